// The runner's scratch memory on the GPU: stages that allocate stream-ordered scratch inside
// captured segments share one arena across the runner's graphs, replays allocate nothing, and a
// stage that returns with scratch it did not free is an error naming its segment.

#include "support.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

using namespace capscope;

namespace {

using lo = impl::lazy_per_layer;

//! A stage that allocates stream-ordered scratch memory, writes it, copies it out and frees it:
//! with cudaMallocAsync, or from the runner's scratch pool.
struct scratch_user {
    void* out;
    std::size_t bytes;
    int value;
    bool use_runner_pool;
    void forward(cudaStream_t s) {
        void* scratch = nullptr;
        if (use_runner_pool) scratch = scratch_allocate(bytes, s);
        else CAPSCOPE_CHECK(cudaMallocAsync(&scratch, bytes, s));
        CAPSCOPE_CHECK(cudaMemsetAsync(scratch, value, bytes, s));
        CAPSCOPE_CHECK(cudaMemcpyAsync(out, scratch, bytes, cudaMemcpyDeviceToDevice, s));
        if (use_runner_pool) scratch_free(scratch, s);
        else CAPSCOPE_CHECK(cudaFreeAsync(scratch, s));
    }
    void backward(cudaStream_t) {}
};

struct scratch_result {
    std::uint64_t graph_memory_high = 0;
    std::size_t arena = 0;
};

scratch_result run_scratch_layers(bool use_runner_pool) {
    constexpr int layers = 8;
    constexpr std::size_t bytes = std::size_t(4) << 20;
    capscope::cuda::stream s;
    capscope::cuda::device_buffer<unsigned char> out(layers * bytes);
    std::vector<scratch_user> users;
    for (int l = 0; l < layers; ++l) users.push_back({out.data() + std::size_t(l) * bytes, bytes, 1 + l, use_runner_pool});
    training_program p;
    p.microbatches.emplace_back();
    for (int l = 0; l < layers; ++l) {
        stage st;
        st.name = "layer" + std::to_string(l) + ".scratch";
        st.layer = l;
        st.kind = stage_kind::other;
        st.forward = stream_fn::of<&scratch_user::forward>(&users[std::size_t(l)]);
        st.backward = stream_fn::of<&scratch_user::backward>(&users[std::size_t(l)]);
        p.microbatches[0].push_back(std::move(st));
    }
    CAPSCOPE_CHECK(cudaDeviceGraphMemTrim(0));
    std::uint64_t zero = 0;
    CAPSCOPE_CHECK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero));
    runner<config<lo, modules<>, warmup_steps<1>>> r(std::move(p));
    out.fill_bytes(0, s);
    r.step(s); // warmup
    r.step(s); // capture + first replay
    s.synchronize();
    scratch_result result;
    std::uint64_t reserved_before = 0, reserved_after = 0;
    std::size_t free_before = 0, free_after = 0, total = 0;
    CAPSCOPE_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &result.graph_memory_high));
    CAPSCOPE_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &reserved_before));
    CAPSCOPE_CHECK(cudaMemGetInfo(&free_before, &total));
    out.fill_bytes(0, s);
    for (int i = 0; i < 10; ++i) r.step(s);
    s.synchronize();
    CAPSCOPE_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &reserved_after));
    CAPSCOPE_CHECK(cudaMemGetInfo(&free_after, &total));
    result.arena = r.scratch().arena_bytes();
    std::printf("  scratch via %-17s: %d graphs each using %zu MiB; graph memory used high %.1f MiB, reserved %.1f -> %.1f MiB; "
                "runner arena %.1f MiB\n",
                use_runner_pool ? "scratch_allocate" : "cudaMallocAsync", layers, bytes >> 20, double(result.graph_memory_high) / (1 << 20),
                double(reserved_before) / (1 << 20), double(reserved_after) / (1 << 20), double(result.arena) / (1 << 20));
    CHECK(r.counters().captures == r.plan().graph_count);
    CHECK(reserved_after == reserved_before);
    CHECK(free_after == free_before); // replays allocate nothing
    const auto host = support::download(out.data(), out.size(), s);
    bool right = true;
    for (int l = 0; l < layers; ++l)
        for (std::size_t i = 0; i < bytes; i += 4093) right = right && host[std::size_t(l) * bytes + i] == 1 + l;
    CHECK(right); // the replayed graphs did the work
    r.reset();
    CHECK(r.graphs_alive() == 0);
    return result;
}
} // namespace

TEST_CASE("scratch memory inside captured segments: the runner's graphs share one arena, replays allocate nothing") {
    const scratch_result shared = run_scratch_layers(true);
    CHECK(shared.arena == std::size_t(4) << 20);  // one segment's scratch, for all 8 graphs
    CHECK(shared.graph_memory_high == 0);         // no graph memory nodes
    run_scratch_layers(false);                    // for comparison: CUDA's graph memory, per graph
}

TEST_CASE("scratch memory: a stage that keeps its scratch past its return is an error naming the segment") {
    struct leaker {
        void forward(cudaStream_t s) { (void)scratch_allocate(1024, s); }
        void backward(cudaStream_t) {}
    } l;
    training_program p;
    stage st;
    st.name = "layer0.leaks";
    st.layer = 0;
    st.forward = stream_fn::of<&leaker::forward>(&l);
    st.backward = stream_fn::of<&leaker::backward>(&l);
    p.microbatches = {{st}};
    runner<config<impl::eager>> r(std::move(p));
    capscope::cuda::stream s;
    try {
        r.step(s);
        FAIL("a scratch leak went unnoticed");
    } catch (const std::logic_error& e) {
        CHECK(std::string(e.what()).find("segment layer0.leaks returned with scratch memory it did not free") != std::string::npos);
    }
}
