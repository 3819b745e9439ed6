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
//! Why that is sound: after a launch, an event recorded in a graph stands for its last record,
//! in the source as in the copy (`tests/gpu/test_graph_event_records.cpp` holds the source to
//! that). Whoever waits on it later binds to it through a call made after the launch returned
//! (an eager wait or query, another graph's launch), so nothing outside the launch observes the
//! records before the last one. Within the launch, nothing waits on the event after its first
//! record: the copy thins only where every wait on the event comes before it. An event that a
//! child graph names is left alone, and so is every record in a graph of any other shape.

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

//! For one graph level (`nodes`, their `types`, and `successors[i]`: the indices of the nodes
//! that depend on node i), whether each node is a record a copy may run as an empty node (see the
//! file's comment). Set-up work: one pass over the graph for each event recorded more than once.
inline std::vector<bool> redundant_event_records(cudaGraph_t g, const std::vector<cudaGraphNode_t>& nodes, const std::vector<cudaGraphNodeType>& types,
                                                 const std::vector<std::vector<std::size_t>>& successors, bool keep_the_first = false) {
    struct event_nodes {
        std::vector<std::size_t> records, waits;
    };
    std::unordered_map<cudaEvent_t, event_nodes> by_event;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const cudaGraphNodeType t = types[i];
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
    // One topological order (Kahn's), its positions, and each node's predecessors.
    const std::size_t n = nodes.size(), none = n;
    std::vector<std::vector<std::size_t>> predecessors(n);
    std::vector<std::size_t> pending(n, 0), order, position(n, 0);
    for (std::size_t u = 0; u < n; ++u)
        for (std::size_t v : successors[u]) predecessors[v].push_back(u), ++pending[v];
    for (std::size_t u = 0; u < n; ++u)
        if (pending[u] == 0) order.push_back(u);
    for (std::size_t at = 0; at < order.size(); ++at)
        for (std::size_t v : successors[order[at]])
            if (--pending[v] == 0) order.push_back(v);
    if (order.size() != n) return redundant; // (a cycle, which CUDA does not allow: leave it all)
    for (std::size_t at = 0; at < n; ++at) position[order[at]] = at;
    std::vector<std::size_t> latest(n); // the latest record of the event before each node, by position (none: no such record)
    std::vector<char> is_record(n), before_first(n);
    for (const auto& [e, en] : by_event) {
        const std::size_t k = en.records.size();
        if (k < 2 || in_children.count(e)) continue;
        std::fill(is_record.begin(), is_record.end(), 0);
        for (std::size_t r : en.records) is_record[r] = 1;
        for (std::size_t v : order) {
            std::size_t l = none;
            for (std::size_t u : predecessors[v]) {
                const std::size_t from = is_record[u] ? position[u] : latest[u];
                if (from != none && (l == none || from > l)) l = from;
            }
            latest[v] = l;
        }
        // A chain: each record's latest record before it is the one just before it in the order.
        std::vector<std::size_t> records = en.records;
        std::sort(records.begin(), records.end(), [&](std::size_t a, std::size_t b) { return position[a] < position[b]; });
        bool chain = latest[records[0]] == none;
        for (std::size_t j = 1; j < k && chain; ++j) chain = latest[records[j]] == position[records[j - 1]];
        if (!chain) continue;
        // Every wait on the event comes before the first record: among its ancestors.
        std::fill(before_first.begin(), before_first.end(), 0);
        std::vector<std::size_t> stack(predecessors[records[0]]);
        while (!stack.empty()) {
            const std::size_t u = stack.back();
            stack.pop_back();
            if (before_first[u]) continue;
            before_first[u] = 1;
            stack.insert(stack.end(), predecessors[u].begin(), predecessors[u].end());
        }
        if (!std::all_of(en.waits.begin(), en.waits.end(), [&](std::size_t w) { return before_first[w] != 0; })) continue;
        for (std::size_t j = 0; j + 1 < k; ++j) redundant[records[j]] = true;
        if (keep_the_first) redundant[records[0]] = false, redundant[records[k - 1]] = true; // a test, broken on purpose
    }
    return redundant;
}

} // namespace capscope::cuda::detail
