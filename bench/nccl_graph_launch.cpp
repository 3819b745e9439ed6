// Why does cudaGraphLaunch block the host on 2 GPUs (issue 50)? A probe with no model: graphs
// that hold one NCCL all-gather each (4 MiB), or only a kernel, launched back to back far ahead of
// the device (each graph also holds a spin kernel of --spin-us, so that the device is the slower
// side). It reports the host's time per cudaGraphLaunch, as the median over the launches, the
// first launch that waited (how far the host got ahead), and which node types NCCL put in the
// captured graph. The cases:
//   kernel only          a graph without NCCL, relaunched
//   user object          the kernel-only graph holding a user object (NCCL's graphs hold their
//                        plan's destructor as one)
//   NCCL as a child      the NCCL graph embedded as a child graph node of a new graph
//   NCCL cloned          the NCCL graph cloned (cudaGraphClone)
// and after them: the user-object graph on two streams in turn; the NCCL graph on four streams in
// turn, each launch ordered after the one before by an event; the all-gather issued eagerly.
//   one NCCL graph       the same graph with NCCL, relaunched
//   two NCCL graphs      two graphs with NCCL (one communicator), alternating, as per-layer
//                        graphs of a sharded step are
//   NCCL and kernel      a graph with NCCL alternating with one without
//   NCCL, copied         the NCCL graph copied node by node without its user object
//                        (cuda::without_user_objects, the fix); its all-gather is checked after
//   copy engines         the all-gather on copy engines (a zero-CTA communicator, buffers in
//                        NCCL symmetric windows: memcpy and memory-operation nodes, no kernel),
//                        as captured; and copied (each memory-operation node a one-thread kernel,
//                        cuda/mem_op_kernel.hpp), and copied with those nodes kept; checked after
//
// With --strip-events, NCCL's event record and wait nodes are removed from the captured graphs
// (their order kept) before they are instantiated.
//
//   mpirun -np 2 nccl_graph_launch [--launches N] [--spin-us U] [--strip-events]     exit 77 without 2 GPUs

#include "arguments.hpp"
#include "round_robin.hpp"

#include "../tests/gpu/mpi_support.hpp"
#include "../examples/common/pipeline_kernels.hpp"

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/nccl_window.hpp>
#include <capscope/cuda/stream.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

using namespace capscope;

namespace {

//! A kernel node's launch attributes, those NCCL may set on its kernel.
std::string kernel_words(cudaGraphNode_t n) {
    cudaLaunchAttributeValue v{};
    std::string attrs;
    if (cudaGraphKernelNodeGetAttribute(n, cudaLaunchAttributeCooperative, &v) == cudaSuccess && v.cooperative) attrs += " cooperative";
    if (cudaGraphKernelNodeGetAttribute(n, cudaLaunchAttributeMemSyncDomain, &v) == cudaSuccess)
        attrs += " memsync-domain=" + std::to_string(int(v.memSyncDomain));
    if (cudaGraphKernelNodeGetAttribute(n, cudaLaunchAttributePriority, &v) == cudaSuccess) attrs += " priority=" + std::to_string(v.priority);
    if (cudaGraphKernelNodeGetAttribute(n, cudaLaunchAttributeClusterDimension, &v) == cudaSuccess && v.clusterDim.x > 1)
        attrs += " cluster=" + std::to_string(v.clusterDim.x);
    cudaKernelNodeParams kp{};
    if (cudaGraphKernelNodeGetParams(n, &kp) == cudaSuccess)
        attrs += " grid=" + std::to_string(kp.gridDim.x) + " block=" + std::to_string(kp.blockDim.x) + " smem=" + std::to_string(kp.sharedMemBytes);
    (void)cudaGetLastError(); // a query that NCCL's driver-API node does not answer leaves its error behind
    return "kernel [" + attrs + " ]";
}

std::string node_census(const cuda::graph& g) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nodes.data(), &count));
    std::map<std::string, int> kinds;
    for (cudaGraphNode_t n : nodes) {
        const cudaGraphNodeType t = cuda::node_type(n); // (the runtime's query fails on memory-operation nodes)
        const char* name = t == static_cast<cudaGraphNodeType>(CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) ? "memory operations"
                         : t == cudaGraphNodeTypeMemcpy ? "memcpy" : t == cudaGraphNodeTypeMemset ? "memset"
                         : t == cudaGraphNodeTypeHost ? "host" : t == cudaGraphNodeTypeGraph ? "child graph" : t == cudaGraphNodeTypeEmpty ? "empty"
                         : t == cudaGraphNodeTypeWaitEvent ? "event wait" : t == cudaGraphNodeTypeEventRecord ? "event record"
                         : t == cudaGraphNodeTypeMemAlloc ? "mem alloc" : t == cudaGraphNodeTypeMemFree ? "mem free" : "other";
        ++kinds[t == cudaGraphNodeTypeKernel ? kernel_words(n) : std::string(name)];
    }
    std::string out;
    for (const auto& [k, n] : kinds) out += (out.empty() ? "" : ", ") + std::to_string(n) + " " + k;
    return out;
}

//! Removes the graph's event record and event wait nodes, each predecessor of one joined to each
//! of its successors, so that the order within the graph stays (`--strip-events`: is it them?).
int strip_event_nodes(const cuda::graph& g) {
    std::size_t count = 0;
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CAPSCOPE_CHECK(cudaGraphGetNodes(g.get(), nodes.data(), &count));
    int removed = 0;
    for (cudaGraphNode_t n : nodes) {
        const cudaGraphNodeType t = cuda::node_type(n);
        if (t != cudaGraphNodeTypeEventRecord && t != cudaGraphNodeTypeWaitEvent) continue;
        std::size_t before = 0, after = 0;
        CAPSCOPE_CHECK(cudaGraphNodeGetDependencies(n, nullptr, nullptr, &before));
        CAPSCOPE_CHECK(cudaGraphNodeGetDependentNodes(n, nullptr, nullptr, &after));
        std::vector<cudaGraphNode_t> from(before), to(after);
        if (before) CAPSCOPE_CHECK(cudaGraphNodeGetDependencies(n, from.data(), nullptr, &before));
        if (after) CAPSCOPE_CHECK(cudaGraphNodeGetDependentNodes(n, to.data(), nullptr, &after));
        for (cudaGraphNode_t a : from)
            for (cudaGraphNode_t b : to) CAPSCOPE_CHECK(cudaGraphAddDependencies(g.get(), &a, &b, nullptr, 1));
        CAPSCOPE_CHECK(cudaGraphDestroyNode(n));
        ++removed;
    }
    return removed;
}

} // namespace

int main(int argc, char** argv) {
    int launches = 400, spin_us = 100;
    bool strip = false;
    bench::arguments args("nccl_graph_launch");
    args.integer("--launches", launches, 2).integer("--spin-us", spin_us, 0).flag("--strip-events", strip).parse_or_exit(argc, argv);
    const std::string device = bench::device_or_skip();
    support::comm();
    const int ranks = support::comm().size(), rank = support::comm().rank();
    if (ranks < 2) return std::printf("one rank: NCCL kernels need two (mpirun -np 2): skipped\n"), 77;
    cuda::stream s;
    const std::size_t floats = std::size_t{1} << 20;
    cuda::device_buffer<float> send(floats), gathered(floats * std::size_t(ranks));
    CAPSCOPE_CHECK(cudaMemsetAsync(send.data(), rank + 1, send.bytes(), s)); // every byte of rank r's part is r + 1
    auto gather = [&](cudaStream_t on) {
        pipeline_kernels::spin(1000LL * spin_us, on);
        CAPSCOPE_CHECK(ncclAllGather(send.data(), gathered.data(), floats, ncclFloat, support::comm().get(), on));
    };
    auto kernel = [&](cudaStream_t on) { pipeline_kernels::spin(1000LL * spin_us, on); };
    gather(s); // NCCL's connections open eagerly, before the capture
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    const cuda::graph g1 = cuda::capture(s, gather), g2 = cuda::capture(s, gather), k = cuda::capture(s, kernel);
    if (rank == 0) std::printf("%s, %d ranks; NCCL's captured all-gather graph holds: %s\n", device.c_str(), ranks, node_census(g1).c_str());
    if (strip) {
        const int removed = strip_event_nodes(g1) + strip_event_nodes(g2);
        if (rank == 0) std::printf("--strip-events: %d event nodes removed; the graph now holds %s\n", removed, node_census(g1).c_str());
    }
    // A graph without NCCL holding a user object, as NCCL's captures do (its plan's destructor,
    // cudaUserObjectNoDestructorSync, moved into the graph).
    const cuda::graph u = cuda::capture(s, kernel);
    cudaUserObject_t object = nullptr;
    static int payload = 0;
    CAPSCOPE_CHECK(cudaUserObjectCreate(&object, &payload, [](void*) {}, 1, cudaUserObjectNoDestructorSync));
    CAPSCOPE_CHECK(cudaGraphRetainUserObject(u.get(), object, 1, cudaGraphUserObjectMove));
    // The NCCL graph embedded in a new graph as a child node, and cloned: do they keep the user object?
    cudaGraph_t parent_raw = nullptr, clone_raw = nullptr;
    CAPSCOPE_CHECK(cudaGraphCreate(&parent_raw, 0));
    const cuda::graph parent(parent_raw);
    cudaGraphNode_t child = nullptr;
    CAPSCOPE_CHECK(cudaGraphAddChildGraphNode(&child, parent.get(), nullptr, 0, g1.get()));
    CAPSCOPE_CHECK(cudaGraphClone(&clone_raw, g1.get()));
    const cuda::graph clone(clone_raw);
    cuda::copy_result copied = cuda::without_user_objects(cuda::capture(s, gather));
    if (!copied.refused.empty()) return std::fprintf(stderr, "the NCCL graph was not copied: %s\n", copied.refused.c_str()), 1;
    if (rank == 0) std::printf("copied without its user object: %s\n", node_census(copied.copy).c_str());
    // The all-gather on copy engines: its own communicator with NCCL's zero-CTA policy, and its
    // buffers in symmetric windows; one eager call first (a window's device state is set up then).
    const cuda::nccl_communicator zero_cta = cuda::communicator_from_mpi(support::mpi(), {cuda::nccl_cta_policy::zero});
    cuda::nccl_symmetric_buffer<float> ce_send(zero_cta, floats), ce_gathered(zero_cta, floats * std::size_t(ranks));
    CAPSCOPE_CHECK(cudaMemsetAsync(ce_send.data(), rank + 1, ce_send.bytes(), s));
    auto gather_ce = [&](cudaStream_t on) {
        pipeline_kernels::spin(1000LL * spin_us, on);
        CAPSCOPE_CHECK(ncclAllGather(ce_send.data(), ce_gathered.data(), floats, ncclFloat, zero_cta.get(), on));
    };
    gather_ce(s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    const cuda::graph gce = cuda::capture(s, gather_ce);
    if (rank == 0) std::printf("on copy engines, captured: %s\n", node_census(gce).c_str());
    cuda::prepare_mem_op_kernel(); // the copy's memory operations as a kernel (opt-in for now, cuda/mem_op_kernel.hpp)
    cuda::copy_result ce_copied = cuda::without_user_objects(cuda::capture(s, gather_ce));
    if (!ce_copied.refused.empty()) return std::fprintf(stderr, "the copy-engine graph was not copied: %s\n", ce_copied.refused.c_str()), 1;
    if (rank == 0) std::printf("on copy engines, copied: %s\n", node_census(ce_copied.copy).c_str());
    capscope::detail::installed_breakage().keep_mem_op_nodes = true; // the copy as before cuda/mem_op_kernel.hpp
    cuda::copy_result ce_kept = cuda::without_user_objects(cuda::capture(s, gather_ce));
    capscope::detail::installed_breakage().keep_mem_op_nodes = false;
    if (!ce_kept.refused.empty()) return std::fprintf(stderr, "the copy-engine graph was not copied: %s\n", ce_kept.refused.c_str()), 1;
    const cuda::graph_exec e1(g1), e2(g2), ek(k), eu(u), ep(parent), ecl(clone), ecopy(copied.copy), ece(gce), ecec(ce_copied.copy), ecek(ce_kept.copy);

    struct plan {
        const char* name;
        std::vector<const cuda::graph_exec*> cycle;
    };
    const std::vector<plan> plans{{"kernel only", {&ek}}, {"user object", {&eu}}, {"NCCL as a child", {&ep}}, {"NCCL cloned", {&ecl}}, {"one NCCL graph", {&e1}}, {"two NCCL graphs", {&e1, &e2}}, {"NCCL and kernel", {&e1, &ek}}, {"NCCL, copied", {&ecopy}},
                                  {"copy engines", {&ece}}, {"copy engines, copied", {&ecec}}, {"CE, copied, memory-operation nodes kept", {&ecek}}};
    for (const plan& p : plans) {
        std::vector<double> us;
        CAPSCOPE_CHECK(cudaMemsetAsync(gathered.data(), 0, gathered.bytes(), s));
        CAPSCOPE_CHECK(cudaMemsetAsync(ce_gathered.data(), 0, ce_gathered.bytes(), s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        const auto begin = std::chrono::steady_clock::now();
        for (int i = 0; i < launches; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            p.cycle[std::size_t(i) % p.cycle.size()]->launch(s);
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        const double enqueue_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
        std::vector<double> late(us.end() - launches / 2, us.end());
        // How far the host got ahead: the first launch that waited (over 50 us).
        const auto first_wait = std::find_if(us.begin(), us.end(), [](double x) { return x > 50.0; });
        const std::string ahead = first_wait == us.end() ? "none waited" : "launch " + std::to_string(first_wait - us.begin()) + " waited first";
        std::printf("rank %d, %-16s %d launches: host %.1f us a launch (median; %.1f over the second half), enqueue %.1f ms of %.1f ms; %s\n",
                    rank, p.name, launches, bench::median(us), bench::median(late), enqueue_ms, total_ms, ahead.c_str());
        if (p.cycle[0] == &ecopy || p.cycle[0] == &ecec || p.cycle[0] == &ecek) { // the copy gathers what the source does: rank r's part all r + 1
            std::vector<unsigned char> back(gathered.bytes());
            CAPSCOPE_CHECK(cudaMemcpy(back.data(), p.cycle[0] == &ecopy ? static_cast<void*>(gathered.data()) : ce_gathered.data(), back.size(),
                                      cudaMemcpyDeviceToHost));
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < back.size(); ++i) wrong += back[i] != (unsigned char)(i / send.bytes() + 1);
            std::printf("rank %d, %-16s all-gather after the launches: %s\n", rank, p.name,
                        wrong ? ("WRONG in " + std::to_string(wrong) + " bytes").c_str() : "every byte from its rank");
            if (wrong) return 1;
        }
    }
    { // the user-object graph launched on two streams in turn: is the limit per stream?
        cuda::stream other;
        std::vector<double> us;
        CAPSCOPE_CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < launches; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            eu.launch(i % 2 ? other.get() : s.get());
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        CAPSCOPE_CHECK(cudaDeviceSynchronize());
        const auto first_wait = std::find_if(us.begin(), us.end(), [](double x) { return x > 50.0; });
        std::printf("rank %d, %-16s %d launches: host %.1f us a launch (median); %s\n", rank, "user object, 2 streams", launches, bench::median(us),
                    first_wait == us.end() ? "none waited" : ("launch " + std::to_string(first_wait - us.begin()) + " waited first").c_str());
    }
    { // the NCCL graph on 4 streams in turn, each launch after the one before it (an event): the
      // order of one stream, the in-flight limit of four?
        std::vector<cuda::stream> lanes(4);
        std::vector<cuda::event> done(4);
        std::vector<double> us;
        CAPSCOPE_CHECK(cudaDeviceSynchronize());
        CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        const auto begin = std::chrono::steady_clock::now();
        for (int i = 0; i < launches; ++i) {
            const std::size_t k = std::size_t(i) % lanes.size();
            const auto t0 = std::chrono::steady_clock::now();
            if (i > 0) done[(k + lanes.size() - 1) % lanes.size()].wait_on(lanes[k]);
            e1.launch(lanes[k]);
            done[k].record(lanes[k]);
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        const double enqueue_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
        CAPSCOPE_CHECK(cudaDeviceSynchronize());
        const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
        const auto first_wait = std::find_if(us.begin(), us.end(), [](double x) { return x > 50.0; });
        std::printf("rank %d, %-16s %d launches: host %.1f us a launch (median), enqueue %.1f ms of %.1f ms; %s\n", rank, "NCCL, 4 chained streams",
                    launches, bench::median(us), enqueue_ms, total_ms,
                    first_wait == us.end() ? "none waited" : ("launch " + std::to_string(first_wait - us.begin()) + " waited first").c_str());
    }
    { // the same all-gather issued eagerly, each after its spin kernel
        std::vector<double> us;
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        for (int i = 0; i < launches; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            gather(s);
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        std::vector<double> late(us.end() - launches / 2, us.end());
        std::printf("rank %d, %-16s %d calls: host %.1f us a call (median; %.1f over the second half)\n", rank, "eager NCCL", launches,
                    bench::median(us), bench::median(late));
    }
    return 0;
}
