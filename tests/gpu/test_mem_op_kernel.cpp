// The kernel that graph copies run for memory-operation nodes (cuda/mem_op_kernel.hpp): held to
// CUDA's own nodes for every wait condition, later NCCL's shape of waits and resets, two streams that
// synchronise as NCCL 2.28's ranks do, and a copy seen whole before the kernel's flag; loaded
// ahead, so that neither a copy nor its instantiation waits for the device; kept as a node beside
// a cooperative kernel.

#include <capscope/cuda.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/mem_op_kernel.hpp>

#include "engine_kernels.hpp"
#include "mem_ops.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

using namespace capscope;
using namespace mem_ops;

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
    // NCCL's batch for n ranks after 2.28, and 2.28's with NVLink multicast (the flag itself sent
    // by a copy): a wait (EQ) for each other rank's flag, then a reset of every flag
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

TEST_CASE("memory operations as NCCL 2.28 orders two ranks: each writes its flag into the other's window, waits for the other's, resets its own") {
    // NCCL 2.28's batch for a copy-engine collective captured on n ranks (src/ce_coll.cc,
    // ncclPrepUCSync): a write of this rank's flag into each peer's window, a wait (EQ) for each
    // peer's flag in its own, then a reset of its own flags; once before the ranks' copies
    // ("ready": the peer's buffer is free) and once after ("complete": the copies have landed).
    // Two ranks here are two streams of one GPU, each launching its graph 50 times back to back,
    // with nothing from the host in between: rank 0 pushes its step count, rank 1 its count + 1000
    // after a 1 ms spin, and each adds what it received to a sum. A wait let through too early
    // adds what was there before, or a rank that outran the other loses a flag to a reset and
    // hangs (caught below). As captured (CUDA's nodes), copied (kernels), and one of each.
    REQUIRE(cuda::prepare_mem_op_kernel());
    constexpr int n = 1 << 20, steps = 50;
    constexpr unsigned sync_value = 0x600d; // NCCL's GRAPH_SYNC_VALUE's role: the flag a captured sync writes
    cuda::device_buffer<unsigned> windows(8); // rank, ready or complete, from whom
    auto flag = [&](int rank, int which, int from) { return windows.data() + rank * 4 + which * 2 + from; };
    cuda::device_buffer<int> counter(2), staging(n), send0(n), send1(n), recv0(n), recv1(n), sum0(n), sum1(n);
    int* send[2] = {send0.data(), send1.data()};
    int* recv[2] = {recv0.data(), recv1.data()};
    int* sum[2] = {sum0.data(), sum1.data()};
    auto sync = [&](int me, int which, cudaStream_t on) {
        const int peer = 1 - me;
        issue_batch({write_op(flag(peer, which, me), false, sync_value), wait_op(flag(me, which, peer), false, sync_value, CU_STREAM_WAIT_VALUE_EQ),
                     write_op(flag(me, which, 0), false, 0), write_op(flag(me, which, 1), false, 0)},
                    on);
    };
    auto step = [&](int me) {
        return [&, me](cudaStream_t on) {
            engine_kernels::add_one(counter.data() + me, on);
            if (me == 0) engine_kernels::fill_from(send[0], counter.data(), 0, n, on);
            else {
                engine_kernels::fill_from(staging.data(), counter.data() + 1, 1000, n, on);
                engine_kernels::slow_copy(send[1], staging.data(), n, 1'000'000, on); // the slower rank
            }
            sync(me, 0, on);
            CAPSCOPE_CHECK(cudaMemcpyAsync(recv[1 - me], send[me], n * sizeof(int), cudaMemcpyDeviceToDevice, on)); // pushed to the peer
            sync(me, 1, on);
            engine_kernels::add(sum[me], sum[me], recv[me], n, on);
        };
    };
    cuda::stream s0, s1, side;
    const cuda::stream* streams[2] = {&s0, &s1};
    const long expected[2] = {long(steps) * (steps + 1) / 2 + 1000L * steps, long(steps) * (steps + 1) / 2}; // what each receives, summed
    struct pairing {
        const char* name;
        bool kernels[2];
    };
    for (const pairing& p : {pairing{"both as captured", {false, false}}, pairing{"both copied, kernels", {true, true}},
                             pairing{"rank 0 as captured, rank 1 copied", {false, true}}}) {
        INFO(p.name);
        std::vector<cuda::graph_exec> execs;
        for (int me = 0; me < 2; ++me) {
            cuda::graph g = cuda::capture(s0, step(me));
            if (!p.kernels[me]) {
                execs.emplace_back(g);
                continue;
            }
            const cuda::copy_result c = cuda::without_user_objects(std::move(g));
            REQUIRE(c.refused.empty());
            CHECK(c.mem_op_kernels == 2);
            execs.emplace_back(c.copy);
        }
        windows.fill_bytes(0, side);
        counter.fill_bytes(0, side);
        sum0.fill_bytes(0, side);
        sum1.fill_bytes(0, side);
        side.synchronize();
        for (int k = 0; k < steps; ++k)
            for (int me = 0; me < 2; ++me) execs[std::size_t(me)].launch(*streams[me]);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while ((cudaStreamQuery(s0.get()) == cudaErrorNotReady || cudaStreamQuery(s1.get()) == cudaErrorNotReady) &&
               std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (cudaStreamQuery(s0.get()) == cudaErrorNotReady || cudaStreamQuery(s1.get()) == cudaErrorNotReady) {
            std::fprintf(stderr, "memory operations as NCCL 2.28's, %s: the two ranks still wait for each other after 20 s\n", p.name);
            std::abort(); // a held stream cannot be let go from here
        }
        for (int me = 0; me < 2; ++me) {
            std::vector<int> got(n);
            CAPSCOPE_CHECK(cudaMemcpy(got.data(), sum[me], n * sizeof(int), cudaMemcpyDeviceToHost));
            const long wrong = long(std::count_if(got.begin(), got.end(), [&](int v) { return long(v) != expected[me]; }));
            INFO("rank ", me, ": ", wrong, " of ", n, " sums wrong (element 0: ", got[0], ", expected ", expected[me], ")");
            CHECK(wrong == 0);
        }
        std::vector<unsigned> left(8);
        windows.copy_to_host(left, side);
        side.synchronize();
        CHECK(std::count(left.begin(), left.end(), 0u) == 8); // every flag reset
    }
    std::printf("  memory operations as NCCL 2.28's between two ranks (two streams): %d steps of flags written to the peer, waited for and reset, "
                "with 4 MiB pushed between them, summed right as captured, copied and mixed\n", steps);
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
