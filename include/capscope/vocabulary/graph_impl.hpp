#pragma once
//! @file
//! Which machinery captures CUDA graphs (Megatron's `cuda_graph_impl`).
//!
//! | C++ (`graph_impl::…`)        | Megatron `--cuda-graph-impl` | what it means                                      |
//! |------------------------------|------------------------------|----------------------------------------------------|
//! | `eager`                      | `none`                       | no CUDA graphs                                     |
//! | `lazy_per_layer`             | `local`                      | per-layer graphs captured lazily by a manager      |
//! | `ahead_of_time_per_layer`    | `transformer_engine`         | all layers' fwd/bwd graphs captured up front        |
//! | `whole_iteration`            | `full_iteration`             | forward+backward of one iteration as one graph     |

#include <capscope/detail/enum_names.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

enum class graph_impl : std::uint8_t { eager, lazy_per_layer, ahead_of_time_per_layer, whole_iteration };

template <>
struct enum_names<graph_impl> {
    static constexpr std::string_view megatron[] = {"none", "local", "transformer_engine", "full_iteration"};
    static constexpr std::string_view cpp[] = {"eager", "lazy_per_layer", "ahead_of_time_per_layer",
                                               "whole_iteration"};
};

//! Per-layer implementations are the ones that read `cuda_graph_modules`.
constexpr bool is_per_layer(graph_impl i) {
    return i == graph_impl::lazy_per_layer || i == graph_impl::ahead_of_time_per_layer;
}

} // namespace capscope
