// Data parallelism on hooks, replicated and sharded, one process per GPU (`mpirun -np 2`; alone it
// is one rank): each
// rank runs its own data through two layers and two microbatches, accumulating integer
// gradients; the data-parallel hook sums them across the ranks after the last microbatch's
// backward; the optimizer adds them to the parameters. Integers, so every result is exact: the
// parameters after each step must equal the sum over ranks and microbatches computed here, on
// every rank, under every impl (eager, warmup, captured), and a skipped or misplaced collective
// gives other numbers. Ranks with different plans get the same clear error, not a hang.

#include "breakage.hpp"
#include "data_parallel_model.hpp"
#include "engine_kernels.hpp"
#include "mpi_support.hpp"
#include "support.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>
#include <capscope/parallel/data_parallel.hpp>
#include <capscope/parallel/sharded.hpp>
#include <capscope/parallel/sharding.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;

namespace {

// Declarations, not a directive: this file's `layers` is the model's, not capscope::layers<N>.
using data_parallel_model::dp_model;
using data_parallel_model::expected_param;
using data_parallel_model::ints;
using data_parallel_model::layers;
using data_parallel_model::microbatches;
using data_parallel_model::n;
using data_parallel_model::synthetic_program;
using data_parallel_model::wrong_params;
using support::comm;
using support::mpi;

//! `op`: ncclSum (a double reduction doubles the result), or the trainer's default, ncclAvg (a
//! sum in its place, or a wrong divisor, gives other numbers on two ranks).
template <class Config>
void check_data_parallel(const char* impl, ncclRedOp_t op = ncclSum) {
    comm(); // takes this rank's GPU before any stream or buffer is made
    cuda::stream s;
    dp_model m(mpi().rank(), s);
    if (breakage::broken("sum_for_average")) op = ncclSum; // broken on purpose: a sum where an average is expected
    hook_pipeline hooks{op == ncclAvg ? gradient_all_reduce(comm(), ncclInt32) : gradient_all_reduce(comm(), ncclInt32, op)};
    static_assert(hooks_fit<Config, decltype(hooks)>);
    runner<Config> r(with_hooks(m.program(), hooks, m.tensors));
    cuda::require_same_plan(comm(), plan_fingerprint(r.plan(), r.program()), s);
    for (int step = 1; step <= Config::warmup_steps + 4; ++step) {
        r.step(s);
        for (int l = 0; l < layers; ++l) {
            const std::string wrong = wrong_params(m, l, step, mpi().size(), op == ncclAvg, s);
            CHECK_MESSAGE(wrong.empty(), std::string(impl), ", rank ", mpi().rank(), ", ", wrong);
        }
    }
    if constexpr (Config::impl != graph_impl::eager) CHECK(r.counters().replays > 0);
    if constexpr (Config::impl != graph_impl::eager && Config::warmup_steps >= 2) CHECK(r.counters().doctor_calls_watched > 0);
    if (mpi().rank() == 0)
        std::printf("  data parallel, %s, %s: %d ranks, %d steps exact (capture doctor: %ld stage calls watched)\n", impl,
                    op == ncclAvg ? "average" : "sum", mpi().size(), Config::warmup_steps + 4, r.counters().doctor_calls_watched);
}

} // namespace

TEST_CASE("data parallel: the gradient all-reduce hook, eager and captured, under every impl, exact on every rank") {
    check_data_parallel<config<impl::eager>>("none");
    check_data_parallel<config<impl::lazy_per_layer, modules<capture::mlp>, warmup_steps<1>>>("local");
    check_data_parallel<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine");
    check_data_parallel<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration");
}

TEST_CASE("data parallel with the capture doctor watching the last warmup step: NCCL's all-reduce in a hook is no offence") {
    check_data_parallel<config<impl::lazy_per_layer, modules<capture::mlp>, warmup_steps<2>>>("local, warmup 2");
    check_data_parallel<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>>("transformer_engine, warmup 2");
    check_data_parallel<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>>("full_iteration, warmup 2");
}

TEST_CASE("data parallel: the default reduction averages, and two ranks tell the average from the sum, under every impl") {
    check_data_parallel<config<impl::eager>>("none", ncclAvg);
    check_data_parallel<config<impl::lazy_per_layer, modules<capture::mlp>, warmup_steps<1>>>("local", ncclAvg);
    check_data_parallel<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine", ncclAvg);
    check_data_parallel<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration", ncclAvg);
}

TEST_CASE("ranks that planned different steps get a clear error on every rank, not a hang") {
    if (mpi().size() < 2) return; // one rank cannot disagree with itself
    comm();
    cuda::stream s;
    dp_model m(mpi().rank(), s);
    hook_pipeline hooks{gradient_all_reduce(comm(), ncclInt32, ncclSum)};
    runner<config<impl::ahead_of_time_per_layer>> r(with_hooks(m.program(mpi().rank() == 1), hooks, m.tensors));
    try {
        cuda::require_same_plan(comm(), plan_fingerprint(r.plan(), r.program()), s);
        FAIL("ranks with different plans passed the check");
    } catch (const cuda::plan_mismatch& e) {
        if (mpi().rank() == 0) std::printf("  %s\n", e.what());
        CHECK(std::string(e.what()).find("the ranks planned different steps") != std::string::npos);
    }
}

namespace {
//! An all-reduce of a layer's gradients on the step's own stream (no lane), as a trainer might write
//! it; `collective_calls` makes it a collective for the plan (its fingerprint, and rule P18).
struct all_reduce_on_step_stream {
    ncclComm_t comm;
    void operator()(backward_context& c) const {
        for (const tensor_ref& g : c.gradients())
            CAPSCOPE_CHECK(ncclAllReduce(g.data, g.data, g.bytes / sizeof(int), ncclInt32, ncclSum, comm, c.stream()));
    }
    std::string collective_calls(int) const { return "all-reduce int32 sum"; }
};
} // namespace

TEST_CASE("a step the device may refuse, with an all-reduce on the step's own stream: P18 on every rank, before any collective") {
    // A refused step runs again on the rank whose flag was set, and only there: its all-reduce would
    // wait for the other ranks forever. On the step's stream (lane 0) as much as on a side lane.
    comm();
    cuda::stream s;
    dp_model m(mpi().rank(), s);
    ints refused(1);
    const tensor_ref flag{"refused", refused.data(), refused.bytes()};
    training_program p = m.program();
    stage clear;
    clear.name = "clear refused";
    clear.forward = stream_fn::from([](stream_handle) {});
    clear.buffers_declared = true;
    clear.outputs = {flag};
    p.step_begin.insert(p.step_begin.begin(), clear);
    p.rerun.flag = flag;
    p.rerun.before = stream_fn::from([](stream_handle) {});
    const hook_pipeline hooks{hook<hook_phase::backward, capturable, last_microbatch_only>("all-reduce", all_reduce_on_step_stream{comm().get()})};
    std::string refusal = "no error";
    try {
        runner<config<impl::ahead_of_time_per_layer, modules<>>> r(with_hooks(p, hooks, m.tensors));
    } catch (const plan_error& e) {
        refusal = e.what();
    }
    if (mpi().rank() == 0) std::printf("  %d ranks, an all-reduce hook on lane 0 in a step that may be refused: %s\n", mpi().size(), refusal.c_str());
    CHECK_MESSAGE(refusal.find("capscope plan rule P18: stage 'layer0.hook.all-reduce' is a collective") == 0, refusal);
}

// ---- sharded: all-gather before each layer's forward, reduce-scatter after its backward ----------

namespace {

//! The same step as dp_model, with each layer's parameters sharded over `Layers` layers: a forward
//! copies the gathered parameters it sees into `seen` (so the test can tell that the gather ran,
//! and when), the backward accumulates full gradients (and, with `backward_reads_parameters`,
//! adds the gathered parameters of its layer), and the optimizer adds the reduced shard to the
//! shard. Layer l gathers into full[l % 2], the static double buffer.
template <int Layers>
struct sharded_model_of {
    static constexpr int layer_count = Layers;
    int rank, ranks;
    bool backward_reads_parameters;
    shard_layout layout;
    ints counter{1}, tmp{n};
    std::vector<ints> act, seen, param_shard, grad_full, grad_shard;
    ints full[2] = {ints(n), ints(n)};
    std::vector<sharded_layer_buffers> buffers;
    // What the hooks touch: the gathered parameters the layer reads, and its gradients.
    tensor_ref full_refs[Layers], grad_refs[Layers];
    layer_tensors tensors[Layers];

    struct begin_fns {
        sharded_model_of* m;
        void forward(cudaStream_t s) {
            k::add_one(m->counter.data(), s);
            for (auto& g : m->grad_full) g.fill_bytes(0, s);
        }
    } begin{this};
    struct layer_fns {
        sharded_model_of* m;
        int mb, l;
        void forward(cudaStream_t s) {
            const int i = mb * Layers + l;
            k::fill_from(m->act[std::size_t(i)].data(), m->counter.data(), 10 * l + 100 * m->rank + 1000 * mb, n, s);
            k::scale(m->seen[std::size_t(i)].data(), m->full[l % 2].data(), 1, n, s);
        }
        void backward(cudaStream_t s) {
            ints& g = m->grad_full[std::size_t(l)];
            k::scale(m->tmp.data(), m->act[std::size_t(mb * Layers + l)].data(), 2, n, s);
            k::add(g.data(), g.data(), m->tmp.data(), n, s);
            if (m->backward_reads_parameters) k::add(g.data(), g.data(), m->full[l % 2].data(), n, s);
        }
    };
    std::vector<layer_fns> fns;
    struct end_fns {
        sharded_model_of* m;
        void forward(cudaStream_t s) {
            for (int l = 0; l < Layers; ++l)
                k::add(m->param_shard[std::size_t(l)].data(), m->param_shard[std::size_t(l)].data(), m->grad_shard[std::size_t(l)].data(),
                       int(m->layout.parameters[std::size_t(l)].shard), s);
        }
    } end{this};

    sharded_model_of(int r, int size, cudaStream_t s, bool reads_parameters = false)
        : rank(r), ranks(size), backward_reads_parameters(reads_parameters), layout(make_shard_layout(std::vector<std::size_t>(Layers, n), size, 64)) {
        REQUIRE(layout.parameters[0].padded == std::size_t(n)); // n divides into aligned shards: the gather fills `full` exactly
        for (int i = 0; i < microbatches * Layers; ++i) {
            act.emplace_back(n);
            seen.emplace_back(n);
        }
        for (int l = 0; l < Layers; ++l) {
            const std::size_t shard = layout.parameters[std::size_t(l)].shard;
            param_shard.emplace_back(shard);
            grad_shard.emplace_back(shard);
            grad_full.emplace_back(n);
            param_shard.back().fill_bytes(0, s);
        }
        counter.fill_bytes(0, s);
        for (int l = 0; l < Layers; ++l) {
            buffers.push_back({param_shard[std::size_t(l)].data(), full[l % 2].data(), grad_full[std::size_t(l)].data(),
                               grad_shard[std::size_t(l)].data(), layout.parameters[std::size_t(l)].shard, ncclInt32, ncclInt32});
            full_refs[l] = {"full", full[l % 2].data(), full[l % 2].bytes()};
            grad_refs[l] = {"grad_full", grad_full[std::size_t(l)].data(), grad_full[std::size_t(l)].bytes()};
            tensors[l] = {{&full_refs[l], 1}, {&grad_refs[l], 1}};
        }
        fns.reserve(microbatches * Layers);
    }
    sharded_model_of(const sharded_model_of&) = delete; // the stages and the tensors point into it

    training_program program() { return synthetic_program(*this); }
};
using sharded_model = sharded_model_of<layers>;

//! `Gather`: prefetch_next_layer (each layer's gather while the one before it computes) or gather_on_demand.
template <class Config, class Gather = prefetch_next_layer>
void check_sharded(const char* impl, ncclRedOp_t op = ncclSum) {
    comm();
    using policy = sharded<static_double_buffer, persistent_buffer, keep_for_backward, Gather>;
    static_assert(sharding_fits<Config, policy>);
    cuda::stream s;
    sharded_model m(mpi().rank(), mpi().size(), s);
    if (breakage::broken("sum_for_average")) op = ncclSum; // broken on purpose: a sum where an average is expected
    hook_pipeline hooks{parameter_all_gather(comm(), m.buffers, Gather{}), gradient_reduce_scatter(comm(), m.buffers, op)};
    static_assert(hooks_fit<Config, decltype(hooks)>);
    runner<Config> r(with_hooks(m.program(), hooks, m.tensors));
    cuda::require_same_plan(comm(), plan_fingerprint(r.plan(), r.program()), s);
    for (int step = 1; step <= Config::warmup_steps + 4; ++step) {
        r.step(s);
        for (int l = 0; l < layers; ++l) {
            // The forward of every microbatch saw the full parameters of the step before (gathered).
            for (int mb = 0; mb < microbatches; ++mb) {
                const auto seen = support::download(m.seen[std::size_t(mb * layers + l)].data(), n, s);
                const int want_seen = expected_param(l, step - 1, mpi().size(), op == ncclAvg);
                CHECK_MESSAGE(std::count(seen.begin(), seen.end(), want_seen) == n, std::string(impl), ", rank ", mpi().rank(), ", step ", step,
                              ", layer ", l, ", microbatch ", mb, ": gathered ", seen.front(), " != ", want_seen);
            }
            // The shard holds its part of the reduced update.
            const std::size_t shard = m.layout.parameters[std::size_t(l)].shard;
            const auto mine = support::download(m.param_shard[std::size_t(l)].data(), shard, s);
            const int want = expected_param(l, step, mpi().size(), op == ncclAvg);
            CHECK_MESSAGE(std::count(mine.begin(), mine.end(), want) == long(shard), std::string(impl), ", rank ", mpi().rank(), ", step ", step,
                          ", layer ", l, ": shard ", mine.front(), " != ", want);
        }
    }
    if constexpr (Config::impl != graph_impl::eager) CHECK(r.counters().replays > 0);
    if (mpi().rank() == 0)
        std::printf("  sharded, %s, %s, %s: %d ranks, %zu of %d elements per layer on each rank, %d steps exact\n",
                    std::is_same_v<Gather, prefetch_next_layer> ? "prefetched" : "on demand", impl, op == ncclAvg ? "average" : "sum", mpi().size(), m.layout.parameters[0].shard, n, Config::warmup_steps + 4);
}

} // namespace

TEST_CASE("sharded data parallel: all-gather before each layer's forward, reduce-scatter after its backward, under every impl") {
    check_sharded<config<impl::eager>>("none");
    check_sharded<config<impl::lazy_per_layer, modules<capture::mlp>, warmup_steps<1>>>("local");
    check_sharded<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine");
    check_sharded<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration");
    check_sharded<config<impl::eager>, gather_on_demand>("none");
    check_sharded<config<impl::lazy_per_layer, modules<capture::mlp>, warmup_steps<1>>, gather_on_demand>("local");
    check_sharded<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>, gather_on_demand>("transformer_engine");
}

TEST_CASE("sharded data parallel: an averaging reduce-scatter, told from the sum on two ranks, under every impl") {
    check_sharded<config<impl::eager>>("none", ncclAvg);
    check_sharded<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine", ncclAvg);
    check_sharded<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration", ncclAvg);
}

// ---- sharded, 3 layers on a double buffer, the backward reading the gathered parameters ------------

namespace {

constexpr int regather_layers = 3;

//! Three layers on the double buffer: layer 2's gather overwrites layer 0's parameters, so layer
//! 0's backward, which reads them, is right only if the re-gather before it ran, in its place.
using regather_model = sharded_model_of<regather_layers>;

//! Each layer's parameter after each step, worked out on the host (sum over ranks): every
//! element alike.
std::vector<std::vector<long long>> regather_expected(int steps, int ranks) {
    std::vector<std::vector<long long>> p(std::size_t(steps + 1), std::vector<long long>(regather_layers, 0));
    for (int step = 1; step <= steps; ++step)
        for (int l = 0; l < regather_layers; ++l) {
            long long g = 0;
            for (int r = 0; r < ranks; ++r)
                for (int mb = 0; mb < microbatches; ++mb) g += 2 * (step + 10 * l + 100 * r + 1000 * mb) + p[std::size_t(step - 1)][std::size_t(l)];
            p[std::size_t(step)][std::size_t(l)] = p[std::size_t(step - 1)][std::size_t(l)] + g;
        }
    return p;
}

template <class Config, class Gather, class Hooks>
void run_regather(regather_model& m, const Hooks& hooks, const char* impl, cudaStream_t s);

template <class Config, class Gather = prefetch_next_layer>
void check_regather(const char* impl) {
    comm();
    using policy = sharded<static_double_buffer, persistent_buffer, regather_for_backward, Gather>;
    static_assert(sharding_fits<Config, policy>);
    cuda::stream s;
    regather_model m(mpi().rank(), mpi().size(), s, /*reads_parameters=*/true);
    hook_pipeline hooks{parameter_all_gather(comm(), m.buffers, Gather{}), parameter_regather(comm(), m.buffers, Gather{}),
                        gradient_reduce_scatter(comm(), m.buffers, ncclSum)};
    run_regather<Config, Gather>(m, hooks, impl, s);
}

template <class Config, class Gather, class Hooks>
void run_regather(regather_model& m, const Hooks& hooks, const char* impl, cudaStream_t s) {
    runner<Config> r(with_hooks(m.program(), hooks, m.tensors));
    cuda::require_same_plan(comm(), plan_fingerprint(r.plan(), r.program()), s);
    const int steps = Config::warmup_steps + 4;
    const auto want = regather_expected(steps, mpi().size());
    bool exact = true;
    for (int step = 1; step <= steps; ++step) {
        r.step(s);
        for (int l = 0; l < regather_layers; ++l) {
            const std::size_t shard = m.layout.parameters[std::size_t(l)].shard;
            const auto mine = support::download(m.param_shard[std::size_t(l)].data(), shard, s);
            const long long w = want[std::size_t(step)][std::size_t(l)];
            const bool same = std::count(mine.begin(), mine.end(), int(w)) == long(shard);
            exact = exact && same;
            CHECK_MESSAGE(same, std::string(impl), ", rank ", mpi().rank(), ", step ", step, ", layer ", l, ": shard ", mine.front(), " != ", w);
        }
    }
    if constexpr (Config::impl != graph_impl::eager) CHECK(r.counters().replays > 0);
    if (mpi().rank() == 0)
        std::printf("  sharded, re-gathered for the backward, %s, %s: %d ranks, 3 layers on a double buffer, %d steps exact: %s\n",
                    std::is_same_v<Gather, prefetch_next_layer> ? "prefetched" : "on demand", impl, mpi().size(), steps, exact ? "yes" : "NO");
}

} // namespace

//! Without the re-gather, layer 0's backward would read layer 2's weights from the double buffer
//! (wrong bits, no race: the must-fail test of issue 34 showed it): the plan refuses it (P19).
template <class Config>
std::string refused_without_regather() {
    cuda::stream s;
    regather_model m(mpi().rank(), mpi().size(), s, /*reads_parameters=*/true);
    hook_pipeline hooks{parameter_all_gather(comm(), m.buffers, gather_on_demand{}), gradient_reduce_scatter(comm(), m.buffers, ncclSum)};
    try {
        runner<Config> r(with_hooks(m.program(), hooks, m.tensors));
    } catch (const plan_error& e) {
        return e.what();
    }
    return "accepted";
}

TEST_CASE("sharded data parallel: gathered weights kept for the backward in a double buffer are refused (P19), under every impl") {
    comm();
    const std::string texts[] = {refused_without_regather<config<impl::eager>>(),
                                 refused_without_regather<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>(),
                                 refused_without_regather<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>()};
    for (const std::string& text : texts) {
        const bool names_both = text.find("capscope plan rule P19: ") == 0 && text.find("reads layer 0's parameters") != std::string::npos &&
                                text.find("layer 2's") != std::string::npos;
        CHECK_MESSAGE(names_both, text);
    }
    if (mpi().rank() == 0) std::printf("  sharded, no re-gather, 3 layers on a double buffer: %s\n", texts[0].substr(0, 160).c_str());
}

TEST_CASE("sharded data parallel: 3 layers on a double buffer, re-gathered before each backward that reads them, under every impl") {
    check_regather<config<impl::eager>>("none");
    check_regather<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine");
    check_regather<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration");
    check_regather<config<impl::eager>, gather_on_demand>("none");
    check_regather<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>, gather_on_demand>("transformer_engine");
    check_regather<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>, gather_on_demand>("full_iteration");
}

TEST_CASE("the plan's fingerprint covers the real hooks' bucket size and the sharded collectives' element type") {
    comm();
    cuda::stream s;
    dp_model m(mpi().rank(), s);
    auto fingerprint = [&](std::size_t bucket_bytes) {
        hook_pipeline hooks{gradient_all_reduce(comm(), ncclInt32, ncclSum, bucket_bytes)};
        const training_program p = with_hooks(m.program(), hooks, m.tensors);
        return plan_fingerprint(make_training_plan(capture_scope_of<config<impl::whole_iteration, no_nan_check>>, 1, p), p);
    };
    CHECK(fingerprint(40 << 20) == fingerprint(40 << 20));
    CHECK(fingerprint(40 << 20) != fingerprint(1 << 20)); // other NCCL groups: a rank must not pass the same-plan check with it
    sharded_model sm(mpi().rank(), mpi().size(), s);
    auto sharded_fingerprint = [&](ncclDataType_t parameter_type) {
        std::vector<sharded_layer_buffers> buffers = sm.buffers;
        for (auto& b : buffers) b.parameter_type = parameter_type; // the same bytes per element, another type
        hook_pipeline hooks{parameter_all_gather(comm(), buffers), gradient_reduce_scatter(comm(), buffers, ncclSum)};
        const training_program p = with_hooks(sm.program(), hooks, sm.tensors);
        return plan_fingerprint(make_training_plan(capture_scope_of<config<impl::whole_iteration, no_nan_check>>, 1, p), p);
    };
    CHECK(sharded_fingerprint(ncclInt32) == sharded_fingerprint(ncclInt32));
    CHECK(sharded_fingerprint(ncclInt32) != sharded_fingerprint(ncclFloat32));
}
