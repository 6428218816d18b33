/*
 * target_host.c: host code through ORC LLJIT.
 *
 * The host compiler's context is the context of an ORC ThreadSafeContext,
 * so every module built in it can be handed to the JIT. The JIT targets the
 * machine it runs on (LLJIT detects the host CPU and its features: F16C for
 * half conversions, FMA for the math library's reductions), and the host
 * pass pipeline (codegen.c) runs first with a target machine for the same
 * CPU, so the SLP vectorizer sees the real vector width (and the skeletons
 * make lane groups of that width: cg_vector_bytes). A process symbol generator
 * resolves the few library functions host code calls (libm for f64 math).
 *
 * Code stays alive as long as the compiler: LLJIT owns it and frees it with
 * the compiler.
 *
 * Objects. For the kernel cache, host code also travels as a relocatable
 * object file: fz_kernel_object runs the optimized module through the same
 * target machine's code generator into an ELF object in memory (what the
 * JIT would have produced), and fz_host_load hands such an object, fresh
 * or read back from the disk cache, to LLJIT's object linking layer, which
 * only links it: no LLVM IR is compiled on that path. A cached kernel's
 * entry point is named after its key (fz_kernel_set_entry), so any number
 * of cached objects coexist in one JIT; loading a name that the JIT already
 * defines returns the code already there.
 *
 *     fz_kernel_set_entry(k, "fz_3fa9...");
 *     fz_kernel_object(c, k, &obj, &len, &err);     module consumed
 *     fz_host_load(c, obj, len, "fz_3fa9...", &fn, &err);
 */
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg.h"

fz_status cg_host_init(fz_compiler *c, char **err)
{
	LLVMOrcLLJITRef jit = NULL;
	LLVMErrorRef e = LLVMOrcCreateLLJIT(&jit, NULL);
	if (e)
		return cg_llvm_error(c, e, "creating the host JIT", -1, err);
	c->jit = jit;
	LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
	c->tsc = tsc;
	c->ctx = LLVMOrcThreadSafeContextGetContext(tsc);
	c->triple = fz_strdup(LLVMOrcLLJITGetTripleString(jit));
	c->layout = fz_strdup(LLVMOrcLLJITGetDataLayoutStr(jit));

	LLVMOrcDefinitionGeneratorRef gen = NULL;
	e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
		&gen, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL);
	if (e)
		return cg_llvm_error(c, e, "resolving process symbols", -1, err);
	LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);

	LLVMTargetRef target;
	char *msg = NULL;
	if (LLVMGetTargetFromTriple(c->triple, &target, &msg)) {
		if (err)
			*err = fz_strdup_printf("no host target: %s", msg ? msg : "?");
		LLVMDisposeMessage(msg);
		return FZ_EUNSUPPORTED;
	}
	char *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
	/* 512-bit vectors (AVX-512 F, BW, VL, DQ): lane groups of 64 bytes,
	 * 16 f32 lanes, and the skeletons' functions say
	 * prefer-vector-width=512 (emit.c), since LLVM's tuning for these CPUs
	 * would split every vector in two 256-bit halves: a bf16 pointwise
	 * kernel is bound by its vector instructions on two cores, not by
	 * memory (swiglu bf16 4096^2: 58 instructions per 8 elements in ymm,
	 * 59 per 16 in zmm; llvm-mca for Sapphire Rapids 3.7 and 2.4 cycles
	 * an element; 1.5x the speed at one thread, measured). Else 256-bit (AVX2): 32 bytes, so bf16
	 * data widens to a full register of f32. The host CPU's name and a
	 * hash of its features are in the cache key (cache/build.c), so an
	 * object never meets another machine. */
	c->vector_bytes = feat && strstr(feat, "+avx512f") && strstr(feat, "+avx512bw") &&
			  strstr(feat, "+avx512vl") && strstr(feat, "+avx512dq") ? 64 :
			  feat && strstr(feat, "+avx2") ? 32 : 16;
	c->host_bf16 = c->vector_bytes == 64 && feat && strstr(feat, "+avx512bf16");
	/* the AVX-512 host's choices tested on an AVX2 one (fz_host_model) */
	if (c->vector_bytes == 32 && fz_host_model()) {
		c->vector_bytes = 64;
		c->host_model = true;
	}
	/* streaming stores: one output a loop on AMD's Zen cores, every
	 * output elsewhere (emit.c, "streaming stores") */
	c->host_streams = cpu && strncmp(cpu, "znver", 5) == 0 ? 1 : INT_MAX;
	c->tm = LLVMCreateTargetMachine(target, c->triple, cpu, feat,
					LLVMCodeGenLevelAggressive, LLVMRelocPIC,
					LLVMCodeModelJITDefault);
	LLVMDisposeMessage(cpu);
	LLVMDisposeMessage(feat);
	if (!c->tm || !c->triple || !c->layout) {
		if (err)
			*err = fz_strdup("cannot create the host target machine");
		return FZ_ERUNTIME;
	}
	return FZ_OK;
}

bool fz_host_model(void)
{
	const char *m = getenv("FUSEC_HOST_MODEL");
	return m && strcmp(m, "avx512") == 0;
}

void cg_host_free(fz_compiler *c)
{
	if (c->jit)
		LLVMOrcDisposeLLJIT((LLVMOrcLLJITRef)c->jit);
	if (c->tsc)
		LLVMOrcDisposeThreadSafeContext((LLVMOrcThreadSafeContextRef)c->tsc);
	c->jit = NULL;
	c->tsc = NULL;
	c->ctx = NULL;
}

fz_status fz_kernel_jit(fz_compiler *c, fz_kernel *k, char **err)
{
	if (err)
		*err = NULL;
	if (c->o.target != FZ_CG_HOST || !k->mod) {
		if (err)
			*err = fz_strdup_printf("region %d: the JIT needs a host compiler "
						"and an unemitted module", k->region);
		return FZ_EINVAL;
	}
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	LLVMOrcLLJITRef jit = c->jit;
	LLVMOrcThreadSafeModuleRef tsm =
		LLVMOrcCreateNewThreadSafeModule(k->mod, (LLVMOrcThreadSafeContextRef)c->tsc);
	k->mod = NULL; /* the JIT owns it now, whatever happens */
	LLVMErrorRef e = LLVMOrcLLJITAddLLVMIRModule(jit, LLVMOrcLLJITGetMainJITDylib(jit), tsm);
	if (e)
		return cg_llvm_error(c, e, "adding the module to the JIT", k->region, err);
	LLVMOrcExecutorAddress addr = 0;
	e = LLVMOrcLLJITLookup(jit, &addr, k->names[0]);
	if (e)
		return cg_llvm_error(c, e, "compiling host code", k->region, err);
	k->host = (fz_host_fn)(uintptr_t)addr;
	clock_gettime(CLOCK_MONOTONIC, &b);
	k->t_emit = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
	return FZ_OK;
}

fz_status fz_kernel_set_entry(fz_kernel *k, const char *name)
{
	/* one entry, or (EMU, index_add) two: the second is NAME_s */
	size_t n = strlen(name);
	LLVMValueRef fn = k->mod ? LLVMGetNamedFunction(k->mod, k->names[0]) : NULL;
	LLVMValueRef fn2 = k->mod && k->n_entries == 2 ?
			   LLVMGetNamedFunction(k->mod, k->names[1]) : NULL;
	if (!fn || k->n_entries < 1 || k->n_entries > 2 || (k->n_entries == 2 && !fn2) ||
	    n + 2 >= sizeof k->names[0])
		return FZ_EINVAL;
	LLVMSetValueName2(fn, name, n);
	memcpy(k->names[0], name, n + 1);
	if (fn2) {
		snprintf(k->names[1], sizeof k->names[1], "%s_s", name);
		LLVMSetValueName2(fn2, k->names[1], n + 2);
	}
	return FZ_OK;
}

fz_status fz_kernel_object(fz_compiler *c, fz_kernel *k, void **obj, size_t *len,
			   char **err)
{
	*obj = NULL;
	*len = 0;
	if (c->o.target == FZ_CG_NVPTX || !k->mod) {
		if (err)
			*err = fz_strdup_printf("region %d: an object needs a host "
						"compiler and an unemitted module", k->region);
		return FZ_EINVAL;
	}
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	char *msg = NULL;
	LLVMMemoryBufferRef buf = NULL;
	LLVMBool bad = LLVMTargetMachineEmitToMemoryBuffer(
		(LLVMTargetMachineRef)c->tm, k->mod, LLVMObjectFile, &msg, &buf);
	LLVMDisposeModule(k->mod);
	k->mod = NULL;
	if (bad || !buf) {
		if (err)
			*err = fz_strdup_printf("region %d: emitting the host object: %s",
						k->region, msg ? msg : "?");
		LLVMDisposeMessage(msg);
		return FZ_ERUNTIME;
	}
	size_t n = LLVMGetBufferSize(buf);
	void *p = malloc(n ? n : 1);
	if (p)
		memcpy(p, LLVMGetBufferStart(buf), n);
	LLVMDisposeMemoryBuffer(buf);
	if (!p) {
		if (err)
			*err = fz_strdup("out of memory");
		return FZ_ENOMEM;
	}
	*obj = p;
	*len = n;
	clock_gettime(CLOCK_MONOTONIC, &b);
	k->t_emit = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
	return FZ_OK;
}

fz_status fz_host_load(fz_compiler *c, const void *obj, size_t len,
		       const char *name, fz_host_fn *fn, char **err)
{
	*fn = NULL;
	if (c->o.target == FZ_CG_NVPTX || !c->jit || !obj || !len) {
		if (err)
			*err = fz_strdup("fz_host_load: needs a host compiler and an object");
		return FZ_EINVAL;
	}
	LLVMOrcLLJITRef jit = c->jit;
	LLVMOrcExecutorAddress addr = 0;
	/* already linked (loaded earlier under this name): the same code */
	LLVMErrorRef e = LLVMOrcLLJITLookup(jit, &addr, name);
	if (!e && addr) {
		*fn = (fz_host_fn)(uintptr_t)addr;
		return FZ_OK;
	}
	if (e)
		LLVMConsumeError(e);
	LLVMMemoryBufferRef buf =
		LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, len, name);
	if (!buf) {
		if (err)
			*err = fz_strdup("out of memory");
		return FZ_ENOMEM;
	}
	e = LLVMOrcLLJITAddObjectFile(jit, LLVMOrcLLJITGetMainJITDylib(jit), buf);
	if (e)
		return cg_llvm_error(c, e, "adding an object to the JIT", -1, err);
	e = LLVMOrcLLJITLookup(jit, &addr, name);
	if (e)
		return cg_llvm_error(c, e, "linking a host object", -1, err);
	*fn = (fz_host_fn)(uintptr_t)addr;
	return FZ_OK;
}
