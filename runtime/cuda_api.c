/*
 * cuda_api.c: the driver and cuBLASLt tables of cuda_api.h, filled once.
 *
 * dlopen finds libcuda.so.1 on the loader path (the driver installs it
 * there; it exists only where a GPU does), then every entry point by its
 * versioned name. A missing library or symbol is a sentence, not a crash:
 * the CUDA target's open turns it into FZ_EUNSUPPORTED "no CUDA device
 * (libcuda.so.1: cannot open shared object file)", and `fusec run
 * --device auto` falls back to the CPU.
 *
 * Where cuda.h is present the function types below are checked against
 * its prototypes: _Generic on &cuLaunchKernel (which the header maps to
 * the versioned symbol) against the table's field type matches only when
 * every parameter type is the same, and the constants are compared one by
 * one.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "ir.h"

#ifdef FZ_HAVE_CUDA_H
#define FZ_CU_CHECK(field, sym, alt, hdr, params)                              \
	_Static_assert(_Generic(&hdr, CUresult(*) params: 1, default: 0),      \
	               "the type of " sym " differs from cuda.h");
FZ_CU_FUNCS(FZ_CU_CHECK)
#undef FZ_CU_CHECK
#define FZ_CU_SAME(x) _Static_assert((int)FZ_##x == (int)x, #x " differs from cuda.h");
FZ_CU_SAME(CUDA_SUCCESS)
FZ_CU_SAME(CUDA_ERROR_NO_DEVICE)
FZ_CU_SAME(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
FZ_CU_SAME(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
FZ_CU_SAME(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
FZ_CU_SAME(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
FZ_CU_SAME(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
FZ_CU_SAME(CU_JIT_ERROR_LOG_BUFFER)
FZ_CU_SAME(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
FZ_CU_SAME(CU_JIT_INPUT_PTX)
FZ_CU_SAME(CU_EVENT_DEFAULT)
FZ_CU_SAME(CU_EVENT_DISABLE_TIMING)
FZ_CU_SAME(CU_STREAM_NON_BLOCKING)
FZ_CU_SAME(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
_Static_assert(sizeof(CUdeviceptr) == sizeof(void *), "CUdeviceptr is a pointer");
#endif

#ifdef FZ_HAVE_CUBLASLT_H
#define FZ_LT_CHECK(field, sym, hdr, ret, params)                              \
	_Static_assert(_Generic(&hdr, ret(*) params: 1, default: 0),           \
	               "the type of " sym " differs from cublasLt.h");
FZ_LT_FUNCS(FZ_LT_CHECK)
#undef FZ_LT_CHECK
FZ_CU_SAME(CUBLAS_STATUS_SUCCESS)
FZ_CU_SAME(CUBLAS_OP_N)
FZ_CU_SAME(CUBLAS_OP_T)
FZ_CU_SAME(CUBLAS_COMPUTE_32F)
FZ_CU_SAME(CUBLAS_COMPUTE_32F_FAST_TF32)
FZ_CU_SAME(CUBLAS_COMPUTE_64F)
FZ_CU_SAME(CUDA_R_16F)
FZ_CU_SAME(CUDA_R_16BF)
FZ_CU_SAME(CUDA_R_32F)
FZ_CU_SAME(CUDA_R_64F)
FZ_CU_SAME(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT)
FZ_CU_SAME(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET)
FZ_CU_SAME(CUBLASLT_MATMUL_DESC_TRANSA)
FZ_CU_SAME(CUBLASLT_MATMUL_DESC_TRANSB)
FZ_CU_SAME(CUBLASLT_MATMUL_DESC_EPILOGUE)
FZ_CU_SAME(CUBLASLT_MATMUL_DESC_BIAS_POINTER)
FZ_CU_SAME(CUBLASLT_EPILOGUE_DEFAULT)
FZ_CU_SAME(CUBLASLT_EPILOGUE_BIAS)
FZ_CU_SAME(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
FZ_CU_SAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES)
FZ_CU_SAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES)
FZ_CU_SAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES)
FZ_CU_SAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
_Static_assert(sizeof(cublasLtMatmulHeuristicResult_t) == 96,
               "cublasLtMatmulHeuristicResult_t's size");
#endif

/* ---- the driver ---------------------------------------------------------- */

static const char *const cu_names[] = {"libcuda.so.1", "libcuda.so", NULL};
static const char *cu_path;           /* tests: this library only */
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static fz_cu_api cu_api;
static const fz_cu_api *cu_ok;
static const char *cu_why;
static char cu_why_buf[256];

const char *const *fz_cu_library_names(void) { return cu_names; }

void fz_cu_set_library(const char *path) { cu_path = path; }

static void *open_first(const char *const *names, const char *only,
                        char *why, size_t n)
{
	const char *one[] = {only, NULL};
	const char *const *list = only ? one : names;
	/* the first name's error is the one that says what is missing */
	why[0] = 0;
	for (int i = 0; list[i]; i++) {
		void *h = dlopen(list[i], RTLD_NOW | RTLD_LOCAL);
		if (h)
			return h;
		const char *e = dlerror();
		if (!why[0])
			snprintf(why, n, "%s", e ? e : "cannot open the library");
	}
	if (!why[0])
		snprintf(why, n, "cannot open the library");
	return NULL;
}

static void cu_open(void)
{
	void *h = open_first(cu_names, cu_path, cu_why_buf, sizeof cu_why_buf);
	if (!h) {
		cu_why = cu_why_buf;
		return;
	}
	fz_cu_api a;
	memset(&a, 0, sizeof a);
#define FZ_CU_LOAD(field, sym, alt, hdr, params)                               \
	*(void **)&a.field = dlsym(h, sym);                                     \
	if (!a.field && alt)                                                    \
		*(void **)&a.field = dlsym(h, alt ? alt : sym);                 \
	if (!a.field) {                                                         \
		snprintf(cu_why_buf, sizeof cu_why_buf,                         \
		         "the driver lacks %s (too old for this fusec)", sym);  \
		goto fail;                                                      \
	}
	FZ_CU_FUNCS(FZ_CU_LOAD)
#undef FZ_CU_LOAD
	CUresult r = a.Init(0);
	if (r != FZ_CUDA_SUCCESS) {
		const char *name = NULL;
		if (a.GetErrorName(r, &name) != FZ_CUDA_SUCCESS || !name)
			name = "an unknown error";
		snprintf(cu_why_buf, sizeof cu_why_buf, "cuInit failed: %s", name);
		goto fail;
	}
	if (a.DriverGetVersion(&a.driver_version) != FZ_CUDA_SUCCESS)
		a.driver_version = 0;
	cu_api = a;
	cu_ok = &cu_api;
	return;
fail:
	cu_why = cu_why_buf;
	/* the library stays open: a driver is never unloaded under a
	 * process that may have touched it */
}

const fz_cu_api *fz_cu_load(const char **why)
{
	pthread_once(&cu_once, cu_open);
	if (why)
		*why = cu_ok ? NULL : cu_why;
	return cu_ok;
}

fz_status fz_cu_fail(const fz_cu_api *cu, char **err, CUresult r,
                     const char *call, const char *what)
{
	const char *name = NULL, *text = NULL;
	if (cu) {
		if (cu->GetErrorName(r, &name) != FZ_CUDA_SUCCESS)
			name = NULL;
		if (cu->GetErrorString(r, &text) != FZ_CUDA_SUCCESS)
			text = NULL;
	}
	if (err) {
		free(*err);
		*err = fz_strdup_printf("%s (%s): %s%s%s%s", call, what,
		                        name ? name : "CUDA error",
		                        text ? " (" : "", text ? text : "",
		                        text ? ")" : "");
		if (!name && *err) {
			char *m = fz_strdup_printf("%s %d", *err, (int)r);
			free(*err);
			*err = m;
		}
	}
	return r == 2 /* CUDA_ERROR_OUT_OF_MEMORY */ ? FZ_ENOMEM : FZ_ERUNTIME;
}

/* ---- cuBLASLt -------------------------------------------------------------- */

static const char *const lt_names[] = {
	"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
	"/usr/local/cuda/lib64/libcublasLt.so.13",
	"/usr/local/cuda/lib64/libcublasLt.so.12",
	"/usr/local/cuda/lib64/libcublasLt.so", NULL,
};
static const char *lt_path;           /* tests: this library only */
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static fz_lt_api lt_api;
static const fz_lt_api *lt_ok;
static const char *lt_why;
static char lt_why_buf[256];

void fz_lt_set_library(const char *path) { lt_path = path; }

static void lt_open(void)
{
	void *h = open_first(lt_names, lt_path, lt_why_buf, sizeof lt_why_buf);
	if (!h) {
		lt_why = lt_why_buf;
		return;
	}
	fz_lt_api a;
	memset(&a, 0, sizeof a);
#define FZ_LT_LOAD(field, sym, hdr, ret, params)                               \
	if (!(*(void **)&a.field = dlsym(h, sym))) {                            \
		snprintf(lt_why_buf, sizeof lt_why_buf, "cuBLASLt lacks %s", sym);\
		lt_why = lt_why_buf;                                            \
		dlclose(h);                                                     \
		return;                                                         \
	}
	FZ_LT_FUNCS(FZ_LT_LOAD)
#undef FZ_LT_LOAD
	lt_api = a;
	lt_ok = &lt_api;
}

const fz_lt_api *fz_lt_load(const char **why)
{
	pthread_once(&lt_once, lt_open);
	if (why)
		*why = lt_ok ? NULL : lt_why;
	return lt_ok;
}

fz_status fz_lt_fail(const fz_lt_api *lt, char **err, cublasStatus_t s,
                     const char *call, const char *what)
{
	const char *name = lt ? lt->GetStatusName(s) : NULL;
	if (err) {
		free(*err);
		*err = name ? fz_strdup_printf("%s (%s): %s", call, what, name)
		            : fz_strdup_printf("%s (%s): cuBLAS status %d", call,
		                               what, (int)s);
	}
	return s == 3 /* CUBLAS_STATUS_ALLOC_FAILED */ ? FZ_ENOMEM : FZ_ERUNTIME;
}
