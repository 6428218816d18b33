/*
 * target.h (cpu branch): only the matrix-product descriptor of the
 * runtime seam that the lead's runtime/target.h defines, copied verbatim
 * so that blas.c builds against it before the seam lands on main. On
 * merge, main's target.h replaces this file whole.
 */
#ifndef FUSEC_RUNTIME_TARGET_H
#define FUSEC_RUNTIME_TARGET_H

#include "codegen.h"
#include "fusec.h"
#include "plan.h"

/* A matrix product, fixed when a plan is prepared; the runner sets the
 * pointers per run. y[b] = a[b] · op(w[b]) (+ bias), with torch.matmul's
 * batch broadcast: batch dim d has extent bshape[d] and element strides
 * a_bstride[d], b_bstride[d] (0 where an operand broadcasts); y is
 * contiguous. linear: b is [N, K] (b_trans), bias [N] or NULL. */
typedef struct fz_matmul {
	int region;
	fz_dtype dtype;          /* a, b, bias and y share it */
	int64_t M, N, K;
	bool b_trans;
	int nbd;
	int64_t bshape[FZ_MAX_RANK], a_bstride[FZ_MAX_RANK], b_bstride[FZ_MAX_RANK];
	const void *a, *b, *bias;
	void *y;
} fz_matmul;

#endif
