/*
 * bench_warm.c: where the time of a warm start goes, before any kernel is
 * loaded: parsing the trace, the program from the cache, and the kernel
 * keys (canonical forms) of its regions.
 *
 *     bench_warm [--cache-dir DIR] [--target sm_90] [--reps N] FILE
 *
 * The first round fills the cache (a miss plans and stores the program);
 * then N rounds (default 7) each parse the file, build the program's form
 * and hash, load the program (fz_plan_cached, which must hit), and key
 * every kernel region, both by canonicalizing each region (what fusec
 * compile did before) and through the cache (fz_program_canons). Prints
 * the best and the median of each phase in milliseconds. Run it under
 * `taskset -c 0,1` to see a two-core machine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../cache/cache.h"
#include "codegen.h"
#include "plan.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

enum { PH_PARSE, PH_FORM, PH_LOAD, PH_CANON, PH_CANON_CACHED, PH_TOTAL, PH_COUNT };
static const char *const ph_names[PH_COUNT] = {
	"parse", "plan form+hash", "plan load (hit)", "keys: canonicalize",
	"keys: cached", "parse+load+cached keys",
};

int main(int argc, char **argv)
{
	const char *dir = NULL, *target = "sm_90", *file = NULL;
	int reps = 7;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--cache-dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--target") && i + 1 < argc)
			target = argv[++i];
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
		else
			file = argv[i];
	}
	if (!file) {
		fprintf(stderr, "usage: bench_warm [--cache-dir DIR] [--target T] "
			"[--reps N] FILE\n");
		return 2;
	}
	char *err = NULL;
	fz_cg_options co;
	if (fz_cg_options_parse(target, &co, &err) != FZ_OK) {
		fprintf(stderr, "%s\n", err ? err : "bad target");
		return 2;
	}
	fz_disk_options dopt = {dir, 0, NULL, NULL};
	fz_disk *d = NULL;
	if (fz_disk_open(&dopt, &d, &err) != FZ_OK || fz_disk_disabled(d)) {
		fprintf(stderr, "no cache: %s\n", err ? err : fz_disk_disabled(d));
		return 1;
	}
	double *t[PH_COUNT];
	for (int k = 0; k < PH_COUNT; k++)
		t[k] = calloc((size_t)reps + 1, sizeof(double));
	int rc = 0, kernels = 0, ops = 0;
	for (int r = -1; r < reps && !rc; r++) {
		double t0 = now();
		fz_module *m = NULL;
		char *diag = NULL;
		if (fz_module_parse_file(file, &m, &diag) != FZ_OK) {
			fprintf(stderr, "%s", diag ? diag : "parse failed\n");
			return 1;
		}
		double t1 = now();
		const fz_trace *tr = fz_module_trace(m, 0);
		ops = fz_trace_op_count(tr);
		void *form = NULL;
		size_t len = 0;
		fz_plan_form(tr, NULL, &form, &len);
		(void)fz_key_of(form, len);
		free(form);
		double t2 = now();
		fz_program *p = NULL;
		bool hit = false;
		if (fz_plan_cached(d, tr, NULL, &p, &hit, &err) != FZ_OK) {
			fprintf(stderr, "plan: %s\n", err ? err : "?");
			return 1;
		}
		double t3 = now();
		if (r >= 0 && !hit) {
			fprintf(stderr, "the program was not found in the cache\n");
			rc = 1;
		}
		kernels = 0;
		char tname[160];
		fz_cache_target(&co, tname, sizeof tname);
		for (int i = 0; i < p->n_regions; i++) {
			const fz_region *R = p->regions[i];
			if (!fz_region_is_kernel(R->kind))
				continue;
			uint8_t spec[2 + 256];
			fz_key_params kp;
			fz_key_params_init(&kp, tname, FZ_CODEGEN_VERSION);
			kp.spec = spec;
			kp.n_spec = fz_cache_spec(&co, R, spec, sizeof spec);
			fz_canon *cn = NULL;
			if (fz_canon_region(tr, R, &kp, &cn, &err) != FZ_OK)
				rc = 1;
			fz_canon_free(cn);
			kernels++;
		}
		double t4 = now();
		fz_canon **cs = NULL;
		bool khit = false;
		if (fz_program_canons(d, p, &co, &cs, &khit, &err) != FZ_OK) {
			fprintf(stderr, "keys: %s\n", err ? err : "?");
			rc = 1;
		}
		double t5 = now();
		if (r >= 0 && !khit) {
			fprintf(stderr, "the kernel keys were not found in the cache\n");
			rc = 1;
		}
		fz_program_canons_free(p, cs);
		if (r >= 0) {
			t[PH_PARSE][r] = t1 - t0;
			t[PH_FORM][r] = t2 - t1;
			t[PH_LOAD][r] = t3 - t2;
			t[PH_CANON][r] = t4 - t3;
			t[PH_CANON_CACHED][r] = t5 - t4;
			t[PH_TOTAL][r] = (t1 - t0) + (t3 - t2) + (t5 - t4);
		}
		fz_program_free(p);
		fz_module_free(m);
	}
	printf("%s: %d ops, %d kernel regions, %s\n", file, ops, kernels, target);
	for (int k = 0; k < PH_COUNT; k++) {
		qsort(t[k], (size_t)reps, sizeof(double), cmp_double);
		printf("  %-24s best %8.2f ms  median %8.2f ms\n", ph_names[k],
		       t[k][0] * 1e3, t[k][reps / 2] * 1e3);
		free(t[k]);
	}
	fz_disk_close(d);
	free(err);
	return rc;
}
