/*
 * comm_nccl.c: NCCL as the GPU's communication engine, opened at run time.
 *
 * UNTESTED ON A GPU. This build's machines have no GPU. Written against
 * NCCL 2.x's documented API (nccl.h), and run here against a fake libnccl
 * (tests/fake/fake_nccl.c: the documented semantics on host memory, with
 * threads as ranks; tests/test_cuda_api.c and tests/cuda_fake_run.sh) and,
 * where a real libnccl is installed, for the unique id and the file
 * bootstrap (tests/test_comm.c). The CUDA target (cuda.c) calls the
 * collectives on its communication stream.
 *
 * Loading. libnccl.so.2 is opened with dlopen ($FUSEC_NCCL_LIBRARY first),
 * so the library builds and links with no NCCL installed, and its absence
 * is a clear status, not a failed link. Where the build finds the
 * toolkit's nccl.h, the types, constants and config layout used here are
 * checked against it at compile time.
 *
 * Bootstrap: the ranks agree on one ncclUniqueId (128 bytes) made by rank 0
 * with ncclGetUniqueId, then each calls ncclCommInitRank. How the id
 * travels:
 *   - NCCL_COMM_ID=host:port in the environment: NCCL derives the id from
 *     it on every rank (ncclGetUniqueId reads it), nothing to share;
 *   - a file every rank can read (fz_nccl_bootstrap_file): rank 0 writes it
 *     atomically (a temporary file renamed into place), the others poll for
 *     it until a deadline;
 *   - the caller's own channel: the PyTorch bridge broadcasts rank 0's id
 *     over the caller's torch.distributed process group
 *     (fusec.torch.nccl_unique_id), so `torchrun --nnodes N` across
 *     machines needs nothing more.
 * The communicator is formed non-blocking (ncclConfig_t.blocking = 0) and
 * polled with ncclCommGetAsyncError until a deadline, so a rank that never
 * joins is an error naming the timeout, after ncclCommAbort, never a hang.
 *
 * Collectives are enqueued on the stream the caller gives (the CUDA
 * target's communication stream) and return at once: no host
 * synchronization. The CUDA target records an event after each and makes
 * its compute stream wait on it at the `wait`. NCCL gathers and scatters
 * flat buffers, which is the trace's dim 0 (what FSDP shards); a collective
 * along an inner dim (outer > 1) would need a transposing copy on each side
 * and is FZ_EUNSUPPORTED here. A bucket is one ncclGroupStart/End around
 * its members: one launch.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"

typedef struct nccl_id { char internal[FZ_NCCL_ID_BYTES]; } nccl_id;
typedef void *nccl_comm_t;

/* The prefix of ncclConfig_t that NCCL 2.14 introduced; `size` tells NCCL
 * how much of the struct the caller knows. */
typedef struct nccl_config {
	size_t size;
	unsigned int magic, version;
	int blocking, cga_cluster_size, min_ctas, max_ctas;
	const char *net_name;
} nccl_config;

enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7, NCCL_SUM = 0 };
#define NCCL_UNDEF_INT (-2147483647 - 1)

/* Where the build finds the toolkit's nccl.h, what is declared here is
 * checked against it: the config prefix's layout, the constants, and the
 * types of the entry points (as the driver's are in cuda_api.c). */
#if defined(FZ_HAVE_CUDA_H) && defined(__has_include)
#if __has_include(<nccl.h>)
#include <stddef.h>
#include <nccl.h>
#define FZ_NCCL_SAME_AT(f1, f2) \
	_Static_assert(offsetof(nccl_config, f1) == offsetof(ncclConfig_t, f2), \
		       "ncclConfig_t." #f2 " is elsewhere than here");
FZ_NCCL_SAME_AT(size, size)
FZ_NCCL_SAME_AT(magic, magic)
FZ_NCCL_SAME_AT(version, version)
FZ_NCCL_SAME_AT(blocking, blocking)
FZ_NCCL_SAME_AT(cga_cluster_size, cgaClusterSize)
FZ_NCCL_SAME_AT(min_ctas, minCTAs)
FZ_NCCL_SAME_AT(max_ctas, maxCTAs)
FZ_NCCL_SAME_AT(net_name, netName)
_Static_assert(sizeof(nccl_id) == sizeof(ncclUniqueId), "ncclUniqueId's size");
_Static_assert((int)NCCL_SUCCESS == (int)ncclSuccess &&
	       (int)NCCL_IN_PROGRESS == (int)ncclInProgress &&
	       (int)NCCL_SUM == (int)ncclSum && NCCL_UNDEF_INT == NCCL_CONFIG_UNDEF_INT,
	       "NCCL's constants");
_Static_assert(ncclInt8 == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt64 == 4 &&
	       ncclFloat16 == 6 && ncclFloat32 == 7 && ncclFloat64 == 8 &&
	       ncclBfloat16 == 9, "NCCL's data types");
#define FZ_NCCL_TYPE(f, params) \
	_Static_assert(_Generic(&f, ncclResult_t(*) params: 1, default: 0), \
		       "the type of " #f " differs from nccl.h");
FZ_NCCL_TYPE(ncclGetUniqueId, (ncclUniqueId *))
FZ_NCCL_TYPE(ncclCommInitRankConfig, (ncclComm_t *, int, ncclUniqueId, int,
				      ncclConfig_t *))
FZ_NCCL_TYPE(ncclCommGetAsyncError, (ncclComm_t, ncclResult_t *))
FZ_NCCL_TYPE(ncclCommAbort, (ncclComm_t))
FZ_NCCL_TYPE(ncclCommDestroy, (ncclComm_t))
FZ_NCCL_TYPE(ncclAllGather, (const void *, void *, size_t, ncclDataType_t,
			     ncclComm_t, cudaStream_t))
FZ_NCCL_TYPE(ncclReduceScatter, (const void *, void *, size_t, ncclDataType_t,
				 ncclRedOp_t, ncclComm_t, cudaStream_t))
FZ_NCCL_TYPE(ncclAllReduce, (const void *, void *, size_t, ncclDataType_t,
			     ncclRedOp_t, ncclComm_t, cudaStream_t))
#endif
#endif

static struct {
	void *lib;
	int (*get_unique_id)(nccl_id *);
	int (*init_rank_config)(nccl_comm_t *, int, nccl_id, int, nccl_config *);
	int (*get_async_error)(nccl_comm_t, int *);
	int (*abort)(nccl_comm_t);
	int (*destroy)(nccl_comm_t);
	int (*all_gather)(const void *, void *, size_t, int, nccl_comm_t, void *);
	int (*reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm_t,
			      void *);
	int (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
	int (*group_start)(void);
	int (*group_end)(void);
	const char *(*error_string)(int);
	char why[512];
} api;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void)
{
	const char *names[] = {getenv("FUSEC_NCCL_LIBRARY"), "libnccl.so.2",
			       "libnccl.so"};
	for (int i = 0; i < 3 && !api.lib; i++)
		if (names[i] && *names[i])
			api.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!api.lib) {
		snprintf(api.why, sizeof api.why, "NCCL is not available: libnccl.so.2 "
			 "could not be opened (%s); set FUSEC_NCCL_LIBRARY to its path",
			 dlerror());
		return;
	}
#define SYM(field, name) \
	if (!(*(void **)&api.field = dlsym(api.lib, name))) { \
		snprintf(api.why, sizeof api.why, "NCCL is too old: no %s", name); \
		dlclose(api.lib); \
		api.lib = NULL; \
		return; \
	}
	SYM(get_unique_id, "ncclGetUniqueId")
	SYM(init_rank_config, "ncclCommInitRankConfig")
	SYM(get_async_error, "ncclCommGetAsyncError")
	SYM(abort, "ncclCommAbort")
	SYM(destroy, "ncclCommDestroy")
	SYM(all_gather, "ncclAllGather")
	SYM(reduce_scatter, "ncclReduceScatter")
	SYM(all_reduce, "ncclAllReduce")
	SYM(group_start, "ncclGroupStart")
	SYM(group_end, "ncclGroupEnd")
	SYM(error_string, "ncclGetErrorString")
#undef SYM
}

static fz_status loaded(char **err)
{
	pthread_once(&load_once, load);
	if (api.lib)
		return FZ_OK;
	if (err)
		*err = fz_strdup(api.why);
	return FZ_EUNSUPPORTED;
}

static fz_status nccl_fail(int rc, const char *what, char **err)
{
	if (err)
		*err = fz_strdup_printf("%s: NCCL error %d (%s)", what, rc,
					api.error_string ? api.error_string(rc) : "?");
	return FZ_EINVAL;
}

FZ_API fz_status fz_nccl_unique_id(unsigned char id[FZ_NCCL_ID_BYTES], char **err)
{
	if (err)
		*err = NULL;
	fz_status st = loaded(err);
	if (st != FZ_OK)
		return st;
	nccl_id u;
	int rc = api.get_unique_id(&u);
	if (rc != NCCL_SUCCESS)
		return nccl_fail(rc, "ncclGetUniqueId", err);
	memcpy(id, u.internal, FZ_NCCL_ID_BYTES);
	return FZ_OK;
}


fz_status fz_nccl_bootstrap_file(int rank, const char *path, double timeout_s,
				 unsigned char id[FZ_NCCL_ID_BYTES], char **err)
{
	if (err)
		*err = NULL;
	if (timeout_s <= 0)
		timeout_s = 60;
	if (rank == 0) {
		fz_status st = fz_nccl_unique_id(id, err);
		if (st != FZ_OK)
			return st;
		char *tmp = fz_strdup_printf("%s.tmp.%ld", path, (long)getpid());
		FILE *f = tmp ? fopen(tmp, "wb") : NULL;
		bool ok = f && fwrite(id, 1, FZ_NCCL_ID_BYTES, f) == FZ_NCCL_ID_BYTES;
		if (f && fclose(f) != 0)
			ok = false;
		if (ok && rename(tmp, path) != 0)
			ok = false;
		if (!ok) {
			if (err)
				*err = fz_strdup_printf("rank 0 could not write the NCCL id to "
							"%s: %s", path, strerror(errno));
			if (tmp)
				unlink(tmp);
		}
		free(tmp);
		return ok ? FZ_OK : FZ_EINVAL;
	}
	double end = fz_now() + timeout_s;
	for (;;) {
		FILE *f = fopen(path, "rb");
		if (f) {
			size_t n = fread(id, 1, FZ_NCCL_ID_BYTES, f);
			fclose(f);
			if (n == FZ_NCCL_ID_BYTES)
				return FZ_OK;
		}
		if (fz_now() > end) {
			if (err)
				*err = fz_strdup_printf("rank %d: rank 0 did not publish the "
							"NCCL id in %s within %g s", rank,
							path, timeout_s);
			return FZ_EINVAL;
		}
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

struct fz_nccl {
	nccl_comm_t comm;
	int world, rank;
};

fz_status fz_nccl_new(int world, int rank, const unsigned char id[FZ_NCCL_ID_BYTES],
		      double timeout_s, fz_nccl **out, char **err)
{
	*out = NULL;
	if (err)
		*err = NULL;
	fz_status st = loaded(err);
	if (st != FZ_OK)
		return st;
	if (world < 1 || rank < 0 || rank >= world) {
		if (err)
			*err = fz_strdup_printf("NCCL: rank %d of world %d", rank, world);
		return FZ_EINVAL;
	}
	fz_nccl *c = calloc(1, sizeof *c);
	if (!c)
		return FZ_ENOMEM;
	c->world = world;
	c->rank = rank;
	nccl_id u;
	memcpy(u.internal, id, FZ_NCCL_ID_BYTES);
	nccl_config cfg = {sizeof cfg, 0xcafebeef, 21400, 0, NCCL_UNDEF_INT,
			   NCCL_UNDEF_INT, NCCL_UNDEF_INT, NULL};
	int rc = api.init_rank_config(&c->comm, world, u, rank, &cfg);
	if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) {
		free(c);
		return nccl_fail(rc, "ncclCommInitRankConfig", err);
	}
	double end = fz_now() + (timeout_s > 0 ? timeout_s : 60);
	int state = NCCL_IN_PROGRESS;
	while (state == NCCL_IN_PROGRESS) {
		rc = api.get_async_error(c->comm, &state);
		if (rc != NCCL_SUCCESS)
			state = rc;
		if (state == NCCL_IN_PROGRESS && fz_now() > end) {
			api.abort(c->comm);
			free(c);
			if (err)
				*err = fz_strdup_printf("rank %d: the NCCL communicator of %d "
							"ranks did not form within %g s (a rank "
							"never joined?)", rank, world,
							timeout_s > 0 ? timeout_s : 60);
			return FZ_EINVAL;
		}
		if (state == NCCL_IN_PROGRESS) {
			struct timespec ts = {0, 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	if (state != NCCL_SUCCESS) {
		api.abort(c->comm);
		free(c);
		return nccl_fail(state, "forming the communicator", err);
	}
	*out = c;
	return FZ_OK;
}

void fz_nccl_free(fz_nccl *c)
{
	if (!c)
		return;
	if (c->comm)
		api.destroy(c->comm);
	free(c);
}

/* A non-blocking communicator may answer a call with ncclInProgress: the
 * call is being enqueued, and NCCL asks that the caller poll
 * ncclCommGetAsyncError until it is done before the next call. This waits
 * for the host-side enqueue, not for the device. */
static fz_status enqueued(fz_nccl *c, const char *what, char **err)
{
	double end = fz_now() + 60;
	int state = NCCL_IN_PROGRESS;
	while (state == NCCL_IN_PROGRESS) {
		int rc = api.get_async_error(c->comm, &state);
		if (rc != NCCL_SUCCESS)
			state = rc;
		if (state == NCCL_IN_PROGRESS && fz_now() > end) {
			if (err)
				*err = fz_strdup_printf("%s: NCCL did not enqueue it within "
							"60 s", what);
			return FZ_ERUNTIME;
		}
	}
	return state == NCCL_SUCCESS ? FZ_OK : nccl_fail(state, what, err);
}

void fz_nccl_abort(fz_nccl *c)
{
	if (!c)
		return;
	if (c->comm)
		api.abort(c->comm);
	free(c);
}

static int nccl_dtype(fz_dtype d)
{
	switch (d) {
	case FZ_I8: return 0;
	case FZ_U8: case FZ_BOOL: return 1;
	case FZ_I32: return 2;
	case FZ_I64: return 4;
	case FZ_F16: return 6;
	case FZ_F32: return 7;
	case FZ_F64: return 8;
	case FZ_BF16: return 9;
	default: return -1;
	}
}

fz_status fz_nccl_collective(fz_nccl *c, fz_opcode op, fz_dtype dt, int64_t outer,
			     int64_t count, const void *x, void *y, void *stream,
			     char **err)
{
	if (err)
		*err = NULL;
	int t = nccl_dtype(dt);
	if (t < 0 || (dt == FZ_BOOL && op != FZ_OP_ALL_GATHER)) {
		if (err)
			*err = fz_strdup_printf("%s of %s: no NCCL type", fz_ops[op].name,
						fz_dtype_name(dt));
		return FZ_EUNSUPPORTED;
	}
	if (outer != 1 && op != FZ_OP_ALL_REDUCE) {
		if (err)
			*err = fz_strdup_printf("%s along an inner dim: NCCL moves flat "
						"buffers (dim 0); not supported",
						fz_ops[op].name);
		return FZ_EUNSUPPORTED;
	}
	int rc;
	switch (op) {
	case FZ_OP_ALL_GATHER: /* count: the operand's elements */
		rc = api.all_gather(x, y, (size_t)count, t, c->comm, stream);
		break;
	case FZ_OP_REDUCE_SCATTER: /* NCCL counts the result */
		if (count % c->world) {
			if (err)
				*err = fz_strdup_printf("reduce_scatter of %lld elements over %d "
							"ranks", (long long)count, c->world);
			return FZ_EINVAL;
		}
		rc = api.reduce_scatter(x, y, (size_t)(count / c->world), t, NCCL_SUM,
					c->comm, stream);
		break;
	case FZ_OP_ALL_REDUCE:
		rc = api.all_reduce(x, y, (size_t)(count * outer), t, NCCL_SUM, c->comm,
				    stream);
		break;
	default:
		return FZ_EINVAL;
	}
	if (rc == NCCL_IN_PROGRESS)
		return enqueued(c, fz_ops[op].name, err);
	if (rc != NCCL_SUCCESS)
		return nccl_fail(rc, fz_ops[op].name, err);
	return FZ_OK;
}

fz_status fz_nccl_group(fz_nccl *c, bool start, char **err)
{
	if (err)
		*err = NULL;
	fz_status st = loaded(err);
	if (st != FZ_OK)
		return st;
	int rc = start ? api.group_start() : api.group_end();
	/* a group of a non-blocking communicator may still be enqueueing */
	if (rc == NCCL_IN_PROGRESS && !start && c)
		return enqueued(c, "ncclGroupEnd", err);
	if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS)
		return nccl_fail(rc, start ? "ncclGroupStart" : "ncclGroupEnd", err);
	return FZ_OK;
}
