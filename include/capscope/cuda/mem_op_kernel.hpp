#pragma once
//! @file
//! A kernel node that does what a batch memory-operation node does: waits on, and writes of,
//! 32- and 64-bit values, in order. `cuda::without_user_objects` (graph_copy.hpp) puts one in
//! place of each such node it copies.
//!
//! Why: NCCL's copy-engine collectives order the ranks' copies with stream memory operations,
//! captured as batch memory-operation nodes, two per collective. CUDA does the work of those nodes
//! on the host at every launch of the graph: on an H200 (CUDA 13.0, bench/graph_mem_ops), a graph
//! of 1,000 kernels launched in 3.5 µs, in 109 µs with 40 batches as NCCL's (a write, a wait, a
//! reset), and with 200 the launch waited for the device (3.2 ms). As kernels, the same launched in
//! 4.3 µs, and the device took 2.5 µs a batch instead of 3.8.
//!
//! The kernel is PTX that the driver compiles when it is loaded (the library holds no code built
//! by nvcc). One thread runs the operations in order, as the stream would:
//! - a wait polls its address (volatile loads, which the peer's copy-engine writes reach) until its
//!   condition holds, as `cuStreamWaitValue32/64` states it: GEQ `(int32_t)(*addr - value) >= 0`
//!   (`int64_t` for 64 bits), EQ, AND `(*addr & value) != 0`, NOR `~(*addr | value) != 0`; then a
//!   system-wide fence, so nothing after it is seen before it;
//! - a write is preceded by a system-wide fence unless `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`,
//!   as the driver's is.
//! The graph orders the kernel with its neighbours as it ordered the node: it starts once the nodes
//! before it have completed, copies included, and what comes after starts once it has. What differs:
//! - while a wait's condition does not hold, the kernel keeps one thread of one SM polling, where
//!   the node held the stream's front end. A kernel that needs every SM at once (a cooperative
//!   launch) could then not start until the wait ends, so a graph that holds one keeps its nodes
//!   (one launched elsewhere at the same time, on another stream or graph, is not seen: if the
//!   peer's flag waited for it, the two would wait for each other; call no such kernel beside
//!   copied collectives, or skip `prepare_mem_op_kernel`); other kernels only lose that one
//!   thread's place. Neither wait can be cancelled (a rank that
//!   stops is the watchdog's, parallel/nccl_watchdog.hpp);
//! - the driver loads the kernel into a context at its first use there, and that load waits for the
//!   context's queued work. So it is loaded ahead (`prepare_mem_op_kernel`), and a copy made where
//!   it is not loaded keeps the nodes rather than wait;
//! - a write's fence is this thread's (`membar.sys`), where the driver's is the stream's. The
//!   nodes before the kernel have completed when it starts, so their writes, the copies' included,
//!   are done before it writes a flag: NCCL 2.28 writes this rank's flag into each peer's window
//!   (an NVLink store to a peer's memory, where the kernel does it) after the copies before it, and
//!   resets its own flags after its waits. (With NVLink multicast, on more than two GPUs unless
//!   `NCCL_NVLS_ENABLE=0`, 2.28 copies the flag to a multicast address instead, and the batch
//!   holds only waits and resets of this GPU's flags: the shape of NCCL's later releases, held to
//!   the nodes on one GPU, and not run across GPUs here, where NVLS is kept off.)
//! Other operations (barriers, flushes of remote writes, atomic reductions), other flags (a wait's
//! `CU_STREAM_WAIT_VALUE_FLUSH`, which an H200 refuses, so it could not be compared), and batches
//! of more than `mem_op_batch::capacity` operations are not converted: the copy keeps such a node
//! as it is, and says how many it kept (`copy_result::mem_op_nodes_kept`).
//!
//! A communicator made for copy-engine collectives (`nccl_options{nccl_cta_policy::zero}`,
//! nccl.hpp) loads it on its device; other programs call `prepare_mem_op_kernel` once per device
//! before their first capture. Held to CUDA's nodes on one GPU (tests/gpu/test_mem_op_kernel.cpp),
//! and across two H200s under NCCL's copy-engine all-gather and all-to-all, 100 steps back to back
//! with one rank late (tests/gpu/test_copy_engine_order.cpp, 2026-11-29).

#include <capscope/cuda/driver_api.hpp>
#include <capscope/detail/breakage.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace capscope::cuda::detail {

//! One operation as the kernel reads it (24 bytes; the PTX below reads these offsets).
struct mem_op {
    std::uint64_t address;
    std::uint64_t value; //!< a 32-bit operation's value in the low half
    std::uint32_t kind;  //!< 0 wait 32, 1 wait 64, 2 write 32, 3 write 64 (bit 0: 64 bits; below 2: a wait)
    std::uint32_t flags; //!< a wait's CU_STREAM_WAIT_VALUE_* in bits 0-1; a write's CU_STREAM_WRITE_VALUE_* in bit 0
};

//! The kernel's one parameter: the operations, then their count at byte 3840. NCCL 2.28's batch
//! holds 3n - 2 operations for n ranks in an NVLink domain (its flag written to each other rank,
//! its waits for theirs, its resets); with NVLink multicast, and in later releases, the flag is
//! copied instead, and the batch holds 2n - 1.
struct mem_op_batch {
    static constexpr unsigned capacity = 160; // within the 4 KB that kernel parameters had before CUDA 12.1
    mem_op op[capacity];
    std::uint32_t count;
};
static_assert(sizeof(mem_op) == 24 && offsetof(mem_op_batch, count) == 3840 && sizeof(mem_op_batch) == 3848,
              "the PTX reads mem_op_batch at these offsets");

// Registers: %at (this operation's parameter bytes), %seen (the value read), %x (the condition's
// operand: shifted into the high half for 32-bit operations, so that one 64-bit compare serves both
// widths and GEQ wraps as (int32_t) does).
inline constexpr char mem_op_ptx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry capscope_mem_ops(.param .align 8 .b8 batch[3848])
{
    .reg .pred  %done, %wide, %wait, %holds, %fence, %not_how;
    .reg .b32   %i, %count, %kind, %flags, %how, %bit, %shift, %word;
    .reg .b64   %base, %at, %address, %value, %seen, %x;

    mov.u64         %base, batch;
    ld.param.u32    %count, [batch+3840];
    mov.u32         %i, 0;
$next:
    setp.ge.u32     %done, %i, %count;
    @%done bra      $end;
    mul.wide.u32    %at, %i, 24;
    add.u64         %at, %base, %at;
    ld.param.u64    %address, [%at];
    ld.param.u64    %value, [%at+8];
    ld.param.u32    %kind, [%at+16];
    ld.param.u32    %flags, [%at+20];
    and.b32         %bit, %kind, 1;
    setp.eq.u32     %wide, %bit, 1;
    selp.u32        %shift, 0, 32, %wide;
    setp.lt.u32     %wait, %kind, 2;
    @!%wait bra     $write;
    and.b32         %how, %flags, 3;
$poll:
    @%wide  ld.volatile.u64 %seen, [%address];
    @!%wide ld.volatile.u32 %word, [%address];
    @!%wide cvt.u64.u32     %seen, %word;
    setp.ne.u32     %not_how, %how, 0;
    @%not_how bra   $eq;
    sub.s64         %x, %seen, %value;
    shl.b64         %x, %x, %shift;
    setp.ge.s64     %holds, %x, 0;
    bra.uni         $check;
$eq:
    setp.ne.u32     %not_how, %how, 1;
    @%not_how bra   $and;
    sub.s64         %x, %seen, %value;
    shl.b64         %x, %x, %shift;
    setp.eq.s64     %holds, %x, 0;
    bra.uni         $check;
$and:
    setp.ne.u32     %not_how, %how, 2;
    @%not_how bra   $nor;
    and.b64         %x, %seen, %value;
    shl.b64         %x, %x, %shift;
    setp.ne.s64     %holds, %x, 0;
    bra.uni         $check;
$nor:
    or.b64          %x, %seen, %value;
    not.b64         %x, %x;
    shl.b64         %x, %x, %shift;
    setp.ne.s64     %holds, %x, 0;
$check:
    @!%holds bra    $poll;
    membar.sys;
    bra.uni         $after;
$write:
    and.b32         %bit, %flags, 1;
    setp.eq.u32     %fence, %bit, 0;
    @%fence membar.sys;
    cvt.u32.u64     %word, %value;
    @%wide  st.volatile.u64 [%address], %value;
    @!%wide st.volatile.u32 [%address], %word;
$after:
    add.u32         %i, %i, 1;
    bra.uni         $next;
$end:
    ret;
}
)";

//! `ops` as the kernel's batch, or why not (an operation or flag it does not take, too many).
//! Broken on purpose (`mem_op_waits_skipped`), the waits are left out.
inline std::string as_kernel_batch(const CUstreamBatchMemOpParams* ops, unsigned count, mem_op_batch& out) {
    if (count > mem_op_batch::capacity)
        return "a batch of " + std::to_string(count) + " memory operations (the kernel takes " + std::to_string(mem_op_batch::capacity) + ")";
    out = {};
    const bool skip_waits = capscope::detail::installed_breakage().mem_op_waits_skipped; // a test, broken on purpose
    constexpr unsigned wait_flags = 3u; // the condition
    for (unsigned i = 0; i < count; ++i) {
        const CUstreamBatchMemOpParams& p = ops[i];
        mem_op op{};
        switch (p.operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
            const bool wide = p.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
            if (p.waitValue.flags & ~wait_flags) return "a wait on a value with flags " + std::to_string(p.waitValue.flags);
            op = {std::uint64_t(p.waitValue.address), wide ? std::uint64_t(p.waitValue.value64) : std::uint64_t(p.waitValue.value), wide ? 1u : 0u,
                  p.waitValue.flags & 3u};
            if (skip_waits) continue;
            break;
        }
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        case CU_STREAM_MEM_OP_WRITE_VALUE_64: {
            const bool wide = p.operation == CU_STREAM_MEM_OP_WRITE_VALUE_64;
            if (p.writeValue.flags & ~unsigned(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER))
                return "a write of a value with flags " + std::to_string(p.writeValue.flags);
            op = {std::uint64_t(p.writeValue.address), wide ? std::uint64_t(p.writeValue.value64) : std::uint64_t(p.writeValue.value), wide ? 3u : 2u,
                  p.writeValue.flags};
            break;
        }
        default: return "a memory operation of kind " + std::to_string(int(p.operation)) + " (the kernel waits and writes only)";
        }
        out.op[out.count++] = op;
    }
    return {};
}

//! The kernel, as a library the driver loads into each context at its first use there.
inline CUkernel mem_op_kernel() {
    static const CUkernel kernel = [] {
        const auto load = driver_entry<PFN_cuLibraryLoadData_v12000>("cuLibraryLoadData", 12000);
        const auto get = driver_entry<PFN_cuLibraryGetKernel_v12000>("cuLibraryGetKernel", 12000);
        CUlibrary library = nullptr;
        CAPSCOPE_CHECK(load(&library, mem_op_ptx, nullptr, nullptr, 0, nullptr, nullptr, 0));
        CUkernel k = nullptr;
        CAPSCOPE_CHECK(get(&k, library, "capscope_mem_ops"));
        return k; // the library stays loaded: its kernel may be in graphs until the process ends
    }();
    return kernel;
}

//! The contexts the kernel is loaded into, with its function there.
struct mem_op_functions {
    std::mutex mutex;
    std::vector<std::pair<CUcontext, CUfunction>> loaded;
};
inline mem_op_functions& mem_op_functions_loaded() {
    static mem_op_functions f;
    return f;
}

inline CUcontext current_context() {
    static const auto get = driver_entry<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent", 4000);
    CUcontext c = nullptr;
    CAPSCOPE_CHECK(get(&c));
    return c;
}

//! The kernel's function in the current context, or null where it is not loaded (the copy then
//! keeps memory-operation nodes: loading there now could wait for the device).
inline CUfunction mem_op_function_here() {
    const CUcontext c = current_context();
    mem_op_functions& f = mem_op_functions_loaded();
    const std::lock_guard<std::mutex> lock(f.mutex);
    for (const auto& [context, function] : f.loaded)
        if (context == c) return function;
    return nullptr;
}

//! Adds to `g` a kernel node of one thread that runs `batch` with `function` (the kernel's in the
//! graph's context), with no edges.
inline cudaGraphNode_t add_mem_op_kernel_node(cudaGraph_t g, const mem_op_batch& batch, CUfunction function) {
    static const auto add = driver_entry<PFN_cuGraphAddKernelNode_v12000>("cuGraphAddKernelNode", 12000);
    void* params[] = {const_cast<mem_op_batch*>(&batch)}; // copied by the add
    CUDA_KERNEL_NODE_PARAMS_v2 p{};
    p.func = function;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = params;
    CUgraphNode node = nullptr;
    CAPSCOPE_CHECK(add(&node, g, nullptr, 0, &p));
    return node;
}

} // namespace capscope::cuda::detail

namespace capscope::cuda {

//! Loads the kernel that graph copies run for memory-operation nodes (`without_user_objects`) into
//! the current device's context; copies made where it is not loaded keep the nodes. The driver's
//! load waits for the work queued in that context, so call it where waiting is harmless: before
//! the first collective, not while a capture or queued collectives wait for another rank. The current device's
//! runtime context is made here if it is not yet. False where there is still none; once loaded, a
//! call costs a lookup.
inline bool prepare_mem_op_kernel() {
    CUcontext c = detail::current_context();
    if (!c) {
        CAPSCOPE_CHECK(cudaFree(nullptr)); // the runtime makes the device's primary context current
        c = detail::current_context();
    }
    if (!c) return false;
    if (detail::mem_op_function_here()) return true;
    static const auto get_function = detail::driver_entry<PFN_cuKernelGetFunction_v12000>("cuKernelGetFunction", 12000);
    CUfunction function = nullptr;
    CAPSCOPE_CHECK(get_function(&function, detail::mem_op_kernel())); // loads it here
    // Under lazy loading a function may be loaded in part, the rest at its first launch (which
    // would wait for the device then): loaded whole now, where the driver can (CUDA 12.4).
    static const auto load = detail::driver_entry_if_any<PFN_cuFuncLoad_v12040>("cuFuncLoad", 12040);
    if (load) CAPSCOPE_CHECK(load(function));
    detail::mem_op_functions& f = detail::mem_op_functions_loaded();
    const std::lock_guard<std::mutex> lock(f.mutex);
    f.loaded.emplace_back(c, function);
    return true;
}

} // namespace capscope::cuda
