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
//! do not wait. NCCL's plan stays alive because its user object does, in the source graph; when
//! the last holder lets go of the source, the device is synchronized first, so no launch of the
//! copy can still read the plan when NCCL frees it (a set-up or clean-up cost, never on replay).
//!
//! Copied: kernel nodes (through the driver API, which also answers for kernels that libraries
//! such as NCCL add with it, with their launch attributes: clusters, priority, memory sync
//! domain), memcpy, memset, host, empty, event record and wait nodes, and child graphs,
//! recursively; edges with their data (programmatic launch ports). A graph with any other node
//! (a conditional node, graph memory allocation, external semaphores) is not copied:
//! `copy_result::refused` says which node, and `graph` is the source itself, which still works and
//! whose launches still wait past 28.

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/detail/breakage.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace capscope::cuda {

namespace detail {

inline void check_status(CUresult status, const char* call, const char* file, int line) {
    if (status != CUDA_SUCCESS) raise(library::cuda, static_cast<int>(status), "a CUDA driver error (CUresult)", call, file, line);
}

//! The three driver calls a kernel node's copy needs, found through the runtime so that nothing
//! links libcuda directly.
struct driver_kernel_node_calls {
    PFN_cuGraphKernelNodeGetParams_v12000 get_params = nullptr;
    PFN_cuGraphAddKernelNode_v12000 add = nullptr;
    PFN_cuGraphKernelNodeCopyAttributes_v11000 copy_attributes = nullptr;
};

inline const driver_kernel_node_calls& driver_kernel_nodes() {
    static const driver_kernel_node_calls calls = [] {
        driver_kernel_node_calls c;
        auto find = [](const char* name, void** fn, unsigned version) {
            cudaDriverEntryPointQueryResult found{};
            CAPSCOPE_CHECK(cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &found));
            if (found != cudaDriverEntryPointSuccess || !*fn)
                throw std::runtime_error(std::string("capscope: the CUDA driver has no ") + name + " -- fix: a driver of CUDA 12 or later");
        };
        find("cuGraphKernelNodeGetParams", reinterpret_cast<void**>(&c.get_params), 12000);
        find("cuGraphAddKernelNode", reinterpret_cast<void**>(&c.add), 12000);
        find("cuGraphKernelNodeCopyAttributes", reinterpret_cast<void**>(&c.copy_attributes), 11000);
        return c;
    }();
    return calls;
}

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
    default: return "unknown";
    }
}

struct raw_graph { // a graph being built here, destroyed unless handed on
    cudaGraph_t g = nullptr;
    raw_graph() { CAPSCOPE_CHECK(cudaGraphCreate(&g, 0)); }
    ~raw_graph() {
        if (g) (void)cudaGraphDestroy(g);
    }
    raw_graph(const raw_graph&) = delete;
    raw_graph& operator=(const raw_graph&) = delete;
};

//! Copies `from`'s nodes and edges into the empty graph `to`. Returns why not (a node it does not
//! copy), or "" when copied; `to` is then as `from`, less user objects.
inline std::string copy_nodes(cudaGraph_t from, cudaGraph_t to) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(from, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count), copies(count, nullptr);
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(from, nodes.data(), &count));
    for (std::size_t i = 0; i < count; ++i) {
        cudaGraphNodeType t{};
        CAPSCOPE_CHECK(cudaGraphNodeGetType(nodes[i], &t));
        if (t != cudaGraphNodeTypeKernel && t != cudaGraphNodeTypeMemcpy && t != cudaGraphNodeTypeMemset && t != cudaGraphNodeTypeHost &&
            t != cudaGraphNodeTypeGraph && t != cudaGraphNodeTypeEmpty && t != cudaGraphNodeTypeWaitEvent && t != cudaGraphNodeTypeEventRecord)
            return std::string("a ") + node_type_name(t) + " node";
    }
    for (std::size_t i = 0; i < count; ++i) {
        const cudaGraphNode_t n = nodes[i];
        cudaGraphNodeType t{};
        CAPSCOPE_CHECK(cudaGraphNodeGetType(n, &t));
        switch (t) {
        case cudaGraphNodeTypeKernel: {
            if (capscope::detail::installed_breakage().copy_kernels_as_empty) { // a test, broken on purpose
                CAPSCOPE_CHECK(cudaGraphAddEmptyNode(&copies[i], to, nullptr, 0));
                break;
            }
            const driver_kernel_node_calls& drv = driver_kernel_nodes();
            CUDA_KERNEL_NODE_PARAMS_v2 p{};
            CAPSCOPE_CHECK(drv.get_params(n, &p));
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
            if (std::string why = copy_nodes(child, copy.g); !why.empty()) return why + ", in a child graph";
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
        auto copy_of = [&](cudaGraphNode_t n) {
            for (std::size_t i = 0; i < count; ++i)
                if (nodes[i] == n) return copies[i];
            throw std::logic_error("capscope: a graph edge names a node the graph does not list");
        };
        for (std::size_t e = 0; e < edges; ++e) {
            src[e] = copy_of(src[e]);
            dst[e] = copy_of(dst[e]);
        }
        CAPSCOPE_CHECK(cudaGraphAddDependencies(to, src.data(), dst.data(), data.data(), edges));
    }
    return {};
}

//! Keeps the source graph alive, and lets it go only after the device has finished what was
//! launched from copies of it.
struct source_after_device_work {
    void operator()(const graph* source) const noexcept {
        (void)cudaDeviceSynchronize();
        (void)cudaGetLastError(); // a sticky fault is reported where it happened, not here
        delete source;
    }
};

} // namespace detail

struct copy_result {
    graph copy;           //!< the copy; the source itself when `refused` says why not
    std::string refused;  //!< empty when copied: the node the copy would not take
};

//! `source`'s nodes and edges in a new graph without its user objects, holding `source` alive
//! (see the file's comment). Set-up work: one driver query and one add per node.
inline copy_result without_user_objects(graph source) {
    detail::raw_graph copy;
    if (std::string why = detail::copy_nodes(source.get(), copy.g); !why.empty()) return {std::move(source), std::move(why)};
    graph copied(std::exchange(copy.g, nullptr));
    std::shared_ptr<const graph> keep(new graph(std::move(source)), detail::source_after_device_work{});
    copied.keep_alive(std::move(keep));
    return {std::move(copied), {}};
}

} // namespace capscope::cuda
