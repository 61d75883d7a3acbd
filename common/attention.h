// The contract every stage implements. Declared once here; each stage's attention.cu defines
// the launcher for its element type plus its capability record and workspace size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

// Tensors are contiguous row-major [batch, heads, len, head_dim], as PyTorch's
// scaled_dot_product_attention takes them, in device memory (cudaMalloc or managed); lse is
// [batch, heads, len_q] in FP32. Alignment: q, k, v, o (and dout, dq, dk, dv) to the stage's
// alignment_bytes, lse to 4 bytes (alignof(float)). Outputs (o, lse; dq, dk, dv) must not
// overlap an input or each other; inputs may overlap each other.
struct AttentionShape {
    int batch = 1;
    int heads = 1;
    int len_q = 1;
    int len_kv = 1;
    int head_dim = 64;
    bool causal = false;  // top-left aligned, as PyTorch's is_causal: query i sees key j iff j <= i
    float scale = 0.0f;   // 0 selects the default, 1/sqrt(head_dim); at most 2^16 (validate.h)
    // Bit-identical results from run to run, at some cost in speed. Every forward already is
    // (each output element is summed by one block in a fixed order), so the forward accepts it
    // and changes nothing. The backward sums dQ over blocks in device memory: a stage whose
    // capabilities say deterministic_backward then adds in a fixed order; any other backward
    // refuses the shape (std::invalid_argument). A field of the shape, not a flag of the
    // launcher, because the backward's workspace depends on it and
    // attention_backward_workspace_bytes sees only the shape.
    bool deterministic = false;

    float softmax_scale() const;
    int64_t q_elements() const { return int64_t(batch) * heads * len_q * head_dim; }
    int64_t kv_elements() const { return int64_t(batch) * heads * len_kv * head_dim; }
    int64_t lse_elements() const { return int64_t(batch) * heads * len_q; }
    // Number of (query, key) pairs that are not masked, summed over batch and heads.
    int64_t attended_pairs() const;
    std::string to_string() const;
};

AttentionShape make_shape(int batch, int heads, int len_q, int len_kv, int head_dim,
                          bool causal = false, float scale = 0.0f);

// What a stage supports, published in one place that the tests, the benchmark and the
// validation all read.
struct StageCapabilities {
    std::string name;            // folder name, e.g. "03_online_softmax"
    std::string dtype;           // "fp32" or "bf16"
    std::vector<int> head_dims;  // supported head dims
    int max_len_q = 0;           // every len_q in [1, max_len_q] is supported
    int max_len_kv = 0;          // every len_kv in [1, max_len_kv] is supported
    bool causal = true;
    bool backward = false;
    int alignment_bytes = 4;     // q, k, v, o (and dout, dq, dk, dv) must be aligned to this
    // 0: runs on every GPU the build targets (compute capability 8.0 and newer). 90: the
    // kernels use Hopper-only instructions (wgmma, setmaxnreg; built for sm_90a alone) and run
    // only on a GPU of compute capability 9.0.
    int compute_capability = 0;
    // The backward honours AttentionShape::deterministic (bit-identical dQ, dK, dV run to run);
    // without it, a backward with deterministic = true is refused by validate_backward.
    bool deterministic_backward = false;
    // The backward takes a key_centre (attention_backward's last argument): the c of its
    // centred dQ given by the caller instead of the mean of the call's keys. Without it, a
    // backward given a key_centre is refused by validate_backward.
    bool key_centre_backward = false;
};

// ---- defined by every stage -------------------------------------------------------------
// May ask the current device (stage 01 sizes its limit from the opt-in shared memory).
const StageCapabilities& stage_capabilities();
// Device memory the forward launcher allocates for this shape (0 for the fused stages).
size_t attention_workspace_bytes(const AttentionShape& shape);

// Exactly one of the two is defined by a stage, for its element type. lse may be null.
// Throws std::invalid_argument on bad input before anything is launched or written, and
// std::runtime_error on a CUDA failure. Never prints, exits or aborts.
void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                       const AttentionShape& shape, cudaStream_t stream = 0);
void attention_forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                       __nv_bfloat16* o, float* lse, const AttentionShape& shape,
                       cudaStream_t stream = 0);

// Defined by stages whose capabilities say backward (07). lse is the forward's output.
// The backwards of 07 and 11 return a centred dQ: dQ_i = scale (sum_j dS_ij K_j - rowsum(dS)_i c),
// the same as scale dS K in exact arithmetic when the call sees all of row i's keys (then
// rowsum(dS)_i = 0), but with K's common part kept from multiplying the rounding error of
// delta = rowsum(dO * O) through the bf16 O. c is the mean of the call's keys unless key_centre
// is given: [batch * heads][head_dim] FP32 in device memory, aligned as the tensors, read as c.
// A caller that splits a row's keys over several calls and sums their dQ (ring attention, stage
// 13) passes every call the same c, the mean of all the keys: the sum is then the centred dQ of
// the whole row, where each call's own mean would leave it off by scale sum_b rowsum_b(dS)_i c_b.
// Only a stage whose capabilities say key_centre_backward takes one; the others refuse it.
void attention_backward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                        const __nv_bfloat16* o, const float* lse, const __nv_bfloat16* dout,
                        __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                        const AttentionShape& shape, cudaStream_t stream = 0,
                        const float* key_centre = nullptr);
size_t attention_backward_workspace_bytes(const AttentionShape& shape);
