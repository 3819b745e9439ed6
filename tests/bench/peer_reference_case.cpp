// The float64 reference's half of the peer's CPU check (tests/bench/peer_reference.py). It draws
// a tiny model's weights and one batch, and writes them with what the reference
// (tests/gpu/reference.cpp, which the GPU suite checks the CUDA model against) computes from
// them, for the PyTorch peer to compute again:
//   DIR/weights.safetensors    the weights (fp32 values, the config in the metadata), written as
//                              gpt::save_parameters writes a model's
//   DIR/batch.bin              tokens, then labels (-1: no loss), int32, batch x seq_len each
//   DIR/gradients.safetensors  the loss's gradient for every parameter, by central differences
//   DIR/routing.bin            each MoE layer's routing map, tokens x top_k expert ids, int32, in
//                              layer order (as bench/same_model writes routing_step1.bin)
//   DIR/reference.txt          "loss <value>", then "dropped <layer> <assignments>" per MoE layer
// usage: peer_reference_case DIR LAYER_PATTERN CAPACITY_FACTOR SEED

#include "../gpu/reference.hpp"
#include "../gpu/support.hpp"

#include <gpt/save_parameters.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Weights of 0.3 (the GPU gradient checks' scale) keep attention and routing far from uniform;
// norm gains around 1, not at 1, so that a gain applied in the wrong place shows.
std::vector<float> draw(const std::vector<gpt::parameter_info>& list, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> all;
    for (const auto& p : list) {
        const bool gain = p.name.ends_with("norm");
        for (std::size_t i = 0; i < p.count; ++i) all.push_back(gain ? 1.f + 0.2f * normal(rng) : 0.3f * normal(rng));
    }
    return all;
}

reference::parameters by_name(const std::vector<gpt::parameter_info>& list, const std::vector<float>& all) {
    reference::parameters p;
    for (const auto& info : list) p[info.name].assign(all.begin() + std::ptrdiff_t(info.offset), all.begin() + std::ptrdiff_t(info.offset + info.count));
    return p;
}

void write_ints(std::ofstream& f, const std::vector<int>& v) {
    const std::vector<std::int32_t> out(v.begin(), v.end());
    f.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * sizeof(std::int32_t)));
}

} // namespace

int main(int argc, char** argv) try {
    if (argc != 5) {
        std::fputs("usage: peer_reference_case DIR LAYER_PATTERN CAPACITY_FACTOR SEED\n", stderr);
        return 2;
    }
    const std::string dir = argv[1];
    const gpt::model_config cfg = support::tiny_model(argv[2], gpt::moe_mode::drop_and_pad, std::stod(argv[3]), std::stoull(argv[4]));
    cfg.validate();

    std::vector<gpt::parameter_info> list;
    std::size_t offset = 0;
    for (const auto& [name, count] : reference::model_parameters(cfg)) {
        list.push_back({name, offset, count});
        offset += count;
    }
    const std::vector<float> values = draw(list, cfg.seed);
    const reference::parameters params = by_name(list, values);
    gpt::write_safetensors(dir + "/weights.safetensors", cfg, list, values.data());

    const auto b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, cfg.seed + 7);
    std::ofstream batch(dir + "/batch.bin", std::ios::binary);
    write_ints(batch, b.tokens);
    write_ints(batch, b.labels);
    if (!batch.flush()) throw std::runtime_error("could not write " + dir + "/batch.bin");

    const auto loss_of = [&](const reference::parameters& p) { return reference::model_loss(cfg, p, b.tokens, b.labels); };
    const reference::parameters grads = reference::finite_difference_gradients(params, loss_of);
    std::vector<float> flat;
    for (const auto& info : list) flat.insert(flat.end(), grads.at(info.name).begin(), grads.at(info.name).end());
    gpt::write_safetensors(dir + "/gradients.safetensors", cfg, list, flat.data());

    std::ofstream routing(dir + "/routing.bin", std::ios::binary);
    for (int l = 0; l < int(cfg.layer_pattern.size()); ++l)
        if (cfg.layer_pattern[l] == 'E') write_ints(routing, reference::routing_map(cfg, params, b.tokens, l));
    if (!routing.flush()) throw std::runtime_error("could not write " + dir + "/routing.bin");

    std::ofstream out(dir + "/reference.txt");
    char line[64];
    std::snprintf(line, sizeof line, "loss %.17g\n", loss_of(params));
    out << line;
    for (int l = 0; l < int(cfg.layer_pattern.size()); ++l)
        if (cfg.layer_pattern[l] == 'E') out << "dropped " << l << ' ' << reference::dropped_assignments(cfg, params, b.tokens, l) << '\n';
    if (!out.flush()) throw std::runtime_error("could not write " + dir + "/reference.txt");
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "peer_reference_case: %s\n", e.what());
    return 1;
}
