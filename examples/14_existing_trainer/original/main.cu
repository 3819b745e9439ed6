// The trainer's own eager loop: no graphs, one blocking stream.
#include "trainer.cuh"

#include <cstdint>

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no usable CUDA device: skipped\n");
        return 77;
    }
    CHECK_CUDA(cudaStreamCreate(&main_stream));
    CHECK_CUBLAS(cublasCreate(&cublas));
    CHECK_CUBLAS(cublasSetStream(cublas, main_stream));

    const shape s;
    model m;
    model_init(&m, s, 1234);
    for (int step = 0; step < s.steps; ++step) {
        zero_grads(&m);
        for (int mb = 0; mb < s.microbatches; ++mb) {
            const batch b = next_batch(s, step, mb);
            forward(&m, b, mb);
            backward(&m, b, mb);
        }
        update(&m, step, main_stream);
        printf("step %d loss %.6f\n", step, read_loss(&m));
    }

    // FNV-1a over the parameters' bytes: equal hashes mean bitwise-equal training.
    const std::vector<float> params = read_parameters(&m);
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(params.data());
    uint64_t hash = 14695981039346656037ull;
    for (size_t i = 0; i < params.size() * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
    printf("parameter hash %016llx\n", (unsigned long long)hash);

    model_free(&m);
    CHECK_CUBLAS(cublasDestroy(cublas));
    CHECK_CUDA(cudaStreamDestroy(main_stream));
    return 0;
}
