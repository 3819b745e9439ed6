#pragma once
//! @file
//! Shape and behaviour of the example model. Checked once, at set-up: a bad value throws
//! `std::invalid_argument` naming the field and what it must be.

#include <cstdint>
#include <string>

namespace gpt {

enum class precision { fp32, bf16, fp16 };

//! The widest attention head (hidden / heads) the fused attention kernels take.
constexpr int max_head_dim = 128;

//! How the MoE layer sizes its expert batches.
enum class moe_mode {
    drop_and_pad, //!< fixed capacity per expert, overflow dropped: fixed shapes, no host sync, capturable
    dropless,     //!< every token kept: per-expert counts are read back by the host to size the GEMMs
};

//! Dynamic loss scaling, which fp16 needs: activation gradients below fp16's smallest subnormal
//! (about 6e-8) would vanish, so the loss's gradient is multiplied by a scale first. The scale
//! lives in device memory, so a captured step follows it.
struct loss_scaling {
    bool dynamic = false;
    float initial = 65536.f;    //!< a power of two in [1, 2^24], so scaling and unscaling are exact
    int growth_interval = 2000; //!< finite steps in a row after which the scale doubles
};

//! Layer kinds in `layer_pattern`: 'D' dense transformer, 'E' MoE transformer, 'M' Mamba-style.
struct model_config {
    int vocab = 32;
    int hidden = 64;
    int heads = 4;
    int ffn_hidden = 256;
    int seq_len = 16;
    int batch = 4;      //!< sequences per microbatch
    int microbatches = 1; //!< per training step; gradients accumulate over them
    std::string layer_pattern = "DEM";
    int experts = 4;
    int top_k = 2;
    double capacity_factor = 1.25;
    gpt::moe_mode moe_mode = gpt::moe_mode::drop_and_pad;
    //! Dropless MoE captured (capscope's static_expert_capacity): > 0 gives each expert a static
    //! capacity of ceil(factor * tokens * top_k / experts) rows in training, which graphs are
    //! captured for. A step in which an expert gets more tokens sets a device flag: its optimizer
    //! is skipped on the device and the runner reruns the step eagerly, dropless, with the counts
    //! read back (`training_program().rerun`), so only a runner drives such a model
    //! (gpt_model::forward refuses). 0: every step reads the counts back (not capturable).
    //! Inference reads them back either way.
    double dropless_capacity_factor = 0;
    int mamba_inner = 0; //!< 0: same as hidden
    std::uint64_t seed = 1234;
    float init_stddev = 0.02f; //!< weights ~ N(0, init_stddev); norm gains start at 1
    //! Dropout on each dense MLP's output before the residual add, in training (0: none). Its
    //! random numbers come from a counter-based generator whose seed and offset live in device
    //! memory, so a captured step draws new masks on every replay.
    float hidden_dropout = 0.f;
    //! Check loss and gradients for inf and NaN on the device before each optimizer step, and
    //! skip the step when one is found (capscope's nan_check_on_device): `training_program()` then
    //! has a `check_finite` stage that writes the flag `all_finite`, and the optimizer is guarded by
    //! it (capscope::run_if), a conditional node when captured.
    bool check_finite_on_device = false;
    //! With `loss_scale.dynamic` (needs check_finite_on_device): the head multiplies the loss's
    //! gradient by the scale, AdamW divides the gradients by it, and a stage after the optimizer
    //! halves it when the step was not finite (that step was skipped) or doubles it after
    //! growth_interval finite steps. The reported loss is never scaled.
    loss_scaling loss_scale;

    int tokens() const { return seq_len * batch; }
    int head_dim() const { return hidden / heads; }
    int inner() const { return mamba_inner ? mamba_inner : hidden; }
    //! Slots per expert under drop-and-pad: ceil(capacity_factor * tokens * top_k / experts).
    int expert_capacity() const;
    //! The static dropless capacity per expert (dropless_capacity_factor > 0): ceil(dropless_capacity_factor * tokens * top_k / experts).
    int dropless_capacity() const;
    //! Throws std::invalid_argument on the first field that cannot work.
    void validate() const;
};

//! The dropout generator's state, in device memory: masks come from hash(seed, offset, element),
//! and every dropout call advances the offset by one with a kernel, so graphs advance it too.
struct rng_state {
    std::uint64_t seed = 0;
    std::uint64_t offset = 0;
};

//! Dynamic loss scaling's state, in device memory: the scale, its inverse (exact: a power of two),
//! which AdamW multiplies the gradients by, and the finite steps since it last changed. It stays
//! within [smallest, largest].
struct loss_scale_state {
    float scale = 1.f, inverse = 1.f;
    int clean_steps = 0;
    static constexpr float smallest = 1.f, largest = 16777216.f; // 2^24: far past fp16's range (65504)
};

//! A bidirectional encoder over a variable number of patches per sample, padded to `max_patches`.
struct vision_config {
    int patch_dim = 24;
    int hidden = 64;
    int heads = 4;
    int ffn_hidden = 256;
    int layers = 2;
    int max_patches = 32; //!< size of the position table: the largest padded length
    int batch = 4;
    int padded_len = 32; //!< the longest padded length this encoder's buffers hold (the largest length bucket)
    std::uint64_t seed = 99;
    float init_stddev = 0.02f;
    bool training = true; //!< false: forward only, no gradient buffers

    int tokens() const { return batch * padded_len; }
    void validate() const;
};

} // namespace gpt
