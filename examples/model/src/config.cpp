#include <gpt/config.hpp>

#include <cmath>
#include <stdexcept>
#include <string>

namespace gpt {
namespace {
[[noreturn]] void reject(const std::string& field, const std::string& got, const std::string& need) {
    throw std::invalid_argument("model config: " + field + " = " + got + ": " + need);
}
void positive(const char* field, int v) {
    if (v <= 0) reject(field, std::to_string(v), "must be positive");
}
} // namespace

int model_config::expert_capacity() const {
    return static_cast<int>(std::ceil(capacity_factor * tokens() * top_k / experts));
}
int model_config::dropless_capacity() const {
    return static_cast<int>(std::ceil(dropless_capacity_factor * tokens() * top_k / experts));
}

void model_config::validate() const {
    positive("vocab", vocab);
    positive("hidden", hidden);
    positive("heads", heads);
    positive("ffn_hidden", ffn_hidden);
    if (!(hidden_dropout >= 0.f && hidden_dropout < 1.f))
        throw std::invalid_argument("model_config::hidden_dropout must be in [0, 1), got " + std::to_string(hidden_dropout));
    positive("seq_len", seq_len);
    positive("batch", batch);
    positive("microbatches", microbatches);
    if (hidden % heads != 0) reject("hidden", std::to_string(hidden), "must be a multiple of heads (" + std::to_string(heads) + ")");
    if (head_dim() > max_head_dim)
        reject("heads", std::to_string(heads), "gives heads of " + std::to_string(head_dim()) + " (hidden / heads) but attention takes at most " +
                                                   std::to_string(max_head_dim) + "; use at least " +
                                                   std::to_string((hidden + max_head_dim - 1) / max_head_dim) + " heads");
    if (layer_pattern.empty()) reject("layer_pattern", "\"\"", "needs at least one layer: D (dense), E (MoE) or M (Mamba)");
    bool moe = false;
    for (char c : layer_pattern) {
        if (c != 'D' && c != 'E' && c != 'M')
            reject("layer_pattern", "\"" + layer_pattern + "\"", std::string("unknown layer kind '") + c + "'; use D (dense), E (MoE) or M (Mamba)");
        moe |= c == 'E';
    }
    if (moe) {
        if (experts < 1 || experts > 64) reject("experts", std::to_string(experts), "must be in [1, 64]");
        if (top_k < 1 || top_k > experts) reject("top_k", std::to_string(top_k), "must be in [1, experts]");
        if (moe_mode == gpt::moe_mode::drop_and_pad && !(capacity_factor > 0))
            reject("capacity_factor", std::to_string(capacity_factor), "must be > 0 for drop-and-pad");
    }
    if (!(dropless_capacity_factor >= 0) || !std::isfinite(dropless_capacity_factor))
        reject("dropless_capacity_factor", std::to_string(dropless_capacity_factor), "must be 0 (off) or a positive factor of the mean");
    if (dropless_capacity_factor > 0 && moe_mode != gpt::moe_mode::dropless)
        reject("dropless_capacity_factor", std::to_string(dropless_capacity_factor),
               "is a static capacity for dropless MoE, but moe_mode is drop_and_pad (whose capacity is capacity_factor); set moe_mode "
               "dropless or leave it 0");
    if (mamba_inner < 0) reject("mamba_inner", std::to_string(mamba_inner), "must be >= 0 (0: same as hidden)");
    if (loss_scale.dynamic) {
        if (!check_finite_on_device)
            reject("loss_scale.dynamic", "true",
                   "needs check_finite_on_device = true: a step whose scaled gradients overflow must be skipped before the scale is halved");
        int exponent = 0;
        const bool power_of_two = std::frexp(loss_scale.initial, &exponent) == 0.5f;
        if (!(loss_scale.initial >= loss_scale_state::smallest && loss_scale.initial <= loss_scale_state::largest) || !power_of_two)
            reject("loss_scale.initial", std::to_string(loss_scale.initial),
                   "must be a power of two in [1, 2^24] (so that scaling and unscaling are exact), e.g. 65536");
        positive("loss_scale.growth_interval", loss_scale.growth_interval);
    }
}

void vision_config::validate() const {
    auto check = [](const char* f, int v) {
        if (v <= 0) throw std::invalid_argument(std::string("vision config: ") + f + " = " + std::to_string(v) + ": must be positive");
    };
    check("patch_dim", patch_dim);
    check("hidden", hidden);
    check("heads", heads);
    check("ffn_hidden", ffn_hidden);
    check("layers", layers);
    check("max_patches", max_patches);
    check("batch", batch);
    check("padded_len", padded_len);
    if (hidden % heads != 0)
        throw std::invalid_argument("vision config: hidden = " + std::to_string(hidden) + ": must be a multiple of heads");
    if (hidden / heads > max_head_dim)
        throw std::invalid_argument("vision config: heads = " + std::to_string(heads) + " gives heads of " + std::to_string(hidden / heads) +
                                    " (hidden / heads) but attention takes at most " + std::to_string(max_head_dim) + "; use more heads");
    if (padded_len > max_patches)
        throw std::invalid_argument("vision config: padded_len = " + std::to_string(padded_len) +
                                    ": exceeds max_patches = " + std::to_string(max_patches) +
                                    " (the position table); raise max_patches or pad to a smaller length");
}

} // namespace gpt
