// Fused CPU recurrences for decoding: a matrix state per head advanced token by token,
// read once and written once per token, for float and double.
//
// decay_step (GLA and RetNet in the first form, RWKV-6 in the second), per batch row b and head h:
//     u given (RWKV-6):  o_t = scale q_t . (S + (u k_t)^T v_t);  S <- diag(exp(w_t)) S + k_t^T v_t
//     u null (GLA):      S <- diag(exp(w_t)) S + k_t^T v_t;      o_t = scale q_t . S
// delta_step (the gated delta rule), per b and h:
//     S <- exp(g_t) S;  S <- S + k_t^T (beta_t (v_t - k_t S));  o_t = scale q_t . S
//
// Layouts: S0, S (batch, H, K, V); u (H, K). q, k, w: (batch, L, H, K); v, o (batch, L, H, V);
// g, beta (batch, L, H). All contiguous. S0 null means a zero state. S is written, never S0:
// a state is a value its caller may keep.
//
// Torch's step forms make a (K, V) temporary per op (the outer product, the decay, the
// sum) and pass over it again for the readout; here each row of S is read, updated and
// read out in one pass, the loop over V innermost so that it vectorises. No threads: the
// caller splits the batch into slices, each writing only its own rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace {

using i64 = std::int64_t;

struct Layout {  // element offset of the (b, h, t) row of a (batch, L, H, X) tensor
    i64 H, L;
    i64 row(i64 b, i64 h, i64 t, i64 X) const { return ((b * L + t) * H + h) * X; }
};

// One row i of a head's state: s_out = d s_in + k_i v, and o += qi * (the row o reads).
// s_in may be s_out (a later token updates in place); GCC checks the overlap at run time.
template <typename T>
inline void decay_row(const T* s_in, T* s_out, const T* __restrict v, T* __restrict o,
                      T d, T ki, T qi, T ui, bool read_first, i64 V) {
    if (read_first) {
        for (i64 j = 0; j < V; ++j) {
            const T kv = ki * v[j];
            const T s = s_in[j];
            o[j] += qi * (s + ui * kv);
            s_out[j] = d * s + kv;
        }
    } else {
        for (i64 j = 0; j < V; ++j) {
            const T s = d * s_in[j] + ki * v[j];
            s_out[j] = s;
            o[j] += qi * s;
        }
    }
}

// A state this large (bytes, the whole batch's) does not stay in cache until the next step
// reads it: its rows are written with streaming stores, which skip reading each destination
// line from memory before writing it (a third of a step's state traffic).
constexpr i64 STREAM_BYTES = 16 << 20;

// decay_row's second form (the state read after the update), its rows streamed where the
// CPU can and the row is whole vectors of float on a 32-byte boundary (equal to decay_row
// up to rounding: the compiler may fuse decay_row's multiply-adds, these are not fused).
template <typename T>
inline void decay_row_streamed(const T* s_in, T* s_out, const T* __restrict v, T* __restrict o, T d, T ki, T qi,
                               i64 V) {
#if defined(__AVX__)
    if constexpr (sizeof(T) == 4) {
        if (V % 8 == 0 && reinterpret_cast<std::uintptr_t>(s_out) % 32 == 0) {
            const __m256 dv = _mm256_set1_ps(d), kv = _mm256_set1_ps(ki), qv = _mm256_set1_ps(qi);
            for (i64 j = 0; j < V; j += 8) {
                const __m256 s = _mm256_add_ps(_mm256_mul_ps(dv, _mm256_loadu_ps(s_in + j)),
                                               _mm256_mul_ps(kv, _mm256_loadu_ps(v + j)));
                _mm256_stream_ps(s_out + j, s);
                _mm256_storeu_ps(o + j, _mm256_add_ps(_mm256_loadu_ps(o + j), _mm256_mul_ps(qv, s)));
            }
            return;
        }
    }
#endif
    decay_row(s_in, s_out, v, o, d, ki, qi, T(0), false, V);
}

// Calls token(b, h, t, s_prev, s) for every head of every batch row, its tokens in order:
// s is the head's (K, V) state in S, s_prev the one token t reads (S0's, or zeros, at t = 0).
template <typename T, typename Token>
void over_heads(const T* S0, T* S, i64 batch, i64 H, i64 L, i64 K, i64 V, Token token) {
    for (i64 b = 0; b < batch; ++b) {
        for (i64 h = 0; h < H; ++h) {
            T* s = S + (b * H + h) * K * V;
            const T* s_prev = S0 ? S0 + (b * H + h) * K * V : s;
            if (!S0) std::memset(s, 0, sizeof(T) * K * V);
            else if (L == 0) std::memcpy(s, s_prev, sizeof(T) * K * V);
            for (i64 t = 0; t < L; ++t) {
                token(b, h, t, s_prev, s);
                s_prev = s;
            }
        }
    }
}

template <typename T>
void decay_step(const T* q, const T* k, const T* v, const T* w, const T* u, const T* S0, T* S, T* o,
                i64 batch, i64 H, i64 L, i64 K, i64 V, T scale) {
    const Layout at{H, L};
    over_heads(S0, S, batch, H, L, K, V, [&](i64 b, i64 h, i64 t, const T* s_prev, T* s) {
        const T *qt = q + at.row(b, h, t, K), *kt = k + at.row(b, h, t, K), *wt = w + at.row(b, h, t, K);
        T* ot = o + at.row(b, h, t, V);
        std::memset(ot, 0, sizeof(T) * V);
        for (i64 i = 0; i < K; ++i)
            decay_row(s_prev + i * V, s + i * V, v + at.row(b, h, t, V), ot, std::exp(wt[i]), kt[i],
                      scale * qt[i], u ? u[h * K + i] : T(0), u != nullptr, V);
    });
}

template <typename T>
void delta_step(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* S0, T* S, T* o,
                i64 batch, i64 H, i64 L, i64 K, i64 V, T scale) {
    const Layout at{H, L};
    const bool stream = batch * H * K * V * i64(sizeof(T)) >= STREAM_BYTES;
    std::vector<T> delta(V);
    over_heads(S0, S, batch, H, L, K, V, [&](i64 b, i64 h, i64 t, const T* s_prev, T* s) {
        const T *qt = q + at.row(b, h, t, K), *kt = k + at.row(b, h, t, K), *vt = v + at.row(b, h, t, V);
        T* ot = o + at.row(b, h, t, V);
        const i64 gi = (b * L + t) * H + h;
        const T a = std::exp(g[gi]), bt = beta[gi];
        // first pass: k_t S (the head's state then sits in cache for the second)
        std::fill(delta.begin(), delta.end(), T(0));
        for (i64 i = 0; i < K; ++i) {
            const T* row = s_prev + i * V;
            const T ki = kt[i];
            for (i64 j = 0; j < V; ++j) delta[j] += ki * row[j];
        }
        for (i64 j = 0; j < V; ++j) delta[j] = bt * (vt[j] - a * delta[j]);  // beta (v - k (a S))
        std::memset(ot, 0, sizeof(T) * V);
        for (i64 i = 0; i < K; ++i) {
            if (stream)
                decay_row_streamed(s_prev + i * V, s + i * V, delta.data(), ot, a, kt[i], scale * qt[i], V);
            else
                decay_row(s_prev + i * V, s + i * V, delta.data(), ot, a, kt[i], scale * qt[i], T(0), false, V);
        }
    });
#if defined(__AVX__)
    if (stream) _mm_sfence();  // the streamed rows are visible before the caller reads them
#endif
}

}  // namespace

extern "C" {
void decay_step_f32(const float* q, const float* k, const float* v, const float* w, const float* u,
                    const float* S0, float* S, float* o, i64 batch, i64 H, i64 L, i64 K, i64 V, double scale) {
    decay_step<float>(q, k, v, w, u, S0, S, o, batch, H, L, K, V, float(scale));
}
void decay_step_f64(const double* q, const double* k, const double* v, const double* w, const double* u,
                    const double* S0, double* S, double* o, i64 batch, i64 H, i64 L, i64 K, i64 V,
                    double scale) {
    decay_step<double>(q, k, v, w, u, S0, S, o, batch, H, L, K, V, scale);
}
void delta_step_f32(const float* q, const float* k, const float* v, const float* g, const float* beta,
                    const float* S0, float* S, float* o, i64 batch, i64 H, i64 L, i64 K, i64 V, double scale) {
    delta_step<float>(q, k, v, g, beta, S0, S, o, batch, H, L, K, V, float(scale));
}
void delta_step_f64(const double* q, const double* k, const double* v, const double* g, const double* beta,
                    const double* S0, double* S, double* o, i64 batch, i64 H, i64 L, i64 K, i64 V,
                    double scale) {
    delta_step<double>(q, k, v, g, beta, S0, S, o, batch, H, L, K, V, scale);
}
}
