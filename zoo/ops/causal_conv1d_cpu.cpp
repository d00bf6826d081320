// Causal depthwise convolution on (batch, L, C), forward and backward, for float and double,
// with an optional SiLU after it (as causal-conv1d's activation="silu"):
//
//     v[b, t, c] = bias[c] + sum_k taps[k, c] * x[b, t - (W-1) + k, c]     (x = 0 before t = 0)
//     y = v, or silu(v) = v * sigmoid(v)
//
// Layouts: x (batch, L, C) with C contiguous and any batch and time strides (a mixer's slice
// of its input projection, read in place); y, dx, dy (batch, L, C) contiguous; taps (W, C);
// bias (C) or null; dtaps (W, C) and dbias (C) are this batch slice's partial sums (the
// caller adds the slices), so slices run in parallel without races. The loop over channels
// is innermost and branch-free, so that it vectorises: one pass over x forward, one over dy
// backward (plus one recomputing v for the SiLU's gradient), where torch's shifted sums make
// W passes each way and conv1d's depthwise backward is slow.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_math.h"

namespace {

using i64 = std::int64_t;
using linbench::sigmoid;

// v_t (before the SiLU) of one batch row at step t, into vt.
template <typename S>
inline void conv_at(const S* xb, i64 sx_t, const S* __restrict taps, const S* __restrict bias,
                    S* __restrict vt, i64 t, i64 C, i64 W) {
    if (bias)  // the choice outside the loop: inside it, GCC keeps the loop scalar
        for (i64 c = 0; c < C; ++c) vt[c] = bias[c];
    else
        for (i64 c = 0; c < C; ++c) vt[c] = S(0);
    for (i64 k = 0; k < W; ++k) {
        const i64 s = t - (W - 1) + k;  // the input tap k reads
        if (s < 0) continue;
        const S* __restrict xs = xb + s * sx_t;
        const S* __restrict wk = taps + k * C;
        for (i64 c = 0; c < C; ++c) vt[c] += wk[c] * xs[c];
    }
}

template <typename S>
void forward(const S* x, i64 sx_b, i64 sx_t, const S* __restrict taps, const S* __restrict bias,
             S* __restrict y, i64 batch, i64 L, i64 C, i64 W, bool silu) {
    for (i64 b = 0; b < batch; ++b)
        for (i64 t = 0; t < L; ++t) {
            S* __restrict yt = y + (b * L + t) * C;
            conv_at(x + b * sx_b, sx_t, taps, bias, yt, t, C, W);
            if (silu)
                for (i64 c = 0; c < C; ++c) yt[c] *= sigmoid(yt[c]);
        }
}

template <typename S>
void backward(const S* x, i64 sx_b, i64 sx_t, const S* __restrict taps, const S* __restrict bias,
              const S* dy_, S* __restrict dx, S* __restrict dtaps, S* __restrict dbias,
              i64 batch, i64 L, i64 C, i64 W, bool silu) {
    for (i64 i = 0; i < W * C; ++i) dtaps[i] = 0;
    for (i64 c = 0; c < C; ++c) dbias[c] = 0;
    std::vector<S> dv(silu ? L * C : 0);  // dL/dv of one batch row, through the SiLU
    for (i64 b = 0; b < batch; ++b) {
        const S* xb = x + b * sx_b;
        const S* dyb = dy_ + b * L * C;
        if (silu) {  // silu'(v) = sig(v) (1 + v (1 - sig(v))), v recomputed
            for (i64 t = 0; t < L; ++t) {
                S* __restrict vt = dv.data() + t * C;
                const S* __restrict dyt = dyb + t * C;
                conv_at(xb, sx_t, taps, bias, vt, t, C, W);
                for (i64 c = 0; c < C; ++c) {
                    const S v = vt[c], sg = sigmoid(v);
                    vt[c] = dyt[c] * sg * (S(1) + v * (S(1) - sg));
                }
            }
            dyb = dv.data();
        }
        S* dxb = dx + b * L * C;
        for (i64 s = 0; s < L; ++s) {  // dx_s gathers every output that read x_s
            S* __restrict dxs = dxb + s * C;
            for (i64 c = 0; c < C; ++c) dxs[c] = 0;
            for (i64 k = 0; k < W; ++k) {
                const i64 t = s + (W - 1) - k;
                if (t >= L) continue;
                const S* __restrict dyt = dyb + t * C;
                const S* __restrict wk = taps + k * C;
                for (i64 c = 0; c < C; ++c) dxs[c] += wk[c] * dyt[c];
            }
        }
        for (i64 t = 0; t < L; ++t) {
            const S* __restrict dyt = dyb + t * C;
            for (i64 c = 0; c < C; ++c) dbias[c] += dyt[c];
            for (i64 k = 0; k < W; ++k) {
                const i64 s = t - (W - 1) + k;
                if (s < 0) continue;
                const S* __restrict xs = xb + s * sx_t;
                S* __restrict dwk = dtaps + k * C;
                for (i64 c = 0; c < C; ++c) dwk[c] += dyt[c] * xs[c];
            }
        }
    }
}

}  // namespace

#define LINBENCH_CONV_ENTRY_POINTS(S, suffix)                                                 \
    extern "C" void causal_conv1d_fwd_##suffix(const S* x, const S* taps, const S* bias,      \
                                               S* y, i64 batch, i64 L, i64 C, i64 W,          \
                                               i64 sx_b, i64 sx_t, i64 silu) {                \
        forward(x, sx_b, sx_t, taps, bias, y, batch, L, C, W, silu != 0);                      \
    }                                                                                         \
    extern "C" void causal_conv1d_bwd_##suffix(const S* x, const S* taps, const S* bias,      \
                                               const S* dy, S* dx, S* dtaps, S* dbias,        \
                                               i64 batch, i64 L, i64 C, i64 W, i64 sx_b,      \
                                               i64 sx_t, i64 silu) {                          \
        backward(x, sx_b, sx_t, taps, bias, dy, dx, dtaps, dbias, batch, L, C, W, silu != 0); \
    }

LINBENCH_CONV_ENTRY_POINTS(float, f32)
LINBENCH_CONV_ENTRY_POINTS(double, f64)
