// 1F1B's and interleaved 1F1B's phases (pipeline/phases.hpp): cut from every count's program,
// they are the program, and each is its variant's phase (captured from another count) up to
// microbatch numbers congruent mod the period, on the same slots: what lets graphs captured once
// serve every count. The slots k mod S_c never hold two microbatches alive at once.

#include <capscope/pipeline/phases.hpp>

#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

using namespace capscope::pipeline;

TEST_CASE("1f1b phases: every count's program is its phases, and each phase is the one captured for its key") {
    int compared = 0;
    for (int ranks = 2; ranks <= 6; ++ranks) {
        schedule_shape s{schedule_kind::one_f_one_b, ranks, 1, ranks};
        for (int rank = 0; rank < ranks; ++rank) {
            CAPTURE(ranks);
            CAPTURE(rank);
            const phase_layout l = phase_layout_of(s, rank);
            CHECK(l.warmup == ranks - rank - 1);
            CHECK(l.activation_slots == ranks - rank); // 1F1B keeps ranks - rank microbatches
            // The captured phases, one per key, each from the count count_holding names.
            std::vector<std::pair<phase_key, std::string>> captured;
            auto capture_of = [&](phase_key key) -> std::string {
                const int m = count_holding(s, rank, key);
                const rank_program p = program_of(s, rank, m);
                for (const phase_segment& seg : phases_of(s, rank, m))
                    if (seg.key == key) return detail::phase_text(s, rank, p, seg);
                FAIL("count_holding(" << int(key.kind) << ", " << key.variant << ") = " << m << " holds no such phase");
                return "";
            };
            for (int m = ranks; m <= 4 * ranks + 5; ++m) {
                CAPTURE(m);
                const rank_program p = program_of(s, rank, m);
                const std::vector<phase_segment> phases = phases_of(s, rank, m);
                // Together they are the program: passes in order, groups in order.
                int next_pass = 0;
                std::vector<p2p_group> groups;
                for (const phase_segment& seg : phases) {
                    CHECK(seg.first_pass == next_pass);
                    next_pass = seg.end_pass;
                    for (const p2p_group& g : seg.groups) {
                        CHECK(g.after < seg.end_pass);
                        CHECK((g.after >= seg.first_pass || (g.after == seg.first_pass - 1 && seg.key.kind == phase_kind::warmup) ||
                               (g.after == -1 && seg.key.kind == phase_kind::warmup)));
                        groups.push_back(g);
                    }
                }
                CHECK(next_pass == int(p.compute.size()));
                REQUIRE(groups.size() == p.groups.size());
                for (std::size_t i = 0; i < groups.size(); ++i) {
                    CHECK(groups[i].after == p.groups[i].after);
                    CHECK(groups[i].ops.size() == p.groups[i].ops.size());
                }
                CHECK(int(phases.size()) == 1 + (m - l.warmup)); // warmup, R - 1 steady, the tail
                // The slots are microbatch k mod S (activations) and k mod G (received gradients).
                const slot_plan plan = plan_slots(s, rank, m);
                CHECK(plan.slots[0] == l.activation_slots);
                for (const slot_use& u : plan.uses) CHECK(u.slot == l.activation_slot(u.microbatch));
                for (const gradient_use& u : plan.gradients) CHECK(u.slot == l.gradient_slot(u.microbatch));
                // Each phase is its key's captured phase.
                for (const phase_segment& seg : phases) {
                    const std::string text = detail::phase_text(s, rank, p, seg);
                    CHECK(text == capture_of(seg.key));
                    ++compared;
                }
            }
        }
    }
    MESSAGE(compared << " phases compared with the phase captured for their key");
    CHECK(compared > 1000);
}

TEST_CASE("phases are refused for other schedules and for fewer microbatches than ranks, with the fix") {
    const schedule_shape gpipe{schedule_kind::gpipe, 4, 1, 4};
    CHECK_THROWS_WITH_AS(phase_layout_of(gpipe, 0), doctest::Contains("cut for 1f1b and interleaved 1f1b"), std::invalid_argument);
    const schedule_shape looped{schedule_kind::interleaved_1f1b, 4, 2, 8};
    const phase_layout l = phase_layout_of(looped, 0);
    CHECK_THROWS_WITH_AS(phases_of(looped, 0, l.least_microbatches + 1), doctest::Contains("in whole groups"), std::invalid_argument);
    CHECK_NOTHROW(phases_of(looped, 0, l.least_microbatches));
    schedule_shape paired{schedule_kind::one_f_one_b, 4, 1, 4};
    paired.grouping = p2p_grouping::paired;
    CHECK_THROWS_AS(phase_layout_of(paired, 0), std::invalid_argument);
    const schedule_shape plain{schedule_kind::one_f_one_b, 4, 1, 4};
    CHECK_THROWS_WITH_AS(phases_of(plain, 0, 3), doctest::Contains("at least 4 microbatches"), std::invalid_argument);
    CHECK_THROWS_AS(phase_layout_of(plain, 4), std::invalid_argument);
    CHECK_NOTHROW(phases_of(plain, 0, 4));
}

namespace {
//! No two of one chunk's spans alive at once (a span [from, to): taken after pass `from`, freed by
//! the backward at `to`) share a slot.
template <class Slot>
bool no_shared_slot(const std::vector<std::pair<int, int>>& spans, const std::vector<int>& chunk, Slot slot) {
    for (std::size_t a = 0; a < spans.size(); ++a)
        for (std::size_t b = a + 1; b < spans.size(); ++b) {
            const bool together = spans[a].first < spans[b].second && spans[b].first < spans[a].second;
            if (together && slot(a) == slot(b) && chunk[a] == chunk[b]) return false;
        }
    return true;
}
} // namespace

TEST_CASE("interleaved phases: every whole-group count's program is its phases, each the one captured for its key, on slots k mod S") {
    int compared = 0, shapes = 0;
    for (int ranks = 2; ranks <= 4; ++ranks)
        for (int chunks = 2; chunks <= 3; ++chunks)
            for (int group : {ranks, ranks + 1, 2 * ranks}) {
                const schedule_shape s{schedule_kind::interleaved_1f1b, ranks, chunks, ranks * chunks, group};
                // Every rank serves the same counts (one that served a count another refuses would wait in its sends).
                for (int rank = 1; rank < ranks; ++rank)
                    CHECK(phase_layout_of(s, rank).least_microbatches == phase_layout_of(s, 0).least_microbatches);
                for (int rank = 0; rank < ranks; ++rank) {
                    CAPTURE(ranks);
                    CAPTURE(chunks);
                    CAPTURE(group);
                    CAPTURE(rank);
                    const phase_layout l = phase_layout_of(s, rank);
                    ++shapes;
                    std::map<std::pair<int, int>, std::string> captured; // (kind, variant) -> its text, captured once
                    auto capture_of = [&](phase_key key) -> std::string {
                        if (const auto at = captured.find({int(key.kind), key.variant}); at != captured.end()) return at->second;
                        const int m = count_holding(s, rank, key);
                        REQUIRE(m > 0);
                        const rank_program p = program_of(s, rank, m);
                        for (const phase_segment& seg : phases_of(s, rank, m))
                            if (seg.key == key) return captured[{int(key.kind), key.variant}] = detail::phase_text(s, rank, p, seg);
                        FAIL("count_holding(" << int(key.kind) << ", " << key.variant << ") = " << m << " holds no such phase");
                        return "";
                    };
                    for (int m = l.least_microbatches; m <= l.least_microbatches + 2 * l.microbatch_period + group; m += group) {
                        CAPTURE(m);
                        REQUIRE(check_shape(s, m) == schedule_rule::none);
                        const rank_program p = program_of(s, rank, m);
                        const std::vector<phase_segment> phases = phases_of(s, rank, m);
                        int next_pass = 0;
                        std::size_t groups = 0;
                        for (const phase_segment& seg : phases) {
                            CHECK(seg.first_pass == next_pass);
                            next_pass = seg.end_pass;
                            for (const p2p_group& g : seg.groups) {
                                REQUIRE(groups < p.groups.size()); // more groups in the phases than in the program
                                CHECK(g.after == p.groups[groups].after);
                                CHECK(g.ops.size() == p.groups[groups++].ops.size());
                            }
                        }
                        CHECK(next_pass == int(p.compute.size()));
                        CHECK(groups == p.groups.size());
                        CHECK(int(phases.size()) == 1 + (chunks * m - l.warmup));
                        // The slots k mod S_c and the gradient slots never hold two live microbatches.
                        const slot_plan plan = plan_slots(s, rank, m);
                        std::vector<std::pair<int, int>> spans, gspans;
                        std::vector<int> chunk_of, gchunk_of, slot, gslot;
                        for (const slot_use& u : plan.uses) {
                            spans.emplace_back(u.received, u.backward);
                            chunk_of.push_back(u.chunk);
                            slot.push_back(l.activation_slot(u.chunk, u.microbatch));
                        }
                        for (const gradient_use& u : plan.gradients) {
                            gspans.emplace_back(u.received, u.backward);
                            gchunk_of.push_back(0); // one pool: every chunk's gradients
                            gslot.push_back(l.gradient_slot(u.chunk, u.microbatch));
                        }
                        CHECK(no_shared_slot(spans, chunk_of, [&](std::size_t i) { return slot[i]; }));
                        CHECK(no_shared_slot(gspans, gchunk_of, [&](std::size_t i) { return gslot[i]; }));
                        for (const phase_segment& seg : phases) {
                            CHECK(detail::phase_text(s, rank, p, seg) == capture_of(seg.key));
                            ++compared;
                        }
                    }
                }
            }
    MESSAGE(compared << " interleaved phases compared with the phase captured for their key, over " << shapes << " ranks of 18 shapes");
    CHECK(compared > 1000);
}
