// Stage 13: ring attention. The sequence is split across P GPUs; each GPU
// keeps its queries and, step by step, computes them against the key/value block in hand with
// stage 12's forward (its output and log-sum-exp), merges that partial result into an FP32
// accumulator by the rule of stage 03 (merge.h), and meanwhile passes the block one hop round
// the ring with NCCL on a second stream. The backward walks the same ring with stage 11's
// backward: dQ is summed where it lives, dK and dV travel with their block and come home.
// Before the backward, each GPU computes the mean of all keys of the sequence (an NCCL all-reduce
// of each GPU's column sums) and gives it to every call of stage 11's backward as the centre of
// its centred dQ: a call's own keys' mean is right only for a call that sees all of a row's keys
// (see `the key centre` below).
//
// Neither stage's kernels are copied here: stage 11's object (build/11_hopper_backward/obj/
// attention.o) is linked, and this file calls its C++ contract's attention_backward; stage 12's
// forward comes through its C ABI library (fastest_forward, below), because the two stages'
// C++ names are the same.
// One process drives every GPU: one host thread each (made with the ring, kept for its life),
// one NCCL communicator each (ncclCommInitAll).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "attention.h"
#include "c_shape.h"
#include "cuda_check.h"
#include "merge.h"
#include "ring.h"
#include "workspace.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "13_ring_attention needs NCCL 2.18 or newer (common/fetch_nccl.sh fetches 2.28.9)"
#endif

using bf16 = __nv_bfloat16;

namespace {

// ---- kernels: the merge, and moving rows between a piece and a call's contiguous tensors ----

constexpr int THREADS = 256;

unsigned grid_for(int64_t threads) {
    return unsigned(std::max<int64_t>(1, std::min<int64_t>((threads + THREADS - 1) / THREADS, 1 << 20)));
}

// At most this many partial results in one merge: zigzag's piece against the block's two
// pieces. A step with more calls on one query piece (pieces cut at kRingMaxPiece) merges them
// in batches of this many.
constexpr int MAX_PARTIALS = 2;

// One call's result for rows [row_begin, row_begin + rows) of a query piece: O [batch_heads,
// rows, D] in bf16, as stage 12 writes it, and its log-sum-exp [batch_heads, rows].
struct Partial {
    const bf16* o;
    const float* lse;
    int64_t row_begin, rows;
};
struct Partials {
    Partial part[MAX_PARTIALS];
    int count;
};

// A lane's COLUMNS consecutive columns of a row, each tensor in one access: FP32 in 16 bytes
// (COLUMNS = 4, D = 128) or 8 (COLUMNS = 2, D = 64), bf16 in half that.
template <int COLUMNS>
struct LaneColumns;
template <>
struct LaneColumns<4> {
    using Fp32 = float4;
    using Bf16 = uint2;
};
template <>
struct LaneColumns<2> {
    using Fp32 = float2;
    using Bf16 = unsigned;
};

template <int COLUMNS>
__device__ void load_columns(float (&to)[COLUMNS], const float* from) {
    const auto packed = *reinterpret_cast<const typename LaneColumns<COLUMNS>::Fp32*>(from);
    memcpy(to, &packed, sizeof packed);
}
template <int COLUMNS>
__device__ void store_columns(float* to, const float (&from)[COLUMNS]) {
    typename LaneColumns<COLUMNS>::Fp32 packed;
    memcpy(&packed, from, sizeof packed);
    *reinterpret_cast<typename LaneColumns<COLUMNS>::Fp32*>(to) = packed;
}
template <int COLUMNS>
__device__ void store_columns(bf16* to, const float (&from)[COLUMNS]) {
    __nv_bfloat162 pairs[COLUMNS / 2];
#pragma unroll
    for (int c = 0; c < COLUMNS / 2; ++c) pairs[c] = __floats2bfloat162_rn(from[2 * c], from[2 * c + 1]);
    typename LaneColumns<COLUMNS>::Bf16 packed;
    memcpy(&packed, pairs, sizeof packed);
    *reinterpret_cast<typename LaneColumns<COLUMNS>::Bf16*>(to) = packed;
}

// One warp per row of a query piece ([batch_heads][piece_rows] rows), each lane on COLUMNS
// consecutive columns (head_dim = 32 COLUMNS): the state merged so far (none yet when `fresh`)
// and each partial result of one step that covers the row, folded in the calls' order, in
// registers. Every load of the row is issued before the first weight is computed, so that their
// latencies overlap (the kernel is memory bound). The state goes back to the FP32 accumulator,
// or, at the piece's last merge (o_out not null), out as the ring's result: O in bf16 and the LSE.
template <int COLUMNS>
__global__ void merge_piece_kernel(float* __restrict__ o_acc, float* __restrict__ lse_acc, Partials partials,
                                   bool fresh, bf16* __restrict__ o_out, float* __restrict__ lse_out,
                                   int64_t batch_heads, int64_t piece_rows) {
    constexpr int head_dim = 32 * COLUMNS;
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
    for (int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; warp < batch_heads * piece_rows;
         warp += warps) {
        const int64_t head = warp / piece_rows, row = warp % piece_rows;
        // excerpt: merge-kernel
        // The loads: the state so far, then each covering partial's LSE and columns.
        float lse = -INFINITY, o[COLUMNS] = {};
        if (!fresh) {
            lse = lse_acc[warp];
            load_columns(o, o_acc + warp * head_dim + lane * COLUMNS);
        }
        float part_lse[MAX_PARTIALS];
        typename LaneColumns<COLUMNS>::Bf16 part_o[MAX_PARTIALS] = {};
#pragma unroll
        for (int p = 0; p < MAX_PARTIALS; ++p) {
            const Partial& part = partials.part[p];
            part_lse[p] = -INFINITY;  // a partial that does not cover the row weighs nothing (weight 0)
            if (p >= partials.count || row < part.row_begin || row >= part.row_begin + part.rows) continue;
            const int64_t i = head * part.rows + row - part.row_begin;
            part_lse[p] = part.lse[i];
            part_o[p] = *reinterpret_cast<const typename LaneColumns<COLUMNS>::Bf16*>(part.o + i * head_dim +
                                                                                      lane * COLUMNS);
        }
        // An accumulator that no key reached (LSE = -inf) may hold anything: it starts from zero.
#pragma unroll
        for (int c = 0; c < COLUMNS; ++c)
            if (lse == -INFINITY) o[c] = 0.0f;
        // The folds, in the calls' order. A zero weight multiplies nothing (a partial that does
        // not cover the row has weight 0 and leaves the state as it was, to the bit).
#pragma unroll
        for (int p = 0; p < MAX_PARTIALS; ++p) {
            const MergeWeights<float> w = merge_weights(lse, part_lse[p]);
            __nv_bfloat162 pairs[COLUMNS / 2];
            memcpy(pairs, &part_o[p], sizeof pairs);
#pragma unroll
            for (int c = 0; c < COLUMNS; ++c) {
                const float value = c % 2 == 0 ? __low2float(pairs[c / 2]) : __high2float(pairs[c / 2]);
                o[c] = (w.accumulated != 0.0f ? w.accumulated * o[c] : 0.0f) +
                       (w.partial != 0.0f ? w.partial * value : 0.0f);
            }
            lse = w.lse;
        }
        // end excerpt
        __syncwarp();  // every lane has read lse_acc[warp] before lane 0 writes it
        if (o_out != nullptr) {
            store_columns(o_out + warp * head_dim + lane * COLUMNS, o);
            if (lane == 0) lse_out[warp] = lse;
        } else {
            store_columns(o_acc + warp * head_dim + lane * COLUMNS, o);
            if (lane == 0) lse_acc[warp] = lse;
        }
    }
}

// dst[h][i] = src[h][begin + i], rows of `width` elements, for i < count: a call's rows of a
// piece as a contiguous tensor of the contract.
template <class T>
__global__ void gather_rows_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t batch_heads,
                                   int64_t src_rows, int64_t begin, int64_t count, int64_t width) {
    const int64_t per_head = count * width, total = batch_heads * per_head;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
        dst[e] = src[(e / per_head) * src_rows * width + begin * width + e % per_head];
}

// acc[h][begin + i] += part[h][i] in FP32: a call's dQ (or dK, dV) into the piece's sum. Memory
// bound, on the compute stream between the attention calls: eight elements a thread (one 16-byte
// load of bf16, two of FP32), heads along the grid's y. Rows of head_dim elements (64 or 128) and
// tensors aligned to 16 bytes (validate_ring) keep every access whole.
__global__ void add_rows_kernel(float* __restrict__ acc, const bf16* __restrict__ part, int64_t batch_heads,
                                int64_t acc_rows, int64_t begin, int64_t count, int64_t width) {
    const int64_t per_head = count * width, step = int64_t(gridDim.x) * blockDim.x * 8;
    for (int64_t h = blockIdx.y; h < batch_heads; h += gridDim.y) {
        float* a = acc + (h * acc_rows + begin) * width;
        const bf16* p = part + h * per_head;
        for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8; e < per_head; e += step) {
            const uint4 packed = *reinterpret_cast<const uint4*>(p + e);
            const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
            float4* out = reinterpret_cast<float4*>(a + e);
            float4 lo = out[0], hi = out[1];
            const float2 p0 = __bfloat1622float2(pairs[0]), p1 = __bfloat1622float2(pairs[1]),
                         p2 = __bfloat1622float2(pairs[2]), p3 = __bfloat1622float2(pairs[3]);
            lo.x += p0.x, lo.y += p0.y, lo.z += p1.x, lo.w += p1.y;
            hi.x += p2.x, hi.y += p2.y, hi.z += p3.x, hi.w += p3.y;
            out[0] = lo, out[1] = hi;
        }
    }
}

// ---- the key centre ------------------------------------------------------------------------
// Stage 11's backward returns dQ_i = scale (sum_j dS_ij K_j - rowsum(dS)_i c), c the mean of the
// call's keys unless the caller gives one (attention_backward's key_centre). Exact for a call that
// sees all of row i's keys (rowsum(dS)_i = 0 over a whole row); a ring's block b would be off by
// scale rowsum_b(dS)_i c_b, and the blocks' errors do not cancel unless their keys have the same
// mean. So the ring computes one c, the mean of all keys of the sequence, and gives it to every
// call: the sum over the blocks is then stage 11's centred dQ over the whole sequence, on the
// keys as given (lab notes 13).

// Column sums of one piece's keys, [batch_heads][rows][head_dim], in chunks of CHUNK_ROWS rows:
// partials[head][first_chunk + chunk][d] (one block per (head, chunk), one thread per column).
constexpr int CHUNK_ROWS = 512;

__global__ void key_column_partials_kernel(float* __restrict__ partials, const bf16* __restrict__ k,
                                           int64_t batch_heads, int64_t rows, int head_dim,
                                           int64_t chunks, int64_t first_chunk, int64_t total_chunks) {
    const int64_t head = int64_t(blockIdx.x) / chunks, chunk = int64_t(blockIdx.x) % chunks;
    const int d = threadIdx.x;
    if (head >= batch_heads || d >= head_dim) return;
    const int64_t begin = chunk * CHUNK_ROWS, end = begin + CHUNK_ROWS < rows ? begin + CHUNK_ROWS : rows;
    const bf16* column = k + head * rows * head_dim + d;
    float sum = 0.0f;
    for (int64_t row = begin; row < end; ++row) sum += __bfloat162float(column[row * head_dim]);
    partials[(head * total_chunks + first_chunk + chunk) * head_dim + d] = sum;
}

// sums[head][d] = the partials of every chunk, added in order (the same bits every run).
__global__ void fold_key_sums_kernel(float* __restrict__ sums, const float* __restrict__ partials,
                                     int64_t batch_heads, int64_t total_chunks, int head_dim) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < batch_heads * head_dim;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t head = i / head_dim, d = i % head_dim;
        float sum = 0.0f;
        for (int64_t chunk = 0; chunk < total_chunks; ++chunk)
            sum += partials[(head * total_chunks + chunk) * head_dim + d];
        sums[i] = sum;
    }
}

__global__ void scale_kernel(float* __restrict__ data, float factor, int64_t count) {
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x)
        data[e] *= factor;
}

// dst = src rounded to bf16, eight elements a thread (counts of whole rows of 64 or 128).
__global__ void to_bf16_kernel(bf16* __restrict__ dst, const float* __restrict__ src, int64_t count) {
    for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8; e < count;
         e += int64_t(gridDim.x) * blockDim.x * 8) {
        const float4 lo = *reinterpret_cast<const float4*>(src + e), hi = *reinterpret_cast<const float4*>(src + e + 4);
        const __nv_bfloat162 pairs[4] = {__floats2bfloat162_rn(lo.x, lo.y), __floats2bfloat162_rn(lo.z, lo.w),
                                         __floats2bfloat162_rn(hi.x, hi.y), __floats2bfloat162_rn(hi.z, hi.w)};
        *reinterpret_cast<uint4*>(dst + e) = *reinterpret_cast<const uint4*>(pairs);
    }
}

template <class T>
void gather_rows(T* dst, const T* src, int64_t batch_heads, int64_t src_rows, int64_t begin,
                 int64_t count, int64_t width, cudaStream_t stream) {
    gather_rows_kernel<<<grid_for(batch_heads * count * width), THREADS, 0, stream>>>(
        dst, src, batch_heads, src_rows, begin, count, width);
    CUDA_CHECK_LAUNCH();
}

// The eight-element kernels' terms, which validate_ring's alignment and head dims guarantee.
void check_eights(const void* a, const void* b, int64_t elements) {
    if (reinterpret_cast<uintptr_t>(a) % 16 != 0 || reinterpret_cast<uintptr_t>(b) % 16 != 0 || elements % 8 != 0)
        throw std::logic_error("ring attention: rows of a multiple of 8 elements at 16-byte aligned addresses expected");
}

void add_rows(float* acc, const bf16* part, int64_t batch_heads, int64_t acc_rows, int64_t begin,
              int64_t count, int64_t width, cudaStream_t stream) {
    if (batch_heads * count * width == 0) return;
    check_eights(acc + begin * width, part, width);
    const unsigned heads = unsigned(std::min<int64_t>(batch_heads, 65535));
    const unsigned blocks = std::min(grid_for(count * width / 8), std::max(1u, 4096u / heads));  // ~4096 in all
    add_rows_kernel<<<dim3(blocks, heads), THREADS, 0, stream>>>(acc, part, batch_heads, acc_rows, begin, count, width);
    CUDA_CHECK_LAUNCH();
}

void to_bf16(bf16* dst, const float* src, int64_t count, cudaStream_t stream) {
    if (count == 0) return;
    check_eights(dst, src, count);
    to_bf16_kernel<<<grid_for(count / 8), THREADS, 0, stream>>>(dst, src, count);
    CUDA_CHECK_LAUNCH();
}

// One merge of a query piece (merge_piece_kernel): into the accumulator, or out as the result.
void merge_piece(float* o_acc, float* lse_acc, const Partials& partials, bool fresh, bf16* o_out, float* lse_out,
                 int64_t batch_heads, int64_t piece_rows, int64_t head_dim, cudaStream_t stream) {
    if (batch_heads * piece_rows == 0) return;
    const unsigned blocks = grid_for(batch_heads * piece_rows * 32);
    if (head_dim == 128)
        merge_piece_kernel<4><<<blocks, THREADS, 0, stream>>>(o_acc, lse_acc, partials, fresh, o_out, lse_out,
                                                              batch_heads, piece_rows);
    else if (head_dim == 64)
        merge_piece_kernel<2><<<blocks, THREADS, 0, stream>>>(o_acc, lse_acc, partials, fresh, o_out, lse_out,
                                                              batch_heads, piece_rows);
    else
        throw std::logic_error("ring attention: the merge takes head dims of 64 and 128");
    CUDA_CHECK_LAUNCH();
}

// ---- NCCL -------------------------------------------------------------------------------------

void nccl_check(ncclResult_t result, ncclComm_t comm, const char* expression, const char* file, int line) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    std::string message = std::string("NCCL error '") + ncclGetErrorString(result) + "' at " + file + ":" +
                          std::to_string(line) + " (" + expression + ")";
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    if (last && *last) message += ": " + std::string(last);
    throw std::runtime_error(message);
}
#define NCCL_CHECK(expression, comm) nccl_check((expression), (comm), #expression, __FILE__, __LINE__)

// Events without timing, freed with their owner.
class Events {
public:
    explicit Events(size_t count) : events_(count, nullptr) {
        for (cudaEvent_t& event : events_) CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    ~Events() {
        for (cudaEvent_t event : events_)
            if (event) cudaEventDestroy(event);
    }
    Events(const Events&) = delete;
    Events& operator=(const Events&) = delete;
    cudaEvent_t operator[](size_t i) const { return events_.at(i); }

private:
    std::vector<cudaEvent_t> events_;
};

}  // namespace

// ---- the ring's GPUs --------------------------------------------------------------------------

// One host thread per GPU for the ring's life: made with the ring, each sets its GPU once and
// then waits for work, so that no call pays for starting threads (under CUPTI's trace a thread
// made per call started its GPU's work 5 to 12 ms late, most of it the tracer's own cost: lab
// notes 13, "Where a ring call's time went").
class Workers {
public:
    explicit Workers(const std::vector<int>& devices) : errors_(devices.size()) {
        for (size_t r = 0; r < devices.size(); ++r) threads_.emplace_back([this, r, id = devices[r]] { serve(int(r), id); });
    }
    ~Workers() {
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        work_ready_.notify_all();
        for (std::thread& thread : threads_) thread.join();
    }
    Workers(const Workers&) = delete;
    Workers& operator=(const Workers&) = delete;

    // Runs job(r) on every GPU's thread and waits for all of them; the failures, per GPU.
    std::vector<std::exception_ptr> run(const std::function<void(int)>& job) {
        std::unique_lock<std::mutex> lock(mutex_);
        job_ = &job;
        pending_ = threads_.size();
        std::fill(errors_.begin(), errors_.end(), nullptr);
        ++generation_;
        work_ready_.notify_all();
        work_done_.wait(lock, [&] { return pending_ == 0; });
        job_ = nullptr;
        return errors_;
    }

private:
    void serve(int r, int device) {
        uint64_t seen = 0;
        for (;;) {
            const std::function<void(int)>* job = nullptr;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                work_ready_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_;
                job = job_;
            }
            std::exception_ptr error;
            try {
                CUDA_CHECK(cudaSetDevice(device));
                (*job)(r);
            } catch (...) {
                error = std::current_exception();
            }
            const std::lock_guard<std::mutex> lock(mutex_);
            errors_[size_t(r)] = error;
            if (--pending_ == 0) work_done_.notify_all();
        }
    }

    std::mutex mutex_;
    std::condition_variable work_ready_, work_done_;
    const std::function<void(int)>* job_ = nullptr;
    uint64_t generation_ = 0;
    size_t pending_ = 0;
    bool stop_ = false;
    std::vector<std::exception_ptr> errors_;
    std::vector<std::thread> threads_;
};

struct RingDevices {
    struct Device {
        int id = 0;
        ncclComm_t comm = nullptr;
        cudaStream_t compute = nullptr;  // stage 11's kernels, the merges
        cudaStream_t comm_stream = nullptr;  // NCCL, at the highest priority, so that its few
                                             // blocks get SMs while the attention grid is resident
    };
    std::vector<Device> devices;
    std::unique_ptr<Workers> workers;  // one host thread per GPU
    std::atomic<bool> failed{false};  // a worker has thrown: the others stop waiting
    bool broken = false;              // the communicators were aborted

    // Runs work(r) on every GPU's thread, waits for them, and rethrows the first failure, after
    // aborting the communicators so that no GPU waits for a peer.
    template <class Work>
    void run_on_every_gpu(Work work) {
        if (broken)
            throw std::runtime_error("ring attention: an earlier call failed and aborted the communicators; "
                                     "make a new RingAttention");
        failed = false;
        const std::vector<std::exception_ptr> errors = workers->run([&](int r) {
            try {
                work(r);
            } catch (...) {
                failed = true;
                throw;
            }
        });
        for (const std::exception_ptr& error : errors)
            if (error) {
                for (Device& device : devices) ncclCommAbort(device.comm);
                broken = true;
                std::rethrow_exception(error);
            }
    }

    // Waits for a stream without blocking forever when another GPU's worker has failed (its
    // peers' transfers would then never complete).
    void wait(cudaStream_t stream) const {
        for (;;) {
            const cudaError_t status = cudaStreamQuery(stream);
            if (status == cudaSuccess) return;
            if (status != cudaErrorNotReady) CUDA_CHECK(status);
            if (failed) throw std::runtime_error("ring attention: stopped because another GPU's worker failed");
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
};

namespace {

// What one GPU's worker needs to know of the whole ring.
struct RingPlan {
    AttentionShape whole;
    std::vector<Shard> shards;
    int64_t batch_heads = 0, head_dim = 0;
    int devices = 0;

    int64_t largest_piece = 0;  // rows of the longest piece of any GPU
    size_t most_calls = 0;      // calls of the busiest step

    RingPlan(const AttentionShape& shape, Sharding sharding, int gpus, int64_t max_piece)
        : whole(shape), shards(make_shards(sharding, shape.len_q, gpus, max_piece)),
          batch_heads(int64_t(shape.batch) * shape.heads), head_dim(shape.head_dim), devices(gpus) {
        for (const Shard& shard : shards)
            for (const Piece& piece : shard.pieces) largest_piece = std::max(largest_piece, piece.length);
        for (int r = 0; r < devices; ++r)
            for (int step = 0; step < devices; ++step) {
                const std::vector<BlockCall> step_calls = calls(r, step);
                most_calls = std::max(most_calls, step_calls.size());
                // Every call takes whole key pieces (block_calls): the block in hand is the
                // calls' K and V as it is, never a copy.
                for (const BlockCall& call : step_calls)
                    if (call.key_begin != 0 || call.key_count != piece_rows(block_owner(r, step, devices), call.key_piece))
                        throw std::logic_error("ring attention: a call takes part of a key piece");
            }
    }

    int next(int r) const { return (r + 1) % devices; }
    int previous(int r) const { return (r + devices - 1) % devices; }
    // Elements of one [pieces][batch, heads, length, head_dim] tensor of GPU r.
    int64_t elements(int r) const { return batch_heads * shards[size_t(r)].length() * head_dim; }
    int64_t largest_shard() const {
        int64_t largest = 0;
        for (const Shard& shard : shards) largest = std::max(largest, shard.length());
        return largest;
    }
    // Where piece p of GPU r's tensor starts, in elements of rows `width` wide.
    int64_t piece_start(int r, int piece, int64_t width) const {
        return batch_heads * shards[size_t(r)].offset(piece) * width;
    }
    int64_t piece_rows(int r, int piece) const { return shards[size_t(r)].pieces[size_t(piece)].length; }
    // Chunks of CHUNK_ROWS keys of GPU r, per head (its key column sums are added chunk by chunk).
    int64_t key_chunks(int r) const {
        int64_t chunks = 0;
        for (const Piece& piece : shards[size_t(r)].pieces) chunks += (piece.length + CHUNK_ROWS - 1) / CHUNK_ROWS;
        return chunks;
    }
    std::vector<BlockCall> calls(int r, int step) const {
        return block_calls(shards[size_t(r)], shards[size_t(block_owner(r, step, devices))], whole.causal);
    }
    // The rows of a query piece of GPU r that its calls take as a slice, copied (striped's
    // shifted rows, the same at every step that has them; piece -1: none). One at most.
    struct Slice {
        int piece = -1;
        int64_t begin = 0, count = 0;
    };
    Slice query_slice(int r) const {
        Slice slice;
        for (int step = 0; step < devices; ++step)
            for (const BlockCall& call : calls(r, step)) {
                if (batch_heads == 1 || call.query_count == piece_rows(r, call.query_piece)) continue;
                if (slice.piece >= 0 && (slice.piece != call.query_piece || slice.begin != call.query_begin ||
                                         slice.count != call.query_count))
                    throw std::logic_error("ring attention: the calls take one slice of query rows at most");
                slice = {call.query_piece, call.query_begin, call.query_count};
            }
        // Step 0 (the GPU's own block) takes whole pieces: the slice is copied while it computes.
        if (slice.piece >= 0 && devices == 1) throw std::logic_error("ring attention: a slice of query rows with one GPU");
        return slice;
    }
    AttentionShape call_shape(const BlockCall& call) const {
        return make_shape(whole.batch, whole.heads, int(call.query_count), int(call.key_count),
                          whole.head_dim, call.causal, whole.softmax_scale());
    }
};

// Byte offsets into one workspace, each region 256-byte aligned.
struct Regions {
    size_t total = 0;
    size_t add(size_t bytes) {
        const size_t at = total;
        total += (bytes + 255) / 256 * 256;
        return at;
    }
};

// A travelling key/value block: the GPU's own k, v at step 0, then one of two buffers.
struct Block {
    const bf16* k;
    const bf16* v;
};

// One NCCL group: K and V of the block in hand to the next GPU, the next block from the previous.
// A GPU that holds no token (a sequence shorter than the pieces) sends and receives nothing;
// both ends of a transfer compute the same count, so they skip it together.
void pass_block(const RingPlan& plan, const RingDevices::Device& device, int r, Block send, int send_owner,
                bf16* receive_k, bf16* receive_v, int receive_owner) {
    const size_t send_count = size_t(plan.elements(send_owner)), receive_count = size_t(plan.elements(receive_owner));
    const int next = plan.next(r), previous = plan.previous(r);
    // excerpt: pass-block
    NCCL_CHECK(ncclGroupStart(), device.comm);
    if (send_count > 0) {
        NCCL_CHECK(ncclSend(send.k, send_count, ncclBfloat16, next, device.comm, device.comm_stream), device.comm);
        NCCL_CHECK(ncclSend(send.v, send_count, ncclBfloat16, next, device.comm, device.comm_stream), device.comm);
    }
    if (receive_count > 0) {
        NCCL_CHECK(ncclRecv(receive_k, receive_count, ncclBfloat16, previous, device.comm, device.comm_stream), device.comm);
        NCCL_CHECK(ncclRecv(receive_v, receive_count, ncclBfloat16, previous, device.comm, device.comm_stream), device.comm);
    }
    NCCL_CHECK(ncclGroupEnd(), device.comm);
    // end excerpt
}

// The mean of all keys of the sequence (`the key centre`), computed on GPU r: its column sums
// (chunk partials folded in order), added over the GPUs by an NCCL all-reduce on the NCCL stream,
// divided by the length: `mean` ([batch_heads][head_dim], FP32, the same bits on every GPU).
// `partials`: key_chunks(r) * batch_heads * head_dim floats. Every GPU takes part in the
// all-reduce, one that holds no token with sums of zero.
void key_centre(const RingPlan& plan, const RingDevices::Device& device, int r, const bf16* k, float* partials,
                float* mean, const Events& events) {
    const int64_t BH = plan.batch_heads, D = plan.head_dim, total_chunks = plan.key_chunks(r);
    const cudaStream_t compute = device.compute;
    const Shard& shard = plan.shards[size_t(r)];
    int64_t first = 0;
    for (int p = 0; p < int(shard.pieces.size()); ++p) {
        const int64_t rows = plan.piece_rows(r, p), chunks = (rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
        if (chunks == 0) continue;
        key_column_partials_kernel<<<unsigned(BH * chunks), unsigned(D), 0, compute>>>(
            partials, k + plan.piece_start(r, p, D), BH, rows, int(D), chunks, first, total_chunks);
        CUDA_CHECK_LAUNCH();
        first += chunks;
    }
    fold_key_sums_kernel<<<grid_for(BH * D), THREADS, 0, compute>>>(mean, partials, BH, total_chunks, int(D));
    CUDA_CHECK_LAUNCH();
    if (plan.devices > 1) {
        CUDA_CHECK(cudaEventRecord(events[0], compute));
        CUDA_CHECK(cudaStreamWaitEvent(device.comm_stream, events[0], 0));
        NCCL_CHECK(ncclAllReduce(mean, mean, size_t(BH * D), ncclFloat32, ncclSum, device.comm, device.comm_stream),
                   device.comm);
        CUDA_CHECK(cudaEventRecord(events[1], device.comm_stream));
        CUDA_CHECK(cudaStreamWaitEvent(compute, events[1], 0));
    }
    scale_kernel<<<grid_for(BH * D), THREADS, 0, compute>>>(mean, 1.0f / float(plan.whole.len_q), BH * D);
    CUDA_CHECK_LAUNCH();
}

// Each GPU's tensors must live on that GPU: a pointer to another GPU's memory would make every
// kernel read across NVLink (or fail), and NCCL would move the wrong GPU's memory.
void check_residence(const RingDevices& ring, const RingTensors& tensors) {
    for (const auto& [field, pointers] : tensors)
        for (size_t r = 0; r < pointers.size(); ++r) {
            if (pointers[r] == nullptr) continue;  // a GPU that holds no token (validate_ring)
            cudaPointerAttributes attributes{};
            CUDA_CHECK(cudaPointerGetAttributes(&attributes, pointers[r]));
            if (attributes.type != cudaMemoryTypeDevice || attributes.device != ring.devices[r].id)
                throw std::invalid_argument(
                    "ring attention: " + std::string(field) + "[" + std::to_string(r) + "] is not allowed: it must be "
                    "device memory of GPU " + std::to_string(ring.devices[r].id) + " (the ring's GPU " +
                    std::to_string(r) + "), and it is " +
                    (attributes.type == cudaMemoryTypeDevice ? "on GPU " + std::to_string(attributes.device)
                                                              : std::string("not device memory")));
        }
}

// The caller's current GPU, given back when the guard goes: setting up and tearing down the ring
// makes each of its GPUs current in turn, and the caller's next cudaMalloc must not land on
// whichever came last (the first 2-GPU run's bad-arguments case allocated on GPU 1 after an
// earlier ring's destructor).
class CallerDevice {
public:
    CallerDevice() {
        if (cudaGetDevice(&device_) != cudaSuccess) {
            cudaGetLastError();
            device_ = -1;
        }
    }
    ~CallerDevice() {
        if (device_ >= 0) cudaSetDevice(device_);
    }
    CallerDevice(const CallerDevice&) = delete;
    CallerDevice& operator=(const CallerDevice&) = delete;

private:
    int device_ = -1;
};

}  // namespace

// ---- RingAttention ------------------------------------------------------------------------------

RingAttention::RingAttention(const std::vector<int>& devices) : ring_(std::make_unique<RingDevices>()) {
    if (devices.empty())
        throw std::invalid_argument("ring attention: devices = {} is not allowed: name at least one GPU");
    const CallerDevice caller;  // given back at the end, or on a throw: setting up every GPU changes it
    int visible = 0;
    CUDA_CHECK(cudaGetDeviceCount(&visible));
    for (size_t i = 0; i < devices.size(); ++i) {
        if (devices[i] < 0 || devices[i] >= visible)
            throw std::invalid_argument("ring attention: device " + std::to_string(devices[i]) +
                                        " is not allowed: " + std::to_string(visible) + " GPU(s) are visible");
        if (std::count(devices.begin(), devices.end(), devices[i]) > 1)
            throw std::invalid_argument("ring attention: device " + std::to_string(devices[i]) +
                                        " is named twice: each GPU of the ring holds one shard");
        cudaDeviceProp properties{};
        CUDA_CHECK(cudaGetDeviceProperties(&properties, devices[i]));
        if (properties.major * 10 + properties.minor != stage_capabilities().compute_capability)
            throw std::runtime_error("ring attention: GPU " + std::to_string(devices[i]) + " (" + properties.name +
                                     ") is not a Hopper GPU (sm_90): stage 11's kernels run on nothing else");
    }
    // NVLink multicast (NVLS) stays off whatever the environment says: the ring needs none of it,
    // and on shared machines a program that uses it can take the GPUs out of service.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
    ring_->devices.resize(devices.size());
    std::vector<ncclComm_t> comms(devices.size());
    NCCL_CHECK(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()), nullptr);
    for (size_t r = 0; r < devices.size(); ++r) {
        RingDevices::Device& device = ring_->devices[r];
        device.id = devices[r];
        device.comm = comms[r];
        CUDA_CHECK(cudaSetDevice(device.id));
        int least = 0, greatest = 0;
        CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        CUDA_CHECK(cudaStreamCreateWithFlags(&device.compute, cudaStreamNonBlocking));
        CUDA_CHECK(cudaStreamCreateWithPriority(&device.comm_stream, cudaStreamNonBlocking, greatest));
    }
    ring_->workers = std::make_unique<Workers>(devices);
    // One small exchange round the ring now, so that NCCL connects the neighbours here and not
    // inside the first timed (or failing) call.
    if (devices.size() > 1)
        ring_->run_on_every_gpu([&](int r) {
            RingDevices::Device& device = ring_->devices[size_t(r)];
            const int P = int(ring_->devices.size());
            Workspace buffer(2 * sizeof(float), device.comm_stream);
            float* data = buffer.as<float>();
            CUDA_CHECK(cudaMemsetAsync(data, 0, 2 * sizeof(float), device.comm_stream));
            NCCL_CHECK(ncclGroupStart(), device.comm);
            NCCL_CHECK(ncclSend(data, 1, ncclFloat32, (r + 1) % P, device.comm, device.comm_stream), device.comm);
            NCCL_CHECK(ncclRecv(data + 1, 1, ncclFloat32, (r + P - 1) % P, device.comm, device.comm_stream), device.comm);
            NCCL_CHECK(ncclGroupEnd(), device.comm);
            // And one all-reduce, which every backward makes first (the key sums), so that NCCL sets
            // up its collective here too.
            NCCL_CHECK(ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, device.comm, device.comm_stream), device.comm);
            ring_->wait(device.comm_stream);
        });
}

RingAttention::~RingAttention() {
    const CallerDevice caller;  // each GPU is made current below; the caller's is given back
    for (RingDevices::Device& device : ring_->devices) {
        cudaSetDevice(device.id);
        // Aborted communicators are freed already, and work that waited on them may never end.
        if (ring_->broken) continue;
        if (device.compute) cudaStreamSynchronize(device.compute);
        if (device.comm_stream) cudaStreamSynchronize(device.comm_stream);
        if (device.comm) ncclCommDestroy(device.comm);
        if (device.compute) cudaStreamDestroy(device.compute);
        if (device.comm_stream) cudaStreamDestroy(device.comm_stream);
    }
}

int RingAttention::devices() const { return int(ring_->devices.size()); }

std::string ring_nccl_version() {
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version), nullptr);
    auto text = [](int code) {
        // NCCL_VERSION's encoding: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after.
        const int major = code >= 10000 ? code / 10000 : code / 1000;
        const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
        return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
    };
    return text(version) + " (built with " + text(NCCL_VERSION_CODE) + ")";
}

// excerpt: fastest-forward
void fastest_forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const AttentionShape& shape,
                     cudaStream_t stream) {
    const AttentionCShape c_shape = to_c_shape(shape);
    const int status = attention_c_forward(q, k, v, o, lse, &c_shape, stream);
    if (status == ATTENTION_C_OK) return;
    const std::string message = std::string("stage 12's forward: ") + attention_c_last_error();
    if (status == ATTENTION_C_INVALID_ARGUMENT) throw std::invalid_argument(message);
    throw std::runtime_error(message);
}
// end excerpt

void RingAttention::forward(const std::vector<const bf16*>& q, const std::vector<const bf16*>& k,
                            const std::vector<const bf16*>& v, const std::vector<bf16*>& o,
                            const std::vector<float*>& lse, const AttentionShape& whole, Sharding sharding,
                            int64_t max_piece) {
    const int P = devices();
    const RingTensors bf16_tensors{{"q", {q.begin(), q.end()}}, {"k", {k.begin(), k.end()}},
                                   {"v", {v.begin(), v.end()}}, {"o", {o.begin(), o.end()}}};
    const RingTensors fp32_tensors{{"lse", {lse.begin(), lse.end()}}};
    validate_ring(whole, sharding, P, bf16_tensors, fp32_tensors, /*backward=*/false, max_piece);
    check_residence(*ring_, bf16_tensors);
    check_residence(*ring_, fp32_tensors);
    const RingPlan plan(whole, sharding, P, max_piece);
    const int64_t BH = plan.batch_heads, D = plan.head_dim;

    ring_->run_on_every_gpu([&](int r) {
        const RingDevices::Device& device = ring_->devices[size_t(r)];
        const cudaStream_t compute = device.compute, comm = device.comm_stream;
        const Shard& mine = plan.shards[size_t(r)];
        const int pieces = int(mine.pieces.size());
        const int64_t rows = mine.length(), largest = plan.largest_shard();

        // Per query piece, the last step with a call for it: its merge there writes the result.
        // And the most calls one query piece has in one step: the partial results to hold.
        std::vector<int> last_step(size_t(pieces), -1);
        int most_partials = 0;
        for (int step = 0; step < P; ++step) {
            std::vector<int> per_piece(size_t(pieces), 0);
            for (const BlockCall& call : plan.calls(r, step)) {
                last_step[size_t(call.query_piece)] = step;
                most_partials = std::max(most_partials, ++per_piece[size_t(call.query_piece)]);
            }
        }
        const RingPlan::Slice slice = plan.query_slice(r);

        // Two block buffers (K then V), the FP32 accumulators, the partial results of a step's
        // calls on one query piece, and the copied query rows.
        Regions regions;
        const size_t block_at[2] = {regions.add(2 * BH * largest * D * sizeof(bf16)),
                                    regions.add(2 * BH * largest * D * sizeof(bf16))};
        const size_t o_at = regions.add(BH * rows * D * sizeof(float));
        const size_t lse_at = regions.add(BH * rows * sizeof(float));
        const int64_t piece = plan.largest_piece;
        std::vector<size_t> o_part_at(static_cast<size_t>(most_partials)), lse_part_at(o_part_at.size());
        for (size_t p = 0; p < size_t(most_partials); ++p) {
            o_part_at[p] = regions.add(BH * piece * D * sizeof(bf16));
            lse_part_at[p] = regions.add(BH * piece * sizeof(float));
        }
        const size_t q_rows_at = regions.add(BH * slice.count * D * sizeof(bf16));
        // Per query piece, a partial result held over to the piece's next merge (`held`).
        std::vector<size_t> held_o_at(static_cast<size_t>(pieces)), held_lse_at(held_o_at.size());
        for (size_t p = 0; p < size_t(pieces); ++p) {
            held_o_at[p] = regions.add(BH * plan.piece_rows(r, int(p)) * D * sizeof(bf16));
            held_lse_at[p] = regions.add(BH * plan.piece_rows(r, int(p)) * sizeof(float));
        }
        Workspace workspace(regions.total, compute);
        char* base = workspace.as<char>();
        auto at = [&](size_t offset) { return base + offset; };
        float* o_acc = reinterpret_cast<float*>(at(o_at));
        float* lse_acc = reinterpret_cast<float*>(at(lse_at));
        auto block_in_hand = [&](int step) -> Block {
            if (step == 0) return {k[size_t(r)], v[size_t(r)]};
            bf16* buffer = reinterpret_cast<bf16*>(at(block_at[step % 2]));
            return {buffer, buffer + plan.elements(block_owner(r, step, P))};
        };

        // Events: the workspace is ready; each transfer (group g delivers step g + 1's block);
        // each step's last read of its block (its last attention call); the end of the transfers.
        Events ready(1), arrived(static_cast<size_t>(P)), released(static_cast<size_t>(P)), transfers_done(1);
        CUDA_CHECK(cudaEventRecord(ready[0], compute));
        CUDA_CHECK(cudaStreamWaitEvent(comm, ready[0], 0));

        std::vector<bool> merged(size_t(pieces), false);  // a query piece's accumulator holds a state
        // A piece's first partial result, when it is its step's only one and covers the whole
        // piece, is held to the piece's next step with calls and merged there with that step's:
        // a merge of one partial into the empty accumulator would only copy it into FP32 (the same
        // bits as the next merge's first fold), a pass over the piece for nothing.
        std::vector<Partial> held(size_t(pieces), Partial{});  // o == nullptr: none held
        // Stage 12's forward on each call of `step` for query piece p, into the partial results
        // (after the piece's held one, if any); none when the piece's only call, at its only step,
        // covers all of it: then it writes the ring's result in place and there is nothing to merge.
        auto compute_calls = [&](int step, int p, const std::vector<BlockCall>& calls) {
            const Block block = block_in_hand(step);
            const int owner = block_owner(r, step, P);
            const int64_t piece_rows = plan.piece_rows(r, p);
            const auto piece_calls =
                std::count_if(calls.begin(), calls.end(), [&](const BlockCall& c) { return c.query_piece == p; });
            const bool first = !merged[size_t(p)] && held[size_t(p)].o == nullptr;
            const bool alone = step == last_step[size_t(p)] && first && piece_calls == 1;
            const bool hold = step < last_step[size_t(p)] && first && piece_calls == 1;
            std::vector<Partial> partials;
            size_t slots = 0;  // the partial-result buffers taken (a held partial has its own)
            if (held[size_t(p)].o != nullptr && piece_calls > 0) {
                partials.push_back(held[size_t(p)]);
                held[size_t(p)] = Partial{};
            }
            for (const BlockCall& call : calls) {
                if (call.query_piece != p) continue;
                const bool whole = call.query_count == piece_rows;
                const bf16* q_call = BH > 1 && !whole ? reinterpret_cast<const bf16*>(at(q_rows_at))  // the copied slice
                                                      : q[size_t(r)] + plan.piece_start(r, p, D) + call.query_begin * D;
                const bf16* k_call = block.k + plan.piece_start(owner, call.key_piece, D);  // whole pieces
                const bf16* v_call = block.v + plan.piece_start(owner, call.key_piece, D);
                if (alone && whole) {
                    fastest_forward(q_call, k_call, v_call, o[size_t(r)] + plan.piece_start(r, p, D),
                                      lse[size_t(r)] + plan.piece_start(r, p, 1), plan.call_shape(call), compute);
                    merged[size_t(p)] = true;
                    break;
                }
                if (hold && whole) {
                    bf16* o_held = reinterpret_cast<bf16*>(at(held_o_at[size_t(p)]));
                    float* lse_held = reinterpret_cast<float*>(at(held_lse_at[size_t(p)]));
                    held[size_t(p)] = Partial{o_held, lse_held, 0, piece_rows};
                    fastest_forward(q_call, k_call, v_call, o_held, lse_held, plan.call_shape(call), compute);
                    break;
                }
                const size_t slot = slots++;
                bf16* o_part = reinterpret_cast<bf16*>(at(o_part_at[slot]));
                float* lse_part = reinterpret_cast<float*>(at(lse_part_at[slot]));
                partials.push_back({o_part, lse_part, call.query_begin, call.query_count});
                fastest_forward(q_call, k_call, v_call, o_part, lse_part, plan.call_shape(call), compute);
            }
            return partials;
        };

        // The copied query rows, needed from step 1 on: on the NCCL stream after the first
        // transfer (stage 12's grid holds every SM until its call ends: a transfer queued behind
        // the copy waited for step 0's call, lab notes 13), step 1's arrival recorded after it.
        auto copy_query_rows = [&] {
            if (slice.piece < 0) return;
            gather_rows(reinterpret_cast<bf16*>(at(q_rows_at)), q[size_t(r)] + plan.piece_start(r, slice.piece, D), BH,
                        plan.piece_rows(r, slice.piece), slice.begin, slice.count, D, comm);
            if (P > 1) CUDA_CHECK(cudaEventRecord(arrived[1], comm));
        };
        // excerpt: forward-ring
        auto pass = [&](int step) {  // the block for `step` arrives while step - 1 computes
            Block into = block_in_hand(step);
            pass_block(plan, device, r, block_in_hand(step - 1), block_owner(r, step - 1, P),
                       const_cast<bf16*>(into.k), const_cast<bf16*>(into.v), block_owner(r, step, P));
            CUDA_CHECK(cudaEventRecord(arrived[size_t(step)], comm));
        };
        if (P > 1) pass(1);
        copy_query_rows();  // after the first transfer's launch
        for (int step = 0; step < P; ++step) {
            if (step > 0) CUDA_CHECK(cudaStreamWaitEvent(compute, arrived[size_t(step)], 0));
            const std::vector<BlockCall> calls = plan.calls(r, step);
            // The block is read by the attention calls only: once the last is launched, the
            // transfer into its buffer may be queued, before the step's last merges.
            int last_piece = -1;
            for (const BlockCall& call : calls) last_piece = std::max(last_piece, call.query_piece);
            if (last_piece < 0) CUDA_CHECK(cudaEventRecord(released[size_t(step)], compute));
            for (int p = 0; p < pieces; ++p) {  // each query piece: its calls, then one merge
                const std::vector<Partial> partials = compute_calls(step, p, calls);
                if (p == last_piece) CUDA_CHECK(cudaEventRecord(released[size_t(step)], compute));
                // One merge per MAX_PARTIALS partial results; the piece's last merge writes the
                // ring's result: O in bf16 and the LSE.
                for (size_t first = 0; first < partials.size(); first += MAX_PARTIALS) {
                    Partials batch{};
                    batch.count = int(std::min<size_t>(MAX_PARTIALS, partials.size() - first));
                    std::copy_n(partials.begin() + int64_t(first), batch.count, batch.part);
                    const bool last = step == last_step[size_t(p)] && first + size_t(batch.count) == partials.size();
                    merge_piece(o_acc + plan.piece_start(r, p, D), lse_acc + plan.piece_start(r, p, 1), batch,
                                /*fresh=*/!merged[size_t(p)], last ? o[size_t(r)] + plan.piece_start(r, p, D) : nullptr,
                                last ? lse[size_t(r)] + plan.piece_start(r, p, 1) : nullptr, BH, plan.piece_rows(r, p),
                                D, compute);
                    merged[size_t(p)] = true;
                }
            }
            // The buffer that held this step's block takes the block of step + 2.
            if (step + 2 < P) {
                CUDA_CHECK(cudaStreamWaitEvent(comm, released[size_t(step)], 0));
                pass(step + 2);
            }
        }
        // end excerpt
        // A query piece that no call reached (none does: every row sees its own key) would hold
        // no key: O = 0, LSE = -inf.
        for (int p = 0; p < pieces; ++p)
            if (last_step[size_t(p)] < 0)
                merge_piece(nullptr, nullptr, Partials{}, /*fresh=*/true, o[size_t(r)] + plan.piece_start(r, p, D),
                            lse[size_t(r)] + plan.piece_start(r, p, 1), BH, plan.piece_rows(r, p), D, compute);
        // The workspace is freed on the compute stream: after the last transfer too.
        CUDA_CHECK(cudaEventRecord(transfers_done[0], comm));
        CUDA_CHECK(cudaStreamWaitEvent(compute, transfers_done[0], 0));
        ring_->wait(compute);
    });
}

void RingAttention::backward(const std::vector<const bf16*>& q, const std::vector<const bf16*>& k,
                             const std::vector<const bf16*>& v, const std::vector<const bf16*>& o,
                             const std::vector<const float*>& lse, const std::vector<const bf16*>& dout,
                             const std::vector<bf16*>& dq, const std::vector<bf16*>& dk,
                             const std::vector<bf16*>& dv, const AttentionShape& whole, Sharding sharding,
                             int64_t max_piece) {
    const int P = devices();
    const RingTensors bf16_tensors{{"q", {q.begin(), q.end()}},       {"k", {k.begin(), k.end()}},
                                   {"v", {v.begin(), v.end()}},       {"o", {o.begin(), o.end()}},
                                   {"dout", {dout.begin(), dout.end()}}, {"dq", {dq.begin(), dq.end()}},
                                   {"dk", {dk.begin(), dk.end()}},    {"dv", {dv.begin(), dv.end()}}};
    const RingTensors fp32_tensors{{"lse", {lse.begin(), lse.end()}}};
    validate_ring(whole, sharding, P, bf16_tensors, fp32_tensors, /*backward=*/true, max_piece);
    check_residence(*ring_, bf16_tensors);
    check_residence(*ring_, fp32_tensors);
    const RingPlan plan(whole, sharding, P, max_piece);
    const int64_t BH = plan.batch_heads, D = plan.head_dim;

    ring_->run_on_every_gpu([&](int r) {
        const RingDevices::Device& device = ring_->devices[size_t(r)];
        const cudaStream_t compute = device.compute, comm = device.comm_stream;
        const Shard& mine = plan.shards[size_t(r)];
        const int64_t rows = mine.length(), largest = plan.largest_shard();
        // A call's dK, dV wait in a part buffer until the travelling sums have arrived, so that
        // their transfer overlaps the step's first calls. Two sets: the third call of a step
        // (zigzag has four; more where pieces are cut at kRingMaxPiece) reuses the first's set
        // once the first's parts are in the sums.
        const int64_t piece = plan.largest_piece;
        const int part_sets = int(std::min<size_t>(2, plan.most_calls));
        const RingPlan::Slice slice = plan.query_slice(r);  // copied once, as in the forward

        Regions regions;
        const size_t block_at[2] = {regions.add(2 * BH * largest * D * sizeof(bf16)),
                                    regions.add(2 * BH * largest * D * sizeof(bf16))};
        const size_t sums_at[2] = {regions.add(2 * BH * largest * D * sizeof(float)),
                                   regions.add(2 * BH * largest * D * sizeof(float))};
        const size_t dq_sum_at = regions.add(BH * rows * D * sizeof(float));
        const size_t partials_at = regions.add(BH * plan.key_chunks(r) * D * sizeof(float));
        const size_t mean_at = regions.add(BH * D * sizeof(float));
        const size_t dq_part_at = regions.add(BH * piece * D * sizeof(bf16));
        std::vector<size_t> dk_part_at(static_cast<size_t>(part_sets)), dv_part_at(dk_part_at.size());
        for (size_t c = 0; c < size_t(part_sets); ++c) {
            dk_part_at[c] = regions.add(BH * piece * D * sizeof(bf16));
            dv_part_at[c] = regions.add(BH * piece * D * sizeof(bf16));
        }
        const size_t q_rows_at = regions.add(BH * slice.count * D * sizeof(bf16));
        const size_t o_rows_at = regions.add(BH * slice.count * D * sizeof(bf16));
        const size_t do_rows_at = regions.add(BH * slice.count * D * sizeof(bf16));
        const size_t lse_rows_at = regions.add(BH * slice.count * sizeof(float));
        Workspace workspace(regions.total, compute);
        char* base = workspace.as<char>();
        auto at = [&](size_t offset) { return base + offset; };
        float* dq_sum = reinterpret_cast<float*>(at(dq_sum_at));
        float* mean = reinterpret_cast<float*>(at(mean_at));
        auto block_in_hand = [&](int step) -> Block {
            if (step == 0) return {k[size_t(r)], v[size_t(r)]};
            bf16* buffer = reinterpret_cast<bf16*>(at(block_at[step % 2]));
            return {buffer, buffer + plan.elements(block_owner(r, step, P))};
        };
        // The dK, dV sums (FP32) of the block in hand at `step`.
        auto sums_in_hand = [&](int step) { return reinterpret_cast<float*>(at(sums_at[step % 2])); };

        Events centring(2), ready(1), kv_arrived(static_cast<size_t>(P)), sums_arrived(static_cast<size_t>(P)), computed(static_cast<size_t>(P)), transfers_done(1);
        CUDA_CHECK(cudaMemsetAsync(dq_sum, 0, size_t(BH * rows * D) * sizeof(float), compute));
        CUDA_CHECK(cudaMemsetAsync(sums_in_hand(0), 0, size_t(2 * plan.elements(r)) * sizeof(float), compute));
        // The mean of all keys, the centre of every call's centred dQ (`the key centre`).
        key_centre(plan, device, r, k[size_t(r)], reinterpret_cast<float*>(at(partials_at)), mean, centring);
        CUDA_CHECK(cudaEventRecord(ready[0], compute));
        CUDA_CHECK(cudaStreamWaitEvent(comm, ready[0], 0));
        // The query side's copied rows (q, o, dO, LSE), from step 1 on: on the NCCL stream before
        // the first transfer, as in the forward.
        if (slice.piece >= 0) {
            const int64_t piece_rows = plan.piece_rows(r, slice.piece);
            for (const auto& [tensor, scratch] : {std::pair{q[size_t(r)], q_rows_at}, std::pair{o[size_t(r)], o_rows_at},
                                                 std::pair{dout[size_t(r)], do_rows_at}})
                gather_rows(reinterpret_cast<bf16*>(at(scratch)), tensor + plan.piece_start(r, slice.piece, D), BH,
                            piece_rows, slice.begin, slice.count, D, comm);
            gather_rows(reinterpret_cast<float*>(at(lse_rows_at)), lse[size_t(r)] + plan.piece_start(r, slice.piece, 1),
                        BH, piece_rows, slice.begin, slice.count, int64_t(1), comm);
        }

        auto pass_kv = [&](int step) {
            Block into = block_in_hand(step);
            pass_block(plan, device, r, block_in_hand(step - 1), block_owner(r, step - 1, P),
                       const_cast<bf16*>(into.k), const_cast<bf16*>(into.v), block_owner(r, step, P));
            CUDA_CHECK(cudaEventRecord(kv_arrived[size_t(step)], comm));
        };
        // After step `step` (not the last): its block's dK, dV sums go on to the next GPU; the sums
        // of the block of step + 1 come in.
        auto pass_sums = [&](int step) {
            const size_t send_count = size_t(2 * plan.elements(block_owner(r, step, P)));
            const size_t receive_count = size_t(2 * plan.elements(block_owner(r, step + 1, P)));
            // excerpt: pass-sums
            NCCL_CHECK(ncclGroupStart(), device.comm);
            if (send_count > 0)
                NCCL_CHECK(ncclSend(sums_in_hand(step), send_count, ncclFloat32, plan.next(r), device.comm, comm),
                           device.comm);
            if (receive_count > 0)
                NCCL_CHECK(ncclRecv(sums_in_hand(step + 1), receive_count, ncclFloat32, plan.previous(r), device.comm,
                                    comm), device.comm);
            NCCL_CHECK(ncclGroupEnd(), device.comm);
            // end excerpt
            CUDA_CHECK(cudaEventRecord(sums_arrived[size_t(step + 1)], comm));
        };
        // After the last step: the block's finished dK, dV (in bf16) go home, and this GPU's own
        // come in, straight into dk and dv.
        auto pass_home = [&](const bf16* finished, int owner) {
            const size_t send_count = size_t(plan.elements(owner)), receive_count = size_t(plan.elements(r));
            NCCL_CHECK(ncclGroupStart(), device.comm);
            if (send_count > 0) {
                NCCL_CHECK(ncclSend(finished, send_count, ncclBfloat16, plan.next(r), device.comm, comm), device.comm);
                NCCL_CHECK(ncclSend(finished + send_count, send_count, ncclBfloat16, plan.next(r), device.comm, comm),
                           device.comm);
            }
            if (receive_count > 0) {
                NCCL_CHECK(ncclRecv(dk[size_t(r)], receive_count, ncclBfloat16, plan.previous(r), device.comm, comm),
                           device.comm);
                NCCL_CHECK(ncclRecv(dv[size_t(r)], receive_count, ncclBfloat16, plan.previous(r), device.comm, comm),
                           device.comm);
            }
            NCCL_CHECK(ncclGroupEnd(), device.comm);
        };

        if (P > 1) pass_kv(1);
        for (int step = 0; step < P; ++step) {
            if (step > 0) CUDA_CHECK(cudaStreamWaitEvent(compute, kv_arrived[size_t(step)], 0));
            const Block block = block_in_hand(step);
            const int owner = block_owner(r, step, P);
            const std::vector<BlockCall> calls = plan.calls(r, step);
            // dK, dV of call c into the sums that travel with this block, after the sums of the
            // block have arrived (during the first calls); the calls' parts go in in their order.
            float* sums = sums_in_hand(step);
            size_t added = 0;
            auto add_parts = [&](size_t c) {
                if (c == 0 && step > 0) CUDA_CHECK(cudaStreamWaitEvent(compute, sums_arrived[size_t(step)], 0));
                const BlockCall& call = calls[c];
                const int64_t key_rows = plan.piece_rows(owner, call.key_piece);
                const int64_t key_start = plan.piece_start(owner, call.key_piece, D);
                const size_t set = c % size_t(part_sets);
                add_rows(sums + key_start, reinterpret_cast<bf16*>(at(dk_part_at[set])), BH, key_rows,
                         call.key_begin, call.key_count, D, compute);
                add_rows(sums + plan.elements(owner) + key_start, reinterpret_cast<bf16*>(at(dv_part_at[set])), BH,
                         key_rows, call.key_begin, call.key_count, D, compute);
            };
            for (size_t c = 0; c < calls.size(); ++c) {
                // Call c takes the set of call c - 2: that call's parts go into the sums first.
                while (added + size_t(part_sets) <= c) add_parts(added++);
                const size_t set = c % size_t(part_sets);
                const BlockCall& call = calls[c];
                const int64_t query_rows = plan.piece_rows(r, call.query_piece);
                const int64_t query_start = plan.piece_start(r, call.query_piece, D);
                // The call's query rows: the piece, rows of it (one head), or the copied slice.
                const bool copied = BH > 1 && call.query_count != query_rows;
                auto query_side = [&](const auto* tensor, int64_t width, size_t scratch) {
                    using T = std::remove_const_t<std::remove_pointer_t<decltype(tensor)>>;
                    return copied ? reinterpret_cast<const T*>(at(scratch))
                                  : tensor + plan.piece_start(r, call.query_piece, width) + call.query_begin * width;
                };
                const bf16* q_call = query_side(q[size_t(r)], D, q_rows_at);
                const bf16* o_call = query_side(o[size_t(r)], D, o_rows_at);
                const bf16* do_call = query_side(dout[size_t(r)], D, do_rows_at);
                const float* lse_call = query_side(lse[size_t(r)], int64_t(1), lse_rows_at);
                const bf16* k_call = block.k + plan.piece_start(owner, call.key_piece, D);  // whole pieces
                const bf16* v_call = block.v + plan.piece_start(owner, call.key_piece, D);
                bf16* dq_part = reinterpret_cast<bf16*>(at(dq_part_at));
                // O and LSE are the whole row's (the forward's result): stage 11 then takes
                // P = exp(S - LSE) and delta = rowsum(dO * O) of the whole row, as the ring needs;
                // its dQ is centred by the mean of all keys, not of this call's (`the key centre`).
                attention_backward(q_call, k_call, v_call, o_call, lse_call, do_call, dq_part,
                                   reinterpret_cast<bf16*>(at(dk_part_at[set])), reinterpret_cast<bf16*>(at(dv_part_at[set])),
                                   plan.call_shape(call), compute, mean);
                add_rows(dq_sum + query_start, dq_part, BH, query_rows, call.query_begin, call.query_count, D, compute);
            }
            while (added < calls.size()) add_parts(added++);
            if (calls.empty() && step > 0) CUDA_CHECK(cudaStreamWaitEvent(compute, sums_arrived[size_t(step)], 0));
            const bool last = step == P - 1;
            // The last hop carries finished sums: rounded to bf16 here, as the owner would round
            // them, into the block's buffer (its K, V are no longer read), it moves half the bytes.
            if (last && P > 1) to_bf16(const_cast<bf16*>(block.k), sums, 2 * plan.elements(owner), compute);
            CUDA_CHECK(cudaEventRecord(computed[size_t(step)], compute));
            if (P > 1) {
                CUDA_CHECK(cudaStreamWaitEvent(comm, computed[size_t(step)], 0));
                if (last) pass_home(block.k, owner); else pass_sums(step);
                if (step + 2 < P) pass_kv(step + 2);
            }
        }
        to_bf16(dq[size_t(r)], dq_sum, BH * rows * D, compute);
        if (P == 1) {
            to_bf16(dk[size_t(r)], sums_in_hand(0), plan.elements(r), compute);
            to_bf16(dv[size_t(r)], sums_in_hand(0) + plan.elements(r), plan.elements(r), compute);
        }
        CUDA_CHECK(cudaEventRecord(transfers_done[0], comm));
        CUDA_CHECK(cudaStreamWaitEvent(compute, transfers_done[0], 0));
        ring_->wait(compute);
    });
}
