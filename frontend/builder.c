/*
 * builder.c: the one path into the IR.
 *
 * The parser and every framework binding build traces through fz_opcode, which
 * turns what a person writes into what the later stages want to see:
 *
 *   - attributes are checked against the op's schema in ops.def (unknown,
 *     missing, repeated, ill-typed) and filled with defaults, and negative
 *     dims are normalized, so a node's attributes are complete and plain;
 *   - a number literal becomes a rank-0 `full` of the dtype of the tensor
 *     beside it;
 *   - numpy broadcasting becomes explicit `broadcast_in_dim` nodes, so
 *     elementwise nodes in the IR always have operands of one shape;
 *   - composite ops are lowered to primitives (lower.c).
 *
 *     r = rsqrt(add(ms, 1e-5))        with ms: f32[B, T, 1]
 *  becomes
 *     _1 = full(shape=[], value=1e-05, dtype=f32)
 *     _2 = broadcast_in_dim(_1, shape=[B, T, 1], dims=[])
 *     _3 = add(ms, _2)
 *     r  = rsqrt(_3)
 *
 * If anything fails halfway (a composite whose third step is ill-typed), the
 * nodes already added are rolled back, so a failed fz_opcode leaves the trace
 * as it was and the message in fz_trace_error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder.h"

/* ---- attributes ---- */

enum { K_DTYPE, K_EXTS, K_EXT, K_INTS, K_INT, K_BOOL, K_SCALAR, K_NAME, K_FLOAT };

static const int attr_kinds[FZ_ATTR_COUNT] = {
#define ATTR(id, key, kind) [FZ_ATTR_##id] = K_##kind,
	FZ_ATTRS(ATTR)
#undef ATTR
};

static bool value_as_int(const fz_attr_value *v, int64_t *out)
{
	if (v->kind == FZ_AV_INT) {
		*out = v->i;
		return true;
	}
	if (v->kind == FZ_AV_FLOAT && v->f == floor(v->f) && fabs(v->f) < 9e18) {
		*out = (int64_t)v->f;
		return true;
	}
	return false;
}

/* An extent written as a name: "B", a product "2*B*T", or a sum of
 * products "B*T+2", "T-1" (a derived symbol: type.c). */
static bool parse_ext_name(fz_trace *t, const char *s, fz_ext *out)
{
	return fz_trace_ext_parse(t, s, out);
}

static int list_items(fz_trace *t, const char *op, const char *key,
		      const fz_attr_value *v)
{
	if (v->kind != FZ_AV_LIST)
		return fz_fail(t, "%s: attribute '%s' must be a list", op, key);
	if (v->n > FZ_MAX_RANK || v->n < 0)
		return fz_fail(t, "%s: attribute '%s' has %d entries; at most %d",
			       op, key, v->n, FZ_MAX_RANK);
	return v->n;
}

static int convert_attr(fz_trace *t, const char *op, fz_attr_id id,
			const fz_attr_value *v, fz_attrs *a)
{
	const char *key = fz_attr_names[id];
	int64_t iv;
	int n;
	switch (attr_kinds[id]) {
	case K_DTYPE:
		if (v->kind == FZ_AV_DTYPE && (unsigned)v->i < FZ_DTYPE_COUNT) {
			a->dtype = (fz_dtype)v->i;
			return 0;
		}
		if (v->kind == FZ_AV_NAME && fz_dtype_from_name(v->name, &a->dtype))
			return 0;
		return fz_fail(t, "%s: attribute 'dtype' must be a dtype (f64, f32, "
			       "f16, bf16, i64, i32, i8, u8, bool)", op);
	case K_EXTS: {
		if ((n = list_items(t, op, key, v)) < 0)
			return -1;
		fz_ext *e = fz_arena_alloc(&t->arena, sizeof *e * (size_t)(n + 1));
		if (!e)
			return fz_fail(t, "out of memory");
		for (int i = 0; i < n; i++) {
			const fz_attr_value *it = &v->items[i];
			if (value_as_int(it, &iv) && iv >= -1)
				e[i] = fz_ext_const(iv);
			else if (it->kind == FZ_AV_NAME && parse_ext_name(t, it->name, &e[i]))
				;
			else
				return fz_fail(t, "%s: entry %d of '%s' must be an extent "
					       "(a non-negative integer or an extent name)",
					       op, i, key);
		}
		if (id == FZ_ATTR_SHAPE) {
			a->shape = e;
			a->n_shape = n;
		} else {
			a->end = e;
			a->n_slice = n;
		}
		return 0;
	}
	case K_INTS: {
		if ((n = list_items(t, op, key, v)) < 0)
			return -1;
		int64_t *l = fz_arena_alloc(&t->arena, sizeof *l * (size_t)(n + 1));
		if (!l)
			return fz_fail(t, "out of memory");
		for (int i = 0; i < n; i++) {
			if (!value_as_int(&v->items[i], &l[i]))
				return fz_fail(t, "%s: entry %d of '%s' must be an integer",
					       op, i, key);
			/* dims are ints; slice bounds and steps are int64, and
			 * the op's inference checks them against the extent */
			if (id == FZ_ATTR_DIMS && (l[i] < INT32_MIN || l[i] > INT32_MAX))
				return fz_fail(t, "%s: entry %d of '%s' is %lld, out of "
					       "range for a dim", op, i, key, (long long)l[i]);
		}
		if (id == FZ_ATTR_DIMS) {
			a->dims = fz_arena_alloc(&t->arena, sizeof(int) * (size_t)(n + 1));
			if (!a->dims)
				return fz_fail(t, "out of memory");
			for (int i = 0; i < n; i++)
				a->dims[i] = (int)l[i];
			a->n_dims = n;
		} else if (id == FZ_ATTR_START) {
			a->start = l;
			a->n_slice = a->n_slice ? a->n_slice : n;
		} else {
			a->step = l;
		}
		return n;
	}
	case K_EXT:
		if (value_as_int(v, &iv) && iv >= 0)
			a->length = fz_ext_const(iv);
		else if (!(v->kind == FZ_AV_NAME && parse_ext_name(t, v->name, &a->length)))
			return fz_fail(t, "%s: attribute '%s' must be an extent (a "
				       "non-negative integer or an extent name)", op, key);
		return 0;
	case K_INT:
		if (!value_as_int(v, &iv))
			return fz_fail(t, "%s: attribute '%s' must be an integer", op, key);
		if (id == FZ_ATTR_DIM) {
			if (iv < INT32_MIN || iv > INT32_MAX)
				return fz_fail(t, "%s: dim %lld is out of range", op,
					       (long long)iv);
			a->dim = (int)iv;
		} else if (id == FZ_ATTR_SEED) {
			a->seed = iv;
		} else if (id == FZ_ATTR_OFFSET) {
			a->offset = iv;
		} else if (id == FZ_ATTR_K) {
			a->k = iv;
		} else if (id == FZ_ATTR_WINDOW) {
			a->window = iv;
		} else {
			a->correction = iv;
		}
		return 0;
	case K_BOOL:
		if (v->kind != FZ_AV_BOOL)
			return fz_fail(t, "%s: attribute '%s' must be true or false", op,
				       key);
		if (id == FZ_ATTR_CAUSAL)
			a->causal = v->i != 0;
		else
			a->keepdim = v->i != 0;
		return 0;
	case K_SCALAR:
		if (v->kind == FZ_AV_INT || v->kind == FZ_AV_BOOL) {
			a->value = (double)v->i;
			return 0;
		}
		if (v->kind == FZ_AV_FLOAT) {
			a->value = v->f;
			return 0;
		}
		fz_ext ve;
		if (v->kind == FZ_AV_NAME && parse_ext_name(t, v->name, &ve) &&
		    fz_ext_as_sym(ve) >= 0) {
			a->value_sym = fz_ext_as_sym(ve);
			return 0;
		}
		return fz_fail(t, "%s: attribute 'value' must be a number or an "
			       "extent name", op);
	case K_NAME:
		if (v->kind == FZ_AV_NAME && strcmp(v->name, "none") == 0)
			a->approximate = FZ_APPROX_NONE;
		else if (v->kind == FZ_AV_NAME && strcmp(v->name, "tanh") == 0)
			a->approximate = FZ_APPROX_TANH;
		else
			return fz_fail(t, "%s: attribute 'approximate' must be none or "
				       "tanh", op);
		return 0;
	case K_FLOAT:
		if (v->kind == FZ_AV_FLOAT || v->kind == FZ_AV_INT) {
			double f = v->kind == FZ_AV_FLOAT ? v->f : (double)v->i;
			if (id == FZ_ATTR_SCALE)
				a->scale = f;
			else if (id == FZ_ATTR_SOFTCAP)
				a->softcap = f;
			else
				a->eps = f;
			return 0;
		}
		return fz_fail(t, "%s: attribute '%s' must be a number", op, key);
	}
	return fz_fail(t, "%s: bad attribute '%s'", op, key);
}

static void attr_list(const fz_opinfo *oi, unsigned mask, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	for (int i = 0; i < FZ_ATTR_COUNT && len < n; i++)
		if (mask & (1u << i))
			len += (size_t)snprintf(buf + len, n - len, "%s%s",
						len ? ", " : "", fz_attr_names[i]);
	if (!len)
		snprintf(buf, n, "none");
}

static int convert_attrs(fz_trace *t, fz_opcode op, const fz_attr *attrs, int n,
			 fz_attrs *a)
{
	const fz_opinfo *oi = &fz_ops[op];
	char list[256];
	int n_step = -1, n_start = -1;
	memset(a, 0, sizeof *a);
	a->value_sym = -1;
	a->eps = 1e-5;
	for (int i = 0; i < n; i++) {
		fz_attr_id id;
		if (!attrs[i].key || !fz_attr_from_name(attrs[i].key, &id) ||
		    !(oi->attrs & (1u << id))) {
			attr_list(oi, oi->attrs, list, sizeof list);
			return fz_fail(t, "%s: unknown attribute '%s'; %s takes: %s",
				       oi->name, attrs[i].key ? attrs[i].key : "",
				       oi->name, list);
		}
		if (a->present & (1u << id))
			return fz_fail(t, "%s: attribute '%s' given twice", oi->name,
				       attrs[i].key);
		int r = convert_attr(t, oi->name, id, &attrs[i].value, a);
		if (r < 0)
			return -1;
		if (id == FZ_ATTR_STEP)
			n_step = r;
		if (id == FZ_ATTR_START)
			n_start = r;
		a->present |= 1u << id;
	}
	unsigned missing = oi->required & ~a->present;
	if (missing) {
		attr_list(oi, missing, list, sizeof list);
		return fz_fail(t, "%s: missing attribute%s %s", oi->name,
			       (missing & (missing - 1)) ? "s" : "", list);
	}
	if (op == FZ_OP_SLICE) {
		int ne = a->n_slice;
		a->n_slice = n_start;
		if (ne != n_start || (n_step >= 0 && n_step != n_start))
			return fz_fail(t, "slice: start, end and step must have the same "
				       "length");
		if (n_step < 0) {
			a->step = fz_arena_alloc(&t->arena, sizeof(int64_t) *
						 (size_t)(n_start + 1));
			if (!a->step)
				return fz_fail(t, "out of memory");
			for (int i = 0; i < n_start; i++)
				a->step[i] = 1;
		}
	}
	return 0;
}

/* Python-style negative dims, relative to `rank`; out-of-range ones are left
 * for inference to report. */
static int norm_dim(int d, int rank)
{
	return d < 0 && d >= -rank ? d + rank : d;
}

static int resolve_reshape(fz_trace *t, const fz_value *x, fz_attrs *a)
{
	int hole = -1;
	fz_ext known = fz_ext_const(1), total;
	for (int i = 0; i < a->n_shape; i++) {
		if (fz_ext_eq(a->shape[i], fz_ext_const(-1))) {
			if (hole >= 0)
				return fz_fail(t, "reshape: more than one -1 in shape");
			hole = i;
		} else if (!fz_ext_mul(known, a->shape[i], &known)) {
			return fz_fail(t, "reshape: the element count of the shape "
				       "overflows");
		}
	}
	if (hole < 0)
		return 0;
	if (!fz_type_numel(&x->type, &total))
		return fz_fail(t, "reshape: element count overflows");
	char e1[128], e2[128];
	fz_poly p;
	if ((known.c == 0 && known.syms == 0) ||
	    !fz_ext_div(total, known, &a->shape[hole]) ||
	    !fz_ext_expand(t, a->shape[hole], &p) ||
	    !fz_trace_ext_of_poly(t, &p, &a->shape[hole]))
		return fz_fail(t, "reshape: cannot infer -1: %s elements do not "
			       "divide by %s", fz_ext_str(t, total, e1, sizeof e1),
			       fz_ext_str(t, known, e2, sizeof e2));
	return 0;
}

static void normalize(fz_opcode op, fz_value **in, int n_in, fz_attrs *a)
{
	int rank = n_in ? in[0]->type.rank : 0;
	int drank = op == FZ_OP_BROADCAST_IN_DIM ? a->n_shape : rank;
	for (int i = 0; i < a->n_dims; i++)
		a->dims[i] = norm_dim(a->dims[i], drank);
	a->dim = norm_dim(a->dim, op == FZ_OP_UNSQUEEZE ? rank + 1 : rank);
}

/*
 * index_add of f16/bf16 sums in f32 and rounds once, as every reduction of
 * a half dtype does. A scatter adds into its output one source row at a
 * time (atomics on the GPU), so in the storage dtype each repeated index
 * would round again: the embedding backward of bf16 training adds
 * thousands of rows into one, and drifts by several ulps. Written as
 *
 *     y = index_add(x, i, s)    ->    y = cast(index_add(cast(x, f32), i,
 *                                                        cast(s, f32)), bf16)
 *
 * the accumulator is a buffer of f32 the size of the output, which the
 * memory planner owns like any other.
 */
static fz_value *index_add_in_f32(fz_trace *t, fz_value **in, const fz_attrs *a)
{
	fz_dtype d = in[0]->type.dtype;
	fz_value *w[3] = {fz_b_cast(t, in[0], FZ_F32), in[1],
			  fz_b_cast(t, in[2], FZ_F32)};
	if (!w[0] || !w[2])
		return NULL;
	fz_node *nd = fz_node_add(t, FZ_OP_INDEX_ADD, w, 3, a);
	return nd ? fz_b_cast(t, nd->out[0], d) : NULL;
}

/* ---- operands: literals and broadcasting ---- */

static fz_value *add1(fz_trace *t, fz_opcode op, fz_value **in, int n,
		      const fz_attrs *a)
{
	for (int i = 0; i < n; i++)
		if (!in[i])
			return NULL;
	fz_node *nd = fz_node_add(t, op, in, n, a);
	return nd ? nd->out[0] : NULL;
}

fz_value *fz_b_scalar(fz_trace *t, double v, fz_dtype d)
{
	fz_attrs a = {.present = AT(SHAPE) | AT(VALUE) | AT(DTYPE), .dtype = d,
		      .value = v, .value_sym = -1};
	return add1(t, FZ_OP_FULL, NULL, 0, &a);
}

fz_value *fz_b_full_sym(fz_trace *t, int sym, fz_dtype d)
{
	fz_attrs a = {.present = AT(SHAPE) | AT(VALUE) | AT(DTYPE), .dtype = d,
		      .value_sym = sym};
	return add1(t, FZ_OP_FULL, NULL, 0, &a);
}

/* x broadcast to shape (numpy: aligned to the right). */
static fz_value *broadcast_to(fz_trace *t, fz_value *x, const fz_type *shape)
{
	if (!x)
		return NULL;
	fz_type want = *shape;
	want.dtype = x->type.dtype;
	if (fz_type_eq(&x->type, &want))
		return x;
	int dims[FZ_MAX_RANK];
	int off = shape->rank - x->type.rank;
	for (int i = 0; i < x->type.rank; i++)
		dims[i] = off + i;
	fz_attrs a = {.present = AT(SHAPE) | AT(DIMS), .n_shape = shape->rank,
		      .shape = (fz_ext *)shape->dims, .n_dims = x->type.rank,
		      .dims = dims, .value_sym = -1};
	return add1(t, FZ_OP_BROADCAST_IN_DIM, &x, 1, &a);
}

/* The numpy broadcast shape of in[first..n). */
static int broadcast_shape(fz_trace *t, fz_opcode op, fz_value **in, int first,
			   int n, fz_type *out)
{
	memset(out, 0, sizeof *out);
	for (int i = first; i < n; i++)
		if (in[i]->type.rank > out->rank)
			out->rank = in[i]->type.rank;
	fz_ext one = fz_ext_const(1);
	for (int d = 0; d < out->rank; d++)
		out->dims[d] = one;
	for (int i = first; i < n; i++) {
		const fz_type *ty = &in[i]->type;
		int off = out->rank - ty->rank;
		for (int d = 0; d < ty->rank; d++) {
			fz_ext *o = &out->dims[off + d], e = ty->dims[d];
			if (fz_ext_eq(*o, e) || fz_ext_eq(e, one))
				continue;
			if (fz_ext_eq(*o, one)) {
				*o = e;
				continue;
			}
			char e1[128], e2[128];
			return fz_fail(t, "%s: operands do not broadcast: operand %d has "
				       "extent %s where another has %s", fz_ops[op].name,
				       i + 1, fz_ext_str(t, e, e1, sizeof e1),
				       fz_ext_str(t, *o, e2, sizeof e2));
		}
	}
	return 0;
}

static int broadcast_operands(fz_trace *t, fz_opcode op, fz_value **in, int n)
{
	fz_type shape;
	if (broadcast_shape(t, op, in, 0, n, &shape) < 0)
		return -1;
	for (int i = 0; i < n; i++)
		if (!(in[i] = broadcast_to(t, in[i], &shape)))
			return -1;
	return 0;
}

/* Turns number literals into rank-0 constants of the neighbour's dtype. */
static int resolve_literals(fz_trace *t, fz_opcode op, const fz_arg *args, int n,
			    fz_value **in)
{
	int first = op == FZ_OP_WHERE ? 1 : 0;
	fz_value *donor = NULL;
	int donor_i = 0;
	for (int i = first; i < n && !donor; i++)
		if (args[i].kind == FZ_ARG_VALUE)
			donor = args[donor_i = i].value;
	for (int i = 0; i < n; i++) {
		if (args[i].kind == FZ_ARG_VALUE) {
			in[i] = args[i].value;
			continue;
		}
		fz_dtype d = op == FZ_OP_WHERE && i == 0 ? FZ_BOOL
			   : donor ? donor->type.dtype : FZ_DTYPE_COUNT;
		if (d == FZ_DTYPE_COUNT)
			return fz_fail(t, "%s: every operand is a number; one must be a "
				       "tensor to give the numbers a dtype",
				       fz_ops[op].name);
		double v = args[i].number;
		if (!fz_dtype_is_float(d) && v != floor(v))
			return fz_fail(t, "%s: operand %d, the number %g, is not an "
				       "integer, but it takes the dtype %s of operand "
				       "%d", fz_ops[op].name, i + 1, v, fz_dtype_name(d),
				       donor_i + 1);
		if (!(in[i] = fz_b_scalar(t, v, d)))
			return -1;
	}
	return 0;
}

/* ---- fz_opcode ---- */

static int op_inner(fz_trace *t, fz_opcode op, const fz_arg *args, int nargs,
		    const fz_attr *attrs, int nattrs, fz_value **outs,
		    int max_outs)
{
	const fz_opinfo *oi = &fz_ops[op];
	fz_value *in[FZ_MAX_ARGS];
	double nums[3] = {0};
	fz_attrs a;

	if (nargs < oi->min_args || (oi->max_args >= 0 && nargs > oi->max_args) ||
	    nargs > FZ_MAX_ARGS) {
		if (oi->max_args < 0)
			return fz_fail(t, "%s: %d operands; expected %d or more (at most "
				       "%d)", oi->name, nargs, oi->min_args, FZ_MAX_ARGS);
		if (oi->min_args == oi->max_args)
			return fz_fail(t, "%s: %d operand%s; expected %d", oi->name, nargs,
				       nargs == 1 ? "" : "s", oi->min_args);
		return fz_fail(t, "%s: %d operands; expected %d to %d", oi->name,
			       nargs, oi->min_args, oi->max_args);
	}
	for (int i = 0; i < nargs; i++)
		if (args[i].kind == FZ_ARG_VALUE && !args[i].value)
			return fz_fail(t, "%s: operand %d is NULL", oi->name, i + 1);
	if (convert_attrs(t, op, attrs, nattrs, &a) < 0)
		return -1;

	bool literal_ok = fz_op_is_elementwise(op) ||
			  (oi->cls == FZ_CLASS_COMPOSITE && op != FZ_OP_TRANSPOSE &&
			   op != FZ_OP_CROSS_ENTROPY && op != FZ_OP_LAYER_NORM &&
			   op != FZ_OP_RMS_NORM);
	if (op == FZ_OP_TRANSPOSE) {
		if (args[0].kind != FZ_ARG_VALUE || args[1].kind != FZ_ARG_NUMBER ||
		    args[2].kind != FZ_ARG_NUMBER || !args[1].is_int || !args[2].is_int)
			return fz_fail(t, "transpose: expected transpose(x, d0, d1) with "
				       "integer dims");
		in[0] = args[0].value;
		nums[1] = args[1].number;
		nums[2] = args[2].number;
	} else if (literal_ok) {
		if (resolve_literals(t, op, args, nargs, in) < 0)
			return -1;
	} else {
		for (int i = 0; i < nargs; i++) {
			if (args[i].kind != FZ_ARG_VALUE)
				return fz_fail(t, "%s: operand %d is a number; expected a "
					       "tensor", oi->name, i + 1);
			in[i] = args[i].value;
		}
	}
	normalize(op, in, nargs, &a);
	if (op == FZ_OP_RESHAPE && resolve_reshape(t, in[0], &a) < 0)
		return -1;
	/* attention's scale defaults to 1/sqrt(D), written out from here on */
	if (oi->cls == FZ_CLASS_ATTENTION && !(a.present & AT(SCALE))) {
		const fz_type *q = &in[0]->type;
		if (q->rank >= 1 && fz_ext_is_const(q->dims[q->rank - 1]) &&
		    q->dims[q->rank - 1].c > 0)
			a.scale = 1.0 / sqrt((double)q->dims[q->rank - 1].c);
		a.present |= AT(SCALE);
	}

	fz_value *res[2] = {NULL, NULL};
	int n_out = 1;
	/* a composite, and an index_add of f16/bf16 (index_add_in_f32), are
	 * written as primitives, each node marked with what it came from */
	bool half_index_add = op == FZ_OP_INDEX_ADD && nargs == 3 &&
			      (in[0]->type.dtype == FZ_F16 ||
			       in[0]->type.dtype == FZ_BF16) &&
			      in[2]->type.dtype == in[0]->type.dtype;
	if (oi->cls == FZ_CLASS_COMPOSITE || half_index_add) {
		if (!half_index_add && op != FZ_OP_TRANSPOSE &&
		    op != FZ_OP_CROSS_ENTROPY && op != FZ_OP_LAYER_NORM &&
		    op != FZ_OP_RMS_NORM && broadcast_operands(t, op, in, nargs) < 0)
			return -1;
		int before = t->n_nodes;
		res[0] = half_index_add ? index_add_in_f32(t, in, &a)
					: fz_lower(t, op, in, nargs, nums, &a);
		if (!res[0])
			return -1;
		for (int i = before; i < t->n_nodes; i++)
			t->nodes[i]->origin = op;
	} else {
		if (fz_op_is_elementwise(op) && broadcast_operands(t, op, in, nargs) < 0)
			return -1;
		fz_node *nd = fz_node_add(t, op, in, nargs, &a);
		if (!nd)
			return -1;
		res[0] = nd->out[0];
		res[1] = nd->out[1];
		n_out = nd->n_out;
	}
	if (n_out > max_outs)
		return fz_fail(t, "%s gives %d results; %d %s expected", oi->name,
			       n_out, max_outs, max_outs == 1 ? "was" : "were");
	for (int i = 0; i < n_out; i++)
		outs[i] = res[i];
	return n_out;
}

int fz_op(fz_trace *t, const char *opname, const fz_arg *args, int nargs,
	  const fz_attr *attrs, int nattrs, fz_value **outs, int max_outs)
{
	fz_opcode op;
	t->error[0] = '\0';
	if (!opname || !fz_op_from_name(opname, &op)) {
		fz_fail(t, "unknown op '%s'", opname ? opname : "(null)");
		return -1;
	}
	if (nargs < 0 || (nargs > 0 && !args) || (nattrs > 0 && !attrs) ||
	    !outs || max_outs < 1) {
		fz_fail(t, "%s: bad arguments to fz_opcode", opname);
		return -1;
	}
	int n_nodes = t->n_nodes, n_values = t->n_values;
	int n = op_inner(t, op, args, nargs, attrs, nattrs, outs, max_outs);
	if (n < 0)
		fz_trace_rollback(t, n_nodes, n_values);
	return n;
}

fz_value *fz_op1(fz_trace *t, const char *op, const fz_arg *args, int nargs,
		 const fz_attr *attrs, int nattrs)
{
	fz_value *out;
	return fz_op(t, op, args, nargs, attrs, nattrs, &out, 1) == 1 ? out : NULL;
}

/* ---- helpers for lower.c ---- */

fz_value *fz_b_unary(fz_trace *t, fz_opcode op, fz_value *x)
{
	return add1(t, op, &x, 1, NULL);
}

fz_value *fz_b_binary(fz_trace *t, fz_opcode op, fz_value *a, fz_value *b)
{
	fz_value *in[2] = {a, b};
	if (!a || !b || broadcast_operands(t, op, in, 2) < 0)
		return NULL;
	return add1(t, op, in, 2, NULL);
}

fz_value *fz_b_binary_s(fz_trace *t, fz_opcode op, fz_value *a, double s)
{
	if (!a)
		return NULL;
	return fz_b_binary(t, op, a, fz_b_scalar(t, s, a->type.dtype));
}

fz_value *fz_b_cast(fz_trace *t, fz_value *x, fz_dtype d)
{
	if (!x || x->type.dtype == d)
		return x;
	fz_attrs a = {.present = AT(DTYPE), .dtype = d, .value_sym = -1};
	return add1(t, FZ_OP_CAST, &x, 1, &a);
}

fz_value *fz_b_reduce(fz_trace *t, fz_opcode op, fz_value *x, const int *dims,
		      int n, bool keepdim)
{
	fz_attrs a = {.present = AT(DIMS) | AT(KEEPDIM), .n_dims = n,
		      .dims = (int *)dims, .keepdim = keepdim, .value_sym = -1};
	return add1(t, op, &x, 1, &a);
}

fz_value *fz_b_var_mean(fz_trace *t, fz_value *x, const int *dims, int n,
			int64_t correction, bool keepdim, fz_value **mean)
{
	fz_attrs a = {.present = AT(DIMS) | AT(KEEPDIM) | AT(CORRECTION),
		      .n_dims = n, .dims = (int *)dims, .keepdim = keepdim,
		      .correction = correction, .value_sym = -1};
	*mean = NULL;
	if (!x)
		return NULL;
	fz_node *nd = fz_node_add(t, FZ_OP_VAR_MEAN, &x, 1, &a);
	if (!nd)
		return NULL;
	*mean = nd->out[1];
	return nd->out[0];
}

fz_value *fz_b_unsqueeze(fz_trace *t, fz_value *x, int dim)
{
	fz_attrs a = {.present = AT(DIM), .dim = dim, .value_sym = -1};
	return add1(t, FZ_OP_UNSQUEEZE, &x, 1, &a);
}

fz_value *fz_b_squeeze(fz_trace *t, fz_value *x, const int *dims, int n)
{
	fz_attrs a = {.present = AT(DIMS), .n_dims = n, .dims = (int *)dims,
		      .value_sym = -1};
	return add1(t, FZ_OP_SQUEEZE, &x, 1, &a);
}

fz_value *fz_b_permute(fz_trace *t, fz_value *x, const int *dims)
{
	if (!x)
		return NULL;
	fz_attrs a = {.present = AT(DIMS), .n_dims = x->type.rank,
		      .dims = (int *)dims, .value_sym = -1};
	return add1(t, FZ_OP_PERMUTE, &x, 1, &a);
}

fz_value *fz_b_take_along(fz_trace *t, fz_value *x, fz_value *idx, int dim)
{
	fz_value *in[2] = {x, idx};
	fz_attrs a = {.present = AT(DIM), .dim = dim, .value_sym = -1};
	return add1(t, FZ_OP_TAKE_ALONG, in, 2, &a);
}
