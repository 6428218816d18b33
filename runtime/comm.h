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
 * NCCL (comm_nccl.c, opened at run time) is the GPU's engine: the CUDA
 * target enqueues its collectives on a communication stream, through the
 * rank's fz_nccl that the caller set on the communicator (fz_comm_set_nccl);
 * the host rendezvous then only starts ranks together (fz_comm_barrier)
 * and spreads an abort.
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
/* Waits until every rank has arrived (the same deadline and abort as a
 * collective); on the host, outside any step: how ranks agree that all
 * are ready before a device engine (NCCL) gets work no rank may abandon. */
fz_status fz_comm_barrier(fz_comm *c, int rank, char **err);

/* A device engine per rank (NCCL), kept beside the host rendezvous: the
 * CUDA target enqueues rank r's collectives through fz_comm_nccl(c, r),
 * and fz_comm_collective is then not used. NULL (the default): none; c
 * does not own it. */
typedef struct fz_nccl fz_nccl;
void fz_comm_set_nccl(fz_comm *c, int rank, fz_nccl *n);
fz_nccl *fz_comm_nccl(const fz_comm *c, int rank);

/* ---- NCCL (comm_nccl.c): tested against a fake libnccl (tests/fake),
 * never yet on a GPU ---- */

#define FZ_NCCL_ID_BYTES 128

/* Rank 0's ncclGetUniqueId (with NCCL_COMM_ID set, every rank's). Loads
 * libnccl.so.2 on first use: FZ_EUNSUPPORTED, saying so, where absent. */
FZ_API fz_status fz_nccl_unique_id(unsigned char id[FZ_NCCL_ID_BYTES], char **err);
/* Shares the id through a file: rank 0 makes and writes it (atomically),
 * the others read it, waiting up to timeout_s (<= 0: 60 s). */
fz_status fz_nccl_bootstrap_file(int rank, const char *path, double timeout_s,
                                 unsigned char id[FZ_NCCL_ID_BYTES], char **err);
/* Rank `rank` of `world` joins the communicator of id (the CUDA device must
 * be current); a communicator not formed within timeout_s is aborted and an
 * error, never a hang. */
fz_status fz_nccl_new(int world, int rank, const unsigned char id[FZ_NCCL_ID_BYTES],
                      double timeout_s, fz_nccl **out, char **err);
void fz_nccl_free(fz_nccl *c);
/* ncclCommAbort, then frees c: what a rank does when a peer failed, so
 * that collectives the peer will never join are cancelled on the device
 * instead of waited for forever. */
void fz_nccl_abort(fz_nccl *c);
/* Enqueues op on `stream` (a cudaStream_t / CUstream) and returns: count is
 * the operand's elements (outer 1: along dim 0; all_reduce any). */
fz_status fz_nccl_collective(fz_nccl *c, fz_opcode op, fz_dtype dt, int64_t outer,
                             int64_t count, const void *x, void *y, void *stream,
                             char **err);
/* ncclGroupStart (start) or ncclGroupEnd around a bucket's members of
 * communicator c (whose enqueueing ncclGroupEnd may leave in progress). */
fz_status fz_nccl_group(fz_nccl *c, bool start, char **err);

#endif
