// How a stage's new host values get into a captured graph before each replay, measured (issue 48).
// A step of F fixed kernels with a stage of K kernels in its middle; the stage passes host values
// that change every step (a scale and a shift, as an optimizer's learning rate and bias
// corrections). Four ways to update the executable graph, each over the same steps:
//   child graph   the stage recorded alone, set with cudaGraphExecChildGraphNodeSetParams
//                 (what capscope does for stage::updated_in_graph)
//   kernel nodes  the stage recorded alone, each kernel node's parameters copied into the
//                 executable graph with cudaGraphExecKernelNodeSetParams (the stage captured flat)
//   by hand       cudaGraphExecKernelNodeSetParams with the new arguments, nothing recorded: the
//                 floor, open only to code that knows each kernel and its arguments (not cuBLAS's)
//   whole graph   the whole step recorded again and applied with cudaGraphExecUpdate
// Per way: host time of the update (median), device time of a replay (median), and the buffers
// after the last step, which must be bitwise those of eager launches.
//
//   graph_update [--steps N] [--fixed F]      exit 77 without a GPU

#include "arguments.hpp"

#include <capscope/cuda/error.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int elements = 4096; // per buffer: a short kernel, as a launch-bound step has

__global__ void scale_shift(float* x, float a, float b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + b;
}

struct step_shape {
    int fixed = 400, stage = 11;
};

//! The step's buffers: one per kernel, so every launch is its own work.
struct buffers {
    float* all = nullptr;
    int count = 0;
    explicit buffers(int n) : count(n) {
        CAPSCOPE_CHECK(cudaMalloc(&all, std::size_t(n) * elements * sizeof(float)));
        reset();
    }
    ~buffers() { cudaFree(all); }
    float* at(int i) const { return all + std::size_t(i) * elements; }
    void reset() {
        std::vector<float> v(std::size_t(count) * elements);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 977) / 977.f;
        CAPSCOPE_CHECK(cudaMemcpy(all, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    std::vector<float> read() const {
        std::vector<float> v(std::size_t(count) * elements);
        CAPSCOPE_CHECK(cudaMemcpy(v.data(), all, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return v;
    }
};

//! What the stage passes by value at `step`.
float scale_of(int step) { return 1.f + 1e-3f * std::sin(float(step)); }
float shift_of(int step, int kernel) { return 1e-4f * float((step * 31 + kernel) % 17); }

const dim3 grid((elements + 255) / 256), block(256);

void stage(const buffers& b, const step_shape& s, int step, cudaStream_t on) {
    for (int k = 0; k < s.stage; ++k) scale_shift<<<grid, block, 0, on>>>(b.at(s.fixed + k), scale_of(step), shift_of(step, k), elements);
}
void fixed_kernels(const buffers& b, int from, int to, cudaStream_t on) {
    for (int i = from; i < to; ++i) scale_shift<<<grid, block, 0, on>>>(b.at(i), 0.999f, 1e-3f, elements);
}
//! One eager step; with `stage_nodes`, launched under capture, it also collects the stage's kernel nodes.
void whole_step(const buffers& b, const step_shape& s, int step, cudaStream_t on, std::vector<cudaGraphNode_t>* stage_nodes = nullptr) {
    fixed_kernels(b, 0, s.fixed / 2, on);
    for (int k = 0; k < s.stage; ++k) {
        scale_shift<<<grid, block, 0, on>>>(b.at(s.fixed + k), scale_of(step), shift_of(step, k), elements);
        if (stage_nodes) {
            const cudaGraphNode_t* deps = nullptr;
            std::size_t n = 0;
            cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
            CAPSCOPE_CHECK(cudaStreamGetCaptureInfo(on, &status, nullptr, nullptr, &deps, nullptr, &n));
            if (n != 1) throw std::runtime_error("graph_update: a captured launch should leave one dependency");
            stage_nodes->push_back(deps[0]);
        }
    }
    fixed_kernels(b, s.fixed / 2, s.fixed, on);
}

cudaGraph_t record(const std::function<void(cudaStream_t)>& work, cudaStream_t on) {
    CAPSCOPE_CHECK(cudaStreamBeginCapture(on, cudaStreamCaptureModeThreadLocal));
    work(on);
    cudaGraph_t g = nullptr;
    CAPSCOPE_CHECK(cudaStreamEndCapture(on, &g));
    return g;
}

//! The kernel nodes of a recorded chain, in launch order.
std::vector<cudaGraphNode_t> chain(cudaGraph_t g) {
    std::size_t n = 0;
    CAPSCOPE_CHECK(cudaGraphGetRootNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> out(n);
    CAPSCOPE_CHECK(cudaGraphGetRootNodes(g, out.data(), &n));
    if (n != 1) throw std::runtime_error("graph_update: the stage should record as one chain");
    for (;;) {
        std::size_t next = 0;
        CAPSCOPE_CHECK(cudaGraphNodeGetDependentNodes(out.back(), nullptr, nullptr, &next));
        if (next == 0) return out;
        cudaGraphNode_t node = nullptr;
        CAPSCOPE_CHECK(cudaGraphNodeGetDependentNodes(out.back(), &node, nullptr, &next));
        out.push_back(node);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

struct result {
    const char* way;
    double update_us = 0, launch_us = 0, device_us = 0;
    bool same = true;
};

double us_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

//! Trains `steps` steps: `update(step)`, then `launch(step)`, each timed on the host, the launch on
//! the device too; then the buffers must be `want`'s bits.
result measure(const char* way, buffers& b, int steps, cudaStream_t on, const std::function<void(int)>& update,
               const std::function<void(int)>& launch, const std::vector<float>& want) {
    cudaEvent_t start, stop;
    CAPSCOPE_CHECK(cudaEventCreate(&start));
    CAPSCOPE_CHECK(cudaEventCreate(&stop));
    std::vector<double> updating, launching, device;
    for (int step = 0; step < steps; ++step) {
        auto t = std::chrono::steady_clock::now();
        update(step);
        updating.push_back(us_since(t));
        CAPSCOPE_CHECK(cudaEventRecord(start, on));
        t = std::chrono::steady_clock::now();
        launch(step);
        launching.push_back(us_since(t));
        CAPSCOPE_CHECK(cudaEventRecord(stop, on));
        CAPSCOPE_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CAPSCOPE_CHECK(cudaEventElapsedTime(&ms, start, stop));
        device.push_back(1000.0 * ms);
    }
    CAPSCOPE_CHECK(cudaEventDestroy(start));
    CAPSCOPE_CHECK(cudaEventDestroy(stop));
    const std::vector<float> got = b.read();
    b.reset();
    return {way, median(updating), median(launching), median(device), got == want};
}

bool compare(const step_shape& s, int steps, cudaStream_t on, cudaStream_t side) {
    buffers b(s.fixed + s.stage);
    // Eager launches: the reference bits, then the same steps timed.
    for (int k = 0; k < steps; ++k) whole_step(b, s, k, on);
    const std::vector<float> want = b.read();
    b.reset();
    std::vector<result> rows;
    rows.push_back(measure("eager launches", b, steps, on, [](int) {}, [&](int step) { whole_step(b, s, step, on); }, want));

    // Child graph: the stage is one child graph node of the step's graph.
    {
        cudaGraphNode_t child_node = nullptr;
        cudaGraph_t g = record(
            [&](cudaStream_t st) {
                fixed_kernels(b, 0, s.fixed / 2, st);
                cudaGraph_t child = record([&](cudaStream_t x) { stage(b, s, 0, x); }, side);
                const cudaGraphNode_t* deps = nullptr;
                std::size_t n = 0;
                cudaGraph_t parent = nullptr;
                cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
                CAPSCOPE_CHECK(cudaStreamGetCaptureInfo(st, &status, nullptr, &parent, &deps, nullptr, &n));
                CAPSCOPE_CHECK(cudaGraphAddChildGraphNode(&child_node, parent, deps, n, child));
                CAPSCOPE_CHECK(cudaStreamUpdateCaptureDependencies(st, &child_node, nullptr, 1, cudaStreamSetCaptureDependencies));
                CAPSCOPE_CHECK(cudaGraphDestroy(child));
                fixed_kernels(b, s.fixed / 2, s.fixed, st);
            },
            on);
        cudaGraphExec_t exec = nullptr;
        CAPSCOPE_CHECK(cudaGraphInstantiate(&exec, g, 0));
        rows.push_back(measure(
            "child graph (capscope)", b, steps, on,
            [&](int step) {
                cudaGraph_t fresh = record([&](cudaStream_t x) { stage(b, s, step, x); }, side);
                CAPSCOPE_CHECK(cudaGraphExecChildGraphNodeSetParams(exec, child_node, fresh));
                CAPSCOPE_CHECK(cudaGraphDestroy(fresh));
            },
            [&](int) { CAPSCOPE_CHECK(cudaGraphLaunch(exec, on)); }, want));
        CAPSCOPE_CHECK(cudaGraphExecDestroy(exec));
        CAPSCOPE_CHECK(cudaGraphDestroy(g));
    }

    // The stage captured flat: its kernel nodes, updated one by one.
    std::vector<cudaGraphNode_t> nodes;
    cudaGraph_t flat = record([&](cudaStream_t st) { whole_step(b, s, 0, st, &nodes); }, on);
    cudaGraphExec_t exec = nullptr;
    CAPSCOPE_CHECK(cudaGraphInstantiate(&exec, flat, 0));
    auto launch = [&](int) { CAPSCOPE_CHECK(cudaGraphLaunch(exec, on)); };
    rows.push_back(measure(
        "kernel nodes, recorded", b, steps, on,
        [&](int step) {
            cudaGraph_t fresh = record([&](cudaStream_t x) { stage(b, s, step, x); }, side);
            const std::vector<cudaGraphNode_t> recorded = chain(fresh);
            for (std::size_t k = 0; k < recorded.size(); ++k) {
                cudaKernelNodeParams p{};
                CAPSCOPE_CHECK(cudaGraphKernelNodeGetParams(recorded[k], &p));
                CAPSCOPE_CHECK(cudaGraphExecKernelNodeSetParams(exec, nodes[k], &p));
            }
            CAPSCOPE_CHECK(cudaGraphDestroy(fresh));
        },
        launch, want));
    rows.push_back(measure(
        "kernel nodes, by hand", b, steps, on,
        [&](int step) {
            for (int k = 0; k < s.stage; ++k) {
                float* x = b.at(s.fixed + k);
                float a = scale_of(step), sh = shift_of(step, k);
                int n = elements;
                void* args[] = {&x, &a, &sh, &n};
                const cudaKernelNodeParams p{reinterpret_cast<void*>(&scale_shift), grid, block, 0, args, nullptr};
                CAPSCOPE_CHECK(cudaGraphExecKernelNodeSetParams(exec, nodes[std::size_t(k)], &p));
            }
        },
        launch, want));
    rows.push_back(measure(
        "whole graph, cudaGraphExecUpdate", b, steps, on,
        [&](int step) {
            cudaGraph_t fresh = record([&](cudaStream_t st) { whole_step(b, s, step, st); }, on);
            cudaGraphExecUpdateResultInfo info{};
            CAPSCOPE_CHECK(cudaGraphExecUpdate(exec, fresh, &info));
            CAPSCOPE_CHECK(cudaGraphDestroy(fresh));
        },
        launch, want));
    CAPSCOPE_CHECK(cudaGraphExecDestroy(exec));
    CAPSCOPE_CHECK(cudaGraphDestroy(flat));

    printf("\na stage of %d kernels in a step of %d kernels; median of %d steps, microseconds\n", s.stage, s.fixed + s.stage, steps);
    printf("  %-34s %14s %14s %14s\n", "", "update (host)", "launch (host)", "step (device)");
    bool all = true;
    for (const result& r : rows) {
        printf("  %-34s %14.1f %14.1f %14.1f  %s\n", r.way, r.update_us, r.launch_us, r.device_us, r.same ? "bitwise equal to eager" : "DIFFERS FROM EAGER");
        all = all && r.same;
    }
    return all;
}

} // namespace

int main(int argc, char** argv) {
    int steps = 200, fixed = 400;
    bench::arguments("graph_update").integer("--steps", steps, 1).integer("--fixed", fixed, 2, 100000).parse_or_exit(argc, argv);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return printf("no usable CUDA device: skipped\n"), 77;
    cudaStream_t on = nullptr, side = nullptr;
    CAPSCOPE_CHECK(cudaStreamCreateWithFlags(&on, cudaStreamNonBlocking));
    CAPSCOPE_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    bool same = true;
    for (int stage : {1, 11, 64}) same = compare({fixed, stage}, steps, on, side) && same;
    printf("\n%s\n", same ? "every way bitwise equal to eager launches" : "FAIL: a way differs from eager launches");
    CAPSCOPE_CHECK(cudaStreamDestroy(side));
    CAPSCOPE_CHECK(cudaStreamDestroy(on));
    return same ? 0 : 1;
}
