// What a graph's memory-operation nodes cost at launch (issue 50), on one GPU: a graph of 1,000
// short kernels (--kernel-ns each) and N batches of stream memory operations as NCCL's copy-engine
// collectives capture them (a write of a flag, a wait for it, its reset: one node each), launched
//   as captured                     the batches as memory-operation nodes
//   copied, nodes kept              cuda::without_user_objects with the seam keep_mem_op_nodes
//   copied                          cuda::without_user_objects: each batch a one-thread kernel
//                                   (cuda/mem_op_kernel.hpp, loaded by cuda::prepare_mem_op_kernel)
// It reports the host's time per cudaGraphLaunch (median of --launches back to back, the device
// behind), the device's time per graph (CUDA events around --launches), round-robin over
// --rounds, and the same without batches for reference.
//
//   graph_mem_ops [--batches N,N,...] [--launches N] [--rounds N] [--kernel-ns N]     exit 77 without a GPU

#include "arguments.hpp"
#include "round_robin.hpp"

#include "../tests/gpu/mem_ops.hpp"

#include <capscope/cuda/event.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/stream.hpp>

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

struct variant {
    std::string name;
    cuda::graph_exec exec;
    std::vector<double> host_us, device_us;
};

} // namespace

int main(int argc, char** argv) {
    int launches = 20, rounds = 5, kernel_ns = 2000;
    std::string batches_text = "40,200";
    bench::arguments args("graph_mem_ops");
    args.text("--batches", batches_text, "N,N,...").integer("--launches", launches, 2).integer("--rounds", rounds, 1).integer("--kernel-ns", kernel_ns, 0);
    args.parse_or_exit(argc, argv);
    std::vector<int> batch_counts;
    for (std::size_t at = 0; at < batches_text.size();) {
        const std::size_t comma = std::min(batches_text.find(',', at), batches_text.size());
        const std::string item = batches_text.substr(at, comma - at);
        if (item.empty() || item.size() > 6 || item.find_first_not_of("0123456789") != std::string::npos || std::stoi(item) < 1)
            args.refuse("--batches takes positive numbers separated by commas (batches per graph), not '" + item + "'");
        batch_counts.push_back(std::stoi(item));
        at = comma + 1;
    }
    const std::string device = bench::device_or_skip();
    std::printf("%s: 1000 kernels of %d ns and N batches of memory operations (write, wait, reset) in one graph; %d launches, %d rounds\n",
                device.c_str(), kernel_ns, launches, rounds);
    if (!cuda::prepare_mem_op_kernel()) return std::fprintf(stderr, "graph_mem_ops: no CUDA context to load the kernel into\n"), 1;
    cuda::stream s;
    cuda::device_buffer<unsigned> flag(1);
    flag.fill_bytes(0, s);
    cuda::event begin = cuda::event::timing(), end = cuda::event::timing();
    for (const int batches : batch_counts) {
        auto body = [&](int with_batches) {
            return [&, with_batches](cudaStream_t on) {
                const int every = with_batches ? 1000 / with_batches : 0;
                for (int k = 0; k < 1000; ++k) {
                    spin<<<1, 1, 0, on>>>(kernel_ns);
                    if (every && k % every == 0) flag_batch(flag.data(), on);
                }
            };
        };
        std::vector<variant> v;
        v.push_back({"no batches", cuda::graph_exec(cuda::capture(s, body(0))), {}, {}});
        v.push_back({"as captured", cuda::graph_exec(cuda::capture(s, body(batches))), {}, {}});
        capscope::detail::installed_breakage().keep_mem_op_nodes = true;
        cuda::copy_result kept = cuda::without_user_objects(cuda::capture(s, body(batches)));
        capscope::detail::installed_breakage().keep_mem_op_nodes = false;
        cuda::copy_result copied = cuda::without_user_objects(cuda::capture(s, body(batches)));
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
        for (const variant& x : v)
            std::printf("%4d batches, %-20s host %9.1f us a launch; device %8.1f us a graph\n", x.name == "no batches" ? 0 : batches, x.name.c_str(),
                        bench::median(x.host_us), bench::median(x.device_us));
    }
    return 0;
}
