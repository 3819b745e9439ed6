#pragma once
//! @file
//! Training-loop facts some capture rules read: the transformer implementation, fp8 and
//! Megatron-FSDP.

#include <capscope/detail/enum_names.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

//! `--transformer-impl`.
enum class transformer_impl : std::uint8_t { local, transformer_engine, inference_optimized };

template <>
struct enum_names<transformer_impl> {
    static constexpr std::string_view megatron[] = {"local", "transformer_engine", "inference_optimized"};
    static constexpr std::string_view cpp[] = {"local", "transformer_engine", "inference_optimized"};
};

//! `--fp8-format`: fp8 training is on when set.
enum class fp8_format : std::uint8_t { e4m3, hybrid };

template <>
struct enum_names<fp8_format> {
    static constexpr std::string_view megatron[] = {"e4m3", "hybrid"};
    static constexpr std::string_view cpp[] = {"e4m3", "hybrid"};
};

//! `--fp8-recipe` (Megatron's default is `delayed`).
enum class fp8_recipe : std::uint8_t { tensorwise, delayed, mxfp8, blockwise, custom };

template <>
struct enum_names<fp8_recipe> {
    static constexpr std::string_view megatron[] = {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"};
    static constexpr std::string_view cpp[] = {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"};
};

//! Megatron-FSDP (`--use-megatron-fsdp`; v2 with `--megatron-fsdp-version 2`).
enum class fsdp_mode : std::uint8_t { off, v1, v2 };

template <>
struct enum_names<fsdp_mode> {
    static constexpr std::string_view megatron[] = {"off", "v1", "v2"};
    static constexpr std::string_view cpp[] = {"off", "v1", "v2"};
};

struct fsdp_settings {
    fsdp_mode mode = fsdp_mode::off;
    bool double_buffer = false;                        // --fsdp-double-buffer
    bool persistent_buffer_on_alloc_fail = false;      // --fsdp-db-use-persist-buf-on-alloc-fail
    bool nccl_user_buffers = false;                    // --use-nccl-ub (implies double buffer with FSDP)
    bool max_pool_double_buffer = false;               // --megatron-fsdp-max-pool-double-buffer (implies it too)

    friend constexpr bool operator==(const fsdp_settings&, const fsdp_settings&) = default;
};

} // namespace capscope
