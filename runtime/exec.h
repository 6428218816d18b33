/*
 * exec.h: execution targets and the program runner.
 *
 * A target is a struct of function pointers, one per target, each in its
 * own file: runtime/cpu.c runs generated host code (this file's only one so
 * far); the CUDA target (driver API loaded at run time) is a later part.
 *
 *     fz_exec *x;  fz_exec_new(trace, &fz_target_cpu, &x, &err);
 *                  fz_exec_run(x, sym_sizes, in, n_in, out, n_out, &err);
 *                  fz_exec_free(x);
 *
 * fz_exec_run plans the trace at the bound sizes (ir/plan.h), resolves
 * every kernel of the plan through the structural cache (one variant per
 * index width and vectorization; see runtime/cpu.c), walks the regions in
 * scheduled order, launches each kernel through the target, runs library calls as a blocked matmul,
 * collectives at world 1 as the identity, and takes bookended views as
 * strides over their base's buffer (copied to contiguous only when a kernel
 * reads a view that is not). A kernel region the skeletons cannot take
 * (FZ_EUNSUPPORTED) runs as one kernel per op instead.
 */
#ifndef FUSEC_RUNTIME_EXEC_H
#define FUSEC_RUNTIME_EXEC_H

#include "codegen.h"
#include "ir.h"
#include "plan.h"

typedef struct fz_exec_target {
	const char *name;
	fz_cg_target codegen;   /* what its kernels are compiled for */
	void *(*alloc)(size_t bytes);          /* 64-byte aligned, zeroed */
	void (*release)(void *p);
	/* Runs entry e of kernel k over buffers bufs; *bad gets 1 + the id of
	 * a node that met a bad index, or stays 0. */
	fz_status (*launch)(const fz_kernel *k, int e, void **bufs,
	                    const int64_t *syms, int32_t *bad, char **err);
	fz_status (*sync)(char **err);
} fz_exec_target;

extern const fz_exec_target fz_target_cpu;

typedef struct fz_exec fz_exec;

/* Counters since fz_exec_new. Kernels are resolved when a plan is made:
 * unique distinct keys, each either a cache hit (linked from the disk
 * cache), compiled (LLVM IR built, compiled and stored), or unsupported;
 * mem_hits are kernels found among those this runner already holds (the
 * other 31 layers). late: kernels resolved while running because a
 * buffer's alignment was not the plan's (expected 0). */
typedef struct fz_exec_stats {
	int regions, kernels, compiled, split; /* split: regions run per op */
	int unique, cache_hits, mem_hits, late;
	double compile_seconds;   /* resolving kernels: compiling or loading */
} fz_exec_stats;

/* Where a runner finds and keeps compiled kernels besides its memory. */
typedef struct fz_exec_cache {
	bool disk;             /* use the disk cache (cache/disk.c) */
	const char *dir;       /* NULL: $FUSEC_CACHE_DIR, $XDG_CACHE_HOME/fusec,
	                          ~/.cache/fusec */
	void (*warn)(void *ctx, const char *msg); /* damaged entries, ... */
	void *warn_ctx;
} fz_exec_cache;

/* A runner keeps the kernels it loads in an in-memory LRU; with no
 * fz_exec_set_cache it uses no disk cache. */
fz_status fz_exec_new(const fz_trace *t, const fz_exec_target *tg, fz_exec **out,
                      char **err);
/* Opens the disk cache o names (o NULL or !o->disk: none), before the first
 * run. A cache directory that cannot be used leaves it disabled with one
 * warning; only running out of memory (or no directory to name) fails. */
fz_status fz_exec_set_cache(fz_exec *x, const fz_exec_cache *o, char **err);
void fz_exec_free(fz_exec *x);
fz_status fz_exec_run(fz_exec *x, const int64_t *sym_sizes, const fz_tensor *in,
                      int n_in, fz_tensor *out, int n_out, char **err);
const fz_exec_stats *fz_exec_stats_of(const fz_exec *x);

/* Makes the runner rank `rank` of communicator c (comm.h), for a trace
 * declared `world N` with N the communicator's world: its collectives go
 * through c, one thread per rank. */
struct fz_comm;
void fz_exec_set_comm(fz_exec *x, struct fz_comm *c, int rank);

#endif
