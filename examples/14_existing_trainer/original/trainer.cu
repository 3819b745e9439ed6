#include "trainer.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

cudaStream_t main_stream;
cublasHandle_t cublas;

namespace {

constexpr int BLOCK = 256;
constexpr float EPS = 1e-5f;

unsigned blocks(size_t n) { return unsigned((n + BLOCK - 1) / BLOCK); }

// A fixed tree over a fixed block size: the same additions in the same order on every run.
__device__ float block_sum(float v) {
    __shared__ float buf[BLOCK];
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();  // buf is reused by the next call
    return r;
}

// One block per row: xn = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
__device__ void norm_row(float* xn, float* rstd, const float* x, const float* w, int C) {
    const size_t row = size_t(blockIdx.x) * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += BLOCK) ss += x[row + c] * x[row + c];
    const float rs = rsqrtf(block_sum(ss) / C + EPS);
    for (int c = threadIdx.x; c < C; c += BLOCK) xn[row + c] = x[row + c] * rs * w[c];
    if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

// The data: row r of a microbatch is pool row hash(seed, r), or zeros past the batch's examples.
__global__ void sample_rows(float* x, float* target, const float* pool_x, const float* pool_t, int pool_rows, unsigned seed,
                            int examples, int C) {
    const int r = blockIdx.x;
    const size_t row = size_t(r) * C, from = size_t((seed ^ (unsigned(r) * 0x9E3779B9u)) * 0x85EBCA6Bu % unsigned(pool_rows)) * C;
    for (int c = threadIdx.x; c < C; c += BLOCK) x[row + c] = r < examples ? pool_x[from + c] : 0.f;
    if (threadIdx.x == 0) target[r] = r < examples ? pool_t[from / C] : 0.f;
}

__global__ void rmsnorm_fwd(float* xn, float* rstd, const float* x, const float* w, int C) { norm_row(xn, rstd, x, w, C); }

// Block l's residual add fused with block l+1's norm (llm.c style): one pass over the new row.
__global__ void residual_rmsnorm_fwd(float* x_next, float* xn_next, float* rstd_next, const float* x, const float* y,
                                     const float* w_next, int C) {
    const size_t row = size_t(blockIdx.x) * C;
    for (int c = threadIdx.x; c < C; c += BLOCK) x_next[row + c] = x[row + c] + y[row + c];
    norm_row(xn_next, rstd_next, x_next, w_next, C);  // each thread rereads only what it wrote
}

// dx += rstd * (g*w - xhat * mean(g*w*xhat)); dx already holds the gradient through the residual path.
__global__ void rmsnorm_bwd(float* dx, const float* dxn, const float* x, const float* w, const float* rstd, int C) {
    const size_t row = size_t(blockIdx.x) * C;
    const float rs = rstd[blockIdx.x];
    float dot = 0.f;
    for (int c = threadIdx.x; c < C; c += BLOCK) dot += dxn[row + c] * w[c] * x[row + c] * rs;
    const float mean = block_sum(dot) / C;
    for (int c = threadIdx.x; c < C; c += BLOCK) dx[row + c] += rs * (dxn[row + c] * w[c] - x[row + c] * rs * mean);
}

// One thread per column, rows summed in order: deterministic without atomics.
__global__ void norm_wgrad(float* dw, const float* dxn, const float* x, const float* rstd, int R, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.f;
    for (int r = 0; r < R; ++r) acc += dxn[size_t(r) * C + c] * x[size_t(r) * C + c] * rstd[r];
    dw[c] += acc;
}

__device__ float gelu(float x) { return 0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }
__device__ float gelu_grad(float x) {
    const float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.7978845608f * (1.f + 3.f * 0.044715f * x * x);
}
__global__ void gelu_fwd(float* a, const float* h, size_t n) {
    const size_t i = size_t(blockIdx.x) * BLOCK + threadIdx.x;
    if (i < n) a[i] = gelu(h[i]);
}
__global__ void gelu_bwd(float* dh, const float* h, size_t n) {  // in place: da in, dh out
    const size_t i = size_t(blockIdx.x) * BLOCK + threadIdx.x;
    if (i < n) dh[i] *= gelu_grad(h[i]);
}

// One block per example row (padding has no loss): pred = xn . w_out, loss_row = (pred - target)^2.
__global__ void head_loss(float* pred, float* loss_rows, const float* xn, const float* w_out, const float* target, int C) {
    const size_t row = size_t(blockIdx.x) * C;
    float dot = 0.f;
    for (int c = threadIdx.x; c < C; c += BLOCK) dot += xn[row + c] * w_out[c];
    const float p = block_sum(dot);
    if (threadIdx.x == 0) {
        pred[blockIdx.x] = p;
        loss_rows[blockIdx.x] = (p - target[blockIdx.x]) * (p - target[blockIdx.x]);
    }
}
__global__ void mean_rows(float* out, const float* v, int n) {  // one block
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK) s += v[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *out = s / n;
}
// d pred = scale * (pred - target) for the examples, 0 for the padding; dxn = d pred * w_out.
__global__ void head_bwd(float* dxn, const float* pred, const float* target, const float* w_out, float scale, int examples, int R, int C) {
    const size_t i = size_t(blockIdx.x) * BLOCK + threadIdx.x;
    if (i < size_t(R) * C) dxn[i] = i / C < size_t(examples) ? scale * (pred[i / C] - target[i / C]) * w_out[i % C] : 0.f;
}
// Over the example rows (R of them) only.
__global__ void head_wgrad(float* dw_out, const float* pred, const float* target, const float* xn, float scale, int R, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.f;
    for (int r = 0; r < R; ++r) acc += (pred[r] - target[r]) * xn[size_t(r) * C + c];
    dw_out[c] += scale * acc;
}

// AdamW (decoupled weight decay 0.01): the learning rate and both bias corrections come by value.
__global__ void adamw(float* w, const float* g, float* m, float* v, float lr, float bc1, float bc2, size_t n) {
    const size_t i = size_t(blockIdx.x) * BLOCK + threadIdx.x;
    if (i >= n) return;
    m[i] = 0.9f * m[i] + 0.1f * g[i];
    v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
    w[i] -= lr * ((m[i] / bc1) / (sqrtf(v[i] / bc2) + 1e-8f) + 0.01f * w[i]);
}

// Row-major C (M x N) = op(A) (M x K) * op(B) (K x N) + beta * C. cuBLAS is column-major, where a
// row-major matrix reads as its transpose, so it computes C^T = op(B)^T op(A)^T instead.
void matmul(float* C, const float* A, const float* B, int M, int N, int K, bool ta, bool tb, float beta) {
    const float one = 1.f;
    CHECK_CUBLAS(cublasSgemm(cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &one, B,
                             tb ? K : N, A, ta ? M : K, &beta, C, N));
}

// Where block l's fused kernel writes: block l+1's input and norm, or after the last block the final norm.
struct norm_site {
    float *x, *xn, *rstd, *w, *dw;
};
norm_site next_norm(model* m, int l) {
    if (l + 1 < m->s.layers) {
        layer& n = m->layers[size_t(l) + 1];
        return {n.x, n.xn, n.rstd, n.norm_w, n.d_norm_w};
    }
    return {m->x_out, m->xn_out, m->rstd_out, m->final_norm_w, m->d_final_norm_w};
}

struct tensor {
    float *w, *g;
    size_t n;
};
std::vector<tensor> parameters(model* m) {
    const size_t C = size_t(m->s.width), H = size_t(m->s.hidden);
    std::vector<tensor> t;
    for (layer& l : m->layers) t.insert(t.end(), {{l.norm_w, l.d_norm_w, C}, {l.w1, l.d_w1, H * C}, {l.w2, l.d_w2, C * H}});
    t.insert(t.end(), {{m->final_norm_w, m->d_final_norm_w, C}, {m->w_out, m->d_w_out, C}});
    return t;
}

// Deterministic uniform in [-scale, scale] (splitmix64 of seed, tensor id and index): no RNG state.
std::vector<float> uniform(size_t n, float scale, unsigned seed, unsigned id) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        uint64_t z = (uint64_t(seed) << 32 | id) * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        v[i] = scale * (float(z >> 40) / float(1 << 24) * 2.f - 1.f);
    }
    return v;
}

float* alloc(model* m, size_t n) {
    float* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(float)));
    m->allocations.push_back(p);
    return p;
}
float* upload(model* m, const std::vector<float>& v) {
    float* p = alloc(m, v.size());
    CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return p;
}

}  // namespace

batch next_batch(const shape& s, int step, int microbatch) {
    uint64_t z = uint64_t(step) * 0x9E3779B97F4A7C15ull + uint64_t(microbatch + 1) * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    const unsigned seed = unsigned(z >> 32);
    return {seed, s.rows - int(seed % unsigned(s.rows / 4 + 1))};  // at least three quarters of the rows are examples
}

void model_init(model* m, const shape& s, unsigned seed) {
    m->s = s;
    const size_t C = size_t(s.width), H = size_t(s.hidden), R = size_t(s.rows);
    unsigned id = 0;
    // Half the usual 1/sqrt(fan_in) bound: lr 0.05 then sits well inside the stable range.
    auto bound = [](size_t fan_in) { return 0.5f / std::sqrt(float(fan_in)); };
    m->layers.resize(size_t(s.layers));
    for (layer& l : m->layers) {
        l.norm_w = upload(m, std::vector<float>(C, 1.f));
        l.w1 = upload(m, uniform(H * C, bound(C), seed, id++));
        l.w2 = upload(m, uniform(C * H, bound(H), seed, id++));
        l.d_norm_w = alloc(m, C), l.d_w1 = alloc(m, H * C), l.d_w2 = alloc(m, C * H);
        l.x = alloc(m, R * C), l.xn = alloc(m, R * C), l.rstd = alloc(m, R), l.h = alloc(m, R * H), l.a = alloc(m, R * H);
    }
    m->final_norm_w = upload(m, std::vector<float>(C, 1.f));
    m->w_out = upload(m, uniform(C, bound(C), seed, id++));
    m->d_final_norm_w = alloc(m, C), m->d_w_out = alloc(m, C);
    m->x_out = alloc(m, R * C), m->xn_out = alloc(m, R * C), m->rstd_out = alloc(m, R);
    m->pred = alloc(m, R), m->loss_rows = alloc(m, R), m->loss = alloc(m, size_t(s.microbatches));
    m->y = alloc(m, R * C), m->dres = alloc(m, R * C), m->dxn = alloc(m, R * C), m->dh = alloc(m, R * H);
    // The data: a pool of uniform inputs, targets from a fixed random linear teacher.
    const std::vector<float> teacher = uniform(C, 1.f / std::sqrt(float(C)), seed, id++);
    const size_t P = R * size_t(s.microbatches);
    const std::vector<float> in = uniform(P * C, 1.f, seed, id++);
    std::vector<float> t(P, 0.f);
    for (size_t r = 0; r < P; ++r)
        for (size_t c = 0; c < C; ++c) t[r] += in[r * C + c] * teacher[c];
    m->pool_x = upload(m, in), m->pool_t = upload(m, t);
    for (int mb = 0; mb < s.microbatches; ++mb) m->targets.push_back(alloc(m, R));
    for (const tensor& t : parameters(m)) {
        m->adam_m.push_back(upload(m, std::vector<float>(t.n, 0.f)));
        m->adam_v.push_back(upload(m, std::vector<float>(t.n, 0.f)));
    }
}

void model_free(model* m) {
    for (float* p : m->allocations) CHECK_CUDA(cudaFree(p));
    m->allocations.clear();
}

void forward(model* m, const batch& b, int mb) {
    const shape& s = m->s;
    const size_t RH = size_t(s.rows) * s.hidden;
    // Input: x_0 and block 0's norm (every later norm is fused into the previous block's residual add).
    layer& first = m->layers[0];
    sample_rows<<<s.rows, BLOCK, 0, main_stream>>>(first.x, m->targets[size_t(mb)], m->pool_x, m->pool_t, s.rows * s.microbatches,
                                                   b.seed, b.examples, s.width);
    rmsnorm_fwd<<<s.rows, BLOCK, 0, main_stream>>>(first.xn, first.rstd, first.x, first.norm_w, s.width);
    for (int l = 0; l < s.layers; ++l) {
        layer& L = m->layers[size_t(l)];
        const norm_site next = next_norm(m, l);
        matmul(L.h, L.xn, L.w1, s.rows, s.hidden, s.width, false, true, 0.f);  // h = xn W1^T
        gelu_fwd<<<blocks(RH), BLOCK, 0, main_stream>>>(L.a, L.h, RH);
        matmul(m->y, L.a, L.w2, s.rows, s.width, s.hidden, false, true, 0.f);  // y = a W2^T
        residual_rmsnorm_fwd<<<s.rows, BLOCK, 0, main_stream>>>(next.x, next.xn, next.rstd, L.x, m->y, next.w, s.width);
    }
    // Head: one prediction per example, and this microbatch's mean squared error over its examples.
    head_loss<<<b.examples, BLOCK, 0, main_stream>>>(m->pred, m->loss_rows, m->xn_out, m->w_out, m->targets[size_t(mb)], s.width);
    mean_rows<<<1, BLOCK, 0, main_stream>>>(m->loss + mb, m->loss_rows, b.examples);
    CHECK_CUDA(cudaGetLastError());
}

void backward(model* m, const batch& b, int mb) {
    const shape& s = m->s;
    const size_t RC = size_t(s.rows) * s.width, RH = size_t(s.rows) * s.hidden;
    // Head: the step's loss is the mean over microbatches of each one's mean over its examples.
    const float scale = 2.f / (float(b.examples) * float(s.microbatches));
    const float* target = m->targets[size_t(mb)];
    head_bwd<<<blocks(RC), BLOCK, 0, main_stream>>>(m->dxn, m->pred, target, m->w_out, scale, b.examples, s.rows, s.width);
    head_wgrad<<<blocks(size_t(s.width)), BLOCK, 0, main_stream>>>(m->d_w_out, m->pred, target, m->xn_out, scale, b.examples, s.width);
    CHECK_CUDA(cudaMemsetAsync(m->dres, 0, RC * sizeof(float), main_stream));  // x_out feeds only the final norm
    for (int l = s.layers - 1; l >= 0; --l) {
        layer& L = m->layers[size_t(l)];
        const norm_site next = next_norm(m, l);
        // The fused kernel's norm: dres becomes d x_{l+1}, which is also d y (the residual branch).
        rmsnorm_bwd<<<s.rows, BLOCK, 0, main_stream>>>(m->dres, m->dxn, next.x, next.w, next.rstd, s.width);
        norm_wgrad<<<blocks(size_t(s.width)), BLOCK, 0, main_stream>>>(next.dw, m->dxn, next.x, next.rstd, s.rows, s.width);
        matmul(L.d_w2, m->dres, L.a, s.width, s.hidden, s.rows, true, false, 1.f);  // dW2 += dy^T a
        matmul(m->dh, m->dres, L.w2, s.rows, s.hidden, s.width, false, false, 0.f);  // da = dy W2
        gelu_bwd<<<blocks(RH), BLOCK, 0, main_stream>>>(m->dh, L.h, RH);
        matmul(L.d_w1, m->dh, L.xn, s.hidden, s.width, s.rows, true, false, 1.f);  // dW1 += dh^T xn
        matmul(m->dxn, m->dh, L.w1, s.rows, s.width, s.hidden, false, false, 0.f);  // dxn = dh W1
    }
    // Input: block 0's norm. Its input is data, so only the weight gradient.
    layer& first = m->layers[0];
    norm_wgrad<<<blocks(size_t(s.width)), BLOCK, 0, main_stream>>>(first.d_norm_w, m->dxn, first.x, first.rstd, s.rows, s.width);
    CHECK_CUDA(cudaGetLastError());
}

void zero_grads(model* m) {
    for (const tensor& t : parameters(m)) CHECK_CUDA(cudaMemsetAsync(t.g, 0, t.n * sizeof(float), main_stream));
}

void update(model* m, int step, cudaStream_t stream) {
    // A linear warmup over 5 steps, then a cosine over the run; the bias corrections of step + 1.
    const float t = float(step + 1), lr = m->s.lr * std::min(1.f, t / 5.f) * (0.5f + 0.5f * std::cos(3.14159265f * float(step) / float(m->s.steps)));
    const float bc1 = 1.f - std::pow(0.9f, t), bc2 = 1.f - std::pow(0.999f, t);
    const std::vector<tensor> ts = parameters(m);
    for (size_t i = 0; i < ts.size(); ++i)
        adamw<<<blocks(ts[i].n), BLOCK, 0, stream>>>(ts[i].w, ts[i].g, m->adam_m[i], m->adam_v[i], lr, bc1, bc2, ts[i].n);
    CHECK_CUDA(cudaGetLastError());
}

float read_loss(model* m) {
    std::vector<float> loss(size_t(m->s.microbatches));
    CHECK_CUDA(cudaMemcpy(loss.data(), m->loss, loss.size() * sizeof(float), cudaMemcpyDeviceToHost));
    float sum = 0.f;
    for (float v : loss) sum += v;
    return sum / float(loss.size());
}

std::vector<float> read_parameters(model* m) {
    std::vector<float> all;
    for (const tensor& t : parameters(m)) {
        const size_t at = all.size();
        all.resize(at + t.n);
        CHECK_CUDA(cudaMemcpy(all.data() + at, t.w, t.n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return all;
}
