#pragma once
// A host-only stand-in for a model's stages (no CUDA): each stage function appends its name to
// a log, so the plan's call order can be checked and "run" without a GPU.

#include <capscope/plan.hpp>

#include <memory>
#include <string>
#include <vector>

namespace fake {

//! A hook's call as the hook tests log it: "what L<layer> mb<microbatch>".
template <class Context>
std::string where(const char* what, const Context& c) {
    return std::string(what) + " L" + std::to_string(c.layer()) + " mb" + std::to_string(c.microbatch());
}

struct recorder {
    std::vector<std::string>* log;
    std::string name;
    void forward(capscope::stream_handle) { log->push_back(name + ".fwd"); }
    void backward(capscope::stream_handle) { log->push_back(name + ".bwd"); }
};

//! Stages of a model with layers from `pattern` (D dense, E MoE, M Mamba). Layer stages are
//! shared by every microbatch; the embedding and the head read per-microbatch buffers.
struct model {
    std::vector<std::string> log;
    std::vector<std::unique_ptr<recorder>> recorders;
    std::vector<char> buffers = std::vector<char>(64);

    capscope::stage make(const std::string& name, int layer, capscope::stage_kind kind, capscope::capture_module_set regions,
                         void* buffer) {
        recorders.push_back(std::make_unique<recorder>(recorder{&log, name}));
        capscope::stage s;
        s.name = name;
        s.layer = layer;
        s.kind = kind;
        s.captured_by = regions;
        s.forward = capscope::stream_fn::of<&recorder::forward>(recorders.back().get());
        s.backward = capscope::stream_fn::of<&recorder::backward>(recorders.back().get());
        s.outputs = {{name + ".out", buffer, 1}};
        s.buffers_declared = true; // the recorder touches no buffer but this one
        return s;
    }

    capscope::training_program program(const std::string& pattern, bool dropless, int microbatches) {
        using capscope::capture_module;
        using k = capscope::stage_kind;
        capscope::training_program p;
        p.step_begin.push_back(make("zero_grad", -1, k::other, {}, &buffers[0]));
        p.step_begin.back().backward = {};
        std::vector<capscope::stage> layers;
        for (std::size_t i = 0; i < pattern.size(); ++i) {
            const int l = int(i);
            const std::string n = "layer" + std::to_string(i) + ".";
            void* b = &buffers[1 + i];
            if (pattern[i] == 'M') {
                layers.push_back(make(n + "mamba", l, k::mamba, {capture_module::mamba}, b));
                continue;
            }
            layers.push_back(make(n + "attention", l, k::attention, {capture_module::attention}, b));
            if (pattern[i] == 'D') {
                layers.push_back(make(n + "mlp", l, k::mlp, {capture_module::mlp}, b));
                continue;
            }
            layers.push_back(make(n + "moe_router", l, k::moe_router, {capture_module::moe, capture_module::moe_router}, b));
            layers.push_back(make(n + "moe_preprocess", l, k::moe_preprocess, {capture_module::moe, capture_module::moe_preprocess}, b));
            layers.back().synchronizes_with_host = dropless;
            layers.push_back(make(n + "moe_experts", l, k::moe_experts, {capture_module::moe}, b));
            layers.back().shapes_depend_on_data = dropless;
        }
        for (int mb = 0; mb < microbatches; ++mb) {
            const std::string suffix = microbatches > 1 ? ".mb" + std::to_string(mb) : "";
            std::vector<capscope::stage> list;
            list.push_back(make("embedding" + suffix, -1, k::embedding, {}, &buffers[40 + std::size_t(mb)]));
            list.insert(list.end(), layers.begin(), layers.end());
            list.push_back(make("head" + suffix, -1, k::head, {}, &buffers[50 + std::size_t(mb)]));
            p.microbatches.push_back(std::move(list));
        }
        p.step_end.push_back(make("optimizer", -1, k::optimizer, {}, &buffers[60]));
        p.step_end.back().backward = {};
        return p;
    }
};

} // namespace fake
