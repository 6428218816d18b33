/*
 * target.h: an execution target is one table of functions.
 *
 * The runner (exec.c) walks a prepared plan and never touches memory or a
 * device itself: every allocation, copy, kernel load and launch, library
 * call, collective, event and synchronization goes through the target's
 * table. A target is one file: cpu.c (generated host code, all cores),
 * cuda.c (the driver API opened at run time), emu.c (the GPU's kernels
 * emulated on the CPU, with bounds and race checks). They are found by
 * name in one table (fz_target_find), which the C API, `fusec run` and
 * Python all use.
 *
 *     const fz_target *tg = fz_target_find("cpu");
 *     fz_device *dev;  tg->open(&opts, &dev, &err);     shared, refcounted
 *     tg->alloc(dev, arena_bytes, &arena, &err);         once per plan
 *     tg->load(dev, &k, &code, fn, &err);                once per key
 *     tg->launch(dev, &k, fn, bufs, syms, flag, stream, &err);
 *       or, fixed at prepare: tg->pack(..., bufs, syms, flag, &pk, &err),
 *       then per run tg->launch_packed(dev, pk, stream, &err)
 *     tg->matmul(dev, &mm, stream, &err);
 *     tg->sync(dev, stream, &err);
 *     fz_device_release(dev);
 *
 * Pointers a target hands out (alloc) are device pointers: host pointers
 * where host_memory is set (cpu, emu), else only the target may read
 * them and upload/download cross over. Every slot returns a status and
 * names what failed in *err; none exits.
 *
 * Streams are opaque (a CUstream on CUDA, ignored on the CPU): a program
 * runs on the caller's stream, and collectives on the device's
 * communication stream, ordered with events. A run never synchronizes the
 * host; sync is for the caller's asking.
 *
 * Optional slots a GPU target fills (NULL elsewhere): pack (a launch's
 * geometry and parameter block fixed when a plan is prepared), zero (a
 * device memset), and graphs (capture_begin ... capture_end, graph_launch:
 * a whole run recorded once and replayed). One a host target fills: fresh
 * (advice on the caller's output memory before a run writes it).
 */
#ifndef FUSEC_RUNTIME_TARGET_H
#define FUSEC_RUNTIME_TARGET_H

#include <pthread.h>

#include "codegen.h"
#include "fusec.h"
#include "plan.h"

typedef struct fz_target fz_target;
typedef struct fz_kstore fz_kstore;

/* Every target's device context begins with this header: the runner and
 * the kernel store (kernels.c) share one device per target and process,
 * so each key's code is loaded once and serves every program. */
typedef struct fz_device {
	const fz_target *tg;
	int refs;               /* fz_device_retain / fz_device_release */
	pthread_mutex_t mu;     /* guards loads and the kernel store */
	fz_kstore *store;       /* loaded kernels by canonical form */
	fz_cg_options cg;       /* what its kernels are compiled for */
	int sm_count;           /* for launch geometry (0: not a GPU) */
	int threads;            /* host threads a launch may use */
	/* The cache section of this device's machine code ("cubin.sm_90";
	 * "" for none): what kernels.c hands load beside the PTX, and where
	 * it stores what native made. */
	char native_tag[16];
} fz_device;

/* A target calls this whenever it blocks the host on the device (a stream
 * or context synchronization, a blocking copy); counted per thread, so
 * fz_exec_run can report the ones inside its runs (the contract: 0) even
 * with ranks on threads sharing one device. */
void fz_host_sync_note(void);
long fz_host_sync_count(void);

/* A kernel's code as the cache or the compiler hands it over. */
typedef struct fz_kcode {
	const void *obj;        /* host or emu: a relocatable object */
	size_t obj_len;
	const char *ptx;        /* NVPTX: PTX text */
	size_t ptx_len;
	const void *cubin;      /* NVPTX: machine code for the device, or NULL */
	size_t cubin_len;
} fz_kcode;

/* A matrix product, fixed when a plan is prepared; the runner sets the
 * pointers per run. y[b] = a[b] · op(w[b]) (+ bias), with torch.matmul's
 * batch broadcast: batch dim d has extent bshape[d] and element strides
 * a_bstride[d], b_bstride[d] (0 where an operand broadcasts); y is
 * contiguous. linear: b is [N, K] (b_trans), bias [N] or NULL. */
typedef struct fz_matmul {
	int region;
	fz_dtype dtype;          /* a, b, bias and y share it */
	int64_t M, N, K;
	bool b_trans;
	bool a_trans;            /* a is stored as its transpose [K, M] (a
	                            strided view: lda set; matmul_strided only) */
	int nbd;
	int64_t bshape[FZ_MAX_RANK], a_bstride[FZ_MAX_RANK], b_bstride[FZ_MAX_RANK];
	const void *a, *b, *bias;
	void *y;
	/* Row strides in elements, 0 for dense (a: K, or M when a_trans;
	 * b: N, or K when b_trans): an operand may be a strided view whose
	 * rows (or, transposed, columns) are contiguous, only on a target
	 * that sets matmul_strided. */
	int64_t lda, ldb;
	/* scratch the library may use (NULL: none): the target's
	 * matmul_workspace bytes of the plan's arena, shared by the plan's
	 * matmuls, which run in stream order */
	void *workspace;
	size_t workspace_bytes;
} fz_matmul;

typedef enum fz_coll_kind {
	FZ_COLL_ALL_GATHER, FZ_COLL_REDUCE_SCATTER, FZ_COLL_ALL_REDUCE
} fz_coll_kind;

/* A collective over the device's communicator. The operand is seen as
 * [outer, extent, inner] around the collective's dim (extent: this rank's
 * x along it); all_gather makes [outer, world*extent, inner], reduce_scatter
 * [outer, extent/world, inner], all_reduce the same shape. */
typedef struct fz_collective {
	int region;
	fz_coll_kind kind;
	fz_dtype dtype;
	int64_t outer, extent, inner;
	const void *x;
	void *y;
	/* The runner's communicator and rank (NULL: world 1, the identity;
	 * cpu: runtime/comm.h across threads), and the event the target
	 * records on its communication stream when this collective is done:
	 * the wait makes the compute stream wait on it (event_wait). A device
	 * target must first make its communication stream wait for the
	 * compute stream's work so far: then the operand is ready, and the
	 * buffer memplan gives the result (freed by an earlier step) is no
	 * longer read. memplan keeps the operand live until the wait
	 * (ir/comm.c), so nothing overwrites it while the collective reads. */
	struct fz_comm *comm;
	int rank;
	int event;
	/* A bucket (one collective region of several, consecutive steps
	 * sharing event): 1 its first member, 2 one inside, 3 its last; 0 a
	 * collective alone. A target may issue a bucket as one group (NCCL:
	 * ncclGroupStart/End, one launch). */
	int bucket;
} fz_collective;

struct fz_target {
	const char *name;        /* "cpu", "cuda", "emu" */
	bool host_memory;        /* device pointers are host pointers */
	size_t matmul_workspace; /* arena bytes a plan with matmuls reserves
	                            for fz_matmul.workspace (0: none) */
	bool matmul_strided;     /* takes fz_matmul.lda/ldb and a_trans (else
	                            operands that are strided views are
	                            gathered) */

	/* The process's device for options o (o->device picks among several),
	 * retained once for the caller: FZ_EUNSUPPORTED with a plain message
	 * ("no CUDA device") where there is none. */
	fz_status (*open)(const fz_exec_options *o, fz_device **dev, char **err);
	void (*close)(fz_device *dev);  /* the last release */

	/* Memory. alloc gives 256-byte-aligned device memory; copy makes dst
	 * contiguous from src seen through lay (strides in elements of es
	 * bytes, lay->offset included), on the stream. */
	fz_status (*alloc)(fz_device *dev, size_t bytes, void **p, char **err);
	void (*release)(fz_device *dev, void *p);
	fz_status (*upload)(fz_device *dev, void *dst, const void *src, size_t n,
	                    void *stream, char **err);
	fz_status (*download)(fz_device *dev, void *dst, const void *src, size_t n,
	                      void *stream, char **err);
	fz_status (*copy)(fz_device *dev, void *dst, const void *src, size_t es,
	                  const fz_layout *lay, void *stream, char **err);
	/* Optional (NULL: none): p[0..n) is an output the caller handed a
	 * run, about to be written whole; a host target may prepare fresh
	 * memory for that (cpu: transparent huge pages). No status: it is
	 * advice, and a run does the same without it. */
	void (*fresh)(fz_device *dev, void *p, size_t n);

	/* Kernels. load turns code into fn[0..k->n_entries) (host functions,
	 * CUfunctions, ...); launch runs every entry of k in order over bufs
	 * (the kernel's parameters: canonical inputs, then outputs) with the
	 * symbols' sizes; a bad index sets *flag (device memory) to 1 + the
	 * node id. */
	fz_status (*load)(fz_device *dev, const fz_kernel *k, const fz_kcode *code,
	                  void **fn, char **err);
	fz_status (*launch)(fz_device *dev, const fz_kernel *k, void *const *fn,
	                    void **bufs, const int64_t *syms, int32_t *flag,
	                    void *stream, char **err);
	/* Optional (NULL: launch is called per run): a kernel's launch fixed
	 * when a plan is prepared. pack reads k, fn, the plan's sizes syms
	 * and flag once (the geometry, the parameter block) and keeps the
	 * address of bufs, the step's array that the runner refills with a
	 * run's pointers before each launch_packed: a run builds nothing.
	 * *pk lives until unpack; k and fn outlive it (the device's store). */
	fz_status (*pack)(fz_device *dev, const fz_kernel *k, void *const *fn,
	                  void **bufs, const int64_t *syms, int32_t *flag,
	                  void **pk, char **err);
	fz_status (*launch_packed)(fz_device *dev, void *pk, void *stream,
	                           char **err);
	void (*unpack)(fz_device *dev, void *pk);
	/* Optional (NULL: an upload of zeros): n bytes at p (a multiple of
	 * 4) set to 0 on the stream, without the host's bytes (the flag
	 * word's reset). */
	fz_status (*zero)(fz_device *dev, void *p, size_t n, void *stream,
	                  char **err);
	/* Optional (NULL: no graphs): the work queued on stream between
	 * capture_begin and capture_end is not run but kept as one graph
	 * (*graph), which graph_launch replays on a stream as a whole (CUDA
	 * graphs); graph_free frees it. capture_end always ends the capture,
	 * even when it fails. */
	fz_status (*capture_begin)(fz_device *dev, void *stream, char **err);
	fz_status (*capture_end)(fz_device *dev, void *stream, void **graph,
	                         char **err);
	fz_status (*graph_launch)(fz_device *dev, void *graph, void *stream,
	                          char **err);
	void (*graph_free)(fz_device *dev, void *graph);
	/* Optional (NULL: none): machine code for this device made from
	 * code's portable form (PTX), for a cache entry that has none under
	 * native_tag; kernels.c stores it back so that the next process
	 * loads it. *bin is freed with free. */
	fz_status (*native)(fz_device *dev, const fz_kernel *k,
	                    const fz_kcode *code, void **bin, size_t *len,
	                    char **err);

	/* Library calls and collectives. */
	fz_status (*matmul)(fz_device *dev, const fz_matmul *m, void *stream,
	                    char **err);
	fz_status (*collective)(fz_device *dev, const fz_collective *c,
	                        void *stream, char **err);

	/* Events (ev: an index the runner allocates per plan) and sync. */
	fz_status (*event_record)(fz_device *dev, int ev, void *stream, char **err);
	fz_status (*event_wait)(fz_device *dev, int ev, void *stream, char **err);
	fz_status (*sync)(fz_device *dev, void *stream, char **err);
};

extern const fz_target fz_target_cpu;
extern const fz_target fz_target_cuda;
extern const fz_target fz_target_emu;   /* emu.c: the GPU's kernels on the CPU */

/* The target called name ("cpu", "cuda", "emu"), or NULL. */
const fz_target *fz_target_find(const char *name);
/* The names, for messages: "cpu, cuda, emu". */
const char *fz_target_names(void);

/* Device references: open returns one; each holder releases it. The last
 * release frees the kernel store and closes the device. */
void fz_device_retain(fz_device *dev);
void fz_device_release(fz_device *dev);
/* Retains dev unless its last release is under way (false then): how a
 * target's open shares the device it already has. */
bool fz_device_try_retain(fz_device *dev);
/* Fills the header of a device a target's open just made. */
fz_status fz_device_init(fz_device *dev, const fz_target *tg, char **err);

#endif
