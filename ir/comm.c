/*
 * comm.c: communication scheduling, so that collectives overlap compute.
 *
 * FSDP / ZeRO-3 traces gather every sharded parameter before its layer and
 * reduce-scatter every gradient after it. What users measured going wrong:
 * gathers issued in the wrong order, waits placed far before the op that
 * needs the gathered tensor (so the compute stream stalls while the link
 * still has time), gathers issued one at a time (each paying the launch and
 * ring latency) and prefetch that holds either too little or everything.
 * These passes run after the memory scheduler (and horizontal fusion) and
 * before memplan, and each only moves regions in the order, never changes
 * what is computed:
 *
 *     waits     each wait moves right before its first consumer (views,
 *               which launch nothing, move to their first reader too, so a
 *               reshape of a gathered weight does not drag its wait up);
 *               a wait nobody reads (a gradient shard that is returned)
 *               goes to the end of the step
 *     prefetch  all-gathers are issued in the order of their first consumer
 *               (their wait, placed above), each as early as its input
 *               exists and as the cap on gathered-but-not-yet-released
 *               bytes allows (max_inflight_bytes, 0: no cap); a gather is
 *               never later than its wait
 *     scatter   reduce-scatters and all-reduces are issued right after the
 *               region that completes their operand
 *     bucket    all-gathers smaller than bucket_bytes that are issued at
 *               one point (back to back, large gathers may lie between
 *               them) are coalesced into collective regions of at most
 *               bucket_bytes (one NCCL group, one launch, one ring
 *               latency), and their waits into one wait at the first of them
 *
 * Two rules make asynchronous collectives safe for the memory plan. A
 * collective reads its operand on its own stream until its wait, so each
 * wait region also lists the operands of the collectives it waits on: every
 * replay (fz_order_peak, memplan) then keeps them live until the wait. And
 * a wait's result takes over the future's buffer in place (it is the same
 * bytes, now known complete), so a gathered weight is counted once.
 *
 *     fsdp: ag(w0) ag(w1) ag(w2) ... layer0 ... layer1 ...   (written order:
 *           wait(w0) w1 w2 ... right at the top, every gather before the
 *           first matmul)
 *     with max_inflight_bytes = 2 layers:
 *           ag(w0) ag(w1) wait(w0) layer0 [w0 released] ag(w2) wait(w1)
 *           layer1 ...
 *
 * The order stays a topological order of the regions, so the scheduled
 * trace (fz_program_print_trace: the nodes in the order they run) prints,
 * parses back, and plans to the same order again.
 *
 * Cost. Each pass builds the region graph once (regions plus operand
 * edges), walks the order once and emits every region once; prefetch
 * sorts its G gathers (G log G) and finds what each releases by one walk
 * over the successors of each gather's lazy readers; the gathers freed at
 * a step and the reductions ready after a step are lists indexed by step,
 * never a scan of all of them per step (which made both passes regions x
 * collectives, quadratic in the layers of an FSDP step). Each counts its
 * steps in fz_program.work; test_comm checks that work per op at 64
 * layers is at most twice that at 8.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct cm {
	fz_program *p;
	int n;
	int *pred_start, *preds;  /* distinct producer regions of each region */
	int *succ_start, *succs;
	bool *done;
	int *out, n_out;          /* the new order being built */
} cm;

static bool is_gather(const fz_region *R)
{
	if (R->kind != FZ_REGION_COLLECTIVE)
		return false;
	for (int j = 0; j < R->n_nodes; j++)
		if (R->nodes[j]->op != FZ_OP_ALL_GATHER)
			return false;
	return true;
}

static void cm_free(cm *c)
{
	free(c->pred_start);
	free(c->preds);
	free(c->succ_start);
	free(c->succs);
	free(c->done);
	free(c->out);
}

/* Region edges from the values each region reads (its nodes' operands). */
static fz_status cm_init(cm *c, fz_program *p)
{
	memset(c, 0, sizeof *c);
	c->p = p;
	c->n = p->n_regions;
	int n = c->n, cap = 0;
	for (int r = 0; r < n; r++)
		for (int j = 0; j < p->regions[r]->n_nodes; j++)
			cap += p->regions[r]->nodes[j]->n_in;
	c->pred_start = calloc((size_t)n + 2, sizeof(int));
	c->preds = calloc((size_t)cap + 1, sizeof(int));
	c->succ_start = calloc((size_t)n + 2, sizeof(int));
	c->succs = calloc((size_t)cap + 1, sizeof(int));
	c->done = calloc((size_t)n + 1, sizeof(bool));
	c->out = calloc((size_t)n + 1, sizeof(int));
	int *mark = calloc((size_t)n + 1, sizeof(int));
	int *fill = calloc((size_t)n + 1, sizeof(int));
	if (!c->pred_start || !c->preds || !c->succ_start || !c->succs ||
	    !c->done || !c->out || !mark || !fill) {
		free(mark);
		free(fill);
		cm_free(c);
		return FZ_ENOMEM;
	}
	int np = 0;
	for (int r = 0; r < n; r++) {
		const fz_region *R = p->regions[r];
		c->pred_start[r] = np;
		for (int j = 0; j < R->n_nodes; j++)
			for (int k = 0; k < R->nodes[j]->n_in; k++) {
				const fz_value *v = R->nodes[j]->in[k];
				if (!v->def)
					continue;
				int q = p->region_of[v->def->id];
				if (q == r || mark[q] == r + 1)
					continue;
				mark[q] = r + 1;
				c->preds[np++] = q;
			}
	}
	c->pred_start[n] = np;
	p->work += 2 * (int64_t)n + cap + 2 * (int64_t)np;
	for (int i = 0; i < np; i++)
		c->succ_start[c->preds[i] + 1]++;
	for (int r = 0; r < n; r++)
		c->succ_start[r + 1] += c->succ_start[r];
	for (int r = 0; r < n; r++)
		for (int i = c->pred_start[r]; i < c->pred_start[r + 1]; i++) {
			int q = c->preds[i];
			c->succs[c->succ_start[q] + fill[q]++] = r;
		}
	free(mark);
	free(fill);
	return FZ_OK;
}

static bool preds_done(const cm *c, int r)
{
	for (int i = c->pred_start[r]; i < c->pred_start[r + 1]; i++)
		if (!c->done[c->preds[i]])
			return false;
	return true;
}

static void emit(cm *c, int r)
{
	FZ_ASSERT(!c->done[r] && preds_done(c, r));
	c->p->work += 1 + c->pred_start[r + 1] - c->pred_start[r];
	c->done[r] = true;
	c->out[c->n_out++] = r;
}

/* The new order replaces the old one; the peak is measured again. */
static fz_status cm_commit(cm *c)
{
	FZ_ASSERT(c->n_out == c->n);
	memcpy(c->p->order, c->out, sizeof(int) * (size_t)c->n);
	c->p->work += c->n + c->pred_start[c->n]; /* the replay */
	int64_t pk = fz_order_peak(c->p, c->p->order);
	if (pk < 0)
		return FZ_ENOMEM;
	c->p->peak_bytes = pk;
	return FZ_OK;
}

/* Bytes a collective region makes (its futures). */
static int64_t coll_bytes(const fz_program *p, const fz_region *R)
{
	int64_t b = 0;
	for (int j = 0; j < R->n_nodes; j++)
		b += p->bytes[R->nodes[j]->out[0]->id];
	return b;
}

/* ---- the asynchrony rules ---- */

/* Each wait region also reads the operands of the collectives it waits on,
 * and each wait's result takes over its future's buffer. Called after every
 * relink; idempotent. */
static fz_status link_waits(fz_program *p)
{
	for (int r = 0; r < p->n_regions; r++) {
		fz_region *R = p->regions[r];
		p->work++;
		if (R->kind != FZ_REGION_WAIT)
			continue;
		int extra = 0;
		for (int j = 0; j < R->n_nodes; j++) {
			const fz_node *coll = R->nodes[j]->in[0]->def;
			extra += coll ? coll->n_in : 0;
		}
		fz_value **in = fz_arena_alloc(&p->arena, sizeof *in *
					       (size_t)(R->n_in + extra + 1));
		if (!in)
			return FZ_ENOMEM;
		memcpy(in, R->in, sizeof *in * (size_t)R->n_in);
		int m = R->n_in;
		for (int j = 0; j < R->n_nodes; j++) {
			const fz_node *w = R->nodes[j], *coll = w->in[0]->def;
			for (int k = 0; coll && k < coll->n_in; k++) {
				bool have = false;
				p->work += 1 + m;
				for (int i = 0; i < m; i++)
					have |= in[i] == coll->in[k];
				if (!have)
					in[m++] = coll->in[k];
			}
			fz_value *o = w->out[0], *f = w->in[0];
			if (p->n_donors[o->id] == 0 && p->bytes[o->id] == p->bytes[f->id] &&
			    fz_view_root(p, o) == o) {
				int *d = fz_arena_alloc(&p->arena, sizeof(int));
				if (!d)
					return FZ_ENOMEM;
				d[0] = f->id;
				p->donors[o->id] = d;
				p->n_donors[o->id] = 1;
			}
		}
		R->in = in;
		R->in_id = NULL;
		R->n_in = m;
	}
	return FZ_OK;
}

/* ---- waits: right before the first consumer ---- */

static bool is_lazy(const fz_region *R)
{
	return R->kind == FZ_REGION_WAIT || R->kind == FZ_REGION_VIEW;
}

/* Emits the lazy regions r needs (and what they need), then r. */
static void emit_with_lazy(cm *c, int r)
{
	for (int i = c->pred_start[r]; i < c->pred_start[r + 1]; i++) {
		int q = c->preds[i];
		if (!c->done[q])
			emit_with_lazy(c, q);
	}
	emit(c, r);
}

fz_status fz_comm_waits(fz_program *p)
{
	if (!p->opts.comm_waits || !fz_program_count(p, FZ_REGION_WAIT))
		return link_waits(p);
	cm c;
	fz_status st = cm_init(&c, p);
	if (st != FZ_OK)
		return st;
	for (int s = 0; s < c.n; s++) {
		int r = p->order[s];
		if (!is_lazy(p->regions[r]) && !c.done[r])
			emit_with_lazy(&c, r);
	}
	/* what nobody computed needs: returned values, at the end */
	for (int s = 0; s < c.n; s++)
		if (!c.done[p->order[s]])
			emit_with_lazy(&c, p->order[s]);
	st = link_waits(p);
	if (st == FZ_OK)
		st = cm_commit(&c);
	cm_free(&c);
	return st;
}

/* ---- prefetch: all-gathers in the order of first use, under a cap ---- */

typedef struct gather_info {
	int r;          /* region */
	int need;       /* step (in the order without gathers) of its first reader */
	int release;    /* step after which its gathered bytes are free */
	int64_t bytes;
} gather_info;

static int cmp_gather(const void *a, const void *b)
{
	const gather_info *x = a, *y = b;
	if (x->need != y->need)
		return (x->need > y->need) - (x->need < y->need);
	return (x->r > y->r) - (x->r < y->r);
}

fz_status fz_comm_prefetch(fz_program *p)
{
	int ng = 0;
	for (int r = 0; r < p->n_regions; r++)
		ng += is_gather(p->regions[r]);
	if (!p->opts.comm_prefetch || !ng)
		return FZ_OK;
	cm c;
	fz_status st = cm_init(&c, p);
	if (st != FZ_OK)
		return st;
	int n = c.n, nrest = 0;
	int *rest = malloc(sizeof(int) * ((size_t)n + 1));
	int *pos = malloc(sizeof(int) * ((size_t)n + 1));
	int *stack = malloc(sizeof(int) * ((size_t)n + 1));
	int *mark = calloc((size_t)n + 1, sizeof(int));
	bool *pinned = calloc((size_t)p->trace->n_values + 1, sizeof(bool));
	gather_info *g = calloc((size_t)ng + 1, sizeof *g);
	int *rel_start = NULL, *rel = NULL;
	st = FZ_ENOMEM;
	if (!rest || !pos || !stack || !mark || !pinned || !g)
		goto done;
	for (int i = 0; i < p->trace->n_outputs; i++)
		pinned[fz_view_root_id(p, p->trace->outputs[i])] = true;
	ng = 0;
	for (int s = 0; s < n; s++) {
		int r = p->order[s];
		if (is_gather(p->regions[r])) {
			g[ng].r = r;
			g[ng].bytes = coll_bytes(p, p->regions[r]);
			ng++;
		} else {
			pos[r] = nrest;
			rest[nrest++] = r;
		}
	}
	/* need: the first direct reader (its wait); release: the last reader
	 * of what the gather made, through waits and views (end of step if
	 * the result is returned) */
	for (int i = 0; i < ng; i++) {
		int top = 0, stamp = i + 1;
		g[i].need = nrest;
		g[i].release = -1;
		for (int k = c.succ_start[g[i].r]; k < c.succ_start[g[i].r + 1]; k++) {
			int q = c.succs[k];
			if (!is_gather(p->regions[q]) && pos[q] < g[i].need)
				g[i].need = pos[q];
			if (mark[q] != stamp) {
				mark[q] = stamp;
				stack[top++] = q;
			}
		}
		p->work += 1 + c.succ_start[g[i].r + 1] - c.succ_start[g[i].r];
		while (top > 0) {
			int q = stack[--top];
			const fz_region *Q = p->regions[q];
			p->work += 1 + Q->n_out + c.succ_start[q + 1] - c.succ_start[q];
			if (!is_gather(Q) && pos[q] > g[i].release)
				g[i].release = pos[q];
			if (!is_lazy(Q))
				continue;
			for (int k = 0; k < Q->n_out; k++)
				if (pinned[fz_view_root_id(p, Q->out[k])])
					g[i].release = nrest;
			for (int k = c.succ_start[q]; k < c.succ_start[q + 1]; k++) {
				int u = c.succs[k];
				if (mark[u] != stamp) {
					mark[u] = stamp;
					stack[top++] = u;
				}
			}
		}
		if (g[i].release < g[i].need)
			g[i].release = g[i].need;
	}
	qsort(g, (size_t)ng, sizeof *g, cmp_gather);
	p->work += fz_nlogn(ng);
	/* the gathers each step releases: a list per step (release is in
	 * need..nrest), by counting */
	rel_start = calloc((size_t)nrest + 3, sizeof(int));
	rel = malloc(sizeof(int) * ((size_t)ng + 1));
	if (!rel_start || !rel)
		goto done;
	for (int k = 0; k < ng; k++)
		rel_start[g[k].release + 2]++;
	for (int i = 0; i <= nrest; i++)
		rel_start[i + 2] += rel_start[i + 1];
	for (int k = 0; k < ng; k++)
		rel[rel_start[g[k].release + 1]++] = k;
	p->work += 2 * ((int64_t)ng + nrest);
	int64_t cap = p->opts.max_inflight_bytes, inflight = 0, peak = 0;
	int head = 0;
	bool *issued = calloc((size_t)ng + 1, sizeof(bool));
	if (!issued)
		goto done;
	for (int i = 0; i <= nrest; i++) {
		/* those needed now, whatever the cap says */
		for (int k = head; k < ng && g[k].need <= i; k++) {
			if (issued[k])
				continue;
			emit(&c, g[k].r);
			issued[k] = true;
			inflight += g[k].bytes;
		}
		/* then as many as the cap allows, strictly in order */
		while (head < ng) {
			if (issued[head]) {
				head++;
				continue;
			}
			if (!preds_done(&c, g[head].r) ||
			    (cap > 0 && inflight + g[head].bytes > cap))
				break;
			emit(&c, g[head].r);
			issued[head] = true;
			inflight += g[head].bytes;
			head++;
		}
		if (inflight > peak)
			peak = inflight;
		if (i == nrest)
			break;
		emit(&c, rest[i]);
		for (int j = rel_start[i]; j < rel_start[i + 1]; j++)
			if (issued[rel[j]])
				inflight -= g[rel[j]].bytes;
	}
	free(issued);
	p->comm_peak_inflight = peak;
	st = cm_commit(&c);
done:
	free(rest);
	free(pos);
	free(stack);
	free(mark);
	free(pinned);
	free(g);
	free(rel_start);
	free(rel);
	cm_free(&c);
	return st;
}

/* ---- scatter: reductions issued as soon as their operand is complete ---- */

fz_status fz_comm_scatter(fz_program *p)
{
	int nc = 0;
	for (int r = 0; r < p->n_regions; r++)
		nc += p->regions[r]->kind == FZ_REGION_COLLECTIVE &&
		      !is_gather(p->regions[r]);
	if (!p->opts.comm_scatter || !nc)
		return FZ_OK;
	cm c;
	fz_status st = cm_init(&c, p);
	if (st != FZ_OK)
		return st;
	int n = c.n, np = 0;
	int *pend = malloc(sizeof(int) * ((size_t)nc + 1));
	int *ready = malloc(sizeof(int) * ((size_t)nc + 1));
	int *pos = malloc(sizeof(int) * ((size_t)n + 1));
	int *pidx = malloc(sizeof(int) * ((size_t)n + 1));
	int *rstart = calloc((size_t)n + 3, sizeof(int));
	int *rlist = malloc(sizeof(int) * ((size_t)nc + 1));
	st = FZ_ENOMEM;
	if (!pend || !ready || !pos || !pidx || !rstart || !rlist)
		goto done;
	for (int s = 0; s < n; s++) {
		int r = p->order[s];
		pos[r] = s;
		pidx[r] = -1;
		if (p->regions[r]->kind == FZ_REGION_COLLECTIVE &&
		    !is_gather(p->regions[r])) {
			pidx[r] = np;
			pend[np++] = r;
		}
	}
	/* ready[k]: the step before which reduction k can be issued, right
	 * after its last operand's producer (a reduction of a reduction after
	 * that one); the reductions are in the order, so a reduction's
	 * producers among them come first */
	for (int k = 0; k < np; k++) {
		int r = pend[k];
		ready[k] = 0;
		for (int i = c.pred_start[r]; i < c.pred_start[r + 1]; i++) {
			int q = c.preds[i];
			int at = pidx[q] >= 0 ? ready[pidx[q]] : pos[q] + 1;
			if (at > ready[k])
				ready[k] = at;
		}
		rstart[ready[k] + 2]++;
		p->work += 1 + c.pred_start[r + 1] - c.pred_start[r];
	}
	for (int s = 0; s <= n; s++)
		rstart[s + 2] += rstart[s + 1];
	for (int k = 0; k < np; k++)
		rlist[rstart[ready[k] + 1]++] = k;
	p->work += 2 * ((int64_t)n + np);
	for (int s = 0; s <= n; s++) {
		for (int j = rstart[s]; j < rstart[s + 1]; j++)
			if (!c.done[pend[rlist[j]]])
				emit(&c, pend[rlist[j]]);
		if (s == n)
			break;
		int r = p->order[s];
		if (!c.done[r])
			emit(&c, r);
	}
	st = cm_commit(&c);
done:
	free(pend);
	free(ready);
	free(pos);
	free(pidx);
	free(rstart);
	free(rlist);
	cm_free(&c);
	return st;
}

/* ---- bucket: back-to-back small all-gathers become one ---- */

static int cmp_node_id(const void *a, const void *b)
{
	int x = (*(fz_node *const *)a)->id, y = (*(fz_node *const *)b)->id;
	return (x > y) - (x < y);
}

/* Both peaks again under the asynchrony rules (link_waits), which the
 * passes before this file did not know. */
static fz_status remeasure(fz_program *p)
{
	if (!fz_program_count(p, FZ_REGION_COLLECTIVE))
		return FZ_OK;
	p->peak_bytes = fz_order_peak(p, p->order);
	p->peak_bytes_trace_order = fz_order_peak(p, p->trace_order);
	return p->peak_bytes < 0 || p->peak_bytes_trace_order < 0 ? FZ_ENOMEM : FZ_OK;
}

static fz_status bucket(fz_program *p);

fz_status fz_comm_bucket(fz_program *p)
{
	fz_status st = bucket(p);
	return st == FZ_OK ? remeasure(p) : st;
}

static fz_status bucket(fz_program *p)
{
	int64_t cap = p->opts.bucket_bytes;
	if (cap <= 0)
		return FZ_OK;
	int n = p->n_regions;
	p->work += n;
	int *group = malloc(sizeof(int) * ((size_t)n + 1)); /* region -> leader */
	int *wgroup = malloc(sizeof(int) * ((size_t)n + 1));
	if (!group || !wgroup) {
		free(group);
		free(wgroup);
		return FZ_ENOMEM;
	}
	for (int r = 0; r < n; r++)
		group[r] = wgroup[r] = -1;
	int buckets = 0;
	/* runs of gathers issued back to back (nothing runs between them, so
	 * their inputs are all ready at the first); in each, the small ones in
	 * issue order, greedily, up to cap bytes per bucket, even across a
	 * large gather between them: a bucket goes where its first member was */
	for (int s = 0; s < n;) {
		if (!is_gather(p->regions[p->order[s]])) {
			s++;
			continue;
		}
		int e = s;
		while (e < n && is_gather(p->regions[p->order[e]]))
			e++;
		int lead = -1, count = 0;
		int64_t sum = 0;
		for (int k = s; k <= e; k++) {
			int r = k < e ? p->order[k] : -1;
			int64_t b = r >= 0 ? coll_bytes(p, p->regions[r]) : 0;
			if (r >= 0 && b >= cap)
				continue;
			if (lead >= 0 && (r < 0 || sum + b > cap)) {
				if (count >= 2)
					buckets++;
				else
					group[lead] = -1;
				lead = -1;
			}
			if (r < 0)
				break;
			if (lead < 0) {
				lead = r;
				sum = 0;
				count = 0;
			}
			group[r] = lead;
			sum += b;
			count++;
		}
		s = e;
	}
	if (!buckets) {
		free(group);
		free(wgroup);
		return FZ_OK;
	}
	/* the waits of a bucket join the first of them in the order */
	for (int s = 0; s < n; s++) {
		int r = p->order[s];
		const fz_region *R = p->regions[r];
		if (R->kind != FZ_REGION_WAIT || R->n_nodes != 1)
			continue;
		const fz_node *coll = R->nodes[0]->in[0]->def;
		int gr = coll ? p->region_of[coll->id] : -1;
		if (gr < 0 || group[gr] < 0)
			continue;
		wgroup[r] = group[gr];
	}
	/* build the new regions: a leader takes its members' nodes */
	fz_status st = FZ_ENOMEM;
	fz_region **regs = fz_arena_alloc(&p->arena, sizeof *regs * ((size_t)n + 1));
	int *new_id = malloc(sizeof(int) * ((size_t)n + 1));
	int *wlead = malloc(sizeof(int) * ((size_t)n + 1)); /* bucket -> its wait */
	int *order = malloc(sizeof(int) * ((size_t)n + 1));
	int *vw = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	int *vb = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)n + 1));
	if (!regs || !new_id || !wlead || !order || !vw || !vb)
		goto fail;
	for (int r = 0; r < n; r++)
		wlead[r] = -1;
	/* the wait leader of a bucket: its first wait in the order */
	for (int s = 0; s < n; s++) {
		int r = p->order[s];
		if (wgroup[r] >= 0 && wlead[wgroup[r]] < 0)
			wlead[wgroup[r]] = r;
	}
	int nn = 0;
	for (int r = 0; r < n; r++) {
		int lead = group[r] >= 0 ? group[r] : wgroup[r] >= 0 ?
			   wlead[wgroup[r]] : r;
		if (lead != r)
			continue;
		new_id[r] = nn;
		vw[nn] = p->vec_width[r];
		vb[nn] = p->vec_bytes[r];
		regs[nn++] = p->regions[r];
	}
	for (int r = 0; r < n; r++) {
		int lead = group[r] >= 0 ? group[r] : wgroup[r] >= 0 ?
			   wlead[wgroup[r]] : r;
		new_id[r] = new_id[lead];
	}
	/* gather the members' nodes, in the order's order */
	for (int s = 0; s < n; s++) {
		int r = p->order[s];
		int lead = group[r] >= 0 ? group[r] : wgroup[r] >= 0 ?
			   wlead[wgroup[r]] : r;
		if (lead == r)
			continue;
		fz_region *L = p->regions[lead], *M = p->regions[r];
		fz_node **nodes = fz_arena_alloc(&p->arena, sizeof *nodes *
						 (size_t)(L->n_nodes + M->n_nodes));
		if (!nodes)
			goto fail;
		memcpy(nodes, L->nodes, sizeof *nodes * (size_t)L->n_nodes);
		memcpy(nodes + L->n_nodes, M->nodes, sizeof *nodes * (size_t)M->n_nodes);
		p->work += L->n_nodes + M->n_nodes;
		L->nodes = nodes;
		L->n_nodes += M->n_nodes;
	}
	/* members in node order, which is topological */
	for (int r = 0; r < n; r++) {
		fz_region *L = p->regions[r];
		if ((group[r] == r || (wgroup[r] >= 0 && wlead[wgroup[r]] == r)) &&
		    L->n_nodes > 1)
			qsort(L->nodes, (size_t)L->n_nodes, sizeof *L->nodes, cmp_node_id);
	}
	int k = 0;
	for (int s = 0; s < n; s++) {
		int r = p->order[s];
		int lead = group[r] >= 0 ? group[r] : wgroup[r] >= 0 ?
			   wlead[wgroup[r]] : r;
		if (lead == r)
			order[k++] = new_id[r];
	}
	FZ_ASSERT(k == nn);
	/* the written order: each merged region where its first member was */
	int kt = 0;
	bool *seen = calloc((size_t)nn + 1, sizeof(bool));
	if (!seen)
		goto fail;
	for (int s = 0; s < n; s++) {
		int id = new_id[p->trace_order[s]];
		if (!seen[id]) {
			seen[id] = true;
			p->trace_order[kt++] = id;
		}
	}
	free(seen);
	FZ_ASSERT(kt == nn);
	p->work += 6 * (int64_t)n;
	for (int r = 0; r < nn; r++) {
		regs[r]->id = r;
		p->work += 1 + regs[r]->n_nodes;
		for (int j = 0; j < regs[r]->n_nodes; j++)
			p->region_of[regs[r]->nodes[j]->id] = r;
	}
	p->regions = regs;
	p->n_regions = nn;
	p->vec_width = vw;
	p->vec_bytes = vb;
	memcpy(p->order, order, sizeof(int) * (size_t)nn);
	p->comm_buckets = buckets;
	if ((st = fz_regions_link(p)) != FZ_OK || (st = link_waits(p)) != FZ_OK)
		goto fail;
fail:
	free(group);
	free(wgroup);
	free(new_id);
	free(wlead);
	free(order);
	return st;
}

/* ---- the scheduled trace ---- */

fz_status fz_program_print_trace(const fz_program *p, char **out)
{
	const fz_trace *t = p->trace;
	const fz_node **order = malloc(sizeof *order * ((size_t)t->n_nodes + 1));
	if (!order) {
		*out = NULL;
		return FZ_ENOMEM;
	}
	int k = 0;
	for (int s = 0; s < p->n_regions; s++) {
		const fz_region *R = p->regions[p->order[s]];
		for (int j = 0; j < R->n_nodes; j++)
			order[k++] = R->nodes[j];
	}
	FZ_ASSERT(k == t->n_nodes);
	fz_status st = fz_trace_print_ordered(t, order, out);
	free(order);
	return st;
}
