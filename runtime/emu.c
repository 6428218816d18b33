/*
 * emu.c: the emulated GPU target ("emu"): the CUDA target's kernels, run
 * on the CPU with memcheck and racecheck, so that CI tests what the GPU
 * runs.
 *
 * CI has no GPU; the CPU target runs host-flavoured kernels (the
 * skeletons' parallel loops as plain loops), so the GPU kernels' own logic
 * (thread and block indexing, grid-stride tails, warp shuffles, shared
 * memory and barriers, the register-held row, lanes, the 32-bit index
 * variant, the launch geometry) would be checked by ptxas alone. This
 * target runs those kernels:
 *
 *   compile   codegen's EMU flavour: the NVPTX skeletons and choices,
 *             compiled for this CPU as an object (cache key target
 *             "emu-sm_90-host-TRIPLE-CPU"), the SIMT primitives as calls
 *             through a per-thread context, every access checked
 *   load      the object linked into this device's JIT (no LLVM IR
 *             compiled on a warm cache)
 *   launch    fz_kernel_launch_dims, the geometry the CUDA target uses for
 *             the emulated device, then every block and thread through
 *             runtime/emu_sched.c (fibers, barriers, shuffles, checks)
 *   memory    host memory (host_memory), 256-byte aligned, filled with
 *             0xff bytes (NaN, -1) as a GPU's fresh memory is garbage, so
 *             a kernel or runner that reads what nothing wrote shows it
 *   matmul    a plain f64-accumulating loop (cuBLAS's part; not under test)
 *
 * Settings, from the environment when the device is opened (the device is
 * shared by the process; tests run a tool per setting):
 *
 *   FUSEC_EMU_SM=sm_90         the GPU emulated (sm_70 ... sm_90)
 *   FUSEC_EMU_SM_COUNT=132     its multiprocessors (default: the part's:
 *                              H100 132, A100 108, V100 80, ...)
 *   FUSEC_EMU_INDEX_BITS=64    the 64-bit index variant of every kernel,
 *                              where the runner would pick 32 bits (it
 *                              does below 2^31/8 elements: tests need the
 *                              other variant without huge inputs)
 *   FUSEC_EMU_MAX_GRID=N       at most N blocks per launch, fewer than
 *                              the CUDA target would launch: every kernel
 *                              loops over its rows or elements with a
 *                              stride, so small tests run those loops'
 *                              later iterations and tails (tests only)
 *   FUSEC_EMU_FAULT=barrier|load|store|shfl|mma|cpwait
 *                              a seeded fault in every kernel compiled,
 *                              to prove the checks fire (tests only):
 *                              mma has lane 31 skip every mma.sync,
 *                              cpwait drops every cp.async.wait_group
 *
 * What CI runs (`ctest -L emu`, tests/CMakeLists.txt): every corpus trace
 * at B,T = 1,1 / 3,17 / 17,3 / 2,100, at 3,17 with 64-bit indices and at
 * 2,100 with grids of at most 3 blocks; the seeded faults; the random
 * differential test; the exported models. On the 32-trace corpus that is
 * 192 tool runs, 282 traces, 2454 kernels x sizes, 4212 launches, 27
 * million GPU threads, 206 thousand barriers, 8.7 million warp shuffles
 * and 375 million shared-memory accesses checked: 0 mismatches, 0
 * violations. The whole suite, 43 tests from a cold kernel cache
 * (tools/bench/emu_suite.sh build 2): 162 s wall on a 2-core machine
 * shared with other jobs, 138 s of CPU, so about 70 s on two idle cores.
 *
 * A violation is FZ_ERUNTIME from the launch, with a message such as
 *
 *   emu: kernel fz_1c9e... (region 4), block 2 thread 255: global load out
 *   of bounds: elements [4096, 4100) of buffer 0 (input 0), which has 4096
 */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "numeric.h"
#include "target.h"

typedef struct emu_device {
	fz_device h;            /* first: the runner's view */
	fz_compiler *c;         /* EMU compiler: its JIT links the kernels */
	fz_emu_sched *s;
	pthread_mutex_t run_mu; /* one launch at a time on the scheduler */
	bool poison;
	int64_t max_grid;       /* FUSEC_EMU_MAX_GRID (0: none) */
} emu_device;


/* ---- settings --------------------------------------------------------------------- */

static int sm_count_of(int sm)
{
	switch (sm) {
	case 70: return 80;    /* V100 */
	case 75: return 40;    /* T4 */
	case 80: return 108;   /* A100 */
	case 86: return 84;    /* RTX 3090 */
	case 89: return 128;   /* RTX 4090 */
	default: return 132;   /* H100 SXM */
	}
}

static fz_status settings(fz_cg_options *o, int *sm_count, char **err)
{
	const char *sm = getenv("FUSEC_EMU_SM");
	char name[32];
	snprintf(name, sizeof name, "emu-%s", sm && sm[0] ? sm : "sm_90");
	char *m = NULL;
	if (fz_cg_options_parse(name, o, &m) != FZ_OK) {
		fz_set_err(err, fz_strdup_printf("FUSEC_EMU_SM='%s': %s", sm, m ? m : "?"));
		free(m);
		return FZ_EINVAL;
	}
	*sm_count = sm_count_of(o->sm);
	const char *n = getenv("FUSEC_EMU_SM_COUNT");
	if (n && n[0]) {
		char *end;
		long v = strtol(n, &end, 10);
		if (*end || v < 1 || v > 1024) {
			fz_set_err(err, fz_strdup_printf("FUSEC_EMU_SM_COUNT='%s': expected a "
						      "number of multiprocessors, 1 to 1024", n));
			return FZ_EINVAL;
		}
		*sm_count = (int)v;
	}
	static const char *const faults[FZ_EMU_FAULT_COUNT] = {"none", "barrier", "load",
							       "store", "shfl", "mma",
							       "cpwait"};
	const char *f = getenv("FUSEC_EMU_FAULT");
	o->emu_fault = FZ_EMU_FAULT_NONE;
	if (f && f[0]) {
		int i = 0;
		while (i < FZ_EMU_FAULT_COUNT && strcmp(f, faults[i]))
			i++;
		if (i == FZ_EMU_FAULT_COUNT) {
			fz_set_err(err, fz_strdup_printf("FUSEC_EMU_FAULT='%s': expected none, "
						      "barrier, load, store, shfl, mma or cpwait",
						      f));
			return FZ_EINVAL;
		}
		o->emu_fault = (fz_emu_fault)i;
	}
	const char *ib = getenv("FUSEC_EMU_INDEX_BITS");
	if (ib && ib[0] && strcmp(ib, "32") && strcmp(ib, "64")) {
		fz_set_err(err, fz_strdup_printf("FUSEC_EMU_INDEX_BITS='%s': expected 32 "
					      "(the runner's choice) or 64", ib));
		return FZ_EINVAL;
	}
	o->emu_idx64 = ib && !strcmp(ib, "64");
	return FZ_OK;
}

/* ---- the device ---------------------------------------------------------------------- */

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static emu_device *the_dev;     /* the process's device, while referenced */

static void emu_close(fz_device *d)
{
	emu_device *e = (emu_device *)d;
	if (!e)
		return;
	pthread_mutex_lock(&open_mu);
	if (the_dev == e)
		the_dev = NULL;
	pthread_mutex_unlock(&open_mu);
	if (getenv("FUSEC_EMU_STATS") && e->s) {
		const fz_emu_stats *st = fz_emu_sched_stats(e->s);
		fprintf(stderr, "emu: %lld launches, %lld blocks, %lld threads, %lld "
			"barriers, %lld warp shuffles, %lld shared-memory accesses, %lld "
			"mma.sync, %lld ldmatrix, %lld cp.async checked\n",
			(long long)st->launches, (long long)st->blocks, (long long)st->threads,
			(long long)st->barriers, (long long)st->shuffles,
			(long long)st->smem_accesses, (long long)st->mmas,
			(long long)st->ldmatrix, (long long)st->cp_async);
	}
	fz_emu_sched_free(e->s);
	fz_compiler_free(e->c);
	pthread_mutex_destroy(&e->run_mu);
	free(e); /* the header's mutex: fz_device_release destroyed it */
}

static fz_status emu_open(const fz_exec_options *o, fz_device **out, char **err)
{
	(void)o;
	*out = NULL;
	pthread_mutex_lock(&open_mu);
	if (the_dev && fz_device_try_retain(&the_dev->h)) {
		*out = &the_dev->h;
		pthread_mutex_unlock(&open_mu);
		return FZ_OK;
	}
	fz_cg_options cg;
	int sm_count;
	fz_status st = settings(&cg, &sm_count, err);
	emu_device *e = NULL;
	if (st != FZ_OK)
		goto fail;
	e = calloc(1, sizeof *e);
	if (!e) {
		st = FZ_ENOMEM;
		fz_set_err(err, fz_strdup("out of memory"));
		goto fail;
	}
	pthread_mutex_init(&e->run_mu, NULL);
	if ((st = fz_device_init(&e->h, &fz_target_emu, err)) != FZ_OK)
		goto fail;
	e->h.cg = cg;
	e->h.sm_count = sm_count;
	e->h.threads = 1;
	const char *mg = getenv("FUSEC_EMU_MAX_GRID");
	if (mg && mg[0]) {
		char *end;
		long long v = strtoll(mg, &end, 10);
		if (*end || v < 1) {
			st = FZ_EINVAL;
			fz_set_err(err, fz_strdup_printf("FUSEC_EMU_MAX_GRID='%s': expected a "
						      "number of blocks, 1 or more", mg));
			goto fail;
		}
		e->max_grid = v;
	}
	const char *p = getenv("FUSEC_EMU_POISON");
	e->poison = !p || strcmp(p, "0");
	if ((st = fz_compiler_new(&cg, &e->c, err)) != FZ_OK ||
	    (st = fz_emu_sched_new(&e->s, err)) != FZ_OK)
		goto fail;
	the_dev = e;
	*out = &e->h;
	pthread_mutex_unlock(&open_mu);
	return FZ_OK;
fail:
	pthread_mutex_unlock(&open_mu);
	if (e) {
		fz_emu_sched_free(e->s);
		fz_compiler_free(e->c);
		pthread_mutex_destroy(&e->run_mu);
		if (e->h.tg)
			pthread_mutex_destroy(&e->h.mu);
		free(e);
	}
	return st;
}

/* ---- memory -------------------------------------------------------------------------- */

static fz_status emu_alloc(fz_device *d, size_t bytes, void **p, char **err)
{
	emu_device *e = (emu_device *)d;
	size_t n = (bytes + 255) / 256 * 256;
	*p = aligned_alloc(256, n ? n : 256);
	if (!*p) {
		fz_set_err(err, fz_strdup_printf("emu: out of memory (%zu bytes)", bytes));
		return FZ_ENOMEM;
	}
	memset(*p, e->poison ? 0xff : 0, n ? n : 256);
	return FZ_OK;
}

static void emu_release(fz_device *d, void *p)
{
	(void)d;
	free(p);
}

static fz_status emu_upload(fz_device *d, void *dst, const void *src, size_t n,
			    void *stream, char **err)
{
	(void)d; (void)stream; (void)err;
	if (n && dst != src)
		memmove(dst, src, n);
	return FZ_OK;
}

static fz_status emu_copy(fz_device *d, void *dst, const void *src, size_t es,
			  const fz_layout *lay, void *stream, char **err)
{
	(void)d; (void)stream; (void)err;
	fz_layout_gather(dst, src, es, lay);
	return FZ_OK;
}

/* ---- kernels --------------------------------------------------------------------------- */

static fz_status emu_load(fz_device *d, const fz_kernel *k, const fz_kcode *code,
			  void **fn, char **err)
{
	emu_device *e = (emu_device *)d;
	if (!code->obj || !code->obj_len) {
		fz_set_err(err, fz_strdup_printf("region %d: no emu object to load", k->region));
		return FZ_EINVAL;
	}
	for (int i = 0; i < k->n_entries; i++) {
		fz_host_fn f = NULL;
		fz_status st = fz_host_load(e->c, code->obj, code->obj_len, k->names[i], &f,
					    err);
		if (st != FZ_OK)
			return st;
		fn[i] = (void *)f;
	}
	return FZ_OK;
}

static fz_status emu_launch(fz_device *d, const fz_kernel *k, void *const *fn,
			    void **bufs, const int64_t *syms, int32_t *flag,
			    void *stream, char **err)
{
	(void)stream;
	emu_device *e = (emu_device *)d;
	fz_status st = FZ_OK;
	pthread_mutex_lock(&e->run_mu);
	for (int i = 0; i < k->n_entries && st == FZ_OK; i++) {
		int64_t grid;
		int block;
		fz_kernel_launch_dims_on(k, i, syms, e->h.sm_count, &grid, &block);
		if (e->max_grid && grid > e->max_grid)
			grid = e->max_grid; /* tests: every grid-stride loop iterates */
		fz_emu_launch L = {
			.kernel = k->names[i], .region = k->region,
			.fn = (fz_emu_fn)(void (*)(void))fn[i], .bufs = bufs, .syms = syms,
			.flag = flag, .grid = grid, .block = block,
			/* rows spread over a warp or a block shuffle and sync;
			 * tiles are warps' matrix operations */
			.fibers = (k->sk == FZ_SK_ROW && k->par != FZ_PAR_THREAD) ||
				  k->sk == FZ_SK_TILE,
			.n_in = k->n_in,
			.smem = k->smem,
		};
		st = fz_emu_run(e->s, &L, err);
	}
	pthread_mutex_unlock(&e->run_mu);
	return st;
}

/* ---- library calls and collectives (world 1) ------------------------------------------ */

static void to_f64(double *o, const void *p, fz_dtype d, int64_t off, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		o[i] = fz_load_f64(p, d, off + i);
}

static fz_status emu_matmul(fz_device *d, const fz_matmul *m, void *stream, char **err)
{
	(void)d; (void)stream;
	int64_t M = m->M, N = m->N, K = m->K, nb = 1;
	for (int i = 0; i < m->nbd; i++)
		nb *= m->bshape[i];
	double *A = malloc(sizeof *A * (size_t)(M * K > 0 ? M * K : 1));
	double *B = malloc(sizeof *B * (size_t)(K * N > 0 ? K * N : 1));
	double *Bt = m->b_trans ? malloc(sizeof *Bt * (size_t)(K * N > 0 ? K * N : 1)) : NULL;
	double *C = malloc(sizeof *C * (size_t)(M * N > 0 ? M * N : 1));
	if (!A || !B || !C || (m->b_trans && !Bt)) {
		free(A);
		free(B);
		free(Bt);
		free(C);
		fz_set_err(err, fz_strdup_printf("region %d: emu: out of memory", m->region));
		return FZ_ENOMEM;
	}
	int64_t bi[FZ_MAX_RANK] = {0};
	for (int64_t b = 0; b < nb; b++) {
		int64_t ao = 0, bo = 0;
		for (int i = 0; i < m->nbd; i++) {
			ao += bi[i] * m->a_bstride[i];
			bo += bi[i] * m->b_bstride[i];
		}
		to_f64(A, m->a, m->dtype, ao, M * K);
		to_f64(B, m->b, m->dtype, bo, K * N);
		if (m->b_trans) /* [N, K] to [K, N]: rows in the inner loop */
			for (int64_t j = 0; j < N; j++)
				for (int64_t k = 0; k < K; k++)
					Bt[k * N + j] = B[j * K + k];
		fz_matmul_f64(A, m->b_trans ? Bt : B, C, M, K, N);
		for (int64_t i = 0; i < M * N; i++) {
			double v = C[i] + (m->bias ? fz_load_f64(m->bias, m->dtype, i % N) : 0);
			if (fz_dtype_is_float(m->dtype))
				fz_store_f64(m->y, m->dtype, b * M * N + i, v);
			else
				fz_store_i64(m->y, m->dtype, b * M * N + i, (int64_t)v);
		}
		for (int i = m->nbd - 1; i >= 0; i--) {
			if (++bi[i] < m->bshape[i])
				break;
			bi[i] = 0;
		}
	}
	free(A);
	free(B);
	free(Bt);
	free(C);
	return FZ_OK;
}

static fz_status emu_collective(fz_device *d, const fz_collective *c, void *stream,
				char **err)
{
	(void)d; (void)stream; (void)err;
	/* one rank: every collective is the identity */
	size_t n = (size_t)(c->outer * c->extent * c->inner) * fz_dtype_size(c->dtype);
	if (n && c->y != c->x)
		memmove(c->y, c->x, n);
	return FZ_OK;
}

static fz_status emu_nop_ev(fz_device *d, int ev, void *stream, char **err)
{
	(void)d; (void)ev; (void)stream; (void)err;
	return FZ_OK;
}

static fz_status emu_sync(fz_device *d, void *stream, char **err)
{
	(void)d; (void)stream; (void)err;
	return FZ_OK;
}

const fz_target fz_target_emu = {
	.name = "emu",
	.host_memory = true,
	.open = emu_open,
	.close = emu_close,
	.alloc = emu_alloc,
	.release = emu_release,
	.upload = emu_upload,
	.download = emu_upload,
	.copy = emu_copy,
	.load = emu_load,
	.launch = emu_launch,
	.matmul = emu_matmul,
	.collective = emu_collective,
	.event_record = emu_nop_ev,
	.event_wait = emu_nop_ev,
	.sync = emu_sync,
};
