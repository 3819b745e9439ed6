// The experiment behind docs/multi_gpu.md ("why not fork one child per GPU"): a launcher forks
// one child per GPU, passes NCCL's unique id through shared memory, and each child all-reduces
// 1K floats. Three variants, each under a 30 s watchdog:
//   clean    - the parent touches neither CUDA nor NCCL; child 0 makes the id;
//   cuda     - the parent calls cudaGetDeviceCount before forking (as a launcher that counts GPUs does);
//   id       - the parent makes the id (ncclGetUniqueId) before forking.
// usage: fork_probe clean|cuda|id     (run with NCCL_DEBUG=INFO to see where a child stops)
// Build: g++ -std=c++20 fork_probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -lnccl
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace {
struct shared {
    std::atomic<int> ready;
    ncclUniqueId id;
};

#define TRY(call)                                                                                  \
    do {                                                                                           \
        auto status_ = (call);                                                                     \
        if (status_ != 0) {                                                                        \
            std::fprintf(stderr, "rank %d: %s failed: %d\n", rank, #call, int(status_));           \
            std::_Exit(3);                                                                         \
        }                                                                                          \
    } while (0)

int child(int rank, int ranks, shared* sh) {
    if (rank == 0 && !sh->ready.load()) {
        TRY(ncclGetUniqueId(&sh->id));
        sh->ready.store(1);
    }
    while (!sh->ready.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclUniqueId id = sh->id;
    std::fprintf(stderr, "rank %d: cudaSetDevice(%d)\n", rank, rank);
    TRY(cudaSetDevice(rank));
    ncclComm_t comm;
    std::fprintf(stderr, "rank %d: ncclCommInitRank\n", rank);
    TRY(ncclCommInitRank(&comm, ranks, id, rank));
    float* x = nullptr;
    TRY(cudaMalloc(&x, 1024 * sizeof(float)));
    TRY(cudaMemset(x, 0, 1024 * sizeof(float)));
    TRY(ncclAllReduce(x, x, 1024, ncclFloat32, ncclSum, comm, nullptr));
    TRY(cudaDeviceSynchronize());
    std::fprintf(stderr, "rank %d: all-reduce done\n", rank);
    ncclCommDestroy(comm);
    return 0;
}
} // namespace

int main(int argc, char** argv) {
    const std::string variant = argc > 1 ? argv[1] : "clean";
    auto* sh = static_cast<shared*>(mmap(nullptr, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    new (sh) shared{};
    int rank = -1;
    int ranks = 2;
    if (variant == "cuda") TRY(cudaGetDeviceCount(&ranks));
    if (variant == "id") {
        TRY(ncclGetUniqueId(&sh->id));
        sh->ready.store(1);
    }
    ranks = 2;
    pid_t pids[2];
    for (int r = 0; r < ranks; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) std::_Exit(child(r, ranks, sh));
    }
    int finished = 0, failed = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (finished < ranks && std::chrono::steady_clock::now() < deadline) {
        int status = 0;
        const pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            ++finished;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    if (finished < ranks) {
        for (pid_t p : pids) kill(p, SIGKILL);
        std::printf("fork_probe %s: HUNG (%d of %d children finished in 30 s)\n", variant.c_str(), finished, ranks);
        return 2;
    }
    std::printf("fork_probe %s: %s (%d of %d children failed)\n", variant.c_str(), failed ? "FAILED" : "ok", failed, ranks);
    return failed ? 1 : 0;
}
