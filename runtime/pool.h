/*
 * pool.h: the CPU target's thread pool.
 *
 * One pool per CPU device: n - 1 worker threads that sleep until a job
 * comes, plus the thread that runs the job, which works too. A job is a
 * function called once per part 0 .. nparts-1; the parts go to whichever
 * thread asks next (an atomic counter), so a core that another process
 * holds for a while gets fewer parts instead of holding up the launch.
 * fz_pool_run returns when every part has returned.
 *
 *     fz_pool *p;
 *     fz_pool_new(0, &p, &err);           0: the CPUs this process may use
 *     fz_pool_run(p, 8, body, &args);     body(&args, 0 .. 7, 8)
 *     fz_pool_free(p);
 *
 * Jobs from several threads at once run one after the other (a job holds
 * the pool; on an OpenMP team, side by side, each caller on a team of its
 * own); a part that starts a job of its own runs it inline, in order.
 */
#ifndef FUSEC_RUNTIME_POOL_H
#define FUSEC_RUNTIME_POOL_H

#include "fusec.h"

typedef struct fz_pool fz_pool;
typedef void (*fz_pool_fn)(void *arg, int part, int nparts);

/* threads <= 0: the CPUs this process may run on (sched_getaffinity). */
fz_status fz_pool_new(int threads, fz_pool **out, char **err);
void fz_pool_free(fz_pool *p);
/* Threads that run a job's parts, the caller's included. */
int fz_pool_threads(const fz_pool *p);
/* Whose threads those are: "own" (the pool's) or "openmp" (the team of
 * the OpenMP runtime already in the process; pool.c says when). */
const char *fz_pool_kind(const fz_pool *p);
/* Runs fn(arg, i, nparts) for every i in [0, nparts) across the pool. */
void fz_pool_run(fz_pool *p, int nparts, fz_pool_fn fn, void *arg);
/* How many parts to cut `items` units of work into, at least `min_items`
 * each: between 1 and four per thread (the spare parts balance a launch
 * when a core is busy with something else). */
int fz_pool_parts(const fz_pool *p, int64_t items, int64_t min_items);
/* The CPUs this process may run on (at least 1). */
int fz_cpu_count(void);

#endif
