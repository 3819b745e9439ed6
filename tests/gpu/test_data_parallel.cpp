// Data parallelism on hooks, one process per GPU (`mpirun -np 2`; alone it is one rank): each
// rank runs its own data through two layers and two microbatches, accumulating integer
// gradients; the data-parallel hook sums them across the ranks after the last microbatch's
// backward; the optimizer adds them to the parameters. Integers, so every result is exact: the
// parameters after each step must equal the sum over ranks and microbatches computed here, on
// every rank, under every impl (eager, warmup, captured), and a skipped or misplaced collective
// gives other numbers. Ranks with different plans get the same clear error, not a hang.

#include "engine_kernels.hpp"
#include "support.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/mpi_bootstrap.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>
#include <capscope/parallel/data_parallel.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;

namespace {

constexpr int n = 1024, layers = 2, microbatches = 2;
using ints = cuda::device_buffer<int>;

cuda::mpi_session& mpi() {
    static cuda::mpi_session session;
    return session;
}
cuda::nccl_communicator& comm() {
    static cuda::nccl_communicator c = cuda::communicator_from_mpi(mpi());
    return c;
}

//! step_begin: counter += 1, grads = 0. Layer l of microbatch mb: forward act = counter + offset
//! (offset = 10 l + 100 rank + 1000 mb); backward grad[l] += 2 act. step_end: param[l] += grad[l].
struct dp_model {
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

    training_program program(bool extra_stage = false) {
        training_program p;
        stage b;
        b.name = "step_begin";
        b.forward = stream_fn::of<&begin_fns::forward>(&begin);
        p.step_begin.push_back(b);
        for (int mb = 0; mb < microbatches; ++mb) {
            std::vector<stage> list;
            for (int l = 0; l < layers; ++l) {
                fns.push_back({this, mb, l});
                stage st;
                st.name = "layer" + std::to_string(l) + ".mlp";
                st.layer = l;
                st.captured_by = region_set{capture_module::mlp};
                st.forward = stream_fn::of<&layer_fns::forward>(&fns.back());
                st.backward = stream_fn::of<&layer_fns::backward>(&fns.back());
                list.push_back(st);
            }
            if (extra_stage) list.push_back(list.back()); // a rank that plans one more stage
            p.microbatches.push_back(std::move(list));
        }
        stage e;
        e.name = "optimizer";
        e.forward = stream_fn::of<&end_fns::forward>(&end);
        p.step_end.push_back(e);
        return p;
    }
};

//! The parameters every rank must hold after `steps` steps: sum over steps k, ranks r and
//! microbatches mb of 2 (k + 10 l + 100 r + 1000 mb).
int expected_param(int l, int steps, int ranks) {
    int sum = 0;
    for (int step = 1; step <= steps; ++step)
        for (int r = 0; r < ranks; ++r)
            for (int mb = 0; mb < microbatches; ++mb) sum += 2 * (step + 10 * l + 100 * r + 1000 * mb);
    return sum;
}

template <class Config>
void check_data_parallel(const char* impl) {
    comm(); // takes this rank's GPU before any stream or buffer is made
    cuda::stream s;
    dp_model m(mpi().rank(), s);
    hook_pipeline hooks{gradient_all_reduce(comm(), microbatches, ncclInt32, ncclSum)};
    static_assert(hooks_fit<Config, decltype(hooks)>);
    runner<Config> r(with_hooks(m.program(), hooks, m.tensors));
    cuda::require_same_plan(comm(), plan_fingerprint(r.plan(), r.program()), s);
    for (int step = 1; step <= Config::warmup_steps + 4; ++step) {
        r.step(s);
        for (int l = 0; l < layers; ++l) {
            const auto got = support::download(m.param[l].data(), n, s);
            const int want = expected_param(l, step, mpi().size());
            CHECK_MESSAGE(std::count(got.begin(), got.end(), want) == n, impl, ", rank ", mpi().rank(), ", step ", step, ", layer ", l,
                          ": ", got.front(), " != ", want);
        }
    }
    if constexpr (Config::impl != graph_impl::eager) CHECK(r.counters().replays > 0);
    if (mpi().rank() == 0) std::printf("  data parallel, %s: %d ranks, %d steps exact\n", impl, mpi().size(), Config::warmup_steps + 4);
}

} // namespace

TEST_CASE("data parallel: the gradient all-reduce hook, eager and captured, under every impl, exact on every rank") {
    check_data_parallel<config<impl::eager>>("none");
    check_data_parallel<config<impl::lazy_per_layer, modules<capture::mlp>, warmup_steps<1>>>("local");
    check_data_parallel<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine");
    check_data_parallel<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration");
}

TEST_CASE("ranks that planned different steps get a clear error on every rank, not a hang") {
    if (mpi().size() < 2) return; // one rank cannot disagree with itself
    comm();
    cuda::stream s;
    dp_model m(mpi().rank(), s);
    hook_pipeline hooks{gradient_all_reduce(comm(), microbatches, ncclInt32, ncclSum)};
    runner<config<impl::ahead_of_time_per_layer>> r(with_hooks(m.program(mpi().rank() == 1), hooks, m.tensors));
    try {
        cuda::require_same_plan(comm(), plan_fingerprint(r.plan(), r.program()), s);
        FAIL("ranks with different plans passed the check");
    } catch (const cuda::plan_mismatch& e) {
        if (mpi().rank() == 0) std::printf("  %s\n", e.what());
        CHECK(std::string(e.what()).find("the ranks planned different steps") != std::string::npos);
    }
}
