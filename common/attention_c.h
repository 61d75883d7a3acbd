/* The contract of common/attention.h as a plain C ABI: what each suite's shared library,
 * build/<STAGE>/libattention_<STAGE>.so, exports (common/stage.mk builds it with `make`), so
 * that C, Python (ctypes: common/stage_abi.py), the PyTorch package and the benchmark driver
 * call any stage without C++ and without PyTorch. Usable from C and from C++.
 *
 * Tensors are as in the C++ contract: contiguous row-major [batch, heads, len, head_dim] in
 * device memory, elements of the stage's type (`float` for the fp32 stages 00-04 and
 * cublas_fp32; the bits of `__nv_bfloat16` for the bf16 stages 05-11 and cublas_bf16: read
 * `dtype` of the capability record), aligned to the record's `alignment_bytes`; lse is
 * [batch, heads, len_q] FP32, 4-byte aligned. `stream` is a cudaStream_t (NULL: the legacy
 * default stream); the calls are asynchronous on it, as the C++ launchers are.
 *
 * Every function returns ATTENTION_C_OK or an error code, and never throws, prints, exits or
 * aborts. ATTENTION_C_INVALID_ARGUMENT: bad input (the shape, a pointer, the stage's limits),
 * refused before anything is launched or written. ATTENTION_C_RUNTIME_ERROR: a CUDA failure,
 * or a stage built for another GPU than the one present (08-12 need compute capability 9.0).
 * attention_c_last_error() then says which field, its value and what is allowed, or which
 * CUDA call failed and where.
 *
 * Several stages' libraries may be loaded into one process at once (each exports the same
 * names; load them with RTLD_LOCAL, as ctypes does, and look the names up per library):
 * each library binds its own code and exports nothing but these functions.
 */
#ifndef ATTENTION_C_H
#define ATTENTION_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct or a signature below changes: a loader that mirrors the structs
 * (common/stage_abi.py) checks it against attention_c_abi_version(). */
#define ATTENTION_C_ABI_VERSION 3

/* The problem. causal: 0 or 1 (top-left aligned, as PyTorch's is_causal: query i sees key j
 * iff j <= i). scale: 0 selects 1/sqrt(head_dim); otherwise positive and at most 2^16.
 * deterministic: 0 or 1 (AttentionShape::deterministic): 1 asks for bit-identical dQ, dK, dV
 * from run to run. Only the backward reads it: every forward is deterministic already and
 * accepts either value. A stage whose capabilities say deterministic_backward = 0 refuses 1 in
 * attention_c_backward and attention_c_backward_workspace_bytes (ATTENTION_C_INVALID_ARGUMENT,
 * "deterministic = true is not allowed"); a stage that has it may need more workspace for it.
 * Added in ABI version 2; zero-initialise the struct and 0 keeps version 1's behaviour. */
typedef struct {
    int batch, heads, len_q, len_kv, head_dim;
    int causal;
    float scale;
    int deterministic;
} AttentionCShape;

/* What the stage supports: StageCapabilities of common/attention.h. name: the suite's name
 * (its folder, e.g. "03_online_softmax", or "cublas_fp32"); dtype: "fp32" or "bf16";
 * head_dims[0 .. head_dim_count): the supported head dims; every len_q in [1, max_len_q] and
 * len_kv in [1, max_len_kv] is supported; causal, backward: 1 when supported;
 * compute_capability: 0 runs on every GPU the build targets, 90 only on compute capability 9.0;
 * deterministic_backward: 1 when the backward honours AttentionCShape.deterministic = 1 (since
 * ABI version 2; 0 for a stage without a backward); key_centre_backward: 1 when
 * attention_c_backward takes a key_centre (since ABI version 3; 0 for a stage without a backward).
 * Stage 01 sizes max_len_kv from the current device's shared memory at its first call. */
typedef struct {
    char name[64];
    char dtype[8];
    int head_dims[8];
    int head_dim_count;
    int max_len_q, max_len_kv;
    int causal, backward, alignment_bytes, compute_capability;
    int deterministic_backward;
    int key_centre_backward;
} AttentionCCapabilities;

enum {
    ATTENTION_C_OK = 0,
    ATTENTION_C_INVALID_ARGUMENT = 1, /* std::invalid_argument of the C++ contract */
    ATTENTION_C_RUNTIME_ERROR = 2     /* std::runtime_error (CUDA) or any other failure */
};

/* ATTENTION_C_ABI_VERSION of the header the library was built with. */
int attention_c_abi_version(void);

int attention_c_capabilities(AttentionCCapabilities* out);

/* Device memory the forward allocates (stream-ordered, inside the call) for a shape that the
 * stage accepts; a shape it refuses is ATTENTION_C_INVALID_ARGUMENT. */
int attention_c_workspace_bytes(const AttentionCShape* shape, size_t* bytes);

/* The same for the backward. A stage without a backward pass (capabilities.backward == 0)
 * answers ATTENTION_C_INVALID_ARGUMENT, "<stage> has no backward pass", and *bytes = 0:
 * an answer of 0 bytes would read as "a backward that needs no workspace". For the same
 * reason a shape with deterministic = 1 is refused, as attention_c_backward refuses it, by a
 * stage without a deterministic backward. */
int attention_c_backward_workspace_bytes(const AttentionCShape* shape, size_t* bytes);

/* O = softmax(scale * Q K^T (masked)) V, and lse (may be NULL). */
int attention_c_forward(const void* q, const void* k, const void* v, void* o, float* lse,
                        const AttentionCShape* shape, void* stream);

/* dQ, dK, dV from the forward's inputs, its o and lse, and dout. A stage without a backward
 * pass answers ATTENTION_C_INVALID_ARGUMENT, "<stage> has no backward pass"; with
 * shape->deterministic = 1, one without a deterministic backward answers it too (before the
 * pointers are looked at, as the C++ launcher's validate_backward does).
 * key_centre: NULL, or [batch * heads][head_dim] FP32 in device memory, aligned to
 * alignment_bytes: the c of the backward's centred dQ, dQ_i = scale (sum_j dS_ij K_j -
 * rowsum(dS)_i c), instead of the mean of the call's keys (attention_backward in
 * common/attention.h says why a caller that splits a row's keys over several calls passes one).
 * A stage whose capabilities say key_centre_backward = 0 refuses a non-NULL one, before the
 * other pointers are looked at ("key_centre = ... is not allowed"). Added in ABI version 3. */
int attention_c_backward(const void* q, const void* k, const void* v, const void* o,
                         const float* lse, const void* dout, void* dq, void* dk, void* dv,
                         const float* key_centre, const AttentionCShape* shape, void* stream);

/* The message of the calling thread's last failed call, "" after a successful one. Valid
 * until this thread's next call into this library. */
const char* attention_c_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_C_H */
