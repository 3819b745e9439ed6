#pragma once
//! @file
//! A tensor a stage keeps from its forward for its backward, named by the module input it is
//! (Megatron's `offload_modules` names, or a trainer's own: capscope/vocabulary/offload_module.hpp):
//! what activation offloading may move to pinned host memory between the two, and bring back
//! before the backward reads it (capscope/offload/with_offload.hpp).

#include <capscope/stage/tensor_ref.hpp>
#include <capscope/vocabulary/offload_module.hpp>

#include <cstddef>

namespace capscope {

struct saved_tensor {
    offload_name module; //!< what it is; empty: not named (offloading refuses it)
    tensor_ref tensor;
    //! Bytes per element: `min_offloaded_tensor_size` counts elements, as Megatron does.
    std::size_t element_bytes = 1;

    std::size_t elements() const { return element_bytes ? tensor.bytes / element_bytes : 0; }
    friend bool operator==(const saved_tensor&, const saved_tensor&) = default;
};

} // namespace capscope
