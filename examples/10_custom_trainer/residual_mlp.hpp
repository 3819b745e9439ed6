#pragma once
// A trainer's own model, not shaped like Megatron: a stack of residual MLP blocks,
// y = x + relu(x W1) W2, trained by SGD to map random inputs to a fixed random target. Each block
// is two parts with names of the trainer's own, "up" (h = relu(x W1)) and "down" (y = x + h W2),
// which a configuration captures independently. fp32, its own cuBLAS calls and kernels.

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/stage/program.hpp>
#include <capscope/stage/schema.hpp>

#include <cstdint>
#include <vector>

namespace custom {

// [snippet schema]
// The block's two parts as a layer schema: the runner checks the plan of each config against it
// at compile time, and the program against it at construction.
using up_part = capscope::stage_decl<capscope::kind<"up">, capscope::regions<capscope::region<"up">>>;
using down_part = capscope::stage_decl<capscope::kind<"down">, capscope::regions<capscope::region<"down">>>;
using residual_block = capscope::layer_schema<"residual_mlp", up_part, down_part>;
// [snippet schema]

struct shape {
    int rows = 512, features = 256, hidden = 1024, blocks = 4;
    float lr = 1.0f;
    std::uint64_t seed = 7;
};

class residual_mlp {
public:
    residual_mlp(const shape& sh, cudaStream_t s);
    residual_mlp(const residual_mlp&) = delete;
    residual_mlp& operator=(const residual_mlp&) = delete;

    //! The training step as stages: zero the gradients; per block "up" then "down"; the loss; SGD.
    capscope::training_program training_program();
    //! The same step by hand, eagerly: the reference a runner must match bit for bit.
    void step_by_hand(cudaStream_t s);

    float loss(cudaStream_t s) const; //!< synchronizes `s`
    std::vector<float> weights(cudaStream_t s) const; //!< every weight, synchronizes `s`
    const shape& dims() const { return sh_; }

    // The stage functions (bound into stream_fn by training_program()).
    void zero_grads(cudaStream_t s);
    void loss_forward(cudaStream_t s);
    void sgd(cudaStream_t s);
    struct block_fns {
        residual_mlp* m;
        int l;
        void up_forward(cudaStream_t s);
        void up_backward(cudaStream_t s);
        void down_forward(cudaStream_t s);
        void down_backward(cudaStream_t s);
    };

private:
    float* w1(int l) const { return params_.data() + std::size_t(l) * per_block(); }
    float* w2(int l) const { return w1(l) + std::size_t(sh_.features) * sh_.hidden; }
    float* g1(int l) const { return grads_.data() + std::size_t(l) * per_block(); }
    float* g2(int l) const { return g1(l) + std::size_t(sh_.features) * sh_.hidden; }
    std::size_t per_block() const { return 2 * std::size_t(sh_.features) * sh_.hidden; }
    float* x(int l) const { return xs_.data() + std::size_t(l) * sh_.rows * sh_.features; }  //!< input of block l (l = blocks: the output)
    float* dx(int l) const { return dxs_.data() + std::size_t(l) * sh_.rows * sh_.features; } //!< d loss / d x(l)
    float* pre(int l) const { return pres_.data() + std::size_t(l) * sh_.rows * sh_.hidden; }
    float* h(int l) const { return hs_.data() + std::size_t(l) * sh_.rows * sh_.hidden; }

    shape sh_;
    capscope::cuda::blas_handle blas_;
    capscope::cuda::device_buffer<float> params_, grads_, xs_, dxs_, pres_, hs_, dh_, dpre_, target_, loss_, lr_;
    std::vector<block_fns> fns_;
};

} // namespace custom
