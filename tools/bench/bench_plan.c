/*
 * bench_plan.c: how long fz_plan takes, and how that grows with the trace.
 *
 *     bench_plan [--bind B=1,T=2048] [--reps N] FILE...
 *
 * For each file (one trace each), parses it once, then plans it N times
 * (default 5) and prints the op count, the regions, the median and best
 * wall time of one plan in milliseconds, and the best CPU time of the
 * planning thread (what a shared machine's other load disturbs least),
 * also per op in microseconds, so a
 * run over 8, 32 and 128 layers shows whether planning stays linear; then
 * the best time of each pass per op, to show which one grows, and the work
 * each pass counted (fz_program.pass_work: nodes, edges, heap and sort
 * steps) per op, which a noisy machine does not disturb.
 * tools/bench/plan_scaling.sh exports Llama-2-7B checkpointed steps of 8
 * to 128 layers and runs it on them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan.h"


/* CPU time of this thread: a busy machine's other work does not enter it */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* "B=1,T=2048" into sizes by symbol of t; -1 elsewhere. */
static void bind(const fz_trace *t, const char *spec, int64_t *sizes)
{
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		sizes[s] = -1;
	if (!spec)
		return;
	char *copy = strdup(spec), *save = NULL;
	for (char *tok = strtok_r(copy, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '=');
		if (!eq)
			continue;
		*eq = '\0';
		for (int s = 0; s < fz_trace_symbol_count(t); s++)
			if (!strcmp(fz_trace_symbol(t, s), tok))
				sizes[s] = atoll(eq + 1);
	}
	free(copy);
}

int main(int argc, char **argv)
{
	const char *spec = NULL;
	int reps = 5, rc = 0;
	printf("%-28s %8s %8s %8s %10s %10s %10s %12s\n", "file", "ops", "regions",
	       "kernels", "median ms", "best ms", "cpu best ms", "cpu us/op");
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--bind") && i + 1 < argc) {
			spec = argv[++i];
			continue;
		}
		if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			reps = atoi(argv[++i]);
			if (reps < 1)
				reps = 1;
			continue;
		}
		fz_module *m = NULL;
		char *diag = NULL;
		if (fz_module_parse_file(argv[i], &m, &diag) != FZ_OK) {
			fprintf(stderr, "%s", diag ? diag : "parse failed\n");
			fz_free(diag);
			rc = 1;
			continue;
		}
		const fz_trace *t = fz_module_trace(m, 0);
		int64_t sizes[FZ_MAX_SYMS];
		bind(t, spec, sizes);
		fz_plan_options o;
		fz_plan_defaults(&o);
		o.sym_sizes = sizes;
		double *ms = calloc((size_t)reps, sizeof *ms);
		double cpu_best = 0;
		double pass_best[FZ_PASS_COUNT];
		int64_t pass_work[FZ_PASS_COUNT] = {0};
		int regions = 0, kernels = 0;
		for (int r = 0; r < reps && ms; r++) {
			fz_program *p = NULL;
			double t0 = fz_now(), c0 = cpu_now();
			fz_status st = fz_plan(t, &o, &p, NULL);
			ms[r] = (fz_now() - t0) * 1e3;
			double c = (cpu_now() - c0) * 1e3;
			if (!r || c < cpu_best)
				cpu_best = c;
			if (st != FZ_OK) {
				fprintf(stderr, "%s: plan failed: %s\n", argv[i],
					fz_status_name(st));
				rc = 1;
				break;
			}
			for (int k = 0; k < FZ_PASS_COUNT; k++)
				if (!r || p->pass_seconds[k] < pass_best[k])
					pass_best[k] = p->pass_seconds[k];
			memcpy(pass_work, p->pass_work, sizeof pass_work);
			regions = p->n_regions;
			kernels = fz_program_kernels(p);
			fz_program_free(p);
		}
		if (ms) {
			qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
			const char *base = strrchr(argv[i], '/');
			int ops = fz_trace_op_count(t);
			printf("%-28s %8d %8d %8d %10.2f %10.2f %10.2f %12.3f\n",
			       base ? base + 1 : argv[i], ops, regions, kernels,
			       ms[reps / 2], ms[0], cpu_best,
			       cpu_best * 1e3 / (ops ? ops : 1));
			printf("  best per pass, us per op:");
			for (int k = 0; k < FZ_PASS_COUNT; k++)
				printf(" %s %.3f", fz_pass_names[k],
				       pass_best[k] * 1e6 / (ops ? ops : 1));
			printf("\n  work per op (nodes, edges, steps counted):");
			for (int k = 0; k < FZ_PASS_COUNT; k++)
				printf(" %s %.1f", fz_pass_names[k],
				       (double)pass_work[k] / (ops ? ops : 1));
			printf("\n");
		}
		free(ms);
		fz_module_free(m);
	}
	return rc;
}
