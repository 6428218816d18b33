/*
 * test_comm.c: communication scheduling (ir/comm.c), the scheduled trace,
 * and the CPU communicator (runtime/comm_cpu.c).
 *
 * The passes on small FSDP-shaped traces a person can follow: waits right
 * before their first consumer, all-gathers in the order of first use and
 * under the inflight cap, reduce-scatters right after their gradient with
 * their waits at the end, small gathers in buckets of at most bucket_bytes;
 * then the scheduled trace, printed, parsed and planned again, prints the
 * same; counted work per op stays flat from 8 to 64 layers. The
 * communicator: exact results across threads, a rank that never
 * joins is a timeout naming it, ranks that call different collectives are
 * an error, and an aborting rank frees the others at once.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "fusec.h"
#include "ir.h"
#include "plan.h"

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "t.trace", &m, &diag);
	ck_assert_msg(st == FZ_OK, "%s", diag ? diag : "");
	return m;
}

static fz_program *plan(const fz_trace *t, const fz_plan_options *o)
{
	fz_program *p = NULL;
	char *err = NULL;
	fz_status st = fz_plan(t, o, &p, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "");
	return p;
}

/* The step at which the node defining value `name` runs. */
static int step_of(const fz_program *p, const char *name)
{
	const fz_value *v = fz_lookup(p->trace, name);
	ck_assert_msg(v && v->def, "no value %s", name);
	int r = p->region_of[v->def->id];
	for (int s = 0; s < p->n_regions; s++)
		if (p->order[s] == r)
			return s;
	ck_abort_msg("region not in the order");
	return -1;
}

/* Two layers, each gathering two weights (64 KiB gathered each); the
 * written order is the naive one: every gather and wait at the top. */
static const char *two_layers =
	"trace f(x: f32[16, 128], a_s: f32[64, 128], b_s: f32[64, 128], "
	"c_s: f32[64, 128], d_s: f32[64, 128]) world 2 {\n"
	"  af = all_gather(a_s, dim=0)\n"
	"  bf = all_gather(b_s, dim=0)\n"
	"  cf = all_gather(c_s, dim=0)\n"
	"  df = all_gather(d_s, dim=0)\n"
	"  a = wait(af)\n  b = wait(bf)\n  c = wait(cf)\n  d = wait(df)\n"
	"  l1 = linear(x, a)\n  h1 = relu(l1)\n"
	"  l2 = linear(h1, b)\n  h2 = relu(l2)\n"
	"  l3 = linear(h2, c)\n  h3 = relu(l3)\n"
	"  h4 = linear(h3, d)\n"
	"  return h4\n}\n";

START_TEST(waits_before_first_consumer)
{
	fz_module *m = parse(two_layers);
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.bucket_bytes = 0;
	fz_program *p = plan(fz_module_trace(m, 0), &o);
	const char *w[] = {"a", "b", "c", "d"};
	const char *use[] = {"l1", "l2", "l3", "h4"};
	for (int i = 0; i < 4; i++) {
		/* the wait, then (views aside) its consumer's matmul */
		int sw = step_of(p, w[i]), su = step_of(p, use[i]);
		ck_assert_int_lt(sw, su);
		for (int s = sw + 1; s < su; s++) {
			fz_region_kind k = p->regions[p->order[s]]->kind;
			ck_assert_msg(k == FZ_REGION_VIEW || k == FZ_REGION_WAIT ||
				      k == FZ_REGION_COLLECTIVE,
				      "wait of %s is %d steps before its consumer", w[i],
				      su - sw);
		}
	}
	fz_program_free(p);
	/* with every pass off the memory scheduler's order stands, and its
	 * gathers come late, right before their waits: nothing overlaps */
	o.comm_waits = o.comm_prefetch = o.comm_scatter = false;
	p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_gt(step_of(p, "cf"), step_of(p, "l1"));
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(gathers_in_order_of_first_use)
{
	/* written in reverse order of use: d, c, b, a */
	fz_module *m = parse(
		"trace f(x: f32[16, 128], a_s: f32[64, 128], b_s: f32[64, 128], "
		"c_s: f32[64, 128], d_s: f32[64, 128]) world 2 {\n"
		"  df = all_gather(d_s, dim=0)\n  cf = all_gather(c_s, dim=0)\n"
		"  bf = all_gather(b_s, dim=0)\n  af = all_gather(a_s, dim=0)\n"
		"  d = wait(df)\n  c = wait(cf)\n  b = wait(bf)\n  a = wait(af)\n"
		"  h1 = relu(linear(x, a))\n  h2 = relu(linear(h1, b))\n"
		"  h3 = relu(linear(h2, c))\n  h4 = linear(h3, d)\n"
		"  return h4\n}\n");
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.bucket_bytes = 0;
	fz_program *p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_lt(step_of(p, "af"), step_of(p, "bf"));
	ck_assert_int_lt(step_of(p, "bf"), step_of(p, "cf"));
	ck_assert_int_lt(step_of(p, "cf"), step_of(p, "df"));
	/* no cap that binds here: all four issued before the first matmul */
	ck_assert_int_lt(step_of(p, "df"), step_of(p, "h1"));
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(inflight_cap)
{
	fz_module *m = parse(two_layers);
	const int64_t one = 64 * 128 * 4 * 2; /* one gathered weight */
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.bucket_bytes = 0;
	o.max_inflight_bytes = 2 * one;
	fz_program *p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_le(p->comm_peak_inflight, 2 * one);
	ck_assert_int_eq(p->comm_peak_inflight, 2 * one);
	/* a and b go at once; c only after a's last reader (l1's matmul) */
	ck_assert_int_lt(step_of(p, "bf"), step_of(p, "l1"));
	ck_assert_int_eq(step_of(p, "cf"), step_of(p, "l1") + 1);
	/* and d right after l2 releases b */
	ck_assert_int_eq(step_of(p, "df"), step_of(p, "l2") + 1);
	/* memplan reuses the released gathered buffer: less than 4 in the arena */
	ck_assert_int_lt(p->arena_bytes, 4 * one + 16 * 128 * 4 * 4);
	fz_program_free(p);
	/* no cap: all four at once */
	o.max_inflight_bytes = 0;
	p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_eq(p->comm_peak_inflight, 4 * one);
	fz_program_free(p);
	/* a cap below one gather still makes progress, one at a time */
	o.max_inflight_bytes = one / 2;
	p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_eq(p->comm_peak_inflight, one);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

START_TEST(buckets)
{
	fz_module *m = parse(two_layers);
	const int64_t one = 64 * 128 * 4 * 2;
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.max_inflight_bytes = 0;
	o.bucket_bytes = 2 * one; /* two per bucket */
	fz_program *p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_eq(p->comm_buckets, 2);
	ck_assert_int_eq(fz_program_count(p, FZ_REGION_COLLECTIVE), 2);
	ck_assert_int_eq(fz_program_count(p, FZ_REGION_WAIT), 2);
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = p->regions[r];
		if (R->kind != FZ_REGION_COLLECTIVE)
			continue;
		int64_t b = 0;
		for (int j = 0; j < R->n_nodes; j++)
			b += p->bytes[R->nodes[j]->out[0]->id];
		ck_assert_int_le(b, o.bucket_bytes);
		ck_assert_int_eq(R->n_nodes, 2);
	}
	ck_assert_int_eq(p->region_of[fz_lookup(p->trace, "af")->def->id],
			 p->region_of[fz_lookup(p->trace, "bf")->def->id]);
	fz_program_free(p);
	/* a gather as large as the bucket stays alone; 0 turns buckets off */
	o.bucket_bytes = one;
	p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_eq(p->comm_buckets, 0);
	ck_assert_int_eq(fz_program_count(p, FZ_REGION_COLLECTIVE), 4);
	fz_program_free(p);
	o.bucket_bytes = 0;
	p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_eq(fz_program_count(p, FZ_REGION_COLLECTIVE), 4);
	fz_program_free(p);
	fz_module_free(m);
	/* two norm weights issued with a large weight between them share a
	 * bucket; the large one stays alone */
	m = parse("trace n(x: f32[8, 256], g1_s: f32[128], w_s: f32[128, 256], "
		  "g2_s: f32[128]) world 2 {\n"
		  "  g1 = wait(all_gather(g1_s, dim=0))\n"
		  "  w = wait(all_gather(w_s, dim=0))\n"
		  "  g2 = wait(all_gather(g2_s, dim=0))\n"
		  "  y = mul(linear(mul(x, g1), w), g2)\n  return y\n}\n");
	fz_plan_defaults(&o);
	o.bucket_bytes = 64 << 10;
	p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_eq(p->comm_buckets, 1);
	ck_assert_int_eq(fz_program_count(p, FZ_REGION_COLLECTIVE), 2);
	const fz_trace *t = p->trace;
	const fz_value *g1 = fz_lookup(t, "g1"), *g2 = fz_lookup(t, "g2");
	const fz_value *w = fz_lookup(t, "w");
	int r1 = p->region_of[g1->def->in[0]->def->id];
	ck_assert_int_eq(r1, p->region_of[g2->def->in[0]->def->id]);
	ck_assert_int_ne(r1, p->region_of[w->def->in[0]->def->id]);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

/* Backward of two linears: each weight gradient is reduce-scattered as soon
 * as it is complete, and its wait goes to the end of the step. */
static const char *backward =
	"trace g(x: f32[32, 64], dy: f32[32, 64], w1: f32[64, 64], "
	"w2: f32[64, 64]) world 2 {\n"
	"  h = linear(x, w1)\n"
	"  dh = linear(dy, transpose(w2, 0, 1))\n"
	"  dw2 = matmul(transpose(dy, 0, 1), h)\n"
	"  dx = linear(dh, transpose(w1, 0, 1))\n"
	"  dw1 = matmul(transpose(dh, 0, 1), x)\n"
	"  g2f = reduce_scatter(dw2, dim=0)\n"
	"  g1f = reduce_scatter(dw1, dim=0)\n"
	"  g2 = wait(g2f)\n  g1 = wait(g1f)\n"
	"  return dx, g1, g2\n}\n";

START_TEST(scatter_early_waits_late)
{
	fz_module *m = parse(backward);
	fz_plan_options o;
	fz_plan_defaults(&o);
	fz_program *p = plan(fz_module_trace(m, 0), &o);
	ck_assert_int_eq(step_of(p, "g2f"), step_of(p, "dw2") + 1);
	ck_assert_int_eq(step_of(p, "g1f"), step_of(p, "dw1") + 1);
	/* the waits: the last two steps */
	ck_assert_int_ge(step_of(p, "g1"), p->n_regions - 2);
	ck_assert_int_ge(step_of(p, "g2"), p->n_regions - 2);
	fz_program_free(p);
	fz_module_free(m);
}
END_TEST

/* The scheduled trace prints, parses back, and plans to the same text. */
static void round_trip(const char *src, int64_t inflight, int64_t bucket)
{
	fz_module *m = parse(src);
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.max_inflight_bytes = inflight;
	o.bucket_bytes = bucket;
	fz_program *p = plan(fz_module_trace(m, 0), &o);
	char *text = NULL;
	ck_assert_int_eq(fz_program_print_trace(p, &text), FZ_OK);
	fz_module *m2 = parse(text);
	fz_program *p2 = plan(fz_module_trace(m2, 0), &o);
	char *text2 = NULL;
	ck_assert_int_eq(fz_program_print_trace(p2, &text2), FZ_OK);
	ck_assert_str_eq(text, text2);
	/* the written order of the scheduled trace is the schedule */
	ck_assert_int_eq(p2->n_regions, p->n_regions);
	ck_assert_int_eq(p2->comm_buckets, p->comm_buckets);
	ck_assert_int_eq(p2->peak_bytes, p->peak_bytes);
	/* and it computes the same thing: same ops, world and returns */
	const fz_trace *a = fz_module_trace(m, 0), *b = fz_module_trace(m2, 0);
	ck_assert_int_eq(a->n_nodes, b->n_nodes);
	ck_assert_int_eq(a->world, b->world);
	ck_assert_int_eq(a->n_outputs, b->n_outputs);
	fz_free(text);
	fz_free(text2);
	fz_program_free(p);
	fz_program_free(p2);
	fz_module_free(m);
	fz_module_free(m2);
}

START_TEST(scheduled_trace_round_trip)
{
	round_trip(two_layers, 2 * 64 * 128 * 4 * 2, 0);
	round_trip(two_layers, 0, 1 << 20);
	round_trip(backward, 0, 25 << 20);
	char *path = FZ_SOURCE_DIR "/tests/traces/fsdp_linear.trace";
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	static char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = '\0';
	fclose(f);
	fz_module *m = parse(buf);
	for (int i = 0; i < fz_module_count(m); i++) {
		char *one = NULL;
		ck_assert_int_eq(fz_trace_print(fz_module_trace(m, i), &one), FZ_OK);
		round_trip(one, 0, 25 << 20);
		fz_free(one);
	}
	fz_module_free(m);
}
END_TEST

/* Every cap and bucket size gives a topological order, and the scheduled
 * trace computes what the written one does, bit for bit, across 2 ranks. */
START_TEST(schedules_are_valid)
{
	const int64_t one = 64 * 128 * 4 * 2;
	const int64_t caps[] = {0, 1, one, 2 * one, 3 * one};
	const int64_t buckets[] = {0, one, 2 * one, 1 << 20};
	const char *srcs[] = {two_layers, backward};
	for (int si = 0; si < 2; si++) {
		fz_module *m = parse(srcs[si]);
		const fz_trace *t = fz_module_trace(m, 0);
		/* inputs for both ranks */
		int n_in = t->n_params, n_out = t->n_outputs;
		fz_tensor in[2 * 8], want[2 * 4], got[2 * 4];
		float *bufs[2 * 8];
		for (int r = 0; r < 2; r++)
			for (int i = 0; i < n_in; i++) {
				const fz_value *v = t->params[i];
				fz_tensor *x = &in[r * n_in + i];
				memset(x, 0, sizeof *x);
				x->dtype = FZ_F32;
				x->rank = v->type.rank;
				int64_t n = 1;
				for (int d = x->rank - 1; d >= 0; d--) {
					x->shape[d] = v->type.dims[d].c;
					x->strides[d] = n;
					n *= x->shape[d];
				}
				float *b = bufs[r * n_in + i] = malloc(sizeof(float) * (size_t)n);
				for (int64_t k = 0; k < n; k++)
					b[k] = (float)((k * 7 + i * 13 + r * 5) % 17) / 17.0f - 0.5f;
				x->data = b;
			}
		char *err = NULL;
		ck_assert_int_eq(fz_trace_interpret_world(t, NULL, 2, in, n_in, want,
							  n_out, &err), FZ_OK);
		for (int ci = 0; ci < 5; ci++)
			for (int bi = 0; bi < 4; bi++) {
				fz_plan_options o;
				fz_plan_defaults(&o);
				o.max_inflight_bytes = caps[ci];
				o.bucket_bytes = buckets[bi];
				fz_program *p = plan(t, &o);
				int *step = malloc(sizeof(int) * (size_t)p->n_regions);
				for (int s = 0; s < p->n_regions; s++)
					step[p->order[s]] = s;
				for (int i = 0; i < t->n_nodes; i++)
					for (int k = 0; k < t->nodes[i]->n_in; k++) {
						const fz_node *d = t->nodes[i]->in[k]->def;
						if (d)
							ck_assert_int_le(step[p->region_of[d->id]],
									 step[p->region_of[i]]);
					}
				free(step);
				ck_assert_int_eq(fz_order_peak(p, p->order), p->peak_bytes);
				if (caps[ci] >= one && si == 0)
					ck_assert_int_le(p->comm_peak_inflight, caps[ci]);
				char *text = NULL;
				ck_assert_int_eq(fz_program_print_trace(p, &text), FZ_OK);
				fz_module *m2 = parse(text);
				ck_assert_int_eq(fz_trace_interpret_world(fz_module_trace(m2, 0),
									  NULL, 2, in, n_in, got,
									  n_out, &err), FZ_OK);
				for (int k = 0; k < 2 * n_out; k++) {
					int64_t n = 1;
					for (int d = 0; d < want[k].rank; d++)
						n *= want[k].shape[d];
					ck_assert(memcmp(got[k].data, want[k].data,
							 sizeof(float) * (size_t)n) == 0);
					fz_free(got[k].data);
				}
				fz_free(text);
				fz_module_free(m2);
				fz_program_free(p);
			}
		for (int k = 0; k < 2 * n_out; k++)
			fz_free(want[k].data);
		for (int k = 0; k < 2 * n_in; k++)
			free(bufs[k]);
		fz_module_free(m);
	}
}
END_TEST

/* An FSDP-shaped step of `layers` layers at world 2: each layer gathers a
 * weight and a norm vector, and reduce-scatters its weight's gradient;
 * written naively (every gather and wait at the top, every scatter and
 * wait at the bottom). */
static char *fsdp_step(int layers)
{
	fz_buf b = {0};
	fz_buf_puts(&b, "trace s(h0: f32[16, 128]");
	for (int i = 0; i < layers; i++)
		fz_buf_printf(&b, ", w%d_s: f32[64, 128], n%d_s: f32[64]", i, i);
	fz_buf_puts(&b, ") world 2 {\n");
	for (int i = 0; i < layers; i++)
		fz_buf_printf(&b, "  w%df = all_gather(w%d_s, dim=0)\n"
			      "  n%df = all_gather(n%d_s, dim=0)\n", i, i, i, i);
	for (int i = 0; i < layers; i++)
		fz_buf_printf(&b, "  w%d = wait(w%df)\n  n%d = wait(n%df)\n", i, i, i, i);
	for (int i = 0; i < layers; i++)
		fz_buf_printf(&b, "  h%d = relu(mul(linear(h%d, w%d), n%d))\n", i + 1,
			      i, i, i);
	for (int i = 0; i < layers; i++)
		fz_buf_printf(&b, "  d%d = matmul(transpose(h%d, 0, 1), h%d)\n"
			      "  d%df = reduce_scatter(d%d, dim=0)\n", i, i + 1, i, i, i);
	for (int i = 0; i < layers; i++)
		fz_buf_printf(&b, "  g%d = wait(d%df)\n", i, i);
	fz_buf_printf(&b, "  return h%d", layers);
	for (int i = 0; i < layers; i++)
		fz_buf_printf(&b, ", g%d", i);
	fz_buf_puts(&b, "\n}\n");
	char *src = fz_buf_take(&b);
	ck_assert_ptr_nonnull(src);
	return src;
}

static void fsdp_work(int layers, double *per_op)
{
	char *src = fsdp_step(layers);
	fz_module *m = parse(src);
	free(src);
	const fz_trace *t = fz_module_trace(m, 0);
	fz_plan_options o;
	fz_plan_defaults(&o);
	o.max_inflight_bytes = 3 * 128 * 128 * 4; /* a cap that binds */
	fz_program *p = plan(t, &o);
	int ops = fz_trace_op_count(t);
	for (int k = FZ_PASS_WAITS; k <= FZ_PASS_BUCKET; k++) {
		ck_assert_msg(p->pass_work[k] > 0, "%s counted no work", fz_pass_names[k]);
		per_op[k] = (double)p->pass_work[k] / ops;
	}
	ck_assert_int_gt(p->comm_buckets, 0);
	fz_program_free(p);
	fz_module_free(m);
}

/* Counted work per op of each communication pass at 64 layers is at most
 * twice that at 8 (comm.c's essay: no scan of every collective per step). */
START_TEST(comm_work_per_op_flat)
{
	double w8[FZ_PASS_COUNT], w64[FZ_PASS_COUNT];
	fsdp_work(8, w8);
	fsdp_work(64, w64);
	for (int k = FZ_PASS_WAITS; k <= FZ_PASS_BUCKET; k++) {
		fprintf(stderr, "work per op, %s: %.1f at 8 layers, %.1f at 64\n",
			fz_pass_names[k], w8[k], w64[k]);
		ck_assert_msg(w64[k] <= 2 * w8[k], "%s: %.1f steps per op at 64 "
			      "layers, %.1f at 8", fz_pass_names[k], w64[k], w8[k]);
	}
}
END_TEST

START_TEST(dump_after_comm_passes)
{
	fz_module *m = parse(two_layers);
	const char *names[] = {"waits", "prefetch", "scatter", "bucket"};
	for (int i = 0; i < 4; i++) {
		fz_pass ps;
		ck_assert(fz_pass_from_name(names[i], &ps));
		fz_plan_options o;
		fz_plan_defaults(&o);
		o.dump_after = (int)ps;
		fz_program *p = plan(fz_module_trace(m, 0), &o);
		ck_assert_ptr_nonnull(p->dump);
		ck_assert_ptr_nonnull(strstr(p->dump, names[i]));
		ck_assert_ptr_nonnull(strstr(p->dump, "all_gather"));
		fz_program_free(p);
	}
	fz_module_free(m);
}
END_TEST

/* ---- the communicator ---- */

typedef struct job {
	fz_comm *c;
	int rank;
	fz_opcode op;
	int64_t shape[2];
	float x[8], y[32];
	fz_status st;
	char *err;
} job;

static void *job_main(void *arg)
{
	job *j = arg;
	j->st = fz_comm_collective(j->c, j->rank, j->op, FZ_F32, 2, j->shape, 0,
				   j->x, j->y, &j->err);
	return NULL;
}

static void run_jobs(job *j, int n)
{
	pthread_t th[8];
	for (int r = 0; r < n; r++)
		ck_assert_int_eq(pthread_create(&th[r], NULL, job_main, &j[r]), 0);
	for (int r = 0; r < n; r++)
		pthread_join(th[r], NULL);
}

START_TEST(comm_exact)
{
	fz_comm *c;
	ck_assert_int_eq(fz_comm_new(4, 10, &c), FZ_OK);
	job j[4];
	memset(j, 0, sizeof j);
	for (int r = 0; r < 4; r++) {
		j[r] = (job){.c = c, .rank = r, .op = FZ_OP_REDUCE_SCATTER,
			     .shape = {4, 2}};
		for (int i = 0; i < 8; i++)
			j[r].x[i] = (float)(r * 10 + i) + 0.1f;
	}
	run_jobs(j, 4);
	for (int r = 0; r < 4; r++) {
		ck_assert_msg(j[r].st == FZ_OK, "%s", j[r].err ? j[r].err : "");
		for (int i = 0; i < 2; i++) {
			double want = 0;
			for (int q = 0; q < 4; q++)
				want += (double)j[q].x[r * 2 + i];
			ck_assert(j[r].y[i] == (float)want);
		}
	}
	/* the same communicator, the next collective */
	for (int r = 0; r < 4; r++)
		j[r].op = FZ_OP_ALL_GATHER;
	run_jobs(j, 4);
	for (int r = 0; r < 4; r++) {
		ck_assert_int_eq(j[r].st, FZ_OK);
		for (int q = 0; q < 4; q++)
			for (int i = 0; i < 8; i++)
				ck_assert(j[r].y[q * 8 + i] == j[q].x[i]);
	}
	fz_comm_free(c);
}
END_TEST

START_TEST(comm_rank_never_joins)
{
	fz_comm *c;
	ck_assert_int_eq(fz_comm_new(3, 0.2, &c), FZ_OK);
	job j[3];
	memset(j, 0, sizeof j);
	for (int r = 0; r < 3; r++)
		j[r] = (job){.c = c, .rank = r, .op = FZ_OP_ALL_REDUCE, .shape = {2, 2}};
	run_jobs(j, 2); /* rank 2 never comes */
	for (int r = 0; r < 2; r++) {
		ck_assert_int_ne(j[r].st, FZ_OK);
		ck_assert_ptr_nonnull(j[r].err);
		ck_assert_msg(strstr(j[r].err, "rank 2 did not join all_reduce #1"),
			      "%s", j[r].err);
		fz_free(j[r].err);
	}
	/* the communicator stays failed: no later call waits */
	run_jobs(j + 2, 1);
	ck_assert_int_ne(j[2].st, FZ_OK);
	fz_free(j[2].err);
	fz_comm_free(c);
}
END_TEST

START_TEST(comm_ranks_disagree)
{
	fz_comm *c;
	ck_assert_int_eq(fz_comm_new(2, 10, &c), FZ_OK);
	job j[2];
	memset(j, 0, sizeof j);
	j[0] = (job){.c = c, .rank = 0, .op = FZ_OP_ALL_GATHER, .shape = {2, 2}};
	j[1] = (job){.c = c, .rank = 1, .op = FZ_OP_ALL_REDUCE, .shape = {2, 2}};
	run_jobs(j, 2);
	for (int r = 0; r < 2; r++) {
		ck_assert_int_ne(j[r].st, FZ_OK);
		ck_assert_msg(strstr(j[r].err, "ranks disagree"), "%s", j[r].err);
		fz_free(j[r].err);
	}
	fz_comm_free(c);
}
END_TEST

START_TEST(comm_abort_frees_the_others)
{
	fz_comm *c;
	ck_assert_int_eq(fz_comm_new(2, 30, &c), FZ_OK); /* a long timeout */
	job j = {.c = c, .rank = 0, .op = FZ_OP_ALL_REDUCE, .shape = {2, 2}};
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, job_main, &j), 0);
	fz_comm_abort(c, 1, "input 3 has no data");
	pthread_join(th, NULL);
	ck_assert_int_ne(j.st, FZ_OK);
	ck_assert_msg(strstr(j.err, "rank 1 gave up: input 3 has no data"), "%s", j.err);
	fz_free(j.err);
	fz_comm_free(c);
}
END_TEST

/* ---- NCCL: the parts that need no GPU ---- */

START_TEST(nccl_unique_id)
{
	unsigned char a[FZ_NCCL_ID_BYTES] = {0}, b[FZ_NCCL_ID_BYTES] = {0};
	char *err = NULL;
	fz_status st = fz_nccl_unique_id(a, &err);
	if (st == FZ_EUNSUPPORTED) { /* no libnccl here: said plainly */
		ck_assert_ptr_nonnull(strstr(err, "NCCL is not available"));
		fz_free(err);
		return;
	}
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "");
	ck_assert_int_eq(fz_nccl_unique_id(b, &err), FZ_OK);
	ck_assert(memcmp(a, b, sizeof a) != 0); /* a fresh id each time */
}
END_TEST

typedef struct boot {
	int rank;
	const char *path;
	double timeout;
	unsigned char id[FZ_NCCL_ID_BYTES];
	fz_status st;
	char *err;
} boot;

static void *boot_main(void *arg)
{
	boot *b = arg;
	b->st = fz_nccl_bootstrap_file(b->rank, b->path, b->timeout, b->id, &b->err);
	return NULL;
}

START_TEST(nccl_bootstrap_file)
{
	unsigned char probe[FZ_NCCL_ID_BYTES];
	char *err = NULL;
	if (fz_nccl_unique_id(probe, &err) != FZ_OK) {
		fz_free(err);
		return; /* no libnccl: nothing to share */
	}
	char path[] = "/tmp/fusec-nccl-id-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	unlink(path);
	boot b[3] = {{.rank = 1, .path = path, .timeout = 10},
		     {.rank = 2, .path = path, .timeout = 10},
		     {.rank = 0, .path = path, .timeout = 10}};
	pthread_t th[3];
	for (int i = 0; i < 3; i++) /* the readers start before the writer */
		ck_assert_int_eq(pthread_create(&th[i], NULL, boot_main, &b[i]), 0);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(b[i].st == FZ_OK, "%s", b[i].err ? b[i].err : "");
	ck_assert(memcmp(b[0].id, b[2].id, FZ_NCCL_ID_BYTES) == 0);
	ck_assert(memcmp(b[1].id, b[2].id, FZ_NCCL_ID_BYTES) == 0);
	unlink(path);
	/* rank 0 never writes: a timeout naming the file */
	boot late = {.rank = 1, .path = path, .timeout = 0.1};
	boot_main(&late);
	ck_assert_int_ne(late.st, FZ_OK);
	ck_assert_msg(strstr(late.err, "did not publish the NCCL id"), "%s", late.err);
	fz_free(late.err);
}
END_TEST

static Suite *comm_suite(void)
{
	Suite *s = suite_create("comm");
	TCase *tc = tcase_create("passes");
	tcase_add_test(tc, waits_before_first_consumer);
	tcase_add_test(tc, gathers_in_order_of_first_use);
	tcase_add_test(tc, inflight_cap);
	tcase_add_test(tc, buckets);
	tcase_add_test(tc, scatter_early_waits_late);
	tcase_add_test(tc, scheduled_trace_round_trip);
	tcase_add_test(tc, schedules_are_valid);
	tcase_add_test(tc, dump_after_comm_passes);
	tcase_add_test(tc, comm_work_per_op_flat);
	suite_add_tcase(s, tc);
	tc = tcase_create("communicator");
	tcase_add_test(tc, comm_exact);
	tcase_add_test(tc, comm_rank_never_joins);
	tcase_add_test(tc, comm_ranks_disagree);
	tcase_add_test(tc, comm_abort_frees_the_others);
	suite_add_tcase(s, tc);
	tc = tcase_create("nccl");
	tcase_add_test(tc, nccl_unique_id);
	tcase_add_test(tc, nccl_bootstrap_file);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(comm_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
