// Pipeline schedules (capscope/pipeline/): each rank's passes in Megatron's order, memory by
// in-flight slots, and the replay check of the sends and receives on their communicators.

#include "pipeline_shapes.hpp"

#include <capscope/pipeline.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace capscope;
using namespace capscope::pipeline;

using namespace pipeline_shapes;

namespace {

std::string letters(const std::vector<compute_action>& order) {
    std::string s;
    for (const compute_action& a : order)
        s += (s.empty() ? "" : " ") + std::string(a.direction == pass::forward ? "F" : "B") + std::to_string(a.chunk) + "." + std::to_string(a.microbatch);
    return s;
}

//! A program's groups: "after:{send/receive, activation/gradient, stage.microbatch, ...}".
std::string groups_text(const rank_program& p) {
    std::string s;
    for (const p2p_group& g : p.groups) {
        s += (s.empty() ? "" : " ") + std::to_string(g.after) + ":{";
        for (std::size_t i = 0; i < g.ops.size(); ++i)
            s += std::string(i ? "," : "") + (g.ops[i].send ? "s" : "r") + (g.ops[i].m.what == carries::activation ? "a" : "g") +
                 std::to_string(g.ops[i].m.stage) + "." + std::to_string(g.ops[i].m.microbatch);
        s += "}";
    }
    return s;
}

std::vector<std::vector<compute_action>> orders_of(const schedule_shape& s, int m) {
    std::vector<std::vector<compute_action>> o;
    for (int r = 0; r < s.ranks; ++r) o.push_back(compute_order(s, r, m));
    return o;
}

} // namespace

TEST_CASE("each rank runs Megatron's order: warmup forwards, one forward one backward, the rest of the backwards") {
    // 1F1B (forward_backward_pipelining_without_interleaving): rank r warms up with p - r - 1 forwards.
    CHECK(letters(compute_order(one_f_one_b(4), 0, 6)) == "F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 B0.3 B0.4 B0.5");
    CHECK(letters(compute_order(one_f_one_b(4), 3, 4)) == "F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 F0.3 B0.3");
    CHECK(letters(compute_order({schedule_kind::gpipe, 2, 1, 2}, 1, 3)) == "F0.0 F0.1 F0.2 B0.0 B0.1 B0.2");
    // Interleaved: groups of `ranks` microbatches through chunk 0, then chunk 1; backwards run the
    // chunks in reverse; warmup (p - r - 1) * 2 + (v - 1) * group.
    CHECK(warmup_forwards(interleaved(2, 2), 0, 4) == 4);
    CHECK(warmup_forwards(interleaved(2, 2), 1, 4) == 2);
    CHECK(letters(compute_order(interleaved(2, 2), 0, 4)) == "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3");
    CHECK(letters(compute_order(interleaved(2, 2), 1, 4)) == "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3");
    // A group of 3 on 2 ranks: 6 microbatches in two groups of 3 per chunk.
    std::vector<compute_action> forwards;
    for (const compute_action& a : compute_order(interleaved(2, 2, 3), 1, 6))
        if (a.direction == pass::forward) forwards.push_back(a);
    CHECK(letters(forwards) == "F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 F0.3 F0.4 F0.5 F1.3 F1.4 F1.5");

    // Every (chunk, microbatch) once each way, its backward after its forward, on every shape.
    for (const schedule_shape& s : {one_f_one_b(2), one_f_one_b(4), schedule_shape{schedule_kind::gpipe, 3, 1, 3}, interleaved(2, 2), interleaved(4, 2), interleaved(4, 3)})
        for (int m : {s.ranks, 2 * s.ranks, 4 * s.ranks})
            for (int r = 0; r < s.ranks; ++r) {
                const std::vector<compute_action> o = compute_order(s, r, m);
                REQUIRE(int(o.size()) == 2 * m * s.virtual_stages);
                std::set<std::pair<int, int>> forwards, backwards;
                for (const compute_action& a : o) {
                    if (a.direction == pass::forward) CHECK(forwards.insert({a.chunk, a.microbatch}).second);
                    else CHECK((forwards.count({a.chunk, a.microbatch}) == 1 && backwards.insert({a.chunk, a.microbatch}).second));
                }
                CHECK(int(backwards.size()) == m * s.virtual_stages);
            }
}

TEST_CASE("the rules a shape keeps, each named") {
    CHECK(check_shape(one_f_one_b(4), 8) == schedule_rule::none);
    CHECK(check_shape({schedule_kind::one_f_one_b, 1, 1, 4}) == schedule_rule::PP1);
    CHECK(check_shape(one_f_one_b(4), 0) == schedule_rule::PP1);
    CHECK(check_shape({schedule_kind::one_f_one_b, 4, 1, 10}) == schedule_rule::PP2);
    CHECK(check_shape({schedule_kind::interleaved_1f1b, 4, 2, 12}) == schedule_rule::PP2); // 12 layers over 8 chunks
    CHECK(check_shape({schedule_kind::one_f_one_b, 4, 2, 8}) == schedule_rule::PP3);
    // 1F1B with fewer microbatches than ranks: Megatron accepts it, every rank still runs 1F1B's
    // order (not GPipe's), and replay completes.
    CHECK(check_shape(one_f_one_b(4), 3) == schedule_rule::none);
    CHECK(letters(compute_order(one_f_one_b(4), 2, 3)) == "F0.0 F0.1 B0.0 F0.2 B0.1 B0.2");
    CHECK(check_replay(one_f_one_b(4), 3, communicator_layout::shared).completes());
    CHECK(check_shape({schedule_kind::gpipe, 4, 1, 4}, 3) == schedule_rule::none);
    // Megatron's schedules.py: ranks <= group <= microbatches, and a remainder of 0 or >= ranks.
    CHECK(check_shape(interleaved(4, 2), 6) == schedule_rule::PP4);     // 6 % 4 = 2 < 4
    CHECK(check_shape(interleaved(4, 2), 2) == schedule_rule::PP4);     // a group larger than the microbatches
    CHECK(check_shape(interleaved(4, 2, 2)) == schedule_rule::PP4);     // a group smaller than the ranks, whatever the count
    CHECK(check_shape(interleaved(4, 2), 12) == schedule_rule::none);
    CHECK(check_shape(interleaved(2, 2, 3), 8) == schedule_rule::none); // 8 % 3 = 2 >= 2 ranks: a last group of 2
    CHECK(check_shape({schedule_kind::interleaved_1f1b, 4, 1, 4}) == schedule_rule::PP5);
    CHECK(rule_id(schedule_rule::PP4) == "PP4");
    CHECK(describe(schedule_rule::PP4).find("-- fix: ranks <= group <= microbatches") != std::string_view::npos);
}

TEST_CASE("memory by in-flight slots: flat in the microbatch count, never two live microbatches in one slot") {
    for (int p : {2, 4, 8})
        for (int r = 0; r < p; ++r)
            for (int m : {p, 2 * p, 8 * p}) // Megatron's 1F1B keeps p - r forwards in flight
                CHECK(plan_slots(one_f_one_b(p), r, m).slots == std::vector<int>{p - r});
    CHECK(plan_slots({schedule_kind::gpipe, 4, 1, 4}, 2, 32).slots == std::vector<int>{32}); // GPipe: every microbatch
    for (const schedule_shape& s : {interleaved(2, 2), interleaved(4, 2), interleaved(4, 4)})
        for (int r = 0; r < s.ranks; ++r) {
            const std::vector<int> at8 = plan_slots(s, r, 2 * s.ranks).slots;
            for (int m : {4 * s.ranks, 8 * s.ranks, 16 * s.ranks}) CHECK(plan_slots(s, r, m).slots == at8);
        }
    // The FIFO allocator: a slot is reused only after its last microbatch's backward.
    for (const schedule_shape& s : {one_f_one_b(4), interleaved(4, 2), interleaved(2, 3)})
        for (int r = 0; r < s.ranks; ++r) {
            const slot_plan plan = plan_slots(s, r, 4 * s.ranks);
            const std::vector<compute_action> order = compute_order(s, r, 4 * s.ranks);
            for (const slot_use& a : plan.uses) {
                REQUIRE(a.backward > a.forward);
                CHECK(order[std::size_t(a.backward)] == compute_action{pass::backward, a.chunk, a.microbatch});
                CHECK(order[std::size_t(a.forward)] == compute_action{pass::forward, a.chunk, a.microbatch});
                CHECK(a.slot < plan.slots[std::size_t(a.chunk)]);
                for (const slot_use& b : plan.uses)
                    if (&a != &b && a.chunk == b.chunk && a.slot == b.slot) CHECK((a.backward < b.forward || b.backward < a.forward));
            }
        }
}

TEST_CASE("replay, paired pass by pass: 1f1b and gpipe complete on one shared communicator; interleaved needs one per edge, and the check names why") {
    for (int p : {2, 3, 4, 8})
        for (int m : {p, p + 1, 3 * p}) {
            CHECK(check_replay(grouped(one_f_one_b(p), paired), m, communicator_layout::shared).completes());
            CHECK(check_replay({schedule_kind::gpipe, p, 1, p}, m, communicator_layout::shared).completes());
        }
    // Megatron's interleaved order, with a group of the previous pass's sends and this pass's
    // receives, meets an ordering cycle through the shared communicator's FIFO order.
    const replay_verdict v = check_replay(grouped(interleaved(4, 2), paired), 8, communicator_layout::shared);
    REQUIRE(v.result == replay_verdict::outcome::deadlocks);
    CHECK(describe(v) ==
          "rank 0 sends the gradient of microbatch 0 for stage 3 (rank 0 to rank 3) after its backward of chunk 1, microbatch 0, and rank 3 "
          "never issues the matching receive: it is held before its forward of chunk 0, microbatch 4, waiting for what that pass receives");
    for (int p : {2, 4, 8})
        for (int v2 : {2, 3, 4})
            for (int m : {p, 2 * p, 4 * p}) {
                INFO("ranks " << p << ", chunks " << v2 << ", microbatches " << m);
                CHECK(check_replay(grouped(interleaved(p, v2), paired), m, communicator_layout::per_edge).completes());
                const communicator_plan plan = choose_communicators(grouped(interleaved(p, v2), paired), m);
                CHECK(plan.verdict.completes());
            }
    // A last, partial group (Megatron allows one of at least the ranks). On two ranks one edge
    // carries activations and gradients in orders the two ranks do not share: one communicator
    // for both would cross them, so per_edge keys its communicators by the kind of traffic too.
    // (Plainly, that is: issued, a pass that computes a send waits for the edge's previous send,
    // which closes a cycle here, so the issuer refuses this shape, PP6.)
    CHECK(check_replay(grouped(interleaved(2, 2, 3), paired), 8, communicator_layout::per_edge).completes());
    CHECK(!check_as_issued(grouped(interleaved(2, 2, 3), paired), 8, communicator_layout::per_edge).completes());
    const replay_verdict crossed = check_replay(grouped(interleaved(2, 2, 3), paired), 8, communicator_layout::shared);
    REQUIRE(crossed.result == replay_verdict::outcome::crosses);
    CHECK(describe(crossed) == "rank 1's communicator with rank 0 matches the send of the gradient of microbatch 0 for stage 1 (rank 0 to rank 1) "
                               "with the receive of the activation of microbatch 3 for stage 1 (rank 0 to rank 1), which would take its data silently");
    CHECK(plan_slots(interleaved(2, 2, 3), 0, 8).slots == plan_slots(interleaved(2, 2, 3), 0, 14).slots);
    CHECK(choose_communicators(one_f_one_b(4), 8).layout == communicator_layout::shared);
    CHECK(choose_communicators(grouped(interleaved(4, 2), paired), 8).layout == communicator_layout::per_edge);
    CHECK(choose_communicators(interleaved(4, 2), 8).layout == communicator_layout::shared); // grouped as Megatron does
}

TEST_CASE("replay: sends and receives issued one by one, as PyTorch's eager pipelining did") {
    // 1F1B with each send and receive alone deadlocks on one shared communicator: the reason
    // Megatron pairs them (send_forward_recv_backward).
    const replay_verdict alone = check_replay(grouped(one_f_one_b(4), one_by_one), 8, communicator_layout::shared);
    CHECK(alone.result == replay_verdict::outcome::deadlocks);
    CHECK(check_replay(grouped(one_f_one_b(4), paired), 8, communicator_layout::shared).completes());
    CHECK(check_replay(grouped(one_f_one_b(4), one_by_one), 8, communicator_layout::per_direction).completes());
    // PyTorch #195760's looped example: 2 microbatches, 8 stages on 4 ranks (rank r holds stages r
    // and r + 4), one group of 2 (ScheduleInterleaved1F1B: max(1, 2 / 4) rounds). On one shared
    // communicator, rank 0's receive for stage 4 waits behind its sends to rank 1 and a cycle
    // closes; one communicator per directed edge completes. (The PR calls the per-direction
    // layout it replaced one that "can" deadlock and shows no trace: in this model, rendezvous
    // and FIFO, it completes.)
    const schedule_shape looped = grouped({schedule_kind::interleaved_1f1b, 4, 2, 8, 2}, one_by_one);
    CHECK(letters(compute_order(looped, 0, 2)) == "F0.0 F0.1 F1.0 F1.1 B1.0 B1.1 B0.0 B0.1"); // the PR's 0F0 -> 1F0 -> 0F4 -> 1F4
    CHECK(check_replay(looped, 2, communicator_layout::shared).result == replay_verdict::outcome::deadlocks);
    CHECK(check_replay(looped, 2, communicator_layout::per_edge).completes());
    CHECK(check_replay(looped, 2, communicator_layout::per_direction).completes());
    // With more microbatches than its group reaches round the ring, no layout helps: rank 0
    // waits for a chunk the ring has not reached, which is why PP4 refuses a group below the ranks.
    CHECK(check_shape(looped, 8) == schedule_rule::PP4);
    CHECK(check_replay(looped, 8, communicator_layout::per_edge).result == replay_verdict::outcome::deadlocks);
}

TEST_CASE("replay: orders that disagree are named, as a crossing or a deadlock") {
    const schedule_shape s = one_f_one_b(2);
    std::vector<std::vector<compute_action>> orders = orders_of(s, 4);
    REQUIRE(check_replay(s, orders, communicator_layout::shared).completes());
    // Rank 1 takes microbatch 1's forward before microbatch 0's: the communicator would hand it
    // microbatch 0's activation as microbatch 1's.
    std::vector<compute_action>& r1 = orders[1];
    std::swap(r1[0], r1[2]); // F0.0 B0.0 F0.1 ... -> F0.1 B0.0 F0.0
    const replay_verdict crossed = check_replay(s, orders, communicator_layout::shared);
    REQUIRE(crossed.result == replay_verdict::outcome::crosses);
    CHECK(describe(crossed).find("matches the send of the activation of microbatch 0 for stage 1 (rank 0 to rank 1) with the receive of the "
                                 "activation of microbatch 1") != std::string::npos);
    // Rank 0 wants microbatch 0's gradient before it sends microbatch 1's activation; rank 1
    // wants that activation before it runs microbatch 0's backward: a cycle on any communicators.
    orders = orders_of(s, 2);
    orders[0] = {{pass::forward, 0, 0}, {pass::backward, 0, 0}, {pass::forward, 0, 1}, {pass::backward, 0, 1}};
    orders[1] = {{pass::forward, 0, 0}, {pass::forward, 0, 1}, {pass::backward, 0, 0}, {pass::backward, 0, 1}};
    for (communicator_layout layout : {communicator_layout::shared, communicator_layout::per_edge}) {
        const replay_verdict stuck = check_replay(s, orders, layout);
        REQUIRE(stuck.result == replay_verdict::outcome::deadlocks);
        CHECK(describe(stuck) == "rank 0 receives the gradient of microbatch 0 for stage 0 (rank 1 to rank 0) after its forward of chunk 0, "
                                 "microbatch 0, and rank 1 never issues the matching send: it is held before its forward of chunk 0, "
                                 "microbatch 1, waiting for what that pass receives");
    }
}

TEST_CASE("replay: an operation with no partner is named, and orders for other ranks are refused") {
    const schedule_shape s = one_f_one_b(2);
    std::vector<std::vector<compute_action>> orders = orders_of(s, 2);
    orders[1] = {{pass::forward, 0, 0}, {pass::backward, 0, 0}}; // rank 1 forgets microbatch 1
    const replay_verdict v = check_replay(s, orders, communicator_layout::shared);
    REQUIRE(v.result == replay_verdict::outcome::unmatched);
    CHECK(describe(v) == "rank 0 sends the activation of microbatch 1 for stage 1 (rank 0 to rank 1), and rank 1's program has no matching "
                         "receive: it would never complete");
    orders.pop_back();
    CHECK_THROWS_WITH_AS(check_replay(s, orders, communicator_layout::shared),
                         "capscope pipeline: check_replay was given 1 ranks' orders for a schedule of 2 ranks -- fix: one order per rank",
                         std::invalid_argument);
}

TEST_CASE("replay: a receive issued after the pass that needs it is named") {
    const schedule_shape s = one_f_one_b(2);
    std::vector<rank_program> programs = programs_of(s, 2);
    // Rank 1's first group receives microbatch 0's activation before its first forward; move it
    // after that forward, which would then read a buffer nothing has written yet.
    REQUIRE(programs[1].groups[0].after == -1);
    programs[1].groups[0].after = 0;
    const replay_verdict v = check_replay(s, programs, communicator_layout::shared);
    REQUIRE(v.result == replay_verdict::outcome::late);
    CHECK(describe(v) == "rank 1 receives the activation of microbatch 0 for stage 1 (rank 0 to rank 1) after its forward of chunk 0, "
                         "microbatch 0, and no later pass of it needs that: the pass that does ran before the data arrived, or it has none");
}

TEST_CASE("Megatron's groups, pinned: what schedules.py issues without p2p overlap") {
    // (A reviewing helper's line-by-line transliteration of schedules.py gave the same groups on
    // 708 shapes; these pin a few.) 1F1B, 2 ranks, 3 microbatches: warmup and cooldown alone.
    CHECK(groups_text(program_of(one_f_one_b(2), 0, 3)) == "0:{sa1.0} 1:{sa1.1,rg0.0} 3:{sa1.2,rg0.1} 4:{rg0.2}");
    CHECK(groups_text(program_of(one_f_one_b(2), 1, 3)) == "-1:{ra1.0} 1:{sg0.0,ra1.1} 3:{sg0.1,ra1.2} 5:{sg0.2}");
    // Interleaved, 4 ranks x 2 chunks, 4 microbatches: rank 0 is all warmup (its recv_backward a
    // group of its own), and receives the ring's activations ranks - 1 steps late; rank 3 sends
    // chunk 0's output round the ring and receives the next forward's input with each send.
    CHECK(groups_text(program_of(interleaved(4, 2), 0, 4)) ==
          "0:{sa1.0} 1:{sa1.1} 2:{sa1.2} 3:{sa1.3,ra4.0} 4:{sa5.0,ra4.1} 5:{sa5.1,ra4.2} 6:{sa5.2,ra4.3} 7:{sa5.3} 7:{rg4.0} "
          "8:{sg3.0,rg4.1} 9:{sg3.1,rg4.2} 10:{sg3.2,rg4.3} 11:{sg3.3,rg0.0} 12:{rg0.1} 13:{rg0.2} 14:{rg0.3}");
    CHECK(groups_text(program_of(interleaved(4, 2), 3, 4)) ==
          "-1:{ra3.0} 0:{sa4.0,ra3.1} 1:{sa4.1,ra3.2} 2:{sa4.2,ra3.3} 3:{sa4.3,ra7.0} 5:{sg6.0,ra7.1} 7:{sg6.1,ra7.2} 9:{sg6.2,ra7.3} "
          "11:{sg6.3,rg3.0} 12:{sg2.0,rg3.1} 13:{sg2.1,rg3.2} 14:{sg2.2,rg3.3} 15:{sg2.3}");
    // On two ranks the previous and the next rank are one peer. Megatron's own batch order
    // (_batched_p2p_ops: send to the previous, receive from the previous, send to the next,
    // receive from the next) then pairs one rank's gradient with the other's activation, which is
    // why Megatron refuses interleaving on two ranks without overlap. This library's order within
    // a group (sends of the activation, then the gradient; receives likewise) does not cross.
    const schedule_shape two = interleaved(2, 2);
    std::vector<rank_program> megatron_order = programs_of(two, 4);
    for (rank_program& p : megatron_order)
        for (p2p_group& g : p.groups) {
            group_ops reordered;
            auto take = [&](bool send, carries what) {
                for (const p2p_op& o : g.ops)
                    if (o.send == send && o.m.what == what) reordered.push_back(o);
            };
            take(true, carries::gradient), take(false, carries::activation), take(true, carries::activation), take(false, carries::gradient);
            g.ops = reordered;
        }
    CHECK(check_replay(two, megatron_order, communicator_layout::shared).result == replay_verdict::outcome::crosses);
    CHECK(check_replay(two, 4, communicator_layout::shared).completes());
}

TEST_CASE("replay: a send before the pass that computes it, and a pass whose input never comes, are named") {
    const schedule_shape s = one_f_one_b(2);
    std::vector<rank_program> programs = programs_of(s, 2);
    REQUIRE(programs[0].groups[0].after == 0); // rank 0 sends microbatch 0's activation after its forward
    programs[0].groups[0].after = -1;
    const replay_verdict early = check_replay(s, programs, communicator_layout::shared);
    REQUIRE(early.result == replay_verdict::outcome::early);
    CHECK(describe(early) == "rank 0 sends the activation of microbatch 0 for stage 1 (rank 0 to rank 1) before its first pass, before the "
                             "pass that computes it: it would send what is not there yet");
    programs = programs_of(s, 2);
    programs[0].groups.erase(programs[0].groups.begin()); // the send and its receive, both gone
    programs[1].groups.erase(programs[1].groups.begin());
    const replay_verdict missing = check_replay(s, programs, communicator_layout::shared);
    REQUIRE(missing.result == replay_verdict::outcome::missing);
    CHECK(describe(missing) == "rank 1's forward of chunk 0, microbatch 0 needs an input from another stage, and no receive of its program "
                               "brings it: it would read a buffer nothing wrote");
    CHECK_THROWS_AS(plan_slots(s, 2, 4), std::invalid_argument); // a rank the schedule does not have
}

TEST_CASE("replay, random orders: a verdict of completes means every rank's passes ran in an order that respects every message") {
    // The simulation against a brute-force reading: shuffle one rank's forwards and see the
    // verdict agree with whether its receive order still matches the sender's.
    std::mt19937 rng(7);
    int crossed = 0, completed = 0;
    for (int trial = 0; trial < 200; ++trial) {
        const schedule_shape s = one_f_one_b(2 + int(rng() % 3));
        const int m = s.ranks + int(rng() % 4);
        std::vector<std::vector<compute_action>> orders = orders_of(s, m);
        const int rank = 1 + int(rng() % unsigned(s.ranks - 1));
        std::vector<int> forwards;
        for (int i = 0; i < int(orders[std::size_t(rank)].size()); ++i)
            if (orders[std::size_t(rank)][std::size_t(i)].direction == pass::forward) forwards.push_back(i);
        const int a = forwards[rng() % forwards.size()], b = forwards[rng() % forwards.size()];
        std::swap(orders[std::size_t(rank)][std::size_t(a)].microbatch, orders[std::size_t(rank)][std::size_t(b)].microbatch);
        // The swap keeps each forward before its backward only if the earlier slot took the smaller microbatch.
        bool valid = true;
        std::set<int> seen;
        for (const compute_action& x : orders[std::size_t(rank)]) {
            if (x.direction == pass::forward) seen.insert(x.microbatch);
            else valid = valid && seen.count(x.microbatch);
        }
        if (!valid) continue;
        const replay_verdict v = check_replay(s, orders, communicator_layout::shared);
        const bool same_order = orders[std::size_t(rank)] == compute_order(s, rank, m);
        if (same_order) CHECK(v.completes());
        else CHECK(!v.completes()); // its receives no longer come in the order rank - 1 sends them
        (v.result == replay_verdict::outcome::crosses ? crossed : completed) += 1;
    }
    CHECK(crossed > 20);
    CHECK(completed > 20);
}

TEST_CASE("a schedule as a type: checked for its declared microbatch counts, with the communicators chosen") {
    // Grouped as Megatron groups them (the default), one shared communicator serves.
    using interleaved_4x2 = pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16}, 8, 12, 16>;
    static_assert(interleaved_4x2::communicators == communicator_layout::shared);
    static_assert(interleaved_4x2::declared_microbatches.size() == 3);
    using paired_4x2 = pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16,
                                                        .grouping = p2p_grouping::paired}, 8, 16>;
    static_assert(paired_4x2::communicators == communicator_layout::per_edge); // paired pass by pass, a shared one would deadlock
    using plain = pipeline_schedule<schedule_shape{.kind = schedule_kind::one_f_one_b, .ranks = 4, .layers = 8}, 4, 8, 64>;
    static_assert(plain::communicators == communicator_layout::shared);
    CHECK(plain::slots(0, 64).slots == std::vector<int>{4});
    CHECK(interleaved_4x2::replay_report(12) == "every send and receive completes");
    // A count the type did not declare is checked when asked for, against the rules and on the
    // type's communicators.
    CHECK_THROWS_WITH_AS(interleaved_4x2::program(0, 6),
                         "capscope pipeline rule PP4 with 6 microbatches: interleaved with a group smaller than the ranks or larger than the "
                         "microbatches, or a last, partial group smaller than the ranks -- fix: ranks <= group <= microbatches, and "
                         "microbatches % group either 0 or at least the ranks",
                         std::invalid_argument);
    CHECK(interleaved_4x2::program(0, 20).compute.size() == 80); // undeclared, valid, and it completes
    using paired_for_4 = pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16,
                                                          .grouping = p2p_grouping::paired}, 4>;
    static_assert(paired_for_4::communicators == communicator_layout::shared); // 4 microbatches complete on one
    try {
        (void)paired_for_4::program(0, 8); // 8 would not
        FAIL("8 microbatches on the shared communicator chosen for 4 were accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).starts_with("capscope pipeline rule PP6 with 8 microbatches, on the shared communicators the type chose"));
    }
    const rank_program p = interleaved_4x2::program(3, 8);
    CHECK(p.compute.size() == 32);
    // The first group of the last rank receives chunk 0's activation of microbatch 0 from rank 2.
    REQUIRE(!p.groups.empty());
    CHECK(p.groups[0].after == -1);
    CHECK(p.groups[0].ops[0] == p2p_op{false, {2, 3, carries::activation, 3, 0}});
}

TEST_CASE("grouped as Megatron groups them, every shape the rules accept completes on one shared communicator") {
    // Megatron's schedules.py without p2p overlap: 1F1B's warmup and cooldown operations alone,
    // interleaved receives posted a step ahead (the ring's ranks - 1 steps late). Its FIFO
    // identities must agree (no crossing), and its receive-ahead is paid in slots, flat in M.
    int checked = 0;
    for (int p : {2, 3, 4, 8})
        for (int v : {1, 2, 3})
            for (int extra : {0, 1})
                for (int m = 1; m <= 4 * p + 2; ++m) {
                    const schedule_shape s{v == 1 ? schedule_kind::one_f_one_b : schedule_kind::interleaved_1f1b, p, v, p * v, v > 1 ? p + extra : 0};
                    if ((v == 1 && extra) || check_shape(s, m) != schedule_rule::none) continue;
                    INFO(std::string(name_of(s.kind)) << ", " << p << " ranks, " << v << " chunks, group " << s.group_size() << ", " << m << " microbatches");
                    CHECK(check_replay(s, m, communicator_layout::shared).completes());
                    ++checked;
                }
    CHECK(checked >= 150);
    // With a group larger than the ranks, rank 0 of an interleaved schedule receives the ring's
    // activations ahead of their forwards, and the last rank the ring's gradients: each into a
    // slot of its own until its pass.
    const schedule_shape s = interleaved(4, 2, 6);
    for (int r = 0; r < 4; ++r)
        for (int m : {12, 24, 36}) {
            const slot_plan plan = plan_slots(s, r, m);
            const std::vector<compute_action> order = compute_order(s, r, m);
            for (const slot_use& a : plan.uses) {
                CHECK(order[std::size_t(a.forward)] == compute_action{pass::forward, a.chunk, a.microbatch});
                CHECK(order[std::size_t(a.backward)] == compute_action{pass::backward, a.chunk, a.microbatch});
                CHECK(a.received < a.forward);
                for (const slot_use& b : plan.uses)
                    if (&a != &b && a.chunk == b.chunk && a.slot == b.slot) CHECK((a.backward <= b.received || b.backward <= a.received));
            }
            for (const gradient_use& a : plan.gradients) {
                CHECK(order[std::size_t(a.backward)] == compute_action{pass::backward, a.chunk, a.microbatch});
                CHECK(a.received < a.backward);
                for (const gradient_use& b : plan.gradients)
                    if (&a != &b && a.slot == b.slot) CHECK((a.backward <= b.received || b.backward <= a.received));
            }
            CHECK(plan.slots == plan_slots(s, r, 72).slots);
            CHECK(plan.gradient_slots == plan_slots(s, r, 72).gradient_slots);
        }
    const slot_use ahead = plan_slots(s, 0, 12).uses[4]; // chunk 1's microbatch 0, from the last rank
    CHECK(ahead == slot_use{1, 0, 0, 6, 13, 3});           // received after pass 3, its forward pass 6
    CHECK(plan_slots(s, 3, 12).gradient_slots == 3);      // the last rank keeps three of the ring's gradients
}
