// Causal depthwise convolution on (batch, L, C), forward and backward, for float and double.
//
//     y[b, t, c] = bias[c] + sum_k taps[k, c] * x[b, t - (W-1) + k, c]     (x = 0 before t = 0)
//
// Layouts, all contiguous: x, y, dx, dy (batch, L, C); taps (W, C); bias (C) or null;
// dtaps (W, C) and dbias (C) are this batch slice's partial sums (the caller adds the
// slices), so slices run in parallel without races. The loop over channels is innermost
// and branch-free, so that it vectorises: one pass over x forward, one over dy backward,
// where torch's shifted sums make W passes each way and conv1d's depthwise backward is slow.
#include <cstdint>

namespace {

using i64 = std::int64_t;

template <typename S>
void forward(const S* __restrict x, const S* __restrict taps, const S* __restrict bias,
             S* __restrict y, i64 batch, i64 L, i64 C, i64 W) {
    for (i64 b = 0; b < batch; ++b) {
        const S* xb = x + b * L * C;
        for (i64 t = 0; t < L; ++t) {
            S* __restrict yt = y + (b * L + t) * C;
            for (i64 c = 0; c < C; ++c) yt[c] = bias ? bias[c] : S(0);
            for (i64 k = 0; k < W; ++k) {
                const i64 s = t - (W - 1) + k;  // the input tap k reads
                if (s < 0) continue;
                const S* __restrict xs = xb + s * C;
                const S* __restrict wk = taps + k * C;
                for (i64 c = 0; c < C; ++c) yt[c] += wk[c] * xs[c];
            }
        }
    }
}

template <typename S>
void backward(const S* __restrict x, const S* __restrict taps, const S* __restrict dy,
              S* __restrict dx, S* __restrict dtaps, S* __restrict dbias,
              i64 batch, i64 L, i64 C, i64 W) {
    for (i64 i = 0; i < W * C; ++i) dtaps[i] = 0;
    for (i64 c = 0; c < C; ++c) dbias[c] = 0;
    for (i64 b = 0; b < batch; ++b) {
        const S* xb = x + b * L * C;
        const S* dyb = dy + b * L * C;
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
                const S* __restrict xs = xb + s * C;
                S* __restrict dwk = dtaps + k * C;
                for (i64 c = 0; c < C; ++c) dwk[c] += dyt[c] * xs[c];
            }
        }
    }
}

}  // namespace

extern "C" {

void causal_conv1d_fwd_f32(const float* x, const float* taps, const float* bias, float* y,
                           i64 batch, i64 L, i64 C, i64 W) {
    forward(x, taps, bias, y, batch, L, C, W);
}
void causal_conv1d_fwd_f64(const double* x, const double* taps, const double* bias, double* y,
                           i64 batch, i64 L, i64 C, i64 W) {
    forward(x, taps, bias, y, batch, L, C, W);
}
void causal_conv1d_bwd_f32(const float* x, const float* taps, const float* dy, float* dx,
                           float* dtaps, float* dbias, i64 batch, i64 L, i64 C, i64 W) {
    backward(x, taps, dy, dx, dtaps, dbias, batch, L, C, W);
}
void causal_conv1d_bwd_f64(const double* x, const double* taps, const double* dy, double* dx,
                           double* dtaps, double* dbias, i64 batch, i64 L, i64 C, i64 W) {
    backward(x, taps, dy, dx, dtaps, dbias, batch, L, C, W);
}

}  // extern "C"
