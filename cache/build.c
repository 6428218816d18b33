/*
 * build.c: one region compiled through the cache.
 *
 * The glue between the code generator and the disk cache, shared by
 * `fusec compile` and whatever else wants a region's code: the key's
 * target string and specialization bytes for a compiler's options, and
 * fz_cache_build, which compiles the canonical view of a region (so the
 * kernel's parameters follow the canonical numbering and serve every
 * region with the key), emits PTX (or, for the host, the optimized LLVM
 * IR), builds a cubin where nvJitLink is present, and stores the entry:
 *
 *     section "ptx"          PTX text (NVPTX targets)
 *     section "cubin.sm_90"  machine code for that arch (when nvJitLink)
 *     section "llvm"         optimized LLVM IR text (host target)
 *     section "meta"         what a launcher needs, as lines of text:
 *                            fusec-kernel 1 / entries N NAME... /
 *                            skeleton S / par P / vec V / in N / out N /
 *                            syms N ID... / work E N C:SYMS...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/TargetMachine.h>

#include "cache.h"
#include "codegen.h"

void fz_cache_target(const fz_cg_options *o, char *buf, size_t n)
{
	if (o->target == FZ_CG_NVPTX) {
		snprintf(buf, n, "sm_%d", o->sm);
		return;
	}
	char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName();
	snprintf(buf, n, "host-%s-%s", triple ? triple : "?", cpu ? cpu : "?");
	LLVMDisposeMessage(triple);
	LLVMDisposeMessage(cpu);
}

size_t fz_cache_spec(const fz_cg_options *o, const fz_region *r, uint8_t *buf,
		     size_t cap)
{
	size_t n = 0;
	if (cap >= 2) {
		buf[n++] = o->idx32;
		buf[n++] = o->vectorize;
	}
	/* every buffer the runtime hands a kernel is contiguous and 16-byte
	 * aligned (the arena, views copied to contiguous when a kernel reads
	 * them): one class byte per input, for when that changes */
	for (int i = 0; i < r->n_in && n < cap; i++)
		buf[n++] = 0x10;
	return n;
}

static void meta_text(const fz_kernel *k, fz_buf *b)
{
	fz_buf_printf(b, "fusec-kernel 1\nentries %d", k->n_entries);
	for (int e = 0; e < k->n_entries && e < 2; e++)
		fz_buf_printf(b, " %s", k->names[e]);
	fz_buf_printf(b, "\nskeleton %d\npar %d\nvec %d\nin %d\nout %d\nsyms %d",
		      (int)k->sk, (int)k->par, k->vec, k->n_in, k->n_out, k->n_syms);
	for (int s = 0; s < k->n_syms; s++)
		fz_buf_printf(b, " %d", k->syms[s]);
	fz_buf_puts(b, "\n");
	for (int e = 0; e < k->n_entries && e < 2; e++) {
		fz_buf_printf(b, "work %d %d", e, k->n_work[e]);
		for (int w = 0; w < k->n_work[e] && w < 8; w++)
			fz_buf_printf(b, " %lld:%llx", (long long)k->work[e][w].c,
				      (unsigned long long)k->work[e][w].syms);
		fz_buf_puts(b, "\n");
	}
}

fz_status fz_cache_build(fz_compiler *c, fz_disk *d, const fz_trace *t,
			 const fz_region *r, const fz_canon *cn, bool cubins,
			 fz_build_info *info, char **err)
{
	memset(info, 0, sizeof *info);
	fz_region view;
	fz_canon_region_view(cn, r, &view);
	fz_kernel *k = NULL;
	char *code = NULL;
	void *cubin = NULL;
	size_t cubin_len = 0;
	fz_buf meta = {0};
	const fz_cg_options *o = fz_compiler_options(c);
	fz_status st = fz_compiler_build(c, t, &view, &k, err);
	if (st == FZ_OK)
		st = fz_compiler_optimize(c, k, err);
	if (st == FZ_OK) {
		meta_text(k, &meta);
		if (o->target == FZ_CG_NVPTX)
			st = fz_kernel_ptx(c, k, &code, err);
		else
			st = fz_kernel_llvm(k, &code, err);
	}
	if (st != FZ_OK)
		goto done;
	fz_section sec[3];
	int n = 0;
	memset(sec, 0, sizeof sec);
	strcpy(sec[n].tag, o->target == FZ_CG_NVPTX ? "ptx" : "llvm");
	sec[n].data = code;
	sec[n++].len = strlen(code);
	if (meta.oom) {
		st = FZ_ENOMEM;
		goto done;
	}
	strcpy(sec[n].tag, "meta");
	sec[n].data = meta.data;
	sec[n++].len = meta.len;
	if (o->target == FZ_CG_NVPTX && cubins && fz_jitlink_available()) {
		char *jerr = NULL;
		if (fz_jitlink_cubin(code, strlen(code), o->sm, &cubin, &cubin_len,
				     &jerr) == FZ_OK) {
			snprintf(sec[n].tag, FZ_SECTION_TAG, "cubin.sm_%d", o->sm);
			sec[n].data = cubin;
			sec[n++].len = cubin_len;
			info->cubin = true;
		} else {
			/* PTX alone still serves: the driver JITs it */
			info->cubin_error = jerr;
			jerr = NULL;
		}
		free(jerr);
	}
	info->code_bytes = strlen(code);
	info->cubin_bytes = cubin_len;
	st = fz_disk_store(d, cn->key, cn->text, cn->len, sec, n);
done:
	fz_kernel_free(k);
	free(code);
	free(cubin);
	free(fz_buf_take(&meta));
	return st;
}
