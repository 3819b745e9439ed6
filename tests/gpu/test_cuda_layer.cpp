// The thin CUDA layer: checked calls carry the call, file:line and the active scope; owners
// move; capture() records, replays, and rolls back on an exception.

#include <capscope/cuda.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

using namespace capscope;

TEST_CASE("a failed CUDA call names the call, the file:line and the scope") {
    cuda::scope_label outer("layer3.attention");
    std::string what;
    int line = 0;
    try {
        void* p = nullptr;
        line = __LINE__ + 1;
        CAPSCOPE_CHECK(cudaMalloc(&p, std::size_t{1} << 62)); // far more than any GPU has
        FAIL("an impossible allocation succeeded");
    } catch (const cuda::error& e) {
        what = e.what();
        CHECK(e.which() == cuda::library::cuda);
        CHECK(e.call() == "cudaMalloc(&p, std::size_t{1} << 62)");
        CHECK(e.line() == line);
        CHECK(e.scope() == "layer3.attention");
        CHECK(e.code() == cudaErrorMemoryAllocation);
    }
    std::printf("  %s\n", what.c_str());
    CHECK(what.find("test_cuda_layer.cpp:" + std::to_string(line)) != std::string::npos);
    CHECK(what.find("out of memory") != std::string::npos);
    CHECK(what.find("(in scope 'layer3.attention')") != std::string::npos);
}

TEST_CASE("a failed cuBLAS call is reported through the same facility") {
    cuda::blas_handle blas;
    cuda::stream s;
    float a = 1, b = 1, c = 0, alpha = 1, beta = 0;
    try {
        // m = -1 is an invalid value
        CAPSCOPE_CHECK(cublasSgemm(blas.on(s), CUBLAS_OP_N, CUBLAS_OP_N, -1, 1, 1, &alpha, &a, 1, &b, 1, &beta, &c, 1));
        FAIL("cuBLAS accepted m = -1");
    } catch (const cuda::error& e) {
        std::printf("  %s\n", e.what());
        CHECK(e.which() == cuda::library::cublas);
        CHECK(e.code() == CUBLAS_STATUS_INVALID_VALUE);
        CHECK(std::string(e.what()).find("cuBLAS error: cublasSgemm(") == 0);
        CHECK(e.scope().empty());
    }
}

TEST_CASE("owners are move-only and release once") {
    cuda::device_buffer<float> a(256);
    float* p = a.data();
    cuda::device_buffer<float> b(std::move(a));
    CHECK(a.data() == nullptr);
    CHECK(a.size() == 0);
    CHECK(b.data() == p);
    cuda::stream s1;
    cudaStream_t raw = s1.get();
    cuda::stream s2(std::move(s1));
    CHECK(s1.get() == nullptr);
    CHECK(s2.get() == raw);
    cuda::pinned_buffer<int> h(4);
    cuda::pinned_buffer<int> h2 = std::move(h);
    CHECK(h.data() == nullptr);
    CHECK(h2.size() == 4);
    std::vector<float> too_many(257);
    CHECK_THROWS_AS(b.copy_from_host(too_many, s2), std::length_error);
}

TEST_CASE("capture records work, replays it, and events order streams") {
    cuda::stream main_stream, side;
    cuda::device_buffer<int> x(1024);
    std::vector<int> host(1024, 7);
    x.copy_from_host(host, main_stream);
    cuda::event copied;
    copied.record(main_stream);
    copied.wait_on(side);
    auto g = cuda::capture(side, [&](cudaStream_t s) { x.fill_bytes(0x01, s); });
    CHECK(g.node_count() == 1);
    cuda::graph_exec exec(g);
    exec.launch(side);
    std::vector<int> back(1024);
    x.copy_to_host(back, side);
    side.synchronize();
    CHECK(back[0] == 0x01010101);
    CHECK(back[1023] == 0x01010101);
}

TEST_CASE("a capture that throws is ended and leaves the stream usable") {
    cuda::stream s;
    cuda::device_buffer<int> x(16);
    CHECK_THROWS_AS(cuda::capture(s, [&](cudaStream_t cs) {
                        x.fill_bytes(0, cs);
                        throw std::runtime_error("user code failed mid-capture");
                    }),
                    std::runtime_error);
    cudaStreamCaptureStatus status{};
    CAPSCOPE_CHECK(cudaStreamIsCapturing(s, &status));
    CHECK(status == cudaStreamCaptureStatusNone);
    x.fill_bytes(0, s);
    s.synchronize();
}
