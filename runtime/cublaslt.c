/*
 * cublaslt.c: matmul and linear on the GPU through cuBLASLt.
 *
 * fz_matmul is row-major, as the trace is: y[b] = a[b] · op(w[b]) (+ bias)
 * with a [M, K], w [K, N] (or [N, K] for linear), y [M, N] contiguous,
 * batch dims broadcast as torch.matmul does (a stride of 0 repeats an
 * operand). cuBLASLt is column-major, and a row-major matrix is its
 * transpose seen column-major, so y = a·w is computed as yᵀ = wᵀ·aᵀ:
 *
 *     cuBLASLt A = w   N x K, ld N (linear: stored K x N, ld K, op T)
 *     cuBLASLt B = a   K x M, ld K
 *     cuBLASLt D = y   N x M, ld N     bias: a vector over D's N rows,
 *                                      added in the epilogue
 *
 * with m, n, k = N, M, K. Types: bf16 and f16 in and out with f32
 * accumulation and f32 alpha/beta; f32 with f32 compute, or TF32 where the
 * caller opted in (fz_exec_options.tf32); f64 with f64. Integer products
 * are not cuBLASLt's: FZ_EUNSUPPORTED.
 *
 * Batches. The batch dims are merged where the strides let them (dims of
 * extent 1 drop, neighbours merge when the outer stride is the inner's
 * extent times its stride, for a and w alike), a batch whose weight
 * broadcasts and whose a is contiguous folds into M (one GEMM of
 * B·T rows: linear on [B, T, C]), the innermost remaining dim becomes
 * cuBLASLt's strided batch (stride 0 where an operand broadcasts), and any
 * dims outside it are a host loop of calls, each queued on the stream.
 *
 * Plans. The descriptors, layouts and the algorithm the heuristic picks
 * depend only on the shape, the types, the strides, the operands'
 * alignment and the workspace: they are made once per distinct such key
 * and kept for the device's life (a linear list: a model has a few dozen
 * shapes at most), so a run pays one lookup per matmul. The workspace is
 * the caller's (the runner reserves fz_target.matmul_workspace bytes of the
 * plan's arena, shared by the plan's matmuls, which run in stream order);
 * none given, the heuristic picks among algorithms that need none.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_target.h"
#include "ir.h"

typedef struct mm_key {
	int dtype;
	int tf32, trans, bias;
	int64_t M, N, K;
	int64_t batch, sa, sb, sy;   /* cuBLASLt's strided batch: A=w, B=a, D=y */
	uint32_t align[3];           /* bytes: w, a, y */
	uint64_t ws;
} mm_key;

typedef struct mm_plan {
	mm_key key;
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, ld;
	cublasLtMatmulAlgo_t algo;
	pthread_mutex_t mu;          /* the bias pointer, set per call */
} mm_plan;

struct fz_cuda_blas {
	const fz_lt_api *lt;
	cublasLtHandle_t h;
	pthread_mutex_t mu;          /* the plan list */
	mm_plan **plans;
	int n, cap;
};

fz_status fz_cuda_blas_new(fz_cuda_blas **out, char **err)
{
	*out = NULL;
	const char *why = NULL;
	const fz_lt_api *lt = fz_lt_load(&why);
	if (!lt) {
		fz_set_err(err, fz_strdup_printf("matmul on CUDA needs cuBLASLt: %s",
		                              why ? why : "?"));
		return FZ_EUNSUPPORTED;
	}
	fz_cuda_blas *b = calloc(1, sizeof *b);
	if (!b) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	b->lt = lt;
	cublasStatus_t s = lt->Create(&b->h);
	if (s != FZ_CUBLAS_STATUS_SUCCESS) {
		free(b);
		return fz_lt_fail(lt, err, s, "cublasLtCreate", "the device's handle");
	}
	pthread_mutex_init(&b->mu, NULL);
	*out = b;
	return FZ_OK;
}

static void plan_free(const fz_lt_api *lt, mm_plan *p)
{
	if (!p)
		return;
	if (p->la)
		lt->MatrixLayoutDestroy(p->la);
	if (p->lb)
		lt->MatrixLayoutDestroy(p->lb);
	if (p->ld)
		lt->MatrixLayoutDestroy(p->ld);
	if (p->desc)
		lt->MatmulDescDestroy(p->desc);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

void fz_cuda_blas_free(fz_cuda_blas *b)
{
	if (!b)
		return;
	for (int i = 0; i < b->n; i++)
		plan_free(b->lt, b->plans[i]);
	free(b->plans);
	b->lt->Destroy(b->h);
	pthread_mutex_destroy(&b->mu);
	free(b);
}

/* The largest power of two (up to 256) dividing every value. */
static uint32_t align_of(uint64_t x, uint32_t cap)
{
	uint32_t a = cap;
	while (a > 1 && x % a)
		a /= 2;
	return a;
}

static void describe(const mm_key *k, char *buf, size_t n)
{
	snprintf(buf, n, "%s %" PRId64 "x%" PRId64 "x%" PRId64 "%s, batch %" PRId64,
	         fz_dtype_name((fz_dtype)k->dtype), k->M, k->N, k->K,
	         k->trans ? " (linear)" : "", k->batch);
}

#define LT_TRY(call, name)                                                     \
	do {                                                                   \
		cublasStatus_t s_ = (call);                                    \
		if (s_ != FZ_CUBLAS_STATUS_SUCCESS) {                          \
			st = fz_lt_fail(lt, err, s_, name, what);              \
			goto fail;                                             \
		}                                                              \
	} while (0)

static fz_status plan_make(fz_cuda_blas *b, const mm_key *k, mm_plan **out,
                           char **err)
{
	const fz_lt_api *lt = b->lt;
	char what[128];
	describe(k, what, sizeof what);
	fz_status st = FZ_OK;
	int type, compute, scale;
	switch ((fz_dtype)k->dtype) {
	case FZ_BF16:
		type = FZ_CUDA_R_16BF, compute = FZ_CUBLAS_COMPUTE_32F, scale = FZ_CUDA_R_32F;
		break;
	case FZ_F16:
		type = FZ_CUDA_R_16F, compute = FZ_CUBLAS_COMPUTE_32F, scale = FZ_CUDA_R_32F;
		break;
	case FZ_F32:
		type = FZ_CUDA_R_32F, scale = FZ_CUDA_R_32F;
		compute = k->tf32 ? FZ_CUBLAS_COMPUTE_32F_FAST_TF32 : FZ_CUBLAS_COMPUTE_32F;
		break;
	case FZ_F64:
		type = FZ_CUDA_R_64F, compute = FZ_CUBLAS_COMPUTE_64F, scale = FZ_CUDA_R_64F;
		break;
	default:
		fz_set_err(err, fz_strdup_printf("matmul of %s on CUDA: cuBLASLt takes "
		                              "bf16, f16, f32 and f64",
		                              fz_dtype_name((fz_dtype)k->dtype)));
		return FZ_EUNSUPPORTED;
	}
	mm_plan *p = calloc(1, sizeof *p);
	cublasLtMatmulPreference_t pref = NULL;
	if (!p) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	p->key = *k;
	int32_t opa = k->trans ? FZ_CUBLAS_OP_T : FZ_CUBLAS_OP_N, opb = FZ_CUBLAS_OP_N;
	int32_t epi = k->bias ? FZ_CUBLASLT_EPILOGUE_BIAS : FZ_CUBLASLT_EPILOGUE_DEFAULT;
	LT_TRY(lt->MatmulDescCreate(&p->desc, compute, scale), "cublasLtMatmulDescCreate");
	LT_TRY(lt->MatmulDescSetAttribute(p->desc, FZ_CUBLASLT_MATMUL_DESC_TRANSA,
	                                  &opa, sizeof opa),
	       "cublasLtMatmulDescSetAttribute(TRANSA)");
	LT_TRY(lt->MatmulDescSetAttribute(p->desc, FZ_CUBLASLT_MATMUL_DESC_TRANSB,
	                                  &opb, sizeof opb),
	       "cublasLtMatmulDescSetAttribute(TRANSB)");
	LT_TRY(lt->MatmulDescSetAttribute(p->desc, FZ_CUBLASLT_MATMUL_DESC_EPILOGUE,
	                                  &epi, sizeof epi),
	       "cublasLtMatmulDescSetAttribute(EPILOGUE)");
	if (k->trans)
		LT_TRY(lt->MatrixLayoutCreate(&p->la, type, (uint64_t)k->K,
		                              (uint64_t)k->N, k->K),
		       "cublasLtMatrixLayoutCreate(w)");
	else
		LT_TRY(lt->MatrixLayoutCreate(&p->la, type, (uint64_t)k->N,
		                              (uint64_t)k->K, k->N),
		       "cublasLtMatrixLayoutCreate(w)");
	LT_TRY(lt->MatrixLayoutCreate(&p->lb, type, (uint64_t)k->K, (uint64_t)k->M,
	                              k->K),
	       "cublasLtMatrixLayoutCreate(a)");
	LT_TRY(lt->MatrixLayoutCreate(&p->ld, type, (uint64_t)k->N, (uint64_t)k->M,
	                              k->N),
	       "cublasLtMatrixLayoutCreate(y)");
	if (k->batch > 1) {
		int32_t cnt = (int32_t)k->batch;
		cublasLtMatrixLayout_t l[3] = {p->la, p->lb, p->ld};
		int64_t s[3] = {k->sa, k->sb, k->sy};
		for (int i = 0; i < 3; i++) {
			LT_TRY(lt->MatrixLayoutSetAttribute(l[i],
			                                    FZ_CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
			                                    &cnt, sizeof cnt),
			       "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
			LT_TRY(lt->MatrixLayoutSetAttribute(
			               l[i], FZ_CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
			               &s[i], sizeof s[i]),
			       "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
		}
	}
	LT_TRY(lt->MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
	LT_TRY(lt->MatmulPreferenceSetAttribute(pref,
	                                        FZ_CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
	                                        &k->ws, sizeof k->ws),
	       "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
	{
		int attrs[4] = {FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
		                FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
		                FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
		                FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
		uint32_t v[4] = {k->align[0], k->align[1], k->align[2], k->align[2]};
		for (int i = 0; i < 4; i++)
			LT_TRY(lt->MatmulPreferenceSetAttribute(pref, attrs[i], &v[i],
			                                        sizeof v[i]),
			       "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
	}
	{
		cublasLtMatmulHeuristicResult_t res;
		int got = 0;
		memset(&res, 0, sizeof res);
		LT_TRY(lt->MatmulAlgoGetHeuristic(b->h, p->desc, p->la, p->lb, p->ld,
		                                  p->ld, pref, 1, &res, &got),
		       "cublasLtMatmulAlgoGetHeuristic");
		if (got < 1) {
			fz_set_err(err, fz_strdup_printf("cublasLtMatmulAlgoGetHeuristic "
			                              "(%s): no algorithm", what));
			st = FZ_EUNSUPPORTED;
			goto fail;
		}
		p->algo = res.algo;
	}
	lt->MatmulPreferenceDestroy(pref);
	*out = p;
	return FZ_OK;
fail:
	if (pref)
		lt->MatmulPreferenceDestroy(pref);
	plan_free(lt, p);
	return st;
}

/* The plan for k: found, or made and kept. */
static fz_status plan_get(fz_cuda_blas *b, const mm_key *k, mm_plan **out,
                          char **err)
{
	pthread_mutex_lock(&b->mu);
	for (int i = 0; i < b->n; i++)
		if (!memcmp(&b->plans[i]->key, k, sizeof *k)) {
			*out = b->plans[i];
			pthread_mutex_unlock(&b->mu);
			return FZ_OK;
		}
	fz_status st = FZ_OK;
	if (b->n == b->cap) {
		int cap = b->cap ? 2 * b->cap : 16;
		mm_plan **p = realloc(b->plans, (size_t)cap * sizeof *p);
		if (!p) {
			pthread_mutex_unlock(&b->mu);
			fz_set_err(err, fz_strdup("out of memory"));
			return FZ_ENOMEM;
		}
		b->plans = p;
		b->cap = cap;
	}
	if ((st = plan_make(b, k, out, err)) == FZ_OK)
		b->plans[b->n++] = *out;
	pthread_mutex_unlock(&b->mu);
	return st;
}

typedef struct bdim {
	int64_t n, sa, sb, sy;
} bdim;

/* The batch dims of m with unit dims dropped and mergeable neighbours
 * merged, outermost first; y's strides are its contiguous ones. */
static int batch_dims(const fz_matmul *m, bdim *out)
{
	int64_t sy = m->M * m->N;
	bdim rev[FZ_MAX_RANK];
	int n = 0;
	for (int d = m->nbd - 1; d >= 0; d--) {
		int64_t e = m->bshape[d];
		if (e != 1) {
			bdim x = {e, m->a_bstride[d], m->b_bstride[d], sy};
			if (n > 0 && x.sa == rev[n - 1].sa * rev[n - 1].n &&
			    x.sb == rev[n - 1].sb * rev[n - 1].n)
				rev[n - 1].n *= e; /* y always merges: contiguous */
			else
				rev[n++] = x;
		}
		sy *= e;
	}
	for (int i = 0; i < n; i++)
		out[i] = rev[n - 1 - i];
	return n;
}

fz_status fz_cuda_blas_matmul(fz_cuda_blas *b, const fz_matmul *m, bool tf32,
                              void *stream, char **err)
{
	const fz_lt_api *lt = b->lt;
	if (m->M == 0 || m->N == 0)
		return FZ_OK;
	bdim bd[FZ_MAX_RANK];
	int nb = batch_dims(m, bd);
	int64_t total = 1;
	for (int i = 0; i < nb; i++)
		total *= bd[i].n;
	if (total == 0)
		return FZ_OK;
	if (m->K == 0) {
		fz_set_err(err, fz_strdup_printf("region %d: a matmul over K = 0 is not "
		                              "supported on CUDA", m->region));
		return FZ_EUNSUPPORTED;
	}
	size_t es = fz_dtype_size(m->dtype);
	mm_key k;
	memset(&k, 0, sizeof k); /* padding too: keys compare with memcmp */
	k.dtype = (int)m->dtype;
	k.tf32 = tf32 && m->dtype == FZ_F32;
	k.trans = m->b_trans;
	k.bias = m->bias != NULL;
	k.M = m->M;
	k.N = m->N;
	k.K = m->K;
	k.batch = 1;
	/* a weight shared by a contiguous batch of a: one taller GEMM */
	if (nb == 1 && bd[0].sb == 0 && bd[0].sa == m->M * m->K) {
		k.M *= bd[0].n;
		nb = 0;
	}
	int outer = nb > 0 ? nb - 1 : 0;
	if (nb > 0) {
		k.batch = bd[nb - 1].n;
		k.sa = bd[nb - 1].sb;  /* cuBLASLt's A is our w */
		k.sb = bd[nb - 1].sa;
		k.sy = bd[nb - 1].sy;
	}
	/* alignment over every pointer a call will see */
	uint64_t wa = (uint64_t)(uintptr_t)m->b, aa = (uint64_t)(uintptr_t)m->a,
	         ya = (uint64_t)(uintptr_t)m->y;
	for (int i = 0; i < nb; i++) {
		wa |= (uint64_t)(bd[i].sb * (int64_t)es);
		aa |= (uint64_t)(bd[i].sa * (int64_t)es);
		ya |= (uint64_t)(bd[i].sy * (int64_t)es);
	}
	k.align[0] = align_of(wa, 256);
	k.align[1] = align_of(aa, 256);
	k.align[2] = align_of(ya, 256);
	k.ws = m->workspace ? (uint64_t)m->workspace_bytes : 0;
	mm_plan *p = NULL;
	fz_status st = plan_get(b, &k, &p, err);
	if (st != FZ_OK) {
		if (err && *err)
			fz_set_err(err, fz_strdup_printf("region %d: %s", m->region, *err));
		return st;
	}
	float f1 = 1.0f, f0 = 0.0f;
	double d1 = 1.0, d0 = 0.0;
	const void *alpha = m->dtype == FZ_F64 ? (const void *)&d1 : (const void *)&f1;
	const void *beta = m->dtype == FZ_F64 ? (const void *)&d0 : (const void *)&f0;
	int64_t idx[FZ_MAX_RANK] = {0};
	int64_t calls = 1;
	for (int i = 0; i < outer; i++)
		calls *= bd[i].n;
	char what[160];
	if (k.bias)
		pthread_mutex_lock(&p->mu);
	cublasStatus_t s = FZ_CUBLAS_STATUS_SUCCESS;
	const char *call = "cublasLtMatmul";
	if (k.bias) {
		const void *bias = m->bias;
		s = lt->MatmulDescSetAttribute(p->desc, FZ_CUBLASLT_MATMUL_DESC_BIAS_POINTER,
		                               &bias, sizeof bias);
		call = "cublasLtMatmulDescSetAttribute(BIAS_POINTER)";
	}
	for (int64_t c = 0; c < calls && s == FZ_CUBLAS_STATUS_SUCCESS; c++) {
		int64_t oa = 0, ob = 0, oy = 0;
		for (int i = 0; i < outer; i++) {
			oa += idx[i] * bd[i].sa;
			ob += idx[i] * bd[i].sb;
			oy += idx[i] * bd[i].sy;
		}
		const char *pa = (const char *)m->a + oa * (int64_t)es;
		const char *pw = (const char *)m->b + ob * (int64_t)es;
		char *py = (char *)m->y + oy * (int64_t)es;
		call = "cublasLtMatmul";
		s = lt->Matmul(b->h, p->desc, alpha, pw, p->la, pa, p->lb, beta, py, p->ld,
		               py, p->ld, &p->algo, m->workspace, (size_t)k.ws,
		               (cudaStream_t)stream);
		for (int i = outer - 1; i >= 0; i--) {
			if (++idx[i] < bd[i].n)
				break;
			idx[i] = 0;
		}
	}
	if (k.bias)
		pthread_mutex_unlock(&p->mu);
	if (s != FZ_CUBLAS_STATUS_SUCCESS) {
		char shape[128];
		describe(&k, shape, sizeof shape);
		snprintf(what, sizeof what, "region %d, %s", m->region, shape);
		return fz_lt_fail(lt, err, s, call, what);
	}
	return FZ_OK;
}
