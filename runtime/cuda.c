/*
 * cuda.c: the CUDA target (target.h) on the driver API, opened at run time.
 *
 * A program runs on an NVIDIA GPU as a list of kernel launches, cuBLASLt
 * calls and copies queued on the caller's stream; nothing here waits for
 * the device except sync and download, which the caller asks for. The
 * target is a table of functions over one device object per ordinal and
 * process:
 *
 *     open     dlopen libcuda.so.1 (cuda_api.c); no driver, no device:
 *              FZ_EUNSUPPORTED "no CUDA device (why)". The device's
 *              primary context is retained (cuDevicePrimaryCtxRetain), the
 *              one the CUDA runtime and so PyTorch use: pointers, streams
 *              and events pass between fusec and torch as they are.
 *     alloc    cuMemAlloc, once per plan (the arena), not zeroed
 *     load     the cubin for this device when the cache has it, else the
 *              PTX through the driver's JIT; one module per kernel key per
 *              process (kernels.c calls load once per key), every entry
 *              point looked up once
 *     pack     once per kernel step when a plan is prepared: the grid
 *              from fz_kernel_launch_dims_on (the code generator's, shared
 *              with the emulator) at the plan's sizes and this device's
 *              multiprocessor count, and one parameter block: the buffer
 *              pointers (pointed at in the runner's array, which a run
 *              refills), the flag word, then the kernel's symbols' sizes
 *     launch   cuLaunchKernel per entry over the packed block: a run
 *              builds, allocates and computes nothing per launch. A
 *              kernel with k->smem bytes of dynamic shared memory (tile
 *              memory over 48 KiB, codegen.h) gets them at every launch,
 *              its function's limit raised at load (cuFuncSetAttribute
 *              MAX_DYNAMIC_SHARED_SIZE_BYTES)
 *     zero     cuMemsetD32Async (the flag word's reset)
 *     matmul   cuBLASLt (cublaslt.c), heuristics cached per shape
 *     collective  through the rank's NCCL communicator (comm.h) on the
 *              device's communication stream, which first waits for the
 *              compute stream (an event); an event recorded after it is
 *              what the trace's `wait` makes the compute stream wait on.
 *              A bucket's members are one NCCL group (one launch), forked
 *              and joined once. No communicator: world 1, the identity
 *              (a copy)
 *     copy     a strided view made contiguous by a small gather kernel
 *              written here in PTX (four entries by element size)
 *     sync     cuStreamSynchronize
 *     graphs   cuStreamBeginCapture (thread-local mode), cuStreamEndCapture,
 *              cuGraphInstantiate, cuGraphLaunch: fz_exec_run_graph
 *              captures a whole run on the caller's stream and replays it
 *
 * Every driver call's status is checked and reported with the call and
 * what it was for: "cuLaunchKernel (region 12, fz_3f2a..., grid 528 x 256):
 * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (too many resources requested for
 * launch)".
 *
 * Contexts: the driver acts on the calling thread's current context. A
 * slot makes the device's primary context current only when it is not
 * (cuCtxGetCurrent, then push and pop around the call), so a PyTorch
 * thread, whose current context is that same primary context, pays one
 * cheap query per call and keeps its state.
 *
 * Cubins: where the cache holds no cubin for the running device, cuda_cubin
 * (fz_cuda_cubin) makes one from the PTX with the driver's linker for the
 * current context's device, so the caller can store it beside the PTX and
 * the next process loads machine code. A cubin that the driver refuses
 * (made by a newer toolkit than the driver) is not fatal: the PTX is
 * loaded instead.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "cuda_api.h"
#include "cuda_target.h"
#include "ir.h"
#include "target.h"

#define MAX_ORDINALS 64
#define MAX_EVENTS 4096

static pthread_mutex_t devs_mu = PTHREAD_MUTEX_INITIALIZER;
static cu_dev *devs[MAX_ORDINALS];

static inline cu_dev *cu_of(fz_device *dev) { return (cu_dev *)dev; }

/* ---- contexts ------------------------------------------------------------ */

CUresult fz_cuda_enter(cu_dev *d, bool *pushed)
{
	CUcontext cur = NULL;
	*pushed = false;
	CUresult r = d->cu->CtxGetCurrent(&cur);
	if (r != FZ_CUDA_SUCCESS || cur == d->ctx)
		return r;
	r = d->cu->CtxPushCurrent(d->ctx);
	*pushed = r == FZ_CUDA_SUCCESS;
	return r;
}

void fz_cuda_leave(cu_dev *d, bool pushed)
{
	if (pushed) {
		CUcontext c;
		d->cu->CtxPopCurrent(&c);
	}
}

#define ENTER(d, err, what)                                                    \
	bool pushed_;                                                          \
	do {                                                                   \
		CUresult r_ = fz_cuda_enter(d, &pushed_);                      \
		if (r_ != FZ_CUDA_SUCCESS)                                     \
			return fz_cu_fail((d)->cu, err, r_, "cuCtxPushCurrent",\
			                  what);                               \
	} while (0)
#define LEAVE(d) fz_cuda_leave(d, pushed_)

/* ---- the gather kernel ----------------------------------------------------- */

/* dst[i] = src[off(i)] for i < n, off(i) the dot product of i's index in
 * shape (up to 8 dims, innermost last, rank of them used) with strides;
 * a grid-stride loop. One entry per element size: fz_copy_b8 .. _b64. */
static void ptx_entry(fz_buf *b, int bits)
{
	int log = bits == 8 ? 0 : bits == 16 ? 1 : bits == 32 ? 2 : 3;
	const char *reg = bits == 64 ? "%rv" : bits == 32 ? "%v" : "%h";
	const char *ld = bits == 8 ? "u8" : bits == 16 ? "b16" : bits == 32 ? "b32" : "b64";
	fz_buf_printf(b, ".visible .entry fz_copy_b%d(\n"
	              "\t.param .u64 p_dst, .param .u64 p_src, .param .u64 p_n,\n"
	              "\t.param .u32 p_rank", bits);
	for (int d = 0; d < 8; d++)
		fz_buf_printf(b, ", .param .u64 p_sh%d", d);
	for (int d = 0; d < 8; d++)
		fz_buf_printf(b, ", .param .u64 p_st%d", d);
	fz_buf_puts(b, ")\n{\n"
	            "\t.reg .pred %p<2>;\n\t.reg .b32 %r<8>;\n"
	            "\t.reg .b64 %rd<16>;\n\t.reg .b64 %sh<8>;\n"
	            "\t.reg .b64 %st<8>;\n\t.reg .b16 %h;\n\t.reg .b32 %v;\n"
	            "\t.reg .b64 %rv;\n"
	            "\tld.param.u64 %rd1, [p_dst];\n"
	            "\tld.param.u64 %rd2, [p_src];\n"
	            "\tld.param.u64 %rd3, [p_n];\n"
	            "\tld.param.u32 %r1, [p_rank];\n"
	            "\tcvta.to.global.u64 %rd1, %rd1;\n"
	            "\tcvta.to.global.u64 %rd2, %rd2;\n");
	for (int d = 0; d < 8; d++)
		fz_buf_printf(b, "\tld.param.u64 %%sh%d, [p_sh%d];\n"
		              "\tld.param.u64 %%st%d, [p_st%d];\n", d, d, d, d);
	fz_buf_puts(b, "\tmov.u32 %r2, %ctaid.x;\n\tmov.u32 %r3, %ntid.x;\n"
	            "\tmov.u32 %r4, %tid.x;\n\tmov.u32 %r5, %nctaid.x;\n"
	            "\tmul.wide.u32 %rd4, %r2, %r3;\n"
	            "\tcvt.u64.u32 %rd5, %r4;\n"
	            "\tadd.u64 %rd4, %rd4, %rd5;\n"
	            "\tmul.wide.u32 %rd6, %r5, %r3;\n"
	            "LOOP:\n"
	            "\tsetp.ge.u64 %p1, %rd4, %rd3;\n"
	            "\t@%p1 bra DONE;\n"
	            "\tmov.u64 %rd7, %rd4;\n"
	            "\tmov.u64 %rd8, 0;\n");
	for (int d = 7; d >= 0; d--)
		fz_buf_printf(b, "\tsetp.le.u32 %%p1, %%r1, %d;\n"
		              "\t@%%p1 bra SKIP%d;\n"
		              "\tdiv.u64 %%rd9, %%rd7, %%sh%d;\n"
		              "\tmul.lo.u64 %%rd10, %%rd9, %%sh%d;\n"
		              "\tsub.u64 %%rd10, %%rd7, %%rd10;\n"
		              "\tmad.lo.u64 %%rd8, %%rd10, %%st%d, %%rd8;\n"
		              "\tmov.u64 %%rd7, %%rd9;\n"
		              "SKIP%d:\n", d, d, d, d, d, d);
	fz_buf_printf(b, "\tshl.b64 %%rd11, %%rd8, %d;\n"
	              "\tadd.u64 %%rd11, %%rd2, %%rd11;\n"
	              "\tld.global.%s %s, [%%rd11];\n"
	              "\tshl.b64 %%rd12, %%rd4, %d;\n"
	              "\tadd.u64 %%rd12, %%rd1, %%rd12;\n"
	              "\tst.global.%s [%%rd12], %s;\n"
	              "\tadd.u64 %%rd4, %%rd4, %%rd6;\n"
	              "\tbra LOOP;\n"
	              "DONE:\n\tret;\n}\n",
	              log, ld, reg, log, ld, reg);
}

char *fz_cuda_copy_ptx(void)
{
	fz_buf b = {0};
	fz_buf_puts(&b, "//\n// fusec: strided gather, fz_copy_b8 .. fz_copy_b64\n//\n"
	            ".version 6.0\n.target sm_70\n.address_size 64\n\n");
	for (int bits = 8; bits <= 64; bits *= 2)
		ptx_entry(&b, bits);
	if (b.oom) {
		free(fz_buf_take(&b));
		return NULL;
	}
	return fz_buf_take(&b);
}

/* The gather module, loaded on the first strided copy. */
static fz_status copy_kernels(cu_dev *d, char **err)
{
	if (d->copy_mod)
		return FZ_OK;
	char *ptx = fz_cuda_copy_ptx();
	if (!ptx) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	char log[2048] = "";
	CUjit_option opt[2] = {FZ_CU_JIT_ERROR_LOG_BUFFER,
	                       FZ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *val[2] = {log, (void *)(uintptr_t)sizeof log};
	CUmodule m = NULL;
	CUresult r = d->cu->ModuleLoadDataEx(&m, ptx, 2, opt, val);
	free(ptx);
	if (r != FZ_CUDA_SUCCESS) {
		fz_status st = fz_cu_fail(d->cu, err, r, "cuModuleLoadDataEx",
		                          "the strided-copy kernels");
		if (err && *err && log[0]) {
			char *m2 = fz_strdup_printf("%s: %s", *err, log);
			fz_set_err(err, m2);
		}
		return st;
	}
	for (int i = 0; i < 4; i++) {
		char name[32];
		snprintf(name, sizeof name, "fz_copy_b%d", 8 << i);
		if ((r = d->cu->ModuleGetFunction(&d->copy_fn[i], m, name)) !=
		    FZ_CUDA_SUCCESS) {
			d->cu->ModuleUnload(m);
			return fz_cu_fail(d->cu, err, r, "cuModuleGetFunction", name);
		}
	}
	d->copy_mod = m;
	return FZ_OK;
}

/* ---- open and close ------------------------------------------------------ */

const fz_target fz_target_cuda;

static void cu_close(fz_device *dev);

static fz_status cu_open(const fz_exec_options *o, fz_device **out, char **err)
{
	*out = NULL;
	const char *why = NULL;
	const fz_cu_api *cu = fz_cu_load(&why);
	if (!cu) {
		fz_set_err(err, fz_strdup_printf("no CUDA device (%s)", why ? why : "?"));
		return FZ_EUNSUPPORTED;
	}
	int n = 0;
	CUresult r = cu->DeviceGetCount(&n);
	if (r != FZ_CUDA_SUCCESS || n <= 0) {
		fz_set_err(err, fz_strdup("no CUDA device (the driver sees none)"));
		return FZ_EUNSUPPORTED;
	}
	int ord = o ? o->device : 0;
	if (ord < 0 || ord >= n || ord >= MAX_ORDINALS) {
		fz_set_err(err, fz_strdup_printf("CUDA device %d does not exist: this "
		                              "machine has %d (0 to %d)", ord, n, n - 1));
		return FZ_EINVAL;
	}
	pthread_mutex_lock(&devs_mu);
	/* shared; one whose last release is under way is replaced */
	if (devs[ord] && fz_device_try_retain(&devs[ord]->hd)) {
		*out = &devs[ord]->hd;
		pthread_mutex_unlock(&devs_mu);
		return FZ_OK;
	}
	fz_status st = FZ_ERUNTIME;
	cu_dev *d = calloc(1, sizeof *d);
	if (!d) {
		pthread_mutex_unlock(&devs_mu);
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	d->cu = cu;
	d->ordinal = ord;
	pthread_mutex_init(&d->mu, NULL);
	char what[64];
	snprintf(what, sizeof what, "CUDA device %d", ord);
	if ((r = cu->DeviceGet(&d->dev, ord)) != FZ_CUDA_SUCCESS) {
		st = fz_cu_fail(cu, err, r, "cuDeviceGet", what);
		goto fail;
	}
	int sms = 0;
	if ((r = cu->DeviceGetAttribute(&d->cc_major,
	                                FZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
	                                d->dev)) != FZ_CUDA_SUCCESS ||
	    (r = cu->DeviceGetAttribute(&d->cc_minor,
	                                FZ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
	                                d->dev)) != FZ_CUDA_SUCCESS ||
	    (r = cu->DeviceGetAttribute(&sms, FZ_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
	                                d->dev)) != FZ_CUDA_SUCCESS) {
		st = fz_cu_fail(cu, err, r, "cuDeviceGetAttribute", what);
		goto fail;
	}
	if ((r = cu->DeviceGetName(d->name, (int)sizeof d->name, d->dev)) !=
	    FZ_CUDA_SUCCESS)
		snprintf(d->name, sizeof d->name, "CUDA device %d", ord);
	int cc = d->cc_major * 10 + d->cc_minor;
	if (cc < 70) {
		fz_set_err(err, fz_strdup_printf("%s (%s) has compute capability %d.%d; "
		                              "fusec needs 7.0 or newer", what, d->name,
		                              d->cc_major, d->cc_minor));
		st = FZ_EUNSUPPORTED;
		goto fail;
	}
	if ((r = cu->DevicePrimaryCtxRetain(&d->ctx, d->dev)) != FZ_CUDA_SUCCESS) {
		st = fz_cu_fail(cu, err, r, "cuDevicePrimaryCtxRetain", what);
		goto fail;
	}
	d->ctx_retained = true;
	if ((st = fz_device_init(&d->hd, &fz_target_cuda, err)) != FZ_OK)
		goto fail;
	/* PTX for the newest arch LLVM 19's NVPTX backend knows (sm_90); a
	 * newer GPU JITs it (PTX is forward compatible), an older one gets
	 * its own. Past sm_90, the data-center parts (sm_100, sm_103) get
	 * sm_90's PTX and the others (sm_110, sm_120, sm_121) sm_89's: the
	 * code generator takes f64 to be fast on sm_90 and slow on sm_89
	 * (codegen/reduction.c, fast_f64), as it is on each */
	d->hd.cg.target = FZ_CG_NVPTX;
	d->hd.cg.sm = cc == 100 || cc == 103 ? 90 : cc > 90 ? 89 : cc;
	d->hd.cg.idx32 = false;
	d->hd.cg.vectorize = true;
	d->hd.sm_count = sms;
	d->hd.threads = 1;
	snprintf(d->hd.native_tag, sizeof d->hd.native_tag, "cubin.sm_%u",
	         (unsigned)cc % 1000u);
	d->tf32 = o ? fz_cuda_options_tf32(o) : false;
	devs[ord] = d;
	*out = &d->hd;
	pthread_mutex_unlock(&devs_mu);
	return FZ_OK;
fail:
	pthread_mutex_unlock(&devs_mu);
	if (d->ctx_retained)
		cu->DevicePrimaryCtxRelease(d->dev);
	pthread_mutex_destroy(&d->mu);
	free(d);
	return st;
}

static void cu_close(fz_device *dev)
{
	cu_dev *d = cu_of(dev);
	if (!d)
		return;
	pthread_mutex_lock(&devs_mu);
	if (d->ordinal >= 0 && d->ordinal < MAX_ORDINALS && devs[d->ordinal] == d)
		devs[d->ordinal] = NULL;
	pthread_mutex_unlock(&devs_mu);
	bool pushed = false;
	if (fz_cuda_enter(d, &pushed) == FZ_CUDA_SUCCESS) {
		fz_cuda_blas_free(d->blas);
		for (int i = 0; d->ev && i < MAX_EVENTS; i++)
			if (d->ev[i])
				d->cu->EventDestroy(d->ev[i]);
		for (int i = 0; i < 2; i++)
			if (d->timer[i])
				d->cu->EventDestroy(d->timer[i]);
		if (d->fork)
			d->cu->EventDestroy(d->fork);
		if (d->comm)
			d->cu->StreamDestroy(d->comm);
		for (int i = 0; i < d->n_mods; i++)
			d->cu->ModuleUnload(d->mods[i]);
		if (d->copy_mod)
			d->cu->ModuleUnload(d->copy_mod);
		fz_cuda_leave(d, pushed);
	}
	free(d->ev);
	free(d->mods);
	if (d->ctx_retained)
		d->cu->DevicePrimaryCtxRelease(d->dev);
	pthread_mutex_destroy(&d->mu);
	free(d);
}

/* ---- memory ---------------------------------------------------------------- */

static fz_status cu_alloc(fz_device *dev, size_t bytes, void **p, char **err)
{
	cu_dev *d = cu_of(dev);
	*p = NULL;
	char what[320];
	snprintf(what, sizeof what, "%zu bytes on %s", bytes, d->name);
	ENTER(d, err, what);
	CUdeviceptr q = 0;
	size_t n = bytes ? (bytes + 255) / 256 * 256 : 256;
	/* Not zeroed, as PyTorch's allocator hands out memory too: nothing
	 * a plan computes reads what it did not write (the emulator checks
	 * that). A cuMemsetD8 here was queued on the legacy stream, which
	 * a non-blocking stream (fz_cuda_stream_new's, a caller's) does not
	 * wait for: on the first GPU run it cleared inputs that had been
	 * uploaded on such a stream after it was queued (--graph of a
	 * 2-layer bf16 Llama: logits of 0, different ones run to run). */
	CUresult r = d->cu->MemAlloc(&q, n);
	LEAVE(d);
	if (r != FZ_CUDA_SUCCESS)
		return fz_cu_fail(d->cu, err, r, "cuMemAlloc", what);
	*p = (void *)(uintptr_t)q;
	return FZ_OK;
}

static void cu_release(fz_device *dev, void *p)
{
	cu_dev *d = cu_of(dev);
	if (!p)
		return;
	bool pushed = false;
	if (fz_cuda_enter(d, &pushed) != FZ_CUDA_SUCCESS)
		return;
	d->cu->MemFree((CUdeviceptr)(uintptr_t)p);
	fz_cuda_leave(d, pushed);
}

static fz_status cu_upload(fz_device *dev, void *dst, const void *src, size_t n,
                           void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	if (!n)
		return FZ_OK;
	ENTER(d, err, "an upload");
	CUresult r = d->cu->MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, n,
	                                    (CUstream)stream);
	LEAVE(d);
	if (r != FZ_CUDA_SUCCESS) {
		char what[64];
		snprintf(what, sizeof what, "an upload of %zu bytes", n);
		return fz_cu_fail(d->cu, err, r, "cuMemcpyHtoDAsync", what);
	}
	return FZ_OK;
}

/* Returns when the bytes are on the host: the caller reads them next. */
static fz_status cu_download(fz_device *dev, void *dst, const void *src,
                             size_t n, void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	if (!n)
		return FZ_OK;
	char what[64];
	snprintf(what, sizeof what, "a download of %zu bytes", n);
	ENTER(d, err, what);
	const char *call = "cuMemcpyDtoHAsync";
	CUresult r = d->cu->MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, n,
	                                    (CUstream)stream);
	if (r == FZ_CUDA_SUCCESS) {
		call = "cuStreamSynchronize";
		fz_host_sync_note(); /* the host waits: counted (target.h) */
		r = d->cu->StreamSynchronize((CUstream)stream);
	}
	LEAVE(d);
	return r == FZ_CUDA_SUCCESS ? FZ_OK : fz_cu_fail(d->cu, err, r, call, what);
}

/* Drops unit dims and merges dims that are contiguous with each other:
 * the gather's division count is the rank that remains. */
static int coalesce(const fz_layout *lay, int64_t *sh, int64_t *st)
{
	int r = 0;
	for (int i = 0; i < lay->rank; i++) {
		if (lay->shape[i] == 1)
			continue;
		if (r > 0 && st[r - 1] == lay->strides[i] * lay->shape[i]) {
			sh[r - 1] *= lay->shape[i];
			st[r - 1] = lay->strides[i];
			continue;
		}
		sh[r] = lay->shape[i];
		st[r] = lay->strides[i];
		r++;
	}
	return r;
}

static fz_status cu_copy(fz_device *dev, void *dst, const void *src, size_t es,
                         const fz_layout *lay, void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	int64_t n = 1;
	for (int i = 0; i < lay->rank; i++)
		n *= lay->shape[i];
	if (n <= 0)
		return FZ_OK;
	int64_t sh[FZ_MAX_RANK], st[FZ_MAX_RANK];
	int rank = coalesce(lay, sh, st);
	CUdeviceptr s = (CUdeviceptr)(uintptr_t)src + (CUdeviceptr)(lay->offset * (int64_t)es);
	ENTER(d, err, "a strided copy");
	CUresult r;
	fz_status status = FZ_OK;
	if (rank == 0 || (rank == 1 && st[0] == 1)) {
		r = d->cu->MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, s,
		                           (size_t)n * es, (CUstream)stream);
		if (r != FZ_CUDA_SUCCESS)
			status = fz_cu_fail(d->cu, err, r, "cuMemcpyDtoDAsync",
			                    "a contiguous copy");
		LEAVE(d);
		return status;
	}
	int which = es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : es == 8 ? 3 : -1;
	if (which < 0 || rank > 8) {
		LEAVE(d);
		fz_set_err(err, fz_strdup_printf("a strided copy of %zu-byte elements "
		                              "over %d dims is not supported", es, rank));
		return FZ_EUNSUPPORTED;
	}
	pthread_mutex_lock(&d->mu);
	status = copy_kernels(d, err);
	pthread_mutex_unlock(&d->mu);
	if (status != FZ_OK) {
		LEAVE(d);
		return status;
	}
	CUdeviceptr dp = (CUdeviceptr)(uintptr_t)dst;
	uint64_t nn = (uint64_t)n;
	unsigned rk = (unsigned)rank;
	uint64_t psh[8], pst[8];
	void *args[4 + 16] = {&dp, &s, &nn, &rk};
	for (int i = 0; i < 8; i++) {
		psh[i] = i < rank ? (uint64_t)sh[i] : 1;
		pst[i] = i < rank ? (uint64_t)st[i] : 0;
		args[4 + i] = &psh[i];
		args[12 + i] = &pst[i];
	}
	int64_t blocks = (n + 255) / 256, cap = (int64_t)(d->hd.sm_count > 0 ?
	                                                  d->hd.sm_count : 1) * 16;
	if (blocks > cap)
		blocks = cap;
	r = d->cu->LaunchKernel(d->copy_fn[which], (unsigned)blocks, 1, 1, 256, 1, 1,
	                        0, (CUstream)stream, args, NULL);
	LEAVE(d);
	if (r != FZ_CUDA_SUCCESS) {
		char what[96];
		snprintf(what, sizeof what, "a strided copy of %" PRId64 " elements",
		         n);
		return fz_cu_fail(d->cu, err, r, "cuLaunchKernel", what);
	}
	return FZ_OK;
}

/* ---- kernels --------------------------------------------------------------- */

static fz_status keep_module(cu_dev *d, CUmodule m, char **err)
{
	pthread_mutex_lock(&d->mu);
	if (d->n_mods == d->cap_mods) {
		int cap = d->cap_mods ? 2 * d->cap_mods : 64;
		CUmodule *p = realloc(d->mods, (size_t)cap * sizeof *p);
		if (!p) {
			pthread_mutex_unlock(&d->mu);
			fz_set_err(err, fz_strdup("out of memory"));
			return FZ_ENOMEM;
		}
		d->mods = p;
		d->cap_mods = cap;
	}
	d->mods[d->n_mods++] = m;
	pthread_mutex_unlock(&d->mu);
	return FZ_OK;
}

/* The PTX as a NUL-terminated string (cache sections are not). */
static char *ptx_text(const fz_kcode *code)
{
	char *s = malloc(code->ptx_len + 1);
	if (s) {
		memcpy(s, code->ptx, code->ptx_len);
		s[code->ptx_len] = 0;
	}
	return s;
}

fz_status fz_cuda_cubin(fz_device *dev, const char *ptx, size_t len,
                        const char *what, void **cubin, size_t *cubin_len,
                        char **err)
{
	cu_dev *d = cu_of(dev);
	*cubin = NULL;
	*cubin_len = 0;
	char *text = malloc(len + 1);
	if (!text) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	memcpy(text, ptx, len);
	text[len] = 0;
	ENTER(d, err, what);
	char log[4096] = "";
	CUjit_option opt[2] = {FZ_CU_JIT_ERROR_LOG_BUFFER,
	                       FZ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *val[2] = {log, (void *)(uintptr_t)sizeof log};
	CUlinkState ls = NULL;
	const char *call = "cuLinkCreate";
	fz_status st = FZ_OK;
	void *out = NULL;
	size_t n = 0;
	CUresult r = d->cu->LinkCreate(2, opt, val, &ls);
	if (r == FZ_CUDA_SUCCESS) {
		call = "cuLinkAddData";
		r = d->cu->LinkAddData(ls, FZ_CU_JIT_INPUT_PTX, text, len + 1,
		                       "fusec.ptx", 0, NULL, NULL);
	}
	if (r == FZ_CUDA_SUCCESS) {
		call = "cuLinkComplete";
		r = d->cu->LinkComplete(ls, &out, &n);
	}
	if (r == FZ_CUDA_SUCCESS) {
		/* the linker owns out until cuLinkDestroy */
		*cubin = malloc(n);
		if (*cubin) {
			memcpy(*cubin, out, n);
			*cubin_len = n;
		} else {
			fz_set_err(err, fz_strdup("out of memory"));
			st = FZ_ENOMEM;
		}
	} else {
		st = fz_cu_fail(d->cu, err, r, call, what);
		if (err && *err && log[0])
			fz_set_err(err, fz_strdup_printf("%s: %s", *err, log));
	}
	if (ls)
		d->cu->LinkDestroy(ls);
	LEAVE(d);
	free(text);
	return st;
}

void fz_cuda_cubin_tag(fz_device *dev, char *buf, size_t n)
{
	cu_dev *d = cu_of(dev);
	snprintf(buf, n, "cubin.sm_%d", d->cc_major * 10 + d->cc_minor);
}

static fz_status cu_native(fz_device *dev, const fz_kernel *k, const fz_kcode *code,
                           void **bin, size_t *len, char **err)
{
	*bin = NULL;
	*len = 0;
	if (!code->ptx || !code->ptx_len) {
		fz_set_err(err, fz_strdup_printf("region %d: no PTX to compile", k->region));
		return FZ_EINVAL;
	}
	char what[160];
	snprintf(what, sizeof what, "region %d, kernel %s", k->region, k->names[0]);
	return fz_cuda_cubin(dev, code->ptx, code->ptx_len, what, bin, len, err);
}

static fz_status cu_load(fz_device *dev, const fz_kernel *k, const fz_kcode *code,
                         void **fn, char **err)
{
	cu_dev *d = cu_of(dev);
	char what[160];
	snprintf(what, sizeof what, "region %d, kernel %s", k->region, k->names[0]);
	ENTER(d, err, what);
	CUmodule m = NULL;
	CUresult r = FZ_CUDA_SUCCESS;
	fz_status st = FZ_OK;
	if (code->cubin && code->cubin_len) {
		r = d->cu->ModuleLoadDataEx(&m, code->cubin, 0, NULL, NULL);
		if (r != FZ_CUDA_SUCCESS)
			m = NULL; /* made by a newer toolkit than this driver: the PTX */
	}
	if (!m && code->ptx && code->ptx_len) {
		char *ptx = ptx_text(code), log[4096] = "";
		if (!ptx) {
			LEAVE(d);
			fz_set_err(err, fz_strdup("out of memory"));
			return FZ_ENOMEM;
		}
		CUjit_option opt[2] = {FZ_CU_JIT_ERROR_LOG_BUFFER,
		                       FZ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
		void *val[2] = {log, (void *)(uintptr_t)sizeof log};
		r = d->cu->ModuleLoadDataEx(&m, ptx, 2, opt, val);
		free(ptx);
		if (r != FZ_CUDA_SUCCESS) {
			m = NULL;
			st = fz_cu_fail(d->cu, err, r, "cuModuleLoadDataEx", what);
			if (err && *err && log[0])
				fz_set_err(err, fz_strdup_printf("%s: %s", *err, log));
		}
	} else if (!m) {
		st = r != FZ_CUDA_SUCCESS
		         ? fz_cu_fail(d->cu, err, r, "cuModuleLoadDataEx", what)
		         : FZ_EINVAL;
		if (st == FZ_EINVAL)
			fz_set_err(err, fz_strdup_printf("%s: no PTX or cubin to load", what));
	}
	for (int e = 0; st == FZ_OK && e < k->n_entries; e++) {
		CUfunction f = NULL;
		if ((r = d->cu->ModuleGetFunction(&f, m, k->names[e])) != FZ_CUDA_SUCCESS) {
			st = fz_cu_fail(d->cu, err, r, "cuModuleGetFunction", what);
			break;
		}
		/* the block the launch will ask for must fit the registers the
		 * kernel was compiled to */
		int64_t zero[FZ_MAX_SYMS] = {0}, grid;
		int block = 0, maxt = 0;
		fz_kernel_launch_dims_on(k, e, zero, d->hd.sm_count, &grid, &block);
		if ((r = d->cu->FuncGetAttribute(&maxt, FZ_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
		                                 f)) != FZ_CUDA_SUCCESS) {
			st = fz_cu_fail(d->cu, err, r, "cuFuncGetAttribute", what);
			break;
		}
		if (maxt < block) {
			fz_set_err(err, fz_strdup_printf("%s: entry %s takes at most %d threads "
			                              "per block on %s; its launch needs %d",
			                              what, k->names[e], maxt, d->name, block));
			st = FZ_EUNSUPPORTED;
			break;
		}
		/* tile memory over the static 48 KiB (codegen.h): the function's
		 * dynamic shared memory limit raised to what its launches give */
		if (k->smem > 0 &&
		    (r = d->cu->FuncSetAttribute(f, FZ_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
		                                 k->smem)) != FZ_CUDA_SUCCESS) {
			st = fz_cu_fail(d->cu, err, r, "cuFuncSetAttribute", what);
			break;
		}
		fn[e] = f;
	}
	if (st == FZ_OK)
		st = keep_module(d, m, err);
	else if (m)
		d->cu->ModuleUnload(m);
	LEAVE(d);
	return st;
}

#define MAX_PARAMS (2 * 64 + 1 + FZ_MAX_SYMS)

/* A launch fixed at prepare (fz_target.pack): per entry its function and
 * geometry, from the code generator's launch dims at the plan's sizes and
 * this device's multiprocessors; one parameter block, args[], pointing at
 * the runner's buffer array (refilled per run), the flag word and the
 * kernel's symbols' sizes kept here. cuLaunchKernel copies the values
 * when it queues the launch, so one block serves every run. */
typedef struct cu_packed {
	int region, n_entries;
	char names[2][sizeof ((fz_kernel *)0)->names[0]];
	CUfunction fn[2];
	unsigned grid[2], block[2], smem; /* smem: dynamic shared memory, bytes */
	int32_t *flag;
	int64_t sym[FZ_MAX_SYMS];
	void *args[MAX_PARAMS];
} cu_packed;

static fz_status pack_into(cu_dev *d, const fz_kernel *k, void *const *fn,
                           void **bufs, const int64_t *syms, int32_t *flag,
                           cu_packed *p, char **err)
{
	int nb = k->n_in + k->n_out;
	if (nb + 1 + k->n_syms > MAX_PARAMS || k->n_entries > 2) {
		fz_set_err(err, fz_strdup_printf("region %d: %d parameters are more than "
		                              "a launch takes", k->region, nb + 1 + k->n_syms));
		return FZ_EUNSUPPORTED;
	}
	p->region = k->region;
	p->n_entries = k->n_entries;
	p->smem = (unsigned)k->smem;
	p->flag = flag;
	for (int e = 0; e < k->n_entries; e++) {
		int64_t grid;
		int block;
		fz_kernel_launch_dims_on(k, e, syms, d->hd.sm_count, &grid, &block);
		p->fn[e] = (CUfunction)fn[e];
		p->grid[e] = (unsigned)(grid > INT32_MAX ? INT32_MAX : grid);
		p->block[e] = (unsigned)block;
		memcpy(p->names[e], k->names[e], sizeof p->names[e]);
	}
	for (int i = 0; i < nb; i++)
		p->args[i] = &bufs[i];
	p->args[nb] = &p->flag;
	for (int j = 0; j < k->n_syms; j++) {
		p->sym[j] = syms[k->syms[j]];
		p->args[nb + 1 + j] = &p->sym[j];
	}
	return FZ_OK;
}

static fz_status launch_packed(cu_dev *d, cu_packed *p, void *stream, char **err)
{
	ENTER(d, err, "a launch");
	for (int e = 0; e < p->n_entries; e++) {
		CUresult r = d->cu->LaunchKernel(p->fn[e], p->grid[e], 1, 1, p->block[e],
		                                 1, 1, p->smem, (CUstream)stream, p->args, NULL);
		if (r != FZ_CUDA_SUCCESS) {
			LEAVE(d);
			char what[160];
			snprintf(what, sizeof what, "region %d, %s, grid %u x %u",
			         p->region, p->names[e], p->grid[e], p->block[e]);
			return fz_cu_fail(d->cu, err, r, "cuLaunchKernel", what);
		}
	}
	LEAVE(d);
	return FZ_OK;
}

static fz_status cu_pack(fz_device *dev, const fz_kernel *k, void *const *fn,
                         void **bufs, const int64_t *syms, int32_t *flag,
                         void **pk, char **err)
{
	*pk = NULL;
	cu_packed *p = calloc(1, sizeof *p);
	if (!p) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	fz_status st = pack_into(cu_of(dev), k, fn, bufs, syms, flag, p, err);
	if (st != FZ_OK) {
		free(p);
		return st;
	}
	*pk = p;
	return FZ_OK;
}

static fz_status cu_launch_packed(fz_device *dev, void *pk, void *stream, char **err)
{
	return launch_packed(cu_of(dev), pk, stream, err);
}

static void cu_unpack(fz_device *dev, void *pk)
{
	(void)dev;
	free(pk);
}

/* The same launch packed on the spot (a caller with no prepared plan). */
static fz_status cu_launch(fz_device *dev, const fz_kernel *k, void *const *fn,
                           void **bufs, const int64_t *syms, int32_t *flag,
                           void *stream, char **err)
{
	cu_packed p;
	fz_status st = pack_into(cu_of(dev), k, fn, bufs, syms, flag, &p, err);
	return st == FZ_OK ? launch_packed(cu_of(dev), &p, stream, err) : st;
}

static fz_status cu_zero(fz_device *dev, void *p, size_t n, void *stream,
                         char **err)
{
	cu_dev *d = cu_of(dev);
	ENTER(d, err, "a reset");
	CUresult r = d->cu->MemsetD32Async((CUdeviceptr)(uintptr_t)p, 0, n / 4,
	                                   (CUstream)stream);
	LEAVE(d);
	if (r != FZ_CUDA_SUCCESS) {
		char what[64];
		snprintf(what, sizeof what, "a reset of %zu bytes", n);
		return fz_cu_fail(d->cu, err, r, "cuMemsetD32Async", what);
	}
	return FZ_OK;
}

/* ---- library calls, collectives, events ------------------------------------ */

static fz_status cu_matmul(fz_device *dev, const fz_matmul *m, void *stream,
                           char **err)
{
	cu_dev *d = cu_of(dev);
	char what[64];
	snprintf(what, sizeof what, "the matmul of region %d", m->region);
	ENTER(d, err, what);
	fz_status st = FZ_OK;
	if (!d->blas) {
		pthread_mutex_lock(&d->mu);
		if (!d->blas)
			st = fz_cuda_blas_new(&d->blas, err);
		pthread_mutex_unlock(&d->mu);
	}
	if (st == FZ_OK)
		st = fz_cuda_blas_matmul(d->blas, m, d->tf32, stream, err);
	LEAVE(d);
	return st;
}

static fz_status event_of(cu_dev *d, int ev, CUevent *out, char **err);

/* The communication stream and the fork event, made once per device. */
static fz_status comm_stream(cu_dev *d, char **err)
{
	pthread_mutex_lock(&d->mu);
	CUresult r = FZ_CUDA_SUCCESS;
	const char *call = "cuStreamCreate";
	if (!d->comm)
		r = d->cu->StreamCreate(&d->comm, FZ_CU_STREAM_NON_BLOCKING);
	if (r == FZ_CUDA_SUCCESS && !d->fork) {
		call = "cuEventCreate";
		r = d->cu->EventCreate(&d->fork, FZ_CU_EVENT_DISABLE_TIMING);
	}
	pthread_mutex_unlock(&d->mu);
	return r == FZ_CUDA_SUCCESS ? FZ_OK
	                            : fz_cu_fail(d->cu, err, r, call,
	                                         "the communication stream");
}

/* A collective. Without a communicator (one process, one device, world 1)
 * it is the identity: all_gather and reduce_scatter of one rank keep every
 * element, a copy on the compute stream. With one, through the rank's
 * NCCL engine on the communication stream:
 *
 *     compute:  ... producer of x ... record(fork)
 *     comm:     wait(fork) -> nccl op(x -> y) -> record(event)
 *     compute:  (the wait step) wait(event) -> consumers of y
 *
 * so the operand is complete before NCCL reads it, the result's buffer is
 * no longer read by earlier work, and nothing blocks the host. */
static fz_status cu_collective(fz_device *dev, const fz_collective *c,
                               void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	char what[96];
	snprintf(what, sizeof what, "the collective of region %d", c->region);
	struct fz_nccl *nc = c->comm ? fz_comm_nccl(c->comm, c->rank) : NULL;
	if (c->comm && !nc) {
		fz_set_err(err, fz_strdup_printf("%s: rank %d of %d has no NCCL "
		                              "communicator (the CUDA target runs "
		                              "collectives through NCCL: "
		                              "fz_cuda_nccl_new, fz_comm_set_nccl)",
		                              what, c->rank, fz_comm_world(c->comm)));
		return FZ_EINVAL;
	}
	size_t n = (size_t)(c->outer * c->extent * c->inner) * fz_dtype_size(c->dtype);
	if (!nc && (c->x == c->y || !n))
		return FZ_OK;
	ENTER(d, err, what);
	CUresult r = FZ_CUDA_SUCCESS;
	if (!nc) {
		r = d->cu->MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)c->y,
		                           (CUdeviceptr)(uintptr_t)c->x, n,
		                           (CUstream)stream);
		LEAVE(d);
		return r == FZ_CUDA_SUCCESS
		           ? FZ_OK
		           : fz_cu_fail(d->cu, err, r, "cuMemcpyDtoDAsync", what);
	}
	/* a bucket forks once, is one NCCL group, and joins once */
	bool first = c->bucket <= 1, last = c->bucket == 0 || c->bucket == 3;
	fz_status st = comm_stream(d, err);
	CUevent done = NULL;
	if (st == FZ_OK && last)
		st = event_of(d, c->event, &done, err);
	const char *call = "cuEventRecord";
	if (st == FZ_OK && first &&
	    (r = d->cu->EventRecord(d->fork, (CUstream)stream)) == FZ_CUDA_SUCCESS) {
		call = "cuStreamWaitEvent";
		r = d->cu->StreamWaitEvent(d->comm, d->fork, 0);
	}
	if (st == FZ_OK && r != FZ_CUDA_SUCCESS)
		st = fz_cu_fail(d->cu, err, r, call, what);
	bool grouped = c->bucket >= 2;
	if (st == FZ_OK && c->bucket == 1)
		grouped = (st = fz_nccl_group(nc, true, err)) == FZ_OK;
	fz_opcode op = c->kind == FZ_COLL_ALL_GATHER ? FZ_OP_ALL_GATHER
	               : c->kind == FZ_COLL_REDUCE_SCATTER ? FZ_OP_REDUCE_SCATTER
	               : FZ_OP_ALL_REDUCE;
	if (st == FZ_OK && (st = fz_nccl_collective(nc, op, c->dtype, c->outer,
	                                            c->extent * c->inner, c->x, c->y,
	                                            d->comm, err)) != FZ_OK &&
	    err && *err)
		fz_set_err(err, fz_strdup_printf("%s: %s", what, *err));
	if (grouped && (c->bucket == 3 || st != FZ_OK)) {
		/* the group ends even after a failure inside it */
		fz_status g = fz_nccl_group(nc, false, st == FZ_OK ? err : NULL);
		if (st == FZ_OK)
			st = g;
	}
	if (st == FZ_OK && last &&
	    (r = d->cu->EventRecord(done, d->comm)) != FZ_CUDA_SUCCESS)
		st = fz_cu_fail(d->cu, err, r, "cuEventRecord", what);
	LEAVE(d);
	return st;
}

fz_status fz_cuda_nccl_new(fz_device *dev, int world, int rank,
                           const unsigned char *id, double timeout_s,
                           struct fz_nccl **out, char **err)
{
	cu_dev *d = cu_of(dev);
	*out = NULL;
	ENTER(d, err, "the NCCL communicator");
	fz_status st = fz_nccl_new(world, rank, id, timeout_s, out, err);
	LEAVE(d);
	return st;
}

void fz_cuda_nccl_free(fz_device *dev, struct fz_nccl *n)
{
	cu_dev *d = cu_of(dev);
	bool pushed = false;
	if (!n || fz_cuda_enter(d, &pushed) != FZ_CUDA_SUCCESS)
		return;
	fz_nccl_free(n);
	fz_cuda_leave(d, pushed);
}

void fz_cuda_nccl_abort(fz_device *dev, struct fz_nccl *n)
{
	cu_dev *d = cu_of(dev);
	bool pushed = false;
	if (!n)
		return;
	if (fz_cuda_enter(d, &pushed) != FZ_CUDA_SUCCESS) {
		fz_nccl_abort(n);
		return;
	}
	fz_nccl_abort(n);
	fz_cuda_leave(d, pushed);
}

/* Event ev, created (without timing) on first use. */
static fz_status event_of(cu_dev *d, int ev, CUevent *out, char **err)
{
	if (ev < 0 || ev >= MAX_EVENTS) {
		fz_set_err(err, fz_strdup_printf("event %d is out of range (0 to %d)", ev,
		                              MAX_EVENTS - 1));
		return FZ_EINVAL;
	}
	pthread_mutex_lock(&d->mu);
	fz_status st = FZ_OK;
	if (!d->ev && !(d->ev = calloc(MAX_EVENTS, sizeof *d->ev))) {
		st = FZ_ENOMEM;
		fz_set_err(err, fz_strdup("out of memory"));
	} else if (!d->ev[ev]) {
		CUresult r = d->cu->EventCreate(&d->ev[ev], FZ_CU_EVENT_DISABLE_TIMING);
		if (r != FZ_CUDA_SUCCESS) {
			d->ev[ev] = NULL;
			st = fz_cu_fail(d->cu, err, r, "cuEventCreate", "a plan's event");
		}
	}
	*out = st == FZ_OK ? d->ev[ev] : NULL;
	pthread_mutex_unlock(&d->mu);
	return st;
}

static fz_status cu_event_record(fz_device *dev, int ev, void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	ENTER(d, err, "an event");
	CUevent e;
	fz_status st = event_of(d, ev, &e, err);
	CUresult r = FZ_CUDA_SUCCESS;
	if (st == FZ_OK && (r = d->cu->EventRecord(e, (CUstream)stream)) != FZ_CUDA_SUCCESS)
		st = fz_cu_fail(d->cu, err, r, "cuEventRecord", "a plan's event");
	LEAVE(d);
	return st;
}

static fz_status cu_event_wait(fz_device *dev, int ev, void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	ENTER(d, err, "an event");
	CUevent e;
	fz_status st = event_of(d, ev, &e, err);
	CUresult r = FZ_CUDA_SUCCESS;
	if (st == FZ_OK &&
	    (r = d->cu->StreamWaitEvent((CUstream)stream, e, 0)) != FZ_CUDA_SUCCESS)
		st = fz_cu_fail(d->cu, err, r, "cuStreamWaitEvent", "a plan's event");
	LEAVE(d);
	return st;
}

static fz_status cu_sync(fz_device *dev, void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	ENTER(d, err, "a sync");
	fz_host_sync_note(); /* counted (target.h): never inside a run */
	CUresult r = d->cu->StreamSynchronize((CUstream)stream);
	LEAVE(d);
	return r == FZ_CUDA_SUCCESS
	           ? FZ_OK
	           : fz_cu_fail(d->cu, err, r, "cuStreamSynchronize",
	                        "the work queued on the stream");
}

/* ---- graphs ------------------------------------------------------------------ */

/* Thread-local capture mode: other threads (PyTorch's, other ranks') may
 * use the driver freely meanwhile; a call of this thread that is not
 * allowed during a capture fails instead of being captured. */
static fz_status cu_capture_begin(fz_device *dev, void *stream, char **err)
{
	cu_dev *d = cu_of(dev);
	ENTER(d, err, "a graph capture");
	CUresult r = d->cu->StreamBeginCapture((CUstream)stream,
	                                       FZ_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
	LEAVE(d);
	return r == FZ_CUDA_SUCCESS ? FZ_OK
	                            : fz_cu_fail(d->cu, err, r, "cuStreamBeginCapture",
	                                         "a program's run");
}

static fz_status cu_capture_end(fz_device *dev, void *stream, void **graph,
                                char **err)
{
	cu_dev *d = cu_of(dev);
	*graph = NULL;
	ENTER(d, err, "a graph capture");
	CUgraph g = NULL;
	CUgraphExec x = NULL;
	const char *call = "cuStreamEndCapture";
	CUresult r = d->cu->StreamEndCapture((CUstream)stream, &g);
	if (r == FZ_CUDA_SUCCESS) {
		call = "cuGraphInstantiate";
		r = d->cu->GraphInstantiate(&x, g, 0);
	}
	if (g)
		d->cu->GraphDestroy(g); /* the instance is independent of it */
	LEAVE(d);
	if (r != FZ_CUDA_SUCCESS)
		return fz_cu_fail(d->cu, err, r, call, "a program's run");
	*graph = x;
	return FZ_OK;
}

static fz_status cu_graph_launch(fz_device *dev, void *graph, void *stream,
                                 char **err)
{
	cu_dev *d = cu_of(dev);
	ENTER(d, err, "a graph launch");
	CUresult r = d->cu->GraphLaunch((CUgraphExec)graph, (CUstream)stream);
	LEAVE(d);
	return r == FZ_CUDA_SUCCESS ? FZ_OK
	                            : fz_cu_fail(d->cu, err, r, "cuGraphLaunch",
	                                         "a program's graph");
}

static void cu_graph_free(fz_device *dev, void *graph)
{
	cu_dev *d = cu_of(dev);
	bool pushed = false;
	if (!graph || fz_cuda_enter(d, &pushed) != FZ_CUDA_SUCCESS)
		return;
	d->cu->GraphExecDestroy((CUgraphExec)graph);
	fz_cuda_leave(d, pushed);
}

fz_status fz_cuda_stream_new(fz_device *dev, void **stream, char **err)
{
	cu_dev *d = cu_of(dev);
	*stream = NULL;
	ENTER(d, err, "a stream");
	CUstream s = NULL;
	CUresult r = d->cu->StreamCreate(&s, FZ_CU_STREAM_NON_BLOCKING);
	LEAVE(d);
	if (r != FZ_CUDA_SUCCESS)
		return fz_cu_fail(d->cu, err, r, "cuStreamCreate", "a stream");
	*stream = s;
	return FZ_OK;
}

void fz_cuda_stream_free(fz_device *dev, void *stream)
{
	cu_dev *d = cu_of(dev);
	bool pushed = false;
	if (!stream || fz_cuda_enter(d, &pushed) != FZ_CUDA_SUCCESS)
		return;
	d->cu->StreamDestroy((CUstream)stream);
	fz_cuda_leave(d, pushed);
}

/* ---- what tools and benchmarks ask ------------------------------------------ */

fz_status fz_cuda_timer(fz_device *dev, void *stream, bool stop, double *ms,
                        char **err)
{
	cu_dev *d = cu_of(dev);
	ENTER(d, err, "the timing events");
	CUresult r = FZ_CUDA_SUCCESS;
	const char *call = "cuEventCreate";
	for (int i = 0; i < 2 && r == FZ_CUDA_SUCCESS; i++)
		if (!d->timer[i])
			r = d->cu->EventCreate(&d->timer[i], FZ_CU_EVENT_DEFAULT);
	if (r == FZ_CUDA_SUCCESS) {
		call = "cuEventRecord";
		r = d->cu->EventRecord(d->timer[stop], (CUstream)stream);
	}
	if (r == FZ_CUDA_SUCCESS && stop) {
		call = "cuEventSynchronize";
		r = d->cu->EventSynchronize(d->timer[1]);
		float f = 0;
		if (r == FZ_CUDA_SUCCESS) {
			call = "cuEventElapsedTime";
			r = d->cu->EventElapsedTime(&f, d->timer[0], d->timer[1]);
		}
		if (ms)
			*ms = f;
	}
	LEAVE(d);
	return r == FZ_CUDA_SUCCESS ? FZ_OK
	                            : fz_cu_fail(d->cu, err, r, call, "the timing events");
}

void fz_cuda_describe(fz_device *dev, char *name, size_t n, int *cc,
                      int *driver)
{
	cu_dev *d = cu_of(dev);
	if (name)
		snprintf(name, n, "%s", d->name);
	if (cc)
		*cc = d->cc_major * 10 + d->cc_minor;
	if (driver)
		*driver = d->cu->driver_version;
}

const fz_target fz_target_cuda = {
	.name = "cuda",
	.host_memory = false,
	.matmul_workspace = (size_t)32 << 20, /* cuBLASLt on Hopper: PyTorch's size */
	.open = cu_open,
	.close = cu_close,
	.alloc = cu_alloc,
	.release = cu_release,
	.upload = cu_upload,
	.download = cu_download,
	.copy = cu_copy,
	.load = cu_load,
	.launch = cu_launch,
	.pack = cu_pack,
	.launch_packed = cu_launch_packed,
	.unpack = cu_unpack,
	.zero = cu_zero,
	.native = cu_native,
	.matmul = cu_matmul,
	.collective = cu_collective,
	.capture_begin = cu_capture_begin,
	.capture_end = cu_capture_end,
	.graph_launch = cu_graph_launch,
	.graph_free = cu_graph_free,
	.event_record = cu_event_record,
	.event_wait = cu_event_wait,
	.sync = cu_sync,
};
