// Fused CPU selective scan (Mamba-1's S6 core), forward and backward, for float and double.
//
// Per channel d of batch row b, with group g = d / (dim / G):
//     dt_t = softplus(dt_raw_t + bias_d)          (the identity without softplus; bias 0 if none)
//     a_t  = exp(dt_t * A_d)                      (n)   per-step decay
//     h_t  = a_t * h_{t-1} + dt_t * u_t * B_t     (n),  h_{-1} = 0
//     y_t  = (sum_k C_t[k] h_t[k] + D_d u_t) * silu(z_t)   (no skip without D, no gate without z)
// Layouts: u, dt_raw, z (batch, L, dim) with dim contiguous and any batch and time strides
// (Mamba's views of its projections, read in place); B, C (batch, G, L, n) with n
// contiguous and any other strides; y, du, ddt, dz (batch, L, dim), dB, dC (batch, G, L, n),
// h_last (batch, dim, n), h_chunks (batch, dim, ceil(L/T), n) and dA (batch, dim, n), dD and
// dbias (batch, dim) contiguous, the last three per batch row (the caller sums them).
// h_chunks, the state entering each chunk of T steps, is all the backward keeps.
//
// Per batch row: one pass over (L, dim) forms every step size (vectorised over dim), one
// (b, d) row at a time is scanned with the loop over n innermost (branch-free over restrict
// pointers, so it vectorises: float has its own exp and log1p, since std::exp would be a
// scalar libm call per element), and one more pass over (L, dim) applies the skip and the
// gate. No threads here: the caller splits the batch into slices, and a slice owns every
// output it writes (dB and dC included, since the channels of a group share a batch row).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_math.h"

namespace {

using i64 = std::int64_t;  // every size and index: batch * dim * L * n can pass 2^31
using linbench::exp_approx;
using linbench::sigmoid;

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

// log(1 + e) for e in [0, 1], vectorisable: 2 atanh(s) with s = e / (2 + e) <= 1/3, by its
// series to s^15 (the first term left out is below 2e-9 relative).
inline float log1p_unit(float e) {
    const float s = e / (2.0f + e), s2 = s * s;
    float p = 1.0f / 15;
    p = p * s2 + 1.0f / 13;
    p = p * s2 + 1.0f / 11;
    p = p * s2 + 1.0f / 9;
    p = p * s2 + 1.0f / 7;
    p = p * s2 + 1.0f / 5;
    p = p * s2 + 1.0f / 3;
    return 2.0f * s * (p * s2 + 1.0f);
}
inline double log1p_unit(double e) { return std::log1p(e); }

template <typename S>
inline S softplus(S x) {  // max(x, 0) + log(1 + exp(-|x|)): no overflow at any x
    const S ax = x < 0 ? -x : x;
    return (x > 0 ? x : S(0)) + log1p_unit(exp_approx(-ax));
}

// Strides, in elements, of the inputs that need not be contiguous.
struct Strides {
    i64 u_b, u_t, dt_b, dt_t, z_b, z_t, B_b, B_g, B_t, C_b, C_g, C_t;
};

// What both passes need of one batch row b: the step sizes, and where each input starts.
template <typename S>
struct Row {
    const S *u, *dt_raw, *z, *B, *C;
    Row(const S* u_, const S* dt_, const S* z_, const S* B_, const S* C_, const Strides& s, i64 b)
        : u(u_ + b * s.u_b), dt_raw(dt_ + b * s.dt_b), z(z_ ? z_ + b * s.z_b : nullptr),
          B(B_ + b * s.B_b), C(C_ + b * s.C_b) {}
};

// dts[t * dim + d] = the step size of (t, d) in batch row r.
template <typename S>
void step_sizes(const Row<S>& r, const S* bias, bool use_softplus, const Strides& s, S* dts,
                i64 dim, i64 L) {
    // Each case its own branch-free loop: with the choices inside, GCC keeps the loop scalar.
    const S* __restrict bs = bias;
    for (i64 t = 0; t < L; ++t) {
        const S* __restrict raw = r.dt_raw + t * s.dt_t;
        S* __restrict out = dts + t * dim;
        if (bs && use_softplus)
            for (i64 d = 0; d < dim; ++d) out[d] = softplus(raw[d] + bs[d]);
        else if (use_softplus)
            for (i64 d = 0; d < dim; ++d) out[d] = softplus(raw[d]);
        else if (bs)
            for (i64 d = 0; d < dim; ++d) out[d] = raw[d] + bs[d];
        else
            std::copy(raw, raw + dim, out);
    }
}

// N > 0: n known at compile time (the loops over n unrolled into whole vectors); 0: any n.
template <typename S, i64 N>
void forward(const S* u, const S* dt_raw, const S* z, const S* A, const S* Dskip, const S* bias,
             const S* B, const S* C, const Strides& s, S* y, S* y_pre, S* h_last, S* h_chunks, i64 batch,
             i64 dim, i64 L, i64 n_, i64 G, i64 T, bool use_softplus) {
    const i64 n = N ? N : n_;
    const i64 nc = (L + T - 1) / T, per_group = dim / G;
    std::vector<S> h(n), dts(L * dim);
    for (i64 b = 0; b < batch; ++b) {
        const Row<S> r(u, dt_raw, z, B, C, s, b);
        step_sizes(r, bias, use_softplus, s, dts.data(), dim, L);
        S* yb = y + b * L * dim;  // the scan's y first, gated below
        // One channel at a time (scanning eight together, their inputs at a step sharing a
        // cache line, made the backward 40% slower).
        for (i64 d = 0; d < dim; ++d) {
            const i64 row = b * dim + d, g = d / per_group;
            const S *Bg = r.B + g * s.B_g, *Cg = r.C + g * s.C_g;
            std::fill(h.begin(), h.end(), S(0));
            for (i64 c = 0; c < nc; ++c) {
                std::copy(h.begin(), h.end(), h_chunks + (row * nc + c) * n);
                for (i64 t = c * T; t < std::min(L, (c + 1) * T); ++t) {
                    const S dtt = dts[t * dim + d];
                    yb[t * dim + d] = step<S, false>(h.data(), nullptr, A + d * n, Bg + t * s.B_t,
                                                     Cg + t * s.C_t, dtt, dtt * r.u[t * s.u_t + d], n);
                }
            }
            std::copy(h.begin(), h.end(), h_last + row * n);
        }
        const S* __restrict Dk = Dskip;
        for (i64 t = 0; t < L; ++t) {
            S* __restrict yt = yb + t * dim;
            const S* __restrict ut = r.u + t * s.u_t;
            if (Dk)
                for (i64 d = 0; d < dim; ++d) yt[d] += Dk[d] * ut[d];
            if (r.z) {  // the gate's input kept for the backward
                const S* __restrict zt = r.z + t * s.z_t;
                S* __restrict pre = y_pre + b * L * dim + t * dim;
                for (i64 d = 0; d < dim; ++d) {
                    pre[d] = yt[d];
                    yt[d] *= zt[d] * sigmoid(zt[d]);
                }
            }
        }
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
// hs ((T + 1) x n: the entering state, then the state after each step) and as (T x n). Per
// batch row, a pass over (L, dim) first forms the step sizes and the gradient reaching the
// scan's y (through the gate); one after the rows forms the gradients of the skip, the gate
// and the raw step (through softplus) from what the rows left.
template <typename S, i64 N>
void backward(const S* u, const S* dt_raw, const S* z, const S* A, const S* Dskip, const S* bias,
              const S* B, const S* C, const Strides& s, const S* h_chunks, const S* y_pre, const S* dy,
              const S* dh_last, S* du, S* ddt, S* dz, S* dA, S* dB, S* dC, S* dD, S* dbias,
              i64 batch, i64 dim, i64 L, i64 n_, i64 G, i64 T, bool use_softplus) {
    const i64 n = N ? N : n_;
    const i64 nc = (L + T - 1) / T, per_group = dim / G;
    std::fill(dB, dB + batch * G * L * n, S(0));
    std::fill(dC, dC + batch * G * L * n, S(0));
    const i64 span = std::min(T, L);  // the longest chunk
    std::vector<S> hs((span + 1) * n), as(span * n), gh(n), dts(L * dim), dys(L * dim);
    for (i64 b = 0; b < batch; ++b) {
        const Row<S> r(u, dt_raw, z, B, C, s, b);
        step_sizes(r, bias, use_softplus, s, dts.data(), dim, L);
        const S* dyb = dy + b * L * dim;
        for (i64 t = 0; t < L; ++t) {  // dL/d(the scan's y) = dy * silu(z)
            const S* __restrict dyt = dyb + t * dim;
            S* __restrict out = dys.data() + t * dim;
            if (r.z) {
                const S* __restrict zt = r.z + t * s.z_t;
                for (i64 d = 0; d < dim; ++d) out[d] = dyt[d] * zt[d] * sigmoid(zt[d]);
            } else {
                std::copy(dyt, dyt + dim, out);
            }
        }
        S *dub = du + b * L * dim, *ddtb = ddt + b * L * dim;
        for (i64 d = 0; d < dim; ++d) {
            const i64 row = b * dim + d, g = d / per_group;
            const S *Ad = A + d * n, *Bg = r.B + g * s.B_g, *Cg = r.C + g * s.C_g;
            S *dBg = dB + (b * G + g) * L * n, *dCg = dC + (b * G + g) * L * n, *dAd = dA + row * n;
            std::fill(dAd, dAd + n, S(0));
            for (i64 k = 0; k < n; ++k) gh[k] = dh_last ? dh_last[row * n + k] : S(0);
            for (i64 c = nc - 1; c >= 0; --c) {
                const i64 t0 = c * T, m = std::min(L, t0 + T) - t0;
                std::copy(h_chunks + (row * nc + c) * n, h_chunks + (row * nc + c + 1) * n,
                          hs.begin());
                for (i64 j = 0; j < m; ++j) {
                    const i64 t = t0 + j;
                    const S dtt = dts[t * dim + d];
                    S* h = hs.data() + (j + 1) * n;  // stepped in place from a copy of h_{t-1}
                    std::copy(h - n, h, h);
                    step<S, true>(h, as.data() + j * n, Ad, Bg + t * s.B_t, Cg + t * s.C_t, dtt,
                                  dtt * r.u[t * s.u_t + d], n);
                }
                for (i64 j = m - 1; j >= 0; --j) {
                    const i64 t = t0 + j, at = t * dim + d;
                    const S dtt = dts[at], ut = r.u[t * s.u_t + d];
                    S gB, gA;
                    step_back<S>(gh.data(), dAd, dBg + t * n, dCg + t * n, hs.data() + j * n,
                                 hs.data() + (j + 1) * n, as.data() + j * n, Ad, Bg + t * s.B_t,
                                 Cg + t * s.C_t, dys[at], dtt * ut, dtt, n, gB, gA);
                    dub[at] = dtt * gB;  // h_t gets dt u B_t
                    ddtb[at] = ut * gB + gA;  // d(step size); through softplus below
                }
            }
        }
        S *dDb = dD + b * dim, *dbiasb = dbias + b * dim;
        std::fill(dDb, dDb + dim, S(0));
        std::fill(dbiasb, dbiasb + dim, S(0));
        const S* __restrict Dk = Dskip;
        const S* __restrict bs = bias;
        for (i64 t = 0; t < L; ++t) {  // one branch-free loop per term, as in step_sizes
            const S* __restrict ut = r.u + t * s.u_t;
            const S* __restrict dyst = dys.data() + t * dim;
            S* __restrict dut = dub + t * dim;
            S* __restrict ddtt = ddtb + t * dim;
            S* __restrict dDt = dDb;
            S* __restrict dbt = dbiasb;
            if (Dk)
                for (i64 d = 0; d < dim; ++d) {
                    dut[d] += Dk[d] * dyst[d];
                    dDt[d] += dyst[d] * ut[d];
                }
            if (use_softplus) {
                const S* __restrict raw = r.dt_raw + t * s.dt_t;
                if (bs)
                    for (i64 d = 0; d < dim; ++d) ddtt[d] *= sigmoid(raw[d] + bs[d]);
                else
                    for (i64 d = 0; d < dim; ++d) ddtt[d] *= sigmoid(raw[d]);
            }
            for (i64 d = 0; d < dim; ++d) dbt[d] += ddtt[d];
            if (r.z) {  // silu'(z) = sig(z) (1 + z (1 - sig(z)))
                const S* __restrict zt = r.z + t * s.z_t;
                const S* __restrict dyt = dyb + t * dim;
                const S* __restrict pre = y_pre + b * L * dim + t * dim;
                S* __restrict dzt = dz + b * L * dim + t * dim;
                for (i64 d = 0; d < dim; ++d) {
                    const S sg = sigmoid(zt[d]);
                    dzt[d] = dyt[d] * pre[d] * sg * (S(1) + zt[d] * (S(1) - sg));
                }
            }
        }
    }
}

}  // namespace

// n == 16 (Mamba's d_state) gets its own instance: with the loops over n unrolled into two
// whole vectors it runs 20% faster than the instance for any n. ``strides`` points to the
// 12 values of a Strides.
#define LINBENCH_SCAN_ENTRY_POINTS(S, suffix)                                                 \
    extern "C" void selective_scan_fwd_##suffix(                                              \
        const S* u, const S* dt, const S* z, const S* A, const S* Dskip, const S* bias,       \
        const S* B, const S* C, const i64* strides, S* y, S* y_pre, S* h_last, S* h_chunks,   \
        i64 batch,                                                                            \
        i64 dim, i64 L, i64 n, i64 G, i64 T, i64 use_softplus) {                              \
        Strides s;                                                                            \
        std::memcpy(&s, strides, sizeof s);                                                   \
        (n == 16 ? forward<S, 16> : forward<S, 0>)(u, dt, z, A, Dskip, bias, B, C, s, y,      \
                                                   y_pre, h_last, h_chunks, batch, dim, L, n, G, T,  \
                                                   use_softplus != 0);                        \
    }                                                                                         \
    extern "C" void selective_scan_bwd_##suffix(                                              \
        const S* u, const S* dt, const S* z, const S* A, const S* Dskip, const S* bias,       \
        const S* B, const S* C, const i64* strides, const S* h_chunks, const S* y_pre,        \
        const S* dy,                                                                          \
        const S* dh_last, S* du, S* ddt, S* dz, S* dA, S* dB, S* dC, S* dD, S* dbias,         \
        i64 batch, i64 dim, i64 L, i64 n, i64 G, i64 T, i64 use_softplus) {                   \
        Strides s;                                                                            \
        std::memcpy(&s, strides, sizeof s);                                                   \
        (n == 16 ? backward<S, 16> : backward<S, 0>)(u, dt, z, A, Dskip, bias, B, C, s,       \
                                                     h_chunks, y_pre, dy, dh_last, du, ddt, dz, dA,  \
                                                     dB, dC, dD, dbias, batch, dim, L, n, G,  \
                                                     T, use_softplus != 0);                   \
    }

LINBENCH_SCAN_ENTRY_POINTS(float, f32)
LINBENCH_SCAN_ENTRY_POINTS(double, f64)

// The float exp alone, so that a test can measure its error in ulps.
extern "C" void exp_approx_f32(const float* x, float* out, i64 count) {
    for (i64 i = 0; i < count; ++i) out[i] = exp_approx(x[i]);
}

// The float softplus alone, for the same reason.
extern "C" void softplus_f32(const float* x, float* out, i64 count) {
    for (i64 i = 0; i < count; ++i) out[i] = softplus(x[i]);
}
