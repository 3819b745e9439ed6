#pragma once
//! @file
//! A constexpr set over a small enum, used for capture modules, offload modules and
//! recompute modules. Iteration follows the enum's declaration order, so printed sets are
//! stable and match Megatron's listing order.

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace capscope::detail {

template <class Enum>
class enum_set {
    static_assert(std::is_enum_v<Enum>, "enum_set<E> requires an enum type");
    std::uint32_t bits_ = 0;

    static constexpr std::uint32_t bit(Enum e) { return std::uint32_t{1} << static_cast<unsigned>(e); }

public:
    constexpr enum_set() = default;
    constexpr enum_set(std::initializer_list<Enum> items) {
        for (Enum e : items) insert(e);
    }

    constexpr bool contains(Enum e) const { return (bits_ & bit(e)) != 0; }
    constexpr bool empty() const { return bits_ == 0; }
    constexpr int size() const {
        int n = 0;
        for (std::uint32_t b = bits_; b != 0; b &= b - 1) ++n;
        return n;
    }
    constexpr void insert(Enum e) { bits_ |= bit(e); }
    constexpr void erase(Enum e) { bits_ &= ~bit(e); }
    constexpr void insert_all(enum_set other) { bits_ |= other.bits_; }

    //! True when every element of this set is also in `other`.
    constexpr bool subset_of(enum_set other) const { return (bits_ & ~other.bits_) == 0; }
    constexpr bool intersects(enum_set other) const { return (bits_ & other.bits_) != 0; }
    constexpr enum_set without(enum_set other) const {
        enum_set r;
        r.bits_ = bits_ & ~other.bits_;
        return r;
    }

    //! Calls f(e) for each element in declaration order.
    template <class F>
    constexpr void for_each(F&& f) const {
        for (unsigned i = 0; i < 32; ++i)
            if (bits_ & (std::uint32_t{1} << i)) f(static_cast<Enum>(i));
    }

    friend constexpr bool operator==(enum_set, enum_set) = default;
};

} // namespace capscope::detail
