/*
 * cpu.c: the CPU target.
 *
 * Kernels are host code: each key's object (from the cache, or just
 * compiled) is linked once into the device's JIT, and a launch runs its
 * entry point across the device's thread pool (pool.c): the skeletons'
 * host entry points take a part index and a part count and run that
 * contiguous chunk of their rows or lane groups (fz_host_fn), so a launch
 * is fz_pool_run over parts, at most four per thread, sized from the
 * kernel's work at the bound sizes so that a small launch stays on the
 * calling thread. Matrix products go to the BLAS (blas.c: OpenBLAS opened
 * at run time, split across the same pool, f32 accumulation as PyTorch
 * does on the CPU). Memory is host memory, so uploads, downloads and
 * copies are plain memory moves, events are no-ops and sync has nothing
 * to wait for; collectives are those of a world of one.
 *
 * Strided copies. A view a kernel or a product cannot read where it lies
 * is gathered into a contiguous block (fz_layout_gather moves each run of
 * contiguous elements with one memcpy). A transpose has runs of one
 * element: the weight gradients' x^T of a training step ([2048, 512] read
 * with strides [1, 2048]) moved 4 MB in 23 ms that way, element by
 * element down the columns. Where the innermost extent is strided and an
 * outer one is contiguous in the source, the copy goes by tiles of 16 x
 * 16 elements, the tiles split across the pool: 0.9 ms for that copy.
 *
 * Fresh memory. A large block fresh from malloc (glibc maps anything of
 * 32 MiB or more anew per call, so every torch.empty of a big output is
 * one) faults on its first touch once per 4 KiB page: 8192 faults for a
 * 32 MiB output, which on a VM cost more than the kernel that writes it
 * (33 ms against 12 ms to fill 32 MiB, measured here). Arenas and the
 * outputs a run is handed are advised to use transparent huge pages
 * where the system leaves them to madvise, 512 times fewer faults; the
 * Python binding takes large outputs from the host cache
 * (host_cache.c), whose blocks stay mapped from one run to the next.
 *
 * There is one CPU device per process, shared by every program on it (the
 * kernel store then loads each key once); it lives while a program holds
 * it. Its pool has fz_exec_options.threads threads, else $FUSEC_THREADS,
 * else as many as the CPUs this process may run on, as the program that
 * opens it asks; programs that open it while it lives share that pool.
 * In a process that has an OpenMP runtime loaded (PyTorch's), the pool
 * runs its jobs on that runtime's team rather than on threads of its own
 * (pool.c says why, and what it costs on a crowded machine).
 */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "blas.h"
#include "comm.h"
#include "pool.h"
#include "target.h"

typedef struct cpu_device {
	fz_device h;
	fz_compiler *jit;      /* links the kernels' objects */
	fz_pool *pool;         /* runs launches and products */
	fz_blas *blas;
} cpu_device;

static pthread_mutex_t cpu_mu = PTHREAD_MUTEX_INITIALIZER;
static cpu_device *cpu_dev;   /* the process's, while held */


static void cpu_close(fz_device *d)
{
	cpu_device *c = (cpu_device *)d;
	pthread_mutex_lock(&cpu_mu);
	if (cpu_dev == c)
		cpu_dev = NULL;
	pthread_mutex_unlock(&cpu_mu);
	fz_compiler_free(c->jit);
	fz_pool_free(c->pool);
	fz_blas_close(c->blas);
	free(c);
}

static fz_status cpu_open(const fz_exec_options *o, fz_device **out, char **err)
{
	fz_status st = FZ_OK;
	pthread_mutex_lock(&cpu_mu);
	if (cpu_dev && fz_device_try_retain(&cpu_dev->h)) {
		*out = &cpu_dev->h;
		pthread_mutex_unlock(&cpu_mu);
		return FZ_OK;
	}
	cpu_device *c = calloc(1, sizeof *c);
	if (!c) {
		pthread_mutex_unlock(&cpu_mu);
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	fz_cg_options cg = {.target = FZ_CG_HOST};
	int threads = o && o->threads > 0 ? o->threads : 0;
	const char *env = getenv("FUSEC_THREADS");
	if (threads == 0 && env && atoi(env) > 0)
		threads = atoi(env);
	if ((st = fz_device_init(&c->h, &fz_target_cpu, err)) == FZ_OK)
		st = fz_compiler_new(&cg, &c->jit, err);
	if (st == FZ_OK)
		st = fz_pool_new(threads, &c->pool, err);
	if (st == FZ_OK)
		st = fz_blas_open(&c->blas, err);
	if (st != FZ_OK) {
		pthread_mutex_unlock(&cpu_mu);
		fz_compiler_free(c->jit);
		fz_pool_free(c->pool);
		free(c);
		return st;
	}
	c->h.cg = cg;
	c->h.threads = fz_pool_threads(c->pool);
	cpu_dev = c;
	pthread_mutex_unlock(&cpu_mu);
	*out = &c->h;
	return FZ_OK;
}

const char *fz_cpu_blas(void)
{
	pthread_mutex_lock(&cpu_mu);
	const char *name = cpu_dev ? fz_blas_name(cpu_dev->blas) : NULL;
	pthread_mutex_unlock(&cpu_mu);
	return name;
}

#define THP_BYTES ((uintptr_t)2 << 20)  /* an x86-64 huge page */

/* Huge pages for the whole huge pages inside p[0..n), if n is large. */
static void cpu_fresh(fz_device *d, void *p, size_t n)
{
	(void)d;
	if (n < 2 * THP_BYTES)
		return;
	uintptr_t a = ((uintptr_t)p + THP_BYTES - 1) & ~(THP_BYTES - 1);
	uintptr_t e = ((uintptr_t)p + n) & ~(THP_BYTES - 1);
	if (e > a)
		(void)madvise((void *)a, e - a, MADV_HUGEPAGE);
}

/* A buffer of a page or more starts on a page: the arena's large buffers
 * are planned on pages of it (ir/memplan.c says why: 4K aliasing). */
static fz_status cpu_alloc(fz_device *d, size_t n, void **p, char **err)
{
	size_t align = n >= 4096 ? 4096 : 256;
	n = (n + align - 1) / align * align;
	*p = aligned_alloc(align, n ? n : 256);
	if (!*p) {
		fz_set_err(err, fz_strdup_printf("out of memory (%zu bytes)", n));
		return FZ_ENOMEM;
	}
	cpu_fresh(d, *p, n);
	memset(*p, 0, n ? n : 256);
	return FZ_OK;
}

static void cpu_release(fz_device *d, void *p)
{
	(void)d;
	free(p);
}

static fz_status cpu_move(fz_device *d, void *dst, const void *src, size_t n,
			  void *stream, char **err)
{
	(void)d;
	(void)stream;
	(void)err;
	if (n)
		memmove(dst, src, n);
	return FZ_OK;
}

/* dst (contiguous) from src seen through lay. */
/* A transposing gather: src seen through lay, whose innermost dim L is
 * strided and whose dim P is contiguous, into dst in row-major order. A
 * part is one band of TILE indices along P for one index of the other
 * dims; it walks its band in TILE x TILE tiles along L. */
enum { TILE = 16 };

typedef struct tgather {
	char *dst;
	const char *src;
	size_t es;
	const fz_layout *lay;
	int P, L;
	int64_t bands;          /* bands along P per index of the other dims */
	int64_t dstride[FZ_MAX_RANK];
} tgather;

/* A tile is read along P, one source line per index of L, and written
 * down P into 16 destination lines (0.9 ms for 4 MB here). Reading down
 * L instead thrashed the L1 where the source's stride is a power of two
 * (32 lines 8 KiB apart share one set); tiles of 32 were 3x slower, and
 * so was a buffer between the two sides. */
#define TILE_LOOP(T)                                                                   \
	for (int64_t j0 = 0; j0 < nl; j0 += TILE) {                                    \
		int64_t j1 = j0 + TILE < nl ? j0 + TILE : nl;                          \
		for (int64_t j = j0; j < j1; j++) {                                    \
			const T *x = (const T *)src + j * sl;                          \
			T *o = (T *)dst + j;                                           \
			for (int64_t i = i0; i < i1; i++)                              \
				o[i * dp] = x[i];                                      \
		}                                                                      \
	}

static void tgather_part(void *arg, int part, int nparts)
{
	(void)nparts;
	const tgather *g = arg;
	const fz_layout *lay = g->lay;
	int64_t outer = part / g->bands, band = part % g->bands;
	int64_t soff = lay->offset, doff = 0;
	for (int d = lay->rank - 1; d >= 0; d--) {
		if (d == g->P || d == g->L)
			continue;
		int64_t i = outer % lay->shape[d];
		outer /= lay->shape[d];
		soff += i * lay->strides[d];
		doff += i * g->dstride[d];
	}
	int64_t np = lay->shape[g->P], nl = lay->shape[g->L];
	int64_t i0 = band * TILE, i1 = i0 + TILE < np ? i0 + TILE : np;
	int64_t dp = g->dstride[g->P], sl = lay->strides[g->L];
	const char *src = g->src + soff * (int64_t)g->es;
	char *dst = g->dst + doff * (int64_t)g->es;
	switch (g->es) {
	case 1: TILE_LOOP(uint8_t) break;
	case 2: TILE_LOOP(uint16_t) break;
	case 4: TILE_LOOP(uint32_t) break;
	case 8: TILE_LOOP(uint64_t) break;
	default:
		for (int64_t i = i0; i < i1; i++)
			for (int64_t j = 0; j < nl; j++)
				memcpy(dst + (i * dp + j) * (int64_t)g->es,
				       src + (i + j * sl) * (int64_t)g->es, g->es);
	}
}

static fz_status cpu_copy(fz_device *d, void *dst, const void *src, size_t es,
			  const fz_layout *lay, void *stream, char **err)
{
	(void)stream;
	(void)err;
	tgather g = {.dst = dst, .src = src, .es = es, .lay = lay, .P = -1,
		     .L = lay->rank - 1};
	int64_t n = 1;
	for (int k = lay->rank - 1; k >= 0; k--) {
		g.dstride[k] = n;
		n *= lay->shape[k];
	}
	/* the contiguous dim nearest the innermost, when the innermost is not */
	if (g.L >= 1 && lay->shape[g.L] > 1 && lay->strides[g.L] != 1)
		for (int k = g.L - 1; k >= 0 && g.P < 0; k--)
			if (lay->strides[k] == 1 && lay->shape[k] > 1)
				g.P = k;
	if (g.P < 0 || n < TILE * TILE) {
		fz_layout_gather(dst, src, es, lay);
		return FZ_OK;
	}
	g.bands = (lay->shape[g.P] + TILE - 1) / TILE;
	int64_t parts = n / (lay->shape[g.P] * lay->shape[g.L]) * g.bands;
	if (parts > INT32_MAX) {
		fz_layout_gather(dst, src, es, lay);
		return FZ_OK;
	}
	/* a copy of under 256 KiB stays on the calling thread */
	fz_pool *pool = (int64_t)es * n >= (256 << 10) ? ((cpu_device *)d)->pool : NULL;
	fz_pool_run(pool, (int)parts, tgather_part, &g);
	return FZ_OK;
}

static fz_status cpu_load(fz_device *d, const fz_kernel *k, const fz_kcode *code,
			  void **fn, char **err)
{
	cpu_device *c = (cpu_device *)d;
	if (!code->obj || k->n_entries < 1) {
		fz_set_err(err, fz_strdup_printf("kernel %s: no host object to load",
					      k->names[0]));
		return FZ_EINVAL;
	}
	fz_host_fn f = NULL;
	fz_status st = fz_host_load(c->jit, code->obj, code->obj_len, k->names[0],
				    &f, err);
	fn[0] = (void *)f;
	fn[1] = NULL;
	return st;
}

typedef struct launch_args {
	fz_host_fn fn;
	void **bufs;
	const int64_t *syms;
	int32_t *flag;
} launch_args;

static void launch_part(void *arg, int part, int nparts)
{
	launch_args *a = arg;
	a->fn(a->bufs, a->syms, a->flag, part, nparts);
}

/* Parts for a launch of k: a row kernel's rows (one may be a part), a
 * pointwise kernel's elements (16 Ki a part at least, so that a small
 * launch stays on the calling thread); index_add's as a pointwise one's
 * (its work: its result's lane groups, or src's elements): along dim 0
 * into wide rows it is a gather split by the rows of its result
 * (codegen/pointwise.c, "the scatter as a gather"), into narrower rows of
 * f32 or f64 lanes a scatter split so ("the scatter by rows"); any other
 * runs in part 0 alone and its other parts return at once. */
static int launch_parts(const cpu_device *c, const fz_kernel *k, const int64_t *syms)
{
	int64_t w = 0;
	for (int i = 0; i < k->n_work[0] && i < 8; i++) {
		int64_t x = fz_ext_eval(k->work[0][i], syms);
		w = x > w ? x : w;
	}
	if (k->sk == FZ_SK_ROW)
		return fz_pool_parts(c->pool, w, 1);
	if (k->sk == FZ_SK_ATTENTION) /* w rows: a part is a block of 32 or more */
		return fz_pool_parts(c->pool, (w + 31) / 32, 1);
	return fz_pool_parts(c->pool, w * (k->vec > 0 ? k->vec : 1), 16384);
}

static fz_status cpu_launch(fz_device *d, const fz_kernel *k, void *const *fn,
			    void **bufs, const int64_t *syms, int32_t *flag,
			    void *stream, char **err)
{
	(void)stream;
	(void)err;
	cpu_device *c = (cpu_device *)d;
	/* a host kernel's entry 0 runs every entry (index_add: init, scatter) */
	launch_args a = {(fz_host_fn)fn[0], bufs, syms, flag};
	fz_pool_run(c->pool, launch_parts(c, k, syms), launch_part, &a);
	return FZ_OK;
}

/* ---- matrix products: the BLAS, across the pool (blas.c) -------------------- */

static fz_status cpu_matmul(fz_device *d, const fz_matmul *m, void *stream,
			    char **err)
{
	(void)stream;
	cpu_device *c = (cpu_device *)d;
	return fz_cpu_matmul(c->blas, c->pool, m, err);
}

/* World 1: every collective is the identity. World N: the ranks are
 * threads joined by the runner's communicator (comm.h), which computes the
 * collective exactly, as the interpreter does, before it returns: the CPU
 * has no communication stream to overlap with. */
static fz_status cpu_collective(fz_device *d, const fz_collective *c, void *stream,
				char **err)
{
	(void)d;
	(void)stream;
	if (c->comm) {
		static const fz_opcode op[] = {FZ_OP_ALL_GATHER, FZ_OP_REDUCE_SCATTER,
					       FZ_OP_ALL_REDUCE};
		int64_t shape[3] = {c->outer, c->extent, c->inner};
		return fz_comm_collective(c->comm, c->rank, op[c->kind], c->dtype, 3,
					  shape, 1, c->x, c->y, err);
	}
	size_t n = (size_t)(c->outer * c->extent * c->inner) * fz_dtype_size(c->dtype);
	if (n)
		memmove(c->y, c->x, n);
	return FZ_OK;
}

static fz_status cpu_event(fz_device *d, int ev, void *stream, char **err)
{
	(void)d;
	(void)ev;
	(void)stream;
	(void)err;
	return FZ_OK;
}

static fz_status cpu_sync(fz_device *d, void *stream, char **err)
{
	fz_host_sync_note(); /* nothing to wait for, but counted as asked */
	(void)d;
	(void)stream;
	(void)err;
	return FZ_OK;
}

const fz_target fz_target_cpu = {
	.name = "cpu",
	.host_memory = true,
	.matmul_strided = true,
	.open = cpu_open,
	.close = cpu_close,
	.alloc = cpu_alloc,
	.release = cpu_release,
	.upload = cpu_move,
	.download = cpu_move,
	.copy = cpu_copy,
	.fresh = cpu_fresh,
	.load = cpu_load,
	.launch = cpu_launch,
	.matmul = cpu_matmul,
	.collective = cpu_collective,
	.event_record = cpu_event,
	.event_wait = cpu_event,
	.sync = cpu_sync,
};
