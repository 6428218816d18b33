/*
 * cmd_compile.c: `fusec compile`, a model's kernels into the cache ahead of
 * time.
 *
 *     fusec compile FILE... [--target sm_90|host] [--cache-dir DIR]
 *                           [--jobs N] [--no-cubin] [--json]
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
 * For the host target the entry is a relocatable object for this CPU, the
 * very code `fusec run --device cpu` links, and each region is compiled at
 * both index widths: the runner picks 32-bit indexing when the bound sizes
 * allow it, which only the run knows, so both are made and a warm run
 * compiles nothing whatever it binds.
 *
 * A progress bar goes to stderr when it is a terminal. The report: kernel
 * regions, unique keys, compiled, cache hits, seconds (the whole command,
 * parsing and planning included); --json prints them as one object, with
 * the seconds of each phase (parse, plan, keys, lookup, compile, and the
 * compile's llvm, ptx, cubin and store summed over its threads).
 * Regions the code generator does not take (FZ_EUNSUPPORTED) are counted
 * and do not fail the command; any other failure does (exit 1).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cache/cache.h"
#include "codegen.h"
#include "plan.h"
#include "tool.h"

static int cmd_compile(int argc, char **argv);

const fz_command fz_cmd_compile = {"compile", "compile a model's kernels into the cache",
	cmd_compile,
	 "usage: fusec compile FILE... [--target sm_90|host] [--cache-dir DIR]\n"
	 "                             [--jobs N] [--no-cubin] [--no-plan-cache]\n"
	 "                             [--json]\n"
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
	 "                   cpu` links). Default sm_90\n"
	 "  --cache-dir DIR  the cache (default $FUSEC_CACHE_DIR, else\n"
	 "                   $XDG_CACHE_HOME/fusec, else ~/.cache/fusec)\n"
	 "  --jobs N         compile N regions at once (default: the CPUs)\n"
	 "  --no-cubin       store PTX only, even where nvJitLink is installed\n"
	 "  --no-plan-cache  plan every trace afresh (by default a program\n"
	 "                   planned before at these sizes is loaded from the\n"
	 "                   cache, and a new one stored there)\n"
	 "  --json           one JSON object: regions, unique, compiled,\n"
	 "                   cache_hits, unsupported, failed, seconds, target,\n"
	 "                   cubins, jobs, cache_dir, plan_cache_hits, and\n"
	 "                   phases: seconds of parse, plan, keys (canonical\n"
	 "                   forms), lookup, compile (wall), and, summed over\n"
	 "                   the threads, llvm (IR and optimization), ptx (or\n"
	 "                   the host object), cubin, store\n"
	 "\n"
	 "The size cap is $FUSEC_CACHE_MAX_SIZE (default 2G). Exit status: 0 when\n"
	 "every region compiled or was found, 1 when one failed, 2 usage.\n"};

typedef struct job {
	const fz_trace *t;
	const fz_region *r;
	fz_canon *cn;
	bool idx32;      /* compiled with 32-bit indexing */
} job;

/*
 * The workers. Jobs arrive while the main thread still parses, plans and
 * keys the traces after the first (queued as each trace's kernels are
 * known), so compiling overlaps planning; the workers start with the first
 * job, and a warm run starts none. A worker takes the largest job waiting
 * (by the region's ops, a fair proxy for the PTX nvJitLink will chew on),
 * so the long kernels start first and the run does not end on one of them
 * alone. closed: no more jobs will come.
 */
typedef struct pool {
	job *jobs;
	int n, cap, done, waiting;
	bool closed;
	pthread_cond_t more;
	int compiled, unsupported, failed, cubins;
	double llvm_s, code_s, cubin_s, store_s; /* summed over the workers */
	char *first_unsupported, *first_error, *cubin_error;
	pthread_mutex_t mu;
	fz_cg_options o;
	fz_disk *disk;
	bool want_cubins, progress;
} pool;

static void progress_draw(pool *p)
{
	enum { W = 40 };
	int fill = p->n ? p->done * W / p->n : W;
	fprintf(stderr, "\rcompiling [");
	for (int i = 0; i < W; i++)
		fputc(i < fill ? '=' : i == fill ? '>' : ' ', stderr);
	fprintf(stderr, "] %d/%d", p->done, p->n);
	fflush(stderr);
}

/* Under p->mu: the largest job waiting, removed from the queue (jobs[done
 * + taken .. n) wait; a taken job moves to the front). -1 if none. */
static int take_job(pool *p, job *out)
{
	int first = p->n - p->waiting, best = -1;
	for (int i = first; i < p->n; i++)
		if (best < 0 || p->jobs[i].r->n_nodes > p->jobs[best].r->n_nodes)
			best = i;
	if (best < 0)
		return -1;
	job tmp = p->jobs[first];
	p->jobs[first] = p->jobs[best];
	p->jobs[best] = tmp;
	p->waiting--;
	*out = p->jobs[first];
	return first;
}

static void *worker(void *arg)
{
	pool *p = arg;
	fz_compiler *cs[2] = {NULL, NULL}; /* by index width, made when needed */
	char *err = NULL;
	for (;;) {
		job jb, *j = &jb;
		pthread_mutex_lock(&p->mu);
		while (!p->waiting && !p->closed)
			pthread_cond_wait(&p->more, &p->mu);
		int i = take_job(p, &jb);
		pthread_mutex_unlock(&p->mu);
		if (i < 0)
			break;
		fz_build_info info = {0};
		char *jerr = NULL;
		fz_status st = FZ_OK;
		if (!cs[j->idx32]) {
			fz_cg_options o = p->o;
			o.idx32 = j->idx32;
			free(err);
			err = NULL;
			st = fz_compiler_new(&o, &cs[j->idx32], &err);
		}
		fz_compiler *c = cs[j->idx32];
		if (st == FZ_OK)
			st = fz_cache_build(c, p->disk, j->t, j->r, j->cn, p->want_cubins,
					    &info, &jerr);
		else
			jerr = fz_strdup(err ? err : "cannot create a compiler");
		pthread_mutex_lock(&p->mu);
		p->done++;
		p->llvm_s += info.llvm_seconds;
		p->code_s += info.code_seconds;
		p->cubin_s += info.cubin_seconds;
		p->store_s += info.store_seconds;
		if (st == FZ_OK) {
			p->compiled++;
			p->cubins += info.cubin;
		} else if (st == FZ_EUNSUPPORTED) {
			p->unsupported++;
			if (!p->first_unsupported) {
				p->first_unsupported = jerr;
				jerr = NULL;
			}
		} else {
			p->failed++;
			if (!p->first_error) {
				p->first_error = jerr;
				jerr = NULL;
			}
		}
		if (info.cubin_error && !p->cubin_error) {
			p->cubin_error = info.cubin_error;
			info.cubin_error = NULL;
		}
		if (p->progress)
			progress_draw(p);
		pthread_mutex_unlock(&p->mu);
		free(info.cubin_error);
		free(jerr);
	}
	fz_compiler_free(cs[0]);
	fz_compiler_free(cs[1]);
	free(err);
	return NULL;
}

/* The LRU as a set of canonical forms: one job per distinct form. */
static uint64_t canon_hash(const void *k)
{
	return ((const fz_canon *)k)->key.lo;
}

static bool canon_eq(const void *a, const void *b)
{
	const fz_canon *x = a, *y = b;
	return fz_key_eq(x->key, y->key) && x->len == y->len &&
	       !memcmp(x->text, y->text, x->len);
}

static void on_warn(void *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "%s\n", msg);
}

static int cmd_compile(int argc, char **argv)
{
	const fz_command *cmd = &fz_cmd_compile;
	double t0 = tool_now();
	const char *target = "sm_90", *cache_dir = NULL;
	long jobs = sysconf(_SC_NPROCESSORS_ONLN);
	bool json = false, no_cubin = false, plan_cache = true;
	double parse_s = 0, plan_s = 0, keys_s = 0, lookup_s = 0, compile_s = 0;
	int plan_hits = 0;
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
			   !strcmp(a, "--jobs") || !strcmp(a, "-j")) {
			if (i + 1 >= argc) {
				free(files);
				return tool_usage_error(cmd, "%s needs a value", a);
			}
			const char *v = argv[++i];
			if (!strcmp(a, "--target")) {
				target = v;
			} else if (!strcmp(a, "--cache-dir")) {
				cache_dir = v;
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

	pool p;
	memset(&p, 0, sizeof p);
	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.more, NULL);
	char *err = NULL;
	if (fz_cg_options_parse(target, &p.o, &err) != FZ_OK) {
		int rc = tool_usage_error(cmd, "%s", err ? err : "bad target");
		free(err);
		free(files);
		return rc;
	}
	char tname[160];
	fz_cache_target(&p.o, tname, sizeof tname);

	int rc = 0, regions = 0, hits = 0, n_mods = 0, n_progs = 0, cap_progs = 0;
	fz_module **mods = calloc((size_t)n_files, sizeof *mods);
	fz_program **progs = NULL;
	job *canons = NULL;            /* every kernel region's form, per width */
	int n_canons = 0, cap_canons = 0;
	fz_lru *unique = NULL;
	fz_disk *disk = NULL;
	fz_disk_options dopt = {cache_dir, 0, on_warn, NULL};
	fz_lru_ops ops = {canon_hash, canon_eq, NULL};
	pthread_t th[1024];
	int started = 0, n_unique = 0;
	double tc = 0;
	if (!mods || fz_disk_open(&dopt, &disk, &err) != FZ_OK ||
	    fz_lru_new((size_t)1 << 16, &ops, NULL, &unique) != FZ_OK) {
		fprintf(stderr, "fusec compile: %s\n", err ? err : "out of memory");
		rc = EXIT_BAD;
		goto done;
	}
	p.disk = disk;
	p.want_cubins = p.o.target == FZ_CG_NVPTX && !no_cubin;
	p.progress = isatty(2) && !json;

	/* plan every trace; a canonical form per kernel region */
	for (int f = 0; f < n_files && !rc; f++) {
		double tp = tool_now();
		fz_module *m = tool_load(files[f]);
		parse_s += tool_now() - tp;
		if (!m) {
			rc = EXIT_BAD;
			break;
		}
		mods[n_mods++] = m;
		for (int i = 0; i < fz_module_count(m) && !rc; i++) {
			const fz_trace *t = fz_module_trace(m, i);
			fz_plan_options po;
			fz_plan_defaults(&po);
			fz_program *prog = NULL;
			bool hit = false;
			int first_canon = n_canons;
			double tq = tool_now();
			fz_status pst = fz_plan_cached(plan_cache ? disk : NULL, t, &po,
						       &prog, &hit, &err);
			plan_s += tool_now() - tq;
			plan_hits += hit;
			if (pst != FZ_OK) {
				fprintf(stderr, "fusec compile: %s: trace %s: %s\n", files[f],
					fz_trace_name(t), err ? err : "planning failed");
				rc = EXIT_BAD;
				break;
			}
			if (n_progs == cap_progs) {
				cap_progs = cap_progs ? 2 * cap_progs : 8;
				fz_program **np = realloc(progs, sizeof *np * (size_t)cap_progs);
				if (!np) {
					fz_program_free(prog);
					rc = EXIT_BAD;
					break;
				}
				progs = np;
			}
			progs[n_progs++] = prog;
			double tk = tool_now();
			/* the host: both index widths (the run picks one) */
			int widths = p.o.target == FZ_CG_HOST ? 2 : 1;
			for (int w = 0; w < widths && !rc; w++) {
				fz_cg_options o = p.o;
				o.idx32 = w == 1;
				fz_canon **cs = NULL;
				if (fz_program_canons(plan_cache ? disk : NULL, prog, &o, &cs,
						      NULL, &err) != FZ_OK) {
					fprintf(stderr, "fusec compile: %s: trace %s: %s\n",
						files[f], fz_trace_name(t),
						err ? err : "cannot key the kernels");
					rc = EXIT_BAD;
					break;
				}
				for (int r = 0; r < prog->n_regions; r++) {
					if (!cs[r])
						continue;
					if (n_canons == cap_canons) {
						cap_canons = cap_canons ? 2 * cap_canons : 64;
						job *nc = realloc(canons, sizeof *nc * (size_t)cap_canons);
						if (!nc) {
							rc = EXIT_BAD;
							break;
						}
						canons = nc;
					}
					if (w == 0)
						regions++;
					canons[n_canons++] = (job){t, prog->regions[r], cs[r],
								   o.idx32};
					cs[r] = NULL; /* the job owns it now */
				}
				fz_program_canons_free(prog, cs);
			}
			keys_s += tool_now() - tk;
			/* this trace's distinct forms the cache lacks go to the
			 * workers at once, while the next trace is planned */
			double tl = tool_now();
			for (int k = first_canon; k < n_canons && !rc; k++) {
				fz_canon *cn = canons[k].cn;
				if (fz_lru_get(unique, cn))
					continue;
				fz_lru_put(unique, cn, cn);
				n_unique++;
				fz_entry *e = NULL;
				fz_disk_lookup(disk, cn->key, cn->text, cn->len, &e);
				/* an entry without this target's payload (an older
				 * host entry) is compiled again and replaced */
				bool usable = e && fz_cache_usable(e, &p.o);
				fz_entry_free(e);
				if (usable) {
					hits++;
					continue;
				}
				pthread_mutex_lock(&p.mu);
				if (p.n == p.cap) {
					int nc = p.cap ? 2 * p.cap : 64;
					job *nj = realloc(p.jobs, sizeof *nj * (size_t)nc);
					if (nj) {
						p.jobs = nj;
						p.cap = nc;
					}
				}
				if (p.n < p.cap) {
					p.jobs[p.n++] = canons[k];
					p.waiting++;
					pthread_cond_signal(&p.more);
				} else {
					rc = EXIT_BAD;
				}
				pthread_mutex_unlock(&p.mu);
				/* the first job starts the workers; this thread
				 * joins them when it has keyed everything */
				if (p.n == 1 && !started) {
					tc = tool_now();
					for (long w = 1; w < jobs; w++)
						if (pthread_create(&th[started], NULL, worker,
								   &p) == 0)
							started++;
				}
			}
			lookup_s += tool_now() - tl;
		}
	}
	pthread_mutex_lock(&p.mu);
	p.closed = true;
	pthread_cond_broadcast(&p.more);
	pthread_mutex_unlock(&p.mu);
	if (!rc && p.n > 0)
		worker(&p);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (p.n > 0)
		compile_s = tool_now() - tc;
	if (rc)
		goto done;
	if (jobs > p.n)
		jobs = p.n > 0 ? p.n : 1;
	if (p.progress && p.n)
		fprintf(stderr, "\n");
	double secs = tool_now() - t0;
	/* whether this run built cubins for what it compiled; asked only when
	 * it compiled something, since opening nvJitLink costs more than a
	 * whole warm run */
	const char *cubins = !p.want_cubins || !p.compiled ? "null"
			     : p.cubins ? "true" : "false";
	if (p.failed) {
		fprintf(stderr, "fusec compile: %d region%s failed: %s\n", p.failed,
			p.failed == 1 ? "" : "s", p.first_error ? p.first_error : "?");
		rc = EXIT_BAD;
	}
	if (p.unsupported && !json)
		fprintf(stderr, "fusec compile: %d region%s not taken by the code "
			"generator (they run per op): %s\n", p.unsupported,
			p.unsupported == 1 ? "" : "s",
			p.first_unsupported ? p.first_unsupported : "?");
	if (p.cubin_error && !json)
		fprintf(stderr, "fusec compile: no cubin: %s\n", p.cubin_error);
	if (json) {
		printf("{\"regions\": %d, \"unique\": %d, \"compiled\": %d, "
		       "\"cache_hits\": %d, \"unsupported\": %d, \"failed\": %d, "
		       "\"seconds\": %.4f, \"target\": ", regions, n_unique, p.compiled,
		       hits, p.unsupported, p.failed, secs);
		tool_json_str(tname);
		printf(", \"cubins\": %s, \"jobs\": %ld, \"cache_dir\": ",
		       cubins, jobs);
		tool_json_str(fz_disk_disabled(disk) ? "" : fz_disk_path(disk));
		printf(", \"plan_cache_hits\": %d, \"phases\": {\"parse\": %.4f, "
		       "\"plan\": %.4f, \"keys\": %.4f, \"lookup\": %.4f, "
		       "\"compile\": %.4f, \"llvm\": %.4f, \"ptx\": %.4f, "
		       "\"cubin\": %.4f, \"store\": %.4f}}\n", plan_hits, parse_s,
		       plan_s, keys_s, lookup_s, compile_s, p.llvm_s, p.code_s,
		       p.cubin_s, p.store_s);
	} else {
		printf("%d kernel regions, %d unique keys: %d compiled, %d cache hits",
		       regions, n_unique, p.compiled, hits);
		if (p.unsupported)
			printf(", %d unsupported", p.unsupported);
		printf(" (%s%s) in %.3f s\n", tname,
		       cubins[0] == 't' ? ", cubins" : cubins[0] == 'f' ? ", PTX only"
		       : "", secs);
	}
done:
	free(err);
	fz_lru_free(unique);
	fz_disk_close(disk);
	for (int i = 0; i < n_canons; i++)
		fz_canon_free(canons[i].cn);
	free(canons);
	for (int i = 0; i < n_progs; i++)
		fz_program_free(progs[i]);
	free(progs);
	for (int i = 0; i < n_mods; i++)
		fz_module_free(mods[i]);
	free(mods);
	free(files);
	free(p.jobs);
	free(p.first_error);
	free(p.first_unsupported);
	free(p.cubin_error);
	pthread_mutex_destroy(&p.mu);
	pthread_cond_destroy(&p.more);
	return rc;
}
