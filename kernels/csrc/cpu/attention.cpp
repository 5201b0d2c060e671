// matris::attention_pair and matris::attention_pair_backward on the CPU: both softmax
// aggregations of one separable attention (spec §4; the formulas in kernels/aggregate.py), in one
// online pass over the edges.
//
// Per segment and channel the running maximum (in lse), Σ p (in sum) and Σ p·m (in out) are
// rescaled when the maximum grows; out = Σp·m / Σp and lse = max + log Σp at the end (0 and 0 for
// an empty segment). Threads own blocks of channels, so every segment row is updated by one
// thread, in edge order: no races, the same numbers for any thread count.
// Line graph: α = rows·W [E, 2C] is computed by the GEMM of a block of rows and folded in while
// it is in L1. Atom graph: α = rows[row_index] (rows already projected per bond, [B, 2C]).

#include "common.h"

namespace matris_cpu {
namespace {

template <typename T> void attn_init(i64 n, T* out, T* lse, T* sum) {
    const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp simd
    for (i64 q = 0; q < n; ++q) {
        out[q] = sum[q] = T(0);
        lse[q] = ninf;
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

template <typename T> void attn_finish(i64 n, T* out, T* lse, const T* sum) {
#pragma omp simd
    for (i64 q = 0; q < n; ++q) {
        if (sum[q] > T(0)) {
            out[q] = out[q] / sum[q];
            lse[q] = lse[q] + std::log(sum[q]);
        } else {
            out[q] = T(0);
            lse[q] = T(0);
        }
    }
}

// Forward. Each thread owns a range of [α_s ‖ α_t]'s columns (whole 16-column panels of the
// packed weight on the line graph; with two threads, α_s and α_t) for every row: it computes its
// columns of a block of rows (line graph: the GEMM; atom graph: read through row_index) and
// folds them into the running statistics of those channels. With rw (nullable, line graph;
// then K = c), also the residual y_new = m + rw ⊙ rows (one rounding, as torch.addcmul), each
// thread its channel_range of a block's rows.
template <typename T>
void attn_fwd(const T* rows, i64 ldr, i64 K, const T* wp, const i64* aidx, const T* m, const i64* src,
              const i64* tgt, i64 e, i64 c, T* alpha, T* out_s, T* out_t, T* lse_s, T* lse_t, T* sum_s, T* sum_t,
              const T* rw, T* y_new, int nt) {
    const i64 w = 2 * c;
#pragma omp parallel num_threads(nt)
    {
        i64 t, team_size;
        team(t, team_size);
        const i64 panels = (w + 15) / 16;
        const i64 k0 = std::min(w, panels * t / team_size * 16), k1 = std::min(w, panels * (t + 1) / team_size * 16);
        const i64 s0 = std::min(k0, c), s1 = std::min(k1, c);          // α_s channels
        const i64 t0 = std::max(k0, c) - c, t1 = std::max(k1, c) - c;  // α_t channels
        i64 j0, j1;
        channel_range(c, j0, j1);
        if (k0 < k1 || (rw && j0 < j1)) {
            for (i64 s = 0; s < e; s += kBlock) {
                const i64 mb = std::min(kBlock, e - s);
                if (rw)
                    for (i64 r = s; r < s + mb; ++r) {
                        const T* yr = rows + r * ldr;
                        const T* mr = m + r * c;
                        T* o = y_new + r * c;
#pragma omp simd
                        for (i64 j = j0; j < j1; ++j) o[j] = std::fma(rw[j], yr[j], mr[j]);
                    }
                if (k0 >= k1) continue;
                if (!aidx)
                    gemm_serial(rows + s * ldr, mb, K, ldr, wp + k0 * K, k1 - k0, alpha + s * w + k0, w,
                                (const T*)nullptr, 0);
                for (i64 r = s; r < s + mb; ++r) {
                    const T* a = aidx ? rows + aidx[r] * w : alpha + r * w;
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
            }
        }
    }
}

// Backward of one row: p = exp(α − lse[idx]), ∂L/∂m = p_s·G_s[src] + p_t·G_t[tgt],
// ∂L/∂α_x = p_x·(m − out_x[idx])·G_x[idx] → ga [2c]
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

// Backward, rows split over the threads in blocks: the rows' ∂L/∂m (into gm, nullable) and ∂L/∂α
// (into ga: a block buffer on the line graph, then ∂L/∂rows = ∂L/∂α·Wᵀ by the GEMM while the block
// is in cache, wp packed [2c → K]; the whole [e, 2c] on the atom graph, summed into
// g_rows[row_index] afterwards, threads owning channels). With gy (nullable, the residual's
// gradient, line graph; then K = c): gm += gy and g_rows += rw ⊙ gy (one rounding, as addcmul_).
// ga_keep (nullable, line graph, [e, 2c]): ∂L/∂α of every row is written there instead of a block
// buffer (the projection's weight gradient is a GEMM over all rows of it: kernels/aggregate.py).
template <typename T>
void attn_bwd(const T* alpha, const i64* aidx, const T* m, const i64* src, const i64* tgt, i64 e, i64 c,
              const T* out_s, const T* out_t, const T* lse_s, const T* lse_t, const T* g_s, const T* g_t, T* gm,
              const T* wp, i64 K, T* g_rows, const T* gy, const T* rw, T* ga_all, T* ga_keep, int nt) {
    const i64 w = 2 * c;
#pragma omp parallel num_threads(nt)
    {
        i64 b, en;
        split(e, b, en);
        std::vector<T> block(aidx || ga_keep ? 0 : kBlock * w);
        for (i64 s = b; s < en; s += kBlock) {
            const i64 mb = std::min(kBlock, en - s);
            T* ga = aidx ? ga_all + s * w : (ga_keep ? ga_keep + s * w : block.data());
            for (i64 i = 0; i < mb; ++i) {
                const i64 r = s + i, os = src[r] * c, ot = tgt[r] * c;
                const T* a = aidx ? alpha + aidx[r] * w : alpha + r * w;
                if (gm)
                    attn_bwd_row<T, true>(a, m + r * c, out_s + os, out_t + ot, lse_s + os, lse_t + ot, g_s + os,
                                          g_t + ot, c, ga + i * w, gm + r * c);
                else
                    attn_bwd_row<T, false>(a, m + r * c, out_s + os, out_t + ot, lse_s + os, lse_t + ot, g_s + os,
                                           g_t + ot, c, ga + i * w, nullptr);
            }
            if (aidx) continue;
            if (g_rows) gemm_serial((const T*)ga, mb, w, w, wp, K, g_rows + s * K, K, (const T*)nullptr, 0);
            if (gy)
                for (i64 r = s; r < s + mb; ++r) {
                    const T* g = gy + r * c;
                    if (gm) {
                        T* gmr = gm + r * c;
#pragma omp simd
                        for (i64 j = 0; j < c; ++j) gmr[j] += g[j];
                    }
                    if (g_rows) {
                        T* gr = g_rows + r * c;
#pragma omp simd
                        for (i64 j = 0; j < c; ++j) gr[j] = std::fma(g[j], rw[j], gr[j]);
                    }
                }
        }
        if (aidx && g_rows) {
#pragma omp barrier
            i64 j0, j1;
            channel_range(w, j0, j1);
            for (i64 r = 0; r < e; ++r) {
                const T* v = ga_all + r * w;
                T* o = g_rows + aidx[r] * w;
#pragma omp simd
                for (i64 j = j0; j < j1; ++j) o[j] += v[j];
            }
        }
    }
}

using Opt = std::optional<at::Tensor>;

static bool given(const Opt& t) { return t.has_value() && t->defined(); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_pair(
    const at::Tensor& rows_in, const Opt& weight, const Opt& row_index, const at::Tensor& messages,
    const at::Tensor& target, const at::Tensor& source, int64_t num_segments, const Opt& res_weight,
    at::TensorList /*csr: the CUDA kernel's segment order; the CPU loops read the indices*/) {
    const auto dtype = messages.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "matris::attention_pair takes float32 or float64, got ",
                dtype);
    const bool atom = given(row_index);
    TORCH_CHECK(atom || given(weight), "matris::attention_pair: the line-graph form (no row_index) needs weight");
    TORCH_CHECK(!(atom && given(res_weight)), "matris::attention_pair: res_weight is for the line-graph form");
    check_input(messages, "attention_pair", "messages", dtype);
    check_input(target, "attention_pair", "target", at::kLong);
    check_input(source, "attention_pair", "source", at::kLong);
    const i64 e = messages.size(0), c = messages.size(1), w = 2 * c;
    at::Tensor rows = atom || rows_in.stride(-1) != 1 ? rows_in.contiguous() : rows_in;
    TORCH_CHECK(rows.scalar_type() == dtype, "matris::attention_pair: rows and messages must share a dtype");
    at::Tensor index = atom ? row_index->contiguous() : at::Tensor();
    if (atom) TORCH_CHECK(rows.size(1) == w, "matris::attention_pair: projected rows are [B, 2C]");
    const i64 K = atom ? 0 : rows.size(1);
    at::Tensor rw = given(res_weight) ? res_weight->contiguous().view({-1}) : at::Tensor();
    if (rw.defined()) TORCH_CHECK(rw.numel() == c && K == c, "matris::attention_pair: the residual needs d = C");
    auto opts = messages.options();
    at::Tensor alpha = atom ? at::empty({0}, opts) : at::empty({e, w}, opts);
    at::Tensor y_new = rw.defined() ? at::empty({e, c}, opts) : at::empty({0}, opts);
    at::Tensor out_s = at::empty({num_segments, c}, opts), out_t = at::empty({num_segments, c}, opts),
               lse_s = at::empty({num_segments, c}, opts), lse_t = at::empty({num_segments, c}, opts),
               sum_s = at::empty({num_segments, c}, opts), sum_t = at::empty({num_segments, c}, opts);
    const at::Tensor wp = atom ? at::Tensor() : pack(weight->t());
    AT_DISPATCH_FLOATING_TYPES(dtype, "matris_attention_pair", [&] {
        const i64 nq = num_segments * c;
        attn_init(nq, out_s.data_ptr<scalar_t>(), lse_s.data_ptr<scalar_t>(), sum_s.data_ptr<scalar_t>());
        attn_init(nq, out_t.data_ptr<scalar_t>(), lse_t.data_ptr<scalar_t>(), sum_t.data_ptr<scalar_t>());
        attn_fwd<scalar_t>(rows.data_ptr<scalar_t>(), atom ? w : rows.stride(0), K, data<scalar_t>(wp),
                           atom ? index.data_ptr<i64>() : nullptr, messages.data_ptr<scalar_t>(),
                           source.data_ptr<i64>(), target.data_ptr<i64>(), e, c, data<scalar_t>(alpha),
                           out_s.data_ptr<scalar_t>(), out_t.data_ptr<scalar_t>(), lse_s.data_ptr<scalar_t>(),
                           lse_t.data_ptr<scalar_t>(), sum_s.data_ptr<scalar_t>(), sum_t.data_ptr<scalar_t>(),
                           data<scalar_t>(rw), data<scalar_t>(y_new), threads_for(e, 2.0 * K * c + 64.0 * c));
        attn_finish(nq, out_s.data_ptr<scalar_t>(), lse_s.data_ptr<scalar_t>(), sum_s.data_ptr<scalar_t>());
        attn_finish(nq, out_t.data_ptr<scalar_t>(), lse_t.data_ptr<scalar_t>(), sum_t.data_ptr<scalar_t>());
    });
    return {out_t, out_s, y_new, alpha, lse_s, lse_t};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_pair_backward(
    const at::Tensor& g_t_in, const at::Tensor& g_s_in, const Opt& g_y_in, const at::Tensor& rows,
    const Opt& weight, const Opt& row_index, const at::Tensor& messages, const at::Tensor& target,
    const at::Tensor& source, const at::Tensor& alpha_in, const at::Tensor& out_s, const at::Tensor& out_t,
    const at::Tensor& lse_s, const at::Tensor& lse_t, const Opt& res_weight, bool want_rows, bool want_messages,
    bool want_weights) {
    const auto dtype = messages.scalar_type();
    const bool atom = given(row_index);
    const i64 e = messages.size(0), c = messages.size(1), w = 2 * c;
    auto opts = messages.options();
    const at::Tensor g_t = g_t_in.contiguous(), g_s = g_s_in.contiguous();
    // atom graph: α is the projected rows, read through row_index
    const at::Tensor alpha = atom ? rows.contiguous() : alpha_in.contiguous();
    for (const at::Tensor* t : {&g_t, &g_s, &alpha, &out_s, &out_t, &lse_s, &lse_t})
        check_input(*t, "attention_pair_backward", "a saved tensor or a gradient", dtype);
    const bool res = !atom && given(res_weight) && given(g_y_in);
    const at::Tensor g_y = res ? g_y_in->contiguous() : at::Tensor();
    const at::Tensor rw = res ? res_weight->contiguous().view({-1}) : at::Tensor();
    at::Tensor g_rows = want_rows ? (atom ? at::zeros(rows.sizes(), opts) : at::empty(rows.sizes(), opts))
                                  : at::empty({0}, opts);
    at::Tensor g_m = want_messages ? at::empty({e, c}, opts) : at::empty({0}, opts);
    // ∂L/∂α per row for the projection's weight gradient (line graph)
    at::Tensor g_alpha = want_weights && !atom ? at::empty({e, w}, opts) : at::empty({0}, opts);
    if (e == 0) {
        if (want_rows) g_rows.zero_();
        return {g_rows, g_m, g_alpha};
    }
    const i64 K = atom ? 0 : rows.size(1);
    const at::Tensor wp = !atom && want_rows ? pack(*weight) : at::Tensor();
    const at::Tensor index = atom ? row_index->contiguous() : at::Tensor();
    at::Tensor ga_all = atom ? at::empty({e, w}, opts) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(dtype, "matris_attention_pair_backward", [&] {
        attn_bwd<scalar_t>(alpha.data_ptr<scalar_t>(), atom ? index.data_ptr<i64>() : nullptr,
                           messages.contiguous().data_ptr<scalar_t>(), source.data_ptr<i64>(), target.data_ptr<i64>(),
                           e, c, out_s.data_ptr<scalar_t>(), out_t.data_ptr<scalar_t>(), lse_s.data_ptr<scalar_t>(),
                           lse_t.data_ptr<scalar_t>(), g_s.data_ptr<scalar_t>(), g_t.data_ptr<scalar_t>(),
                           want_messages ? g_m.data_ptr<scalar_t>() : nullptr, data<scalar_t>(wp), K,
                           want_rows ? g_rows.data_ptr<scalar_t>() : nullptr, data<scalar_t>(g_y), data<scalar_t>(rw),
                           data<scalar_t>(ga_all), want_weights && !atom ? g_alpha.data_ptr<scalar_t>() : nullptr,
                           threads_for(e, 4.0 * K * c + 96.0 * c));
    });
    return {g_rows, g_m, g_alpha};
}

}  // namespace
}  // namespace matris_cpu

TORCH_LIBRARY_IMPL(matris, CPU, m) {
    m.impl("attention_pair", &matris_cpu::attention_pair);
    m.impl("attention_pair_backward", &matris_cpu::attention_pair_backward);
}
