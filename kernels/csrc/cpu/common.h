// Shared pieces of the fused CPU operators (phi.cpp, attention.cpp, refine.cpp): a vectorisable
// exp, the OpenMP work split, and the register-blocked GEMM the whole passes run on blocks of rows.
//
// Loops over channels are written for the compiler's vectoriser (`omp simd`); exp is a
// polynomial that vectorises (accurate to a few ulp, see vexp). Work is split over rows where
// every row writes its own output, and over channel blocks where rows scatter into shared
// per-segment rows (each thread owns a block of channels of every segment: no races, no
// atomics, the same summation order as a serial loop).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace matris_cpu {

typedef int64_t i64;



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

// 1/n! for n = 0..D, computed at compile time (in double, rounded to T): the Taylor coefficients of
// vexp as constants (a constexpr function called in the loop was not always folded: GCC left calls)
template <typename T, int D> struct InvFactorials {
    T v[D + 1];
    constexpr InvFactorials() : v() {
        double f = 1.0;
        for (int n = 0; n <= D; ++n) {
            if (n > 1) f /= n;
            v[n] = T(f);
        }
    }
};
template <typename T> inline constexpr InvFactorials<T, ExpConst<T>::degree> kInvFactorials{};

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
    T p = kInvFactorials<T>.v[C::degree];
#pragma GCC unroll 16
    for (int n = C::degree - 1; n >= 0; --n) p = p * r + kInvFactorials<T>.v[n];
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


// ---- GEMM on blocks of rows ----------------------------------------------------------------------
// C[M, N] = A[M, K]·B[K, N] (⊙ S[M, N]): A's rows where they lie (row stride lda, unit column
// stride), B packed once per operator call by gemm_pack into 16-column panels [⌈N/16⌉][K][16]
// (the last panel zero-padded), C row-major (ldc). With S (row stride lds) the product is
// multiplied elementwise by S before it is stored: the backward's silu' factor, applied to each
// tile in registers instead of in a pass of its own.
// Why not MKL: its sgemm packs both operands on every call, which blocks of 24 rows cannot
// amortise; this register kernel reads A where it lies and packs the weight once per operator
// call. float32: 12 rows × 32 columns with AVX-512, 6 × 16 with AVX2 + FMA (the same k-ordered
// FMA chain per output, so the same bits on either); every other case (float64, CPUs without
// AVX2) a portable kernel of the same layout that the compiler vectorises for the CPU at hand.
// Each output is one fused multiply-add chain in k order: the same sums for any thread count.

// the portable kernel: rows [0, R) times one 16-column panel, accumulators in a local tile
template <typename T, int R>
static inline void gemm_block_portable(const T* A, i64 lda, const T* Bp, i64 K, T* C, i64 ldc, const T* S, i64 lds,
                                       i64 cols) {
    T acc[R][16];
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < 16; ++j) acc[r][j] = T(0);
    for (i64 k = 0; k < K; ++k) {
        const T* b = Bp + k * 16;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const T a = A[r * lda + k];
#pragma omp simd
            for (int j = 0; j < 16; ++j) acc[r][j] = std::fma(a, b[j], acc[r][j]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (i64 j = 0; j < cols; ++j) C[r * ldc + j] = S ? acc[r][j] * S[r * lds + j] : acc[r][j];
}

template <typename T, int R>
static inline void gemm_rows_portable(const T* A, i64 lda, const T* Bp, i64 K, i64 N, T* C, i64 ldc, const T* S,
                                      i64 lds) {
    for (i64 j = 0; j < N; j += 16)
        gemm_block_portable<T, R>(A, lda, Bp + j * K, K, C + j, ldc, S ? S + j : nullptr, lds, std::min<i64>(16, N - j));
}

template <typename T, int R>
static inline void gemm_tail_portable(const T* A, i64 lda, const T* Bp, i64 K, i64 N, T* C, i64 ldc, const T* S,
                                      i64 lds, i64 rows) {
    if constexpr (R > 0) {
        if (rows == R) gemm_rows_portable<T, R>(A, lda, Bp, K, N, C, ldc, S, lds);
        else gemm_tail_portable<T, R - 1>(A, lda, Bp, K, N, C, ldc, S, lds, rows);
    }
}

// 4 rows × 16 columns: 64 accumulators, 8 AVX-512 or 16 AVX2 registers in float64
constexpr int kPortableRows = 4;

template <typename T>
static inline void gemm_serial_portable(const T* A, i64 M, i64 K, i64 lda, const T* Bp, i64 N, T* C, i64 ldc,
                                        const T* S, i64 lds) {
    i64 i = 0;
    for (; i + kPortableRows <= M; i += kPortableRows)
        gemm_rows_portable<T, kPortableRows>(A + i * lda, lda, Bp, K, N, C + i * ldc, ldc, S ? S + i * lds : nullptr,
                                             lds);
    gemm_tail_portable<T, kPortableRows - 1>(A + i * lda, lda, Bp, K, N, C + i * ldc, ldc, S ? S + i * lds : nullptr,
                                             lds, M - i);
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
}  // namespace matris_cpu
#include <immintrin.h>
namespace matris_cpu {
#if defined(__AVX512F__)
constexpr const char* kGemmKernel = "avx512";
constexpr int kRows = 12;  // 24 accumulators of 32

// rows [0, R) of a row block times two adjacent 16-column panels (Bp, Bp + 16·K) at once (2R
// accumulators), or one panel (Two = false: the last panel of an odd count); R ≤ 12. Each output
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
    if (S) {
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

// full panels only (the caller sends a partial last panel to the portable kernel)
template <int R>
static inline void gemm_rows_vec(const float* A, i64 lda, const float* Bp, i64 K, i64 N, float* C, i64 ldc,
                                 const float* S, i64 lds) {
    i64 j = 0;
    for (; j + 32 <= N; j += 32) gemm_block<R, true>(A, lda, Bp + j * K, K, C + j, ldc, S ? S + j : nullptr, lds);
    if (j < N) gemm_block<R, false>(A, lda, Bp + j * K, K, C + j, ldc, S ? S + j : nullptr, lds);
}
#else
constexpr const char* kGemmKernel = "avx2";
constexpr int kRows = 6;  // 12 accumulators of 16

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
    if (S) {
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
static inline void gemm_rows_vec(const float* A, i64 lda, const float* Bp, i64 K, i64 N, float* C, i64 ldc,
                                 const float* S, i64 lds) {
    for (i64 j = 0; j < N; j += 16) gemm_block<R>(A, lda, Bp + j * K, K, C + j, ldc, S ? S + j : nullptr, lds);
}
#endif

template <int R>
static inline void gemm_tail_vec(const float* A, i64 lda, const float* Bp, i64 K, i64 N, float* C, i64 ldc,
                                 const float* S, i64 lds, i64 rows) {
    if constexpr (R > 0) {
        if (rows == R) gemm_rows_vec<R>(A, lda, Bp, K, N, C, ldc, S, lds);
        else gemm_tail_vec<R - 1>(A, lda, Bp, K, N, C, ldc, S, lds, rows);
    }
}

// float32: the register kernels for the full panels, the portable one for a partial last panel
static inline void gemm_serial(const float* A, i64 M, i64 K, i64 lda, const float* Bp, i64 N, float* C, i64 ldc,
                               const float* S, i64 lds) {
    const i64 full = N / 16 * 16;
    if (full) {
        i64 i = 0;
        for (; i + kRows <= M; i += kRows)
            gemm_rows_vec<kRows>(A + i * lda, lda, Bp, K, full, C + i * ldc, ldc, S ? S + i * lds : nullptr, lds);
        gemm_tail_vec<kRows - 1>(A + i * lda, lda, Bp, K, full, C + i * ldc, ldc, S ? S + i * lds : nullptr, lds,
                                 M - i);
    }
    if (full < N)
        gemm_serial_portable<float>(A, M, K, lda, Bp + full * K, N - full, C + full, ldc, S ? S + full : nullptr,
                                    lds);
}
#else
constexpr const char* kGemmKernel = "portable";

static inline void gemm_serial(const float* A, i64 M, i64 K, i64 lda, const float* Bp, i64 N, float* C, i64 ldc,
                               const float* S, i64 lds) {
    gemm_serial_portable<float>(A, M, K, lda, Bp, N, C, ldc, S, lds);
}
#endif

static inline void gemm_serial(const double* A, i64 M, i64 K, i64 lda, const double* Bp, i64 N, double* C, i64 ldc,
                               const double* S, i64 lds) {
    gemm_serial_portable<double>(A, M, K, lda, Bp, N, C, ldc, S, lds);
}

// B [K, N] (any strides: a weight or its transpose) packed for gemm_serial: a [⌈N/16⌉·16·K] tensor,
// Bp[j/16][k][j%16] = B[k, j], zeros past column N
static inline at::Tensor pack(const at::Tensor& B) {
    TORCH_CHECK(B.dim() == 2, "matris: a GEMM operand must be a matrix, got ", B.dim(), " dimensions");
    const i64 K = B.size(0), N = B.size(1), panels = (N + 15) / 16;
    at::Tensor packed = at::zeros({panels * 16 * K}, B.options());
    AT_DISPATCH_FLOATING_TYPES(B.scalar_type(), "matris_pack", [&] {
        const scalar_t* b = B.data_ptr<scalar_t>();
        scalar_t* p = packed.data_ptr<scalar_t>();
        const i64 sk = B.stride(0), sn = B.stride(1);
        for (i64 j0 = 0; j0 < N; j0 += 16)
            for (i64 k = 0; k < K; ++k)
                for (i64 jj = 0; jj < 16 && j0 + jj < N; ++jj) p[j0 * K + k * 16 + jj] = b[k * sk + (j0 + jj) * sn];
    });
    return packed;
}

// rows of blocks: every whole pass hands each thread its rows in blocks of kBlock, every step
// run on a block while it is in L2
constexpr i64 kBlock = 24;

// the thread count of the operators: torch's (torch.set_num_threads)
static inline int threads() { return std::max(1, at::get_num_threads()); }

// The threads worth waking for `rows` rows of `flops_per_row` each: one per kFlopsPerThread of
// work (4 MFLOP: ~50 µs on one core, well above the wake-up of a thread that sleeps while it
// waits), at most threads(). A small structure's loops run on the calling thread alone, which
// is faster than splitting them and leaves the other cores to whatever else runs on the
// machine. Every loop gives the same sums for any thread count, so the numbers do not change.
constexpr double kFlopsPerThread = 4.0e6;
static inline int threads_for(i64 rows, double flops_per_row) {
    const double want = static_cast<double>(rows) * flops_per_row / kFlopsPerThread;
    return static_cast<int>(std::max(1.0, std::min(static_cast<double>(threads()), std::floor(want))));
}

// a tensor's data, or nullptr for an absent optional one
template <typename T> static inline T* data(const std::optional<at::Tensor>& t) {
    return t.has_value() && t->defined() && t->numel() ? t->data_ptr<T>() : nullptr;
}
template <typename T> static inline T* data(const at::Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; }

// refuse what the kernels cannot read: CPU, contiguous, of the operator's dtype (float32/float64)
static inline void check_input(const at::Tensor& t, const char* op, const char* name, at::ScalarType dtype) {
    TORCH_CHECK(t.device().is_cpu(), "matris::", op, ": ", name, " must be a CPU tensor");
    TORCH_CHECK(t.is_contiguous(), "matris::", op, ": ", name, " must be contiguous");
    TORCH_CHECK(t.scalar_type() == dtype, "matris::", op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
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

}  // namespace matris_cpu
