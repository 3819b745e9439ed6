// What the nodes NCCL adds to a captured graph cost at launch (issue 50), on one GPU: a graph of
// --kernels short kernels (1,000; --kernel-ns each) and N batches of stream memory operations as NCCL's
// copy-engine collectives capture them (a write of a flag, a wait for it, its reset: one node
// each), or N collectives' event records as NCCL's graph-mixing support leaves them (a wait on one
// event at the root, a record of it after each; --events E spreads them over E events, one per
// communicator, each with its own root wait), launched
//   as captured                     the batches as memory-operation nodes, every record
//   copied, nodes kept              cuda::without_user_objects with the seam keep_mem_op_nodes
//                                   (or keep_event_records)
//   copied                          cuda::without_user_objects: each batch a one-thread kernel
//                                   (cuda/mem_op_kernel.hpp, loaded by cuda::prepare_mem_op_kernel);
//                                   the chain's last record only (cuda/graph_event_records.hpp)
// It reports the host's time per cudaGraphLaunch (median of --launches back to back, the device
// behind), the device's time per graph (CUDA events around --launches), round-robin over
// --rounds, and the same with neither for reference.
//
// It also says how long the copy took (set-up, never on the replay path).
//
//   graph_mem_ops [--batches N,...] [--records N,...] [--events E] [--kernels N] [--launches N] [--rounds N] [--kernel-ns N]     exit 77 without a GPU

#include "arguments.hpp"
#include "round_robin.hpp"

#include "../tests/gpu/mem_ops.hpp"

#include <capscope/cuda/event.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/stream.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

using namespace capscope;

namespace {

//! Spins for about `ns` nanoseconds (globaltimer): a kernel of known length.
__global__ void spin(long long ns) {
    unsigned long long start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    while (now - start < (unsigned long long)ns);
}

//! A flag written, waited for and reset, in one batch (one graph node), as NCCL orders two ranks'
//! copies (src/ce_coll.cc: the peer's flag by a copy, the wait and the reset as memory operations).
void flag_batch(unsigned* flag, cudaStream_t s) {
    mem_ops::issue_batch({mem_ops::write_op(flag, false, 1), mem_ops::wait_op(flag, false, 1, CU_STREAM_WAIT_VALUE_EQ), mem_ops::write_op(flag, false, 0)}, s);
}

//! A record of `e` as NCCL's graph-mixing support leaves one after a captured collective.
void record_external(cudaEvent_t e, cudaStream_t s) { CAPSCOPE_CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal)); }

//! Positive numbers separated by commas, none above `most`, or a refusal through `args`.
std::vector<int> counts_from(const std::string& text, const char* option, int most, bench::arguments& args) {
    std::vector<int> counts;
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t comma = std::min(text.find(',', at), text.size());
        const std::string item = text.substr(at, comma - at);
        if (item.empty() || item.size() > 6 || item.find_first_not_of("0123456789") != std::string::npos || std::stoi(item) < 1)
            args.refuse(std::string(option) + " takes positive numbers separated by commas (per graph), not '" + item + "'");
        counts.push_back(std::stoi(item));
        if (counts.back() > most) // (one after a kernel at most)
            args.refuse(std::string(option) + " " + item + " is more than --kernels " + std::to_string(most) + ": at most one after each kernel");
        at = comma + 1;
    }
    return counts;
}

struct variant {
    std::string name;
    cuda::graph_exec exec;
    std::vector<double> host_us, device_us;
};

} // namespace

int main(int argc, char** argv) {
    int launches = 20, rounds = 5, kernel_ns = 2000, kernels = 1000, events = 1;
    std::string batches_text = "40,200", records_text = "24,48,200";
    bench::arguments args("graph_mem_ops");
    args.text("--batches", batches_text, "N,N,...").text("--records", records_text, "N,N,...").integer("--launches", launches, 2).integer("--rounds", rounds, 1)
        .integer("--kernel-ns", kernel_ns, 0).integer("--kernels", kernels, 1).integer("--events", events, 1);
    args.parse_or_exit(argc, argv);
    const std::vector<int> batch_counts = counts_from(batches_text, "--batches", kernels, args),
                           record_counts = counts_from(records_text, "--records", kernels, args);
    for (const int r : record_counts)
        if (r < events) args.refuse("--records " + std::to_string(r) + " is fewer than --events " + std::to_string(events) + ": each event needs a record");
    const std::string device = bench::device_or_skip();
    std::printf("%s: %d kernels of %d ns and N batches of memory operations (write, wait, reset), or N records of %d event(s), each after a "
                "wait on it at the root, in one graph; %d launches, %d rounds\n",
                device.c_str(), kernels, kernel_ns, events, launches, rounds);
    if (!cuda::prepare_mem_op_kernel()) return std::fprintf(stderr, "graph_mem_ops: no CUDA context to load the kernel into\n"), 1;
    cuda::stream s;
    cuda::device_buffer<unsigned> flag(1);
    flag.fill_bytes(0, s);
    cuda::event begin = cuda::event::timing(), end = cuda::event::timing();
    const std::vector<cuda::event> serial(static_cast<std::size_t>(events)); // NCCL's graph-mixing event's role, one per communicator
    for (const cuda::event& e : serial) e.record(s);
    s.synchronize();
    struct family {
        int count;
        bool records; // records of an event, else batches of memory operations
    };
    std::vector<family> families;
    for (const int b : batch_counts) families.push_back({b, false});
    for (const int r : record_counts) families.push_back({r, true});
    for (const family f : families) {
        auto body = [&](int with) {
            return [&, with](cudaStream_t on) {
                const int every = with ? std::max(1, kernels / with) : 0;
                if (with && f.records)
                    for (const cuda::event& e : serial) CAPSCOPE_CHECK(cudaStreamWaitEvent(on, e.get(), cudaEventWaitExternal));
                for (int k = 0, added = 0; k < kernels; ++k) {
                    spin<<<1, 1, 0, on>>>(kernel_ns);
                    if (!every || k % every != 0 || added == with) continue;
                    ++added;
                    if (f.records) record_external(serial[std::size_t(added % events)].get(), on);
                    else flag_batch(flag.data(), on);
                }
            };
        };
        bool& keep = f.records ? capscope::detail::installed_breakage().keep_event_records : capscope::detail::installed_breakage().keep_mem_op_nodes;
        std::vector<variant> v;
        v.push_back({"neither", cuda::graph_exec(cuda::capture(s, body(0))), {}, {}});
        v.push_back({"as captured", cuda::graph_exec(cuda::capture(s, body(f.count))), {}, {}});
        keep = true;
        cuda::copy_result kept = cuda::without_user_objects(cuda::capture(s, body(f.count)));
        keep = false;
        cuda::graph to_copy = cuda::capture(s, body(f.count));
        const auto copy_started = std::chrono::steady_clock::now();
        cuda::copy_result copied = cuda::without_user_objects(std::move(to_copy));
        const double copy_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - copy_started).count();
        if (!kept.refused.empty() || !copied.refused.empty()) return std::fprintf(stderr, "not copied: %s%s\n", kept.refused.c_str(), copied.refused.c_str()), 1;
        v.push_back({"copied, nodes kept", cuda::graph_exec(kept.copy), {}, {}});
        v.push_back({"copied", cuda::graph_exec(copied.copy), {}, {}});
        for (variant& x : v) x.exec.launch(s); // uploads
        s.synchronize();
        for (int round = 0; round < rounds; ++round)
            for (variant& x : v) {
                std::vector<double> us;
                begin.record(s);
                for (int i = 0; i < launches; ++i) {
                    const auto t0 = std::chrono::steady_clock::now();
                    x.exec.launch(s);
                    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
                }
                end.record(s);
                s.synchronize();
                x.host_us.push_back(bench::median(us));
                x.device_us.push_back(1000.0 * double(cuda::event::elapsed_ms(begin, end)) / launches);
            }
        if (f.records && copied.event_records_dropped != std::size_t(f.count - events))
            return std::fprintf(stderr, "the copy ran %zu of %d records as empty nodes, not %d\n", copied.event_records_dropped, f.count, f.count - events), 1;
        std::printf("%4d %-8s copied in %.1f ms (set-up)\n", f.count, f.records ? "records," : "batches,", copy_ms);
        for (const variant& x : v)
            std::printf("%4d %-8s %-20s host %9.1f us a launch; device %8.1f us a graph\n", x.name == "neither" ? 0 : f.count, f.records ? "records," : "batches,",
                        x.name.c_str(), bench::median(x.host_us), bench::median(x.device_us));
    }
    return 0;
}
