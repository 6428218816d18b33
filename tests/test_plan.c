/*
 * test_plan.c: partition, bookend, schedule and memplan (ir/plan.c and the
 * passes it calls).
 *
 * Each pass is checked on small traces whose regions a person can draw,
 * then the whole pipeline on the corpus and on random DAGs against
 * properties that must hold for any trace: every op in exactly one region,
 * the order a topological order of the regions, the peak equal to a
 * brute-force replay of the chosen order written here independently (which
 * also checks that no two live buffers overlap in the arena), the planned
 * peak never above the written order's, the exact search never beaten by
 * trying every order, and regions that do not change when independent
 * statements are reordered and values renamed. Horizontal fusion is on
 * throughout (the default); every corpus trace and random DAG is planned
 * with it off as well, and with it on the peak is never higher.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "fusec.h"
#include "ir.h"
#include "plan.h"

/* ---- helpers ---------------------------------------------------------------- */

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "test.trace", &m, &diag);
	ck_assert_msg(st == FZ_OK, "parse failed: %s", diag ? diag : "(no message)");
	fz_free(diag);
	return m;
}

static fz_program *plan_sized(const fz_trace *t, const int64_t *syms)
{
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.sym_sizes = syms;
	fz_program *p = NULL;
	char *err = NULL;
	fz_status st = fz_plan(t, &o, &p, &err);
	ck_assert_msg(st == FZ_OK, "plan failed: %s", err ? err : "?");
	fz_free(err);
	return p;
}

static fz_program *plan(const fz_trace *t) { return plan_sized(t, NULL); }

static fz_program *plan_flat(const fz_trace *t, const int64_t *syms)
{
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.sym_sizes = syms;
	o.horizontal = false;
	fz_program *p = NULL;
	ck_assert_int_eq(fz_plan(t, &o, &p, NULL), FZ_OK);
	return p;
}

/* Horizontal fusion never raises the planned peak, never adds a region. */
static void check_horizontal(const fz_trace *t, const int64_t *syms)
{
	fz_program *on = plan_sized(t, syms), *off = plan_flat(t, syms);
	ck_assert_int_le(on->peak_bytes, off->peak_bytes);
	ck_assert_int_le(on->n_regions, off->n_regions);
	ck_assert_int_eq(off->n_regions - on->n_regions, on->horizontal_merged);
	ck_assert_int_eq(off->horizontal_merged, 0);
	fz_program_free(on);
	fz_program_free(off);
}

static int count_kind(const fz_program *p, fz_region_kind k)
{
	return fz_program_count(p, k);
}

static const fz_value *named(const fz_trace *t, const char *name)
{
	const fz_value *v = fz_lookup(t, name);
	ck_assert_msg(v != NULL, "no value %s", name);
	return v;
}

static fz_module *load_file(const char *path)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse_file(path, &m, &diag);
	ck_assert_msg(st == FZ_OK, "%s: %s", path, diag ? diag : "?");
	fz_free(diag);
	return m;
}

/* ---- the properties every plan must have -------------------------------- */

static int64_t round256(int64_t x) { return (x + 255) / 256 * 256; }

/* Whether value v of region r is computed from value b (walking defs
 * inside the region). */
static bool computed_from(const fz_program *p, int r, const fz_value *v,
			  const fz_value *b)
{
	if (v == b)
		return true;
	if (!v->def || p->region_of[v->def->id] != r)
		return false;
	for (int i = 0; i < v->def->n_in; i++)
		if (computed_from(p, r, v->def->in[i], b))
			return true;
	return false;
}

/* An output that takes over an input's buffer in place is computed from
 * that input: then the kernel stores each element after loading it, and
 * no other read of the input in the region comes after the store (issue
 * 23: y = m - x with m placed over x read x after m's store). */
static void check_in_place(const fz_program *p)
{
	const fz_trace *t = p->trace;
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = p->regions[r];
		for (int k = 0; k < R->n_out; k++) {
			const fz_value *o = R->out[k];
			int b = p->buffer[o->id];
			if (b == o->id || p->offset[o->id] < 0 ||
			    (p->view_of && p->view_of[o->id]))
				continue;
			for (int i = 0; i < R->n_in; i++)
				if (R->in[i]->id == b)
					ck_assert_msg(computed_from(p, r, o, t->values[b]),
						      "%s: region %d stores %s over %s, "
						      "which it is not computed from",
						      t->name, r, o->name ? o->name : "?",
						      t->values[b]->name ? t->values[b]->name : "?");
		}
	}
}

/* What node i's region reads for its operand k (a folded attention op
 * reads repeated kv heads unrepeated, ir/attention.h). */
static const fz_value *operand(const fz_program *p, const fz_node *nd, int k)
{
	int r = p->region_of[nd->id];
	return r >= 0 ? fz_attn_operand(p->regions[r], nd, k) : nd->in[k];
}

/* Checks p against its trace and returns the brute-force peak of p->order. */
static int64_t check_plan(const fz_program *p)
{
	const fz_trace *t = p->trace;
	int n = p->n_regions, nv = t->n_values;
	/* every op in exactly one region, region_of agrees */
	int *seen = calloc((size_t)t->n_nodes + 1, sizeof(int));
	for (int r = 0; r < n; r++) {
		const fz_region *R = p->regions[r];
		ck_assert_int_eq(R->id, r);
		ck_assert_int_gt(R->n_nodes, 0);
		for (int j = 0; j < R->n_nodes; j++) {
			seen[R->nodes[j]->id]++;
			ck_assert_int_eq(p->region_of[R->nodes[j]->id], r);
			if (j)
				ck_assert_int_lt(R->nodes[j - 1]->id, R->nodes[j]->id);
		}
		if (R->kind == FZ_REGION_LIBRARY)
			ck_assert_int_eq(R->n_nodes, 1);
		/* a bucket (ir/comm.c) holds several all-gathers, its wait
		 * several waits */
		for (int j = 0; R->kind == FZ_REGION_COLLECTIVE && j < R->n_nodes; j++)
			ck_assert_msg(R->n_nodes == 1 || R->nodes[j]->op == FZ_OP_ALL_GATHER,
				      "%s: collective region %d holds %s (%d ops)",
				      t->name, r, fz_ops[R->nodes[j]->op].name,
				      R->n_nodes);
		for (int j = 0; R->kind == FZ_REGION_WAIT && j < R->n_nodes; j++)
			ck_assert(R->nodes[j]->op == FZ_OP_WAIT);
	}
	for (int i = 0; i < t->n_nodes; i++) /* a dead one in none (dce.c) */
		ck_assert_msg(seen[i] == !(p->dead && p->dead[i]),
			      "node %d is in %d regions", i, seen[i]);
	free(seen);

	/* the order: a permutation, and every input made before it is read */
	int *step = malloc(sizeof(int) * ((size_t)n + 1));
	for (int r = 0; r < n; r++)
		step[r] = -1;
	for (int s = 0; s < n; s++) {
		ck_assert_int_ge(p->order[s], 0);
		ck_assert_int_lt(p->order[s], n);
		ck_assert_int_eq(step[p->order[s]], -1);
		step[p->order[s]] = s;
	}
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		for (int k = 0; p->region_of[i] >= 0 && k < nd->n_in; k++)
			if (operand(p, nd, k)->def)
				ck_assert_int_le(step[p->region_of[operand(p, nd, k)->def->id]],
						 step[p->region_of[i]]);
	}

	/* brute-force replay: a buffer (memplan's p->buffer) is live from the
	 * step of the first value in it to the last step anything in it (or a
	 * view of it) is read; forever if a program output lives in it */
	int *first = malloc(sizeof(int) * ((size_t)nv + 1));
	int *last = malloc(sizeof(int) * ((size_t)nv + 1));
	int64_t *size = calloc((size_t)nv + 1, sizeof(int64_t));
	for (int v = 0; v < nv; v++)
		first[v] = last[v] = -1;
	for (int v = 0; v < nv; v++) {
		const fz_value *x = t->values[v];
		if (!x->def || p->offset[v] < 0 || p->view_of[v])
			continue;
		int b = p->buffer[v], s = step[p->region_of[x->def->id]];
		ck_assert_int_eq(p->bytes[v], p->bytes[b]);
		size[b] = p->bytes[b];
		if (first[b] < 0 || s < first[b])
			first[b] = s;
		if (s > last[b])
			last[b] = s;
	}
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		for (int k = 0; k < nd->n_in; k++) {
			const fz_value *x = operand(p, nd, k);
			int b = p->buffer[x->id];
			if (x->def && first[b] >= 0 && p->region_of[i] >= 0 &&
			    step[p->region_of[i]] > last[b])
				last[b] = step[p->region_of[i]];
		}
	}
	/* a collective reads its operand on its own stream until its wait */
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *w = t->nodes[i];
		const fz_node *c = w->op == FZ_OP_WAIT ? w->in[0]->def : NULL;
		if (!c || p->region_of[i] < 0)
			continue;
		for (int k = 0; k < c->n_in; k++) {
			int b = p->buffer[c->in[k]->id];
			if (c->in[k]->def && first[b] >= 0 &&
			    step[p->region_of[i]] > last[b])
				last[b] = step[p->region_of[i]];
		}
	}
	for (int i = 0; i < t->n_outputs; i++) {
		int b = p->buffer[t->outputs[i]->id];
		if (first[b] >= 0)
			last[b] = n;
	}
	/* each step's live buffers, then no two of them overlapping */
	int64_t peak = 0;
	int *live_at = malloc(sizeof(int) * ((size_t)nv + 1));
	for (int s = 0; s < n; s++) {
		int64_t live = 0;
		int nl = 0;
		for (int b = 0; b < nv; b++) {
			if (first[b] < 0 || first[b] > s || last[b] < s)
				continue;
			live += size[b];
			ck_assert_int_le(p->offset[b] + size[b], p->arena_bytes);
			/* a page or more starts on a page (4K aliasing) */
			if (round256(size[b]) >= 4096)
				ck_assert_int_eq(p->offset[b] % 4096, 0);
			if (size[b])
				live_at[nl++] = b;
		}
		for (int i = 0; i < nl; i++)
			for (int j = i + 1; j < nl; j++) {
				int b = live_at[i], c = live_at[j];
				int64_t b0 = p->offset[b], b1 = b0 + round256(size[b]);
				int64_t c0 = p->offset[c], c1 = c0 + round256(size[c]);
				ck_assert_msg(b1 <= c0 || c1 <= b0,
					      "step %d: buffers %d [%lld,%lld) and %d [%lld,%lld) "
					      "overlap", s, b, (long long)b0, (long long)b1, c,
					      (long long)c0, (long long)c1);
			}
		if (live > peak)
			peak = live;
	}
	free(live_at);
	free(first);
	free(last);
	free(size);
	free(step);
	check_in_place(p);

	ck_assert_int_eq(peak, p->peak_bytes);
	/* communication scheduling (ir/comm.c) trades bytes for overlap under
	 * its cap; without collectives the plan never loses to the trace */
	if (!fz_program_count(p, FZ_REGION_COLLECTIVE))
		ck_assert_int_le(p->peak_bytes, p->peak_bytes_trace_order);
	ck_assert_int_ge(p->arena_bytes, p->peak_bytes);
	ck_assert_int_le(p->peak_lower_bound, p->peak_bytes);
	ck_assert_int_eq(fz_order_peak(p, p->order), p->peak_bytes);
	ck_assert_int_eq(fz_order_peak(p, p->trace_order), p->peak_bytes_trace_order);
	return peak;
}

/* ---- partition ----------------------------------------------------------- */

/* fz_sort_u64, which the passes number and reorder with: sorted, and a
 * permutation of its input, for every size across the switch to insertion
 * sort and for keys that repeat (where quicksort cannot split). */
START_TEST(sort_u64_sorts)
{
	uint64_t x = 88172645463325252ull;
	for (int n = 0; n <= 700; n += n < 64 ? 1 : 37) {
		for (int dup = 0; dup < 3; dup++) {
			uint64_t *a = malloc(sizeof *a * (size_t)(n + 1));
			uint64_t sum = 0, xor = 0;
			for (int i = 0; i < n; i++) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				a[i] = dup == 0 ? x : dup == 1 ? x % 5 : 42;
				sum += a[i];
				xor ^= a[i] * 0x9e3779b97f4a7c15ull;
			}
			fz_sort_u64(a, n);
			uint64_t sum2 = 0, xor2 = 0;
			for (int i = 0; i < n; i++) {
				if (i)
					ck_assert_msg(a[i - 1] <= a[i], "n %d: %d out of order", n, i);
				sum2 += a[i];
				xor2 ^= a[i] * 0x9e3779b97f4a7c15ull;
			}
			ck_assert(sum == sum2 && xor == xor2);
			free(a);
		}
	}
}
END_TEST

START_TEST(layer_norm_is_one_kernel)
{
	fz_module *m = parse(
		"trace ln(x: bf16[16, 128, 1600], w: bf16[1600], b: bf16[1600]) {\n"
		"  y = layer_norm(x, w, b, dims=[2], eps=1e-5)\n"
		"  return y\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(fz_program_kernels(p), 1);
	ck_assert_int_eq(p->n_regions, 1);
	ck_assert_int_eq(p->regions[0]->kind, FZ_REGION_NORMALIZATION);
	ck_assert_int_eq(p->regions[0]->n_in, 3);
	ck_assert_int_eq(p->regions[0]->n_out, 1);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(softmax_rmsnorm_one_kernel)
{
	fz_module *m = parse(
		"trace sm(s: f32[B, 12, T, T]) {\n"
		"  p = softmax(mul(s, 0.125), dim=-1)\n  return p\n}\n"
		"trace rms(x: bf16[B, T, 4096], w: bf16[4096]) {\n"
		"  y = rms_norm(x, w, dims=[2], eps=1e-5)\n  return y\n}\n");
	for (int i = 0; i < 2; i++) {
		fz_program *p = plan(fz_module_trace(m, i));
		ck_assert_int_eq(fz_program_kernels(p), 1);
		ck_assert_int_eq(count_kind(p, FZ_REGION_NORMALIZATION), 1);
		check_plan(p);
		fz_program_free(p);
	}
	fz_module_free(m);
}
END_TEST

START_TEST(reduction_with_epilogue)
{
	/* mean over the last dim: a reduction, not a normalization */
	fz_module *m = parse(
		"trace m(x: f32[64, 256]) {\n"
		"  y = mean(exp(x), dims=[1])\n  return y\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(p->n_regions, 1);
	ck_assert_int_eq(p->regions[0]->kind, FZ_REGION_REDUCTION);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(library_calls_are_alone)
{
	fz_module *m = parse(
		"trace c(x: f32[64, 64], w: f32[64, 64]) {\n"
		"  a = relu(x)\n  b = matmul(a, w)\n  c = relu(b)\n  return c\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(p->n_regions, 3);
	ck_assert_int_eq(count_kind(p, FZ_REGION_LIBRARY), 1);
	ck_assert_int_eq(count_kind(p, FZ_REGION_POINTWISE), 2);
	/* the relu after the matmul overwrites nothing it should not: b dies
	 * there, so c may take b's place */
	const fz_trace *t = p->trace;
	ck_assert_int_eq(p->buffer[named(t, "c")->id], named(t, "b")->id);
	ck_assert_int_eq(p->peak_bytes, 2 * 64 * 64 * 4);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

/* Issue 23: m = r * 2 must not take over x, which y = m - x reads in the
 * same region; y, computed from x, may (and r from s). */
START_TEST(in_place_only_over_what_it_reads)
{
	fz_module *m = parse(
		"trace t(p: f32[17]) {\n"
		"  x = cumsum(p, dim=0)\n  s = cumsum(x, dim=0)\n"
		"  r = add(s, 1.0)\n  m = mul(r, 2.0)\n  y = sub(m, x)\n"
		"  c = cumsum(m, dim=0)\n  return y, r, c\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	const fz_trace *t = p->trace;
	int x = named(t, "x")->id, s = named(t, "s")->id;
	ck_assert_int_ne(p->buffer[named(t, "m")->id], x);
	ck_assert_int_eq(p->buffer[named(t, "y")->id], x);
	ck_assert_int_eq(p->buffer[named(t, "r")->id], s);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(no_cycle_through_a_library_call)
{
	/* a and d could share a kernel by shape, but d needs the matmul of a:
	 * one kernel would wait on itself */
	fz_module *m = parse(
		"trace c(x: f32[32, 32], w: f32[32, 32]) {\n"
		"  a = exp(x)\n  b = matmul(a, w)\n  d = add(a, b)\n  return d\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(p->n_regions, 3);
	const fz_trace *t = p->trace;
	ck_assert_int_ne(p->region_of[named(t, "a")->def->id],
			 p->region_of[named(t, "d")->def->id]);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(cross_entropy_two_kernels)
{
	fz_module *m = parse(
		"trace ce(logits: f32[B, T, 50257], labels: i64[B, T]) {\n"
		"  loss = cross_entropy(reshape(logits, shape=[-1, 50257]),\n"
		"                       reshape(labels, shape=[-1]))\n"
		"  return loss\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_le(fz_program_kernels(p), 2);
	ck_assert_int_eq(count_kind(p, FZ_REGION_NORMALIZATION), 1);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(embedding_indexing)
{
	fz_module *m = parse(
		"trace e(wte: f32[1000, 64], wpe: f32[128, 64], ids: i64[B, 128],"
		" pos: i64[128]) {\n"
		"  h = add(take(wte, ids, dim=0), take(wpe, pos, dim=0))\n"
		"  return h\n}\n"
		"trace eb(g: f32[B, 64], ids: i64[B]) {\n"
		"  z = full(shape=[1000, 64], value=0, dtype=f32)\n"
		"  d = index_add(z, ids, g, dim=0)\n  e = mul(d, 2.0)\n"
		"  return e\n}\n"
		"trace ec(dy: bf16[8192, 1024], idx: i64[8192]) {\n"
		"  z = full(shape=[32000, 1024], value=0, dtype=f32)\n"
		"  acc = index_add(z, idx, cast(dy, dtype=f32), dim=0)\n"
		"  out = cast(acc, dtype=bf16)\n  return out\n}\n"
		"trace ed(g: f32[64, 8], ids: i64[8]) {\n"
		"  z = full(shape=[64, 100], value=0, dtype=f32)\n"
		"  d = index_add(z, ids, g, dim=1)\n  e = mul(d, 2.0)\n"
		"  return e\n}\n"
		"trace ee(g: f32[8, 3, 5], ids: i64[8]) {\n"
		"  z = full(shape=[64, 3, 5], value=0, dtype=f32)\n"
		"  d = index_add(z, ids, g, dim=0)\n  e = mul(d, 2.0)\n"
		"  return e\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(fz_program_kernels(p), 1);
	ck_assert_int_eq(count_kind(p, FZ_REGION_INDEXING), 1);
	check_plan(p);
	fz_program_free(p);
	/* an elementwise follower of a scatter along dim 0 shares its kernel
	 * (the host gathers by rows: codegen/pointwise.c) */
	p = plan(fz_module_trace(m, 1));
	ck_assert_int_eq(fz_program_kernels(p), 1);
	check_plan(p);
	fz_program_free(p);
	/* an embedding's bf16 backward: one kernel, and the f32 table is no
	 * buffer at all: the peak is the bf16 gradient's bytes */
	p = plan(fz_module_trace(m, 2));
	ck_assert_int_eq(fz_program_kernels(p), 1);
	ck_assert_int_eq(count_kind(p, FZ_REGION_INDEXING), 1);
	ck_assert_int_eq(p->peak_bytes, (int64_t)32000 * 1024 * 2);
	check_plan(p);
	fz_program_free(p);
	/* along another dim, or into rows under 64 elements (15 here), nothing
	 * reads a scatter's result in the kernel that scatters */
	for (int i = 3; i <= 4; i++) {
		p = plan(fz_module_trace(m, i));
		ck_assert_int_eq(fz_program_kernels(p), 2);
		check_plan(p);
		fz_program_free(p);
	}
	fz_module_free(m);
}
END_TEST

/* ---- bookend ---------------------------------------------------------------- */

START_TEST(rotary_v_is_a_view)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/tests/traces/rotary.trace", FZ_SOURCE_DIR);
	fz_module *m = load_file(path);
	fz_program *p = plan(fz_module_trace(m, 0));
	const fz_trace *t = p->trace;
	ck_assert_int_le(fz_program_kernels(p), 2);
	ck_assert_int_eq(count_kind(p, FZ_REGION_LIBRARY), 1);
	const fz_value *v = named(t, "v"), *qkv = named(t, "qkv");
	ck_assert_ptr_nonnull(p->view_of[v->id]);
	ck_assert_ptr_eq(p->view_of[v->id]->base, qkv);
	/* [B, T, 3, H, D] = [2, 128, 3, 8, 64], v = [:, :, 2] moved to [B, H, T, D] */
	const fz_layout *l = &p->view_of[v->id]->lay;
	ck_assert_int_eq(l->rank, 4);
	ck_assert_int_eq(l->strides[0], 128 * 1536);
	ck_assert_int_eq(l->strides[1], 64);
	ck_assert_int_eq(l->strides[2], 1536);
	ck_assert_int_eq(l->strides[3], 1);
	ck_assert_int_eq(l->offset, 2 * 512);
	ck_assert_int_eq(p->regions[p->region_of[v->def->id]]->kind, FZ_REGION_VIEW);
	/* no copy: v's storage is qkv's */
	ck_assert_int_eq(p->buffer[v->id], qkv->id);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(layer_norm_stays_vectorized)
{
	fz_module *m = parse(
		"trace ln(x: bf16[16, 128, 1600], w: bf16[1600], b: bf16[1600]) {\n"
		"  y = layer_norm(x, w, b, dims=[2], eps=1e-5)\n  return y\n}\n"
		"trace odd(x: bf16[16, 128, 1601], w: bf16[1601]) {\n"
		"  y = rms_norm(x, w, dims=[2], eps=1e-5)\n  return y\n}\n"
		"trace sym(x: bf16[16, C]) {\n  y = exp(x)\n  return y\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(p->vec_bytes[0], 16);
	ck_assert_int_eq(p->vec_width[0], 8);
	fz_program_free(p);
	p = plan(fz_module_trace(m, 1)); /* an odd row cannot be */
	ck_assert_int_eq(p->vec_width[0], 1);
	fz_program_free(p);
	/* a symbolic innermost extent earns nothing it lacks for some size */
	p = plan(fz_module_trace(m, 2));
	ck_assert_int_eq(p->vec_width[0], 1);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(views_at_edges_copies_inside)
{
	fz_module *m = parse(
		/* a reshape of an input before a reduction: a view */
		"trace a(x: f32[8, 16, 32]) {\n"
		"  y = sum(reshape(x, shape=[128, 32]), dims=[1])\n  return y\n}\n"
		/* permute then merge dims between two matmuls: needs a copy */
		"trace b(x: f32[2, 4, 8, 16], w: f32[64, 16]) {\n"
		"  y = matmul(x, permute(w, dims=[1, 0]))\n"
		"  z = reshape(permute(y, dims=[0, 2, 1, 3]), shape=[2, 8, 256])\n"
		"  return z\n}\n"
		/* only meta ops on an input: nothing launches */
		"trace c(x: f32[4, 6]) {\n"
		"  y = unsqueeze(permute(x, dims=[1, 0]), dim=0)\n  return y\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(fz_program_kernels(p), 1);
	ck_assert_int_eq(count_kind(p, FZ_REGION_VIEW), 1);
	check_plan(p);
	fz_program_free(p);
	p = plan(fz_module_trace(m, 1));
	ck_assert_int_eq(count_kind(p, FZ_REGION_LIBRARY), 1);
	ck_assert_int_eq(fz_program_kernels(p), 1); /* the reshape copy */
	const fz_value *z = named(p->trace, "z");
	ck_assert_ptr_null(p->view_of[z->id]);
	/* the transposed weight reaches the library call as a view */
	check_plan(p);
	fz_program_free(p);
	p = plan(fz_module_trace(m, 2));
	ck_assert_int_eq(fz_program_kernels(p), 0);
	ck_assert_int_eq(p->peak_bytes, 0);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(view_eval_rebinds)
{
	fz_module *m = parse(
		"trace a(x: f32[B, 16]) {\n"
		"  y = exp(slice(x, start=[0, 4], end=[B, 12], step=[1, 2]))\n"
		"  return y\n}\n");
	int64_t syms[FZ_MAX_SYMS];
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		syms[i] = -1;
	syms[0] = 3;
	fz_program *p = plan_sized(fz_module_trace(m, 0), syms);
	const fz_trace *t = p->trace;
	const fz_node *sl = NULL;
	for (int i = 0; i < t->n_nodes; i++)
		if (t->nodes[i]->op == FZ_OP_SLICE)
			sl = t->nodes[i];
	ck_assert_ptr_nonnull(sl);
	const fz_view *w = p->view_of[sl->out[0]->id];
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(w->lay.shape[0], 3);
	ck_assert_int_eq(w->lay.strides[1], 2);
	ck_assert_int_eq(w->lay.offset, 4);
	fz_layout l;
	syms[0] = 7;
	ck_assert_int_eq(fz_view_eval(p, sl->out[0], syms, &l), FZ_OK);
	ck_assert_int_eq(l.shape[0], 7);
	ck_assert_int_eq(l.shape[1], 4);
	ck_assert_int_eq(l.strides[0], 16);
	/* a step-2 slice: one element at a time */
	ck_assert_int_eq(p->vec_width[p->region_of[named(t, "y")->def->id]], 1);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

/* ---- schedule and memplan -------------------------------------------------- */

static void seed004(const char *name, int64_t trace_peak)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/tests/traces/%s", FZ_SOURCE_DIR, name);
	fz_module *m = load_file(path);
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(p->peak_bytes, 786432);
	ck_assert_int_eq(p->arena_bytes, 786432);
	ck_assert_int_eq(count_kind(p, FZ_REGION_LIBRARY), 20);
	ck_assert_int_le(fz_program_kernels(p), 20);
	if (trace_peak)
		ck_assert_int_eq(p->peak_bytes_trace_order, trace_peak);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}

START_TEST(seed004_efficient) { seed004("seed004_chain_efficient.trace", 786432); }
END_TEST

START_TEST(seed004_stages) { seed004("seed004_chain_stages.trace", 2883584); }
END_TEST

/* ---- the corpus -------------------------------------------------------------- */

/* ---- attention ----------------------------------------------------------- */

static int64_t value_bytes(const fz_value *v, const int64_t *syms)
{
	return fz_type_numel_at(&v->type, syms) * (int64_t)fz_dtype_size(v->type.dtype);
}

/* The attention region that holds op n, described. */
static fz_attn attn_of(const fz_program *p, const fz_node *n)
{
	fz_attn A;
	char why[128] = "";
	ck_assert_int_ge(p->region_of[n->id], 0);
	const fz_region *R = p->regions[p->region_of[n->id]];
	ck_assert_int_eq(R->kind, FZ_REGION_ATTENTION);
	ck_assert_msg(fz_attn_describe(p->trace, R, &A, why, sizeof why), "%s", why);
	return A;
}

static const fz_value *attn_in(const fz_program *p, const fz_node *n, int slot)
{
	return slot < 0 ? NULL : p->regions[p->region_of[n->id]]->in[slot];
}

/* GQA as Hugging Face writes it before SDPA (repeat_kv: unsqueeze,
 * broadcast_in_dim, reshape; the backward's reshape and sum over each
 * group), tests/traces/attention_gqa_repeat.trace: the attention ops read
 * k and v where they lie and the repeats are dead, so at B=2, T=1024 the
 * plan holds the results and nothing else (5570560 bytes before the fold,
 * 2686976 after); attention_dkv's region writes the group sums. Where the
 * repeated dk is read as well, attention_dkv keeps reading the copy; kv
 * heads tiled (head h reads kv head h mod Hkv) are not a GQA read. */
START_TEST(attention_gqa_repeat_folded)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/tests/traces/attention_gqa_repeat.trace",
		 FZ_SOURCE_DIR);
	fz_module *m = load_file(path);
	for (int ti = 0; ti < fz_module_count(m); ti++) {
		const fz_trace *t = fz_module_trace(m, ti);
		int64_t syms[FZ_MAX_SYMS];
		for (int s = 0; s < t->n_syms; s++)
			syms[s] = !strcmp(fz_trace_symbol(t, s), "B") ? 2 : 1024;
		fz_program *p = plan_sized(t, syms);
		check_plan(p);
		const fz_value *k = named(t, "k"), *v = named(t, "v");
		const fz_value *kr = named(t, "kr"), *vr = named(t, "vr");
		const fz_node *fwd = named(t, "o")->def, *dq = named(t, "dq")->def;
		const fz_node *dkv = named(t, "dkr")->def;
		/* forward and dq read k and v unrepeated in every trace */
		for (int j = 0; j < 2; j++) {
			const fz_node *n = j ? dq : fwd;
			fz_attn A = attn_of(p, n);
			ck_assert_ptr_eq(attn_in(p, n, A.in_k), k);
			ck_assert_ptr_eq(attn_in(p, n, A.in_v), v);
			ck_assert_int_eq(A.hkv.c, k->type.dims[1].c);
			ck_assert_int_eq(A.group, A.hq.c / A.hkv.c);
		}
		fz_attn A = attn_of(p, dkv);
		bool kept = !strcmp(t->name, "gqa_repeat_kept");
		if (!kept) {
			/* no repeat planned; dk and dv are the group sums */
			ck_assert(p->dead && p->dead[kr->def->id] && p->dead[vr->def->id]);
			ck_assert(p->dead[kr->def->in[0]->def->id]);
			ck_assert_ptr_eq(attn_in(p, dkv, A.in_k), k);
			ck_assert_ptr_eq(attn_in(p, dkv, A.in_v), v);
			const fz_region *R = p->regions[p->region_of[dkv->id]];
			const fz_value *dk = named(t, "dk"), *dv = named(t, "dv");
			ck_assert_ptr_eq(R->out[A.out_dk], dk->def->op == FZ_OP_SQUEEZE ?
					 dk->def->in[0] : dk);
			ck_assert_ptr_eq(R->out[A.out_dv], dv->def->op == FZ_OP_SQUEEZE ?
					 dv->def->in[0] : dv);
			int64_t results = value_bytes(named(t, "o"), syms) +
					  value_bytes(named(t, "lse"), syms) +
					  value_bytes(named(t, "dq"), syms) +
					  value_bytes(dk, syms) + value_bytes(dv, syms);
			ck_assert_int_eq(p->peak_bytes, results);
		} else {
			/* the repeated dk is returned: attention_dkv reads the copy */
			ck_assert(!p->dead || !p->dead[kr->def->id]);
			ck_assert_ptr_eq(attn_in(p, dkv, A.in_k), kr);
			ck_assert_int_eq(A.group, 1);
			fz_attn B = attn_of(p, named(t, "ot")->def);
			ck_assert_ptr_eq(attn_in(p, named(t, "ot")->def, B.in_k), named(t, "kt"));
			ck_assert_int_eq(B.group, 1);
		}
		fz_program_free(p);
	}
	fz_module_free(m);
}
END_TEST

START_TEST(corpus_plans)
{
	char dir[1024];
	snprintf(dir, sizeof dir, "%s/tests/traces", FZ_SOURCE_DIR);
	DIR *d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	struct dirent *e;
	int files = 0;
	int64_t syms[FZ_MAX_SYMS];
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		syms[i] = 4 + i;
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		if (len < 7 || strcmp(e->d_name + len - 6, ".trace"))
			continue;
		char path[2048];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		fz_module *m = load_file(path);
		for (int i = 0; i < fz_module_count(m); i++) {
			for (int sized = 0; sized < 2; sized++) {
				fz_program *p = plan_sized(fz_module_trace(m, i),
							   sized ? syms : NULL);
				check_plan(p);
				fz_program_free(p);
				check_horizontal(fz_module_trace(m, i), sized ? syms : NULL);
			}
		}
		fz_module_free(m);
		files++;
	}
	closedir(d);
	ck_assert_int_gt(files, 0);
}
END_TEST

/* ---- random DAGs ------------------------------------------------------------- */

/* Shapes: 0 = [8, 8], 1 = [8, 1], 2 = [1, 8]. */
typedef struct rop {
	int kind, a, b, shape;
} rop;

enum { R_RELU, R_EXP, R_ADD, R_MUL, R_MATMUL, R_SUM, R_PERMUTE, R_SOFTMAX,
       R_KINDS };

static uint64_t rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* n params (ids 0..np-1, shape 0) then ops; each op reads earlier ids */
static int random_dag(uint64_t *s, rop *ops, int np, int n)
{
	for (int i = 0; i < np; i++)
		ops[i] = (rop){-1, -1, -1, 0};
	for (int i = np; i < np + n; i++) {
		for (;;) {
			int k = (int)(rng(s) % R_KINDS);
			int a = (int)(rng(s) % (uint64_t)i), b = (int)(rng(s) % (uint64_t)i);
			/* favour recent values, so chains form */
			if (rng(s) % 2)
				a = i - 1 - (int)(rng(s) % (uint64_t)(i < 4 ? i : 4));
			int sa = ops[a].shape, sb = ops[b].shape, sh;
			switch (k) {
			case R_RELU: case R_EXP: sh = sa; break;
			case R_ADD: case R_MUL: sh = sa == sb ? sa : 0; break;
			case R_MATMUL: if (sa || sb) continue; sh = 0; break;
			case R_SUM: if (sa) continue; sh = 1; break;
			case R_PERMUTE: sh = sa == 0 ? 0 : 3 - sa; break;
			default: if (sa) continue; sh = 0; break;
			}
			ops[i] = (rop){k, a, b, sh};
			break;
		}
	}
	return np + n;
}

/* The DAG as trace text, statements in a random topological order and
 * values named by `salt`. */
static char *dag_text(const rop *ops, int np, int n, uint64_t order_seed,
		      int salt)
{
	size_t cap = 65536;
	char *buf = malloc(cap);
	size_t len = 0;
	len += (size_t)snprintf(buf + len, cap - len, "trace r(");
	for (int i = 0; i < np; i++)
		len += (size_t)snprintf(buf + len, cap - len, "%sp%d: f32[8, 8]",
					i ? ", " : "", i);
	len += (size_t)snprintf(buf + len, cap - len, ") {\n");
	bool *done = calloc((size_t)n + 1, 1), *used = calloc((size_t)n + 1, 1);
	for (int i = 0; i < np; i++)
		done[i] = true;
	uint64_t s = order_seed;
	for (int emitted = np; emitted < n;) {
		int ready[512], nr = 0;
		for (int i = np; i < n; i++)
			if (!done[i] && done[ops[i].a] &&
			    (ops[i].kind != R_ADD && ops[i].kind != R_MUL &&
			     ops[i].kind != R_MATMUL ? true : done[ops[i].b]))
				ready[nr++] = i;
		int i = ready[rng(&s) % (uint64_t)nr];
		char a[32], b[32];
		if (ops[i].a < np)
			snprintf(a, sizeof a, "p%d", ops[i].a);
		else
			snprintf(a, sizeof a, "v%d_%d", salt, ops[i].a);
		if (ops[i].b < np)
			snprintf(b, sizeof b, "p%d", ops[i].b);
		else
			snprintf(b, sizeof b, "v%d_%d", salt, ops[i].b);
		static const char *const fmt[R_KINDS] = {
			"relu(%s)", "exp(%s)", "add(%s, %s)", "mul(%s, %s)",
			"matmul(%s, %s)", "sum(%s, dims=[1], keepdim=true)",
			"permute(%s, dims=[1, 0])", "softmax(%s, dim=1)",
		};
		char expr[128];
		snprintf(expr, sizeof expr, fmt[ops[i].kind], a, b);
		len += (size_t)snprintf(buf + len, cap - len, "  v%d_%d = %s\n", salt, i,
					expr);
		used[ops[i].a] = true;
		if (ops[i].kind == R_ADD || ops[i].kind == R_MUL || ops[i].kind == R_MATMUL)
			used[ops[i].b] = true;
		done[i] = true;
		emitted++;
	}
	len += (size_t)snprintf(buf + len, cap - len, "  return ");
	int k = 0;
	for (int i = np; i < n; i++)
		if (!used[i] || i == n - 1)
			len += (size_t)snprintf(buf + len, cap - len, "%sv%d_%d",
						k++ ? ", " : "", salt, i);
	snprintf(buf + len, cap - len, "\n}\n");
	free(done);
	free(used);
	return buf;
}

/* The regions as text that names no value and no position: per region its
 * kind and the sorted op names, regions listed in id order. */
static char *region_signature(const fz_program *p)
{
	fz_buf b = {0};
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = p->regions[r];
		const char *names[256];
		int n = R->n_nodes < 256 ? R->n_nodes : 256;
		for (int j = 0; j < n; j++)
			names[j] = fz_ops[R->nodes[j]->op].name;
		for (int j = 1; j < n; j++)
			for (int i = j; i > 0 && strcmp(names[i - 1], names[i]) > 0; i--) {
				const char *tmp = names[i];
				names[i] = names[i - 1];
				names[i - 1] = tmp;
			}
		fz_buf_printf(&b, "%s:", fz_region_kind_names[R->kind]);
		for (int j = 0; j < n; j++)
			fz_buf_printf(&b, " %s", names[j]);
		fz_buf_puts(&b, "\n");
	}
	return fz_buf_take(&b);
}

/* The smallest peak over every topological order of the regions. */
static int64_t best_peak(const fz_program *p, int *order, int k, bool *used)
{
	int n = p->n_regions;
	if (k == n)
		return fz_order_peak(p, order);
	int64_t best = -1;
	for (int r = 0; r < n; r++) {
		if (used[r])
			continue;
		bool ready = true;
		const fz_region *R = p->regions[r];
		for (int i = 0; i < R->n_in && ready; i++)
			if (R->in[i]->def && !used[p->region_of[R->in[i]->def->id]])
				ready = false;
		if (!ready)
			continue;
		used[r] = true;
		order[k] = r;
		int64_t pk = best_peak(p, order, k + 1, used);
		used[r] = false;
		if (pk >= 0 && (best < 0 || pk < best))
			best = pk;
	}
	return best;
}

START_TEST(random_dags)
{
	uint64_t s = 0x5eed0000u + (uint64_t)_i;
	rop ops[128];
	int np = 1 + (int)(rng(&s) % 3);
	int n = random_dag(&s, ops, np, 2 + (int)(rng(&s) % 40));
	char *t1 = dag_text(ops, np, n, rng(&s), 1);
	char *t2 = dag_text(ops, np, n, rng(&s), 2);
	fz_module *m1 = parse(t1), *m2 = parse(t2);
	fz_program *p1 = plan(fz_module_trace(m1, 0));
	fz_program *p2 = plan(fz_module_trace(m2, 0));
	check_plan(p1);
	check_plan(p2);
	/* the same graph written in another order with other names */
	char *g1 = region_signature(p1), *g2 = region_signature(p2);
	if (strcmp(g1, g2))
		fprintf(stderr, "regions differ:\n%s\n---\n%s\n---\n%s\n%s", g1, g2,
			t1, t2);
	ck_assert_msg(!strcmp(g1, g2), "regions differ (printed on stderr)");
	ck_assert_int_eq(p1->peak_bytes, p2->peak_bytes);
	check_horizontal(fz_module_trace(m1, 0), NULL);
	/* small programs: nothing beats the planned peak when it claims to be
	 * optimal, and it is never worse than the best order by much when not */
	if (p1->n_regions <= 9) {
		int order[16];
		bool used[16] = {0};
		int64_t best = best_peak(p1, order, 0, used);
		ck_assert_int_ge(p1->peak_bytes, best);
		if (p1->peak_proven_optimal)
			ck_assert_int_eq(p1->peak_bytes, best);
	}
	free(g1);
	free(g2);
	fz_program_free(p1);
	fz_program_free(p2);
	fz_module_free(m1);
	fz_module_free(m2);
	free(t1);
	free(t2);
}
END_TEST

/* ---- horizontal fusion --------------------------------------------------- */

static int region_of_value(const fz_program *p, const char *name)
{
	return p->region_of[named(p->trace, name)->def->id];
}

START_TEST(horizontal_quantize_columns)
{
	/* col_min and col_max reduce the same w over the same dim: one
	 * reduction kernel, two results per column */
	char path[1024];
	snprintf(path, sizeof path, "%s/tests/traces/quantize.trace", FZ_SOURCE_DIR);
	fz_module *m = load_file(path);
	const fz_trace *t = fz_module_trace(m, 1);
	fz_program *off = plan_flat(t, NULL);
	ck_assert_int_eq(fz_program_kernels(off), 3);
	fz_program *p = plan(t);
	ck_assert_int_eq(fz_program_kernels(p), 2);
	ck_assert_int_eq(p->horizontal_merged, 1);
	int r = region_of_value(p, "col_min");
	ck_assert_int_eq(r, region_of_value(p, "col_max"));
	ck_assert_int_eq(p->regions[r]->kind, FZ_REGION_REDUCTION);
	ck_assert_int_eq(p->regions[r]->n_in, 1);  /* w, read once */
	ck_assert_int_eq(p->regions[r]->n_out, 2);
	ck_assert_int_ne(r, region_of_value(p, "q"));
	ck_assert_int_eq(p->peak_bytes, off->peak_bytes);
	check_plan(p);
	fz_program_free(p);
	fz_program_free(off);
	fz_module_free(m);
}
END_TEST

START_TEST(horizontal_pointwise_pair)
{
	/* rotary: q and k are rotated over one shape with the same cos and
	 * sin; v stays a view of the linear's output */
	char path[1024];
	snprintf(path, sizeof path, "%s/tests/traces/rotary.trace", FZ_SOURCE_DIR);
	fz_module *m = load_file(path);
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(fz_program_kernels(p), 1);
	int r = region_of_value(p, "q_rot");
	ck_assert_int_eq(r, region_of_value(p, "k_rot"));
	ck_assert_int_eq(p->regions[r]->kind, FZ_REGION_POINTWISE);
	ck_assert_ptr_nonnull(p->view_of[named(p->trace, "v")->id]);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
	/* two maps of one input, both returned */
	m = parse("trace t(x: f32[64, 64]) {\n"
		  "  a = exp(x)\n  b = sin(x)\n  return a, b\n}\n");
	p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(p->n_regions, 1);
	ck_assert_int_eq(p->regions[0]->n_out, 2);
	ck_assert_int_eq(p->peak_bytes, 2 * 64 * 64 * 4);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
	/* DiT's adaLN: the gated residual y = x + gate * attn_out walks the
	 * rows of the layer norm of the same x: the normalization kernel's
	 * last pass over the row writes it too */
	snprintf(path, sizeof path, "%s/tests/traces/adaln.trace", FZ_SOURCE_DIR);
	m = load_file(path);
	p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(fz_program_kernels(p), 2);
	r = region_of_value(p, "h");
	ck_assert_int_eq(r, region_of_value(p, "y"));
	ck_assert_int_eq(p->regions[r]->kind, FZ_REGION_NORMALIZATION);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
	/* different element counts, or rows of other extents than a map's
	 * output: apart */
	m = parse("trace t(x: f32[64, 64], y: f32[32, 64]) {\n"
		  "  a = exp(x)\n  b = exp(y)\n"
		  "  c = sum(reshape(x, shape=[4096]), dims=[0])\n"
		  "  return a, b, c\n}\n");
	p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(fz_program_kernels(p), 3);
	ck_assert_int_eq(p->horizontal_merged, 0);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(horizontal_refused_when_peak_rises)
{
	/* Two paths from one input: each makes a big tensor that a matmul
	 * shrinks to a column. Run apart, one big tensor is live at a time;
	 * run as one kernel, both are: the merge is refused. */
	fz_module *m = parse(
		"trace t(x: f32[256, 256], y0: f32[256, 256], y1: f32[256, 256],\n"
		"        w0: f32[256, 1], w1: f32[256, 1]) {\n"
		"  p0 = relu(add(x, y0))\n  s0 = matmul(p0, w0)\n"
		"  p1 = relu(add(x, y1))\n  s1 = matmul(p1, w1)\n"
		"  z = add(s0, s1)\n  return z\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	fz_program *off = plan_flat(fz_module_trace(m, 0), NULL);
	ck_assert_int_ne(region_of_value(p, "p0"), region_of_value(p, "p1"));
	ck_assert_int_ge(p->horizontal_refused_peak, 1);
	ck_assert_int_eq(p->horizontal_merged, 0);
	ck_assert_int_eq(p->peak_bytes, off->peak_bytes);
	ck_assert_int_eq(p->peak_bytes, 262144 + 2 * 1024);
	check_plan(p);
	fz_program_free(p);
	fz_program_free(off);
	fz_module_free(m);
}
END_TEST

START_TEST(horizontal_seed004_keeps_its_peak)
{
	/* batching the ten relus is what raised the reported peak: what is
	 * merged here must leave it at three tensors, in both written orders */
	const char *files[2] = {"seed004_chain_efficient.trace",
				"seed004_chain_stages.trace"};
	for (int f = 0; f < 2; f++) {
		char path[1024];
		snprintf(path, sizeof path, "%s/tests/traces/%s", FZ_SOURCE_DIR, files[f]);
		fz_module *m = load_file(path);
		fz_program *p = plan(fz_module_trace(m, 0));
		ck_assert_int_eq(p->peak_bytes, 786432);
		ck_assert_int_ge(p->horizontal_refused_peak, 1);
		ck_assert_int_eq(count_kind(p, FZ_REGION_LIBRARY), 20);
		ck_assert_int_le(fz_program_kernels(p), 20);
		/* no kernel holds more than two of the twenty relus */
		for (int r = 0; r < p->n_regions; r++)
			if (p->regions[r]->kind == FZ_REGION_POINTWISE)
				ck_assert_int_le(p->regions[r]->n_out, 2);
		check_plan(p);
		fz_program_free(p);
		fz_module_free(m);
	}
}
END_TEST

START_TEST(horizontal_refused_on_a_path)
{
	/* a and d share x and a shape, but d needs the matmul of a */
	fz_module *m = parse(
		"trace c(x: f32[32, 32], w: f32[32, 32]) {\n"
		"  a = exp(x)\n  b = matmul(a, w)\n  d = add(tanh(b), x)\n"
		"  return d\n}\n");
	fz_program *p = plan(fz_module_trace(m, 0));
	ck_assert_int_eq(fz_program_kernels(p), 2);
	ck_assert_int_ge(p->horizontal_refused_path, 1);
	ck_assert_int_eq(p->horizontal_merged, 0);
	check_plan(p);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(horizontal_blind_to_names_and_order)
{
	fz_module *m = parse(
		"trace a(w: f32[688, 256], v: f32[64, 256]) {\n"
		"  absmax = amax(abs(w), dims=[1], keepdim=true)\n"
		"  q = cast(div(w, absmax), dtype=i8)\n"
		"  lo = amin(w, dims=[0])\n  hi = amax(w, dims=[0])\n"
		"  e = exp(v)\n  s = sin(v)\n"
		"  return q, lo, hi, e, s\n}\n"
		"trace b(w: f32[688, 256], v: f32[64, 256]) {\n"
		"  S = sin(v)\n  H = amax(w, dims=[0])\n  E = exp(v)\n"
		"  L = amin(w, dims=[0])\n"
		"  A = amax(abs(w), dims=[1], keepdim=true)\n"
		"  Q = cast(div(w, A), dtype=i8)\n"
		"  return Q, L, H, E, S\n}\n");
	fz_program *p1 = plan(fz_module_trace(m, 0)), *p2 = plan(fz_module_trace(m, 1));
	ck_assert_int_eq(p1->horizontal_merged, 2);
	char *g1 = region_signature(p1), *g2 = region_signature(p2);
	ck_assert_str_eq(g1, g2);
	ck_assert_int_eq(p1->peak_bytes, p2->peak_bytes);
	free(g1);
	free(g2);
	fz_program_free(p1);
	fz_program_free(p2);
	fz_module_free(m);
}
END_TEST

START_TEST(dump_after_each_pass)
{
	fz_module *m = parse(
		"trace c(x: f32[64, 64], w: f32[64, 64]) {\n"
		"  a = relu(x)\n  b = matmul(a, w)\n  c = relu(b)\n  return c\n}\n");
	for (int pass = 0; pass < FZ_PASS_COUNT; pass++) {
		fz_plan_options o;
		fz_plan_defaults(&o);
		o.dump_after = pass;
		fz_program *p = NULL;
		ck_assert_int_eq(fz_plan(fz_module_trace(m, 0), &o, &p, NULL), FZ_OK);
		ck_assert_ptr_nonnull(p->dump);
		ck_assert_ptr_nonnull(strstr(p->dump, fz_pass_names[pass]));
		ck_assert_ptr_nonnull(strstr(p->dump, "matmul"));
		fz_pass back;
		ck_assert(fz_pass_from_name(fz_pass_names[pass], &back));
		ck_assert_int_eq(back, pass);
		fz_program_free(p);
	}
	fz_pass x;
	ck_assert(!fz_pass_from_name("codegen", &x));
	fz_module_free(m);
}
END_TEST

/* ---- scaling: counted work per op stays flat as the trace grows ---------- */

/*
 * A checkpointed training step of a small Llama (hidden 64, 4 heads of 16,
 * MLP 128, vocabulary 100, bf16, batch 1, sequence 16), written here so
 * that the test needs nothing but itself: the forward keeps only each
 * layer's input; the backward, layer by layer from the last, recomputes
 * the layer from its saved input and takes the gradient through it
 * (SwiGLU, rms_norm, attention with softmax, rotary, the projections), with
 * every weight's gradient returned. The loss gradient is a stand-in
 * (softmax(logits) - 0.01). What matters for planning is the shape a real
 * checkpointed step has: edges from each forward layer to its
 * recomputation far later, rotary tables and a mask read by every layer,
 * a gradient chain through all of them.
 */
static void ckpt_layer(fz_buf *b, const char *P, const char *X, int i)
{
	const char *split = "shape=[1, 16, 4, 16]", *perm = "dims=[0, 2, 1, 3]";
	const char *lo = "start=[0, 0, 0, 0], end=[1, 4, 16, 8], step=[1, 1, 1, 1]";
	const char *hi = "start=[0, 0, 0, 8], end=[1, 4, 16, 16], step=[1, 1, 1, 1]";
	fz_buf_printf(b, "  %s_n1 = rms_norm(%s, l%d_attn_norm, dims=[2], eps=1e-5)\n",
		      P, X, i);
	for (const char *t = "qkv"; *t; t++)
		fz_buf_printf(b, "  %s_%c = permute(reshape(linear(%s_n1, l%d_w%c), %s), %s)\n",
			      P, *t, P, i, *t, split, perm);
	for (const char *t = "qk"; *t; t++) {
		fz_buf_printf(b, "  %s_%c1 = slice(%s_%c, %s)\n", P, *t, P, *t, lo);
		fz_buf_printf(b, "  %s_%c2 = slice(%s_%c, %s)\n", P, *t, P, *t, hi);
		fz_buf_printf(b, "  %s_%cr = add(mul(%s_%c, cos), mul(cat(neg(%s_%c2), "
			      "%s_%c1, dim=3), sin))\n", P, *t, P, *t, P, *t, P, *t);
	}
	fz_buf_printf(b, "  %s_sc = mul(matmul(%s_qr, transpose(%s_kr, 2, 3)), 0.25)\n",
		      P, P, P);
	fz_buf_printf(b, "  %s_pr = softmax(where(mask, %s_sc, -1e9), dim=3)\n", P, P);
	fz_buf_printf(b, "  %s_ctx = reshape(permute(matmul(%s_pr, %s_v), %s), "
		      "shape=[1, 16, 64])\n", P, P, P, perm);
	fz_buf_printf(b, "  %s_h = add(%s, linear(%s_ctx, l%d_wo))\n", P, X, P, i);
	fz_buf_printf(b, "  %s_n2 = rms_norm(%s_h, l%d_mlp_norm, dims=[2], eps=1e-5)\n",
		      P, P, i);
	fz_buf_printf(b, "  %s_gl = linear(%s_n2, l%d_w_gate)\n", P, P, i);
	fz_buf_printf(b, "  %s_g = silu(%s_gl)\n", P, P);
	fz_buf_printf(b, "  %s_u = linear(%s_n2, l%d_w_up)\n", P, P, i);
	fz_buf_printf(b, "  %s_m = mul(%s_g, %s_u)\n", P, P, P);
	fz_buf_printf(b, "  %s_y = add(%s_h, linear(%s_m, l%d_w_down))\n", P, P, P, i);
}

/* dW = Gᵀ A over the 16 rows */
static void ckpt_wgrad(fz_buf *b, const char *name, const char *g, int gk,
		       const char *a, int ak)
{
	fz_buf_printf(b, "  %s = matmul(transpose(reshape(%s, shape=[16, %d]), 0, 1), "
		      "reshape(%s, shape=[16, %d]))\n", name, g, gk, a, ak);
}

/* The gradient through rms_norm(x, w) of gn into gout (added to gadd). */
static void ckpt_rms_grad(fz_buf *b, const char *B, const char *x,
			  const char *w, const char *gn, const char *gadd,
			  const char *gout, const char *dw)
{
	fz_buf_printf(b, "  %s_r = rsqrt(add(mean(mul(%s, %s), dims=[2], keepdim=true), "
		      "1e-5))\n", B, x, x);
	fz_buf_printf(b, "  %s_gw = mul(%s, %s)\n", B, gn, w);
	fz_buf_printf(b, "  %s_dx = mul(%s_r, sub(%s_gw, mul(mul(%s, mean(mul(%s_gw, "
		      "%s), dims=[2], keepdim=true)), mul(%s_r, %s_r))))\n", B, B, B, x,
		      B, x, B, B);
	if (gadd)
		fz_buf_printf(b, "  %s = add(%s, %s_dx)\n", gout, gadd, B);
	else
		fz_buf_printf(b, "  %s = mul(%s_dx, 1.0)\n", gout, B);
	fz_buf_printf(b, "  %s = sum(reshape(mul(%s, mul(%s, %s_r)), shape=[16, 64]), "
		      "dims=[0])\n", dw, gn, x, B);
}

static void ckpt_backward(fz_buf *b, int i, const char *X, const char *G,
			  const char *gout)
{
	char P[16], B[16], n[64], n2[64];
	snprintf(P, sizeof P, "r%d", i);
	snprintf(B, sizeof B, "b%d", i);
	const char *perm = "dims=[0, 2, 1, 3]";
	const char *lo = "start=[0, 0, 0, 0], end=[1, 4, 16, 8], step=[1, 1, 1, 1]";
	const char *hi = "start=[0, 0, 0, 8], end=[1, 4, 16, 16], step=[1, 1, 1, 1]";
	ckpt_layer(b, P, X, i);
	fz_buf_printf(b, "  %s_gm = matmul(%s, l%d_w_down)\n", B, G, i);
	snprintf(n, sizeof n, "d%d_w_down", i);
	snprintf(n2, sizeof n2, "%s_m", P);
	ckpt_wgrad(b, n, G, 64, n2, 128);
	fz_buf_printf(b, "  %s_gg = mul(%s_gm, %s_u)\n", B, B, P);
	fz_buf_printf(b, "  %s_gu = mul(%s_gm, %s_g)\n", B, B, P);
	fz_buf_printf(b, "  %s_sg = sigmoid(%s_gl)\n", B, P);
	fz_buf_printf(b, "  %s_ggl = mul(%s_gg, mul(%s_sg, add(1.0, mul(%s_gl, "
		      "sub(1.0, %s_sg)))))\n", B, B, B, P, B);
	snprintf(n, sizeof n, "d%d_w_gate", i);
	snprintf(n2, sizeof n2, "%s_ggl", B);
	char a[64];
	snprintf(a, sizeof a, "%s_n2", P);
	ckpt_wgrad(b, n, n2, 128, a, 64);
	snprintf(n, sizeof n, "d%d_w_up", i);
	snprintf(n2, sizeof n2, "%s_gu", B);
	ckpt_wgrad(b, n, n2, 128, a, 64);
	fz_buf_printf(b, "  %s_gn2 = add(matmul(%s_ggl, l%d_w_gate), matmul(%s_gu, "
		      "l%d_w_up))\n", B, B, i, B, i);
	char B2[24], x[64], w[64], gn[64], go[64], dw[64];
	snprintf(B2, sizeof B2, "%s_m2", B);
	snprintf(x, sizeof x, "%s_h", P);
	snprintf(w, sizeof w, "l%d_mlp_norm", i);
	snprintf(gn, sizeof gn, "%s_gn2", B);
	snprintf(go, sizeof go, "%s_gh", B);
	snprintf(dw, sizeof dw, "d%d_mlp_norm", i);
	ckpt_rms_grad(b, B2, x, w, gn, G, go, dw);
	snprintf(n, sizeof n, "d%d_wo", i);
	snprintf(a, sizeof a, "%s_ctx", P);
	ckpt_wgrad(b, n, go, 64, a, 64);
	fz_buf_printf(b, "  %s_gctx = permute(reshape(matmul(%s_gh, l%d_wo), "
		      "shape=[1, 16, 4, 16]), %s)\n", B, B, i, perm);
	fz_buf_printf(b, "  %s_gpr = matmul(%s_gctx, transpose(%s_v, 2, 3))\n", B, B, P);
	fz_buf_printf(b, "  %s_gv = matmul(transpose(%s_pr, 2, 3), %s_gctx)\n", B, P, B);
	fz_buf_printf(b, "  %s_gsc = mul(mul(%s_pr, sub(%s_gpr, sum(mul(%s_gpr, %s_pr), "
		      "dims=[3], keepdim=true))), 0.25)\n", B, P, B, B, P);
	fz_buf_printf(b, "  %s_gq = matmul(%s_gsc, %s_kr)\n", B, B, P);
	fz_buf_printf(b, "  %s_gk = matmul(transpose(%s_gsc, 2, 3), %s_qr)\n", B, B, P);
	for (const char *t = "qk"; *t; t++) {
		fz_buf_printf(b, "  %s_g%cs = mul(%s_g%c, sin)\n", B, *t, B, *t);
		fz_buf_printf(b, "  %s_g%c0 = add(mul(%s_g%c, cos), cat(slice(%s_g%cs, %s), "
			      "neg(slice(%s_g%cs, %s)), dim=3))\n", B, *t, B, *t, B, *t,
			      hi, B, *t, lo);
	}
	for (const char *t = "qkv"; *t; t++) {
		fz_buf_printf(b, "  %s_g%cm = reshape(permute(%s_g%c%s, %s), "
			      "shape=[1, 16, 64])\n", B, *t, B, *t, *t == 'v' ? "" : "0",
			      perm);
		snprintf(n, sizeof n, "d%d_w%c", i, *t);
		snprintf(n2, sizeof n2, "%s_g%cm", B, *t);
		snprintf(a, sizeof a, "%s_n1", P);
		ckpt_wgrad(b, n, n2, 64, a, 64);
	}
	fz_buf_printf(b, "  %s_gn1 = add(add(matmul(%s_gqm, l%d_wq), matmul(%s_gkm, "
		      "l%d_wk)), matmul(%s_gvm, l%d_wv))\n", B, B, i, B, i, B, i);
	snprintf(B2, sizeof B2, "%s_m1", B);
	snprintf(w, sizeof w, "l%d_attn_norm", i);
	snprintf(gn, sizeof gn, "%s_gn1", B);
	snprintf(dw, sizeof dw, "d%d_attn_norm", i);
	ckpt_rms_grad(b, B2, X, w, gn, go, gout, dw);
}

static char *ckpt_step(int layers)
{
	static const char *const wn[] = {"wq", "wk", "wv", "wo", "w_gate", "w_up",
					 "w_down", "attn_norm", "mlp_norm"};
	static const char *const wt[] = {"[64, 64]", "[64, 64]", "[64, 64]",
					 "[64, 64]", "[128, 64]", "[128, 64]",
					 "[64, 128]", "[64]", "[64]"};
	fz_buf b = {0};
	fz_buf_printf(&b, "trace step(ids: i64[1, 16], cos: bf16[16, 16], "
		      "sin: bf16[16, 16], mask: bool[16, 16], embed: bf16[100, 64]");
	for (int i = 0; i < layers; i++)
		for (int k = 0; k < 9; k++)
			fz_buf_printf(&b, ", l%d_%s: bf16%s", i, wn[k], wt[k]);
	fz_buf_puts(&b, ", final_norm: bf16[64], lm_head: bf16[100, 64]) {\n");
	fz_buf_puts(&b, "  x0 = take(embed, ids, dim=0)\n");
	char X[32], P[16];
	for (int i = 0; i < layers; i++) {
		snprintf(X, sizeof X, i ? "f%d_y" : "x0", i - 1);
		snprintf(P, sizeof P, "f%d", i);
		ckpt_layer(&b, P, X, i);
	}
	fz_buf_printf(&b, "  hn = rms_norm(f%d_y, final_norm, dims=[2], eps=1e-5)\n",
		      layers - 1);
	fz_buf_puts(&b, "  logits = linear(hn, lm_head)\n"
		    "  glog = sub(softmax(logits, dim=2), 0.01)\n"
		    "  d_lm_head = matmul(transpose(reshape(glog, shape=[16, 100]), 0, 1), "
		    "reshape(hn, shape=[16, 64]))\n"
		    "  ghn = matmul(glog, lm_head)\n");
	char G[32] = "g_top", gout[32];
	snprintf(X, sizeof X, "f%d_y", layers - 1);
	ckpt_rms_grad(&b, "bf", X, "final_norm", "ghn", NULL, G, "d_final_norm");
	for (int i = layers - 1; i >= 0; i--) {
		snprintf(X, sizeof X, i ? "f%d_y" : "x0", i - 1);
		snprintf(gout, sizeof gout, "g%d", i);
		ckpt_backward(&b, i, X, G, gout);
		snprintf(G, sizeof G, "%s", gout);
	}
	fz_buf_printf(&b, "  d_embed = index_add(full(shape=[100, 64], value=0, "
		      "dtype=bf16), reshape(ids, shape=[16]), reshape(%s, "
		      "shape=[16, 64]), dim=0)\n", G);
	fz_buf_puts(&b, "  return d_embed, d_lm_head, d_final_norm");
	for (int i = 0; i < layers; i++)
		for (int k = 0; k < 9; k++)
			fz_buf_printf(&b, ", d%d_%s", i, wn[k]);
	fz_buf_puts(&b, "\n}\n");
	char *s = fz_buf_take(&b);
	ck_assert_ptr_nonnull(s);
	return s;
}

/* Counted work (fz_program.pass_work) per op of each pass, and of all of
 * them, at 64 layers is at most twice that at 8: no pass grows faster than
 * n log n on the shape of a checkpointed training step. Counted, not timed,
 * so a busy machine cannot fail it, and a pass that goes quadratic can. */
static void ckpt_work(int layers, double *per_op, int *ops)
{
	char *src = ckpt_step(layers);
	fz_module *m = parse(src);
	free(src);
	const fz_trace *t = fz_module_trace(m, 0);
	fz_program *p = plan_sized(t, NULL);
	*ops = fz_trace_op_count(t);
	double all = 0;
	for (int k = 0; k < FZ_PASS_COUNT; k++) {
		per_op[k] = (double)p->pass_work[k] / *ops;
		all += (double)p->pass_work[k];
		/* this step has no collectives: the communication passes have
		 * nothing to do (test_comm covers them); every other pass must
		 * count its work */
		bool comm = k >= FZ_PASS_WAITS && k <= FZ_PASS_BUCKET;
		ck_assert_msg(comm || p->pass_work[k] > 0, "%s counted no work",
			      fz_pass_names[k]);
	}
	per_op[FZ_PASS_COUNT] = all / *ops;
	fz_program_free(p);
	fz_module_free(m);
}

START_TEST(work_per_op_flat)
{
	double w8[FZ_PASS_COUNT + 1], w64[FZ_PASS_COUNT + 1];
	int ops8, ops64;
	ckpt_work(8, w8, &ops8);
	ckpt_work(64, w64, &ops64);
	ck_assert_int_gt(ops64, 7 * ops8);
	for (int k = 0; k <= FZ_PASS_COUNT; k++) {
		const char *name = k < FZ_PASS_COUNT ? fz_pass_names[k] : "all passes";
		fprintf(stderr, "work per op, %s: %.1f at 8 layers (%d ops), %.1f at "
			"64 (%d ops)\n", name, w8[k], ops8, w64[k], ops64);
		ck_assert_msg(w64[k] <= 2 * w8[k], "%s: %.1f steps per op at 64 "
			      "layers, %.1f at 8", name, w64[k], w8[k]);
	}
}
END_TEST

Suite *plan_suite(void)
{
	Suite *s = suite_create("plan");
	TCase *tc = tcase_create("partition");
	tcase_add_test(tc, sort_u64_sorts);
	tcase_add_test(tc, layer_norm_is_one_kernel);
	tcase_add_test(tc, softmax_rmsnorm_one_kernel);
	tcase_add_test(tc, reduction_with_epilogue);
	tcase_add_test(tc, library_calls_are_alone);
	tcase_add_test(tc, in_place_only_over_what_it_reads);
	tcase_add_test(tc, no_cycle_through_a_library_call);
	tcase_add_test(tc, cross_entropy_two_kernels);
	tcase_add_test(tc, embedding_indexing);
	suite_add_tcase(s, tc);
	tc = tcase_create("bookend");
	tcase_add_test(tc, rotary_v_is_a_view);
	tcase_add_test(tc, layer_norm_stays_vectorized);
	tcase_add_test(tc, views_at_edges_copies_inside);
	tcase_add_test(tc, view_eval_rebinds);
	suite_add_tcase(s, tc);
	tc = tcase_create("schedule");
	tcase_add_test(tc, seed004_efficient);
	tcase_add_test(tc, seed004_stages);
	tcase_add_test(tc, dump_after_each_pass);
	suite_add_tcase(s, tc);
	tc = tcase_create("corpus");
	tcase_add_test(tc, corpus_plans);
	tcase_add_test(tc, attention_gqa_repeat_folded);
	suite_add_tcase(s, tc);
	tc = tcase_create("horizontal");
	tcase_add_test(tc, horizontal_quantize_columns);
	tcase_add_test(tc, horizontal_pointwise_pair);
	tcase_add_test(tc, horizontal_refused_when_peak_rises);
	tcase_add_test(tc, horizontal_seed004_keeps_its_peak);
	tcase_add_test(tc, horizontal_refused_on_a_path);
	tcase_add_test(tc, horizontal_blind_to_names_and_order);
	suite_add_tcase(s, tc);
	tc = tcase_create("random");
	tcase_add_loop_test(tc, random_dags, 0, 300);
	suite_add_tcase(s, tc);
	tc = tcase_create("scaling");
	tcase_add_test(tc, work_per_op_flat);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(plan_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
