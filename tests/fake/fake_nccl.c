/*
 * fake_nccl.c: the NCCL entry points fusec uses (runtime/comm_nccl.c),
 * faked on the host for tests with no GPU, in the fake driver's library
 * (fake_cuda.h): its "device memory" is host memory, so the collectives
 * are performed here, exactly, across the threads that call them, one
 * thread per rank.
 *
 * What NCCL documents, and this fake does:
 *   - ncclGetUniqueId makes an id; ranks that pass the same id to
 *     ncclCommInitRankConfig form one communicator of nranks. With
 *     config->blocking == 0 the call returns ncclInProgress and
 *     ncclCommGetAsyncError reports ncclInProgress until every rank has
 *     joined, then ncclSuccess. A CUDA device must be current (the fake
 *     driver's context): the communicator is that device's. A call
 *     without one is counted (nccl_no_device) and refused. A collective
 *     enqueued on a stream of another device is refused too
 *     (nccl_wrong_device; the fake driver's streams know their device).
 *   - ncclAllGather(send, recv, sendcount): recv holds rank q's sendcount
 *     elements at q * sendcount, in rank order. ncclReduceScatter(send,
 *     recv, recvcount, sum): recv = the sum over ranks of send's block
 *     [rank * recvcount, (rank + 1) * recvcount). ncclAllReduce(count,
 *     sum): every rank's recv = the sum of all sends. Sums are taken in
 *     f64 in rank order and rounded once (for two ranks: the correctly
 *     rounded sum, as any order gives). In place (send == recv, or the
 *     all_gather's own slot) is allowed, as NCCL allows it.
 *   - Every rank must call the same collectives in the same order with
 *     the same counts and types: a mismatch is ncclInvalidUsage.
 *   - ncclGroupStart/End (per thread): the calls between are deferred to
 *     ncclGroupEnd, then performed in order.
 *   - On a non-blocking communicator a collective (or ncclGroupEnd) may
 *     answer ncclInProgress; the caller must then poll
 *     ncclCommGetAsyncError before its next call on it. This fake always
 *     answers so, and refuses a call made without polling
 *     (nccl_unpolled).
 *
 * The device would run a collective later, on the stream; the fake driver
 * runs everything at once in call order, and so does this (a rank's call
 * returns when every rank has made it: the fake's "device" is the
 * calling thread). Each collective is logged ('N', fake_cuda.log) with
 * its stream, so tests check where it was enqueued and what ordered it.
 * A rank that never arrives makes the others fail after 20 s with
 * ncclSystemError rather than hang a test. A collective enqueued on a
 * capturing stream becomes a node of the graph (fake_defer) and is
 * performed at each launch of it, as NCCL's captured kernels are.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define API __attribute__((visibility("default")))
#define MAX_RANKS 8
#define MAX_CLIQUES 16

enum { OK = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, INVALID_USAGE = 5,
       IN_PROGRESS = 7 };
enum { AG, RS, AR };

typedef struct { char internal[128]; } ncclUniqueId;

typedef struct config { /* the prefix of ncclConfig_t fusec sets */
	size_t size;
	unsigned int magic, version;
	int blocking;
} config;

typedef struct post {
	int kind, dtype, redop;
	size_t count;           /* AG: send count; RS: recv count; AR: count */
	const void *send;
	void *recv;
	long seq;
} post;

typedef struct clique {
	char id[128];
	int world, joined, left;
	bool used;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int arrived;
	long generation;
	bool failed;
	post slot[MAX_RANKS];
} clique;

typedef struct comm {
	clique *q;
	int rank, dev;
	long seq;
	int blocking;
	int pending;            /* a call answered ncclInProgress, not yet
	                           polled to completion */
} comm;

extern fake_state fake_cuda;
int fake_current_device(void);

static pthread_mutex_t cliques_mu = PTHREAD_MUTEX_INITIALIZER;
static clique cliques[MAX_CLIQUES];
static long ids_made;

API const char *ncclGetErrorString(int r)
{
	return r == OK ? "no error" : r == SYSTEM_ERROR ? "unhandled system error" :
	       r == INVALID_ARGUMENT ? "invalid argument" :
	       r == INVALID_USAGE ? "invalid usage" : r == IN_PROGRESS ?
	       "operation in progress" : "unknown result code";
}

API int ncclGetUniqueId(ncclUniqueId *id)
{
	memset(id, 0, sizeof *id);
	long n = __atomic_add_fetch(&ids_made, 1, __ATOMIC_RELAXED);
	snprintf(id->internal, sizeof id->internal, "fake-nccl-%ld-%ld",
	         (long)getpid(), n);
	return OK;
}

API int ncclCommInitRankConfig(comm **out, int nranks, ncclUniqueId id, int rank,
                               config *cfg)
{
	*out = NULL;
	if (fake_current_device() < 0) {
		__atomic_fetch_add(&fake_cuda.nccl_no_device, 1, __ATOMIC_RELAXED);
		return INVALID_USAGE;
	}
	if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
		return INVALID_ARGUMENT;
	pthread_mutex_lock(&cliques_mu);
	clique *q = NULL;
	for (int i = 0; i < MAX_CLIQUES && !q; i++)
		if (cliques[i].used && !memcmp(cliques[i].id, id.internal, 128) &&
		    cliques[i].joined < cliques[i].world)
			q = &cliques[i];
	for (int i = 0; i < MAX_CLIQUES && !q; i++)
		if (!cliques[i].used) {
			q = &cliques[i];
			memset(q, 0, sizeof *q);
			q->used = true;
			memcpy(q->id, id.internal, 128);
			q->world = nranks;
			pthread_mutex_init(&q->mu, NULL);
			pthread_cond_init(&q->cv, NULL);
		}
	if (!q || q->world != nranks) {
		pthread_mutex_unlock(&cliques_mu);
		return INVALID_USAGE;
	}
	comm *c = calloc(1, sizeof *c);
	c->q = q;
	c->rank = rank;
	c->dev = fake_current_device();
	c->blocking = !cfg || cfg->blocking != 0;
	pthread_mutex_lock(&q->mu);
	q->joined++;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
	pthread_mutex_unlock(&cliques_mu);
	__atomic_fetch_add(&fake_cuda.nccl_comms, 1, __ATOMIC_RELAXED);
	*out = c;
	return cfg && cfg->blocking == 0 ? IN_PROGRESS : OK;
}

API int ncclCommGetAsyncError(comm *c, int *state)
{
	c->pending = 0; /* polled: the enqueue is done */
	pthread_mutex_lock(&c->q->mu);
	*state = c->q->failed ? SYSTEM_ERROR : c->q->joined < c->q->world ? IN_PROGRESS
	                                                                  : OK;
	pthread_mutex_unlock(&c->q->mu);
	return OK;
}

static void leave(comm *c)
{
	__atomic_fetch_sub(&fake_cuda.nccl_comms, 1, __ATOMIC_RELAXED);
	pthread_mutex_lock(&cliques_mu);
	if (++c->q->left == c->q->world) /* the last rank out frees the clique */
		c->q->used = false;
	pthread_mutex_unlock(&cliques_mu);
	free(c);
}

API int ncclCommDestroy(comm *c) { leave(c); return OK; }

API int ncclCommAbort(comm *c)
{
	pthread_mutex_lock(&c->q->mu);
	c->q->failed = true;
	pthread_cond_broadcast(&c->q->cv);
	pthread_mutex_unlock(&c->q->mu);
	leave(c);
	return OK;
}

/* All ranks at this point, or an error (a deadline of 20 s). */
static int barrier(clique *q)
{
	long gen = q->generation;
	if (++q->arrived == q->world) {
		q->arrived = 0;
		q->generation++;
		pthread_cond_broadcast(&q->cv);
		return OK;
	}
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 20;
	while (q->generation == gen && !q->failed)
		if (pthread_cond_timedwait(&q->cv, &q->mu, &dl) == ETIMEDOUT)
			q->failed = true;
	return q->generation != gen ? OK : SYSTEM_ERROR;
}

static size_t elem_size(int t)
{
	switch (t) {
	case 0: case 1: return 1;       /* int8, uint8 */
	case 2: case 3: case 7: return 4; /* int32, uint32, float32 */
	case 4: case 5: case 8: return 8; /* int64, uint64, float64 */
	case 6: case 9: return 2;       /* float16, bfloat16 */
	default: return 0;
	}
}

static double get(int t, const void *p, size_t i)
{
	switch (t) {
	case 0: return ((const int8_t *)p)[i];
	case 1: return ((const uint8_t *)p)[i];
	case 2: return ((const int32_t *)p)[i];
	case 4: return (double)((const int64_t *)p)[i];
	case 7: return ((const float *)p)[i];
	case 8: return ((const double *)p)[i];
	case 9: {
		uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	default: return 0;
	}
}

static void put(int t, void *p, size_t i, double v)
{
	switch (t) {
	case 0: ((int8_t *)p)[i] = (int8_t)v; break;
	case 1: ((uint8_t *)p)[i] = (uint8_t)v; break;
	case 2: ((int32_t *)p)[i] = (int32_t)v; break;
	case 4: ((int64_t *)p)[i] = (int64_t)v; break;
	case 7: ((float *)p)[i] = (float)v; break;
	case 8: ((double *)p)[i] = v; break;
	case 9: { /* round to nearest even */
		float f = (float)v;
		uint32_t u;
		memcpy(&u, &f, 4);
		u += 0x7fff + ((u >> 16) & 1);
		((uint16_t *)p)[i] = (uint16_t)(u >> 16);
		break;
	}
	}
}

typedef struct deferred {
	comm *c;
	post p;
	void *stream;
} deferred;

static int perform(comm *c, post me, void *stream);

static void run_deferred(void *ctx, void *stream)
{
	deferred *d = ctx;
	(void)perform(d->c, d->p, stream); /* a replay has no status to give */
}

/* Performs rank c's part of post me with every rank (now, or at each
 * launch of the graph the stream is capturing). */
static int perform(comm *c, post me, void *stream)
{
	deferred dd = {c, me, stream};
	int captured = fake_defer(stream, 'N', run_deferred, &dd, sizeof dd);
	if (captured > 1)
		return INVALID_USAGE;
	if (captured == 1)
		return OK;
	clique *q = c->q;
	size_t es = elem_size(me.dtype);
	if (!es || (me.kind != AG && (me.dtype == 3 || me.dtype == 5 || me.dtype == 6)) ||
	    (me.kind != AG && me.redop != 0))
		return INVALID_ARGUMENT; /* types and ops the fake does not sum */
	if (stream && *(int *)stream != c->dev) {
		/* a stream of another device than the communicator's */
		__atomic_fetch_add(&fake_cuda.nccl_wrong_device, 1, __ATOMIC_RELAXED);
		return INVALID_ARGUMENT;
	}
	fake_op *o = fake_log('N', stream);
	if (o) {
		o->x = me.send;
		o->y = me.recv;
	}
	me.seq = ++c->seq;
	int W = q->world;
	size_t out_n = me.kind == AG ? me.count * (size_t)W : me.count;
	void *tmp = malloc(out_n * es + 1);
	pthread_mutex_lock(&q->mu);
	q->slot[c->rank] = me;
	int r = barrier(q);
	for (int p = 0; r == OK && p < W; p++) {
		const post *s = &q->slot[p];
		if (s->kind != me.kind || s->dtype != me.dtype || s->count != me.count ||
		    s->redop != me.redop || s->seq != me.seq) {
			q->failed = true;
			r = INVALID_USAGE;
		}
	}
	pthread_mutex_unlock(&q->mu);
	/* everyone posted: read the others' operands */
	for (size_t i = 0; r == OK && i < out_n; i++) {
		if (me.kind == AG) {
			const post *s = &q->slot[i / me.count];
			memcpy((char *)tmp + i * es, (const char *)s->send + (i % me.count) * es,
			       es);
			continue;
		}
		size_t at = me.kind == RS ? (size_t)c->rank * me.count + i : i;
		double sum = 0;
		for (int p = 0; p < W; p++)
			sum += get(me.dtype, q->slot[p].send, at);
		put(me.dtype, tmp, i, sum);
	}
	pthread_mutex_lock(&q->mu);
	if (r == OK)
		r = barrier(q); /* nobody writes until everyone has read */
	pthread_mutex_unlock(&q->mu);
	if (r == OK)
		memcpy(me.recv, tmp, out_n * es);
	free(tmp);
	if (r == OK)
		__atomic_fetch_add(&fake_cuda.nccl_ops, 1, __ATOMIC_RELAXED);
	return r;
}

/* ncclGroupStart/End: this thread's deferred calls. */
static _Thread_local int group_depth;
static _Thread_local deferred group_ops[64];
static _Thread_local int group_n;

/* A non-blocking communicator answers ncclInProgress: the caller must
 * poll ncclCommGetAsyncError before its next call, as NCCL asks; a call
 * made before that is refused (nccl_unpolled). */
static int call(comm *c, post p, void *stream)
{
	if (!c)
		return INVALID_ARGUMENT;
	if (c->pending) {
		__atomic_fetch_add(&fake_cuda.nccl_unpolled, 1, __ATOMIC_RELAXED);
		return INVALID_USAGE;
	}
	if (group_depth > 0) {
		if (group_n == 64)
			return INVALID_USAGE;
		group_ops[group_n++] = (deferred){c, p, stream};
		return OK;
	}
	int r = perform(c, p, stream);
	if (r == OK && !c->blocking) {
		c->pending = 1;
		return IN_PROGRESS;
	}
	return r;
}

API int ncclGroupStart(void)
{
	group_depth++;
	return OK;
}

API int ncclGroupEnd(void)
{
	if (group_depth == 0)
		return INVALID_USAGE;
	if (--group_depth > 0)
		return OK;
	int r = OK;
	bool nonblocking = false;
	if (group_n)
		__atomic_fetch_add(&fake_cuda.nccl_groups, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < group_n && r == OK; i++) {
		r = perform(group_ops[i].c, group_ops[i].p, group_ops[i].stream);
		if (!group_ops[i].c->blocking) {
			group_ops[i].c->pending = 1;
			nonblocking = true;
		}
	}
	group_n = 0;
	return r == OK && nonblocking ? IN_PROGRESS : r;
}

API int ncclAllGather(const void *send, void *recv, size_t sendcount, int dtype,
                      comm *c, void *stream)
{
	return call(c, (post){AG, dtype, 0, sendcount, send, recv, 0}, stream);
}

API int ncclReduceScatter(const void *send, void *recv, size_t recvcount, int dtype,
                          int op, comm *c, void *stream)
{
	return call(c, (post){RS, dtype, op, recvcount, send, recv, 0}, stream);
}

API int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op,
                      comm *c, void *stream)
{
	return call(c, (post){AR, dtype, op, count, send, recv, 0}, stream);
}
