/* Inference kernels on CPU, each one pass split over the process's cores (bert_of/runtime/kernels.py
 * checks each against OneFlow's own op on first use and otherwise stays with OneFlow's).
 *
 * GELU for inference on CPU, the float operations OneFlow 0.9's CPU kernels perform, in the same
 * order and with the same libm calls, so the result is the same to the last bit (bert_of/runtime/kernels.py
 * checks that on first use and otherwise stays with OneFlow's kernels). What differs is the pass:
 * OneFlow runs each op as its own single-threaded loop over the tensor (gelu_tanh takes seven); this
 * does one pass, split over the process's cores.
 *
 * op 0, exact GELU (OneFlow's gelu kernel): 0.5f * x * (1.0f + erff(sqrt(0.5) * x))
 * op 1, Google's tanh GELU as bert_of writes it for OneFlow (kernels.gelu_tanh):
 *       x * sigmoid(c * (x + 0.044715f * (x * x * x))), c = 2 sqrt(2/pi) as a float, and
 *       OneFlow's CPU sigmoid computes in double: (float)(1.0 / (1.0 + exp(-(double)u))).
 * Built without floating-point contraction (bert_of/runtime/native.py): a fused multiply-add would round
 * differently from OneFlow's separate kernels. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#define MAX_THREADS 64
#define MIN_PER_THREAD 32768 /* below this a thread costs more than it saves */

typedef struct {
    const float *x;
    float *y;
    int64_t lo, hi;
    int op;
} span_t;

static void gelu_span(const float *x, float *y, int64_t lo, int64_t hi, int op) {
    if (op == 0) {
        const float inv_sqrt2 = (float)sqrt(0.5);
        for (int64_t i = lo; i < hi; i++) {
            const float s = x[i];
            y[i] = 0.5f * s * (1.0f + erff(inv_sqrt2 * s));
        }
    } else {
        const float a = 0.044715f, c = (float)(2.0 * sqrt(2.0 / M_PI));
        for (int64_t i = lo; i < hi; i++) {
            const float s = x[i];
            float u = s * s;
            u = u * s;
            u = u * a;
            u = s + u;
            u = u * c;
            y[i] = s * (float)(1.0 / (1.0 + exp(-(double)u)));
        }
    }
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

/* LayerNorm over rows of [T, H]: t = x (+ res when not NULL: the residual, one float add), mean and
 * biased variance in double (two passes), y = (float)((t - mean) / sqrt(var + eps)) * w + b (the
 * last multiply and add in float, as OneFlow's separate ops). */
typedef struct {
    const float *x, *res, *w, *b;
    float *y;
    int64_t H;
    double eps;
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
            for (int64_t c = 0; c < H; c++)
                ys[c] = xs[c] + res[c];
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
    ln_args a = {x, res, w, b, y, H, eps};
    parallel_rows(ln_rows, &a, T, H, threads);
}
