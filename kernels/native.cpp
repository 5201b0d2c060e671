// Fused CPU loops of the chunked kernels (kernels/phi.py, aggregate.py, refine.py).
//
// Each function computes, in one pass over the rows, a formula that the chunked PyTorch code
// computes with several ops (one pass and one temporary per op). The formulas are the ones in
// the docstrings of those modules; the PyTorch forms stay beside them and the tests compare
// the two (tests/test_native.py). Plain C ABI: called with ctypes on contiguous CPU tensors,
// float32 ("_f32") and float64 ("_f64"), int64 indices, `nt` OpenMP threads.
//
// Loops over channels are written for the compiler's vectoriser (`omp simd`); exp is a
// polynomial that vectorises (accurate to a few ulp, see vexp). Work is split over rows where
// every row writes its own output, and over channel blocks where rows scatter into shared
// per-segment rows (each thread owns a block of channels of every segment: no races, no
// atomics, the same summation order as a serial loop).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef int64_t i64;

namespace {

constexpr double inv_factorial(int n) { return n <= 1 ? 1.0 : inv_factorial(n - 1) / n; }

template <typename T> struct ExpConst;
template <> struct ExpConst<float> {
    using I = int32_t;
    static constexpr float lo = -87.0f, hi = 88.0f;
    static constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    static constexpr float ln2hi = 0.693359375f, ln2lo = -2.12194440e-4f;
    static constexpr int shift = 23, bias = 127, degree = 7;
};
template <> struct ExpConst<double> {
    using I = int64_t;
    static constexpr double lo = -708.0, hi = 709.0;
    static constexpr double magic = 6755399441055744.0;  // 1.5 * 2^52
    static constexpr double ln2hi = 6.93145751953125e-1, ln2lo = 1.42860682030941723212e-6;
    static constexpr int shift = 52, bias = 1023, degree = 13;
};

// bit copy (std::bit_cast of C++20, written for C++17 compilers); vectorises like a move
template <typename To, typename From> static inline To bits(From x) {
    static_assert(sizeof(To) == sizeof(From), "same size");
    To y;
    std::memcpy(&y, &x, sizeof(To));
    return y;
}

// exp(x): x = k·ln2 + r with |r| ≤ ln2/2, exp(r) by its Taylor series (degree 7 in float32,
// 13 in float64: truncation below half an ulp), times 2^k built in the exponent bits.
// Below `lo` it returns 0 (exp(-87) ≈ 1.6e-38), above `hi` it saturates; NaN propagates through
// the arithmetic (r and p are NaN, so p·scale is), with no select of its own: a select on x == x
// made GCC compute every 1/(1 + vexp(·)) twice, once per branch (two vdivps instead of one).
template <typename T> static inline T vexp(T x) {
    using C = ExpConst<T>;
    using I = typename C::I;
    const T xc = x < C::lo ? C::lo : (x > C::hi ? C::hi : x);
    T kf = xc * T(1.4426950408889634) + C::magic;
    const I kbits = bits<I>(kf);
    kf -= C::magic;
    const T r = (xc - kf * C::ln2hi) - kf * C::ln2lo;
    // Horner from 1/deg! down to 1/0!
    T p = T(inv_factorial(C::degree));
    for (int n = C::degree - 1; n >= 0; --n) p = p * r + T(inv_factorial(n));
    const I k = kbits - bits<I>(C::magic);
    const T scale = bits<T>((I)((k + C::bias) << C::shift));
    const T res = p * scale;
    return x < C::lo ? T(0) : res;
}

template <typename T> static inline T sigm(T x) { return T(1) / (T(1) + vexp(-x)); }

// this thread's number and the team's size
static inline void team(i64& t, i64& nt) {
#ifdef _OPENMP
    t = omp_get_thread_num();
    nt = omp_get_num_threads();
#else
    t = 0;
    nt = 1;
#endif
}

// rows [begin, end) of `n` split evenly over the team
static inline void split(i64 n, i64& begin, i64& end) {
    i64 t, nt;
    team(t, nt);
    begin = n * t / nt;
    end = n * (t + 1) / nt;
}

// channels [begin, end) of `w` for this thread in the scatter loops: contiguous ranges, in
// multiples of 8 (a vector), so every row is read once, in one stream, and each output element
// is summed by one thread in row order (the same sums for any thread count)
static inline void channel_range(i64 w, i64& begin, i64& end) {
    i64 t, nt;
    team(t, nt);
    const i64 units = (w + 7) / 8;
    begin = std::min(w, units * t / nt * 8);
    end = std::min(w, units * (t + 1) / nt * 8);
}

// body(r) for the rows 0..n-1, split evenly over `nt` threads
template <typename F> static inline void for_rows(i64 n, int nt, F&& body) {
#pragma omp parallel num_threads(nt)
    {
        i64 b, e;
        split(n, b, e);
        for (i64 r = b; r < e; ++r) body(r);
    }
}

// body(j0, j1) once per thread, with its range of the `w` channels (channel_range)
template <typename F> static inline void for_channels(i64 w, int nt, F&& body) {
#pragma omp parallel num_threads(nt)
    {
        i64 j0, j1;
        channel_range(w, j0, j1);
        if (j0 < j1) body(j0, j1);
    }
}

// pre = (init ? 0 : pre) + bias + Σ_k P_k[idx_k]   [n, w];   hid = silu(pre); with `slope`, pre is
// then overwritten by silu'(pre) = σ(pre)·(1 + pre·(1 − σ(pre))): the only use of pre is the
// backward's product with it, which becomes one multiplication instead of an exp and a division
template <typename T>
static inline void gather_silu_row(T* p, T* h, i64 w, const T* bias, int init, int nterms, const T* const* projs,
                                   const i64* const* idx, i64 r, int slope) {
    if (init) {
#pragma omp simd
        for (i64 j = 0; j < w; ++j) p[j] = T(0);
    }
    if (bias) {
#pragma omp simd
        for (i64 j = 0; j < w; ++j) p[j] += bias[j];
    }
    for (int k = 0; k < nterms; ++k) {
        const T* q = projs[k] + idx[k][r] * w;
#pragma omp simd
        for (i64 j = 0; j < w; ++j) p[j] += q[j];
    }
    if (slope) {
#pragma omp simd
        for (i64 j = 0; j < w; ++j) {
            const T x = p[j], sg = sigm(x);
            h[j] = x * sg;
            p[j] = sg * (T(1) + x * (T(1) - sg));
        }
    } else {
#pragma omp simd
        for (i64 j = 0; j < w; ++j) h[j] = p[j] / (T(1) + vexp(-p[j]));
    }
}

template <typename T>
void gather_silu(T* pre, T* hid, i64 n, i64 w, const T* bias, int init, int nterms, const T* const* projs,
                 const i64* const* idx, int slope, int nt) {
    for_rows(n, nt, [&](i64 r) {
        gather_silu_row(pre + r * w, hid + r * w, w, bias, init, nterms, projs, idx, r, slope);
    });
}

// Gated epilogue, RMSNorm (Layer = false): rc = rsqrt(mean(core²) + eps) (rg likewise),
// sig = σ(gate·rg·ng), out = silu(core·rc·nc) ⊙ sig.
// LayerNorm (Layer = true): core and gate are first centred in place (core ← core − mean(core),
// two passes, as torch's layer_norm), rc = rsqrt(mean(core²) + eps) of the centred row, and the
// norms' biases nbc, nbg are added: out = silu(core·rc·nc + nbc) ⊙ σ(gate·rg·ng + nbg). The
// stored rows are then the centred ones, which is all the backward needs.
// The biases bc, bg (nullable) are added to core and gate in place first (the GEMMs before run
// without them, so no pass copies a bias into their outputs). HasBias is a template argument:
// a null test inside the loop made GCC emit masked gathers (measured 1.4x slower).
template <typename T, bool HasBias, bool Layer>
static inline void gated_fwd_row(T* c, T* g, i64 d, const T* bc, const T* bg, const T* nc, const T* ng,
                                 const T* nbc, const T* nbg, T eps, T* rc, T* rg, T* s, T* o) {
    T sc = 0, sg = 0;
#pragma omp simd reduction(+ : sc, sg)
    for (i64 j = 0; j < d; ++j) {
        const T cv = HasBias ? c[j] + bc[j] : c[j], gv = HasBias ? g[j] + bg[j] : g[j];
        if (HasBias) {
            c[j] = cv;
            g[j] = gv;
        }
        sc += Layer ? cv : cv * cv;
        sg += Layer ? gv : gv * gv;
    }
    if (Layer) {
        const T mc = sc / T(d), mg = sg / T(d);
        sc = sg = 0;
#pragma omp simd reduction(+ : sc, sg)
        for (i64 j = 0; j < d; ++j) {
            const T cv = c[j] - mc, gv = g[j] - mg;
            c[j] = cv;
            g[j] = gv;
            sc += cv * cv;
            sg += gv * gv;
        }
    }
    const T a = T(1) / std::sqrt(sc / T(d) + eps), bb = T(1) / std::sqrt(sg / T(d) + eps);
    *rc = a;
    *rg = bb;
#pragma omp simd
    for (i64 j = 0; j < d; ++j) {
        const T cn = Layer ? c[j] * a * nc[j] + nbc[j] : c[j] * a * nc[j];
        const T sv = sigm(Layer ? g[j] * bb * ng[j] + nbg[j] : g[j] * bb * ng[j]);
        s[j] = sv;
        o[j] = cn / (T(1) + vexp(-cn)) * sv;
    }
}

// the row function for a row's norm (layer: LayerNorm, else RMSNorm) and biases
template <typename T, bool HasBias>
static inline void gated_fwd_any(int layer, T* c, T* g, i64 d, const T* bc, const T* bg, const T* nc, const T* ng,
                                 const T* nbc, const T* nbg, T eps, T* rc, T* rg, T* s, T* o) {
    if (layer)
        gated_fwd_row<T, HasBias, true>(c, g, d, bc, bg, nc, ng, nbc, nbg, eps, rc, rg, s, o);
    else
        gated_fwd_row<T, HasBias, false>(c, g, d, bc, bg, nc, ng, nbc, nbg, eps, rc, rg, s, o);
}

template <typename T>
void gated_fwd(T* core, T* gate, i64 n, i64 d, const T* bc, const T* bg, const T* nc, const T* ng, const T* nbc,
               const T* nbg, int layer, T eps, T* rc, T* rg, T* sig, T* out, int nt) {
    if (bc || bg) {  // one bias alone: the other reads zeros
        std::vector<T> zc(bc ? 0 : d, T(0)), zg(bg ? 0 : d, T(0));
        const T* bcc = bc ? bc : zc.data();
        const T* bgg = bg ? bg : zg.data();
        for_rows(n, nt, [&](i64 r) {
            gated_fwd_any<T, true>(layer, core + r * d, gate + r * d, d, bcc, bgg, nc, ng, nbc, nbg, eps, rc + r,
                                   rg + r, sig + r * d, out + r * d);
        });
        return;
    }
    for_rows(n, nt, [&](i64 r) {
        gated_fwd_any<T, false>(layer, core + r * d, gate + r * d, d, nullptr, nullptr, nc, ng, nbc, nbg, eps, rc + r,
                                rg + r, sig + r * d, out + r * d);
    });
}

// Its backward (input gradients): G → (G_core, G_gate), the formulas of kernels/phi.py; c and g
// are the stored rows (centred for LayerNorm), whose gradient through x·r with r = rsqrt(mean(x²)
// + eps) is r·X − x·r³·mean(X ⊙ x), X = ∂L/∂(x·r); LayerNorm's centring also subtracts r·mean(X).
template <typename T, bool Layer>
static inline void gated_bwd_row(const T* c, const T* g, const T* G, const T* s, const T* nc, const T* ng,
                                 const T* nbc, i64 d, T a, T bb, T* oc, T* og) {
    T dc = 0, dg = 0, mc = 0, mg = 0;
#pragma omp simd reduction(+ : dc, dg, mc, mg)
    for (i64 j = 0; j < d; ++j) {
        const T cn = Layer ? c[j] * a * nc[j] + nbc[j] : c[j] * a * nc[j];
        const T sc = sigm(cn);
        const T sv = s[j];
        const T xc = G[j] * sv * sc * (T(1) + cn * (T(1) - sc)) * nc[j];  // ∂L/∂(core·rc)
        const T xg = G[j] * cn * sc * sv * (T(1) - sv) * ng[j];            // ∂L/∂(gate·rg)
        oc[j] = xc;
        og[j] = xg;
        dc += xc * c[j];
        dg += xg * g[j];
        if (Layer) {
            mc += xc;
            mg += xg;
        }
    }
    const T kc = dc * a * a * a / T(d), kg = dg * bb * bb * bb / T(d);
    if (Layer) {
        mc /= T(d);
        mg /= T(d);
    }
#pragma omp simd
    for (i64 j = 0; j < d; ++j) {
        oc[j] = (Layer ? oc[j] - mc : oc[j]) * a - c[j] * kc;
        og[j] = (Layer ? og[j] - mg : og[j]) * bb - g[j] * kg;
    }
}

template <typename T>
static inline void gated_bwd_any(int layer, const T* c, const T* g, const T* G, const T* s, const T* nc, const T* ng,
                                 const T* nbc, i64 d, T a, T bb, T* oc, T* og) {
    if (layer)
        gated_bwd_row<T, true>(c, g, G, s, nc, ng, nbc, d, a, bb, oc, og);
    else
        gated_bwd_row<T, false>(c, g, G, s, nc, ng, nbc, d, a, bb, oc, og);
}

template <typename T>
void gated_bwd(const T* grad, const T* core, const T* gate, const T* rc, const T* rg, const T* sig, const T* nc,
               const T* ng, const T* nbc, int layer, i64 n, i64 d, T* gcore, T* ggate, int nt) {
    for_rows(n, nt, [&](i64 r) {
        const i64 o = r * d;
        gated_bwd_any(layer, core + o, gate + o, grad + o, sig + o, nc, ng, nbc, d, rc[r], rg[r], gcore + o,
                      ggate + o);
    });
}

// out_k[idx_k[r]] += src[r]   (src [n, w], out_k [*, w]); threads own channel ranges. With Scale,
// src is first multiplied by scale in place (the backward's silu' factor) in the same pass.
template <typename T, bool Scale>
void scatter_add(T* src, const T* scale, i64 n, i64 w, int nterms, T* const* outs, const i64* const* idx, int nt) {
    for_channels(w, nt, [&](i64 j0, i64 j1) {
        for (i64 r = 0; r < n; ++r) {
            T* s = src + r * w;
            if (Scale) {
                const T* f = scale + r * w;
#pragma omp simd
                for (i64 j = j0; j < j1; ++j) s[j] *= f[j];
            }
            for (int k = 0; k < nterms; ++k) {
                T* o = outs[k] + idx[k][r] * w;
#pragma omp simd
                for (i64 j = j0; j < j1; ++j) o[j] += s[j];
            }
        }
    });
}

// Both softmax aggregations of one attention, in one online pass over the edges, called chunk
// by chunk of rows (while a chunk of α and m is in cache; threads own blocks of channels).
// alpha row r (of width 2c) is alpha[aidx ? aidx[r] : r]: [α_s ‖ α_t]. Per segment and channel
// the running maximum (in lse), Σ p (in sum) and Σ p·m (in out) are rescaled when the maximum
// grows. out_*, lse_*, sum_* are [nseg, c]: attn_init before the first chunk, attn_finish after
// the last (out = Σp·m / Σp, lse = max + log Σp; 0 and 0 for empty segments).
template <typename T> void attn_init(i64 nseg, i64 c, T* out_s, T* out_t, T* lse_s, T* lse_t, T* sum_s, T* sum_t) {
    const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp simd
    for (i64 q = 0; q < nseg * c; ++q) {
        out_s[q] = out_t[q] = sum_s[q] = sum_t[q] = T(0);
        lse_s[q] = lse_t[q] = ninf;
    }
}

// one row's update of the running statistics of channels [j0, j1) of one half
template <typename T>
static inline void attn_update(const T* a, const T* mv, T* A, T* M, T* S, i64 j0, i64 j1) {
#pragma omp simd
    for (i64 j = j0; j < j1; ++j) {
        const T dlt = a[j] - M[j];
        const bool up = dlt > T(0);
        const T x = vexp(up ? -dlt : dlt);  // exp(−|Δ|); 0 against an initial −inf
        S[j] = up ? S[j] * x + T(1) : S[j] + x;
        A[j] = up ? A[j] * x + mv[j] : A[j] + x * mv[j];
        M[j] = up ? a[j] : M[j];
    }
}

template <typename T>
void attn_fwd(const T* alpha, const i64* aidx, const T* m, const i64* src, const i64* tgt, i64 e, i64 c, T* out_s,
              T* out_t, T* lse_s, T* lse_t, T* sum_s, T* sum_t, int nt) {
    // each thread's columns of [α_s ‖ α_t]: a range that may span both halves
    for_channels(2 * c, nt, [&](i64 k0, i64 k1) {
        const i64 s0 = std::min(k0, c), s1 = std::min(k1, c);          // α_s channels
        const i64 t0 = std::max(k0, c) - c, t1 = std::max(k1, c) - c;  // α_t channels
        for (i64 r = 0; r < e; ++r) {
            const T* a = alpha + (aidx ? aidx[r] : r) * 2 * c;
            const T* mv = m + r * c;
            if (s0 < s1) {
                const i64 o = src[r] * c;
                attn_update(a, mv, out_s + o, lse_s + o, sum_s + o, s0, s1);
            }
            if (t0 < t1) {
                const i64 o = tgt[r] * c;
                attn_update(a + c, mv, out_t + o, lse_t + o, sum_t + o, t0, t1);
            }
        }
    });
}

template <typename T> void attn_finish(i64 nseg, i64 c, T* out, T* lse, const T* sum) {
#pragma omp simd
    for (i64 q = 0; q < nseg * c; ++q) {
        if (sum[q] > T(0)) {
            out[q] = out[q] / sum[q];
            lse[q] = lse[q] + std::log(sum[q]);
        } else {
            out[q] = T(0);
            lse[q] = T(0);
        }
    }
}

// Its backward for rows [0, e) (callers pass chunk-offset pointers): p = exp(α − lse[idx]),
// ∂L/∂m = p_s·G_s[src] + p_t·G_t[tgt], ∂L/∂α_x = p_x·(m − out_x[idx])·G_x[idx] → galpha [e, 2c]
template <typename T, bool HasGm>
static inline void attn_bwd_row(const T* a, const T* mv, const T* out_s, const T* out_t, const T* lse_s,
                                const T* lse_t, const T* g_s, const T* g_t, i64 c, T* ga, T* gmr) {
#pragma omp simd
    for (i64 j = 0; j < c; ++j) {
        const T ps = vexp(a[j] - lse_s[j]), pt = vexp(a[c + j] - lse_t[j]);
        const T gs = g_s[j], gt = g_t[j];
        ga[j] = ps * (mv[j] - out_s[j]) * gs;
        ga[c + j] = pt * (mv[j] - out_t[j]) * gt;
        if (HasGm) gmr[j] = ps * gs + pt * gt;
    }
}

template <typename T>
void attn_bwd(const T* alpha, const i64* aidx, const T* m, const i64* src, const i64* tgt, i64 e, i64 c,
              const T* out_s, const T* out_t, const T* lse_s, const T* lse_t, const T* g_s, const T* g_t, T* gm,
              T* galpha, int nt) {
    for_rows(e, nt, [&](i64 r) {
        const T* a = alpha + (aidx ? aidx[r] : r) * 2 * c;
        const i64 os = src[r] * c, ot = tgt[r] * c;
        if (gm)
            attn_bwd_row<T, true>(a, m + r * c, out_s + os, out_t + ot, lse_s + os, lse_t + ot, g_s + os, g_t + ot,
                                  c, galpha + r * 2 * c, gm + r * c);
        else
            attn_bwd_row<T, false>(a, m + r * c, out_s + os, out_t + ot, lse_s + os, lse_t + ot, g_s + os, g_t + ot,
                                   c, galpha + r * 2 * c, nullptr);
    });
}

// Refine's line-graph edge side, forward: u_g = u ⊙ q[src] ⊙ q[tgt] → ug [e, c] and
// agg[tgt] += u_g (agg initialised by the caller)
template <typename T>
void refine_fwd(const T* u, const T* q, const i64* src, const i64* tgt, i64 e, i64 c, T* ug, T* agg, int nt) {
    for_channels(c, nt, [&](i64 j0, i64 j1) {
        for (i64 r = 0; r < e; ++r) {
            const T* ur = u + r * c;
            const T* qs = q + src[r] * c;
            const T* qt = q + tgt[r] * c;
            T* o = ug + r * c;
            T* ag = agg + tgt[r] * c;
#pragma omp simd
            for (i64 j = j0; j < j1; ++j) {
                const T v = ur[j] * (qs[j] * qt[j]);
                o[j] = v;
                ag[j] += v;
            }
        }
    });
}

// and backward, rows in parallel: G_ug = G_R[tgt] (+ G_in if smooth), G_u = G_ug ⊙ q[src] ⊙ q[tgt]
// (+ G_in if not smooth), and the two terms of G_q: ps = G_ug ⊙ u ⊙ q[tgt] (summed by src) and
// pt = G_ug ⊙ u ⊙ q[src] (summed by tgt), which scatter_add adds to G_q. gin may be null (no
// edge update, the model's last block): G_in = 0.
template <typename T, bool HasIn, bool HasU, bool HasQ>
static inline void refine_bwd_row(const T* gr, const T* gi, const T* ur, const T* qs, const T* qt, i64 c, int smooth,
                                  T* o, T* os, T* ot) {
#pragma omp simd
    for (i64 j = 0; j < c; ++j) {
        const T in = HasIn ? gi[j] : T(0);
        const T gug = smooth ? gr[j] + in : gr[j];
        const T qsj = qs[j], qtj = qt[j];
        if (HasU) o[j] = smooth ? (qsj * qtj) * gug : (qsj * qtj) * gug + in;
        if (HasQ) {
            const T gg = gug * ur[j];
            os[j] = qtj * gg;
            ot[j] = qsj * gg;
        }
    }
}

// the variants as template arguments: null tests inside the vector loop make GCC emit masked
// gathers and stores
template <typename T, bool HasIn>
static inline void refine_bwd_rows(const T* gagg, const T* gin, const T* u, const T* q, const i64* src,
                                   const i64* tgt, i64 e, i64 c, int smooth, T* gu, T* ps, T* pt, int nt) {
    auto run = [&](auto has_u, auto has_q) {
        for_rows(e, nt, [&](i64 r) {
            refine_bwd_row<T, HasIn, decltype(has_u)::value, decltype(has_q)::value>(
                gagg + tgt[r] * c, HasIn ? gin + r * c : nullptr, u + r * c, q + src[r] * c, q + tgt[r] * c, c,
                smooth, gu ? gu + r * c : nullptr, ps ? ps + r * c : nullptr, pt ? pt + r * c : nullptr);
        });
    };
    using Y = std::true_type;
    using N = std::false_type;
    if (gu && ps) run(Y{}, Y{});
    else if (gu) run(Y{}, N{});
    else if (ps) run(N{}, Y{});
}

template <typename T>
void refine_bwd(const T* gagg, const T* gin, const T* u, const T* q, const i64* src, const i64* tgt, i64 e, i64 c,
                int smooth, T* gu, T* ps, T* pt, int nt) {
    if (gin)
        refine_bwd_rows<T, true>(gagg, gin, u, q, src, tgt, e, c, smooth, gu, ps, pt, nt);
    else
        refine_bwd_rows<T, false>(gagg, gin, u, q, src, tgt, e, c, smooth, gu, ps, pt, nt);
}

// ---- float32 GEMM for the chunked kernels' row-chunk products -------------------------------
// C[M, N] = A[M, K]·B[K, N]: A's rows where they lie (row stride lda, unit column stride), B
// packed once per call by gemm_pack into 16-column panels [N/16][K][16], C row-major (ldc).
// Why: MKL's sgemm packs both operands on every call, which these shapes (4,096 rows × K 128|256
// × N 128|256, a different weight each call, A just written by a fused loop) cannot amortise;
// this register kernel reads A where it lies and packs the weight once per kernel call: 6 rows ×
// 16 columns with AVX2 + FMA, 12 rows × 32 columns with AVX-512. On a 2-core EPYC (AVX2) it made a
// Si64 call's GEMMs 10-40 % faster than MKL's; on a 2-core AVX-512 Xeon it runs the row-chunk
// shapes at MKL's rate in cache, and the whole passes built on it make the Si64 call ~7 % faster
// than MKL GEMMs between the fused loops (benchmarks/cpu_speed.py, gemm_floor). Each output is one
// fused multiply-add chain in k order: the same sums for any thread count and either instruction
// set. Without AVX2 + FMA gemm_available() is 0 and the Python side calls torch.mm. With S (row stride lds), the product is multiplied elementwise by
// S[M, N] before it is stored: the backward's silu' factor, applied to each tile in registers
// instead of in a pass of its own over the stored product.
#if defined(__AVX512F__)
#include <immintrin.h>
constexpr int kGemm = 1;

// AVX-512: rows [0, R) of a row block times two adjacent 16-column panels (Bp, Bp + 16·K) at once
// (2R accumulators), or one panel (Two = false: the last panel of an odd count); R ≤ 12. Each output
// is the same k-ordered FMA chain as in the AVX2 kernel below: the same bits.
template <int R, bool Two>
static inline void gemm_block(const float* A, i64 lda, const float* Bp, i64 K, float* C, i64 ldc, const float* S,
                              i64 lds) {
    __m512 c0[R], c1[R];
    const float* B1 = Bp + 16 * K;
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
    for (i64 k = 0; k < K; ++k) {
        const __m512 b0 = _mm512_loadu_ps(Bp + k * 16);
        const __m512 b1 = Two ? _mm512_loadu_ps(B1 + k * 16) : b0;
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
            const __m512 a = _mm512_set1_ps(A[r * lda + k]);
            c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
            if (Two) c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
        }
    }
    if (S) {  // the optional elementwise factor, while the tile is in registers
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
            c0[r] = _mm512_mul_ps(c0[r], _mm512_loadu_ps(S + r * lds));
            if (Two) c1[r] = _mm512_mul_ps(c1[r], _mm512_loadu_ps(S + r * lds + 16));
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(C + r * ldc, c0[r]);
        if (Two) _mm512_storeu_ps(C + r * ldc + 16, c1[r]);
    }
}

template <int R>
static inline void gemm_rows(const float* A, i64 lda, const float* Bp, i64 K, i64 N, float* C, i64 ldc, const float* S,
                             i64 lds) {
    i64 j = 0;
    for (; j + 32 <= N; j += 32)
        gemm_block<R, true>(A, lda, Bp + j * K, K, C + j, ldc, S ? S + j : nullptr, lds);
    if (j < N) gemm_block<R, false>(A, lda, Bp + j * K, K, C + j, ldc, S ? S + j : nullptr, lds);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
constexpr int kGemm = 1;

// rows [0, R) of a row block times one 16-column panel; R ≤ 6 (12 accumulators + 2 + 1 registers)
template <int R>
static inline void gemm_block(const float* A, i64 lda, const float* Bp, i64 K, float* C, i64 ldc, const float* S,
                              i64 lds) {
    __m256 c0[R], c1[R];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
    for (i64 k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(Bp + k * 16), b1 = _mm256_loadu_ps(Bp + k * 16 + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            const __m256 a = _mm256_broadcast_ss(A + r * lda + k);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
    }
    if (S) {  // the optional elementwise factor, while the tile is in registers
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            c0[r] = _mm256_mul_ps(c0[r], _mm256_loadu_ps(S + r * lds));
            c1[r] = _mm256_mul_ps(c1[r], _mm256_loadu_ps(S + r * lds + 8));
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(C + r * ldc, c0[r]);
        _mm256_storeu_ps(C + r * ldc + 8, c1[r]);
    }
}

template <int R>
static inline void gemm_rows(const float* A, i64 lda, const float* Bp, i64 K, i64 N, float* C, i64 ldc, const float* S,
                             i64 lds) {
    for (i64 j = 0; j < N; j += 16) gemm_block<R>(A, lda, Bp + j * K, K, C + j, ldc, S ? S + j : nullptr, lds);
}
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// rows [0, M) in one thread: kRows-row register blocks, the remaining rows through narrower kernels
#if defined(__AVX512F__)
constexpr int kRows = 12;  // 24 accumulators of 32
#else
constexpr int kRows = 6;  // 12 accumulators of 16
#endif
template <int R>
static inline void gemm_tail(const float* A, i64 lda, const float* Bp, i64 K, i64 N, float* C, i64 ldc,
                             const float* S, i64 lds, i64 rows) {
    if constexpr (R > 0) {
        if (rows == R) gemm_rows<R>(A, lda, Bp, K, N, C, ldc, S, lds);
        else gemm_tail<R - 1>(A, lda, Bp, K, N, C, ldc, S, lds, rows);
    }
}

static void gemm_serial(const float* A, i64 M, i64 K, i64 lda, const float* Bp, i64 N, float* C, i64 ldc,
                        const float* S, i64 lds) {
    i64 i = 0;
    for (; i + kRows <= M; i += kRows)
        gemm_rows<kRows>(A + i * lda, lda, Bp, K, N, C + i * ldc, ldc, S ? S + i * lds : nullptr, lds);
    gemm_tail<kRows - 1>(A + i * lda, lda, Bp, K, N, C + i * ldc, ldc, S ? S + i * lds : nullptr, lds, M - i);
}
#else
constexpr int kGemm = 0;

// portable form, for the tests' sake only (the Python side uses torch.mm where gemm_available() is 0)
static void gemm_serial(const float* A, i64 M, i64 K, i64 lda, const float* Bp, i64 N, float* C, i64 ldc,
                        const float* S, i64 lds) {
    for (i64 i = 0; i < M; ++i)
        for (i64 j = 0; j < N; ++j) {
            const float* b = Bp + (j / 16) * 16 * K + j % 16;
            float acc = 0;
            for (i64 k = 0; k < K; ++k) acc = std::fma(A[i * lda + k], b[k * 16], acc);
            C[i * ldc + j] = S ? acc * S[i * lds + j] : acc;
        }
}
#endif

// C = A·B (⊙ S) over the team: blocks of 48 rows (8 register blocks) handed out statically
static void gemm_run(const float* A, i64 M, i64 K, i64 lda, const float* Bp, i64 N, float* C, i64 ldc,
                     const float* S, i64 lds, int nt) {
    const i64 nblocks = (M + 47) / 48;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (i64 ib = 0; ib < nblocks; ++ib) {
        const i64 i = ib * 48, m = std::min(M, i + 48) - i;
        gemm_serial(A + i * lda, m, K, lda, Bp, N, C + i * ldc, ldc, S ? S + i * lds : nullptr, lds);
    }
}

// Bp[j/16][k][j%16] = B[k·sk + j·sn] for k < K, j < N (N a multiple of 16)
static void gemm_pack(const float* B, i64 K, i64 N, i64 sk, i64 sn, float* Bp) {
    for (i64 j0 = 0; j0 < N; j0 += 16)
        for (i64 k = 0; k < K; ++k)
            for (i64 jj = 0; jj < 16; ++jj) Bp[j0 * K + k * 16 + jj] = B[k * sk + (j0 + jj) * sn];
}

// ---- the whole gated Φ of kernels/phi.py in one call (float32, with the GEMM above) --------
// The chunked form runs each step over a chunk of 4,096 rows (MiBs: in L3 at best) and returns to
// Python between steps; here each thread takes its share of the rows in blocks of kPhiRows and
// runs every step on a block while it is in L2 (with the packed weights, ~0.4 MiB). Each row goes
// through the same operations in the same order as in the chunked form: the same numbers.
constexpr i64 kPhiRows = 24;

// ask for a row of w floats to be brought towards the core (L2), one request per cache line
static inline void prefetch_row(const float* row, i64 w) {
    for (i64 j = 0; j < w; j += 16) __builtin_prefetch(row + j, 0, 2);
}

// Forward: pre = rows·W_r (rows nullable) + b₁ + Σ_k P_k[idx_k]; hid = silu(pre), pre ← silu'(pre);
// core = hid_c·W_c, gate = hid_g·W_g; then the gated epilogue (gated_fwd_row, biases added there).
// wr, wc, wg: packed (gemm_pack) [dr → 2H], [H → d], [H → d]; rows [n, dr] with row stride ldr.
static void phi_fwd(const float* rows, i64 ldr, i64 dr, const float* wr, i64 n, i64 h, const float* bias,
                    int nterms, const float* const* projs, const i64* const* idx, const float* wc, const float* wg,
                    i64 d, const float* bc, const float* bg, const float* nc, const float* ng, const float* nbc,
                    const float* nbg, int layer, float eps, float* pre, float* core, float* gate, float* rc,
                    float* rg, float* sig, float* out, int nt) {
    const i64 w = 2 * h;
#pragma omp parallel num_threads(nt)
    {
        i64 b, e;
        split(n, b, e);
        std::vector<float> hid(kPhiRows * w);
        for (i64 s = b; s < e; s += kPhiRows) {
            const i64 m = std::min(kPhiRows, e - s);
            float* p = pre + s * w;
            // the block's gathered rows (random rows of tables larger than L2) are requested
            // before its first GEMM, which then hides their latency
            for (int k = 0; k < nterms; ++k)
                for (i64 r = s; r < s + m; ++r) prefetch_row(projs[k] + idx[k][r] * w, w);
            if (rows) gemm_serial(rows + s * ldr, m, dr, ldr, wr, w, p, w, nullptr, 0);
            for (i64 r = 0; r < m; ++r)
                gather_silu_row(p + r * w, hid.data() + r * w, w, bias, rows == nullptr, nterms, projs, idx, s + r, 1);
            gemm_serial(hid.data(), m, h, w, wc, d, core + s * d, d, nullptr, 0);
            gemm_serial(hid.data() + h, m, h, w, wg, d, gate + s * d, d, nullptr, 0);
            for (i64 r = s; r < s + m; ++r)
                gated_fwd_any<float, true>(layer, core + r * d, gate + r * d, d, bc, bg, nc, ng, nbc, nbg, eps,
                                           rc + r, rg + r, sig + r * d, out + r * d);
        }
    }
}

// Backward (input gradients; pre holds silu'(pre)): G → (G_core, G_gate) (gated_bwd_row),
// G_pre = silu'(pre) ⊙ [G_core·W_cᵀ ‖ G_gate·W_gᵀ], G_rows = G_pre·W_r (g_rows nullable) by
// blocks of rows; every `chunk` rows the chunk's G_pre is scattered to the projections' gradients
// outs_k[idx_k] (threads own channel ranges, rows in order: the chunked form's sums).
// wc, wg: packed [d → H]; wr: packed [2H → dr].
static void phi_bwd(const float* grad, const float* core, const float* gate, const float* rc, const float* rg,
                    const float* sig, const float* nc, const float* ng, const float* nbc, int layer,
                    const float* pre, i64 n, i64 d, i64 h, const float* wc, const float* wg, const float* wr, i64 dr,
                    float* g_rows, int nterms, float* const* outs, const i64* const* idx, i64 chunk, int nt) {
    const i64 w = 2 * h;
    std::vector<float> gh(std::min(chunk, n) * w);
#pragma omp parallel num_threads(nt)
    {
        std::vector<float> gc(kPhiRows * d), gg(kPhiRows * d);
        for (i64 s0 = 0; s0 < n; s0 += chunk) {
            const i64 k = std::min(chunk, n - s0);
            i64 b, e;
            split(k, b, e);
            for (i64 s = b; s < e; s += kPhiRows) {
                const i64 m = std::min(kPhiRows, e - s), r0 = s0 + s;
                for (i64 r = 0; r < m; ++r) {
                    const i64 o = (r0 + r) * d;
                    gated_bwd_any(layer, core + o, gate + o, grad + o, sig + o, nc, ng, nbc, d, rc[r0 + r],
                                  rg[r0 + r], gc.data() + r * d, gg.data() + r * d);
                }
                float* gp = gh.data() + s * w;
                gemm_serial(gc.data(), m, d, d, wc, h, gp, w, pre + r0 * w, w);
                gemm_serial(gg.data(), m, d, d, wg, h, gp + h, w, pre + r0 * w + h, w);
                if (g_rows) gemm_serial(gp, m, w, w, wr, dr, g_rows + r0 * dr, dr, nullptr, 0);
            }
            if (nterms) {
#pragma omp barrier
                i64 j0, j1;
                channel_range(w, j0, j1);
                for (i64 r = 0; r < k; ++r) {
                    const float* src = gh.data() + r * w;
                    for (int t = 0; t < nterms; ++t) {
                        float* o = outs[t] + idx[t][s0 + r] * w;
#pragma omp simd
                        for (i64 j = j0; j < j1; ++j) o[j] += src[j];
                    }
                }
#pragma omp barrier
            }
        }
    }
}

// ---- both softmax aggregations of the line graph's attention with their logits GEMM ----------
// Forward: α = rows·W [e, 2c] (W packed [K → 2c]) and attn_fwd's online pass, in one call. Each
// thread owns a range of whole 16-column panels of α (with two threads: α_s and α_t) for every
// row: it computes its columns of a block of rows and folds them into the running statistics of
// those channels while they are in L1. Per segment and channel the rows come in order, and each
// α element is the GEMM's: the same numbers as the chunked form, for any thread count.
// With rw (nullable; then K = c), also the residual y_new = m + rw ⊙ rows (one rounding, as
// torch.addcmul), each thread its channel_range of a block's rows.
static void attn_fwd_gemm(const float* rows, i64 ldr, i64 K, const float* wp, const float* m, const i64* src,
                          const i64* tgt, i64 e, i64 c, float* alpha, float* out_s, float* out_t, float* lse_s,
                          float* lse_t, float* sum_s, float* sum_t, const float* rw, float* y_new, int nt) {
    const i64 w = 2 * c;
#pragma omp parallel num_threads(nt)
    {
        i64 t, team_size;
        team(t, team_size);
        const i64 panels = w / 16;
        const i64 k0 = panels * t / team_size * 16, k1 = panels * (t + 1) / team_size * 16;
        const i64 s0 = std::min(k0, c), s1 = std::min(k1, c);
        const i64 t0 = std::max(k0, c) - c, t1 = std::max(k1, c) - c;
        i64 j0, j1;
        channel_range(c, j0, j1);
        if (k0 < k1 || (rw && j0 < j1)) {
            for (i64 s = 0; s < e; s += kPhiRows) {
                const i64 mb = std::min(kPhiRows, e - s);
                if (rw)
                    for (i64 r = s; r < s + mb; ++r) {
                        const float* yr = rows + r * ldr;
                        const float* mr = m + r * c;
                        float* o = y_new + r * c;
#pragma omp simd
                        for (i64 j = j0; j < j1; ++j) o[j] = std::fma(rw[j], yr[j], mr[j]);
                    }
                if (k0 >= k1) continue;
                gemm_serial(rows + s * ldr, mb, K, ldr, wp + k0 * K, k1 - k0, alpha + s * w + k0, w, nullptr, 0);
                for (i64 r = s; r < s + mb; ++r) {
                    const float* a = alpha + r * w;
                    const float* mv = m + r * c;
                    if (s0 < s1) {
                        const i64 o = src[r] * c;
                        attn_update(a, mv, out_s + o, lse_s + o, sum_s + o, s0, s1);
                    }
                    if (t0 < t1) {
                        const i64 o = tgt[r] * c;
                        attn_update(a + c, mv, out_t + o, lse_t + o, sum_t + o, t0, t1);
                    }
                }
            }
        }
    }
}

// Backward: attn_bwd's rows (∂L/∂m into gm, nullable; ∂L/∂α per block of rows) and
// ∂L/∂rows = ∂L/∂α·Wᵀ (wp packed [2c → K]) while the block is in L1/L2. With gy (nullable, the
// residual's gradient; then K = c): gm += gy and g_rows += rw ⊙ gy (one rounding, as addcmul_).
static void attn_bwd_gemm(const float* alpha, const float* m, const i64* src, const i64* tgt, i64 e, i64 c,
                          const float* out_s, const float* out_t, const float* lse_s, const float* lse_t,
                          const float* g_s, const float* g_t, float* gm, const float* wp, i64 K, float* g_rows,
                          const float* gy, const float* rw, int nt) {
    const i64 w = 2 * c;
#pragma omp parallel num_threads(nt)
    {
        i64 b, en;
        split(e, b, en);
        std::vector<float> ga(kPhiRows * w);
        for (i64 s = b; s < en; s += kPhiRows) {
            const i64 mb = std::min(kPhiRows, en - s);
            for (i64 i = 0; i < mb; ++i) {
                const i64 r = s + i, os = src[r] * c, ot = tgt[r] * c;
                if (gm)
                    attn_bwd_row<float, true>(alpha + r * w, m + r * c, out_s + os, out_t + ot, lse_s + os,
                                              lse_t + ot, g_s + os, g_t + ot, c, ga.data() + i * w, gm + r * c);
                else
                    attn_bwd_row<float, false>(alpha + r * w, m + r * c, out_s + os, out_t + ot, lse_s + os,
                                               lse_t + ot, g_s + os, g_t + ot, c, ga.data() + i * w, nullptr);
            }
            gemm_serial(ga.data(), mb, w, w, wp, K, g_rows + s * K, K, nullptr, 0);
            if (gy)
                for (i64 r = s; r < s + mb; ++r) {
                    const float* g = gy + r * c;
                    float* gr = g_rows + r * c;
                    if (gm) {
                        float* gmr = gm + r * c;
#pragma omp simd
                        for (i64 j = 0; j < c; ++j) gmr[j] += g[j];
                    }
#pragma omp simd
                    for (i64 j = 0; j < c; ++j) gr[j] = std::fma(g[j], rw[j], gr[j]);
                }
        }
    }
}

// ---- Refine's line-graph edge side in one call (float32, with the GEMM above) ------------------
// Forward: per block of rows, u_g = u ⊙ q[src] ⊙ q[tgt] into the chunk's buffer, then (y given)
// h = (u_g or u)·W₁ (kept: ← silu'(h + b₁)), y' = silu(h + b₁)·W₂ + b₂ + w ⊙ y; every `chunk` rows
// the chunk's u_g is summed into agg[tgt] (threads own channel ranges, rows in order). The same
// operations per row, in the same order, as the chunk loop in kernels/refine.py.
// w1p: packed [C → H]; w2p: packed [H → C]; b1, b2 nullable.
static void refine_fwd_whole(const float* u, const float* q, const i64* src, const i64* tgt, i64 e, i64 c,
                             const float* y, const float* rw, const float* w1p, const float* b1, const float* w2p,
                             const float* b2, i64 hd, int smooth, i64 chunk, float* agg, float* h, float* y_new,
                             int nt) {
    std::vector<float> ugc(std::min(chunk, e) * c);
#pragma omp parallel num_threads(nt)
    {
        std::vector<float> act(y ? kPhiRows * hd : 0);
        for (i64 s0 = 0; s0 < e; s0 += chunk) {
            const i64 k = std::min(chunk, e - s0);
            i64 b, en;
            split(k, b, en);
            for (i64 s = b; s < en; s += kPhiRows) {
                const i64 mb = std::min(kPhiRows, en - s), r0 = s0 + s;
                for (i64 i = 0; i < mb; ++i) {
                    const i64 r = r0 + i;
                    const float* ur = u + r * c;
                    const float* qs = q + src[r] * c;
                    const float* qt = q + tgt[r] * c;
                    float* o = ugc.data() + (s + i) * c;
#pragma omp simd
                    for (i64 j = 0; j < c; ++j) o[j] = ur[j] * (qs[j] * qt[j]);
                }
                if (!y) continue;
                gemm_serial(smooth ? ugc.data() + s * c : u + r0 * c, mb, c, c, w1p, hd, h + r0 * hd, hd, nullptr, 0);
                for (i64 i = 0; i < mb; ++i)
                    gather_silu_row(h + (r0 + i) * hd, act.data() + i * hd, hd, b1, 0, 0, (const float* const*)nullptr,
                                    (const i64* const*)nullptr, 0, 1);
                gemm_serial(act.data(), mb, hd, hd, w2p, c, y_new + r0 * c, c, nullptr, 0);
                for (i64 r = r0; r < r0 + mb; ++r) {
                    float* o = y_new + r * c;
                    const float* yr = y + r * c;
                    if (b2) {
#pragma omp simd
                        for (i64 j = 0; j < c; ++j) o[j] = std::fma(yr[j], rw[j], o[j] + b2[j]);
                    } else {
#pragma omp simd
                        for (i64 j = 0; j < c; ++j) o[j] = std::fma(yr[j], rw[j], o[j]);
                    }
                }
            }
#pragma omp barrier
            i64 j0, j1;
            channel_range(c, j0, j1);
            for (i64 r = 0; r < k; ++r) {
                const float* v = ugc.data() + r * c;
                float* ag = agg + tgt[s0 + r] * c;
#pragma omp simd
                for (i64 j = j0; j < j1; ++j) ag[j] += v[j];
            }
#pragma omp barrier
        }
    }
}

// Backward (h holds silu'): with g_ynew, G_h = silu'(h) ⊙ (G_y'·W₂) and G_in = G_h·W₁ per block of
// rows; then refine_bwd_row (G_u into g_u, nullable; the two terms of G_q into the chunk's
// buffers), and every `chunk` rows those terms are summed into g_q by source, then by target.
// w2p: packed [C → H] (W₂ [C, H] as it is); w1p: packed [H → C]. With g_y (nullable), also the
// residual's G_y = rw ⊙ G_y'.
static void refine_bwd_whole(const float* g_agg, const float* g_ynew, const float* u, const float* q, const i64* src,
                             const i64* tgt, i64 e, i64 c, const float* h, const float* w2p, const float* w1p, i64 hd,
                             int smooth, float* g_u, float* g_q, float* g_y, const float* rw, i64 chunk, int nt) {
    const i64 kc = std::min(chunk, e);
    std::vector<float> ps(g_q ? kc * c : 0), pt(g_q ? kc * c : 0);
#pragma omp parallel num_threads(nt)
    {
        std::vector<float> gh(g_ynew ? kPhiRows * hd : 0), gin(g_ynew ? kPhiRows * c : 0);
        auto rows = [&](i64 s, i64 r0, i64 mb, auto has_in, auto has_u, auto has_q) {
            for (i64 i = 0; i < mb; ++i) {
                const i64 r = r0 + i;
                refine_bwd_row<float, decltype(has_in)::value, decltype(has_u)::value, decltype(has_q)::value>(
                    g_agg + tgt[r] * c, g_ynew ? gin.data() + i * c : nullptr, u + r * c, q + src[r] * c,
                    q + tgt[r] * c, c, smooth, g_u ? g_u + r * c : nullptr, g_q ? ps.data() + (s + i) * c : nullptr,
                    g_q ? pt.data() + (s + i) * c : nullptr);
            }
        };
        using Y = std::true_type;
        using N = std::false_type;
        for (i64 s0 = 0; s0 < e; s0 += chunk) {
            const i64 k = std::min(chunk, e - s0);
            i64 b, en;
            split(k, b, en);
            for (i64 s = b; s < en; s += kPhiRows) {
                const i64 mb = std::min(kPhiRows, en - s), r0 = s0 + s;
                if (g_ynew) {
                    if (g_y)  // the residual's G_y = w ⊙ G_y', while the rows are read for the GEMM
                        for (i64 r = r0; r < r0 + mb; ++r) {
                            const float* gr = g_ynew + r * c;
                            float* o = g_y + r * c;
#pragma omp simd
                            for (i64 j = 0; j < c; ++j) o[j] = gr[j] * rw[j];
                        }
                    gemm_serial(g_ynew + r0 * c, mb, c, c, w2p, hd, gh.data(), hd, h + r0 * hd, hd);
                    gemm_serial(gh.data(), mb, hd, hd, w1p, c, gin.data(), c, nullptr, 0);
                    if (g_u && g_q) rows(s, r0, mb, Y{}, Y{}, Y{});
                    else if (g_u) rows(s, r0, mb, Y{}, Y{}, N{});
                    else if (g_q) rows(s, r0, mb, Y{}, N{}, Y{});
                } else {
                    if (g_u && g_q) rows(s, r0, mb, N{}, Y{}, Y{});
                    else if (g_u) rows(s, r0, mb, N{}, Y{}, N{});
                    else if (g_q) rows(s, r0, mb, N{}, N{}, Y{});
                }
            }
            if (g_q) {
#pragma omp barrier
                i64 j0, j1;
                channel_range(c, j0, j1);
                for (i64 r = 0; r < k; ++r) {
                    const float* v = ps.data() + r * c;
                    float* o = g_q + src[s0 + r] * c;
#pragma omp simd
                    for (i64 j = j0; j < j1; ++j) o[j] += v[j];
                }
                for (i64 r = 0; r < k; ++r) {
                    const float* v = pt.data() + r * c;
                    float* o = g_q + tgt[s0 + r] * c;
#pragma omp simd
                    for (i64 j = j0; j < j1; ++j) o[j] += v[j];
                }
#pragma omp barrier
            }
        }
    }
}

}  // namespace

#define MATRIS_EXPORT(T, S)                                                                                        \
    extern "C" void gather_silu_##S(T* pre, T* hid, i64 n, i64 w, const T* bias, int init, int nterms,           \
                                    const T* const* projs, const i64* const* idx, int slope, int nt) {            \
        gather_silu<T>(pre, hid, n, w, bias, init, nterms, projs, idx, slope, nt);                                 \
    }                                                                                                              \
    extern "C" void gated_fwd_##S(T* core, T* gate, i64 n, i64 d, const T* bc, const T* bg, const T* nc,           \
                                  const T* ng, const T* nbc, const T* nbg, int layer, T eps, T* rc, T* rg, T* sig, \
                                  T* out, int nt) {                                                                \
        gated_fwd<T>(core, gate, n, d, bc, bg, nc, ng, nbc, nbg, layer, eps, rc, rg, sig, out, nt);                \
    }                                                                                                              \
    extern "C" void gated_bwd_##S(const T* grad, const T* core, const T* gate, const T* rc, const T* rg,           \
                                  const T* sig, const T* nc, const T* ng, const T* nbc, int layer, i64 n, i64 d,   \
                                  T* gcore, T* ggate, int nt) {                                                    \
        gated_bwd<T>(grad, core, gate, rc, rg, sig, nc, ng, nbc, layer, n, d, gcore, ggate, nt);                   \
    }                                                                                                              \
    extern "C" void scatter_add_##S(const T* src, i64 n, i64 w, int nterms, T* const* outs, const i64* const* idx, \
                                    int nt) {                                                                      \
        scatter_add<T, false>(const_cast<T*>(src), nullptr, n, w, nterms, outs, idx, nt);                          \
    }                                                                                                              \
    extern "C" void scale_scatter_add_##S(T* src, const T* scale, i64 n, i64 w, int nterms, T* const* outs,       \
                                          const i64* const* idx, int nt) {                                         \
        scatter_add<T, true>(src, scale, n, w, nterms, outs, idx, nt);                                             \
    }                                                                                                              \
    extern "C" void attn_init_##S(i64 nseg, i64 c, T* out_s, T* out_t, T* lse_s, T* lse_t, T* sum_s, T* sum_t) {  \
        attn_init<T>(nseg, c, out_s, out_t, lse_s, lse_t, sum_s, sum_t);                                           \
    }                                                                                                              \
    extern "C" void attn_fwd_##S(const T* alpha, const i64* aidx, const T* m, const i64* src, const i64* tgt,      \
                                 i64 e, i64 c, T* out_s, T* out_t, T* lse_s, T* lse_t, T* sum_s, T* sum_t,         \
                                 int nt) {                                                                         \
        attn_fwd<T>(alpha, aidx, m, src, tgt, e, c, out_s, out_t, lse_s, lse_t, sum_s, sum_t, nt);                 \
    }                                                                                                              \
    extern "C" void attn_finish_##S(i64 nseg, i64 c, T* out, T* lse, const T* sum) {                               \
        attn_finish<T>(nseg, c, out, lse, sum);                                                                    \
    }                                                                                                              \
    extern "C" void attn_bwd_##S(const T* alpha, const i64* aidx, const T* m, const i64* src, const i64* tgt,      \
                                 i64 e, i64 c, const T* out_s, const T* out_t, const T* lse_s, const T* lse_t,     \
                                 const T* g_s, const T* g_t, T* gm, T* galpha, int nt) {                           \
        attn_bwd<T>(alpha, aidx, m, src, tgt, e, c, out_s, out_t, lse_s, lse_t, g_s, g_t, gm, galpha, nt);         \
    }                                                                                                              \
    extern "C" void refine_fwd_##S(const T* u, const T* q, const i64* src, const i64* tgt, i64 e, i64 c, T* ug,    \
                                   T* agg, int nt) {                                                               \
        refine_fwd<T>(u, q, src, tgt, e, c, ug, agg, nt);                                                          \
    }                                                                                                              \
    extern "C" void refine_bwd_##S(const T* gagg, const T* gin, const T* u, const T* q, const i64* src,            \
                                   const i64* tgt, i64 e, i64 c, int smooth, T* gu, T* ps, T* pt, int nt) {        \
        refine_bwd<T>(gagg, gin, u, q, src, tgt, e, c, smooth, gu, ps, pt, nt);                                    \
    }                                                                                                              \
    extern "C" T vexp_##S(T x) { return vexp<T>(x); }

MATRIS_EXPORT(float, f32)
MATRIS_EXPORT(double, f64)


// float32 GEMM (gemm_run, gemm_pack above); gemm_available(): 1 where the fast kernel is built
extern "C" int gemm_available() { return kGemm; }
extern "C" void gemm_pack_f32(const float* B, i64 K, i64 N, i64 sk, i64 sn, float* Bp) { gemm_pack(B, K, N, sk, sn, Bp); }
extern "C" void gemm_f32(const float* A, i64 M, i64 K, i64 lda, const float* Bp, i64 N, float* C, i64 ldc,
                         const float* S, i64 lds, int nt) {
    gemm_run(A, M, K, lda, Bp, N, C, ldc, S, lds, nt);
}
extern "C" void phi_fwd_f32(const float* rows, i64 ldr, i64 dr, const float* wr, i64 n, i64 h, const float* bias,
                            int nterms, const float* const* projs, const i64* const* idx, const float* wc,
                            const float* wg, i64 d, const float* bc, const float* bg, const float* nc, const float* ng,
                            const float* nbc, const float* nbg, int layer, float eps, float* pre, float* core,
                            float* gate, float* rc, float* rg, float* sig, float* out, int nt) {
    phi_fwd(rows, ldr, dr, wr, n, h, bias, nterms, projs, idx, wc, wg, d, bc, bg, nc, ng, nbc, nbg, layer, eps, pre,
            core, gate, rc, rg, sig, out, nt);
}
extern "C" void phi_bwd_f32(const float* grad, const float* core, const float* gate, const float* rc, const float* rg,
                            const float* sig, const float* nc, const float* ng, const float* nbc, int layer,
                            const float* pre, i64 n, i64 d, i64 h, const float* wc, const float* wg, const float* wr,
                            i64 dr, float* g_rows, int nterms, float* const* outs, const i64* const* idx, i64 chunk,
                            int nt) {
    phi_bwd(grad, core, gate, rc, rg, sig, nc, ng, nbc, layer, pre, n, d, h, wc, wg, wr, dr, g_rows, nterms, outs, idx,
            chunk, nt);
}
extern "C" void attn_fwd_gemm_f32(const float* rows, i64 ldr, i64 K, const float* wp, const float* m, const i64* src,
                                  const i64* tgt, i64 e, i64 c, float* alpha, float* out_s, float* out_t,
                                  float* lse_s, float* lse_t, float* sum_s, float* sum_t, const float* rw,
                                  float* y_new, int nt) {
    attn_fwd_gemm(rows, ldr, K, wp, m, src, tgt, e, c, alpha, out_s, out_t, lse_s, lse_t, sum_s, sum_t, rw, y_new, nt);
}
extern "C" void attn_bwd_gemm_f32(const float* alpha, const float* m, const i64* src, const i64* tgt, i64 e, i64 c,
                                  const float* out_s, const float* out_t, const float* lse_s, const float* lse_t,
                                  const float* g_s, const float* g_t, float* gm, const float* wp, i64 K,
                                  float* g_rows, const float* gy, const float* rw, int nt) {
    attn_bwd_gemm(alpha, m, src, tgt, e, c, out_s, out_t, lse_s, lse_t, g_s, g_t, gm, wp, K, g_rows, gy, rw, nt);
}
extern "C" void refine_fwd_whole_f32(const float* u, const float* q, const i64* src, const i64* tgt, i64 e, i64 c,
                                     const float* y, const float* rw, const float* w1p, const float* b1,
                                     const float* w2p, const float* b2, i64 hd, int smooth, i64 chunk, float* agg,
                                     float* h, float* y_new, int nt) {
    refine_fwd_whole(u, q, src, tgt, e, c, y, rw, w1p, b1, w2p, b2, hd, smooth, chunk, agg, h, y_new, nt);
}
extern "C" void refine_bwd_whole_f32(const float* g_agg, const float* g_ynew, const float* u, const float* q,
                                     const i64* src, const i64* tgt, i64 e, i64 c, const float* h, const float* w2p,
                                     const float* w1p, i64 hd, int smooth, float* g_u, float* g_q, float* g_y,
                                     const float* rw, i64 chunk, int nt) {
    refine_bwd_whole(g_agg, g_ynew, u, q, src, tgt, e, c, h, w2p, w1p, hd, smooth, g_u, g_q, g_y, rw, chunk, nt);
}
