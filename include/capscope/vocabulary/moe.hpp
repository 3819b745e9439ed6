#pragma once
//! @file
//! Mixture-of-experts facts the capture rules read.

#include <capscope/detail/enum_names.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

//! `--moe-token-dispatcher-type`.
enum class token_dispatcher : std::uint8_t { allgather, alltoall, flex };

template <>
struct enum_names<token_dispatcher> {
    static constexpr std::string_view megatron[] = {"allgather", "alltoall", "flex"};
    static constexpr std::string_view cpp[] = {"allgather", "alltoall", "flex"};
};

//! Which layers are MoE layers (`--moe-layer-freq`): every N-th layer, or an explicit 0/1
//! pattern (1 = MoE layer), up to 256 layers.
class moe_layer_layout {
public:
    static constexpr int max_pattern_layers = 256;

    constexpr moe_layer_layout() = default;
    static constexpr moe_layer_layout every(int n) {
        moe_layer_layout l;
        l.frequency_ = n;
        return l;
    }
    constexpr void append(bool moe_layer) {
        if (length_ < max_pattern_layers) {
            if (moe_layer) bits_[length_ / 64] |= std::uint64_t{1} << (length_ % 64);
            ++length_;
        }
        frequency_ = 0;
    }

    constexpr bool is_pattern() const { return frequency_ == 0; }
    constexpr int frequency() const { return frequency_; }
    constexpr int pattern_length() const { return length_; }
    constexpr bool pattern_moe(int i) const { return (bits_[i / 64] >> (i % 64)) & 1; }

    //! Whether some layer is dense. With a frequency N > 1 the layers between MoE layers are
    //! dense (Megatron places MoE layers at indices divisible by N), so one exists when the
    //! model has at least two layers; `num_layers` < 0 means "unknown", treated as "many".
    constexpr bool has_dense_layer(int num_layers) const {
        if (!is_pattern()) return frequency_ > 1 && (num_layers < 0 || num_layers > 1);
        for (int i = 0; i < length_; ++i)
            if (!pattern_moe(i)) return true;
        return false;
    }
    constexpr bool has_moe_layer() const {
        if (!is_pattern()) return frequency_ >= 1;
        for (int i = 0; i < length_; ++i)
            if (pattern_moe(i)) return true;
        return false;
    }

    friend constexpr bool operator==(const moe_layer_layout&, const moe_layer_layout&) = default;

private:
    int frequency_ = 1;
    int length_ = 0;
    std::uint64_t bits_[max_pattern_layers / 64]{};
};

} // namespace capscope
