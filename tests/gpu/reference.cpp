#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace reference {
namespace {

using vec = std::vector<double>;

// Keys are passed as a block name and a part (or one literal), never as a temporary string, so
// binding the result to a reference is visibly safe (and gcc 13's -Wdangling-reference agrees).
const vec& get(const parameters& p, const char* name) {
    auto it = p.find(name);
    if (it == p.end()) throw std::logic_error(std::string("reference: no parameter '") + name + "'");
    return it->second;
}
const vec& get(const parameters& p, const std::string& block, const char* part) { return get(p, (block + part).c_str()); }

// [m,k] x [k,n]
vec matmul(const vec& a, const vec& b, int m, int k, int n) {
    vec c(std::size_t(m) * n, 0.0);
    for (int i = 0; i < m; ++i)
        for (int l = 0; l < k; ++l) {
            const double x = a[std::size_t(i) * k + l];
            for (int j = 0; j < n; ++j) c[std::size_t(i) * n + j] += x * b[std::size_t(l) * n + j];
        }
    return c;
}

vec rms_norm(const vec& x, const vec& g, int rows, int cols) {
    vec y(x.size());
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int c = 0; c < cols; ++c) ss += x[std::size_t(r) * cols + c] * x[std::size_t(r) * cols + c];
        const double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
        for (int c = 0; c < cols; ++c) y[std::size_t(r) * cols + c] = x[std::size_t(r) * cols + c] * inv * g[c];
    }
    return y;
}

double gelu(double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

void add_into(vec& x, const vec& d) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += d[i];
}

// Self-attention over each sample; key j visible to query i when (causal ? j <= i : j < length).
vec attention(const vec& x, const parameters& p, const std::string& name, int batch, int seq, int hidden, int heads, bool causal,
              const std::vector<int>& lengths) {
    const int t = batch * seq, dh = hidden / heads;
    const vec n = rms_norm(x, get(p, name, ".input_norm"), t, hidden);
    const vec qkv = matmul(n, get(p, name, ".qkv"), t, hidden, 3 * hidden);
    vec ctx(std::size_t(t) * hidden, 0.0);
    const double scale = 1.0 / std::sqrt(double(dh));
    for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
            for (int i = 0; i < seq; ++i) {
                const int visible = causal ? i + 1 : lengths[b];
                std::vector<double> w(visible);
                double mx = -1e300;
                for (int j = 0; j < visible; ++j) {
                    double s = 0;
                    for (int d = 0; d < dh; ++d)
                        s += qkv[std::size_t(b * seq + i) * 3 * hidden + h * dh + d] *
                             qkv[std::size_t(b * seq + j) * 3 * hidden + hidden + h * dh + d];
                    w[j] = s * scale;
                    mx = std::max(mx, w[j]);
                }
                double sum = 0;
                for (double& v : w) sum += (v = std::exp(v - mx));
                for (int j = 0; j < visible; ++j)
                    for (int d = 0; d < dh; ++d)
                        ctx[std::size_t(b * seq + i) * hidden + h * dh + d] +=
                            w[j] / sum * qkv[std::size_t(b * seq + j) * 3 * hidden + 2 * hidden + h * dh + d];
            }
    vec y = x;
    add_into(y, matmul(ctx, get(p, name, ".proj"), t, hidden, hidden));
    return y;
}

vec mlp(const vec& x, const parameters& p, const std::string& name, int t, int hidden, int ffn) {
    const vec n = rms_norm(x, get(p, name, ".pre_mlp_norm"), t, hidden);
    vec a = matmul(n, get(p, name, ".fc1"), t, hidden, ffn);
    for (double& v : a) v = gelu(v);
    vec y = x;
    add_into(y, matmul(a, get(p, name, ".fc2"), t, ffn, hidden));
    return y;
}

struct routing {
    std::vector<int> expert;   // [t*k]
    std::vector<double> gate;  // [t*k]
    std::vector<bool> kept;    // [t*k]
};

routing route(const vec& n, const parameters& p, const std::string& name, const gpt::model_config& c) {
    const int t = c.tokens(), e = c.experts, k = c.top_k;
    const vec logits = matmul(n, get(p, name, ".router"), t, c.hidden, e);
    routing r{std::vector<int>(std::size_t(t) * k), vec(std::size_t(t) * k), std::vector<bool>(std::size_t(t) * k)};
    for (int i = 0; i < t; ++i) {
        std::vector<bool> taken(e, false);
        vec chosen(k);
        for (int j = 0; j < k; ++j) {
            int best = -1;
            for (int x = 0; x < e; ++x)
                if (!taken[x] && (best < 0 || logits[std::size_t(i) * e + x] > logits[std::size_t(i) * e + best])) best = x;
            taken[best] = true;
            r.expert[std::size_t(i) * k + j] = best;
            chosen[j] = logits[std::size_t(i) * e + best];
        }
        double sum = 0;
        for (int j = 0; j < k; ++j) sum += std::exp(chosen[j] - chosen[0]);
        for (int j = 0; j < k; ++j) r.gate[std::size_t(i) * k + j] = std::exp(chosen[j] - chosen[0]) / sum;
    }
    // Capacity: each expert keeps its first `capacity` assignments in (token, choice) order.
    const int capacity = c.moe_mode == gpt::moe_mode::drop_and_pad ? c.expert_capacity() : t * k;
    std::vector<int> used(e, 0);
    for (std::size_t a = 0; a < r.expert.size(); ++a) r.kept[a] = used[r.expert[a]]++ < capacity;
    return r;
}

vec moe(const vec& x, const parameters& p, const std::string& name, const gpt::model_config& c) {
    const int t = c.tokens(), h = c.hidden, f = c.ffn_hidden, k = c.top_k;
    const vec n = rms_norm(x, get(p, name, ".pre_mlp_norm"), t, h);
    const routing r = route(n, p, name, c);
    const vec& w1 = get(p, name, ".experts.fc1");
    const vec& w2 = get(p, name, ".experts.fc2");
    vec y = x;
    for (int i = 0; i < t; ++i)
        for (int j = 0; j < k; ++j) {
            const std::size_t a = std::size_t(i) * k + j;
            if (!r.kept[a]) continue;
            const int e = r.expert[a];
            vec act(f, 0.0);
            for (int q = 0; q < f; ++q) {
                double s = 0;
                for (int d = 0; d < h; ++d) s += n[std::size_t(i) * h + d] * w1[(std::size_t(e) * h + d) * f + q];
                act[q] = gelu(s);
            }
            for (int d = 0; d < h; ++d) {
                double s = 0;
                for (int q = 0; q < f; ++q) s += act[q] * w2[(std::size_t(e) * f + q) * h + d];
                y[std::size_t(i) * h + d] += r.gate[a] * s;
            }
        }
    return y;
}

vec mamba(const vec& x, const parameters& p, const std::string& name, const gpt::model_config& c) {
    const int t = c.tokens(), h = c.hidden, d = c.inner();
    const vec n = rms_norm(x, get(p, name, ".norm"), t, h);
    const vec proj = matmul(n, get(p, name, ".in_proj"), t, h, 3 * d);
    vec mixed(std::size_t(t) * d);
    for (int b = 0; b < c.batch; ++b)
        for (int q = 0; q < d; ++q) {
            double state = 0;
            for (int s = 0; s < c.seq_len; ++s) {
                const std::size_t row = std::size_t(b) * c.seq_len + s;
                const double u = proj[row * 3 * d + q], z = proj[row * 3 * d + d + q], a = sigmoid(proj[row * 3 * d + 2 * d + q]);
                state = a * state + (1 - a) * u;
                mixed[row * d + q] = state * z * sigmoid(z);
            }
        }
    vec y = x;
    add_into(y, matmul(mixed, get(p, name, ".out_proj"), t, d, h));
    return y;
}

vec model_hidden(const gpt::model_config& c, const parameters& p, const std::vector<int>& tokens, int stop_before_layer,
                 bool before_moe_only = false) {
    const int t = c.tokens(), h = c.hidden;
    vec x(std::size_t(t) * h);
    const vec& tok = get(p, "embedding.tokens");
    const vec& pos = get(p, "embedding.positions");
    for (int i = 0; i < t; ++i)
        for (int d = 0; d < h; ++d)
            x[std::size_t(i) * h + d] = tok[std::size_t(tokens[i]) * h + d] + pos[std::size_t(i % c.seq_len) * h + d];
    for (int l = 0; l < int(c.layer_pattern.size()); ++l) {
        const std::string name = "layer" + std::to_string(l);
        const char kind = c.layer_pattern[l];
        if (kind == 'M') {
            if (l == stop_before_layer) return x;
            x = mamba(x, p, name, c);
            continue;
        }
        if (l == stop_before_layer && !before_moe_only) return x;
        x = attention(x, p, name, c.batch, c.seq_len, h, c.heads, true, {});
        if (l == stop_before_layer) return x;
        x = kind == 'D' ? mlp(x, p, name, t, h, c.ffn_hidden) : moe(x, p, name, c);
    }
    return x;
}

// MoE layer `moe_layer`'s routing of its input rows.
routing layer_routing(const gpt::model_config& c, const parameters& p, const std::vector<int>& tokens, int moe_layer) {
    const vec x = model_hidden(c, p, tokens, moe_layer, true);
    const std::string name = "layer" + std::to_string(moe_layer);
    return route(rms_norm(x, get(p, name, ".pre_mlp_norm"), c.tokens(), c.hidden), p, name, c);
}

} // namespace

double model_loss(const gpt::model_config& c, const parameters& p, const std::vector<int>& tokens, const std::vector<int>& labels) {
    const int t = c.tokens(), h = c.hidden, v = c.vocab;
    const vec x = model_hidden(c, p, tokens, -1);
    const vec n = rms_norm(x, get(p, "final_norm"), t, h);
    const vec logits = matmul(n, get(p, "lm_head"), t, h, v);
    double total = 0;
    int count = 0;
    for (int i = 0; i < t; ++i) {
        if (labels[i] < 0) continue;
        double mx = -1e300;
        for (int j = 0; j < v; ++j) mx = std::max(mx, logits[std::size_t(i) * v + j]);
        double sum = 0;
        for (int j = 0; j < v; ++j) sum += std::exp(logits[std::size_t(i) * v + j] - mx);
        total += std::log(sum) + mx - logits[std::size_t(i) * v + labels[i]];
        ++count;
    }
    return count ? total / count : 0.0;
}

std::vector<std::pair<std::string, std::size_t>> model_parameters(const gpt::model_config& c) {
    using sz = std::size_t;
    const sz h = sz(c.hidden), f = sz(c.ffn_hidden), e = sz(c.experts), d = sz(c.inner());
    std::vector<std::pair<std::string, std::size_t>> out{{"embedding.tokens", sz(c.vocab) * h}, {"embedding.positions", sz(c.seq_len) * h}};
    for (int l = 0; l < int(c.layer_pattern.size()); ++l) {
        const std::string name = "layer" + std::to_string(l);
        const char kind = c.layer_pattern[l];
        if (kind == 'M') {
            out.insert(out.end(), {{name + ".norm", h}, {name + ".in_proj", h * 3 * d}, {name + ".out_proj", d * h}});
            continue;
        }
        out.insert(out.end(), {{name + ".input_norm", h}, {name + ".qkv", h * 3 * h}, {name + ".proj", h * h}, {name + ".pre_mlp_norm", h}});
        if (kind == 'D')
            out.insert(out.end(), {{name + ".fc1", h * f}, {name + ".fc2", f * h}});
        else
            out.insert(out.end(), {{name + ".router", h * e}, {name + ".experts.fc1", e * h * f}, {name + ".experts.fc2", e * f * h}});
    }
    out.insert(out.end(), {{"final_norm", h}, {"lm_head", h * sz(c.vocab)}});
    return out;
}

std::vector<int> routing_map(const gpt::model_config& c, const parameters& p, const std::vector<int>& tokens, int moe_layer) {
    return layer_routing(c, p, tokens, moe_layer).expert;
}

int dropped_assignments(const gpt::model_config& c, const parameters& p, const std::vector<int>& tokens, int moe_layer) {
    const routing r = layer_routing(c, p, tokens, moe_layer);
    return int(std::count(r.kept.begin(), r.kept.end(), false));
}

std::vector<double> vision_forward(const gpt::vision_config& c, const parameters& p, const std::vector<double>& patches,
                                   const std::vector<int>& lengths) {
    const int t = c.tokens(), h = c.hidden;
    vec x = matmul(patches, get(p, "vision.patch_embed"), t, c.patch_dim, h);
    const vec& pos = get(p, "vision.positions");
    for (int i = 0; i < t; ++i)
        for (int d = 0; d < h; ++d) x[std::size_t(i) * h + d] += pos[std::size_t(i % c.padded_len) * h + d];
    for (int l = 0; l < c.layers; ++l) {
        const std::string name = "vision.layer" + std::to_string(l);
        x = attention(x, p, name, c.batch, c.padded_len, h, c.heads, false, lengths);
        x = mlp(x, p, name, t, h, c.ffn_hidden);
    }
    return rms_norm(x, get(p, "vision.final_norm"), t, h);
}

parameters finite_difference_gradients(const parameters& p, const std::function<double(const parameters&)>& f) {
    parameters work = p, grads;
    for (auto& [name, values] : work) {
        vec& g = grads[name];
        g.resize(values.size());
        for (std::size_t i = 0; i < values.size(); ++i) {
            const double keep = values[i];
            const double step = 1e-6 * std::max(1.0, std::abs(keep));
            values[i] = keep + step;
            const double up = f(work);
            values[i] = keep - step;
            const double down = f(work);
            values[i] = keep;
            g[i] = (up - down) / (2 * step);
        }
    }
    return grads;
}

} // namespace reference
