#pragma once
//! @file
//! Where a send reads, or a receive writes, and how many bytes: what a stage hands the issuer
//! (parallel/pipeline_p2p.hpp) for each of its sends and receives. Host-only, so that a model's
//! stage can name its buffers without NCCL.

#include <cstddef>

namespace capscope {

struct p2p_buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
};

} // namespace capscope
