#pragma once
//! @file
//! A guard: stages that run only when a condition kept on the device holds (`run_if`), or again
//! and again while it holds (`run_while`). The condition is a 32-bit `int` in device memory that
//! a kernel writes (nonzero: holds), so no host read is needed to decide. Captured, consecutive
//! stages with the same guard become one conditional graph node (IF or WHILE, captured with CUDA 13:
//! capscope/cuda/conditional.hpp); run eagerly, the runner reads the flag on the host and takes
//! the same decision, so eager runs and replays agree bit for bit.
//!
//! The plan checks (capscope/plan/guards.hpp): a guarded stage is capturable (P14); some earlier
//! call of the step writes the flag, and a WHILE body writes it too (P15); and a run of guarded
//! stages is not split between two segments (P16).

#include <capscope/stage/tensor_ref.hpp>

#include <cstdint>
#include <utility>

namespace capscope {

enum class guard_kind : std::uint8_t {
    none,        //!< unguarded: always runs
    if_holds,    //!< runs once when the flag holds (a step skipped on overflow)
    while_holds, //!< runs again and again while the flag holds (a loop; the stages must clear it)
};

struct stage_guard {
    guard_kind kind = guard_kind::none;
    //! The flag: an `int` in device memory (`bytes` = 4) that a kernel writes; its name shows in
    //! the plan text.
    tensor_ref predicate;

    explicit operator bool() const noexcept { return kind != guard_kind::none; }
    const int* flag() const noexcept { return static_cast<const int*>(predicate.data); }
    friend bool operator==(const stage_guard& a, const stage_guard& b) { return a.kind == b.kind && a.predicate == b.predicate; }
};

//! The stage runs only when `*predicate.data` (an int) is nonzero.
inline stage_guard run_if(tensor_ref predicate) { return {guard_kind::if_holds, std::move(predicate)}; }
//! The stages run while `*predicate.data` is nonzero; they write it themselves.
inline stage_guard run_while(tensor_ref predicate) { return {guard_kind::while_holds, std::move(predicate)}; }

inline const char* guard_word(guard_kind k) noexcept {
    switch (k) {
    case guard_kind::if_holds: return "IF";
    case guard_kind::while_holds: return "WHILE";
    case guard_kind::none: break;
    }
    return "";
}

} // namespace capscope
