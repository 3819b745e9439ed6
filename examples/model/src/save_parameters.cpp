// The safetensors writer (gpt/save_parameters.hpp). The header is a few lines of JSON written
// here rather than through a JSON library: the GPU machine, where this runs, has none installed,
// and the names are the model's own identifiers.

#include <gpt/save_parameters.hpp>

#include <cuda_fp16.h>

#include <capscope/cuda/error.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace gpt {

namespace {
std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

std::string metadata(const model_config& c) {
    std::ostringstream m;
    const auto field = [&](const char* k, const std::string& v) { m << quoted(k) << ':' << quoted(v) << ','; };
    field("vocab", std::to_string(c.vocab));
    field("hidden", std::to_string(c.hidden));
    field("heads", std::to_string(c.heads));
    field("ffn_hidden", std::to_string(c.ffn_hidden));
    field("seq_len", std::to_string(c.seq_len));
    field("batch", std::to_string(c.batch));
    field("microbatches", std::to_string(c.microbatches));
    field("layer_pattern", c.layer_pattern);
    field("experts", std::to_string(c.experts));
    field("top_k", std::to_string(c.top_k));
    field("capacity_factor", std::to_string(c.capacity_factor));
    field("moe_mode", c.moe_mode == moe_mode::drop_and_pad ? "drop_and_pad" : "dropless");
    field("mamba_inner", std::to_string(c.inner()));
    std::string s = m.str();
    s.pop_back(); // the last comma
    return "{" + s + "}";
}
} // namespace

void write_safetensors(const std::string& path, const model_config& config, const std::vector<parameter_info>& tensors,
                       const float* values) {
    std::ostringstream h;
    h << '{' << quoted("__metadata__") << ':' << metadata(config);
    std::size_t total = 0;
    for (const parameter_info& p : tensors) {
        h << ',' << quoted(p.name) << ":{\"dtype\":\"F32\",\"shape\":[" << p.count << "],\"data_offsets\":[" << p.offset * sizeof(float)
          << ',' << (p.offset + p.count) * sizeof(float) << "]}";
        total = std::max(total, p.offset + p.count);
    }
    h << '}';
    std::string header = h.str();
    header.append((8 - header.size() % 8) % 8, ' '); // the format pads the header to 8 bytes
    const std::uint64_t n = header.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(header.data(), std::streamsize(header.size()));
    f.write(reinterpret_cast<const char*>(values), std::streamsize(total * sizeof(float)));
    if (!f) throw std::runtime_error("write_safetensors: could not write '" + path + "'");
}

template <class T> void save_parameters(const gpt_model<T>& model, const std::string& path, cudaStream_t s, saved_arena arena) {
    const auto& store = model.parameters();
    if (store.sharded()) throw std::invalid_argument("save_parameters: the store is sharded; save from a replicated model");
    std::vector<float> all(store.total());
    CAPSCOPE_CHECK(cudaMemcpyAsync(all.data(), arena == saved_arena::masters ? store.masters() : store.grads(), all.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    write_safetensors(path, model.config(), store.list(), all.data());
}

template void save_parameters(const gpt_model<float>&, const std::string&, cudaStream_t, saved_arena);
template void save_parameters(const gpt_model<__nv_bfloat16>&, const std::string&, cudaStream_t, saved_arena);
template void save_parameters(const gpt_model<__half>&, const std::string&, cudaStream_t, saved_arena);

} // namespace gpt
