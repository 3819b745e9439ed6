// NCCL's rules for graphs without its graph-mixing support (cuda/nccl_graph_mixing.hpp), kept by
// construction: an eager NCCL call waits on the host for the last launch of a graph holding NCCL
// work, and such a launch on another stream waits on the device for the one before. One GPU and no
// NCCL: the "NCCL work" is a slow kernel whose result the next step reads, as NCCL's proxy thread
// would read the state the graph leaves, so reading too early is seen.

#include <capscope/capscope.hpp>
#include <capscope/cuda.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/nccl_graph_mixing.hpp>
#include <capscope/engine.hpp>

#include "data_parallel_model.hpp"
#include "engine_kernels.hpp"
#include "scoped_environment.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;

namespace {

constexpr unsigned slow_ns = 2'000'000; // the graph's last kernel: 2 ms

//! The graph as a runner would launch it: copied without its user objects (it then records its own
//! end), or as captured (an event is recorded after it).
cuda::graph_exec launchable(cuda::graph g, bool copied) {
    if (!copied) return cuda::graph_exec(g);
    cuda::copy_result c = cuda::without_user_objects(std::move(g));
    REQUIRE(c.refused.empty());
    REQUIRE(c.copy.finished_event() != nullptr);
    return cuda::graph_exec(c.copy);
}

} // namespace

TEST_CASE("NCCL_GRAPH_MIXING_SUPPORT read as NCCL reads it: unset or empty is on; else strtoll's number, on unless it is 0") {
    CHECK(cuda::nccl_graph_mixing_from(nullptr));
    CHECK(cuda::nccl_graph_mixing_from(""));
    CHECK(cuda::nccl_graph_mixing_from("1"));
    CHECK(cuda::nccl_graph_mixing_from("2"));
    CHECK(cuda::nccl_graph_mixing_from("0x1"));
    CHECK(cuda::nccl_graph_mixing_from("99999999999999999999")); // overflows: NCCL keeps its default
    CHECK(!cuda::nccl_graph_mixing_from("0"));
    CHECK(!cuda::nccl_graph_mixing_from("0x0"));
    CHECK(!cuda::nccl_graph_mixing_from("off")); // no number: strtoll gives 0, and NCCL takes it
    CHECK(!cuda::nccl_graph_mixing_from("false"));
    CHECK(!cuda::nccl_graph_mixing_from(" "));
    CHECK(!cuda::nccl_graph_mixing_from("0abc"));
    const scoped_environment off("NCCL_GRAPH_MIXING_SUPPORT", "0");
    CHECK(!cuda::nccl_graph_mixing());
    CHECK(!cuda::nccl_launch_order().kept() == !!capscope::detail::installed_breakage().nccl_order_skipped);
}

TEST_CASE("without NCCL's graph mixing, an eager call after a graph holding NCCL work waits for it on the host, and a graph on another stream on the device") {
    // Each launch adds one to a counter, then a slow kernel copies it, then it goes into a buffer
    // and into host memory (the state an eager NCCL call would hand to NCCL's proxy thread). After each launch, before_eager() must
    // leave the host reading this launch's value. A second graph on another stream reads what the
    // first wrote (a graph of the same communicator launched beside it): its launch must follow the
    // first's. Broken on purpose (nccl_order_skipped), the host reads the last launch's value and
    // the second graph reads before the first has written.
    constexpr int launches = 3, n = 1 << 16;
    cuda::stream s, other;
    cuda::device_buffer<int> counter(1), value(1), staging(n), out(n);
    cuda::pinned_buffer<int> seen(1);
    for (const bool copied : {true, false}) {
        INFO(std::string(copied ? "copied" : "as captured"));
        const cuda::graph_exec writer = launchable(cuda::capture(s, [&](cudaStream_t on) {
                                                       k::add_one(counter.data(), on);
                                                       k::slow_copy(value.data(), counter.data(), 1, slow_ns, on);
                                                       k::fill_from(staging.data(), value.data(), 0, n, on);
                                                       k::scale(seen.data(), value.data(), 1, 1, on);
                                                   }),
                                                   copied);
        const cuda::graph_exec reader = launchable(cuda::capture(other, [&](cudaStream_t on) { k::scale(out.data(), staging.data(), 1, n, on); }), copied);
        counter.fill_bytes(0, s);
        staging.fill_bytes(0, s);
        seen.data()[0] = 0;
        s.synchronize();
        const cuda::nccl_launch_order order(false); // NCCL_GRAPH_MIXING_SUPPORT=0
        const cuda::nccl_order_counts before = cuda::nccl_launch_order::counts();
        std::vector<int> got(n);
        for (int launch = 1; launch <= launches; ++launch) {
            order.launch(writer, s);
            order.before_eager();
            const int read = *static_cast<volatile int*>(seen.data());
            INFO("launch ", launch, ": the host read ", read, ", expected ", 2 * launch - 1);
            CHECK(read == 2 * launch - 1); // (two writer launches a round)
            // The writer again, then the reader on the other stream at once.
            order.launch(writer, s);
            order.launch(reader, other);
            other.synchronize();
            out.copy_to_host(got, other);
            other.synchronize();
            const long wrong = long(std::count_if(got.begin(), got.end(), [&](int v) { return v != 2 * launch; }));
            INFO("launch ", launch, ": the graph on the other stream read ", wrong, " of ", n, " elements before the first had written them");
            CHECK(wrong == 0);
            s.synchronize();
            order.before_eager(); // (all finished: the host waits for nothing)
        }
        const cuda::nccl_order_counts after = cuda::nccl_launch_order::counts();
        if (!capscope::detail::installed_breakage().nccl_order_skipped) {
            CHECK(after.host_waits - before.host_waits == 2 * launches);
            CHECK(after.stream_waits - before.stream_waits == launches);
            CHECK(after.events_recorded - before.events_recorded == (copied ? 0 : 3 * launches));
        }
        std::printf("  without NCCL's graph mixing, %s: %ld host waits, %ld stream waits, %ld events recorded in %d launches\n",
                    copied ? "copied" : "as captured", after.host_waits - before.host_waits, after.stream_waits - before.stream_waits,
                    after.events_recorded - before.events_recorded, 3 * launches);
    }
}

TEST_CASE("without NCCL's graph mixing, a graph holding NCCL work launched after an eager NCCL call on another stream runs after it") {
    // NCCL's graph-mixing wait ordered a graph's collectives after the eager ones before it; without
    // it, the order's event after the eager call does. The "eager call" is a slow kernel writing a
    // buffer that the graph, on another stream, reads. Broken on purpose (nccl_order_skipped), the
    // graph reads before it is written.
    constexpr int n = 1 << 16, rounds = 3;
    cuda::stream s, other;
    cuda::device_buffer<int> counter(1), value(1), staging(n), out(n);
    counter.fill_bytes(0, s);
    s.synchronize();
    const cuda::graph_exec reader = launchable(cuda::capture(other, [&](cudaStream_t on) { k::scale(out.data(), staging.data(), 1, n, on); }), true);
    const cuda::nccl_launch_order order(false);
    const cuda::nccl_order_counts before = cuda::nccl_launch_order::counts();
    std::vector<int> got(n);
    for (int round = 1; round <= rounds; ++round) {
        order.eager(s, [&] {
            k::add_one(counter.data(), s);
            k::slow_copy(value.data(), counter.data(), 1, slow_ns, s);
            k::fill_from(staging.data(), value.data(), 0, n, s);
        });
        order.launch(reader, other);
        out.copy_to_host(got, other);
        other.synchronize();
        const long wrong = long(std::count_if(got.begin(), got.end(), [&](int v) { return v != round; }));
        INFO("round ", round, ": the graph read ", wrong, " of ", n, " elements before the eager call had written them");
        CHECK(wrong == 0);
        s.synchronize();
    }
    const cuda::nccl_order_counts after = cuda::nccl_launch_order::counts();
    if (!capscope::detail::installed_breakage().nccl_order_skipped) CHECK(after.stream_waits - before.stream_waits == rounds);
}

TEST_CASE("with NCCL's graph mixing on, the order adds no call: NCCL orders its work itself") {
    cuda::stream s;
    cuda::device_buffer<int> counter(1);
    const cuda::graph_exec g = launchable(cuda::capture(s, [&](cudaStream_t on) { k::add_one(counter.data(), on); }), true);
    const cuda::nccl_launch_order order(true);
    const cuda::nccl_order_counts before = cuda::nccl_launch_order::counts();
    order.captured();
    for (int i = 0; i < 3; ++i) {
        order.launch(g, s);
        order.before_eager();
    }
    s.synchronize();
    const cuda::nccl_order_counts after = cuda::nccl_launch_order::counts();
    CHECK(after.host_waits == before.host_waits);
    CHECK(after.stream_waits == before.stream_waits);
    CHECK(after.capture_waits == before.capture_waits);
    CHECK(after.events_recorded == before.events_recorded);
    std::vector<int> c(1);
    counter.copy_to_host(c, s);
    s.synchronize();
    CHECK(c[0] >= 3); // launched all the same
}

namespace {
//! A backward hook that declares collective calls (so the runner treats its graph as NCCL's): the
//! step's counter into host memory, after a slow kernel.
struct slow_collective {
    const int* counter;
    int* seen;
    void operator()(backward_context& c) const { k::slow_copy(seen, counter, 1, slow_ns, c.stream()); }
    std::string collective_calls(int) const { return "a slow copy standing for NCCL's work"; }
};
} // namespace

TEST_CASE("without NCCL's graph mixing, a runner's eager collective after its hook graphs runs once they have finished (transformer_engine)") {
    // transformer_engine: the layers' backward hooks are graphs, the step-end stage that reduces what
    // lies outside the layers runs eagerly after them (as the example trainer's does), here reading on
    // the host what the hooks' graphs wrote. Broken on purpose (nccl_order_skipped), it reads the
    // last step's value.
    const scoped_environment off("NCCL_GRAPH_MIXING_SUPPORT", "0");
    cuda::stream s;
    data_parallel_model::dp_model m(0, s);
    cuda::pinned_buffer<int> seen(1);
    seen.data()[0] = 0;
    std::vector<int> read;
    hook_pipeline hooks{hook<hook_phase::backward, capturable, on_lane<1>, last_microbatch_only>("slow collective", slow_collective{m.counter.data(), seen.data()})};
    training_program p = m.program();
    stage host_read;
    host_read.name = "eager collective (host read)";
    host_read.kind = stage_kind_id("collective");
    host_read.lane = 1;
    host_read.collective_calls = "reads on the host what the hooks wrote";
    host_read.buffers_declared = true;
    host_read.forward = stream_fn::from([&](cudaStream_t) { read.push_back(int(*static_cast<volatile int*>(seen.data()))); });
    p.step_end.insert(p.step_end.begin(), host_read);
    using te = config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>;
    runner<te> r(with_hooks(std::move(p), hooks, m.tensors));
    const cuda::nccl_order_counts before = cuda::nccl_launch_order::counts();
    constexpr int steps = 5;
    for (int step = 1; step <= steps; ++step) r.step(s);
    s.synchronize();
    REQUIRE(read.size() == std::size_t(steps));
    CHECK(r.counters().replays > 0);
    for (int step = 2; step <= steps; ++step) { // (step 1 is the eager warmup: no graph to wait for)
        INFO("step ", step, ": the eager collective read ", read[std::size_t(step - 1)], " on the host");
        CHECK(read[std::size_t(step - 1)] == step);
    }
    const cuda::nccl_order_counts after = cuda::nccl_launch_order::counts();
    if (!capscope::detail::installed_breakage().nccl_order_skipped) {
        CHECK(after.host_waits - before.host_waits == steps - 1);
        CHECK(after.capture_waits - before.capture_waits >= 1);
    }
    std::printf("  without NCCL's graph mixing, transformer_engine: the eager step-end collective read this step's value in %d replayed "
                "steps (%ld host waits, %ld captures followed by a device wait)\n",
                steps - 1, after.host_waits - before.host_waits, after.capture_waits - before.capture_waits);
}

TEST_CASE("without NCCL's graph mixing, the order watches the last launch's graph but does not keep it: NCCL's plans go with the graph") {
    // The source graph of a copy holds NCCL's plans (its user objects), which must go before their
    // communicator does. The order keeps none alive, and once the copy is gone its end was waited
    // for: the next eager call or launch elsewhere waits for nothing, and touches no freed event.
    cuda::stream s, other;
    cuda::device_buffer<int> counter(1);
    counter.fill_bytes(0, s);
    s.synchronize();
    const cuda::nccl_launch_order order(false);
    const long graphs_before = cuda::detail::live_graph_count.load();
    {
        const cuda::graph_exec g = launchable(cuda::capture(s, [&](cudaStream_t on) { k::add_one(counter.data(), on); }), true);
        order.launch(g, s);
    }
    CHECK(cuda::detail::live_graph_count.load() == graphs_before);
    const cuda::graph_exec h = launchable(cuda::capture(other, [&](cudaStream_t on) { k::add_one(counter.data(), on); }), true);
    const cuda::nccl_order_counts before = cuda::nccl_launch_order::counts();
    order.launch(h, other); // another stream: nothing left to wait for
    order.before_eager();  // h's end
    const cuda::nccl_order_counts after = cuda::nccl_launch_order::counts();
    if (!capscope::detail::installed_breakage().nccl_order_skipped) {
        CHECK(after.stream_waits == before.stream_waits);
        CHECK(after.host_waits == before.host_waits + 1);
    }
    std::vector<int> c(1);
    counter.copy_to_host(c, other);
    other.synchronize();
    CHECK(c[0] == 2);
}

TEST_CASE("without NCCL's graph mixing, an inference runner's eager collectives run once its collective graphs have finished") {
    // A tensor-parallel server's forward, two layers: each attention stage makes collective calls
    // and is a per-layer graph; each MLP, outside the config's modules, is an eager island. Layer
    // 0's makes collective calls too, here reading on the host what layer 0's graph wrote; layer
    // 1's makes none, so it must wait for nothing. Then the second bucket's eager warmup, after the
    // first bucket's graphs, its replay, and past the largest bucket the eager forward, which reads
    // what the last graph wrote. Broken on purpose (nccl_order_skipped), they read earlier values.
    const scoped_environment off("NCCL_GRAPH_MIXING_SUPPORT", "0");
    cuda::stream s;
    cuda::device_buffer<int> counter(1);
    cuda::pinned_buffer<int> seen(1);
    counter.fill_bytes(0, s);
    seen.data()[0] = 0;
    s.synchronize();
    std::vector<int> island_read, oversize_read;
    auto attention = [&](int layer) {
        stage a;
        a.name = "layer" + std::to_string(layer) + ".attention (all-reduce)";
        a.layer = layer;
        a.captured_by = {capture_module::attention};
        a.collective_calls = "a slow copy standing for NCCL's work";
        a.buffers_declared = true;
        a.forward = stream_fn::from([c = counter.data(), to = seen.data()](cudaStream_t on) {
            k::add_one(c, on);
            k::slow_copy(to, c, 1, slow_ns, on);
        });
        return a;
    };
    stage mlp0;
    mlp0.name = "layer0.mlp (eager collective, host read)";
    mlp0.layer = 0;
    mlp0.captured_by = {capture_module::mlp};
    mlp0.kind = stage_kind_id("collective");
    mlp0.collective_calls = "reads on the host what layer 0's attention graph wrote";
    mlp0.buffers_declared = true;
    mlp0.forward = stream_fn::from([from = seen.data(), into = &island_read](cudaStream_t) {
        into->push_back(int(*static_cast<const volatile int*>(from)));
    });
    stage mlp1;
    mlp1.name = "layer1.mlp (no collective)";
    mlp1.layer = 1;
    mlp1.captured_by = {capture_module::mlp};
    mlp1.buffers_declared = true;
    mlp1.forward = stream_fn::from([](cudaStream_t) {});
    inference_program p;
    for (int size : {1, 2}) {
        p.buckets.push_back({attention(0), mlp0, attention(1), mlp1});
        p.bucket_sizes.push_back(size);
    }
    struct eager_forward_reads {
        const int* seen;
        std::vector<int>* into;
        void forward(cudaStream_t, int) { into->push_back(int(*static_cast<const volatile int*>(seen))); }
    } eager_forward{seen.data(), &oversize_read};
    p.eager_forward = sized_stream_fn::of<&eager_forward_reads::forward>(&eager_forward);
    using serve = config<impl::lazy_per_layer, inference::per_layer, modules<capture::attention>, warmup_steps<1>, buckets<1, 2>,
                         oversize_requests<oversize::run_eagerly>>;
    inference_runner<serve> r(std::move(p));
    REQUIRE(r.plan().graphs_per_bucket == 2);
    REQUIRE(r.plan().eager_islands_per_run() == 2);
    const cuda::nccl_order_counts before = cuda::nccl_launch_order::counts();
    constexpr int runs = 4; // in bucket 1; each run adds 2 to the counter
    for (int run = 1; run <= runs; ++run) r.run(1, s); // run 1 is the eager warmup: no graph to wait for
    r.run(2, s); // bucket 2's eager warmup: its first collective waits for run 4's layer-1 graph
    r.run(2, s); // bucket 2 captured and replayed
    r.run(3, s); // past the largest bucket: the eager forward, after bucket 2's layer-1 graph
    s.synchronize();
    REQUIRE(island_read.size() == std::size_t(runs + 2));
    REQUIRE(oversize_read.size() == 1);
    CHECK(r.counters().replays == 2 * (runs - 1) + 2);
    for (int run = 2; run <= runs; ++run) {
        INFO("run ", run, ": the eager collective island read ", island_read[std::size_t(run - 1)], " on the host");
        CHECK(island_read[std::size_t(run - 1)] == 2 * run - 1);
    }
    INFO("bucket 2's warmup read ", island_read[runs], ", its replay ", island_read[runs + 1], ", the eager forward past the largest bucket ",
         oversize_read[0]);
    CHECK(island_read[runs] == 2 * runs);         // what run 4's last graph wrote
    CHECK(island_read[runs + 1] == 2 * runs + 3); // its own layer-0 graph's
    CHECK(oversize_read[0] == 2 * runs + 4);
    const cuda::nccl_order_counts after = cuda::nccl_launch_order::counts();
    if (!capscope::detail::installed_breakage().nccl_order_skipped) {
        // Each replayed run's collective island, bucket 2's warmup once, the eager forward; layer
        // 1's island none.
        CHECK(after.host_waits - before.host_waits == (runs - 1) + 1 + 1 + 1);
        CHECK(after.capture_waits - before.capture_waits == 4);
    }
    std::printf("  without NCCL's graph mixing, an inference runner: its eager collective island read its run's value in %d replayed "
                "runs, bucket 2's warmup %d, its replay %d, the eager forward past the largest bucket %d (%ld host waits, %ld captures "
                "followed by a device wait)\n",
                runs - 1, island_read[runs], island_read[runs + 1], oversize_read[0], after.host_waits - before.host_waits,
                after.capture_waits - before.capture_waits);
}
