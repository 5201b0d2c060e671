// matris::bessel, matris::fourier and matris::spherical (with their *_backward operators) on the
// CPU: the basis functions of spec §3, the formulas of kernels/basis.py's Triton kernels, one pass
// over the rows writing all K columns of each, and an analytic first-order backward.
//
// The derivatives with respect to the learnable frequencies are summed over rows in fixed chunks
// of kChunk rows (each chunk summed in row order by one thread, the chunks then in order), so the
// sums are the same for any thread count.

#include "common.h"

namespace matris_cpu {
namespace {

constexpr i64 kChunk = 1024;

// the chunks [c·kChunk, (c+1)·kChunk) of n rows, shared out among the threads
template <typename F> static void for_chunks(i64 n, F&& body) {
    const i64 chunks = (n + kChunk - 1) / kChunk;
    const int nt = static_cast<int>(std::min<i64>(threads(), std::max<i64>(chunks, 1)));
#pragma omp parallel for num_threads(nt) schedule(static)
    for (i64 c = 0; c < chunks; ++c) body(c * kChunk, std::min(n, (c + 1) * kChunk), c);
}

// Σ over chunks, in order: parts [chunks, k] → [k]
static at::Tensor sum_chunks(const at::Tensor& parts) {
    at::Tensor out = at::zeros({parts.size(1)}, parts.options());
    AT_DISPATCH_FLOATING_TYPES(parts.scalar_type(), "matris_sum_chunks", [&] {
        const scalar_t* p = parts.data_ptr<scalar_t>();
        scalar_t* o = out.data_ptr<scalar_t>();
        const i64 k = parts.size(1);
        for (i64 c = 0; c < parts.size(0); ++c)
            for (i64 j = 0; j < k; ++j) o[j] += p[c * k + j];
    });
    return out;
}

static void check_rows(const at::Tensor& t, const char* op, const char* name) {
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, "matris::", op,
                " takes float32 or float64, got ", t.scalar_type());
    TORCH_CHECK(t.dim() == 1, "matris::", op, ": ", name, " must be 1-D");
}

// the polynomial envelope f(s) of order p and its derivative df/ds; both zero for s ≥ 1
template <typename T> static inline void envelope(T s, i64 p, T& f, T& df) {
    if (!(s < T(1))) {
        f = df = T(0);
        return;
    }
    T sp = s;
    for (i64 i = 1; i < p; ++i) sp *= s;  // s^p
    const T a = T((p + 1) * (p + 2)) / T(2), b = T(p * (p + 2)), c = T(p * (p + 1)) / T(2);
    f = T(1) - a * sp + b * sp * s - c * sp * s * s;
    df = (-a * T(p) * sp + b * T(p + 1) * sp * s - c * T(p + 2) * sp * s * s) / s;
}

// ---------------------------------------------------------------------------- Bessel × envelope
// out[b, k] = sqrt(2/r_c) · sin(f_k·s) / r · env(s),  s = r / r_c
at::Tensor bessel(const at::Tensor& r_in, const at::Tensor& f_in, double cutoff, int64_t p) {
    check_rows(r_in, "bessel", "r");
    const at::Tensor r = r_in.contiguous(), f = f_in.to(r.scalar_type()).contiguous();
    const i64 n = r.size(0), k = f.size(0);
    at::Tensor out = at::empty({n, k}, r.options());
    AT_DISPATCH_FLOATING_TYPES(r.scalar_type(), "matris_bessel", [&] {
        using T = scalar_t;
        const T* rp = r.data_ptr<T>();
        const T* fp = f.data_ptr<T>();
        T* o = out.data_ptr<T>();
        const T rc = T(cutoff), norm = T(std::sqrt(2.0 / cutoff));
        for_chunks(n, [&](i64 r0, i64 r1, i64) {
            for (i64 b = r0; b < r1; ++b) {
                const T x = rp[b], s = x / rc;
                T env, denv;
                envelope(s, p, env, denv);
                for (i64 j = 0; j < k; ++j) o[b * k + j] = norm * std::sin(fp[j] * s) / x * env;
            }
        });
    });
    return out;
}

// (∂L/∂r [B], ∂L/∂f [K], the latter empty without freq_grad)
std::tuple<at::Tensor, at::Tensor> bessel_backward(const at::Tensor& r_in, const at::Tensor& f_in, double cutoff,
                                                   int64_t p, const at::Tensor& grad_in, bool freq_grad) {
    check_rows(r_in, "bessel_backward", "r");
    const at::Tensor r = r_in.contiguous(), f = f_in.to(r.scalar_type()).contiguous(), grad = grad_in.contiguous();
    const i64 n = r.size(0), k = f.size(0), chunks = (n + kChunk - 1) / kChunk;
    at::Tensor g_r = at::empty({n}, r.options());
    at::Tensor parts = at::zeros({freq_grad ? std::max<i64>(chunks, 1) : 0, k}, r.options());
    AT_DISPATCH_FLOATING_TYPES(r.scalar_type(), "matris_bessel_backward", [&] {
        using T = scalar_t;
        const T* rp = r.data_ptr<T>();
        const T* fp = f.data_ptr<T>();
        const T* g = grad.data_ptr<T>();
        T* gr = g_r.data_ptr<T>();
        T* pp = freq_grad ? parts.data_ptr<T>() : nullptr;
        const T rc = T(cutoff), norm = T(std::sqrt(2.0 / cutoff));
        for_chunks(n, [&](i64 r0, i64 r1, i64 c) {
            for (i64 b = r0; b < r1; ++b) {
                const T x = rp[b], s = x / rc;
                T env, denv;
                envelope(s, p, env, denv);
                T acc = 0;
                for (i64 j = 0; j < k; ++j) {
                    const T arg = fp[j] * s, sn = std::sin(arg), cs = std::cos(arg), gj = g[b * k + j];
                    acc += gj * norm * (cs * fp[j] / rc / x * env - sn / (x * x) * env + sn / x * denv / rc);
                    if (freq_grad) pp[c * k + j] += gj * norm * cs * s / x * env;
                }
                gr[b] = acc;
            }
        });
    });
    return {g_r, freq_grad ? sum_chunks(parts) : at::empty({0}, r.options())};
}

// ---------------------------------------------------------------------------- Fourier
// [c, sin(f_1θ)…sin(f_mθ), cos(f_1θ)…cos(f_mθ)] / √π, c = `constant` in the compute dtype (1/√2)
at::Tensor fourier(const at::Tensor& t_in, const at::Tensor& f_in, double constant) {
    check_rows(t_in, "fourier", "theta");
    const at::Tensor t = t_in.contiguous(), f = f_in.to(t.scalar_type()).contiguous();
    const i64 n = t.size(0), m = f.size(0), w = 2 * m + 1;
    at::Tensor out = at::empty({n, w}, t.options());
    AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "matris_fourier", [&] {
        using T = scalar_t;
        const T* tp = t.data_ptr<T>();
        const T* fp = f.data_ptr<T>();
        T* o = out.data_ptr<T>();
        const T inv = T(1.0 / std::sqrt(M_PI)), first = T(constant) * inv;
        for_chunks(n, [&](i64 r0, i64 r1, i64) {
            for (i64 a = r0; a < r1; ++a) {
                T* row = o + a * w;
                row[0] = first;
                for (i64 j = 0; j < m; ++j) {
                    const T x = tp[a] * fp[j];
                    row[1 + j] = std::sin(x) * inv;
                    row[1 + m + j] = std::cos(x) * inv;
                }
            }
        });
    });
    return out;
}

std::tuple<at::Tensor, at::Tensor> fourier_backward(const at::Tensor& t_in, const at::Tensor& f_in,
                                                    const at::Tensor& grad_in, bool freq_grad) {
    check_rows(t_in, "fourier_backward", "theta");
    const at::Tensor t = t_in.contiguous(), f = f_in.to(t.scalar_type()).contiguous(), grad = grad_in.contiguous();
    const i64 n = t.size(0), m = f.size(0), w = 2 * m + 1, chunks = (n + kChunk - 1) / kChunk;
    at::Tensor g_t = at::empty({n}, t.options());
    at::Tensor parts = at::zeros({freq_grad ? std::max<i64>(chunks, 1) : 0, m}, t.options());
    AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "matris_fourier_backward", [&] {
        using T = scalar_t;
        const T* tp = t.data_ptr<T>();
        const T* fp = f.data_ptr<T>();
        const T* g = grad.data_ptr<T>();
        T* gt = g_t.data_ptr<T>();
        T* pp = freq_grad ? parts.data_ptr<T>() : nullptr;
        const T inv = T(1.0 / std::sqrt(M_PI));
        for_chunks(n, [&](i64 r0, i64 r1, i64 c) {
            for (i64 a = r0; a < r1; ++a) {
                const T* row = g + a * w;
                T acc = 0;
                for (i64 j = 0; j < m; ++j) {
                    const T x = tp[a] * fp[j];
                    const T common = (row[1 + j] * std::cos(x) - row[1 + m + j] * std::sin(x)) * inv;
                    acc += common * fp[j];
                    if (freq_grad) pp[c * m + j] += common * tp[a];
                }
                gt[a] = acc;
            }
        });
    });
    return {g_t, freq_grad ? sum_chunks(parts) : at::empty({0}, t.options())};
}

// ---------------------------------------------------------------------------- SH
// Feature k = n·max_l + j is R_{n,j}(ρ)·Y_{k / max_n}(cos θ)·factor (m = 0 harmonics, l < 4,
// n < 4). The coefficients c of R_{n,j} are the float32 values of matris/model/basis.py's
// SH_RADIAL_COEFFICIENTS (zero-padded to 8), as the reference and the Triton kernel read them.
constexpr float kShCoefficients[4][4][8] = {
    {{3.1415927410125732f}, {6.2831854820251465f}, {9.42477798461914f}, {12.566370964050293f}},
    {{-1.0244648456573486f, 4.493409633636475f, 0.22799275815486908f, 4.493409633636475f},
     {-1.0083433389663696f, 7.7252516746521f, 0.1305256336927414f, 7.7252516746521f},
     {-1.0041964054107666f, 10.904121398925781f, 0.09209328889846802f, 10.904121398925781f},
     {-1.0025237798690796f, 14.066193580627441f, 0.0712718591094017f, 14.066193580627441f}},
    {{-1.048079490661621f, 5.763459205627441f, 0.5455470681190491f, 5.763459205627441f, 0.09465618431568146f,
      5.763459205627441f},
     {-1.0186179876327515f, 9.095011711120605f, 0.33599230647087097f, 9.095011711120605f, 0.036942481994628906f,
      9.095011711120605f},
     {-1.010022759437561f, 12.322940826416016f, 0.24588839709758759f, 12.322940826416016f, 0.019953710958361626f,
      12.322940826416016f},
     {-1.0062896013259888f, 15.514602661132812f, 0.19458240270614624f, 15.514602661132812f, 0.01254188735038042f,
      15.514602661132812f}},
    {{1.0694283246994019f, 6.987932205200195f, 0.9182358384132385f, 6.987932205200195f, 0.3285077214241028f,
      6.987932205200195f, 0.047010719776153564f, 6.987932205200195f},
     {1.0292173624038696f, 10.417118072509766f, 0.5928034782409668f, 10.417118072509766f, 0.1422666758298874f,
      10.417118072509766f, 0.013657009229063988f, 10.417118072509766f},
     {1.0165081024169922f, 13.698022842407227f, 0.4452502727508545f, 13.698022842407227f, 0.0812617763876915f,
      13.698022842407227f, 0.0059323725290596485f, 13.698022842407227f},
     {1.010696530342102f, 16.923622131347656f, 0.3583263158798218f, 16.923622131347656f, 0.05293286591768265f,
      16.923622131347656f, 0.003127750474959612f, 16.923622131347656f}}};

// R_{n,j}(ρ) and dR/dρ
template <typename T> static inline void sh_radial(i64 n, i64 j, T rho, T& val, T& der) {
    const float* cf = kShCoefficients[n][j];
    const T c0 = T(cf[0]), c1 = T(cf[1]), c2 = T(cf[2]), c3 = T(cf[3]), c4 = T(cf[4]), c5 = T(cf[5]),
            c6 = T(cf[6]), c7 = T(cf[7]);
    if (n == 0) {
        val = std::sin(c0 * rho) / rho;
        der = c0 * std::cos(c0 * rho) / rho - std::sin(c0 * rho) / (rho * rho);
        return;
    }
    T num, dnum, den;
    const T r2 = rho * rho;
    if (n == 1) {
        num = c0 * rho * std::cos(c1 * rho) + c2 * std::sin(c3 * rho);
        dnum = c0 * std::cos(c1 * rho) - c0 * c1 * rho * std::sin(c1 * rho) + c2 * c3 * std::cos(c3 * rho);
        den = r2;
    } else if (n == 2) {
        num = c0 * r2 * std::sin(c1 * rho) - c2 * rho * std::cos(c3 * rho) + c4 * std::sin(c5 * rho);
        dnum = T(2) * c0 * rho * std::sin(c1 * rho) + c0 * c1 * r2 * std::cos(c1 * rho) - c2 * std::cos(c3 * rho) +
               c2 * c3 * rho * std::sin(c3 * rho) + c4 * c5 * std::cos(c5 * rho);
        den = r2 * rho;
    } else {
        num = c0 * r2 * rho * std::cos(c1 * rho) - c2 * r2 * std::sin(c3 * rho) - c4 * rho * std::cos(c5 * rho) +
              c6 * std::sin(c7 * rho);
        dnum = T(3) * c0 * r2 * std::cos(c1 * rho) - c0 * c1 * r2 * rho * std::sin(c1 * rho) -
               T(2) * c2 * rho * std::sin(c3 * rho) - c2 * c3 * r2 * std::cos(c3 * rho) - c4 * std::cos(c5 * rho) +
               c4 * c5 * rho * std::sin(c5 * rho) + c6 * c7 * std::cos(c7 * rho);
        den = r2 * r2;
    }
    val = num / den;
    der = dnum / den - T(n + 1) * num / (den * rho);
}

// Y_l(t) and dY_l/dt, t = cos θ (normalisations computed in double, as the Python constants)
template <typename T> static inline void legendre(i64 l, T t, T& y, T& dy) {
    static const double norms[4] = {0.5 * std::sqrt(1 / M_PI), std::sqrt(3 / (4 * M_PI)), std::sqrt(5 / (16 * M_PI)),
                                    std::sqrt(7 / (16 * M_PI))};
    const T c = T(norms[l]);
    if (l == 0) {
        y = c;
        dy = 0;
    } else if (l == 1) {
        y = c * t;
        dy = c;
    } else if (l == 2) {
        y = c * (T(3) * t * t - T(1));
        dy = c * T(6) * t;
    } else {
        y = c * t * (T(5) * t * t - T(3));
        dy = c * (T(15) * t * t - T(3));
    }
}

static void check_sh(const at::Tensor& theta, const at::Tensor& rho, int64_t max_l, int64_t max_n, const char* op) {
    check_rows(theta, op, "theta");
    TORCH_CHECK(rho.sizes() == theta.sizes(), "matris::", op, ": rho and theta must have the same shape");
    TORCH_CHECK(max_l >= 1 && max_l <= 4 && max_n >= 1 && max_n <= 4, "matris::", op,
                ": max_l and max_n must be 1 to 4, got ", max_l, " and ", max_n);
}

at::Tensor spherical(const at::Tensor& t_in, const at::Tensor& rho_in, const at::Tensor& factor, int64_t max_l,
                     int64_t max_n) {
    check_sh(t_in, rho_in, max_l, max_n, "spherical");
    const at::Tensor t = t_in.contiguous(), rho = rho_in.to(t.scalar_type()).contiguous();
    const i64 n = t.size(0), w = max_l * max_n;
    at::Tensor out = at::empty({n, w}, t.options());
    AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "matris_spherical", [&] {
        using T = scalar_t;
        const T fac = factor.to(t.scalar_type()).item<T>();
        const T* tp = t.data_ptr<T>();
        const T* rp = rho.data_ptr<T>();
        T* o = out.data_ptr<T>();
        for_chunks(n, [&](i64 r0, i64 r1, i64) {
            for (i64 a = r0; a < r1; ++a) {
                const T c = std::cos(tp[a]);
                for (i64 nn = 0; nn < max_n; ++nn)
                    for (i64 j = 0; j < max_l; ++j) {
                        T radial, d_radial, y, dy;
                        sh_radial(nn, j, rp[a], radial, d_radial);
                        legendre((nn * max_l + j) / max_n, c, y, dy);
                        o[a * w + nn * max_l + j] = radial * y * fac;
                    }
            }
        });
    });
    return out;
}

std::tuple<at::Tensor, at::Tensor> spherical_backward(const at::Tensor& t_in, const at::Tensor& rho_in,
                                                      const at::Tensor& factor, int64_t max_l, int64_t max_n,
                                                      const at::Tensor& grad_in) {
    check_sh(t_in, rho_in, max_l, max_n, "spherical_backward");
    const at::Tensor t = t_in.contiguous(), rho = rho_in.to(t.scalar_type()).contiguous(), grad = grad_in.contiguous();
    const i64 n = t.size(0), w = max_l * max_n;
    at::Tensor g_t = at::empty({n}, t.options()), g_rho = at::empty({n}, t.options());
    AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "matris_spherical_backward", [&] {
        using T = scalar_t;
        const T fac = factor.to(t.scalar_type()).item<T>();
        const T* tp = t.data_ptr<T>();
        const T* rp = rho.data_ptr<T>();
        const T* g = grad.data_ptr<T>();
        T* gt = g_t.data_ptr<T>();
        T* gr = g_rho.data_ptr<T>();
        for_chunks(n, [&](i64 r0, i64 r1, i64) {
            for (i64 a = r0; a < r1; ++a) {
                const T c = std::cos(tp[a]);
                T acc_t = 0, acc_r = 0;
                for (i64 nn = 0; nn < max_n; ++nn)
                    for (i64 j = 0; j < max_l; ++j) {
                        T radial, d_radial, y, dy;
                        sh_radial(nn, j, rp[a], radial, d_radial);
                        legendre((nn * max_l + j) / max_n, c, y, dy);
                        const T gk = g[a * w + nn * max_l + j] * fac;
                        acc_t += gk * radial * dy;
                        acc_r += gk * d_radial * y;
                    }
                gt[a] = -std::sin(tp[a]) * acc_t;
                gr[a] = acc_r;
            }
        });
    });
    return {g_t, g_rho};
}

}  // namespace

TORCH_LIBRARY_IMPL(matris, CPU, m) {
    m.impl("bessel", &bessel);
    m.impl("bessel_backward", &bessel_backward);
    m.impl("fourier", &fourier);
    m.impl("fourier_backward", &fourier_backward);
    m.impl("spherical", &spherical);
    m.impl("spherical_backward", &spherical_backward);
}

}  // namespace matris_cpu
