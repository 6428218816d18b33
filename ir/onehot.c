/*
 * onehot.c: a sum over a one-hot select, recognized on the graph.
 *
 * PyTorch's cross-entropy backward scatters -1 at each row's target into
 * zeros and multiplies by the loss's weight; the exported step then sums
 * that product along the row again (log_softmax's backward needs the
 * row's sum of its incoming gradient):
 *
 *     oh  = where(eq(iota_j, t), -1, 0)          # [N, V], one -1 per row
 *     g   = mul(oh, w)                           # w: [N, 1], broadcast
 *     s   = sum(g, dims=[1], keepdim=true)       # a pass over 32000 per row
 *
 * Only one element of the row can be other than zero, so the sum is the
 * value there: the whole pass is a select on 0 <= t < n. The form taken:
 * a `sum` over one dim j of x, where x is a product (mul, either side) of
 * exactly one one-hot select where(eq(I, t), a, z) and factors that do not
 * vary along j; I is the index along j (an i32 or i64 iota reached through
 * broadcast_in_dim, reshape, squeeze, unsqueeze), t and a do not vary
 * along j, z is a zero (a full of value 0, perhaps broadcast). Whether a
 * value varies along j is read from the graph: a full does not; nor does a
 * broadcast that stretches j or an extent of 1 there; nor an elementwise
 * op of values that do not. Anything else (a region's input of the
 * row's extent, a reshape, an indexing op) is taken to vary.
 *
 * The exact rule (what the row skeleton computes). Let H be x at j = t and
 * Z x at any other j: every factor but the select is the same at every j,
 * so every term but the one at t is Z, and Z is a product with a zero
 * factor: 0, or NaN when a factor is infinite or NaN (0 * inf). The sum of
 * the terms is then exactly
 *
 *     (0 <= t < n ? H : 0)  +  (some j != t exists ? Z : 0)
 *
 * in the sum's own precision, whatever the order of the additions: adding
 * zeros to one value is exact, and one NaN makes the sum NaN, as the
 * interpreter's f64 sum rounded once finds. Integer sums alike (Z is 0).
 * Both H and Z are x's own expression at two indices of the row, so the
 * skeleton evaluates them with the one emitter, at j = t (clamped into the
 * row) and at j = (t == 0 ? 1 : 0).
 */
#include "onehot.h"

#define WALK 256 /* nodes a recognition visits */

typedef struct walk {
	bool (*leaf)(void *, const fz_value *);
	void *ctx;
	int budget;
} walk;

static bool opaque(walk *w, const fz_value *v)
{
	return !v->def || (w->leaf && w->leaf(w->ctx, v));
}

/* v's value does not depend on its index along dim p (-1: v has none) */
static bool invariant(walk *w, const fz_value *v, int p)
{
	if (p < 0 || fz_ext_is_one(v->type.dims[p]))
		return true;
	if (--w->budget < 0 || opaque(w, v))
		return false;
	const fz_node *n = v->def;
	if (n->op == FZ_OP_FULL)
		return true;
	if (n->op == FZ_OP_BROADCAST_IN_DIM) {
		int i = -1;
		for (int k = 0; k < n->attrs.n_dims; k++)
			if (n->attrs.dims[k] == p)
				i = k;
		return invariant(w, n->in[0], i);
	}
	if (!fz_op_is_elementwise(n->op))
		return false;
	for (int k = 0; k < n->n_in; k++)
		if (!invariant(w, n->in[k], p))
			return false;
	return true;
}

/* the one dim of v whose extent is not 1, or -1 (none, or several) */
static int lone_dim(const fz_value *v)
{
	int d = -1;
	for (int k = 0; k < v->type.rank; k++) {
		if (fz_ext_is_one(v->type.dims[k]))
			continue;
		if (d >= 0)
			return -1;
		d = k;
	}
	return d;
}

/* v is the index along its dim p, as an i32 or i64, the same along every
 * other dim */
static bool is_index(walk *w, const fz_value *v, int p)
{
	if (--w->budget < 0 || opaque(w, v))
		return false;
	const fz_node *n = v->def;
	const fz_value *x = n->n_in ? n->in[0] : NULL;
	switch (n->op) {
	case FZ_OP_IOTA:
		return p == 0 && (v->type.dtype == FZ_I64 || v->type.dtype == FZ_I32);
	case FZ_OP_BROADCAST_IN_DIM:
		for (int k = 0; k < n->attrs.n_dims; k++)
			if (n->attrs.dims[k] == p)
				return fz_ext_eq(x->type.dims[k], v->type.dims[p]) &&
				       is_index(w, x, k);
		return false;
	case FZ_OP_RESHAPE: case FZ_OP_SQUEEZE: case FZ_OP_UNSQUEEZE: {
		/* one dim of extent n on both sides, every other of 1 */
		int q = lone_dim(x);
		return lone_dim(v) == p && q >= 0 &&
		       fz_ext_eq(x->type.dims[q], v->type.dims[p]) && is_index(w, x, q);
	}
	default:
		return false;
	}
}

/* v is zero everywhere */
static bool is_zero(walk *w, const fz_value *v)
{
	if (--w->budget < 0 || opaque(w, v))
		return false;
	const fz_node *n = v->def;
	if (n->op == FZ_OP_BROADCAST_IN_DIM)
		return is_zero(w, n->in[0]);
	return n->op == FZ_OP_FULL && n->attrs.value_sym < 0 && n->attrs.value == 0;
}

/* x (the reduced operand's shape) is a product of one one-hot select
 * along p and factors constant along p; the hot index into *t */
static bool one_hot(walk *w, const fz_value *x, int p, const fz_value **t)
{
	if (--w->budget < 0 || opaque(w, x))
		return false;
	const fz_node *n = x->def;
	if (n->op == FZ_OP_MUL)
		return (one_hot(w, n->in[0], p, t) && invariant(w, n->in[1], p)) ||
		       (one_hot(w, n->in[1], p, t) && invariant(w, n->in[0], p));
	if (n->op != FZ_OP_WHERE || !is_zero(w, n->in[2]) || !invariant(w, n->in[1], p))
		return false;
	const fz_value *c = n->in[0];
	if (opaque(w, c) || c->def->op != FZ_OP_EQ)
		return false;
	for (int k = 0; k < 2; k++) {
		const fz_value *i = c->def->in[k], *o = c->def->in[1 - k];
		if (is_index(w, i, p) && invariant(w, o, p)) {
			*t = o;
			return true;
		}
	}
	return false;
}

bool fz_invariant_along(const fz_value *v, int dim,
			bool (*leaf)(void *ctx, const fz_value *v), void *ctx)
{
	walk w = {leaf, ctx, WALK};
	return invariant(&w, v, dim);
}

bool fz_onehot_find(const fz_node *n, bool (*leaf)(void *ctx, const fz_value *v),
		    void *ctx, fz_onehot *out)
{
	if (n->op != FZ_OP_SUM || n->attrs.n_dims != 1)
		return false;
	const fz_value *x = n->in[0];
	if (x->type.dtype == FZ_BOOL)
		return false;
	walk w = {leaf, ctx, WALK};
	const fz_value *t = NULL;
	int p = n->attrs.dims[0];
	if (!one_hot(&w, x, p, &t))
		return false;
	out->dim = p;
	out->index = t;
	return true;
}
