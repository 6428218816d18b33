/*
 * onehot.h: a sum over a one-hot select is its value at the hot index.
 *
 * The exporter writes a gather's gradient as a scatter of a row value at
 * the target: where(eq(iota_j, t), a, 0), a one-hot row; a reduction of
 * it along j, times factors that do not vary along j,
 *
 *     r = sum(mul(where(eq(iota_j, t), a, 0), s), dims=[j])
 *
 * is a row value, a * s where 0 <= t < n, else 0: no pass over the row is
 * needed to find it (ir/onehot.c has the argument and the exact rule).
 * fz_onehot_find recognizes the form on the graph; the row skeleton
 * (codegen/reduction.c, "the pick") computes such a reduction at the row,
 * without a pass. The trace is not rewritten: the interpreter still sums,
 * and is the oracle for the pick.
 */
#ifndef FUSEC_ONEHOT_H
#define FUSEC_ONEHOT_H

#include "ir.h"

typedef struct fz_onehot {
	int dim;                /* the reduced dim j */
	const fz_value *index;  /* t, in the reduced operand's shape and
	                         * constant along j (an integer dtype) */
} fz_onehot;

/* Is reduction n a sum over dim j alone of a one-hot product (above)?
 * The walk stops at values `leaf` says are opaque (a region's inputs:
 * then only their extents tell whether they vary along j); leaf may be
 * NULL (the whole trace is visible). Fills *out when it is. Visits a
 * bounded number of nodes. */
bool fz_onehot_find(const fz_node *n, bool (*leaf)(void *ctx, const fz_value *v),
                    void *ctx, fz_onehot *out);

/* v's value does not vary along its dim `dim` (the rule above: a full, a
 * broadcast that stretches it, an extent of 1, elementwise ops of such);
 * leaf as above. The row skeleton's rescale asks it of a row value. */
bool fz_invariant_along(const fz_value *v, int dim,
                        bool (*leaf)(void *ctx, const fz_value *v), void *ctx);

#endif
