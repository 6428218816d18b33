/*
 * fake_cublaslt.c: the cuBLASLt entry points the CUDA target uses, faked on
 * the host in the same library as the fake driver (fake_cuda.h). Matmul
 * computes f32 and f64 as cuBLASLt defines it (column-major, op(A) m x k
 * times op(B) k x n into D m x n, strided batches, bias per row of D) and
 * records every call.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#define API __attribute__((visibility("default")))

extern fake_state fake_cuda;

typedef struct desc { int compute, scale, transa, transb, epilogue; const void *bias; } desc;
typedef struct layout { int type; uint64_t rows, cols; int64_t ld; int batch; int64_t stride; } layout;
typedef struct pref { uint64_t ws; uint32_t align[4]; } pref;

API int cublasLtCreate(void **h) { *h = malloc(1); __atomic_fetch_add(&fake_cuda.lt_creates, 1, __ATOMIC_RELAXED); return 0; }
API int cublasLtDestroy(void *h) { free(h); __atomic_fetch_add(&fake_cuda.lt_destroys, 1, __ATOMIC_RELAXED); return 0; }
API size_t cublasLtGetVersion(void) { return 130000; }
API const char *cublasLtGetStatusName(int s)
{
	return s == 7 ? "CUBLAS_STATUS_INVALID_VALUE" : s == 15 ? "CUBLAS_STATUS_NOT_SUPPORTED" :
	       "CUBLAS_STATUS_UNKNOWN";
}

API int cublasLtMatmulDescCreate(desc **d, int compute, int scale)
{
	*d = calloc(1, sizeof **d);
	(*d)->compute = compute;
	(*d)->scale = scale;
	(*d)->epilogue = 1;
	return 0;
}

API int cublasLtMatmulDescDestroy(desc *d) { free(d); return 0; }

API int cublasLtMatmulDescSetAttribute(desc *d, int attr, const void *buf, size_t n)
{
	switch (attr) {
	case 3: if (n != 4) return 7; memcpy(&d->transa, buf, 4); return 0;
	case 4: if (n != 4) return 7; memcpy(&d->transb, buf, 4); return 0;
	case 7: if (n != 4) return 7; memcpy(&d->epilogue, buf, 4); return 0;
	case 8: if (n != sizeof(void *)) return 7; memcpy(&d->bias, buf, n); return 0;
	}
	return 7;
}

API int cublasLtMatrixLayoutCreate(layout **l, int type, uint64_t rows, uint64_t cols,
                                   int64_t ld)
{
	if (ld < (int64_t)rows)
		return 7;
	*l = calloc(1, sizeof **l);
	**l = (layout){type, rows, cols, ld, 1, 0};
	return 0;
}

API int cublasLtMatrixLayoutDestroy(layout *l) { free(l); return 0; }

API int cublasLtMatrixLayoutSetAttribute(layout *l, int attr, const void *buf, size_t n)
{
	if (attr == 5 && n == 4) { memcpy(&l->batch, buf, 4); return 0; }
	if (attr == 6 && n == 8) { memcpy(&l->stride, buf, 8); return 0; }
	return 7;
}

API int cublasLtMatmulPreferenceCreate(pref **p) { *p = calloc(1, sizeof **p); return 0; }
API int cublasLtMatmulPreferenceDestroy(pref *p) { free(p); return 0; }

API int cublasLtMatmulPreferenceSetAttribute(pref *p, int attr, const void *buf, size_t n)
{
	if (attr == 1 && n == 8) { memcpy(&p->ws, buf, 8); return 0; }
	if (attr >= 5 && attr <= 8 && n == 4) { memcpy(&p->align[attr - 5], buf, 4); return 0; }
	return 7;
}

typedef struct { uint64_t data[8]; } algo;
typedef struct { algo a; size_t ws; int state; float waves; int reserved[4]; } heur;

API int cublasLtMatmulAlgoGetHeuristic(void *h, desc *d, layout *a, layout *b, layout *c,
                                       layout *dd, pref *p, int req, heur *res, int *got)
{
	(void)h, (void)d, (void)a, (void)b, (void)c, (void)dd, (void)req;
	__atomic_fetch_add(&fake_cuda.lt_heuristics, 1, __ATOMIC_RELAXED);
	memcpy(fake_cuda.align, p->align, sizeof p->align);
	memset(res, 0, sizeof *res);
	res->a.data[0] = 42;
	*got = 1;
	return 0;
}

static double get(int type, const void *p, int64_t i)
{
	return type == 1 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static void put(int type, void *p, int64_t i, double v)
{
	if (type == 1)
		((double *)p)[i] = v;
	else
		((float *)p)[i] = (float)v;
}

/* A product with its descriptors copied: what a captured call keeps. */
typedef struct mm_args {
	desc d;
	layout la, lb, ld;
	const void *A, *B;
	void *D;
	double alpha, beta;
	uint64_t m, n, k;
} mm_args;

static void run_matmul(void *ctx, void *stream)
{
	mm_args *a = ctx;
	const desc *d = &a->d;
	const layout *la = &a->la, *lb = &a->lb, *ld = &a->ld;
	fake_op *o = fake_log('M', stream);
	if (o) {
		o->x = a->A;
		o->y = a->D;
	}
	int t = la->type;
	if (t != 0 && t != 1)
		return; /* only f32 and f64 are computed */
	uint64_t m = a->m, n = a->n, k = a->k;
	for (int bt = 0; bt < ld->batch; bt++)
		for (uint64_t j = 0; j < n; j++)
			for (uint64_t i = 0; i < m; i++) {
				double s = 0;
				for (uint64_t l = 0; l < k; l++) {
					int64_t ia = d->transa ? (int64_t)(l + i * la->ld)
					                       : (int64_t)(i + l * la->ld);
					int64_t ib = d->transb ? (int64_t)(j + l * lb->ld)
					                       : (int64_t)(l + j * lb->ld);
					s += get(t, a->A, bt * la->stride + ia) *
					     get(t, a->B, bt * lb->stride + ib);
				}
				int64_t id = bt * ld->stride + (int64_t)(i + j * ld->ld);
				double v = a->alpha * s +
				           (a->beta != 0 ? a->beta * get(t, a->D, id) : 0);
				if (d->epilogue == 4)
					v += get(t, d->bias, (int64_t)i);
				put(t, a->D, id, v);
			}
}

API int cublasLtMatmul(void *h, desc *d, const void *alpha, const void *A, layout *la,
                       const void *B, layout *lb, const void *beta, const void *C,
                       layout *lc, void *D, layout *ld, const algo *al, void *ws,
                       size_t wsn, void *stream)
{
	(void)h, (void)C, (void)lc, (void)ws;
	if (!al || al->data[0] != 42)
		return 7;
	uint64_t m = d->transa ? la->cols : la->rows, k = d->transa ? la->rows : la->cols;
	uint64_t kb = d->transb ? lb->cols : lb->rows, n = d->transb ? lb->rows : lb->cols;
	if (k != kb || ld->rows != m || ld->cols != n || la->batch != ld->batch ||
	    lb->batch != ld->batch)
		return 7;
	int at = __atomic_fetch_add(&fake_cuda.n_matmuls, 1, __ATOMIC_RELAXED);
	if (at < FAKE_MAX_LAUNCHES)
		fake_cuda.mm[at] = (fake_matmul){
			d->compute, d->scale, d->transa, d->transb, d->epilogue, la->type,
			m, n, k, la->ld, lb->ld, ld->ld, ld->batch, la->stride, lb->stride,
			ld->stride, A, B, D, d->bias, wsn};
	int t = la->type;
	mm_args a = {*d, *la, *lb, *ld, A, B, D, 0, 0, m, n, k};
	if (t == 0 || t == 1) {
		a.alpha = t == 1 ? *(const double *)alpha : *(const float *)alpha;
		a.beta = t == 1 ? *(const double *)beta : *(const float *)beta;
	}
	int r = fake_defer(stream, 'M', run_matmul, &a, sizeof a);
	if (r > 1)
		return 14; /* CUBLAS_STATUS_INTERNAL_ERROR */
	if (r == 0)
		run_matmul(&a, stream);
	return 0;
}
