#pragma once
//! @file
//! The bind-time check: every layer of a training program must match one of the layer schemas
//! the runner was declared with (same stages in order, same regions, same capture facts), so a
//! plan checked by the compiler is the plan that runs.

#include <capscope/plan/plan_error.hpp>
#include <capscope/stage/program.hpp>
#include <capscope/stage/schema.hpp>

#include <span>
#include <string>
#include <vector>

namespace capscope {

class schema_mismatch : public std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

namespace detail {

struct schema_view {
    std::string_view name;
    std::vector<stage_facts> stages;
};

inline std::string facts_text(const stage_facts& f) {
    std::string s(f.kind.name);
    s += " {" + module_list(f.captured_by) + "}";
    if (f.synchronizes_with_host) s += " synchronizes_with_host";
    if (f.shapes_depend_on_data) s += " shapes_depend_on_data";
    if (!f.saves.empty()) s += " saves {" + names_of(f.saves) + "}";
    if (!f.makes.empty()) s += " makes {" + names_of(f.makes) + "}";
    if (f.guarded != guard_kind::none) s += std::string(" guarded by ") + guard_word(f.guarded) + " '" + std::string(f.guard_flag) + "'";
    return s;
}

inline bool same_layer_facts(std::span<const stage_facts> a, std::span<const stage_facts> b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        stage_facts x = a[i], y = b[i];
        x.layer = y.layer = 0;
        x.flags_written = y.flags_written = region_set{}; // a schema's; a bound stage's writes are its outputs
        x.guard_flag_written_before = y.guard_flag_written_before = false;
        if (!(x == y)) return false;
    }
    return true;
}

inline void match_layer(const std::vector<schema_view>& schemas, const std::vector<stage>& list, std::size_t first, std::size_t last) {
    std::vector<stage_facts> facts;
    for (std::size_t i = first; i < last; ++i) facts.push_back(list[i].facts());
    for (const schema_view& s : schemas)
        if (same_layer_facts(s.stages, facts)) return;
    std::string names, stages;
    for (const schema_view& s : schemas) names += (names.empty() ? "" : ", ") + std::string(s.name);
    for (std::size_t i = first; i < last; ++i) stages += "\n    " + list[i].name + ": " + facts_text(list[i].facts());
    // The nearest schema: the one with the same stage kinds, if any, to say what differs.
    std::string nearest;
    for (const schema_view& s : schemas) {
        if (s.stages.size() != facts.size()) continue;
        bool kinds = true;
        for (std::size_t i = 0; i < facts.size(); ++i) kinds = kinds && s.stages[i].kind == facts[i].kind;
        if (!kinds) continue;
        for (std::size_t i = 0; i < facts.size(); ++i) {
            stage_facts want = s.stages[i], got = facts[i];
            if (!same_layer_facts(std::span(&want, 1), std::span(&got, 1))) {
                nearest = "\n  schema '" + std::string(s.name) + "' has the same stages, but declares " + list[first + i].name + " as " +
                          facts_text(want);
                break;
            }
        }
        break;
    }
    throw schema_mismatch("capscope: layer " + std::to_string(list[first].layer) + " of the model matches none of the runner's layer schemas (" +
                          names + "); its stages are:" + stages + nearest +
                          "\n  fix: declare the runner with a layer_schema that lists these stages, or tag the stages as the schema says");
}

} // namespace detail

//! Checks every layer of every microbatch list against the schemas; throws `schema_mismatch`.
template <class... Layers>
void match_schemas(layer_schemas<Layers...>, const training_program& program) {
    const std::vector<detail::schema_view> schemas = {
        detail::schema_view{Layers::name(), [] {
            const auto f = Layers::facts();
            return std::vector<stage_facts>(f.begin(), f.end());
        }()}...};
    for (const auto& list : program.microbatches) {
        std::size_t i = 0;
        while (i < list.size()) {
            if (list[i].layer < 0 || list[i].added) {
                ++i;
                continue;
            }
            // The layer's own stages, passing over those capscope added (hooks, activation copies).
            std::vector<stage> own;
            std::size_t j = i;
            for (; j < list.size(); ++j) {
                if (list[j].added) continue;
                if (list[j].layer != list[i].layer) break;
                own.push_back(list[j]);
            }
            detail::match_layer(schemas, own, 0, own.size());
            i = j;
        }
    }
}

} // namespace capscope
