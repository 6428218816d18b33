/*
 * plan.c: the pass pipeline that turns a verified trace into a program.
 *
 *     fz_plan(trace)
 *       dce         mark the ops whose results nothing needs: no region
 *                   holds them, nothing plans, compiles or launches them
 *       partition   group primitive ops into regions a kernel skeleton runs
 *       bookend     meta ops at region edges become host-side views
 *       schedule    an order of regions that keeps peak live bytes low
 *       horizontal  independent sibling kernels become one, where the
 *                   planned peak does not rise (then schedules again)
 *       waits       communication (comm.c): each wait right before its
 *       prefetch    first consumer, all-gathers in order of first use under
 *       scatter     a cap on bytes in flight, reduce-scatters as soon as
 *       bucket      their gradient is complete, small gathers coalesced
 *       memplan     an offset in one arena for every buffer
 *
 * The pipeline is the flat list of calls in fz_plan; each pass may dump the
 * program after itself (`fusec plan --dump-after=partition`). Everything
 * the program holds comes from its own arena and goes with fz_program_free.
 *
 * Two sets of sizes. Bytes are counted at the bound sizes, an unbound
 * symbol taken as 1 (and reported as such). Structure (which ops may share
 * a kernel, whether a reshape is a view, how wide a vector may be) is
 * judged at probe sizes: every symbol a distinct prime above 100, so an
 * answer that holds there holds for the symbol's generic size, and the
 * partition does not change with --bind. A symbolic innermost extent thus
 * never earns a vector width it would not have for every batch size.
 *
 * This file also holds what the passes share: the region links (in, out),
 * the replay that measures the peak of an order (the one rule that the
 * scheduler optimizes, memplan follows and the tests check by brute force),
 * and the dump.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "plan.h"

const char *const fz_region_kind_names[FZ_REGION_KIND_COUNT] = {
	"pointwise", "reduction", "normalization", "indexing", "library",
	"collective", "wait", "view", "scan", "select", "attention",
};

const char *const fz_pass_names[FZ_PASS_COUNT] = {
	"dce", "partition", "bookend", "schedule", "horizontal", "waits", "prefetch",
	"scatter", "bucket", "memplan",
};

int fz_pass_from_name(const char *name, fz_pass *out)
{
	for (int i = 0; i < FZ_PASS_COUNT; i++) {
		if (!strcmp(name, fz_pass_names[i])) {
			*out = (fz_pass)i;
			return 1;
		}
	}
	return 0;
}

void fz_plan_defaults(fz_plan_options *o)
{
	memset(o, 0, sizeof *o);
	o->dump_after = -1;
	o->horizontal = true;
	o->comm_waits = o->comm_prefetch = o->comm_scatter = true;
	o->max_inflight_bytes = (int64_t)1 << 30;
	o->bucket_bytes = 25 << 20;
}

fz_value *fz_view_root(const fz_program *p, fz_value *v)
{
	if (p->view_root)
		return p->trace->values[p->view_root[v->id]];
	while (p->view_of && p->view_of[v->id])
		v = p->view_of[v->id]->base;
	return v;
}

fz_status fz_program_index_views(fz_program *p)
{
	int nv = p->trace->n_values;
	int *root = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)nv + 1));
	if (!root)
		return FZ_ENOMEM;
	bool *param = fz_arena_alloc(&p->arena, sizeof(bool) * ((size_t)nv + 1));
	if (!param)
		return FZ_ENOMEM;
	p->view_root = NULL;
	p->is_param = NULL;
	for (int v = 0; v < nv; v++) {
		root[v] = fz_view_root_id(p, p->trace->values[v]);
		param[v] = p->trace->values[v]->param_index >= 0;
	}
	p->view_root = root;
	p->is_param = param;
	p->work += nv;
	return FZ_OK;
}

int fz_program_count(const fz_program *p, fz_region_kind k)
{
	int n = 0;
	for (int i = 0; i < p->n_regions; i++)
		n += p->regions[i]->kind == k;
	return n;
}

int fz_program_kernels(const fz_program *p)
{
	int n = 0;
	for (int i = 0; i < p->n_regions; i++)
		n += fz_region_is_kernel(p->regions[i]->kind);
	return n;
}

/* ---- region links ---- */

/* Values a region reads from outside and makes for others. A value made by
 * a view region is "made" there even though it owns no storage. */
fz_status fz_regions_link(fz_program *p)
{
	const fz_trace *t = p->trace;
	int nv = t->n_values;
	int *mark = calloc((size_t)nv + 1, sizeof *mark);
	bool *external = calloc((size_t)nv + 1, sizeof *external);
	fz_value **tmp = malloc(sizeof *tmp * ((size_t)nv + 1));
	if (!mark || !external || !tmp)
		goto oom;
	for (int i = 0; i < t->n_outputs; i++)
		external[t->outputs[i]->id] = true;
	/* with the graph as ids (node_in, def_of), both walks read dense
	 * arrays, not the nodes and values */
	const int *ins = p->node_in, *start = p->node_in_start;
	for (int i = 0; i < t->n_nodes; i++) {
		if (p->region_of[i] < 0) /* dead (dce.c): reads nothing */
			continue;
		const fz_node *n = ins ? NULL : t->nodes[i];
		int n_in = ins ? start[i + 1] - start[i] : n->n_in;
		for (int k = 0; k < n_in; k++) {
			int v = ins ? ins[start[i] + k] : n->in[k]->id;
			int d = p->def_of ? p->def_of[v] : fz_def_id(p, n->in[k]);
			if (d >= 0 && p->region_of[d] != p->region_of[i])
				external[v] = true;
		}
	}
	for (int r = 0; r < p->n_regions; r++) {
		fz_region *R = p->regions[r];
		int stamp = r + 1, m = 0;
		for (int j = 0; j < R->n_nodes; j++) {
			const fz_node *n = R->nodes[j];
			int i = n->id;
			int n_in = ins ? start[i + 1] - start[i] : n->n_in;
			for (int k = 0; k < n_in; k++) {
				int v = ins ? ins[start[i] + k] : n->in[k]->id;
				int d = p->def_of ? p->def_of[v] : fz_def_id(p, n->in[k]);
				if (d >= 0 && p->region_of[d] == r)
					continue;
				if (mark[v] != stamp) {
					mark[v] = stamp;
					tmp[m++] = t->values[v];
				}
			}
		}
		R->in = fz_arena_alloc(&p->arena, sizeof *R->in * (size_t)(m + 1));
		R->in_id = fz_arena_alloc(&p->arena, sizeof(int) * (size_t)(m + 1));
		if (!R->in || !R->in_id)
			goto oom;
		memcpy(R->in, tmp, sizeof *tmp * (size_t)m);
		for (int k = 0; k < m; k++)
			R->in_id[k] = tmp[k]->id;
		R->n_in = m;
		m = 0;
		for (int j = 0; j < R->n_nodes; j++) {
			const fz_node *n = R->nodes[j];
			for (int k = 0; k < n->n_out; k++) {
				int v = p->node_out ? p->node_out[2 * n->id + k] :
					n->out[k]->id;
				if (external[v])
					tmp[m++] = t->values[v];
			}
		}
		R->out = fz_arena_alloc(&p->arena, sizeof *R->out * (size_t)(m + 1));
		R->out_id = fz_arena_alloc(&p->arena, sizeof(int) * (size_t)(m + 1));
		if (!R->out || !R->out_id)
			goto oom;
		memcpy(R->out, tmp, sizeof *tmp * (size_t)m);
		for (int k = 0; k < m; k++)
			R->out_id[k] = tmp[k]->id;
		R->n_out = m;
	}
	free(mark);
	free(external);
	free(tmp);
	return FZ_OK;
oom:
	free(mark);
	free(external);
	free(tmp);
	return FZ_ENOMEM;
}

/* ---- sorting numbers ---- */

/* Quicksort (median of three) down to runs of 24, then insertion: on
 * numbers, with no comparison callback (qsort's indirect calls were a tenth
 * of partition's time). */
void fz_sort_u64(uint64_t *a, int n)
{
	while (n > 24) {
		uint64_t x = a[0], y = a[n / 2], z = a[n - 1];
		uint64_t piv = x < y ? (y < z ? y : x < z ? z : x)
				     : (x < z ? x : y < z ? z : y);
		int i = 0, j = n - 1;
		for (;;) {
			while (a[i] < piv)
				i++;
			while (a[j] > piv)
				j--;
			if (i >= j)
				break;
			uint64_t t = a[i];
			a[i++] = a[j];
			a[j--] = t;
		}
		/* [0, j] <= piv <= [j + 1, n): recurse into the smaller */
		if (j < 0 || j >= n - 1)
			break; /* no split (equal keys): insertion sorts it */
		if (j + 1 < n - j - 1) {
			fz_sort_u64(a, j + 1);
			a += j + 1;
			n -= j + 1;
		} else {
			fz_sort_u64(a + j + 1, n - j - 1);
			n = j + 1;
		}
	}
	for (int i = 1; i < n; i++) {
		uint64_t x = a[i];
		int j = i;
		for (; j > 0 && a[j - 1] > x; j--)
			a[j] = a[j - 1];
		a[j] = x;
	}
}

/* ---- the peak of an order ---- */

/*
 * The replay. Before a region runs, its outputs that own storage are
 * allocated (an output that takes over a dying input in place allocates
 * nothing); the live total then is a candidate for the peak. After it runs,
 * every buffer it read for the last time is released, unless it is a
 * program output (never released) or a parameter (never counted). A view
 * counts as a read of its base.
 */
int64_t fz_order_peak(const fz_program *p, const int *order)
{
	const fz_trace *t = p->trace;
	int nv = t->n_values;
	int *readers = calloc((size_t)nv + 1, sizeof *readers);
	int *seen = calloc((size_t)nv + 1, sizeof *seen);
	bool *pinned = calloc((size_t)nv + 1, sizeof *pinned);
	bool *donated = calloc((size_t)nv + 1, sizeof *donated);
	int64_t live = 0, peak = 0;
	if (!readers || !seen || !pinned || !donated) {
		peak = -1;
		goto done;
	}
	fz_program_count_readers(p, readers, seen, pinned);
	memset(seen, 0, sizeof *seen * (size_t)nv);
	for (int s = 0; s < p->n_regions; s++) {
		const fz_region *R = p->regions[order[s]];
		int stamp = s + 1;
		int64_t alloc = 0;
		for (int k = 0; k < R->n_out; k++) {
			int o = fz_out_id(R, k);
			if (fz_root_id(p, o) != o)
				continue;
			int donor = fz_pick_donor(p, o, readers, pinned, donated);
			if (donor >= 0)
				donated[donor] = true;
			else
				alloc += p->bytes[o];
		}
		live += alloc;
		if (live > peak)
			peak = live;
		for (int k = 0; k < R->n_in; k++) {
			int b = fz_root_id(p, fz_in_id(R, k));
			if (seen[b] == stamp || fz_id_is_param(p, b))
				continue;
			seen[b] = stamp;
			if (--readers[b] == 0 && !pinned[b] && !donated[b])
				live -= p->bytes[b];
		}
		for (int k = 0; k < R->n_out; k++) {
			int o = fz_out_id(R, k);
			if (fz_root_id(p, o) == o && readers[o] == 0 && !pinned[o])
				live -= p->bytes[o]; /* made for nobody */
		}
	}
done:
	free(readers);
	free(seen);
	free(pinned);
	free(donated);
	return peak;
}

/* ---- views under other sizes ---- */

fz_status fz_view_eval(const fz_program *p, const fz_value *v,
		       const int64_t *sym_sizes, fz_layout *out)
{
	const fz_view *w = p->view_of ? p->view_of[v->id] : NULL;
	if (!w)
		return fz_layout_contiguous(v, sym_sizes, out) ? FZ_OK : FZ_EINVAL;
	fz_layout in;
	fz_status st = fz_view_eval(p, w->node->in[0], sym_sizes, &in);
	if (st != FZ_OK)
		return st;
	return fz_meta_layout(w->node, sym_sizes, &in, out) ? FZ_OK : FZ_EINVAL;
}

int fz_pick_donor(const fz_program *p, int o, const int *readers,
		  const bool *pinned, const bool *donated)
{
	for (int d = 0; d < p->n_donors[o]; d++) {
		int b = p->donors[o][d];
		if (readers[b] == 1 && !pinned[b] && !donated[b])
			return b;
	}
	return -1;
}

void fz_program_count_readers(const fz_program *p, int *readers, int *seen,
			      bool *pinned)
{
	const fz_trace *t = p->trace;
	for (int i = 0; i < t->n_outputs; i++)
		pinned[fz_view_root_id(p, t->outputs[i])] = true;
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = p->regions[r];
		for (int k = 0; k < R->n_in; k++) {
			int b = fz_root_id(p, fz_in_id(R, k));
			if (seen[b] != r + 1) {
				seen[b] = r + 1;
				readers[b]++;
			}
		}
	}
}

/* ---- the dump ---- */

static void dump_value(const fz_program *p, const fz_value *v, fz_buf *b)
{
	char ty[256];
	if (v->name)
		fz_buf_printf(b, "%s", v->name);
	else
		fz_buf_printf(b, "%%%d", v->id);
	fz_buf_printf(b, " %s", fz_type_str(p->trace, &v->type, ty, sizeof ty));
}

static void dump_region(const fz_program *p, const fz_region *R, fz_pass pass,
			fz_buf *b)
{
	fz_buf_printf(b, "region %d: %s", R->id, fz_region_kind_names[R->kind]);
	if (pass >= FZ_PASS_BOOKEND && fz_region_is_kernel(R->kind))
		fz_buf_printf(b, "  vector %d x %d bytes", p->vec_width[R->id],
			      p->vec_width[R->id] ? p->vec_bytes[R->id] /
			      p->vec_width[R->id] : 0);
	fz_buf_puts(b, "\n  ops:");
	for (int j = 0; j < R->n_nodes; j++)
		fz_buf_printf(b, " %s", fz_ops[R->nodes[j]->op].name);
	fz_buf_puts(b, "\n");
	for (int pass_in = 0; pass_in < 2; pass_in++) {
		int n = pass_in ? R->n_out : R->n_in;
		fz_value **vs = pass_in ? R->out : R->in;
		fz_buf_puts(b, pass_in ? "  out:" : "  in: ");
		for (int k = 0; k < n; k++) {
			fz_buf_puts(b, k ? ", " : " ");
			dump_value(p, vs[k], b);
			const fz_view *w = p->view_of ? p->view_of[vs[k]->id] : NULL;
			if (w && pass >= FZ_PASS_BOOKEND) {
				fz_buf_puts(b, " (view of ");
				fz_buf_puts(b, w->base->name ? w->base->name : "?");
				fz_buf_puts(b, ", strides [");
				for (int d = 0; d < w->lay.rank; d++)
					fz_buf_printf(b, "%s%lld", d ? ", " : "",
						      (long long)w->lay.strides[d]);
				fz_buf_printf(b, "], offset %lld)",
					      (long long)w->lay.offset);
			}
			if (pass >= FZ_PASS_MEMPLAN && pass_in &&
			    p->offset[vs[k]->id] >= 0)
				fz_buf_printf(b, " @%lld", (long long)p->offset[vs[k]->id]);
		}
		fz_buf_puts(b, "\n");
	}
}

void fz_program_dump(const fz_program *p, fz_pass pass, fz_buf *b)
{
	fz_buf_printf(b, "# after %s: trace %s, %d regions (%d kernels)\n",
		      fz_pass_names[pass], p->trace->name, p->n_regions,
		      fz_program_kernels(p));
	if (pass == FZ_PASS_DCE) { /* no regions yet: the ops, dead or not */
		fz_buf_puts(b, "ops:");
		for (int i = 0; i < p->trace->n_nodes; i++)
			fz_buf_printf(b, " %s%s", fz_ops[p->trace->nodes[i]->op].name,
				      p->dead && p->dead[i] ? "(dead)" : "");
		fz_buf_puts(b, "\n");
	}
	if (p->dead) {
		fz_buf_printf(b, "dead: %d op%s, in no region:", p->n_dead,
			      p->n_dead == 1 ? "" : "s");
		for (int i = 0; i < p->trace->n_nodes; i++) {
			const fz_node *n = p->trace->nodes[i];
			if (!p->dead[i])
				continue;
			fz_buf_printf(b, " %s", fz_ops[n->op].name);
			if (n->line > 0)
				fz_buf_printf(b, "@%d:%d", n->line, n->col);
		}
		fz_buf_puts(b, "\n");
	}
	if (pass >= FZ_PASS_SCHEDULE) {
		for (int s = 0; s < p->n_regions; s++)
			dump_region(p, p->regions[p->order[s]], pass, b);
		fz_buf_printf(b, "peak %lld bytes planned, %lld in the written "
			      "order\n", (long long)p->peak_bytes,
			      (long long)p->peak_bytes_trace_order);
	} else {
		for (int r = 0; r < p->n_regions; r++)
			dump_region(p, p->regions[r], pass, b);
	}
	if (pass >= FZ_PASS_MEMPLAN)
		fz_buf_printf(b, "arena %lld bytes\n", (long long)p->arena_bytes);
}

/* ---- the pipeline ---- */

static int64_t nth_prime_above_100(int i)
{
	int64_t c = 101;
	for (int found = 0;; c++) {
		bool prime = true;
		for (int64_t d = 2; d * d <= c; d++)
			if (c % d == 0)
				prime = false;
		if (prime && found++ == i)
			return c;
	}
}

void fz_program_free(fz_program *p)
{
	if (!p)
		return;
	free(p->dump);
	free(p->cache_form);
	fz_arena_release(&p->arena);
	free(p);
}

fz_status fz_plan(const fz_trace *t, const fz_plan_options *o,
		  fz_program **out, char **err)
{
	static fz_status (*const passes[FZ_PASS_COUNT])(fz_program *) = {
		fz_dce, fz_partition, fz_bookend, fz_schedule, fz_horizontal,
		fz_comm_waits, fz_comm_prefetch, fz_comm_scatter, fz_comm_bucket,
		fz_memplan,
	};
	*out = NULL;
	fz_program *p = calloc(1, sizeof *p);
	if (!p)
		return FZ_ENOMEM;
	p->trace = t;
	if (o)
		p->opts = *o;
	else
		fz_plan_defaults(&p->opts);
	int64_t given[FZ_MAX_SYMS];
	char msg[8];
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		given[s] = p->opts.sym_sizes && s < t->n_syms ? p->opts.sym_sizes[s] : -1;
	fz_trace_syms_derive(t, given, msg, sizeof msg); /* T+1 from T */
	for (int s = 0; s < FZ_MAX_SYMS; s++) {
		int64_t v = given[s];
		if (s < t->n_syms && v < 0)
			p->unbound_syms |= 1ull << s;
		p->sym_sizes[s] = v < 0 ? 1 : v;
		p->probe_sizes[s] = nth_prime_above_100(s);
	}
	p->opts.sym_sizes = NULL;
	fz_buf dump = {0};
	fz_status st = FZ_OK;
	for (int i = 0; i < FZ_PASS_COUNT && st == FZ_OK; i++) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		int64_t w0 = p->work;
		st = passes[i](p);
		p->pass_work[i] = p->work - w0;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		p->pass_seconds[i] = (double)(t1.tv_sec - t0.tv_sec) +
				     (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
		if (st == FZ_OK && p->opts.dump_after == i)
			fz_program_dump(p, (fz_pass)i, &dump);
	}
	if (st != FZ_OK) {
		if (err)
			*err = fz_strdup_printf("plan of trace '%s': %s", t->name,
						fz_status_name(st));
		free(fz_buf_take(&dump));
		fz_program_free(p);
		return st;
	}
	if (dump.len)
		p->dump = fz_buf_take(&dump);
	else
		free(fz_buf_take(&dump));
	*out = p;
	return FZ_OK;
}

bool fz_layout_is_contiguous(const fz_layout *l)
{
	int64_t acc = 1;
	for (int d = l->rank - 1; d >= 0; d--) {
		if (l->shape[d] != 1 && l->strides[d] != acc)
			return false;
		acc *= l->shape[d];
	}
	return true;
}

void fz_layout_gather(void *dst, const void *src, size_t es, const fz_layout *lay)
{
	int rank = lay->rank;
	int64_t n = 1, idx[FZ_MAX_RANK] = {0}, off = lay->offset;
	for (int i = 0; i < rank; i++)
		n *= lay->shape[i];
	if (n <= 0)
		return;
	/* the innermost run of contiguous elements moves in one memcpy */
	int inner = rank;
	int64_t run = 1;
	while (inner > 0 && (lay->shape[inner - 1] == 1 ||
			     lay->strides[inner - 1] == run)) {
		run *= lay->shape[inner - 1];
		inner--;
	}
	const char *s = src;
	char *o = dst;
	for (int64_t i = 0; i < n; i += run) {
		memcpy(o + (size_t)i * es, s + off * (int64_t)es, (size_t)run * es);
		for (int k = inner - 1; k >= 0; k--) {
			off += lay->strides[k];
			if (++idx[k] < lay->shape[k])
				break;
			off -= lay->strides[k] * lay->shape[k];
			idx[k] = 0;
		}
	}
}

/* ---- a kernel region with its views folded in ---- */

/* Whether the view chain of r's input x may fold into attention region r:
 * x is q, k, v, o or do as an attention op of r reads it (not a mask, not
 * lse, not kv heads read unrepeated), which the host's kernels read at
 * any strides with the head dim contiguous (fz_attn.stride). */
static bool fold_attn_operand(const fz_region *r, const fz_value *x)
{
	for (int j = 0; j < r->n_nodes; j++) {
		const fz_node *n = r->nodes[j];
		if (fz_ops[n->op].cls != FZ_CLASS_ATTENTION)
			continue;
		int nm = n->op == FZ_OP_ATTENTION ? 3 : 6;
		for (int k = 0; k < nm; k++)
			if (k != 4 && n->in[k] == x && (k == 1 || k == 2 ?
							fz_attn_operand(r, n, k) == x : true))
				return true;
	}
	return false;
}

/* Region r as its kernel computes it, with the strided views it reads
 * folded in. A view the runner would otherwise gather into the arena
 * before the launch (a weight broadcast over the rows of a layer_norm, a
 * bias over a batch, a transposed operand) becomes the meta ops that make
 * it from its base, so the kernel reads the base where its data lies and
 * no copy runs: broadcast_in_dim, permute, slice and reshape are index
 * arithmetic to the skeletons. A view made by reshapes alone stays an
 * input (it points into its base at no cost). On the host an attention
 * region's q, k, v, o and do fold too (fold_attn_operand), unless the
 * strides that makes are ones its kernels do not take. The choice
 * depends on the trace alone, never on the sizes, so that `fusec
 * compile` at symbolic sizes keys the kernels a run at bound sizes asks
 * for (plan.h says what it returns). */
bool fz_region_fold_views(const fz_program *p, const fz_region *r, bool host,
			  fz_region *out, fz_node ***folded, fz_value **ins)
{
	*out = *r;
	*folded = NULL;
	/* attention: the host's kernels read q, k, v, o and do through
	 * permutes and reshapes (the [B, T, H, D] projections seen as [B, H,
	 * T, D]); other targets read them contiguous, where the runner
	 * staged them */
	bool attn = r->kind == FZ_REGION_ATTENTION;
	if (!p->view_of || (attn && !host))
		return true;
	int cap = 0;
	for (int i = 0; i < r->n_in; i++)
		for (fz_value *x = r->in[i]; p->view_of[x->id]; x = p->view_of[x->id]->node->in[0])
			cap++;
	if (cap == 0)
		return true;
	fz_node **nodes = malloc(sizeof *nodes * (size_t)(cap + r->n_nodes));
	if (!nodes)
		return false;
	int n_pre = 0;
	for (int i = 0; i < r->n_in; i++) {
		int first = n_pre;
		bool ok = true, strided = false;
		for (fz_value *x = r->in[i]; ok && p->view_of[x->id];
		     x = p->view_of[x->id]->node->in[0]) {
			fz_node *n = p->view_of[x->id]->node;
			ok = n->n_in == 1;
			strided |= n->op != FZ_OP_RESHAPE && n->op != FZ_OP_SQUEEZE &&
				   n->op != FZ_OP_UNSQUEEZE;
			bool seen = false;
			for (int k = 0; k < n_pre && !seen; k++)
				seen = nodes[k] == n;
			if (!seen)
				nodes[n_pre++] = n;
		}
		if (!ok || !strided || (attn && !fold_attn_operand(r, r->in[i])))
			n_pre = first;
		/* walked from v to its base: the ops in the order they run */
		for (int j = first, k = n_pre - 1; j < k; j++, k--) {
			fz_node *tmp = nodes[j];
			nodes[j] = nodes[k];
			nodes[k] = tmp;
		}
	}
	if (n_pre == 0) {
		free(nodes);
		return true;
	}
	memcpy(nodes + n_pre, r->nodes, sizeof *nodes * (size_t)r->n_nodes);
	/* the inputs now: what the nodes read that no node makes (what r's
	 * own nodes read from outside r's inputs, r's nodes make) */
	int n_in = 0;
	for (int i = 0; i < n_pre + r->n_nodes; i++)
		for (int k = 0; k < nodes[i]->n_in; k++) {
			fz_value *v = nodes[i]->in[k];
			bool made = i >= n_pre && !fz_value_listed(r->in, r->n_in, v);
			for (int j = 0; j < n_pre && !made; j++)
				made = nodes[j] == v->def;
			/* each of r's inputs is itself or its view chain's
			 * base here: at most r->n_in, what ki has room for */
			if (!made && !fz_value_listed(ins, n_in, v)) {
				FZ_ASSERT(n_in < r->n_in);
				ins[n_in++] = v;
			}
		}
	*folded = nodes;
	out->n_nodes = n_pre + r->n_nodes;
	out->nodes = nodes;
	out->n_in = n_in;
	out->in = ins;
	fz_attn A;
	if (attn && !fz_attn_describe(p->trace, out, &A, NULL, 0)) {
		/* strides the kernels do not take: staged as before */
		free(nodes);
		*folded = NULL;
		*out = *r;
	}
	return true;
}
