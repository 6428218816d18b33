/*
 * comm_cpu.c: the CPU communicator: N ranks as threads of one process.
 *
 * A collective is two barriers around shared slots:
 *
 *     post      rank r puts (op, dtype, extents, dim, operand pointer) in
 *               slot r; the last rank to arrive wakes the others
 *     compute   every rank checks that all slots describe the same
 *               collective, then computes its own result from all operands
 *               (ir/collective.c), reading the others' buffers in place
 *     leave     a second barrier, so no rank returns (and frees or
 *               overwrites its operand) while another still reads it
 *
 * Each barrier waits with a deadline: a rank that never arrives turns into
 * "rank 3 did not join all_gather #5 within 60 s" for every rank that did,
 * and a rank that fails on its own calls fz_comm_abort, which wakes the
 * others with its reason. A generation counter keeps barriers of
 * consecutive collectives apart; the communicator is unusable after a
 * failure (every later call fails at once), as an NCCL communicator is
 * after an error.
 *
 * Where the CUDA target runs the ranks, the same object carries each
 * rank's NCCL engine (fz_comm_set_nccl): the collectives go to the device,
 * and the host side only starts the ranks together (fz_comm_barrier) and
 * spreads a rank's failure (fz_comm_abort).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"

typedef struct post {
	fz_opcode op;
	fz_dtype dt;
	int nd, dim;
	int64_t shape[FZ_MAX_RANK];
	const void *x;
	long seq;              /* which collective of this rank */
} post;

struct fz_comm {
	int world;
	double timeout;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int arrived;
	long generation;
	bool failed;
	char why[1024];
	post *slots;
	long *seq;             /* per rank: collectives entered */
	fz_nccl **nccl;        /* per rank: its device engine, or NULL */
};

fz_status fz_comm_new(int world, double timeout_s, fz_comm **out)
{
	*out = NULL;
	if (world < 1)
		return FZ_EINVAL;
	fz_comm *c = calloc(1, sizeof *c);
	if (!c)
		return FZ_ENOMEM;
	c->slots = calloc((size_t)world, sizeof *c->slots);
	c->seq = calloc((size_t)world, sizeof *c->seq);
	c->nccl = calloc((size_t)world, sizeof *c->nccl);
	if (!c->slots || !c->seq || !c->nccl) {
		free(c->slots);
		free(c->seq);
		free(c->nccl);
		free(c);
		return FZ_ENOMEM;
	}
	c->world = world;
	c->timeout = timeout_s > 0 ? timeout_s : 60;
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	*out = c;
	return FZ_OK;
}

void fz_comm_free(fz_comm *c)
{
	if (!c)
		return;
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c->slots);
	free(c->seq);
	free(c->nccl);
	free(c);
}

void fz_comm_set_nccl(fz_comm *c, int rank, fz_nccl *n)
{
	if (rank >= 0 && rank < c->world)
		c->nccl[rank] = n;
}

fz_nccl *fz_comm_nccl(const fz_comm *c, int rank)
{
	return rank >= 0 && rank < c->world ? c->nccl[rank] : NULL;
}

int fz_comm_world(const fz_comm *c) { return c->world; }

static void fail_locked(fz_comm *c, const char *why)
{
	if (!c->failed) {
		c->failed = true;
		snprintf(c->why, sizeof c->why, "%s", why);
	}
	pthread_cond_broadcast(&c->cv);
}

void fz_comm_abort(fz_comm *c, int rank, const char *why)
{
	char buf[sizeof c->why];
	snprintf(buf, sizeof buf, "rank %d gave up: %.400s", rank, why ? why : "error");
	pthread_mutex_lock(&c->mu);
	fail_locked(c, buf);
	pthread_mutex_unlock(&c->mu);
}

/* Waits until all ranks have arrived at this barrier; FZ_OK, or an error
 * with c->why set. Called with c->mu held. */
static fz_status barrier_locked(fz_comm *c, int rank, const char *what)
{
	if (c->failed)
		return FZ_EINVAL;
	long gen = c->generation;
	if (++c->arrived == c->world) {
		c->arrived = 0;
		c->generation++;
		pthread_cond_broadcast(&c->cv);
		return FZ_OK;
	}
	struct timespec dl;
	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += (time_t)c->timeout;
	dl.tv_nsec += (long)((c->timeout - (double)(time_t)c->timeout) * 1e9);
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	while (c->generation == gen && !c->failed) {
		int rc = pthread_cond_timedwait(&c->cv, &c->mu, &dl);
		if (rc == ETIMEDOUT && c->generation == gen && !c->failed) {
			char buf[512];
			int missing = -1;
			for (int q = 0; q < c->world && missing < 0; q++)
				if (c->seq[q] < c->seq[rank])
					missing = q;
			if (missing >= 0)
				snprintf(buf, sizeof buf, "rank %d did not join %s #%ld within "
					 "%g s (rank %d waited)", missing, what, c->seq[rank],
					 c->timeout, rank);
			else
				snprintf(buf, sizeof buf, "a rank did not finish %s #%ld "
					 "within %g s (rank %d waited)", what, c->seq[rank],
					 c->timeout, rank);
			fail_locked(c, buf);
		}
	}
	return c->generation != gen ? FZ_OK : FZ_EINVAL;
}

fz_status fz_comm_barrier(fz_comm *c, int rank, char **err)
{
	if (err)
		*err = NULL;
	pthread_mutex_lock(&c->mu);
	fz_status st = barrier_locked(c, rank, "the barrier");
	if (st != FZ_OK && err)
		*err = fz_strdup_printf("the barrier: %s", c->failed ? c->why : "failed");
	pthread_mutex_unlock(&c->mu);
	return st;
}

static bool same_post(const post *a, const post *b)
{
	if (a->op != b->op || a->dt != b->dt || a->nd != b->nd || a->seq != b->seq ||
	    (a->op != FZ_OP_ALL_REDUCE && a->dim != b->dim))
		return false;
	for (int i = 0; i < a->nd; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}

static void describe(const post *p, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "%s #%ld of %s[", fz_ops[p->op].name,
				    p->seq, fz_dtype_name(p->dt));
	for (int i = 0; i < p->nd && k < n; i++)
		k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "",
				      (long long)p->shape[i]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

fz_status fz_comm_collective(fz_comm *c, int rank, fz_opcode op, fz_dtype dt,
			     int nd, const int64_t *shape, int dim,
			     const void *x, void *y, char **err)
{
	if (err)
		*err = NULL;
	if (rank < 0 || rank >= c->world || nd < 0 || nd > FZ_MAX_RANK) {
		if (err)
			*err = fz_strdup_printf("collective: rank %d of world %d", rank,
						c->world);
		return FZ_EINVAL;
	}
	const char *what = fz_ops[op].name;
	pthread_mutex_lock(&c->mu);
	post *me = &c->slots[rank];
	me->op = op;
	me->dt = dt;
	me->nd = nd;
	me->dim = dim;
	memcpy(me->shape, shape, sizeof(int64_t) * (size_t)nd);
	me->x = x;
	me->seq = ++c->seq[rank];
	fz_status st = barrier_locked(c, rank, what);
	if (st == FZ_OK) {
		for (int q = 0; q < c->world; q++) {
			if (same_post(&c->slots[q], me))
				continue;
			char a[256], b[256], buf[600];
			describe(me, a, sizeof a);
			describe(&c->slots[q], b, sizeof b);
			snprintf(buf, sizeof buf, "ranks disagree: rank %d called %s, rank "
				 "%d called %s", rank, a, q, b);
			fail_locked(c, buf);
			st = FZ_EINVAL;
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (st == FZ_OK) {
		/* the operands stay put until the second barrier */
		const void **xs = malloc(sizeof(void *) * (size_t)c->world);
		if (!xs) {
			fz_comm_abort(c, rank, "out of memory");
			st = FZ_ENOMEM;
		} else {
			for (int q = 0; q < c->world; q++)
				xs[q] = c->slots[q].x;
			st = fz_collective_eval(op, dt, nd, shape, dim, c->world, rank, xs, y);
			free(xs);
			if (st != FZ_OK)
				fz_comm_abort(c, rank, "the operand does not divide by the world");
		}
	}
	pthread_mutex_lock(&c->mu);
	if (st == FZ_OK)
		st = barrier_locked(c, rank, what);
	if (st != FZ_OK && err && !*err)
		*err = fz_strdup_printf("%s: %s", what, c->failed ? c->why : "failed");
	pthread_mutex_unlock(&c->mu);
	return st;
}
