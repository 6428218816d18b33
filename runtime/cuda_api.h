/*
 * cuda_api.h: the CUDA driver and cuBLASLt, opened at run time.
 *
 * Nothing in fusec links CUDA: `ldd fusec` names no libcuda, cublas or
 * nccl, the library loads on a machine with no GPU, and a machine with one
 * finds the driver when a program first asks for the "cuda" target. Each
 * library is one table of function pointers filled once (pthread_once)
 * with dlsym, by the versioned names the headers map the plain ones to
 * (cuMemAlloc is cuMemAlloc_v2), so the ABI is the one the header names:
 *
 *     const fz_cu_api *cu = fz_cu_load(&why);     NULL: why says what
 *     CUresult r = cu->MemAlloc(&p, bytes);
 *     if (r) return fz_cu_fail(err, r, "cuMemAlloc", "the arena of region 3");
 *
 * The tables are one X-macro list each (name, symbol, parameters). The
 * types and constants used are declared here so that fusec builds without
 * the toolkit; where the build finds cuda.h (FZ_HAVE_CUDA_H), every
 * function type and constant is checked against the header at compile
 * time (_Static_assert), so a signature typed wrong here does not build.
 */
#ifndef FUSEC_RUNTIME_CUDA_API_H
#define FUSEC_RUNTIME_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "fusec.h"

#ifdef FZ_HAVE_CUDA_H
#include <cuda.h>
#if defined(__has_include)
#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#define FZ_HAVE_CUBLASLT_H 1
#endif
#endif
#else
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUlinkState_st *CUlinkState;
typedef int CUjit_option;
typedef int CUjitInputType;
typedef int CUdevice_attribute;
typedef int CUfunction_attribute;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef int CUstreamCaptureMode;
#endif

#ifndef FZ_HAVE_CUBLASLT_H
typedef int cublasStatus_t;
typedef int cudaDataType;
typedef int cublasComputeType_t;
typedef int cublasLtMatmulDescAttributes_t;
typedef int cublasLtMatrixLayoutAttribute_t;
typedef int cublasLtMatmulPreferenceAttributes_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct fz_lt_desc *cublasLtMatmulDesc_t;
typedef struct fz_lt_layout *cublasLtMatrixLayout_t;
typedef struct fz_lt_pref *cublasLtMatmulPreference_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct {
	uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	cublasStatus_t state;
	float wavesCount;
	int reserved[4];
} cublasLtMatmulHeuristicResult_t;
#endif

/* The constants fusec uses (plain integers, checked against the headers
 * where present). */
#define FZ_CUDA_SUCCESS                                  0
#define FZ_CUDA_ERROR_NO_DEVICE                          100
#define FZ_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT      16
#define FZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR  75
#define FZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR  76
#define FZ_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK       0
#define FZ_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define FZ_CU_JIT_ERROR_LOG_BUFFER                       5
#define FZ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES            6
#define FZ_CU_JIT_INPUT_PTX                              1
#define FZ_CU_EVENT_DEFAULT                              0
#define FZ_CU_EVENT_DISABLE_TIMING                       2
#define FZ_CU_STREAM_NON_BLOCKING                        1
#define FZ_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL           1

#define FZ_CUBLAS_STATUS_SUCCESS                         0
#define FZ_CUBLAS_OP_N                                   0
#define FZ_CUBLAS_OP_T                                   1
#define FZ_CUBLAS_COMPUTE_32F                            68
#define FZ_CUBLAS_COMPUTE_32F_FAST_TF32                  77
#define FZ_CUBLAS_COMPUTE_64F                            70
#define FZ_CUDA_R_16F                                    2
#define FZ_CUDA_R_16BF                                   14
#define FZ_CUDA_R_32F                                    0
#define FZ_CUDA_R_64F                                    1
#define FZ_CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT            5
#define FZ_CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET   6
#define FZ_CUBLASLT_MATMUL_DESC_TRANSA                   3
#define FZ_CUBLASLT_MATMUL_DESC_TRANSB                   4
#define FZ_CUBLASLT_MATMUL_DESC_EPILOGUE                 7
#define FZ_CUBLASLT_MATMUL_DESC_BIAS_POINTER             8
#define FZ_CUBLASLT_EPILOGUE_DEFAULT                     1
#define FZ_CUBLASLT_EPILOGUE_BIAS                        4
#define FZ_CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES      1
#define FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES    5
#define FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES    6
#define FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES    7
#define FZ_CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES    8

/* The driver entry points: X(field, symbol, fallback symbol, header name,
 * parameters). The fallback is tried where a driver predates the symbol
 * (cuEventElapsedTime_v2 is CUDA 12.8). */
#define FZ_CU_FUNCS(X)                                                         \
	X(Init, "cuInit", NULL, cuInit, (unsigned int))                          \
	X(DriverGetVersion, "cuDriverGetVersion", NULL, cuDriverGetVersion,      \
	  (int *))                                                               \
	X(GetErrorName, "cuGetErrorName", NULL, cuGetErrorName,                  \
	  (CUresult, const char **))                                             \
	X(GetErrorString, "cuGetErrorString", NULL, cuGetErrorString,            \
	  (CUresult, const char **))                                             \
	X(DeviceGetCount, "cuDeviceGetCount", NULL, cuDeviceGetCount, (int *))   \
	X(DeviceGet, "cuDeviceGet", NULL, cuDeviceGet, (CUdevice *, int))        \
	X(DeviceGetAttribute, "cuDeviceGetAttribute", NULL, cuDeviceGetAttribute,\
	  (int *, CUdevice_attribute, CUdevice))                                 \
	X(DeviceGetName, "cuDeviceGetName", NULL, cuDeviceGetName,               \
	  (char *, int, CUdevice))                                               \
	X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL,              \
	  cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                     \
	X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", NULL,         \
	  cuDevicePrimaryCtxRelease, (CUdevice))                                 \
	X(CtxGetCurrent, "cuCtxGetCurrent", NULL, cuCtxGetCurrent, (CUcontext *))\
	X(CtxPushCurrent, "cuCtxPushCurrent_v2", NULL, cuCtxPushCurrent,         \
	  (CUcontext))                                                           \
	X(CtxPopCurrent, "cuCtxPopCurrent_v2", NULL, cuCtxPopCurrent,            \
	  (CUcontext *))                                                         \
	X(ModuleLoadDataEx, "cuModuleLoadDataEx", NULL, cuModuleLoadDataEx,      \
	  (CUmodule *, const void *, unsigned int, CUjit_option *, void **))     \
	X(ModuleGetFunction, "cuModuleGetFunction", NULL, cuModuleGetFunction,   \
	  (CUfunction *, CUmodule, const char *))                                \
	X(ModuleUnload, "cuModuleUnload", NULL, cuModuleUnload, (CUmodule))      \
	X(FuncGetAttribute, "cuFuncGetAttribute", NULL, cuFuncGetAttribute,      \
	  (int *, CUfunction_attribute, CUfunction))                             \
	X(FuncSetAttribute, "cuFuncSetAttribute", NULL, cuFuncSetAttribute,      \
	  (CUfunction, CUfunction_attribute, int))                               \
	X(LinkCreate, "cuLinkCreate_v2", NULL, cuLinkCreate,                     \
	  (unsigned int, CUjit_option *, void **, CUlinkState *))                \
	X(LinkAddData, "cuLinkAddData_v2", NULL, cuLinkAddData,                  \
	  (CUlinkState, CUjitInputType, void *, size_t, const char *,            \
	   unsigned int, CUjit_option *, void **))                               \
	X(LinkComplete, "cuLinkComplete", NULL, cuLinkComplete,                  \
	  (CUlinkState, void **, size_t *))                                      \
	X(LinkDestroy, "cuLinkDestroy", NULL, cuLinkDestroy, (CUlinkState))      \
	X(LaunchKernel, "cuLaunchKernel", NULL, cuLaunchKernel,                  \
	  (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,   \
	   unsigned int, unsigned int, unsigned int, CUstream, void **, void **))\
	X(MemAlloc, "cuMemAlloc_v2", NULL, cuMemAlloc, (CUdeviceptr *, size_t))  \
	X(MemFree, "cuMemFree_v2", NULL, cuMemFree, (CUdeviceptr))               \
	X(MemsetD8, "cuMemsetD8_v2", NULL, cuMemsetD8,                           \
	  (CUdeviceptr, unsigned char, size_t))                                  \
	X(MemsetD32Async, "cuMemsetD32Async", NULL, cuMemsetD32Async,           \
	  (CUdeviceptr, unsigned int, size_t, CUstream))                         \
	X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL, cuMemcpyHtoDAsync,      \
	  (CUdeviceptr, const void *, size_t, CUstream))                         \
	X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", NULL, cuMemcpyDtoHAsync,      \
	  (void *, CUdeviceptr, size_t, CUstream))                               \
	X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", NULL, cuMemcpyDtoDAsync,      \
	  (CUdeviceptr, CUdeviceptr, size_t, CUstream))                          \
	X(StreamCreate, "cuStreamCreate", NULL, cuStreamCreate,                  \
	  (CUstream *, unsigned int))                                            \
	X(StreamDestroy, "cuStreamDestroy_v2", NULL, cuStreamDestroy, (CUstream))\
	X(StreamBeginCapture, "cuStreamBeginCapture_v2", NULL,                   \
	  cuStreamBeginCapture, (CUstream, CUstreamCaptureMode))                 \
	X(StreamEndCapture, "cuStreamEndCapture", NULL, cuStreamEndCapture,      \
	  (CUstream, CUgraph *))                                                 \
	X(GraphInstantiate, "cuGraphInstantiateWithFlags", NULL,                 \
	  cuGraphInstantiate, (CUgraphExec *, CUgraph, unsigned long long))      \
	X(GraphLaunch, "cuGraphLaunch", NULL, cuGraphLaunch,                     \
	  (CUgraphExec, CUstream))                                               \
	X(GraphExecDestroy, "cuGraphExecDestroy", NULL, cuGraphExecDestroy,      \
	  (CUgraphExec))                                                         \
	X(GraphDestroy, "cuGraphDestroy", NULL, cuGraphDestroy, (CUgraph))       \
	X(StreamSynchronize, "cuStreamSynchronize", NULL, cuStreamSynchronize,   \
	  (CUstream))                                                            \
	X(StreamWaitEvent, "cuStreamWaitEvent", NULL, cuStreamWaitEvent,         \
	  (CUstream, CUevent, unsigned int))                                     \
	X(EventCreate, "cuEventCreate", NULL, cuEventCreate,                     \
	  (CUevent *, unsigned int))                                             \
	X(EventDestroy, "cuEventDestroy_v2", NULL, cuEventDestroy, (CUevent))    \
	X(EventRecord, "cuEventRecord", NULL, cuEventRecord, (CUevent, CUstream))\
	X(EventSynchronize, "cuEventSynchronize", NULL, cuEventSynchronize,      \
	  (CUevent))                                                             \
	X(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime",       \
	  cuEventElapsedTime, (float *, CUevent, CUevent))

#define FZ_CU_FIELD(field, sym, alt, hdr, params) CUresult(*field) params;
typedef struct fz_cu_api {
	FZ_CU_FUNCS(FZ_CU_FIELD)
	int driver_version;     /* cuDriverGetVersion: 12080 for 12.8 */
} fz_cu_api;
#undef FZ_CU_FIELD

/* cuBLASLt: X(field, symbol, header name, return type, parameters). */
#define FZ_LT_FUNCS(X)                                                         \
	X(Create, "cublasLtCreate", cublasLtCreate, cublasStatus_t,               \
	  (cublasLtHandle_t *))                                                  \
	X(Destroy, "cublasLtDestroy", cublasLtDestroy, cublasStatus_t,            \
	  (cublasLtHandle_t))                                                    \
	X(GetVersion, "cublasLtGetVersion", cublasLtGetVersion, size_t, (void))   \
	X(GetStatusName, "cublasLtGetStatusName", cublasLtGetStatusName,          \
	  const char *, (cublasStatus_t))                                        \
	X(MatmulDescCreate, "cublasLtMatmulDescCreate", cublasLtMatmulDescCreate, \
	  cublasStatus_t, (cublasLtMatmulDesc_t *, cublasComputeType_t,          \
	                   cudaDataType))                                        \
	X(MatmulDescDestroy, "cublasLtMatmulDescDestroy",                         \
	  cublasLtMatmulDescDestroy, cublasStatus_t, (cublasLtMatmulDesc_t))     \
	X(MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute",               \
	  cublasLtMatmulDescSetAttribute, cublasStatus_t,                        \
	  (cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *,   \
	   size_t))                                                              \
	X(MatrixLayoutCreate, "cublasLtMatrixLayoutCreate",                       \
	  cublasLtMatrixLayoutCreate, cublasStatus_t,                            \
	  (cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t)) \
	X(MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy",                     \
	  cublasLtMatrixLayoutDestroy, cublasStatus_t, (cublasLtMatrixLayout_t)) \
	X(MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute",           \
	  cublasLtMatrixLayoutSetAttribute, cublasStatus_t,                      \
	  (cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t,              \
	   const void *, size_t))                                                \
	X(MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate",               \
	  cublasLtMatmulPreferenceCreate, cublasStatus_t,                        \
	  (cublasLtMatmulPreference_t *))                                        \
	X(MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy",             \
	  cublasLtMatmulPreferenceDestroy, cublasStatus_t,                       \
	  (cublasLtMatmulPreference_t))                                          \
	X(MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute",   \
	  cublasLtMatmulPreferenceSetAttribute, cublasStatus_t,                  \
	  (cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,     \
	   const void *, size_t))                                                \
	X(MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic",               \
	  cublasLtMatmulAlgoGetHeuristic, cublasStatus_t,                        \
	  (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,       \
	   cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,                       \
	   cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,              \
	   cublasLtMatmulHeuristicResult_t *, int *))                            \
	X(Matmul, "cublasLtMatmul", cublasLtMatmul, cublasStatus_t,               \
	  (cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,   \
	   cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,         \
	   const void *, const void *, cublasLtMatrixLayout_t, void *,           \
	   cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, \
	   cudaStream_t))

#define FZ_LT_FIELD(field, sym, hdr, ret, params) ret(*field) params;
typedef struct fz_lt_api {
	FZ_LT_FUNCS(FZ_LT_FIELD)
} fz_lt_api;
#undef FZ_LT_FIELD

/* The driver, opened and initialized (cuInit) once per process: the table,
 * or NULL with *why set to a static sentence ("libcuda.so.1 was not found",
 * "cuInit failed: CUDA_ERROR_NO_DEVICE"). Thread-safe. */
const fz_cu_api *fz_cu_load(const char **why);
/* cuBLASLt (libcublasLt.so.13, .so.12, .so, then /usr/local/cuda/lib64),
 * once per process: the table, or NULL with *why set. */
const fz_lt_api *fz_lt_load(const char **why);

/* Tests: the names the driver loader tries, in order (NULL-terminated),
 * and loaders that open exactly the library at path instead (NULL
 * restores the list); to be called before the first fz_cu_load or
 * fz_lt_load of the process. */
const char *const *fz_cu_library_names(void);
void fz_cu_set_library(const char *path);
void fz_lt_set_library(const char *path);

/* An error message for a failed driver call: "cuMemAlloc (the arena of
 * a plan, 1048576 bytes): CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
 * Returns the fusec status the CUresult maps to (FZ_ENOMEM for
 * CUDA_ERROR_OUT_OF_MEMORY, else FZ_ERUNTIME). err may be NULL. */
fz_status fz_cu_fail(const fz_cu_api *cu, char **err, CUresult r,
                     const char *call, const char *what);
/* Likewise for cuBLASLt. */
fz_status fz_lt_fail(const fz_lt_api *lt, char **err, cublasStatus_t s,
                     const char *call, const char *what);

#endif
