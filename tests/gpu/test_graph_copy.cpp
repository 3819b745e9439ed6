// cuda::without_user_objects (cuda/graph_copy.hpp): the copy computes what the source computes,
// keeps the source (and so its user objects) alive as long as anything launched from it may run,
// and its launches do not wait on the host, where the source's do once 28 are in flight.

#include <capscope/capscope.hpp>
#include <capscope/cuda.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/engine.hpp>

#include "engine_kernels.hpp"
#include "synthetic_stages.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
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

//! Stream memory operations (the node type NCCL's copy-engine collectives capture to order the
//! ranks' copies): a wait on the 32- or 64-bit value at `at` (`how`: CU_STREAM_WAIT_VALUE_*), a write.
CUstreamBatchMemOpParams wait_op(const void* at, bool wide, std::uint64_t value, unsigned how) {
    CUstreamBatchMemOpParams op{};
    op.waitValue.operation = wide ? CU_STREAM_MEM_OP_WAIT_VALUE_64 : CU_STREAM_MEM_OP_WAIT_VALUE_32;
    op.waitValue.address = reinterpret_cast<CUdeviceptr>(at);
    if (wide) op.waitValue.value64 = value;
    else op.waitValue.value = cuuint32_t(value);
    op.waitValue.flags = how;
    return op;
}
CUstreamBatchMemOpParams write_op(void* at, bool wide, std::uint64_t value, unsigned flags = CU_STREAM_WRITE_VALUE_DEFAULT) {
    CUstreamBatchMemOpParams op{};
    op.writeValue.operation = wide ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = reinterpret_cast<CUdeviceptr>(at);
    if (wide) op.writeValue.value64 = value;
    else op.writeValue.value = cuuint32_t(value);
    op.writeValue.flags = flags;
    return op;
}
//! The operations as one batch on `s` (one node when captured).
void issue_batch(std::vector<CUstreamBatchMemOpParams> ops, cudaStream_t s) {
    static const auto batch = cuda::detail::driver_entry<PFN_cuStreamBatchMemOp_v11070>("cuStreamBatchMemOp", 11070);
    CAPSCOPE_CHECK(batch(reinterpret_cast<CUstream>(s), unsigned(ops.size()), ops.data(), 0));
}

//! Writes `value` to `flag` and then waits for it there, as one batch.
void write_then_wait(unsigned* flag, unsigned value, cudaStream_t s) {
    issue_batch({write_op(flag, false, value), wait_op(flag, false, value, CU_STREAM_WAIT_VALUE_EQ)}, s);
}

//! How many nodes of type `t` `g` holds (the driver's type: the runtime has no name for a batch
//! of memory operations).
std::size_t nodes_of_type(const cuda::graph& g, cudaGraphNodeType t) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nodes.data(), &count));
    return std::size_t(std::count_if(nodes.begin(), nodes.end(), [&](cudaGraphNode_t n) { return cuda::node_type(n) == t; }));
}

bool device_attribute(CUdevice_attribute a) {
    static const auto get = cuda::detail::driver_entry<PFN_cuDeviceGetAttribute_v2000>("cuDeviceGetAttribute", 2000);
    int device = 0, value = 0;
    CAPSCOPE_CHECK(cudaGetDevice(&device));
    CAPSCOPE_CHECK(get(&value, a, CUdevice(device)));
    return value != 0;
}

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
        write_then_wait(flag.data(), 0x5eedu, side);
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

TEST_CASE("memory operations in a copied graph run as a kernel that waits and writes as the captured node does") {
    // Each case: one batch of a write ("started"), a wait on a word, and a write ("finished"),
    // captured, launched as captured and from the copy. With the word at a value the wait's
    // condition refuses, the stream must hold, with "started" written and "finished" not; with
    // the word then set to a value it takes, the stream must finish. The node is CUDA's own
    // reading of the condition, so a case that both follow is read alike. Broken on purpose
    // (mem_op_waits_skipped), the copy's kernel does not wait.
    struct wait_case {
        const char* name;
        bool wide;
        unsigned how;
        std::uint64_t value, refused, taken;
    };
    const wait_case cases[] = {
        {"GEQ, 32 bits", false, CU_STREAM_WAIT_VALUE_GEQ, 7, 3, 8},
        {"GEQ, 32 bits, past the wrap", false, CU_STREAM_WAIT_VALUE_GEQ, 0xfffffff0u, 0xffffffe0u, 5},
        {"EQ, 32 bits", false, CU_STREAM_WAIT_VALUE_EQ, 0x5eed, 0x5eec, 0x5eed},
        {"AND, 32 bits", false, CU_STREAM_WAIT_VALUE_AND, 0x0f00, 0x00ff, 0x0100},
        {"NOR, 32 bits", false, CU_STREAM_WAIT_VALUE_NOR, 0xffff0000u, 0xffffffffu, 0xfffffffeu},
        {"GEQ, 64 bits", true, CU_STREAM_WAIT_VALUE_GEQ, std::uint64_t(1) << 40, (std::uint64_t(1) << 40) - 1, std::uint64_t(1) << 40},
        {"EQ, 64 bits (the high half counts)", true, CU_STREAM_WAIT_VALUE_EQ, 0x100000005ull, 0x5, 0x100000005ull},
        {"NOR, 64 bits", true, CU_STREAM_WAIT_VALUE_NOR, 0, ~std::uint64_t(0), ~std::uint64_t(0) >> 1},
    };
    REQUIRE(cuda::prepare_mem_op_kernel());
    const bool has_nor = device_attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR),
               has_64 = device_attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS);
    cuda::stream s, side; // side: the host's reads and writes while s is held
    cuda::device_buffer<std::uint64_t> word(1);
    cuda::device_buffer<unsigned> marks(2); // started, finished
    int compared = 0;
    for (const wait_case& c : cases) {
        if ((c.how & 3u) == CU_STREAM_WAIT_VALUE_NOR && !has_nor) continue;
        if (c.wide && !has_64) continue;
        cuda::graph captured = cuda::capture(s, [&](cudaStream_t on) {
            issue_batch({write_op(marks.data(), false, 1), wait_op(word.data(), c.wide, c.value, c.how), write_op(marks.data() + 1, false, 1)}, on);
        });
        REQUIRE(nodes_of_type(captured, cuda::detail::batch_mem_op_node) == 1);
        cuda::graph captured_again = cuda::capture(s, [&](cudaStream_t on) {
            issue_batch({write_op(marks.data(), false, 1), wait_op(word.data(), c.wide, c.value, c.how), write_op(marks.data() + 1, false, 1)}, on);
        });
        const cuda::copy_result copy = cuda::without_user_objects(std::move(captured_again));
        REQUIRE(copy.refused.empty());
        CHECK(copy.mem_op_kernels == 1);
        CHECK(copy.mem_op_nodes_kept == 0);
        CHECK(nodes_of_type(copy.copy, cuda::detail::batch_mem_op_node) == 0);
        CHECK(nodes_of_type(copy.copy, cudaGraphNodeTypeKernel) == 1);
        const std::pair<const char*, cuda::graph_exec> execs[] = {{"as captured", cuda::graph_exec(captured)},
                                                                   {"copied, a kernel", cuda::graph_exec(copy.copy)}};
        for (const auto& [what, exec] : execs) {
            INFO(c.name, ", ", what);
            std::vector<std::uint64_t> w{c.refused};
            std::vector<unsigned> m(2, 0);
            word.copy_from_host(w, side);
            marks.copy_from_host(m, side);
            side.synchronize();
            exec.launch(s);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const bool held = cudaStreamQuery(s.get()) == cudaErrorNotReady;
            marks.copy_to_host(m, side);
            side.synchronize();
            CHECK(held);
            CHECK(m[0] == 1u); // written before the wait
            CHECK(m[1] == 0u); // not past it
            w[0] = c.taken;
            word.copy_from_host(w, side);
            side.synchronize();
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            while (cudaStreamQuery(s.get()) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            if (cudaStreamQuery(s.get()) == cudaErrorNotReady) {
                std::fprintf(stderr, "memory operations test: %s, %s: the stream still waits 5 s after the word took a value the wait takes\n", c.name, what);
                std::abort(); // a held stream cannot be let go from here
            }
            marks.copy_to_host(m, side);
            side.synchronize();
            CHECK(m[1] == 1u);
        }
        ++compared;
    }
    CHECK(compared >= 5);
    // A batch as large as the kernel takes is converted; one more operation, and it is kept.
    std::vector<CUstreamBatchMemOpParams> many;
    for (unsigned i = 0; i < cuda::detail::mem_op_batch::capacity; ++i) many.push_back(write_op(marks.data(), false, i));
    const cuda::copy_result full = cuda::without_user_objects(cuda::capture(s, [&](cudaStream_t on) { issue_batch(many, on); }));
    CHECK(full.mem_op_kernels == 1);
    many.push_back(write_op(marks.data(), false, 7));
    const cuda::copy_result kept = cuda::without_user_objects(cuda::capture(s, [&](cudaStream_t on) { issue_batch(many, on); }));
    REQUIRE(kept.refused.empty());
    CHECK(kept.mem_op_nodes_kept == 1);
    CHECK(nodes_of_type(kept.copy, cuda::detail::batch_mem_op_node) == 1);
    const cuda::graph_exec run_full(full.copy); // its last write wins: capacity - 1
    run_full.launch(s);
    std::vector<unsigned> last(2);
    marks.copy_to_host(last, s);
    s.synchronize();
    CHECK(last[0] == cuda::detail::mem_op_batch::capacity - 1);
    // ... and everything, with the seam the bench compares by.
    capscope::detail::installed_breakage().keep_mem_op_nodes = true;
    cuda::graph plain = cuda::capture(s, [&](cudaStream_t on) { write_then_wait(marks.data(), 3, on); });
    const cuda::copy_result as_nodes = cuda::without_user_objects(std::move(plain));
    capscope::detail::installed_breakage().keep_mem_op_nodes = false;
    CHECK(nodes_of_type(as_nodes.copy, cuda::detail::batch_mem_op_node) == 1);
    std::printf("  memory operations: %d wait conditions held and let go alike by the captured node and by the copy's kernel; a batch of the kernel's capacity converted, one past it kept as a node\n",
                compared);
}

TEST_CASE("memory operations as NCCL orders two ranks: waits on several flags, then their resets, and the data before a flag seen with it") {
    REQUIRE(cuda::prepare_mem_op_kernel());
    cuda::stream s, side;
    // NCCL's batch for n ranks: a wait (EQ) for each other rank's flag, then a reset of every flag
    // (src/ce_coll.cc). Released one flag at a time, the stream must hold until the last.
    constexpr int others = 3;
    cuda::device_buffer<unsigned> flags(others), marks(1);
    auto nccl_like = [&](cudaStream_t on) {
        std::vector<CUstreamBatchMemOpParams> ops;
        for (int r = 0; r < others; ++r) ops.push_back(wait_op(flags.data() + r, false, 0x600d, CU_STREAM_WAIT_VALUE_EQ));
        for (int r = 0; r < others; ++r) ops.push_back(write_op(flags.data() + r, false, 0));
        issue_batch(ops, on);
        issue_batch({write_op(marks.data(), false, 1)}, on);
    };
    const cuda::graph captured = cuda::capture(s, nccl_like);
    const cuda::copy_result copy = cuda::without_user_objects(cuda::capture(s, nccl_like));
    REQUIRE(copy.refused.empty());
    CHECK(copy.mem_op_kernels == 2);
    const std::pair<const char*, cuda::graph_exec> execs[] = {{"as captured", cuda::graph_exec(captured)}, {"copied, kernels", cuda::graph_exec(copy.copy)}};
    for (const auto& [what, exec] : execs) {
        INFO(what);
        std::vector<unsigned> f(others, 0), m(1, 0);
        flags.copy_from_host(f, side);
        marks.copy_from_host(m, side);
        side.synchronize();
        exec.launch(s);
        for (int r = 0; r < others; ++r) {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            CHECK(cudaStreamQuery(s.get()) == cudaErrorNotReady); // flags 0..r-1 set, r not yet
            std::vector<unsigned> one{0x600d};
            CAPSCOPE_CHECK(cudaMemcpyAsync(flags.data() + r, one.data(), sizeof(unsigned), cudaMemcpyHostToDevice, side));
            side.synchronize();
        }
        s.synchronize();
        flags.copy_to_host(f, s);
        marks.copy_to_host(m, s);
        s.synchronize();
        CHECK(m[0] == 1u);
        CHECK(std::count(f.begin(), f.end(), 0u) == others); // every flag reset
    }
    // The data before a flag: a copy fills a pinned buffer, then the kernel writes the flag there
    // too; the host, polling the flag, must see the whole buffer. 100 rounds, a value each.
    constexpr std::size_t n = std::size_t(4) << 20;
    cuda::device_buffer<unsigned> pattern(n);
    cuda::pinned_buffer<unsigned> seen(n), flag(1);
    *static_cast<volatile unsigned*>(flag.data()) = 0;
    int wrong_rounds = 0;
    for (unsigned round = 1; round <= 100; ++round) {
        std::vector<unsigned> fill(n, round);
        pattern.copy_from_host(fill, side);
        side.synchronize();
        const cuda::copy_result mp = cuda::without_user_objects(cuda::capture(s, [&](cudaStream_t on) {
            CAPSCOPE_CHECK(cudaMemcpyAsync(seen.data(), pattern.data(), pattern.bytes(), cudaMemcpyDeviceToHost, on));
            issue_batch({write_op(flag.data(), false, round)}, on);
        }));
        REQUIRE(mp.mem_op_kernels == 1);
        const cuda::graph_exec exec(mp.copy);
        exec.launch(s);
        while (*static_cast<volatile unsigned*>(flag.data()) != round) {
        }
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) wrong += static_cast<volatile unsigned*>(seen.data())[i] != round;
        wrong_rounds += wrong != 0;
        s.synchronize();
    }
    CHECK(wrong_rounds == 0);
    std::printf("  memory operations as NCCL's: %d flags waited for one by one and reset, as captured and copied; a 16 MiB copy seen whole "
                "with the kernel's flag after it, 100 of 100 rounds\n", others);
}

TEST_CASE("a copy and its instantiation do not wait for the device, and a graph with a cooperative kernel keeps its memory operations") {
    REQUIRE(cuda::prepare_mem_op_kernel());
    cuda::stream s, held;
    cuda::device_buffer<unsigned> flag(1);
    flag.fill_bytes(0, s);
    s.synchronize();
    auto batch = [&](cudaStream_t on) { write_then_wait(flag.data(), 0x5eed, on); };
    // The device held by a kernel that spins until the host lets it go: copying must not wait.
    static cuda::pinned_buffer<int> release(1);
    *static_cast<volatile int*>(release.data()) = 0;
    engine_kernels::hang_until(release.data(), held);
    const auto started = std::chrono::steady_clock::now();
    const cuda::copy_result copy = cuda::without_user_objects(cuda::capture(s, batch));
    const cuda::graph_exec instantiated(copy.copy); // (loading the kernel here would wait too)
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    *static_cast<volatile int*>(release.data()) = 1;
    held.synchronize();
    CHECK(copy.mem_op_kernels == 1);
    CHECK(seconds < 1.0);
    // A kernel marked cooperative (it would need every SM at once): the copy keeps the node.
    cuda::device_buffer<int> counter(1);
    cuda::graph g = cuda::capture(s, [&](cudaStream_t on) {
        engine_kernels::add_one(counter.data(), on);
        batch(on);
    });
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nodes.data(), &count));
    for (cudaGraphNode_t node : nodes)
        if (cuda::node_type(node) == cudaGraphNodeTypeKernel) {
            cudaLaunchAttributeValue v{};
            v.cooperative = 1;
            CAPSCOPE_CHECK(cudaGraphKernelNodeSetAttribute(node, cudaLaunchAttributeCooperative, &v));
        }
    const cuda::copy_result kept = cuda::without_user_objects(std::move(g));
    REQUIRE(kept.refused.empty());
    CHECK(kept.mem_op_kernels == 0);
    CHECK(kept.mem_op_nodes_kept == 1);
    std::printf("  copied and instantiated in %.3f s while the device was held (%zu memory operations as a kernel); beside a cooperative kernel the node is kept\n",
                seconds, copy.mem_op_kernels);
}
