/*
 * graph.c: the trace as a container: creation, the name table, nodes and
 * values, and the read-only accessors of the public API.
 *
 * fz_node_add is the one place a node enters a trace. It copies operands and
 * attribute lists into the arena, types the results with fz_infer, counts
 * uses, and numbers nodes and values densely, so later stages can keep side
 * tables indexed by node->id and value->id. Nodes are appended, so the node
 * list is always a topological order.
 *
 * The name table maps user names (statement left-hand sides and
 * parameters) to values: open addressing over a power-of-two table, grown at
 * half load, all in the arena.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "ir.h"

fz_trace *fz_trace_new(const char *name)
{
	fz_trace *t = calloc(1, sizeof *t);
	if (!t)
		return NULL;
	t->world = 1;
	t->name = fz_arena_strdup(&t->arena, name ? name : "trace");
	if (!t->name) {
		fz_trace_free(t);
		return NULL;
	}
	return t;
}

void fz_trace_free(fz_trace *t)
{
	if (!t)
		return;
	fz_arena_release(&t->arena);
	free(t);
}

const char *fz_trace_name(const fz_trace *t) { return t->name; }
int fz_trace_world(const fz_trace *t) { return t->world; }
const char *fz_trace_error(const fz_trace *t) { return t->error; }

fz_status fz_trace_set_world(fz_trace *t, int world)
{
	if (world < 1 || world > 1 << 20) {
		fz_fail(t, "world size %d is out of range (1 to %d)", world, 1 << 20);
		return FZ_EINVAL;
	}
	if (t->n_nodes > 0) {
		fz_fail(t, "the world size must be set before the first op");
		return FZ_EINVAL;
	}
	t->world = world;
	return FZ_OK;
}

/* Grows an arena array of pointers by doubling; the old copy stays in the
 * arena until the trace is freed. */
static bool grow(fz_trace *t, void ***arr, int n, int *cap)
{
	if (n < *cap)
		return true;
	int nc = *cap ? *cap * 2 : 16;
	void **p = fz_arena_alloc(&t->arena, sizeof(void *) * (size_t)nc);
	if (!p)
		return false;
	if (n)
		memcpy(p, *arr, sizeof(void *) * (size_t)n);
	*arr = p;
	*cap = nc;
	return true;
}

/* ---- names ---- */

static uint64_t hash_str(const char *s)
{
	return XXH3_64bits(s, strlen(s));
}

fz_value *fz_lookup(const fz_trace *t, const char *name)
{
	if (!t->cap_names || !name)
		return NULL;
	unsigned mask = (unsigned)t->cap_names - 1;
	for (unsigned i = (unsigned)hash_str(name) & mask;; i = (i + 1) & mask) {
		const fz_name_slot *s = &t->names[i];
		if (!s->name)
			return NULL;
		if (strcmp(s->name, name) == 0)
			return s->value;
	}
}

static bool names_insert(fz_name_slot *tab, int cap, const char *name,
			 fz_value *v)
{
	unsigned mask = (unsigned)cap - 1;
	for (unsigned i = (unsigned)hash_str(name) & mask;; i = (i + 1) & mask) {
		if (!tab[i].name) {
			tab[i].name = name;
			tab[i].value = v;
			return true;
		}
	}
}

static bool valid_name(const char *s)
{
	if (!s || !(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
		return false;
	for (s++; *s; s++)
		if (!(*s == '_' || (*s >= 'a' && *s <= 'z') ||
		      (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
			return false;
	return true;
}

fz_status fz_name(fz_trace *t, fz_value *v, const char *name)
{
	if (!valid_name(name)) {
		fz_fail(t, "'%s' is not a valid name", name ? name : "(null)");
		return FZ_EINVAL;
	}
	if (v->name) {
		fz_fail(t, "value '%s' is already named", v->name);
		return FZ_EINVAL;
	}
	if (fz_lookup(t, name)) {
		fz_fail(t, "'%s' is already defined", name);
		return FZ_EVERIFY;
	}
	if ((t->n_names + 1) * 2 > t->cap_names) {
		int cap = t->cap_names ? t->cap_names * 2 : 64;
		fz_name_slot *tab = fz_arena_alloc(&t->arena, sizeof *tab * (size_t)cap);
		if (!tab) {
			fz_fail(t, "out of memory");
			return FZ_ENOMEM;
		}
		for (int i = 0; i < t->cap_names; i++)
			if (t->names[i].name)
				names_insert(tab, cap, t->names[i].name, t->names[i].value);
		t->names = tab;
		t->cap_names = cap;
	}
	const char *s = fz_arena_strdup(&t->arena, name);
	if (!s) {
		fz_fail(t, "out of memory");
		return FZ_ENOMEM;
	}
	names_insert(t->names, t->cap_names, s, v);
	t->n_names++;
	v->name = s;
	return FZ_OK;
}

/* ---- values and nodes ---- */

static fz_value *value_new(fz_trace *t, const fz_type *type)
{
	fz_value *v = fz_arena_alloc(&t->arena, sizeof *v);
	if (!v || !grow(t, (void ***)&t->values, t->n_values, &t->cap_values))
		return NULL;
	v->id = t->n_values;
	v->type = *type;
	v->param_index = -1;
	t->values[t->n_values++] = v;
	return v;
}

fz_value *fz_param(fz_trace *t, const char *name, fz_dtype dtype, int rank,
		   const fz_dim *dims)
{
	if ((unsigned)dtype >= FZ_DTYPE_COUNT) {
		fz_fail(t, "parameter '%s': unknown dtype", name ? name : "?");
		return NULL;
	}
	if (rank < 0 || rank > FZ_MAX_RANK) {
		fz_fail(t, "parameter '%s': rank %d is out of range (0 to %d)",
			name ? name : "?", rank, FZ_MAX_RANK);
		return NULL;
	}
	if (t->n_nodes > 0) {
		fz_fail(t, "parameter '%s' declared after the first op",
			name ? name : "?");
		return NULL;
	}
	fz_type ty = {.dtype = dtype, .rank = rank};
	for (int i = 0; i < rank; i++) {
		if (dims[i].sym) {
			if (!fz_trace_ext_parse(t, dims[i].sym, &ty.dims[i])) {
				if (t->n_syms == FZ_MAX_SYMS)
					fz_fail(t, "too many symbolic extents (at most %d)",
						FZ_MAX_SYMS);
				else
					fz_fail(t, "parameter '%s': '%s' is not a valid "
						"extent (a name, a product B*T, or a sum "
						"T+1)", name, dims[i].sym);
				return NULL;
			}
		} else if (dims[i].size < 0) {
			fz_fail(t, "parameter '%s': extent %lld is negative", name,
				(long long)dims[i].size);
			return NULL;
		} else {
			ty.dims[i] = fz_ext_const(dims[i].size);
		}
	}
	fz_ext n;
	if (!fz_type_numel(&ty, &n)) {
		fz_fail(t, "parameter '%s': the element count overflows%s", name,
			"");
		return NULL;
	}
	if (!grow(t, (void ***)&t->params, t->n_params, &t->cap_params)) {
		fz_fail(t, "out of memory");
		return NULL;
	}
	fz_value *v = value_new(t, &ty);
	if (!v) {
		fz_fail(t, "out of memory");
		return NULL;
	}
	if (fz_name(t, v, name) != FZ_OK) {
		t->n_values--;
		return NULL;
	}
	v->param_index = t->n_params;
	t->params[t->n_params++] = v;
	return v;
}

static void *dup_list(fz_trace *t, const void *p, int n, size_t size)
{
	if (!p || n <= 0)
		return NULL;
	void *q = fz_arena_alloc(&t->arena, size * (size_t)n);
	if (q)
		memcpy(q, p, size * (size_t)n);
	return q;
}

fz_node *fz_node_add(fz_trace *t, fz_opcode op, fz_value *const *in, int n_in,
		     const fz_attrs *attrs)
{
	fz_type types[2];
	char err[FZ_ERRLEN];
	static const fz_attrs none;
	const fz_attrs *a = attrs ? attrs : &none;
	int n_out = fz_infer(t, op, in, n_in, a, types, err, sizeof err);
	if (n_out < 0) {
		fz_fail(t, "%s", err);
		return NULL;
	}
	fz_node *nd = fz_arena_alloc(&t->arena, sizeof *nd);
	if (!nd || !grow(t, (void ***)&t->nodes, t->n_nodes, &t->cap_nodes))
		goto oom;
	nd->op = op;
	nd->origin = op;
	nd->line = t->line;
	nd->col = t->col;
	nd->attrs = *a;
	nd->attrs.shape = dup_list(t, a->shape, a->n_shape, sizeof *a->shape);
	nd->attrs.dims = dup_list(t, a->dims, a->n_dims, sizeof *a->dims);
	nd->attrs.start = dup_list(t, a->start, a->n_slice, sizeof *a->start);
	nd->attrs.step = dup_list(t, a->step, a->n_slice, sizeof *a->step);
	nd->attrs.end = dup_list(t, a->end, a->n_slice, sizeof *a->end);
	nd->in = dup_list(t, in, n_in, sizeof *in);
	if ((n_in && !nd->in) || (a->n_shape && !nd->attrs.shape) ||
	    (a->n_dims && !nd->attrs.dims) ||
	    (a->n_slice && !(nd->attrs.start && nd->attrs.step && nd->attrs.end)))
		goto oom;
	nd->n_in = n_in;
	for (int k = 0; k < n_out; k++) {
		fz_value *v = value_new(t, &types[k]);
		if (!v)
			goto oom;
		v->def = nd;
		v->out_index = k;
		nd->out[k] = v;
	}
	nd->n_out = n_out;
	for (int i = 0; i < n_in; i++)
		in[i]->n_uses++;
	nd->id = t->n_nodes;
	t->nodes[t->n_nodes++] = nd;
	return nd;
oom:
	fz_fail(t, "out of memory");
	return NULL;
}

/* Drops nodes and values added since a mark, after a failed composite. */
void fz_trace_rollback(fz_trace *t, int n_nodes, int n_values)
{
	for (int i = n_nodes; i < t->n_nodes; i++)
		for (int k = 0; k < t->nodes[i]->n_in; k++)
			t->nodes[i]->in[k]->n_uses--;
	t->n_nodes = n_nodes;
	t->n_values = n_values;
}

fz_status fz_return(fz_trace *t, fz_value *const *vals, int n)
{
	if (t->outputs) {
		fz_fail(t, "the trace already has a return");
		return FZ_EVERIFY;
	}
	if (n < 1) {
		fz_fail(t, "return needs at least one value");
		return FZ_EVERIFY;
	}
	for (int i = 0; i < n; i++) {
		if (vals[i]->type.future) {
			fz_fail(t, "return: value %d%s%s%s is a future; wait on it first",
				i + 1, vals[i]->name ? " ('" : "",
				vals[i]->name ? vals[i]->name : "",
				vals[i]->name ? "')" : "");
			return FZ_EVERIFY;
		}
	}
	t->outputs = dup_list(t, vals, n, sizeof *vals);
	if (!t->outputs) {
		fz_fail(t, "out of memory");
		return FZ_ENOMEM;
	}
	t->n_outputs = n;
	for (int i = 0; i < n; i++)
		vals[i]->n_uses++;
	return FZ_OK;
}

/* ---- accessors ---- */

int fz_trace_param_count(const fz_trace *t) { return t->n_params; }
int fz_trace_output_count(const fz_trace *t) { return t->n_outputs; }
int fz_trace_op_count(const fz_trace *t) { return t->n_nodes; }

fz_value *fz_trace_param(const fz_trace *t, int i)
{
	return i >= 0 && i < t->n_params ? t->params[i] : NULL;
}

fz_value *fz_trace_output(const fz_trace *t, int i)
{
	return i >= 0 && i < t->n_outputs ? t->outputs[i] : NULL;
}

fz_dtype fz_value_dtype(const fz_value *v) { return v->type.dtype; }
int fz_value_rank(const fz_value *v) { return v->type.rank; }
const char *fz_value_name(const fz_value *v) { return v->name; }

int64_t fz_value_extent(const fz_value *v, int i, const int64_t *sym_sizes)
{
	if (i < 0 || i >= v->type.rank)
		return -1;
	return fz_ext_eval(v->type.dims[i], sym_sizes);
}
