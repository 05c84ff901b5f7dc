/* A threaded BLAS under OneFlow 0.9's CPU kernels.
 *
 * liboneflow carries a single-threaded OpenBLAS and calls exactly four of its routines through the
 * PLT: cblas_sgemm, cblas_dgemm, cblas_sdot, cblas_ddot (objdump of liboneflow-*.so). These
 * definitions, loaded RTLD_GLOBAL before liboneflow, take their place and call the routines that
 * bert_of.blas binds (a threaded OpenBLAS from the scipy-openblas32 wheel, MKL, or a library the
 * user names), whatever their symbols are called there. CBLAS's C interface, 32-bit integers. */
#include <stdatomic.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int, const double *, int,
                         double, double *, int);
typedef float (*sdot_fn)(int, const float *, int, const float *, int);
typedef double (*ddot_fn)(int, const double *, int, const double *, int);

static sgemm_fn sgemm;
static dgemm_fn dgemm;
static sdot_fn sdot;
static ddot_fn ddot;
static atomic_long gemms;

/* Called once, from Python, before liboneflow is loaded (so before any call below). */
void bert_of_blas_bind(void *s_gemm, void *d_gemm, void *s_dot, void *d_dot) {
  sgemm = (sgemm_fn)s_gemm;
  dgemm = (dgemm_fn)d_gemm;
  sdot = (sdot_fn)s_dot;
  ddot = (ddot_fn)d_dot;
}

long bert_of_blas_gemms(void) { return atomic_load_explicit(&gemms, memory_order_relaxed); }

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
  atomic_fetch_add_explicit(&gemms, 1, memory_order_relaxed);
  sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc) {
  atomic_fetch_add_explicit(&gemms, 1, memory_order_relaxed);
  dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

float cblas_sdot(int n, const float *x, int incx, const float *y, int incy) { return sdot(n, x, incx, y, incy); }

double cblas_ddot(int n, const double *x, int incx, const double *y, int incy) { return ddot(n, x, incx, y, incy); }
