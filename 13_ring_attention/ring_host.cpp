// What the ring needs of the host: the shardings and their index maps, the calls each step
// makes, and the whole ring simulated in FP64 on P virtual GPUs (ring.h).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "merge.h"
#include "reference.h"
#include "ring.h"
#include "validate.h"

// ---- sharding -------------------------------------------------------------------------------

const char* sharding_name(Sharding sharding) {
    switch (sharding) {
    case Sharding::contiguous: return "contiguous";
    case Sharding::zigzag: return "zigzag";
    case Sharding::striped: return "striped";
    }
    return "?";
}

Sharding parse_sharding(const std::string& name) {
    for (Sharding sharding : {Sharding::contiguous, Sharding::zigzag, Sharding::striped})
        if (name == sharding_name(sharding)) return sharding;
    throw std::invalid_argument("ring attention: sharding = \"" + name +
                                "\" is not allowed: must be contiguous, zigzag or striped");
}

int64_t Shard::length() const {
    int64_t total = 0;
    for (const Piece& piece : pieces) total += piece.length;
    return total;
}

int64_t Shard::offset(int piece) const {
    int64_t total = 0;
    for (int p = 0; p < piece; ++p) total += pieces[size_t(p)].length;
    return total;
}

namespace {

// len split into `parts` runs, the first len % parts of them one longer.
int64_t part_length(int64_t len, int64_t parts, int64_t part) {
    return len / parts + (part < len % parts ? 1 : 0);
}
int64_t part_start(int64_t len, int64_t parts, int64_t part) {
    return part * (len / parts) + std::min(part, len % parts);
}
// The part that holds position `global`, and the offset in it.
std::pair<int64_t, int64_t> split_position(int64_t len, int64_t parts, int64_t global) {
    const int64_t base = len / parts, extra = len % parts;
    const int64_t long_tokens = extra * (base + 1);  // tokens in the longer parts, which come first
    const int64_t part = global < long_tokens ? global / (base + 1) : extra + (global - long_tokens) / base;
    return {part, global - part_start(len, parts, part)};
}

void check_ring(int64_t len, int devices) {
    if (len < 1)
        throw std::invalid_argument("ring attention: len = " + std::to_string(len) +
                                    " is not allowed: must be positive");
    if (devices < 1)
        throw std::invalid_argument("ring attention: devices = " + std::to_string(devices) +
                                    " is not allowed: must be positive");
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

}  // namespace

std::vector<Shard> make_shards(Sharding sharding, int64_t len, int devices, int64_t max_piece) {
    check_ring(len, devices);
    if (max_piece < 0)
        throw std::invalid_argument("ring attention: max_piece = " + std::to_string(max_piece) +
                                    " is not allowed: 0 (no cap) or positive");
    const int64_t P = devices;
    std::vector<Shard> shards(static_cast<size_t>(devices));
    for (int64_t r = 0; r < P; ++r) {
        std::vector<Piece>& pieces = shards[size_t(r)].pieces;
        // A run of consecutive tokens, cut into pieces of at most max_piece (kRingMaxPiece).
        auto add_run = [&](int64_t first, int64_t length) {
            const int64_t parts = max_piece > 0 && length > max_piece ? (length + max_piece - 1) / max_piece : 1;
            for (int64_t part = 0; part < parts; ++part)
                pieces.push_back({first + part_start(length, parts, part), part_length(length, parts, part), 1});
        };
        switch (sharding) {
        case Sharding::contiguous:
            add_run(part_start(len, P, r), part_length(len, P, r));
            break;
        case Sharding::zigzag:
            // excerpt: zigzag-pieces
            for (int64_t chunk : {r, 2 * P - 1 - r})
                add_run(part_start(len, 2 * P, chunk), part_length(len, 2 * P, chunk));
            // end excerpt
            break;
        case Sharding::striped:
            pieces.push_back({r, r < len ? (len - r + P - 1) / P : 0, P});
            break;
        }
    }
    return shards;
}

int64_t global_position(const std::vector<Shard>& shards, int device, int64_t local) {
    const Shard& shard = shards.at(static_cast<size_t>(device));
    for (const Piece& piece : shard.pieces) {
        if (local < piece.length) return piece.position(local);
        local -= piece.length;
    }
    throw std::out_of_range("global_position: local index past the shard");
}

Location locate(Sharding sharding, int64_t len, int devices, int64_t global) {
    check_ring(len, devices);
    const int64_t P = devices;
    switch (sharding) {
    case Sharding::contiguous: {
        const auto [part, offset] = split_position(len, P, global);
        return {int(part), offset};
    }
    case Sharding::zigzag: {
        const auto [chunk, offset] = split_position(len, 2 * P, global);
        if (chunk < P) return {int(chunk), offset};
        const int64_t device = 2 * P - 1 - chunk;  // its first piece is chunk `device`
        return {int(device), part_length(len, 2 * P, device) + offset};
    }
    case Sharding::striped: return {int(global % P), global / P};
    }
    throw std::logic_error("locate: unknown sharding");
}

// ---- the calls ------------------------------------------------------------------------------

std::vector<BlockCall> block_calls(const Shard& queries, const Shard& keys, bool causal) {
    std::vector<BlockCall> calls;
    for (int a = 0; a < int(queries.pieces.size()); ++a)
        for (int b = 0; b < int(keys.pieces.size()); ++b) {
            const Piece& q = queries.pieces[size_t(a)];
            const Piece& k = keys.pieces[size_t(b)];
            if (q.length == 0 || k.length == 0) continue;
            BlockCall call{a, 0, q.length, b, 0, k.length, false};
            if (!causal) {
                calls.push_back(call);
                continue;
            }
            if (q.stride != k.stride)
                throw std::logic_error("block_calls: pieces of different strides");
            if (q.stride == 1) {
                // excerpt: causal-blocks
                // Runs of consecutive tokens: a block entirely below the diagonal is seen whole,
                // one entirely above it not at all, and a run against itself is the causal call.
                const int64_t q_last = q.position(q.length - 1), k_last = k.position(k.length - 1);
                if (k_last < q.first) {
                    calls.push_back(call);
                } else if (k.first > q_last) {
                    continue;
                } else if (k.first == q.first && k.length == q.length) {
                    call.causal = true;
                    calls.push_back(call);
                } else {
                    throw std::logic_error("block_calls: runs that overlap in part");
                }
                // end excerpt
                continue;
            }
            // Striped: query i sits at q.first + i S, key j at k.first + j S, so key j is seen
            // iff j <= i + floor((q.first - k.first) / S): on the diagonal (shift 0) or
            // strictly below it (shift -1: a later GPU's tokens), where the query rows from 1 on
            // make the causal call. Either call takes the whole key piece: a key past the last
            // query row (a piece may hold one token more than another) is hidden by the causal
            // mask anyway, and a whole piece is never copied. Only the shifted query rows are a
            // slice of their piece (attention.cu gathers them once per ring call).
            const int64_t shift = floor_div(q.first - k.first, q.stride);
            call.causal = true;
            if (shift == -1) {
                call.query_begin = 1;
                call.query_count = q.length - 1;
                if (call.query_count <= 0) continue;
            } else if (shift != 0) {
                throw std::logic_error("block_calls: striped pieces more than a stride apart");
            }
            calls.push_back(call);
        }
    return calls;
}

int64_t call_pairs(const BlockCall& call) {
    const int64_t q = call.query_count, k = call.key_count;
    if (!call.causal) return q * k;
    // Row i sees min(i + 1, k) keys.
    return q <= k ? q * (q + 1) / 2 : k * (k + 1) / 2 + (q - k) * k;
}

std::vector<std::vector<int64_t>> step_work(const std::vector<Shard>& shards, bool causal) {
    const int P = int(shards.size());
    std::vector<std::vector<int64_t>> work(size_t(P), std::vector<int64_t>(size_t(P), 0));
    for (int step = 0; step < P; ++step)
        for (int device = 0; device < P; ++device)
            for (const BlockCall& call :
                 block_calls(shards[size_t(device)], shards[size_t(block_owner(device, step, P))], causal))
                work[size_t(step)][size_t(device)] += call_pairs(call);
    return work;
}

int64_t smallest_call_keys(const AttentionShape& whole, Sharding sharding, int devices, int64_t max_piece) {
    const std::vector<Shard> shards = make_shards(sharding, whole.len_kv, devices, max_piece);
    int64_t smallest = INT64_MAX;
    for (int step = 0; step < devices; ++step)
        for (int device = 0; device < devices; ++device)
            for (const BlockCall& call : block_calls(shards[size_t(device)],
                                                     shards[size_t(block_owner(device, step, devices))],
                                                     whole.causal))
                smallest = std::min(smallest, call.key_count);
    return smallest;
}

// ---- layouts --------------------------------------------------------------------------------

int64_t piece_row_offset(const Shard& shard, int piece, int64_t batch_heads, int64_t head,
                         int64_t row, int64_t row_width) {
    const int64_t length = shard.pieces[size_t(piece)].length;
    return (batch_heads * shard.offset(piece) + head * length + row) * row_width;
}

namespace {

template <class T>
std::vector<std::vector<T>> shard_rows_impl(const std::vector<T>& whole, const std::vector<Shard>& shards,
                                            int64_t batch_heads, int64_t len, int64_t row_width) {
    std::vector<std::vector<T>> local;
    for (const Shard& shard : shards) {
        std::vector<T> buffer(size_t(batch_heads * shard.length() * row_width));
        for (int p = 0; p < int(shard.pieces.size()); ++p)
            for (int64_t h = 0; h < batch_heads; ++h)
                for (int64_t i = 0; i < shard.pieces[size_t(p)].length; ++i) {
                    const int64_t from = (h * len + shard.pieces[size_t(p)].position(i)) * row_width;
                    std::copy_n(whole.begin() + from, row_width,
                                buffer.begin() + piece_row_offset(shard, p, batch_heads, h, i, row_width));
                }
        local.push_back(std::move(buffer));
    }
    return local;
}

// Rows [begin, begin + count) of one piece, for every head: a [batch_heads, count, width] tensor.
template <class T>
std::vector<T> extract_rows(const std::vector<T>& buffer, const Shard& shard, int piece, int64_t begin,
                            int64_t count, int64_t batch_heads, int64_t width) {
    std::vector<T> out(size_t(batch_heads * count * width));
    for (int64_t h = 0; h < batch_heads; ++h)
        std::copy_n(buffer.begin() + piece_row_offset(shard, piece, batch_heads, h, begin, width),
                    count * width, out.begin() + h * count * width);
    return out;
}

// buffer rows [begin, begin + count) of one piece += values ([batch_heads, count, width]).
template <class T>
void add_rows(std::vector<T>& buffer, const Shard& shard, int piece, int64_t begin, int64_t count,
              int64_t batch_heads, int64_t width, const std::vector<double>& values) {
    for (int64_t h = 0; h < batch_heads; ++h) {
        T* to = buffer.data() + piece_row_offset(shard, piece, batch_heads, h, begin, width);
        const double* from = values.data() + h * count * width;
        for (int64_t e = 0; e < count * width; ++e) to[e] += T(from[e]);
    }
}

template <class T>
void merge_rows_impl(T* o_accumulated, T* lse_accumulated, const T* o_partial, const T* lse_partial,
                     int64_t rows, int64_t head_dim) {
    for (int64_t row = 0; row < rows; ++row) {
        const MergeWeights<T> w = merge_weights(lse_accumulated[row], lse_partial[row]);
        T* o = o_accumulated + row * head_dim;
        const T* part = o_partial + row * head_dim;
        // A side of weight 0 is left out, not multiplied: an output nobody wrote (a row that
        // saw no key) may hold anything, and 0 * NaN is NaN.
        for (int64_t d = 0; d < head_dim; ++d)
            o[d] = (w.accumulated != T(0) ? w.accumulated * o[d] : T(0)) +
                   (w.partial != T(0) ? w.partial * part[d] : T(0));
        lse_accumulated[row] = w.lse;
    }
}

}  // namespace

std::vector<std::vector<float>> shard_rows(const std::vector<float>& whole, const std::vector<Shard>& shards,
                                           int64_t batch_heads, int64_t len, int64_t row_width) {
    return shard_rows_impl(whole, shards, batch_heads, len, row_width);
}

template <class T>
std::vector<T> unshard_rows(const std::vector<std::vector<T>>& local, const std::vector<Shard>& shards,
                            int64_t batch_heads, int64_t len, int64_t row_width) {
    std::vector<T> whole(size_t(batch_heads * len * row_width));
    for (size_t r = 0; r < shards.size(); ++r) {
        const Shard& shard = shards[r];
        for (int p = 0; p < int(shard.pieces.size()); ++p)
            for (int64_t h = 0; h < batch_heads; ++h)
                for (int64_t i = 0; i < shard.pieces[size_t(p)].length; ++i)
                    std::copy_n(local[r].begin() + piece_row_offset(shard, p, batch_heads, h, i, row_width),
                                row_width,
                                whole.begin() + (h * len + shard.pieces[size_t(p)].position(i)) * row_width);
    }
    return whole;
}
template std::vector<float> unshard_rows(const std::vector<std::vector<float>>&, const std::vector<Shard>&,
                                         int64_t, int64_t, int64_t);
template std::vector<double> unshard_rows(const std::vector<std::vector<double>>&, const std::vector<Shard>&,
                                          int64_t, int64_t, int64_t);

void merge_rows(double* o_accumulated, double* lse_accumulated, const double* o_partial,
                const double* lse_partial, int64_t rows, int64_t head_dim) {
    merge_rows_impl(o_accumulated, lse_accumulated, o_partial, lse_partial, rows, head_dim);
}
void merge_rows(float* o_accumulated, float* lse_accumulated, const float* o_partial,
                const float* lse_partial, int64_t rows, int64_t head_dim) {
    merge_rows_impl(o_accumulated, lse_accumulated, o_partial, lse_partial, rows, head_dim);
}

// ---- the ring simulated ---------------------------------------------------------------------

namespace {

void check_whole(const AttentionShape& whole) {
    if (whole.len_q != whole.len_kv)
        throw std::invalid_argument("ring attention: len_q = " + std::to_string(whole.len_q) +
                                    " and len_kv = " + std::to_string(whole.len_kv) +
                                    " is not allowed: the ring splits one sequence (self-attention), len_q == len_kv");
}

// A key/value block as it travels: whose it is, its rows, and (backward) the dK, dV summed so far.
struct TravellingBlock {
    int owner;
    std::vector<float> k, v;
    std::vector<double> dk, dv;
};

// One hop round the ring: GPU r's block goes to GPU r + 1.
void pass_blocks(std::vector<TravellingBlock>& blocks) {
    std::rotate(blocks.rbegin(), blocks.rbegin() + 1, blocks.rend());
}

template <class Accumulator>
RingResult simulate_forward(const AttentionShape& whole, Sharding sharding, int devices,
                            const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v, int64_t max_piece) {
    check_whole(whole);
    const int64_t N = whole.len_q, D = whole.head_dim, BH = int64_t(whole.batch) * whole.heads;
    const std::vector<Shard> shards = make_shards(sharding, N, devices, max_piece);
    const auto q_local = shard_rows(q, shards, BH, N, D);
    const auto k_local = shard_rows(k, shards, BH, N, D);
    const auto v_local = shard_rows(v, shards, BH, N, D);

    std::vector<TravellingBlock> blocks;
    std::vector<std::vector<Accumulator>> o(static_cast<size_t>(devices)), lse(static_cast<size_t>(devices));
    for (int r = 0; r < devices; ++r) {
        blocks.push_back({r, k_local[size_t(r)], v_local[size_t(r)], {}, {}});
        o[size_t(r)].assign(size_t(BH * shards[size_t(r)].length() * D), Accumulator(0));
        lse[size_t(r)].assign(size_t(BH * shards[size_t(r)].length()), -Accumulator(INFINITY));
    }
    for (int step = 0; step < devices; ++step) {
        for (int r = 0; r < devices; ++r) {
            const TravellingBlock& block = blocks[size_t(r)];
            if (block.owner != block_owner(r, step, devices))
                throw std::logic_error("simulate_ring_forward: a block went astray");
            const Shard& mine = shards[size_t(r)];
            const Shard& theirs = shards[size_t(block.owner)];
            for (const BlockCall& call : block_calls(mine, theirs, whole.causal)) {
                const auto q_rows = extract_rows(q_local[size_t(r)], mine, call.query_piece, call.query_begin,
                                                 call.query_count, BH, D);
                const auto k_rows = extract_rows(block.k, theirs, call.key_piece, call.key_begin, call.key_count, BH, D);
                const auto v_rows = extract_rows(block.v, theirs, call.key_piece, call.key_begin, call.key_count, BH, D);
                const AttentionShape part_shape =
                    make_shape(whole.batch, whole.heads, int(call.query_count), int(call.key_count),
                               whole.head_dim, call.causal, whole.softmax_scale());
                std::vector<double> o_part(q_rows.size()), lse_part(size_t(BH * call.query_count));
                reference_forward(part_shape, q_rows.data(), k_rows.data(), v_rows.data(), o_part.data(),
                                  lse_part.data());
                const std::vector<Accumulator> o_cast(o_part.begin(), o_part.end());
                const std::vector<Accumulator> lse_cast(lse_part.begin(), lse_part.end());
                for (int64_t h = 0; h < BH; ++h)
                    merge_rows(o[size_t(r)].data() + piece_row_offset(mine, call.query_piece, BH, h, call.query_begin, D),
                               lse[size_t(r)].data() + piece_row_offset(mine, call.query_piece, BH, h, call.query_begin, 1),
                               o_cast.data() + h * call.query_count * D, lse_cast.data() + h * call.query_count,
                               call.query_count, D);
            }
        }
        pass_blocks(blocks);
    }
    RingResult result;
    const auto o_whole = unshard_rows(o, shards, BH, N, D);
    const auto lse_whole = unshard_rows(lse, shards, BH, N, 1);
    result.o.assign(o_whole.begin(), o_whole.end());
    result.lse.assign(lse_whole.begin(), lse_whole.end());
    return result;
}

}  // namespace

RingResult simulate_ring_forward(const AttentionShape& whole, Sharding sharding, int devices,
                                 const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, bool fp32_merge, int64_t max_piece) {
    return fp32_merge ? simulate_forward<float>(whole, sharding, devices, q, k, v, max_piece)
                      : simulate_forward<double>(whole, sharding, devices, q, k, v, max_piece);
}

void reference_block_backward(int64_t batch_heads, int64_t query_count, int64_t key_count,
                              int64_t head_dim, bool causal, double scale, const float* q,
                              const float* k, const float* v, const float* dout,
                              const double* lse, const double* delta, double* dq, double* dk,
                              double* dv, double* ds_rowsum) {
    const int64_t D = head_dim;
    std::fill(dq, dq + batch_heads * query_count * D, 0.0);
    if (ds_rowsum) std::fill(ds_rowsum, ds_rowsum + batch_heads * query_count, 0.0);
    std::fill(dk, dk + batch_heads * key_count * D, 0.0);
    std::fill(dv, dv + batch_heads * key_count * D, 0.0);
    std::vector<double> p(static_cast<size_t>(key_count)), dp(static_cast<size_t>(key_count));
    for (int64_t h = 0; h < batch_heads; ++h)
        for (int64_t i = 0; i < query_count; ++i) {
            const int64_t row = h * query_count + i;
            const float* q_row = q + row * D;
            const float* do_row = dout + row * D;
            const int64_t keys = causal ? std::min(i + 1, key_count) : key_count;
            double block_delta = 0;  // rowsum(P * dP) over this call's keys alone
            for (int64_t j = 0; j < keys; ++j) {
                const float* k_row = k + (h * key_count + j) * D;
                const float* v_row = v + (h * key_count + j) * D;
                double s = 0, dot = 0;
                for (int64_t d = 0; d < D; ++d) {
                    s += double(q_row[d]) * k_row[d];
                    dot += double(do_row[d]) * v_row[d];
                }
                // P against the whole row's softmax: exp(S - LSE), not a softmax of the block.
                p[size_t(j)] = std::exp(s * scale - lse[row]);
                dp[size_t(j)] = dot;
                block_delta += p[size_t(j)] * dot;
            }
            const double row_delta = delta ? delta[row] : block_delta;
            for (int64_t j = 0; j < keys; ++j) {
                const double ds = p[size_t(j)] * (dp[size_t(j)] - row_delta) * scale;
                if (ds_rowsum) ds_rowsum[row] += ds;
                const float* k_row = k + (h * key_count + j) * D;
                double* dk_row = dk + (h * key_count + j) * D;
                double* dv_row = dv + (h * key_count + j) * D;
                for (int64_t d = 0; d < D; ++d) {
                    dq[row * D + d] += ds * k_row[d];
                    dk_row[d] += ds * q_row[d];
                    dv_row[d] += p[size_t(j)] * do_row[d];
                }
            }
        }
}

RingResult simulate_ring_backward(const AttentionShape& whole, Sharding sharding, int devices,
                                  const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const std::vector<double>& o,
                                  const std::vector<double>& lse, const std::vector<float>& dout,
                                  DeltaSource delta_source, DqCentring centring, int64_t max_piece) {
    check_whole(whole);
    const int64_t N = whole.len_q, D = whole.head_dim, BH = int64_t(whole.batch) * whole.heads;
    const double scale = whole.softmax_scale();
    const std::vector<Shard> shards = make_shards(sharding, N, devices, max_piece);
    const auto q_local = shard_rows(q, shards, BH, N, D);
    const auto k_local = shard_rows(k, shards, BH, N, D);
    const auto v_local = shard_rows(v, shards, BH, N, D);
    const auto do_local = shard_rows(dout, shards, BH, N, D);
    const auto lse_local = shard_rows_impl(lse, shards, BH, N, 1);
    // As the GPU ring: the mean of all keys, from every GPU's sums, the c of every call.
    const std::vector<double> whole_means =
        centring == DqCentring::whole_keys ? whole_key_means(k_local, shards, BH, D, N) : std::vector<double>{};
    // delta_i = rowsum(dO_i * O_i) over the whole row's output, once per local row.
    std::vector<double> delta_whole(size_t(BH * N));
    for (int64_t row = 0; row < BH * N; ++row)
        for (int64_t d = 0; d < D; ++d) delta_whole[size_t(row)] += double(dout[size_t(row * D + d)]) * o[size_t(row * D + d)];
    const auto delta_local = shard_rows_impl(delta_whole, shards, BH, N, 1);

    std::vector<TravellingBlock> blocks;
    std::vector<std::vector<double>> dq(static_cast<size_t>(devices));
    for (int r = 0; r < devices; ++r) {
        const size_t elements = size_t(BH * shards[size_t(r)].length() * D);
        blocks.push_back({r, k_local[size_t(r)], v_local[size_t(r)], std::vector<double>(elements, 0.0),
                          std::vector<double>(elements, 0.0)});
        dq[size_t(r)].assign(elements, 0.0);
    }
    for (int step = 0; step < devices; ++step) {
        for (int r = 0; r < devices; ++r) {
            TravellingBlock& block = blocks[size_t(r)];
            if (block.owner != block_owner(r, step, devices))
                throw std::logic_error("simulate_ring_backward: a block went astray");
            const Shard& mine = shards[size_t(r)];
            const Shard& theirs = shards[size_t(block.owner)];
            for (const BlockCall& call : block_calls(mine, theirs, whole.causal)) {
                const int qp = call.query_piece, kp = call.key_piece;
                const int64_t qb = call.query_begin, qc = call.query_count;
                const int64_t kb = call.key_begin, kc = call.key_count;
                const auto q_rows = extract_rows(q_local[size_t(r)], mine, qp, qb, qc, BH, D);
                const auto do_rows = extract_rows(do_local[size_t(r)], mine, qp, qb, qc, BH, D);
                const auto lse_rows = extract_rows(lse_local[size_t(r)], mine, qp, qb, qc, BH, 1);
                const auto delta_rows = extract_rows(delta_local[size_t(r)], mine, qp, qb, qc, BH, 1);
                const auto k_rows = extract_rows(block.k, theirs, kp, kb, kc, BH, D);
                const auto v_rows = extract_rows(block.v, theirs, kp, kb, kc, BH, D);
                std::vector<double> dq_part(q_rows.size()), dk_part(k_rows.size()), dv_part(v_rows.size());
                std::vector<double> ds_rowsum(size_t(BH * qc));
                reference_block_backward(BH, qc, kc, D, call.causal, scale, q_rows.data(), k_rows.data(),
                                         v_rows.data(), do_rows.data(), lse_rows.data(),
                                         delta_source == DeltaSource::whole_row ? delta_rows.data() : nullptr,
                                         dq_part.data(), dk_part.data(), dv_part.data(), ds_rowsum.data());
                if (centring != DqCentring::none)
                    for (int64_t h = 0; h < BH; ++h) {
                        // per_call: stage 11's default, c = this call's key mean; whole_keys: the
                        // ring's key_centre, the mean of all keys.
                        std::vector<double> mean(size_t(D), 0.0);
                        if (centring == DqCentring::per_call) {
                            for (int64_t j = 0; j < kc; ++j)
                                for (int64_t d = 0; d < D; ++d) mean[size_t(d)] += k_rows[size_t((h * kc + j) * D + d)];
                            for (double& m : mean) m /= double(kc);
                        } else {
                            for (int64_t d = 0; d < D; ++d) mean[size_t(d)] = whole_means[size_t(h * D + d)];
                        }
                        for (int64_t i = 0; i < qc; ++i)
                            for (int64_t d = 0; d < D; ++d)
                                dq_part[size_t((h * qc + i) * D + d)] -= ds_rowsum[size_t(h * qc + i)] * mean[size_t(d)];
                    }
                // excerpt: backward-bookkeeping
                add_rows(dq[size_t(r)], mine, qp, qb, qc, BH, D, dq_part);  // dQ stays home
                add_rows(block.dk, theirs, kp, kb, kc, BH, D, dk_part);     // dK, dV travel
                add_rows(block.dv, theirs, kp, kb, kc, BH, D, dv_part);     // with their block
                // end excerpt
            }
        }
        // After the last step this hop takes every block, and its dK, dV, home.
        pass_blocks(blocks);
    }
    RingResult result;
    std::vector<std::vector<double>> dk(static_cast<size_t>(devices)), dv(static_cast<size_t>(devices));
    for (int r = 0; r < devices; ++r) {
        if (blocks[size_t(r)].owner != r)
            throw std::logic_error("simulate_ring_backward: a block did not come home");
        dk[size_t(r)] = std::move(blocks[size_t(r)].dk);
        dv[size_t(r)] = std::move(blocks[size_t(r)].dv);
    }
    result.dq = unshard_rows(dq, shards, BH, N, D);
    result.dk = unshard_rows(dk, shards, BH, N, D);
    result.dv = unshard_rows(dv, shards, BH, N, D);
    return result;
}

// ---- the mean of all keys, the ring's key centre --------------------------------------------------

std::vector<double> whole_key_means(const std::vector<std::vector<float>>& k_local,
                                    const std::vector<Shard>& shards, int64_t batch_heads,
                                    int64_t head_dim, int64_t len) {
    const int64_t D = head_dim;
    std::vector<double> total(size_t(batch_heads * D), 0.0);
    for (size_t r = 0; r < shards.size(); ++r) {  // each GPU's sums, then added over the GPUs
        std::vector<double> sums(total.size(), 0.0);
        for (int p = 0; p < int(shards[r].pieces.size()); ++p)
            for (int64_t h = 0; h < batch_heads; ++h)
                for (int64_t i = 0; i < shards[r].pieces[size_t(p)].length; ++i) {
                    const int64_t at = piece_row_offset(shards[r], p, batch_heads, h, i, D);
                    for (int64_t d = 0; d < D; ++d) sums[size_t(h * D + d)] += k_local[r][size_t(at + d)];
                }
        for (size_t i = 0; i < total.size(); ++i) total[i] += sums[i];
    }
    for (double& sum : total) sum /= double(len);
    return total;
}

std::vector<float> offset_keys_by_gpu(const std::vector<float>& k, const AttentionShape& whole,
                                      Sharding sharding, int devices, float amplitude) {
    static constexpr float kSigns[] = {1.0f, -1.0f, 0.5f, -0.5f, 1.5f, -1.5f, 0.25f, -0.25f};
    const int64_t N = whole.len_kv, D = whole.head_dim, BH = int64_t(whole.batch) * whole.heads;
    if (k.size() != size_t(BH * N * D))
        throw std::invalid_argument("offset_keys_by_gpu: k has " + std::to_string(k.size()) + " elements, the shape " +
                                    std::to_string(BH * N * D));
    std::vector<float> out = k;
    for (int64_t j = 0; j < N; ++j) {
        const int device = locate(sharding, N, devices, j).device;
        const float offset = amplitude * kSigns[device % 8];
        for (int64_t h = 0; h < BH; ++h)
            for (int64_t d = 0; d < D; ++d) out[size_t((h * N + j) * D + d)] += d % 2 == 0 ? offset : -offset;
    }
    return out;
}

// ---- the arguments of a GPU ring call ---------------------------------------------------------

void validate_ring(const AttentionShape& whole, Sharding sharding, int devices, const RingTensors& bf16_tensors,
                   const RingTensors& fp32_tensors, bool backward, int64_t max_piece) {
    check_whole(whole);
    validate_shape(whole, stage_capabilities());
    check_ring(whole.len_q, devices);
    for (const RingTensors* tensors : {&bf16_tensors, &fp32_tensors})
        for (const auto& [field, pointers] : *tensors) {
            if (pointers.size() != size_t(devices))
                throw std::invalid_argument("ring attention: " + std::string(field) + " has " +
                                            std::to_string(pointers.size()) +
                                            " pointers, which is not allowed: one per GPU of the ring, " +
                                            std::to_string(devices));
            const std::vector<Shard> shards = make_shards(sharding, whole.len_q, devices, max_piece);
            for (size_t r = 0; r < pointers.size(); ++r) {
                if (shards[r].length() == 0) continue;  // a GPU that holds no token (len < pieces)
                const std::string name = std::string(field) + "[" + std::to_string(r) + "]";
                validate_pointer(name.c_str(), pointers[r],
                                 tensors == &bf16_tensors ? stage_capabilities().alignment_bytes : int(alignof(float)));
            }
        }
    if (backward) {
        const int64_t keys = smallest_call_keys(whole, sharding, devices, max_piece);
        if (keys < kRingMinimumBackwardKeys)
            throw std::invalid_argument(
                "ring attention backward: len = " + std::to_string(whole.len_q) + " over " + std::to_string(devices) +
                " GPUs (" + sharding_name(sharding) + ") makes calls of " + std::to_string(keys) +
                " keys, which is not allowed: at least " + std::to_string(kRingMinimumBackwardKeys) +
                " (with one key tile stage 11's backward sums delta over the block's own keys, right for a whole "
                "sequence and wrong for a ring's block)");
    }
}
