#pragma once
// Stream memory operations for the GPU tests: the node type NCCL's copy-engine collectives capture
// to order the ranks' copies, issued here directly (cuStreamBatchMemOp, found through the runtime).

#include <capscope/cuda/driver_api.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_copy.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mem_ops {

using namespace capscope;

//! Stream memory operations (the node type NCCL's copy-engine collectives capture to order the
//! ranks' copies): a wait on the 32- or 64-bit value at `at` (`how`: CU_STREAM_WAIT_VALUE_*), a write.
inline CUstreamBatchMemOpParams wait_op(const void* at, bool wide, std::uint64_t value, unsigned how) {
    CUstreamBatchMemOpParams op{};
    op.waitValue.operation = wide ? CU_STREAM_MEM_OP_WAIT_VALUE_64 : CU_STREAM_MEM_OP_WAIT_VALUE_32;
    op.waitValue.address = reinterpret_cast<CUdeviceptr>(at);
    if (wide) op.waitValue.value64 = value;
    else op.waitValue.value = cuuint32_t(value);
    op.waitValue.flags = how;
    return op;
}
inline CUstreamBatchMemOpParams write_op(void* at, bool wide, std::uint64_t value, unsigned flags = CU_STREAM_WRITE_VALUE_DEFAULT) {
    CUstreamBatchMemOpParams op{};
    op.writeValue.operation = wide ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = reinterpret_cast<CUdeviceptr>(at);
    if (wide) op.writeValue.value64 = value;
    else op.writeValue.value = cuuint32_t(value);
    op.writeValue.flags = flags;
    return op;
}
//! The operations as one batch on `s` (one node when captured).
inline void issue_batch(std::vector<CUstreamBatchMemOpParams> ops, cudaStream_t s) {
    static const auto batch = cuda::detail::driver_entry<PFN_cuStreamBatchMemOp_v11070>("cuStreamBatchMemOp", 11070);
    CAPSCOPE_CHECK(batch(reinterpret_cast<CUstream>(s), unsigned(ops.size()), ops.data(), 0));
}

//! Writes `value` to `flag` and then waits for it there, as one batch.
inline void write_then_wait(unsigned* flag, unsigned value, cudaStream_t s) {
    issue_batch({write_op(flag, false, value), wait_op(flag, false, value, CU_STREAM_WAIT_VALUE_EQ)}, s);
}

//! How many nodes of type `t` `g` holds (the driver's type: the runtime has no name for a batch
//! of memory operations).
inline std::size_t nodes_of_type(const cuda::graph& g, cudaGraphNodeType t) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nodes.data(), &count));
    return std::size_t(std::count_if(nodes.begin(), nodes.end(), [&](cudaGraphNode_t n) { return cuda::node_type(n) == t; }));
}

inline bool device_attribute(CUdevice_attribute a) {
    static const auto get = cuda::detail::driver_entry<PFN_cuDeviceGetAttribute_v2000>("cuDeviceGetAttribute", 2000);
    int device = 0, value = 0;
    CAPSCOPE_CHECK(cudaGetDevice(&device));
    CAPSCOPE_CHECK(get(&value, a, CUdevice(device)));
    return value != 0;
}

} // namespace mem_ops
