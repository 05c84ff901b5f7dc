/* GELU on CPU, GELU_VEC_LANES floats at a time (GCC vector extensions), no libm calls: one copy for
 * inference (cpu_kernels.c) and training (cpu_train_kernels.c) to share. Static inline: each library that
 * includes it gets its own copy, picked per CPU when it loads (GELU_VEC_CLONES).
 *
 * op 0, exact GELU: x Phi(x), Phi the normal CDF, Phi(x) = (1 + erf(x / sqrt 2)) / 2.
 * op 1, Google's tanh GELU as bert_of writes it: x sigmoid(c (x + 0.044715 x^3)), c = 2 sqrt(2/pi).
 *
 * Why not libm: OneFlow's kernels (and this file's scalar predecessor) call erff or exp once per value,
 * ~20 ns each, as long as the six GEMMs of a layer together (docs/benchmarks.md). Numerics are bounded,
 * not OneFlow's bits: within GELU_ULPS (bert_of/runtime/kernels.py) float ulps of |x| of the float64
 * GELU, checked on first use; measured <= 2 (the check reports OneFlow's own distance beside it).
 *
 * How (facts, not code, from the usual float implementations):
 * - exp(x) for x <= 0 by Cephes' expf: x = n ln2 + r (ln2 split in two for an exact r), e^r by its
 *   degree-7 polynomial (~1 ulp), times 2^n by the exponent bits; 0 below -87.3 (no normal float).
 * - Phi with z = |x| / sqrt 2: for z < 1, erf(z) = z P(z^2) (degree 6 in z^2, relative error 1.2e-9);
 *   from 1 on, erfc(z) = t G(t) exp(-z^2), t = 1 / (1 + z / 2), G of degree 8 fitted to erfc(z) e^(z^2) / t
 *   over z in [1, 9.4] (relative 1.9e-9; past 9.4 e^(-z^2) is no float), and Phi = erfc(z) / 2 for x < 0,
 *   1 - erfc(z) / 2 for x > 0: no 1 + erf cancellation in the left tail. Both polynomials are near-minimax
 *   relative fits (least squares on Chebyshev nodes, Lawson-reweighted; bench/gelu_fit.py makes them).
 * - sigmoid(u) = 1 / (1 + e) for u >= 0, e / (1 + e) for u < 0, e = exp(-|u|): never 1 - tiny.
 * Specials as the scalar formula gives them: GELU(+inf) = +inf, GELU(-inf) = NaN (-inf x 0, as OneFlow's
 * kernels), NaN -> NaN, -0.0 -> -0.0, large negative x -> -0.0.
 *
 * Contraction (fused multiply-add) is allowed here (GELU_VEC_FAST): the bound does not depend on how each
 * step rounds, and cpu_kernels.c's op-by-op GELU and its whole layer call the same gelu_vec_row, so they
 * agree bit for bit. */
#ifndef BERT_OF_GELU_VEC_H
#define BERT_OF_GELU_VEC_H

#include <stdint.h>
#include <string.h>
#pragma GCC diagnostic ignored "-Wpsabi" /* vectors pass between always-inlined helpers only */

/* 16: one zmm with AVX-512, two ymm with AVX2 (GCC splits the vector), four xmm on plain x86-64 */
#ifndef GELU_VEC_LANES
#define GELU_VEC_LANES 16
#endif
typedef float gelu_vf __attribute__((vector_size(4 * GELU_VEC_LANES), aligned(4)));
typedef int32_t gelu_vi __attribute__((vector_size(4 * GELU_VEC_LANES), aligned(4)));

#define GELU_VEC_FAST __attribute__((optimize("O2,fp-contract=fast")))
#define GELU_VEC_INLINE static inline __attribute__((always_inline)) GELU_VEC_FAST
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
/* one copy per instruction set, chosen when the library loads (GCC's ifunc) */
#define GELU_VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GELU_VEC_CLONES
#endif

/* a broadcast (GCC at -O2 builds the lane-by-lane constructor with inserts) */
GELU_VEC_INLINE gelu_vf gelu_vec_splat(float x) { return (gelu_vf){0} + x; }
GELU_VEC_INLINE gelu_vf gelu_vec_abs(gelu_vf x) { return (gelu_vf)((gelu_vi)x & 0x7fffffff); }
/* m ? a : b lane by lane (m all ones or all zeros per lane) */
GELU_VEC_INLINE gelu_vf gelu_vec_select(gelu_vi m, gelu_vf a, gelu_vf b) {
    return (gelu_vf)((m & (gelu_vi)a) | (~m & (gelu_vi)b));
}

/* exp(x) for x <= 0 or NaN (NaN -> NaN), 0 below -87.3 (e^x < 2^-126: no normal float), for any float
 * vector type: VEC_EXP_LE0 defines `attrs vf name(vf x)` for the float vector vf, its int32 vector vi and
 * its broadcast splat. One polynomial for the GELUs below (gelu_vf) and the attention's softmax
 * (cpu_kernels.c, 8 lanes). n in [-126, 0] (NaN's garbage exponent leaves p NaN). */
#define VEC_EXP_LE0(name, attrs, vf, vi, splat)                                                              \
    attrs vf name(vf x) {                                                                                    \
        const vi under = x < splat(-87.3f);                                                                  \
        x = (vf)((vi)x & ~under); /* those become 0 here, masked to 0 below */                              \
        const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */               \
        const vf n = (x * splat(1.44269504088896341f) + magic) - magic;                                      \
        vf r = x - n * splat(0.693359375f);                                                                  \
        r = r - n * splat(-2.12194440e-4f);                                                                  \
        vf p = splat(1.9875691500e-4f);                                                                      \
        p = p * r + splat(1.3981999507e-3f);                                                                 \
        p = p * r + splat(8.3334519073e-3f);                                                                 \
        p = p * r + splat(4.1665795894e-2f);                                                                 \
        p = p * r + splat(1.6666665459e-1f);                                                                 \
        p = p * r + splat(5.0000001201e-1f);                                                                 \
        p = p * (r * r) + r + splat(1.0f);                                                                   \
        const vi two_n = (__builtin_convertvector(n, vi) + 127) << 23;                                       \
        return (vf)((vi)(p * (vf)two_n) & ~under);                                                           \
    }

VEC_EXP_LE0(gelu_vec_exp_le0, GELU_VEC_INLINE, gelu_vf, gelu_vi, gelu_vec_splat)

/* Phi(x), the normal CDF (above) */
GELU_VEC_INLINE gelu_vf gelu_vec_phi(gelu_vf x) {
    const gelu_vf z = gelu_vec_abs(x) * gelu_vec_splat(0.707106781186547524f), z2 = z * z;
    /* z < 1: Phi = 1/2 + (x / (2 sqrt 2)) P(z^2) */
    gelu_vf ps = gelu_vec_splat(7.854118303e-05f);
    ps = ps * z2 + gelu_vec_splat(-8.010277525e-04f);
    ps = ps * z2 + gelu_vec_splat(5.188338459e-03f);
    ps = ps * z2 + gelu_vec_splat(-2.685381845e-02f);
    ps = ps * z2 + gelu_vec_splat(1.128358543e-01f);
    ps = ps * z2 + gelu_vec_splat(-3.761262596e-01f);
    ps = ps * z2 + gelu_vec_splat(1.128379107e+00f);
    const gelu_vf small = gelu_vec_splat(0.5f) + (x * gelu_vec_splat(0.353553390593273762f)) * ps;
    /* z >= 1 (and NaN): h = erfc(z) / 2 = t G(t) e^(-z^2) / 2 */
    const gelu_vf t = gelu_vec_splat(1.0f) / (gelu_vec_splat(1.0f) + gelu_vec_splat(0.5f) * z);
    gelu_vf g = gelu_vec_splat(-4.240969568e-02f);
    g = g * t + gelu_vec_splat(2.341307998e-01f);
    g = g * t + gelu_vec_splat(-4.250064790e-01f);
    g = g * t + gelu_vec_splat(2.384544462e-01f);
    g = g * t + gelu_vec_splat(-1.322626602e-02f);
    g = g * t + gelu_vec_splat(2.006662935e-01f);
    g = g * t + gelu_vec_splat(2.430657148e-01f);
    g = g * t + gelu_vec_splat(2.824226022e-01f);
    g = g * t + gelu_vec_splat(2.820825279e-01f);
    const gelu_vf h = (gelu_vec_splat(0.5f) * t) * g * gelu_vec_exp_le0(-z2);
    const gelu_vf tail = gelu_vec_select(x < gelu_vec_splat(0.0f), h, gelu_vec_splat(1.0f) - h);
    return gelu_vec_select(z < gelu_vec_splat(1.0f), small, tail);
}

/* sigmoid(u) (above) */
GELU_VEC_INLINE gelu_vf gelu_vec_sigmoid(gelu_vf u) {
    const gelu_vf e = gelu_vec_exp_le0(-gelu_vec_abs(u));
    const gelu_vf inv = gelu_vec_splat(1.0f) / (gelu_vec_splat(1.0f) + e);
    return gelu_vec_select(u < gelu_vec_splat(0.0f), e * inv, inv);
}

/* GELU op (0 exact, 1 tanh) of GELU_VEC_LANES floats */
GELU_VEC_INLINE gelu_vf gelu_vec(gelu_vf x, int op) {
    if (op == 0)
        return x * gelu_vec_phi(x);
    const gelu_vf u = gelu_vec_splat(1.5957691216057308f) * (x + gelu_vec_splat(0.044715f) * (x * x * x));
    return x * gelu_vec_sigmoid(u);
}

/* y[0:n] = GELU op of x[0:n] (+ bias[0:n] when bias is not NULL: one float add, as OneFlow's bias add
 * rounds it). y may be x (in place). The last n % GELU_VEC_LANES values go through the same vector code. */
__attribute__((unused)) GELU_VEC_CLONES GELU_VEC_FAST static void gelu_vec_row(const float *x, const float *bias,
                                                                               float *y, int64_t n, int op) {
    int64_t i = 0;
    for (; i + GELU_VEC_LANES <= n; i += GELU_VEC_LANES) {
        gelu_vf s;
        memcpy(&s, x + i, sizeof s);
        if (bias) {
            gelu_vf b;
            memcpy(&b, bias + i, sizeof b);
            s = s + b;
        }
        s = gelu_vec(s, op);
        memcpy(y + i, &s, sizeof s);
    }
    if (i < n) {
        gelu_vf s = {0};
        const int64_t m = n - i;
        for (int64_t l = 0; l < m; l++)
            s[l] = bias ? x[i + l] + bias[i + l] : x[i + l];
        s = gelu_vec(s, op);
        for (int64_t l = 0; l < m; l++)
            y[i + l] = s[l];
    }
}

#endif
