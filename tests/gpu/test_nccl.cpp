// NCCL calls go through the same checked-call facility as CUDA and cuBLAS.

#include <capscope/cuda.hpp>
#include <capscope/cuda/nccl.hpp>
#include <capscope/parallel/nccl_watchdog.hpp>

#include "engine_kernels.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

using namespace capscope;

TEST_CASE("a failed NCCL call names the call, the library's error string and the scope") {
    ncclUniqueId id{};
    CAPSCOPE_CHECK(ncclGetUniqueId(&id));
    cuda::scope_label label("layer0.attention");
    try {
        cuda::nccl_communicator comm(1, id, 3); // rank 3 of a 1-rank communicator
        FAIL("NCCL accepted rank 3 of 1");
    } catch (const cuda::error& e) {
        std::printf("  %s\n", e.what());
        CHECK(e.which() == cuda::library::nccl);
        CHECK(e.code() == ncclInvalidArgument);
        CHECK(e.call() == "ncclCommInitRank(comm_.out(), ranks, id, rank)");
        CHECK(std::string(e.what()).find("NCCL error: ncclCommInitRank(") == 0);
        CHECK(e.scope() == "layer0.attention");
    }
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
TEST_CASE("a communicator for copy-engine collectives loads the kernel that graph copies run for their memory operations") {
    // Nothing else in this program loads it: without the communicator's load, graph copies would
    // keep NCCL's memory-operation nodes, whose work CUDA does on the host at every launch.
    REQUIRE(cuda::detail::mem_op_function_here() == nullptr);
    ncclUniqueId id{};
    CAPSCOPE_CHECK(ncclGetUniqueId(&id));
    const cuda::nccl_communicator comm(1, id, 0, {cuda::nccl_cta_policy::zero});
    CHECK(cuda::detail::mem_op_function_here() != nullptr);
}
#endif

TEST_CASE("an all-reduce that is not the identity, eagerly and inside a captured graph, into a poisoned buffer") {
    // One rank's plain sum is the identity, which a skipped collective would also "compute". A
    // pre-multiplied sum (ncclRedOpCreatePreMulSum) scales the input: 3 * x on one rank, and on
    // every rank the sum of 3 * x over the ranks. Out of place, into a buffer of NaNs.
    ncclUniqueId id{};
    CAPSCOPE_CHECK(ncclGetUniqueId(&id));
    cuda::nccl_communicator comm(1, id, 0);
    cuda::stream s;
    constexpr std::size_t n = 1 << 16;
    cuda::device_buffer<float> x(n), y(n);
    std::vector<float> host(n), want(n);
    for (std::size_t i = 0; i < n; ++i) {
        host[i] = float(i % 1000) * 0.5f - 100.f;
        want[i] = 3.f * host[i];
    }
    x.copy_from_host(host, s);
    float scale = 3.f;
    ncclRedOp_t times3{};
    CAPSCOPE_CHECK(ncclRedOpCreatePreMulSum(&times3, &scale, ncclFloat, ncclScalarHostImmediate, comm.get()));
    auto poison = [&] { CAPSCOPE_CHECK(cudaMemsetAsync(y.data(), 0xff, y.bytes(), s)); };
    auto result = [&] {
        std::vector<float> back(n);
        y.copy_to_host(back, s);
        s.synchronize();
        return back;
    };
    poison();
    CAPSCOPE_CHECK(ncclAllReduce(x.data(), y.data(), n, ncclFloat, times3, comm.get(), s));
    CHECK(result() == want);
    auto g = cuda::capture(s, [&](cudaStream_t cs) { CAPSCOPE_CHECK(ncclAllReduce(x.data(), y.data(), n, ncclFloat, times3, comm.get(), cs)); });
    cuda::graph_exec exec(g);
    for (int replay = 0; replay < 3; ++replay) {
        poison();
        exec.launch(s);
        CHECK(result() == want); // the replay wrote every element, scaled
    }
    CAPSCOPE_CHECK(ncclRedOpDestroy(times3, comm.get()));
    std::printf("  one-rank all-reduce (premultiplied by 3) of %zu floats: eager and 3 replays correct\n", n);
}

TEST_CASE("one process, every GPU: communicators from ncclCommInitAll all-reduce across the devices") {
    int devices = 0;
    CAPSCOPE_CHECK(cudaGetDeviceCount(&devices));
    std::vector<int> ids(static_cast<std::size_t>(devices));
    for (int d = 0; d < devices; ++d) ids[std::size_t(d)] = d;
    auto comms = cuda::nccl_communicator::for_devices(ids);
    REQUIRE(int(comms.size()) == devices);
    constexpr std::size_t n = 4096;
    std::vector<cuda::device_buffer<float>> x;
    std::vector<cuda::stream> streams;
    for (int d = 0; d < devices; ++d) {
        CAPSCOPE_CHECK(cudaSetDevice(d));
        CHECK(comms[std::size_t(d)].rank() == d);
        CHECK(comms[std::size_t(d)].size() == devices);
        streams.emplace_back();
        x.emplace_back(n);
        std::vector<float> host(n, float(d + 1));
        x.back().copy_from_host(host, streams.back());
    }
    CAPSCOPE_CHECK(ncclGroupStart());
    for (int d = 0; d < devices; ++d)
        CAPSCOPE_CHECK(ncclAllReduce(x[std::size_t(d)].data(), x[std::size_t(d)].data(), n, ncclFloat, ncclSum,
                                     comms[std::size_t(d)].get(), streams[std::size_t(d)]));
    CAPSCOPE_CHECK(ncclGroupEnd());
    const float want = float(devices * (devices + 1) / 2); // 1 + 2 + ... + devices
    for (int d = 0; d < devices; ++d) {
        CAPSCOPE_CHECK(cudaSetDevice(d));
        std::vector<float> back(n);
        x[std::size_t(d)].copy_to_host(back, streams[std::size_t(d)]);
        streams[std::size_t(d)].synchronize();
        CHECK(back == std::vector<float>(n, want));
    }
    CAPSCOPE_CHECK(cudaSetDevice(0));
    std::printf("  ncclCommInitAll over %d GPU(s): the sum of 1..%d on every device\n", devices, devices);
}

TEST_CASE("the step watchdog: a hung step is found within its timeout and the communicator aborted; steps that finish are not") {
    using namespace std::chrono_literals;
    ncclUniqueId id{};
    CAPSCOPE_CHECK(ncclGetUniqueId(&id));
    cuda::nccl_communicator comm(1, id, 0);
    cuda::stream s;
    cuda::pinned_buffer<int> release(1);
    release[0] = 0;
    std::mutex m;
    std::string what;
    long fault_step = -1;
    std::atomic<int> faults{0};
    watchdog_settings settings;
    settings.step_timeout = 300ms;
    settings.warmup_timeout = 3000ms;
    settings.poll = 10ms;
    {
        cuda::nccl_watchdog dog(comm, settings, [&](const watchdog_fault& f) {
            std::lock_guard lock(m);
            what = f.what;
            fault_step = f.step;
            ++faults;
        });
        // Five steps of a real all-reduce each, the first a warmup one, then an idle spell of
        // twice the step timeout: nothing fires.
        cuda::device_buffer<float> x(1 << 16);
        CAPSCOPE_CHECK(cudaMemsetAsync(x.data(), 0, x.bytes(), s));
        for (int step = 0; step < 5; ++step) {
            dog.begin_step(step > 0);
            CAPSCOPE_CHECK(ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat, ncclSum, comm.get(), s));
            dog.end_step(s);
            s.synchronize();
        }
        std::this_thread::sleep_for(600ms);
        CHECK(faults.load() == 0);
        CHECK_FALSE(comm.aborted());

        // The sixth step hangs on the device, as a collective waiting for a missing rank does.
        const auto t0 = std::chrono::steady_clock::now();
        dog.begin_step(true);
        engine_kernels::hang_until(release.data(), s);
        dog.end_step(s);
        while (!dog.fired() && std::chrono::steady_clock::now() - t0 < 10s) std::this_thread::sleep_for(5ms);
        const auto found = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
        // With a handler of the test's, the watchdog aborts the communicator before calling it, and
        // ncclCommAbort waits for the kernels running on the device: this one is the test's own,
        // which no abort flag reaches, so the test lets it go (a collective waiting for a peer
        // gives up on NCCL's abort flag). The default handler ends the process without the abort.
        *static_cast<volatile int*>(release.data()) = 1;
        while (faults.load() == 0 && std::chrono::steady_clock::now() - t0 < 20s) std::this_thread::sleep_for(5ms);
        s.synchronize();
        std::lock_guard lock(m);
        std::printf("  watchdog: a hung step found after %ld ms (timeout 300 ms, poll 10 ms); communicator aborted: %s; %s\n", long(found.count()),
                    comm.aborted() ? "yes" : "NO", what.c_str());
        CHECK(dog.fired());
        CHECK(found >= 300ms);
        CHECK(found < 2000ms);
        CHECK(faults.load() == 1);
        CHECK(fault_step == 6);
        CHECK(what.find("step 6 did not finish within 300 ms") != std::string::npos);
        CHECK(what.find("its work was enqueued and the device has not finished it") != std::string::npos);
        CHECK(comm.aborted());
    }
    // The aborted communicator is given up, not destroyed a second time, when it goes.
}
