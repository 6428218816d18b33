/*
 * builder.h: the builder's internal helpers, for the composite lowerings in
 * lower.c.
 *
 * Each helper adds one primitive (plus the broadcasts and scalar constants
 * it needs) and returns its value, or NULL with the message in t->error.
 * Every helper passes a NULL operand straight through as NULL, so a lowering
 * reads like the math it implements and checks for failure once, at the end:
 *
 *     fz_value *e = fz_b_unary(t, FZ_OP_EXP, fz_b_binary(t, FZ_OP_SUB, x, m));
 *     return e ? ... : NULL;
 */
#ifndef FUSEC_BUILDER_H
#define FUSEC_BUILDER_H

#include "ir.h"

fz_value *fz_b_unary(fz_trace *t, fz_opcode op, fz_value *x);
/* numpy broadcasting between a and b */
fz_value *fz_b_binary(fz_trace *t, fz_opcode op, fz_value *a, fz_value *b);
/* a op scalar, the scalar taking a's dtype */
fz_value *fz_b_binary_s(fz_trace *t, fz_opcode op, fz_value *a, double s);
fz_value *fz_b_scalar(fz_trace *t, double v, fz_dtype d);
/* x itself when it already has dtype d */
fz_value *fz_b_cast(fz_trace *t, fz_value *x, fz_dtype d);
fz_value *fz_b_reduce(fz_trace *t, fz_opcode op, fz_value *x, const int *dims,
                      int n, bool keepdim);
/* both results of var_mean; returns the variance, *mean gets the mean */
fz_value *fz_b_var_mean(fz_trace *t, fz_value *x, const int *dims, int n,
                        int64_t correction, bool keepdim, fz_value **mean);
fz_value *fz_b_full_sym(fz_trace *t, int sym, fz_dtype d);
fz_value *fz_b_unsqueeze(fz_trace *t, fz_value *x, int dim);
fz_value *fz_b_squeeze(fz_trace *t, fz_value *x, const int *dims, int n);
fz_value *fz_b_permute(fz_trace *t, fz_value *x, const int *dims);
fz_value *fz_b_take_along(fz_trace *t, fz_value *x, fz_value *idx, int dim);

/* The working dtype of normalizations: f32 for f16/bf16, else the input's. */
static inline fz_dtype fz_compute_dtype(fz_dtype d)
{
	return d == FZ_F16 || d == FZ_BF16 ? FZ_F32 : d;
}

/* Lowers composite op on operands in[] (numbers already made tensors, except
 * transpose's, which arrive in nums[]) with normalized attributes. Returns
 * the result or NULL with t->error set. */
fz_value *fz_lower(fz_trace *t, fz_opcode op, fz_value **in, int n_in,
                   const double *nums, const fz_attrs *a);

#endif
