/*
 * infer.c: shape and dtype inference, one rule per op class.
 *
 * fz_infer is a pure function from operand types and attributes to result
 * types. The builder calls it to type every node it adds; the verifier calls
 * it again on a finished graph and compares, so a pass that rewrites the IR
 * cannot leave a node whose stored type disagrees with its op.
 *
 * The rules are strict, as DESIGN.md asks: elementwise operands have
 * identical shapes (the builder makes numpy broadcasting explicit before it
 * gets here) and identical dtypes; a future must be waited on before use.
 * Every message names the op, the operand and what was expected:
 *
 *     add: operand 2 ('w', f16[4096]) has dtype f16; expected f32, the
 *     dtype of operand 1
 */
#include <stdio.h>
#include <string.h>

#include "ir.h"

typedef struct ctx {
	const fz_trace *t;
	fz_opcode op;
	fz_value *const *in;
	char *err;
	size_t errlen;
} ctx;

#define FAIL(c, ...) (snprintf((c)->err, (c)->errlen, __VA_ARGS__), -1)

/* "operand 2 ('w', f16[4096])" */
static const char *opnd(const ctx *c, int i, char *buf, size_t n)
{
	char ty[256];
	const fz_value *v = c->in[i];
	fz_type_str(c->t, &v->type, ty, sizeof ty);
	if (v->name)
		snprintf(buf, n, "operand %d ('%s', %s)", i + 1, v->name, ty);
	else
		snprintf(buf, n, "operand %d (%s)", i + 1, ty);
	return buf;
}

static const char *ext_s(const ctx *c, fz_ext e, char *buf, size_t n)
{
	return fz_ext_str(c->t, e, buf, n);
}

static int check_dtype_flags(const ctx *c, int i, unsigned flags)
{
	char b[400];
	fz_dtype d = c->in[i]->type.dtype;
	const char *name = fz_ops[c->op].name;
	if ((flags & FL_FLOAT) && !fz_dtype_is_float(d))
		return FAIL(c, "%s: %s has dtype %s; expected a floating dtype "
			    "(f64, f32, f16, bf16)", name, opnd(c, i, b, sizeof b),
			    fz_dtype_name(d));
	if ((flags & FL_NOBOOL) && d == FZ_BOOL)
		return FAIL(c, "%s: %s is bool; expected a numeric dtype", name,
			    opnd(c, i, b, sizeof b));
	if ((flags & FL_BOOL) && d != FZ_BOOL)
		return FAIL(c, "%s: %s has dtype %s; expected bool", name,
			    opnd(c, i, b, sizeof b), fz_dtype_name(d));
	return 0;
}

static int same_dtype(const ctx *c, int i, int j)
{
	char b[400];
	if (c->in[i]->type.dtype == c->in[j]->type.dtype)
		return 0;
	return FAIL(c, "%s: %s has dtype %s; expected %s, the dtype of operand %d"
		    " (insert a cast)", fz_ops[c->op].name, opnd(c, i, b, sizeof b),
		    fz_dtype_name(c->in[i]->type.dtype),
		    fz_dtype_name(c->in[j]->type.dtype), j + 1);
}

static int same_shape(const ctx *c, int i, int j)
{
	const fz_type *a = &c->in[i]->type, *b = &c->in[j]->type;
	bool ok = a->rank == b->rank;
	for (int k = 0; ok && k < a->rank; k++)
		ok = fz_ext_eq(a->dims[k], b->dims[k]);
	if (ok)
		return 0;
	char s[400], tb[256];
	fz_type_str(c->t, b, tb, sizeof tb);
	return FAIL(c, "%s: %s does not have the shape of operand %d (%s)",
		    fz_ops[c->op].name, opnd(c, i, s, sizeof s), j + 1, tb);
}

static int index_dtype(const ctx *c, int i)
{
	char b[400];
	fz_dtype d = c->in[i]->type.dtype;
	if (d == FZ_I32 || d == FZ_I64)
		return 0;
	return FAIL(c, "%s: index %s has dtype %s; expected i32 or i64",
		    fz_ops[c->op].name, opnd(c, i, b, sizeof b), fz_dtype_name(d));
}

static int check_dim(const ctx *c, const char *what, int d, int rank)
{
	if (d >= 0 && d < rank)
		return 0;
	return FAIL(c, "%s: %s %d is out of range for rank %d", fz_ops[c->op].name,
		    what, d, rank);
}

/* dims must be distinct and in range; `seen` marks them. */
static int check_dims(const ctx *c, const fz_attrs *a, int rank, bool seen[])
{
	memset(seen, 0, sizeof(bool) * FZ_MAX_RANK);
	for (int i = 0; i < a->n_dims; i++) {
		if (check_dim(c, "dim", a->dims[i], rank) < 0)
			return -1;
		if (seen[a->dims[i]])
			return FAIL(c, "%s: dim %d is listed twice", fz_ops[c->op].name,
				    a->dims[i]);
		seen[a->dims[i]] = true;
	}
	return 0;
}

static int check_shape_attr(const ctx *c, const fz_attrs *a)
{
	if (a->n_shape > FZ_MAX_RANK)
		return FAIL(c, "%s: shape has rank %d; at most %d is supported",
			    fz_ops[c->op].name, a->n_shape, FZ_MAX_RANK);
	fz_type t = {.rank = a->n_shape};
	for (int i = 0; i < a->n_shape; i++) {
		if (a->shape[i].c < 0)
			return FAIL(c, "%s: shape extent %d is negative",
				    fz_ops[c->op].name, i);
		t.dims[i] = a->shape[i];
	}
	fz_ext n;
	if (!fz_type_numel(&t, &n))
		return FAIL(c, "%s: the element count of the shape overflows",
			    fz_ops[c->op].name);
	return 0;
}

static void set_shape(fz_type *out, const fz_ext *dims, int rank)
{
	out->rank = rank;
	for (int i = 0; i < rank; i++)
		out->dims[i] = dims[i];
}

static int infer_elementwise(const ctx *c, int n_in, const fz_attrs *a,
			     fz_type *out)
{
	const fz_opinfo *oi = &fz_ops[c->op];
	int first = c->op == FZ_OP_WHERE ? 1 : 0;
	if (c->op == FZ_OP_WHERE && c->in[0]->type.dtype != FZ_BOOL) {
		char b[400];
		return FAIL(c, "where: condition %s has dtype %s; expected bool",
			    opnd(c, 0, b, sizeof b),
			    fz_dtype_name(c->in[0]->type.dtype));
	}
	for (int i = first; i < n_in; i++) {
		if (check_dtype_flags(c, i, oi->flags) < 0)
			return -1;
		if (i > first && same_dtype(c, i, first) < 0)
			return -1;
	}
	for (int i = 1; i < n_in; i++)
		if (same_shape(c, i, 0) < 0)
			return -1;
	out[0] = c->in[first]->type;
	if (oi->flags & FL_BOOLRES)
		out[0].dtype = FZ_BOOL;
	if (c->op == FZ_OP_CAST)
		out[0].dtype = a->dtype;
	return 1;
}

static int infer_creation(const ctx *c, int n_in, const fz_attrs *a, fz_type *out)
{
	const char *name = fz_ops[c->op].name;
	out[0].dtype = a->dtype;
	switch (c->op) {
	case FZ_OP_FULL:
		if (a->value_sym >= c->t->n_syms)
			return FAIL(c, "full: value names an unknown symbol");
		if (check_shape_attr(c, a) < 0)
			return -1;
		set_shape(out, a->shape, a->n_shape);
		return 1;
	case FZ_OP_IOTA:
		if (a->length.c < 0 || a->length.c > (INT64_MAX >> 2))
			return FAIL(c, "iota: length %lld is out of range",
				    (long long)a->length.c);
		if (a->dtype == FZ_BOOL)
			return FAIL(c, "iota: dtype bool; expected a numeric dtype");
		out[0].rank = 1;
		out[0].dims[0] = a->length;
		return 1;
	case FZ_OP_UNIFORM:
		/* uniform(s, shape=..., offset=O, dtype=D): the seed is the
		 * value of s, read at run time */
		if (n_in == 1) {
			char b[400];
			const fz_type *st = &c->in[0]->type;
			if (a->present & AT(SEED))
				return FAIL(c, "uniform: the seed is given twice, as %s "
					    "and as the attribute seed=; give one",
					    opnd(c, 0, b, sizeof b));
			if (st->rank != 0 ||
			    (st->dtype != FZ_I64 && st->dtype != FZ_I32))
				return FAIL(c, "uniform: the seed, %s, must be a rank-0 "
					    "i64 or i32", opnd(c, 0, b, sizeof b));
		}
		if (!fz_dtype_is_float(a->dtype))
			return FAIL(c, "uniform: dtype %s; expected a floating dtype",
				    fz_dtype_name(a->dtype));
		if (check_shape_attr(c, a) < 0)
			return -1;
		set_shape(out, a->shape, a->n_shape);
		return 1;
	default:
		return FAIL(c, "%s: not a creation op", name);
	}
}

static int infer_broadcast(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	char e1[128], e2[128];
	if (check_shape_attr(c, a) < 0)
		return -1;
	if (a->n_dims != x->rank)
		return FAIL(c, "broadcast_in_dim: dims has %d entries; expected %d, "
			    "the rank of operand 1", a->n_dims, x->rank);
	for (int i = 0; i < a->n_dims; i++) {
		if (check_dim(c, "dim", a->dims[i], a->n_shape) < 0)
			return -1;
		if (i > 0 && a->dims[i] <= a->dims[i - 1])
			return FAIL(c, "broadcast_in_dim: dims must be strictly "
				    "increasing");
		fz_ext xe = x->dims[i], oe = a->shape[a->dims[i]];
		if (!fz_ext_eq(xe, oe) && !fz_ext_eq(xe, fz_ext_const(1)))
			return FAIL(c, "broadcast_in_dim: operand dim %d has extent %s;"
				    " expected %s or 1 (result dim %d)", i,
				    ext_s(c, xe, e1, sizeof e1),
				    ext_s(c, oe, e2, sizeof e2), a->dims[i]);
	}
	out[0].dtype = x->dtype;
	set_shape(out, a->shape, a->n_shape);
	return 1;
}

static int infer_reshape(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	char e1[128], e2[128];
	if (check_shape_attr(c, a) < 0)
		return -1;
	fz_type r = {.dtype = x->dtype};
	set_shape(&r, a->shape, a->n_shape);
	fz_ext n1, n2;
	if (!fz_type_numel(x, &n1) || !fz_type_numel(&r, &n2))
		return FAIL(c, "reshape: element count overflows");
	fz_poly d;
	if (!fz_ext_eq(n1, n2) && !(fz_ext_diff(c->t, n1, n2, &d) && d.n == 0))
		return FAIL(c, "reshape: operand 1 has %s elements; the shape has %s",
			    ext_s(c, n1, e1, sizeof e1), ext_s(c, n2, e2, sizeof e2));
	out[0] = r;
	return 1;
}

static int infer_permute(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	bool seen[FZ_MAX_RANK];
	if (a->n_dims != x->rank)
		return FAIL(c, "permute: dims has %d entries; expected %d, the rank "
			    "of operand 1", a->n_dims, x->rank);
	if (check_dims(c, a, x->rank, seen) < 0)
		return -1;
	out[0].dtype = x->dtype;
	out[0].rank = x->rank;
	for (int i = 0; i < x->rank; i++)
		out[0].dims[i] = x->dims[a->dims[i]];
	return 1;
}

/* Whether p >= 0 at every size: no negative coefficient. */
static bool poly_nonneg(const fz_poly *p)
{
	for (int i = 0; i < p->n; i++)
		if (p->term[i].c < 0)
			return false;
	return true;
}

/* A symbolic dim of a slice, step 1: the result is end - start, a sum
 * like T+1-1 = T or T-1 (a derived symbol, interned here: the trace is
 * written through the const pointer, see fz_trace_ext_of_poly). end must
 * not pass the extent: where extent - end has no negative term it never
 * does; else (the first T of 64 positions) extent - end becomes a derived
 * symbol too, "-T+64", which binding refuses to see negative. */
static int symbolic_slice(const ctx *c, int i, fz_ext ext, fz_ext end,
			  int64_t s, int64_t st, fz_ext *out)
{
	char e1[128], e2[128];
	fz_poly room, len, ps = {.n = 1, .term = {fz_ext_const(s)}};
	if (st != 1 || s < 0)
		return FAIL(c, "slice: dim %d has symbolic extent %s; it takes "
			    "step 1 and a start >= 0", i, ext_s(c, ext, e1, sizeof e1));
	fz_ext guard;
	if (!fz_ext_diff(c->t, ext, end, &room) ||
	    (!poly_nonneg(&room) &&
	     !fz_trace_ext_of_poly((fz_trace *)c->t, &room, &guard)))
		return FAIL(c, "slice: end %s in dim %d passes the extent %s",
			    ext_s(c, end, e1, sizeof e1), i,
			    ext_s(c, ext, e2, sizeof e2));
	if (!fz_ext_expand(c->t, end, &len) || !fz_poly_add(&len, &ps, -1, &len) ||
	    !fz_trace_ext_of_poly((fz_trace *)c->t, &len, out))
		return FAIL(c, "slice: [%lld, %s) in dim %d is not an extent",
			    (long long)s, ext_s(c, end, e1, sizeof e1), i);
	return 0;
}

static int infer_slice(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	char e1[128], e2[128];
	if (a->n_slice != x->rank)
		return FAIL(c, "slice: start/end/step have %d entries; expected %d, "
			    "the rank of operand 1", a->n_slice, x->rank);
	out[0].dtype = x->dtype;
	out[0].rank = x->rank;
	for (int i = 0; i < x->rank; i++) {
		fz_ext ext = x->dims[i], end = a->end[i];
		int64_t s = a->start[i], st = a->step[i];
		if (st < 1)
			return FAIL(c, "slice: step %lld in dim %d; expected >= 1",
				    (long long)st, i);
		if (!fz_ext_is_const(ext) || !fz_ext_is_const(end)) {
			if (symbolic_slice(c, i, ext, end, s, st, &out[0].dims[i]) < 0)
				return -1;
			continue;
		}
		if (s < 0 || s > end.c || end.c > ext.c)
			return FAIL(c, "slice: bounds [%lld, %s) in dim %d lie outside "
				    "the extent %s", (long long)s,
				    ext_s(c, end, e1, sizeof e1), i,
				    ext_s(c, ext, e2, sizeof e2));
		/* ceil((end - start) / step), which a step near 2^63 must not
		 * overflow */
		int64_t n = end.c - s;
		out[0].dims[i] = fz_ext_const(n ? (n - 1) / st + 1 : 0);
	}
	return 1;
}

static int infer_squeeze(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	bool seen[FZ_MAX_RANK];
	char e[128];
	if (check_dims(c, a, x->rank, seen) < 0)
		return -1;
	out[0].dtype = x->dtype;
	out[0].rank = 0;
	for (int i = 0; i < x->rank; i++) {
		if (!seen[i]) {
			out[0].dims[out[0].rank++] = x->dims[i];
			continue;
		}
		if (!fz_ext_eq(x->dims[i], fz_ext_const(1)))
			return FAIL(c, "squeeze: dim %d has extent %s; expected 1", i,
				    ext_s(c, x->dims[i], e, sizeof e));
	}
	return 1;
}

static int infer_unsqueeze(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	if (x->rank == FZ_MAX_RANK)
		return FAIL(c, "unsqueeze: operand 1 already has the maximum rank %d",
			    FZ_MAX_RANK);
	if (check_dim(c, "dim", a->dim, x->rank + 1) < 0)
		return -1;
	out[0].dtype = x->dtype;
	out[0].rank = x->rank + 1;
	for (int i = 0, j = 0; i < out[0].rank; i++)
		out[0].dims[i] = i == a->dim ? fz_ext_const(1) : x->dims[j++];
	return 1;
}

static int infer_cat(const ctx *c, int n_in, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	char b[400], e1[128], e2[128];
	if (check_dim(c, "dim", a->dim, x->rank) < 0)
		return -1;
	fz_poly sum;
	if (!fz_ext_expand(c->t, x->dims[a->dim], &sum))
		return FAIL(c, "cat: the extent of operand 1 along dim %d cannot be "
			    "added to", a->dim);
	for (int i = 1; i < n_in; i++) {
		const fz_type *y = &c->in[i]->type;
		if (same_dtype(c, i, 0) < 0)
			return -1;
		if (y->rank != x->rank)
			return FAIL(c, "cat: %s has rank %d; expected %d like operand 1",
				    opnd(c, i, b, sizeof b), y->rank, x->rank);
		for (int k = 0; k < x->rank; k++) {
			if (k != a->dim && !fz_ext_eq(y->dims[k], x->dims[k]))
				return FAIL(c, "cat: %s has extent %s in dim %d; expected "
					    "%s like operand 1", opnd(c, i, b, sizeof b),
					    ext_s(c, y->dims[k], e1, sizeof e1), k,
					    ext_s(c, x->dims[k], e2, sizeof e2));
		}
		fz_ext e = y->dims[a->dim];
		fz_poly pe;
		if (!fz_ext_expand(c->t, e, &pe) || !fz_poly_add(&sum, &pe, 1, &sum))
			return FAIL(c, "cat: extents along dim %d cannot be added into "
				    "one extent (at %s, %s)", a->dim,
				    opnd(c, i, b, sizeof b), ext_s(c, e, e1, sizeof e1));
	}
	out[0] = *x;
	/* the sum, canonical: B and B give 2*B, T and 1 give T+1 */
	if (!fz_trace_ext_of_poly((fz_trace *)c->t, &sum, &out[0].dims[a->dim]))
		return FAIL(c, "cat: the extents along dim %d cannot be added into "
			    "one extent", a->dim);
	return 1;
}

static int infer_reduction(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	bool seen[FZ_MAX_RANK];
	if (check_dtype_flags(c, 0, fz_ops[c->op].flags) < 0)
		return -1;
	if (check_dims(c, a, x->rank, seen) < 0)
		return -1;
	if (c->op == FZ_OP_VAR_MEAN && a->correction < 0)
		return FAIL(c, "var_mean: correction %lld; expected >= 0",
			    (long long)a->correction);
	out[0].dtype = x->dtype;
	out[0].rank = 0;
	for (int i = 0; i < x->rank; i++) {
		if (!seen[i])
			out[0].dims[out[0].rank++] = x->dims[i];
		else if (a->keepdim)
			out[0].dims[out[0].rank++] = fz_ext_const(1);
	}
	if (c->op != FZ_OP_VAR_MEAN)
		return 1;
	out[1] = out[0];
	return 2;
}

/* cumsum: the operand's type. */
static int infer_scan(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	if (check_dtype_flags(c, 0, fz_ops[c->op].flags) < 0 ||
	    check_dim(c, "dim", a->dim, x->rank) < 0)
		return -1;
	out[0] = *x;
	return 1;
}

/* argmax, argmin: i64 of the operand's shape without dim (1 with keepdim);
 * topk: the operand's shape with k at dim, values and i64 indices. */
static int infer_select(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	char e[128];
	if (check_dtype_flags(c, 0, fz_ops[c->op].flags) < 0 ||
	    check_dim(c, "dim", a->dim, x->rank) < 0)
		return -1;
	fz_ext n = x->dims[a->dim];
	if (c->op != FZ_OP_TOPK) {
		/* over an extent of 0 there is no extremum: the verifier
		 * refuses it where the op runs (not where dce.c drops it) */
		out[0].dtype = FZ_I64;
		out[0].rank = 0;
		for (int i = 0; i < x->rank; i++) {
			if (i != a->dim)
				out[0].dims[out[0].rank++] = x->dims[i];
			else if (a->keepdim)
				out[0].dims[out[0].rank++] = fz_ext_const(1);
		}
		return 1;
	}
	if (a->k < 1)
		return FAIL(c, "topk: k=%lld; expected 1 or more", (long long)a->k);
	if (!fz_ext_is_const(n) || n.c < a->k)
		return FAIL(c, "topk: k=%lld exceeds extent %s of dim %d%s",
			    (long long)a->k, ext_s(c, n, e, sizeof e), a->dim,
			    fz_ext_is_const(n) ? "" : " (a symbolic extent: k must "
			    "not exceed a known one)");
	out[0] = *x;
	out[0].dims[a->dim] = fz_ext_const(a->k);
	out[1] = out[0];
	out[1].dtype = FZ_I64;
	return 2;
}

static int infer_take(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type, *idx = &c->in[1]->type;
	if (index_dtype(c, 1) < 0 || check_dim(c, "dim", a->dim, x->rank) < 0)
		return -1;
	int rank = x->rank - 1 + idx->rank;
	if (rank > FZ_MAX_RANK)
		return FAIL(c, "take: result rank %d exceeds %d", rank, FZ_MAX_RANK);
	out[0].dtype = x->dtype;
	out[0].rank = 0;
	for (int i = 0; i < x->rank; i++) {
		if (i != a->dim) {
			out[0].dims[out[0].rank++] = x->dims[i];
			continue;
		}
		for (int k = 0; k < idx->rank; k++)
			out[0].dims[out[0].rank++] = idx->dims[k];
	}
	return 1;
}

static int infer_take_along(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type, *idx = &c->in[1]->type;
	char b[400], e1[128], e2[128];
	if (index_dtype(c, 1) < 0 || check_dim(c, "dim", a->dim, x->rank) < 0)
		return -1;
	if (idx->rank != x->rank)
		return FAIL(c, "take_along: index %s has rank %d; expected %d, the "
			    "rank of operand 1", opnd(c, 1, b, sizeof b), idx->rank,
			    x->rank);
	for (int i = 0; i < x->rank; i++) {
		if (i == a->dim || fz_ext_eq(idx->dims[i], x->dims[i]))
			continue;
		if (fz_ext_is_const(idx->dims[i]) && fz_ext_is_const(x->dims[i]) &&
		    idx->dims[i].c <= x->dims[i].c)
			continue;
		return FAIL(c, "take_along: index extent %s in dim %d exceeds the "
			    "operand's %s", ext_s(c, idx->dims[i], e1, sizeof e1), i,
			    ext_s(c, x->dims[i], e2, sizeof e2));
	}
	out[0] = *idx;
	out[0].dtype = x->dtype;
	return 1;
}

static int infer_index_add(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type, *idx = &c->in[1]->type;
	const fz_type *src = &c->in[2]->type;
	char b[400], e1[128], e2[128];
	if (index_dtype(c, 1) < 0 || check_dim(c, "dim", a->dim, x->rank) < 0 ||
	    check_dtype_flags(c, 0, FL_NOBOOL) < 0 || same_dtype(c, 2, 0) < 0)
		return -1;
	if (idx->rank != 1)
		return FAIL(c, "index_add: index %s has rank %d; expected 1",
			    opnd(c, 1, b, sizeof b), idx->rank);
	if (src->rank != x->rank)
		return FAIL(c, "index_add: source %s has rank %d; expected %d",
			    opnd(c, 2, b, sizeof b), src->rank, x->rank);
	for (int i = 0; i < x->rank; i++) {
		fz_ext want = i == a->dim ? idx->dims[0] : x->dims[i];
		if (!fz_ext_eq(src->dims[i], want))
			return FAIL(c, "index_add: source extent %s in dim %d; "
				    "expected %s", ext_s(c, src->dims[i], e1, sizeof e1),
				    i, ext_s(c, want, e2, sizeof e2));
	}
	out[0] = *x;
	return 1;
}

/* torch.matmul: 1-D operands are promoted (and the promoted dim dropped from
 * the result); batch dims broadcast. */
static int infer_matmul(const ctx *c, fz_type *out)
{
	const fz_type *a = &c->in[0]->type, *b = &c->in[1]->type;
	char e1[128], e2[128];
	if (check_dtype_flags(c, 0, FL_NOBOOL) < 0 || same_dtype(c, 1, 0) < 0)
		return -1;
	if (a->rank == 0 || b->rank == 0)
		return FAIL(c, "matmul: operand %d is rank 0; expected rank >= 1",
			    a->rank == 0 ? 1 : 2);
	fz_ext one = fz_ext_const(1);
	fz_ext ak = a->dims[a->rank - 1];
	fz_ext bk = b->rank == 1 ? b->dims[0] : b->dims[b->rank - 2];
	if (!fz_ext_eq(ak, bk))
		return FAIL(c, "matmul: contracted extents differ: %s (operand 1) "
			    "and %s (operand 2)", ext_s(c, ak, e1, sizeof e1),
			    ext_s(c, bk, e2, sizeof e2));
	int abatch = a->rank > 2 ? a->rank - 2 : 0;
	int bbatch = b->rank > 2 ? b->rank - 2 : 0;
	int nb = abatch > bbatch ? abatch : bbatch;
	fz_type *o = &out[0];
	o->dtype = a->dtype;
	o->rank = 0;
	for (int i = 0; i < nb; i++) {
		int ia = i - (nb - abatch), ib = i - (nb - bbatch);
		fz_ext ea = ia >= 0 ? a->dims[ia] : one;
		fz_ext eb = ib >= 0 ? b->dims[ib] : one;
		if (!fz_ext_eq(ea, eb) && !fz_ext_eq(ea, one) && !fz_ext_eq(eb, one))
			return FAIL(c, "matmul: batch extents %s and %s do not "
				    "broadcast", ext_s(c, ea, e1, sizeof e1),
				    ext_s(c, eb, e2, sizeof e2));
		o->dims[o->rank++] = fz_ext_eq(ea, one) ? eb : ea;
	}
	if (a->rank >= 2)
		o->dims[o->rank++] = a->dims[a->rank - 2];
	if (b->rank >= 2)
		o->dims[o->rank++] = b->dims[b->rank - 1];
	return 1;
}

static int infer_linear(const ctx *c, int n_in, fz_type *out)
{
	const fz_type *x = &c->in[0]->type, *w = &c->in[1]->type;
	char b[400], e1[128], e2[128];
	if (check_dtype_flags(c, 0, FL_NOBOOL) < 0 || same_dtype(c, 1, 0) < 0)
		return -1;
	if (x->rank < 1)
		return FAIL(c, "linear: input is rank 0; expected rank >= 1");
	if (w->rank != 2)
		return FAIL(c, "linear: weight %s has rank %d; expected 2 ([out, in])",
			    opnd(c, 1, b, sizeof b), w->rank);
	if (!fz_ext_eq(x->dims[x->rank - 1], w->dims[1]))
		return FAIL(c, "linear: input features %s differ from the weight's "
			    "%s (weight is [out, in])",
			    ext_s(c, x->dims[x->rank - 1], e1, sizeof e1),
			    ext_s(c, w->dims[1], e2, sizeof e2));
	if (n_in == 3) {
		const fz_type *bias = &c->in[2]->type;
		if (same_dtype(c, 2, 0) < 0)
			return -1;
		if (bias->rank != 1 || !fz_ext_eq(bias->dims[0], w->dims[0]))
			return FAIL(c, "linear: bias %s; expected shape [%s]",
				    opnd(c, 2, b, sizeof b),
				    ext_s(c, w->dims[0], e1, sizeof e1));
	}
	out[0] = *x;
	out[0].dims[x->rank - 1] = w->dims[0];
	return 1;
}

static int infer_collective(const ctx *c, const fz_attrs *a, fz_type *out)
{
	const fz_type *x = &c->in[0]->type;
	char e[128];
	int world = c->t->world;
	if (check_dtype_flags(c, 0, fz_ops[c->op].flags) < 0)
		return -1;
	out[0] = *x;
	out[0].future = true;
	if (c->op == FZ_OP_ALL_REDUCE)
		return 1;
	if (check_dim(c, "dim", a->dim, x->rank) < 0)
		return -1;
	fz_ext d = x->dims[a->dim], w = fz_ext_const(world);
	bool ok = c->op == FZ_OP_ALL_GATHER ? fz_ext_mul(d, w, &out[0].dims[a->dim])
					    : fz_ext_div(d, w, &out[0].dims[a->dim]);
	if (!ok)
		return FAIL(c, "%s: extent %s in dim %d %s the world size %d",
			    fz_ops[c->op].name, ext_s(c, d, e, sizeof e), a->dim,
			    c->op == FZ_OP_ALL_GATHER ? "overflows when multiplied by"
						      : "is not divisible by", world);
	return 1;
}

/* attention(q, k, v, mask?) -> o, lse; attention_dq(q, k, v, o, lse, do,
 * mask?) -> dq; attention_dkv(...) -> dk, dv. q [batch..., Hq, Tq, D],
 * k [batch..., Hkv, Tk, D], v [batch..., Hkv, Tk, Dv], Hq a multiple of
 * Hkv; o and do [batch..., Hq, Tq, Dv], lse f32 [batch..., Hq, Tq]; the
 * mask bool or of q's dtype, broadcastable to [batch..., Hq, Tq, Tk]. */
static int infer_attention(const ctx *c, int n_in, const fz_attrs *a, fz_type *out)
{
	char b[400], e1[128], e2[128];
	const char *name = fz_ops[c->op].name;
	bool fwd = c->op == FZ_OP_ATTENTION;
	int n_main = fwd ? 3 : 6;
	const fz_type *q = &c->in[0]->type, *k = &c->in[1]->type, *v = &c->in[2]->type;
	fz_dtype d = q->dtype;
	if (d != FZ_F32 && d != FZ_BF16 && d != FZ_F16 && d != FZ_F64)
		return FAIL(c, "%s: %s has dtype %s; expected f64, f32, f16 or bf16",
			    name, opnd(c, 0, b, sizeof b), fz_dtype_name(d));
	int r = q->rank;
	if (r < 3 || k->rank != r || v->rank != r)
		return FAIL(c, "%s: q, k and v must have one rank of at least 3 "
			    "([batch..., heads, length, head dim]); got %d, %d, %d",
			    name, q->rank, k->rank, v->rank);
	for (int i = 1; i < 3; i++)
		if (c->in[i]->type.dtype != d)
			return FAIL(c, "%s: %s has dtype %s; expected %s like q", name,
				    opnd(c, i, b, sizeof b),
				    fz_dtype_name(c->in[i]->type.dtype), fz_dtype_name(d));
	for (int i = 0; i < r - 3; i++)
		for (int j = 1; j < 3; j++)
			if (!fz_ext_eq(c->in[j]->type.dims[i], q->dims[i]))
				return FAIL(c, "%s: %s has batch extent %s in dim %d; "
					    "expected %s like q", name, opnd(c, j, b, sizeof b),
					    ext_s(c, c->in[j]->type.dims[i], e1, sizeof e1), i,
					    ext_s(c, q->dims[i], e2, sizeof e2));
	fz_ext hq = q->dims[r - 3], hkv = k->dims[r - 3], grp;
	if (!fz_ext_eq(v->dims[r - 3], hkv) || !fz_ext_eq(v->dims[r - 2], k->dims[r - 2]))
		return FAIL(c, "%s: v (%s) must have the heads and length of k", name,
			    opnd(c, 2, b, sizeof b));
	if (!fz_ext_eq(k->dims[r - 1], q->dims[r - 1]))
		return FAIL(c, "%s: k's head dim %s differs from q's %s", name,
			    ext_s(c, k->dims[r - 1], e1, sizeof e1),
			    ext_s(c, q->dims[r - 1], e2, sizeof e2));
	if (!fz_ext_is_const(q->dims[r - 1]) || !fz_ext_is_const(v->dims[r - 1]) ||
	    q->dims[r - 1].c < 1 || v->dims[r - 1].c < 1)
		return FAIL(c, "%s: the head dims must be concrete and positive", name);
	if (!fz_ext_div(hq, hkv, &grp) || !fz_ext_is_const(grp) || grp.c < 1)
		return FAIL(c, "%s: q's %s heads are not a multiple of k's %s", name,
			    ext_s(c, hq, e1, sizeof e1), ext_s(c, hkv, e2, sizeof e2));
	if (a->window < 0 || a->softcap < 0 || !(a->scale == a->scale))
		return FAIL(c, "%s: window and softcap must be >= 0 and scale a number",
			    name);
	fz_type o = *q, lse = *q;
	o.dims[r - 1] = v->dims[r - 1];
	lse.dtype = d == FZ_F64 ? FZ_F64 : FZ_F32;
	lse.rank = r - 1;
	if (!fwd) {
		const fz_type *want[3] = {&o, &lse, &o};
		for (int i = 0; i < 3; i++) {
			fz_type got = c->in[3 + i]->type;
			got.future = false;
			if (!fz_type_eq(&got, want[i])) {
				char t1[200];
				fz_type_str(c->t, want[i], t1, sizeof t1);
				return FAIL(c, "%s: %s; expected %s (%s)", name,
					    opnd(c, 3 + i, b, sizeof b), t1,
					    i == 0 ? "o" : i == 1 ? "lse" : "do");
			}
		}
	}
	if (n_in > n_main) {
		const fz_type *m = &c->in[n_main]->type;
		fz_ext one = fz_ext_const(1);
		if (m->dtype != FZ_BOOL && m->dtype != d)
			return FAIL(c, "%s: the mask %s has dtype %s; expected bool or %s",
				    name, opnd(c, n_main, b, sizeof b),
				    fz_dtype_name(m->dtype), fz_dtype_name(d));
		if (m->rank > r)
			return FAIL(c, "%s: the mask %s has rank %d; at most %d", name,
				    opnd(c, n_main, b, sizeof b), m->rank, r);
		for (int i = 0; i < m->rank; i++) {
			int qd = r - m->rank + i;
			fz_ext want = qd == r - 1 ? k->dims[r - 2] : q->dims[qd];
			if (!fz_ext_eq(m->dims[i], one) && !fz_ext_eq(m->dims[i], want))
				return FAIL(c, "%s: the mask %s does not broadcast to the "
					    "scores: extent %s in its dim %d, expected %s or 1",
					    name, opnd(c, n_main, b, sizeof b),
					    ext_s(c, m->dims[i], e1, sizeof e1), i,
					    ext_s(c, want, e2, sizeof e2));
		}
	}
	switch (c->op) {
	case FZ_OP_ATTENTION:
		out[0] = o;
		out[1] = lse;
		return 2;
	case FZ_OP_ATTENTION_DQ:
		out[0] = *q;
		return 1;
	default:
		out[0] = *k;
		out[1] = *v;
		return 2;
	}
}

int fz_infer(const fz_trace *t, fz_opcode op, fz_value *const *in, int n_in,
	     const fz_attrs *a, fz_type *out, char *err, size_t errlen)
{
	ctx c = {t, op, in, err, errlen};
	const fz_opinfo *oi = &fz_ops[op];
	char b[400];
	if (oi->cls == FZ_CLASS_COMPOSITE)
		return FAIL(&c, "%s: composite op in the IR", oi->name);
	if (n_in < oi->min_args || (oi->max_args >= 0 && n_in > oi->max_args)) {
		char most[32] = "";
		if (oi->max_args < 0)
			snprintf(most, sizeof most, " or more");
		else if (oi->max_args != oi->min_args)
			snprintf(most, sizeof most, " to %d", oi->max_args);
		return FAIL(&c, "%s: %d operands; expected %d%s", oi->name, n_in,
			    oi->min_args, most);
	}
	for (int i = 0; i < n_in; i++) {
		bool fut = in[i]->type.future;
		if (op == FZ_OP_WAIT && !fut)
			return FAIL(&c, "wait: %s is not a future; expected the result"
				    " of a collective", opnd(&c, i, b, sizeof b));
		if (op != FZ_OP_WAIT && fut)
			return FAIL(&c, "%s: %s is a future; wait on it first",
				    oi->name, opnd(&c, i, b, sizeof b));
	}
	memset(out, 0, sizeof(fz_type) * ((oi->flags & FL_TWO_RESULTS) ? 2 : 1));
	switch (oi->cls) {
	case FZ_CLASS_UNARY:
	case FZ_CLASS_BINARY:
	case FZ_CLASS_TERNARY:
		return infer_elementwise(&c, n_in, a, out);
	case FZ_CLASS_CREATION:
		return infer_creation(&c, n_in, a, out);
	case FZ_CLASS_META:
		switch (op) {
		case FZ_OP_BROADCAST_IN_DIM: return infer_broadcast(&c, a, out);
		case FZ_OP_RESHAPE: return infer_reshape(&c, a, out);
		case FZ_OP_PERMUTE: return infer_permute(&c, a, out);
		case FZ_OP_SLICE: return infer_slice(&c, a, out);
		case FZ_OP_SQUEEZE: return infer_squeeze(&c, a, out);
		case FZ_OP_UNSQUEEZE: return infer_unsqueeze(&c, a, out);
		case FZ_OP_CAT: return infer_cat(&c, n_in, a, out);
		default: break;
		}
		break;
	case FZ_CLASS_REDUCTION:
		return infer_reduction(&c, a, out);
	case FZ_CLASS_SCAN:
		return infer_scan(&c, a, out);
	case FZ_CLASS_SELECT:
		return infer_select(&c, a, out);
	case FZ_CLASS_INDEXING:
		if (op == FZ_OP_TAKE)
			return infer_take(&c, a, out);
		if (op == FZ_OP_TAKE_ALONG)
			return infer_take_along(&c, a, out);
		return infer_index_add(&c, a, out);
	case FZ_CLASS_LIBRARY:
		return op == FZ_OP_MATMUL ? infer_matmul(&c, out)
					  : infer_linear(&c, n_in, out);
	case FZ_CLASS_COLLECTIVE:
		return infer_collective(&c, a, out);
	case FZ_CLASS_ATTENTION:
		return infer_attention(&c, n_in, a, out);
	case FZ_CLASS_WAIT:
		out[0] = in[0]->type;
		out[0].future = false;
		return 1;
	default:
		break;
	}
	return FAIL(&c, "%s: no inference rule", oi->name);
}
