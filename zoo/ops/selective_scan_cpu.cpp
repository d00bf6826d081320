// Fused CPU selective scan (Mamba-1's S6 core), forward and backward, for float and double.
//
// Per channel d of batch row b, with group g = d / (dim / G):
//     a_t = exp(dt_t * A_d)                     (n)   per-step decay
//     h_t = a_t * h_{t-1} + dt_t * u_t * B_t    (n),  h_{-1} = 0
//     y_t = sum_k C_t[k] * h_t[k]
// Layouts, all contiguous: u, dt, y, du, ddt (batch, dim, L); A (dim, n);
// B, C, dB, dC (batch, G, L, n); h_last (batch, dim, n); h_chunks (batch, dim, ceil(L/T), n),
// the state entering each chunk of T steps, which is all the backward keeps.
//
// One (b, d) row is scanned at a time, the loop over n innermost: it is branch-free over
// restrict pointers so that it vectorises, which is why float has its own exp (std::exp
// would be a scalar libm call per element). No threads here: the caller splits the batch
// into slices, and a slice owns every output it writes (dB and dC included, since the
// channels of a group share a batch row), so slices never race.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using i64 = std::int64_t;  // every size and index: batch * dim * L * n can pass 2^31

// exp for float, vectorisable: x = k ln2 + r with |r| <= ln2 / 2, e^r by Cephes' degree-5
// polynomial (within 1 ulp of the exact value), 2^k written into the exponent bits. The
// input is clamped so that 2^k stays a normal float: below the clamp the result is 0 (the
// true value is a denormal at most), above it 2.2e38 (the scan's dt A <= 0 never gets there).
inline float exp_approx(float x) {
    const float lo = -87.3f, hi = 88.3f;
    // lo > x ? lo : x is maxps(lo, x), which passes a NaN x through (as does the min).
    float xc = lo > x ? lo : x;
    xc = hi < xc ? hi : xc;
    const float k = std::nearbyint(xc * 1.44269504088896341f);
    // fma, so that -fassociative-math cannot fold the two parts of ln2 into one constant
    const float r = std::fma(k, 2.12194440e-4f, std::fma(k, -0.693359375f, xc));
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : er * scale;
}

// double exists for exact tests; its speed does not matter.
inline double exp_approx(double x) { return std::exp(x); }

// One step forward of one row: h <- a * h + x * B_t (the decays a kept if KeepDecay);
// returns y_t.
template <typename S, bool KeepDecay>
inline S step(S* __restrict h, S* __restrict a_out, const S* __restrict A,
              const S* __restrict Bt, const S* __restrict Ct, S dt, S x, i64 n) {
    S y = 0;
    for (i64 k = 0; k < n; ++k) {
        const S a = exp_approx(dt * A[k]);
        const S hk = a * h[k] + x * Bt[k];
        h[k] = hk;
        y += Ct[k] * hk;
        if (KeepDecay) a_out[k] = a;
    }
    return y;
}

// N > 0: n known at compile time (the loops over n unrolled into whole vectors); 0: any n.
template <typename S, i64 N>
void forward(const S* u, const S* dt, const S* A, const S* B, const S* C, S* y, S* h_last,
             S* h_chunks, i64 batch, i64 dim, i64 L, i64 n_, i64 G, i64 T) {
    const i64 n = N ? N : n_;
    const i64 nc = (L + T - 1) / T, per_group = dim / G;
    std::vector<S> h(n);
    for (i64 b = 0; b < batch; ++b)
        for (i64 d = 0; d < dim; ++d) {
            const i64 row = b * dim + d;
            const S* Bg = B + (b * G + d / per_group) * L * n;
            const S* Cg = C + (b * G + d / per_group) * L * n;
            std::fill(h.begin(), h.end(), S(0));
            for (i64 c = 0; c < nc; ++c) {
                std::copy(h.begin(), h.end(), h_chunks + (row * nc + c) * n);
                for (i64 t = c * T; t < std::min(L, (c + 1) * T); ++t) {
                    const S dtt = dt[row * L + t];
                    y[row * L + t] = step<S, false>(h.data(), nullptr, A + d * n, Bg + t * n,
                                                    Cg + t * n, dtt, dtt * u[row * L + t], n);
                }
            }
            std::copy(h.begin(), h.end(), h_last + row * n);
        }
}

// One step backward of one row. gh holds dL/dh_t from the steps after t; on return it holds
// dL/dh_{t-1}. Accumulates into dBt, dCt, dA; sets gB = sum_k g B_t and gA = sum_k g
// dh_t/d(dt A) A, with g = dL/dh_t, from which the caller forms du_t and ddt_t.
template <typename S>
inline void step_back(S* __restrict gh, S* __restrict dA, S* __restrict dBt, S* __restrict dCt,
                      const S* __restrict hprev, const S* __restrict hcur,
                      const S* __restrict a, const S* __restrict A, const S* __restrict Bt,
                      const S* __restrict Ct, S dy, S x, S dt, i64 n, S& gB, S& gA) {
    S sum_gB = 0, sum_gA = 0;
    for (i64 k = 0; k < n; ++k) {
        const S g = gh[k] + dy * Ct[k];  // dL/dh_t[k]
        dCt[k] += dy * hcur[k];
        dBt[k] += g * x;
        sum_gB += g * Bt[k];
        const S ga = g * hprev[k] * a[k];  // dL/d(dt A[k]), through a = exp(dt A)
        sum_gA += ga * A[k];
        dA[k] += ga * dt;
        gh[k] = g * a[k];
    }
    gB = sum_gB;
    gA = sum_gA;
}

// Reverse over chunks; each chunk's states and decays are recomputed from h_chunks into
// hs ((T + 1) x n: the entering state, then the state after each step) and as (T x n).
template <typename S, i64 N>
void backward(const S* u, const S* dt, const S* A, const S* B, const S* C, const S* h_chunks,
              const S* dy, const S* dh_last, S* du, S* ddt, S* dA, S* dB, S* dC,
              i64 batch, i64 dim, i64 L, i64 n_, i64 G, i64 T) {
    const i64 n = N ? N : n_;
    const i64 nc = (L + T - 1) / T, per_group = dim / G;
    std::fill(dB, dB + batch * G * L * n, S(0));
    std::fill(dC, dC + batch * G * L * n, S(0));
    const i64 span = std::min(T, L);  // the longest chunk
    std::vector<S> hs((span + 1) * n), as(span * n), gh(n);
    for (i64 b = 0; b < batch; ++b)
        for (i64 d = 0; d < dim; ++d) {
            const i64 row = b * dim + d, group = (b * G + d / per_group) * L * n;
            const S *Ad = A + d * n, *Bg = B + group, *Cg = C + group;
            S *dBg = dB + group, *dCg = dC + group, *dAd = dA + row * n;
            std::fill(dAd, dAd + n, S(0));
            for (i64 k = 0; k < n; ++k) gh[k] = dh_last ? dh_last[row * n + k] : S(0);
            for (i64 c = nc - 1; c >= 0; --c) {
                const i64 t0 = c * T, m = std::min(L, t0 + T) - t0;
                std::copy(h_chunks + (row * nc + c) * n, h_chunks + (row * nc + c + 1) * n,
                          hs.begin());
                for (i64 j = 0; j < m; ++j) {
                    const i64 t = t0 + j;
                    const S dtt = dt[row * L + t];
                    S* h = hs.data() + (j + 1) * n;  // stepped in place from a copy of h_{t-1}
                    std::copy(h - n, h, h);
                    step<S, true>(h, as.data() + j * n, Ad, Bg + t * n, Cg + t * n, dtt,
                                  dtt * u[row * L + t], n);
                }
                for (i64 j = m - 1; j >= 0; --j) {
                    const i64 t = t0 + j, i = row * L + t;
                    S gB, gA;
                    step_back<S>(gh.data(), dAd, dBg + t * n, dCg + t * n, hs.data() + j * n,
                                 hs.data() + (j + 1) * n, as.data() + j * n, Ad, Bg + t * n,
                                 Cg + t * n, dy[i], dt[i] * u[i], dt[i], n, gB, gA);
                    du[i] = dt[i] * gB;  // h_t gets dt u B_t
                    ddt[i] = u[i] * gB + gA;
                }
            }
        }
}

}  // namespace

// n == 16 (Mamba's d_state) gets its own instance: with the loops over n unrolled into two
// whole vectors it runs 20% faster than the instance for any n.
#define LINBENCH_SCAN_ENTRY_POINTS(S, suffix)                                                 \
    extern "C" void selective_scan_fwd_##suffix(                                              \
        const S* u, const S* dt, const S* A, const S* B, const S* C, S* y, S* h_last,         \
        S* h_chunks, i64 batch, i64 dim, i64 L, i64 n, i64 G, i64 T) {                        \
        (n == 16 ? forward<S, 16> : forward<S, 0>)(u, dt, A, B, C, y, h_last, h_chunks,       \
                                                   batch, dim, L, n, G, T);                   \
    }                                                                                         \
    extern "C" void selective_scan_bwd_##suffix(                                              \
        const S* u, const S* dt, const S* A, const S* B, const S* C, const S* h_chunks,       \
        const S* dy, const S* dh_last, S* du, S* ddt, S* dA, S* dB, S* dC, i64 batch,         \
        i64 dim, i64 L, i64 n, i64 G, i64 T) {                                                \
        (n == 16 ? backward<S, 16> : backward<S, 0>)(u, dt, A, B, C, h_chunks, dy, dh_last,   \
                                                     du, ddt, dA, dB, dC, batch, dim, L, n,   \
                                                     G, T);                                   \
    }

LINBENCH_SCAN_ENTRY_POINTS(float, f32)
LINBENCH_SCAN_ENTRY_POINTS(double, f64)

// The float exp alone, so that a test can measure its error in ulps.
extern "C" void exp_approx_f32(const float* x, float* out, i64 count) {
    for (i64 i = 0; i < count; ++i) out[i] = exp_approx(x[i]);
}
