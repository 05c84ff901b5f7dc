"""The polynomials of bert_of/runtime/gelu_vec.h's exact GELU, fitted (not a benchmark: the script that
made its coefficients, kept so they can be remade or changed).

    python bench/gelu_fit.py [Z0 P DEG_SMALL DEG_TAIL]      # gelu_vec.h: 1.0 0.5 6 8

erf(z) = z P(z^2) on [0, Z0]; erfc(z) exp(z^2) = t G(t), t = 1 / (1 + P z), on [Z0, 9.4] (past 9.4,
e^(-z^2) is no float). Relative least squares on Chebyshev nodes with Lawson's reweighting (near
minimax), float64 references from Python's math.erf / math.erfc. Prints each fit's relative error in
float64 and evaluated in float32 (Horner, t from a float z), then the float32 coefficients, lowest first.
NumPy only.
"""

import math
import sys

import numpy as np

N = 6000


def cheb(a, b):
    k = np.arange(N)
    return a + (b - a) * (0.5 - 0.5 * np.cos(np.pi * (k + 0.5) / N))


def lawson(A, g, iters=40):
    """Coefficients c minimising max |A c - g| / |g| (approximately: reweighted least squares)"""
    w = np.ones(len(g))
    for _ in range(iters):
        W = np.sqrt(w) / np.abs(g)
        c = np.linalg.lstsq(A * W[:, None], g * W, rcond=None)[0]
        e = np.abs(A @ c - g) / np.abs(g)
        w = w * e
        w /= w.sum()
    return c


def horner32(c, v):
    c, v = np.asarray(c, np.float32), v.astype(np.float32)
    acc = np.full_like(v, c[-1])
    for cc in c[-2::-1]:
        acc = (acc * v + cc).astype(np.float32)
    return acc.astype(np.float64)


def main():
    z0, p, deg_small, deg_tail = (float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])) \
        if len(sys.argv) == 5 else (1.0, 0.5, 6, 8)
    z = cheb(1e-4, z0)
    g = np.array([math.erf(v) / v for v in z])
    A = np.vander(z * z, deg_small + 1, increasing=True)
    cs = lawson(A, g)
    e32 = np.abs(horner32(cs, (z * z).astype(np.float32)) - g) / g
    print("small: relative %.2e, in float32 %.2e" % ((np.abs(A @ cs - g) / g).max(), e32.max()))
    t = cheb(1 / (1 + p * 9.4), 1 / (1 + p * z0))
    zz = (1 / t - 1) / p
    g = np.array([math.erfc(v) * math.exp(v * v) for v in zz]) / t
    A = np.vander(t, deg_tail + 1, increasing=True)
    ct = lawson(A, g)
    z32 = zz.astype(np.float32)
    t32 = (np.float32(1) / (np.float32(1) + np.float32(p) * z32)).astype(np.float32)
    ref = np.array([math.erfc(float(v)) * math.exp(float(v) ** 2) for v in z32])
    e32 = np.abs(horner32(ct, t32) * t32 - ref) / ref
    print("tail: relative %.2e, in float32 %.2e; erfc(Z0) / 2 = %.3f" % ((np.abs(A @ ct - g) / g).max(), e32.max(),
                                                                         0.5 * math.erfc(z0)))
    print("small", ", ".join("%.9ef" % v for v in np.float32(cs)))
    print("tail", ", ".join("%.9ef" % v for v in np.float32(ct)))


if __name__ == "__main__":
    main()
