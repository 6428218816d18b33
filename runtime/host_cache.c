/*
 * host_cache.c: host memory for outputs, kept mapped between uses
 * (fz_host_alloc and friends in fusec.h).
 *
 * A prepared program writes its outputs into memory the caller hands it.
 * The PyTorch bridge used to hand it torch.empty, and on the CPU that was
 * the most expensive part of a call: glibc maps a block of 32 MiB or more
 * anew for every allocation and unmaps it at free (and trims its heap
 * below that), so every large output faulted in page by page on its first
 * touch. rms_norm over bf16 4096 x 4096 took 12.0 ms a call with fresh
 * outputs and 2.9 ms writing into the same output again, measured here;
 * torch.compile pays the same toll. A training step is the worst case:
 * every activation is fresh memory every step.
 *
 * So the bridge takes outputs from here. A request is rounded up to its
 * size class (64 KiB steps up to 4 MiB, 2 MiB steps above) and served by
 * the most recently released block of exactly that class, else by a new
 * mapping, 2 MiB aligned and advised to use transparent huge pages (512
 * times fewer faults where the system leaves them to madvise). A
 * training step asks for the same sizes every step, so from the second
 * step on every request is a hit and nothing faults.
 *
 * Released blocks wait on one list, most recent first; while they hold
 * more than the limit (a quarter of physical memory, $FUSEC_HOST_CACHE_MB,
 * or fz_host_cache_set_limit), the ones at the tail, released longest
 * ago, are unmapped. A lookup walks the list: a step's outputs are tens
 * to hundreds of blocks, and a walk of them costs less than one fault.
 *
 * A block reaches PyTorch as a DLPack tensor whose deleter releases it, so
 * the memory comes back when the last view of the tensor dies, on
 * whatever thread that is (autograd's included): one mutex guards the
 * lists and the counters. A fork takes that mutex first (pthread_atfork),
 * so a child (a DataLoader's worker) never starts with it held by a
 * thread the child does not have, which would hang its first output.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fusec.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define SMALL_STEP (64 * KIB)  /* classes up to SMALL_TOP */
#define SMALL_TOP (4 * MIB)
#define HUGE_PAGE (2 * MIB)    /* classes above, and every block's alignment */

/* DLPack's ABI (dlpack.h, v0.8; the legacy DLManagedTensor that every
 * consumer accepts in a "dltensor" capsule), the fields fusec fills. */
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape, *strides;
	uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
enum { DL_CPU = 1 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_BOOL = 6 };

struct fz_host_block {
	void *data;                  /* the mapping: size bytes, 2 MiB aligned */
	size_t size;                 /* the size class */
	fz_host_block *prev, *next;  /* on the free list, while released */
	DLManagedTensor dl;          /* while a DLPack tensor owns the block */
	int64_t shape[FZ_MAX_RANK], strides[FZ_MAX_RANK];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static fz_host_block *head, *tail;  /* released, most recent first */
static fz_host_stats st;
static int limit_set;

static size_t size_class(size_t n)
{
	if (n <= SMALL_TOP)
		return n ? (n + SMALL_STEP - 1) / SMALL_STEP * SMALL_STEP : SMALL_STEP;
	return (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
}

static size_t default_limit(void)
{
	const char *env = getenv("FUSEC_HOST_CACHE_MB");
	if (env && *env) {
		char *end;
		unsigned long long mb = strtoull(env, &end, 10);
		if (*end == '\0')
			return (size_t)mb * MIB;
	}
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	if (pages <= 0 || page <= 0)
		return 1024 * MIB;
	return (size_t)pages * (size_t)page / 4;
}

/* A new mapping of size bytes, HUGE_PAGE aligned: map one huge page more
 * and unmap the slack on either side. NULL when the system refuses. */
static void *map_block(size_t size)
{
	size_t span = size + HUGE_PAGE;
	char *p = mmap(NULL, span, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
	size_t lead = a - (uintptr_t)p, trail = span - lead - size;
	if (lead)
		munmap(p, lead);
	if (trail)
		munmap((char *)a + size, trail);
	if (size >= HUGE_PAGE)
		(void)madvise((void *)a, size, MADV_HUGEPAGE);
	return (void *)a;
}

/* A block of a new mapping of size bytes, or NULL. */
static fz_host_block *new_block(size_t size)
{
	fz_host_block *b = calloc(1, sizeof *b);
	if (!b)
		return NULL;
	if (!(b->data = map_block(size))) {
		free(b);
		return NULL;
	}
	b->size = size;
	return b;
}

static void unlink_block(fz_host_block *b)
{
	if (b->prev)
		b->prev->next = b->next;
	else
		head = b->next;
	if (b->next)
		b->next->prev = b->prev;
	else
		tail = b->prev;
	b->prev = b->next = NULL;
	st.cached_bytes -= b->size;
}

/* Unmaps from the tail until at most keep bytes stay cached. The blocks
 * are gathered under the lock and unmapped after it. */
static void shrink_to(size_t keep)
{
	fz_host_block *gone = NULL;
	while (tail && st.cached_bytes > keep) {
		fz_host_block *b = tail;
		unlink_block(b);
		b->next = gone;
		gone = b;
	}
	pthread_mutex_unlock(&mu);
	while (gone) {
		fz_host_block *b = gone;
		gone = b->next;
		munmap(b->data, b->size);
		free(b);
	}
}

static void ensure_limit(void)
{
	if (!limit_set) {
		st.limit_bytes = default_limit();
		limit_set = 1;
	}
}

static void fork_lock(void) { pthread_mutex_lock(&mu); }
static void fork_unlock(void) { pthread_mutex_unlock(&mu); }
static void handle_forks(void) { pthread_atfork(fork_lock, fork_unlock, fork_unlock); }

fz_host_block *fz_host_alloc(size_t bytes, void **data)
{
	size_t size = size_class(bytes);
	*data = NULL;
	pthread_once(&fork_once, handle_forks);
	pthread_mutex_lock(&mu);
	ensure_limit();
	fz_host_block *b = head;
	while (b && b->size != size)
		b = b->next;
	if (b) {
		unlink_block(b);
		st.hits++;
		st.live_bytes += size;
		pthread_mutex_unlock(&mu);
		*data = b->data;
		return b;
	}
	st.misses++;
	pthread_mutex_unlock(&mu);
	b = new_block(size);
	if (!b) {
		/* no memory: give back what is cached, and try once more */
		fz_host_cache_empty();
		if (!(b = new_block(size)))
			return NULL;
	}
	pthread_mutex_lock(&mu);
	st.live_bytes += size;
	pthread_mutex_unlock(&mu);
	*data = b->data;
	return b;
}

void fz_host_release(fz_host_block *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&mu);
	ensure_limit();
	st.live_bytes -= b->size;
	b->prev = NULL;
	b->next = head;
	if (head)
		head->prev = b;
	else
		tail = b;
	head = b;
	st.cached_bytes += b->size;
	shrink_to(st.limit_bytes);  /* unlocks */
}

static void dl_deleter(DLManagedTensor *self)
{
	fz_host_release(self->manager_ctx);
}

static int dl_dtype(fz_dtype t, DLDataType *out)
{
	static const DLDataType table[FZ_DTYPE_COUNT] = {
		[FZ_F64] = {DL_FLOAT, 64, 1}, [FZ_F32] = {DL_FLOAT, 32, 1},
		[FZ_F16] = {DL_FLOAT, 16, 1}, [FZ_BF16] = {DL_BFLOAT, 16, 1},
		[FZ_I64] = {DL_INT, 64, 1},   [FZ_I32] = {DL_INT, 32, 1},
		[FZ_I8] = {DL_INT, 8, 1},     [FZ_U8] = {DL_UINT, 8, 1},
		[FZ_BOOL] = {DL_BOOL, 8, 1},
	};
	if ((unsigned)t >= FZ_DTYPE_COUNT)
		return 0;
	*out = table[t];
	return 1;
}

void *fz_host_block_dlpack(fz_host_block *b, fz_dtype dtype, int rank,
                           const int64_t *shape)
{
	DLDataType dt;
	if (!b || rank < 0 || rank > FZ_MAX_RANK || !dl_dtype(dtype, &dt))
		return NULL;
	size_t n = dt.bits / 8;
	for (int d = rank - 1; d >= 0; d--) {
		if (shape[d] < 0 || (shape[d] && n > b->size / (size_t)shape[d]))
			return NULL;
		b->strides[d] = (int64_t)n / (dt.bits / 8);
		b->shape[d] = shape[d];
		n *= (size_t)shape[d];
	}
	if (n > b->size)
		return NULL;
	b->dl = (DLManagedTensor){
		.dl_tensor = {
			.data = b->data,
			.device = {DL_CPU, 0},
			.ndim = rank,
			.dtype = dt,
			.shape = b->shape,
			.strides = b->strides,
		},
		.manager_ctx = b,
		.deleter = dl_deleter,
	};
	return &b->dl;
}

void fz_host_cache_stats(fz_host_stats *out)
{
	pthread_mutex_lock(&mu);
	ensure_limit();
	*out = st;
	pthread_mutex_unlock(&mu);
}

void fz_host_cache_set_limit(size_t bytes)
{
	pthread_mutex_lock(&mu);
	st.limit_bytes = bytes;
	limit_set = 1;
	shrink_to(bytes);  /* unlocks */
}

void fz_host_cache_empty(void)
{
	pthread_mutex_lock(&mu);
	shrink_to(0);  /* unlocks */
}
