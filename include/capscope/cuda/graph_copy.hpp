#pragma once
//! @file
//! `without_user_objects(g)`: a copy of a captured graph, node for node and edge for edge, that
//! holds no CUDA user object, while the graph it was copied from (with its user objects) is
//! kept alive by the copy and by every executable graph instantiated from it.
//!
//! Why: NCCL gives every graph it is captured into a user object (its plan's destructor,
//! `ncclCudaGraphAddDestructor`), and CUDA lets a stream hold only about 28 launches in flight of
//! graphs that hold one; the next `cudaGraphLaunch` waits on the host for the oldest to finish
//! (bench/nccl_graph_launch, docs/performance.md). A step of per-layer graphs with collectives
//! inside launches more than that, so the host cannot run ahead of the device. The copy's launches
//! do not wait.
//!
//! NCCL's plan stays alive because its user object does, in the source graph, until the last
//! launch of the copy has finished. The copy ends with an event record node after all its other
//! nodes, so every launch records that event, with no host call; launches of one executable graph
//! run in order, so when the event's last record has completed, every launch has. When the last
//! holder lets go, the source is destroyed after `cudaEventSynchronize` on that event: no device-
//! or stream-wide wait, so a capture on another thread is not disturbed (a set-up or clean-up
//! cost, never on replay).
//!
//! Copied: kernel nodes (through the driver API, which also answers for kernels that libraries
//! such as NCCL add with it, with their launch attributes: clusters, priority, memory sync
//! domain), batch memory operations (waits on and writes of 32- and 64-bit values, which NCCL's
//! copy-engine collectives capture; each as a one-thread kernel that does the same,
//! mem_op_kernel.hpp, since CUDA does such a node's work on the host at every launch, or as it
//! was where it holds another operation), memcpy, memset, host, empty, event record and wait nodes,
//! and child graphs, recursively; edges with their data (programmatic launch ports). Not copied,
//! and the source returned as it was with `copy_result::refused` saying why (its launches still
//! wait past 28): a graph with any other node (a conditional node, graph memory, external
//! semaphores), a kernel or memory operation whose context is not the current one (the runtime
//! adds the other nodes in the current device's context), and any node CUDA refuses to copy
//! (device-updatable kernels, whose attributes cannot be copied).

#include <capscope/cuda/driver_api.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/mem_op_kernel.hpp>
#include <capscope/detail/breakage.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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

namespace detail {

struct raw_graph { // a graph being built here, destroyed unless handed on
    cudaGraph_t g = nullptr;
    raw_graph() { CAPSCOPE_CHECK(cudaGraphCreate(&g, 0)); }
    ~raw_graph() {
        if (g) (void)cudaGraphDestroy(g);
    }
    raw_graph(const raw_graph&) = delete;
    raw_graph& operator=(const raw_graph&) = delete;
};

//! What the copy did with memory-operation nodes.
struct mem_op_counts {
    std::size_t kernels = 0; //!< nodes run as the kernel of mem_op_kernel.hpp
    std::size_t kept = 0;    //!< nodes kept as they were (see mem_op_kernel.hpp for when)
};

//! Whether any kernel node of `g` or of its child graphs is a cooperative launch, which needs
//! every SM at once (a memory-operation kernel polling on one would hold it back).
inline bool holds_cooperative_kernel(cudaGraph_t g) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
    for (cudaGraphNode_t n : nodes) {
        const cudaGraphNodeType t = node_type(n);
        if (t == cudaGraphNodeTypeKernel) {
            CUkernelNodeAttrValue v{};
            if (driver_nodes().kernel_attribute(n, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v) != CUDA_SUCCESS || v.cooperative)
                return true; // (a kernel that cannot say counts as one)
        } else if (t == cudaGraphNodeTypeGraph) {
            cudaGraph_t child = nullptr;
            CAPSCOPE_CHECK(cudaGraphChildGraphNodeGetGraph(n, &child));
            if (holds_cooperative_kernel(child)) return true;
        }
    }
    return false;
}

//! Copies `from`'s nodes and edges into the empty graph `to`, each memory-operation node as a
//! kernel where `mem_op_kernel` (the kernel's function here) is given. Returns why not (a node it
//! does not copy), or "" when copied; `to` is then as `from`, less user objects.
inline std::string copy_nodes(cudaGraph_t from, cudaGraph_t to, CUfunction mem_op_kernel, mem_op_counts& mem_ops) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(from, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count), copies(count, nullptr);
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(from, nodes.data(), &count));
    for (std::size_t i = 0; i < count; ++i) {
        const cudaGraphNodeType t = node_type(nodes[i]);
        if (t != cudaGraphNodeTypeKernel && t != cudaGraphNodeTypeMemcpy && t != cudaGraphNodeTypeMemset && t != cudaGraphNodeTypeHost &&
            t != cudaGraphNodeTypeGraph && t != cudaGraphNodeTypeEmpty && t != cudaGraphNodeTypeWaitEvent && t != cudaGraphNodeTypeEventRecord &&
            t != batch_mem_op_node)
            return std::string("a ") + node_type_name(t) + " node";
    }
    for (std::size_t i = 0; i < count; ++i) {
        const cudaGraphNode_t n = nodes[i];
        const cudaGraphNodeType t = node_type(n);
        if (t == batch_mem_op_node) { // not a runtime enumerator, so not a case of the switch
            const driver_node_calls& drv = driver_nodes();
            CUDA_BATCH_MEM_OP_NODE_PARAMS p{}; // its array is the node's, read before `from` changes
            CAPSCOPE_CHECK(drv.batch_mem_op_params(n, &p));
            const CUcontext current = current_context();
            if (p.ctx && p.ctx != current) return "a memory operation of another context than the current one (make its device current first)";
            // As a kernel (mem_op_kernel.hpp: CUDA does a memory-operation node's work on the host
            // at every launch), unless it holds what the kernel does not do; kept if CUDA will not
            // add the kernel, as that only costs the launch time the kernel saves.
            mem_op_batch batch;
            if (mem_op_kernel && as_kernel_batch(p.paramArray, p.count, batch).empty()) {
                try {
                    copies[i] = add_mem_op_kernel_node(to, batch, mem_op_kernel);
                    ++mem_ops.kernels;
                    continue;
                } catch (const error&) {
                }
            }
            CAPSCOPE_CHECK(drv.add_batch_mem_op(&copies[i], to, nullptr, 0, &p));
            ++mem_ops.kept;
            continue;
        }
        switch (t) {
        case cudaGraphNodeTypeKernel: {
            if (capscope::detail::installed_breakage().copy_kernels_as_empty) { // a test, broken on purpose
                CAPSCOPE_CHECK(cudaGraphAddEmptyNode(&copies[i], to, nullptr, 0));
                break;
            }
            const driver_node_calls& drv = driver_nodes();
            CUDA_KERNEL_NODE_PARAMS_v2 p{};
            CAPSCOPE_CHECK(drv.get_params(n, &p));
            const CUcontext current = current_context();
            if (p.ctx && p.ctx != current) return "a kernel of another context than the current one (make its device current first)";
            CAPSCOPE_CHECK(drv.add(&copies[i], to, nullptr, 0, &p));
            CAPSCOPE_CHECK(drv.copy_attributes(copies[i], n));
            break;
        }
        case cudaGraphNodeTypeMemcpy: {
            cudaMemcpy3DParms p{};
            CAPSCOPE_CHECK(cudaGraphMemcpyNodeGetParams(n, &p));
            CAPSCOPE_CHECK(cudaGraphAddMemcpyNode(&copies[i], to, nullptr, 0, &p));
            break;
        }
        case cudaGraphNodeTypeMemset: {
            cudaMemsetParams p{};
            CAPSCOPE_CHECK(cudaGraphMemsetNodeGetParams(n, &p));
            CAPSCOPE_CHECK(cudaGraphAddMemsetNode(&copies[i], to, nullptr, 0, &p));
            break;
        }
        case cudaGraphNodeTypeHost: {
            cudaHostNodeParams p{};
            CAPSCOPE_CHECK(cudaGraphHostNodeGetParams(n, &p));
            CAPSCOPE_CHECK(cudaGraphAddHostNode(&copies[i], to, nullptr, 0, &p));
            break;
        }
        case cudaGraphNodeTypeEmpty: CAPSCOPE_CHECK(cudaGraphAddEmptyNode(&copies[i], to, nullptr, 0)); break;
        case cudaGraphNodeTypeWaitEvent: {
            cudaEvent_t e = nullptr;
            CAPSCOPE_CHECK(cudaGraphEventWaitNodeGetEvent(n, &e));
            CAPSCOPE_CHECK(cudaGraphAddEventWaitNode(&copies[i], to, nullptr, 0, e));
            break;
        }
        case cudaGraphNodeTypeEventRecord: {
            cudaEvent_t e = nullptr;
            CAPSCOPE_CHECK(cudaGraphEventRecordNodeGetEvent(n, &e));
            CAPSCOPE_CHECK(cudaGraphAddEventRecordNode(&copies[i], to, nullptr, 0, e));
            break;
        }
        default: { // a child graph, checked above
            cudaGraph_t child = nullptr;
            CAPSCOPE_CHECK(cudaGraphChildGraphNodeGetGraph(n, &child));
            raw_graph copy;
            if (std::string why = copy_nodes(child, copy.g, mem_op_kernel, mem_ops); !why.empty()) return why + ", in a child graph";
            CAPSCOPE_CHECK(cudaGraphAddChildGraphNode(&copies[i], to, nullptr, 0, copy.g)); // CUDA clones it
            break;
        }
        }
    }
    std::size_t edges = 0;
    CAPSCOPE_CHECK(cudaGraphGetEdges(from, nullptr, nullptr, nullptr, &edges));
    if (edges) {
        std::vector<cudaGraphNode_t> src(edges), dst(edges);
        std::vector<cudaGraphEdgeData> data(edges);
        CAPSCOPE_CHECK(cudaGraphGetEdges(from, src.data(), dst.data(), data.data(), &edges));
        std::unordered_map<cudaGraphNode_t, cudaGraphNode_t> copy_by_node;
        for (std::size_t i = 0; i < count; ++i) copy_by_node.emplace(nodes[i], copies[i]);
        auto copy_of = [&](cudaGraphNode_t n) {
            const auto at = copy_by_node.find(n);
            if (at == copy_by_node.end()) throw std::logic_error("capscope: a graph edge names a node the graph does not list");
            return at->second;
        };
        for (std::size_t e = 0; e < edges; ++e) {
            src[e] = copy_of(src[e]);
            dst[e] = copy_of(dst[e]);
        }
        CAPSCOPE_CHECK(cudaGraphAddDependencies(to, src.data(), dst.data(), data.data(), edges));
    }
    return {};
}

//! Ends `g` with an event record node after every node that has no successor: each launch then
//! records `done` when all its work has finished.
inline void record_when_done(cudaGraph_t g, cudaEvent_t done) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count), sinks;
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
    for (cudaGraphNode_t n : nodes) {
        std::size_t after = 0;
        CAPSCOPE_CHECK(cudaGraphNodeGetDependentNodes(n, nullptr, nullptr, &after));
        if (after == 0) sinks.push_back(n);
    }
    cudaGraphNode_t record = nullptr;
    CAPSCOPE_CHECK(cudaGraphAddEventRecordNode(&record, g, sinks.data(), sinks.size(), done));
}

//! The source graph, kept alive for its user objects until the last launch of its copy has
//! finished (`done`, recorded by the copy's last node).
struct kept_source {
    graph source;
    cudaEvent_t done = nullptr;
    kept_source(graph s, cudaEvent_t d) noexcept : source(std::move(s)), done(d) {}
    kept_source(const kept_source&) = delete;
    kept_source& operator=(const kept_source&) = delete;
    ~kept_source() {
        // A failure here is a device fault, reported where it happened; the source goes either way.
        (void)cudaEventSynchronize(done);
        (void)cudaEventDestroy(done);
    } // then `source`, and with it the user objects
};

} // namespace detail

struct copy_result {
    graph copy;           //!< the copy; the source itself when `refused` says why not
    std::string refused;  //!< empty when copied: the node the copy would not take
    std::size_t mem_op_kernels = 0;    //!< memory-operation nodes the copy runs as kernels (mem_op_kernel.hpp)
    std::size_t mem_op_nodes_kept = 0; //!< memory-operation nodes it keeps as they were (whose work CUDA does on the host at each launch)
};

//! `source`'s nodes and edges in a new graph without its user objects, holding `source` alive
//! (see the file's comment). Set-up work: one driver query and one add per node; no wait for the
//! device (memory-operation nodes become kernels only where `prepare_mem_op_kernel` has loaded it).
inline copy_result without_user_objects(graph source) {
    try {
        detail::raw_graph copy;
        detail::mem_op_counts mem_ops;
        // (Broken on purpose, or for a bench's comparison, keep_mem_op_nodes keeps them all.)
        const CUfunction mem_op_kernel = capscope::detail::installed_breakage().keep_mem_op_nodes || detail::holds_cooperative_kernel(source.get())
                                             ? nullptr
                                             : detail::mem_op_function_here();
        if (std::string why = detail::copy_nodes(source.get(), copy.g, mem_op_kernel, mem_ops); !why.empty()) return {std::move(source), std::move(why)};
        cudaEvent_t done = nullptr;
        CAPSCOPE_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        try {
            detail::record_when_done(copy.g, done);
        } catch (...) {
            (void)cudaEventDestroy(done);
            throw;
        }
        graph copied(std::exchange(copy.g, nullptr));
        copied.keep_alive(std::make_shared<const detail::kept_source>(std::move(source), done));
        return {std::move(copied), {}, mem_ops.kernels, mem_ops.kept};
    } catch (const error& e) { // CUDA would not copy a node: the source still works as it is
        return {std::move(source), std::string("a node CUDA would not copy: ") + e.what(), 0, 0};
    }
}

} // namespace capscope::cuda
