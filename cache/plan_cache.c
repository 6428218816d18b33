/*
 * plan_cache.c: a whole program (regions, schedule, memory plan) kept in
 * the disk cache, so that a warm start goes parse -> hash -> load.
 *
 * Planning a trace costs a few microseconds per op (ir/plan.c); a
 * 32-layer Llama-2-7B training step is 14,000 ops, tens of milliseconds,
 * more than everything else a warm start does. The program it makes
 * depends only on the trace, the sizes it was planned at and the plan
 * options, so it is cached like a kernel: one entry per (trace, sizes,
 * options), in the same directory, under the same rules (temporary file
 * and rename, a checksum, the stored form compared on every lookup, a
 * damaged entry a miss that is removed).
 *
 * The form compared is a text header (format, trace name, sizes, options)
 * followed by the trace's image: every node's op, attributes, operand ids
 * and result types, every parameter's type, the outputs, the symbols, in
 * node order. Value names are left out (the plan does not read them), but
 * the written order is in: the stored program names nodes and values by
 * their ids, which are positions in the written order, so a trace
 * reordered must plan again (the kernels, keyed by canon.c, still hit).
 *
 *     plan
 *     target plan
 *     format 1
 *     planner 1                (FZ_PLAN_VERSION: what the passes make)
 *     trace llama_7b_ckpt_bf16
 *     sizes 1 2048 -1 ...      (per symbol; -1 unbound)
 *     horizontal 1
 *     exact_max_states 0
 *     image 1843212
 *     <the image, binary>
 *
 * The payload ("plan" section) is the program's arrays, ids only, each
 * read back through a bounds check: a region's node that is not a node of
 * this trace, a view whose base is out of range, a schedule that is not a
 * permutation, or bytes left over make the entry a miss (removed), never
 * a program. A stale format number is a miss too, since it is in the
 * compared form.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "codegen.h"

#define PLAN_FORMAT 1

/* ---- a byte buffer ---- */

typedef struct wbuf {
	uint8_t *p;
	size_t len, cap;
	bool oom;
} wbuf;

static void grow(wbuf *b, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n > b->cap) {
		size_t nc = b->cap ? b->cap : 4096;
		while (nc < b->len + n)
			nc *= 2;
		uint8_t *q = realloc(b->p, nc);
		if (!q) {
			b->oom = true;
			return;
		}
		b->p = q;
		b->cap = nc;
	}
}

static inline void put(wbuf *b, const void *x, size_t n)
{
	if (b->len + n > b->cap) {
		grow(b, n);
		if (b->oom)
			return;
	}
	memcpy(b->p + b->len, x, n);
	b->len += n;
}

/* The image is written in LEB128 varints (zigzag for signed numbers): most
 * of its numbers are small, and it is hashed and compared on every warm
 * start. */
static inline void put_u(wbuf *b, uint64_t x)
{
	if (b->len + 10 > b->cap) {
		grow(b, 10);
		if (b->oom)
			return;
	}
	while (x >= 0x80) {
		b->p[b->len++] = (uint8_t)(x | 0x80);
		x >>= 7;
	}
	b->p[b->len++] = (uint8_t)x;
}

static inline void put_s(wbuf *b, int64_t x)
{
	put_u(b, ((uint64_t)x << 1) ^ (uint64_t)(x >> 63));
}

static void put_i32(wbuf *b, int32_t x) { put(b, &x, sizeof x); }
static void put_i64(wbuf *b, int64_t x) { put(b, &x, sizeof x); }
static void put_str(wbuf *b, const char *s) { put(b, s, strlen(s)); }

static void put_ext(wbuf *b, fz_ext e)
{
	put_s(b, e.c);
	put_u(b, e.syms);
}

static void put_type(wbuf *b, const fz_type *ty)
{
	put_s(b, (int32_t)ty->dtype);
	put_s(b, ty->rank);
	put_s(b, ty->future);
	for (int i = 0; i < ty->rank; i++)
		put_ext(b, ty->dims[i]);
}

/* ---- the trace's image ---- */

static void put_attrs(wbuf *b, const fz_attrs *a)
{
	put_s(b, (int32_t)a->present);
	put_s(b, (int32_t)a->dtype);
	put_s(b, a->n_shape);
	for (int i = 0; i < a->n_shape; i++)
		put_ext(b, a->shape[i]);
	put_s(b, a->n_dims);
	for (int i = 0; i < a->n_dims; i++)
		put_s(b, a->dims[i]);
	put_s(b, a->dim);
	put_s(b, a->keepdim);
	put(b, &a->value, sizeof a->value);
	put_s(b, a->value_sym);
	put_ext(b, a->length);
	put_s(b, a->seed);
	put_s(b, a->offset);
	put_s(b, a->n_slice);
	for (int i = 0; i < a->n_slice; i++) {
		put_s(b, a->start[i]);
		put_s(b, a->step[i]);
		put_ext(b, a->end[i]);
	}
	put_s(b, a->correction);
	put_s(b, a->approximate);
	put(b, &a->eps, sizeof a->eps);
	/* attention's: without them a causal trace read a non-causal plan */
	put_s(b, a->causal);
	put(b, &a->scale, sizeof a->scale);
	put(b, &a->window, sizeof a->window);
	put(b, &a->softcap, sizeof a->softcap);
}

static void put_image(wbuf *b, const fz_trace *t)
{
	put_s(b, t->world);
	put_s(b, t->n_syms);
	for (int s = 0; s < t->n_syms; s++) {
		put_str(b, t->syms[s]);
		put(b, "", 1);
	}
	put_s(b, t->n_params);
	for (int i = 0; i < t->n_params; i++) {
		put_s(b, t->params[i]->id);
		put_type(b, &t->params[i]->type);
	}
	put_s(b, t->n_nodes);
	put_s(b, t->n_values);
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *n = t->nodes[i];
		put_s(b, (int32_t)n->op);
		put_s(b, n->n_in);
		for (int k = 0; k < n->n_in; k++)
			put_s(b, n->in[k]->id);
		put_s(b, n->n_out);
		for (int k = 0; k < n->n_out; k++) {
			put_s(b, n->out[k]->id);
			put_type(b, &n->out[k]->type);
		}
		put_attrs(b, &n->attrs);
	}
	put_s(b, t->n_outputs);
	for (int i = 0; i < t->n_outputs; i++)
		put_s(b, t->outputs[i]->id);
}

fz_status fz_plan_form(const fz_trace *t, const fz_plan_options *o,
		       void **form, size_t *len)
{
	fz_plan_options d;
	if (!o) {
		fz_plan_defaults(&d);
		o = &d;
	}
	wbuf img = {0}, b = {0};
	put_image(&img, t);
	char line[128];
	put_str(&b, "plan\ntarget plan\n");
	snprintf(line, sizeof line, "format %d\nplanner %d\n", PLAN_FORMAT,
		 FZ_PLAN_VERSION);
	put_str(&b, line);
	put_str(&b, "trace ");
	put_str(&b, t->name ? t->name : "");
	put_str(&b, "\nsizes");
	for (int s = 0; s < t->n_syms; s++) {
		int64_t v = o->sym_sizes && o->sym_sizes[s] >= 0 ? o->sym_sizes[s] : -1;
		snprintf(line, sizeof line, " %lld", (long long)v);
		put_str(&b, line);
	}
	snprintf(line, sizeof line, "\nhorizontal %d\nexact_max_states %d\n"
		 "image %zu\n", o->horizontal ? 1 : 0, o->exact_max_states, img.len);
	put_str(&b, line);
	put(&b, img.p, img.len);
	free(img.p);
	if (b.oom || img.oom) {
		free(b.p);
		return FZ_ENOMEM;
	}
	*form = b.p;
	*len = b.len;
	return FZ_OK;
}

/* ---- the program ---- */

static void put_ids(wbuf *b, fz_value *const *vs, int n)
{
	put_i32(b, n);
	for (int i = 0; i < n; i++)
		put_i32(b, vs[i]->id);
}

static void put_program(wbuf *b, const fz_program *p)
{
	const fz_trace *t = p->trace;
	int n = t->n_nodes, nv = t->n_values, nr = p->n_regions;
	put(b, p->sym_sizes, sizeof p->sym_sizes);
	put(b, p->probe_sizes, sizeof p->probe_sizes);
	put_i64(b, (int64_t)p->unbound_syms);
	put_i32(b, nr);
	for (int r = 0; r < nr; r++) {
		const fz_region *R = p->regions[r];
		put_i32(b, (int32_t)R->kind);
		put_i32(b, R->n_nodes);
		for (int j = 0; j < R->n_nodes; j++)
			put_i32(b, R->nodes[j]->id);
		put_ids(b, R->in, R->n_in);
		put_ids(b, R->out, R->n_out);
	}
	put(b, p->canon_rank, sizeof(int) * (size_t)n);
	put_i32(b, p->n_views);
	for (int v = 0; v < nv; v++) {
		const fz_view *w = p->view_of[v];
		if (!w)
			continue;
		put_i32(b, v);
		put_i32(b, w->base->id);
		put_i32(b, w->node->id);
		put(b, &w->lay, sizeof w->lay);
	}
	put(b, p->vec_width, sizeof(int) * (size_t)nr);
	put(b, p->vec_bytes, sizeof(int) * (size_t)nr);
	put(b, p->order, sizeof(int) * (size_t)nr);
	put(b, p->trace_order, sizeof(int) * (size_t)nr);
	put_i32(b, (int32_t)p->method);
	put_i32(b, p->peak_proven_optimal);
	put_i64(b, p->peak_lower_bound);
	put(b, p->bytes, sizeof(int64_t) * (size_t)nv);
	put(b, p->buffer, sizeof(int) * (size_t)nv);
	put(b, p->offset, sizeof(int64_t) * (size_t)nv);
	for (int v = 0; v < nv; v++) {
		put_i32(b, p->n_donors[v]);
		for (int d = 0; d < p->n_donors[v]; d++)
			put_i32(b, p->donors[v][d]);
	}
	put_i64(b, p->peak_bytes);
	put_i64(b, p->peak_bytes_trace_order);
	put_i64(b, p->arena_bytes);
	put_i32(b, p->horizontal_merged);
	put_i32(b, p->horizontal_refused_peak);
	put_i32(b, p->horizontal_refused_path);
	put(b, p->pass_seconds, sizeof p->pass_seconds);
	put(b, p->pass_work, sizeof p->pass_work);
}

fz_status fz_plan_serialize(const fz_program *p, void **data, size_t *len)
{
	wbuf b = {0};
	put_program(&b, p);
	if (b.oom) {
		free(b.p);
		return FZ_ENOMEM;
	}
	*data = b.p;
	*len = b.len;
	return FZ_OK;
}

/* ---- reading it back, every number checked ---- */

typedef struct rbuf {
	const uint8_t *p;
	size_t len, off;
	bool bad;
} rbuf;

static void get(rbuf *r, void *x, size_t n)
{
	if (r->bad || n > r->len - r->off) {
		r->bad = true;
		memset(x, 0, n);
		return;
	}
	memcpy(x, r->p + r->off, n);
	r->off += n;
}

static int32_t get_i32(rbuf *r)
{
	int32_t x;
	get(r, &x, sizeof x);
	return x;
}

static int64_t get_i64(rbuf *r)
{
	int64_t x;
	get(r, &x, sizeof x);
	return x;
}

/* An int in [lo, hi), else the buffer is marked bad (and lo returned). */
static int get_in(rbuf *r, int lo, int hi)
{
	int32_t x = get_i32(r);
	if (x < lo || x >= hi) {
		r->bad = true;
		return lo;
	}
	return x;
}

static void *arena_array(fz_program *p, size_t n, size_t size, rbuf *r)
{
	void *a = fz_arena_alloc(&p->arena, n * size + 1);
	if (!a)
		r->bad = true;
	return a;
}

static fz_value **get_ids(rbuf *r, fz_program *p, int *n)
{
	int nv = p->trace->n_values;
	*n = get_in(r, 0, nv + 1);
	fz_value **vs = arena_array(p, (size_t)*n + 1, sizeof *vs, r);
	for (int i = 0; vs && i < *n && !r->bad; i++)
		vs[i] = p->trace->values[get_in(r, 0, nv)];
	return vs;
}

/* Is a[0..n) a permutation of 0..n-1? seen: n bools of scratch. */
static bool is_permutation(const int *a, int n, bool *seen)
{
	if (n <= 0)
		return n == 0;
	memset(seen, 0, (size_t)n);
	for (int i = 0; i < n; i++) {
		if (a[i] < 0 || a[i] >= n || seen[a[i]])
			return false;
		seen[a[i]] = true;
	}
	return true;
}

fz_status fz_plan_deserialize(const fz_trace *t, const fz_plan_options *o,
			      const void *data, size_t len, fz_program **out)
{
	*out = NULL;
	fz_program *p = calloc(1, sizeof *p);
	if (!p)
		return FZ_ENOMEM;
	rbuf r = {data, len, 0, false};
	int n = t->n_nodes, nv = t->n_values;
	bool *seen = NULL;
	p->trace = t;
	if (o)
		p->opts = *o;
	else
		fz_plan_defaults(&p->opts);
	p->opts.sym_sizes = NULL;
	p->opts.dump_after = -1;
	get(&r, p->sym_sizes, sizeof p->sym_sizes);
	get(&r, p->probe_sizes, sizeof p->probe_sizes);
	p->unbound_syms = (uint64_t)get_i64(&r);

	int nr = p->n_regions = get_in(&r, 0, n + 1);
	p->regions = arena_array(p, (size_t)nr + 1, sizeof *p->regions, &r);
	p->region_of = arena_array(p, (size_t)n + 1, sizeof(int), &r);
	seen = calloc((size_t)(n > nv ? n : nv) + (size_t)nr + 1, 1);
	if (!seen)
		r.bad = true;
	for (int i = 0; p->region_of && i < n; i++)
		p->region_of[i] = -1;
	for (int k = 0; k < nr && !r.bad; k++) {
		fz_region *R = arena_array(p, 1, sizeof *R, &r);
		if (!R)
			break;
		R->id = k;
		R->kind = (fz_region_kind)get_in(&r, 0, FZ_REGION_KIND_COUNT);
		R->n_nodes = get_in(&r, 0, n + 1);
		R->nodes = arena_array(p, (size_t)R->n_nodes + 1, sizeof *R->nodes, &r);
		for (int j = 0; R->nodes && j < R->n_nodes && !r.bad; j++) {
			int id = get_in(&r, 0, n);
			if (p->region_of[id] >= 0) /* a node in two regions */
				r.bad = true;
			p->region_of[id] = k;
			R->nodes[j] = t->nodes[id];
		}
		R->in = get_ids(&r, p, &R->n_in);
		R->out = get_ids(&r, p, &R->n_out);
		p->regions[k] = R;
	}
	/* a node in no region is a dead one (ir/dce.c), and only that */
	if (!r.bad && fz_dce(p) != FZ_OK)
		r.bad = true;
	for (int i = 0; p->region_of && i < n && !r.bad; i++)
		if ((p->region_of[i] < 0) != (p->dead && p->dead[i]))
			r.bad = true;
	p->canon_rank = arena_array(p, (size_t)n + 1, sizeof(int), &r);
	if (p->canon_rank)
		get(&r, p->canon_rank, sizeof(int) * (size_t)n);

	p->view_of = arena_array(p, (size_t)nv + 1, sizeof *p->view_of, &r);
	p->n_views = get_in(&r, 0, nv + 1);
	for (int i = 0; p->view_of && i < p->n_views && !r.bad; i++) {
		int v = get_in(&r, 0, nv), base = get_in(&r, 0, nv);
		int node = get_in(&r, 0, n);
		fz_view *w = arena_array(p, 1, sizeof *w, &r);
		if (!w || r.bad)
			break;
		w->value = t->values[v];
		w->base = t->values[base];
		w->node = t->nodes[node];
		get(&r, &w->lay, sizeof w->lay);
		/* the view is made by its node, and the layout fits */
		if (w->node->n_out < 1 || w->node->out[0] != w->value ||
		    p->view_of[v] || w->lay.rank < 0 || w->lay.rank > FZ_MAX_RANK)
			r.bad = true;
		p->view_of[v] = w;
	}
	/* every view's chain ends at a value that is no view, within n steps */
	for (int v = 0; p->view_of && v < nv && !r.bad; v++) {
		const fz_value *x = t->values[v];
		for (int steps = 0; p->view_of[x->id]; steps++) {
			if (steps > nv) {
				r.bad = true;
				break;
			}
			x = p->view_of[x->id]->base;
		}
	}
	if (!r.bad && fz_program_index_views(p) != FZ_OK)
		r.bad = true;
	p->vec_width = arena_array(p, (size_t)nr + 1, sizeof(int), &r);
	p->vec_bytes = arena_array(p, (size_t)nr + 1, sizeof(int), &r);
	p->order = arena_array(p, (size_t)nr + 1, sizeof(int), &r);
	p->trace_order = arena_array(p, (size_t)nr + 1, sizeof(int), &r);
	if (!r.bad) {
		get(&r, p->vec_width, sizeof(int) * (size_t)nr);
		get(&r, p->vec_bytes, sizeof(int) * (size_t)nr);
		get(&r, p->order, sizeof(int) * (size_t)nr);
		get(&r, p->trace_order, sizeof(int) * (size_t)nr);
	}
	if (!r.bad && (!is_permutation(p->order, nr, seen) ||
		       !is_permutation(p->trace_order, nr, seen)))
		r.bad = true;
	p->method = (fz_sched_method)get_in(&r, 0, FZ_SCHED_FUSED + 1);
	p->peak_proven_optimal = get_i32(&r) != 0;
	p->peak_lower_bound = get_i64(&r);

	p->bytes = arena_array(p, (size_t)nv + 1, sizeof(int64_t), &r);
	p->buffer = arena_array(p, (size_t)nv + 1, sizeof(int), &r);
	p->offset = arena_array(p, (size_t)nv + 1, sizeof(int64_t), &r);
	p->n_donors = arena_array(p, (size_t)nv + 1, sizeof(int), &r);
	p->donors = arena_array(p, (size_t)nv + 1, sizeof(int *), &r);
	if (!r.bad) {
		get(&r, p->bytes, sizeof(int64_t) * (size_t)nv);
		get(&r, p->buffer, sizeof(int) * (size_t)nv);
		get(&r, p->offset, sizeof(int64_t) * (size_t)nv);
	}
	for (int v = 0; v < nv && !r.bad; v++) {
		if (p->buffer[v] < 0 || p->buffer[v] >= nv || p->bytes[v] < 0 ||
		    p->offset[v] < -1)
			r.bad = true;
		p->n_donors[v] = get_in(&r, 0, nv + 1);
		p->donors[v] = arena_array(p, (size_t)p->n_donors[v] + 1, sizeof(int), &r);
		for (int d = 0; p->donors[v] && d < p->n_donors[v] && !r.bad; d++)
			p->donors[v][d] = get_in(&r, 0, nv);
	}
	p->peak_bytes = get_i64(&r);
	p->peak_bytes_trace_order = get_i64(&r);
	p->arena_bytes = get_i64(&r);
	for (int v = 0; v < nv && !r.bad; v++)
		if (p->offset[v] >= 0 && p->offset[v] + p->bytes[v] > p->arena_bytes)
			r.bad = true; /* a buffer outside the arena */
	p->horizontal_merged = get_i32(&r);
	p->horizontal_refused_peak = get_i32(&r);
	p->horizontal_refused_path = get_i32(&r);
	get(&r, p->pass_seconds, sizeof p->pass_seconds);
	get(&r, p->pass_work, sizeof p->pass_work);
	if (r.off != r.len)
		r.bad = true;
	free(seen);
	if (r.bad) {
		fz_program_free(p);
		return FZ_EINVAL;
	}
	*out = p;
	return FZ_OK;
}

/* ---- the cache ---- */

fz_status fz_plan_cached(fz_disk *d, const fz_trace *t,
			 const fz_plan_options *o, fz_program **out,
			 bool *hit, char **err)
{
	return fz_plan_cached_hook(d, t, o, NULL, NULL, out, hit, err);
}

fz_status fz_plan_cached_hook(fz_disk *d, const fz_trace *t,
			      const fz_plan_options *o,
			      void (*on_plan)(void *ctx), void *ctx,
			      fz_program **out, bool *hit, char **err)
{
	*out = NULL;
	if (hit)
		*hit = false;
	void *form = NULL;
	size_t form_len = 0;
	fz_status st;
	if (!d || fz_disk_disabled(d) || (o && o->dump_after >= 0)) {
		if (on_plan)
			on_plan(ctx);
		return fz_plan(t, o, out, err);
	}
	if ((st = fz_plan_form(t, o, &form, &form_len)) != FZ_OK)
		return st;
	fz_key key = fz_key_of(form, form_len);
	fz_entry *e = NULL;
	fz_disk_lookup(d, key, form, form_len, &e);
	const fz_section *s = e ? fz_entry_section(e, "plan") : NULL;
	if (s && fz_plan_deserialize(t, o, s->data, s->len, out) == FZ_OK) {
		fz_entry_free(e);
		(*out)->cache_form = form;
		(*out)->cache_form_len = form_len;
		if (hit)
			*hit = true;
		return FZ_OK;
	}
	fz_entry_free(e);
	/* a miss, or an entry that does not read back: plan, and store (a
	 * store replaces what is under the key) */
	if (on_plan)
		on_plan(ctx);
	if ((st = fz_plan(t, o, out, err)) != FZ_OK) {
		free(form);
		return st;
	}
	void *data = NULL;
	size_t len = 0;
	if (fz_plan_serialize(*out, &data, &len) == FZ_OK) {
		fz_section sec = {.data = data, .len = len};
		memcpy(sec.tag, "plan", 5);
		fz_disk_store(d, key, form, form_len, &sec, 1);
	}
	free(data);
	(*out)->cache_form = form;
	(*out)->cache_form_len = form_len;
	return FZ_OK;
}

/* ---- the kernel keys of a program ---- */

/*
 * Keying a program's kernels means canonicalizing every kernel region
 * (canon.c): on a 32-layer Llama-2-7B step, 590 regions, about as long as
 * loading the program. The forms depend only on the program and on what
 * the code generator specializes on (the target, its version, LLVM's, the
 * spec bytes of each region), so they are kept in one more entry: its
 * compared form is a header naming those, every kernel region's spec
 * bytes, then the program's own form (fz_plan_form); its payload, for each
 * kernel region, the key, the canonical order of its nodes, inputs and
 * outputs and its symbols, and each distinct canonical form once. What is
 * read back is checked (node ids of the region, each once; positions a
 * permutation; the key the hash of its form) and builds the same fz_canon
 * that fz_canon_region makes.
 */
#define KEYS_FORMAT 2

static fz_status keys_form(const fz_program *p, const fz_region *const *rs,
			   const fz_cg_options *o, const char *tname, void **form,
			   size_t *len)
{
	/* the program's form: the one the plan cache filed it under (what
	 * determines the program), else made with the sizes it was planned
	 * at */
	const void *pf = p->cache_form;
	void *own = NULL;
	size_t pl = p->cache_form_len;
	if (!pf) {
		int64_t sizes[FZ_MAX_SYMS];
		for (int s = 0; s < FZ_MAX_SYMS; s++)
			sizes[s] = p->unbound_syms >> s & 1 ? -1 : p->sym_sizes[s];
		fz_plan_options po = p->opts;
		po.sym_sizes = sizes;
		fz_status st = fz_plan_form(p->trace, &po, &own, &pl);
		if (st != FZ_OK)
			return st;
		pf = own;
	}
	wbuf b = {0};
	char line[256];
	fz_key_params kp;
	fz_key_params_init(&kp, tname, FZ_CODEGEN_VERSION);
	snprintf(line, sizeof line, "kernel keys\ntarget keys\nformat %d\n"
		 "for %s\ncodegen %d\nbuild %s\nllvm %u.%u.%u\n", KEYS_FORMAT, tname,
		 FZ_CODEGEN_VERSION, kp.build_id, kp.llvm_major, kp.llvm_minor,
		 kp.llvm_patch);
	put_str(&b, line);
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = rs[r];
		if (!R || !fz_region_is_kernel(R->kind))
			continue;
		uint8_t spec[2 + 256];
		size_t n = fz_cache_spec(o, R, spec, sizeof spec);
		put_i32(&b, r);
		put_i32(&b, (int32_t)n);
		put(&b, spec, n);
		/* what is keyed: the region, or its form with views folded in */
		put_i32(&b, R->n_nodes);
		put_i32(&b, R->n_in);
	}
	put_str(&b, "\nprogram\n");
	put(&b, pf, pl);
	free(own);
	if (b.oom) {
		free(b.p);
		return FZ_ENOMEM;
	}
	*form = b.p;
	*len = b.len;
	return FZ_OK;
}

void fz_program_canons_free(const fz_program *p, fz_canon **cs)
{
	if (!cs)
		return;
	for (int r = 0; r < p->n_regions; r++)
		fz_canon_free(cs[r]);
	free(cs);
}

static fz_status canons_compute(const fz_program *p, const fz_region *const *rs,
				const fz_cg_options *o, const char *tname,
				fz_canon **cs, char **err)
{
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = rs[r];
		if (!R || !fz_region_is_kernel(R->kind))
			continue;
		fz_status st = fz_cache_canon(p->trace, R, o, tname, &cs[r], err);
		if (st != FZ_OK)
			return st;
	}
	return FZ_OK;
}

static fz_status canons_serialize(const fz_program *p, fz_canon **cs,
				  void **data, size_t *len)
{
	wbuf b = {0};
	int n_texts = 0;
	/* distinct forms: a region shares the text of an earlier one with
	 * its key and form (the table is small: a model's distinct kernels) */
	int *text_of = calloc((size_t)p->n_regions + 1, sizeof(int));
	int *firsts = calloc((size_t)p->n_regions + 1, sizeof(int));
	if (!text_of || !firsts) {
		free(text_of);
		free(firsts);
		return FZ_ENOMEM;
	}
	for (int r = 0; r < p->n_regions; r++) {
		const fz_canon *c = cs[r];
		if (!c)
			continue;
		int k;
		for (k = 0; k < n_texts; k++) {
			const fz_canon *f = cs[firsts[k]];
			if (fz_key_eq(f->key, c->key) && f->len == c->len &&
			    !memcmp(f->text, c->text, c->len))
				break;
		}
		if (k == n_texts)
			firsts[n_texts++] = r;
		text_of[r] = k;
	}
	put_i32(&b, n_texts);
	for (int k = 0; k < n_texts; k++) {
		const fz_canon *f = cs[firsts[k]];
		put_i64(&b, (int64_t)f->len);
		put(&b, f->text, f->len);
	}
	for (int r = 0; r < p->n_regions; r++) {
		const fz_canon *c = cs[r];
		if (!c)
			continue;
		put_i32(&b, r);
		put_i32(&b, text_of[r]);
		put_i32(&b, c->n_nodes);
		for (int j = 0; j < c->n_nodes; j++)
			put_i32(&b, c->nodes[j]->id);
		put_i32(&b, c->n_in);
		put(&b, c->in_pos, sizeof(int) * (size_t)c->n_in);
		put_i32(&b, c->n_out);
		put(&b, c->out_pos, sizeof(int) * (size_t)c->n_out);
		put_i32(&b, c->n_syms);
		put(&b, c->syms, sizeof(int) * (size_t)c->n_syms);
	}
	put_i32(&b, -1);
	free(text_of);
	free(firsts);
	if (b.oom) {
		free(b.p);
		return FZ_ENOMEM;
	}
	*data = b.p;
	*len = b.len;
	return FZ_OK;
}

/* positions pos[0..n) a permutation of 0..n-1; seen: n ints, stamp fresh */
static bool perm_ok(const int *pos, int n, int *seen, int stamp)
{
	for (int i = 0; i < n; i++) {
		if (pos[i] < 0 || pos[i] >= n || seen[pos[i]] == stamp)
			return false;
		seen[pos[i]] = stamp;
	}
	return true;
}

static fz_status canons_deserialize(const fz_program *p, const fz_region *const *rs,
				    const void *data, size_t len, fz_canon **cs)
{
	const fz_trace *t = p->trace;
	rbuf rd = {data, len, 0, false}, *r = &rd;
	int n_texts = get_in(r, 0, p->n_regions + 1);
	const char **texts = calloc((size_t)n_texts + 1, sizeof *texts);
	size_t *lens = calloc((size_t)n_texts + 1, sizeof *lens);
	fz_key *keys = calloc((size_t)n_texts + 1, sizeof *keys);
	int nmax = t->n_nodes > t->n_values ? t->n_nodes : t->n_values;
	int *seen = calloc((size_t)nmax + 1, sizeof(int)), stamp = 0;
	int *member = calloc((size_t)t->n_nodes + 1, sizeof(int));
	if (!texts || !lens || !keys || !seen || !member)
		r->bad = true;
	for (int k = 0; k < n_texts && !r->bad; k++) {
		int64_t l = get_i64(r);
		if (l < 0 || (uint64_t)l > r->len - r->off) {
			r->bad = true;
			break;
		}
		texts[k] = (const char *)r->p + r->off;
		lens[k] = (size_t)l;
		keys[k] = fz_key_of(texts[k], lens[k]);
		r->off += (size_t)l;
	}
	int last = -1;
	while (!r->bad) {
		int reg = get_i32(r);
		if (reg == -1)
			break;
		if (reg <= last || reg >= p->n_regions || !rs[reg] ||
		    !fz_region_is_kernel(rs[reg]->kind)) {
			r->bad = true;
			break;
		}
		last = reg;
		const fz_region *R = rs[reg];
		for (int j = 0; j < R->n_nodes; j++)
			if (R->nodes[j]->id >= 0 && R->nodes[j]->id < t->n_nodes)
				member[R->nodes[j]->id] = reg + 1;
		int k = get_in(r, 0, n_texts);
		fz_canon *c = calloc(1, sizeof *c);
		if (!c) {
			r->bad = true;
			break;
		}
		cs[reg] = c;
		c->key = keys[k];
		c->text = malloc(lens[k] + 1);
		if (c->text) {
			memcpy(c->text, texts[k], lens[k]);
			c->text[lens[k]] = '\0';
		}
		c->len = lens[k];
		c->n_nodes = get_in(r, R->n_nodes, R->n_nodes + 1);
		c->nodes = calloc((size_t)c->n_nodes + 1, sizeof *c->nodes);
		stamp++;
		for (int j = 0; c->nodes && j < c->n_nodes && !r->bad; j++) {
			int id = get_in(r, 0, t->n_nodes);
			if (member[id] != reg + 1 || seen[id] == stamp)
				r->bad = true;
			seen[id] = stamp;
			c->nodes[j] = t->nodes[id];
		}
		c->n_in = get_in(r, R->n_in, R->n_in + 1);
		c->in = calloc((size_t)c->n_in + 1, sizeof *c->in);
		c->in_pos = calloc((size_t)c->n_in + 1, sizeof *c->in_pos);
		if (c->in_pos && !r->bad)
			get(r, c->in_pos, sizeof(int) * (size_t)c->n_in);
		c->n_out = get_in(r, R->n_out, R->n_out + 1);
		c->out = calloc((size_t)c->n_out + 1, sizeof *c->out);
		c->out_pos = calloc((size_t)c->n_out + 1, sizeof *c->out_pos);
		if (c->out_pos && !r->bad)
			get(r, c->out_pos, sizeof(int) * (size_t)c->n_out);
		c->n_syms = get_in(r, 0, t->n_syms + 1);
		get(r, c->syms, sizeof(int) * (size_t)c->n_syms);
		if (!c->text || !c->nodes || !c->in || !c->in_pos || !c->out ||
		    !c->out_pos || r->bad ||
		    !perm_ok(c->in_pos, c->n_in, seen, ++stamp) ||
		    !perm_ok(c->out_pos, c->n_out, seen, ++stamp)) {
			r->bad = true;
			break;
		}
		for (int s = 0; s < c->n_syms; s++)
			if (c->syms[s] < 0 || c->syms[s] >= t->n_syms)
				r->bad = true;
		for (int i = 0; i < c->n_in; i++)
			c->in[i] = R->in[c->in_pos[i]];
		for (int i = 0; i < c->n_out; i++)
			c->out[i] = R->out[c->out_pos[i]];
	}
	if (r->off != r->len)
		r->bad = true;
	/* every kernel region has its form */
	for (int reg = 0; reg < p->n_regions && !r->bad; reg++)
		if (rs[reg] && fz_region_is_kernel(rs[reg]->kind) && !cs[reg])
			r->bad = true;
	free(member);
	free(texts);
	free(lens);
	free(keys);
	free(seen);
	return r->bad ? FZ_EINVAL : FZ_OK;
}

fz_status fz_program_canons(fz_disk *d, const fz_program *p,
			    const fz_cg_options *o, fz_canon ***out, bool *hit,
			    char **err)
{
	return fz_program_canons_of(d, p, (const fz_region *const *)p->regions, o,
				    out, hit, err);
}

fz_status fz_program_canons_of(fz_disk *d, const fz_program *p,
			       const fz_region *const *rs, const fz_cg_options *o,
			       fz_canon ***out, bool *hit, char **err)
{
	*out = NULL;
	if (hit)
		*hit = false;
	char tname[160];
	fz_cache_target(o, tname, sizeof tname);
	fz_canon **cs = calloc((size_t)p->n_regions + 1, sizeof *cs);
	if (!cs)
		return FZ_ENOMEM;
	void *form = NULL;
	size_t form_len = 0;
	fz_key key = {0, 0};
	fz_status st;
	bool cached = d && !fz_disk_disabled(d);
	if (cached) {
		if ((st = keys_form(p, rs, o, tname, &form, &form_len)) != FZ_OK)
			goto fail;
		key = fz_key_of(form, form_len);
		fz_entry *e = NULL;
		fz_disk_lookup(d, key, form, form_len, &e);
		const fz_section *s = e ? fz_entry_section(e, "keys") : NULL;
		if (s && canons_deserialize(p, rs, s->data, s->len, cs) == FZ_OK) {
			fz_entry_free(e);
			free(form);
			if (hit)
				*hit = true;
			*out = cs;
			return FZ_OK;
		}
		fz_entry_free(e);
		for (int r = 0; r < p->n_regions; r++) {
			fz_canon_free(cs[r]);
			cs[r] = NULL;
		}
	}
	if ((st = canons_compute(p, rs, o, tname, cs, err)) != FZ_OK)
		goto fail;
	if (cached) {
		void *data = NULL;
		size_t len = 0;
		if (canons_serialize(p, cs, &data, &len) == FZ_OK) {
			fz_section sec = {.data = data, .len = len};
			memcpy(sec.tag, "keys", 5);
			fz_disk_store(d, key, form, form_len, &sec, 1);
		}
		free(data);
	}
	free(form);
	*out = cs;
	return FZ_OK;
fail:
	free(form);
	fz_program_canons_free(p, cs);
	return st;
}
