// matris::refine_edges and matris::refine_edges_backward on the CPU: the edge side of Refine on
// the line graph (spec §5; the formulas in kernels/refine.py), in one pass over the rows.

#include "common.h"

namespace matris_cpu {
namespace {

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

// Forward: per block of rows, u_g = u ⊙ q[src] ⊙ q[tgt] into the chunk's buffer, then (y given)
// h = (u_g or u)·W₁ (kept: ← silu'(h + b₁)), y' = silu(h + b₁)·W₂ + b₂ + w ⊙ y; every `chunk` rows
// the chunk's u_g is summed into agg[tgt] (threads own channel ranges, rows in order).
// w1p: packed [C → H]; w2p: packed [H → C]; b1, b2 nullable. act_out (nullable, [e, H]): the FFN's
// hidden activation silu(h + b₁) is written there instead of a block buffer (W₂'s weight gradient).
template <typename T>
void refine_fwd_whole(const T* u, const T* q, const i64* src, const i64* tgt, i64 e, i64 c,
                             const T* y, const T* rw, const T* w1p, const T* b1, const T* w2p,
                             const T* b2, i64 hd, int smooth, i64 chunk, T* agg, T* h, T* y_new,
                             T* act_out, int nt) {
    std::vector<T> ugc(std::min(chunk, e) * c);
#pragma omp parallel num_threads(nt)
    {
        std::vector<T> buffer(y && !act_out ? kBlock * hd : 0);
        for (i64 s0 = 0; s0 < e; s0 += chunk) {
            const i64 k = std::min(chunk, e - s0);
            i64 b, en;
            split(k, b, en);
            for (i64 s = b; s < en; s += kBlock) {
                const i64 mb = std::min(kBlock, en - s), r0 = s0 + s;
                for (i64 i = 0; i < mb; ++i) {
                    const i64 r = r0 + i;
                    const T* ur = u + r * c;
                    const T* qs = q + src[r] * c;
                    const T* qt = q + tgt[r] * c;
                    T* o = ugc.data() + (s + i) * c;
#pragma omp simd
                    for (i64 j = 0; j < c; ++j) o[j] = ur[j] * (qs[j] * qt[j]);
                }
                if (!y) continue;
                T* act = act_out ? act_out + r0 * hd : buffer.data();
                gemm_serial(smooth ? ugc.data() + s * c : u + r0 * c, mb, c, c, w1p, hd, h + r0 * hd, hd, (const T*)nullptr, 0);
                for (i64 i = 0; i < mb; ++i)
                    gather_silu_row(h + (r0 + i) * hd, act + i * hd, hd, b1, 0, 0, (const T* const*)nullptr,
                                    (const i64* const*)nullptr, 0, 1);
                gemm_serial((const T*)act, mb, hd, hd, w2p, c, y_new + r0 * c, c, (const T*)nullptr, 0);
                for (i64 r = r0; r < r0 + mb; ++r) {
                    T* o = y_new + r * c;
                    const T* yr = y + r * c;
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
                const T* v = ugc.data() + r * c;
                T* ag = agg + tgt[s0 + r] * c;
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
// residual's G_y = rw ⊙ G_y'. gh_out (nullable, [e, H]): G_h of every row is written there instead of
// a block buffer (W₁'s weight gradient).
template <typename T>
void refine_bwd_whole(const T* g_agg, const T* g_ynew, const T* u, const T* q, const i64* src,
                             const i64* tgt, i64 e, i64 c, const T* h, const T* w2p, const T* w1p, i64 hd,
                             int smooth, T* g_u, T* g_q, T* g_y, const T* rw, i64 chunk, T* gh_out, int nt) {
    const i64 kc = std::min(chunk, e);
    std::vector<T> ps(g_q ? kc * c : 0), pt(g_q ? kc * c : 0);
#pragma omp parallel num_threads(nt)
    {
        std::vector<T> buffer(g_ynew && !gh_out ? kBlock * hd : 0), gin(g_ynew ? kBlock * c : 0);
        auto rows = [&](i64 s, i64 r0, i64 mb, auto has_in, auto has_u, auto has_q) {
            for (i64 i = 0; i < mb; ++i) {
                const i64 r = r0 + i;
                refine_bwd_row<T, decltype(has_in)::value, decltype(has_u)::value, decltype(has_q)::value>(
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
            for (i64 s = b; s < en; s += kBlock) {
                const i64 mb = std::min(kBlock, en - s), r0 = s0 + s;
                if (g_ynew) {
                    if (g_y)  // the residual's G_y = w ⊙ G_y', while the rows are read for the GEMM
                        for (i64 r = r0; r < r0 + mb; ++r) {
                            const T* gr = g_ynew + r * c;
                            T* o = g_y + r * c;
#pragma omp simd
                            for (i64 j = 0; j < c; ++j) o[j] = gr[j] * rw[j];
                        }
                    T* gh = gh_out ? gh_out + r0 * hd : buffer.data();
                    gemm_serial(g_ynew + r0 * c, mb, c, c, w2p, hd, gh, hd, h + r0 * hd, hd);
                    gemm_serial((const T*)gh, mb, hd, hd, w1p, c, gin.data(), c, (const T*)nullptr, 0);
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
                    const T* v = ps.data() + r * c;
                    T* o = g_q + src[s0 + r] * c;
#pragma omp simd
                    for (i64 j = j0; j < j1; ++j) o[j] += v[j];
                }
                for (i64 r = 0; r < k; ++r) {
                    const T* v = pt.data() + r * c;
                    T* o = g_q + tgt[s0 + r] * c;
#pragma omp simd
                    for (i64 j = j0; j < j1; ++j) o[j] += v[j];
                }
#pragma omp barrier
            }
        }
    }
}


using Opt = std::optional<at::Tensor>;

static bool given(const Opt& t) { return t.has_value() && t->defined(); }

// about 2 MiB of rows per scatter chunk
static i64 default_chunk(i64 c, size_t size) { return std::max<i64>(64, (i64(2) << 20) / std::max<i64>(1, c * size)); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> refine_edges(const at::Tensor& u_in, const at::Tensor& q_in,
                                                            const at::Tensor& src_in, const at::Tensor& tgt_in,
                                                            int64_t num_segments, const Opt& y_in,
                                                            const Opt& res_weight, const Opt& w1, const Opt& b1_in,
                                                            const Opt& w2, const Opt& b2_in, bool smooth,
                                                            int64_t chunk, bool keep_hidden) {
    const auto dtype = u_in.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "matris::refine_edges takes float32 or float64, got ",
                dtype);
    const at::Tensor u = u_in.contiguous(), q = q_in.contiguous(), src = src_in.contiguous(), tgt = tgt_in.contiguous();
    check_input(q, "refine_edges", "q", dtype);
    check_input(src, "refine_edges", "src", at::kLong);
    check_input(tgt, "refine_edges", "tgt", at::kLong);
    const i64 e = u.size(0), c = u.size(1);
    const bool edges = given(y_in);
    TORCH_CHECK(!edges || (given(res_weight) && given(w1) && given(w2)),
                "matris::refine_edges: the edge update (y) needs res_weight, w1 and w2");
    auto opts = u.options();
    at::Tensor agg = at::zeros({num_segments, c}, opts);
    const i64 hd = edges ? w1->size(0) : 0;
    at::Tensor y_new = edges ? at::empty({e, w2->size(0)}, opts) : at::empty({0}, opts);
    at::Tensor h = edges ? at::empty({e, hd}, opts) : at::empty({0}, opts);
    at::Tensor act = edges && keep_hidden ? at::empty({e, hd}, opts) : at::empty({0}, opts);
    if (e == 0) return {agg, y_new, h, act};
    at::Tensor y, rw, w1p, w2p, b1, b2;
    if (edges) {
        y = y_in->contiguous();
        check_input(y, "refine_edges", "y", dtype);
        rw = res_weight->contiguous().view({-1});
        TORCH_CHECK(rw.numel() == c && w2->size(0) == c && w1->size(1) == c,
                    "matris::refine_edges: w1 [H, C], w2 [C, H] and res_weight [C] expected");
        w1p = pack(w1->t());
        w2p = pack(w2->t());
        if (given(b1_in)) b1 = b1_in->contiguous();
        if (given(b2_in)) b2 = b2_in->contiguous();
    }
    chunk = chunk > 0 ? chunk : default_chunk(c, u.element_size());
    AT_DISPATCH_FLOATING_TYPES(dtype, "matris_refine_edges", [&] {
        refine_fwd_whole<scalar_t>(u.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), src.data_ptr<i64>(),
                                   tgt.data_ptr<i64>(), e, c, data<scalar_t>(y), data<scalar_t>(rw),
                                   data<scalar_t>(w1p), data<scalar_t>(b1), data<scalar_t>(w2p), data<scalar_t>(b2), hd,
                                   (int)smooth, chunk, agg.data_ptr<scalar_t>(), data<scalar_t>(h),
                                   data<scalar_t>(y_new), edges && keep_hidden ? act.data_ptr<scalar_t>() : nullptr,
                                   threads_for(e, 4.0 * c * std::max<i64>(hd, 1) + 16.0 * c));
    });
    return {agg, y_new, h, act};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> refine_edges_backward(
    const at::Tensor& g_agg_in, const Opt& g_ynew_in, const at::Tensor& u_in, const at::Tensor& q_in,
    const at::Tensor& src_in, const at::Tensor& tgt_in, const Opt& w1, const Opt& w2, const at::Tensor& h,
    const Opt& res_weight, bool smooth, int64_t chunk, bool want_u, bool want_q, bool want_y, bool want_weights) {
    const auto dtype = u_in.scalar_type();
    const at::Tensor u = u_in.contiguous(), q = q_in.contiguous(), src = src_in.contiguous(), tgt = tgt_in.contiguous(),
                     g_agg = g_agg_in.contiguous();
    check_input(g_agg, "refine_edges_backward", "the gradient of R", dtype);
    const i64 e = u.size(0), c = u.size(1);
    const bool ffn = given(g_ynew_in);
    auto opts = u.options();
    const std::vector<int64_t> none{0}, edge_shape{e, c};
    at::Tensor g_u = want_u ? at::empty(u.sizes(), opts) : at::empty(none, opts);
    at::Tensor g_q = want_q ? at::zeros(q.sizes(), opts) : at::empty(none, opts);
    at::Tensor g_y = at::empty(want_y && ffn ? edge_shape : none, opts);
    const bool keep = want_weights && ffn;  // G_h per row: W₁'s weight gradient
    at::Tensor g_h = keep ? at::empty({e, w1->size(0)}, opts) : at::empty(none, opts);
    if (e == 0) return {g_u, g_q, g_y, g_h};
    at::Tensor g_ynew, w1p, w2p, rw;
    i64 hd = 0;
    if (ffn) {
        g_ynew = g_ynew_in->contiguous();
        check_input(g_ynew, "refine_edges_backward", "the gradient of y'", dtype);
        check_input(h, "refine_edges_backward", "the saved slope", dtype);
        w2p = pack(*w2);
        w1p = pack(*w1);
        hd = w1->size(0);
        if (want_y) rw = res_weight->contiguous().view({-1});
    }
    chunk = chunk > 0 ? chunk : default_chunk(c, u.element_size());
    AT_DISPATCH_FLOATING_TYPES(dtype, "matris_refine_edges_backward", [&] {
        refine_bwd_whole<scalar_t>(g_agg.data_ptr<scalar_t>(), data<scalar_t>(g_ynew), u.data_ptr<scalar_t>(),
                                   q.data_ptr<scalar_t>(), src.data_ptr<i64>(), tgt.data_ptr<i64>(), e, c,
                                   ffn ? h.data_ptr<scalar_t>() : nullptr, data<scalar_t>(w2p), data<scalar_t>(w1p), hd,
                                   (int)smooth, want_u ? g_u.data_ptr<scalar_t>() : nullptr,
                                   want_q ? g_q.data_ptr<scalar_t>() : nullptr,
                                   want_y && ffn ? g_y.data_ptr<scalar_t>() : nullptr, data<scalar_t>(rw), chunk,
                                   keep ? g_h.data_ptr<scalar_t>() : nullptr,
                                   threads_for(e, 8.0 * c * std::max<i64>(hd, 1) + 24.0 * c));
    });
    return {g_u, g_q, g_y, g_h};
}

}  // namespace
}  // namespace matris_cpu

TORCH_LIBRARY_IMPL(matris, CPU, m) {
    m.impl("refine_edges", &matris_cpu::refine_edges);
    m.impl("refine_edges_backward", &matris_cpu::refine_edges_backward);
}
