/*
 * verify.c: the whole-trace checks.
 *
 * The builder types each op as it is added, so a trace built through it is
 * well typed one node at a time. The verifier checks what only the whole
 * trace shows, and re-checks what a pass could have broken since:
 *
 *   - every operand is defined before its use (SSA, in node order), by a
 *     parameter or by a node of this trace;
 *   - every node holds a primitive op with a legal operand count, and its
 *     stored result types are what fz_infer says they are;
 *   - every future is waited on, and nothing returned is a future;
 *   - there is a return;
 *   - a derived symbol (an extent like T+1) is defined over free symbols
 *     only, with at least two terms, as fz_trace_ext_of_poly makes it;
 *   - no op that is run (dce.c: dead ones are not) takes the max, the min,
 *     or the index of either, over an extent of 0 into a result with
 *     elements: there is no such number, and PyTorch refuses it too. Here
 *     where the extent is concrete; fz_trace_bind asks again at the bound
 *     sizes (fz_trace_empty_extremum), so a symbol bound to 0 is refused
 *     at run time with the same message, before anything runs.
 *
 * fz_trace_verify_typed(t, false, ...) leaves out the second half of the
 * second check, for a trace the builder has just made and nothing has
 * changed since (the parser's): fz_node_add stored what fz_infer said, and
 * asking it again was a twentieth of parsing a deep trace.
 *
 * Messages name the op and where it was written:
 *     line 7: all_gather: future 'g' is never waited on
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static void where_(const fz_node *nd, char *buf, size_t n)
{
	if (nd && nd->line > 0)
		snprintf(buf, n, "line %d: ", nd->line);
	else
		buf[0] = '\0';
}

/* What node n reduces: its dims as a mask (amax, amin) or its one dim. */
static uint32_t extremum_dims(const fz_node *n)
{
	switch (n->op) {
	case FZ_OP_AMAX:
	case FZ_OP_AMIN: {
		uint32_t m = 0;
		for (int i = 0; i < n->attrs.n_dims; i++)
			if (n->attrs.dims[i] >= 0 && n->attrs.dims[i] < FZ_MAX_RANK)
				m |= 1u << n->attrs.dims[i];
		return m;
	}
	case FZ_OP_ARGMAX:
	case FZ_OP_ARGMIN:
		return n->attrs.dim >= 0 && n->attrs.dim < FZ_MAX_RANK ?
		       1u << n->attrs.dim : 0;
	default:
		return 0;
	}
}

/* Does n reduce an extent of 0 (at syms; NULL: the concrete ones) into a
 * result that has elements (or may have: a symbolic extent unknown)? */
static bool empty_extremum(const fz_node *n, const int64_t *syms, int *dim)
{
	uint32_t m = extremum_dims(n);
	if (!m || n->n_in < 1 || n->n_out < 1)
		return false;
	const fz_type *x = &n->in[0]->type, *y = &n->out[0]->type;
	*dim = -1;
	for (int d = 0; d < x->rank && *dim < 0; d++)
		if ((m >> d & 1) && fz_ext_eval(x->dims[d], syms) == 0)
			*dim = d;
	if (*dim < 0)
		return false;
	for (int d = 0; d < y->rank; d++)
		if (fz_ext_eval(y->dims[d], syms) == 0)
			return false;
	return true;
}

fz_status fz_trace_empty_extremum(const fz_trace *t, const int64_t *syms,
				  char **err)
{
	int dim = -1, first = -1;
	for (int i = 0; i < t->n_nodes && first < 0; i++)
		if (empty_extremum(t->nodes[i], syms, &dim))
			first = i;
	if (first < 0)
		return FZ_OK;
	/* rare: only now is it worth knowing which nodes run */
	bool *live = malloc(sizeof *live * ((size_t)t->n_nodes + 1));
	if (!live || fz_trace_live(t, live) < 0) {
		free(live);
		if (err)
			*err = fz_strdup("out of memory");
		return FZ_ENOMEM;
	}
	const fz_node *n = NULL;
	for (int i = first; i < t->n_nodes && !n; i++)
		if (live[i] && empty_extremum(t->nodes[i], syms, &dim))
			n = t->nodes[i];
	free(live);
	if (!n)
		return FZ_OK;
	/* the verifier's messages start "line N: " (the parser puts its caret
	 * there); at run time the op says where it was written */
	char at[32] = "", op[64], e[128];
	const fz_ext ext = n->in[0]->type.dims[dim];
	if (!syms && n->line > 0) /* the parser puts its caret on the op */
		snprintf(at, sizeof at, "line %d:%d: ", n->line, n->col);
	if (syms && n->line > 0)
		snprintf(op, sizeof op, "%s at %d:%d", fz_ops[n->op].name, n->line, n->col);
	else
		snprintf(op, sizeof op, "%s", fz_ops[n->op].name);
	bool arg = n->op == FZ_OP_ARGMAX || n->op == FZ_OP_ARGMIN;
	bool max = n->op == FZ_OP_AMAX || n->op == FZ_OP_ARGMAX;
	if (err)
		*err = fz_strdup_printf(
			"%s%s: dim %d is empty (extent %s%s): the %s%s of no elements "
			"is undefined (PyTorch refuses it too; softmax, log_softmax and "
			"cross_entropy take the maximum over their dim)", at, op, dim, fz_ext_str(t, ext, e, sizeof e),
			fz_ext_is_const(ext) ? "" : " = 0", arg ? "index of the " : "",
			max ? "maximum" : "minimum");
	return syms ? FZ_ERANGE : FZ_EVERIFY;
}

fz_status fz_trace_verify(const fz_trace *t, char **err)
{
	return fz_trace_verify_typed(t, true, err);
}

fz_status fz_trace_verify_typed(const fz_trace *t, bool retype, char **err)
{
	char at[32], msg[FZ_ERRLEN], ty1[256], ty2[256];
	fz_status st = FZ_EVERIFY;
	bool *defined = calloc((size_t)t->n_values + 1, sizeof *defined);
	bool *waited = calloc((size_t)t->n_values + 1, sizeof *waited);
	msg[0] = '\0';
	if (!defined || !waited) {
		snprintf(msg, sizeof msg, "out of memory");
		st = FZ_ENOMEM;
		goto done;
	}
	for (int s = 0; s < t->n_syms; s++) {
		const fz_poly *d = t->sym_def[s];
		bool ok = !d || d->n >= 2;
		for (int k = 0; ok && d && k < d->n; k++)
			for (int r = 0; r < t->n_syms; r++)
				ok &= !(fz_ext_power(d->term[k], r) && t->sym_def[r]);
		if (!ok) {
			snprintf(msg, sizeof msg, "symbol %d ('%s') is defined over "
				 "derived symbols or by fewer than two terms", s,
				 t->syms[s]);
			goto done;
		}
	}
	for (int i = 0; i < t->n_params; i++)
		defined[t->params[i]->id] = true;
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		const fz_opinfo *oi = &fz_ops[nd->op];
		fz_type types[2];
		if ((unsigned)nd->op >= FZ_OP_COUNT || oi->cls == FZ_CLASS_COMPOSITE) {
			where_(nd, at, sizeof at); /* only on the error path */
			snprintf(msg, sizeof msg, "%snode %d is not a primitive op", at, i);
			goto done;
		}
		for (int k = 0; k < nd->n_in; k++) {
			const fz_value *v = nd->in[k];
			if (!v || v->id < 0 || v->id >= t->n_values || t->values[v->id] != v ||
			    !defined[v->id]) {
				where_(nd, at, sizeof at); /* only on the error path */
				snprintf(msg, sizeof msg, "%s%s: operand %d is used before it "
					 "is defined", at, oi->name, k + 1);
				goto done;
			}
			if (nd->op == FZ_OP_WAIT)
				waited[v->id] = true;
		}
		int n = retype ? fz_infer(t, nd->op, nd->in, nd->n_in, &nd->attrs,
					  types, msg, sizeof msg) : nd->n_out;
		if (n < 0) {
			char tmp[FZ_ERRLEN];
			memcpy(tmp, msg, sizeof tmp);
			where_(nd, at, sizeof at); /* only on the error path */
			snprintf(msg, sizeof msg, "%s%.*s", at,
				 (int)(sizeof msg - sizeof at), tmp);
			goto done;
		}
		if (n != nd->n_out) {
			where_(nd, at, sizeof at); /* only on the error path */
			snprintf(msg, sizeof msg, "%s%s: %d results stored; expected %d", at,
				 oi->name, nd->n_out, n);
			goto done;
		}
		for (int k = 0; k < n; k++) {
			const fz_value *v = nd->out[k];
			if (retype && !fz_type_eq(&v->type, &types[k])) {
				where_(nd, at, sizeof at); /* only on the error path */
				snprintf(msg, sizeof msg, "%s%s: result %d has type %s; the op "
					 "gives %s", at, oi->name, k + 1,
					 fz_type_str(t, &v->type, ty1, sizeof ty1),
					 fz_type_str(t, &types[k], ty2, sizeof ty2));
				goto done;
			}
			if (v->def != nd || defined[v->id]) {
				where_(nd, at, sizeof at); /* only on the error path */
				snprintf(msg, sizeof msg, "%s%s: result %d is defined twice",
					 at, oi->name, k + 1);
				goto done;
			}
			defined[v->id] = true;
		}
	}
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		for (int k = 0; k < nd->n_out; k++) {
			const fz_value *v = nd->out[k];
			if (!v->type.future || waited[v->id])
				continue;
			where_(nd, at, sizeof at);
			snprintf(msg, sizeof msg, "%s%s: future%s%s%s is never waited on",
				 at, fz_ops[nd->op].name, v->name ? " '" : "",
				 v->name ? v->name : "", v->name ? "'" : "");
			goto done;
		}
	}
	if (t->n_outputs == 0) {
		snprintf(msg, sizeof msg, "trace '%s' has no return", t->name);
		goto done;
	}
	for (int i = 0; i < t->n_outputs; i++) {
		const fz_value *v = t->outputs[i];
		if (!v || v->id >= t->n_values || !defined[v->id]) {
			snprintf(msg, sizeof msg, "return value %d is not defined", i + 1);
			goto done;
		}
		if (v->type.future) {
			snprintf(msg, sizeof msg, "return value %d is a future; wait on it "
				 "first", i + 1);
			goto done;
		}
	}
	st = FZ_OK;
done:
	free(defined);
	free(waited);
	if (st != FZ_OK && err)
		*err = fz_strdup(msg);
	if (st == FZ_OK)
		st = fz_trace_empty_extremum(t, NULL, err);
	return st;
}
