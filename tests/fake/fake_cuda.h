/*
 * fake_cuda.h: a stand-in for libcuda.so.1 and libcublasLt.so, for testing
 * the CUDA target's host side on machines with no GPU (tests/test_cuda_api.c).
 *
 * "Device memory" is host memory (cuMemAlloc is aligned_alloc), kernels
 * run only where a test supplies them (the hook below; fusec's own gather
 * runs here), cuLaunchKernel records what it was asked, and
 * ncclAllGather, ncclReduceScatter and ncclAllReduce (fake_nccl.c) perform
 * the collective across the calling threads (one rank each) on that host
 * memory, as NCCL documents them, and every device call is logged in
 * order with its stream and event, so tests check the ordering a GPU
 * would see. cublasLtMatmul computes f32 and f64 products on the host exactly as
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
#define FAKE_MAX_VALUES 192
#define FAKE_MAX_DEVICES 8

typedef struct fake_launch {
	const char *fn;               /* the entry point's name */
	unsigned grid[3], block[3], shmem;
	void *stream;
	void **params;                /* the array the launch was given */
	unsigned char param[FAKE_MAX_PARAMS][8]; /* the first n_params values */
} fake_launch;

/* What a device was asked to do, in call order across threads: the
 * ordering tests read it (which stream, which event, which device). */
#define FAKE_MAX_LOG 4096
typedef struct fake_op {
	char kind;      /* K launch, R event record, W stream waits on event,
	                   Z memset, D device copy, H host-to-device copy,
	                   h device-to-host copy, S stream sync, E event sync,
	                   M matmul, N an NCCL collective, G graph launch
	                   (its nodes follow, logged as they replay) */
	int dev;        /* the calling thread's current device (-1: none) */
	void *stream;
	void *event;    /* R, W */
	const void *x;  /* N: the operand; D: the source */
	void *y;        /* N: the result; D: the destination */
} fake_op;

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
	int legacy_memsets; /* cuMemsetD8: on the legacy stream, unordered
	                     * with non-blocking streams */
	int streams;            /* created and not destroyed */
	int captures;           /* cuStreamBeginCapture calls */
	int graphs, execs;      /* graphs and instances alive */
	int graph_launches;
	int dyn_smem;           /* the last cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) */
	int n_launches;
	fake_launch launch[FAKE_MAX_LAUNCHES];
	int lt_creates, lt_destroys, lt_heuristics, n_matmuls;
	fake_matmul mm[FAKE_MAX_LAUNCHES];
	uint32_t align[4];      /* the last preference's alignments */
	int n_log;
	fake_op log[FAKE_MAX_LOG];
	/* NCCL (fake_nccl.c) */
	int nccl_comms;         /* communicators formed and not destroyed */
	int nccl_ops;           /* collectives performed */
	int nccl_groups;        /* ncclGroupEnd calls that performed some */
	int nccl_unpolled;      /* calls made while one was in progress */
	int nccl_no_device;     /* communicators asked for with no device current */
	int nccl_wrong_device;  /* collectives on another device's stream */
	/* Kernels. fusec's own gather (cuda.c) runs here; other kernels run
	 * only where a test sets the hook: hook_params says how many 8-byte
	 * parameters the kernel `name` of module `module` (the module-th
	 * loaded on this device, the gather's not counted) takes, so the
	 * launch copies them when it is made (as the driver does); hook_run
	 * runs it over those values when the launch executes. */
	int modules_loaded[FAKE_MAX_DEVICES];
	int (*hook_params)(void *ctx, int module, const char *name);
	void (*hook_run)(void *ctx, int module, const char *name, const uint64_t *vals);
	void *hook_ctx;
} fake_state;

/* Appends to the log (thread-safe); the entry, or NULL when full. */
fake_op *fake_log(char kind, void *stream);
/* For a stream-ordered call: 0 when it is to run now; 1 when stream is
 * capturing and run(copy of ctx, stream) became a node of the graph; else
 * the CUresult the call fails with. */
int fake_defer(void *stream, char kind, void (*run)(void *ctx, void *stream),
               const void *ctx, size_t size);
int fake_current_device(void);

#endif
