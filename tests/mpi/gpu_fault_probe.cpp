// Under `mpirun -np 2` on two GPUs: a fault on rank 1, while rank 0 waits for it inside a step's
// NCCL collective (eager, or in a replayed graph), must end both ranks within seconds, and the
// error must name the rank and what it was doing. tests/mpi/gpu_faults.py runs every case and
// times it from the fault.
//
//   gpu_fault_probe gpus          the GPUs this process can use (no MPI): the driver skips below 2
//   gpu_fault_probe FAULT IMPL    FAULT: none plan capture oom throw stop
//                                 IMPL:  none local transformer_engine full_iteration
//
// The data-parallel tests' integer model (tests/gpu/data_parallel_model.hpp), with its gradient
// all-reduce hook on a real communicator, each step watched by cuda::nccl_watchdog with short
// timeouts. Rank 1's fault:
//   none     no fault: every step's parameters exact on both ranks, exit 0
//   plan     its runner's plan is refused (a step-level stage without a forward, rule P3): rank 0
//            waits in require_same_plan's all-reduce
//   capture  its layer stage synchronizes its stream while it is captured (the capture fails);
//            captured impls only
//   oom      out of device memory at step 5: in the layer stage when it runs eagerly (impl none),
//            else on the host between steps, a trainer's allocation (a replayed stage runs no host
//            code), named by a scope_label
//   throw    its layer stage throws: at step 5 under impl none, else while it is captured (the
//            user's text, `injected fault at step N`: capscope adds the rank to it)
//   stop     it stops taking part before step 5 (sleeps): rank 0's watchdog must end the job
// Before the fault, rank 1 prints `fault injected at <seconds since the epoch>`.

#include "../gpu/breakage.hpp"
#include "../gpu/data_parallel_model.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/parallel/mpi_bootstrap.hpp>
#include <capscope/cuda/nccl.hpp>
#include <capscope/parallel/nccl_watchdog.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>
#include <capscope/parallel/data_parallel.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace capscope;
using namespace data_parallel_model;

namespace {

constexpr int fault_step = 5, steps = 6;

//! What rank 1 does wrong, and when; `step` is the step being run.
struct fault_plan {
    std::string fault;
    bool mine = false; // this rank is the one that fails
    int step = 0;
};

void announce() {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::printf("fault injected at %.3f\n", now);
    std::fflush(stdout);
}

//! Layer 1's forward of microbatch 0 with the fault in front of it: the stage's host code runs
//! every eager step, and once while the stage is captured (never on replay).
struct faulty_layer {
    stream_fn inner;
    const fault_plan* plan;
    void forward(cudaStream_t s) {
        if (plan->mine) {
            cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
            CAPSCOPE_CHECK(cudaStreamIsCapturing(s, &capturing));
            const bool captured = capturing != cudaStreamCaptureStatusNone;
            if (plan->fault == "capture" && captured) {
                announce();
                CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // not allowed while capturing: the capture fails
            }
            if (plan->fault == "throw" && (captured || plan->step == fault_step)) {
                announce();
                // The user's own text alone: capscope adds the rank, not the stage, to an exception it
                // did not raise.
                throw std::runtime_error("injected fault at step " + std::to_string(plan->step) + (captured ? ", while capturing" : ""));
            }
            if (plan->fault == "oom" && !captured && plan->step == fault_step) {
                announce();
                cuda::device_buffer<std::byte> huge(std::size_t{1} << 50); // 1 PiB
            }
        }
        inner(s);
    }
};

template <class Config>
int run(cuda::mpi_session& mpi, const std::string& fault) {
    const cuda::nccl_communicator comm = cuda::communicator_from_mpi(mpi); // before any stream or buffer
    cuda::stream s;
    dp_model m(mpi.rank(), s);
    fault_plan plan{fault, mpi.rank() == 1, 0};
    training_program program = m.program();
    faulty_layer faulty{program.microbatches[0][1].forward, &plan};
    program.microbatches[0][1].forward = stream_fn::of<&faulty_layer::forward>(&faulty);
    if (plan.mine && fault == "plan") {
        stage broken;
        broken.name = "clip_gradients"; // a step-level stage without a forward: plan rule P3
        program.step_end.push_back(broken);
        announce();
    }
    hook_pipeline hooks{gradient_all_reduce(comm, ncclInt32, ncclSum)};
    runner<Config> r(with_hooks(std::move(program), hooks, m.tensors));
    cuda::require_same_plan(comm, plan_fingerprint(r.plan(), r.program()), s);
    // Short timeouts, so that a rank that stops is found well within the bound.
    watchdog_settings settings;
    settings.step_timeout = std::chrono::milliseconds(2000);
    settings.warmup_timeout = std::chrono::milliseconds(5000);
    settings.poll = std::chrono::milliseconds(10);
    cuda::nccl_watchdog dog(comm, settings);
    for (int step = 1; step <= steps; ++step) {
        plan.step = step;
        if (plan.mine && step == fault_step && fault == "stop") {
            announce();
            std::this_thread::sleep_for(std::chrono::minutes(10)); // a rank that stopped taking part
        }
        if (plan.mine && step == fault_step && fault == "oom" && Config::impl != graph_impl::eager) {
            announce();
            const scope_label doing("the trainer, growing a buffer between steps");
            cuda::device_buffer<std::byte> huge(std::size_t{1} << 50);
        }
        if (breakage::broken("no_watchdog")) r.step(s); // broken on purpose: a rank that stops then hangs the other
        else dog.step(r, s);
        for (int l = 0; l < data_parallel_model::layers; ++l) { // waits for the step: rank 0 waits here for a rank that failed
            const std::string wrong = wrong_params(m, l, step, mpi.size(), false, s);
            if (!wrong.empty()) throw std::runtime_error("parameters not the sum over the ranks: " + wrong);
        }
    }
    // A captured impl that fell back to eager would not test a rank waiting inside a replayed graph.
    if (Config::impl != graph_impl::eager && r.counters().replays == 0) throw std::runtime_error("no graph replayed under a captured impl");
    std::printf("rank %d of %d: %d steps exact, %ld replays\n", mpi.rank(), mpi.size(), steps, long(r.counters().replays));
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    const std::vector<std::string_view> faults{"none", "plan", "capture", "oom", "throw", "stop"};
    const std::vector<std::string_view> impls{"none", "local", "transformer_engine", "full_iteration"};
    if (argc == 2 && std::string_view(argv[1]) == "gpus") {
        std::printf("%d\n", cuda::usable_device_count());
        return 0;
    }
    const auto known = [](const std::vector<std::string_view>& names, std::string_view name) {
        return std::ranges::find(names, name) != names.end();
    };
    breakage::install_from_environment();
    if (argc != 3 || !known(faults, argv[1]) || !known(impls, argv[2])) {
        std::fprintf(stderr, "usage: gpu_fault_probe gpus | gpu_fault_probe {none|plan|capture|oom|throw|stop} "
                             "{none|local|transformer_engine|full_iteration}\n");
        return 2;
    }
    const std::string fault = argv[1], impl = argv[2];
    if (fault == "capture" && impl == "none") {
        std::fprintf(stderr, "gpu_fault_probe: impl none captures nothing, so no capture can fail\n");
        return 2;
    }
    return cuda::run_ranks([&](cuda::mpi_session& mpi) {
        if (impl == "none") return run<config<impl::eager>>(mpi, fault);
        if (impl == "local") return run<config<impl::lazy_per_layer, modules<capture::mlp>, warmup_steps<1>>>(mpi, fault);
        if (impl == "transformer_engine") return run<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>(mpi, fault);
        return run<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>(mpi, fault);
    });
}
