/*
 * emu.h: the emulated GPU's scheduler (emu_sched.c), for the emu target
 * (emu.c) and the tests.
 *
 *     fz_emu_sched *s;  fz_emu_sched_new(&s, &err);
 *     fz_emu_launch L = {.kernel = name, .region = 3, .fn = fn, .bufs = bufs,
 *                        .syms = syms, .flag = &flag, .grid = 40, .block = 256,
 *                        .fibers = true, .n_in = 2};
 *     fz_emu_run(s, &L, &err);          every block, every thread, checked
 *     fz_emu_sched_free(s);
 *
 * A violation (a global access past its buffer, a shared-memory race, a
 * shuffle some lane of the warp misses, a barrier some thread of the block
 * misses) stops the launch: FZ_ERUNTIME and a message naming the kernel,
 * region, block and thread.
 */
#ifndef FUSEC_RUNTIME_EMU_H
#define FUSEC_RUNTIME_EMU_H

#include <stdbool.h>
#include <stdint.h>

#include "codegen.h"

typedef struct fz_emu_sched fz_emu_sched;

typedef struct fz_emu_launch {
	const char *kernel;     /* entry point name, for messages */
	int region;
	fz_emu_fn fn;
	void **bufs;            /* inputs then outputs */
	const int64_t *syms;
	int32_t *flag;          /* the kernel's error word */
	int64_t grid;
	int block;
	bool fibers;            /* the kernel has barriers or shuffles */
	int n_in;               /* to name a buffer slot "input i" / "output j" */
	int smem;               /* dynamic shared memory the launch gives (bytes) */
} fz_emu_launch;

/* What a scheduler ran (summed over its launches). */
typedef struct fz_emu_stats {
	int64_t launches, blocks, threads;
	int64_t barriers, shuffles;   /* released, per block and warp */
	int64_t smem_accesses;
	int64_t mmas, ldmatrix, cp_async; /* warp-wide, warp-wide, per thread */
} fz_emu_stats;

fz_status fz_emu_sched_new(fz_emu_sched **out, char **err);
void fz_emu_sched_free(fz_emu_sched *s);
/* Runs every block of L in order, the threads of a block as fibers (or,
 * without barriers and shuffles, one after another). One launch at a time
 * per scheduler. */
fz_status fz_emu_run(fz_emu_sched *s, const fz_emu_launch *L, char **err);
const fz_emu_stats *fz_emu_sched_stats(const fz_emu_sched *s);

#endif
