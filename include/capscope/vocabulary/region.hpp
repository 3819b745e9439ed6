#pragma once
//! @file
//! Capture regions, open to any trainer. A region is a name: Megatron's six modules are one
//! predefined set of names ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"), and
//! a trainer names its own (`region<"mixer">`, or "mixer" in a stage's `captured_by`). A
//! configuration captures the regions it names (`modules<...>` and `capture_regions<...>`), or
//! whole layers when it names none.
//!
//! `region_set` is a literal type (a fixed-capacity set of names, kept in the order they were
//! added, compared as a set), so compile-time plans use it as run-time plans do. The names are
//! views: use string literals, or strings that outlive the set.

#include <capscope/detail/short_text.hpp>
#include <capscope/vocabulary/capture_module.hpp>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string_view>

namespace capscope {

//! A capture region of a trainer's own, named by a literal: `regions<region<"mixer">>` in a layer
//! schema, `capture_regions<"mixer">` in a config.
template <detail::fixed_string Name>
struct region {
    static constexpr std::string_view name = Name.view();
};

class region_set {
public:
    static constexpr std::size_t capacity = 16;

    constexpr region_set() = default;
    //! Megatron's modules, by their Megatron names, in Megatron's order.
    constexpr region_set(capture_module_set modules) { // NOLINT: implicit, the predefined mapping
        modules.for_each([&](capture_module m) { insert(megatron_name(m)); });
    }
    constexpr region_set(std::initializer_list<capture_module> modules) : region_set(capture_module_set(modules)) {}
    constexpr region_set(std::initializer_list<std::string_view> names) {
        for (std::string_view n : names) insert(n);
    }

    constexpr void insert(std::string_view name) {
        if (contains(name)) return;
        if (size_ == capacity) throw std::length_error("capscope::region_set: more than 16 regions");
        names_[size_++] = name;
    }
    constexpr void insert_all(const region_set& o) {
        for (std::size_t i = 0; i < o.size_; ++i) insert(o.names_[i]);
    }
    constexpr bool contains(std::string_view name) const {
        for (std::size_t i = 0; i < size_; ++i)
            if (names_[i] == name) return true;
        return false;
    }
    constexpr bool empty() const { return size_ == 0; }
    constexpr std::size_t size() const { return size_; }
    constexpr bool intersects(const region_set& o) const {
        for (std::size_t i = 0; i < size_; ++i)
            if (o.contains(names_[i])) return true;
        return false;
    }
    //! The names of this set that are also in `o`, in this set's order.
    constexpr region_set common(const region_set& o) const {
        region_set r;
        for (std::size_t i = 0; i < size_; ++i)
            if (o.contains(names_[i])) r.insert(names_[i]);
        return r;
    }
    template <class F>
    constexpr void for_each(F&& f) const {
        for (std::size_t i = 0; i < size_; ++i) f(names_[i]);
    }

    friend constexpr bool operator==(const region_set& a, const region_set& b) {
        if (a.size_ != b.size_) return false;
        for (std::size_t i = 0; i < a.size_; ++i)
            if (!b.contains(a.names_[i])) return false;
        return true;
    }

private:
    std::array<std::string_view, capacity> names_{};
    std::size_t size_ = 0;
};

} // namespace capscope
