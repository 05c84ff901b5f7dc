/* Inference kernels on CPU, each one pass split over the process's cores (bert_of/runtime/kernels.py
 * checks each against OneFlow's own op on first use and otherwise stays with OneFlow's).
 *
 * GELU for inference on CPU, both flavours (op 0 exact, op 1 Google's tanh as bert_of writes it for
 * OneFlow, kernels.gelu_tanh), vectorised without libm in gelu_vec.h: bounded, within GELU_ULPS float
 * ulps of |x| of the float64 GELU (kernels.py checks it), where OneFlow's kernels call libm's erff or exp
 * once per value. OneFlow also runs each op as its own single-threaded loop over the tensor (gelu_tanh
 * takes seven); this does one pass, split over the process's cores.
 *
 * Built without floating-point contraction (bert_of/runtime/native.py): the kernels that keep OneFlow's
 * bits (the heads' split and merge) must round each add as OneFlow's separate kernels do; the vectorised
 * parts (GELU, attention) allow it per function. */
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_DEFAULT: the layer finds the cblas_sgemm OneFlow calls */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "gelu_vec.h"

#define MAX_THREADS 64
#define MIN_PER_THREAD 32768 /* below this a thread costs more than it saves */

typedef struct {
    const float *x;
    float *y;
    int64_t lo, hi;
    int op;
} span_t;

static void gelu_span(const float *x, float *y, int64_t lo, int64_t hi, int op) {
    gelu_vec_row(x + lo, 0, y + lo, hi - lo, op);
}

static void *gelu_thread(void *arg) {
    const span_t *s = arg;
    gelu_span(s->x, s->y, s->lo, s->hi, s->op);
    return 0;
}

/* y[0:n] = GELU(x[0:n]) on up to `threads` threads (the caller's among them). Returns 0, or -1 for
 * an unknown op. A thread that cannot start leaves its span to the caller. */
int bert_of_gelu(const float *x, float *y, int64_t n, int threads, int op) {
    if (op != 0 && op != 1)
        return -1;
    int64_t most = n / MIN_PER_THREAD;
    if (threads > most)
        threads = (int)most;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads < 2) {
        gelu_span(x, y, 0, n, op);
        return 0;
    }
    pthread_t tid[MAX_THREADS];
    span_t span[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int k = 0; k < threads; k++)
        span[k] = (span_t){x, y, n * k / threads, n * (k + 1) / threads, op};
    for (int k = 1; k < threads; k++)
        started[k] = pthread_create(&tid[k], 0, gelu_thread, &span[k]) == 0;
    gelu_span(x, y, span[0].lo, span[0].hi, op);
    for (int k = 1; k < threads; k++) {
        if (started[k])
            pthread_join(tid[k], 0);
        else
            gelu_span(x, y, span[k].lo, span[k].hi, op);
    }
    return 0;
}

/* ------------------------------------------------------------------ the layer's other element-wise work
 *
 * Exact (OneFlow's bits: one float add or a copy per element): a projection's bias add fused with
 * the split into heads, and the heads' merge. Bounded (the reductions run in another order than
 * OneFlow's): LayerNorm accumulates its sums in double, so each output is within a few float ulps of
 * the float64 reference (kernels.py checks that bound and the distance to OneFlow's own on a probe). */

typedef void (*rows_fn)(const void *args, int64_t lo, int64_t hi);

typedef struct {
    rows_fn fn;
    const void *args;
    int64_t lo, hi;
} rows_span_t;

static void *rows_thread(void *arg) {
    const rows_span_t *s = arg;
    s->fn(s->args, s->lo, s->hi);
    return 0;
}

/* fn(args, lo, hi) over rows [0, rows) of `per_row` elements each, on up to `threads` threads. */
static void parallel_rows(rows_fn fn, const void *args, int64_t rows, int64_t per_row, int threads) {
    int64_t most = rows * per_row / MIN_PER_THREAD;
    if (threads > most)
        threads = (int)most;
    if (threads > rows)
        threads = (int)rows;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads < 2) {
        fn(args, 0, rows);
        return;
    }
    pthread_t tid[MAX_THREADS];
    rows_span_t span[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int k = 0; k < threads; k++)
        span[k] = (rows_span_t){fn, args, rows * k / threads, rows * (k + 1) / threads};
    for (int k = 1; k < threads; k++)
        started[k] = pthread_create(&tid[k], 0, rows_thread, &span[k]) == 0;
    fn(args, span[0].lo, span[0].hi);
    for (int k = 1; k < threads; k++) {
        if (started[k])
            pthread_join(tid[k], 0);
        else
            fn(args, span[k].lo, span[k].hi);
    }
}

/* y[b, n, s, d] = x[b, s, n*D + d] (+ bias[n*D + d] when bias is not NULL): a projection's bias add
 * and the split into heads ([B, S, N*D] -> [B, N, S, D]) in one pass. Rows are (b, s). */
typedef struct {
    const float *x, *b;
    float *y;
    int64_t S, N, D;
} heads_args;

static void split_rows(const void *p, int64_t lo, int64_t hi) {
    const heads_args *a = p;
    const int64_t S = a->S, N = a->N, D = a->D;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t bi = r / S, s = r % S;
        const float *x = a->x + r * N * D;
        for (int64_t n = 0; n < N; n++) {
            float *restrict y = a->y + ((bi * N + n) * S + s) * D;
            const float *restrict xn = x + n * D;
            if (a->b) {
                const float *restrict bn = a->b + n * D;
                for (int64_t d = 0; d < D; d++)
                    y[d] = xn[d] + bn[d];
            } else {
                for (int64_t d = 0; d < D; d++)
                    y[d] = xn[d];
            }
        }
    }
}

void bert_of_split_heads(const float *x, const float *bias, float *y, int64_t B, int64_t S, int64_t N,
                         int64_t D, int threads) {
    heads_args a = {x, bias, y, S, N, D};
    parallel_rows(split_rows, &a, B * S, N * D, threads);
}

/* y[b, s, n*D + d] = x[b, n, s, d]: the heads merged back ([B, N, S, D] -> [B, S, N*D]). */
static void merge_rows(const void *p, int64_t lo, int64_t hi) {
    const heads_args *a = p;
    const int64_t S = a->S, N = a->N, D = a->D;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t bi = r / S, s = r % S;
        float *restrict y = a->y + r * N * D;
        for (int64_t n = 0; n < N; n++) {
            const float *restrict x = a->x + ((bi * N + n) * S + s) * D;
            for (int64_t d = 0; d < D; d++)
                y[n * D + d] = x[d];
        }
    }
}

void bert_of_merge_heads(const float *x, float *y, int64_t B, int64_t N, int64_t S, int64_t D, int threads) {
    heads_args a = {x, 0, y, S, N, D};
    parallel_rows(merge_rows, &a, B * S, N * D, threads);
}

/* LayerNorm's sums keep LANES independent partial sums in double (no reassociation needed to run
 * them side by side; their order differs from OneFlow's anyway: kernels.py bounds this kernel). */
#define LANES 8
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORISE __attribute__((optimize("O3"))) /* GCC's -O2 leaves these lanes scalar */
#else
#define VECTORISE
#endif

static double sum_lanes(const double acc[LANES]) {
    double s = 0.0;
    for (int k = 0; k < LANES; k++)
        s += acc[k];
    return s;
}

/* LayerNorm over rows of [T, H]: t = x (+ res when not NULL: the residual, one float add; with xb
 * not NULL t = (x + xb) + res, a projection's bias added first, each add rounded as OneFlow's
 * separate ops round it), mean and biased variance in double (two passes),
 * y = (float)((t - mean) / sqrt(var + eps)) * w + b (the last multiply and add in float, as
 * OneFlow's separate ops). */
typedef struct {
    const float *x, *res, *w, *b;
    float *y;
    int64_t H;
    double eps;
    const float *xb;
} ln_args;

VECTORISE static void ln_rows(const void *p, int64_t lo, int64_t hi) {
    const ln_args *a = p;
    const int64_t H = a->H;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->x + r * H; /* y itself once the residual is added */
        float *y = a->y + r * H;
        const float *w = a->w, *b = a->b;
        if (a->res) {
            const float *restrict xs = x, *restrict res = a->res + r * H;
            float *restrict ys = y;
            if (a->xb) {
                const float *restrict xb = a->xb;
                for (int64_t c = 0; c < H; c++) {
                    const float biased = xs[c] + xb[c];
                    ys[c] = biased + res[c];
                }
            } else {
                for (int64_t c = 0; c < H; c++)
                    ys[c] = xs[c] + res[c];
            }
            x = y;
        }
        double acc[LANES] = {0};
        int64_t c = 0;
        for (; c + LANES <= H; c += LANES)
            for (int k = 0; k < LANES; k++)
                acc[k] += x[c + k];
        for (; c < H; c++)
            acc[0] += x[c];
        const double mean = sum_lanes(acc) / (double)H;
        double sq[LANES] = {0};
        for (c = 0; c + LANES <= H; c += LANES)
            for (int k = 0; k < LANES; k++) {
                const double d = (double)x[c + k] - mean;
                sq[k] += d * d;
            }
        for (; c < H; c++) {
            const double d = (double)x[c] - mean;
            sq[0] += d * d;
        }
        const double inv = 1.0 / sqrt(sum_lanes(sq) / (double)H + a->eps);
        for (c = 0; c < H; c++) {
            const float n = (float)(((double)x[c] - mean) * inv);
            const float scaled = n * w[c];
            y[c] = scaled + b[c];
        }
    }
}

void bert_of_layer_norm(const float *x, const float *res, const float *w, const float *b, float *y, int64_t T,
                        int64_t H, double eps, int threads) {
    ln_args a = {x, res, w, b, y, H, eps, 0};
    parallel_rows(ln_rows, &a, T, H, threads);
}

/* ------------------------------------------------------------------ the attention core
 *
 * context[b, s, n*D + d] = sum_j softmax_j(scale * (q[b, n, s] . k[b, n, j]) [* coeff] + mask[b, s, j])
 *                          * v[b, n, j, d]
 * for q, k, v [B, N, S, D] (the heads' split) and an additive mask of [B, 1, 1, S] (mask_rows 0) or
 * [B, 1, S, S] (mask_rows 1), NULL for none; the heads' merge is the write. Bounded, not OneFlow's bits
 * (its sums run in other orders, with fused multiply-adds): kernels.py checks the bound against
 * float64 and OneFlow's own ops.
 *
 * Why here: OneFlow runs the two batched matmuls as B*N small GEMMs, each split over the BLAS's
 * threads, then the mask add, softmax and merge as separate passes over [B, N, S, S]. Here each
 * thread takes whole (b, n) pairs, the next from a shared counter, and, ATTN_ROWS query rows at a time,
 * computes a block of scores
 * (in cache; [B, N, S, S] never exists), its softmax (max-subtracted; the row sums in float lanes,
 * added in double) and its product with v, normalised by the row sum as it is written.
 * The GEMMs are register-blocked outer products over GCC vectors (16 floats in zmm with AVX-512, 8 in
 * ymm with AVX2 and FMA, SSE2 pairs otherwise: the copy for the CPU is picked when the library loads);
 * each sum runs in index order whatever the thread count, so threads never change a result. */
#include <stdlib.h>
#pragma GCC diagnostic ignored "-Wpsabi" /* vectors pass between always-inlined helpers only */

typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));
#define ATTN_ROWS 32 /* query rows per block: a [32, S] float block is 64 KB at S = 512 */
#define ATTN_FAST __attribute__((optimize("O2,fp-contract=fast")))
#define ATTN_INLINE static inline __attribute__((always_inline)) ATTN_FAST
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
/* one copy per instruction set, chosen when the library loads (GCC's ifunc) */
#define ATTN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ATTN_CLONES
#endif

/* a broadcast (GCC at -O2 builds the lane-by-lane constructor with 8 inserts) */
ATTN_INLINE v8f splat(float x) { return (v8f){0} + x; }

/* exp(x) for x <= 0 (a max-subtracted score): gelu_vec.h's polynomial, on 8 lanes */
VEC_EXP_LE0(exp_le0, ATTN_INLINE, v8f, v8i, splat)

typedef struct {
    const float *q, *k, *v, *mask;
    float *y;
    int64_t N, S, D, mask_rows;
    float alpha, coeff;
    int use_coeff, wide; /* wide: AVX-512 (micro16's 4 x 32 blocks) */
    int64_t pairs, next; /* B * N; the next pair a worker takes */
} attn_args;

ATTN_INLINE v8f load8(const float *p) { return *(const v8f *)p; }

/* The GEMMs' micro-kernel: C[r, 0:L*W] = (sum_t A[r, t] B[t, 0:L*W]) (* rs[r] when rs is not NULL) for
 * R rows (4 or 1) and W vectors of L columns (W 2 or 1), t from 0 to K in order. Written out so that
 * the R x W accumulators stay in registers (GCC does not unroll arrays of them at -O2, and -O3's
 * vectoriser regroups the broadcasts badly). The scores: A = q, B = k transposed; the context:
 * A = the softmax's exponentials, B = v. micro8 works on vectors of 8 floats, micro16 of 16 (zmm
 * with AVX-512: 4 x 32 columns, 8 accumulators of the 32 registers). */
#define MK_ROW(r) const float x##r = A[(r) * lda + t]; c##r##0 += b0 * x##r; if (W > 1) c##r##1 += b1 * x##r;
#define MK_STORE(r, VT, L)                                                                             \
    {                                                                                                  \
        const float f = rs ? rs[r] : 1.0f;                                                             \
        *(VT *)(C + (r) * ldc) = rs ? c##r##0 * f : c##r##0;                                           \
        if (W > 1)                                                                                     \
            *(VT *)(C + (r) * ldc + L) = rs ? c##r##1 * f : c##r##1;                                   \
    }
#define DEFINE_MICRO(NAME, VT, L)                                                                      \
    ATTN_INLINE void NAME(const int R, const int W, const float *A, int64_t lda, const float *B, int64_t ldb, \
                          int64_t K, float *C, int64_t ldc, const float *rs) {                         \
        VT c00 = (VT){0}, c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00; \
        for (int64_t t = 0; t < K; t++) {                                                              \
            const VT b0 = *(const VT *)(B + t * ldb), b1 = W > 1 ? *(const VT *)(B + t * ldb + L) : b0; \
            MK_ROW(0)                                                                                  \
            if (R > 1) {                                                                               \
                MK_ROW(1)                                                                              \
                MK_ROW(2)                                                                              \
                MK_ROW(3)                                                                              \
            }                                                                                          \
        }                                                                                              \
        MK_STORE(0, VT, L)                                                                             \
        if (R > 1) {                                                                                   \
            MK_STORE(1, VT, L)                                                                         \
            MK_STORE(2, VT, L)                                                                         \
            MK_STORE(3, VT, L)                                                                         \
        }                                                                                              \
    }
typedef float v16f __attribute__((vector_size(64), aligned(4)));
DEFINE_MICRO(micro8, v8f, 8)
DEFINE_MICRO(micro16, v16f, 16)

/* One (b, n) pair, rows [i0, i0 + R) of its queries. kt: k transposed, [D, Sp] (Sp = S rounded up to
 * 8, zero columns past S); sc: [R, Sp]. */
ATTN_INLINE void attn_block(const attn_args *a, int64_t bn, int64_t i0, int64_t R, const float *kt, float *sc,
                            int64_t Sp) {
    const int64_t S = a->S, D = a->D, N = a->N, ND = N * D, bi = bn / N, n = bn % N;
    const float *q = a->q + (bn * S + i0) * D, *v = a->v + bn * S * D;
    float inv[ATTN_ROWS];
    /* scores */
    int64_t i = 0;
    for (; i < R; i += i + 4 <= R ? 4 : 1) {
        const int rows = i + 4 <= R ? 4 : 1;
        const float *A = q + i * D;
        float *C = sc + i * Sp;
        int64_t jc = 0;
        if (a->wide)
            for (; jc + 32 <= Sp; jc += 32)
                rows == 4 ? micro16(4, 2, A, D, kt + jc, Sp, D, C + jc, Sp, 0)
                          : micro16(1, 2, A, D, kt + jc, Sp, D, C + jc, Sp, 0);
        for (; jc + 16 <= Sp; jc += 16)
            rows == 4 ? micro8(4, 2, A, D, kt + jc, Sp, D, C + jc, Sp, 0)
                      : micro8(1, 2, A, D, kt + jc, Sp, D, C + jc, Sp, 0);
        for (; jc < Sp; jc += 8)
            rows == 4 ? micro8(4, 1, A, D, kt + jc, Sp, D, C + jc, Sp, 0)
                      : micro8(1, 1, A, D, kt + jc, Sp, D, C + jc, Sp, 0);
    }
    /* scale, mask, softmax's exponentials and row sums */
    for (i = 0; i < R; i++) {
        float *restrict row = sc + i * Sp;
        const float *restrict m =
            a->mask ? a->mask + (a->mask_rows ? (bi * S + i0 + i) * S : bi * S) : 0; /* this query's row */
        const float alpha = a->alpha, coeff = a->coeff;
        v8f mx = splat(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= S; j += 8) { /* the same float operations as the scalar tail, 8 at a time */
            v8f x = load8(row + j) * alpha;
            if (a->use_coeff)
                x = x * coeff;
            if (m)
                x = x + load8(m + j);
            *(v8f *)(row + j) = x;
            const v8i more = x > mx;
            mx = (v8f)(((v8i)x & more) | ((v8i)mx & ~more));
        }
        float top = mx[0];
        for (int k = 1; k < 8; k++)
            top = mx[k] > top ? mx[k] : top;
        for (; j < S; j++) {
            float x = row[j] * alpha;
            if (a->use_coeff)
                x = x * coeff;
            if (m)
                x = x + m[j];
            row[j] = x;
            top = x > top ? x : top;
        }
        for (; j < Sp; j++)
            row[j] = -INFINITY;
        v8f sum = splat(0.0f);
        for (int64_t j = 0; j < Sp; j += 8) {
            const v8f e = exp_le0(*(const v8f *)(row + j) - splat(top));
            *(v8f *)(row + j) = e;
            sum += e;
        }
        double total = 0.0;
        for (int k = 0; k < 8; k++)
            total += sum[k];
        inv[i] = (float)(1.0 / total);
    }
    /* context, normalised, into the merged layout */
    float *out = a->y + (bi * S + i0) * ND + n * D;
    for (i = 0; i < R; i += i + 4 <= R ? 4 : 1) {
        const int rows = i + 4 <= R ? 4 : 1;
        const float *A = sc + i * Sp;
        float *C = out + i * ND;
        int64_t dc = 0;
        if (a->wide)
            for (; dc + 32 <= D; dc += 32)
                rows == 4 ? micro16(4, 2, A, Sp, v + dc, D, S, C + dc, ND, inv + i)
                          : micro16(1, 2, A, Sp, v + dc, D, S, C + dc, ND, inv + i);
        for (; dc + 16 <= D; dc += 16)
            rows == 4 ? micro8(4, 2, A, Sp, v + dc, D, S, C + dc, ND, inv + i)
                      : micro8(1, 2, A, Sp, v + dc, D, S, C + dc, ND, inv + i);
        for (; dc + 8 <= D; dc += 8)
            rows == 4 ? micro8(4, 1, A, Sp, v + dc, D, S, C + dc, ND, inv + i)
                      : micro8(1, 1, A, Sp, v + dc, D, S, C + dc, ND, inv + i);
    }
    for (int64_t dc = D - D % 8; dc < D; dc++) /* a head size not a multiple of 8 */
        for (i = 0; i < R; i++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < S; j++)
                acc += sc[i * Sp + j] * v[j * D + dc];
            out[i * ND + dc] = acc * inv[i];
        }
}

/* A worker: takes the next (b, n) pair until none is left (a shared counter, not a fixed share, so a
 * thread slowed by other work on its core leaves its pairs to the others). */
ATTN_CLONES ATTN_FAST static void attn_worker(const void *p, int64_t lo, int64_t hi) {
    (void)lo;
    (void)hi;
    attn_args *a = (attn_args *)p;
    const int64_t S = a->S, D = a->D, Sp = (S + 7) / 8 * 8;
    float *kt = malloc(sizeof(float) * (size_t)(D * Sp + ATTN_ROWS * Sp));
    if (!kt)
        abort(); /* a few hundred KB: nothing sensible to return to */
    float *sc = kt + D * Sp;
    for (int64_t bn; (bn = __atomic_fetch_add(&a->next, 1, __ATOMIC_RELAXED)) < a->pairs;) {
        const float *k = a->k + bn * S * D;
        for (int64_t d = 0; d < D; d++) {
            for (int64_t j = 0; j < S; j++)
                kt[d * Sp + j] = k[j * D + d];
            for (int64_t j = S; j < Sp; j++)
                kt[d * Sp + j] = 0.0f;
        }
        for (int64_t i0 = 0; i0 < S; i0 += ATTN_ROWS)
            attn_block(a, bn, i0, S - i0 < ATTN_ROWS ? S - i0 : ATTN_ROWS, kt, sc, Sp);
    }
    free(kt);
}

/* y [B, S, N*D] = the attention's context for q, k, v [B, N, S, D] (see above); mask NULL, [B, 1, 1, S]
 * (mask_rows 0) or [B, 1, S, S] (mask_rows 1). Scores are (q.k * alpha) * coeff when use_coeff (LiBai's
 * layer scaling), else q.k * alpha. (b, n) pairs split over up to `threads` threads. */
void bert_of_attention(const float *q, const float *k, const float *v, const float *mask, float *y, int64_t B,
                       int64_t N, int64_t S, int64_t D, int mask_rows, float alpha, float coeff, int use_coeff,
                       int threads) {
    if (B * N * S * D == 0)
        return;
    attn_args a = {q, k, v, mask, y, N, S, D, mask_rows ? 1 : 0, alpha, coeff, use_coeff, 0, 0, 0};
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    a.wide = __builtin_cpu_supports("avx512f");
#endif
    a.pairs = B * N;
    const int64_t workers = threads < B * N ? threads : B * N; /* parallel_rows: one "row" per worker */
    parallel_rows(attn_worker, &a, workers, B * N * S * S * D / workers, threads);
}

/* ------------------------------------------------------------------ a whole post-LN layer
 *
 * BERT's post-LN encoder layer for inference in one call (bert_of/runtime/kernels.py: layer_stack):
 *   q, k, v = split(x Wq^T + bq), split(x Wk^T + bk), split(x Wv^T + bv)      [B, N, S, D]
 *   ctx     = the attention core (bert_of_attention, heads merged)              [B, S, H]
 *   a       = LayerNorm1((ctx Wo^T + bo) + x)                                    [B, S, H]
 *   y       = LayerNorm2((GELU(a Wi^T + bi) W2^T + b2) + a)                       [B, S, H]
 * The six GEMMs are cblas_sgemm calls with the arguments OneFlow's CPU matmul passes for x @ W^T
 * (row-major, W transposed, beta 0), through the very routine liboneflow's PLT reaches (the global
 * scope's cblas_sgemm: bert_of's BLAS shim when bert_of.runtime.blas installed one, else
 * liboneflow's own), so their bits and threads are OneFlow's. Each bias add is the first float
 * operation of the pass after its GEMM (the heads' split, the LayerNorm's residual add, the GELU), in
 * OneFlow's order; the passes are the kernels above. So the result is that of the layer run op by op
 * with these kernels, bit for bit (kernels.py checks that on first use). */
#include <dlfcn.h>
#include <link.h>
#include <string.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
static sgemm_fn layer_sgemm;

static int find_liboneflow(struct dl_phdr_info *info, size_t size, void *out) {
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "/liboneflow")) {
        void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            *(void **)out = h;
            return 1;
        }
    }
    return 0;
}

/* The cblas_sgemm liboneflow's calls resolve to: the global scope's first (liboneflow is loaded
 * RTLD_LOCAL, so its PLT looks there before its own), else its own. 1 when found. */
int bert_of_layer_blas(void) {
    if (layer_sgemm)
        return 1;
    void *f = dlsym(RTLD_DEFAULT, "cblas_sgemm"), *h = 0;
    if (!f) {
        dl_iterate_phdr(find_liboneflow, &h);
        if (h)
            f = dlsym(h, "cblas_sgemm");
    }
    layer_sgemm = (sgemm_fn)f;
    return f != 0;
}

/* y [T, out] = x [T, in] @ w[out, in]^T, as OneFlow's matmul(x, w, transpose_b=True) calls it */
static void gemm_nt(const float *x, const float *w, float *y, int64_t T, int64_t in, int64_t out) {
    enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
    layer_sgemm(ROW_MAJOR, NO_TRANS, TRANS, (int)T, (int)out, (int)in, 1.0f, x, (int)in, w, (int)in, 0.0f, y,
                (int)out);
}

/* y[r, c] = GELU(y[r, c] + bias[c]) in place over rows of `cols`: the intermediate's bias and activation */
typedef struct {
    float *y;
    const float *b;
    int64_t cols;
    int op;
} bias_gelu_args;

static void bias_gelu_rows(const void *p, int64_t lo, int64_t hi) {
    const bias_gelu_args *a = p;
    const int64_t C = a->cols;
    for (int64_t r = lo; r < hi; r++) /* the same code as bert_of_gelu's after OneFlow's bias add: its bits */
        gelu_vec_row(a->y + r * C, a->b, a->y + r * C, C, a->op);
}

/* Floats of scratch bert_of_layer needs: 2 T H + max(3 T H, T I) (the intermediate [T, I] reuses k, v
 * and the context once they are spent: a third less memory to fault in on a process's first call). */
int64_t bert_of_layer_scratch(int64_t T, int64_t H, int64_t I) { return 2 * T * H + T * (3 * H > I ? 3 * H : I); }

/* One post-LN layer (above): x [B, S, H] -> y [B, S, H] (y must not overlap x or scratch), mask as
 * bert_of_attention's (NULL, [B, 1, 1, S] or [B, 1, S, S] with mask_rows 1). p: the layer's 16
 * parameters, Wq [H, H], bq [H], Wk, bk, Wv, bv, Wo [H, H], bo, LayerNorm1's weight [H] and bias,
 * Wi [I, H], bi [I], W2 [H, I], b2 [H], LayerNorm2's weight and bias. act: 0 exact GELU, 1 tanh.
 * scratch: bert_of_layer_scratch(B S, H, I) floats. Returns 0, -1 when no cblas_sgemm was found, -2
 * for sizes past a BLAS's 32-bit integers or an unknown act. */
int bert_of_layer(const float *x, const float *mask, int mask_rows, float *y, float *scratch, const float *const *p,
                  int64_t B, int64_t S, int64_t H, int64_t N, int64_t I, float alpha, float coeff, int use_coeff,
                  double eps1, double eps2, int act, int threads) {
    const int64_t T = B * S, D = H / N;
    if (!bert_of_layer_blas())
        return -1;
    if ((act != 0 && act != 1) || N * D != H || T * (H > I ? H : I) > INT32_MAX)
        return -2;
    if (T == 0)
        return 0;
    float *tmp = scratch, *qh = tmp + T * H, *kh = qh + T * H, *vh = kh + T * H, *ctx = vh + T * H,
          *inter = kh; /* written after the output projection has read ctx: k, v and ctx are spent */
    float *heads[3] = {qh, kh, vh};
    for (int k = 0; k < 3; k++) { /* the projections and the heads' split with their biases */
        gemm_nt(x, p[2 * k], tmp, T, H, H);
        heads_args h = {tmp, p[2 * k + 1], heads[k], S, N, D};
        parallel_rows(split_rows, &h, T, H, threads);
    }
    bert_of_attention(qh, kh, vh, mask, ctx, B, N, S, D, mask_rows, alpha, coeff, use_coeff, threads);
    float *attn = qh; /* q, k, v are spent */
    gemm_nt(ctx, p[6], tmp, T, H, H);
    ln_args ln1 = {tmp, x, p[8], p[9], attn, H, eps1, p[7]};
    parallel_rows(ln_rows, &ln1, T, H, threads);
    gemm_nt(attn, p[10], inter, T, H, I);
    bias_gelu_args g = {inter, p[11], I, act};
    parallel_rows(bias_gelu_rows, &g, T, I, threads);
    gemm_nt(inter, p[12], tmp, T, I, H);
    ln_args ln2 = {tmp, attn, p[14], p[15], y, H, eps2, p[13]};
    parallel_rows(ln_rows, &ln2, T, H, threads);
    return 0;
}
