/* A threaded BLAS under OneFlow 0.9's CPU kernels.
 *
 * liboneflow carries a single-threaded OpenBLAS and calls exactly four of its routines through the
 * PLT: cblas_sgemm, cblas_dgemm, cblas_sdot, cblas_ddot (objdump of liboneflow-*.so). These
 * definitions, loaded RTLD_GLOBAL before liboneflow, take their place and call the routines that
 * bert_of.runtime.blas binds (a threaded OpenBLAS from the scipy-openblas32 wheel, MKL, or a library the
 * user names), whatever their symbols are called there. CBLAS's C interface, 32-bit integers.
 * The shim loads first (a library loaded after it, MKL's own layers included, cannot come before
 * it); until bert_of.runtime.blas binds a library, each routine is the next definition (liboneflow's). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int find_liboneflow(struct dl_phdr_info *info, size_t size, void *out) {
  (void)size;
  if (info->dlpi_name && strstr(info->dlpi_name, "/liboneflow")) {
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (h) { *(void **)out = h; return 1; }
  }
  return 0;
}

/* Unbound: the definition after this one (liboneflow is loaded RTLD_LOCAL, so ask it by handle). */
static void *next(const char *name) {
  void *f = dlsym(RTLD_NEXT, name), *h = NULL;
  if (!f) {
    dl_iterate_phdr(find_liboneflow, &h);
    if (h) f = dlsym(h, name);
  }
  if (!f) {
    fprintf(stderr, "bert_of: blas_shim: no %s to call (BERT_OF_BLAS)\n", name);
    abort();
  }
  return f;
}

#define NEXT(f, T) if (!f) f = (T)next("cblas_" #f)

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
  NEXT(sgemm, sgemm_fn);
  atomic_fetch_add_explicit(&gemms, 1, memory_order_relaxed);
  sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc) {
  NEXT(dgemm, dgemm_fn);
  atomic_fetch_add_explicit(&gemms, 1, memory_order_relaxed);
  dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

float cblas_sdot(int n, const float *x, int incx, const float *y, int incy) {
  NEXT(sdot, sdot_fn);
  return sdot(n, x, incx, y, incy);
}

double cblas_ddot(int n, const double *x, int incx, const double *y, int incy) {
  NEXT(ddot, ddot_fn);
  return ddot(n, x, incx, y, incy);
}
