// NCCL calls go through the same checked-call facility as CUDA and cuBLAS.

#include <capscope/cuda.hpp>
#include <capscope/cuda/nccl.hpp>

#include <doctest/doctest.h>

#include <cstdio>
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
