#pragma once
//! @file
//! The name of the scope (stage, segment) being captured or run on this thread. Errors raised
//! inside it carry it (`cuda::error::scope()`), so a failure says which stage it came from.
//! Host-only: a thread-local string view, set and restored without allocation.

#include <string_view>

namespace capscope {

namespace detail {
inline thread_local std::string_view current_scope{};
} // namespace detail

//! Names the scope being captured or run on this thread for the errors raised inside it.
//! Nests: the previous label is restored on exit. The label must outlive the guard.
class scope_label {
public:
    explicit scope_label(std::string_view label) noexcept : previous_(detail::current_scope) {
        detail::current_scope = label;
    }
    ~scope_label() { detail::current_scope = previous_; }
    scope_label(const scope_label&) = delete;
    scope_label& operator=(const scope_label&) = delete;

    static std::string_view current() noexcept { return detail::current_scope; }

private:
    std::string_view previous_;
};

} // namespace capscope
