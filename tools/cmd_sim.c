/*
 * cmd_sim.c: `fusec sim`, one training step across N ranks, predicted.
 *
 *     fusec sim FILE --world N [--bind B=2,T=4096] [--trace-order]
 *               [--link-gbps G] [--tflops F] [--hbm-tbps B] [--svg OUT]
 *               [--json] [communication flags as for plan]
 *
 * A discrete-event simulation of the planned program (or, with
 * --trace-order, of the regions in the written order, no communication
 * scheduling) on two streams per rank, the way the runtime issues it:
 *
 *   compute stream  regions in order; a library call costs
 *                   max(flops / F, bytes / B), a kernel bytes / B (what it
 *                   reads and writes), an attention region (the fused
 *                   kernel) max(flops / F, bytes / B) with the flops of its
 *                   products (fz_attn_flops), each plus a launch of LAUNCH_S; a view
 *                   costs nothing
 *   comm stream     collectives in the order they are issued; one cannot
 *                   start before the compute stream reaches it (its operand
 *                   is ready then) nor before the previous collective ends.
 *                   Ring algorithms over N ranks, message of S bytes (the
 *                   gathered tensor, the reduce-scatter's operand):
 *                     all_gather, reduce_scatter: (N-1)/N * S / G + (N-1) a
 *                     all_reduce:               2 (N-1)/N * S / G + 2 (N-1) a
 *                   plus one launch COLL_LAUNCH_S per collective region, so a
 *                   bucket of many gathers pays it and the latency once
 *   wait            the compute stream stalls until the collectives it
 *                   waits on have ended; the stall is exposed communication
 *
 * Every rank runs the same program on same-sized shards (SPMD) and the cost
 * model has no per-rank term, so all ranks' timelines are the same and one
 * is simulated and drawn; a collective starts when the last rank reaches
 * it, which is then the same instant for every rank.
 *
 * Reported: step time (the later stream's end), compute time (the compute
 * stream's busy time), communication time (the comm stream's busy time),
 * exposed communication (compute stalled on waits), peak bytes (the
 * planned peak of this order, fz_order_peak), and peak unsharded bytes: the
 * most all-gathered bytes alive at once, from a gather's issue to the last
 * reader of what it gathered.
 *
 * The SVG is a profiler-style picture: a time axis in ms, a compute lane
 * (matmuls blue, kernels green, red hatching where it waits), a
 * communication lane (all-gathers orange, reduce-scatters purple,
 * all-reduces red), and below them the unsharded bytes over time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "tool.h"

#define LAUNCH_S 4e-6       /* a kernel or library launch */
#define COLL_LAUNCH_S 10e-6 /* a collective launch (NCCL kernel) */
#define RING_STEP_S 3e-6    /* latency of one ring step */

static int cmd_sim(int argc, char **argv);

const fz_command fz_cmd_sim = {"sim", "simulate one step across ranks: time, "
	"exposed communication, a timeline",
	cmd_sim,
	 "usage: fusec sim FILE --world N [--bind B=2,T=4096] [--trace-order]\n"
	 "                 [--link-gbps G] [--tflops F] [--hbm-tbps B] [--svg OUT]\n"
	 "                 [--json] [--max-inflight-bytes SIZE] [--bucket-bytes SIZE]\n"
	 "                 [--no-prefetch] [--no-comm-waits] [--no-early-scatter]\n"
	 "\n"
	 "Simulate one step of the first trace of FILE on a compute and a\n"
	 "communication stream per rank, with a cost model: library calls at\n"
	 "F TFLOP/s (or HBM bandwidth, whichever is slower), kernels at B TB/s,\n"
	 "ring collectives over links of G GB/s per rank with latency. Prints\n"
	 "step time, compute and communication time, exposed communication\n"
	 "(compute waiting on a collective), peak bytes and peak unsharded\n"
	 "(all-gathered, not yet released) bytes.\n"
	 "\n"
	 "  --world N         ranks; must be the world the trace declares\n"
	 "  --bind LIST       sizes of symbolic extents, NAME=SIZE[,...]\n"
	 "  --trace-order     simulate the written order, without communication\n"
	 "                    scheduling\n"
	 "  --link-gbps G     collective bandwidth per rank, gigabytes/s (default\n"
	 "                    370: NCCL ring bus bandwidth on 8 x H100 NVLink)\n"
	 "  --tflops F        matmul rate, TFLOP/s (default 989: H100 SXM dense\n"
	 "                    bf16)\n"
	 "  --hbm-tbps B      memory bandwidth, TB/s (default 3.35: H100 SXM)\n"
	 "  --svg OUT         draw the timeline (compute and communication lanes,\n"
	 "                    unsharded bytes) into OUT\n"
	 "  --json            one JSON object: step_seconds, compute_seconds,\n"
	 "                    comm_seconds, exposed_comm_seconds, peak_bytes,\n"
	 "                    peak_unsharded_bytes, and the model's parameters\n"
	 "Communication flags as for `fusec plan` (see fusec plan --help).\n"};

typedef struct span {
	double t0, t1;
	int lane;      /* 0 compute, 1 comm, 2 stall */
	int color;     /* index in colors[] */
	int region;
} span;

enum { C_MATMUL, C_KERNEL, C_STALL, C_GATHER, C_SCATTER, C_REDUCE, C_COUNT };
static const char *const colors[C_COUNT] = {
	"#4a7fd4", "#55a868", "#d62728", "#f28e2b", "#9467bd", "#c44e52",
};
static const char *const color_names[C_COUNT] = {
	"matmul / linear", "fused kernel", "waiting on communication",
	"all_gather", "reduce_scatter", "all_reduce",
};

typedef struct sim_model {
	int world;
	double link, flops, hbm; /* bytes/s, flop/s, bytes/s */
} sim_model;

typedef struct sim_result {
	double step, compute, comm, exposed;
	double matmul, kernel, flops; /* compute split: library calls, kernels */
	int64_t peak, peak_unsharded;
	span *spans;
	int n_spans;
	double *ush_t;        /* unsharded bytes after each change */
	int64_t *ush_b;
	int n_ush;
} sim_result;

static int64_t value_bytes(const fz_program *p, const fz_value *v)
{
	int64_t e = fz_type_numel_at(&v->type, p->sym_sizes);
	return e < 0 ? 0 : e * (int64_t)fz_dtype_size(v->type.dtype);
}

/* Bytes a region moves through memory: what it reads (a broadcast view
 * reads its base once) and what it writes. */
static int64_t region_bytes(const fz_program *p, const fz_region *R)
{
	int64_t b = 0;
	for (int k = 0; k < R->n_in; k++) {
		fz_value *v = R->in[k], *base = fz_view_root(p, v);
		int64_t x = value_bytes(p, v), y = base != v ? value_bytes(p, base) : x;
		b += y < x ? y : x;
	}
	for (int k = 0; k < R->n_out; k++)
		if (!p->view_of[R->out[k]->id])
			b += value_bytes(p, R->out[k]);
	return b;
}

static double library_flops(const fz_program *p, const fz_node *n)
{
	const fz_type *a = &n->in[0]->type, *y = &n->out[0]->type;
	int64_t out = fz_type_numel_at(y, p->sym_sizes);
	int64_t K = a->rank ? fz_ext_eval(a->dims[a->rank - 1], p->sym_sizes) : 1;
	if (out < 0 || K < 0)
		return 0;
	return 2.0 * (double)out * (double)K;
}

static double coll_seconds(const fz_program *p, const fz_region *R,
			   const sim_model *m)
{
	double N = m->world, t = COLL_LAUNCH_S;
	double bytes = 0, factor = 1;
	for (int j = 0; j < R->n_nodes; j++) {
		const fz_node *n = R->nodes[j];
		if (n->op == FZ_OP_ALL_GATHER) {
			bytes += (double)value_bytes(p, n->out[0]);
		} else {
			bytes += (double)value_bytes(p, n->in[0]);
			if (n->op == FZ_OP_ALL_REDUCE)
				factor = 2;
		}
	}
	if (m->world > 1)
		t += factor * ((N - 1) / N * bytes / m->link + (N - 1) * RING_STEP_S);
	return t;
}

static int coll_color(const fz_region *R)
{
	switch (R->nodes[0]->op) {
	case FZ_OP_ALL_GATHER: return C_GATHER;
	case FZ_OP_REDUCE_SCATTER: return C_SCATTER;
	default: return C_REDUCE;
	}
}

static bool add_span(sim_result *r, int *cap, double t0, double t1, int lane,
		     int color, int region)
{
	if (r->n_spans == *cap) {
		int nc = *cap ? *cap * 2 : 1024;
		span *s = realloc(r->spans, sizeof *s * (size_t)nc);
		if (!s)
			return false;
		r->spans = s;
		*cap = nc;
	}
	r->spans[r->n_spans++] = (span){t0, t1, lane, color, region};
	return true;
}

static int cmp_event(const void *a, const void *b)
{
	const double *x = a, *y = b;
	if (x[0] != y[0])
		return (x[0] > y[0]) - (x[0] < y[0]);
	return (x[1] > y[1]) - (x[1] < y[1]); /* releases first at a tie */
}

/* Runs the program in `order`; fills r. 0, or -1 when out of memory. */
static int simulate(const fz_program *p, const int *order, const sim_model *m,
		    sim_result *r)
{
	const fz_trace *t = p->trace;
	int n = p->n_regions, cap = 0, nv = t->n_values;
	memset(r, 0, sizeof *r);
	double *done = calloc((size_t)n + 1, sizeof(double)); /* per region */
	double *start = calloc((size_t)n + 1, sizeof(double));
	int *last_step = malloc(sizeof(int) * ((size_t)nv + 1));
	double *ev = malloc(sizeof(double) * 2 * ((size_t)t->n_nodes + 1) * 2);
	if (!done || !start || !last_step || !ev)
		goto oom;
	double tc = 0, tm = 0;
	for (int s = 0; s < n; s++) {
		const fz_region *R = p->regions[order[s]];
		switch (R->kind) {
		case FZ_REGION_VIEW:
			start[R->id] = done[R->id] = tc;
			break;
		case FZ_REGION_COLLECTIVE: {
			double t0 = tc > tm ? tc : tm, d = coll_seconds(p, R, m);
			start[R->id] = tc; /* issued */
			tm = done[R->id] = t0 + d;
			r->comm += d;
			if (!add_span(r, &cap, t0, tm, 1, coll_color(R), R->id))
				goto oom;
			break;
		}
		case FZ_REGION_WAIT: {
			double until = tc;
			for (int j = 0; j < R->n_nodes; j++) {
				const fz_node *c = R->nodes[j]->in[0]->def;
				double e = done[p->region_of[c->id]];
				if (e > until)
					until = e;
			}
			if (until > tc) {
				r->exposed += until - tc;
				if (!add_span(r, &cap, tc, until, 2, C_STALL, R->id))
					goto oom;
				tc = until;
			}
			start[R->id] = done[R->id] = tc;
			break;
		}
		default: {
			double bytes = (double)region_bytes(p, R), d = bytes / m->hbm;
			int color = C_KERNEL;
			if (R->kind == FZ_REGION_LIBRARY) {
				double fl = library_flops(p, R->nodes[0]);
				r->flops += fl;
				if (fl / m->flops > d)
					d = fl / m->flops;
				color = C_MATMUL;
			}
			fz_attn at;
			if (R->kind == FZ_REGION_ATTENTION &&
			    fz_attn_describe(p->trace, R, &at, NULL, 0)) {
				/* the fused kernel: its products on the tensor
				 * cores at the matmul rate (causal: half the
				 * pairs), its bytes (q, k, v, o; no T x T) */
				double fl = fz_attn_flops(&at, p->sym_sizes);
				r->flops += fl;
				if (fl / m->flops > d)
					d = fl / m->flops;
			}
			d += LAUNCH_S;
			*(color == C_MATMUL ? &r->matmul : &r->kernel) += d;
			start[R->id] = tc;
			done[R->id] = tc + d;
			if (!add_span(r, &cap, tc, tc + d, 0, color, R->id))
				goto oom;
			tc += d;
			r->compute += d;
		}
		}
	}
	r->step = tc > tm ? tc : tm;
	r->peak = fz_order_peak(p, order);
	if (r->peak < 0)
		goto oom;

	/* unsharded bytes: a gather's result is alive from its issue until
	 * the last region that reads it (its wait, and what reads the waited
	 * value or views of it); returned: until the end */
	for (int v = 0; v < nv; v++)
		last_step[v] = -1;
	for (int s = 0; s < n; s++) {
		const fz_region *R = p->regions[order[s]];
		for (int k = 0; k < R->n_in; k++)
			last_step[fz_view_root(p, R->in[k])->id] = s;
	}
	for (int i = 0; i < t->n_outputs; i++)
		last_step[fz_view_root(p, t->outputs[i])->id] = n;
	double *end_of = malloc(sizeof(double) * ((size_t)n + 1));
	if (!end_of)
		goto oom;
	for (int s = 0; s < n; s++)
		end_of[s] = done[order[s]];
	int ne = 0;
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *g = t->nodes[i];
		if (g->op != FZ_OP_ALL_GATHER || p->region_of[i] < 0) /* dead */
			continue;
		const fz_value *f = g->out[0];
		int last = last_step[f->id];
		/* the wait that reads f, and the last reader of its result */
		for (int j = 0; j < t->n_nodes; j++) {
			const fz_node *w = t->nodes[j];
			if (w->op == FZ_OP_WAIT && w->in[0] == f) {
				int l = last_step[fz_view_root(p, w->out[0])->id];
				if (l > last)
					last = l;
			}
		}
		double t0 = start[p->region_of[g->id]];
		double t1 = last >= n ? r->step : last >= 0 ? end_of[last] : t0;
		double b = (double)value_bytes(p, f);
		ev[2 * ne] = t0, ev[2 * ne + 1] = b, ne++;
		ev[2 * ne] = t1, ev[2 * ne + 1] = -b, ne++;
	}
	free(end_of);
	qsort(ev, (size_t)ne, 2 * sizeof(double), cmp_event);
	r->ush_t = malloc(sizeof(double) * ((size_t)ne + 1));
	r->ush_b = malloc(sizeof(int64_t) * ((size_t)ne + 1));
	if (!r->ush_t || !r->ush_b)
		goto oom;
	double live = 0;
	for (int i = 0; i < ne; i++) {
		live += ev[2 * i + 1];
		if (live < 0.5)
			live = 0;
		r->ush_t[r->n_ush] = ev[2 * i];
		r->ush_b[r->n_ush++] = (int64_t)live;
		if ((int64_t)live > r->peak_unsharded)
			r->peak_unsharded = (int64_t)live;
	}
	free(done);
	free(start);
	free(last_step);
	free(ev);
	return 0;
oom:
	free(done);
	free(start);
	free(last_step);
	free(ev);
	return -1;
}

static void sim_result_free(sim_result *r)
{
	free(r->spans);
	free(r->ush_t);
	free(r->ush_b);
}

/* ---- the picture ---- */

static void svg_text(FILE *f, double x, double y, const char *anchor,
		     int size, const char *fill, const char *s)
{
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\" "
		"fill=\"%s\">%s</text>\n", x, y, anchor, size, fill, s);
}

static double nice_tick(double span_s)
{
	double raw = span_s / 10, p10 = pow(10, floor(log10(raw)));
	double m = raw / p10;
	return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p10;
}

typedef struct panel {
	double x, w;          /* pixels */
	double t0, t1;        /* seconds shown */
	double y;             /* top */
} panel;

#define LANE_H 40.0
#define MEM_H 80.0

/* Lanes, unsharded bytes and a time axis for the window [t0, t1]; returns
 * the y below it. */
static double draw_panel(FILE *f, const sim_result *r, const panel *pn,
			 const char *title)
{
	char buf[256];
	double sx = pn->w / (pn->t1 - pn->t0);
	double y_comp = pn->y + 14, y_comm = y_comp + LANE_H + 10;
	double y_mem = y_comm + LANE_H + 14;
	svg_text(f, pn->x, pn->y + 4, "start", 13, "#222", title);
	const char *lane_name[2] = {"compute stream", "communication stream"};
	double lane_y[3] = {y_comp, y_comm, y_comp};
	for (int l = 0; l < 2; l++) {
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
			"fill=\"#f4f4f4\" stroke=\"#ccc\"/>\n", pn->x, lane_y[l], pn->w,
			LANE_H);
		svg_text(f, pn->x - 10, lane_y[l] + LANE_H / 2 + 5, "end", 13, "#222",
			 lane_name[l]);
	}
	fprintf(f, "<svg x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
		"overflow=\"hidden\">\n", pn->x, pn->y, pn->w, y_mem + MEM_H - pn->y);
	/* spans, in the nested svg's coordinates; adjacent ones of one color
	 * narrower than a pixel become one */
	for (int l = 0; l < 3; l++) {
		int i = 0;
		while (i < r->n_spans) {
			const span *s = &r->spans[i];
			if (s->lane != l || s->t1 < pn->t0 || s->t0 > pn->t1) {
				i++;
				continue;
			}
			double x0 = (s->t0 - pn->t0) * sx, x1 = (s->t1 - pn->t0) * sx;
			int color = s->color, j = i + 1;
			while (j < r->n_spans) {
				const span *u = &r->spans[j];
				if (u->lane != l) {
					j++;
					continue;
				}
				if (u->color != color || (u->t0 - pn->t0) * sx - x1 > 0.5 ||
				    x1 - x0 > 0.5)
					break;
				x1 = (u->t1 - pn->t0) * sx;
				j++;
			}
			if (x1 - x0 < 0.6)
				x1 = x0 + 0.6;
			double y = lane_y[l] - pn->y + (l == 2 ? 0 : 3);
			double h = LANE_H - (l == 2 ? 0 : 6);
			fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
				"fill=\"%s\"%s/>\n", x0, y, x1 - x0, h,
				l == 2 ? "url(#stall)" : colors[color],
				x1 - x0 > 3 && l != 2 ? " stroke=\"white\" stroke-width=\"0.5\"" : "");
			i = j;
		}
	}
	/* unsharded bytes, a step line */
	double maxb = (double)(r->peak_unsharded > 0 ? r->peak_unsharded : 1);
	double base = y_mem - pn->y + MEM_H;
	fprintf(f, "<path fill=\"#f28e2b\" fill-opacity=\"0.35\" stroke=\"#c86a10\" "
		"stroke-width=\"1\" d=\"M %.1f %.1f", 0.0, base);
	double prev = 0;
	for (int i = 0; i < r->n_ush; i++) {
		double x = (r->ush_t[i] - pn->t0) * sx;
		if (x < -1)
			x = -1;
		if (x > pn->w + 1)
			break;
		fprintf(f, " L %.2f %.2f", x, base - prev / maxb * (MEM_H - 8));
		prev = (double)r->ush_b[i];
		fprintf(f, " L %.2f %.2f", x, base - prev / maxb * (MEM_H - 8));
	}
	fprintf(f, " L %.1f %.2f L %.1f %.1f Z\"/>\n", pn->w + 1,
		base - prev / maxb * (MEM_H - 8), pn->w + 1, base);
	fprintf(f, "</svg>\n");
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
		"fill=\"none\" stroke=\"#ccc\"/>\n", pn->x, y_mem, pn->w, MEM_H);
	svg_text(f, pn->x - 10, y_mem + 16, "end", 13, "#222", "unsharded bytes");
	snprintf(buf, sizeof buf, "top: %.2f GiB", maxb / (1 << 30));
	svg_text(f, pn->x - 10, y_mem + 32, "end", 11, "#777", buf);
	/* time axis */
	double ya = y_mem + MEM_H, tick = nice_tick(pn->t1 - pn->t0);
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
		"stroke=\"#444\"/>\n", pn->x, ya, pn->x + pn->w, ya);
	for (double x = ceil(pn->t0 / tick) * tick; x <= pn->t1 * 1.0001; x += tick) {
		double px = pn->x + (x - pn->t0) * sx;
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
			"stroke=\"#444\"/>\n", px, ya, px, ya + 5);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
			"stroke=\"#000\" stroke-opacity=\"0.07\"/>\n", px, y_comp, px, ya);
		snprintf(buf, sizeof buf, "%g ms", fabs(x) < 1e-12 ? 0 :
			 round(x * 1e7) / 1e4);
		svg_text(f, px, ya + 18, "middle", 11, "#444", buf);
	}
	return ya + 28;
}

static int write_svg(const char *path, const fz_program *p, const sim_result *r,
		     const sim_model *m, bool trace_order)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		perror(path);
		return EXIT_BAD;
	}
	const double W = 1600, left = 170, right = 30, plot = W - left - right;
	const double H = 612;
	double T = r->step > 0 ? r->step : 1e-9;
	char buf[512];
	fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
		"height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, "
		"Arial, sans-serif\">\n", W, H, W, H);
	fprintf(f, "<defs><pattern id=\"stall\" width=\"6\" height=\"6\" "
		"patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
		"<rect width=\"6\" height=\"6\" fill=\"#fbe3e3\"/><line x1=\"0\" "
		"y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"%s\" stroke-width=\"3\"/>"
		"</pattern></defs>\n", colors[C_STALL]);
	fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
	snprintf(buf, sizeof buf, "%s: one step, world %d, %s", p->trace->name,
		 m->world, trace_order ? "written order (no communication "
		 "scheduling)" : "communication scheduled");
	svg_text(f, left, 30, "start", 18, "#222", buf);
	snprintf(buf, sizeof buf, "step %.2f ms &#183; compute %.2f ms &#183; "
		 "communication %.2f ms, exposed %.2f ms (%.1f%% of the step) "
		 "&#183; peak unsharded %.2f GiB &#183; peak %.2f GiB",
		 r->step * 1e3, r->compute * 1e3, r->comm * 1e3, r->exposed * 1e3,
		 100 * r->exposed / T, (double)r->peak_unsharded / (1 << 30),
		 (double)r->peak / (1 << 30));
	svg_text(f, left, 54, "start", 13, "#444", buf);
	snprintf(buf, sizeof buf, "model: %.0f TFLOP/s, HBM %.2f TB/s, link %.0f "
		 "GB/s per rank, ring collectives; every rank runs this same "
		 "timeline (SPMD)", m->flops / 1e12, m->hbm / 1e12, m->link / 1e9);
	svg_text(f, left, 72, "start", 11, "#777", buf);
	panel whole = {left, plot, 0, T, 96};
	double y = draw_panel(f, r, &whole, "the whole step");
	/* a zoom: a twentieth of the step, a fifth of the way in (forward) */
	panel zoom = {left, plot, 0.2 * T, 0.25 * T, y + 16};
	double zx0 = left + zoom.t0 / T * plot, zx1 = left + zoom.t1 / T * plot;
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
		"fill=\"none\" stroke=\"#222\" stroke-dasharray=\"4 3\"/>\n", zx0,
		whole.y + 12, zx1 - zx0, y - whole.y - 40);
	snprintf(buf, sizeof buf, "zoom: %.1f to %.1f ms (dashed box above)",
		 zoom.t0 * 1e3, zoom.t1 * 1e3);
	y = draw_panel(f, r, &zoom, buf);
	/* legend */
	double lx = left, ly = y + 18;
	for (int c = 0; c < C_COUNT; c++) {
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" "
			"fill=\"%s\"/>\n", lx, ly - 11, c == C_STALL ? "url(#stall)" :
			colors[c]);
		svg_text(f, lx + 20, ly, "start", 12, "#333", color_names[c]);
		lx += 40 + 7.0 * (double)strlen(color_names[c]);
	}
	fprintf(f, "</svg>\n");
	if (fclose(f) != 0) {
		perror(path);
		return EXIT_BAD;
	}
	return 0;
}

static double parse_pos(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	return *end || !(v > 0) || !isfinite(v) ? -1 : v;
}

static int cmd_sim(int argc, char **argv)
{
	const fz_command *c = &fz_cmd_sim;
	tool_binding binds[FZ_MAX_SYMS];
	int n_binds = 0, world = 0;
	bool json = false, trace_order = false;
	const char *file = NULL, *svg = NULL;
	double link = 370, tflops = 989, hbm = 3.35;
	fz_plan_options po;
	fz_plan_defaults(&po);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_next = i + 1 < argc;
		int took = tool_comm_option(c, argc, argv, &i, &po);
		if (took < 0)
			return EXIT_USAGE;
		if (took)
			continue;
		if (!strcmp(a, "--json")) {
			json = true;
		} else if (!strcmp(a, "--trace-order")) {
			trace_order = true;
		} else if (!strcmp(a, "--bind") && has_next) {
			if (tool_bind_option(c, argv[++i], binds, &n_binds))
				return EXIT_USAGE;
		} else if (!strcmp(a, "--world") && has_next) {
			char *end;
			long w = strtol(argv[++i], &end, 10);
			if (*end || w < 1 || w > 1 << 20)
				return tool_usage_error(c, "bad world size '%s'", argv[i]);
			world = (int)w;
		} else if ((!strcmp(a, "--link-gbps") || !strcmp(a, "--tflops") ||
			    !strcmp(a, "--hbm-tbps")) && has_next) {
			double v = parse_pos(argv[++i]);
			if (v < 0)
				return tool_usage_error(c, "expected a positive number, not "
						   "'%s'", argv[i]);
			*(a[2] == 'l' ? &link : a[2] == 't' ? &tflops : &hbm) = v;
		} else if (!strcmp(a, "--svg") && has_next) {
			svg = argv[++i];
		} else if (a[0] == '-' && a[1]) {
			return tool_usage_error(c, "unknown option or missing value: '%s'", a);
		} else if (file) {
			return tool_usage_error(c, "more than one FILE ('%s')", a);
		} else {
			file = a;
		}
	}
	if (!file)
		return tool_usage_error(c, "no FILE given%s", "");
	if (!world)
		return tool_usage_error(c, "--world N is required%s", "");
	fz_module *m = tool_load(file);
	if (!m)
		return EXIT_BAD;
	int rc = tool_check_world("sim", m, world);
	const fz_trace *t = fz_module_trace(m, 0);
	fz_program *p = NULL;
	sim_result r = {0};
	int64_t syms[FZ_MAX_SYMS];
	if (rc)
		goto out;
	tool_bind_symbols(t, binds, n_binds, syms);
	for (int s = 0; s < fz_trace_symbol_count(t); s++)
		if (syms[s] < 0)
			fprintf(stderr, "fusec sim: warning: symbol %s is unbound; taken as 1 "
				"(bind it with --bind)\n", fz_trace_symbol(t, s));
	po.sym_sizes = syms;
	if (trace_order) {
		po.comm_waits = po.comm_prefetch = po.comm_scatter = false;
		po.bucket_bytes = 0;
	}
	char *err = NULL;
	fz_status st = fz_plan(t, &po, &p, &err);
	if (st != FZ_OK) {
		fprintf(stderr, "fusec sim: %s\n", err ? err : fz_status_name(st));
		fz_free(err);
		rc = EXIT_BAD;
		goto out;
	}
	sim_model md = {world, link * 1e9, tflops * 1e12, hbm * 1e12};
	if (simulate(p, trace_order ? p->trace_order : p->order, &md, &r) < 0) {
		fprintf(stderr, "fusec sim: out of memory\n");
		rc = EXIT_BAD;
		goto out;
	}
	if (svg && (rc = write_svg(svg, p, &r, &md, trace_order)) != 0)
		goto out;
	if (json) {
		printf("{\"file\": ");
		tool_json_str(file);
		printf(", \"trace\": ");
		tool_json_str(fz_trace_name(t));
		printf(", \"world\": %d, \"order\": \"%s\", \"step_seconds\": %.9g, "
		       "\"compute_seconds\": %.9g, \"comm_seconds\": %.9g, "
		       "\"exposed_comm_seconds\": %.9g, \"peak_bytes\": %lld, "
		       "\"peak_unsharded_bytes\": %lld, \"regions\": %d, "
		       "\"collectives\": %d, \"buckets\": %d, \"link_gbps\": %g, "
		       "\"tflops\": %g, \"hbm_tbps\": %g, \"matmul_seconds\": %.9g, "
		       "\"kernel_seconds\": %.9g, \"matmul_flops\": %.6g}\n", world,
		       trace_order ? "trace" : "scheduled", r.step, r.compute, r.comm,
		       r.exposed, (long long)r.peak, (long long)r.peak_unsharded,
		       p->n_regions, fz_program_count(p, FZ_REGION_COLLECTIVE),
		       p->comm_buckets, link, tflops, hbm, r.matmul, r.kernel, r.flops);
	} else {
		printf("trace %s, world %d, %s\n", fz_trace_name(t), world,
		       trace_order ? "written order (no communication scheduling)" :
		       "communication scheduled");
		printf("  step            %10.3f ms\n", r.step * 1e3);
		printf("  compute         %10.3f ms (compute stream busy: %.3f ms in "
		       "matmuls, %.1f TFLOP; %.3f ms in kernels)\n", r.compute * 1e3,
		       r.matmul * 1e3, r.flops / 1e12, r.kernel * 1e3);
		printf("  communication   %10.3f ms (communication stream busy; %d "
		       "collective launches)\n", r.comm * 1e3,
		       fz_program_count(p, FZ_REGION_COLLECTIVE));
		printf("  exposed comm    %10.3f ms (%.1f%% of the step)\n",
		       r.exposed * 1e3, r.step > 0 ? 100 * r.exposed / r.step : 0.0);
		printf("  peak bytes      %10.3f GiB\n", (double)r.peak / (1 << 30));
		printf("  peak unsharded  %10.3f GiB (all-gathered, not yet released)\n",
		       (double)r.peak_unsharded / (1 << 30));
		if (svg)
			printf("  timeline        %s\n", svg);
	}
out:
	sim_result_free(&r);
	fz_program_free(p);
	fz_module_free(m);
	return rc;
}
