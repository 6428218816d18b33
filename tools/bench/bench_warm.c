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
 * the best and the median of each phase in milliseconds, and the best CPU
 * time of the process in it (robust to a busy machine). Run it under
 * `taskset -c 0,1` to see a two-core machine.
 *
 * With --exec DEVICE, each round also times a prepared program's set-up
 * (fz_exec_new and fz_exec_prepare: the program from the cache, the
 * kernels resolved and loaded, the arena mapped; the arena comes from an
 * mmap that nothing touches, so a 14 GB plan costs no memory), as `fusec
 * run` and the PyTorch bridge do it before their first step. The kernels
 * must be in the cache already (`fusec compile --target host` for cpu).
 * A trace with symbolic extents is prepared with every symbol at 1.
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../cache/cache.h"
#include "codegen.h"
#include "exec.h"
#include "plan.h"


/* CPU time of the process: what a shared machine's other load does not
 * inflate (a phase that waits on threads or the disk shows less here) */
static double cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

enum { PH_PARSE, PH_FORM, PH_LOAD, PH_CANON, PH_CANON_CACHED, PH_TOTAL,
       PH_EXEC, PH_COUNT };
static const char *const ph_names[PH_COUNT] = {
	"parse", "plan form+hash", "plan load (hit)", "keys: canonicalize",
	"keys: cached", "parse+load+cached keys", "exec set-up (--exec)",
};

static void *map_arena(void *ctx, size_t bytes)
{
	(void)ctx;
	void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static size_t mapped;
static void *map_arena_sized(void *ctx, size_t bytes)
{
	mapped = bytes;
	return map_arena(ctx, bytes);
}

static void unmap_arena(void *ctx, void *p)
{
	(void)ctx;
	munmap(p, mapped ? mapped : 1);
}

int main(int argc, char **argv)
{
	const char *dir = NULL, *target = "sm_90", *file = NULL, *exec_dev = NULL;
	int reps = 7;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--cache-dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--target") && i + 1 < argc)
			target = argv[++i];
		else if (!strcmp(argv[i], "--exec") && i + 1 < argc)
			exec_dev = argv[++i];
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
	double *t[PH_COUNT], *c[PH_COUNT];
	for (int k = 0; k < PH_COUNT; k++) {
		t[k] = calloc((size_t)reps + 1, sizeof(double));
		c[k] = calloc((size_t)reps + 1, sizeof(double));
	}
	int rc = 0, kernels = 0, ops = 0;
	for (int r = -1; r < reps && !rc; r++) {
		double c0 = cpu(), t0 = fz_now();
		fz_module *m = NULL;
		char *diag = NULL;
		if (fz_module_parse_file(file, &m, &diag) != FZ_OK) {
			fprintf(stderr, "%s", diag ? diag : "parse failed\n");
			return 1;
		}
		double t1 = fz_now(), c1 = cpu();
		const fz_trace *tr = fz_module_trace(m, 0);
		ops = fz_trace_op_count(tr);
		void *form = NULL;
		size_t len = 0;
		fz_plan_form(tr, NULL, &form, &len);
		(void)fz_key_of(form, len);
		free(form);
		double t2 = fz_now(), c2 = cpu();
		fz_program *p = NULL;
		bool hit = false;
		if (fz_plan_cached(d, tr, NULL, &p, &hit, &err) != FZ_OK) {
			fprintf(stderr, "plan: %s\n", err ? err : "?");
			return 1;
		}
		double t3 = fz_now(), c3 = cpu();
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
			fz_canon *cn = NULL;
			if (fz_cache_canon(tr, R, &co, tname, &cn, &err) != FZ_OK)
				rc = 1;
			fz_canon_free(cn);
			kernels++;
		}
		double t4 = fz_now(), c4 = cpu();
		fz_canon **cs = NULL;
		bool khit = false;
		if (fz_program_canons(d, p, &co, &cs, &khit, &err) != FZ_OK) {
			fprintf(stderr, "keys: %s\n", err ? err : "?");
			rc = 1;
		}
		double t5 = fz_now(), c5 = cpu();
		if (r >= 0 && !khit) {
			fprintf(stderr, "the kernel keys were not found in the cache\n");
			rc = 1;
		}
		fz_program_canons_free(p, cs);
		double t6 = fz_now(), t7 = t6, c6 = cpu(), c7 = c6;
		if (exec_dev) {
			fz_exec_options eo;
			fz_exec_options_init(&eo);
			eo.cache_dir = dir;
			eo.alloc = map_arena_sized;
			eo.release = unmap_arena;
			/* the inputs' shapes, as a step would bind them (concrete
			 * sizes: the parameters' own; no data is read) */
			int np = tr->n_params;
			fz_tensor *in = calloc((size_t)np + 1, sizeof *in);
			int64_t one[FZ_MAX_SYMS];
			for (int k = 0; k < FZ_MAX_SYMS; k++)
				one[k] = 1;
			for (int k = 0; in && k < np; k++) {
				const fz_value *v = tr->params[k];
				int64_t shape[FZ_MAX_RANK];
				for (int d = 0; d < v->type.rank; d++)
					shape[d] = fz_ext_eval(v->type.dims[d], one);
				fz_tensor_contiguous(&in[k], NULL, v->type.dtype,
						     v->type.rank, shape);
			}
			fz_exec *x = NULL;
			if (!in || fz_exec_new(tr, exec_dev, &eo, &x, &err) != FZ_OK ||
			    fz_exec_prepare(x, NULL, in, np, &err) != FZ_OK) {
				fprintf(stderr, "exec: %s\n", err ? err : "?");
				rc = 1;
			} else if (r >= 0 && fz_exec_stats_of(x)->k.compiled) {
				fprintf(stderr, "exec: %d kernels compiled: the cache "
					"lacks them\n", fz_exec_stats_of(x)->k.compiled);
				rc = 1;
			}
			t7 = fz_now();
			c7 = cpu();
			fz_exec_free(x);
			free(in);
		}
		if (r >= 0) {
			t[PH_EXEC][r] = t7 - t6;
			c[PH_EXEC][r] = c7 - c6;
			c[PH_PARSE][r] = c1 - c0;
			c[PH_FORM][r] = c2 - c1;
			c[PH_LOAD][r] = c3 - c2;
			c[PH_CANON][r] = c4 - c3;
			c[PH_CANON_CACHED][r] = c5 - c4;
			c[PH_TOTAL][r] = (c1 - c0) + (c3 - c2) + (c5 - c4);
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
		if (k == PH_EXEC && !exec_dev)
			break;
		qsort(t[k], (size_t)reps, sizeof(double), cmp_double);
		qsort(c[k], (size_t)reps, sizeof(double), cmp_double);
		printf("  %-24s best %8.2f ms  median %8.2f ms  cpu best %8.2f ms\n",
		       ph_names[k], t[k][0] * 1e3, t[k][reps / 2] * 1e3, c[k][0] * 1e3);
	}
	for (int k = 0; k < PH_COUNT; k++) {
		free(t[k]);
		free(c[k]);
	}
	fz_disk_close(d);
	free(err);
	return rc;
}
