/*
 * comm.h: a communicator, the engine behind a target's collectives.
 *
 * One fz_comm joins `world` ranks. A rank calls fz_comm_collective with its
 * operand and gets its result; the call returns when every rank has
 * contributed, or fails with a clear error when a rank does not join within
 * the timeout, or called another collective, or one of another size, or
 * gave up (fz_comm_abort). Nothing waits forever.
 *
 * The CPU communicator (comm_cpu.c) joins threads of one process over
 * shared memory and computes exactly what the reference interpreter does
 * (ir/collective.c: sums in f64 in rank order, one rounding), so N
 * emulated ranks are checked element by element against the interpreter.
 * NCCL is the other engine (the CUDA target's), not part of this build.
 */
#ifndef FUSEC_RUNTIME_COMM_H
#define FUSEC_RUNTIME_COMM_H

#include "ir.h"

typedef struct fz_comm fz_comm;

/* world ranks; a rank that does not join a collective within timeout_s
 * seconds makes the others fail (timeout_s <= 0: 60 s). */
fz_status fz_comm_new(int world, double timeout_s, fz_comm **out);
void fz_comm_free(fz_comm *c);
int fz_comm_world(const fz_comm *c);

/* Rank `rank`'s part of collective `op` (all_gather, reduce_scatter,
 * all_reduce) over operand x (dtype dt, extents shape[0..nd), gathered or
 * scattered along dim) into y, which has the result's size. On failure
 * *err says which rank did what (fz_free it). */
fz_status fz_comm_collective(fz_comm *c, int rank, fz_opcode op, fz_dtype dt,
                             int nd, const int64_t *shape, int dim,
                             const void *x, void *y, char **err);

/* Rank `rank` gives up (an error of its own); every rank waiting in, or
 * later entering, a collective fails at once with `why`. */
void fz_comm_abort(fz_comm *c, int rank, const char *why);

#endif
