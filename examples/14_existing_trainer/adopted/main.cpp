// The trainer's own eager loop, adopted: its marked regions run under capscope, eagerly or
// captured as argv[1] says (none, local, transformer_engine, full_iteration). The only C++20 file.
#include "trainer.cuh"

#include <capscope/capscope.hpp>
#include <capscope/engine.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <variant>

using namespace capscope;

using runners = std::variant<in_place_runner<config<impl::eager>>, in_place_runner<config<impl::lazy_per_layer, capture_regions<"block">, warmup_steps<2>>>,
                             in_place_runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>>,
                             in_place_runner<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>>>;
static std::optional<runners> cap;
static in_place_step* current = nullptr; // the step the trainer's marks go to

// A mark of trainer.cu, for the current step. Block l's fused kernel normalises with block l + 1's
// weights. The sampler's seed and the head's example count come by value: those regions are
// updated in the graph, recorded on a stream capscope gives them, so the trainer's global stream
// points there while their code runs (no cuBLAS in them; every other region runs on the step's).
static void mark(const char* kind, int layer, bool backward, void (*code)(void*), void* context) {
    const int next[] = {layer + 1};
    const bool host_valued = std::strcmp(kind, "data") == 0 || std::strcmp(kind, "head") == 0;
    const marked_region r{.layer = layer, .kind = stage_kind_id(kind), .updated_in_graph = host_valued,
                          .reads_parameters_of = layer >= 0 && layer + 1 < shape{}.layers && !backward ? list_view<int>(next) : list_view<int>()};
    auto run = [&](cudaStream_t given) {
        const cudaStream_t own = std::exchange(main_stream, host_valued ? given : main_stream);
        code(context);
        main_stream = own;
    };
    backward ? current->backward(r, run) : current->forward(r, run);
}
static bool choose(const std::string& impl) {
    if (impl == "none") cap.emplace(std::in_place_index<0>);
    if (impl == "local") cap.emplace(std::in_place_index<1>);
    if (impl == "transformer_engine") cap.emplace(std::in_place_index<2>);
    if (impl == "full_iteration") cap.emplace(std::in_place_index<3>);
    return cap.has_value();
}
static in_place_step begin_step() { return std::visit([](auto& r) { return r.step(main_stream); }, *cap); }

int main(int argc, char** argv) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no usable CUDA device: skipped\n");
        return 77;
    }
    CHECK_CUDA(cudaStreamCreate(&main_stream));
    CHECK_CUBLAS(cublasCreate(&cublas));
    CHECK_CUBLAS(cublasSetStream(cublas, main_stream));

    const std::string impl = argc > 1 ? argv[1] : "full_iteration";
    if (!choose(impl)) return printf("usage: 14_existing_trainer [none|local|transformer_engine|full_iteration]\n"), 2;
    marker = &mark;

    const shape s;
    ::model m; // (capscope has a model<> of its own)
    model_init(&m, s, 1234);
    for (int step = 0; step < s.steps; ++step) {
        in_place_step st = begin_step();
        current = &st;
        st.run({.kind = stage_kind_id("zero_grads")}, [&](cudaStream_t) { zero_grads(&m); });
        for (int mb = 0; mb < s.microbatches; ++mb) {
            st.microbatch();
            const batch b = next_batch(s, step, mb);
            forward(&m, b, mb);
            backward(&m, b, mb);
        }
        st.run({.kind = stage_kind::optimizer, .updated_in_graph = true}, [&](cudaStream_t given) { update(&m, step, given); });
        st.end();
        printf("step %d loss %.6f\n", step, read_loss(&m));
    }

    // FNV-1a over the parameters' bytes: equal hashes mean bitwise-equal training.
    const std::vector<float> params = read_parameters(&m);
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(params.data());
    uint64_t hash = 14695981039346656037ull;
    for (size_t i = 0; i < params.size() * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
    printf("parameter hash %016llx\n", (unsigned long long)hash);
    std::visit([&](auto& r) { printf("%s: %ld captures, %ld replays\n%s", impl.c_str(), r.counters().captures, r.counters().replays, r.plan_text().c_str()); }, *cap);

    model_free(&m);
    cap.reset(); // its graphs go before the stream and the handle they use
    CHECK_CUBLAS(cublasDestroy(cublas));
    CHECK_CUDA(cudaStreamDestroy(main_stream));
    return 0;
}
