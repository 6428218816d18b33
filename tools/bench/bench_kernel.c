/*
 * bench_kernel.c: one trace's per-call time on the CPU, outputs kept.
 *
 *     bench_kernel TRACE_FILE [CALLS]      (default 20)
 *
 * Runs the trace's first function through fz_exec_run CALLS times on the
 * same inputs and outputs (pseudo-random floats in [-2, 2), integers in
 * [0, 97): valid rows of any table of 97 or more), after two calls that
 * compile and warm up, and prints one JSON object: the calling thread's
 * CPU time and the wall time per call, fastest and median, in ms. With
 * FUSEC_THREADS=1 the kernels run in the calling thread, so the CPU time
 * leaves out the turns other processes take on a shared machine (cache
 * and memory contention stay in it): two builds compared by it, run
 * alternately a few times each (one builds tools/bench/bench_kernel), give
 * a codegen change's effect on a kernel where wall times on a loaded
 * machine would not. Unlike cpu_bench.py's `fusec` way no output is
 * allocated per call (no page faults) and no Python runs; unlike `fusec
 * run --iters` each call is timed on its own and the inputs are made once.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusec.h"

static double secs(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* pseudo-random element k of a buffer of dtype d */
static void fill(char *p, fz_dtype d, int64_t k, unsigned *s)
{
	*s = *s * 1664525u + 1013904223u;
	float f = ((float)(*s >> 8) / 16777216.0f - 0.5f) * 4;
	int64_t i = (*s >> 8) % 97;
	size_t es = fz_dtype_size(d);
	if (d == FZ_F32) {
		memcpy(p + k * 4, &f, 4);
	} else if (d == FZ_BF16) {
		unsigned u;
		memcpy(&u, &f, 4);
		unsigned short h = (unsigned short)(u >> 16);
		memcpy(p + k * 2, &h, 2);
	} else if (d == FZ_F64) {
		double x = f;
		memcpy(p + k * 8, &x, 8);
	} else if (d == FZ_I64) {
		memcpy(p + k * 8, &i, 8);
	} else if (d == FZ_I32) {
		int x = (int)i;
		memcpy(p + k * 4, &x, 4);
	} else {
		memset(p + k * es, 0, es);
	}
}

int main(int argc, char **argv)
{
	static const char usage[] =
		"usage: bench_kernel TRACE_FILE [CALLS]\n\n"
		"Runs the first trace of TRACE_FILE (concrete extents) CALLS times\n"
		"(default 20) on the CPU with the same inputs and outputs, after two\n"
		"warm-up calls, and prints one JSON object: the calling thread's CPU\n"
		"time and the wall time per call, fastest and median, in ms. Use\n"
		"FUSEC_THREADS=1 to keep the kernels in the calling thread.\n";
	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		fputs(usage, stdout);
		return 0;
	}
	if (argc < 2 || argc > 3) {
		fputs(usage, stderr);
		return 2;
	}
	char *end = NULL;
	long lc = argc > 2 ? strtol(argv[2], &end, 10) : 20;
	if (argc > 2 && (*end || lc < 1 || lc > 1000000)) {
		fprintf(stderr, "bench_kernel: CALLS must be a number from 1 to 1000000, not '%s'\n",
			argv[2]);
		return 2;
	}
	int calls = (int)lc;
	fz_module *m = NULL;
	char *err = NULL;
	if (fz_module_parse_file(argv[1], &m, &err) != FZ_OK) {
		fprintf(stderr, "%s\n", err ? err : "parse failed");
		return 1;
	}
	const fz_trace *t = fz_module_trace(m, 0);
	int ni = fz_trace_param_count(t), no = fz_trace_output_count(t);
	if (fz_trace_symbol_count(t)) {
		fprintf(stderr, "bench_kernel: a trace with concrete extents\n");
		return 2;
	}
	fz_tensor *in = calloc((size_t)ni + 1, sizeof *in), *out = calloc((size_t)no + 1, sizeof *out);
	unsigned seed = 12345;
	for (int i = 0; i < ni + no; i++) {
		fz_value *v = i < ni ? fz_trace_param(t, i) : fz_trace_output(t, i - ni);
		int64_t shape[FZ_MAX_RANK], n = 1;
		for (int d = 0; d < fz_value_rank(v); d++)
			n *= shape[d] = fz_value_extent(v, d, NULL);
		fz_dtype dt = fz_value_dtype(v);
		size_t bytes = (size_t)n * fz_dtype_size(dt);
		char *data = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
		if (!data) {
			fprintf(stderr, "bench_kernel: out of memory\n");
			return 1;
		}
		if (i < ni)
			for (int64_t k = 0; k < n; k++)
				fill(data, dt, k, &seed);
		else
			memset(data, 0, bytes);
		fz_tensor_contiguous(i < ni ? &in[i] : &out[i - ni], data, dt,
				     fz_value_rank(v), shape);
	}
	fz_exec_options o;
	fz_exec_options_init(&o);
	fz_exec *x;
	if (fz_exec_new(t, "cpu", &o, &x, &err) != FZ_OK ||
	    fz_exec_run(x, NULL, in, ni, out, no, NULL, &err) != FZ_OK ||
	    fz_exec_run(x, NULL, in, ni, out, no, NULL, &err) != FZ_OK) {
		fprintf(stderr, "bench_kernel: %s\n", err ? err : "failed");
		return 1;
	}
	double *c = malloc(sizeof *c * (size_t)calls), *w = malloc(sizeof *w * (size_t)calls);
	for (int k = 0; k < calls; k++) {
		double c0 = secs(CLOCK_THREAD_CPUTIME_ID), w0 = secs(CLOCK_MONOTONIC);
		fz_exec_run(x, NULL, in, ni, out, no, NULL, NULL);
		c[k] = secs(CLOCK_THREAD_CPUTIME_ID) - c0;
		w[k] = secs(CLOCK_MONOTONIC) - w0;
	}
	qsort(c, (size_t)calls, sizeof *c, cmp_d);
	qsort(w, (size_t)calls, sizeof *w, cmp_d);
	printf("{\"calls\": %d, \"cpu_min_ms\": %.3f, \"cpu_median_ms\": %.3f, "
	       "\"wall_min_ms\": %.3f, \"wall_median_ms\": %.3f}\n", calls, c[0] * 1e3,
	       c[calls / 2] * 1e3, w[0] * 1e3, w[calls / 2] * 1e3);
	free(c);
	free(w);
	fz_exec_free(x);
	fz_module_free(m);
	return 0;
}
