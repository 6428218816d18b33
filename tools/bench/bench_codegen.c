/*
 * bench_codegen.c: compile time per region of the code generator.
 *
 *     bench_codegen [--target sm_90|host] [--each] FILE...
 *
 * Every kernel region of every trace in the files is built as LLVM IR,
 * optimized (the pipeline of codegen.c) and emitted (PTX through NVPTX, or host code through ORC
 * with --target host), with symbolic extents left as kernel parameters, as
 * `fusec compile` would do for a cache. Reports, per file and over all,
 * the number of kernels and the median and 90th percentile of each stage
 * (IR build, optimization, emission) and of their sum, in milliseconds;
 * --each prints every kernel's times too. The goal is under 20 ms per
 * region.
 *
 * Measured (sm_90, a quiet 2-core machine, two runs each): the 32-layer
 * Llama took a median of 27-28 ms per region under default<O3> (opt 19,
 * emit 9); with the tailored pipeline of codegen.c it takes 11-14 ms (opt
 * 3-4, emit 8-10; p90 17-19), and the whole corpus plus that Llama 4.0-4.5
 * ms (was 8.0-8.2). The same kernels under default<O3> (FUSEC_CODEGEN_PASSES)
 * take 34-39 ms: the row kernels grew (float sums as pairs, rows unrolled
 * into registers), so O3 alone would have missed the goal further.
 *
 * The 32-layer Llama trace comes from tools/gen/llama.py:
 *     python3 tools/gen/llama.py --layers 32 -o /tmp/llama32.trace
 *     bench_codegen tests/traces/NAME.trace ... /tmp/llama32.trace
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "fusec.h"
#include "ir.h"

typedef struct sample {
	double build, opt, emit;
} sample;

typedef struct acc {
	fz_compiler *c;
	sample *s;
	int n, cap;
	bool each;
} acc;

static fz_status take(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	acc *a = ud;
	char *out = NULL;
	fz_status st;
	if (fz_compiler_options(a->c)->target == FZ_CG_NVPTX) {
		st = fz_kernel_ptx(a->c, k, &out, err);
		fz_free(out);
	} else {
		st = fz_kernel_jit(a->c, k, err);
	}
	if (st != FZ_OK)
		return st;
	if (a->n == a->cap) {
		a->cap = a->cap ? 2 * a->cap : 256;
		a->s = realloc(a->s, sizeof *a->s * (size_t)a->cap);
	}
	a->s[a->n++] = (sample){k->t_build, k->t_opt, k->t_emit};
	if (a->each)
		printf("  region %4d op %3d  %-8s build %6.2f  opt %6.2f  emit %6.2f ms\n",
		       r->id, op, k->sk == FZ_SK_ROW ? "rows" : k->sk == FZ_SK_SCATTER ?
		       "scatter" : "pointwise", k->t_build * 1e3, k->t_opt * 1e3,
		       k->t_emit * 1e3);
	return FZ_OK;
}

static int cmpd(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

static void report(const char *what, const sample *s, int n)
{
	if (!n) {
		printf("%-40s no kernels\n", what);
		return;
	}
	double *v[4];
	for (int j = 0; j < 4; j++)
		v[j] = malloc(sizeof(double) * (size_t)n);
	for (int i = 0; i < n; i++) {
		v[0][i] = s[i].build * 1e3;
		v[1][i] = s[i].opt * 1e3;
		v[2][i] = s[i].emit * 1e3;
		v[3][i] = v[0][i] + v[1][i] + v[2][i];
	}
	for (int j = 0; j < 4; j++)
		qsort(v[j], (size_t)n, sizeof(double), cmpd);
	printf("%-32s %5d kernels  median ms: build %6.2f  opt %6.2f  emit %6.2f  "
	       "total %6.2f   p90 total %6.2f\n", what, n, v[0][n / 2], v[1][n / 2],
	       v[2][n / 2], v[3][n / 2], v[3][n * 9 / 10]);
	for (int j = 0; j < 4; j++)
		free(v[j]);
}

int main(int argc, char **argv)
{
	const char *target = "sm_90";
	int first = 1;
	bool each = false;
	for (;;) {
		if (argc > first + 1 && !strcmp(argv[first], "--target")) {
			target = argv[first + 1];
			first += 2;
		} else if (argc > first && !strcmp(argv[first], "--each")) {
			each = true;
			first++;
		} else {
			break;
		}
	}
	if (first >= argc) {
		fprintf(stderr, "usage: bench_codegen [--target sm_90|host] [--each] FILE...\n");
		return 2;
	}
	fz_cg_options o;
	char *err = NULL;
	if (fz_cg_options_parse(target, &o, &err) != FZ_OK) {
		fprintf(stderr, "bench_codegen: %s\n", err);
		return 2;
	}
	acc all = {0};
	int rc = 0;
	for (int i = first; i < argc; i++) {
		fz_module *m = NULL;
		if (fz_module_parse_file(argv[i], &m, &err) != FZ_OK) {
			fprintf(stderr, "%s", err ? err : "parse error\n");
			fz_free(err);
			err = NULL;
			rc = 1;
			continue;
		}
		acc a = {0};
		a.each = each;
		if (fz_compiler_new(&o, &a.c, &err) != FZ_OK) {
			fprintf(stderr, "bench_codegen: %s\n", err);
			return 1;
		}
		for (int t = 0; t < fz_module_count(m); t++) {
			fz_status st = fz_compile_trace(a.c, fz_module_trace(m, t), NULL, -1,
							take, &a, &err);
			if (st != FZ_OK) {
				fprintf(stderr, "%s: %s\n", argv[i], err ? err : fz_status_name(st));
				fz_free(err);
				err = NULL;
				rc = 1;
			}
		}
		const char *base = strrchr(argv[i], '/');
		report(base ? base + 1 : argv[i], a.s, a.n);
		for (int k = 0; k < a.n; k++) {
			if (all.n == all.cap) {
				all.cap = all.cap ? 2 * all.cap : 256;
				all.s = realloc(all.s, sizeof *all.s * (size_t)all.cap);
			}
			all.s[all.n++] = a.s[k];
		}
		free(a.s);
		fz_compiler_free(a.c);
		fz_module_free(m);
	}
	report("ALL", all.s, all.n);
	free(all.s);
	return rc;
}
