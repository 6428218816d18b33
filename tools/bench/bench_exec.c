/*
 * bench_exec.c: what a prepared program costs per call beyond its kernels.
 *
 *     bench_exec [TRACE_FILE] [--calls N] [--device cpu]
 *
 * A framework calls fz_exec_run once per op group per step, so the host
 * time around the kernels is what it pays thousands of times. This runs
 * one trace (default: z = x * y + 1 over 16 floats) through fz_exec_run N
 * times (default 100000), and calls the same prepared kernels directly,
 * through the target's launch with the same buffers, N times. Both are
 * timed in batches of 1000 calls; the report is the median per call of
 * each and their difference, the overhead (goal: at most 1 us).
 *
 * Only for a trace whose plan is kernels alone (no library calls): the
 * direct loop replays the kernel steps, nothing else.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "kernels.h"
#include "target.h"

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static const char *default_src =
	"trace f(x: f32[16], y: f32[16]) {\n"
	"  z = add(mul(x, y), 1.0)\n"
	"  return z\n"
	"}\n";

int main(int argc, char **argv)
{
	const char *file = NULL, *device = "cpu";
	long calls = 100000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--calls") && i + 1 < argc)
			calls = atol(argv[++i]);
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = argv[++i];
		else if (argv[i][0] != '-')
			file = argv[i];
		else {
			fprintf(stderr, "usage: bench_exec [TRACE_FILE] [--calls N] "
				"[--device D]\n");
			return 2;
		}
	}
	if (calls < 1000)
		calls = 1000;
	fz_module *m = NULL;
	char *err = NULL;
	fz_status st = file ? fz_module_parse_file(file, &m, &err)
		       : fz_module_parse(default_src, strlen(default_src), "<bench>",
					 &m, &err);
	if (st != FZ_OK) {
		fprintf(stderr, "%s\n", err ? err : "parse failed");
		return 1;
	}
	const fz_trace *t = fz_module_trace(m, 0);
	int n_in = fz_trace_param_count(t), n_out = fz_trace_output_count(t);
	fz_tensor in[16], out[16];
	memset(in, 0, sizeof in);
	memset(out, 0, sizeof out);
	if (n_in > 16 || n_out > 16 || fz_trace_symbol_count(t)) {
		fprintf(stderr, "bench_exec: a trace of at most 16 inputs and "
			"outputs, with concrete extents\n");
		return 2;
	}
	for (int i = 0; i < n_in + n_out; i++) {
		fz_value *v = i < n_in ? fz_trace_param(t, i) : fz_trace_output(t, i - n_in);
		int64_t shape[FZ_MAX_RANK], n = 1;
		for (int d = 0; d < fz_value_rank(v); d++)
			n *= shape[d] = fz_value_extent(v, d, NULL);
		size_t bytes = (size_t)n * fz_dtype_size(fz_value_dtype(v));
		void *data = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
		memset(data, 0, bytes);
		fz_tensor_contiguous(i < n_in ? &in[i] : &out[i - n_in], data,
				     fz_value_dtype(v), fz_value_rank(v), shape);
	}
	fz_exec_options o;
	fz_exec_options_init(&o);
	fz_exec *x;
	if (fz_exec_new(t, device, &o, &x, &err) != FZ_OK ||
	    fz_exec_run(x, NULL, in, n_in, out, n_out, NULL, &err) != FZ_OK) {
		fprintf(stderr, "bench_exec: %s\n", err ? err : "failed");
		return 1;
	}

	/* the same kernels, launched directly with the buffers a run binds */
	const fz_program *p = fz_exec_plan(x);
	const fz_target *tg = fz_target_find(fz_exec_device(x));
	fz_device *dev;
	fz_kctx *kx;
	fz_kset *ks;
	if (tg->open(&o, &dev, &err) != FZ_OK) {
		fprintf(stderr, "bench_exec: %s\n", err);
		return 1;
	}
	fz_kctx_options ko = {dev->cg, NULL, dev, false, 1, NULL, NULL};
	int64_t syms[1] = {0};
	if (fz_kctx_new(&ko, &kx, &err) != FZ_OK ||
	    fz_kset_build(kx, p, syms, &ks, &err) != FZ_OK) {
		fprintf(stderr, "bench_exec: %s\n", err ? err : "failed");
		return 1;
	}
	int nk = 0;
	const fz_kinst *ki[64];
	void *bufs[64][32];
	for (int i = 0; i < p->n_regions; i++) {
		const fz_region *r = p->regions[p->order[i]];
		if (r->kind == FZ_REGION_LIBRARY || r->kind == FZ_REGION_COLLECTIVE) {
			fprintf(stderr, "bench_exec: the trace must be kernels only\n");
			return 2;
		}
		if (!fz_region_is_kernel(r->kind) || nk == 64)
			continue;
		ki[nk] = ks->whole[r->id];
		for (int a = 0; a < ki[nk]->view.n_in + ki[nk]->view.n_out && a < 32; a++)
			bufs[nk][a] = aligned_alloc(64, 1 << 16);
		nk++;
	}
	int32_t flag = 0;
	long batches = calls / 1000;
	double *te = malloc(sizeof *te * (size_t)batches);
	double *tk = malloc(sizeof *tk * (size_t)batches);
	for (int rep = 0; rep < 2; rep++) /* the second pass is measured */
		for (long b = 0; b < batches; b++) {
			double t0 = fz_now();
			for (int c = 0; c < 1000; c++)
				fz_exec_run(x, NULL, in, n_in, out, n_out, NULL, NULL);
			double t1 = fz_now();
			for (int c = 0; c < 1000; c++)
				for (int k = 0; k < nk; k++)
					tg->launch(dev, &ki[k]->code->k, ki[k]->code->fn,
						   bufs[k], syms, &flag, NULL, NULL);
			double t2 = fz_now();
			te[b] = (t1 - t0) / 1000;
			tk[b] = (t2 - t1) / 1000;
		}
	qsort(te, (size_t)batches, sizeof *te, cmp_d);
	qsort(tk, (size_t)batches, sizeof *tk, cmp_d);
	double me = te[batches / 2], mk = tk[batches / 2];
	printf("{\"calls\": %ld, \"kernels\": %d, \"exec_run_us\": %.3f, "
	       "\"kernels_direct_us\": %.3f, \"overhead_us\": %.3f}\n",
	       batches * 1000, nk, me * 1e6, mk * 1e6, (me - mk) * 1e6);
	fz_kset_free(ks);
	fz_kctx_free(kx);
	fz_device_release(dev);
	fz_exec_free(x);
	fz_module_free(m);
	return 0;
}
