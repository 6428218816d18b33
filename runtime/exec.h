/*
 * exec.h: the runner as the tools and tests see it.
 *
 * The prepared-program API itself is public (include/fusec.h: fz_exec_new,
 * fz_exec_run, fz_exec_sync, fz_exec_free); this header adds what only
 * fusec's own tools report: counters, the plan a run used, and the flag
 * that makes `fusec run` report a device error after every run.
 */
#ifndef FUSEC_RUNTIME_EXEC_H
#define FUSEC_RUNTIME_EXEC_H

#include "fusec.h"
#include "kernels.h"
#include "plan.h"

typedef struct fz_exec_stats {
	int plans;                /* bindings prepared (plans made) */
	int regions;              /* regions of the current plan */
	int launches;             /* kernels launched by the last run */
	int steps;                /* steps of the current plan */
	int64_t arena_bytes;      /* the current plan's arena, staging included */
	fz_kstats k;              /* kernels: unique, compiled, cache hits, ... */
	double prepare_seconds;   /* planning, kernels and arenas, all plans */
	int graph_captures;       /* fz_exec_run_graph: runs captured */
	int graph_launches;       /* fz_exec_run_graph: graphs replayed */
} fz_exec_stats;

const fz_exec_stats *fz_exec_stats_of(const fz_exec *x);
/* The device x runs on (tools: to allocate and copy device buffers). */
fz_device *fz_exec_dev(const fz_exec *x);
/* The plan the last run used (NULL before the first). */
const fz_program *fz_exec_plan(const fz_exec *x);
/* Prepares the plan for sym_sizes (NULL: taken from the inputs) without
 * running, so that set-up can be timed apart from runs. */
fz_status fz_exec_prepare(fz_exec *x, const int64_t *sym_sizes,
                          const fz_tensor *inputs, int n_in, char **err);

/* Makes the runner rank `rank` of communicator c (comm.h), for a trace
 * declared `world N` with N the communicator's world: its collectives go
 * through c, one thread per rank. */
struct fz_comm;
void fz_exec_set_comm(fz_exec *x, struct fz_comm *c, int rank);
/* fz_exec_run through a graph of the whole run (targets with
 * capture_begin: CUDA graphs): the first call for a plan and these
 * inputs and outputs (pointers, shapes, strides) captures the run on
 * stream into a graph and launches it; later calls with the same ones
 * only launch it; a change captures again (the old graph is freed). The
 * flag word is reset outside the graph. stream must be the caller's own:
 * the legacy default stream (NULL) cannot be captured. FZ_EUNSUPPORTED on
 * targets without graphs, saying so. */
fz_status fz_exec_run_graph(fz_exec *x, const int64_t *sym_sizes,
                            const fz_tensor *in, int n_in, fz_tensor *out,
                            int n_out, void *stream, char **err);

/* Host synchronizations the device performed inside this runner's runs
 * (fz_exec_sync, which the caller asks for, is not counted): 0 is the
 * contract. */
long fz_exec_host_syncs(const fz_exec *x);

#endif
