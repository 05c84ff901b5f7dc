/* Training kernels on CPU: forward and backward of the layer's element-wise pieces, each one pass
 * split over the process's cores (bert_of/runtime/train_kernels.py wraps them as autograd Functions
 * and checks each against OneFlow's own ops on first use; otherwise it stays with OneFlow's).
 *
 * Why: OneFlow 0.9 runs each element-wise op of these pieces (and of their backward) as its own
 * single-threaded pass; bert_of's LayerNorm in OneFlow's ops is ~10 passes forward and more backward.
 * Here each piece is one pass forward and one backward, the reductions over rows (the weight's and
 * bias's gradients) as per-thread partial sums in double, added in thread order.
 *
 * - LayerNorm(x + residual): forward saves x_hat = (t - mean) * rstd and rstd (per row) for the
 *   backward: dt = rstd * (g w - mean(g w) - x_hat mean(g w x_hat)), dw = sum_rows g x_hat,
 *   db = sum_rows g (dx = dresidual = dt). Row sums in double.
 * - GELU(a + bias) (bias optional): forward and backward 8 floats at a time without libm (gelu_vec.h,
 *   the inference kernels' GELU too; OneFlow's GELUs call libm's scalar erff / exp per element,
 *   ~20 ns each), within a few float ulps of |a + bias| of the float64 GELU; the forward saves a + bias; backward
 *   d = g * GELU'(a + bias), db = sum_rows d in double.
 *
 * Built without floating-point contraction (bert_of/runtime/native.py), as cpu_kernels.c; the
 * vectorised GELU allows it (VFAST: its bound does not depend on the rounding of each step). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#pragma GCC diagnostic ignored "-Wpsabi" /* vectors pass between always-inlined helpers only */

#define GELU_VEC_LANES 8 /* this file's v8f */
#include "gelu_vec.h"

#define MAX_THREADS 64
#define MIN_PER_THREAD 32768 /* elements: below this a thread costs more than it saves */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORISE __attribute__((optimize("O3"))) /* GCC's -O2 leaves these loops scalar */
#else
#define VECTORISE
#endif

/* fn(args, lo, hi, k): rows [lo, hi) on thread k of `threads` (k 0 is the caller's) */
typedef void (*rows_fn)(const void *, int64_t, int64_t, int);
typedef struct {
    rows_fn fn;
    const void *args;
    int64_t lo, hi;
    int k;
} job_t;

static void *job_thread(void *p) {
    const job_t *j = p;
    j->fn(j->args, j->lo, j->hi, j->k);
    return 0;
}

/* The number of threads parallel_rows will use for `rows` rows of `cols` elements. */
int bert_of_train_threads(int64_t rows, int64_t cols, int threads) {
    const int64_t most = rows * cols / MIN_PER_THREAD;
    if (threads > most)
        threads = (int)most;
    if (threads > rows)
        threads = (int)rows;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    return threads < 1 ? 1 : threads;
}

/* Rows split into `threads` spans (a thread that cannot start leaves its span to the caller). */
static void parallel_rows(rows_fn fn, const void *args, int64_t rows, int threads) {
    if (threads < 2) {
        fn(args, 0, rows, 0);
        return;
    }
    pthread_t tid[MAX_THREADS];
    job_t job[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int k = 0; k < threads; k++)
        job[k] = (job_t){fn, args, rows * k / threads, rows * (k + 1) / threads, k};
    for (int k = 1; k < threads; k++)
        started[k] = pthread_create(&tid[k], 0, job_thread, &job[k]) == 0;
    fn(args, job[0].lo, job[0].hi, 0);
    for (int k = 1; k < threads; k++) {
        if (started[k])
            pthread_join(tid[k], 0);
        else
            fn(args, job[k].lo, job[k].hi, k);
    }
}

/* out[c] = (float) sum over k < threads of part[k * C + c], in k order */
static void sum_parts(const double *part, float *out, int64_t C, int threads) {
    for (int64_t c = 0; c < C; c++) {
        double s = 0.0;
        for (int k = 0; k < threads; k++)
            s += part[k * C + c];
        out[c] = (float)s;
    }
}

/* ------------------------------------------------------------------ LayerNorm(x + residual) */

#define LANES 8

typedef struct {
    const float *x, *res, *w, *b, *g;
    float *y, *xhat, *rstd, *dx;
    double *dw, *db; /* [threads, H] partial sums (backward) */
    int64_t H;
    double eps;
} ln_args;

VECTORISE static void ln_fwd_rows(const void *p, int64_t lo, int64_t hi, int k) {
    (void)k;
    const ln_args *a = p;
    const int64_t H = a->H;
    for (int64_t r = lo; r < hi; r++) {
        const float *restrict x = a->x + r * H;
        float *restrict xh = a->xhat + r * H, *restrict y = a->y + r * H;
        if (a->res) { /* t = x + residual, one float add, kept in y for now */
            const float *restrict res = a->res + r * H;
            for (int64_t c = 0; c < H; c++)
                y[c] = x[c] + res[c];
            x = y;
        }
        double acc[LANES] = {0};
        int64_t c = 0;
        for (; c + LANES <= H; c += LANES)
            for (int l = 0; l < LANES; l++)
                acc[l] += x[c + l];
        for (; c < H; c++)
            acc[0] += x[c];
        double mean = 0.0;
        for (int l = 0; l < LANES; l++)
            mean += acc[l];
        mean /= (double)H;
        double sq[LANES] = {0};
        for (c = 0; c + LANES <= H; c += LANES)
            for (int l = 0; l < LANES; l++) {
                const double d = (double)x[c + l] - mean;
                sq[l] += d * d;
            }
        for (; c < H; c++) {
            const double d = (double)x[c] - mean;
            sq[0] += d * d;
        }
        double var = 0.0;
        for (int l = 0; l < LANES; l++)
            var += sq[l];
        const double inv = 1.0 / sqrt(var / (double)H + a->eps);
        for (c = 0; c < H; c++) {
            const float n = (float)(((double)x[c] - mean) * inv);
            xh[c] = n;
            y[c] = n * a->w[c] + a->b[c];
        }
        a->rstd[r] = (float)inv;
    }
}

/* y = LayerNorm(x + res) over rows of [T, H] (res may be NULL); xhat [T, H] and rstd [T] for the
 * backward. y may not alias x or res. */
void bert_of_ln_fwd(const float *x, const float *res, const float *w, const float *b, float *y, float *xhat,
                    float *rstd, int64_t T, int64_t H, double eps, int threads) {
    ln_args a = {x, res, w, b, 0, y, xhat, rstd, 0, 0, 0, H, eps};
    parallel_rows(ln_fwd_rows, &a, T, bert_of_train_threads(T, H, threads));
}

VECTORISE static void ln_bwd_rows(const void *p, int64_t lo, int64_t hi, int k) {
    const ln_args *a = p;
    const int64_t H = a->H;
    double *restrict dw = a->dw + k * H, *restrict db = a->db + k * H;
    for (int64_t r = lo; r < hi; r++) {
        const float *restrict g = a->g + r * H, *restrict xh = a->xhat + r * H, *restrict w = a->w;
        float *restrict dx = a->dx + r * H;
        double s1 = 0.0, s2 = 0.0;
        for (int64_t c = 0; c < H; c++) {
            const double gw = (double)g[c] * w[c];
            s1 += gw;
            s2 += gw * xh[c];
            dw[c] += (double)g[c] * xh[c];
            db[c] += g[c];
        }
        const double m1 = s1 / (double)H, m2 = s2 / (double)H, rs = a->rstd[r];
        for (int64_t c = 0; c < H; c++)
            dx[c] = (float)(rs * ((double)g[c] * w[c] - m1 - xh[c] * m2));
    }
}

/* The backward of bert_of_ln_fwd for the output's gradient g [T, H]: dx [T, H] (also the residual's),
 * dw and db [H]. part: scratch of 2 * threads * H doubles. */
void bert_of_ln_bwd(const float *g, const float *xhat, const float *rstd, const float *w, float *dx, float *dw,
                    float *db, double *part, int64_t T, int64_t H, int threads) {
    threads = bert_of_train_threads(T, H, threads);
    memset(part, 0, sizeof(double) * 2 * threads * H);
    ln_args a = {0, 0, w, 0, g, 0, (float *)xhat, (float *)rstd, dx, part, part + threads * H, H, 0.0};
    parallel_rows(ln_bwd_rows, &a, T, threads);
    sum_parts(a.dw, dw, H, threads);
    sum_parts(a.db, db, H, threads);
}

/* ------------------------------------------------------------------ GELU(a + bias) */

typedef struct {
    const float *a, *bias, *g, *pre;
    float *y, *save, *dx;
    double *db;
    int64_t C;
    int op;
} gelu_args;

/* GELU and GELU' on 8 floats at once, without libm (its erff and expf are scalar calls: the backward
 * took twice the forward's time): gelu_vec.h's exp, normal CDF and sigmoid, the inference kernels' own
 * (one GELU for both). GELU' within a few float ulps of its magnitude, which train_kernels.py checks
 * against float64. */
typedef gelu_vf v8f; /* 8 lanes: GELU_VEC_LANES above */
typedef gelu_vi v8i;
#define VFAST GELU_VEC_FAST
#define VINLINE GELU_VEC_INLINE
#define VCLONES GELU_VEC_CLONES

VINLINE v8f splat(float x) { return gelu_vec_splat(x); }
VINLINE v8f vabs(v8f a) { return gelu_vec_abs(a); }
VINLINE v8f select(v8i m, v8f a, v8f b) { return gelu_vec_select(m, a, b); }

/* GELU op of 8 floats (gelu_vec.h's) */
VINLINE v8f gelu8(v8f s, int op) { return gelu_vec(s, op); }

VINLINE v8f dgelu8(v8f s, int op) {
    if (op == 0) /* Phi(s) + s phi(s) */
        return gelu_vec_phi(s) + s * gelu_vec_exp_le0(splat(-0.5f) * (s * s)) * splat(0.39894228040143268f);
    /* sigmoid(u) + s sigmoid(u) (1 - sigmoid(u)) c (1 + 3 a s^2), u = c (s + a s^3) */
    const v8f c = splat(1.5957691216057308f), a = splat(0.044715f);
    const v8f u = c * (s + a * s * s * s);
    const v8f e = gelu_vec_exp_le0(-vabs(u)), inv = splat(1.0f) / (splat(1.0f) + e);
    const v8f sg = select(u < splat(0.0f), e * inv, inv);
    /* sigmoid (1 - sigmoid) = e / (1 + e)^2 either side: 1 - sg would cancel where sg nears 1 */
    return sg + s * (e * inv * inv) * c * (splat(1.0f) + splat(3.0f) * a * s * s);
}

VCLONES VFAST static void gelu_fwd_rows(const void *p, int64_t lo, int64_t hi, int k) {
    (void)k;
    const gelu_args *a = p;
    const int64_t C = a->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->a + r * C;
        float *y = a->y + r * C, *sv = a->save + r * C;
        for (int64_t c = 0; c < C; c += 8) {
            const int n = C - c < 8 ? (int)(C - c) : 8;
            v8f s = {0};
            if (n == 8) /* the bias add: one float add, as OneFlow's */
                s = a->bias ? *(const v8f *)(x + c) + *(const v8f *)(a->bias + c) : *(const v8f *)(x + c);
            else
                for (int l = 0; l < n; l++)
                    s[l] = a->bias ? x[c + l] + a->bias[c + l] : x[c + l];
            const v8f out = gelu8(s, a->op);
            if (n == 8) {
                *(v8f *)(sv + c) = s;
                *(v8f *)(y + c) = out;
            } else
                for (int l = 0; l < n; l++)
                    sv[c + l] = s[l], y[c + l] = out[l];
        }
    }
}

/* y = GELU op (0 exact, 1 tanh) of a + bias over rows of [T, C] (bias [C] or NULL); pre = a + bias
 * for the backward. Returns 0, or -1 for an unknown op. */
int bert_of_gelu_fwd(const float *a, const float *bias, float *y, float *pre, int64_t T, int64_t C, int op,
                     int threads) {
    if (op != 0 && op != 1)
        return -1;
    gelu_args g = {a, bias, 0, 0, y, pre, 0, 0, C, op};
    parallel_rows(gelu_fwd_rows, &g, T, bert_of_train_threads(T, C, threads));
    return 0;
}

VCLONES VFAST static void gelu_bwd_rows(const void *p, int64_t lo, int64_t hi, int k) {
    const gelu_args *a = p;
    const int64_t C = a->C;
    double *db = a->db ? a->db + k * C : 0;
    for (int64_t r = lo; r < hi; r++) {
        const float *g = a->g + r * C, *s = a->pre + r * C;
        float *dx = a->dx + r * C;
        for (int64_t c = 0; c < C; c += 8) {
            const int n = C - c < 8 ? (int)(C - c) : 8;
            v8f sv = {0}, gv = {0};
            if (n == 8) {
                sv = *(const v8f *)(s + c);
                gv = *(const v8f *)(g + c);
            } else
                for (int l = 0; l < n; l++)
                    sv[l] = s[c + l], gv[l] = g[c + l];
            const v8f d = gv * dgelu8(sv, a->op);
            if (n == 8)
                *(v8f *)(dx + c) = d;
            else
                for (int l = 0; l < n; l++)
                    dx[c + l] = d[l];
            if (db)
                for (int l = 0; l < n; l++)
                    db[c + l] += d[l];
        }
    }
}

/* The backward of bert_of_gelu_fwd for the output's gradient g [T, C]: dx [T, C] (also the input's
 * before the bias) and, when db is not NULL, db [C] (part: scratch of threads * C doubles). */
int bert_of_gelu_bwd(const float *g, const float *pre, float *dx, float *db, double *part, int64_t T, int64_t C,
                     int op, int threads) {
    if (op != 0 && op != 1)
        return -1;
    threads = bert_of_train_threads(T, C, threads);
    if (db)
        memset(part, 0, sizeof(double) * threads * C);
    gelu_args a = {0, 0, g, pre, 0, 0, dx, db ? part : 0, C, op};
    parallel_rows(gelu_bwd_rows, &a, T, threads);
    if (db)
        sum_parts(part, db, C, threads);
    return 0;
}

/* ------------------------------------------------------------------ dropout, softmax + dropout
 *
 * OneFlow 0.9's CPU dropout draws each element's mask from its generator one by one on one thread
 * (~10 ns an element: 16 ms forward for one layer's attention probabilities at 8 x 12 x 128 x 128,
 * more than the softmax and both batched matmuls together), and its softmax, mask add and their
 * backward are single-threaded passes too. Here the mask is a counter-based hash: element i of a call
 * is kept when the top 24 bits of mix(mix(i + s0) ^ s1 ^ i_hi) are >= thr (thr = p 2^24; mix is a
 * 32-bit integer hash, a bijection), so the backward recomputes it from the call's seed (s0, s1: drawn
 * from the model's dropout generator, train_kernels.py) instead of keeping it, and any thread count
 * draws the same mask. Kept elements are x * scale (scale = 1 / (1 - p) in float, as OneFlow's).
 *
 * The softmax over the last axis of scores [R, S] (+ an additive mask of one row per R / B rows, or
 * none): max-subtracted exponentials by gelu_vec.h's exp, the row sum in float lanes added in double,
 * P = e / sum; its backward dx = P (g - sum_j g_j P_j) with g the output's gradient through the
 * dropout. Rows split over the threads. */

typedef uint32_t v8u __attribute__((vector_size(32), aligned(4)));

VINLINE v8u mix8(v8u h) {
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
    return h;
}

/* lanes of elements i0 .. i0 + 7 of the stream (s0, s1) that are kept: all ones, else 0 */
VINLINE v8i keep8(uint64_t i0, uint32_t s0, uint32_t s1, uint32_t thr) {
    const v8u lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const uint32_t lo = (uint32_t)i0, hi = (uint32_t)(i0 >> 32);
    v8u i = lane + lo; /* a wrap past 2^32 inside the 8 lanes: i_hi below would be off by one for
                          those, which only changes which hash they get */
    const v8u h = mix8(mix8(i + s0) ^ (s1 ^ hi)) >> 8;
    return (v8i)(h >= thr);
}

typedef struct {
    const float *x, *mask, *P, *g;
    float *y, *out;
    int64_t S, rows_per_mask;
    uint32_t s0, s1, thr;
    float scale;
} drop_args;

/* y = x kept * scale over elements [lo, hi) * DROP_CHUNK (the "rows" of parallel_rows) */
#define DROP_CHUNK 4096
VCLONES VFAST static void dropout_rows(const void *p, int64_t lo, int64_t hi, int k) {
    (void)k;
    const drop_args *a = p;
    const int64_t n = a->S; /* the element count */
    const v8f scale = splat(a->scale);
    for (int64_t i = lo * DROP_CHUNK; i < hi * DROP_CHUNK && i < n; i += 8) {
        const v8i keep = keep8((uint64_t)i, a->s0, a->s1, a->thr);
        if (i + 8 <= n) {
            const v8f x = *(const v8f *)(a->x + i);
            *(v8f *)(a->y + i) = (v8f)(keep & (v8i)(x * scale));
        } else
            for (int l = 0; i + l < n; l++)
                a->y[i + l] = keep[l] ? a->x[i + l] * a->scale : 0.0f;
    }
}

/* y [n] = dropout of x [n] with the stream (s0, s1), threshold thr and scale: the forward, and with
 * the output's gradient for x the backward too (the same kept elements, the same scale). */
void bert_of_dropout(const float *x, float *y, int64_t n, uint32_t s0, uint32_t s1, uint32_t thr, float scale,
                     int threads) {
    drop_args a = {x, 0, 0, 0, y, 0, n, 0, s0, s1, thr, scale};
    const int64_t chunks = (n + DROP_CHUNK - 1) / DROP_CHUNK;
    parallel_rows(dropout_rows, &a, chunks, bert_of_train_threads(chunks, DROP_CHUNK, threads));
}

VCLONES VFAST static void softmax_drop_fwd_rows(const void *p, int64_t lo, int64_t hi, int k) {
    (void)k;
    const drop_args *a = p;
    const int64_t S = a->S, S8 = S - S % 8;
    const v8f scale = splat(a->scale);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->x + r * S, *m = a->mask ? a->mask + (r / a->rows_per_mask) * S : 0;
        float *P = a->out + r * S; /* t = x + mask first, then the exponentials, then P, in place */
        v8f mx = splat(-INFINITY);
        int64_t j = 0;
        for (; j < S8; j += 8) {
            const v8f xv = *(const v8f *)(x + j);
            const v8f t = m ? xv + *(const v8f *)(m + j) : xv; /* one float add, as OneFlow's */
            *(v8f *)(P + j) = t;
            mx = select(t > mx, t, mx);
        }
        float top = -INFINITY;
        for (int l = 0; l < 8; l++)
            top = mx[l] > top ? mx[l] : top;
        for (; j < S; j++) {
            const float t = m ? x[j] + m[j] : x[j];
            P[j] = t;
            top = t > top ? t : top;
        }
        v8f sum = splat(0.0f);
        for (j = 0; j < S8; j += 8) {
            const v8f e = gelu_vec_exp_le0(*(const v8f *)(P + j) - splat(top));
            *(v8f *)(P + j) = e;
            sum += e;
        }
        double total = 0.0;
        if (j < S) {
            v8f t = splat(-INFINITY);
            for (int l = 0; j + l < S; l++)
                t[l] = P[j + l] - top;
            const v8f e = gelu_vec_exp_le0(t);
            for (int l = 0; j + l < S; l++)
                P[j + l] = e[l], total += e[l];
        }
        for (int l = 0; l < 8; l++)
            total += sum[l];
        const float tot = (float)total;
        const v8f totv = splat(tot);
        for (j = 0; j < S8; j += 8)
            *(v8f *)(P + j) = *(const v8f *)(P + j) / totv;
        for (; j < S; j++)
            P[j] = P[j] / tot;
        if (a->y) /* the dropout of this row: elements r S + j */
            for (j = 0; j < S; j += 8) {
                const v8i keep = keep8((uint64_t)(r * S + j), a->s0, a->s1, a->thr);
                if (j + 8 <= S)
                    *(v8f *)(a->y + r * S + j) = (v8f)(keep & (v8i)(*(const v8f *)(P + j) * scale));
                else
                    for (int l = 0; j + l < S; l++)
                        a->y[r * S + j + l] = keep[l] ? P[j + l] * a->scale : 0.0f;
            }
    }
}

/* P [R, S] = softmax(x + mask) over rows of x [R, S] (mask [R / rows_per_mask, S], row r takes row
 * r / rows_per_mask; or NULL); y [R, S] = dropout of P (stream s0, s1, thr, scale), or not written
 * when y is NULL (no dropout: P is the output). */
void bert_of_softmax_dropout_fwd(const float *x, const float *mask, float *P, float *y, int64_t R, int64_t S,
                                 int64_t rows_per_mask, uint32_t s0, uint32_t s1, uint32_t thr, float scale,
                                 int threads) {
    drop_args a = {x, mask, 0, 0, y, P, S, rows_per_mask < 1 ? 1 : rows_per_mask, s0, s1, thr, scale};
    parallel_rows(softmax_drop_fwd_rows, &a, R, bert_of_train_threads(R, S, threads));
}

VCLONES VFAST static void softmax_drop_bwd_rows(const void *p, int64_t lo, int64_t hi, int k) {
    (void)k;
    const drop_args *a = p;
    const int64_t S = a->S;
    for (int64_t r = lo; r < hi; r++) {
        const float *P = a->P + r * S, *g = a->g + r * S;
        float *dx = a->out + r * S; /* first the gradient through the dropout, then dx in place */
        if (a->thr) {
            const v8f scale = splat(a->scale);
            for (int64_t j = 0; j < S; j += 8) {
                const v8i keep = keep8((uint64_t)(r * S + j), a->s0, a->s1, a->thr);
                if (j + 8 <= S)
                    *(v8f *)(dx + j) = (v8f)(keep & (v8i)(*(const v8f *)(g + j) * scale));
                else
                    for (int l = 0; j + l < S; l++)
                        dx[j + l] = keep[l] ? g[j + l] * a->scale : 0.0f;
            }
        } else
            memcpy(dx, g, sizeof(float) * (size_t)S);
        v8f acc = splat(0.0f);
        int64_t j = 0;
        for (; j + 8 <= S; j += 8)
            acc += *(const v8f *)(dx + j) * *(const v8f *)(P + j);
        double dot = 0.0;
        for (; j < S; j++)
            dot += (double)dx[j] * P[j];
        for (int l = 0; l < 8; l++)
            dot += acc[l];
        const float d = (float)dot;
        for (j = 0; j < S; j++)
            dx[j] = P[j] * (dx[j] - d);
    }
}

/* The backward of bert_of_softmax_dropout_fwd: dx [R, S] (the scores' gradient; the mask has none)
 * for the output's gradient g [R, S], the saved P and the same stream (thr 0: no dropout). */
void bert_of_softmax_dropout_bwd(const float *g, const float *P, float *dx, int64_t R, int64_t S, uint32_t s0,
                                 uint32_t s1, uint32_t thr, float scale, int threads) {
    drop_args a = {0, 0, P, g, 0, dx, S, 1, s0, s1, thr, scale};
    parallel_rows(softmax_drop_bwd_rows, &a, R, bert_of_train_threads(R, S, threads));
}

/* ------------------------------------------------------------------ the step's update: clip, AdamW
 *
 * Passes over a list of tensors at once (a model's ~100 gradients / parameters) instead of OneFlow 0.9's
 * one single-threaded op (or several) per tensor: the list is one index space (the tensors one after
 * another) cut into MULTI_CHUNK-element chunks, which parallel_rows spreads over the threads. Element-wise
 * work equals OneFlow's per-element formula bit for bit (no contraction, IEEE division and square root:
 * vectorising changes nothing); the norm's sum is per chunk in double, the chunks added in order, so it
 * does not depend on the thread count. */

#define MULTI_CHUNK 65536
#if defined(__GNUC__) && !defined(__clang__)
/* GCC -O2 leaves these loops scalar (the library is built with -fno-math-errno: native.EXTRA_FLAGS) */
#define MULTI_FAST __attribute__((optimize("O3")))
#else
#define MULTI_FAST
#endif

typedef struct {
    int64_t n;              /* tensors */
    const int64_t *start;   /* [n + 1]: where each begins in the index space, start[n] the total */
    float *const *x;        /* [n]: the gradients (norm, scale) or the parameters (AdamW) */
    float *const *g, *const *m, *const *v; /* AdamW: gradients, first and second moments */
    double *part;           /* norm: one sum per chunk */
    float coef, lr, beta1, beta2, eps, wd, bc1, bc2, scale, l1, l2;
    int op;                 /* MULTI_* */
} multi_args;

enum { MULTI_SQSUM, MULTI_SCALE, MULTI_ADAMW };

typedef float f4u __attribute__((vector_size(16), aligned(4))); /* 4 floats at any float address */
typedef double d4 __attribute__((vector_size(32)));

/* sum of x[i]^2 in double: each square exact, 16 running sums (a fixed order, whatever the clone) */
VCLONES MULTI_FAST static double sqsum(const float *x, int64_t n) {
    d4 s0 = {0, 0, 0, 0}, s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const d4 a = __builtin_convertvector(*(const f4u *)(x + i), d4);
        const d4 b = __builtin_convertvector(*(const f4u *)(x + i + 4), d4);
        const d4 c = __builtin_convertvector(*(const f4u *)(x + i + 8), d4);
        const d4 d = __builtin_convertvector(*(const f4u *)(x + i + 12), d4);
        s0 += a * a;
        s1 += b * b;
        s2 += c * c;
        s3 += d * d;
    }
    double t = 0.0;
    for (; i < n; i++)
        t += (double)x[i] * (double)x[i];
    const d4 s = (s0 + s1) + (s2 + s3);
    return ((s[0] + s[1]) + (s[2] + s[3])) + t;
}

VCLONES MULTI_FAST static void scale_span(float *x, int64_t n, float c) {
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] * c;
}

/* OneFlow 0.9's AdamUpdateFunctor (model_update_kernel_util.h), operation for operation, in float */
VCLONES MULTI_FAST static void adamw_span(const multi_args *a, float *p, const float *g, float *m, float *v,
                                          int64_t n) {
    const float lr = a->lr, beta1 = a->beta1, beta2 = a->beta2, eps = a->eps, wd = a->wd;
    const float scale = a->scale, l1 = a->l1, l2 = a->l2;
    const float sqrt_bc2 = sqrtf(a->bc2), step_size = lr / a->bc1, decay = lr * wd;
    for (int64_t i = 0; i < n; i++) {
        const float w = p[i];
        const float d = g[i] * scale + l1 * (float)((w >= 0) - (w <= 0)) + l2 * w;
        const float next_m = beta1 * m[i] + (1 - beta1) * d;
        m[i] = next_m;
        const float next_v = beta2 * v[i] + (1 - beta2) * d * d;
        v[i] = next_v;
        const float denom = (sqrtf(next_v) / sqrt_bc2) + eps;
        p[i] = w - step_size * (next_m / denom) - decay * w;
    }
}

/* chunks [lo, hi) of the index space: each chunk's pieces of the tensors it covers */
static void multi_rows(const void *p, int64_t lo, int64_t hi, int k) {
    (void)k;
    const multi_args *a = p;
    int64_t t = 0; /* the tensor holding the first element: the last whose start <= it */
    for (int64_t b = a->n; t < b;) {
        const int64_t mid = (t + b + 1) / 2;
        if (mid < a->n && a->start[mid] <= lo * MULTI_CHUNK)
            t = mid;
        else
            b = mid - 1;
    }
    for (int64_t c = lo; c < hi; c++) {
        const int64_t c0 = c * MULTI_CHUNK, c1 = c0 + MULTI_CHUNK < a->start[a->n] ? c0 + MULTI_CHUNK : a->start[a->n];
        double sum = 0.0;
        for (int64_t e = c0; e < c1;) {
            while (a->start[t + 1] <= e)
                t++;
            const int64_t off = e - a->start[t];
            const int64_t len = (a->start[t + 1] < c1 ? a->start[t + 1] : c1) - e;
            switch (a->op) {
            case MULTI_SQSUM: sum += sqsum(a->x[t] + off, len); break;
            case MULTI_SCALE: scale_span(a->x[t] + off, len, a->coef); break;
            default: adamw_span(a, a->x[t] + off, a->g[t] + off, a->m[t] + off, a->v[t] + off, len);
            }
            e += len;
        }
        if (a->op == MULTI_SQSUM)
            a->part[c] = sum;
    }
}

static void multi_run(multi_args *a, int threads) {
    const int64_t chunks = (a->start[a->n] + MULTI_CHUNK - 1) / MULTI_CHUNK;
    if (chunks > 0)
        parallel_rows(multi_rows, a, chunks, bert_of_train_threads(chunks, MULTI_CHUNK, threads));
}

/* The number of chunks of n tensors whose starts are start [n + 1] (bert_of_multi_sqsum's part size). */
int64_t bert_of_multi_chunks(const int64_t *start, int64_t n) {
    return (start[n] + MULTI_CHUNK - 1) / MULTI_CHUNK;
}

/* Sum of the squares of every element of the n tensors x (start [n + 1]: their offsets in one index
 * space), in double (part: bert_of_multi_chunks doubles of scratch). */
double bert_of_multi_sqsum(int64_t n, const int64_t *start, float *const *x, double *part, int threads) {
    multi_args a = {n, start, x, 0, 0, 0, part, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, MULTI_SQSUM};
    multi_run(&a, threads);
    double s = 0.0;
    for (int64_t c = 0; c < bert_of_multi_chunks(start, n); c++)
        s += part[c];
    return s;
}

/* x *= coef over the n tensors (in float: OneFlow's mul_ by a float scalar tensor). */
void bert_of_multi_scale(int64_t n, const int64_t *start, float *const *x, float coef, int threads) {
    multi_args a = {n, start, x, 0, 0, 0, 0, coef, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, MULTI_SCALE};
    multi_run(&a, threads);
}

/* One AdamW step (OneFlow's adam_update without amsgrad) of the n parameters p with gradients g and
 * moments m, v, all of one parameter group: lr, betas, eps, weight decay, bias corrections, the
 * gradient's scale, l1, l2 as OneFlow's kernel takes them (floats). */
void bert_of_multi_adamw(int64_t n, const int64_t *start, float *const *p, float *const *g, float *const *m,
                         float *const *v, float lr, float beta1, float beta2, float eps, float wd, float bc1,
                         float bc2, float scale, float l1, float l2, int threads) {
    multi_args a = {n, start, p, g, m, v, 0, 0, lr, beta1, beta2, eps, wd, bc1, bc2, scale, l1, l2, MULTI_ADAMW};
    multi_run(&a, threads);
}

/* ------------------------------------------------------------------ the heads' split and merge
 *
 * OneFlow 0.9's backward of the heads' split (a Linear's output [B, S, N*D] reshaped and permuted to
 * [B, N, S, D]) makes the permuted gradient contiguous in a single-threaded strided copy with index
 * arithmetic per element (~60 ms for a MiniLM layer's query at 8 x 384 tokens, five times the
 * Linear's own GEMMs), three times a layer; the Linear's bias gradient is another single-threaded
 * pass. Here the split (with the bias add) and the merge are one pass each way over rows (b, s), the
 * bias's gradient the split's backward's row sums (per-thread partial sums in double, added in
 * thread order). */

typedef struct {
    const float *x, *bias;
    float *y;
    double *db; /* [threads, N*D] partial sums, or NULL */
    int64_t S, N, D;
} heads_args;

/* y[b, n, s, :] = x[b, s, n*D : (n+1)*D] (+ bias[n*D : (n+1)*D], one float add) for rows r = b S + s */
VECTORISE static void heads_split_rows(const void *p, int64_t lo, int64_t hi, int k) {
    (void)k;
    const heads_args *a = p;
    const int64_t S = a->S, N = a->N, D = a->D;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t b = r / S, s = r % S;
        for (int64_t n = 0; n < N; n++) {
            const float *restrict x = a->x + r * N * D + n * D;
            float *restrict y = a->y + ((b * N + n) * S + s) * D;
            if (a->bias) {
                const float *restrict bn = a->bias + n * D;
                for (int64_t d = 0; d < D; d++)
                    y[d] = x[d] + bn[d];
            } else
                memcpy(y, x, sizeof(float) * (size_t)D);
        }
    }
}

/* y[b, s, n*D + d] = x[b, n, s, d] for rows r = b S + s; db[k] += y's row when db is not NULL */
VECTORISE static void heads_merge_rows(const void *p, int64_t lo, int64_t hi, int k) {
    const heads_args *a = p;
    const int64_t S = a->S, N = a->N, D = a->D, H = N * D;
    double *restrict db = a->db ? a->db + k * H : 0;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t b = r / S, s = r % S;
        float *restrict y = a->y + r * H;
        for (int64_t n = 0; n < N; n++)
            memcpy(y + n * D, a->x + ((b * N + n) * S + s) * D, sizeof(float) * (size_t)D);
        if (db)
            for (int64_t c = 0; c < H; c++)
                db[c] += y[c];
    }
}

/* The heads' split: y [B, N, S, D] from x [B, S, N*D] plus bias [N*D] (or NULL); also the merge's
 * backward (no bias). */
void bert_of_heads_split(const float *x, const float *bias, float *y, int64_t B, int64_t S, int64_t N, int64_t D,
                         int threads) {
    heads_args a = {x, bias, y, 0, S, N, D};
    parallel_rows(heads_split_rows, &a, B * S, bert_of_train_threads(B * S, N * D, threads));
}

/* The heads' merge: y [B, S, N*D] from x [B, N, S, D]; also the split's backward, which with db not
 * NULL gives the bias's gradient db [N*D] (the sum of y's rows; part: scratch of threads * N*D doubles). */
void bert_of_heads_merge(const float *x, float *y, float *db, double *part, int64_t B, int64_t S, int64_t N,
                         int64_t D, int threads) {
    threads = bert_of_train_threads(B * S, N * D, threads);
    if (db)
        memset(part, 0, sizeof(double) * (size_t)(threads * N * D));
    heads_args a = {x, 0, y, db ? part : 0, S, N, D};
    parallel_rows(heads_merge_rows, &a, B * S, threads);
    if (db)
        sum_parts(part, db, N * D, threads);
}
