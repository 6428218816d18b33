/*
 * partition.c: group primitive ops into regions, each one kernel, one
 * library call, one collective or one wait.
 *
 * Every node starts as a group of its own. Nodes are visited in a canonical
 * order, and each one tries to merge its group with the group of each
 * operand's producer (producer-consumer fusion). A merge is taken when the
 * merged group is still something a kernel skeleton can run and when it
 * does not close a cycle between groups:
 *
 *   - library calls, collectives and waits never merge;
 *   - all reductions of a group share one input shape and one set of
 *     reduced dims: that is the row the normalization kernel keeps, and the
 *     reduced shape its per-row results have;
 *   - what a group writes for others has one element count: its iteration
 *     domain (for a group with reductions, the input domain or the reduced
 *     one). Smaller values feeding broadcasts, and larger ones read through
 *     a slice, stay inside as index arithmetic and are never written;
 *   - take and index_add make an indexing group; index_add scatters, so
 *     nothing may consume its result in the same kernel; take_along joins a
 *     normalization only as a row gather (one element of the row, along the
 *     reduced dim), which is what cross_entropy needs;
 *   - the cycle test walks forward from the producer group's consumers,
 *     only over nodes written before the consumer group's last node (node
 *     ids are a topological order), looking for the consumer group.
 *
 *     xf = cast(x)  var,mu = var_mean(xf)  r = rsqrt(add(var, eps))
 *     y = cast(add(mul(mul(sub(xf, mu), r), w), b))
 *  becomes one normalization region: var_mean's input [16, 128, 1600] is
 *  the domain, [16, 128, 1] the reduced domain, and only y is written.
 *
 * The canonical order is by depth (longest path from the inputs), then by a
 * structural hash of each node (op, attributes, types, and its operands'
 * hashes; parameters by position), then by node id. Neither the written
 * order of independent statements nor value names enter it, so a reordered
 * or renamed trace forms the same regions, numbered the same way.
 *
 * A region's kind follows from what it holds: a group with reductions is a
 * normalization when elementwise work over the full domain (or another
 * reduction) uses a reduced value, else a reduction.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct part {
	fz_program *p;
	const fz_trace *t;
	int n;
	int *parent, *next, *tail, *size;
	int *red;          /* per root: a reduction node of the group, or -1 */
	int *flags;        /* per root: G_* */
	int *cons_start, *cons;  /* CSR: value id -> consumer node ids */
	bool *is_output;   /* per value */
	int64_t *numel;    /* per value, at probe sizes */
	int *stamp, cur;   /* the cycle walk's visited marks */
	int *stack;
	int *ord;          /* per root: a topological order of the groups */
	int *fwd, n_fwd;   /* groups the last forward walk reached */
	int *bwd, *pool;   /* scratch for reordering after a merge */
	uint64_t *hash;
	int *depth, *rank; /* rank: position in the canonical order */
} part;

enum { G_FIXED = 1, G_TAKE = 2, G_INDEX_ADD = 4 };

static bool is_reduction(fz_opcode op)
{
	return fz_ops[op].cls == FZ_CLASS_REDUCTION;
}

static int find(part *s, int x)
{
	while (s->parent[x] != x)
		x = s->parent[x] = s->parent[s->parent[x]];
	return x;
}

static bool in_pair(part *s, int node, int ra, int rb)
{
	int r = find(s, node);
	return r == ra || r == rb;
}

/* Is there a path from group ra to group rb through some other group?
 *
 * Groups run as units, so the walk is between groups, not nodes: a group
 * entered through one of its nodes passes on the results of all of them.
 * (A node-level walk misses the cycle that a group of two independent nodes
 * closes: ra feeds its node x, its other node y feeds rb, and one kernel
 * cannot run both after ra and before rb.)
 *
 * The walk is bounded by ord, a topological order of the groups kept up to
 * date across merges (see reorder): a path into rb only passes through
 * groups ordered before rb, so the walk visits the groups between ra and rb
 * and no more, which keeps partitioning near linear in the trace. The groups
 * it reached are left in s->fwd for reorder. */
static bool closes_cycle(part *s, int ra, int rb)
{
	const fz_trace *t = s->t;
	int sp = 0, bound = s->ord[rb];
	s->cur++;
	s->n_fwd = 0;
	s->stamp[ra] = s->cur;
	s->stack[sp++] = ra;
	while (sp > 0) {
		int g = s->stack[--sp];
		for (int n = g; n >= 0; n = s->next[n]) {
			const fz_node *nd = t->nodes[n];
			for (int k = 0; k < nd->n_out; k++) {
				int v = nd->out[k]->id;
				for (int c = s->cons_start[v]; c < s->cons_start[v + 1]; c++) {
					int h = find(s, s->cons[c]);
					if (h == rb) {
						if (g != ra)
							return true;
						continue;
					}
					if (h == ra || s->stamp[h] == s->cur || s->ord[h] > bound)
						continue;
					s->stamp[h] = s->cur;
					s->stack[sp++] = h;
					s->fwd[s->n_fwd++] = h;
				}
			}
		}
	}
	return false;
}

static int cmp_int(const void *a, const void *b)
{
	return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

static _Thread_local const int *sort_ord; /* plans may run on threads */
static int cmp_by_ord(const void *a, const void *b)
{
	return cmp_int(&sort_ord[*(const int *)a], &sort_ord[*(const int *)b]);
}

/* Keeps ord topological when ra merges into rb (Pearce and Kelly's local
 * reordering): F, the groups after ra that ra reaches (s->fwd, from the
 * cycle walk), must follow the merged group; B, the groups before rb that
 * reach rb, must precede it. Their ord values, with ra's and rb's, are
 * dealt out again: B first, then the merged group, then F, each in its old
 * order. No other group moves, and every edge stays forward. */
static void reorder(part *s, int ra, int rb)
{
	const fz_trace *t = s->t;
	int nb = 0, sp = 0, bound = s->ord[ra];
	s->cur++;
	s->stamp[rb] = s->cur;
	s->stack[sp++] = rb;
	while (sp > 0) {
		int g = s->stack[--sp];
		for (int n = g; n >= 0; n = s->next[n]) {
			const fz_node *nd = t->nodes[n];
			for (int k = 0; k < nd->n_in; k++) {
				if (!nd->in[k]->def)
					continue;
				int h = find(s, nd->in[k]->def->id);
				if (h == ra || h == rb || s->stamp[h] == s->cur ||
				    s->ord[h] < bound)
					continue;
				s->stamp[h] = s->cur;
				s->stack[sp++] = h;
				s->bwd[nb++] = h;
			}
		}
	}
	int np = 0;
	for (int i = 0; i < nb; i++)
		s->pool[np++] = s->ord[s->bwd[i]];
	for (int i = 0; i < s->n_fwd; i++)
		s->pool[np++] = s->ord[s->fwd[i]];
	s->pool[np++] = s->ord[ra];
	s->pool[np++] = s->ord[rb];
	qsort(s->pool, (size_t)np, sizeof(int), cmp_int);
	sort_ord = s->ord;
	qsort(s->bwd, (size_t)nb, sizeof(int), cmp_by_ord);
	qsort(s->fwd, (size_t)s->n_fwd, sizeof(int), cmp_by_ord);
	int w = 0;
	for (int i = 0; i < nb; i++)
		s->ord[s->bwd[i]] = s->pool[w++];
	s->ord[rb] = s->pool[w++];
	w++; /* ra's old slot stays empty: gaps do no harm */
	for (int i = 0; i < s->n_fwd; i++)
		s->ord[s->fwd[i]] = s->pool[w++];
}

static bool used_outside(part *s, const fz_value *v, int ra, int rb)
{
	if (s->is_output[v->id])
		return true;
	for (int c = s->cons_start[v->id]; c < s->cons_start[v->id + 1]; c++)
		if (!in_pair(s, s->cons[c], ra, rb))
			return true;
	return false;
}

/* May groups ra (a producer) and rb (its consumer) become one? */
static bool can_merge(part *s, int ra, int rb)
{
	const fz_trace *t = s->t;
	int fa = s->flags[ra], fb = s->flags[rb];
	if ((fa | fb) & G_FIXED)
		return false;
	if (fa & G_INDEX_ADD) /* a scatter's result is read by a later kernel */
		return false;
	/* a group of only meta ops and constants read by other groups too is
	 * left alone until they all join: merging it into one of them would
	 * fuse independent work horizontally by the back door */
	if (s->size[ra] <= 64) {
		bool plain = true, shared = false;
		for (int n = ra; n >= 0 && plain; n = s->next[n]) {
			fz_opclass c = fz_ops[t->nodes[n]->op].cls;
			plain = c == FZ_CLASS_META || c == FZ_CLASS_CREATION;
			for (int k = 0; plain && k < t->nodes[n]->n_out; k++) {
				const fz_value *v = t->nodes[n]->out[k];
				for (int c2 = s->cons_start[v->id]; c2 < s->cons_start[v->id + 1]; c2++)
					shared |= !in_pair(s, s->cons[c2], ra, rb);
			}
		}
		if (plain && shared)
			return false;
	}
	int red = s->red[ra] >= 0 ? s->red[ra] : s->red[rb];
	if (red >= 0 && ((fa | fb) & (G_TAKE | G_INDEX_ADD)))
		return false;
	if (s->red[ra] >= 0 && s->red[rb] >= 0) {
		const fz_node *x = t->nodes[s->red[ra]], *y = t->nodes[s->red[rb]];
		if (!fz_same_shape(&x->in[0]->type, &y->in[0]->type) ||
		    fz_reduced_dims(x) != fz_reduced_dims(y))
			return false;
	}
	const fz_node *rn = red >= 0 ? t->nodes[red] : NULL;
	int64_t din = rn ? s->numel[rn->in[0]->id] : -1;
	int64_t dr = rn ? s->numel[rn->out[0]->id] : -1;
	int64_t dom = -1;
	for (int half = 0; half < 2; half++) {
		for (int n = half ? rb : ra; n >= 0; n = s->next[n]) {
			const fz_node *nd = t->nodes[n];
			if (nd->op == FZ_OP_TAKE_ALONG && rn) {
				/* only as a row gather along the reduced dim */
				if (!fz_same_shape(&nd->in[0]->type, &rn->in[0]->type) ||
				    !(fz_reduced_dims(rn) >> nd->attrs.dim & 1) ||
				    s->numel[nd->out[0]->id] != dr)
					return false;
			}
			for (int k = 0; k < nd->n_out; k++) {
				const fz_value *v = nd->out[k];
				int64_t e = s->numel[v->id];
				if (rn && (e < 0 || e > din))
					return false;
				if (rn && e == din && din != dr &&
				    fz_op_is_elementwise(nd->op) &&
				    !fz_same_shape(&v->type, &rn->in[0]->type))
					return false;
				if (!used_outside(s, v, ra, rb))
					continue;
				if (rn) {
					if (e != din && e != dr)
						return false;
				} else {
					if (dom >= 0 && e != dom)
						return false;
					dom = e;
				}
			}
		}
	}
	/* the edge ra -> rb exists and ord is topological, so only a path from
	 * ra to rb through other groups can close a cycle */
	return !closes_cycle(s, ra, rb);
}

/* Call right after can_merge(s, ra, rb) said yes: reorder reads the walk
 * it left behind. */
static void merge(part *s, int ra, int rb)
{
	reorder(s, ra, rb);
	/* rb (the consumer) absorbs ra */
	s->parent[ra] = rb;
	s->next[s->tail[rb]] = ra;
	s->tail[rb] = s->tail[ra];
	s->size[rb] += s->size[ra];
	if (s->red[rb] < 0)
		s->red[rb] = s->red[ra];
	s->flags[rb] |= s->flags[ra];
}

/* ---- the canonical order ---- */

static uint64_t mix(uint64_t h, uint64_t x)
{
	h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h *= 0xff51afd7ed558ccdull;
	return h ^ (h >> 33);
}

static uint64_t hash_type(uint64_t h, const fz_type *ty)
{
	h = mix(h, (uint64_t)ty->dtype * 31 + (uint64_t)ty->rank);
	for (int i = 0; i < ty->rank; i++)
		h = mix(mix(h, (uint64_t)ty->dims[i].c), ty->dims[i].syms);
	return h;
}

static uint64_t hash_node(const part *s, const fz_node *n)
{
	const fz_attrs *a = &n->attrs;
	uint64_t h = mix(0x51ed270b27u, (uint64_t)n->op);
	uint64_t vb;
	memcpy(&vb, &a->value, sizeof vb);
	h = mix(h, a->present);
	h = mix(h, (uint64_t)a->dtype);
	for (int i = 0; i < a->n_shape; i++)
		h = mix(mix(h, (uint64_t)a->shape[i].c), a->shape[i].syms);
	for (int i = 0; i < a->n_dims; i++)
		h = mix(h, (uint64_t)a->dims[i]);
	h = mix(mix(h, (uint64_t)a->dim), (uint64_t)a->keepdim);
	h = mix(mix(h, vb), (uint64_t)a->value_sym);
	h = mix(mix(h, (uint64_t)a->length.c), a->length.syms);
	h = mix(mix(h, (uint64_t)a->seed), (uint64_t)a->offset);
	for (int i = 0; i < a->n_slice; i++)
		h = mix(mix(mix(h, (uint64_t)a->start[i]), (uint64_t)a->step[i]),
			(uint64_t)a->end[i].c ^ a->end[i].syms);
	h = mix(mix(h, (uint64_t)a->correction), (uint64_t)a->approximate);
	for (int k = 0; k < n->n_out; k++)
		h = hash_type(h, &n->out[k]->type);
	for (int k = 0; k < n->n_in; k++) {
		const fz_value *v = n->in[k];
		if (v->def)
			h = mix(mix(h, s->hash[v->def->id]), (uint64_t)v->out_index);
		else
			h = hash_type(mix(h, 0xa11ce + (uint64_t)v->param_index), &v->type);
	}
	return h;
}

static _Thread_local const part *sort_ctx;

static int cmp_canon(const void *x, const void *y)
{
	int a = *(const int *)x, b = *(const int *)y;
	const part *s = sort_ctx;
	if (s->depth[a] != s->depth[b])
		return s->depth[a] < s->depth[b] ? -1 : 1;
	if (s->hash[a] != s->hash[b])
		return s->hash[a] < s->hash[b] ? -1 : 1;
	return (a > b) - (a < b);
}

/* ---- the pass ---- */

static void *zalloc(size_t n, size_t size) { return calloc(n + 1, size); }

fz_status fz_partition(fz_program *p)
{
	const fz_trace *t = p->trace;
	int n = t->n_nodes, nv = t->n_values;
	part s = {.p = p, .t = t, .n = n};
	int *order = NULL, *rid = NULL;
	fz_status st = FZ_ENOMEM;
	s.parent = zalloc((size_t)n, sizeof(int));
	s.next = zalloc((size_t)n, sizeof(int));
	s.tail = zalloc((size_t)n, sizeof(int));
	s.size = zalloc((size_t)n, sizeof(int));
	s.red = zalloc((size_t)n, sizeof(int));
	s.flags = zalloc((size_t)n, sizeof(int));
	s.stamp = zalloc((size_t)n, sizeof(int));
	s.stack = zalloc((size_t)n, sizeof(int));
	s.ord = zalloc((size_t)n, sizeof(int));
	s.fwd = zalloc((size_t)n, sizeof(int));
	s.bwd = zalloc((size_t)n, sizeof(int));
	s.pool = zalloc((size_t)n + 2, sizeof(int));
	s.hash = zalloc((size_t)n, sizeof(uint64_t));
	s.depth = zalloc((size_t)n, sizeof(int));
	s.rank = zalloc((size_t)n, sizeof(int));
	s.cons_start = zalloc((size_t)nv + 1, sizeof(int));
	s.is_output = zalloc((size_t)nv, sizeof(bool));
	s.numel = zalloc((size_t)nv, sizeof(int64_t));
	order = zalloc((size_t)n, sizeof(int));
	rid = zalloc((size_t)n, sizeof(int));
	p->region_of = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	if (!s.parent || !s.next || !s.tail || !s.size || !s.red ||
	    !s.flags || !s.stamp || !s.stack || !s.ord || !s.fwd || !s.bwd || !s.pool || !s.hash || !s.depth || !s.rank ||
	    !s.cons_start || !s.is_output || !s.numel || !order || !rid ||
	    !p->region_of)
		goto done;

	/* consumers of each value, outputs, element counts at probe sizes */
	int n_edges = 0;
	for (int i = 0; i < n; i++) {
		const fz_node *nd = t->nodes[i];
		for (int k = 0; k < nd->n_in; k++)
			s.cons_start[nd->in[k]->id + 1]++;
		n_edges += nd->n_in;
	}
	for (int v = 0; v < nv; v++)
		s.cons_start[v + 1] += s.cons_start[v];
	s.cons = zalloc((size_t)n_edges, sizeof(int));
	int *fill = zalloc((size_t)nv, sizeof(int));
	if (!s.cons || !fill) {
		free(fill);
		goto done;
	}
	for (int i = 0; i < n; i++) {
		const fz_node *nd = t->nodes[i];
		for (int k = 0; k < nd->n_in; k++) {
			int v = nd->in[k]->id;
			/* an op reading one value twice is one consumer */
			bool dup = false;
			for (int j = 0; j < k; j++)
				dup |= nd->in[j]->id == v;
			if (!dup)
				s.cons[s.cons_start[v] + fill[v]++] = i;
		}
	}
	/* compact away duplicate slots: shift by rebuilding starts */
	{
		int w = 0;
		for (int v = 0; v < nv; v++) {
			int start = s.cons_start[v];
			s.cons_start[v] = w;
			for (int c = 0; c < fill[v]; c++)
				s.cons[w++] = s.cons[start + c];
		}
		s.cons_start[nv] = w;
	}
	free(fill);
	for (int i = 0; i < t->n_outputs; i++)
		s.is_output[t->outputs[i]->id] = true;
	for (int v = 0; v < nv; v++)
		s.numel[v] = fz_type_numel_at(&t->values[v]->type, p->probe_sizes);

	/* the canonical order */
	for (int i = 0; i < n; i++) {
		const fz_node *nd = t->nodes[i];
		int d = 0;
		for (int k = 0; k < nd->n_in; k++)
			if (nd->in[k]->def && s.depth[nd->in[k]->def->id] + 1 > d)
				d = s.depth[nd->in[k]->def->id] + 1;
		s.depth[i] = d;
		s.hash[i] = hash_node(&s, nd);
		order[i] = i;
	}
	sort_ctx = &s;
	qsort(order, (size_t)n, sizeof *order, cmp_canon);
	for (int i = 0; i < n; i++)
		s.rank[order[i]] = i;
	p->canon_rank = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	if (!p->canon_rank)
		goto done;
	memcpy(p->canon_rank, s.rank, sizeof(int) * (size_t)n);

	for (int i = 0; i < n; i++) {
		const fz_node *nd = t->nodes[i];
		fz_opclass c = fz_ops[nd->op].cls;
		s.parent[i] = i;
		s.next[i] = -1;
		s.tail[i] = i;
		s.size[i] = 1;
		s.ord[i] = i;
		s.red[i] = is_reduction(nd->op) ? i : -1;
		s.flags[i] = c == FZ_CLASS_LIBRARY || c == FZ_CLASS_COLLECTIVE ||
			     c == FZ_CLASS_WAIT || c == FZ_CLASS_SCAN ||
			     c == FZ_CLASS_SELECT ? G_FIXED : 0;
		if (nd->op == FZ_OP_TAKE)
			s.flags[i] |= G_TAKE;
		if (nd->op == FZ_OP_INDEX_ADD)
			s.flags[i] |= G_INDEX_ADD;
	}

	/* producer-consumer fusion in the canonical order, swept again while
	 * a sweep merges something (a shared constant joins once all its
	 * readers have) */
	for (bool changed = true; changed;) {
		changed = false;
		for (int j = 0; j < n; j++) {
			const fz_node *nd = t->nodes[order[j]];
			for (int k = 0; k < nd->n_in; k++) {
				const fz_value *v = nd->in[k];
				if (!v->def)
					continue;
				int ra = find(&s, v->def->id), rb = find(&s, nd->id);
				if (ra != rb && can_merge(&s, ra, rb)) {
					merge(&s, ra, rb);
					changed = true;
				}
			}
		}
	}

	/* regions, numbered in the canonical order of their last node (the
	 * first one may be a constant shared in shape by many regions; the
	 * last one's hash covers all the region computes) */
	int n_regions = 0;
	for (int i = 0; i < n; i++)
		rid[i] = -1;
	for (int j = n - 1; j >= 0; j--) {
		int r = find(&s, order[j]);
		if (rid[r] < 0)
			rid[r] = n_regions++;
	}
	for (int i = 0; i < n; i++)
		if (find(&s, i) == i)
			rid[i] = n_regions - 1 - rid[i];
	p->n_regions = n_regions;
	p->regions = fz_arena_alloc(&p->arena, sizeof(fz_region *) *
				    ((size_t)n_regions + 1));
	if (!p->regions)
		goto done;
	for (int i = 0; i < n; i++) {
		int r = find(&s, i);
		if (rid[r] >= 0 && !p->regions[rid[r]]) {
			fz_region *R = fz_arena_alloc(&p->arena, sizeof *R);
			if (!R)
				goto done;
			R->id = rid[r];
			R->nodes = fz_arena_alloc(&p->arena, sizeof(fz_node *) *
						  (size_t)s.size[r]);
			if (!R->nodes)
				goto done;
			p->regions[rid[r]] = R;
		}
		fz_region *R = p->regions[rid[r]];
		R->nodes[R->n_nodes++] = t->nodes[i]; /* ids ascend: topological */
		p->region_of[i] = rid[r];
	}

	/* kinds */
	bool *dep = zalloc((size_t)nv, sizeof(bool));
	if (!dep)
		goto done;
	for (int r = 0; r < n_regions; r++) {
		fz_region *R = p->regions[r];
		const fz_node *first = R->nodes[0];
		fz_opclass c = fz_ops[first->op].cls;
		int root = find(&s, first->id);
		if (c == FZ_CLASS_LIBRARY || c == FZ_CLASS_COLLECTIVE ||
		    c == FZ_CLASS_WAIT) {
			R->kind = c == FZ_CLASS_LIBRARY ? FZ_REGION_LIBRARY :
				  c == FZ_CLASS_COLLECTIVE ? FZ_REGION_COLLECTIVE :
				  FZ_REGION_WAIT;
			continue;
		}
		if (c == FZ_CLASS_SCAN || c == FZ_CLASS_SELECT) { /* alone */
			R->kind = c == FZ_CLASS_SCAN ? FZ_REGION_SCAN : FZ_REGION_SELECT;
			continue;
		}
		if (s.red[root] < 0) {
			R->kind = s.flags[root] & (G_TAKE | G_INDEX_ADD) ?
				  FZ_REGION_INDEXING : FZ_REGION_POINTWISE;
			for (int j = 0; j < R->n_nodes; j++)
				if (R->nodes[j]->op == FZ_OP_TAKE_ALONG)
					R->kind = FZ_REGION_INDEXING;
			continue;
		}
		const fz_node *rn = t->nodes[s.red[root]];
		int64_t din = s.numel[rn->in[0]->id], dr = s.numel[rn->out[0]->id];
		bool norm = false;
		for (int j = 0; j < R->n_nodes; j++) {
			const fz_node *nd = R->nodes[j];
			bool d = false;
			for (int k = 0; k < nd->n_in; k++)
				if (nd->in[k]->def && p->region_of[nd->in[k]->def->id] == r)
					d |= dep[nd->in[k]->id];
			if (d && (is_reduction(nd->op) ||
				  (s.numel[nd->out[0]->id] == din && din != dr)))
				norm = true;
			for (int k = 0; k < nd->n_out; k++)
				dep[nd->out[k]->id] = d || is_reduction(nd->op);
		}
		R->kind = norm ? FZ_REGION_NORMALIZATION : FZ_REGION_REDUCTION;
	}
	free(dep);
	st = fz_regions_link(p);
done:
	free(s.parent);
	free(s.next);
	free(s.tail);
	free(s.size);
	free(s.red);
	free(s.flags);
	free(s.stamp);
	free(s.stack);
	free(s.ord);
	free(s.fwd);
	free(s.bwd);
	free(s.pool);
	free(s.hash);
	free(s.depth);
	free(s.rank);
	free(s.cons_start);
	free(s.cons);
	free(s.is_output);
	free(s.numel);
	free(order);
	free(rid);
	return st;
}
