/* GELU for inference on CPU, the float operations OneFlow 0.9's CPU kernels perform, in the same
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
