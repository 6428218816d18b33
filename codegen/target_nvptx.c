/*
 * target_nvptx.c: PTX through LLVM's NVPTX backend.
 *
 * The triple is nvptx64-nvidia-cuda and the CPU the compute capability
 * (sm_90 unless `--target` says otherwise). The PTX ISA version is the
 * lowest that the target needs, so the PTX loads on the oldest driver that
 * runs that GPU:
 *
 *     sm_70 6.0   sm_72 6.1   sm_75 6.3   sm_80 7.0   sm_86 7.1
 *     sm_87 7.4   sm_89 7.8   sm_90 7.8   sm_90a 8.0
 *
 * Kernels carry the PTX kernel calling convention and the nvvm.annotations
 * "kernel" entry; buffers are global pointers (address space 1), so loads
 * are ld.global (ld.global.nc where LLVM proves them read-only), and the
 * block-reduction scratch lives in shared memory (address space 3). Thread
 * indices, shuffles and barriers are llvm.nvvm.* intrinsics (emit.c).
 */
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg.h"

static const char *ptx_features(int sm, bool arch_a)
{
	if (arch_a)
		return "+ptx80";
	if (sm >= 89)
		return "+ptx78";
	if (sm >= 87)
		return "+ptx74";
	if (sm >= 86)
		return "+ptx71";
	if (sm >= 80)
		return "+ptx70";
	if (sm >= 75)
		return "+ptx63";
	if (sm >= 72)
		return "+ptx61";
	return "+ptx60";
}

fz_status cg_nvptx_init(fz_compiler *c, char **err)
{
	const char *triple = "nvptx64-nvidia-cuda";
	LLVMTargetRef target;
	char *msg = NULL;
	if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
		if (err)
			*err = fz_strdup_printf("the NVPTX target is missing from this "
						"LLVM: %s", msg ? msg : "?");
		LLVMDisposeMessage(msg);
		return FZ_EUNSUPPORTED;
	}
	char cpu[16];
	bool arch_a = false; /* sm_90a is parsed as sm_90 */
	snprintf(cpu, sizeof cpu, "sm_%d", c->o.sm);
	c->tm = LLVMCreateTargetMachine(target, triple, cpu,
					ptx_features(c->o.sm, arch_a),
					LLVMCodeGenLevelAggressive, LLVMRelocDefault,
					LLVMCodeModelDefault);
	c->ctx = LLVMContextCreate();
	if (!c->tm || !c->ctx) {
		if (err)
			*err = fz_strdup("cannot create the NVPTX target machine");
		return FZ_ERUNTIME;
	}
	LLVMTargetDataRef td = LLVMCreateTargetDataLayout(c->tm);
	char *dl = LLVMCopyStringRepOfTargetData(td);
	c->layout = fz_strdup(dl);
	c->triple = fz_strdup(triple);
	LLVMDisposeMessage(dl);
	LLVMDisposeTargetData(td);
	return c->layout && c->triple ? FZ_OK : FZ_ENOMEM;
}

fz_status fz_kernel_ptx(fz_compiler *c, fz_kernel *k, char **out, char **err)
{
	if (err)
		*err = NULL;
	*out = NULL;
	if (c->o.target != FZ_CG_NVPTX || !k->mod) {
		if (err)
			*err = fz_strdup_printf("region %d: PTX needs an NVPTX compiler "
						"and an unemitted module", k->region);
		return FZ_EINVAL;
	}
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	char *msg = NULL;
	LLVMMemoryBufferRef buf = NULL;
	if (LLVMTargetMachineEmitToMemoryBuffer(c->tm, k->mod, LLVMAssemblyFile,
						&msg, &buf)) {
		if (err)
			*err = fz_strdup_printf("region %d: PTX emission failed: %s%s%s",
						k->region, msg ? msg : "?",
						c->diag[0] ? "; " : "", c->diag);
		LLVMDisposeMessage(msg);
		c->diag[0] = 0;
		return FZ_ERUNTIME;
	}
	size_t n = LLVMGetBufferSize(buf);
	char *s = malloc(n + 1);
	if (s) {
		memcpy(s, LLVMGetBufferStart(buf), n);
		s[n] = 0;
	}
	LLVMDisposeMemoryBuffer(buf);
	LLVMDisposeModule(k->mod);
	k->mod = NULL;
	clock_gettime(CLOCK_MONOTONIC, &b);
	k->t_emit = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
	*out = s;
	return s ? FZ_OK : FZ_ENOMEM;
}
