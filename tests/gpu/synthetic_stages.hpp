#pragma once
// What the engine's GPU tests on synthetic stages share (test_engine, test_guards): integer device
// buffers, and a stage that declares its buffers.

#include <capscope/cuda/buffer.hpp>
#include <capscope/stage/stage.hpp>

#include <string>
#include <utility>

namespace synthetic {

using ints = capscope::cuda::device_buffer<int>;

inline capscope::tensor_ref ref(const ints& b, const char* name = "") { return {name, b.data(), b.bytes()}; }

//! A stage in `regions` of `layer` with its buffers declared (the caller lists them).
inline capscope::stage make_stage(std::string name, int layer, capscope::capture_module_set regions, capscope::stream_fn fwd,
                                  capscope::stream_fn bwd) {
    capscope::stage st;
    st.name = std::move(name);
    st.layer = layer;
    st.captured_by = regions;
    st.forward = fwd;
    st.backward = bwd;
    st.buffers_declared = true;
    return st;
}

} // namespace synthetic
