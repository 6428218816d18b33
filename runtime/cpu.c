/*
 * cpu.c: the CPU target.
 *
 * Kernels are host code: each key's object (from the cache, or just
 * compiled) is linked once into the device's JIT, and a launch calls its
 * entry point with the buffers, every trace symbol's size and the error
 * flag. Memory is host memory, so uploads, downloads and copies are plain
 * memory moves, events are no-ops and sync has nothing to wait for. Matrix
 * products accumulate in f64 in a blocked loop; collectives are those of a
 * world of one.
 *
 * There is one CPU device per process, shared by every program on it (the
 * kernel store then loads each key once); it lives while a program holds
 * it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "numeric.h"
#include "target.h"

typedef struct cpu_device {
	fz_device h;
	fz_compiler *jit;      /* links the kernels' objects */
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
	free(c);
}

static fz_status cpu_open(const fz_exec_options *o, fz_device **out, char **err)
{
	(void)o;
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
	fz_cg_options cg = {FZ_CG_HOST, 0, false, false};
	if ((st = fz_device_init(&c->h, &fz_target_cpu, err)) == FZ_OK)
		st = fz_compiler_new(&cg, &c->jit, err);
	if (st != FZ_OK) {
		pthread_mutex_unlock(&cpu_mu);
		fz_compiler_free(c->jit);
		free(c);
		return st;
	}
	c->h.cg = cg;
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	c->h.threads = n > 0 ? (int)n : 1;
	cpu_dev = c;
	pthread_mutex_unlock(&cpu_mu);
	*out = &c->h;
	return FZ_OK;
}

static fz_status cpu_alloc(fz_device *d, size_t n, void **p, char **err)
{
	(void)d;
	n = (n + 255) / 256 * 256;
	*p = aligned_alloc(256, n ? n : 256);
	if (!*p) {
		fz_set_err(err, fz_strdup_printf("out of memory (%zu bytes)", n));
		return FZ_ENOMEM;
	}
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
	int rank = lay->rank;
	int64_t n = 1, idx[FZ_MAX_RANK] = {0}, off = lay->offset;
	for (int i = 0; i < rank; i++)
		n *= lay->shape[i];
	if (n <= 0)
		return FZ_OK;
	/* the innermost run of contiguous elements moves in one memcpy */
	int inner = rank;
	int64_t run = 1;
	while (inner > 0 && (lay->shape[inner - 1] == 1 ||
			     lay->strides[inner - 1] == run)) {
		run *= lay->shape[inner - 1];
		inner--;
	}
	const char *s = src;
	char *o = dst;
	for (int64_t i = 0; i < n; i += run) {
		memcpy(o + (size_t)i * es, s + off * (int64_t)es, (size_t)run * es);
		for (int k = inner - 1; k >= 0; k--) {
			off += lay->strides[k];
			if (++idx[k] < lay->shape[k])
				break;
			off -= lay->strides[k] * lay->shape[k];
			idx[k] = 0;
		}
	}
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

static fz_status cpu_launch(fz_device *d, const fz_kernel *k, void *const *fn,
			    void **bufs, const int64_t *syms, int32_t *flag,
			    void *stream, char **err)
{
	(void)d;
	(void)stream;
	(void)err;
	/* a host kernel's entry 0 runs every entry (index_add: init, scatter) */
	((fz_host_fn)fn[0])(bufs, syms, flag);
	(void)k;
	return FZ_OK;
}

/* ---- matrix products: blocked, f64 accumulation ------------------------------ */

/* C[M,N] = A[M,K] op(B), B [K,N] (row stride N) or, trans, [N,K]. */
static void mm(const double *A, const double *B, double *C, int64_t M, int64_t K,
	       int64_t N, bool trans)
{
	memset(C, 0, sizeof *C * (size_t)(M * N > 0 ? M * N : 1));
	if (trans) {
		for (int64_t i = 0; i < M; i++)
			for (int64_t j = 0; j < N; j++) {
				double acc = 0;
				const double *a = A + i * K, *b = B + j * K;
				for (int64_t k = 0; k < K; k++)
					acc += a[k] * b[k];
				C[i * N + j] = acc;
			}
		return;
	}
	for (int64_t k0 = 0; k0 < K; k0 += 64) {
		int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
		for (int64_t i = 0; i < M; i++)
			for (int64_t k = k0; k < k1; k++) {
				double a = A[i * K + k];
				const double *b = B + k * N;
				double *c = C + i * N;
				for (int64_t j = 0; j < N; j++)
					c[j] += a * b[j];
			}
	}
}

static void to_f64(double *o, const void *p, fz_dtype d, int64_t off, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		o[i] = fz_load_f64(p, d, off + i);
}

static fz_status cpu_matmul(fz_device *d, const fz_matmul *m, void *stream,
			    char **err)
{
	(void)d;
	(void)stream;
	int64_t M = m->M, N = m->N, K = m->K, batches = 1;
	for (int i = 0; i < m->nbd; i++)
		batches *= m->bshape[i];
	double *A = malloc(sizeof *A * (size_t)(M * K > 0 ? M * K : 1));
	double *B = malloc(sizeof *B * (size_t)(K * N > 0 ? K * N : 1));
	double *C = malloc(sizeof *C * (size_t)(M * N > 0 ? M * N : 1));
	if (!A || !B || !C) {
		free(A);
		free(B);
		free(C);
		fz_set_err(err, fz_strdup_printf("region %d: out of memory", m->region));
		return FZ_ENOMEM;
	}
	int64_t bi[FZ_MAX_RANK] = {0};
	for (int64_t tb = 0; tb < batches; tb++) {
		int64_t ao = 0, bo = 0;
		for (int i = 0; i < m->nbd; i++) {
			ao += bi[i] * m->a_bstride[i];
			bo += bi[i] * m->b_bstride[i];
		}
		to_f64(A, m->a, m->dtype, ao, M * K);
		to_f64(B, m->b, m->dtype, bo, K * N);
		mm(A, B, C, M, K, N, m->b_trans);
		for (int64_t i = 0; i < M * N; i++) {
			double v = C[i];
			if (m->bias)
				v += fz_load_f64(m->bias, m->dtype, i % N);
			if (fz_dtype_is_float(m->dtype))
				fz_store_f64(m->y, m->dtype, tb * M * N + i, v);
			else
				fz_store_i64(m->y, m->dtype, tb * M * N + i, (int64_t)v);
		}
		for (int i = m->nbd - 1; i >= 0; i--) {
			if (++bi[i] < m->bshape[i])
				break;
			bi[i] = 0;
		}
	}
	free(A);
	free(B);
	free(C);
	return FZ_OK;
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
	(void)stream;
	(void)err;
	return FZ_OK;
}

const fz_target fz_target_cpu = {
	.name = "cpu",
	.host_memory = true,
	.open = cpu_open,
	.close = cpu_close,
	.alloc = cpu_alloc,
	.release = cpu_release,
	.upload = cpu_move,
	.download = cpu_move,
	.copy = cpu_copy,
	.load = cpu_load,
	.launch = cpu_launch,
	.matmul = cpu_matmul,
	.collective = cpu_collective,
	.event_record = cpu_event,
	.event_wait = cpu_event,
	.sync = cpu_sync,
};
