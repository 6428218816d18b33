/*
 * build.c: one region compiled through the cache.
 *
 * The glue between the code generator and the disk cache, shared by
 * `fusec compile` and whatever else wants a region's code: the key's
 * target string and specialization bytes for a compiler's options, and
 * fz_cache_build, which compiles the canonical view of a region (so the
 * kernel's parameters follow the canonical numbering and serve every
 * region with the key), emits PTX (or, for the host, a relocatable object
 * file), builds a cubin where nvJitLink is present, and stores the entry:
 *
 *     section "ptx"          PTX text (NVPTX targets)
 *     section "cubin.sm_90"  machine code for that arch (when nvJitLink)
 *     section "obj"          an ELF object for the host CPU (host target),
 *                            its entry point named fz_KEY, so a warm
 *                            `fusec run --device cpu` links machine code
 *                            and compiles no LLVM IR at all
 *     section "meta"         what a launcher needs, as lines of text:
 *                            fusec-kernel 1 / entries N NAME... /
 *                            skeleton S / par P / vec V / in N / out N /
 *                            syms N ID... / work E N C:SYMS...
 *
 * An entry without the payload its target needs (a host entry written by
 * an older fusec, which kept optimized IR text in "llvm") is not usable:
 * fz_cache_usable says so, and callers treat it as a miss and store a new
 * entry over it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#include <xxhash.h>

#include "cache.h"
#include "codegen.h"

static pthread_mutex_t times_mu = PTHREAD_MUTEX_INITIALIZER;
static fz_build_times times;

void fz_cache_build_times(fz_build_times *out)
{
	pthread_mutex_lock(&times_mu);
	*out = times;
	pthread_mutex_unlock(&times_mu);
}

int64_t fz_kernel_builds(void)
{
	fz_build_times t;
	fz_cache_build_times(&t);
	return t.builds;
}


void fz_cache_target(const fz_cg_options *o, char *buf, size_t n)
{
	if (o->target == FZ_CG_NVPTX) {
		snprintf(buf, n, "sm_%d", o->sm);
		return;
	}
	/* EMU: host code for this CPU, of that GPU's kernels, with its faults */
	static const char *fault[FZ_EMU_FAULT_COUNT] = {"", "+fault-barrier",
		"+fault-load", "+fault-store", "+fault-shfl", "+fault-mma", "+fault-cpwait"};
	char emu[64] = "";
	if (o->target == FZ_CG_EMU)
		snprintf(emu, sizeof emu, "emu-sm_%d%s%s-", o->sm,
			 (unsigned)o->emu_fault < FZ_EMU_FAULT_COUNT ? fault[o->emu_fault] : "+?",
			 o->emu_idx64 ? "+idx64" : "");
	/* the CPU's name and its features: a VM can mask features of the CPU
	 * it names (avx512_bf16, which host code uses where it is there), and
	 * an object made where they were would fault where they are not */
	char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName();
	char *feat = LLVMGetHostCPUFeatures();
	snprintf(buf, n, "%shost-%s-%s%s-%016llx", emu, triple ? triple : "?", cpu ? cpu : "?",
		 fz_host_model() ? "+model-avx512" : "",
		 (unsigned long long)XXH3_64bits(feat ? feat : "", feat ? strlen(feat) : 0));
	LLVMDisposeMessage(triple);
	LLVMDisposeMessage(cpu);
	LLVMDisposeMessage(feat);
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

fz_status fz_cache_canon(const fz_trace *t, const fz_region *r,
			 const fz_cg_options *o, const char *target,
			 fz_canon **out, char **err)
{
	uint8_t spec[2 + 256];
	fz_key_params kp;
	fz_key_params_init(&kp, target, FZ_CODEGEN_VERSION);
	kp.spec = spec;
	kp.n_spec = fz_cache_spec(o, r, spec, sizeof spec);
	return fz_canon_region(t, r, &kp, out, err);
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
	if (k->smem) /* a line only where a launch needs it */
		fz_buf_printf(b, "smem %d\n", k->smem);
	if (k->n_scratch) { /* the same */
		fz_buf_printf(b, "scratch %d", k->n_scratch);
		for (int i = 0; i < k->n_scratch && i < 2; i++)
			fz_buf_printf(b, " %lld:%llx", (long long)k->scratch[i].c,
				      (unsigned long long)k->scratch[i].syms);
		fz_buf_puts(b, "\n");
	}
	for (int e = 0; e < k->n_entries && e < 2; e++) {
		fz_buf_printf(b, "work %d %d", e, k->n_work[e]);
		for (int w = 0; w < k->n_work[e] && w < 8; w++)
			fz_buf_printf(b, " %lld:%llx", (long long)k->work[e][w].c,
				      (unsigned long long)k->work[e][w].syms);
		fz_buf_puts(b, "\n");
	}
}

fz_status fz_cache_meta_read(const fz_entry *e, fz_kernel *k)
{
	memset(k, 0, sizeof *k);
	const fz_section *m = fz_entry_section(e, "meta");
	if (!m || m->len < 13 || memcmp(m->data, "fusec-kernel 1\n", 15) ||
	    m->len > 4096)
		return FZ_EINVAL;
	char text[4097];
	memcpy(text, m->data, m->len);
	text[m->len] = 0;
	int ok = 0, n;
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char *p = line;
		if (sscanf(p, "entries %d%n", &k->n_entries, &n) == 1) {
			p += n;
			if (k->n_entries < 1 || k->n_entries > 2)
				return FZ_EINVAL;
			for (int i = 0; i < k->n_entries; i++) {
				if (sscanf(p, " %63s%n", k->names[i], &n) != 1)
					return FZ_EINVAL;
				p += n;
			}
			ok |= 1;
		} else if (sscanf(p, "skeleton %d", &n) == 1) {
			k->sk = (fz_skeleton)n;
			ok |= 2;
		} else if (sscanf(p, "par %d", &n) == 1) {
			k->par = (fz_rowpar)n;
		} else if (sscanf(p, "vec %d", &k->vec) == 1) {
		} else if (sscanf(p, "smem %d", &k->smem) == 1) {
			if (k->smem < 0 || k->smem > FZ_TILE_DYN_MAX)
				return FZ_EINVAL;
		} else if (sscanf(p, "scratch %d%n", &k->n_scratch, &n) == 1) {
			p += n;
			if (k->n_scratch < 0 || k->n_scratch > 2)
				return FZ_EINVAL;
			for (int i = 0; i < k->n_scratch; i++) {
				long long c;
				unsigned long long sy;
				if (sscanf(p, " %lld:%llx%n", &c, &sy, &n) != 2 || c < 0)
					return FZ_EINVAL;
				k->scratch[i].c = c;
				k->scratch[i].syms = sy;
				p += n;
			}
		} else if (sscanf(p, "in %d", &k->n_in) == 1) {
			ok |= 4;
		} else if (sscanf(p, "out %d", &k->n_out) == 1) {
			ok |= 8;
		} else if (sscanf(p, "syms %d%n", &k->n_syms, &n) == 1) {
			p += n;
			if (k->n_syms < 0 || k->n_syms > FZ_MAX_SYMS)
				return FZ_EINVAL;
			for (int i = 0; i < k->n_syms; i++) {
				if (sscanf(p, " %d%n", &k->syms[i], &n) != 1)
					return FZ_EINVAL;
				p += n;
			}
		} else if (!strncmp(p, "work ", 5)) {
			int e, nw;
			if (sscanf(p, "work %d %d%n", &e, &nw, &n) != 2 || e < 0 ||
			    e > 1 || nw < 0 || nw > 8)
				return FZ_EINVAL;
			p += n;
			k->n_work[e] = nw;
			for (int w = 0; w < nw; w++) {
				long long c;
				unsigned long long sy;
				if (sscanf(p, " %lld:%llx%n", &c, &sy, &n) != 2)
					return FZ_EINVAL;
				k->work[e][w].c = c;
				k->work[e][w].syms = sy;
				p += n;
			}
		}
	}
	return ok == 15 && k->n_in >= 0 && k->n_out >= 0 ? FZ_OK : FZ_EINVAL;
}

bool fz_cache_usable(const fz_entry *e, const fz_cg_options *o)
{
	const fz_section *m = fz_entry_section(e, "meta");
	if (!m || m->len < 13 || memcmp(m->data, "fusec-kernel ", 13))
		return false;
	const fz_section *code = fz_entry_section(e, o->target == FZ_CG_NVPTX ?
						  "ptx" : "obj");
	return code && code->len > 0;
}

void fz_cache_entry_name(fz_key key, char *buf, size_t n)
{
	char hex[FZ_KEY_HEX];
	fz_key_hex(key, hex);
	snprintf(buf, n, "fz_%s", hex);
}

fz_status fz_cache_load_host(fz_compiler *c, const fz_entry *e, int n_in,
			     int n_out, fz_host_fn *fn, char **err)
{
	*fn = NULL;
	const fz_section *obj = fz_entry_section(e, "obj");
	const fz_section *meta = fz_entry_section(e, "meta");
	char entries[96], in[16], out[16], name[80];
	if (meta) {
		fz_canon_field(meta->data, meta->len, "entries", entries, sizeof entries);
		fz_canon_field(meta->data, meta->len, "in", in, sizeof in);
		fz_canon_field(meta->data, meta->len, "out", out, sizeof out);
	}
	if (!obj || !meta || sscanf(entries, "1 %79s", name) != 1 ||
	    atoi(in) != n_in || atoi(out) != n_out) {
		if (err)
			*err = fz_strdup("the cache entry is not a host kernel for "
					 "this region");
		return FZ_EINVAL;
	}
	return fz_host_load(c, obj->data, obj->len, name, fn, err);
}

fz_status fz_cache_build(fz_compiler *c, fz_disk *d, const fz_trace *t,
			 const fz_region *r, const fz_canon *cn, bool cubins,
			 fz_build_info *info, char **err)
{
	bool want_code = info->want_code;
	memset(info, 0, sizeof *info);
	info->want_code = want_code;
	fz_region view;
	fz_canon_region_view(cn, r, &view);
	fz_kernel *k = NULL;
	char *code = NULL;
	void *obj = NULL, *cubin = NULL;
	size_t code_len = 0, cubin_len = 0;
	fz_buf meta = {0};
	const fz_cg_options *o = fz_compiler_options(c);
	bool host = o->target != FZ_CG_NVPTX;
	double t0 = fz_now();
	fz_status st = fz_compiler_build(c, t, &view, &k, err);
	if (st == FZ_OK)
		st = fz_compiler_optimize(c, k, err);
	double t1 = fz_now();
	info->llvm_seconds = t1 - t0;
	if (st == FZ_OK && host) {
		char name[64];
		fz_cache_entry_name(cn->key, name, sizeof name);
		st = fz_kernel_set_entry(k, name);
		if (st != FZ_OK && err)
			*err = fz_strdup_printf("region %d: cannot name the entry point",
						r->id);
	}
	if (st == FZ_OK) {
		meta_text(k, &meta);
		if (host) {
			st = fz_kernel_object(c, k, &obj, &code_len, err);
		} else {
			st = fz_kernel_ptx(c, k, &code, err);
			code_len = code ? strlen(code) : 0;
		}
	}
	info->code_seconds = fz_now() - t1;
	if (st != FZ_OK)
		goto done;
	fz_section sec[3];
	int n = 0;
	memset(sec, 0, sizeof sec);
	strcpy(sec[n].tag, host ? "obj" : "ptx");
	sec[n].data = host ? obj : (const void *)code;
	sec[n++].len = code_len;
	if (meta.oom) {
		st = FZ_ENOMEM;
		goto done;
	}
	strcpy(sec[n].tag, "meta");
	sec[n].data = meta.data;
	sec[n++].len = meta.len;
	if (!host && cubins && fz_jitlink_available()) {
		char *jerr = NULL;
		double t2 = fz_now();
		fz_status cst = fz_jitlink_cubin(code, code_len, o->sm, &cubin,
						 &cubin_len, &jerr);
		info->cubin_seconds = fz_now() - t2;
		if (cst == FZ_OK) {
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
	info->code_bytes = code_len;
	info->cubin_bytes = cubin_len;
	double t3 = fz_now();
	if (d)
		st = fz_disk_store(d, cn->key, cn->text, cn->len, sec, n);
	info->store_seconds = fz_now() - t3;
	if (st == FZ_OK) {
		info->kernel = *k;
		info->kernel.mod = NULL;
		info->kernel.host = NULL;
	}
	if (st == FZ_OK && info->want_code) {
		if (host) {
			info->object = obj;
			info->object_len = code_len;
			obj = NULL;
		} else {
			info->ptx = code;
			info->cubin_data = cubin;
			code = NULL;
			cubin = NULL;
		}
	}
done:
	pthread_mutex_lock(&times_mu);
	times.llvm += info->llvm_seconds;
	times.code += info->code_seconds;
	times.cubin += info->cubin_seconds;
	times.store += info->store_seconds;
	times.builds++;
	pthread_mutex_unlock(&times_mu);
	fz_kernel_free(k);
	free(code);
	free(obj);
	free(cubin);
	free(fz_buf_take(&meta));
	return st;
}
