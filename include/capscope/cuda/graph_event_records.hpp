#pragma once
//! @file
//! Which event record nodes a graph copy (graph_copy.hpp) may run as empty nodes: where a graph
//! records one event several times, each record after the one before it, and waits on that event
//! only before the first record, if at all, every record but the last.
//!
//! Why: NCCL's graph-mixing support (`NCCL_GRAPH_MIXING_SUPPORT`, on by default) orders its
//! captured collectives against its other work with one event: a wait on it at the root of the
//! graph, then a record of it after each collective, each after the one before
//! (`src/misc/strongstream.cc`). CUDA does part of a record node's work on the host at every
//! launch. On an H200 (bench/graph_mem_ops), a graph of 1,000 short kernels launched in 3.5 µs.
//! With NCCL's shape for 24 collectives it took 35 µs, and for 48 it took 66 µs. With 200 the
//! launch waited for the device (2.7 ms), as it does with memory-operation nodes. Copied, the
//! launch took 5.4-5.6 µs whatever the count. A whole-step graph of a larger sharded model holds
//! hundreds of collectives.
//!
//! Why that is sound: after a launch, the event stands for its last record. That one comes after
//! every other record of the chain, so whoever waits on the event waits at least as long as
//! before. Within the launch, nothing waits on the event after its first record. The waits before
//! it observe the event as it was before the launch, or a record of this launch that comes after
//! them, which would have been a deadlock in the source too. An event recorded or waited on in a
//! child graph is left alone, and so is every record in a graph that does not hold this shape.

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_nodes.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <set>
#include <unordered_map>
#include <vector>

namespace capscope::cuda::detail {

//! The events that the event nodes of `g`'s child graphs name, recursively.
inline void events_in_children(cudaGraph_t g, bool is_child, std::set<cudaEvent_t>& events) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    if (count) CAPSCOPE_CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
    for (cudaGraphNode_t n : nodes) {
        const cudaGraphNodeType t = node_type(n); // (the runtime's query fails on memory-operation nodes)
        cudaEvent_t e = nullptr;
        if (is_child && t == cudaGraphNodeTypeEventRecord) CAPSCOPE_CHECK(cudaGraphEventRecordNodeGetEvent(n, &e));
        if (is_child && t == cudaGraphNodeTypeWaitEvent) CAPSCOPE_CHECK(cudaGraphEventWaitNodeGetEvent(n, &e));
        if (e) events.insert(e);
        if (t == cudaGraphNodeTypeGraph) {
            cudaGraph_t child = nullptr;
            CAPSCOPE_CHECK(cudaGraphChildGraphNodeGetGraph(n, &child));
            events_in_children(child, true, events);
        }
    }
}

//! For one graph level (`nodes`, and `successors[i]`: the indices of the nodes that depend on
//! node i), whether each node is a record a copy may run as an empty node (see the file's comment).
//! Set-up work: a walk of the graph from each record and wait of an event recorded more than once.
inline std::vector<bool> redundant_event_records(cudaGraph_t g, const std::vector<cudaGraphNode_t>& nodes,
                                                 const std::vector<std::vector<std::size_t>>& successors, bool keep_the_first = false) {
    struct event_nodes {
        std::vector<std::size_t> records, waits;
    };
    std::unordered_map<cudaEvent_t, event_nodes> by_event;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const cudaGraphNodeType t = node_type(nodes[i]);
        cudaEvent_t e = nullptr;
        if (t == cudaGraphNodeTypeEventRecord) {
            CAPSCOPE_CHECK(cudaGraphEventRecordNodeGetEvent(nodes[i], &e));
            by_event[e].records.push_back(i);
        } else if (t == cudaGraphNodeTypeWaitEvent) {
            CAPSCOPE_CHECK(cudaGraphEventWaitNodeGetEvent(nodes[i], &e));
            by_event[e].waits.push_back(i);
        }
    }
    std::vector<bool> redundant(nodes.size(), false);
    bool any_chain = false;
    for (const auto& [e, en] : by_event) any_chain = any_chain || en.records.size() > 1;
    if (!any_chain) return redundant;
    std::set<cudaEvent_t> in_children;
    events_in_children(g, false, in_children);
    // The nodes reachable from `from` (itself not counted unless on a cycle, which a graph has not).
    std::vector<char> seen(nodes.size());
    std::vector<std::size_t> stack;
    auto reach = [&](std::size_t from) {
        std::fill(seen.begin(), seen.end(), 0);
        stack.assign(successors[from].begin(), successors[from].end());
        while (!stack.empty()) {
            const std::size_t n = stack.back();
            stack.pop_back();
            if (seen[n]) continue;
            seen[n] = 1;
            stack.insert(stack.end(), successors[n].begin(), successors[n].end());
        }
    };
    for (const auto& [e, en] : by_event) {
        const std::size_t k = en.records.size();
        if (k < 2 || in_children.count(e)) continue;
        // A chain: the records reach 0, 1, ..., k - 1 of the others, each a different number (in
        // a graph without cycles, that orders them all); the first reaches every other.
        std::vector<std::size_t> by_rank(k, nodes.size());
        bool chain = true;
        for (std::size_t r : en.records) {
            reach(r);
            std::size_t reached = 0;
            for (std::size_t other : en.records) reached += seen[other] ? 1 : 0;
            const std::size_t rank = k - 1 - reached; // 0: the first record
            if (by_rank[rank] != nodes.size()) chain = false;
            by_rank[rank] = r;
        }
        if (!chain) continue;
        bool waits_first = true; // every wait on the event comes before the first record
        for (std::size_t w : en.waits) {
            reach(w);
            waits_first = waits_first && seen[by_rank[0]];
        }
        if (!waits_first) continue;
        for (std::size_t rank = 0; rank + 1 < k; ++rank) redundant[by_rank[rank]] = true;
        if (keep_the_first) redundant[by_rank[0]] = false, redundant[by_rank[k - 1]] = true; // a test, broken on purpose
    }
    return redundant;
}

} // namespace capscope::cuda::detail
