// How accurate is poly_exp2 (below), the exponential that a variant of stage 10 computed on the
// FMA pipe at D = 64, and is that accurate enough for the softmax? No GPU needed for parts 1-3.
// The variant was timed on an H100 and dropped (lab notes 10, "Exponentials on the FMA pipe at
// D = 64"; the kernel change is docs/profiles/10_pingpong/variant-exp2-on-fma.patch, where
// poly_exp2 sat in common/ptx.cuh); poly_exp2 lives here since, unchanged.
//
//   1. The polynomial: Remez fits of 1 + f (c1 + c2 f + ...) to 2^f on [0, 1], minimising the
//      largest relative error, for degrees 1 to 5 (long double), and whether the float
//      coefficients in poly_exp2 are these fits rounded to float.
//   2. The function as compiled, on every float x in [-127, 0] (and -inf, NaN, a few x > 0):
//      poly_exp2<2>, <3>, <4> on the host, whose arithmetic is the device's bit for bit
//      (poly_exp2's comment says why), against exp2 in double; beside it the documented bound
//      of the hardware's ex2.approx.ftz.f32 (PTX ISA: 2 ulp from the correctly rounded result)
//      and bf16's rounding of P.
//   3. What the suite's checks would see: the forward of stage 10's D = 64 kernel emulated on
//      the host (tiles of 128 keys, online softmax in FP32, P rounded to bf16 for P V, l summed
//      in FP32, O rounded to bf16), its exponentials taken from poly_exp2 on the variant's
//      columns, against the FP64 reference of the suite, on the suite's shapes: O's relative
//      L2 error against 1e-2 and against twice a plain bf16 implementation's, LSE's against
//      1e-5 (relative L2, or 1e-5 absolute).
//   4. With a GPU: poly_exp2<3> and fast_exp2 (ex2.approx.ftz.f32) computed on the device for
//      every float x in [-127, 0]: the device's poly_exp2 against the host's bit for bit, and
//      the hardware exponential's measured error against its documented bound. Reported as
//      skipped without one.
//
// make -C bench/experiments exp2_fma_accuracy; build/experiments/exp2_fma_accuracy
// (docs/profiles/10_pingpong/exp2-fma-accuracy.txt, without a GPU, and exp2-fma-accuracy-h100.txt
// are its output, printed while poly_exp2 was in common/ptx.cuh: their labels say "ptx.cuh" and
// "(stage 10)" where the program now says "poly_exp2" and "(variant)").
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "attention.h"
#include "harness.h"
#include "ptx.cuh"  // fast_exp2, the hardware exponential of part 4
#include "reference.h"

namespace {

// 2^x without the exponent unit, computed on the FMA pipe (and one integer add), for the
// softmax's x = s * scale_log2 - max_offset <= 0. The exponent unit does 16 exponentials per
// clock and SM, the FMA pipe 128 FMAs, so where the exponentials bound a loop some of them could
// move here (tried in stage 10 at D = 64, and slower: lab notes 10 have the numbers).
//   Range reduction: x = j + f with j = round(x), f in [-1/2, 1/2], both exact: adding
//   1.5 * 2^23 leaves j in the low mantissa bits of t (floats there are 1 apart), and
//   (t - 1.5 * 2^23) is j as a float. Then 2^x = 2^j * 2^f: 2^f by a polynomial that is exactly
//   1 at f = 0, and j added to the exponent bits of the result ((bits(t) << 23) is j << 23
//   modulo 2^32). Rounding to the nearest j keeps the row's maximum exact: its x is 0 up to a
//   rounding error of either sign, which rounding down would send to f = 1 - tiny.
//   The clamp at -127 makes -inf (masked scores) and NaN give +0, as does every x <= -127;
//   between -127 and -126 the result is below 2^-126 (a subnormal), where ex2.approx.ftz gives
//   0. Valid for x <= 126.
//   The coefficients minimise the largest relative error of 1 + f (c1 + c2 f + ...) against 2^f
//   on [-1/2, 1/2] (Remez: part 1 below, which prints them; part 2 measures every float x in
//   [-127, 0], part 3 the test suite's checks): at degree 3 it is 1.0e-4, 39 times below bf16's
//   rounding of P (2^-8).
// On the host the same arithmetic (rint for the rounded add): bit for bit the device's, when
// the host's arithmetic is not contracted into FMAs (the Makefile builds with -ffp-contract=off).
// On the host: 2^n * p from t = 1.5 * 2^23 + n, by adding n (t's low mantissa bits) to p's
// exponent field, as the device does with integer arithmetic on the bits.
inline float scale_by_exponent(float t, float p) {
    uint32_t t_bits, p_bits;
    std::memcpy(&t_bits, &t, 4);
    std::memcpy(&p_bits, &p, 4);
    const uint32_t bits = (t_bits << 23) + p_bits;
    float result;
    std::memcpy(&result, &bits, 4);
    return result;
}

template <int DEGREE = 3>
__host__ __device__ __forceinline__ float poly_exp2(float x) {
    static_assert(DEGREE >= 2 && DEGREE <= 4, "poly_exp2: degree 2, 3 or 4");
    constexpr float SHIFTER = 12582912.0f;  // 1.5 * 2^23
    x = fmaxf(x, -127.0f);
#ifdef __CUDA_ARCH__
    const float t = __fadd_rn(x, SHIFTER);
#else
    const float t = SHIFTER + rintf(x);  // exact, as the device's rounded add is for |x| <= 2^22
#endif
    const float f = x - (t - SHIFTER);  // in [-1/2, 1/2], exact
    float p;
    if constexpr (DEGREE == 2) {
        p = fmaf(fmaf(0x1.eb3dd4p-3f, f, 0x1.67e7fcp-1f), f, 1.0f);
    } else if constexpr (DEGREE == 3) {
        p = fmaf(fmaf(fmaf(0x1.c2a218p-5f, f, 0x1.f00c4cp-3f), f, 0x1.62f5fap-1f), f, 1.0f);
    } else {
        p = fmaf(fmaf(fmaf(fmaf(0x1.3a02ccp-7f, f, 0x1.c9fc46p-5f), f, 0x1.ec0378p-3f), f,
                      0x1.62e12cp-1f), f, 1.0f);
    }
#ifdef __CUDA_ARCH__
    return __int_as_float((__float_as_int(t) << 23) + __float_as_int(p));
#else
    return scale_by_exponent(t, p);
#endif
}

// ---- 1. Remez --------------------------------------------------------------------------------

using Real = long double;

Real polynomial(const std::vector<Real>& c, Real f) {  // 1 + f (c[0] + c[1] f + ...)
    Real q = 0;
    for (int k = int(c.size()) - 1; k >= 0; --k) q = q * f + c[size_t(k)];
    return 1 + f * q;
}
Real relative_error(const std::vector<Real>& c, Real f) { return polynomial(c, f) / exp2l(f) - 1; }
// The relative error is f (q(f) - (2^f - 1) / f) / 2^f: a weighted error of q that changes
// sign with f. Remez equioscillates the weighted error, sign(f) times the relative error.
Real weighted_error(const std::vector<Real>& c, Real f) { return f < 0 ? -relative_error(c, f) : relative_error(c, f); }

std::vector<Real> solve(std::vector<std::vector<Real>> a, std::vector<Real> b) {
    const size_t n = b.size();
    for (size_t column = 0; column < n; ++column) {
        size_t pivot = column;
        for (size_t row = column + 1; row < n; ++row)
            if (fabsl(a[row][column]) > fabsl(a[pivot][column])) pivot = row;
        std::swap(a[column], a[pivot]);
        std::swap(b[column], b[pivot]);
        for (size_t row = 0; row < n; ++row) {
            if (row == column) continue;
            const Real factor = a[row][column] / a[column][column];
            for (size_t k = column; k < n; ++k) a[row][k] -= factor * a[column][k];
            b[row] -= factor * b[column];
        }
    }
    std::vector<Real> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = b[i] / a[i][i];
    return x;
}

// The degree-`degree` polynomial with constant term 1 whose largest relative error against 2^f
// on [lo, hi] is smallest: the error is 0 at f = 0, and the weighted error equioscillates at
// `degree` + 1 points, found by exchange (Remez).
std::vector<Real> remez(int degree, Real lo, Real hi, Real* level) {
    const int n = degree;  // unknowns c[0 .. n-1], plus the level E
    std::vector<Real> points(size_t(n) + 1), c;
    for (int i = 0; i <= n; ++i) {
        Real f = lo + (hi - lo) * 0.5L * (1 - cosl(M_PIl * (i + 0.5L) / (n + 1)));
        points[size_t(i)] = fabsl(f) < 1e-3L ? f + 0.01L : f;
    }
    for (int iteration = 0; iteration < 60; ++iteration) {
        // f q(f) - sign(f) (-1)^i E 2^f = 2^f - 1 at every point.
        std::vector<std::vector<Real>> a(size_t(n) + 1, std::vector<Real>(size_t(n) + 1));
        std::vector<Real> b(size_t(n) + 1);
        for (int i = 0; i <= n; ++i) {
            const Real f = points[size_t(i)];
            Real power = f;
            for (int k = 0; k < n; ++k, power *= f) a[size_t(i)][size_t(k)] = power;
            a[size_t(i)][size_t(n)] = -(f < 0 ? -1 : 1) * (i % 2 ? -1 : 1) * exp2l(f);
            b[size_t(i)] = exp2l(f) - 1;
        }
        const std::vector<Real> x = solve(a, b);
        c.assign(x.begin(), x.begin() + n);
        *level = fabsl(x[size_t(n)]);
        // The weighted error's local extrema on a fine grid, and the ends, kept alternating.
        const int grid = 100000;
        auto at = [&](int g) { return lo + (hi - lo) * Real(g) / grid; };
        std::vector<Real> extrema{lo};
        Real previous = weighted_error(c, at(0)), current = weighted_error(c, at(1));
        for (int g = 1; g < grid; ++g) {
            const Real next = weighted_error(c, at(g + 1));
            if (fabsl(at(g)) > 1e-9L &&
                ((current > previous && current >= next) || (current < previous && current <= next)))
                extrema.push_back(at(g));
            previous = current;
            current = next;
        }
        extrema.push_back(hi);
        std::vector<Real> chosen;
        for (Real f : extrema) {
            if (!chosen.empty() && (weighted_error(c, f) > 0) == (weighted_error(c, chosen.back()) > 0)) {
                if (fabsl(weighted_error(c, f)) > fabsl(weighted_error(c, chosen.back()))) chosen.back() = f;
            } else {
                chosen.push_back(f);
            }
        }
        while (int(chosen.size()) > n + 1) {
            if (fabsl(weighted_error(c, chosen.front())) < fabsl(weighted_error(c, chosen.back())))
                chosen.erase(chosen.begin());
            else
                chosen.pop_back();
        }
        if (int(chosen.size()) == n + 1) points = chosen;
    }
    return c;
}

// The mean relative error over f uniform in [lo, hi]: what biases a sum of many exponentials.
Real mean_error(const std::vector<Real>& c, Real lo, Real hi) {
    const int samples = 200000;
    Real sum = 0;
    for (int g = 0; g < samples; ++g) sum += relative_error(c, lo + (hi - lo) * (g + 0.5L) / samples);
    return sum / samples;
}

// The coefficients c1, c2, ... of poly_exp2<DEGREE>, as written there.
std::vector<float> header_coefficients(int degree) {
    if (degree == 2) return {0x1.67e7fcp-1f, 0x1.eb3dd4p-3f};
    if (degree == 3) return {0x1.62f5fap-1f, 0x1.f00c4cp-3f, 0x1.c2a218p-5f};
    return {0x1.62e12cp-1f, 0x1.ec0378p-3f, 0x1.c9fc46p-5f, 0x1.3a02ccp-7f};
}

// The degree-3 fit on [0, 1], for the comparison rows: the reduction that rounds x down
// (j = floor(x), f = x - j in [0, 1)), as FlashAttention-4 describes its emulation; poly_exp2
// rounds to the nearest instead. Filled by part 1.
float floor_coefficients[3];

float floor_exp2(float x) {  // poly_exp2<3> with x rounded down, on the host
    x = std::max(x, -127.0f);
    const float t = 12582912.0f + std::floor(x);
    const float f = x - (t - 12582912.0f);
    const float p = std::fma(std::fma(std::fma(floor_coefficients[2], f, floor_coefficients[1]), f,
                                      floor_coefficients[0]), f, 1.0f);
    return scale_by_exponent(t, p);
}

void part_remez() {
    std::printf("== 1. The polynomial: 2^f ~ 1 + f (c1 + c2 f + ...), Remez, smallest largest relative error\n");
    std::printf("reduction       degree  largest |rel. error|  mean rel. error  coefficients c1, c2, ... (long double; as float in hex)\n");
    for (int nearest = 0; nearest < 2; ++nearest) {
        const Real lo = nearest ? -0.5L : 0.0L, hi = nearest ? 0.5L : 1.0L;
        for (int degree = 1; degree <= 5; ++degree) {
            Real level = 0;
            const std::vector<Real> c = remez(degree, lo, hi, &level);
            std::printf("%-15s %6d  %20.3Le  %15.2Le  ", nearest ? "f in [-1/2,1/2]" : "f in [0, 1)", degree,
                        level, mean_error(c, lo, hi));
            for (Real value : c) std::printf("%.10Lf ", value);
            std::printf("(");
            for (size_t k = 0; k < c.size(); ++k) std::printf("%s%a", k ? " " : "", double(float(c[k])));
            std::printf(")");
            if (nearest && degree >= 2 && degree <= 4) {
                const std::vector<float> used = header_coefficients(degree);
                bool same = used.size() == c.size();
                for (size_t k = 0; same && k < c.size(); ++k) same = used[k] == float(c[k]);
                std::printf("  poly_exp2: %s", same ? "these, rounded to float" : "DIFFERENT");
            }
            if (!nearest && degree == 3)
                for (int k = 0; k < 3; ++k) floor_coefficients[k] = float(c[size_t(k)]);
            std::printf("\n");
        }
    }
    std::printf("\n");
}

// ---- 2. Every float x in [-127, 0] -------------------------------------------------------------

float bits_to_float(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}

struct Sweep {
    double max_relative = 0, worst_x = 0;  // over x in [-126, 0]
    double sum_relative = 0, sum_squared = 0;
    uint64_t normal = 0;                   // floats in [-126, 0]
    double max_absolute_low = 0;           // over x in (-127, -126)
    uint64_t nonzero_at_or_below = 0;      // results != +0 for x <= -127
    uint64_t bf16_differs = 0;             // bf16(result) != bf16(correctly rounded float 2^x), [-126, 0]
    void merge(const Sweep& o) {
        if (o.max_relative > max_relative) { max_relative = o.max_relative; worst_x = o.worst_x; }
        sum_relative += o.sum_relative;
        sum_squared += o.sum_squared;
        normal += o.normal;
        max_absolute_low = std::max(max_absolute_low, o.max_absolute_low);
        nonzero_at_or_below += o.nonzero_at_or_below;
        bf16_differs += o.bf16_differs;
    }
};

// Negative floats from -0 (0x80000000) to -127 (0xC2FE0000) and below to -128, by bit pattern.
constexpr uint32_t MINUS_ZERO = 0x80000000u, MINUS_127 = 0xC2FE0000u, MINUS_128 = 0xC3000000u;

template <class Function>
Sweep sweep(Function function) {
    const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
    std::vector<Sweep> partial(workers);
    std::vector<std::thread> threads;
    const uint64_t first = MINUS_ZERO, last = MINUS_128, count = last - first + 1;
    for (unsigned w = 0; w < workers; ++w) {
        threads.emplace_back([&, w] {
            Sweep& s = partial[w];
            const uint64_t begin = first + count * w / workers, end = first + count * (w + 1) / workers;
            for (uint64_t bits = begin; bits < end; ++bits) {
                const float x = bits_to_float(uint32_t(bits));
                const float y = function(x);
                const double exact = std::exp2(double(x));
                if (x >= -126.0f) {
                    const double relative = std::fabs(double(y) - exact) / exact;
                    if (relative > s.max_relative) { s.max_relative = relative; s.worst_x = x; }
                    s.sum_relative += (double(y) - exact) / exact;
                    s.sum_squared += relative * relative;
                    ++s.normal;
                    if (bf16_bits_from_float(y) != bf16_bits_from_float(float(exact))) ++s.bf16_differs;
                } else if (x > -127.0f) {
                    s.max_absolute_low = std::max(s.max_absolute_low, std::fabs(double(y) - exact));
                } else if (y != 0.0f || std::signbit(y)) {
                    ++s.nonzero_at_or_below;
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    Sweep total;
    for (const Sweep& s : partial) total.merge(s);
    return total;
}

template <class Function>
void sweep_line(const char* name, Function function) {
    const Sweep s = sweep(function);
    std::printf("%-25s %10.3e (2^%5.1f) at x = %-11.7g %10.3e %10.3e %12.2e  %6.2f%%  %" PRIu64 "\n",
                name, s.max_relative, std::log2(s.max_relative), s.worst_x,
                s.sum_relative / double(s.normal), std::sqrt(s.sum_squared / double(s.normal)),
                s.max_absolute_low, 100.0 * double(s.bf16_differs) / double(s.normal),
                s.nonzero_at_or_below);
}

void part_sweep() {
    std::printf("== 2. Every float x in [-128, 0] (%" PRIu64 " values; %" PRIu64 " of them in [-126, 0]), against exp2 in double\n",
                uint64_t(MINUS_128 - MINUS_ZERO + 1), uint64_t(0xC2FC0000u - MINUS_ZERO + 1));
    std::printf("relative error over [-126, 0]: largest (where), mean (the bias), RMS; largest absolute error over (-127, -126);\n"
                "how often bf16(result) differs from bf16(correctly rounded 2^x) over [-126, 0]; results other than +0 at x <= -127\n");
    std::printf("function                  largest                            mean       RMS        abs (-127,-126)  bf16 moved  not +0\n");
    const Sweep rounded = sweep([](float x) { return float(std::exp2(double(x))); });
    std::printf("2^x rounded to float      %10.3e (2^%5.1f) at x = %-11.7g %10.3e %10.3e %12.2e  %6.2f%%  (%" PRIu64 ": subnormals, as IEEE has them)\n",
                rounded.max_relative, std::log2(rounded.max_relative), rounded.worst_x,
                rounded.sum_relative / double(rounded.normal),
                std::sqrt(rounded.sum_squared / double(rounded.normal)), rounded.max_absolute_low,
                100.0 * double(rounded.bf16_differs) / double(rounded.normal), rounded.nonzero_at_or_below);
    sweep_line("poly_exp2<2>", [](float x) { return poly_exp2<2>(x); });
    sweep_line("poly_exp2<3> (variant)", [](float x) { return poly_exp2<3>(x); });
    sweep_line("poly_exp2<4>", [](float x) { return poly_exp2<4>(x); });
    sweep_line("degree 3, x rounded down", floor_exp2);
    // PTX ISA, ex2: "The maximum ulp error is 2 ulp from correctly rounded result across the full
    // range of inputs"; with .ftz, subnormal results are flushed to +0. 2 ulp from the rounded
    // result is at most 2.5 ulp from 2^x; an ulp is at most 2^-23 of the value.
    const double documented = 2.5 * std::ldexp(1.0, -23);
    std::printf("ex2.approx.ftz.f32        %10.3e (2^%5.1f) documented bound (2 ulp from the correctly rounded result, <= 2.5 * 2^-23 relative);\n"
                "                          results below 2^-126 are +0 (abs error < 2^-126 = %.2e)\n",
                documented, std::log2(documented), std::ldexp(1.0, -126));
    std::printf("bf16 rounding of P        %10.3e (2^-8.0) unit roundoff: the relative error P already has when it enters P V\n",
                std::ldexp(1.0, -8));
    // Edge inputs.
    const float specials[] = {-INFINITY, NAN, -1e30f, -127.0f, -126.5f, -126.0f, -1.0f, -0.0f, 0.0f,
                              1e-7f, 0.5f, 1.0f, 10.0f};
    std::printf("edge inputs, poly_exp2<3>: ");
    for (float x : specials) std::printf("%g -> %g; ", x, poly_exp2<3>(x));
    std::printf("\n\n");
}

// ---- 3. The suite's checks on an emulated kernel ------------------------------------------------

constexpr int BLOCK_KV = 128;  // Tiling64's keys per tile

// Does the kernel compute the exponential of tile column `column` on the FMA pipe, with
// `per_thread` of a thread's 64 scores per tile there? A thread holds 32 columns of each of its
// two rows: 8n + 2 (lane % 4) + i, i.e. its c-th = 2n + i, and the variant puts c = 32/q - 1,
// 2 * 32/q - 1, ... on the FMA pipe, q = per_thread / 2 of each row (on_fma in
// docs/profiles/10_pingpong/variant-exp2-on-fma.patch).
bool on_fma(int column, int per_thread) {
    if (per_thread == 0) return false;
    const int c = 2 * (column / 8) + column % 2;
    const int stride = 64 / per_thread;
    return c % stride == stride - 1;
}

// Stage 10's forward for one shape, emulated: per tile of 128 keys the running maximum, alpha by
// exp2 (the exponent unit's, here 2^x rounded to float), each score's exponential by
// `exponential` or poly_exp2 where on_fma says so, l in FP32, O += bf16(P) V in FP32, O / l to
// bf16, LSE = m * scale + ln(l).
// degree: 2, 3, 4 for poly_exp2<degree>; 0 for degree 3 with x rounded down (floor_exp2).
void emulated_stage10(const AttentionShape& shape, const float* q, const float* k, const float* v,
                      float* o, float* lse, int per_thread, int degree) {
    const int64_t D = shape.head_dim, Lq = shape.len_q;
    const float scale = shape.softmax_scale();
    const float scale_log2 = scale * 1.4426950408889634f;
    auto exp2_rounded = [](float x) { return float(std::exp2(double(x))); };
    parallel_for(int64_t(shape.batch) * shape.heads * Lq, [&](int64_t row_index) {
        const QueryRow row = query_row(shape, q, k, v, row_index);
        const int64_t keys = row.keys;
        float m = -INFINITY, l = 0;
        std::vector<float> accumulator(size_t(D), 0.0f), s(BLOCK_KV);
        for (int64_t start = 0; start < keys; start += BLOCK_KV) {
            const int width = int(std::min<int64_t>(BLOCK_KV, keys - start));
            float m_new = m;
            for (int j = 0; j < width; ++j) {
                double dot = 0;
                for (int64_t d = 0; d < D; ++d) dot += double(row.q[d]) * double(row.k[(start + j) * D + d]);
                s[size_t(j)] = float(dot);  // S in FP32, as wgmma accumulates it
                m_new = std::max(m_new, s[size_t(j)]);
            }
            const float max_offset = m_new * scale_log2;
            const float alpha = exp2_rounded(m * scale_log2 - max_offset);  // m = -inf: 0
            l *= alpha;
            for (auto& value : accumulator) value *= alpha;
            for (int j = 0; j < width; ++j) {
                const float x = std::fma(s[size_t(j)], scale_log2, -max_offset);
                float p;
                if (!on_fma(j, per_thread)) p = exp2_rounded(x);
                else if (degree == 2) p = poly_exp2<2>(x);
                else if (degree == 3) p = poly_exp2<3>(x);
                else if (degree == 4) p = poly_exp2<4>(x);
                else p = floor_exp2(x);
                l += p;
                const float p_bf16 = round_to_bf16(p);
                for (int64_t d = 0; d < D; ++d) accumulator[size_t(d)] += p_bf16 * row.v[(start + j) * D + d];
            }
            m = m_new;
        }
        for (int64_t d = 0; d < D; ++d) o[row_index * D + d] = round_to_bf16(accumulator[size_t(d)] / l);
        lse[row_index] = m * scale + std::log(l);
    });
}

struct Verdict {
    double worst_o_over_plain = 0;  // largest O error / (2 * plain + 1e-6): > 1 fails
    double worst_o = 0;             // largest O relative L2
    double worst_lse = 0;           // largest LSE relative L2 among shapes whose max |error| > 1e-5
    double worst_lse_any = 0;       // largest LSE relative L2 over all shapes
    int failures = 0;
    std::string first_failure;
};

void part_suite() {
    std::printf("== 3. The suite's checks (common/test_forward.cpp) on stage 10's D = 64 forward emulated on the host\n");
    std::printf("O: relative L2 <= 1e-2 and <= 2 x plain bf16 + 1e-6; LSE: relative L2 <= 1e-5 or max abs <= 1e-5.\n"
                "Shapes: 1x1xNxN for N in the suite's edge lengths and 1x2x4099x4099, causal and not, D = 64,\n"
                "inputs randn + 0.5 rounded to bf16 (the suite's), three seeds each. Per thread and tile of 128 keys\n"
                "k of the 64 scores take poly_exp2 (columns as in the variant); k = 0 is the kernel as committed.\n");
    std::vector<AttentionShape> shapes;
    for (bool causal : {false, true}) {
        for (int n : {1, 2, 17, 63, 64, 65, 127, 128, 129, 1000}) shapes.push_back(make_shape(1, 1, n, n, 64, causal));
        shapes.push_back(make_shape(2, 2, 77, 100, 64, causal));
        shapes.push_back(make_shape(2, 2, 100, 77, 64, causal));
        shapes.push_back(make_shape(1, 2, 4099, 4099, 64, causal));
    }
    struct Inputs { AttentionShape shape; std::vector<float> q, k, v; std::vector<double> o_ref, lse_ref; double plain; };
    std::vector<Inputs> cases;
    for (const AttentionShape& shape : shapes) {
        for (uint64_t seed : {11u, 22u, 33u}) {
            Inputs c{shape, rounded_to_bf16(random_inputs(size_t(shape.q_elements()), seed)),
                     rounded_to_bf16(random_inputs(size_t(shape.kv_elements()), seed + 1)),
                     rounded_to_bf16(random_inputs(size_t(shape.kv_elements()), seed + 2)), {}, {}, 0};
            c.o_ref.resize(c.q.size());
            c.lse_ref.resize(size_t(shape.lse_elements()));
            reference_forward(shape, c.q.data(), c.k.data(), c.v.data(), c.o_ref.data(), c.lse_ref.data());
            std::vector<float> plain(c.q.size());
            emulated_bf16_forward(shape, c.q.data(), c.k.data(), c.v.data(), plain.data());
            c.plain = compare(plain, c.o_ref).relative_l2;
            cases.push_back(std::move(c));
        }
    }
    std::printf("\nk per thread (share)  function        largest O error  largest O / (2 plain)  largest LSE rel. L2  checks\n");
    const std::pair<int, int> configurations[] = {{0, 3}, {2, 3}, {4, 3}, {8, 3}, {16, 3}, {32, 3}, {64, 3},
                                                  {4, 2}, {8, 2}, {16, 2}, {64, 2}, {64, 4}, {8, 0}, {16, 0}, {64, 0}};
    for (auto [per_thread, degree] : configurations) {
        Verdict verdict;
        for (const Inputs& c : cases) {
            std::vector<float> o(c.q.size()), lse(c.lse_ref.size());
            emulated_stage10(c.shape, c.q.data(), c.k.data(), c.v.data(), o.data(), lse.data(), per_thread, degree);
            const ErrorStats o_error = compare(o, c.o_ref), lse_error = compare(lse, c.lse_ref);
            const double ratio = o_error.relative_l2 / (2 * c.plain + 1e-6);
            verdict.worst_o = std::max(verdict.worst_o, o_error.relative_l2);
            verdict.worst_o_over_plain = std::max(verdict.worst_o_over_plain, ratio);
            verdict.worst_lse_any = std::max(verdict.worst_lse_any, lse_error.relative_l2);
            if (lse_error.max_abs > 1e-5) verdict.worst_lse = std::max(verdict.worst_lse, lse_error.relative_l2);
            const bool fail = o_error.non_finite || lse_error.non_finite || o_error.relative_l2 > 1e-2 ||
                              ratio > 1 || (lse_error.relative_l2 > 1e-5 && lse_error.max_abs > 1e-5);
            if (fail && !verdict.failures++)
                verdict.first_failure = c.shape.to_string() + ": O " + o_error.to_string() + ", LSE " + lse_error.to_string();
        }
        const std::string function = degree ? "poly_exp2<" + std::to_string(degree) + ">" : "3, rounded down";
        std::printf("%3d (%5.1f%%)          %-15s %10.3e           %6.3f            %10.3e        %s\n",
                    per_thread, 100.0 * per_thread / 64, function.c_str(), verdict.worst_o, verdict.worst_o_over_plain,
                    verdict.worst_lse_any,
                    verdict.failures ? ("FAIL in " + std::to_string(verdict.failures) + " of " +
                                        std::to_string(cases.size()) + ", first " + verdict.first_failure).c_str()
                                     : ("pass (" + std::to_string(cases.size()) + " cases)").c_str());
    }
    std::printf("\n");
}

// ---- 4. On the GPU ------------------------------------------------------------------------------

__global__ void device_exponentials(uint32_t first, uint32_t count, float* poly, float* hardware) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const float x = __uint_as_float(first + i);
        poly[i] = poly_exp2<3>(x);
        hardware[i] = fast_exp2(x);
    }
}

void part_device() {
    std::printf("== 4. On the GPU: poly_exp2<3> and ex2.approx.ftz.f32 for every float x in [-127, 0]\n");
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        cudaGetLastError();
        std::printf("skipped: no GPU\n");
        return;
    }
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, 0);
    std::printf("%s (compute capability %d.%d)\n", properties.name, properties.major, properties.minor);
    const uint32_t first = MINUS_ZERO, total = MINUS_127 - MINUS_ZERO + 1, chunk = 1u << 26;
    float *poly = nullptr, *hardware = nullptr;
    if (cudaMalloc(&poly, chunk * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&hardware, chunk * sizeof(float)) != cudaSuccess) {
        std::printf("skipped: cudaMalloc failed\n");
        return;
    }
    std::vector<float> poly_host(chunk), hardware_host(chunk);
    uint64_t poly_mismatches = 0, hardware_low_nonzero = 0, normal = 0;
    double hardware_max = 0, hardware_worst_x = 0, hardware_max_ulp = 0;
    for (uint32_t start = 0; start < total; start += chunk) {
        const uint32_t count = std::min(chunk, total - start);
        device_exponentials<<<1024, 256>>>(first + start, count, poly, hardware);
        if (cudaMemcpy(poly_host.data(), poly, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(hardware_host.data(), hardware, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
            std::printf("failed: %s\n", cudaGetErrorString(cudaGetLastError()));
            return;
        }
        for (uint32_t i = 0; i < count; ++i) {
            const float x = bits_to_float(first + start + i);
            const float host = poly_exp2<3>(x);
            if (std::memcmp(&host, &poly_host[i], 4) != 0) ++poly_mismatches;
            const double exact = std::exp2(double(x));
            if (x >= -126.0f) {
                ++normal;
                const double relative = std::fabs(double(hardware_host[i]) - exact) / exact;
                if (relative > hardware_max) { hardware_max = relative; hardware_worst_x = x; }
                const float rounded = float(exact);
                const double ulp = std::ldexp(1.0, std::ilogb(rounded) - 23);
                hardware_max_ulp = std::max(hardware_max_ulp, std::fabs(double(hardware_host[i]) - double(rounded)) / ulp);
            } else if (hardware_host[i] != 0.0f) {
                ++hardware_low_nonzero;
            }
        }
    }
    cudaFree(poly);
    cudaFree(hardware);
    std::printf("poly_exp2<3>: device and host differ at %" PRIu64 " of %u inputs\n", poly_mismatches, total);
    std::printf("ex2.approx.ftz.f32 over [-126, 0] (%" PRIu64 " inputs): largest relative error %.3e (2^%.1f) at x = %.7g, "
                "largest distance from the correctly rounded float %.2f ulp (documented: 2); "
                "results other than +0 below -126: %" PRIu64 "\n",
                normal, hardware_max, std::log2(hardware_max), hardware_worst_x, hardware_max_ulp, hardware_low_nonzero);
}

}  // namespace

int main() {
    part_remez();
    part_sweep();
    part_suite();
    part_device();
    return 0;
}
