#pragma once
//! @file
//! Memory that a block's backward needs only while it runs: the gradients of the block's
//! intermediates (attention's d_probs alone is [batch * heads, seq, seq]). The model runs one
//! block's backward at a time (its stages follow each other on the compute stream, captured or
//! not), so every block's scratch starts at the same address: the model holds the largest
//! block's, not one per block. The gradient of a block's input (`dx`) is read by the block before
//! it, so it is not scratch.

#include <capscope/cuda/buffer.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>

namespace gpt {

class backward_scratch {
public:
    //! Part of a block's scratch: an offset until the buffer is allocated, an address after.
    template <class T>
    struct slice {
        std::size_t offset = 0, elems = 0;
        T* ptr = nullptr;
        T* data() const { return ptr; }
    };

    //! One block's slices, laid out one after the other from the shared start.
    class layout {
    public:
        explicit layout(backward_scratch* owner = nullptr) : owner_(owner) {}
        //! A slice of `elems` elements (none: a null slice, as a forward-only block asks).
        template <class T> slice<T> take(std::size_t elems) {
            if (elems == 0) return {};
            if (!owner_) throw std::logic_error("backward_scratch: a training block needs the model's scratch (block_shape::scratch)");
            if (owner_->allocated_) throw std::logic_error("backward_scratch: a slice was taken after the scratch was allocated");
            const std::size_t offset = (end_ + alignment - 1) / alignment * alignment;
            end_ = offset + elems * sizeof(T);
            owner_->bytes_ = std::max(owner_->bytes_, end_);
            return {offset, elems, nullptr};
        }
        //! The slice's address, once the scratch is allocated.
        template <class T> void resolve(slice<T>& s) const {
            if (s.elems == 0) return;
            if (!owner_->allocated_) throw std::logic_error("backward_scratch: resolved before the scratch was allocated");
            s.ptr = reinterpret_cast<T*>(owner_->buffer_.data() + s.offset);
        }

    private:
        backward_scratch* owner_;
        std::size_t end_ = 0;
    };

    //! Allocates the largest block's scratch; every layout's slices resolve into it.
    void allocate() {
        buffer_ = capscope::cuda::device_buffer<std::byte>(bytes_);
        allocated_ = true;
    }
    //! Bytes held (the largest block's scratch).
    std::size_t bytes() const { return bytes_; }

private:
    static constexpr std::size_t alignment = 256; // cuBLAS and vectorized kernels want aligned rows
    std::size_t bytes_ = 0;
    bool allocated_ = false;
    capscope::cuda::device_buffer<std::byte> buffer_;
};

} // namespace gpt
