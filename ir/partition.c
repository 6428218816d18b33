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
 *     nothing may consume its result in the same kernel but elementwise
 *     work at its shape where the host writes it by rows, each row once
 *     (along dim 0: see scatter_follower); take_along joins a
 *     normalization only as a row gather (one element of the row, along the
 *     reduced dim), which is what cross_entropy needs;
 *   - the cycle test walks forward from the producer group's consumers,
 *     only over groups ordered before the consumer group in a topological
 *     order of the groups kept across merges, looking for the consumer
 *     group; a merge then mends that order locally (Pearce and Kelly).
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
 * Cost: linear in the trace. Setting up (consumer lists, depths, hashes)
 * is O(nodes + edges), the canonical sort O(n log n). A sweep tries each
 * edge once, and every attempt (can_merge: the checks over both groups and
 * the two walks) takes at most WALK_BUDGET steps, a node visited or an edge
 * scanned, or is refused: so a sweep is O(edges x WALK_BUDGET) and the
 * mending sort after a merge O(WALK_BUDGET log WALK_BUDGET). At most
 * MAX_SWEEPS sweeps run (a later sweep only lets a shared constant join
 * the readers the sweep before united; Llama steps take 4). The budget also
 * bounds a group's size (its checks scan it whole), which keeps the later
 * passes' per-region work constant. What the budget refuses is the fusion of
 * groups far apart in the order, which checkpointed steps are full of, and
 * which is not wanted anyway (see walk_forward). On the Llama-2-7B
 * checkpointed step this took planning from 0.54 s to about 50 ms at 32
 * layers, with the same regions and kernels and a lower planned peak; the
 * counted work (fz_program.pass_work) is about 145 steps per op at 8, 32
 * and 64 layers alike.
 *
 * A region's kind follows from what it holds: a group with reductions is a
 * normalization when elementwise work over the full domain (or another
 * reduction) uses a reduced value, else a reduction.
 */
#include <stdlib.h>
#include <string.h>

#include "attention.h"

/* What the sweeps read, packed. A deep trace's nodes and values are tens
 * of megabytes of wide structs (attributes, eight extents per type), and
 * the sweeps visit them in the canonical order, not the order they lie in
 * memory: following node->in[k]->def->id from there costs three or four
 * cache misses per edge. So the pass first copies, in one walk in memory
 * order, what it needs into dense records indexed by id (a node's op, its
 * operands' and results' value ids; a value's producer, consumers and
 * element count), and the union-find and the walks keep each group's
 * fields in one 32-byte record: a group visited is one cache line, not
 * eight arrays. */
typedef struct grp {
	int parent, next, tail, size;
	int red;           /* per root: a reduction node of the group, or -1 */
	int flags;         /* per root: G_* */
	int stamp;         /* the cycle walk's visited marks */
	int ord;           /* per root: a topological order of the groups */
} grp;

typedef struct pnode {
	int in_start;      /* operands: part.in_val[in_start .. +n_in) */
	int n_in;
	int out[2];        /* result value ids (n_out of them) */
	short op;
	short n_out;
} pnode;

typedef struct pval {
	int64_t numel;     /* at probe sizes */
	int def;           /* producing node, or -1 for a parameter */
	int cons;          /* consumers: part.cons[cons .. vals[v + 1].cons) */
} pval;

typedef struct part {
	fz_program *p;
	const fz_trace *t;
	int n;
	grp *g;            /* per node; the fields of a group are its root's */
	pnode *nodes;      /* per node */
	pval *vals;        /* per value, and one past the last */
	int *in_val;       /* operand value ids, per node in order */
	int *cons;         /* consumer node ids, per value in order */
	bool *is_output;   /* per value */
	int cur;           /* the current walk's stamp */
	int *stack;
	int *fwd, n_fwd;   /* groups the last forward walk reached */
	int *bwd, n_bwd;   /* groups the last backward walk reached */
	int *pool;         /* scratch for reordering after a merge */
	uint64_t *tmp;     /* scratch for sort_by */
	int64_t work;      /* steps taken: nodes visited, edges scanned */
	int64_t spent;     /* steps taken by the merge attempt under way */
	uint64_t *hash;
	int *depth, *rank; /* rank: position in the canonical order */
} part;

enum { G_FIXED = 1, G_TAKE = 2, G_INDEX_ADD = 4, G_ATTN = 8 };

static bool is_reduction(fz_opcode op)
{
	return fz_ops[op].cls == FZ_CLASS_REDUCTION;
}

static int find(part *s, int x)
{
	while (s->g[x].parent != x)
		x = s->g[x].parent = s->g[s->g[x].parent].parent;
	return x;
}

/* Nodes ids[0..m) (singleton groups; the dead ones left alone) joined to
 * root's group, one fixed attention group. */
static void attn_group(part *s, int root, const int *ids, int m, const bool *dead)
{
	for (int j = 0; j < m; j++) {
		int x = ids[j];
		if (x == root || (dead && dead[x]))
			continue;
		s->g[x].parent = root;
		s->g[s->g[root].tail].next = x;
		s->g[root].tail = x;
		s->g[root].size++;
	}
	s->g[root].red = -1;
	s->g[root].flags = G_FIXED | G_ATTN;
}

static bool in_pair(part *s, int node, int ra, int rb)
{
	int r = find(s, node);
	return r == ra || r == rb;
}

/* The two walks a merge of ra (producer) into rb (consumer) needs, each
 * over groups, not nodes: groups run as units, so a group entered through
 * one of its nodes passes on the results of all of them. (A node-level walk
 * misses the cycle that a group of two independent nodes closes: ra feeds
 * its node x, its other node y feeds rb, and one kernel cannot run both
 * after ra and before rb.)
 *
 * Both are bounded by ord, a topological order of the groups kept up to
 * date across merges (see reorder): a path from ra into rb only passes
 * through groups ordered between them. The forward walk (walk_forward)
 * looks for rb from ra's consumers, never past ord[rb], and leaves the
 * groups it reached in s->fwd: if it finds rb, the merge would close a
 * cycle. The backward walk (walk_backward) collects in s->bwd the groups
 * after ra that reach rb, which reorder moves before the merged group.
 *
 * And both are bounded by WALK_BUDGET steps (a node visited or an edge
 * scanned, counted in s->work). A walk that would take more refuses the
 * merge. What only a long walk can settle is the fusion of two groups far
 * apart in the order: on a checkpointed step, a forward kernel and the
 * backward's recomputation of it, or one layer's rotary views and the next
 * layer's. Such a fusion is not worth having anyway: the merged kernel must
 * run before everything ra feeds and after everything rb needs, so what it
 * makes for the far side stays alive across the whole distance, which is
 * what checkpointing is there to avoid. With the bound, one merge attempt
 * costs O(WALK_BUDGET) and the pass stays linear in the trace (see the
 * essay at the top). */
#define WALK_BUDGET 512
#define MAX_SWEEPS 8

enum { WALK_OK, WALK_PATH, WALK_FAR };

static int walk_forward(part *s, int ra, int rb)
{
	int sp = 0, bound = s->g[rb].ord;
	s->cur++;
	s->n_fwd = 0;
	s->g[ra].stamp = s->cur;
	s->stack[sp++] = ra;
	while (sp > 0) {
		int g = s->stack[--sp];
		for (int n = g; n >= 0; n = s->g[n].next) {
			const pnode *nd = &s->nodes[n];
			s->spent++;
			for (int k = 0; k < nd->n_out; k++) {
				int v = nd->out[k];
				int c0 = s->vals[v].cons, c1 = s->vals[v + 1].cons;
				s->spent += c1 - c0;
				for (int c = c0; c < c1; c++) {
					int h = find(s, s->cons[c]);
					if (h == rb) {
						if (g != ra)
							return WALK_PATH;
						continue;
					}
					if (h == ra || s->g[h].stamp == s->cur || s->g[h].ord > bound)
						continue;
					s->g[h].stamp = s->cur;
					s->stack[sp++] = h;
					s->fwd[s->n_fwd++] = h;
				}
			}
			if (s->spent > WALK_BUDGET)
				return WALK_FAR;
		}
	}
	return WALK_OK;
}

/* Call after walk_forward(s, ra, rb) found no path: the groups it reached
 * are not in B, so the two sets are disjoint. */
static int walk_backward(part *s, int ra, int rb)
{
	int sp = 0, bound = s->g[ra].ord;
	s->cur++;
	s->n_bwd = 0;
	s->g[rb].stamp = s->cur;
	s->stack[sp++] = rb;
	while (sp > 0) {
		int g = s->stack[--sp];
		for (int n = g; n >= 0; n = s->g[n].next) {
			const pnode *nd = &s->nodes[n];
			s->spent += 1 + nd->n_in;
			for (int k = 0; k < nd->n_in; k++) {
				int def = s->vals[s->in_val[nd->in_start + k]].def;
				if (def < 0)
					continue;
				int h = find(s, def);
				if (h == ra || h == rb || s->g[h].stamp == s->cur ||
				    s->g[h].ord < bound)
					continue;
				s->g[h].stamp = s->cur;
				s->stack[sp++] = h;
				s->bwd[s->n_bwd++] = h;
			}
			if (s->spent > WALK_BUDGET)
				return WALK_FAR;
		}
	}
	return WALK_OK;
}

/* Sorts a[0..n) by key[a[i]].ord (by a[i] itself when key is NULL), all
 * distinct and not negative, through tmp (n numbers of scratch). */
static void sort_by(int *a, int n, const grp *key, uint64_t *tmp)
{
	for (int i = 0; i < n; i++)
		tmp[i] = (key ? (uint64_t)key[a[i]].ord << 32 : 0) | (uint32_t)a[i];
	fz_sort_u64(tmp, n);
	for (int i = 0; i < n; i++)
		a[i] = (int)(uint32_t)tmp[i];
}

/* Keeps ord topological when ra merges into rb (Pearce and Kelly's local
 * reordering): F, the groups after ra that ra reaches (s->fwd), must follow
 * the merged group; B, the groups before rb that reach rb (s->bwd), must
 * precede it. Their ord values, with ra's and rb's, are dealt out again: B
 * first, then the merged group, then F, each in its old order. No other
 * group moves, and every edge stays forward. Both sets came from bounded
 * walks, so this sorts O(WALK_BUDGET) numbers. */
static void reorder(part *s, int ra, int rb)
{
	int nb = s->n_bwd, np = 0;
	for (int i = 0; i < nb; i++)
		s->pool[np++] = s->g[s->bwd[i]].ord;
	for (int i = 0; i < s->n_fwd; i++)
		s->pool[np++] = s->g[s->fwd[i]].ord;
	s->pool[np++] = s->g[ra].ord;
	s->pool[np++] = s->g[rb].ord;
	sort_by(s->pool, np, NULL, s->tmp);
	sort_by(s->bwd, nb, s->g, s->tmp);
	sort_by(s->fwd, s->n_fwd, s->g, s->tmp);
	s->work += fz_nlogn(np) + fz_nlogn(nb) + fz_nlogn(s->n_fwd);
	int w = 0;
	for (int i = 0; i < nb; i++)
		s->g[s->bwd[i]].ord = s->pool[w++];
	s->g[rb].ord = s->pool[w++];
	w++; /* ra's old slot stays empty: gaps do no harm */
	for (int i = 0; i < s->n_fwd; i++)
		s->g[s->fwd[i]].ord = s->pool[w++];
}

static bool used_outside(part *s, int v, int ra, int rb)
{
	if (s->is_output[v])
		return true;
	int c0 = s->vals[v].cons, c1 = s->vals[v + 1].cons;
	s->spent += c1 - c0;
	for (int c = c0; c < c1; c++)
		if (!in_pair(s, s->cons[c], ra, rb))
			return true;
	return false;
}

static bool can_merge_within(part *s, int ra, int rb);

/* May rb, a consumer of ra's index_add, join ra? Where index_add runs
 * along dim 0 into rows of 64 elements or more (fz_index_add_gathers), the
 * host writes its result by rows, each row once, from x's row and the rows
 * of src the index's inverse names (codegen/pointwise.c, "the scatter as
 * a gather"), and then elementwise work at the result's
 * shape can take each row's sums where they are, in registers: an
 * embedding's backward, index_add(zeros f32, idx, dy) and its cast to
 * bf16, then writes only the bf16 gradient, never the f32 table (131 MB
 * written and read again for a 32000 x 1024 table). So rb may join when
 * every node of it is elementwise, or a constant, at the result's shape.
 * (The GPU's scatter adds with atomics into its result and cannot; its
 * code generator turns such a region away, and the runtime runs it one
 * op a kernel.) */
static bool scatter_follower(part *s, int ra, int rb)
{
	const fz_trace *t = s->t;
	if (s->g[rb].flags || s->g[rb].red >= 0)
		return false;
	const fz_node *ia = NULL;
	for (int n = ra; n >= 0 && !ia; n = s->g[n].next) {
		if (++s->spent > WALK_BUDGET)
			return false;
		if (s->nodes[n].op == FZ_OP_INDEX_ADD)
			ia = t->nodes[n];
	}
	if (!ia || !fz_index_add_gathers(ia))
		return false;
	for (int n = rb; n >= 0; n = s->g[n].next) {
		const fz_node *nd = t->nodes[n];
		if (++s->spent > WALK_BUDGET ||
		    !(fz_op_is_elementwise(nd->op) ||
		      fz_ops[nd->op].cls == FZ_CLASS_CREATION) ||
		    !fz_same_shape(&nd->out[0]->type, &ia->out[0]->type))
			return false;
	}
	return true;
}

/* The region's two parts for targets that do not gather (see plan.h):
 * which nodes depend on the index_add's result, then each part's nodes,
 * inputs (read, not made there) and outputs (read by the other part, or
 * the region's). */
static bool made_in(const fz_region *R, const fz_value *v)
{
	for (int i = 0; i < R->n_nodes; i++)
		if (v->def == R->nodes[i])
			return true;
	return false;
}

fz_region *fz_scatter_split(const fz_region *r, bool *oom)
{
	const fz_value *y = NULL;
	int n = r->n_nodes, cap = n;
	for (int j = 0; j < n; j++) {
		const fz_node *a = r->nodes[j];
		cap += a->n_in + a->n_out;
		for (int i = 0; i < n && !y && a->op == FZ_OP_INDEX_ADD; i++)
			for (int k = 0; k < r->nodes[i]->n_in; k++)
				if (r->nodes[i]->in[k] == a->out[0])
					y = a->out[0];
	}
	if (!y)
		return NULL;
	fz_region *two = calloc(1, 2 * sizeof *two + sizeof(void *) * 2 * (size_t)cap + (size_t)n);
	if (!two) {
		*oom = true;
		return NULL;
	}
	fz_node **nodes = (fz_node **)(two + 2);
	bool *dep = (bool *)(nodes + 2 * cap); /* per node: reads y, at a remove */
	for (int j = 0; j < n; j++) {
		const fz_node *a = r->nodes[j];
		for (int k = 0; k < a->n_in && !dep[j]; k++) {
			dep[j] = a->in[k] == y;
			for (int i = 0; i < j && !dep[j]; i++)
				dep[j] = dep[i] && a->in[k]->def == r->nodes[i];
		}
	}
	for (int h = 0; h < 2; h++) {
		fz_region *R = &two[h];
		*R = *r;
		R->kind = h ? FZ_REGION_POINTWISE : r->kind;
		R->nodes = nodes + h * cap;
		R->n_nodes = R->n_in = R->n_out = 0;
		for (int j = 0; j < n; j++)
			if (dep[j] == h)
				R->nodes[R->n_nodes++] = r->nodes[j];
		R->in = (fz_value **)R->nodes + R->n_nodes;
		for (int j = 0; j < R->n_nodes; j++)
			for (int k = 0; k < R->nodes[j]->n_in; k++) {
				fz_value *v = R->nodes[j]->in[k];
				if (!made_in(R, v) && !fz_value_listed(R->in, R->n_in, v))
					R->in[R->n_in++] = v;
			}
		/* what the other part reads, and the region's outputs */
		R->out = R->in + R->n_in;
		for (int j = 0; j < n; j++)
			for (int k = 0; dep[j] != h && k < r->nodes[j]->n_in; k++) {
				fz_value *v = r->nodes[j]->in[k];
				if (made_in(R, v) && !fz_value_listed(R->out, R->n_out, v))
					R->out[R->n_out++] = v;
			}
		for (int i = 0; i < r->n_out; i++)
			if (made_in(R, r->out[i]) && !fz_value_listed(R->out, R->n_out, r->out[i]))
				R->out[R->n_out++] = r->out[i];
	}
	return two;
}

/* May groups ra (a producer) and rb (its consumer) become one? Every step
 * it takes counts against the attempt's budget (WALK_BUDGET): past it, the
 * answer is no. */
static bool can_merge(part *s, int ra, int rb)
{
	bool ok = can_merge_within(s, ra, rb);
	s->work += s->spent;
	s->spent = 0;
	return ok;
}

static bool can_merge_within(part *s, int ra, int rb)
{
	const fz_trace *t = s->t;
	int fa = s->g[ra].flags, fb = s->g[rb].flags;
	if ((fa | fb) & G_FIXED)
		return false;
	/* a scatter's result is read by a later kernel, but by an
	 * elementwise follower (see scatter_follower) */
	if ((fa & G_INDEX_ADD) && !scatter_follower(s, ra, rb))
		return false;
	/* a group of only meta ops and constants read by other groups too is
	 * left alone until they all join: merging it into one of them would
	 * fuse independent work horizontally by the back door */
	if (s->g[ra].size <= 64) {
		bool plain = true, shared = false;
		for (int n = ra; n >= 0 && plain; n = s->g[n].next) {
			const pnode *nd = &s->nodes[n];
			fz_opclass c = fz_ops[nd->op].cls;
			plain = c == FZ_CLASS_META || c == FZ_CLASS_CREATION;
			s->spent++;
			for (int k = 0; plain && k < nd->n_out; k++) {
				int v = nd->out[k];
				int c0 = s->vals[v].cons, c1 = s->vals[v + 1].cons;
				s->spent += c1 - c0;
				for (int c2 = c0; c2 < c1; c2++)
					shared |= !in_pair(s, s->cons[c2], ra, rb);
			}
		}
		if (plain && shared)
			return false;
	}
	int red = s->g[ra].red >= 0 ? s->g[ra].red : s->g[rb].red;
	if (red >= 0 && ((fa | fb) & (G_TAKE | G_INDEX_ADD)))
		return false;
	if (s->g[ra].red >= 0 && s->g[rb].red >= 0) {
		const fz_node *x = t->nodes[s->g[ra].red], *y = t->nodes[s->g[rb].red];
		if (!fz_same_shape(&x->in[0]->type, &y->in[0]->type) ||
		    fz_reduced_dims(x) != fz_reduced_dims(y))
			return false;
	}
	const fz_node *rn = red >= 0 ? t->nodes[red] : NULL;
	int64_t din = rn ? s->vals[rn->in[0]->id].numel : -1;
	int64_t dr = rn ? s->vals[rn->out[0]->id].numel : -1;
	int64_t dom = -1;
	for (int half = 0; half < 2; half++) {
		for (int n = half ? rb : ra; n >= 0; n = s->g[n].next) {
			const pnode *nd = &s->nodes[n];
			if (++s->spent > WALK_BUDGET)
				return false;
			if (nd->op == FZ_OP_TAKE_ALONG && rn) {
				/* only as a row gather along the reduced dim */
				const fz_node *x = t->nodes[n];
				if (!fz_same_shape(&x->in[0]->type, &rn->in[0]->type) ||
				    !(fz_reduced_dims(rn) >> x->attrs.dim & 1) ||
				    s->vals[nd->out[0]].numel != dr)
					return false;
			}
			for (int k = 0; k < nd->n_out; k++) {
				int v = nd->out[k];
				int64_t e = s->vals[v].numel;
				if (rn && (e < 0 || e > din))
					return false;
				if (rn && e == din && din != dr &&
				    fz_op_is_elementwise((fz_opcode)nd->op) &&
				    !fz_same_shape(&t->values[v]->type, &rn->in[0]->type))
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
	return walk_forward(s, ra, rb) == WALK_OK &&
	       walk_backward(s, ra, rb) == WALK_OK;
}

/* Call right after can_merge(s, ra, rb) said yes: reorder reads the walks
 * it left behind. */
static void merge(part *s, int ra, int rb)
{
	reorder(s, ra, rb);
	/* rb (the consumer) absorbs ra */
	s->g[ra].parent = rb;
	s->g[s->g[rb].tail].next = ra;
	s->g[rb].tail = s->g[ra].tail;
	s->g[rb].size += s->g[ra].size;
	if (s->g[rb].red < 0)
		s->g[rb].red = s->g[ra].red;
	s->g[rb].flags |= s->g[ra].flags;
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
	h = mix(mix(h, (uint64_t)a->causal), (uint64_t)a->window);
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

/* in[k] is the first of the operands in[0..k] with its value: a node
 * that reads a value twice is one consumer of it. A dead node (dce.c)
 * consumes nothing. */
static bool first_operand(const fz_program *p, int node, const int *in, int k)
{
	if (p->dead && p->dead[node])
		return false;
	for (int j = 0; j < k; j++)
		if (in[j] == in[k])
			return false;
	return true;
}

fz_status fz_partition(fz_program *p)
{
	const fz_trace *t = p->trace;
	int n = t->n_nodes, nv = t->n_values;
	part s = {.p = p, .t = t, .n = n};
	int *order = NULL, *rid = NULL;
	fz_status st = FZ_ENOMEM;
	s.g = zalloc((size_t)n, sizeof(grp));
	s.nodes = zalloc((size_t)n, sizeof(pnode));
	s.vals = zalloc((size_t)nv + 1, sizeof(pval));
	s.stack = zalloc((size_t)n, sizeof(int));
	s.fwd = zalloc((size_t)n, sizeof(int));
	s.bwd = zalloc((size_t)n, sizeof(int));
	s.pool = zalloc((size_t)n + 2, sizeof(int));
	s.tmp = zalloc((size_t)n + 2, sizeof(uint64_t));
	s.hash = zalloc((size_t)n, sizeof(uint64_t));
	s.depth = zalloc((size_t)n, sizeof(int));
	s.rank = zalloc((size_t)n, sizeof(int));
	s.is_output = zalloc((size_t)nv, sizeof(bool));
	order = zalloc((size_t)n, sizeof(int));
	rid = zalloc((size_t)n, sizeof(int));
	p->region_of = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	if (!s.g || !s.nodes || !s.vals || !s.stack || !s.fwd || !s.bwd ||
	    !s.pool || !s.tmp || !s.hash || !s.depth || !s.rank || !s.is_output ||
	    !order || !rid || !p->region_of)
		goto done;

	/* the dense records, in one walk over the nodes as they lie; then the
	 * consumers of each value (an op reading one value twice is one
	 * consumer), outputs, element counts at probe sizes */
	int n_edges = 0;
	for (int i = 0; i < n; i++)
		n_edges += t->nodes[i]->n_in;
	s.in_val = zalloc((size_t)n_edges, sizeof(int));
	s.cons = zalloc((size_t)n_edges, sizeof(int));
	if (!s.in_val || !s.cons)
		goto done;
	for (int v = 0; v < nv; v++)
		s.vals[v].def = -1;
	for (int i = 0, e = 0; i < n; i++) {
		const fz_node *nd = t->nodes[i];
		pnode *pn = &s.nodes[i];
		pn->in_start = e;
		pn->n_in = nd->n_in;
		pn->op = (short)nd->op;
		pn->n_out = (short)nd->n_out;
		/* an attention op reading repeated kv heads reads them
		 * unrepeated (ir/attention.h, fz_attn_fold_find) */
		const fz_attn_fold *f = p->attn_fold && p->attn_fold[i].k ?
					&p->attn_fold[i] : NULL;
		for (int k = 0; k < nd->n_in; k++)
			s.in_val[e++] = (f && k == 1 ? f->k : f && k == 2 ? f->v :
					 nd->in[k])->id;
		for (int k = 0; k < nd->n_out; k++) {
			pn->out[k] = nd->out[k]->id;
			s.vals[pn->out[k]].def = i;
		}
	}
	/* vals[v].cons counts v's consumers, then says where they start */
	for (int i = 0; i < n; i++) {
		const int *in = &s.in_val[s.nodes[i].in_start];
		for (int k = 0; k < s.nodes[i].n_in; k++)
			if (first_operand(p, i, in, k))
				s.vals[in[k]].cons++;
	}
	for (int v = 0, sum = 0; v <= nv; v++) {
		int c = s.vals[v].cons;
		s.vals[v].cons = sum;
		sum += c;
	}
	/* shifted by one value, vals[v + 1].cons is the fill cursor of v's
	 * list; filled, it ends v's list, which is where v + 1's starts */
	for (int v = nv; v > 0; v--)
		s.vals[v].cons = s.vals[v - 1].cons;
	s.vals[0].cons = 0;
	for (int i = 0; i < n; i++) {
		const int *in = &s.in_val[s.nodes[i].in_start];
		for (int k = 0; k < s.nodes[i].n_in; k++)
			if (first_operand(p, i, in, k))
				s.cons[s.vals[in[k] + 1].cons++] = i;
	}
	for (int i = 0; i < t->n_outputs; i++)
		s.is_output[t->outputs[i]->id] = true;
	for (int v = 0; v < nv; v++)
		s.vals[v].numel = fz_type_numel_at(&t->values[v]->type, p->probe_sizes);
	p->def_of = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)nv + 1));
	if (!p->def_of)
		goto done;
	for (int v = 0; v < nv; v++)
		p->def_of[v] = s.vals[v].def;
	p->node_in_start = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	p->node_in = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n_edges + 1));
	p->node_out = fz_arena_alloc(&p->arena, sizeof(int) * (2 * (size_t)n + 1));
	if (!p->node_in_start || !p->node_in || !p->node_out)
		goto done;
	for (int i = 0; i < n; i++) {
		p->node_in_start[i] = s.nodes[i].in_start;
		p->node_out[2 * i] = s.nodes[i].n_out > 0 ? s.nodes[i].out[0] : -1;
		p->node_out[2 * i + 1] = s.nodes[i].n_out > 1 ? s.nodes[i].out[1] : -1;
	}
	p->node_in_start[n] = n_edges;
	memcpy(p->node_in, s.in_val, sizeof(int) * (size_t)n_edges);

	/* the canonical order */
	for (int i = 0; i < n; i++) {
		const fz_node *nd = t->nodes[i];
		const int *in = &s.in_val[s.nodes[i].in_start];
		int d = 0;
		for (int k = 0; k < nd->n_in; k++) {
			int def = s.vals[in[k]].def;
			if (def >= 0 && s.depth[def] + 1 > d)
				d = s.depth[def] + 1;
		}
		s.depth[i] = d;
		s.hash[i] = hash_node(&s, nd);
		order[i] = i;
	}
	sort_ctx = &s;
	qsort(order, (size_t)n, sizeof *order, cmp_canon);
	s.work += (int64_t)nv + n_edges + fz_nlogn(n);
	for (int i = 0; i < n; i++)
		s.rank[order[i]] = i;
	p->canon_rank = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	if (!p->canon_rank)
		goto done;
	memcpy(p->canon_rank, s.rank, sizeof(int) * (size_t)n);

	for (int i = 0; i < n; i++) {
		const fz_node *nd = t->nodes[i];
		fz_opclass c = fz_ops[nd->op].cls;
		s.g[i].parent = i;
		s.g[i].next = -1;
		s.g[i].tail = i;
		s.g[i].size = 1;
		s.g[i].ord = i;
		s.g[i].red = is_reduction(nd->op) ? i : -1;
		s.g[i].flags = c == FZ_CLASS_LIBRARY || c == FZ_CLASS_COLLECTIVE ||
			     c == FZ_CLASS_WAIT || c == FZ_CLASS_SCAN ||
			     c == FZ_CLASS_SELECT ? G_FIXED : 0;
		if (c == FZ_CLASS_ATTENTION)
			s.g[i].flags = G_FIXED | G_ATTN;
		if (nd->op == FZ_OP_TAKE)
			s.g[i].flags |= G_TAKE;
		if (nd->op == FZ_OP_INDEX_ADD)
			s.g[i].flags |= G_INDEX_ADD;
	}

	/* attention_dkv reading repeated kv heads unrepeated: one fixed group
	 * with the sums of dk and dv over each group, rooted at its last live
	 * node. Its place in the order is the op's: what the group reads is
	 * the op's operands, all before it; what reads the group reads a sum,
	 * all after the op (a reader of dk's sum may come before dv's sum,
	 * the root) */
	for (int i = 0; p->attn_fold && i < n; i++) {
		const fz_attn_fold *f = &p->attn_fold[i];
		if (!f->sum[0][1] || (p->dead && p->dead[i]))
			continue;
		int ids[5] = {i, f->sum[0][0]->id, f->sum[0][1]->id, f->sum[1][0]->id,
			      f->sum[1][1]->id}, root = i;
		for (int j = 1; j < 5; j++)
			if (!(p->dead && p->dead[ids[j]]) && ids[j] > root)
				root = ids[j];
		attn_group(&s, root, ids, 5, p->dead);
		s.g[root].ord = i;
		s.work += 5;
	}

	/* attention written out (ir/attention.c): each form one fixed group
	 * before any fusion, rooted at its second product, which follows all
	 * its other nodes (they are its ancestors, and nothing outside reads
	 * them), so the group's ord is the product's and stays topological */
	for (int i = 0; i < n; i++) {
		int ids[96];
		int m = t->nodes[i]->op == FZ_OP_MATMUL ?
			fz_attn_match(t, t->nodes[i], ids, 96) : 0;
		s.work += 1 + m;
		bool free_nodes = m > 0;
		for (int j = 0; j < m && free_nodes; j++)
			free_nodes = find(&s, ids[j]) == ids[j] && s.g[ids[j]].size == 1 &&
				     ids[j] <= i;
		if (!free_nodes)
			continue;
		attn_group(&s, i, ids, m, NULL);
	}

	/* producer-consumer fusion in the canonical order, swept again while
	 * a sweep merges something (a shared constant joins once all its
	 * readers have) */
	for (int sweep = 0, changed = 1; changed && sweep < MAX_SWEEPS; sweep++) {
		changed = 0;
		s.work += n + n_edges;
		for (int j = 0; j < n; j++) {
			int i = order[j];
			if (p->dead && p->dead[i]) /* stays alone, in no region */
				continue;
			const int *in = &s.in_val[s.nodes[i].in_start];
			for (int k = 0; k < s.nodes[i].n_in; k++) {
				int def = s.vals[in[k]].def;
				if (def < 0)
					continue;
				int ra = find(&s, def), rb = find(&s, i);
				if (ra != rb && can_merge(&s, ra, rb)) {
					merge(&s, ra, rb);
					changed = 1;
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
		if (p->dead && p->dead[order[j]])
			continue;
		if (rid[r] < 0)
			rid[r] = n_regions++;
	}
	for (int i = 0; i < n; i++)
		if (find(&s, i) == i && rid[i] >= 0)
			rid[i] = n_regions - 1 - rid[i];
	p->n_regions = n_regions;
	p->regions = fz_arena_alloc(&p->arena, sizeof(fz_region *) *
				    ((size_t)n_regions + 1));
	if (!p->regions)
		goto done;
	for (int i = 0; i < n; i++) {
		int r = find(&s, i);
		p->region_of[i] = -1;
		if (p->dead && p->dead[i])
			continue;
		if (rid[r] >= 0 && !p->regions[rid[r]]) {
			fz_region *R = fz_arena_alloc(&p->arena, sizeof *R);
			if (!R)
				goto done;
			R->id = rid[r];
			R->nodes = fz_arena_alloc(&p->arena, sizeof(fz_node *) *
						  (size_t)s.g[r].size);
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
		if (s.g[root].flags & G_ATTN) {
			R->kind = FZ_REGION_ATTENTION;
			continue;
		}
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
		if (s.g[root].red < 0) {
			R->kind = s.g[root].flags & (G_TAKE | G_INDEX_ADD) ?
				  FZ_REGION_INDEXING : FZ_REGION_POINTWISE;
			for (int j = 0; j < R->n_nodes; j++)
				if (R->nodes[j]->op == FZ_OP_TAKE_ALONG)
					R->kind = FZ_REGION_INDEXING;
			continue;
		}
		const fz_node *rn = t->nodes[s.g[root].red];
		int64_t din = s.vals[rn->in[0]->id].numel, dr = s.vals[rn->out[0]->id].numel;
		bool norm = false;
		for (int j = 0; j < R->n_nodes; j++) {
			const fz_node *nd = R->nodes[j];
			bool d = false;
			for (int k = 0; k < nd->n_in; k++)
				if (nd->in[k]->def && p->region_of[nd->in[k]->def->id] == r)
					d |= dep[nd->in[k]->id];
			if (d && (is_reduction(nd->op) ||
				  (s.vals[nd->out[0]->id].numel == din && din != dr)))
				norm = true;
			for (int k = 0; k < nd->n_out; k++)
				dep[nd->out[k]->id] = d || is_reduction(nd->op);
		}
		R->kind = norm ? FZ_REGION_NORMALIZATION : FZ_REGION_REDUCTION;
	}
	free(dep);
	s.work += 2 * ((int64_t)n + n_edges); /* numbering, kinds */
	st = fz_regions_link(p);
done:
	free(s.g);
	free(s.nodes);
	free(s.vals);
	free(s.in_val);
	free(s.cons);
	free(s.stack);
	free(s.fwd);
	free(s.bwd);
	free(s.pool);
	free(s.tmp);
	free(s.hash);
	free(s.depth);
	free(s.rank);
	free(s.is_output);
	free(order);
	free(rid);
	p->work += s.work;
	return st;
}
