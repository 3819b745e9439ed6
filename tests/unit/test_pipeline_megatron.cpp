// Megatron-LM's own pipeline schedules, recorded from d98e8a64dd (on the GPU machine, where torch
// runs: tools/conformance/megatron_pipeline_schedules.py runs schedules.py rank by rank with its
// sends and receives recorded): capscope's compute_order and its Megatron grouping
// (p2p_program.hpp) give each rank the same passes and the same groups of sends and receives in
// the same places, and capscope refuses (PP4) exactly the counts Megatron raises on, in its words.

#include <capscope/flags/pipeline_schedule_inputs.hpp>
#include <capscope/pipeline/p2p_program.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

using namespace capscope;
using namespace capscope::pipeline;

namespace {

std::string pass_text(const compute_action& a) {
    return std::string(a.direction == pass::forward ? "F" : "B") + std::to_string(a.chunk) + "." + std::to_string(a.microbatch);
}

//! The recorder's words for an operation: receives by what they carry, sends by what and where.
std::string op_text(const p2p_op& o) {
    const char what = o.m.what == carries::activation ? 'a' : 'g';
    if (!o.send) return std::string("r") + what;
    return std::string("s") + what + std::to_string(o.m.stage) + "." + std::to_string(o.m.microbatch);
}

//! A rank's program as the recorder writes it: passes, and each group after the pass it follows.
std::vector<std::string> events_of(const rank_program& p) {
    std::vector<std::string> out;
    auto groups_after = [&](int pass_index) {
        for (const p2p_group& g : p.groups) {
            if (g.after != pass_index) continue;
            std::vector<std::string> ops;
            for (const p2p_op& o : g.ops) ops.push_back(op_text(o));
            std::sort(ops.begin(), ops.end());
            std::string text = "G[";
            for (std::size_t i = 0; i < ops.size(); ++i) text += (i ? "," : "") + ops[i];
            out.push_back(text + "]");
        }
    };
    groups_after(-1);
    for (int i = 0; i < int(p.compute.size()); ++i) {
        out.push_back(pass_text(p.compute[std::size_t(i)]));
        groups_after(i);
    }
    return out;
}

} // namespace

TEST_CASE("Megatron's pipeline schedules, recorded from d98e8a64dd, run capscope's passes and groups rank for rank") {
    std::ifstream in(CAPSCOPE_UNIT_DATA "/megatron_pipeline_schedules.jsonl");
    REQUIRE(in.good());
    int cases = 0, refused = 0, ranks_compared = 0;
    for (std::string line; std::getline(in, line);) {
        const auto c = nlohmann::json::parse(line);
        schedule_shape s;
        s.ranks = c["ranks"];
        s.virtual_stages = c["chunks"];
        s.kind = s.virtual_stages > 1 ? schedule_kind::interleaved_1f1b : schedule_kind::one_f_one_b;
        s.layers = s.stages();
        s.group = c["group"].is_null() ? 0 : c["group"].get<int>();
        const int m = c["microbatches"];
        ++cases;
        CAPTURE(line.substr(0, 120));
        if (c.contains("error")) {
            ++refused;
            CHECK(check_shape(s, m) == schedule_rule::PP4);
            const std::string recorded = c["error"];
            const std::string words = recorded.substr(recorded.find(": ") + 2);
            CHECK(flags::detail::megatron_schedule_message(s, m, s.group_size()) == words);
            continue;
        }
        REQUIRE(check_shape(s, m) == schedule_rule::none);
        const auto& programs = c["programs"];
        REQUIRE(int(programs.size()) == s.ranks);
        for (int r = 0; r < s.ranks; ++r) {
            CAPTURE(r);
            const std::vector<std::string> recorded = programs[std::size_t(r)].get<std::vector<std::string>>();
            CHECK(events_of(program_of(s, r, m)) == recorded);
            ++ranks_compared;
        }
    }
    MESSAGE(cases << " recorded cases: " << refused << " refused by both, " << ranks_compared << " rank programs compared");
    CHECK(cases == 550);
    CHECK(refused > 100);
}
