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

TEST_CASE("a one-rank communicator all-reduces, eagerly and inside a captured graph") {
    ncclUniqueId id{};
    CAPSCOPE_CHECK(ncclGetUniqueId(&id));
    cuda::nccl_communicator comm(1, id, 0);
    cuda::stream s;
    cuda::device_buffer<float> x(64);
    std::vector<float> host(64);
    for (int i = 0; i < 64; ++i) host[i] = float(i) * 0.5f;
    x.copy_from_host(host, s);
    CAPSCOPE_CHECK(ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat, ncclSum, comm.get(), s));
    auto g = cuda::capture(s, [&](cudaStream_t cs) {
        CAPSCOPE_CHECK(ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat, ncclSum, comm.get(), cs));
    });
    cuda::graph_exec exec(g);
    exec.launch(s);
    std::vector<float> back(64);
    x.copy_to_host(back, s);
    s.synchronize();
    CHECK(back == host); // a sum over one rank is the identity
}
