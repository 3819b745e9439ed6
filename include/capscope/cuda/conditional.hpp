#pragma once
//! @file
//! Conditional graph nodes: an IF node runs its body once when a device
//! flag holds, a WHILE node repeats it while the flag holds. The decision is taken on the device,
//! inside the graph, so a step that skips its optimizer or loops until a condition stays one
//! graph launch.
//!
//! A trainer's kernel writes a plain `int` (nonzero: holds). capscope turns it into the node's
//! condition with a one-thread kernel of its own, launched right before the node (and, for
//! WHILE, at the end of each pass of the body). That kernel is PTX loaded at first use
//! (`cudaLibraryLoadData`), so this header needs no nvcc: the library stays header-only.
//!
//! Versions: conditional nodes exist since CUDA 12.4, but the capture calls used here take CUDA
//! 13's signatures (edge data). With an older toolkit everything else still builds, and the first
//! capture of a guarded run throws an error naming CUDA 13.0; eager runs take guards on any
//! version.

#include <capscope/cuda/error.hpp>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace capscope::cuda {

enum class conditional_kind {
    if_holds,    //!< the body runs once when the flag holds
    while_holds, //!< the body runs again and again while the flag holds (it must clear it)
};

#if CUDART_VERSION >= 13000
namespace detail {

//! `capscope_set_condition(handle, flag)`: sets the node's condition to `*flag != 0`. nvcc 13's
//! PTX for `cudaGraphSetConditional(handle, *flag != 0)`, declared as ISA 8.4 (CUDA 12.4's), so
//! that any driver with conditional nodes can compile it.
inline constexpr char set_condition_ptx[] = R"PTX(
.version 8.4
.target sm_75
.address_size 64
.extern .func cudaGraphSetConditional
(
	.param .b64 cudaGraphSetConditional_param_0,
	.param .b32 cudaGraphSetConditional_param_1
)
;
.visible .entry capscope_set_condition(
	.param .u64 capscope_set_condition_param_0,
	.param .u64 capscope_set_condition_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [capscope_set_condition_param_0];
	ld.param.u64 	%rd2, [capscope_set_condition_param_1];
	cvta.to.global.u64 	%rd3, %rd2;
	ld.global.u32 	%r1, [%rd3];
	setp.ne.s32 	%p1, %r1, 0;
	selp.u32 	%r2, 1, 0, %p1;
	{
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd1;
	.param .b32 param1;
	st.param.b32 	[param1+0], %r2;
	call.uni
	cudaGraphSetConditional,
	(
	param0,
	param1
	);
	}
	ret;
}
)PTX";

//! capscope's kernel, loaded once per process (context-independent: every device gets it).
inline cudaKernel_t set_condition_kernel() {
    static const cudaKernel_t kernel = [] {
        cudaLibrary_t library = nullptr;
        CAPSCOPE_CHECK(cudaLibraryLoadData(&library, set_condition_ptx, nullptr, nullptr, 0, nullptr, nullptr, 0));
        cudaKernel_t k = nullptr;
        CAPSCOPE_CHECK(cudaLibraryGetKernel(&k, library, "capscope_set_condition"));
        return k; // the library stays loaded for the process, as a module of nvcc's would
    }();
    return kernel;
}

inline void launch_set_condition(cudaGraphConditionalHandle handle, const int* flag, cudaStream_t s) {
    void* args[] = {&handle, &flag};
    CAPSCOPE_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(set_condition_kernel()), dim3(1), dim3(1), args, 0, s));
}

} // namespace detail
#endif


//! One conditional node in the graph that `outer` is capturing. The constructor sets the node's
//! condition from `*flag` (after all `outer` has captured so far), adds the node, makes `outer`
//! continue after it, and starts capturing the node's body on `body`, a stream that is not
//! capturing. Work issued to `body` until `close()` is the body. A body left open by an
//! exception is ended by the destructor (the outer capture is the caller's to end).
class conditional_node {
public:
    conditional_node(cudaStream_t outer, cudaStream_t body, conditional_kind kind, const int* flag, cudaStreamCaptureMode mode)
        : body_(body), kind_(kind), flag_(flag) {
#if CUDART_VERSION >= 13000
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaGraph_t graph = nullptr;
        CAPSCOPE_CHECK(cudaStreamGetCaptureInfo(outer, &status, nullptr, &graph));
        if (status != cudaStreamCaptureStatusActive)
            throw std::logic_error("capscope::cuda::conditional_node: the outer stream is not capturing");
        CAPSCOPE_CHECK(cudaGraphConditionalHandleCreate(&handle_, graph, 0, cudaGraphCondAssignDefault));
        detail::launch_set_condition(handle_, flag_, outer);
        const cudaGraphNode_t* deps = nullptr;
        std::size_t dep_count = 0;
        CAPSCOPE_CHECK(cudaStreamGetCaptureInfo(outer, &status, nullptr, &graph, &deps, nullptr, &dep_count));
        cudaGraphNodeParams params{};
        params.type = cudaGraphNodeTypeConditional;
        params.conditional.handle = handle_;
        params.conditional.type = kind == conditional_kind::if_holds ? cudaGraphCondTypeIf : cudaGraphCondTypeWhile;
        params.conditional.size = 1;
        cudaGraphNode_t node = nullptr;
        CAPSCOPE_CHECK(cudaGraphAddNode(&node, graph, deps, nullptr, dep_count, &params));
        CAPSCOPE_CHECK(cudaStreamUpdateCaptureDependencies(outer, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
        CAPSCOPE_CHECK(cudaStreamBeginCaptureToGraph(body_, params.conditional.phGraph_out[0], nullptr, nullptr, 0, mode));
        open_ = true;
#else
        (void)outer, (void)mode, (void)kind_, (void)flag_;
        throw std::runtime_error("capscope: guarded stages are captured as conditional graph nodes, which capscope builds with the CUDA "
                                 "Toolkit 13.0 or later (the capture calls take CUDA 13's signatures); this build has CUDA " +
                                 std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) +
                                 " -- fix: build with CUDA 13, or run the guarded stages eagerly (impl::eager)");
#endif
    }
    conditional_node(const conditional_node&) = delete;
    conditional_node& operator=(const conditional_node&) = delete;
    ~conditional_node() {
        if (!open_) return;
        cudaGraph_t body = nullptr; // owned by the node: not destroyed here
        if (cudaStreamEndCapture(body_, &body) != cudaSuccess) (void)cudaGetLastError();
    }

    //! Ends the body (a WHILE body first sets the condition again, for the next pass).
    void close() {
#if CUDART_VERSION >= 13000
        if (kind_ == conditional_kind::while_holds) detail::launch_set_condition(handle_, flag_, body_);
#endif
        cudaGraph_t body = nullptr;
        open_ = false;
        CAPSCOPE_CHECK(cudaStreamEndCapture(body_, &body));
    }

private:
    cudaStream_t body_;
    conditional_kind kind_;
    const int* flag_;
#if CUDART_VERSION >= 13000
    cudaGraphConditionalHandle handle_ = 0;
#endif
    bool open_ = false;
};

} // namespace capscope::cuda
