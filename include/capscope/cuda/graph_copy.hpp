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
//! and child graphs, recursively; edges with their data (programmatic launch ports). Where the
//! graph records one event in a chain, as NCCL's graph-mixing support does after each collective,
//! the records but the last become empty nodes (graph_event_records.hpp says why that is sound):
//! CUDA does part of a record's work on the host at every launch, too. Not copied,
//! and the source returned as it was with `copy_result::refused` saying why (its launches still
//! wait past 28): a graph with any other node (a conditional node, graph memory, external
//! semaphores), a kernel or memory operation whose context is not the current one (the runtime
//! adds the other nodes in the current device's context), and any node CUDA refuses to copy
//! (device-updatable kernels, whose attributes cannot be copied).

#include <capscope/cuda/driver_api.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_event_records.hpp>
#include <capscope/cuda/graph_nodes.hpp>
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

struct raw_graph { // a graph being built here, destroyed unless handed on
    cudaGraph_t g = nullptr;
    raw_graph() { CAPSCOPE_CHECK(cudaGraphCreate(&g, 0)); }
    ~raw_graph() {
        if (g) (void)cudaGraphDestroy(g);
    }
    raw_graph(const raw_graph&) = delete;
    raw_graph& operator=(const raw_graph&) = delete;
};

//! What the copy did with memory-operation and event record nodes.
struct copy_counts {
    std::size_t kernels = 0;         //!< memory-operation nodes run as the kernel of mem_op_kernel.hpp
    std::size_t kept = 0;            //!< memory-operation nodes kept as they were (see mem_op_kernel.hpp for when)
    std::size_t records_dropped = 0; //!< event records run as empty nodes (graph_event_records.hpp)
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
//! kernel where `mem_op_kernel` (the kernel's function here) is given, and, at the top level
//! (`child` false), the records of an event but the last of a chain as empty nodes
//! (graph_event_records.hpp). Returns why not (a node it does not copy), or "" when copied; `to`
//! is then as `from`, less user objects.
inline std::string copy_nodes(cudaGraph_t from, cudaGraph_t to, CUfunction mem_op_kernel, copy_counts& counts, bool child = false) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(from, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count), copies(count, nullptr);
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(from, nodes.data(), &count));
    std::unordered_map<cudaGraphNode_t, std::size_t> index_of;
    for (std::size_t i = 0; i < count; ++i) index_of.emplace(nodes[i], i);
    auto index = [&](cudaGraphNode_t n) {
        const auto at = index_of.find(n);
        if (at == index_of.end()) throw std::logic_error("capscope: a graph edge names a node the graph does not list");
        return at->second;
    };
    std::size_t edges = 0;
    CAPSCOPE_CHECK(cudaGraphGetEdges(from, nullptr, nullptr, nullptr, &edges));
    std::vector<cudaGraphNode_t> src(edges), dst(edges);
    std::vector<cudaGraphEdgeData> data(edges);
    if (edges) CAPSCOPE_CHECK(cudaGraphGetEdges(from, src.data(), dst.data(), data.data(), &edges));
    std::vector<cudaGraphNodeType> types(count);
    for (std::size_t i = 0; i < count; ++i) {
        const cudaGraphNodeType t = types[i] = node_type(nodes[i]);
        if (t != cudaGraphNodeTypeKernel && t != cudaGraphNodeTypeMemcpy && t != cudaGraphNodeTypeMemset && t != cudaGraphNodeTypeHost &&
            t != cudaGraphNodeTypeGraph && t != cudaGraphNodeTypeEmpty && t != cudaGraphNodeTypeWaitEvent && t != cudaGraphNodeTypeEventRecord &&
            t != batch_mem_op_node)
            return std::string("a ") + node_type_name(t) + " node";
    }
    std::vector<bool> redundant_record(count, false);
    if (!child && !capscope::detail::installed_breakage().keep_event_records) { // (the seam: a bench's comparison)
        std::vector<std::vector<std::size_t>> successors(count);
        for (std::size_t e = 0; e < edges; ++e) successors[index(src[e])].push_back(index(dst[e]));
        redundant_record = redundant_event_records(from, nodes, types, successors, capscope::detail::installed_breakage().first_event_record_kept);
    }
    for (std::size_t i = 0; i < count; ++i) {
        const cudaGraphNode_t n = nodes[i];
        const cudaGraphNodeType t = types[i];
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
                    ++counts.kernels;
                    continue;
                } catch (const error&) {
                }
            }
            CAPSCOPE_CHECK(drv.add_batch_mem_op(&copies[i], to, nullptr, 0, &p));
            ++counts.kept;
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
            if (redundant_record[i]) { // its event's last record, later in the graph, stands for it
                CAPSCOPE_CHECK(cudaGraphAddEmptyNode(&copies[i], to, nullptr, 0));
                ++counts.records_dropped;
                break;
            }
            cudaEvent_t e = nullptr;
            CAPSCOPE_CHECK(cudaGraphEventRecordNodeGetEvent(n, &e));
            CAPSCOPE_CHECK(cudaGraphAddEventRecordNode(&copies[i], to, nullptr, 0, e));
            break;
        }
        default: { // a child graph, checked above
            cudaGraph_t child = nullptr;
            CAPSCOPE_CHECK(cudaGraphChildGraphNodeGetGraph(n, &child));
            raw_graph copy;
            if (std::string why = copy_nodes(child, copy.g, mem_op_kernel, counts, true); !why.empty()) return why + ", in a child graph";
            CAPSCOPE_CHECK(cudaGraphAddChildGraphNode(&copies[i], to, nullptr, 0, copy.g)); // CUDA clones it
            break;
        }
        }
    }
    if (edges) {
        for (std::size_t e = 0; e < edges; ++e) {
            src[e] = copies[index(src[e])];
            dst[e] = copies[index(dst[e])];
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
    std::size_t event_records_dropped = 0; //!< records of an event that a later record of it stands for (graph_event_records.hpp)
};

//! `source`'s nodes and edges in a new graph without its user objects, holding `source` alive
//! (see the file's comment). Set-up work: one driver query and one add per node; no wait for the
//! device (memory-operation nodes become kernels only where `prepare_mem_op_kernel` has loaded it).
inline copy_result without_user_objects(graph source) {
    try {
        detail::raw_graph copy;
        detail::copy_counts counts;
        // (Broken on purpose, or for a bench's comparison, keep_mem_op_nodes keeps them all.)
        const CUfunction mem_op_kernel = capscope::detail::installed_breakage().keep_mem_op_nodes || detail::holds_cooperative_kernel(source.get())
                                             ? nullptr
                                             : detail::mem_op_function_here();
        if (std::string why = detail::copy_nodes(source.get(), copy.g, mem_op_kernel, counts); !why.empty()) return {std::move(source), std::move(why)};
        cudaEvent_t done = nullptr;
        CAPSCOPE_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        try {
            detail::record_when_done(copy.g, done);
        } catch (...) {
            (void)cudaEventDestroy(done);
            throw;
        }
        graph copied(std::exchange(copy.g, nullptr));
        copied.keep_alive(std::make_shared<const detail::kept_source>(std::move(source), done), done);
        return {std::move(copied), {}, counts.kernels, counts.kept, counts.records_dropped};
    } catch (const error& e) { // CUDA would not copy a node: the source still works as it is
        return {std::move(source), std::string("a node CUDA would not copy: ") + e.what(), 0, 0, 0};
    }
}

} // namespace capscope::cuda
