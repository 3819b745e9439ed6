#pragma once
// The data-parallel tests' synthetic model (tests/gpu/test_data_parallel.cpp) and the 2-GPU
// fault probe's (tests/mpi/gpu_fault_probe.cpp): integer work on two layers and two microbatches,
// so every result is exact and a skipped, doubled or misplaced collective gives other numbers.

#include "engine_kernels.hpp"

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/hooks/hook_context.hpp>
#include <capscope/stage/stage.hpp>
#include <capscope/stage/program.hpp>

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace data_parallel_model {

using namespace capscope;
namespace k = engine_kernels;

constexpr int n = 1024, layers = 2, microbatches = 2;
using ints = capscope::cuda::device_buffer<int>;

//! The models' step: `Model::begin` at step begin, per microbatch one mlp stage per layer (of
//! `Model::layer_count`) running
//! `Model::layer_fns{model, mb, l}` (kept in `Model::fns`, reserved), and `Model::end` at step end.
//! `extra_stage`: one more stage in each microbatch (a rank that planned differently).
template <class Model>
training_program synthetic_program(Model& m, bool extra_stage = false) {
    using layer_fns = typename Model::layer_fns;
    training_program p;
    stage b;
    b.name = "step_begin";
    b.forward = stream_fn::of<&decltype(m.begin)::forward>(&m.begin);
    p.step_begin.push_back(b);
    for (int mb = 0; mb < microbatches; ++mb) {
        std::vector<stage> list;
        for (int l = 0; l < Model::layer_count; ++l) {
            m.fns.push_back({&m, mb, l});
            stage st;
            st.name = "layer" + std::to_string(l) + ".mlp";
            st.layer = l;
            st.captured_by = region_set{capture_module::mlp};
            st.forward = stream_fn::of<&layer_fns::forward>(&m.fns.back());
            st.backward = stream_fn::of<&layer_fns::backward>(&m.fns.back());
            list.push_back(st);
        }
        if (extra_stage) list.push_back(list.back());
        p.microbatches.push_back(std::move(list));
    }
    stage e;
    e.name = "optimizer";
    e.forward = stream_fn::of<&decltype(m.end)::forward>(&m.end);
    p.step_end.push_back(e);
    return p;
}

//! step_begin: counter += 1, grads = 0. Layer l of microbatch mb: forward act = counter + offset
//! (offset = 10 l + 100 rank + 1000 mb); backward grad[l] += 2 act. step_end: param[l] += grad[l].
struct dp_model {
    static constexpr int layer_count = layers;
    int rank;
    ints counter{1}, tmp{n};
    ints act[microbatches][layers] = {{ints(n), ints(n)}, {ints(n), ints(n)}};
    ints grad[layers] = {ints(n), ints(n)}, param[layers] = {ints(n), ints(n)};
    layer_tensors tensors[layers];
    tensor_ref grad_refs[layers];

    struct begin_fns {
        dp_model* m;
        void forward(cudaStream_t s) {
            k::add_one(m->counter.data(), s);
            for (auto& g : m->grad) g.fill_bytes(0, s);
        }
    } begin{this};
    struct layer_fns {
        dp_model* m;
        int mb, l;
        void forward(cudaStream_t s) { k::fill_from(m->act[mb][l].data(), m->counter.data(), 10 * l + 100 * m->rank + 1000 * mb, n, s); }
        void backward(cudaStream_t s) {
            k::scale(m->tmp.data(), m->act[mb][l].data(), 2, n, s);
            k::add(m->grad[l].data(), m->grad[l].data(), m->tmp.data(), n, s);
        }
    };
    std::vector<layer_fns> fns;
    struct end_fns {
        dp_model* m;
        void forward(cudaStream_t s) {
            for (int l = 0; l < layers; ++l) k::add(m->param[l].data(), m->param[l].data(), m->grad[l].data(), n, s);
        }
    } end{this};

    explicit dp_model(int r, cudaStream_t s) : rank(r) {
        counter.fill_bytes(0, s);
        for (auto& p : param) p.fill_bytes(0, s);
        for (int l = 0; l < layers; ++l) {
            grad_refs[l] = {"layer" + std::to_string(l) + ".grad", grad[l].data(), grad[l].bytes()};
            tensors[l] = {{}, std::span<const tensor_ref>(&grad_refs[l], 1)};
        }
        fns.reserve(microbatches * layers);
    }

    training_program program(bool extra_stage = false) { return synthetic_program(*this, extra_stage); }
};

//! The parameters every rank must hold after `steps` steps: over steps k, the sum over ranks r and
//! microbatches mb of 2 (k + 10 l + 100 r + 1000 mb), divided by the rank count when the
//! reduction averages (each step's sum is even, so on 1 or 2 ranks the average is exact).
inline int expected_param(int l, int steps, int ranks, bool average) {
    int total = 0;
    for (int step = 1; step <= steps; ++step) {
        int sum = 0;
        for (int r = 0; r < ranks; ++r)
            for (int mb = 0; mb < microbatches; ++mb) sum += 2 * (step + 10 * l + 100 * r + 1000 * mb);
        if (sum % ranks != 0) throw std::logic_error("expected_param: the sum over ranks does not divide by the rank count");
        total += average ? sum / ranks : sum;
    }
    return total;
}

//! Layer `l`'s parameters after `steps` steps, checked on the host: "" when every element is
//! expected_param's, else what differs (the test CHECKs it, the fault probe throws it).
inline std::string wrong_params(const dp_model& m, int l, int steps, int ranks, bool average, cudaStream_t s) {
    std::vector<int> got(n);
    m.param[l].copy_to_host(got, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    const int want = expected_param(l, steps, ranks, average);
    for (int v : got)
        if (v != want) return "step " + std::to_string(steps) + ", layer " + std::to_string(l) + ": " + std::to_string(v) + " != " + std::to_string(want);
    return {};
}

} // namespace data_parallel_model
