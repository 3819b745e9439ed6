// NCCL's copy-engine collectives across ranks, with the memory operations that order them run as
// kernels (cuda/mem_op_kernel.hpp) where a graph copy put them: one process per GPU
// (`mpirun -np 2` or more; alone it is one rank, whose collectives NCCL orders with nothing).
// What the one-GPU tests of the kernel (test_mem_op_kernel.cpp) cannot show, this does: the
// kernel's flag stored into a peer GPU's window after the copy engines' writes to that peer, and
// seen there with them; and a rank that runs ahead of a slow one without a flag lost to a reset.

#include "engine_kernels.hpp"
#include "mpi_support.hpp"

#include <capscope/cuda.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/mem_op_kernel.hpp>
#include <capscope/cuda/nccl_window.hpp>

#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

using namespace capscope;
using support::comm;
using support::mpi;
namespace k = engine_kernels;

TEST_CASE("NCCL's copy-engine all-gather and all-to-all with their memory operations as kernels: 100 steps back to back, "
          "the last rank late, every element exact on every rank") {
    // Each step, rank r sends its step count + 1000 r from a part of n to be all-gathered, and its
    // count + 1000 r + 10 j to rank j in an all-to-all; each rank adds what it received to two
    // sums. Before each collective the last rank runs a kernel whose blocks each sleep 1 ms (a few
    // ms in all), and the steps are launched back to back with nothing from the host in between,
    // so every wait of the others holds. A wait let through too early adds what a buffer held
    // before (or a step that a fast rank pushed later); a flag lost to a reset hangs (caught
    // below). As captured (CUDA's nodes), copied (kernels), and rank 0 as captured with the others
    // copied. Broken on purpose (mem_op_waits_skipped): the sums go wrong.
    comm(); // first: it makes this rank's GPU current, and the kernel is loaded into the current one
    REQUIRE(cuda::prepare_mem_op_kernel());
    const int ranks = mpi().size(), me = mpi().rank();
    if (ranks < 2) {
        MESSAGE("one rank: NCCL orders nothing across ranks; run under mpirun -np 2 (scripts/multi-gpu-check.sh)");
        return;
    }
    static cuda::nccl_communicator copy_engines = cuda::communicator_from_mpi(mpi(), {cuda::nccl_cta_policy::zero});
    constexpr int n = 1 << 20, steps = 100;
    constexpr unsigned late_ns = 1'000'000;
    const bool late = me == ranks - 1;
    const int all = n * ranks;
    const auto all_elements = static_cast<std::size_t>(all);
    cuda::stream s;
    cuda::nccl_symmetric_buffer<int> part(copy_engines, n), whole(copy_engines, all_elements), from(copy_engines, all_elements),
        to(copy_engines, all_elements);
    cuda::device_buffer<int> counter(1), staging(all_elements), gathered_sum(all_elements), scattered_sum(all_elements);
    auto step = [&](cudaStream_t on) {
        k::add_one(counter.data(), on);
        // Block j of `from` (and of `staging`): count + 1000 me + 10 j; the part is block 0's value.
        int* blocks = late ? staging.data() : from.data();
        for (int j = 0; j < ranks; ++j) k::fill_from(blocks + std::size_t(j) * n, counter.data(), 1000 * me + 10 * j, n, on);
        if (late) k::slow_copy(part.data(), staging.data(), n, late_ns, on);
        else k::fill_from(part.data(), counter.data(), 1000 * me, n, on);
        CAPSCOPE_CHECK(ncclAllGather(part.data(), whole.data(), n, ncclInt32, copy_engines.get(), on));
        k::add(gathered_sum.data(), gathered_sum.data(), whole.data(), all, on);
        if (late) k::slow_copy(from.data(), staging.data(), all, late_ns, on);
        CAPSCOPE_CHECK(ncclAlltoAll(from.data(), to.data(), n, ncclInt32, copy_engines.get(), on));
        k::add(scattered_sum.data(), scattered_sum.data(), to.data(), all, on);
    };
    auto reset = [&] {
        counter.fill_bytes(0, s);
        gathered_sum.fill_bytes(0, s);
        scattered_sum.fill_bytes(0, s);
    };
    // Received part r holds, summed over the steps, 1 + ... + steps + (1000 r + `extra`) steps:
    // extra 0 all-gathered, 10 me from the all-to-all.
    auto wrong_in = [&](const cuda::device_buffer<int>& sum, int ran, int extra) {
        std::vector<int> got(all_elements, 0);
        CAPSCOPE_CHECK(cudaMemcpy(got.data(), sum.data(), got.size() * sizeof(int), cudaMemcpyDeviceToHost));
        auto expected = [&](std::size_t i) { return ran * (ran + 1) / 2 + (1000 * int(i / n) + extra) * ran; };
        long wrong = 0;
        for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected(i);
        if (wrong) std::fprintf(stderr, "rank %d: %ld of %d sums wrong (element 0: %d, expected %d)\n", me, wrong, all, got[0], expected(0));
        return wrong;
    };
    // NCCL sets up its copy-engine state at a communicator's first such collective, which a capture forbids.
    reset();
    step(s.get());
    s.synchronize();
    CHECK(wrong_in(gathered_sum, 1, 0) == 0);
    CHECK(wrong_in(scattered_sum, 1, 10 * me) == 0);

    struct pairing {
        const char* name;
        bool copied; // this rank's graph copied, its memory operations as kernels
    };
    for (const pairing& p : {pairing{"every rank as captured", false}, pairing{"every rank copied, kernels", true},
                             pairing{"rank 0 as captured, the others copied", me != 0}}) {
        INFO(p.name, ", rank ", me);
        cuda::graph g = cuda::capture(s, step);
        std::size_t kernels = 0, kept = 0, thinned = 0;
        if (p.copied) {
            cuda::copy_result c = cuda::without_user_objects(std::move(g));
            REQUIRE(c.refused.empty());
            kernels = c.mem_op_kernels;
            kept = c.mem_op_nodes_kept;
            thinned = c.event_records_dropped;
            g = std::move(c.copy);
            CHECK(kernels >= 4); // two collectives, each a batch before its copies and one after (NCCL may sync within a long batch too)
            CHECK(kept == 0);
        }
        const cuda::graph_exec exec(g);
        reset();
        s.synchronize();
        MPI_Barrier(MPI_COMM_WORLD); // (not needed for the order: every rank starts the pairing together, so the late rank is late)
        // A hang (a flag lost to a reset) is ended here: a launch of the graph as captured blocks
        // once about 28 are in flight (NCCL's user object), so the watch runs beside the launches.
        std::atomic<bool> finished{false};
        std::thread watch([&] {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (!finished && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            if (finished) return;
            std::fprintf(stderr, "copy-engine collectives, %s: rank %d still waits after 60 s\n", p.name, me);
            std::abort(); // a held stream cannot be let go from here; mpirun ends the other ranks
        });
        struct stop_watch { // (also where a launch throws: a joinable thread would end the process)
            std::atomic<bool>& finished;
            std::thread& watch;
            ~stop_watch() {
                finished = true;
                watch.join();
            }
        };
        {
            const stop_watch stop{finished, watch};
            for (int k = 0; k < steps; ++k) exec.launch(s);
            CAPSCOPE_CHECK(cudaStreamSynchronize(s.get()));
        }
        const long wrong = wrong_in(gathered_sum, steps, 0) + wrong_in(scattered_sum, steps, 10 * me);
        CHECK(wrong == 0);
        if (me == 0)
            std::printf("  copy-engine all-gather and all-to-all, %s: %d ranks, %d steps back to back, the last rank late, %s on rank 0 "
                        "(%zu memory-operation batches as kernels, %zu kept; %zu event records thinned)\n",
                        p.name, ranks, steps, wrong == 0 ? "exact" : "WRONG", kernels, kept, thinned);
    }
}
