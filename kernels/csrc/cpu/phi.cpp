// matris::gated_phi and matris::gated_phi_backward on the CPU: the whole gated Φ of an edge
// update (spec §5; the formulas in kernels/phi.py's docstring) in one pass over the rows.
//
// Each thread takes its share of the rows in blocks of kBlock and runs every step on a block while
// it is in L2 (with the packed weights, ~0.4 MiB): the first layer's GEMM and gathers, SiLU, the
// two second-layer GEMMs and the gated epilogue, instead of one pass (and one temporary) per
// PyTorch op over tensors that do not fit in cache.

#include "common.h"

namespace matris_cpu {
namespace {

// Gated epilogue, RMSNorm (Layer = false): rc = rsqrt(mean(core²) + eps) (rg likewise),
// out = silu(core·rc·nc) ⊙ σ(gate·rg·ng). σ(gn) is not stored: the backward recomputes it from the
// stored gate row and rg, the same expression on the same values (one exp per element instead of a
// row stored and read back, and a fifth less memory kept for the backward).
// LayerNorm (Layer = true): core and gate are first centred in place (core ← core − mean(core),
// two passes, as torch's layer_norm), rc = rsqrt(mean(core²) + eps) of the centred row, and the
// norms' biases nbc, nbg are added: out = silu(core·rc·nc + nbc) ⊙ σ(gate·rg·ng + nbg). The
// stored rows are then the centred ones, which is all the backward needs.
// The biases bc, bg (nullable) are added to core and gate in place first (the GEMMs before run
// without them, so no pass copies a bias into their outputs). HasBias is a template argument:
// a null test inside the loop made GCC emit masked gathers (measured 1.4x slower).
template <typename T, bool HasBias, bool Layer>
static inline void gated_fwd_row(T* c, T* g, i64 d, const T* bc, const T* bg, const T* nc, const T* ng,
                                 const T* nbc, const T* nbg, T eps, T* rc, T* rg, T* o) {
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
        o[j] = cn / (T(1) + vexp(-cn)) * sv;
    }
}

// the row function for a row's norm (layer: LayerNorm, else RMSNorm) and biases
template <typename T, bool HasBias>
static inline void gated_fwd_any(int layer, T* c, T* g, i64 d, const T* bc, const T* bg, const T* nc, const T* ng,
                                 const T* nbc, const T* nbg, T eps, T* rc, T* rg, T* o) {
    if (layer)
        gated_fwd_row<T, HasBias, true>(c, g, d, bc, bg, nc, ng, nbc, nbg, eps, rc, rg, o);
    else
        gated_fwd_row<T, HasBias, false>(c, g, d, bc, bg, nc, ng, nbc, nbg, eps, rc, rg, o);
}

// Its backward (input gradients): G → (G_core, G_gate), the formulas of kernels/phi.py; c and g
// are the stored rows (centred for LayerNorm), whose gradient through x·r with r = rsqrt(mean(x²)
// + eps) is r·X − x·r³·mean(X ⊙ x), X = ∂L/∂(x·r); LayerNorm's centring also subtracts r·mean(X).
// Keep: also write ∂L/∂cn and ∂L/∂gn (the norms' outputs) to ocn, ogn, for the norms' weight gradients.
template <typename T, bool Layer, bool Keep>
static inline void gated_bwd_row(const T* c, const T* g, const T* G, const T* nc, const T* ng, const T* nbc,
                                 const T* nbg, i64 d, T a, T bb, T* oc, T* og, T* ocn, T* ogn) {
    T dc = 0, dg = 0, mc = 0, mg = 0;
#pragma omp simd reduction(+ : dc, dg, mc, mg)
    for (i64 j = 0; j < d; ++j) {
        const T cn = Layer ? c[j] * a * nc[j] + nbc[j] : c[j] * a * nc[j];
        const T sc = sigm(cn);
        const T sv = sigm(Layer ? g[j] * bb * ng[j] + nbg[j] : g[j] * bb * ng[j]);  // as the forward
        const T gcn = G[j] * sv * sc * (T(1) + cn * (T(1) - sc));  // ∂L/∂cn
        const T ggn = G[j] * cn * sc * sv * (T(1) - sv);              // ∂L/∂gn
        if (Keep) {
            ocn[j] = gcn;
            ogn[j] = ggn;
        }
        const T xc = gcn * nc[j];  // ∂L/∂(core·rc)
        const T xg = ggn * ng[j];  // ∂L/∂(gate·rg)
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
static inline void gated_bwd_any(int layer, const T* c, const T* g, const T* G, const T* nc, const T* ng,
                                 const T* nbc, const T* nbg, i64 d, T a, T bb, T* oc, T* og, T* ocn, T* ogn) {
    if (ocn) {
        if (layer)
            gated_bwd_row<T, true, true>(c, g, G, nc, ng, nbc, nbg, d, a, bb, oc, og, ocn, ogn);
        else
            gated_bwd_row<T, false, true>(c, g, G, nc, ng, nbc, nbg, d, a, bb, oc, og, ocn, ogn);
    } else if (layer) {
        gated_bwd_row<T, true, false>(c, g, G, nc, ng, nbc, nbg, d, a, bb, oc, og, ocn, ogn);
    } else {
        gated_bwd_row<T, false, false>(c, g, G, nc, ng, nbc, nbg, d, a, bb, oc, og, ocn, ogn);
    }
}


// ask for a row of w values to be brought towards the core (L2), one request per cache line
template <typename T> static inline void prefetch_row(const T* row, i64 w) {
    for (i64 j = 0; j < w; j += 64 / sizeof(T)) __builtin_prefetch(row + j, 0, 2);
}

// Forward: pre = rows·W_r (rows nullable) + b₁ + Σ_k P_k[idx_k]; hid = silu(pre), pre ← silu'(pre);
// core = hid_c·W_c, gate = hid_g·W_g; then the gated epilogue (gated_fwd_row, biases added there).
// wr, wc, wg: packed (pack) [dr → 2H], [H → d], [H → d]; rows [n, dr] with row stride ldr.
// hid_out (nullable, [n, 2H]): hid is written there instead of a block buffer (the second layers'
// weight gradients read it: training without a graph of the backward).
template <typename T>
void phi_fwd(const T* rows, i64 ldr, i64 dr, const T* wr, i64 n, i64 h, const T* bias, int nterms,
             const T* const* projs, const i64* const* idx, const T* wc, const T* wg, i64 d, const T* bc, const T* bg,
             const T* nc, const T* ng, const T* nbc, const T* nbg, int layer, T eps, T* pre, T* core, T* gate, T* rc,
             T* rg, T* out, T* hid_out, int nt) {
    const i64 w = 2 * h;
#pragma omp parallel num_threads(nt)
    {
        i64 b, e;
        split(n, b, e);
        std::vector<T> buffer(hid_out ? 0 : kBlock * w);
        for (i64 s = b; s < e; s += kBlock) {
            const i64 m = std::min(kBlock, e - s);
            T* p = pre + s * w;
            T* hid = hid_out ? hid_out + s * w : buffer.data();
            // the block's gathered rows (random rows of tables larger than L2) are requested
            // before its first GEMM, which then hides their latency
            for (int k = 0; k < nterms; ++k)
                for (i64 r = s; r < s + m; ++r) prefetch_row(projs[k] + idx[k][r] * w, w);
            if (rows) gemm_serial(rows + s * ldr, m, dr, ldr, wr, w, p, w, (const T*)nullptr, 0);
            for (i64 r = 0; r < m; ++r)
                gather_silu_row(p + r * w, hid + r * w, w, bias, rows == nullptr, nterms, projs, idx, s + r, 1);
            gemm_serial((const T*)hid, m, h, w, wc, d, core + s * d, d, (const T*)nullptr, 0);
            gemm_serial((const T*)hid + h, m, h, w, wg, d, gate + s * d, d, (const T*)nullptr, 0);
            for (i64 r = s; r < s + m; ++r)
                gated_fwd_any<T, true>(layer, core + r * d, gate + r * d, d, bc, bg, nc, ng, nbc, nbg, eps, rc + r,
                                       rg + r, out + r * d);
        }
    }
}

// Backward (input gradients; pre holds silu'(pre)): G → (G_core, G_gate) (gated_bwd_row),
// G_pre = silu'(pre) ⊙ [G_core·W_cᵀ ‖ G_gate·W_gᵀ], G_rows = G_pre·W_r (g_rows nullable) by
// blocks of rows; every `chunk` rows the chunk's G_pre is scattered to the projections' gradients
// outs_k[idx_k] (threads own channel ranges, rows in order: the same sums for any thread count).
// wc, wg: packed [d → H]; wr: packed [2H → dr]. With keep (weight gradients wanted), G_pre, G_core,
// G_gate, ∂L/∂cn and ∂L/∂gn of every row are written to keep[0..4] ([n, 2H], then [n, d] each) instead
// of block buffers: the weight gradients are GEMMs over all rows of those (kernels/phi.py).
template <typename T>
void phi_bwd(const T* grad, const T* core, const T* gate, const T* rc, const T* rg, const T* nc, const T* ng,
             const T* nbc, const T* nbg, int layer, const T* pre, i64 n, i64 d, i64 h, const T* wc, const T* wg,
             const T* wr, i64 dr, T* g_rows, int nterms, T* const* outs, const i64* const* idx, i64 chunk,
             T* const* keep, int nt) {
    const i64 w = 2 * h;
    std::vector<T> gh(keep ? 0 : std::min(chunk, n) * w);
#pragma omp parallel num_threads(nt)
    {
        std::vector<T> gc(keep ? 0 : kBlock * d), gg(keep ? 0 : kBlock * d);
        for (i64 s0 = 0; s0 < n; s0 += chunk) {
            const i64 k = std::min(chunk, n - s0);
            T* ghc = keep ? keep[0] + s0 * w : gh.data();  // the chunk's G_pre
            i64 b, e;
            split(k, b, e);
            for (i64 s = b; s < e; s += kBlock) {
                const i64 m = std::min(kBlock, e - s), r0 = s0 + s;
                T* bc_ = keep ? keep[1] + r0 * d : gc.data();
                T* bg_ = keep ? keep[2] + r0 * d : gg.data();
                for (i64 r = 0; r < m; ++r) {
                    const i64 o = (r0 + r) * d;
                    gated_bwd_any(layer, core + o, gate + o, grad + o, nc, ng, nbc, nbg, d, rc[r0 + r], rg[r0 + r],
                                  bc_ + r * d, bg_ + r * d, keep ? keep[3] + o : nullptr, keep ? keep[4] + o : nullptr);
                }
                T* gp = ghc + s * w;
                gemm_serial((const T*)bc_, m, d, d, wc, h, gp, w, pre + r0 * w, w);
                gemm_serial((const T*)bg_, m, d, d, wg, h, gp + h, w, pre + r0 * w + h, w);
                if (g_rows) gemm_serial((const T*)gp, m, w, w, wr, dr, g_rows + r0 * dr, dr, (const T*)nullptr, 0);
            }
            if (nterms) {
#pragma omp barrier
                i64 j0, j1;
                channel_range(w, j0, j1);
                for (i64 r = 0; r < k; ++r) {
                    const T* src = ghc + r * w;
                    for (int t = 0; t < nterms; ++t) {
                        T* o = outs[t] + idx[t][s0 + r] * w;
#pragma omp simd
                        for (i64 j = j0; j < j1; ++j) o[j] += src[j];
                    }
                }
#pragma omp barrier
            }
        }
    }
}

using Tensors = std::vector<at::Tensor>;
using Opt = std::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_phi(
    const Opt& rows_in, const Opt& row_weight, const at::Tensor& bias1_in, const at::Tensor& core_weight,
    const at::Tensor& core_bias_in, const at::Tensor& gate_weight, const at::Tensor& gate_bias_in,
    const at::Tensor& core_norm_in, const at::Tensor& gate_norm_in, const Opt& core_norm_bias,
    const Opt& gate_norm_bias, at::TensorList projections, at::TensorList indices, double eps, bool layer,
    int64_t chunk, bool keep_hidden) {
    (void)chunk;  // the forward needs no chunks: rows never scatter
    const auto dtype = bias1_in.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "matris::gated_phi takes float32 or float64, got ", dtype);
    TORCH_CHECK(projections.size() == indices.size(), "matris::gated_phi: one index per projection");
    const bool has_rows = rows_in.has_value() && rows_in->defined();
    TORCH_CHECK(has_rows || !indices.empty(), "matris::gated_phi: give rows or at least one gathered term");
    TORCH_CHECK(!has_rows || (row_weight.has_value() && row_weight->defined()),
                "matris::gated_phi: rows need row_weight");
    at::Tensor rows = has_rows ? (rows_in->stride(-1) == 1 ? *rows_in : rows_in->contiguous()) : at::Tensor();
    const i64 n = has_rows ? rows.size(0) : indices[0].size(0);
    const i64 two_h = bias1_in.size(0), h = core_weight.size(1), d = core_weight.size(0);
    TORCH_CHECK(two_h == 2 * h && gate_weight.size(1) == h && gate_weight.size(0) == d,
                "matris::gated_phi: bias1 [2H], core/gate weight [d, H] expected");
    const at::Tensor bias1 = bias1_in.contiguous(), core_bias = core_bias_in.contiguous(),
                     gate_bias = gate_bias_in.contiguous(), core_norm = core_norm_in.contiguous(),
                     gate_norm = gate_norm_in.contiguous();
    Tensors projs, idx;
    for (size_t k = 0; k < projections.size(); ++k) {
        projs.push_back(projections[k].contiguous());
        idx.push_back(indices[k].contiguous());
        check_input(projs.back(), "gated_phi", "a projection", dtype);
        check_input(idx.back(), "gated_phi", "an index", at::kLong);
        TORCH_CHECK(idx.back().size(0) == n, "matris::gated_phi: every index has one entry per row");
        TORCH_CHECK(projs.back().size(-1) == two_h, "matris::gated_phi: projections are [n_k, 2H]");
    }
    const at::Tensor nbc = layer ? (core_norm_bias.has_value() && core_norm_bias->defined() ? core_norm_bias->contiguous()
                                                                                           : at::zeros_like(core_norm))
                                 : at::Tensor();
    const at::Tensor nbg = layer ? (gate_norm_bias.has_value() && gate_norm_bias->defined() ? gate_norm_bias->contiguous()
                                                                                           : at::zeros_like(gate_norm))
                                 : at::Tensor();
    auto opts = bias1.options();
    at::Tensor out = at::empty({n, d}, opts), pre = at::empty({n, two_h}, opts), core = at::empty({n, d}, opts),
               gate = at::empty({n, d}, opts), r_c = at::empty({n, 1}, opts), r_g = at::empty({n, 1}, opts),
               hid = keep_hidden ? at::empty({n, two_h}, opts) : at::empty({0}, opts);
    const at::Tensor wr = has_rows ? pack(row_weight->t()) : at::Tensor();
    const at::Tensor wc = pack(core_weight.t()), wg = pack(gate_weight.t());
    AT_DISPATCH_FLOATING_TYPES(dtype, "matris_gated_phi", [&] {
        std::vector<const scalar_t*> pp;
        std::vector<const i64*> ip;
        for (size_t k = 0; k < projs.size(); ++k) {
            pp.push_back(projs[k].data_ptr<scalar_t>());
            ip.push_back(idx[k].data_ptr<i64>());
        }
        phi_fwd<scalar_t>(data<scalar_t>(rows), has_rows ? rows.stride(0) : 0, has_rows ? rows.size(1) : 0,
                          data<scalar_t>(wr), n, h, bias1.data_ptr<scalar_t>(), (int)pp.size(), pp.data(), ip.data(),
                          wc.data_ptr<scalar_t>(), wg.data_ptr<scalar_t>(), d, core_bias.data_ptr<scalar_t>(),
                          gate_bias.data_ptr<scalar_t>(), core_norm.data_ptr<scalar_t>(),
                          gate_norm.data_ptr<scalar_t>(), data<scalar_t>(nbc), data<scalar_t>(nbg), (int)layer,
                          (scalar_t)eps, pre.data_ptr<scalar_t>(), core.data_ptr<scalar_t>(),
                          gate.data_ptr<scalar_t>(), r_c.data_ptr<scalar_t>(), r_g.data_ptr<scalar_t>(),
                          out.data_ptr<scalar_t>(), keep_hidden ? hid.data_ptr<scalar_t>() : nullptr,
                          threads_for(n, 2.0 * (has_rows ? rows.size(1) : 0) * two_h + 4.0 * h * d));
    });
    return {out, pre, core, gate, r_c, r_g, hid};
}

Tensors gated_phi_backward(const at::Tensor& grad_in, const Opt& row_weight, const at::Tensor& core_weight,
                           const at::Tensor& gate_weight, const at::Tensor& core_norm_in,
                           const at::Tensor& gate_norm_in, const Opt& core_norm_bias, const Opt& gate_norm_bias,
                           const at::Tensor& slope, const at::Tensor& core, const at::Tensor& gate,
                           const at::Tensor& r_c, const at::Tensor& r_g, at::TensorList indices,
                           at::IntArrayRef projection_rows, bool want_rows, c10::List<bool> want_projections,
                           bool layer, int64_t chunk, bool want_weights) {
    const auto dtype = slope.scalar_type();
    TORCH_CHECK(indices.size() == projection_rows.size() && indices.size() == want_projections.size(),
                "matris::gated_phi_backward: one index, row count and flag per projection");
    TORCH_CHECK(!want_rows || (row_weight.has_value() && row_weight->defined()),
                "matris::gated_phi_backward: the rows' gradient needs row_weight");
    const at::Tensor grad = grad_in.contiguous(), core_norm = core_norm_in.contiguous(),
                     gate_norm = gate_norm_in.contiguous();
    for (const at::Tensor* t : {&grad, &slope, &core, &gate, &r_c, &r_g})
        check_input(*t, "gated_phi_backward", "a saved tensor or the gradient", dtype);
    const i64 n = slope.size(0), two_h = slope.size(1), h = two_h / 2, d = core_weight.size(0);
    const at::Tensor nbc = layer ? (core_norm_bias.has_value() && core_norm_bias->defined() ? core_norm_bias->contiguous()
                                                                                           : at::zeros_like(core_norm))
                                 : at::Tensor();
    const at::Tensor nbg = layer ? (gate_norm_bias.has_value() && gate_norm_bias->defined() ? gate_norm_bias->contiguous()
                                                                                           : at::zeros_like(gate_norm))
                                 : at::Tensor();
    auto opts = slope.options();
    const i64 dr = want_rows ? row_weight->size(1) : 0;
    at::Tensor g_rows = want_rows ? at::empty({n, dr}, opts) : at::empty({0}, opts);
    Tensors result{g_rows}, wanted, wanted_idx;
    for (size_t k = 0; k < indices.size(); ++k) {
        if (want_projections.get(k)) {
            at::Tensor g = at::zeros({projection_rows[k], two_h}, opts);
            result.push_back(g);
            wanted.push_back(g);
            wanted_idx.push_back(indices[k].contiguous());
            check_input(wanted_idx.back(), "gated_phi_backward", "an index", at::kLong);
        } else {
            result.push_back(at::empty({0}, opts));
        }
    }
    // weight gradients: G_pre [n, 2H], G_core, G_gate, ∂L/∂cn, ∂L/∂gn [n, d] (see phi_bwd)
    Tensors keep;
    if (want_weights) {
        keep.push_back(at::empty({n, two_h}, opts));
        for (int k = 0; k < 4; ++k) keep.push_back(at::empty({n, d}, opts));
        result.insert(result.end(), keep.begin(), keep.end());
    }
    if (n == 0) return result;
    const at::Tensor wc = pack(core_weight), wg = pack(gate_weight);
    const at::Tensor wr = want_rows ? pack(*row_weight) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(dtype, "matris_gated_phi_backward", [&] {
        std::vector<scalar_t*> op, kp;
        std::vector<const i64*> ip;
        for (size_t k = 0; k < wanted.size(); ++k) {
            op.push_back(wanted[k].data_ptr<scalar_t>());
            ip.push_back(wanted_idx[k].data_ptr<i64>());
        }
        for (auto& t : keep) kp.push_back(t.data_ptr<scalar_t>());
        phi_bwd<scalar_t>(grad.data_ptr<scalar_t>(), core.data_ptr<scalar_t>(), gate.data_ptr<scalar_t>(),
                          r_c.data_ptr<scalar_t>(), r_g.data_ptr<scalar_t>(), core_norm.data_ptr<scalar_t>(),
                          gate_norm.data_ptr<scalar_t>(), data<scalar_t>(nbc), data<scalar_t>(nbg), (int)layer, slope.data_ptr<scalar_t>(), n, d, h, wc.data_ptr<scalar_t>(),
                          wg.data_ptr<scalar_t>(), data<scalar_t>(wr), dr, want_rows ? g_rows.data_ptr<scalar_t>() : nullptr,
                          (int)op.size(), op.data(), ip.data(), std::max<int64_t>(1, chunk),
                          want_weights ? kp.data() : nullptr, threads_for(n, 4.0 * dr * 2 * h + 8.0 * h * d));
    });
    return result;
}

}  // namespace
}  // namespace matris_cpu

TORCH_LIBRARY_IMPL(matris, CPU, m) {
    m.impl("gated_phi", &matris_cpu::gated_phi);
    m.impl("gated_phi_backward", &matris_cpu::gated_phi_backward);
}
