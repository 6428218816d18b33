/*
 * cuda_target.h: the CUDA target's device, shared by cuda.c (driver calls)
 * and cublaslt.c (matrix products). Nothing outside runtime/ includes it;
 * the runner sees fz_target_cuda through target.h.
 */
#ifndef FUSEC_RUNTIME_CUDA_TARGET_H
#define FUSEC_RUNTIME_CUDA_TARGET_H

#include <pthread.h>
#include <stdbool.h>

#include "cuda_api.h"
#include "target.h"

typedef struct fz_cuda_blas fz_cuda_blas;

/* One per device ordinal and process, shared by every program. */
typedef struct cu_dev {
	fz_device hd;             /* first: what the runner sees */
	const fz_cu_api *cu;
	int ordinal;
	CUdevice dev;
	CUcontext ctx;            /* the primary context, retained */
	bool ctx_retained;
	char name[256];
	int cc_major, cc_minor;
	bool tf32;                /* f32 matmuls may use TF32 */
	pthread_mutex_t mu;       /* modules, events, the gather, cuBLASLt */
	CUmodule *mods;           /* loaded, unloaded at close */
	int n_mods, cap_mods;
	CUevent *ev;              /* by the runner's event index */
	CUevent timer[2];         /* fz_cuda_timer's, with timing */
	CUmodule copy_mod;
	CUfunction copy_fn[4];    /* gather of 1, 2, 4, 8-byte elements */
	fz_cuda_blas *blas;       /* cuBLASLt, made on the first matmul */
	CUstream comm;            /* the communication stream (NCCL), made on
	                             the first collective through NCCL */
	CUevent fork;             /* recorded on the compute stream before a
	                             collective; the communication stream waits */
} cu_dev;

extern const fz_target fz_target_cuda;

/* Makes the device's context current when it is not; leave undoes it. */
CUresult fz_cuda_enter(cu_dev *d, bool *pushed);
void fz_cuda_leave(cu_dev *d, bool pushed);

static inline bool fz_cuda_options_tf32(const fz_exec_options *o)
{
	return o->tf32 != 0;
}

/* cuBLASLt (cublaslt.c), with the device's context current. */
fz_status fz_cuda_blas_new(fz_cuda_blas **out, char **err);
void fz_cuda_blas_free(fz_cuda_blas *b);
fz_status fz_cuda_blas_matmul(fz_cuda_blas *b, const fz_matmul *m, bool tf32,
                              void *stream, char **err);

/* The cubin for dev's own arch from PTX text (the driver's linker), to be
 * stored beside the PTX under fz_cuda_cubin_tag ("cubin.sm_90"). *cubin is
 * freed with free. what names the kernel in messages. */
fz_status fz_cuda_cubin(fz_device *dev, const char *ptx, size_t len,
                        const char *what, void **cubin, size_t *cubin_len,
                        char **err);
void fz_cuda_cubin_tag(fz_device *dev, char *buf, size_t n);

/* The device's name, compute capability (90) and driver version (12080). */
void fz_cuda_describe(fz_device *dev, char *name, size_t n, int *cc,
                      int *driver);

/* Device time on stream: stop false records the start; stop true records
 * the end, waits for it and sets *ms to the time between (`fusec run
 * --iters` on CUDA). */
fz_status fz_cuda_timer(fz_device *dev, void *stream, bool stop, double *ms,
                        char **err);

/* Rank `rank` of `world` joins the NCCL communicator of id on dev (its
 * context made current, as NCCL asks): what the caller sets on the
 * runner's communicator (fz_comm_set_nccl) so that the CUDA target's
 * collectives go through NCCL. Freed with fz_cuda_nccl_free. */
struct fz_nccl;
fz_status fz_cuda_nccl_new(fz_device *dev, int world, int rank,
                           const unsigned char *id, double timeout_s,
                           struct fz_nccl **out, char **err);
void fz_cuda_nccl_free(fz_device *dev, struct fz_nccl *n);
/* The same after a failure of this rank or a peer: ncclCommAbort cancels
 * what the peers will never match (fz_nccl_abort). */
void fz_cuda_nccl_abort(fz_device *dev, struct fz_nccl *n);

/* A stream of dev's own (non-blocking), for a caller with none, such as
 * `fusec run --graph` (the legacy stream cannot be captured). */
fz_status fz_cuda_stream_new(fz_device *dev, void **stream, char **err);
void fz_cuda_stream_free(fz_device *dev, void *stream);

/* The gather kernels' PTX (tests check it with ptxas); free it. */
char *fz_cuda_copy_ptx(void);

#endif
