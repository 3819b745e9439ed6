#pragma once
//! @file
//! Flags Megatron-LM removed (its parser rejects them as unknown), with what replaces them, so
//! the error says what to write instead.

#include <string_view>

namespace capscope::flags {

struct removed_flag {
    std::string_view name;
    std::string_view replacement;
    std::string_view why = "removed from Megatron-LM";
};
inline constexpr removed_flag megatron_removed_flags[] = {
    {"--inference-use-full-iteration-cuda-graph", "--cuda-graph-impl local --inference-cuda-graph-scope block"},
    {"--cuda-graph-use-single-mempool", "nothing: it is a TransformerConfig field with no command-line flag"},
    {"--cuda-graph-retain-backward-graph", "nothing: it is a TransformerConfig field with no command-line flag"},
    // Spellings an earlier capscope accepted that Megatron's parser never had.
    {"--use-fully-shard-api", "--megatron-fsdp-version 2 (Megatron-FSDP v2, with --use-megatron-fsdp)", "never a Megatron-LM flag"},
    {"--nccl-ub", "--use-nccl-ub", "never a Megatron-LM flag"},
};

} // namespace capscope::flags
