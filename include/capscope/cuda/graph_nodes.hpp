#pragma once
//! @file
//! A graph node's type and the driver calls that graph copies need for the nodes the runtime
//! does not fully answer for (kernels added through the driver, batch memory operations), found
//! through the runtime so that nothing links libcuda directly.

#include <capscope/cuda/driver_api.hpp>
#include <capscope/cuda/error.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace capscope::cuda {

namespace detail {

//! The driver calls the copies of kernel and memory-operation nodes need, found through the runtime so that nothing
//! links libcuda directly.
struct driver_node_calls {
    PFN_cuGraphKernelNodeGetParams_v12000 get_params = nullptr;
    PFN_cuGraphAddKernelNode_v12000 add = nullptr;
    PFN_cuGraphKernelNodeCopyAttributes_v11000 copy_attributes = nullptr;
    //! Stream memory operations (waits on and writes of values), which NCCL's copy-engine
    //! collectives capture to order the ranks' copies.
    PFN_cuGraphBatchMemOpNodeGetParams_v11070 batch_mem_op_params = nullptr;
    PFN_cuGraphAddBatchMemOpNode_v11070 add_batch_mem_op = nullptr;
    //! The runtime's cudaGraphNodeGetType fails ("unknown error") on a batch memory operation node.
    PFN_cuGraphNodeGetType_v10000 node_type = nullptr;
    //! A kernel node's launch attribute (whether it is cooperative), for NCCL's nodes too.
    PFN_cuGraphKernelNodeGetAttribute_v11000 kernel_attribute = nullptr;
};

inline const driver_node_calls& driver_nodes() {
    static const driver_node_calls calls = [] {
        driver_node_calls c;
        c.get_params = driver_entry<PFN_cuGraphKernelNodeGetParams_v12000>("cuGraphKernelNodeGetParams", 12000);
        c.add = driver_entry<PFN_cuGraphAddKernelNode_v12000>("cuGraphAddKernelNode", 12000);
        c.copy_attributes = driver_entry<PFN_cuGraphKernelNodeCopyAttributes_v11000>("cuGraphKernelNodeCopyAttributes", 11000);
        c.batch_mem_op_params = driver_entry<PFN_cuGraphBatchMemOpNodeGetParams_v11070>("cuGraphBatchMemOpNodeGetParams", 11070);
        c.add_batch_mem_op = driver_entry<PFN_cuGraphAddBatchMemOpNode_v11070>("cuGraphAddBatchMemOpNode", 11070);
        c.node_type = driver_entry<PFN_cuGraphNodeGetType_v10000>("cuGraphNodeGetType", 10000);
        c.kernel_attribute = driver_entry<PFN_cuGraphKernelNodeGetAttribute_v11000>("cuGraphKernelNodeGetAttribute", 11000);
        return c;
    }();
    return calls;
}

//! The runtime's enum has no name for the driver's CU_GRAPH_NODE_TYPE_BATCH_MEM_OP.
inline constexpr cudaGraphNodeType batch_mem_op_node = static_cast<cudaGraphNodeType>(CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);

inline const char* node_type_name(cudaGraphNodeType t) {
    switch (t) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host";
    case cudaGraphNodeTypeGraph: return "child graph";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeExtSemaphoreSignal: return "external semaphore signal";
    case cudaGraphNodeTypeExtSemaphoreWait: return "external semaphore wait";
    case cudaGraphNodeTypeMemAlloc: return "graph memory allocation";
    case cudaGraphNodeTypeMemFree: return "graph memory free";
    case cudaGraphNodeTypeConditional: return "conditional";
    default: return t == batch_mem_op_node ? "batch memory operation" : "unknown";
    }
}

} // namespace detail

//! A node's type, asked of the driver: the runtime's `cudaGraphNodeGetType` fails on the batch
//! memory operation nodes that NCCL's copy-engine collectives capture (`detail::batch_mem_op_node`).
//! The driver's enum numbers the runtime's types alike.
inline cudaGraphNodeType node_type(cudaGraphNode_t n) {
    CUgraphNodeType t{};
    CAPSCOPE_CHECK(detail::driver_nodes().node_type(n, &t));
    return static_cast<cudaGraphNodeType>(t);
}

} // namespace capscope::cuda
