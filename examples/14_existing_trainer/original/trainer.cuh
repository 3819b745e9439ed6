// A plain CUDA trainer written loop-first: a stack of residual MLP blocks with RMS norms and a
// scalar regression head, fp32 throughout, everything on one global stream.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

// Launches are checked once per function: cudaGetLastError reports a failed launch until it is read.
#define CHECK_CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)
#define CHECK_CUBLAS(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__); exit(1); } } while (0)

// Every kernel and GEMM runs here; main() creates both and binds the handle to the stream.
extern cudaStream_t main_stream;
extern cublasHandle_t cublas;

struct shape {
    int layers = 4, width = 256, hidden = 1024, rows = 512, microbatches = 2;
    float lr = 0.003f;  // AdamW's peak learning rate: warmed up, then cosine
    int steps = 100;    // the cosine's length
};

// What the data loader picked for one microbatch of one step, on the host: a seed for the rows
// sampled from the pool, and how many of the microbatch's rows are examples (the rest is padding).
struct batch {
    unsigned seed;
    int examples;
};
batch next_batch(const shape& s, int step, int microbatch);

// Matrices are row-major; x is (rows x width), h and a are (rows x hidden).
struct layer {
    float *norm_w, *w1, *w2;        // (width), (hidden x width), (width x hidden)
    float *d_norm_w, *d_w1, *d_w2;  // gradients, accumulated over the microbatches of a step
    float *x, *xn, *rstd, *h, *a;   // kept for backward: block input, its norm (and 1/rms per row), pre/post GELU
};

struct model {
    shape s;
    std::vector<layer> layers;
    float *final_norm_w, *w_out, *d_final_norm_w, *d_w_out;  // (width) each
    float *x_out, *xn_out, *rstd_out;                        // last block's output and the final norm
    float *pred, *loss_rows, *loss;                          // (rows), (rows), (microbatches)
    float *pool_x, *pool_t;                                  // the data: (rows * microbatches) examples and targets
    std::vector<float*> targets;                             // per microbatch, sampled with its inputs: (rows)
    std::vector<float*> adam_m, adam_v;                      // AdamW's moments, per parameter tensor
    float *y, *dres, *dxn, *dh;                              // scratch: branch output, d residual, d norm out, d hidden
    std::vector<float*> allocations;                         // everything above, for model_free
};

void model_init(model* m, const shape& s, unsigned seed);
void model_free(model* m);
void forward(model* m, const batch& b, int microbatch);
void backward(model* m, const batch& b, int microbatch);
void zero_grads(model* m);
void update(model* m, int step, cudaStream_t stream);  // AdamW: the rate and bias corrections of `step`, by value
float read_loss(model* m);                      // mean over the step's microbatches
std::vector<float> read_parameters(model* m);  // all parameters, concatenated
