/*
 * schedule.c: an order of the regions that keeps peak live bytes low.
 *
 * The cost of an order is fz_order_peak (plan.c): before a region runs its
 * new outputs are allocated, and the live total then is what the peak
 * counts; after it runs, every buffer it read for the last time is freed.
 * A pointwise output may take over an input buffer that dies there (same
 * bytes, read only elementwise), and then allocates nothing.
 *
 * Three orders are computed and the best is kept:
 *
 *   - the written order: regions ready to run are taken by the position of
 *     their first op in the trace. It is also what `peak_bytes_trace_order`
 *     reports, and the plan is never worse than it.
 *   - the greedy list scheduler: among the ready regions take the one whose
 *     run changes the live total least (new bytes minus bytes it frees);
 *     ties go to the region with the longest path still ahead of it (the
 *     one the rest of the program waits on longest), then to the lower
 *     region id (canonical, from the partition). On the seed-004 chain this
 *     walks one path at a time: relu, matmul, relu, then the chain matmul
 *     that consumes it, and never holds more than three tensors.
 *   - the exact search, when the program has at most 64 regions and at most
 *     `exact_max_states` (default 200000) downsets: after a set S of regions
 *     has run, the live bytes depend only on S, not on the order that got
 *     there, so the best peak reaching S is a dynamic program over the
 *     downsets of the region graph, level by level. Past the bound it gives
 *     up and the greedy order stands.
 *
 * Cost: building the region graph and the written order is O((regions +
 * edges) log regions) (a heap); the greedy order keeps the ready regions
 * in a heap whose keys are mended only when an input buffer gets down to
 * its last reader (see ready_heap), so it is O((regions + edges) log
 * regions) too; the exact search only runs on 64 regions or fewer, under
 * its bound of states. The replays of fz_order_peak are linear.
 *
 * A lower bound is also computed: every region must hold its inputs and
 * its outputs at once (less what it may take over in place), and at the end
 * every program output is live. A greedy order that meets it is optimal.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct sched {
	fz_program *p;
	int n;
	int *pred_start, *preds, *succ_start, *succs;
	int *height;
	/* per region: distinct input buffers (roots, no params) */
	int *in_start, *ins;
	int *readers;        /* per value: regions reading its buffer */
	int *rd_start, *rd;  /* CSR: buffer id -> the regions reading it */
	bool *pinned, *owned;
} sched;

static bool owns(const fz_program *p, const fz_value *v)
{
	return v->def && fz_view_root_id(p, v) == v->id;
}

/* owns, by id, from the arrays */
static bool owns_id(const fz_program *p, int v)
{
	return !fz_id_is_param(p, v) && fz_root_id(p, v) == v;
}

/* The in-place rule, for one region: which inputs each output may take
 * over. Only a pointwise region's elementwise outputs may, and only an input
 * buffer it owns (no view of it is read beside it), read along elementwise
 * ops only, of the output's extents and element size, and only an input
 * the output itself is computed from. That last condition is what makes
 * the overwrite safe in the kernel: element i of the output is stored
 * after, and because of, the load of element i of the input, and every
 * other read of that element in the region is the same load (the
 * emitter's memo; every value computed from the input elementwise has its
 * shape, so it is in the output's loop). An output that does not read the
 * input could be stored before another output loads it (y = m - x, with m
 * over x: issue 23). */
void fz_region_donors(const fz_program *p, const fz_region *R, bool *reach,
		      int *count, int *list)
{
	for (int k = 0; k < R->n_out; k++)
		count[k] = 0;
	if (R->kind != FZ_REGION_POINTWISE)
		return;
	for (int k = 0; k < R->n_in; k++) {
		fz_value *b = R->in[k];
		if (!owns(p, b))
			continue;
		bool alone = true; /* no other input is a view of b */
		for (int j = 0; j < R->n_in; j++)
			if (j != k && fz_view_root_id(p, R->in[j]) == b->id)
				alone = false;
		if (!alone)
			continue;
		reach[b->id] = true;
		bool ok = true;
		int j;
		for (j = 0; j < R->n_nodes && ok; j++) {
			const fz_node *nd = R->nodes[j];
			bool d = false;
			for (int i = 0; i < nd->n_in; i++)
				d |= reach[nd->in[i]->id];
			if (d && !fz_op_is_elementwise(nd->op))
				ok = false;
			for (int i = 0; i < nd->n_out; i++)
				reach[nd->out[i]->id] = d;
		}
		/* the outputs computed from b, of its extents and element size */
		for (int o = 0; o < R->n_out && ok; o++) {
			const fz_value *y = R->out[o];
			if (!reach[y->id] || !owns(p, y) ||
			    !fz_op_is_elementwise(y->def->op))
				continue;
			bool same = b->type.rank == y->type.rank &&
				    fz_dtype_size(b->type.dtype) ==
				    fz_dtype_size(y->type.dtype);
			for (int d = 0; same && d < y->type.rank; d++)
				same = fz_ext_eq(b->type.dims[d], y->type.dims[d]);
			if (same)
				list[o * R->n_in + count[o]++] = b->id;
		}
		/* clear what this walk set, not all the marks: a memset per
		 * input made this quadratic in the trace */
		reach[b->id] = false;
		while (j-- > 0)
			for (int i = 0; i < R->nodes[j]->n_out; i++)
				reach[R->nodes[j]->out[i]->id] = false;
	}
}

/* bytes and in-place candidates per value */
static fz_status prepare_values(fz_program *p)
{
	const fz_trace *t = p->trace;
	int nv = t->n_values, max_in = 0, max_out = 0;
	for (int r = 0; r < p->n_regions; r++) {
		if (p->regions[r]->n_in > max_in)
			max_in = p->regions[r]->n_in;
		if (p->regions[r]->n_out > max_out)
			max_out = p->regions[r]->n_out;
	}
	/* bytes depend on the values and the views alone: a second schedule
	 * (after horizontal fusion) keeps them */
	bool have_bytes = p->bytes != NULL;
	if (!have_bytes)
		p->bytes = fz_arena_alloc(&p->arena, sizeof(int64_t) * ((size_t)nv + 1));
	p->n_donors = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)nv + 1));
	p->donors = fz_arena_alloc(&p->arena, sizeof(int *) * ((size_t)nv + 1));
	bool *reach = calloc((size_t)nv + 1, sizeof(bool));
	int *count = malloc(sizeof(int) * ((size_t)max_out + 1));
	int *list = malloc(sizeof(int) * ((size_t)max_in * (size_t)max_out + 1));
	fz_status st = FZ_ENOMEM;
	if (!p->bytes || !p->n_donors || !p->donors || !reach || !count ||
	    !list)
		goto done;
	for (int v = 0; v < nv && !have_bytes; v++) {
		const fz_value *x = t->values[v];
		int64_t e = fz_type_numel_at(&x->type, p->sym_sizes);
		if (x->def && p->region_of && !p->view_of[v] && e >= 0 &&
		    !__builtin_mul_overflow(e, (int64_t)fz_dtype_size(x->type.dtype), &e))
			p->bytes[v] = e;
	}
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = p->regions[r];
		if (R->kind != FZ_REGION_POINTWISE)
			continue;
		fz_region_donors(p, R, reach, count, list);
		for (int k = 0; k < R->n_out; k++) {
			if (!count[k])
				continue;
			int *l = fz_arena_alloc(&p->arena, sizeof(int) * (size_t)count[k]);
			if (!l)
				goto done;
			memcpy(l, list + k * R->n_in, sizeof(int) * (size_t)count[k]);
			p->n_donors[R->out[k]->id] = count[k];
			p->donors[R->out[k]->id] = l;
		}
	}
	st = FZ_OK;
done:
	free(reach);
	free(count);
	free(list);
	return st;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

static fz_status build_graph(sched *s)
{
	fz_program *p = s->p;
	const fz_trace *t = p->trace;
	int n = s->n, nv = t->n_values;
	int cap = 0;
	for (int r = 0; r < n; r++)
		cap += p->regions[r]->n_in;
	s->pred_start = calloc((size_t)n + 1, sizeof(int));
	s->preds = calloc((size_t)cap + 1, sizeof(int));
	s->succ_start = calloc((size_t)n + 2, sizeof(int));
	s->succs = calloc((size_t)cap + 1, sizeof(int));
	s->in_start = calloc((size_t)n + 1, sizeof(int));
	s->ins = calloc((size_t)cap + 1, sizeof(int));
	s->height = calloc((size_t)n + 1, sizeof(int));
	s->readers = calloc((size_t)nv + 1, sizeof(int));
	s->pinned = calloc((size_t)nv + 1, sizeof(bool));
	s->owned = calloc((size_t)nv + 1, sizeof(bool));
	if (!s->pred_start || !s->preds || !s->succ_start || !s->succs ||
	    !s->in_start || !s->ins || !s->height || !s->readers || !s->pinned ||
	    !s->owned)
		return FZ_ENOMEM;
	int np = 0, ni = 0;
	for (int r = 0; r < n; r++) {
		const fz_region *R = p->regions[r];
		s->pred_start[r] = np;
		s->in_start[r] = ni;
		for (int k = 0; k < R->n_in; k++) {
			const fz_value *v = R->in[k];
			if (v->def)
				s->preds[np++] = p->region_of[fz_def_id(p, v)];
			int b = fz_root_id(p, fz_in_id(R, k));
			if (!fz_id_is_param(p, b))
				s->ins[ni++] = b;
		}
		qsort(s->preds + s->pred_start[r], (size_t)(np - s->pred_start[r]),
		      sizeof(int), cmp_int);
		qsort(s->ins + s->in_start[r], (size_t)(ni - s->in_start[r]),
		      sizeof(int), cmp_int);
		/* dedupe */
		int w = s->pred_start[r];
		for (int i = s->pred_start[r]; i < np; i++)
			if (i == s->pred_start[r] || s->preds[i] != s->preds[i - 1])
				s->preds[w++] = s->preds[i];
		np = w;
		w = s->in_start[r];
		for (int i = s->in_start[r]; i < ni; i++)
			if (i == s->in_start[r] || s->ins[i] != s->ins[i - 1])
				s->ins[w++] = s->ins[i];
		ni = w;
		for (int i = s->in_start[r]; i < ni; i++)
			s->readers[s->ins[i]]++;
	}
	s->pred_start[n] = np;
	s->in_start[n] = ni;
	s->rd_start = calloc((size_t)nv + 2, sizeof(int));
	s->rd = calloc((size_t)ni + 1, sizeof(int));
	if (!s->rd_start || !s->rd)
		return FZ_ENOMEM;
	for (int v = 0; v < nv; v++)
		s->rd_start[v + 1] = s->rd_start[v] + s->readers[v];
	for (int r = 0; r < n; r++)
		for (int i = s->in_start[r]; i < s->in_start[r + 1]; i++) {
			int b = s->ins[i];
			s->rd[s->rd_start[b + 1] - s->readers[b]--] = r;
		}
	for (int r = 0; r < n; r++)
		for (int i = s->in_start[r]; i < s->in_start[r + 1]; i++)
			s->readers[s->ins[i]]++;
	for (int i = 0; i < np; i++)
		s->succ_start[s->preds[i] + 1]++;
	for (int r = 0; r < n; r++)
		s->succ_start[r + 1] += s->succ_start[r];
	int *fill = calloc((size_t)n + 1, sizeof(int));
	if (!fill)
		return FZ_ENOMEM;
	for (int r = 0; r < n; r++)
		for (int i = s->pred_start[r]; i < s->pred_start[r + 1]; i++) {
			int q = s->preds[i];
			s->succs[s->succ_start[q] + fill[q]++] = r;
		}
	free(fill);
	for (int i = 0; i < t->n_outputs; i++)
		s->pinned[fz_view_root_id(p, t->outputs[i])] = true;
	for (int v = 0; v < nv; v++)
		s->owned[v] = owns_id(p, v) && p->bytes[v] >= 0;
	/* heights, from the sinks back: region ids are not topological, so
	 * walk a topological order found by Kahn */
	int *indeg = calloc((size_t)n + 1, sizeof(int)), *topo = malloc(sizeof(int) * ((size_t)n + 1));
	if (!indeg || !topo) {
		free(indeg);
		free(topo);
		return FZ_ENOMEM;
	}
	int h = 0, tl = 0;
	for (int r = 0; r < n; r++)
		if ((indeg[r] = s->pred_start[r + 1] - s->pred_start[r]) == 0)
			topo[tl++] = r;
	while (h < tl) {
		int r = topo[h++];
		for (int i = s->succ_start[r]; i < s->succ_start[r + 1]; i++)
			if (--indeg[s->succs[i]] == 0)
				topo[tl++] = s->succs[i];
	}
	FZ_ASSERT(tl == n); /* the partition never makes a cycle */
	for (int i = n - 1; i >= 0; i--) {
		int r = topo[i], best = 0;
		for (int j = s->succ_start[r]; j < s->succ_start[r + 1]; j++)
			if (s->height[s->succs[j]] + 1 > best)
				best = s->height[s->succs[j]] + 1;
		s->height[r] = best;
	}
	free(indeg);
	free(topo);
	return FZ_OK;
}

/* ---- the written order: a heap on the first op's position ---- */

static void heap_push(int *heap, int *n, int x, const int *key)
{
	int i = (*n)++;
	heap[i] = x;
	while (i > 0 && key[heap[(i - 1) / 2]] > key[heap[i]]) {
		int pa = (i - 1) / 2, tmp = heap[pa];
		heap[pa] = heap[i];
		heap[i] = tmp;
		i = pa;
	}
}

static int heap_pop(int *heap, int *n, const int *key)
{
	int top = heap[0];
	heap[0] = heap[--*n];
	for (int i = 0;;) {
		int l = 2 * i + 1, r = l + 1, m = i;
		if (l < *n && key[heap[l]] < key[heap[m]])
			m = l;
		if (r < *n && key[heap[r]] < key[heap[m]])
			m = r;
		if (m == i)
			break;
		int tmp = heap[m];
		heap[m] = heap[i];
		heap[i] = tmp;
		i = m;
	}
	return top;
}

static fz_status written_order(sched *s, int *order)
{
	int n = s->n;
	int *indeg = calloc((size_t)n + 1, sizeof(int));
	int *key = calloc((size_t)n + 1, sizeof(int));
	int *heap = calloc((size_t)n + 1, sizeof(int));
	if (!indeg || !key || !heap) {
		free(indeg);
		free(key);
		free(heap);
		return FZ_ENOMEM;
	}
	int hn = 0, k = 0;
	for (int r = 0; r < n; r++) {
		const fz_region *R = s->p->regions[r];
		key[r] = R->n_nodes ? R->nodes[0]->id : 0;
		if ((indeg[r] = s->pred_start[r + 1] - s->pred_start[r]) == 0)
			heap_push(heap, &hn, r, key);
	}
	while (hn > 0) {
		int r = heap_pop(heap, &hn, key);
		order[k++] = r;
		for (int i = s->succ_start[r]; i < s->succ_start[r + 1]; i++)
			if (--indeg[s->succs[i]] == 0)
				heap_push(heap, &hn, s->succs[i], key);
	}
	free(indeg);
	free(key);
	free(heap);
	return FZ_OK;
}

/* ---- greedy ---- */

/* Bytes running r would allocate and free, given what is still to read. */
static void step_effect(sched *s, int r, const int *left, int64_t *alloc,
			int64_t *freed)
{
	const fz_program *p = s->p;
	const fz_region *R = p->regions[r];
	int64_t a = 0, f = 0;
	int donated[8], nd = 0;
	s->p->work += 1 + R->n_out + s->in_start[r + 1] - s->in_start[r];
	for (int k = 0; k < R->n_out; k++) {
		int o = fz_out_id(R, k);
		if (!s->owned[o])
			continue;
		int donor = -1;
		for (int d = 0; d < p->n_donors[o] && donor < 0; d++) {
			int b = p->donors[o][d];
			bool used = false;
			for (int i = 0; i < nd; i++)
				used |= donated[i] == b;
			if (left[b] == 1 && !s->pinned[b] && !used)
				donor = b;
		}
		if (donor >= 0 && nd < 8)
			donated[nd++] = donor;
		else
			a += p->bytes[o];
		if (left[o] == 0 && !s->pinned[o] && donor < 0)
			f += p->bytes[o];
	}
	for (int i = s->in_start[r]; i < s->in_start[r + 1]; i++) {
		int b = s->ins[i];
		bool used = false;
		for (int j = 0; j < nd; j++)
			used |= donated[j] == b;
		if (left[b] == 1 && !s->pinned[b] && !used)
			f += p->bytes[b];
	}
	*alloc = a;
	*freed = f;
}

static bool owns_nothing(const sched *s, int r)
{
	const fz_region *R = s->p->regions[r];
	for (int k = 0; k < R->n_out; k++)
		if (s->owned[fz_out_id(R, k)])
			return false;
	return true;
}

/*
 * The ready regions that own an output wait in a heap ordered as the
 * greedy choice is: smaller net (bytes allocated less bytes freed), then
 * greater height, then lower id. A region's net changes only when one of
 * its input buffers gets down to one reader left (from then on running it
 * frees that buffer, or lets an output take it over in place): the other
 * counts step_effect reads (pinned, owned, an output's readers) never
 * change. The one reader left is then found on the buffer's reader list
 * (once per buffer) and, if it is waiting, its place in the heap is mended.
 * So each region enters the heap once, each buffer mends at most one
 * place, and the greedy order costs O((regions + edges) log regions),
 * not a scan of every ready region at every step.
 */
typedef struct ready_heap {
	int *h, n;      /* region ids */
	int *pos;       /* per region: its index in h, or -1 */
	int64_t *net;   /* per region: its key while it waits */
	const int *height;
	int64_t *work;
} ready_heap;

static bool ready_before(const ready_heap *q, int a, int b)
{
	if (q->net[a] != q->net[b])
		return q->net[a] < q->net[b];
	if (q->height[a] != q->height[b])
		return q->height[a] > q->height[b];
	return a < b;
}

static void ready_set(ready_heap *q, int i, int r)
{
	q->h[i] = r;
	q->pos[r] = i;
}

static void ready_fix(ready_heap *q, int i)
{
	int r = q->h[i];
	while (i > 0 && ready_before(q, r, q->h[(i - 1) / 2])) {
		ready_set(q, i, q->h[(i - 1) / 2]);
		i = (i - 1) / 2;
		++*q->work;
	}
	for (;;) {
		int c = 2 * i + 1;
		if (c >= q->n)
			break;
		if (c + 1 < q->n && ready_before(q, q->h[c + 1], q->h[c]))
			c++;
		if (!ready_before(q, q->h[c], r))
			break;
		ready_set(q, i, q->h[c]);
		i = c;
		++*q->work;
	}
	ready_set(q, i, r);
}

static void ready_push(ready_heap *q, int r, int64_t net)
{
	q->net[r] = net;
	ready_set(q, q->n++, r);
	ready_fix(q, q->n - 1);
}

static int ready_pop(ready_heap *q)
{
	int r = q->h[0];
	q->pos[r] = -1;
	if (--q->n > 0) {
		ready_set(q, 0, q->h[q->n]);
		ready_fix(q, 0);
	}
	return r;
}

static int64_t net_of(sched *s, int r, const int *left)
{
	int64_t a, f;
	step_effect(s, r, left, &a, &f);
	return a - f;
}

static void push_ready(sched *s, int r, ready_heap *q, const int *left,
		       int *queue, int *qt)
{
	if (owns_nothing(s, r))
		queue[(*qt)++] = r;
	else
		ready_push(q, r, net_of(s, r, left));
}

/* r runs: its reads are done, its successors may become ready, and the
 * last reader of a buffer that r's run leaves with one has a new net. */
static void take_region(sched *s, int r, int *left, int *indeg,
			ready_heap *q, const bool *taken, int *queue, int *qt)
{
	s->p->work += 1 + s->in_start[r + 1] - s->in_start[r] +
		      s->succ_start[r + 1] - s->succ_start[r];
	for (int i = s->in_start[r]; i < s->in_start[r + 1]; i++) {
		int b = s->ins[i];
		if (--left[b] != 1)
			continue;
		s->p->work += s->rd_start[b + 1] - s->rd_start[b];
		for (int j = s->rd_start[b]; j < s->rd_start[b + 1]; j++) {
			int u = s->rd[j];
			if (taken[u])
				continue;
			if (q->pos[u] >= 0) {
				q->net[u] = net_of(s, u, left);
				ready_fix(q, q->pos[u]);
			}
			break;
		}
	}
	for (int i = s->succ_start[r]; i < s->succ_start[r + 1]; i++)
		if (--indeg[s->succs[i]] == 0)
			push_ready(s, s->succs[i], q, left, queue, qt);
}

static fz_status greedy_order(sched *s, int *order)
{
	int n = s->n, nv = s->p->trace->n_values;
	int *indeg = calloc((size_t)n + 1, sizeof(int));
	int *queue = calloc((size_t)n + 1, sizeof(int));
	int *left = calloc((size_t)nv + 1, sizeof(int));
	bool *taken = calloc((size_t)n + 1, sizeof(bool));
	ready_heap q = {
		.h = calloc((size_t)n + 1, sizeof(int)),
		.pos = malloc(sizeof(int) * ((size_t)n + 1)),
		.net = calloc((size_t)n + 1, sizeof(int64_t)),
		.height = s->height,
		.work = &s->p->work,
	};
	fz_status st = FZ_ENOMEM;
	if (!indeg || !queue || !left || !taken || !q.h || !q.pos || !q.net)
		goto done;
	for (int r = 0; r < n; r++)
		q.pos[r] = -1;
	memcpy(left, s->readers, sizeof(int) * (size_t)nv);
	/* a region that owns no output (a view) allocates nothing: taking it
	 * at once never raises the live total, and only brings frees and
	 * in-place takeovers earlier, so it waits in a queue of its own
	 * (first ready, first taken) and is taken before any in the heap.
	 * The weights' views of a 128-layer model are all ready at the start. */
	int qh = 0, qt = 0;
	for (int r = 0; r < n; r++)
		if ((indeg[r] = s->pred_start[r + 1] - s->pred_start[r]) == 0)
			push_ready(s, r, &q, left, queue, &qt);
	for (int k = 0; k < n; k++) {
		FZ_ASSERT(qh < qt || q.n > 0);
		int r = qh < qt ? queue[qh++] : ready_pop(&q);
		order[k] = r;
		taken[r] = true;
		take_region(s, r, left, indeg, &q, taken, queue, &qt);
	}
	st = FZ_OK;
done:
	free(indeg);
	free(queue);
	free(left);
	free(taken);
	free(q.h);
	free(q.pos);
	free(q.net);
	return st;
}

/* ---- exact: dynamic programming over downsets ---- */

typedef struct dp_slot {
	uint64_t set;
	int64_t peak, live;
	int last;       /* region added last on the best path; -2: empty slot */
} dp_slot;

static dp_slot *dp_find(dp_slot *tab, size_t cap, uint64_t set)
{
	size_t i = (size_t)((set * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
	while (tab[i].last != -2 && tab[i].set != set)
		i = (i + 1) & (cap - 1);
	return &tab[i];
}

/* 1: found the best order; 0: too many states; -1: out of memory */
static int exact_order(sched *s, int *order, int max_states)
{
	int n = s->n, nv = s->p->trace->n_values;
	const fz_program *p = s->p;
	if (n > 64)
		return 0;
	/* n regions have at most 2^n downsets: the table is sized for the
	 * fewer of those and max_states (for max_states alone it was 16 MB,
	 * set up in full for a program of five regions: the sanitized
	 * test_plan took 106 s, now 94) */
	if (n < 30 && (1 << n) < max_states)
		max_states = 1 << n;
	uint64_t *predm = calloc((size_t)n + 1, sizeof(uint64_t));
	uint64_t *rdm = calloc((size_t)nv + 1, sizeof(uint64_t)); /* readers */
	int *defr = malloc(sizeof(int) * ((size_t)nv + 1));
	size_t cap = 1;
	while (cap < (size_t)max_states * 2)
		cap <<= 1;
	dp_slot *tab = malloc(sizeof *tab * cap);
	uint64_t *cur = malloc(sizeof(uint64_t) * ((size_t)max_states + 1));
	uint64_t *nxt = malloc(sizeof(uint64_t) * ((size_t)max_states + 1));
	int *left = malloc(sizeof(int) * ((size_t)nv + 1));
	int rc = -1;
	if (!predm || !rdm || !defr || !tab || !cur || !nxt || !left)
		goto done;
	for (size_t i = 0; i < cap; i++)
		tab[i].last = -2;
	for (int r = 0; r < n; r++) {
		for (int i = s->pred_start[r]; i < s->pred_start[r + 1]; i++)
			predm[r] |= 1ull << s->preds[i];
		for (int i = s->in_start[r]; i < s->in_start[r + 1]; i++)
			rdm[s->ins[i]] |= 1ull << r;
	}
	int n_states = 1, ncur = 1;
	dp_slot *z = dp_find(tab, cap, 0);
	*z = (dp_slot){0, 0, 0, -1};
	cur[0] = 0;
	for (int level = 0; level < n; level++) {
		int nn = 0;
		for (int c = 0; c < ncur; c++) {
			uint64_t S = cur[c];
			dp_slot *from = dp_find(tab, cap, S);
			/* what is left to read of each buffer, after S */
			for (int r = 0; r < n; r++) {
				if (S >> r & 1 || (predm[r] & ~S))
					continue;
				const fz_region *R = p->regions[r];
				for (int i = s->in_start[r]; i < s->in_start[r + 1]; i++) {
					int b = s->ins[i];
					left[b] = __builtin_popcountll(rdm[b] & ~S);
				}
				for (int k = 0; k < R->n_out; k++)
					left[R->out[k]->id] = __builtin_popcountll(rdm[R->out[k]->id]);
				for (int k = 0; k < R->n_out; k++) {
					const fz_value *o = R->out[k];
					for (int d = 0; d < p->n_donors[o->id]; d++) {
						int b = p->donors[o->id][d];
						left[b] = __builtin_popcountll(rdm[b] & ~S);
					}
				}
				int64_t a, f;
				step_effect(s, r, left, &a, &f);
				int64_t peak = from->live + a;
				if (from->peak > peak)
					peak = from->peak;
				uint64_t T = S | 1ull << r;
				dp_slot *to = dp_find(tab, cap, T);
				if (to->last == -2) {
					if (n_states >= max_states) {
						rc = 0;
						goto done;
					}
					n_states++;
					*to = (dp_slot){T, peak, from->live + a - f, r};
					nxt[nn++] = T;
				} else if (peak < to->peak) {
					to->peak = peak;
					to->last = r;
				}
			}
		}
		uint64_t *tmp = cur;
		cur = nxt;
		nxt = tmp;
		ncur = nn;
	}
	/* walk back from the full set */
	uint64_t S = n == 64 ? ~0ull : (1ull << n) - 1;
	for (int k = n - 1; k >= 0; k--) {
		dp_slot *sl = dp_find(tab, cap, S);
		FZ_ASSERT(sl->last >= 0);
		order[k] = sl->last;
		S &= ~(1ull << sl->last);
	}
	rc = 1;
done:
	free(predm);
	free(rdm);
	free(defr);
	free(tab);
	free(cur);
	free(nxt);
	free(left);
	return rc;
}

static int64_t lower_bound(sched *s)
{
	const fz_program *p = s->p;
	int64_t lb = 0, outs = 0;
	for (int v = 0; v < p->trace->n_values; v++)
		if (s->pinned[v] && s->owned[v])
			outs += p->bytes[v];
	lb = outs;
	for (int r = 0; r < s->n; r++) {
		const fz_region *R = p->regions[r];
		int64_t b = 0;
		for (int i = s->in_start[r]; i < s->in_start[r + 1]; i++)
			b += p->bytes[s->ins[i]];
		for (int k = 0; k < R->n_out; k++)
			if (s->owned[R->out[k]->id] && !p->n_donors[R->out[k]->id])
				b += p->bytes[R->out[k]->id];
		if (b > lb)
			lb = b;
	}
	return lb;
}

fz_status fz_schedule(fz_program *p)
{
	sched s = {.p = p, .n = p->n_regions};
	int n = p->n_regions;
	fz_status st = prepare_values(p);
	int *tmp = NULL;
	if (st != FZ_OK)
		return st;
	st = FZ_ENOMEM;
	p->order = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	p->trace_order = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	tmp = malloc(sizeof(int) * ((size_t)n + 1));
	if (!p->order || !p->trace_order || !tmp)
		goto done;
	if ((st = build_graph(&s)) != FZ_OK ||
	    (st = written_order(&s, p->trace_order)) != FZ_OK ||
	    (st = greedy_order(&s, p->order)) != FZ_OK)
		goto done;
	st = FZ_ENOMEM;
	/* the graph, the written order's heap, two replays */
	p->work += (int64_t)p->trace->n_values + 4 * ((int64_t)n + s.pred_start[n]) +
		   2 * fz_nlogn(n);
	p->work += (int64_t)n + s.pred_start[n]; /* the lower bound */
	p->peak_bytes_trace_order = fz_order_peak(p, p->trace_order);
	p->peak_bytes = fz_order_peak(p, p->order);
	p->method = FZ_SCHED_GREEDY;
	p->peak_lower_bound = lower_bound(&s);
	if (p->peak_bytes < 0 || p->peak_bytes_trace_order < 0)
		goto done;
	if (p->peak_bytes > p->peak_lower_bound) {
		int max = p->opts.exact_max_states > 0 ? p->opts.exact_max_states : 200000;
		int rc = exact_order(&s, tmp, max);
		if (rc < 0)
			goto done;
		if (rc == 1) {
			int64_t pk = fz_order_peak(p, tmp);
			if (pk < 0)
				goto done;
			p->method = FZ_SCHED_EXACT;
			p->peak_proven_optimal = true;
			if (pk < p->peak_bytes) {
				memcpy(p->order, tmp, sizeof(int) * (size_t)n);
				p->peak_bytes = pk;
			}
		}
	} else {
		p->peak_proven_optimal = true;
	}
	if (p->peak_bytes_trace_order < p->peak_bytes) {
		memcpy(p->order, p->trace_order, sizeof(int) * (size_t)n);
		p->peak_bytes = p->peak_bytes_trace_order;
		p->method = FZ_SCHED_TRACE;
	}
	st = FZ_OK;
done:
	free(tmp);
	free(s.pred_start);
	free(s.preds);
	free(s.succ_start);
	free(s.succs);
	free(s.in_start);
	free(s.ins);
	free(s.height);
	free(s.readers);
	free(s.rd_start);
	free(s.rd);
	free(s.pinned);
	free(s.owned);
	return st;
}
