/*
 * blas.h: matrix products on the CPU through a BLAS opened at run time.
 *
 *     fz_blas *b;
 *     fz_blas_open(&b, &err);                 the process's MKL, else OpenBLAS,
 *                                             else BLIS, else any
 *                                             libblas.so.3, else none
 *     fz_cpu_matmul(b, pool, &mm, &err);      one fz_matmul across the pool
 *     fz_blas_close(b);
 *
 * The products of f32 and f64 go straight to sgemm / dgemm; bf16 and f16
 * (which the BLAS lacks) through f32 panels: the operands widened to f32,
 * sgemm, the sum and bias rounded once to the output's dtype, as PyTorch
 * does on the CPU. Integer products, and every product when no BLAS could
 * be opened, run a plain loop (f32 accumulation for floats, exact i64 for
 * integers): slower, never wrong. See blas.c for the choice of library.
 */
#ifndef FUSEC_RUNTIME_BLAS_H
#define FUSEC_RUNTIME_BLAS_H

#include "pool.h"
#include "target.h"

typedef struct fz_blas fz_blas;

/* Opens $FUSEC_BLAS (a library path) if set, else MKL where a loaded
 * object already exports it (PyTorch's libtorch_cpu.so), else the first
 * of libopenblas.so.0, libblis.so.4, libblas.so.3 that exports sgemm_ and
 * dgemm_. Finding none is not an error: fz_blas_name says "none" and
 * products use the built-in loop. FZ_ENOMEM only. */
fz_status fz_blas_open(fz_blas **out, char **err);
void fz_blas_close(fz_blas *b);
/* "openblas (CORE)", "mkl (already in the process)", "blis", "blas"
 * (another libblas.so.3), or "none". */
const char *fz_blas_name(const fz_blas *b);

/* y = a · op(b) (+ bias) as m describes, the work split across pool
 * (NULL: this thread). FZ_EUNSUPPORTED for an extent past the BLAS's
 * 32-bit integers; FZ_ENOMEM when scratch for f32 panels cannot be had. */
fz_status fz_cpu_matmul(fz_blas *b, fz_pool *pool, const fz_matmul *m, char **err);

#endif
