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
