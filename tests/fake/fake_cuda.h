/*
 * fake_cuda.h: a stand-in for libcuda.so.1 and libcublasLt.so, for testing
 * the CUDA target's host side on machines with no GPU (tests/test_cuda_api.c).
 *
 * "Device memory" is host memory (cuMemAlloc is aligned_alloc), kernels
 * never run (cuLaunchKernel records what it was asked), and
 * cublasLtMatmul computes f32 and f64 products on the host exactly as
 * cuBLASLt documents them: column-major, op(A) m x k, op(B) k x n, D m x n,
 * strided batches, the bias epilogue adding bias[i] to row i of D. So the
 * target's row-major-to-column-major mapping, batching and broadcast are
 * checked against a reference computed in the test, while the driver's
 * other calls are counted. The test reaches the state through dlsym of
 * "fake_cuda" in the same library the loader opened.
 */
#ifndef FUSEC_TESTS_FAKE_CUDA_H
#define FUSEC_TESTS_FAKE_CUDA_H

#include <stdint.h>

#define FAKE_MAX_LAUNCHES 64
#define FAKE_MAX_PARAMS 64

typedef struct fake_launch {
	const char *fn;               /* the entry point's name */
	unsigned grid[3], block[3], shmem;
	void *stream;
	void **params;                /* the array the launch was given */
	unsigned char param[FAKE_MAX_PARAMS][8]; /* the first n_params values */
} fake_launch;

typedef struct fake_matmul {
	int compute, scale, transa, transb, epilogue, type;
	uint64_t m, n, k;
	int64_t lda, ldb, ldd;
	int batch;
	int64_t sa, sb, sd;
	const void *a, *b, *d, *bias;
	uint64_t ws_bytes;
} fake_matmul;

typedef struct fake_state {
	/* set by the test */
	int init_result;        /* what cuInit returns */
	int devices;            /* cuDeviceGetCount */
	int cc_major, cc_minor, sms;
	int max_threads;        /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */
	int reject_cubin;       /* loading an image that is a cubin fails */
	int reject_ptx;         /* loading PTX fails, with a log */
	int launch_result;
	int n_params;           /* parameter values a launch records */
	int param_size[FAKE_MAX_PARAMS]; /* bytes of each (0: 8) */
	/* counted */
	int retains, releases, pushes, pops;
	int cubin_loads, ptx_loads, links, unloads;
	int allocs, frees, syncs, events, records, waits, uploads, memsets;
	int streams;            /* created and not destroyed */
	int n_launches;
	fake_launch launch[FAKE_MAX_LAUNCHES];
	int lt_creates, lt_destroys, lt_heuristics, n_matmuls;
	fake_matmul mm[FAKE_MAX_LAUNCHES];
	uint32_t align[4];      /* the last preference's alignments */
} fake_state;

#endif
