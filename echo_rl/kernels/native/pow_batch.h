// pow_batch: out[i] = std::pow(x[i], a) for a batch, bit for bit, a few times faster than calling
// std::pow per element (the proportional-PER leaf (p + eps)^alpha; included by sumtree.cpp only).
//
// How it stays bit-identical to std::pow: a vectorised (AVX2 + FMA) evaluation of exp(a * log x) in
// extra precision (table-driven log and exp; error about 0.01 ulp, 0.008 the largest measured against
// powl on 2M inputs) yields y = yh + yl with yh the double nearest to it. When |yl| < 0.45 ulp(yh),
// the true value is more than 0.04 ulp away from a rounding boundary, so the correctly rounded result
// is yh -- and so is libm's pow, which is correctly rounded except within a few hundredths of an ulp
// of a boundary (glibc's pow: < 0.52 ulp). Elements near a boundary (~10%), with x or the result
// outside the checked range, and every element on machines without AVX2 + FMA, get std::pow itself.
// A self-test against std::pow on 256k inputs runs once per process; any mismatch turns the fast
// path off (so a libm that rounds differently cannot change results, only lose the speed-up).
#pragma once
#include "common.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace echo_native {
namespace powb {

constexpr int N = 128;  // table entries for both log and exp
// ln2 = LN2 + LN2_LO to ~2^-110 (LN2: the double nearest ln2). The tables split LN2 = ln2_h + ln2_m
// with 40 bits in ln2_h, so e * ln2_h and n * ln2_h / N are exact for every |e| < 2^11, |n| < 2^13.
constexpr double LN2 = 0x1.62e42fefa39efp-1, LN2_LO = 0x1.abc9e3b39803fp-56;

struct Tables {
    // log: per j, {1/c_j rounded to 8 fractional bits (so r = m * inv - 1 is exact with fma),
    // -log(inv) as hi, lo, unused}: one 32-byte load per lane
    alignas(32) double lg[N][4];
    alignas(16) double ex[N][2];  // exp: per j, 2^(j/N) as hi, lo
    double ln2_h, ln2_m;          // LN2 = ln2_h + ln2_m (ln2_h: 40 bits)
    bool ok = false;
};

inline uint64_t bits(double x) {
    uint64_t u;
    std::memcpy(&u, &x, 8);
    return u;
}
inline double from_bits(uint64_t u) {
    double x;
    std::memcpy(&x, &u, 8);
    return x;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && LDBL_MANT_DIG >= 64
#define ECHO_POWB_FAST 1

// The exp/log tables in double-double, from x87 extended precision (64-bit mantissa, <= 2^-63
// relative: far inside the 0.01 ulp budget).
inline void make_tables(Tables& T) {
    T.ln2_h = from_bits(bits(LN2) & ~((1ULL << 13) - 1));  // keep 40 of 53 bits
    T.ln2_m = LN2 - T.ln2_h;                                // exact
    for (int j = 0; j < N; ++j) {
        double c = 1.0 + (j + 0.5) / N;
        double inv = std::nearbyint(256.0 / c) / 256.0;
        long double k = -logl((long double)inv);
        T.lg[j][0] = inv;
        T.lg[j][1] = (double)k;
        T.lg[j][2] = (double)(k - (long double)T.lg[j][1]);
        T.lg[j][3] = 0.0;
        long double t = exp2l((long double)j / N);
        T.ex[j][0] = (double)t;
        T.ex[j][1] = (double)(t - (long double)T.ex[j][0]);
    }
}

// One pass over the batch, 4 lanes at a time (AVX2 + FMA): y[i] = std::pow(x[i], a) where that is
// decided (see above), NaN where the caller must call std::pow (and for a tail of n % 4).
__attribute__((target("avx2,fma"))) inline void pow_pass(const Tables& T, const double* x, double a, double* y,
                                                          Py_ssize_t n) {
    const __m256d va = _mm256_set1_pd(a), one = _mm256_set1_pd(1.0);
    const __m256d ln2_h = _mm256_set1_pd(T.ln2_h), ln2_m = _mm256_set1_pd(T.ln2_m), ln2_l = _mm256_set1_pd(LN2_LO);
    const __m256d inv_l2n = _mm256_set1_pd(N / LN2), l2n_h = _mm256_set1_pd(T.ln2_h / N),
                  l2n_m = _mm256_set1_pd(T.ln2_m / N), l2n_l = _mm256_set1_pd(LN2_LO / N);
    const __m256d shift = _mm256_set1_pd(0x1.8p52), ebase = _mm256_set1_pd(0x1p52 + 1023.0);
    const __m256d lim = _mm256_set1_pd(40.0), frac = _mm256_set1_pd(0.45);
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256i mant = _mm256_set1_epi64x((1LL << 52) - 1), expo = _mm256_set1_epi64x(0x7ff0000000000000LL);
    const __m256i lo7 = _mm256_set1_epi64x(N - 1), one_exp = _mm256_set1_epi64x(1023LL << 52);
    const __m256i kd_bits = _mm256_set1_epi64x(0x4338000000000000LL), e_bits = _mm256_set1_epi64x(0x4330000000000000LL);
    const __m256i ulp_shift = _mm256_set1_epi64x(52LL << 52), bias7 = _mm256_set1_epi64x(1023LL << 7);
    const __m256i x7ff = _mm256_set1_epi64x(0x7ff), b1023 = _mm256_set1_epi64x(1023), zero = _mm256_setzero_si256();
    const __m256i b2047 = _mm256_set1_epi64x(2047);
    // log1p(r) - r and exp(r) - 1 coefficients
    const __m256d c2 = _mm256_set1_pd(-0.5), c3 = _mm256_set1_pd(1.0 / 3), c4 = _mm256_set1_pd(-0.25),
                  c5 = _mm256_set1_pd(0.2), c6 = _mm256_set1_pd(-1.0 / 6), c7 = _mm256_set1_pd(1.0 / 7),
                  c8 = _mm256_set1_pd(-0.125);
    const __m256d d2 = _mm256_set1_pd(0.5), d3 = _mm256_set1_pd(1.0 / 6), d4 = _mm256_set1_pd(1.0 / 24),
                  d5 = _mm256_set1_pd(1.0 / 120), d6 = _mm256_set1_pd(1.0 / 720);
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d xv = _mm256_loadu_pd(x + i);
        const __m256i ix = _mm256_castpd_si256(xv);
        const __m256i ex = _mm256_srli_epi64(ix, 52);  // biased exponent (x >= 0: no sign bit)
        const __m256i j = _mm256_and_si256(_mm256_srli_epi64(ix, 45), lo7);
        const __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(ix, mant), one_exp));  // [1, 2)
        const __m256d e = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(ex, e_bits)), ebase);
        // log x = e*ln2 + log(c_j) + log1p(r), r = m/c_j - 1 exact, |r| < 2^-7
        // table rows by scalar index (AVX2 gathers are slow on several cores): 4 loads + a 4x4 transpose
        alignas(32) int64_t jx[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(jx), j);
        const __m256d q0 = _mm256_load_pd(T.lg[jx[0]]), q1 = _mm256_load_pd(T.lg[jx[1]]),
                      q2 = _mm256_load_pd(T.lg[jx[2]]), q3 = _mm256_load_pd(T.lg[jx[3]]);
        const __m256d u0 = _mm256_unpacklo_pd(q0, q1), u1 = _mm256_unpackhi_pd(q0, q1),
                      u2 = _mm256_unpacklo_pd(q2, q3), u3 = _mm256_unpackhi_pd(q2, q3);
        const __m256d inv = _mm256_permute2f128_pd(u0, u2, 0x20), k = _mm256_permute2f128_pd(u1, u3, 0x20),
                      klo = _mm256_permute2f128_pd(u0, u2, 0x31);
        const __m256d r = _mm256_fmsub_pd(m, inv, one);
        const __m256d r2 = _mm256_mul_pd(r, r);
        __m256d p = _mm256_fmadd_pd(r, c8, c7);
        p = _mm256_fmadd_pd(r, p, c6);
        p = _mm256_fmadd_pd(r, p, c5);
        p = _mm256_fmadd_pd(r, p, c4);
        p = _mm256_fmadd_pd(r, p, c3);
        p = _mm256_fmadd_pd(r, p, c2);
        p = _mm256_mul_pd(r2, p);
        const __m256d eh = _mm256_mul_pd(e, ln2_h);  // exact
        const __m256d el = _mm256_fmadd_pd(e, ln2_m, _mm256_mul_pd(e, ln2_l));
        const __m256d s1 = _mm256_add_pd(eh, k);  // two-sum: s1 + s1e = eh + k
        const __m256d b1 = _mm256_sub_pd(s1, eh);
        const __m256d s1e = _mm256_add_pd(_mm256_sub_pd(eh, _mm256_sub_pd(s1, b1)), _mm256_sub_pd(k, b1));
        const __m256d s2 = _mm256_add_pd(s1, r);
        const __m256d b2 = _mm256_sub_pd(s2, s1);
        const __m256d s2e = _mm256_add_pd(_mm256_sub_pd(s1, _mm256_sub_pd(s2, b2)), _mm256_sub_pd(r, b2));
        const __m256d lo = _mm256_add_pd(
            _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(s1e, s2e), klo), el), p);
        // t = a * log x as th + tl
        const __m256d th = _mm256_mul_pd(va, s2);
        const __m256d tl = _mm256_fmadd_pd(va, lo, _mm256_fmsub_pd(va, s2, th));
        // exp(t) = 2^(n/N) * exp(rr), |rr| <= ln2/(2N) (+ rounding); n = N*e2 + jj
        const __m256d kd0 = _mm256_fmadd_pd(th, inv_l2n, shift);
        const __m256i nb = _mm256_sub_epi64(_mm256_castpd_si256(kd0), kd_bits);  // n modulo 2^64
        const __m256d kd = _mm256_sub_pd(kd0, shift);
        __m256d rr = _mm256_fnmadd_pd(kd, l2n_h, th);  // exact
        rr = _mm256_fnmadd_pd(kd, l2n_m, rr);
        rr = _mm256_add_pd(_mm256_fnmadd_pd(kd, l2n_l, rr), tl);
        __m256d q = _mm256_fmadd_pd(rr, d6, d5);
        q = _mm256_fmadd_pd(rr, q, d4);
        q = _mm256_fmadd_pd(rr, q, d3);
        q = _mm256_fmadd_pd(rr, q, d2);
        q = _mm256_fmadd_pd(_mm256_mul_pd(rr, rr), q, rr);
        const __m256i jj = _mm256_and_si256(nb, lo7);
        alignas(32) int64_t jy[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(jy), jj);
        const __m256d w02 = _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_load_pd(T.ex[jy[0]])), _mm_load_pd(T.ex[jy[2]]), 1);
        const __m256d w13 = _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_load_pd(T.ex[jy[1]])), _mm_load_pd(T.ex[jy[3]]), 1);
        const __m256d Th = _mm256_unpacklo_pd(w02, w13), Tl = _mm256_unpackhi_pd(w02, w13);
        const __m256d small = _mm256_fmadd_pd(Th, q, _mm256_fmadd_pd(Tl, q, Tl));
        const __m256d yh = _mm256_add_pd(Th, small);
        const __m256d yl = _mm256_sub_pd(small, _mm256_sub_pd(yh, Th));  // exact (|Th| > |small|)
        // decided when |yl| < 0.45 ulp(yh) and yh is not a power of two (the ulp halves below it)
        const __m256i yb = _mm256_castpd_si256(yh);
        const __m256d ulp = _mm256_castsi256_pd(_mm256_sub_epi64(_mm256_and_si256(yb, expo), ulp_shift));
        const __m256i ebias = _mm256_and_si256(_mm256_srli_epi64(_mm256_add_epi64(nb, bias7), 7), x7ff);
        __m256i fine = _mm256_and_si256(_mm256_cmpgt_epi64(ex, zero), _mm256_cmpgt_epi64(b2047, ex));
        fine = _mm256_andnot_si256(_mm256_cmpeq_epi64(_mm256_and_si256(yb, mant), zero), fine);
        const __m256d ok = _mm256_and_pd(_mm256_cmp_pd(_mm256_and_pd(th, absmask), lim, _CMP_LE_OQ),
                                         _mm256_cmp_pd(_mm256_and_pd(yl, absmask), _mm256_mul_pd(frac, ulp), _CMP_LT_OQ));
        fine = _mm256_and_si256(fine, _mm256_castpd_si256(ok));
        // y = yh * 2^(ebias - 1023): exact for the normal results admitted, done on the exponent bits
        const __m256d v = _mm256_castsi256_pd(_mm256_add_epi64(yb, _mm256_slli_epi64(_mm256_sub_epi64(ebias, b1023), 52)));
        _mm256_storeu_pd(y + i, _mm256_blendv_pd(_mm256_set1_pd(NAN), v, _mm256_castsi256_pd(fine)));
    }
    for (; i < n; ++i) y[i] = NAN;  // the tail: std::pow
}

inline bool cpu_ok() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

// The tables, built and checked against std::pow once (thread-safe static initialisation).
inline const Tables& tables() {
    static const Tables T = [] {
        Tables t;
#ifdef ECHO_POWB_FAST
        if (!cpu_ok()) return t;
        make_tables(t);
        constexpr int M = 1 << 15;
        std::vector<double> xv(M), yv(M);
        double *xs = xv.data(), *ys = yv.data();
        const double alphas[8] = {0.6, 0.4, 0.5, 0.7, 0.9, 0.3, 1.0, 0.75};
        uint64_t s = 0x9E3779B97F4A7C15ULL;
        for (int blk = 0; blk < 8; ++blk) {
            for (int i = 0; i < M; ++i) {  // log-uniform over [2^-30, 2^30], and near 1
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                double u = (double)(s >> 11) * 0x1p-53;
                xs[i] = (i & 7) ? std::ldexp(1.0 + u, (int)(s % 61) - 30) : 1.0 + (u - 0.5) * 0x1p-6;
            }
            pow_pass(t, xs, alphas[blk], ys, M);
            for (int i = 0; i < M; ++i)
                if (ys[i] == ys[i] && ys[i] != std::pow(xs[i], alphas[blk])) return t;  // leave ok = false
        }
        t.ok = true;
#endif
        return t;
    }();
    return T;
}

}  // namespace powb

// out[i] = std::pow(x[i], a), bit for bit (x[i] >= 0 and finite, a finite); out may alias x.
inline void pow_batch(const double* x, double a, double* out, Py_ssize_t n) {
#ifdef ECHO_POWB_FAST
    const powb::Tables& T = powb::tables();
    if (T.ok) {
        constexpr Py_ssize_t CH = 256;
        double y[CH];
        for (Py_ssize_t b = 0; b < n; b += CH) {
            const Py_ssize_t m = n - b < CH ? n - b : CH;
            powb::pow_pass(T, x + b, a, y, m);
            for (Py_ssize_t i = 0; i < m; ++i) out[b + i] = y[i] == y[i] ? y[i] : std::pow(x[b + i], a);
        }
        return;
    }
#endif
    for (Py_ssize_t i = 0; i < n; ++i) out[i] = std::pow(x[i], a);
}

}  // namespace echo_native
