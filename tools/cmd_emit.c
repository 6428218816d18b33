/*
 * cmd_emit.c: `fusec emit`, the generated code of every kernel region.
 *
 *     fusec emit FILE [--llvm|--ptx] [--target sm_90|host|emu] [--region N]
 *                     [--bind B=8,T=2048] [--out-dir DIR]
 *
 * Each kernel region of each trace is planned, built as one LLVM module and
 * optimized (codegen/program.c); --llvm prints the module as LLVM IR, --ptx
 * compiles it through the NVPTX backend (the default for an sm_ target;
 * --llvm is the only form for host). Symbols left unbound stay kernel
 * parameters. With --out-dir every module is written to its own file,
 * region-N.ll or region-N.ptx (TRACE.region-N.* when the file holds several
 * traces; region-N.opK.* for a region that runs one kernel per op), each a
 * complete module; without it the modules go to standard output, each
 * after a `// trace T region N` line.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen.h"
#include "ir.h"
#include "tool.h"

static int cmd_emit(int argc, char **argv);

const fz_command fz_cmd_emit = {"emit", "print generated LLVM IR or PTX", cmd_emit,
	"usage: fusec emit FILE [--llvm|--ptx] [--target sm_90|host|emu] [--region N]\n"
	"                       [--bind B=8,T=2048] [--out-dir DIR]\n"
	"\n"
	"Print the generated code of every kernel region (LLVM IR, or PTX from\n"
	"LLVM's NVPTX backend), optimized at O3.\n"
	"\n"
	"  --llvm          LLVM IR (the only form for --target host and emu)\n"
	"  --ptx           PTX (the default for sm_ targets)\n"
	"  --target T      sm_70 ... sm_90 (default sm_90), host, or emu[-sm_NN]\n"
	"                  (the GPU's kernels for the CPU, as --device emu runs)\n"
	"  --region N      only region N (as numbered by `fusec plan`)\n"
	"  --bind LIST     sizes of symbolic extents; unbound ones stay kernel\n"
	"                  parameters\n"
	"  --out-dir DIR   one file per region: region-N.ll or region-N.ptx\n"};

typedef struct emit_ctx {
	const fz_trace *t;
	fz_compiler *c;
	bool ptx, several;
	const char *dir;
	int written, emitted;
} emit_ctx;

static fz_status emit_one(const fz_region *r, int op, fz_kernel *k, void *ud,
			  char **err)
{
	emit_ctx *e = ud;
	char *text = NULL;
	fz_status st = e->ptx ? fz_kernel_ptx(e->c, k, &text, err) :
		       fz_kernel_llvm(k, &text, err);
	if (st != FZ_OK)
		return st;
	e->emitted++;
	char name[512], opname[32] = "";
	if (op >= 0)
		snprintf(opname, sizeof opname, ".op%d", op);
	if (!e->dir) {
		printf("// trace %s region %d%s\n%s\n", fz_trace_name(e->t), r->id,
		       opname, text);
		fz_free(text);
		return FZ_OK;
	}
	snprintf(name, sizeof name, "%s/%s%sregion-%d%s.%s", e->dir,
		 e->several ? fz_trace_name(e->t) : "", e->several ? "." : "",
		 r->id, opname, e->ptx ? "ptx" : "ll");
	FILE *f = fopen(name, "w");
	if (!f || fputs(text, f) == EOF) {
		if (f)
			fclose(f);
		fz_free(text);
		*err = fz_strdup_printf("cannot write %s: %s", name, strerror(errno));
		return FZ_EIO;
	}
	fz_free(text);
	if (fclose(f)) {
		*err = fz_strdup_printf("cannot write %s: %s", name, strerror(errno));
		return FZ_EIO;
	}
	e->written++;
	return FZ_OK;
}

static int cmd_emit(int argc, char **argv)
{
	const fz_command *cmd = &fz_cmd_emit;
	const char *file = NULL, *target = "sm_90", *dir = NULL;
	int form = 0; /* 0 default, 1 llvm, 2 ptx */
	long region = -1;
	tool_binding binds[FZ_MAX_SYMS];
	int n_binds = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_next = i + 1 < argc;
		if (!strcmp(a, "--llvm")) {
			form = 1;
		} else if (!strcmp(a, "--ptx")) {
			form = 2;
		} else if (!strcmp(a, "--target") && has_next) {
			target = argv[++i];
		} else if (!strcmp(a, "--out-dir") && has_next) {
			dir = argv[++i];
		} else if (!strcmp(a, "--region") && has_next) {
			char *end;
			region = strtol(argv[++i], &end, 10);
			if (*end || region < 0)
				return tool_usage_error(cmd, "bad region '%s'", argv[i]);
		} else if (!strcmp(a, "--bind") && has_next) {
			if (tool_bind_option(cmd, argv[++i], binds, &n_binds))
				return EXIT_USAGE;
		} else if (a[0] == '-' && a[1]) {
			return tool_usage_error(cmd, "unknown option or missing value: '%s'", a);
		} else if (file) {
			return tool_usage_error(cmd, "more than one FILE ('%s')", a);
		} else {
			file = a;
		}
	}
	if (!file)
		return tool_usage_error(cmd, "no FILE given%s", "");
	fz_cg_options o;
	char *err = NULL;
	if (fz_cg_options_parse(target, &o, &err) != FZ_OK) {
		int rc = tool_usage_error(cmd, "%s", err);
		fz_free(err);
		return rc;
	}
	if (o.target != FZ_CG_NVPTX && form == 2)
		return tool_usage_error(cmd, "--ptx needs an sm_ target, not '%s'", target);
	bool ptx = o.target == FZ_CG_NVPTX && form != 1;
	if (dir && mkdir(dir, 0777) && errno != EEXIST) {
		fprintf(stderr, "fusec emit: cannot create %s: %s\n", dir, strerror(errno));
		return EXIT_BAD;
	}
	fz_module *m = tool_load(file);
	if (!m)
		return EXIT_BAD;
	int rc = 0, emitted = 0;
	for (int i = 0; i < fz_module_count(m) && !rc; i++) {
		const fz_trace *t = fz_module_trace(m, i);
		int64_t syms[FZ_MAX_SYMS];
		tool_bind_symbols(t, binds, n_binds, syms);
		bool bound = true, small = true;
		for (int s = 0; s < t->n_syms; s++)
			bound = bound && syms[s] >= 0;
		for (int v = 0; bound && v < t->n_values; v++) {
			fz_ext n;
			int64_t e = fz_type_numel(&t->values[v]->type, &n) ? fz_ext_eval(n, syms) : -1;
			small = small && e >= 0 && e < (INT64_C(1) << 28);
		}
		o.idx32 = bound && small; /* symbolic sizes: 64-bit indices */
		fz_compiler *c = NULL;
		if (fz_compiler_new(&o, &c, &err) != FZ_OK) {
			fprintf(stderr, "fusec emit: %s\n", err ? err : "no compiler");
			rc = EXIT_BAD;
			break;
		}
		emit_ctx e = {t, c, ptx, fz_module_count(m) > 1, dir, 0, 0};
		fz_status st = fz_compile_trace(c, t, syms, (int)region, emit_one, &e, &err);
		emitted += e.emitted;
		if (st != FZ_OK) {
			fprintf(stderr, "fusec emit: trace '%s': %s\n", fz_trace_name(t),
				err ? err : fz_status_name(st));
			rc = EXIT_BAD;
		} else if (dir) {
			fprintf(stderr, "trace %s: %d file%s written to %s\n", fz_trace_name(t),
				e.written, e.written == 1 ? "" : "s", dir);
		}
		fz_free(err);
		err = NULL;
		fz_compiler_free(c);
	}
	for (int b = 0; b < n_binds && !rc; b++)
		if (!binds[b].used)
			fprintf(stderr, "fusec emit: warning: --bind %s: no trace in %s has "
				"that symbol\n", binds[b].name, file);
	if (!rc && region >= 0 && !emitted) {
		/* an empty listing with status 0 reads as "no code", not as a
		 * region asked for that is not there */
		fprintf(stderr, "fusec emit: no trace in %s has a kernel region %ld "
			"(`fusec plan %s` numbers the regions and says which are kernels)\n",
			file, region, file);
		rc = EXIT_BAD;
	}
	fz_module_free(m);
	return rc;
}
