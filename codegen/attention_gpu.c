/*
 * attention_gpu.c: the attention kernels for the GPU (NVPTX) and its
 * emulation (EMU): FlashAttention-2 on tensor cores.
 *
 * Not written yet: an attention region on a GPU target is unsupported, a
 * clear status, and the runtime's callers see FZ_EUNSUPPORTED. What this
 * file must build is described in ir/attention.h ("What a GPU emitter must
 * do with it"); the host form is codegen/attention.c.
 */
#include "cg.h"

void cg_attention_gpu(cg *g, const fz_attn *A)
{
	(void)A;
	cg_fail(g, FZ_EUNSUPPORTED, NULL, "attention has no GPU kernel yet");
}
