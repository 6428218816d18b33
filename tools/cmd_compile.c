/*
 * cmd_compile.c: `fusec compile`, a model's kernels into the cache ahead of
 * time.
 *
 *     fusec compile FILE... [--target sm_90|host|emu] [--bind B=8,T=2048]
 *                           [--cache-dir DIR] [--jobs N] [--no-cubin]
 *                           [--no-plan-cache] [--json]
 *
 * Every trace of every file is planned (or its program loaded from the
 * cache, cache/plan_cache.c, when it was planned before at these sizes);
 * each kernel region gets its
 * canonical form and key (cache/canon.c); regions with one key are
 * compiled once (the 32 layers of a Llama make a handful of keys, not
 * hundreds of kernels); keys already in the cache are hits; the rest are
 * compiled by --jobs threads, each with its own compiler (one LLVM context
 * per thread), and stored as they finish. For an sm_NN target the PTX is
 * also linked into a cubin where nvJitLink is installed, so a GPU machine
 * sharing the cache loads machine code with no JIT. No GPU is needed.
 *
 * Which kernels a program launches is decided by runtime/kernels.c, the
 * module `fusec run` and the library use, so with --bind at a run's sizes
 * the run compiles nothing: per-op kernels of regions the skeletons do not
 * take whole and copies of reshapes included. Without --bind the sizes are
 * unknown, so each kernel is made at both index widths (the run picks
 * 32-bit indexing when its sizes allow it). For the host target the entry
 * is a relocatable object for this CPU, the very code `fusec run --device
 * cpu` links.
 *
 * Planning and compiling overlap. The kernels of a planned trace are built
 * on a thread of their own (which runs the --jobs compile threads) while
 * the main thread parses and plans the next trace, so `fusec compile
 * step_fwd.trace step_bwd.trace` or a file of several traces compiles
 * trace k's kernels under trace k+1's planning. And when a trace's program
 * is not in the plan cache (a cold start), the compilers' one-time set-up
 * (LLVM's targets; nvJitLink, whose opening costs 10 to 20 ms, and ten
 * times that when the library is not in the page cache) is started on a
 * thread beside the planning, so that the first kernel does not wait for
 * it. A warm start, whose program comes from the plan cache, starts
 * neither: it compiles nothing.
 *
 *     main:     parse 1 | plan 1 | parse 2 | plan 2 |            (done)
 *     warm-up:           | jitlink, LLVM targets |
 *     kernels:                   | kernels of 1 ...... | kernels of 2 |
 *
 * A progress bar goes to stderr when it is a terminal. The report: kernel
 * regions, unique keys, compiled, cache hits, seconds (the whole command,
 * parsing and planning included); --json prints them as one object, with
 * plan_cache_hits and the seconds of each phase: parse, plan, kernels (keys,
 * lookups and compiling, wall, on the kernel thread: with several traces
 * it runs while the next is planned, so seconds < parse + plan + kernels),
 * warmup (the set-up thread, beside planning), and, summed over the
 * compile threads, llvm (IR and optimization), ptx (or the host object),
 * cubin and store.
 * Regions the code generator does not take (FZ_EUNSUPPORTED) are counted
 * and do not fail the command; any other failure does (exit 1), and so
 * does a compiled kernel that could not be stored (a read-only or full
 * cache, one entry's name taken by a directory, a cache directory that is
 * not ours): the report then says "NOT all stored", --json "stored":
 * false, and stderr why, since filling the cache is what compile is for.
 */
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "codegen.h"
#include "kernels.h"
#include "plan.h"
#include "tool.h"

static int cmd_compile(int argc, char **argv);

const fz_command fz_cmd_compile = {"compile", "compile a model's kernels into the cache",
	cmd_compile,
	 "usage: fusec compile FILE... [--target sm_90|host|emu] [--bind LIST]\n"
	 "                             [--cache-dir DIR] [--jobs N] [--no-cubin]\n"
	 "                             [--no-plan-cache] [--json]\n"
	 "\n"
	 "Plan every trace of the files and compile each distinct kernel region\n"
	 "(one per structural key) that the cache does not hold yet. Regions\n"
	 "that differ only in value names or in the order of independent\n"
	 "statements share a key, so identical layers compile once, and a second\n"
	 "run compiles nothing. Needs no GPU.\n"
	 "\n"
	 "  --target T       sm_70 ... sm_90 (PTX, plus a cubin where nvJitLink\n"
	 "                   is installed), or host (an object file for this\n"
	 "                   CPU, at both index widths, what `fusec run --device\n"
	 "                   cpu` links), or emu[-sm_NN] (the GPU's kernels as\n"
	 "                   objects for this CPU, what `fusec run --device emu`\n"
	 "                   links). Default sm_90\n"
	 "  --bind LIST      sizes of symbolic extents, NAME=SIZE[,NAME=SIZE...]:\n"
	 "                   the kernels a run at these sizes launches, so that\n"
	 "                   it compiles none (default: unbound, both index\n"
	 "                   widths)\n"
	 "  --cache-dir DIR  the cache (default $FUSEC_CACHE_DIR, else\n"
	 "                   $XDG_CACHE_HOME/fusec, else ~/.cache/fusec)\n"
	 "  --jobs N         compile N regions at once (default: the CPUs)\n"
	 "  --no-cubin       store PTX only, even where nvJitLink is installed\n"
	 "  --no-plan-cache  plan every trace afresh (by default a program\n"
	 "                   planned before at these sizes is loaded from the\n"
	 "                   cache, and a new one stored there)\n"
	 "  --json           one JSON object: regions, unique, compiled,\n"
	 "                   cache_hits, unsupported, failed, seconds, stored\n"
	 "                   (false: something compiled could not be stored),\n"
	 "                   target,\n"
	 "                   cubins, jobs, cache_dir, plan_cache_hits, and\n"
	 "                   phases: seconds of parse, plan, kernels (wall, on\n"
	 "                   a thread that runs while the next trace is\n"
	 "                   planned), warmup (compiler set-up beside the\n"
	 "                   planning of a cold start), and, summed over the\n"
	 "                   threads, llvm (IR and optimization), ptx (or the\n"
	 "                   host object), cubin, store\n"
	 "\n"
	 "The size cap is $FUSEC_CACHE_MAX_SIZE (default 2G). Exit status: 0 when\n"
	 "every region compiled or was found and is stored, 1 when one failed or\n"
	 "could not be stored, 2 usage.\n"};

static void on_warn(void *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "%s\n", msg);
}

static void progress_draw(void *ctx, int done, int total)
{
	(void)ctx;
	enum { W = 40 };
	int fill = total ? done * W / total : W;
	fprintf(stderr, "\rcompiling [");
	for (int i = 0; i < W; i++)
		fputc(i < fill ? '=' : i == fill ? '>' : ' ', stderr);
	fprintf(stderr, "] %d/%d", done, total);
	fflush(stderr);
}

/* ---- the kernel thread: trace k's kernels while trace k+1 is planned ---- */

typedef struct item {
	fz_program *prog;        /* a planned trace, or NULL: */
	fz_module *module;       /* a module whose traces are all built, to free */
	int64_t syms[FZ_MAX_SYMS];
	const char *file;
	struct item *next;
} item;

typedef struct pipeline {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	item *head, *tail;
	int queued;              /* items waiting */
	bool closed;             /* no more will come */
	bool failed;             /* a build failed: plan no more */
	fz_kctx *kx;             /* used by the kernel thread alone */
	bool progress;
	int failures;
	double kernels_s;        /* wall seconds in fz_kset_build */
} pipeline;

static void kernels_build(pipeline *q, item *it)
{
	if (it->prog && !q->failed) {
		fz_kset *ks = NULL;
		char *err = NULL;
		double tk = tool_now();
		fz_status st = fz_kset_build(q->kx, it->prog, it->syms, &ks, &err);
		q->kernels_s += tool_now() - tk;
		if (st != FZ_OK) {
			if (q->progress)
				fprintf(stderr, "\n");
			fprintf(stderr, "fusec compile: %s: trace %s: %s\n", it->file,
				fz_trace_name(it->prog->trace), err ? err : "failed");
			pthread_mutex_lock(&q->mu);
			q->failures++;
			q->failed = true;
			pthread_mutex_unlock(&q->mu);
		}
		free(err);
		fz_kset_free(ks);
	}
	fz_program_free(it->prog);
	fz_module_free(it->module);
	free(it);
}

static void *kernel_loop(void *arg)
{
	pipeline *q = arg;
	for (;;) {
		pthread_mutex_lock(&q->mu);
		while (!q->head && !q->closed)
			pthread_cond_wait(&q->cv, &q->mu);
		item *it = q->head;
		if (it) {
			q->head = it->next;
			if (!q->head)
				q->tail = NULL;
			q->queued--;
			pthread_cond_broadcast(&q->cv);
		}
		pthread_mutex_unlock(&q->mu);
		if (!it)
			return NULL;
		kernels_build(q, it);
	}
}

/* Queues it; waits while two planned traces are already waiting, so the
 * planner runs at most one trace ahead of the compilers' queue. */
static void pipeline_push(pipeline *q, item *it)
{
	pthread_mutex_lock(&q->mu);
	while (it->prog && q->queued >= 2)
		pthread_cond_wait(&q->cv, &q->mu);
	if (q->tail)
		q->tail->next = it;
	else
		q->head = it;
	q->tail = it;
	q->queued++;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

/* Waits until the queue is empty (only where no thread was started, the
 * queue is always empty). */
static void pipeline_drain(pipeline *q, bool threaded)
{
	if (!threaded)
		return;
	pthread_mutex_lock(&q->mu);
	while (q->queued)
		pthread_cond_wait(&q->cv, &q->mu);
	pthread_mutex_unlock(&q->mu);
}

static void pipeline_close(pipeline *q)
{
	pthread_mutex_lock(&q->mu);
	q->closed = true;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

static bool pipeline_failed(pipeline *q)
{
	pthread_mutex_lock(&q->mu);
	bool f = q->failed;
	pthread_mutex_unlock(&q->mu);
	return f;
}

/* ---- the compilers' set-up, beside the planning of a cold start ---- */

typedef struct warmup {
	fz_cg_options cg;
	bool cubins;
	bool started;
	pthread_t th;
	double seconds;          /* how long the set-up took, on its thread */
} warmup;

static void *warmup_run(void *arg)
{
	warmup *w = arg;
	double t0 = tool_now();
	if (w->cubins)
		fz_jitlink_available(); /* dlopen, once for the process */
	fz_compiler *c = NULL; /* LLVM's targets, initialized once */
	char *err = NULL;
	fz_compiler_new(&w->cg, &c, &err);
	fz_compiler_free(c);
	free(err);
	w->seconds = tool_now() - t0;
	return NULL;
}

/* fz_plan_cached_hook's on_plan: the first miss starts the set-up. */
static void warmup_start(void *ctx)
{
	warmup *w = ctx;
	if (w->started)
		return;
	w->started = pthread_create(&w->th, NULL, warmup_run, w) == 0;
}

static void warmup_join(warmup *w)
{
	if (w->started)
		pthread_join(w->th, NULL);
	w->started = false;
}

static int cmd_compile(int argc, char **argv)
{
	const fz_command *cmd = &fz_cmd_compile;
	double t0 = tool_now();
#ifdef __GLIBC__
	/* Buffers of a few megabytes (the file, the names, the forms) come
	 * from the heap and go back to it, not to the kernel: what parsing
	 * frees, the kernel keys reuse, instead of faulting in fresh pages (a
	 * thousand page faults of a warm start of a 32-layer step). */
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
	const char *target = "sm_90", *cache_dir = NULL;
	long jobs = sysconf(_SC_NPROCESSORS_ONLN);
	bool json = false, no_cubin = false, plan_cache = true;
	double parse_s = 0, plan_s = 0, kernels_s = 0;
	int plan_hits = 0;
	fz_build_times bt0;
	fz_cache_build_times(&bt0);
	tool_binding binds[FZ_MAX_SYMS];
	int n_binds = 0;
	const char **files = calloc((size_t)argc, sizeof *files);
	int n_files = 0;
	if (!files)
		return EXIT_BAD;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--json")) {
			json = true;
		} else if (!strcmp(a, "--no-cubin")) {
			no_cubin = true;
		} else if (!strcmp(a, "--no-plan-cache")) {
			plan_cache = false;
		} else if (!strcmp(a, "--target") || !strcmp(a, "--cache-dir") ||
			   !strcmp(a, "--jobs") || !strcmp(a, "-j") ||
			   !strcmp(a, "--bind")) {
			if (i + 1 >= argc) {
				free(files);
				return tool_usage_error(cmd, "%s needs a value", a);
			}
			const char *v = argv[++i];
			if (!strcmp(a, "--target")) {
				target = v;
			} else if (!strcmp(a, "--cache-dir")) {
				cache_dir = v;
			} else if (!strcmp(a, "--bind")) {
				if (tool_bind_option(cmd, v, binds, &n_binds)) {
					free(files);
					return EXIT_USAGE;
				}
			} else {
				char *end;
				errno = 0;
				jobs = strtol(v, &end, 10);
				if (*end || end == v || errno || jobs < 1 || jobs > 1024) {
					free(files);
					return tool_usage_error(cmd, "bad --jobs '%s'", v);
				}
			}
		} else if (a[0] == '-' && a[1]) {
			free(files);
			return tool_usage_error(cmd, "unknown option '%s'", a);
		} else {
			files[n_files++] = a;
		}
	}
	if (n_files == 0) {
		free(files);
		return tool_usage_error(cmd, "no trace file%s", "");
	}
	if (jobs < 1)
		jobs = 1;

	char *err = NULL;
	fz_cg_options cg;
	if (fz_cg_options_parse(target, &cg, &err) != FZ_OK) {
		int rc = tool_usage_error(cmd, "%s", err ? err : "bad target");
		free(err);
		free(files);
		return rc;
	}
	int rc = 0, failed = 0;
	fz_disk *disk = NULL;
	fz_kctx *kx = NULL;
	bool progress = isatty(2) && !json;
	fz_disk_options dopt = {cache_dir, 0, on_warn, NULL};
	if (fz_disk_open(&dopt, &disk, &err) != FZ_OK) {
		fprintf(stderr, "fusec compile: %s\n", err ? err : "out of memory");
		free(err);
		free(files);
		return EXIT_BAD;
	}
	bool want_cubins = cg.target == FZ_CG_NVPTX && !no_cubin;
	fz_kctx_options ko = {cg, disk, NULL, want_cubins, (int)jobs,
			      progress ? progress_draw : NULL, NULL};
	if (fz_kctx_new(&ko, &kx, &err) != FZ_OK) {
		fprintf(stderr, "fusec compile: %s\n", err ? err : "out of memory");
		rc = EXIT_BAD;
		goto done;
	}
	/* every trace planned at the bound sizes; its kernels through the one
	 * module `fusec run` uses (runtime/kernels.c), so a run at these sizes
	 * finds every kernel it launches; built on the kernel thread while
	 * the next trace is planned */
	pipeline q = {.kx = kx, .progress = progress,
		      .mu = PTHREAD_MUTEX_INITIALIZER,
		      .cv = PTHREAD_COND_INITIALIZER};
	warmup wu = {.cg = cg, .cubins = want_cubins};
	/* the kernel thread starts with a second trace to plan: one trace is
	 * planned and built on this thread, which keeps its malloc arena (a
	 * thread of its own would fault in fresh pages for all of it) */
	pthread_t kthread;
	bool kthread_ok = false;
	for (int f = 0; f < n_files && !rc && !pipeline_failed(&q); f++) {
		double tp = tool_now();
		fz_module *m = tool_load(files[f]);
		parse_s += tool_now() - tp;
		if (!m) {
			rc = EXIT_BAD;
			break;
		}
		int nt = fz_module_count(m);
		for (int i = 0; i < nt && !rc && !pipeline_failed(&q); i++) {
			const fz_trace *t = fz_module_trace(m, i);
			item *it = calloc(1, sizeof *it);
			if (!it) {
				rc = EXIT_BAD;
				break;
			}
			it->file = files[f];
			tool_bind_symbols(t, binds, n_binds, it->syms);
			fz_plan_options po;
			fz_plan_defaults(&po);
			po.sym_sizes = it->syms;
			bool hit = false;
			double tq = tool_now();
			fz_status st = fz_plan_cached_hook(plan_cache ? disk : NULL, t,
							   &po, warmup_start, &wu,
							   &it->prog, &hit, &err);
			plan_s += tool_now() - tq;
			plan_hits += hit;
			if (st != FZ_OK) {
				fprintf(stderr, "fusec compile: %s: trace %s: %s\n", files[f],
					fz_trace_name(t), err ? err : "failed");
				free(it);
				failed++;
				rc = EXIT_BAD;
				break;
			}
			bool last = f == n_files - 1 && i == nt - 1;
			if (!kthread_ok && !last)
				kthread_ok = pthread_create(&kthread, NULL, kernel_loop,
							    &q) == 0;
			if (!kthread_ok) { /* the only trace, or no thread */
				kernels_build(&q, it);
				continue;
			}
			pipeline_push(&q, it);
		}
		/* the module goes when its last trace's kernels are built */
		item *mi = kthread_ok ? calloc(1, sizeof *mi) : NULL;
		if (mi) {
			mi->module = m;
			pipeline_push(&q, mi);
		} else {
			pipeline_drain(&q, kthread_ok);
			fz_module_free(m);
		}
	}
	pipeline_close(&q);
	if (kthread_ok)
		pthread_join(kthread, NULL);
	warmup_join(&wu);
	kernels_s = q.kernels_s;
	failed += q.failures;
	if (q.failures)
		rc = EXIT_BAD;
	pthread_mutex_destroy(&q.mu);
	pthread_cond_destroy(&q.cv);
	if (progress)
		fprintf(stderr, "\n");
	for (int b = 0; b < n_binds; b++)
		if (!binds[b].used)
			fprintf(stderr, "fusec compile: warning: --bind %s: no trace has "
				"that symbol\n", binds[b].name);
	double secs = tool_now() - t0;
	const fz_kstats *ks = fz_kctx_stats(kx);
	const char *tname = fz_kctx_target(kx);
	/* whether this run built cubins for what it compiled; asked only when
	 * it compiled something, since opening nvJitLink costs more than a
	 * whole warm run */
	const char *cubins = !want_cubins || !ks->compiled ? "null"
			     : ks->cubins ? "true" : "false";
	/* the command's purpose is the cache: what it compiled and could
	 * not store (a read-only or full cache, one entry's name taken by a
	 * directory, a cache that is not ours) fails it */
	const char *why = NULL;
	uint64_t lost = fz_disk_not_stored(disk, &why);
	bool unstored = ks->compiled > 0 && (lost > 0 || !fz_disk_writable(disk));
	if (unstored) {
		if (!why)
			why = fz_disk_disabled(disk) ? fz_disk_disabled(disk) :
			      "storing is off";
		fprintf(stderr, "fusec compile: error: %s of the %d kernel key%s "
			"compiled could not be stored in the cache (%s); a run will "
			"compile %s again\n", fz_disk_writable(disk) ? "some" : "all or "
			"some", ks->compiled, ks->compiled == 1 ? "" : "s", why,
			ks->compiled == 1 ? "it" : "them");
		rc = EXIT_BAD;
	}
	if (ks->unsupported && !json)
		fprintf(stderr, "fusec compile: %d region key%s not taken whole by the "
			"code generator (they run per op, compiled too): %s\n",
			ks->unsupported, ks->unsupported == 1 ? "" : "s",
			fz_kctx_first_unsupported(kx) ? fz_kctx_first_unsupported(kx) : "?");
	if (json) {
		printf("{\"regions\": %d, \"unique\": %d, \"compiled\": %d, "
		       "\"cache_hits\": %d, \"unsupported\": %d, \"failed\": %d, "
		       "\"kernels\": %d, \"seconds\": %.4f, \"stored\": %s, "
		       "\"target\": ", ks->regions, ks->unique, ks->compiled,
		       ks->cache_hits, ks->unsupported, failed, ks->instances, secs,
		       unstored ? "false" : "true");
		tool_json_str(tname);
		printf(", \"cubins\": %s, \"jobs\": %ld, \"cache_dir\": ",
		       cubins, jobs);
		tool_json_str(fz_disk_disabled(disk) ? "" : fz_disk_path(disk));
		fz_build_times bt;
		fz_cache_build_times(&bt);
		printf(", \"plan_cache_hits\": %d, \"phases\": {\"parse\": %.4f, "
		       "\"plan\": %.4f, \"kernels\": %.4f, \"llvm\": %.4f, "
		       "\"ptx\": %.4f, \"cubin\": %.4f, \"store\": %.4f, "
		       "\"warmup\": %.4f}}\n",
		       plan_hits, parse_s, plan_s, kernels_s, bt.llvm - bt0.llvm,
		       bt.code - bt0.code, bt.cubin - bt0.cubin, bt.store - bt0.store,
		       wu.seconds);
	} else if (!rc) {
		printf("%d kernel regions, %d unique keys: %d compiled, %d cache hits",
		       ks->regions, ks->unique, ks->compiled, ks->cache_hits);
		if (ks->unsupported)
			printf(", %d run per op", ks->unsupported);
		printf(" (%s%s) in %.3f s\n", tname,
		       cubins[0] == 't' ? ", cubins" : cubins[0] == 'f' ? ", PTX only"
		       : "", secs);
	} else if (unstored) {
		printf("%d kernel regions, %d unique keys: %d compiled, NOT all stored, "
		       "%d cache hits (%s) in %.3f s\n", ks->regions, ks->unique,
		       ks->compiled, ks->cache_hits, tname, secs);
	}
done:
	free(err);
	fz_kctx_free(kx);
	fz_disk_close(disk);
	free(files);
	return rc;
}
