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
 * Fresh memory. A large block fresh from malloc (glibc maps anything of
 * 32 MiB or more anew per call, so every torch.empty of a big output is
 * one) faults on its first touch once per 4 KiB page: 8192 faults for a
 * 32 MiB output, which on a VM cost more than the kernel that writes it
 * (33 ms against 12 ms to fill 32 MiB, measured here). Arenas and the
 * outputs a run is handed are advised to use transparent huge pages
 * where the system leaves them to madvise, 512 times fewer faults.
 *
 * There is one CPU device per process, shared by every program on it (the
 * kernel store then loads each key once); it lives while a program holds
 * it. Its pool has fz_exec_options.threads threads, else $FUSEC_THREADS,
 * else as many as the CPUs this process may run on, as the program that
 * opens it asks; programs that open it while it lives share that pool.
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

static fz_status cpu_alloc(fz_device *d, size_t n, void **p, char **err)
{
	n = (n + 255) / 256 * 256;
	*p = aligned_alloc(256, n ? n : 256);
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
static fz_status cpu_copy(fz_device *d, void *dst, const void *src, size_t es,
			  const fz_layout *lay, void *stream, char **err)
{
	(void)d;
	(void)stream;
	(void)err;
	fz_layout_gather(dst, src, es, lay);
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
 * launch stays on the calling thread); index_add's scatter runs in part 0
 * alone, so it takes one. */
static int launch_parts(const cpu_device *c, const fz_kernel *k, const int64_t *syms)
{
	if (k->sk == FZ_SK_SCATTER)
		return 1;
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
