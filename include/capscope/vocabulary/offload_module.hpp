#pragma once
//! @file
//! The names of the tensors activation offloading can move, open to any trainer. A name is the
//! module input a tensor is: Megatron's nine (`offload_module`, its `offload_modules` names) are
//! one predefined set, and a trainer names its own (`offload_tensors<"mixer_in">` in a config,
//! `"mixer_in"` in a saved tensor), as it names its capture regions. Megatron's offload rules
//! (O*, OC*, OB*) are about Megatron's names and pass over a trainer's own; plan rule P11 and
//! the offload plan treat every name alike.
//!
//! `offload_name_set` is a literal type, as `region_set` is: names are views, so use string
//! literals or strings that outlive the set.

#include <capscope/detail/enum_names.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string_view>

namespace capscope {

enum class offload_module : std::uint8_t {
    attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act, fused_group_mlp, gdp_qkv
};

template <>
struct enum_names<offload_module> {
    static constexpr std::string_view megatron[] = {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                                                    "expert_fc1", "moe_act", "fused_group_mlp", "gdp_qkv"};
    static constexpr std::string_view cpp[] = {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                                               "expert_fc1", "moe_act", "fused_group_mlp", "gdp_qkv"};
};

//! One offloadable tensor's name: Megatron's (`offload_module::core_attn` converts) or a
//! trainer's own. Empty: not named, which a saved tensor must be before it can be offloaded.
class offload_name {
public:
    constexpr offload_name() = default;
    constexpr offload_name(offload_module m) : name_(megatron_name(m)) {} // NOLINT: implicit, the predefined names
    constexpr offload_name(std::string_view name) : name_(name) {}        // NOLINT: implicit, a trainer's own
    constexpr offload_name(const char* name) : name_(name) {}             // NOLINT: a literal

    constexpr std::string_view view() const noexcept { return name_; }
    constexpr bool empty() const noexcept { return name_.empty(); }
    //! Megatron's module of that name; none for a trainer's own.
    constexpr std::optional<offload_module> megatron() const { return parse_megatron_name<offload_module>(name_); }

    friend constexpr bool operator==(const offload_name& a, const offload_name& b) { return a.name_ == b.name_; }

private:
    std::string_view name_;
};

//! `offload_name` is a name since capscope 0.2, no longer an enum with Megatron spellings: say so,
//! instead of an incomplete `enum_names<offload_name>`.
template <class T>
    requires std::same_as<T, offload_name>
constexpr std::string_view megatron_name(T) {
    static_assert(sizeof(T) == 0, "capscope: megatron_name(offload_name): an offload_name is a name since capscope 0.2 (Megatron's or a "
                                  "trainer's own), not an enum -- fix: use name.view(), or name.megatron() for Megatron's module");
    return {};
}

class offload_name_set {
public:
    static constexpr std::size_t capacity = 16;

    constexpr offload_name_set() = default;
    constexpr offload_name_set(std::initializer_list<offload_module> modules) { // NOLINT: {offload_module::x, ...}
        for (offload_module m : modules) insert(m);
    }
    constexpr offload_name_set(std::initializer_list<std::string_view> names) {
        for (std::string_view n : names) insert(n);
    }

    constexpr void insert(offload_name n) {
        if (n.empty() || contains(n)) return;
        if (size_ == capacity) throw std::length_error("capscope::offload_name_set: more than 16 offload names");
        names_[size_++] = n;
    }
    constexpr void erase(offload_name n) {
        for (std::size_t i = 0; i < size_; ++i)
            if (names_[i] == n) {
                for (std::size_t j = i + 1; j < size_; ++j) names_[j - 1] = names_[j];
                names_[--size_] = {};
                return;
            }
    }
    constexpr void insert_all(const offload_name_set& o) {
        for (std::size_t i = 0; i < o.size_; ++i) insert(o.names_[i]);
    }
    constexpr bool contains(offload_name n) const {
        for (std::size_t i = 0; i < size_; ++i)
            if (names_[i] == n) return true;
        return false;
    }
    constexpr bool empty() const { return size_ == 0; }
    constexpr int size() const { return int(size_); }
    constexpr bool intersects(const offload_name_set& o) const {
        for (std::size_t i = 0; i < size_; ++i)
            if (o.contains(names_[i])) return true;
        return false;
    }
    constexpr bool subset_of(const offload_name_set& o) const {
        for (std::size_t i = 0; i < size_; ++i)
            if (!o.contains(names_[i])) return false;
        return true;
    }
    //! Megatron's names in this set, in Megatron's order: what Megatron's rules look at.
    constexpr offload_name_set megatron() const {
        offload_name_set r;
        for (std::string_view n : enum_names<offload_module>::megatron)
            if (contains(n)) r.insert(n);
        return r;
    }
    //! Calls f(name) for each: Megatron's names in Megatron's order, then a trainer's own in the
    //! order they were added (printed sets stay stable).
    template <class F>
    constexpr void for_each(F&& f) const {
        for (std::string_view n : enum_names<offload_module>::megatron)
            if (contains(n)) f(offload_name(n));
        for (std::size_t i = 0; i < size_; ++i)
            if (!names_[i].megatron()) f(names_[i]);
    }

    friend constexpr bool operator==(const offload_name_set& a, const offload_name_set& b) {
        return a.size_ == b.size_ && a.subset_of(b);
    }

private:
    std::array<offload_name, capacity> names_{};
    std::size_t size_ = 0;
};

//! The name under which older code knew the set (it held Megatron's names only).
using offload_module_set = offload_name_set;

//! The MoE expert inputs whose shapes are unknown in advance (they bypass the pinned pool).
inline constexpr offload_name_set moe_expert_offloads{offload_module::expert_fc1, offload_module::moe_act,
                                                      offload_module::fused_group_mlp};

} // namespace capscope
