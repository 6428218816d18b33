/*
 * target_host.c: host code through ORC LLJIT.
 *
 * The host compiler's context is the context of an ORC ThreadSafeContext,
 * so every module built in it can be handed to the JIT. The JIT targets the
 * machine it runs on (LLJIT detects the host CPU and its features: F16C for
 * half conversions, FMA for the math library's reductions), and the O3
 * pipeline runs first with a target machine for the same CPU, so the loop
 * and SLP vectorizers see the real vector width. A process symbol generator
 * resolves the few library functions host code calls (libm for f64 math).
 *
 * Code stays alive as long as the compiler: LLJIT owns it and frees it with
 * the compiler.
 */
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen.h"

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
