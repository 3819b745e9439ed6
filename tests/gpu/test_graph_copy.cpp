// cuda::without_user_objects (cuda/graph_copy.hpp): the copy computes what the source computes,
// keeps the source (and so its user objects) alive as long as anything launched from it may run,
// and its launches do not wait on the host, where the source's do once 28 are in flight.

#include <capscope/capscope.hpp>
#include <capscope/cuda.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/engine.hpp>

#include "engine_kernels.hpp"
#include "mem_ops.hpp"
#include "synthetic_stages.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

using namespace capscope;

namespace {

std::atomic<int> host_calls{0};
std::atomic<bool> user_object_destroyed{false};

//! A user object, moved into `g`, whose destructor says when CUDA let go of it (as NCCL's plan
//! destructor would run).
void attach_user_object(cudaGraph_t g) {
    cudaUserObject_t object = nullptr;
    CAPSCOPE_CHECK(cudaUserObjectCreate(&object, nullptr, [](void*) { user_object_destroyed = true; }, 1, cudaUserObjectNoDestructorSync));
    CAPSCOPE_CHECK(cudaGraphRetainUserObject(g, object, 1, cudaGraphUserObjectMove));
}

bool destroyed_within(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!user_object_destroyed && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return user_object_destroyed;
}

//! Holds the device until the host lets it go, launches `enqueue()`, and says whether the launches
//! waited for the device: a helper thread lets it go after 3 s if they have not all returned.
template <class Enqueue>
bool launches_waited(cudaStream_t s, Enqueue&& enqueue) {
    static cuda::pinned_buffer<int> release(1);
    *static_cast<volatile int*>(release.data()) = 0;
    engine_kernels::hang_until(release.data(), s);
    std::atomic<bool> enqueued{false}, let_go{false};
    std::thread helper([&] {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
        while (!enqueued && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!enqueued) let_go = true;
        *static_cast<volatile int*>(release.data()) = 1;
    });
    enqueue();
    enqueued = true;
    helper.join();
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return bool(let_go);
}

//! Layers whose forward adds one to a counter and, when captured, gives the graph a user object,
//! as NCCL does to every graph it is captured into.
struct layers_holding_user_objects {
    static constexpr int layers = 4;
    synthetic::ints counter{1};
    void forward(cudaStream_t s) {
        engine_kernels::add_one(counter.data(), s);
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaGraph_t g = nullptr;
        CAPSCOPE_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &g, nullptr, nullptr, nullptr));
        if (status == cudaStreamCaptureStatusActive) attach_user_object(g);
    }
    training_program program() {
        training_program p;
        p.microbatches.emplace_back();
        for (int l = 0; l < layers; ++l) {
            stage st = synthetic::make_stage("layer" + std::to_string(l) + ".mlp", l, {capture_module::mlp},
                                             stream_fn::of<&layers_holding_user_objects::forward>(this), {});
            st.inputs = {synthetic::ref(counter)};
            st.outputs = {synthetic::ref(counter)};
            p.microbatches[0].push_back(st);
        }
        return p;
    }
};

} // namespace

TEST_CASE("a graph copied without its user objects computes what the source computes, and keeps the source alive") {
    cuda::stream s, side;
    cuda::event fork, join, external;
    constexpr int n = 4096;
    cuda::device_buffer<int> in(n), tripled(n), copied(n), counter(1), child_counter(1);
    cuda::device_buffer<unsigned> flag(1);
    flag.fill_bytes(0, s);
    std::vector<int> host_in(n);
    for (int i = 0; i < n; ++i) host_in[std::size_t(i)] = i * 7 - 1000;
    in.copy_from_host(host_in, s);
    counter.fill_bytes(0, s);
    child_counter.fill_bytes(0, s);
    s.synchronize();
    host_calls = 0;
    user_object_destroyed = false;

    // Every node type the copy takes: memset, kernels on two streams joined by events, a host
    // function, a batch of memory operations, a memcpy, and (added after the capture) a child graph.
    cuda::graph g = cuda::capture(s, [&](cudaStream_t on) {
        CAPSCOPE_CHECK(cudaMemsetAsync(tripled.data(), 0xff, tripled.bytes(), on));
        fork.record(on);
        fork.wait_on(side);
        engine_kernels::add_one(counter.data(), side);
        mem_ops::write_then_wait(flag.data(), 0x5eedu, side);
        join.record(side);
        engine_kernels::scale(tripled.data(), in.data(), 3, n, on);
        CAPSCOPE_CHECK(cudaLaunchHostFunc(on, [](void*) { ++host_calls; }, nullptr));
        join.wait_on(on);
        // An event record and an event wait node (external events: kept as nodes, not turned into edges).
        CAPSCOPE_CHECK(cudaEventRecordWithFlags(external.get(), on, cudaEventRecordExternal));
        CAPSCOPE_CHECK(cudaStreamWaitEvent(on, external.get(), cudaEventWaitExternal));
        CAPSCOPE_CHECK(cudaMemcpyAsync(copied.data(), tripled.data(), tripled.bytes(), cudaMemcpyDeviceToDevice, on));
    });
    const cuda::graph child = cuda::capture(s, [&](cudaStream_t on) { engine_kernels::add_one(child_counter.data(), on); });
    cudaGraphNode_t child_node = nullptr;
    CAPSCOPE_CHECK(cudaGraphAddChildGraphNode(&child_node, g.get(), nullptr, 0, child.get()));
    attach_user_object(g.get());
    const std::size_t nodes = g.node_count();

    std::optional<cuda::graph_exec> exec;
    {
        cuda::copy_result r = cuda::without_user_objects(std::move(g));
        INFO("refused: ", r.refused);
        CHECK(r.refused.empty());
        CHECK(r.copy.node_count() == nodes + 1); // and the event record node that says when a launch is done
        REQUIRE(r.copy.keeps_alive());
        exec.emplace(r.copy);
    } // the copy is gone; the executable graph holds the source
    for (int replay = 0; replay < 3; ++replay) exec->launch(s);
    std::vector<int> back(n), counts(1), child_counts(1);
    std::vector<unsigned> flags(1);
    flag.copy_to_host(flags, s);
    copied.copy_to_host(back, s);
    counter.copy_to_host(counts, s);
    child_counter.copy_to_host(child_counts, s);
    s.synchronize();
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += back[std::size_t(i)] != 3 * host_in[std::size_t(i)];
    CHECK(wrong == 0);
    CHECK(counts[0] == 3);
    CHECK(child_counts[0] == 3);
    CHECK(host_calls == 3);
    CHECK(flags[0] == 0x5eedu);
    CHECK_FALSE(destroyed_within(std::chrono::milliseconds(200))); // the source's user object lives while the copy's executable does
    exec.reset();
    CHECK(destroyed_within(std::chrono::milliseconds(2000)));
    std::printf("  copied: %zu nodes (memset, 2 kernels, event record and wait, host, memory operations, memcpy, child graph), 3 replays correct; the user object released with the last executable\n", nodes);
}

TEST_CASE("launches of the copy do not wait while the device is held, where the source's wait once 28 are in flight") {
    // The device is held by a kernel that spins until the host lets it go. Then 64 launches of a
    // graph holding a user object: if a launch waits for the device, a helper thread lets the
    // device go after 3 s, and the launches are known to have waited.
    cuda::stream s;
    cuda::device_buffer<int> counter(1);
    counter.fill_bytes(0, s);
    s.synchronize();
    const cuda::graph source = cuda::capture(s, [&](cudaStream_t on) { engine_kernels::add_one(counter.data(), on); });
    attach_user_object(source.get());
    cuda::graph source_again = cuda::capture(s, [&](cudaStream_t on) { engine_kernels::add_one(counter.data(), on); });
    attach_user_object(source_again.get());
    const cuda::copy_result copy = cuda::without_user_objects(std::move(source_again));
    REQUIRE(copy.refused.empty());

    const cuda::graph_exec copied_exec(copy.copy), source_exec(source);
    auto sixty_four = [&](const cuda::graph_exec& exec) {
        return [&] {
            for (int i = 0; i < 64; ++i) exec.launch(s);
        };
    };
    CHECK_FALSE(launches_waited(s, sixty_four(copied_exec)));
    CHECK(launches_waited(s, sixty_four(source_exec))); // CUDA's behaviour that the copy exists for: if this fails, CUDA no longer waits
    std::vector<int> count(1);
    counter.copy_to_host(count, s);
    s.synchronize();
    CHECK(count[0] == 128);
    std::printf("  64 launches of the copy enqueued while the device was held; those of the source waited for it\n");
}

TEST_CASE("the source outlives launches of its copy still queued when the last executable graph goes") {
    cuda::stream s;
    cuda::device_buffer<int> counter(1);
    counter.fill_bytes(0, s);
    s.synchronize();
    user_object_destroyed = false;
    cuda::graph g = cuda::capture(s, [&](cudaStream_t on) { engine_kernels::add_one(counter.data(), on); });
    attach_user_object(g.get());
    std::optional<cuda::graph_exec> exec;
    {
        const cuda::copy_result r = cuda::without_user_objects(std::move(g));
        REQUIRE(r.refused.empty());
        exec.emplace(r.copy);
    }
    static cuda::pinned_buffer<int> release(1);
    *static_cast<volatile int*>(release.data()) = 0;
    engine_kernels::hang_until(release.data(), s);
    for (int i = 0; i < 3; ++i) exec->launch(s);
    std::atomic<bool> destroyed_while_queued{true};
    std::thread helper([&] { // the executable graph goes while its launches wait behind the held device
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        destroyed_while_queued = bool(user_object_destroyed);
        *static_cast<volatile int*>(release.data()) = 1;
    });
    exec.reset(); // waits for the copy's last launch, then lets the source go
    helper.join();
    CHECK_FALSE(destroyed_while_queued);
    CHECK(destroyed_within(std::chrono::milliseconds(2000)));
    std::vector<int> count(1);
    counter.copy_to_host(count, s);
    s.synchronize();
    CHECK(count[0] == 3);
}

TEST_CASE("a graph with a node the copy does not take is kept as captured, and the refusal names the node") {
    cudaGraph_t raw = nullptr;
    CAPSCOPE_CHECK(cudaGraphCreate(&raw, 0));
    cuda::graph g(raw);
    cudaGraphConditionalHandle handle{};
    CAPSCOPE_CHECK(cudaGraphConditionalHandleCreate(&handle, g.get(), 0, cudaGraphCondAssignDefault));
    cudaGraphNodeParams params{};
    params.type = cudaGraphNodeTypeConditional;
    params.conditional.handle = handle;
    params.conditional.type = cudaGraphCondTypeIf;
    params.conditional.size = 1;
    cudaGraphNode_t node = nullptr;
    CAPSCOPE_CHECK(cudaGraphAddNode(&node, g.get(), nullptr, nullptr, 0, &params));
    cudaGraphNode_t body = nullptr;
    CAPSCOPE_CHECK(cudaGraphAddEmptyNode(&body, params.conditional.phGraph_out[0], nullptr, 0));
    const cudaGraph_t before = g.get();
    cuda::copy_result r = cuda::without_user_objects(std::move(g));
    CHECK(r.refused == "a conditional node");
    CHECK(r.copy.get() == before); // the source itself, still usable
    CHECK_FALSE(r.copy.keeps_alive());
    cuda::stream s;
    const cuda::graph_exec exec(r.copy);
    exec.launch(s);
    s.synchronize();
}

TEST_CASE("a runner's per-layer graphs holding user objects (as NCCL's do) are launched from copies: a step runs ahead of the device") {
    // 4 layers, each its own graph holding a user object: 16 steps are 64 launches, past the 28 in
    // flight that CUDA allows graphs holding one. Broken on purpose (keep_user_objects), the
    // runner instantiates them as captured, and the launches wait.
    cuda::stream s;
    layers_holding_user_objects m;
    m.counter.fill_bytes(0, s);
    runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>, no_nan_check>> r(m.program());
    r.step(s);
    r.step(s);
    CHECK(r.counters().user_object_copies == 4);
    CHECK(r.counters().copies_refused == 0);
    const bool waited = launches_waited(s, [&] {
        for (int i = 0; i < 16; ++i) r.step(s);
    });
    CHECK_FALSE(waited);
    std::vector<int> count(1);
    m.counter.copy_to_host(count, s);
    s.synchronize();
    CHECK(count[0] == 4 * 18);
    std::printf("  16 steps of 4 per-layer graphs (64 launches) enqueued while the device was held: %s\n", waited ? "the launches WAITED" : "none waited");
}
