/*
 * horizontal.c: independent kernels that a person would run as one become
 * one, where the planned peak does not rise.
 *
 * Partition fuses producers into consumers. What it leaves apart are
 * siblings: kernels with no path between them that read the same input or
 * walk the same iteration domain. The column min and max an int8 observer
 * records (amin and amax of w over dim 0) are two reductions over one
 * input; rotary's q and k rotations are two pointwise kernels over one
 * shape, reading the same cos and sin. One kernel each time reads the
 * shared input once and launches once.
 *
 * Fusing siblings can cost memory: it forces both to run at one step, so
 * what one of them makes is allocated early, or what the other one reads
 * is kept late. On the seed-004 chain (ten relu/matmul paths feeding a
 * chain of matmuls) batching the relus is exactly what raised the peak from
 * 0.75 MiB to 2.25 MiB. So a merge is taken only when the planned peak does
 * not rise, and that is decided on the real rule (fz_order_peak's replay),
 * which is why this pass runs after schedule: the peak only means something
 * once views own no storage (bookend), bytes and in-place takeovers are
 * known, and there is an order to start from.
 *
 * The argument. Let σ be the planned order, of peak P, and A (step i) and B
 * (step j > i) the candidates. With no path between them, two orders run
 * them as one region AB and keep every other step where it was:
 *
 *   late:  AB at step j; the steps between that descend from A move just
 *          after it, the others keep their order before it;
 *   early: AB at step i; the steps between that B descends from move just
 *          before it, the others keep their order after it.
 *
 * Outside steps i..j both run the same set of regions before each step as
 * σ did, and the live bytes after a set of regions has run depend on the
 * set alone (what was made and is still to be read, or is an output; an
 * in-place takeover only lowers the peak of its own step). So only steps
 * i..j can change, and a replay of those steps, starting from the live
 * bytes before step i and the readers each buffer has left, gives the peak
 * of the whole new order. The merge is taken when that window's peak stays
 * at or below P (the planned peak before this pass, which bounds every step
 * of σ), and σ becomes the new order. At the end the program is scheduled
 * again, and the order judged here competes with the scheduler's, so the
 * planned peak never rises. The replay after step j must meet σ's live
 * bytes again; the pass asserts it.
 *
 * Which pairs. Kernels the code generator runs as one: pointwise with
 * pointwise whose outputs have one element count (the pointwise skeleton
 * loops once per output shape); reductions or normalizations with
 * reductions or normalizations of the same input shape and reduced dims
 * (the row skeleton makes one pass per reduction over the same rows); a
 * pointwise kernel with a reduction or normalization when every output of
 * the pointwise one has the extents of the rows (the row skeleton's last
 * pass over the row computes it, as DiT's adaLN computes the gated
 * residual beside the modulated layer norm of the same x); all with the
 * same vector access, so neither is slowed by the other. Never library
 * calls, collectives, waits, indexing or views. Candidates lie at
 * most WINDOW steps apart in σ, and a fused kernel holds at most
 * MAX_MEMBERS of the regions before: the search is linear in the program.
 * Within it, a candidate's replay covers at most WINDOW + 1 steps, and the
 * readers each buffer has left are kept as the sweep goes (left_of), not
 * counted on its whole reader list, which for a buffer every layer reads
 * made the pass quadratic.
 * Pairs that share an input are tried first, over the whole order; then
 * pairs that only share a domain. A path between the two (the walk from A
 * forward over steps before j finds B) refuses the pair: one kernel cannot
 * wait on itself. Steps are taken in σ's order, which comes from canonical
 * region ids, so a renamed or reordered trace fuses the same way.
 *
 *     quantize_per_channel: amin(w, dims=[0]) and amax(w, dims=[0]) become
 *     one reduction of 688 x 256 columns, two results per column: 2
 *     kernels, not 3, peak unchanged.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define WINDOW 16      /* candidates lie at most this many steps apart */
#define MAX_MEMBERS 4  /* regions in one horizontally fused kernel */

enum { C_NONE, C_POINTWISE, C_ROWS };

typedef struct hz {
	fz_program *p;
	const fz_trace *t;
	int n;                      /* regions when the pass starts */
	/* union-find over regions; a root's members are a linked list */
	int *parent, *next, *tail, *members;
	fz_region **cur;            /* per root: the region as it stands */
	int *cls;                   /* per region: C_* */
	int64_t *dom;               /* per region: element count (pointwise) */
	const fz_node **red;        /* per region: a reduction of its rows */
	int *pred_start, *preds, *succ_start, *succs; /* between regions */
	int *rd_start, *rd;         /* per buffer: the regions reading it */
	/* the order: step -> root (-1: a hole left by a merge), root -> step */
	int m, *at, *slot;
	int64_t *live_before;       /* per step */
	int *n_don, **don;          /* per value: in-place candidates */
	bool *pinned;
	int64_t limit;              /* the planned peak before the pass */

	/* scratch */
	int eval, *left, *left_mark; /* readers left, valid where marked */
	/* per buffer: the roots reading it whose step is base_first or later
	 * (see left_of); both[b] == both_stamp where both candidates read b */
	int *base, base_first, *both, both_stamp;
	bool *donated;
	int step, *seen;            /* per value: dedup of one step's reads */
	int gcur, *gmark;
	int *stack, *walk, n_walk;
	int win[2][WINDOW + 2], n_win[2];
	int64_t win_live[2][WINDOW + 2];
	bool *reach;
	int *dcount, *dlist;
	int cap_nodes, cap_in, cap_out;
	fz_region tent;             /* the candidate merged region */
	int tx, ty;                 /* its two roots */
} hz;

static int find(hz *h, int x)
{
	while (h->parent[x] != x)
		x = h->parent[x] = h->parent[h->parent[x]];
	return x;
}

static bool is_reduction(fz_opcode op)
{
	return fz_ops[op].cls == FZ_CLASS_REDUCTION;
}

static void classify(hz *h, int r)
{
	const fz_region *R = h->p->regions[r];
	h->cls[r] = C_NONE;
	if (R->kind == FZ_REGION_POINTWISE && R->n_out > 0) {
		int64_t d = -1;
		for (int k = 0; k < R->n_out; k++) {
			int64_t e = fz_type_numel_at(&R->out[k]->type, h->p->probe_sizes);
			if (e < 0 || (d >= 0 && e != d))
				return;
			d = e;
		}
		h->cls[r] = C_POINTWISE;
		h->dom[r] = d;
	} else if (R->kind == FZ_REGION_REDUCTION ||
		   R->kind == FZ_REGION_NORMALIZATION) {
		for (int j = 0; j < R->n_nodes && !h->red[r]; j++)
			if (is_reduction(R->nodes[j]->op))
				h->red[r] = R->nodes[j];
		if (h->red[r])
			h->cls[r] = C_ROWS;
	}
}

/* Does every output of pointwise root x have the extents of the rows
 * (the reduction's input) of root y? Then the row skeleton computes them
 * in its last pass over the row. */
static bool fits_rows(hz *h, int x, int y)
{
	const fz_region *X = h->cur[x];
	for (int k = 0; k < X->n_out; k++)
		if (!fz_same_shape(&X->out[k]->type, &h->red[y]->in[0]->type))
			return false;
	return true;
}

/* May roots x and y run as one kernel (paths aside)? */
static bool compatible(hz *h, int x, int y)
{
	const fz_program *p = h->p;
	if (h->cls[x] == C_NONE || h->cls[y] == C_NONE ||
	    h->members[x] + h->members[y] > MAX_MEMBERS ||
	    p->vec_width[x] != p->vec_width[y] || p->vec_bytes[x] != p->vec_bytes[y])
		return false;
	if (h->cls[x] == C_POINTWISE && h->cls[y] == C_POINTWISE)
		return h->dom[x] == h->dom[y];
	if (h->cls[x] == C_POINTWISE)
		return fits_rows(h, x, y);
	if (h->cls[y] == C_POINTWISE)
		return fits_rows(h, y, x);
	return fz_same_shape(&h->red[x]->in[0]->type, &h->red[y]->in[0]->type) &&
	       fz_reduced_dims(h->red[x]) == fz_reduced_dims(h->red[y]);
}

/* Do roots x and y read one buffer (a parameter or an intermediate)? */
static bool share_input(hz *h, int x, int y)
{
	const fz_region *X = h->cur[x], *Y = h->cur[y];
	h->step++;
	for (int k = 0; k < X->n_in; k++)
		h->seen[fz_root_id(h->p, fz_in_id(X, k))] = h->step;
	for (int k = 0; k < Y->n_in; k++)
		if (h->seen[fz_root_id(h->p, fz_in_id(Y, k))] == h->step)
			return true;
	return false;
}

/* ---- the candidate region ---- */

/* *a holds at least need items of size bytes (and is never NULL after
 * this, even for need 0: the merge copies from it, and memcpy's source
 * must not be NULL even for 0 bytes, say two merged regions that read
 * nothing, an iota's and a full's). */
static bool grow(void **a, int *cap, int need, size_t size)
{
	if (*a && need <= *cap)
		return true;
	int nc = *cap ? *cap : 16;
	while (nc < need)
		nc *= 2;
	void *b = realloc(*a, size * (size_t)nc);
	if (!b)
		return false;
	*a = b;
	*cap = nc;
	return true;
}

/* h->tent := the union of roots x and y, with its in-place candidates. */
static bool build_tent(hz *h, int x, int y)
{
	const fz_region *X = h->cur[x], *Y = h->cur[y];
	fz_region *T = &h->tent;
	int nn = X->n_nodes + Y->n_nodes, ni = X->n_in + Y->n_in;
	int no = X->n_out + Y->n_out;
	if (!grow((void **)&T->nodes, &h->cap_nodes, nn, sizeof(fz_node *)) ||
	    !grow((void **)&T->in, &h->cap_in, ni, sizeof(fz_value *)) ||
	    !grow((void **)&T->out, &h->cap_out, no, sizeof(fz_value *)))
		return false;
	free(h->dcount);
	free(h->dlist);
	h->dcount = malloc(sizeof(int) * ((size_t)no + 1));
	h->dlist = malloc(sizeof(int) * ((size_t)ni * (size_t)no + 1));
	if (!h->dcount || !h->dlist)
		return false;
	/* nodes: both lists ascend by id, so merge them */
	int a = 0, b = 0, k = 0;
	while (a < X->n_nodes || b < Y->n_nodes)
		T->nodes[k++] = b >= Y->n_nodes ||
				(a < X->n_nodes && X->nodes[a]->id < Y->nodes[b]->id) ?
				X->nodes[a++] : Y->nodes[b++];
	T->n_nodes = nn;
	T->in_id = T->out_id = NULL;
	/* Inputs and outputs in the order fz_regions_link gives the merged
	 * region once it is rebuilt: by the first node (ascending ids) that
	 * reads or makes each. The in-place candidates come from these lists
	 * in their order, and an output takes the first candidate free, so
	 * the replay below must see the lists the planner will: with X's
	 * inputs first and then Y's, an output took a different buffer than
	 * it would in the rebuilt program, and the peak replayed here (48
	 * bytes) was not the peak planned (64; a fuzzed trace, the pass's
	 * assertion). No path between them, so nothing one makes is read by
	 * the other: the inputs are X's and Y's, the outputs X's and Y's. */
	h->step++;
	int in_stamp = h->step;
	for (int s = 0; s < 2; s++) {
		const fz_region *R = s ? Y : X;
		for (int i = 0; i < R->n_in; i++)
			h->seen[R->in[i]->id] = in_stamp;
		for (int i = 0; i < R->n_out; i++)
			h->seen[R->out[i]->id] = in_stamp;
	}
	h->step++; /* taken: seen == h->step */
	T->n_in = T->n_out = 0;
	for (int j = 0; j < nn; j++) {
		const fz_node *nd = T->nodes[j];
		for (int i = 0; i < nd->n_in; i++) {
			fz_value *v = nd->in[i];
			if (h->seen[v->id] != in_stamp)
				continue;
			h->seen[v->id] = h->step;
			T->in[T->n_in++] = v;
		}
		for (int i = 0; i < nd->n_out; i++) {
			fz_value *v = nd->out[i];
			if (h->seen[v->id] != in_stamp)
				continue;
			h->seen[v->id] = h->step;
			T->out[T->n_out++] = v;
		}
	}
	FZ_ASSERT(T->n_in <= ni && T->n_out == no);
	/* rows with a map over them: reduce, then a pass over the row */
	T->kind = X->kind == Y->kind ? X->kind : FZ_REGION_NORMALIZATION;
	T->id = -1;
	fz_region_donors(h->p, T, h->reach, h->dcount, h->dlist);
	h->tx = x;
	h->ty = y;
	return true;
}

/* ---- the replay of a window ---- */

/*
 * Readers of buffer b not run before step `first`, the candidate's two
 * roots counted as one.
 *
 * Counting them on b's reader list at every replay made the pass
 * quadratic: rotary's cos and sin are read by every layer, and each of the
 * candidates near one of their readers counted all of them. Instead the
 * count is kept as the sweep goes (base): it starts as the number of roots
 * reading b (base_reset), drops by one when the sweep steps past a root
 * reading b (base_pass), and by one when a merge unites two roots that
 * both read b. A window starts at the sweep's step, so the count at
 * `first` is base[b], less one when the candidate's two roots both read b.
 * Each region's reads are thus counted O(1) times per sweep.
 */
static int *left_of(hz *h, int b, int first, bool tent)
{
	if (h->left_mark[b] != h->eval) {
		FZ_ASSERT(first == h->base_first);
		h->left_mark[b] = h->eval;
		h->donated[b] = false;
		h->left[b] = h->base[b] -
			     (tent && h->both[b] == h->both_stamp ? 1 : 0);
		h->p->work++;
	}
	return &h->left[b];
}

/* Calls fn(h, b) once for each buffer root g's regions read. */
static void group_reads(hz *h, int g, void (*fn)(hz *, int))
{
	const fz_program *p = h->p;
	h->step++;
	for (int r = g; r >= 0; r = h->next[r]) {
		const fz_region *R = p->regions[r];
		h->p->work += 1 + R->n_in;
		for (int k = 0; k < R->n_in; k++) {
			int b = fz_root_id(p, fz_in_id(R, k));
			if (h->seen[b] != h->step) {
				h->seen[b] = h->step;
				fn(h, b);
			}
		}
	}
}

static void base_dec(hz *h, int b) { h->base[b]--; }
static void base_inc(hz *h, int b) { h->base[b]++; }
static void mark_x(hz *h, int b) { h->both[b] = h->both_stamp - 1; }
static void mark_y(hz *h, int b)
{
	if (h->both[b] == h->both_stamp - 1)
		h->both[b] = h->both_stamp;
}

static void both_dec(hz *h, int b)
{
	if (h->both[b] == h->both_stamp)
		h->base[b]--;
}

/* The counts at step 0: every root, for every buffer it reads. */
static void base_reset(hz *h)
{
	memset(h->base, 0, sizeof(int) * (size_t)h->t->n_values);
	for (int s = 0; s < h->m; s++)
		if (h->at[s] >= 0)
			group_reads(h, h->at[s], base_inc);
	h->base_first = 0;
}

/* The sweep steps past step s. */
static void base_pass(hz *h, int s)
{
	if (h->at[s] >= 0)
		group_reads(h, h->at[s], base_dec);
	h->base_first = s + 1;
}

/* Marks the buffers both x and y read (both[b] == both_stamp). */
static void mark_both(hz *h, int x, int y)
{
	h->both_stamp += 2;
	group_reads(h, x, mark_x);
	group_reads(h, y, mark_y);
}

/*
 * Runs the roots of `win` (-2: the candidate region) from step `first`,
 * with `live` bytes live before it: fz_order_peak's rule, step for step.
 * Returns the peak; before[s] gets the live bytes before each step, and
 * before[nw] those after the last.
 */
static int64_t replay(hz *h, const int *win, int nw, int first, int64_t live,
		      int64_t *before, bool tent)
{
	const fz_program *p = h->p;
	int64_t peak = live;
	h->eval++;
	for (int s = 0; s < nw; s++) {
		const fz_region *R = win[s] == -2 ? &h->tent : h->cur[win[s]];
		int64_t alloc = 0;
		before[s] = live;
		h->p->work += 1 + 2 * R->n_out + R->n_in;
		for (int k = 0; k < R->n_out; k++) {
			int o = fz_out_id(R, k);
			if (fz_root_id(p, o) != o)
				continue;
			int nd = win[s] == -2 ? h->dcount[k] : h->n_don[o];
			const int *dl = win[s] == -2 ? h->dlist + k * R->n_in :
					h->don[o];
			int donor = -1;
			for (int d = 0; d < nd && donor < 0; d++) {
				int b = dl[d];
				if (*left_of(h, b, first, tent) == 1 && !h->pinned[b] &&
				    !h->donated[b])
					donor = b;
			}
			if (donor >= 0)
				h->donated[donor] = true;
			else
				alloc += p->bytes[o];
		}
		live += alloc;
		if (live > peak)
			peak = live;
		h->step++;
		for (int k = 0; k < R->n_in; k++) {
			int b = fz_root_id(p, fz_in_id(R, k));
			if (h->seen[b] == h->step || fz_id_is_param(p, b))
				continue;
			h->seen[b] = h->step;
			int *l = left_of(h, b, first, tent);
			if (--*l == 0 && !h->pinned[b] && !h->donated[b])
				live -= p->bytes[b];
		}
		for (int k = 0; k < R->n_out; k++) {
			int o = fz_out_id(R, k);
			if (fz_root_id(p, o) == o &&
			    *left_of(h, o, first, tent) == 0 && !h->pinned[o])
				live -= p->bytes[o];
		}
	}
	before[nw] = live;
	return peak;
}

/* ---- one candidate ---- */

/* Marks (gmark == gcur) the roots between steps i and j that x reaches
 * (forward) or that reach y (backward); false if x reaches y. */
static bool walk(hz *h, int from, int to, int i, int j, bool forward)
{
	int sp = 0;
	h->gcur++;
	h->n_walk = 0;
	h->stack[sp++] = from;
	while (sp > 0) {
		int g = h->stack[--sp];
		for (int r = g; r >= 0; r = h->next[r]) {
			const int *e = forward ? h->succs : h->preds;
			const int *st = forward ? h->succ_start : h->pred_start;
			h->p->work += 1 + st[r + 1] - st[r];
			for (int q = st[r]; q < st[r + 1]; q++) {
				int u = find(h, e[q]);
				if (u == g)
					continue;
				if (u == to)
					return false;
				if (h->slot[u] <= i || h->slot[u] >= j ||
				    h->gmark[u] == h->gcur)
					continue;
				h->gmark[u] = h->gcur;
				h->stack[sp++] = u;
			}
		}
	}
	return true;
}

/* Tries roots x (step i) and y (step j > i) as one; true if merged. */
static fz_status try_pair(hz *h, int i, int j, bool *merged)
{
	int x = h->at[i], y = h->at[j];
	*merged = false;
	/* late: AB at j, what x reaches moves after it */
	if (!walk(h, x, y, i, j, true)) {
		h->p->horizontal_refused_path++;
		return FZ_OK;
	}
	int n0 = 0, n_after = 0, after[WINDOW + 2];
	for (int s = i + 1; s < j; s++) {
		int g = h->at[s];
		if (g < 0)
			continue;
		if (h->gmark[g] == h->gcur)
			after[n_after++] = g;
		else
			h->win[0][n0++] = g;
	}
	h->win[0][n0++] = -2;
	for (int k = 0; k < n_after; k++)
		h->win[0][n0++] = after[k];
	h->n_win[0] = n0;
	/* early: AB at i, what reaches y moves before it */
	walk(h, y, x, i, j, false);
	int n1 = 0, n_rest = 0, rest[WINDOW + 2];
	for (int s = i + 1; s < j; s++) {
		int g = h->at[s];
		if (g < 0)
			continue;
		if (h->gmark[g] == h->gcur)
			h->win[1][n1++] = g;
		else
			rest[n_rest++] = g;
	}
	h->win[1][n1++] = -2;
	for (int k = 0; k < n_rest; k++)
		h->win[1][n1++] = rest[k];
	h->n_win[1] = n1;

	if (!build_tent(h, x, y))
		return FZ_ENOMEM;
	mark_both(h, x, y);
	int64_t pk[2];
	for (int v = 0; v < 2; v++)
		pk[v] = replay(h, h->win[v], h->n_win[v], i, h->live_before[i],
			       h->win_live[v], true);
	int v = pk[1] < pk[0] ? 1 : 0;
	if (pk[v] > h->limit) {
		h->p->horizontal_refused_peak++;
		return FZ_OK;
	}
	/* after the window, the same regions have run: the same live bytes */
	if (j + 1 < h->m)
		FZ_ASSERT(h->win_live[v][h->n_win[v]] == h->live_before[j + 1]);

	/* take it: x absorbs y */
	fz_program *p = h->p;
	fz_region *R = fz_arena_alloc(&p->arena, sizeof *R);
	if (!R)
		return FZ_ENOMEM;
	*R = h->tent;
	R->nodes = fz_arena_alloc(&p->arena, sizeof(fz_node *) * (size_t)R->n_nodes);
	R->in = fz_arena_alloc(&p->arena, sizeof(fz_value *) * ((size_t)R->n_in + 1));
	R->out = fz_arena_alloc(&p->arena, sizeof(fz_value *) * ((size_t)R->n_out + 1));
	R->in_id = R->out_id = NULL;
	if (!R->nodes || !R->in || !R->out)
		return FZ_ENOMEM;
	memcpy(R->nodes, h->tent.nodes, sizeof(fz_node *) * (size_t)R->n_nodes);
	memcpy(R->in, h->tent.in, sizeof(fz_value *) * (size_t)R->n_in);
	memcpy(R->out, h->tent.out, sizeof(fz_value *) * (size_t)R->n_out);
	for (int k = 0; k < R->n_out; k++) {
		int *l = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)h->dcount[k] + 1));
		if (!l)
			return FZ_ENOMEM;
		memcpy(l, h->dlist + k * R->n_in, sizeof(int) * (size_t)h->dcount[k]);
		h->n_don[R->out[k]->id] = h->dcount[k];
		h->don[R->out[k]->id] = l;
	}
	if (h->cls[x] == C_POINTWISE && h->cls[y] == C_ROWS) {
		h->cls[x] = C_ROWS;
		h->red[x] = h->red[y];
	}
	group_reads(h, y, both_dec); /* two readers of these become one */
	h->parent[y] = x;
	h->next[h->tail[x]] = y;
	h->tail[x] = h->tail[y];
	h->members[x] += h->members[y];
	h->cur[x] = R;
	h->slot[y] = -1;
	for (int s = i; s <= j; s++) {
		int k = s - i;
		if (k < h->n_win[v]) {
			int g = h->win[v][k] == -2 ? x : h->win[v][k];
			h->at[s] = g;
			h->slot[g] = s;
			h->live_before[s] = h->win_live[v][k];
		} else {
			h->at[s] = -1;
			h->live_before[s] = h->win_live[v][h->n_win[v]];
		}
	}
	p->horizontal_merged++;
	*merged = true;
	return FZ_OK;
}

/* ---- the pass ---- */

/* The canonical rank of R's last node: distinct per region. */
static int region_key(const fz_program *p, const fz_region *R)
{
	int key = -1;
	for (int j = 0; j < R->n_nodes; j++)
		if (p->canon_rank[R->nodes[j]->id] > key)
			key = p->canon_rank[R->nodes[j]->id];
	return key;
}

/* The program with the merged regions, renumbered as bookend numbers them
 * (by the canonical rank of their last node), then scheduled again; the
 * order judged above stays when the scheduler finds nothing better. */
static fz_status rebuild(hz *h)
{
	fz_program *p = h->p;
	int n = h->n, nn = 0;
	fz_region **regs = fz_arena_alloc(&p->arena, sizeof(fz_region *) * ((size_t)n + 1));
	int *vw = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	int *vb = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	int *order = malloc(sizeof(int) * ((size_t)n + 1));
	uint64_t *keys = malloc(sizeof(uint64_t) * ((size_t)n + 1));
	int *old_vw = p->vec_width, *old_vb = p->vec_bytes;
	if (!regs || !vw || !vb || !order || !keys) {
		free(order);
		free(keys);
		return FZ_ENOMEM;
	}
	/* each key once, then sorted as numbers */
	for (int r = 0; r < n; r++) {
		if (find(h, r) != r)
			continue;
		h->cur[r]->id = r; /* the old id of its root, for a moment */
		keys[nn++] = (uint64_t)region_key(p, h->cur[r]) << 32 | (uint32_t)r;
	}
	fz_sort_u64(keys, nn);
	for (int r = 0; r < nn; r++)
		regs[r] = h->cur[(uint32_t)keys[r]];
	free(keys);
	int *new_id = h->stack; /* borrowed: n ints */
	for (int r = 0; r < nn; r++) {
		fz_region *R = regs[r];
		vw[r] = old_vw[R->id];
		vb[r] = old_vb[R->id];
		new_id[R->id] = r;
		R->id = r;
		for (int j = 0; j < R->n_nodes; j++)
			p->region_of[R->nodes[j]->id] = r;
	}
	int k = 0;
	for (int s = 0; s < h->m; s++)
		if (h->at[s] >= 0)
			order[k++] = new_id[h->at[s]];
	FZ_ASSERT(k == nn);
	p->regions = regs;
	p->n_regions = nn;
	p->vec_width = vw;
	p->vec_bytes = vb;
	fz_status st = fz_regions_link(p);
	if (st == FZ_OK)
		st = fz_schedule(p);
	if (st == FZ_OK) {
		int64_t pk = fz_order_peak(p, order);
		if (pk < 0) {
			st = FZ_ENOMEM;
		} else {
			FZ_ASSERT(pk <= h->limit);
			if (pk < p->peak_bytes) {
				memcpy(p->order, order, sizeof(int) * (size_t)nn);
				p->peak_bytes = pk;
				p->method = FZ_SCHED_FUSED;
				p->peak_proven_optimal = pk == p->peak_lower_bound;
			}
		}
	}
	free(order);
	return st;
}

static fz_status build_edges(hz *h)
{
	fz_program *p = h->p;
	const fz_trace *t = h->t;
	int n = h->n, nv = t->n_values, cap = 0;
	for (int r = 0; r < n; r++)
		cap += p->regions[r]->n_in;
	h->pred_start = calloc((size_t)n + 2, sizeof(int));
	h->preds = calloc((size_t)cap + 1, sizeof(int));
	h->succ_start = calloc((size_t)n + 2, sizeof(int));
	h->succs = calloc((size_t)cap + 1, sizeof(int));
	h->rd_start = calloc((size_t)nv + 2, sizeof(int));
	h->rd = calloc((size_t)cap + 1, sizeof(int));
	int *fill = calloc((size_t)(n > nv ? n : nv) + 1, sizeof(int));
	if (!h->pred_start || !h->preds || !h->succ_start || !h->succs ||
	    !h->rd_start || !h->rd || !fill) {
		free(fill);
		return FZ_ENOMEM;
	}
	/* predecessors and buffers read, each once per region */
	int np = 0;
	for (int r = 0; r < n; r++) {
		const fz_region *R = p->regions[r];
		h->pred_start[r] = np;
		h->step++;
		h->gcur++;
		for (int k = 0; k < R->n_in; k++) {
			const fz_value *v = R->in[k];
			if (v->def) {
				int q = p->region_of[fz_def_id(p, v)];
				if (h->gmark[q] != h->gcur) {
					h->gmark[q] = h->gcur;
					h->preds[np++] = q;
				}
			}
			int b = fz_root_id(p, fz_in_id(R, k));
			if (h->seen[b] != h->step) {
				h->seen[b] = h->step;
				h->rd_start[b + 1]++;
			}
		}
	}
	h->pred_start[n] = np;
	for (int i = 0; i < np; i++)
		h->succ_start[h->preds[i] + 1]++;
	for (int r = 0; r < n; r++)
		h->succ_start[r + 1] += h->succ_start[r];
	for (int r = 0; r < n; r++)
		for (int i = h->pred_start[r]; i < h->pred_start[r + 1]; i++) {
			int q = h->preds[i];
			h->succs[h->succ_start[q] + fill[q]++] = r;
		}
	for (int v = 0; v < nv; v++)
		h->rd_start[v + 1] += h->rd_start[v];
	memset(fill, 0, sizeof(int) * (size_t)(n > nv ? n : nv));
	for (int r = 0; r < n; r++) {
		const fz_region *R = p->regions[r];
		h->step++;
		for (int k = 0; k < R->n_in; k++) {
			int b = fz_root_id(p, fz_in_id(R, k));
			if (h->seen[b] != h->step) {
				h->seen[b] = h->step;
				h->rd[h->rd_start[b] + fill[b]++] = r;
			}
		}
	}
	free(fill);
	return FZ_OK;
}

fz_status fz_horizontal(fz_program *p)
{
	if (!p->opts.horizontal || p->n_regions < 2)
		return FZ_OK;
	const fz_trace *t = p->trace;
	int n = p->n_regions, nv = t->n_values;
	hz h = {.p = p, .t = t, .n = n, .m = n, .limit = p->peak_bytes};
	fz_status st = FZ_ENOMEM;
	h.parent = calloc((size_t)n + 1, sizeof(int));
	h.next = calloc((size_t)n + 1, sizeof(int));
	h.tail = calloc((size_t)n + 1, sizeof(int));
	h.members = calloc((size_t)n + 1, sizeof(int));
	h.cur = calloc((size_t)n + 1, sizeof(fz_region *));
	h.cls = calloc((size_t)n + 1, sizeof(int));
	h.dom = calloc((size_t)n + 1, sizeof(int64_t));
	h.red = calloc((size_t)n + 1, sizeof(fz_node *));
	h.at = calloc((size_t)n + 1, sizeof(int));
	h.slot = calloc((size_t)n + 1, sizeof(int));
	h.live_before = calloc((size_t)n + 2, sizeof(int64_t));
	h.gmark = calloc((size_t)n + 1, sizeof(int));
	h.stack = calloc((size_t)n + 1, sizeof(int));
	h.n_don = calloc((size_t)nv + 1, sizeof(int));
	h.don = calloc((size_t)nv + 1, sizeof(int *));
	h.pinned = calloc((size_t)nv + 1, sizeof(bool));
	h.left = calloc((size_t)nv + 1, sizeof(int));
	h.left_mark = calloc((size_t)nv + 1, sizeof(int));
	h.donated = calloc((size_t)nv + 1, sizeof(bool));
	h.seen = calloc((size_t)nv + 1, sizeof(int));
	h.reach = calloc((size_t)nv + 1, sizeof(bool));
	h.base = calloc((size_t)nv + 1, sizeof(int));
	h.both = calloc((size_t)nv + 1, sizeof(int));
	int64_t *before = malloc(sizeof(int64_t) * ((size_t)n + 2));
	if (!h.parent || !h.next || !h.tail || !h.members || !h.cur || !h.cls ||
	    !h.dom || !h.red || !h.at || !h.slot || !h.live_before || !h.gmark ||
	    !h.stack || !h.n_don || !h.don || !h.pinned || !h.left ||
	    !h.left_mark || !h.donated || !h.seen || !h.reach || !h.base ||
	    !h.both || !before)
		goto done;
	if ((st = build_edges(&h)) != FZ_OK)
		goto done;
	st = FZ_ENOMEM;
	p->work += (int64_t)n + nv + h.pred_start[n] + h.rd_start[nv];
	for (int r = 0; r < n; r++) {
		h.parent[r] = r;
		h.next[r] = -1;
		h.tail[r] = r;
		h.members[r] = 1;
		h.cur[r] = p->regions[r];
		classify(&h, r);
	}
	for (int v = 0; v < nv; v++) {
		h.n_don[v] = p->n_donors[v];
		h.don[v] = p->donors[v];
	}
	for (int i = 0; i < t->n_outputs; i++)
		h.pinned[fz_view_root_id(p, t->outputs[i])] = true;
	for (int s = 0; s < n; s++) {
		h.at[s] = p->order[s];
		h.slot[p->order[s]] = s;
	}
	/* the live bytes before every step of the planned order, by the same
	 * replay that judges the candidates: it must find the planned peak */
	base_reset(&h);
	int64_t pk = replay(&h, h.at, n, 0, 0, before, false);
	FZ_ASSERT(pk == p->peak_bytes);
	memcpy(h.live_before, before, sizeof(int64_t) * ((size_t)n + 1));

	for (int pass = 0; pass < 2; pass++) {
		base_reset(&h);
		for (int i = 0; i < h.m; i++) {
			for (int j = i + 1; j < h.m && j <= i + WINDOW; j++) {
				int x = h.at[i], y = h.at[j];
				p->work++;
				if (x < 0 || y < 0 || !compatible(&h, x, y) ||
				    (pass == 0 && !share_input(&h, x, y)))
					continue;
				bool merged;
				if ((st = try_pair(&h, i, j, &merged)) != FZ_OK)
					goto done;
				st = FZ_ENOMEM;
			}
			base_pass(&h, i);
		}
	}
	st = p->horizontal_merged ? rebuild(&h) : FZ_OK;
done:
	free(h.parent);
	free(h.next);
	free(h.tail);
	free(h.members);
	free(h.cur);
	free(h.cls);
	free(h.dom);
	free(h.red);
	free(h.at);
	free(h.slot);
	free(h.live_before);
	free(h.gmark);
	free(h.stack);
	free(h.n_don);
	free(h.don);
	free(h.pinned);
	free(h.left);
	free(h.left_mark);
	free(h.donated);
	free(h.seen);
	free(h.reach);
	free(h.base);
	free(h.both);
	free(h.pred_start);
	free(h.preds);
	free(h.succ_start);
	free(h.succs);
	free(h.rd_start);
	free(h.rd);
	free(h.dcount);
	free(h.dlist);
	free(h.tent.nodes);
	free(h.tent.in);
	free(h.tent.out);
	free(before);
	return st;
}
