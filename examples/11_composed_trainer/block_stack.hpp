#pragma once
// Tutorial 11's model, a trainer's own: a stack of residual blocks y = x + relu(x W1) W2, as in
// tutorial 10, with what a real trainer adds around its layers:
// - master weights that SGD updates, and a working copy each block reads, which a hook gathers
//   before the block's forward (one GPU's stand-in for a sharded trainer's all-gather);
// - the two activations each block keeps for its backward, named by the trainer ("pre_act", the
//   ReLU's input, and "hidden", its output), in memory an activation store lays out, so a
//   policy can move them to pinned host memory between forward and backward.
// Everything it shares with other streams, each stage declares; capscope derives the waits.

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/offload/activation_store.hpp>
#include <capscope/stage/program.hpp>
#include <capscope/stage/schema.hpp>

#include <cstdint>
#include <vector>

namespace composed {

// [snippet schema]
// The block's parts and what they keep, as a layer schema: "up" keeps pre_act and writes hidden,
// which "down" keeps. The runner checks every config's plan against it at compile time (an
// offloaded tensor whose writer and keeper a graph boundary separates is rule P11).
using up_part = capscope::stage_decl<capscope::kind<"up">, capscope::regions<capscope::region<"up">>, capscope::saves_named<"pre_act">,
                                     capscope::makes_named<"hidden">>;
using down_part = capscope::stage_decl<capscope::kind<"down">, capscope::regions<capscope::region<"down">>, capscope::saves_named<"hidden">>;
using block = capscope::layer_schema<"offloaded_block", up_part, down_part>;
// [snippet schema]

struct shape {
    int rows = 512, features = 256, hidden = 1024, blocks = 6;
    float lr = 0.5f;
    float clip = 0.002f; //!< each gradient element is clamped to [-clip, clip] after its block's backward
    std::uint64_t seed = 11;
};

class block_stack {
public:
    //! The activations live where `policy` puts them (off: memory of their own).
    block_stack(const shape& sh, const capscope::offload_settings& policy, cudaStream_t s);
    block_stack(const block_stack&) = delete;
    block_stack& operator=(const block_stack&) = delete;

    //! The step as stages: zero the gradients; per block "up" then "down"; the loss; SGD on the
    //! master weights. No hook, no copy: the composition adds those.
    capscope::training_program training_program();
    //! Per block, what its stages read (the working weights) and its backward writes (the gradients).
    std::vector<capscope::layer_buffers> layer_buffers() const;
    const capscope::activation_store& store() const { return store_; }

    //! The same step by hand, on one stream, with the gather and the clamp where the hooks run them.
    void step_by_hand(cudaStream_t s);

    // What the hooks call.
    void gather(int l, cudaStream_t s);         //!< working weights of block l <- its master weights
    void clip_gradients(int l, cudaStream_t s); //!< block l's gradients clamped to [-clip, clip]

    //! Block l's kept activations, where the store put them (bench/composed_overhead copies them by hand).
    float* pre_act(int l) const { return pre(l); }
    float* hidden_act(int l) const { return h(l); }
    std::size_t activation_bytes() const { return row_bytes(sh_.hidden); }

    float loss(cudaStream_t s) const;                  //!< synchronizes `s`
    std::vector<float> weights(cudaStream_t s) const;  //!< the master weights; synchronizes `s`
    const shape& dims() const { return sh_; }

    // The stage functions.
    void zero_grads(cudaStream_t s);
    void loss_forward(cudaStream_t s);
    void sgd(cudaStream_t s);
    struct block_fns {
        block_stack* m;
        int l;
        void up_forward(cudaStream_t s);
        void up_backward(cudaStream_t s);
        void down_forward(cudaStream_t s);
        void down_backward(cudaStream_t s);
    };

private:
    std::size_t per_block() const { return 2 * std::size_t(sh_.features) * sh_.hidden; }
    std::size_t row_bytes(int width) const { return std::size_t(sh_.rows) * std::size_t(width) * sizeof(float); }
    float* w1(int l) const { return params_.data() + std::size_t(l) * per_block(); }
    float* w2(int l) const { return w1(l) + std::size_t(sh_.features) * sh_.hidden; }
    float* g1(int l) const { return grads_.data() + std::size_t(l) * per_block(); }
    float* g2(int l) const { return g1(l) + std::size_t(sh_.features) * sh_.hidden; }
    float* x(int l) const { return xs_.data() + std::size_t(l) * sh_.rows * sh_.features; }
    float* dx(int l) const { return dxs_.data() + std::size_t(l) * sh_.rows * sh_.features; }
    float* pre(int l) const { return store_.data_as<float>(pre_ids_[std::size_t(l)]); }
    float* h(int l) const { return store_.data_as<float>(hidden_ids_[std::size_t(l)]); }
    capscope::tensor_ref ref(const char* what, int l, float* p, std::size_t bytes) const;

    shape sh_;
    capscope::cuda::blas_handle blas_;
    capscope::cuda::device_buffer<float> master_, params_, grads_, xs_, dxs_, dh_, dpre_, target_, loss_, lr_;
    capscope::activation_store store_;
    std::vector<capscope::activation_store::id> pre_ids_, hidden_ids_;
    std::vector<block_fns> fns_;
};

} // namespace composed
