/*
 * print.c: the IR back in the trace format, and structural equality.
 *
 * The printer writes one statement per node, in node order, with every
 * attribute the node was given, so parse(print(parse(t))) is the same graph
 * as parse(t): same nodes, same operands, same attributes, same types. The
 * builder's own nodes (broadcasts it made explicit, the rank-0 `full` of a
 * literal, the primitives of a composite) print as ordinary statements with
 * made-up names `_N` that avoid every name in the trace.
 *
 * Numbers print in the shortest form that reads back to the same double;
 * infinities and NaN print as `inf`, `-inf` and `nan`, and an extent that is
 * a product of symbols as `B*T` (both extensions of the value grammar; the
 * parser reads them). A reshape prints such an extent as -1.
 *
 * fz_trace_equal is the other half of the round-trip test, and what the
 * cache will use to tell a hash collision from a hit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static void print_double(fz_buf *b, double v)
{
	char s[64];
	if (isnan(v)) {
		fz_buf_puts(b, "nan");
		return;
	}
	if (isinf(v)) {
		fz_buf_puts(b, v < 0 ? "-inf" : "inf");
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(s, sizeof s, "%.*g", prec, v);
		if (strtod(s, NULL) == v)
			break;
	}
	fz_buf_puts(b, s);
}

static void print_ext(fz_buf *b, const fz_trace *t, fz_ext e)
{
	char s[256];
	fz_buf_puts(b, fz_ext_str(t, e, s, sizeof s));
}

static void print_exts(fz_buf *b, const fz_trace *t, const fz_ext *e, int n,
		       bool hole_ok)
{
	int complex = 0;
	for (int i = 0; i < n; i++)
		complex += !fz_ext_is_const(e[i]) && fz_ext_as_sym(e[i]) < 0;
	fz_buf_puts(b, "[");
	for (int i = 0; i < n; i++) {
		if (i)
			fz_buf_puts(b, ", ");
		bool simple = fz_ext_is_const(e[i]) || fz_ext_as_sym(e[i]) >= 0;
		if (!simple && hole_ok && complex == 1)
			fz_buf_puts(b, "-1");
		else
			print_ext(b, t, e[i]);
	}
	fz_buf_puts(b, "]");
}

static void print_ints(fz_buf *b, const int64_t *l, const int *d, int n)
{
	fz_buf_puts(b, "[");
	for (int i = 0; i < n; i++)
		fz_buf_printf(b, "%s%lld", i ? ", " : "",
			      (long long)(l ? l[i] : d[i]));
	fz_buf_puts(b, "]");
}

static void print_attr(fz_buf *b, const fz_trace *t, const fz_node *nd,
		       fz_attr_id id)
{
	const fz_attrs *a = &nd->attrs;
	fz_buf_printf(b, ", %s=", fz_attr_names[id]);
	switch (id) {
	case FZ_ATTR_DTYPE: fz_buf_puts(b, fz_dtype_name(a->dtype)); break;
	case FZ_ATTR_SHAPE:
		print_exts(b, t, a->shape, a->n_shape, nd->op == FZ_OP_RESHAPE);
		break;
	case FZ_ATTR_DIMS: print_ints(b, NULL, a->dims, a->n_dims); break;
	case FZ_ATTR_DIM: fz_buf_printf(b, "%d", a->dim); break;
	case FZ_ATTR_KEEPDIM: fz_buf_puts(b, a->keepdim ? "true" : "false"); break;
	case FZ_ATTR_VALUE:
		if (a->value_sym >= 0)
			fz_buf_puts(b, t->syms[a->value_sym]);
		else
			print_double(b, a->value);
		break;
	case FZ_ATTR_LENGTH: print_ext(b, t, a->length); break;
	case FZ_ATTR_SEED: fz_buf_printf(b, "%lld", (long long)a->seed); break;
	case FZ_ATTR_OFFSET: fz_buf_printf(b, "%lld", (long long)a->offset); break;
	case FZ_ATTR_START: print_ints(b, a->start, NULL, a->n_slice); break;
	case FZ_ATTR_END: print_exts(b, t, a->end, a->n_slice, false); break;
	case FZ_ATTR_STEP: print_ints(b, a->step, NULL, a->n_slice); break;
	case FZ_ATTR_CORRECTION:
		fz_buf_printf(b, "%lld", (long long)a->correction);
		break;
	case FZ_ATTR_APPROXIMATE:
		fz_buf_puts(b, a->approximate == FZ_APPROX_TANH ? "tanh" : "none");
		break;
	case FZ_ATTR_EPS: print_double(b, a->eps); break;
	case FZ_ATTR_K: fz_buf_printf(b, "%lld", (long long)a->k); break;
	case FZ_ATTR_CAUSAL: fz_buf_puts(b, a->causal ? "true" : "false"); break;
	case FZ_ATTR_SCALE: print_double(b, a->scale); break;
	case FZ_ATTR_WINDOW: fz_buf_printf(b, "%lld", (long long)a->window); break;
	case FZ_ATTR_SOFTCAP: print_double(b, a->softcap); break;
	default: FZ_ASSERT(!"unknown attribute");
	}
}

/* A name for every value: its own, or `_N` clear of every user name. */
static const char **make_names(const fz_trace *t)
{
	const char **names = calloc((size_t)t->n_values + 1, sizeof *names);
	if (!names)
		return NULL;
	for (int i = 0; i < t->n_values; i++) {
		const fz_value *v = t->values[i];
		if (v->name) {
			names[i] = v->name;
			continue;
		}
		char s[64];
		int n = snprintf(s, sizeof s, "_%d", i);
		while (fz_lookup(t, s) && n < (int)sizeof s - 1)
			s[n++] = '_', s[n] = '\0';
		names[i] = fz_strdup(s);
		if (!names[i]) {
			for (int k = 0; k < i; k++)
				if (!t->values[k]->name)
					free((char *)names[k]);
			free(names);
			return NULL;
		}
	}
	return names;
}

static void print_trace(fz_buf *b, const fz_trace *t, const char **names,
			const fz_node *const *order)
{
	char ty[512];
	fz_buf_printf(b, "trace %s(", t->name);
	for (int i = 0; i < t->n_params; i++) {
		const fz_value *p = t->params[i];
		fz_buf_printf(b, "%s%s: %s", i ? ", " : "", p->name,
			      fz_type_str(t, &p->type, ty, sizeof ty));
	}
	fz_buf_puts(b, ")");
	if (t->world != 1)
		fz_buf_printf(b, " world %d", t->world);
	fz_buf_puts(b, " {\n");
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = order ? order[i] : t->nodes[i];
		fz_buf_puts(b, "  ");
		for (int k = 0; k < nd->n_out; k++)
			fz_buf_printf(b, "%s%s", k ? ", " : "", names[nd->out[k]->id]);
		fz_buf_printf(b, " = %s(", fz_ops[nd->op].name);
		for (int k = 0; k < nd->n_in; k++)
			fz_buf_printf(b, "%s%s", k ? ", " : "", names[nd->in[k]->id]);
		unsigned present = nd->attrs.present & fz_ops[nd->op].attrs;
		bool first = nd->n_in == 0;
		for (int id = 0; id < FZ_ATTR_COUNT; id++) {
			if (!(present & (1u << id)))
				continue;
			size_t before = b->len;
			print_attr(b, t, nd, (fz_attr_id)id);
			if (first && !b->oom) { /* drop the leading ", " */
				memmove(b->data + before, b->data + before + 2,
					b->len - before - 1);
				b->len -= 2;
				first = false;
			}
		}
		fz_buf_puts(b, ")\n");
	}
	fz_buf_puts(b, "  return ");
	for (int i = 0; i < t->n_outputs; i++)
		fz_buf_printf(b, "%s%s", i ? ", " : "", names[t->outputs[i]->id]);
	fz_buf_puts(b, "\n}\n");
}

static void free_names(const fz_trace *t, const char **names)
{
	for (int i = 0; i < t->n_values; i++)
		if (!t->values[i]->name)
			free((char *)names[i]);
	free(names);
}

static fz_status print_into(fz_buf *b, const fz_trace *t,
			    const fz_node *const *order)
{
	const char **names = make_names(t);
	if (!names)
		return FZ_ENOMEM;
	print_trace(b, t, names, order);
	free_names(t, names);
	return b->oom ? FZ_ENOMEM : FZ_OK;
}

fz_status fz_trace_print_ordered(const fz_trace *t,
				  const fz_node *const *order, char **out)
{
	fz_buf b = {0};
	fz_status st = print_into(&b, t, order);
	*out = fz_buf_take(&b);
	if (st == FZ_OK && !*out)
		st = FZ_ENOMEM;
	return st;
}

fz_status fz_trace_print(const fz_trace *t, char **out)
{
	fz_buf b = {0};
	fz_status st = print_into(&b, t, NULL);
	*out = fz_buf_take(&b);
	if (st == FZ_OK && !*out)
		st = FZ_ENOMEM;
	return st;
}

fz_status fz_module_print(const fz_module *m, char **out)
{
	fz_buf b = {0};
	fz_status st = FZ_OK;
	for (int i = 0; i < m->n_traces && st == FZ_OK; i++) {
		if (i)
			fz_buf_puts(&b, "\n");
		st = print_into(&b, m->traces[i], NULL);
	}
	*out = fz_buf_take(&b);
	if (st == FZ_OK && !*out)
		st = FZ_ENOMEM;
	if (st != FZ_OK) {
		free(*out);
		*out = NULL;
	}
	return st;
}

/* ---- structural equality ---- */

#define DIFF(...) (snprintf(why, n, __VA_ARGS__), false)

static bool exts_eq(const fz_ext *a, const fz_ext *b, int n)
{
	for (int i = 0; i < n; i++)
		if (!fz_ext_eq(a[i], b[i]))
			return false;
	return true;
}

static bool attrs_eq(const fz_node *x, const fz_node *y)
{
	const fz_attrs *a = &x->attrs, *b = &y->attrs;
	unsigned s = fz_ops[x->op].attrs;
	if ((s & AT(DTYPE)) && a->dtype != b->dtype)
		return false;
	if ((s & AT(SHAPE)) && (a->n_shape != b->n_shape ||
				!exts_eq(a->shape, b->shape, a->n_shape)))
		return false;
	if ((s & AT(DIMS)) && (a->n_dims != b->n_dims ||
			       (a->n_dims && memcmp(a->dims, b->dims,
						    sizeof(int) * (size_t)a->n_dims))))
		return false;
	if ((s & AT(DIM)) && a->dim != b->dim)
		return false;
	if ((s & AT(KEEPDIM)) && a->keepdim != b->keepdim)
		return false;
	if ((s & AT(VALUE)) && (a->value_sym != b->value_sym ||
				(memcmp(&a->value, &b->value, sizeof a->value) &&
				 a->value != b->value)))
		return false;
	if ((s & AT(LENGTH)) && !fz_ext_eq(a->length, b->length))
		return false;
	if ((s & AT(SEED)) && (a->seed != b->seed || a->offset != b->offset))
		return false;
	if ((s & AT(START)) &&
	    (a->n_slice != b->n_slice ||
	     memcmp(a->start, b->start, sizeof(int64_t) * (size_t)a->n_slice) ||
	     memcmp(a->step, b->step, sizeof(int64_t) * (size_t)a->n_slice) ||
	     !exts_eq(a->end, b->end, a->n_slice)))
		return false;
	if ((s & AT(CORRECTION)) && a->correction != b->correction)
		return false;
	if ((s & AT(APPROXIMATE)) && a->approximate != b->approximate)
		return false;
	if ((s & AT(EPS)) && a->eps != b->eps)
		return false;
	if ((s & AT(K)) && a->k != b->k)
		return false;
	if ((s & AT(CAUSAL)) && a->causal != b->causal)
		return false;
	if ((s & AT(SCALE)) && a->scale != b->scale)
		return false;
	if ((s & AT(WINDOW)) && a->window != b->window)
		return false;
	if ((s & AT(SOFTCAP)) && a->softcap != b->softcap)
		return false;
	return true;
}

bool fz_trace_equal(const fz_trace *a, const fz_trace *b, char *why, size_t n)
{
	if (strcmp(a->name, b->name) || a->world != b->world)
		return DIFF("trace name or world differs");
	if (a->n_syms != b->n_syms)
		return DIFF("%d symbols vs %d", a->n_syms, b->n_syms);
	for (int i = 0; i < a->n_syms; i++)
		if (strcmp(a->syms[i], b->syms[i]))
			return DIFF("symbol %d: %s vs %s", i, a->syms[i], b->syms[i]);
	if (a->n_params != b->n_params || a->n_nodes != b->n_nodes ||
	    a->n_values != b->n_values || a->n_outputs != b->n_outputs)
		return DIFF("counts differ: params %d/%d, nodes %d/%d, values %d/%d, "
			    "outputs %d/%d", a->n_params, b->n_params, a->n_nodes,
			    b->n_nodes, a->n_values, b->n_values, a->n_outputs,
			    b->n_outputs);
	for (int i = 0; i < a->n_params; i++)
		if (strcmp(a->params[i]->name, b->params[i]->name) ||
		    !fz_type_eq(&a->params[i]->type, &b->params[i]->type))
			return DIFF("parameter %d differs", i + 1);
	for (int i = 0; i < a->n_nodes; i++) {
		const fz_node *x = a->nodes[i], *y = b->nodes[i];
		if (x->op != y->op || x->n_in != y->n_in || x->n_out != y->n_out)
			return DIFF("node %d: %s vs %s", i, fz_ops[x->op].name,
				    fz_ops[y->op].name);
		for (int k = 0; k < x->n_in; k++)
			if (x->in[k]->id != y->in[k]->id)
				return DIFF("node %d (%s): operand %d differs", i,
					    fz_ops[x->op].name, k + 1);
		for (int k = 0; k < x->n_out; k++)
			if (x->out[k]->id != y->out[k]->id ||
			    !fz_type_eq(&x->out[k]->type, &y->out[k]->type))
				return DIFF("node %d (%s): result %d differs", i,
					    fz_ops[x->op].name, k + 1);
		if (!attrs_eq(x, y))
			return DIFF("node %d (%s): attributes differ", i,
				    fz_ops[x->op].name);
	}
	for (int i = 0; i < a->n_outputs; i++)
		if (a->outputs[i]->id != b->outputs[i]->id)
			return DIFF("return value %d differs", i + 1);
	return true;
}
