#pragma once
//! @file
//! A device tensor a stage reads or writes, by address: graphs replay on these fixed buffers,
//! and activation offloading (a later layer) moves them.

#include <cstddef>
#include <string>

namespace capscope {

struct tensor_ref {
    std::string name;
    void* data = nullptr;
    std::size_t bytes = 0;

    //! Same memory (names are for people).
    friend bool operator==(const tensor_ref& a, const tensor_ref& b) { return a.data == b.data && a.bytes == b.bytes; }
};

} // namespace capscope
