/*
 * cmd_compile.c: `fusec compile`, a model's kernels into the cache ahead of
 * time.
 *
 *     fusec compile FILE... [--target sm_90|host] [--cache-dir DIR]
 *                           [--jobs N] [--no-cubin] [--json]
 *
 * Every trace of every file is planned; each kernel region gets its
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
 * parsing and planning included); --json prints them as one object.
 * Regions the code generator does not take (FZ_EUNSUPPORTED) are counted
 * and do not fail the command; any other failure does (exit 1).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "plan.h"
#include "tool.h"

static int cmd_compile(int argc, char **argv);

const fz_command fz_cmd_compile = {"compile", "compile a model's kernels into the cache",
	cmd_compile,
	 "usage: fusec compile FILE... [--target sm_90|host] [--cache-dir DIR]\n"
	 "                             [--jobs N] [--no-cubin] [--json]\n"
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
	 "  --json           one JSON object: regions, unique, compiled,\n"
	 "                   cache_hits, unsupported, failed, seconds, target,\n"
	 "                   cubins, jobs, cache_dir\n"
	 "\n"
	 "The size cap is $FUSEC_CACHE_MAX_SIZE (default 2G). Exit status: 0 when\n"
	 "every region compiled or was found, 1 when one failed, 2 usage.\n"};

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

static int cmd_compile(int argc, char **argv)
{
	const fz_command *cmd = &fz_cmd_compile;
	double t0 = tool_now();
	const char *target = "sm_90", *cache_dir = NULL;
	long jobs = sysconf(_SC_NPROCESSORS_ONLN);
	bool json = false, no_cubin = false;
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
				n_binds = tool_parse_bindings(v, binds, FZ_MAX_SYMS);
				if (n_binds < 0) {
					free(files);
					return tool_usage_error(cmd, "--bind takes NAME=SIZE"
						"[,NAME=SIZE...], not '%s'", v);
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
	 * finds every kernel it launches */
	for (int f = 0; f < n_files && !rc; f++) {
		fz_module *m = tool_load(files[f]);
		if (!m) {
			rc = EXIT_BAD;
			break;
		}
		for (int i = 0; i < fz_module_count(m) && !rc; i++) {
			const fz_trace *t = fz_module_trace(m, i);
			int64_t syms[FZ_MAX_SYMS];
			tool_bind_symbols(t, binds, n_binds, syms);
			fz_plan_options po;
			fz_plan_defaults(&po);
			po.sym_sizes = syms;
			fz_program *prog = NULL;
			fz_kset *ks = NULL;
			fz_status st = fz_plan(t, &po, &prog, &err);
			if (st == FZ_OK)
				st = fz_kset_build(kx, prog, syms, &ks, &err);
			if (st != FZ_OK) {
				if (progress)
					fprintf(stderr, "\n");
				fprintf(stderr, "fusec compile: %s: trace %s: %s\n", files[f],
					fz_trace_name(t), err ? err : "failed");
				failed++;
				rc = EXIT_BAD;
			}
			fz_kset_free(ks);
			fz_program_free(prog);
		}
		fz_module_free(m);
	}
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
	if (ks->unsupported && !json)
		fprintf(stderr, "fusec compile: %d region key%s not taken whole by the "
			"code generator (they run per op, compiled too): %s\n",
			ks->unsupported, ks->unsupported == 1 ? "" : "s",
			fz_kctx_first_unsupported(kx) ? fz_kctx_first_unsupported(kx) : "?");
	if (json) {
		printf("{\"regions\": %d, \"unique\": %d, \"compiled\": %d, "
		       "\"cache_hits\": %d, \"unsupported\": %d, \"failed\": %d, "
		       "\"kernels\": %d, \"seconds\": %.4f, \"target\": ", ks->regions,
		       ks->unique, ks->compiled, ks->cache_hits, ks->unsupported, failed,
		       ks->instances, secs);
		tool_json_str(tname);
		printf(", \"cubins\": %s, \"jobs\": %ld, \"cache_dir\": ",
		       cubins, jobs);
		tool_json_str(fz_disk_disabled(disk) ? "" : fz_disk_path(disk));
		printf("}\n");
	} else if (!rc) {
		printf("%d kernel regions, %d unique keys: %d compiled, %d cache hits",
		       ks->regions, ks->unique, ks->compiled, ks->cache_hits);
		if (ks->unsupported)
			printf(", %d run per op", ks->unsupported);
		printf(" (%s%s) in %.3f s\n", tname,
		       cubins[0] == 't' ? ", cubins" : cubins[0] == 'f' ? ", PTX only"
		       : "", secs);
	}
done:
	free(err);
	fz_kctx_free(kx);
	fz_disk_close(disk);
	free(files);
	return rc;
}
