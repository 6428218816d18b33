/*
 * lower.c: composite ops as primitives.
 *
 * Frameworks and people write softmax, layer_norm, gelu; the partitioner and
 * the code generator should only ever see primitives, so that one emitter of
 * elementwise math and three kernel skeletons cover everything. Each
 * composite here is its textbook formula written with the builder helpers.
 *
 * Normalizations, softmax and the transcendental activations compute in f32
 * for f16/bf16 inputs and round once, back to the input dtype, at the end:
 * what PyTorch does internally, and what keeps a bf16 layer norm within
 * 1e-2 of f64. A mean over symbolic extents divides by the bound sizes,
 * taken from `full(value=B)`, so one trace serves every batch size.
 *
 *     softmax(x, dim=k), x: bf16      xf = cast(x, f32)
 *                                     m  = amax(xf, dims=[k], keepdim=true)
 *                                     e  = exp(sub(xf, m))
 *                                     s  = sum(e, dims=[k], keepdim=true)
 *                                     y  = cast(div(e, s), bf16)
 */
#include <math.h>
#include <stdio.h>

#include "builder.h"

#ifndef M_SQRT1_2
#define M_SQRT1_2 0.70710678118654752440
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* The product of x's extents over dims, as a rank-0 tensor of dtype d. */
static fz_value *count_of(fz_trace *t, fz_value *x, const int *dims, int n,
			  fz_dtype d)
{
	fz_ext cnt = fz_ext_const(1);
	for (int i = 0; i < n; i++) {
		if (dims[i] < 0 || dims[i] >= x->type.rank) {
			fz_fail(t, "mean: dim %d is out of range for rank %d", dims[i],
				x->type.rank);
			return NULL;
		}
		if (!fz_ext_mul(cnt, x->type.dims[dims[i]], &cnt)) {
			fz_fail(t, "mean: the element count overflows");
			return NULL;
		}
	}
	fz_value *v = fz_b_scalar(t, (double)cnt.c, d);
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		for (int p = fz_ext_power(cnt, s); p > 0; p--)
			v = fz_b_binary(t, FZ_OP_MUL, v, fz_b_full_sym(t, s, d));
	return v;
}

/* mean in the compute dtype; the caller casts back. */
static fz_value *mean_f(fz_trace *t, fz_value *xf, const int *dims, int n,
			bool keepdim)
{
	if (!xf)
		return NULL;
	fz_value *s = fz_b_reduce(t, FZ_OP_SUM, xf, dims, n, keepdim);
	return fz_b_binary(t, FZ_OP_DIV, s, count_of(t, xf, dims, n,
						      xf->type.dtype));
}

static fz_value *gelu(fz_trace *t, fz_value *x, int approximate)
{
	fz_value *inner;
	if (approximate == FZ_APPROX_TANH) {
		fz_value *x3 = fz_b_binary(t, FZ_OP_MUL, fz_b_binary(t, FZ_OP_MUL, x, x), x);
		fz_value *u = fz_b_binary(t, FZ_OP_ADD, x,
					  fz_b_binary_s(t, FZ_OP_MUL, x3, 0.044715));
		u = fz_b_binary_s(t, FZ_OP_MUL, u, sqrt(2.0 / M_PI));
		inner = fz_b_unary(t, FZ_OP_TANH, u);
	} else {
		inner = fz_b_unary(t, FZ_OP_ERF, fz_b_binary_s(t, FZ_OP_MUL, x, M_SQRT1_2));
	}
	fz_value *h = fz_b_binary_s(t, FZ_OP_MUL, x, 0.5);
	return fz_b_binary(t, FZ_OP_MUL, h, fz_b_binary_s(t, FZ_OP_ADD, inner, 1.0));
}

static fz_value *softmax(fz_trace *t, fz_value *xf, int dim, bool logp)
{
	int dims[1] = {dim};
	fz_value *m = fz_b_reduce(t, FZ_OP_AMAX, xf, dims, 1, true);
	fz_value *sh = fz_b_binary(t, FZ_OP_SUB, xf, m);
	fz_value *e = fz_b_unary(t, FZ_OP_EXP, sh);
	fz_value *s = fz_b_reduce(t, FZ_OP_SUM, e, dims, 1, true);
	if (logp)
		return fz_b_binary(t, FZ_OP_SUB, sh, fz_b_unary(t, FZ_OP_LOG, s));
	return fz_b_binary(t, FZ_OP_DIV, e, s);
}

static fz_value *check_same_dtype(fz_trace *t, const char *op, const char *what,
				  fz_value *x, fz_value *p)
{
	if (p->type.dtype == x->type.dtype)
		return p;
	fz_fail(t, "%s: %s has dtype %s; expected %s like the input", op, what,
		fz_dtype_name(p->type.dtype), fz_dtype_name(x->type.dtype));
	return NULL;
}

static fz_value *layer_norm(fz_trace *t, fz_value **in, int n, fz_value *xf,
			    const fz_attrs *a, bool rms)
{
	const char *op = rms ? "rms_norm" : "layer_norm";
	fz_value *y;
	if (rms) {
		fz_value *ms = mean_f(t, fz_b_binary(t, FZ_OP_MUL, xf, xf), a->dims,
				      a->n_dims, true);
		fz_value *r = fz_b_unary(t, FZ_OP_RSQRT, fz_b_binary_s(t, FZ_OP_ADD, ms,
									a->eps));
		y = fz_b_binary(t, FZ_OP_MUL, xf, r);
	} else {
		fz_value *mean;
		fz_value *var = fz_b_var_mean(t, xf, a->dims, a->n_dims, 0, true, &mean);
		fz_value *r = fz_b_unary(t, FZ_OP_RSQRT, fz_b_binary_s(t, FZ_OP_ADD, var,
									a->eps));
		y = fz_b_binary(t, FZ_OP_MUL, fz_b_binary(t, FZ_OP_SUB, xf, mean), r);
	}
	for (int i = 1; i < n && y; i++) {
		fz_value *p = check_same_dtype(t, op, i == 1 ? "weight" : "bias",
					       in[0], in[i]);
		p = fz_b_cast(t, p, xf ? xf->type.dtype : FZ_F32);
		y = fz_b_binary(t, i == 1 ? FZ_OP_MUL : FZ_OP_ADD, y, p);
	}
	return y;
}

static fz_value *cross_entropy(fz_trace *t, fz_value *logits, fz_value *target)
{
	const fz_type *lt = &logits->type, *tt = &target->type;
	char b[256];
	if (lt->rank < 1) {
		fz_fail(t, "cross_entropy: logits are rank 0; expected [..., classes]");
		return NULL;
	}
	if (tt->dtype != FZ_I32 && tt->dtype != FZ_I64) {
		fz_fail(t, "cross_entropy: target has dtype %s; expected i32 or i64",
			fz_dtype_name(tt->dtype));
		return NULL;
	}
	bool ok = tt->rank == lt->rank - 1;
	for (int i = 0; ok && i < tt->rank; i++)
		ok = fz_ext_eq(tt->dims[i], lt->dims[i]);
	if (!ok) {
		fz_type want = *lt;
		want.rank--;
		want.dtype = tt->dtype;
		fz_fail(t, "cross_entropy: target must have the logits' shape without"
			" the class dim (the last): %s", fz_type_str(t, &want, b, sizeof b));
		return NULL;
	}
	int c = lt->rank - 1, dims[1] = {c};
	fz_value *lf = fz_b_cast(t, logits, fz_compute_dtype(lt->dtype));
	fz_value *m = fz_b_reduce(t, FZ_OP_AMAX, lf, dims, 1, true);
	fz_value *sh = fz_b_binary(t, FZ_OP_SUB, lf, m);
	fz_value *s = fz_b_reduce(t, FZ_OP_SUM, fz_b_unary(t, FZ_OP_EXP, sh), dims,
				  1, true);
	fz_value *picked = fz_b_take_along(t, sh, fz_b_unsqueeze(t, target, c), c);
	fz_value *nll = fz_b_binary(t, FZ_OP_SUB, fz_b_unary(t, FZ_OP_LOG, s), picked);
	int all[FZ_MAX_RANK];
	for (int i = 0; i < lt->rank; i++)
		all[i] = i;
	fz_value *loss = mean_f(t, nll, all, lt->rank, false);
	return fz_b_cast(t, loss, lt->dtype);
}

fz_value *fz_lower(fz_trace *t, fz_opcode op, fz_value **in, int n_in,
		   const double *nums, const fz_attrs *a)
{
	fz_value *x = in[0];
	fz_dtype d = x->type.dtype;
	fz_dtype cd = fz_compute_dtype(d);
	unsigned flags = fz_ops[op].flags;
	if ((flags & FL_FLOAT) && !fz_dtype_is_float(d)) {
		fz_fail(t, "%s: the input has dtype %s; expected a floating dtype",
			fz_ops[op].name, fz_dtype_name(d));
		return NULL;
	}
	if ((flags & FL_NOBOOL) && d == FZ_BOOL) {
		fz_fail(t, "%s: the input is bool; expected a numeric dtype",
			fz_ops[op].name);
		return NULL;
	}
	/* The last step of each lowering below always adds a node, so a
	 * composite's result is never one of its operands. */
	switch (op) {
	case FZ_OP_RELU:
		return fz_b_binary_s(t, FZ_OP_MAXIMUM, x, 0.0);
	case FZ_OP_SILU: {
		fz_value *xf = fz_b_cast(t, x, cd);
		fz_value *y = fz_b_binary(t, FZ_OP_MUL, xf, fz_b_unary(t, FZ_OP_SIGMOID, xf));
		return fz_b_cast(t, y, d);
	}
	case FZ_OP_GELU:
		return fz_b_cast(t, gelu(t, fz_b_cast(t, x, cd), a->approximate), d);
	case FZ_OP_SOFTMAX:
	case FZ_OP_LOG_SOFTMAX:
		if (a->dim < 0 || a->dim >= x->type.rank) {
			fz_fail(t, "%s: dim %d is out of range for rank %d",
				fz_ops[op].name, a->dim, x->type.rank);
			return NULL;
		}
		return fz_b_cast(t, softmax(t, fz_b_cast(t, x, cd), a->dim,
					    op == FZ_OP_LOG_SOFTMAX), d);
	case FZ_OP_MEAN:
		return fz_b_cast(t, mean_f(t, fz_b_cast(t, x, cd), a->dims, a->n_dims,
					   a->keepdim), d);
	case FZ_OP_LAYER_NORM:
	case FZ_OP_RMS_NORM:
		return fz_b_cast(t, layer_norm(t, in, n_in, fz_b_cast(t, x, cd), a,
					       op == FZ_OP_RMS_NORM), d);
	case FZ_OP_TRANSPOSE: {
		int r = x->type.rank, perm[FZ_MAX_RANK];
		int d0 = (int)nums[1], d1 = (int)nums[2];
		d0 = d0 < 0 ? d0 + r : d0;
		d1 = d1 < 0 ? d1 + r : d1;
		if (d0 < 0 || d0 >= r || d1 < 0 || d1 >= r) {
			fz_fail(t, "transpose: dims %g and %g are out of range for rank %d",
				nums[1], nums[2], r);
			return NULL;
		}
		for (int i = 0; i < r; i++)
			perm[i] = i == d0 ? d1 : i == d1 ? d0 : i;
		return fz_b_permute(t, x, perm);
	}
	case FZ_OP_CROSS_ENTROPY:
		return cross_entropy(t, x, in[1]);
	default:
		break;
	}
	fz_fail(t, "%s: no lowering", fz_ops[op].name);
	return NULL;
}
