#pragma once
//! @file
//! Guarded stages of a layer schema, checked by the compiler (the same rules as the plan's,
//! capscope/plan/guards.hpp, as far as one layer's declaration shows them):
//! - P14: a guarded stage is capturable (no host sync, data-dependent shapes or host values);
//! - P15: its flag is written by an earlier stage of the layer (`writes_flags<...>`), or said to
//!   be written before the layer (`flag_writer::before_layer`); and a WHILE run writes it.

#include <capscope/rules/rule.hpp>
#include <capscope/stage/stage.hpp>

#include <array>
#include <cstddef>

namespace capscope {

enum class guard_problem { none, needs_host, flag_not_written, loop_never_ends };

struct guard_finding {
    int stage = -1;
    guard_problem problem = guard_problem::none;
    constexpr bool found() const { return problem != guard_problem::none; }
};

//! The first guarded stage of a layer's stages that breaks P14 or P15.
template <std::size_t N>
constexpr guard_finding find_guard_problem(const std::array<stage_facts, N>& s) {
    for (std::size_t i = 0; i < N; ++i) {
        if (s[i].guarded == guard_kind::none) continue;
        if (!s[i].capturable()) return {int(i), guard_problem::needs_host};
        // The run: i and the stages after it under the same guard.
        const bool run_start = i == 0 || s[i - 1].guarded != s[i].guarded || s[i - 1].guard_flag != s[i].guard_flag;
        if (!run_start) continue;
        std::size_t end = i + 1;
        while (end < N && s[end].guarded == s[i].guarded && s[end].guard_flag == s[i].guard_flag) ++end;
        bool written = s[i].guard_flag_written_before;
        for (std::size_t j = 0; j < i; ++j) written = written || s[j].flags_written.contains(s[i].guard_flag);
        if (!written) return {int(i), guard_problem::flag_not_written};
        if (s[i].guarded == guard_kind::while_holds) {
            bool body_writes = false;
            for (std::size_t j = i; j < end; ++j) body_writes = body_writes || s[j].flags_written.contains(s[i].guard_flag);
            if (!body_writes) return {int(i), guard_problem::loop_never_ends};
        }
    }
    return {};
}

namespace plan_rules {
// The instantiation note below each error names the layer schema and the stage's index in it.
template <class Schema, int Stage>
struct P14 {
    static_assert(detail::always_false<Schema>, "capscope plan rule P14: a guarded stage of this layer schema synchronizes with the host, launches shapes that depend on data or passes host values at launch, but guarded stages run inside a conditional graph node when captured, where the host cannot act -- fix: keep the guarded work on the device (values in device memory, shapes fixed), or move the host work out of the guarded stage");
};
template <class Schema, int Stage>
struct P15_flag_not_written {
    static_assert(detail::always_false<Schema>, "capscope plan rule P15: a guarded stage's flag is written by no earlier stage of its layer schema -- fix: add writes_flags<\"flag\"> to the stage that writes it, or, when a stage before the layer writes it, say so: run_if_holds<\"flag\", flag_writer::before_layer>");
};
template <class Schema, int Stage>
struct P15_loop_never_ends {
    static_assert(detail::always_false<Schema>, "capscope plan rule P15: a WHILE-guarded run of this layer schema never writes its flag, so the loop would never end once it holds -- fix: add writes_flags<\"flag\"> to the guarded stage that clears it");
};
} // namespace plan_rules

namespace detail {
// Each report is a base class, so clang shows its one static_assert and no second error.
template <class Schema, int Stage, guard_problem Problem>
struct report_guard_problem {}; // nothing wrong
template <class Schema, int Stage>
struct report_guard_problem<Schema, Stage, guard_problem::needs_host> : plan_rules::P14<Schema, Stage> {};
template <class Schema, int Stage>
struct report_guard_problem<Schema, Stage, guard_problem::flag_not_written> : plan_rules::P15_flag_not_written<Schema, Stage> {};
template <class Schema, int Stage>
struct report_guard_problem<Schema, Stage, guard_problem::loop_never_ends> : plan_rules::P15_loop_never_ends<Schema, Stage> {};
} // namespace detail

} // namespace capscope
