// Fused CPU matrix-state recurrences for training, forward and backward, for float and
// double: the decay recurrence (GLA, RWKV-6; RetNet's and Mamba-2's are special cases) and
// the gated delta rule (Gated DeltaNet). Each keeps a (K, V) state per head.
//
// The decay recurrence.
// Per batch row b and head h, with e_t = exp(w_t) (w the log decay, per key channel, or one
// per head when Kw = 1) and sq_t = scale q_t:
//     u null (GLA, RetNet, Mamba-2):  S_t = diag(e_t) S_{t-1} + k_t^T v_t;  o_t = sq_t S_t
//     u given (RWKV-6):               o_t = sq_t (S_{t-1} + diag(u) k_t^T v_t);  S_t as above
// Layouts: q, k (batch, L, H, K), v (batch, L, H, V), w (batch, L, H, Kw): the last dim
// contiguous, any batch, time and head strides (a stride 0 broadcasts: Mamba-2's groups,
// RetNet's constant decay). u (H, K); S0, S_last (batch, H, K, V); S_chunks (batch, H, nc, K,
// V), the state entering each chunk of T steps, is all the backward keeps. o, do, dq, dk,
// dv, dw contiguous in their inputs' shapes; du (batch, H, K) per batch row (the caller sums).
//
// The backward walks the chunks in reverse, recomputes a chunk's states from S_chunks into
// a (T + 1) x K x V buffer, then steps back through it with dS = dL/dS_t, one pass over a
// head's state per token that forms dq, dk, dv, dw and the next dS together:
//     GLA:    g = dS + sq_t^T do_t;  dk_t = g v_t;  dv_t = k_t g;  dw_t = e_t (g . S_{t-1}) by row;
//             dq_t = scale S_t do_t;  dS <- diag(e_t) g
//     RWKV-6: dk_t = dS v_t;  dv_t = k_t dS;  dw_t = e_t (dS . S_{t-1});  dq_t = scale S_{t-1} do_t;
//             dS <- diag(e_t) dS + sq_t^T do_t;  plus the bonus term's gradients.
// The loops over V are innermost, so they vectorise. No threads: the caller splits the batch.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_math.h"

namespace {

using i64 = std::int64_t;

struct View {  // a (batch, L, H, X) input: element offset of row (b, t, h)
    const i64* s;  // batch, time and head strides
    i64 at(i64 b, i64 t, i64 h) const { return b * s[0] + t * s[1] + h * s[2]; }
};

struct Dims {
    i64 batch, H, L, K, V, Kw, chunk;  // chunk: the steps between kept states
    i64 chunks() const { return (L + chunk - 1) / chunk; }
    i64 out(i64 b, i64 t, i64 h, i64 X) const { return ((b * L + t) * H + h) * X; }  // contiguous rows
};

// e[i] = exp(w[i or 0]) for the K key rows.
template <typename T>
inline void decays(const T* w, i64 Kw, i64 K, T* e) {
    if (Kw == 1) {
        std::fill(e, e + K, linbench::exp_approx(w[0]));
    } else {
        for (i64 i = 0; i < K; ++i) e[i] = linbench::exp_approx(w[i]);
    }
}

// VN > 0: V known at compile time (the loops over V unrolled into whole vectors); 0: any V.
template <typename T, int VN>
void fwd(const T* q, const T* k, const T* v, const T* w, const T* u, const T* S0, const i64* strides, T* o,
         T* S_last, T* S_chunks, const Dims& d, T scale) {
    const View Q{strides}, Kv{strides + 3}, Vv{strides + 6}, W{strides + 9};
    const i64 K = d.K, V = VN ? VN : d.V, KV = K * V, nc = d.chunks();
    std::vector<T> e(K);
    for (i64 b = 0; b < d.batch; ++b) {
        for (i64 h = 0; h < d.H; ++h) {
            T* s = S_last + (b * d.H + h) * KV;  // the running state lives in S_last
            if (S0) std::memcpy(s, S0 + (b * d.H + h) * KV, sizeof(T) * KV);
            else std::memset(s, 0, sizeof(T) * KV);
            for (i64 t = 0; t < d.L; ++t) {
                if (t % d.chunk == 0) std::memcpy(S_chunks + ((b * d.H + h) * nc + t / d.chunk) * KV, s, sizeof(T) * KV);
                const T *qt = q + Q.at(b, t, h), *kt = k + Kv.at(b, t, h), *vt = v + Vv.at(b, t, h);
                decays(w + W.at(b, t, h), d.Kw, K, e.data());
                T* __restrict ot = o + d.out(b, t, h, V);
                std::memset(ot, 0, sizeof(T) * V);
                for (i64 i = 0; i < K; ++i) {
                    T* __restrict row = s + i * V;
                    const T ki = kt[i], sqi = scale * qt[i], ei = e[i];
                    if (u) {
                        const T ui = u[h * K + i];
                        for (i64 j = 0; j < V; ++j) {
                            const T kv = ki * vt[j];
                            ot[j] += sqi * (row[j] + ui * kv);
                            row[j] = ei * row[j] + kv;
                        }
                    } else {
                        for (i64 j = 0; j < V; ++j) {
                            const T x = ei * row[j] + ki * vt[j];
                            row[j] = x;
                            ot[j] += sqi * x;
                        }
                    }
                }
            }
        }
    }
}

template <typename T, int VN>
void bwd(const T* q, const T* k, const T* v, const T* w, const T* u, const i64* strides, const T* S_chunks,
         const T* dout, const T* dS_last, T* dq, T* dk, T* dv, T* dw, T* du, T* dS0, const Dims& d, T scale) {
    const View Q{strides}, Kv{strides + 3}, Vv{strides + 6}, W{strides + 9};
    const i64 K = d.K, V = VN ? VN : d.V, KV = K * V, nc = d.chunks(), span = std::min(d.chunk, d.L);
    std::vector<T> hs((span + 1) * KV), dS(KV), e(K), dvt(V), dwt(K);
    for (i64 b = 0; b < d.batch; ++b) {
        for (i64 h = 0; h < d.H; ++h) {
            if (dS_last) std::memcpy(dS.data(), dS_last + (b * d.H + h) * KV, sizeof(T) * KV);
            else std::fill(dS.begin(), dS.end(), T(0));
            T* dub = du ? du + (b * d.H + h) * K : nullptr;
            if (dub) std::fill(dub, dub + K, T(0));
            for (i64 c = nc - 1; c >= 0; --c) {
                const i64 t0 = c * d.chunk, t1 = std::min(d.L, t0 + d.chunk);
                std::memcpy(hs.data(), S_chunks + ((b * d.H + h) * nc + c) * KV, sizeof(T) * KV);
                for (i64 t = t0; t < t1; ++t) {  // the chunk's states again: hs[t - t0 + 1] = S_t
                    const T *kt = k + Kv.at(b, t, h), *vt = v + Vv.at(b, t, h);
                    decays(w + W.at(b, t, h), d.Kw, K, e.data());
                    const T* prev = hs.data() + (t - t0) * KV;
                    T* __restrict next = hs.data() + (t - t0 + 1) * KV;
                    for (i64 i = 0; i < K; ++i) {
                        const T ki = kt[i], ei = e[i];
                        for (i64 j = 0; j < V; ++j) next[i * V + j] = ei * prev[i * V + j] + ki * vt[j];
                    }
                }
                for (i64 t = t1 - 1; t >= t0; --t) {
                    const T *qt = q + Q.at(b, t, h), *kt = k + Kv.at(b, t, h), *vt = v + Vv.at(b, t, h);
                    const T* __restrict dot = dout + d.out(b, t, h, V);
                    decays(w + W.at(b, t, h), d.Kw, K, e.data());
                    const T* prev = hs.data() + (t - t0) * KV;  // S_{t-1}
                    const T* read = u ? prev : prev + KV;  // the state o_t reads
                    T* __restrict dqt = dq + d.out(b, t, h, K);
                    T* __restrict dkt = dk + d.out(b, t, h, K);
                    std::fill(dvt.begin(), dvt.end(), T(0));
                    for (i64 i = 0; i < K; ++i) {
                        T* __restrict g = dS.data() + i * V;
                        const T* __restrict p = prev + i * V;
                        const T* __restrict r = read + i * V;
                        const T ki = kt[i], sqi = scale * qt[i], ei = e[i];
                        T adk = 0, ade = 0, adq = 0;
                        if (u) {
                            for (i64 j = 0; j < V; ++j) {
                                const T gj = g[j];
                                adk += gj * vt[j];
                                ade += gj * p[j];
                                adq += dot[j] * r[j];
                                dvt[j] += gj * ki;
                                g[j] = ei * gj + sqi * dot[j];
                            }
                        } else {
                            for (i64 j = 0; j < V; ++j) {
                                const T gj = g[j] + sqi * dot[j];
                                adk += gj * vt[j];
                                ade += gj * p[j];
                                adq += dot[j] * r[j];
                                dvt[j] += gj * ki;
                                g[j] = ei * gj;
                            }
                        }
                        dqt[i] = scale * adq;
                        dkt[i] = adk;
                        dwt[i] = ei * ade;
                    }
                    if (u) {  // the bonus term sq_t . (u k_t) v_t
                        T ov = 0, quk = 0;
                        for (i64 j = 0; j < V; ++j) ov += dot[j] * vt[j];
                        for (i64 i = 0; i < K; ++i) {
                            const T ui = u[h * K + i], sqi = scale * qt[i];
                            quk += sqi * ui * kt[i];
                            dqt[i] += scale * ui * kt[i] * ov;
                            dkt[i] += sqi * ui * ov;
                            if (dub) dub[i] += sqi * kt[i] * ov;
                        }
                        for (i64 j = 0; j < V; ++j) dvt[j] += quk * dot[j];
                    }
                    std::copy(dvt.begin(), dvt.end(), dv + d.out(b, t, h, V));
                    if (dw) {
                        T* dwo = dw + d.out(b, t, h, d.Kw);
                        if (d.Kw == 1) {
                            T sum = 0;
                            for (i64 i = 0; i < K; ++i) sum += dwt[i];
                            dwo[0] = sum;
                        } else {
                            std::copy(dwt.begin(), dwt.end(), dwo);
                        }
                    }
                }
            }
            if (dS0) std::copy(dS.begin(), dS.end(), dS0 + (b * d.H + h) * KV);
        }
    }
}

// The gated delta rule, per batch row b and head h, with a_t = exp(g_t), one per head:
//     p_t = a_t k_t S_{t-1} (V);  u_t = beta_t (v_t - p_t);  S_t = a_t S_{t-1} + k_t^T u_t;  o_t = sq_t S_t
// q, k (batch, L, H, K), v (batch, L, H, V), g and beta (batch, L, H): any batch, time and
// head strides, the last dim of q, k, v contiguous. Backward, with g = dS + sq_t^T do_t:
//     dq_t = scale S_t do_t;  dk_t = g u_t + a_t S_{t-1} dp;  du = k_t g;  dp = -beta_t du;
//     dv_t = beta_t du;  dbeta_t = du . (v_t - p_t);  dg_t = a_t (g . S_{t-1} + dp . k_t S_{t-1});
//     dS <- a_t (g + k_t^T dp)
// two passes over a head's state per token (the second needs du, which sums over its rows).
template <typename T>
void delta_fwd(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* S0, const i64* strides,
               T* o, T* S_last, T* S_chunks, const Dims& d, T scale) {
    const View Q{strides}, Kv{strides + 3}, Vv{strides + 6}, G{strides + 9}, Bt{strides + 12};
    const i64 K = d.K, V = d.V, KV = K * V, nc = d.chunks();
    std::vector<T> u(V);
    for (i64 b = 0; b < d.batch; ++b) {
        for (i64 h = 0; h < d.H; ++h) {
            T* s = S_last + (b * d.H + h) * KV;
            if (S0) std::memcpy(s, S0 + (b * d.H + h) * KV, sizeof(T) * KV);
            else std::memset(s, 0, sizeof(T) * KV);
            for (i64 t = 0; t < d.L; ++t) {
                if (t % d.chunk == 0) std::memcpy(S_chunks + ((b * d.H + h) * nc + t / d.chunk) * KV, s, sizeof(T) * KV);
                const T *qt = q + Q.at(b, t, h), *kt = k + Kv.at(b, t, h), *vt = v + Vv.at(b, t, h);
                const T a = linbench::exp_approx(g[G.at(b, t, h)]), bt = beta[Bt.at(b, t, h)];
                std::fill(u.begin(), u.end(), T(0));
                for (i64 i = 0; i < K; ++i) {
                    const T* __restrict row = s + i * V;
                    const T ki = kt[i];
                    for (i64 j = 0; j < V; ++j) u[j] += ki * row[j];
                }
                for (i64 j = 0; j < V; ++j) u[j] = bt * (vt[j] - a * u[j]);
                T* __restrict ot = o + d.out(b, t, h, V);
                std::memset(ot, 0, sizeof(T) * V);
                for (i64 i = 0; i < K; ++i) {
                    T* __restrict row = s + i * V;
                    const T ki = kt[i], sqi = scale * qt[i];
                    for (i64 j = 0; j < V; ++j) {
                        const T x = a * row[j] + ki * u[j];
                        row[j] = x;
                        ot[j] += sqi * x;
                    }
                }
            }
        }
    }
}

template <typename T>
void delta_bwd(const T* q, const T* k, const T* v, const T* g, const T* beta, const i64* strides,
               const T* S_chunks, const T* dout, const T* dS_last, T* dq, T* dk, T* dv, T* dg, T* dbeta, T* dS0,
               const Dims& d, T scale) {
    const View Q{strides}, Kv{strides + 3}, Vv{strides + 6}, G{strides + 9}, Bt{strides + 12};
    const i64 K = d.K, V = d.V, KV = K * V, nc = d.chunks(), span = std::min(d.chunk, d.L);
    std::vector<T> hs((span + 1) * KV), dS(KV), pk(V), u(V), du(V), dp(V);
    for (i64 b = 0; b < d.batch; ++b) {
        for (i64 h = 0; h < d.H; ++h) {
            if (dS_last) std::memcpy(dS.data(), dS_last + (b * d.H + h) * KV, sizeof(T) * KV);
            else std::fill(dS.begin(), dS.end(), T(0));
            for (i64 c = nc - 1; c >= 0; --c) {
                const i64 t0 = c * d.chunk, t1 = std::min(d.L, t0 + d.chunk);
                std::memcpy(hs.data(), S_chunks + ((b * d.H + h) * nc + c) * KV, sizeof(T) * KV);
                for (i64 t = t0; t < t1; ++t) {  // the chunk's states again: hs[t - t0 + 1] = S_t
                    const T *kt = k + Kv.at(b, t, h), *vt = v + Vv.at(b, t, h);
                    const T a = linbench::exp_approx(g[G.at(b, t, h)]), bt = beta[Bt.at(b, t, h)];
                    const T* prev = hs.data() + (t - t0) * KV;
                    T* __restrict next = hs.data() + (t - t0 + 1) * KV;
                    std::fill(u.begin(), u.end(), T(0));
                    for (i64 i = 0; i < K; ++i)
                        for (i64 j = 0; j < V; ++j) u[j] += kt[i] * prev[i * V + j];
                    for (i64 j = 0; j < V; ++j) u[j] = bt * (vt[j] - a * u[j]);
                    for (i64 i = 0; i < K; ++i)
                        for (i64 j = 0; j < V; ++j) next[i * V + j] = a * prev[i * V + j] + kt[i] * u[j];
                }
                for (i64 t = t1 - 1; t >= t0; --t) {
                    const T *qt = q + Q.at(b, t, h), *kt = k + Kv.at(b, t, h), *vt = v + Vv.at(b, t, h);
                    const T* __restrict dot = dout + d.out(b, t, h, V);
                    const i64 gi = G.at(b, t, h), bi = Bt.at(b, t, h);
                    const T a = linbench::exp_approx(g[gi]), bt = beta[bi];
                    const T* prev = hs.data() + (t - t0) * KV;  // S_{t-1}
                    const T* now = prev + KV;  // S_t
                    std::fill(pk.begin(), pk.end(), T(0));
                    for (i64 i = 0; i < K; ++i)
                        for (i64 j = 0; j < V; ++j) pk[j] += kt[i] * prev[i * V + j];
                    for (i64 j = 0; j < V; ++j) u[j] = bt * (vt[j] - a * pk[j]);
                    T* __restrict dqt = dq + d.out(b, t, h, K);
                    T* __restrict dkt = dk + d.out(b, t, h, K);
                    std::fill(du.begin(), du.end(), T(0));
                    T da = 0;
                    for (i64 i = 0; i < K; ++i) {  // first pass: g in place of dS
                        T* __restrict gr = dS.data() + i * V;
                        const T* __restrict p = prev + i * V;
                        const T* __restrict r = now + i * V;
                        const T ki = kt[i], sqi = scale * qt[i];
                        T adq = 0, adk = 0, ada = 0;
                        for (i64 j = 0; j < V; ++j) {
                            const T gj = gr[j] + sqi * dot[j];
                            gr[j] = gj;
                            adq += dot[j] * r[j];
                            adk += gj * u[j];
                            ada += gj * p[j];
                            du[j] += gj * ki;
                        }
                        dqt[i] = scale * adq;
                        dkt[i] = adk;
                        da += ada;
                    }
                    T dbt = 0;
                    for (i64 j = 0; j < V; ++j) {
                        dbt += du[j] * (vt[j] - a * pk[j]);
                        dp[j] = -bt * du[j];
                        da += dp[j] * pk[j];
                    }
                    T* __restrict dvt = dv + d.out(b, t, h, V);
                    for (i64 j = 0; j < V; ++j) dvt[j] = bt * du[j];
                    for (i64 i = 0; i < K; ++i) {  // second pass: dS_{t-1} = a (g + k dp^T)
                        T* __restrict gr = dS.data() + i * V;
                        const T* __restrict p = prev + i * V;
                        const T ki = kt[i];
                        T adk = 0;
                        for (i64 j = 0; j < V; ++j) {
                            adk += dp[j] * p[j];
                            gr[j] = a * (gr[j] + ki * dp[j]);
                        }
                        dkt[i] += a * adk;
                    }
                    dg[d.out(b, t, h, 1)] = a * da;
                    dbeta[d.out(b, t, h, 1)] = dbt;
                }
            }
            if (dS0) std::copy(dS.begin(), dS.end(), dS0 + (b * d.H + h) * KV);
        }
    }
}

}  // namespace

#define DECAY_SCAN(S, suffix)                                                                              \
    extern "C" void decay_scan_fwd_##suffix(const S* q, const S* k, const S* v, const S* w, const S* u,    \
                                            const S* S0, const i64* strides, S* o, S* S_last,              \
                                            S* S_chunks, i64 batch, i64 H, i64 L, i64 K, i64 V, i64 Kw,    \
                                            i64 T, double scale) {                                         \
        const Dims d{batch, H, L, K, V, Kw, T};                                                            \
        if (V == 32) fwd<S, 32>(q, k, v, w, u, S0, strides, o, S_last, S_chunks, d, S(scale));             \
        else if (V == 64) fwd<S, 64>(q, k, v, w, u, S0, strides, o, S_last, S_chunks, d, S(scale));        \
        else fwd<S, 0>(q, k, v, w, u, S0, strides, o, S_last, S_chunks, d, S(scale));                      \
    }                                                                                                      \
    extern "C" void decay_scan_bwd_##suffix(const S* q, const S* k, const S* v, const S* w, const S* u,    \
                                            const i64* strides, const S* S_chunks, const S* dout,          \
                                            const S* dS_last, S* dq, S* dk, S* dv, S* dw, S* du, S* dS0,   \
                                            i64 batch, i64 H, i64 L, i64 K, i64 V, i64 Kw, i64 T,          \
                                            double scale) {                                                \
        const Dims d{batch, H, L, K, V, Kw, T};                                                            \
        if (V == 32) bwd<S, 32>(q, k, v, w, u, strides, S_chunks, dout, dS_last, dq, dk, dv, dw, du, dS0, d, S(scale)); \
        else if (V == 64) bwd<S, 64>(q, k, v, w, u, strides, S_chunks, dout, dS_last, dq, dk, dv, dw, du, dS0, d, S(scale)); \
        else bwd<S, 0>(q, k, v, w, u, strides, S_chunks, dout, dS_last, dq, dk, dv, dw, du, dS0, d, S(scale)); \
    }

DECAY_SCAN(float, f32)
DECAY_SCAN(double, f64)

#define DELTA_SCAN(S, suffix)                                                                              \
    extern "C" void delta_scan_fwd_##suffix(const S* q, const S* k, const S* v, const S* g, const S* beta, \
                                            const S* S0, const i64* strides, S* o, S* S_last,              \
                                            S* S_chunks, i64 batch, i64 H, i64 L, i64 K, i64 V, i64 Kw,    \
                                            i64 T, double scale) {                                         \
        delta_fwd<S>(q, k, v, g, beta, S0, strides, o, S_last, S_chunks, Dims{batch, H, L, K, V, Kw, T},   \
                     S(scale));                                                                            \
    }                                                                                                      \
    extern "C" void delta_scan_bwd_##suffix(const S* q, const S* k, const S* v, const S* g, const S* beta, \
                                            const i64* strides, const S* S_chunks, const S* dout,          \
                                            const S* dS_last, S* dq, S* dk, S* dv, S* dg, S* dbeta,        \
                                            S* dS0, i64 batch, i64 H, i64 L, i64 K, i64 V, i64 Kw, i64 T,  \
                                            double scale) {                                                \
        delta_bwd<S>(q, k, v, g, beta, strides, S_chunks, dout, dS_last, dq, dk, dv, dg, dbeta, dS0,       \
                     Dims{batch, H, L, K, V, Kw, T}, S(scale));                                            \
    }

DELTA_SCAN(float, f32)
DELTA_SCAN(double, f64)
