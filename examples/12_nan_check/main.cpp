// Tutorial 12: the NaN/inf check inside a whole-step graph. Megatron checks loss and gradients on
// the host, which a graph cannot do, so it refuses `--cuda-graph-impl full_iteration` with the
// check on (rule A1). capscope can check on the device instead (`nan_check_on_device`): a kernel
// writes an "all finite" flag, and the optimizer is a guarded stage (`run_if`), which the whole-step
// graph holds as a conditional node. A step whose gradients overflow skips its update inside the
// graph, with no host sync.
//
// The tutorial overflows one gradient at step 100 (its own kernel, overflow.cu) and trains the
// same model twice: eagerly, where the runner reads the flag on the host, and as one graph per
// step. Both must skip step 100 and end bit for bit alike.
//
// Then the same in fp16, which needs dynamic loss scaling (model_config::loss_scale): the loss's
// gradient is multiplied by a scale kept on the device, AdamW divides it out, and a stage after the
// optimizer halves the scale on a skipped step and doubles it after 50 finite ones, all inside the
// graph.
//
//   12_nan_check [--dot FILE]
//
// Exits 1 unless every run skips exactly one step, eager and graphed end bitwise equal (weights and
// scale) and learn; 77 without a GPU.

#include "../common/tutorial.hpp"
#include "overflow.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cuda_fp16.h>

#include <cstring>
#include <type_traits>

using namespace capscope;

constexpr int steps = 200, overflow_step = 100;

//! A stage of the tutorial's own, at the front of step_end (after every backward, before the
//! check): it overflows the first gradient at `overflow_step`.
struct overflow_injector {
    float* gradients;
    cuda::device_buffer<int> count{1};
    void run(cudaStream_t s) { overflow_at(gradients, count.data(), overflow_step, s); }
};

struct trained {
    std::vector<float> masters;
    int skipped = 0;
    float first_loss = 0, last_loss = 0, scale = 0;
};

template <class T, class Config> trained train(const char* name, const std::string& dot_path, cudaStream_t s) {
    constexpr bool fp16 = std::is_same_v<T, __half>;
    // [snippet loss_scale]
    gpt::model_config cfg = tutorial::reverse_task_model("DEMD", 128, 32, 2);
    cfg.check_finite_on_device = true; // the check stage, and the optimizer guarded by its flag
    if (fp16) cfg.loss_scale = {.dynamic = true, .initial = 1024.f, .growth_interval = 50};
    gpt::gpt_model<T> model(cfg, s);
    // [snippet loss_scale]
    overflow_injector inject{model.parameters().grads()};
    inject.count.fill_bytes(0, s);

    training_program program = model.training_program();
    stage st;
    st.name = "overflow_at_step_100";
    st.forward = stream_fn::of<&overflow_injector::run>(&inject);
    st.buffers_declared = true;
    st.outputs = {{"gradients[0]", model.parameters().grads(), sizeof(float)}, {"count", inject.count.data(), sizeof(int)}};
    program.step_end.insert(program.step_end.begin(), std::move(st));

    runner<Config> r(std::move(program));
    std::printf("== %s\n", name);
    if (Config::impl != graph_impl::eager) std::fputs(r.plan_text().c_str(), stdout);
    tutorial::write_dot(dot_path, r.plan_dot());

    std::mt19937 rng(12);
    trained out;
    for (int step = 1; step <= steps; ++step) {
        tutorial::feed(model, rng, s);
        model.set_optimizer({2e-3f}, s);
        r.step(s);
        if (step == 1 || step == overflow_step - 1 || step == overflow_step || step == overflow_step + 1 || step == steps) {
            const float loss = model.loss(s);
            if (step == 1) out.first_loss = loss;
            out.last_loss = loss;
            std::printf("step %4d  loss %.4f  skipped so far %d", step, loss, model.skipped_steps(s));
            if (fp16) std::printf("  loss scale now %.0f", double(model.loss_scale(s).scale));
            std::puts(step != overflow_step ? ""
                      : fp16                ? "   <- a gradient overflowed: the update was skipped, the scale halved"
                                            : "   <- a gradient overflowed: the update was skipped");
        }
    }
    tutorial::print_counters(name, r.counters());
    out.skipped = model.skipped_steps(s);
    out.scale = model.loss_scale(s).scale;
    out.masters.resize(model.parameters().total());
    CAPSCOPE_CHECK(cudaMemcpyAsync(out.masters.data(), model.parameters().masters(), out.masters.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return out;
}

//! Trains eagerly and as one graph per step; true when both skip step 100 alone, end bitwise
//! equal (the weights, and in fp16 the loss scale) and learn.
template <class T> bool compare(const char* precision, const std::string& dot_path, cudaStream_t s) {
    const std::string eager_name = std::string(precision) + ", eager, the flag read on the host";
    const std::string graph_name = std::string(precision) + ", full_iteration, the check and a conditional node in the graph";
    const trained eager = train<T, config<impl::eager, nan_check_on_device>>(eager_name.c_str(), "", s);
    const trained graphed = train<T, config<impl::whole_iteration, warmup_steps<1>, nan_check_on_device>>(graph_name.c_str(), dot_path, s);
    const bool same = eager.masters.size() == graphed.masters.size() && eager.scale == graphed.scale &&
                      std::memcmp(eager.masters.data(), graphed.masters.data(), eager.masters.size() * sizeof(float)) == 0;
    std::printf("%s: skipped steps: eager %d, graphed %d; weights after %d steps bitwise equal: %s; loss %.4f -> %.4f\n\n", precision,
                eager.skipped, graphed.skipped, steps, same ? "yes" : "NO", graphed.first_loss, graphed.last_loss);
    return same && eager.skipped == 1 && graphed.skipped == 1 && graphed.last_loss < 0.5f * graphed.first_loss;
}

int main(int argc, char** argv) {
    const auto args = tutorial::parse(argc, argv, "usage: 12_nan_check [--dot FILE]");
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        // What Megatron says to a whole-step graph with the host's check on:
        runtime_config megatron;
        megatron.impl = graph_impl::whole_iteration;
        const validation_report report = validate(megatron);
        std::printf("config<impl::whole_iteration> (the check on the host): [%s] %s\n  fix: %s\n\n", std::string(report.violations[0].rule->id).c_str(),
                    report.violations[0].text().c_str(), std::string(report.violations[0].rule->fix).c_str());

        cuda::stream s;
        const bool bf16_ok = compare<__nv_bfloat16>("bf16", "", s);
        const bool fp16_ok = compare<__half>("fp16 with dynamic loss scaling", args.dot.empty() ? "" : args.dot[0], s);
        const bool ok = bf16_ok && fp16_ok;
        std::puts(ok ? "every check passed" : "FAIL");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "12_nan_check: %s\n", e.what());
        return 1;
    }
}
