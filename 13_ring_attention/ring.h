// Ring attention: one sequence split across P GPUs. Each GPU keeps its queries; the key/value
// blocks travel one hop round the ring per step, so that after P steps every GPU has seen every
// block; stage 12's forward computes each (local queries, block in hand) pair with its
// log-sum-exp, and the merge rule of stage 03 (merge.h) combines the partial outputs exactly.
// The backward is stage 11's.
//
// This header holds what needs no GPU (the shardings, the calls each step makes, the FP64
// simulation of the whole ring) and the GPU ring itself (RingAttention, on NCCL), which
// attention.cu defines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attention.h"

// ---- sharding -------------------------------------------------------------------------------

// How the N tokens of the sequence are dealt to P GPUs.
//   contiguous: GPU r holds tokens [r N/P, (r+1) N/P): causal work grows with r.
//   zigzag:     the sequence cut into 2P chunks; GPU r holds chunk r and chunk 2P-1-r, one from
//               each end, so every GPU holds as much of the triangle as every other.
//   striped:    GPU r holds tokens r, r+P, r+2P, ...
// Where N does not divide, the first pieces get one token more.
enum class Sharding { contiguous, zigzag, striped };
const char* sharding_name(Sharding sharding);
// "contiguous", "zigzag" or "striped"; anything else throws std::invalid_argument.
Sharding parse_sharding(const std::string& name);

// A run of one GPU's tokens: global positions first, first + stride, ... (length of them).
struct Piece {
    int64_t first = 0;
    int64_t length = 0;
    int64_t stride = 1;
    int64_t position(int64_t i) const { return first + i * stride; }
};

// What one GPU holds: its pieces in order. In memory each piece is a tensor of its own,
// [batch, heads, length, head_dim], and the pieces lie one after another ("piece-major"), so
// that every piece is a contiguous tensor of the attention contract. With one piece (striped;
// contiguous up to kRingMaxPiece tokens per GPU) that is the plain [batch, heads, len, head_dim]
// layout; a contiguous run cut in pieces is that layout only when batch * heads = 1.
struct Shard {
    std::vector<Piece> pieces;
    int64_t length() const;             // tokens held
    int64_t offset(int piece) const;    // tokens in the pieces before `piece`
};

// The longest run of tokens a piece holds (contiguous and zigzag): a longer run is cut into
// ceil(length / max_piece) pieces of equal length (the first ones a token longer), one after the
// other in the piece-major layout, so that no call of the ring is longer than this many keys or
// queries. Stage 11 loses speed on long unmasked calls (its blocks' reuse of K/V in the L2
// cache): on H200s its non-causal forward ran 2-3% slower at 131,072 tokens than at 65,536 and
// 8% slower again at 262,144; with the cap the ring's non-causal rows at 262,144 tokens per GPU ran
// 7-10% faster (lab notes 13, "Pieces capped at the kernel's sweet spot"). Striped's piece is never cut:
// its calls are causal, whose rate holds at those lengths. max_piece = 0: no cap.
inline constexpr int64_t kRingMaxPiece = 65536;

// One Shard per GPU. Throws std::invalid_argument for len < 1, devices < 1 or max_piece < 0.
std::vector<Shard> make_shards(Sharding sharding, int64_t len, int devices, int64_t max_piece = kRingMaxPiece);

// The index maps: the global position of a GPU's local token, and back. locate() is written
// from the sharding's formula, not by search, so that the tests check one map against the other.
struct Location {
    int device;
    int64_t local;
};
int64_t global_position(const std::vector<Shard>& shards, int device, int64_t local);
Location locate(Sharding sharding, int64_t len, int devices, int64_t global);

// ---- the calls one step makes ---------------------------------------------------------------

// One call of the single-GPU forward (or backward): rows [query_begin, query_begin + query_count)
// of a local query piece against rows [key_begin, key_begin + key_count) of a piece of the block
// in hand, unmasked or causal (top-left aligned over the two ranges: query_begin + i sees
// key_begin + j iff j <= i, the stage contract's causal).
struct BlockCall {
    int query_piece = 0;
    int64_t query_begin = 0, query_count = 0;
    int key_piece = 0;
    int64_t key_begin = 0, key_count = 0;
    bool causal = false;
};

// Every call that covers the (query, key) pairs of `queries` x `keys` that attention keeps: all
// of them, or under the causal mask those with key position <= query position. Blocks entirely
// above the diagonal make no call; a piece against itself is one causal call; striped tokens of a
// later GPU are seen strictly below the diagonal, which is the causal call with the first query
// row dropped (the key piece stays whole: the mask hides a key past the last query row). Every
// call takes whole key pieces.
std::vector<BlockCall> block_calls(const Shard& queries, const Shard& keys, bool causal);

// The (query, key) pairs one call computes.
int64_t call_pairs(const BlockCall& call);

// The step at which GPU `device` holds the block of GPU `owner`: blocks move one hop
// (r -> r+1) per step, so at step t GPU r holds the block of GPU (r - t) mod P.
inline int block_owner(int device, int step, int devices) {
    return ((device - step) % devices + devices) % devices;
}

// work[step][device]: the pairs GPU `device` computes at `step`.
std::vector<std::vector<int64_t>> step_work(const std::vector<Shard>& shards, bool causal);

// ---- layouts and the FP64 simulation ---------------------------------------------------------

// [batch, heads, len, head_dim] (row_width = head_dim; 1 for lse [batch, heads, len]) -> one
// piece-major buffer per GPU, and back.
std::vector<std::vector<float>> shard_rows(const std::vector<float>& whole, const std::vector<Shard>& shards,
                                           int64_t batch_heads, int64_t len, int64_t row_width);
template <class T>
std::vector<T> unshard_rows(const std::vector<std::vector<T>>& local, const std::vector<Shard>& shards,
                            int64_t batch_heads, int64_t len, int64_t row_width);

// Where row `row` of piece `piece`, head `head`, starts in a piece-major buffer.
int64_t piece_row_offset(const Shard& shard, int piece, int64_t batch_heads, int64_t head,
                         int64_t row, int64_t row_width);

// The FP64 merge of a partial state into an accumulated one, rows of head_dim values.
void merge_rows(double* o_accumulated, double* lse_accumulated, const double* o_partial,
                const double* lse_partial, int64_t rows, int64_t head_dim);
// The same in FP32, as the CUDA kernel computes it (its arithmetic, on the host).
void merge_rows(float* o_accumulated, float* lse_accumulated, const float* o_partial,
                const float* lse_partial, int64_t rows, int64_t head_dim);

// The ring run on the host: P virtual GPUs, each with its own buffers in the piece-major
// layout; the key/value blocks (and in the backward their dK, dV) are handed from GPU to GPU
// step by step as NCCL would, and each call is computed by the FP64 reference. Inputs are the
// whole [batch, heads, len, head_dim] tensors; the results are gathered back to that layout.
struct RingResult {
    std::vector<double> o, lse;       // forward
    std::vector<double> dq, dk, dv;   // backward
};
// Forward: the reference per call, merged in FP64 (or, with fp32_merge, in FP32 on FP32
// accumulators, as the GPU does).
RingResult simulate_ring_forward(const AttentionShape& whole, Sharding sharding, int devices,
                                 const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, bool fp32_merge = false,
                                 int64_t max_piece = kRingMaxPiece);

// How the backward of one call finds delta_i = rowsum(dO_i * O_i): from the whole row's O (what
// the ring needs, and what stage 11 computes from the o it is given), or summed over the keys
// of the call alone (what stage 11's backward does when one key tile holds all of len_kv: right
// for a whole sequence, wrong for a ring's block; the tests show it).
enum class DeltaSource { whole_row, block_keys };

// How the backward of each call centres dQ. Stage 11 (and 07) compute
// dQ_i = scale (sum_j dS_ij K_j - rowsum(dS)_i c): with c the mean of the call's keys unless the
// caller gives one (attention_backward's key_centre), which is exact only when the call sees all
// of row i's keys, since only over a whole row is rowsum(dS) = 0. Summed over a ring's calls b,
// that dQ is off by scale sum_b rowsum_b(dS)_i c_b, zero only when every call's keys have the same
// mean.
//   none:       c = 0 (dQ = scale dS K): the exact gradient.
//   per_call:   c = the mean of the call's own keys (stage 11's default): wrong over a ring.
//   whole_keys: what the GPU ring does: every call given the same c, the mean of all keys of the
//               sequence (whole_key_means; the ring's key_centre). The sum is then
//               scale (dS K - rowsum(dS) c) over whole rows: stage 11's centred dQ on the whole
//               sequence.
enum class DqCentring { none, per_call, whole_keys };

// Backward: dQ stays on its GPU, dK and dV travel with their block and come home after the last
// step. o and lse are the forward's (the whole sequence's), in the whole layout.
RingResult simulate_ring_backward(const AttentionShape& whole, Sharding sharding, int devices,
                                  const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const std::vector<double>& o,
                                  const std::vector<double>& lse, const std::vector<float>& dout,
                                  DeltaSource delta = DeltaSource::whole_row,
                                  DqCentring centring = DqCentring::none,
                                  int64_t max_piece = kRingMaxPiece);

// The gradient of one call in FP64 against the whole row's softmax (lse) and delta: what each
// GPU adds into dQ (rows of the query piece) and into the travelling dK, dV (rows of the key
// piece). Tensors are [batch_heads, rows, head_dim] of the call's rows. ds_rowsum (unless null):
// sum_j scale dS_ij over the call's keys, per query row, what the centring multiplies.
void reference_block_backward(int64_t batch_heads, int64_t query_count, int64_t key_count,
                              int64_t head_dim, bool causal, double scale, const float* q,
                              const float* k, const float* v, const float* dout,
                              const double* lse, const double* delta, double* dq, double* dk,
                              double* dv, double* ds_rowsum = nullptr);

// ---- the mean of all keys, the ring's key centre ---------------------------------------------

// The column means of all the keys of the sequence, [batch * heads][head_dim], from each GPU's
// piece-major k: each GPU's column sums, added over the GPUs in order (what the GPU ring's NCCL
// all-reduce adds), divided by len. A GPU that holds no token adds zeros.
std::vector<double> whole_key_means(const std::vector<std::vector<float>>& k_local,
                                    const std::vector<Shard>& shards, int64_t batch_heads,
                                    int64_t head_dim, int64_t len);

// Test inputs whose keys' means differ from GPU to GPU, so that a centring by each call's own
// keys shows: k (whole layout) plus, on every key that GPU r holds, amplitude * s_r in even
// head-dim columns and -amplitude * s_r in odd ones, s = 1, -1, 1/2, -1/2, 3/2, -3/2, 1/4, -1/4
// (then again). The offset sums to zero over the columns, so a query with a common mean (the
// suite's inputs) does not single out one GPU's keys.
std::vector<float> offset_keys_by_gpu(const std::vector<float>& k, const AttentionShape& whole,
                                      Sharding sharding, int devices, float amplitude);

// ---- the GPU ring (attention.cu; needs NCCL and Hopper GPUs) --------------------------------

// Stage 11's backward sums delta over the block's own keys when one key tile (128 keys) holds
// all of len_kv (see DeltaSource): the ring refuses a backward whose calls have that few keys.
inline constexpr int64_t kRingMinimumBackwardKeys = 129;

// The keys of the smallest call of the ring for this shape: the backward needs at least
// kRingMinimumBackwardKeys.
int64_t smallest_call_keys(const AttentionShape& whole, Sharding sharding, int devices,
                           int64_t max_piece = kRingMaxPiece);

// The tensors of one ring call, one pointer per GPU each: {"q", {q on GPU 0, q on GPU 1, ...}}.
using RingTensors = std::vector<std::pair<const char*, std::vector<const void*>>>;

// Everything about a ring call that needs no GPU, checked before anything is launched: the
// whole shape (self-attention, len_q == len_kv, within stage 11's capabilities), one pointer per
// GPU for every tensor, not null unless that GPU holds no token, bf16 tensors aligned to stage 11's 16 bytes and FP32 ones
// (lse) to 4, and for the backward, calls of at least kRingMinimumBackwardKeys keys. Throws
// std::invalid_argument naming the field, its value and what is allowed.
void validate_ring(const AttentionShape& whole, Sharding sharding, int devices, const RingTensors& bf16_tensors,
                   const RingTensors& fp32_tensors, bool backward, int64_t max_piece = kRingMaxPiece);

#ifdef RING_HAVE_NCCL
struct RingDevices;

// One process, one host thread per GPU, one NCCL communicator per GPU (ncclCommInitAll).
// Tensors are per GPU, in device memory on that GPU, bf16 in the piece-major layout of its
// Shard, make_shards(sharding, N, P, max_piece) (lse: FP32, [pieces][batch, heads, length]); `whole` is the whole sequence's shape
// (len_q == len_kv == N, any batch, heads, head dim stage 11 supports, causal or not).
// The backward first computes the mean of all keys of the sequence (an NCCL all-reduce of the
// GPUs' column sums) and gives it to every call of stage 11's backward as its key_centre, so that
// the calls' centred dQ sum to the whole sequence's (attention.cu, `the key centre`). The keys,
// and the forward's lse, are as given.
// Every argument is checked before anything is launched (std::invalid_argument, nothing
// written); a CUDA or NCCL failure during the ring aborts the communicators, throws
// std::runtime_error, and leaves the object unusable (a new one starts afresh).
// Construction and destruction leave the calling thread's current GPU as they found it.
class RingAttention {
public:
    explicit RingAttention(const std::vector<int>& devices);
    ~RingAttention();
    RingAttention(const RingAttention&) = delete;
    RingAttention& operator=(const RingAttention&) = delete;

    int devices() const;

    void forward(const std::vector<const __nv_bfloat16*>& q, const std::vector<const __nv_bfloat16*>& k,
                 const std::vector<const __nv_bfloat16*>& v, const std::vector<__nv_bfloat16*>& o,
                 const std::vector<float*>& lse, const AttentionShape& whole, Sharding sharding,
                 int64_t max_piece = kRingMaxPiece);

    void backward(const std::vector<const __nv_bfloat16*>& q, const std::vector<const __nv_bfloat16*>& k,
                  const std::vector<const __nv_bfloat16*>& v, const std::vector<const __nv_bfloat16*>& o,
                  const std::vector<const float*>& lse, const std::vector<const __nv_bfloat16*>& dout,
                  const std::vector<__nv_bfloat16*>& dq, const std::vector<__nv_bfloat16*>& dk,
                  const std::vector<__nv_bfloat16*>& dv, const AttentionShape& whole,
                  Sharding sharding, int64_t max_piece = kRingMaxPiece);

private:
    std::unique_ptr<RingDevices> ring_;
};

// The NCCL version the ring was built and runs with ("2.28.9 (built with 2.28.9)").
std::string ring_nccl_version();

// The forward of every call the ring makes: stage 12's persistent forward, the course's fastest,
// which returns the log-sum-exp the merge needs. Stage 12 has no backward, so the ring takes the
// backward from stage 11, whose object it links; the two stages define the same C++ names, so
// stage 12 comes through its C ABI (common/attention_c.h): build/12_persistent/
// libattention_12_persistent.so, linked with the ring, which exports the C names alone. The
// arguments are attention_forward's; an error comes back as std::invalid_argument (a shape or
// pointer stage 12 refuses) or std::runtime_error (CUDA), with the library's message.
void fastest_forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o,
                     float* lse, const AttentionShape& shape, cudaStream_t stream = nullptr);
#endif
