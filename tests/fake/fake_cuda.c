/*
 * fake_cuda.c: the driver entry points the CUDA target uses, faked on the
 * host (see fake_cuda.h). Built as a shared library that the test names to
 * the loader (fz_cu_set_library), so the real dlopen and dlsym path runs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef struct CUctx_st *CUcontext;

API fake_state fake_cuda = {.devices = 1, .cc_major = 9, .cc_minor = 0,
                           .sms = 132, .max_threads = 1024};

static _Thread_local CUcontext cur;

fake_op *fake_log(char kind, void *stream)
{
	int i = __atomic_fetch_add(&fake_cuda.n_log, 1, __ATOMIC_RELAXED);
	if (i >= FAKE_MAX_LOG)
		return NULL;
	fake_op *o = &fake_cuda.log[i];
	o->kind = kind;
	o->dev = cur ? (int)((uintptr_t)cur - 0x1000) : -1;
	o->stream = stream;
	return o;
}

int fake_current_device(void) { return cur ? (int)((uintptr_t)cur - 0x1000) : -1; }
#define BUMP(field) __atomic_fetch_add(&fake_cuda.field, 1, __ATOMIC_RELAXED)
static _Thread_local CUcontext stack[16];
static _Thread_local int depth;

static const char *names[] = {
	[0] = "CUDA_SUCCESS", [1] = "CUDA_ERROR_INVALID_VALUE",
	[2] = "CUDA_ERROR_OUT_OF_MEMORY", [100] = "CUDA_ERROR_NO_DEVICE",
	[200] = "CUDA_ERROR_INVALID_IMAGE", [218] = "CUDA_ERROR_INVALID_PTX",
	[701] = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
};

/* A tool run under the fake (tests/cuda_fake_run.sh) sets the device
 * count through FAKE_CUDA_DEVICES. */
API CUresult cuInit(unsigned flags)
{
	(void)flags;
	const char *n = getenv("FAKE_CUDA_DEVICES");
	if (n && *n)
		fake_cuda.devices = atoi(n);
	return fake_cuda.init_result;
}
API CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }

API CUresult cuGetErrorName(CUresult r, const char **s)
{
	if (r < 0 || r >= (int)(sizeof names / sizeof *names) || !names[r]) {
		*s = NULL;
		return 1;
	}
	*s = names[r];
	return 0;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
	*s = r == 701 ? "too many resources requested for launch" :
	     r == 2 ? "out of memory" : r == 100 ? "no CUDA-capable device is detected" :
	     NULL;
	return *s ? 0 : 1;
}

API CUresult cuDeviceGetCount(int *n) { *n = fake_cuda.devices; return 0; }

API CUresult cuDeviceGet(int *d, int ord)
{
	if (ord < 0 || ord >= fake_cuda.devices)
		return 1;
	*d = ord;
	return 0;
}

API CUresult cuDeviceGetAttribute(int *v, int attr, int dev)
{
	(void)dev;
	*v = attr == 75 ? fake_cuda.cc_major : attr == 76 ? fake_cuda.cc_minor :
	     attr == 16 ? fake_cuda.sms : 0;
	return 0;
}

API CUresult cuDeviceGetName(char *s, int n, int dev)
{
	(void)dev;
	strncpy(s, "Fake GPU", (size_t)n);
	return 0;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, int dev)
{
	fake_cuda.retains++;
	*c = (CUcontext)(uintptr_t)(0x1000 + dev);
	return 0;
}

API CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; fake_cuda.releases++; return 0; }
API CUresult cuCtxGetCurrent(CUcontext *c) { *c = cur; return 0; }

API CUresult cuCtxPushCurrent_v2(CUcontext c)
{
	if (depth == 16)
		return 1;
	stack[depth++] = cur;
	cur = c;
	fake_cuda.pushes++;
	return 0;
}

API CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	if (!depth)
		return 1;
	*c = cur;
	cur = stack[--depth];
	fake_cuda.pops++;
	return 0;
}

/* A module is a heap copy of its kind; a function is its entry's name. */
API CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *opt,
                                void **val)
{
	if (!cur)
		return 201; /* CUDA_ERROR_INVALID_CONTEXT */
	const char *s = image;
	if (!strncmp(s, "CUBIN", 5)) {
		if (fake_cuda.reject_cubin)
			return 200;
		fake_cuda.cubin_loads++;
	} else {
		if (fake_cuda.reject_ptx) {
			for (unsigned i = 0; i < n; i++)
				if (opt[i] == 5)
					strcpy(val[i], "ptxas fatal: fake error");
			return 218;
		}
		fake_cuda.ptx_loads++;
	}
	*m = malloc(1);
	return 0;
}

/* the names handed out, kept for the process (so never a leak) */
static char fn_names[256][64];
static int n_fn_names;

API CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
	(void)m;
	for (int i = 0; i < n_fn_names; i++)
		if (!strcmp(fn_names[i], name)) {
			*f = fn_names[i];
			return 0;
		}
	if (n_fn_names == 256 || strlen(name) >= 64)
		return 500; /* CUDA_ERROR_NOT_FOUND */
	strcpy(fn_names[n_fn_names], name);
	*f = fn_names[n_fn_names++];
	return 0;
}

API CUresult cuModuleUnload(void *m) { free(m); fake_cuda.unloads++; return 0; }

API CUresult cuFuncGetAttribute(int *v, int attr, void *f)
{
	(void)f;
	*v = attr == 0 ? fake_cuda.max_threads : 0;
	return 0;
}

typedef struct { char *data; size_t n; } link_state;

API CUresult cuLinkCreate_v2(unsigned n, int *o, void **v, void **ls)
{
	(void)n, (void)o, (void)v;
	*ls = calloc(1, sizeof(link_state));
	return 0;
}

API CUresult cuLinkAddData_v2(void *ls, int type, void *data, size_t size,
                              const char *name, unsigned n, int *o, void **v)
{
	(void)type, (void)name, (void)n, (void)o, (void)v;
	link_state *l = ls;
	if (fake_cuda.reject_ptx)
		return 218;
	l->data = malloc(size + 5);
	memcpy(l->data, "CUBIN", 5);
	memcpy(l->data + 5, data, size);
	l->n = size + 5;
	return 0;
}

API CUresult cuLinkComplete(void *ls, void **out, size_t *n)
{
	link_state *l = ls;
	fake_cuda.links++;
	*out = l->data;
	*n = l->n;
	return 0;
}

API CUresult cuLinkDestroy(void *ls)
{
	link_state *l = ls;
	free(l->data);
	free(l);
	return 0;
}

API CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz, unsigned sh,
                            void *stream, void **params, void **extra)
{
	(void)extra;
	if (!cur)
		return 201;
	if (fake_cuda.launch_result)
		return fake_cuda.launch_result;
	fake_log('K', stream);
	int at = BUMP(n_launches);
	if (at < FAKE_MAX_LAUNCHES) {
		fake_launch *l = &fake_cuda.launch[at];
		l->fn = f;
		l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
		l->block[0] = bx, l->block[1] = by, l->block[2] = bz;
		l->shmem = sh;
		l->stream = stream;
		l->params = params;
		for (int i = 0; i < fake_cuda.n_params && i < FAKE_MAX_PARAMS; i++) {
			int sz = fake_cuda.param_size[i] ? fake_cuda.param_size[i] : 8;
			memset(l->param[i], 0, 8);
			memcpy(l->param[i], params[i], (size_t)sz);
		}
	}
	return 0;
}

API CUresult cuMemAlloc_v2(unsigned long long *p, size_t n)
{
	void *q = aligned_alloc(256, (n + 255) / 256 * 256);
	if (!q)
		return 2;
	fake_cuda.allocs++;
	*p = (uintptr_t)q;
	return 0;
}

API CUresult cuMemFree_v2(unsigned long long p) { free((void *)(uintptr_t)p); fake_cuda.frees++; return 0; }

API CUresult cuMemsetD8_v2(unsigned long long p, unsigned char c, size_t n)
{
	memset((void *)(uintptr_t)p, c, n);
	return 0;
}

API CUresult cuMemsetD32Async(unsigned long long p, unsigned v, size_t n, void *st)
{
	(void)st;
	if (p % 4)
		return 1; /* CUDA_ERROR_INVALID_VALUE: not 4-byte aligned */
	for (size_t i = 0; i < n; i++)
		((uint32_t *)(uintptr_t)p)[i] = v;
	fake_log('Z', st);
	BUMP(memsets);
	return 0;
}

API CUresult cuMemcpyHtoDAsync_v2(unsigned long long d, const void *s, size_t n, void *st)
{
	memcpy((void *)(uintptr_t)d, s, n);
	fake_log('H', st);
	BUMP(uploads);
	return 0;
}

API CUresult cuMemcpyDtoHAsync_v2(void *d, unsigned long long s, size_t n, void *st)
{
	memcpy(d, (void *)(uintptr_t)s, n);
	fake_log('h', st);
	return 0;
}

API CUresult cuMemcpyDtoDAsync_v2(unsigned long long d, unsigned long long s, size_t n,
                                  void *st)
{
	memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
	fake_op *o = fake_log('D', st);
	if (o) {
		o->x = (const void *)(uintptr_t)s;
		o->y = (void *)(uintptr_t)d;
	}
	return 0;
}

API CUresult cuStreamSynchronize(void *s)
{
	fake_log('S', s);
	BUMP(syncs);
	return 0;
}

API CUresult cuStreamWaitEvent(void *s, void *e, unsigned f)
{
	if (!e || f)
		return 1; /* CUDA_ERROR_INVALID_VALUE: flags must be 0 */
	fake_op *o = fake_log('W', s);
	if (o)
		o->event = e;
	BUMP(waits);
	return 0;
}

API CUresult cuEventCreate(void **e, unsigned f)
{
	(void)f;
	*e = malloc(1);
	BUMP(events);
	return 0;
}

API CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }

API CUresult cuEventRecord(void *e, void *s)
{
	if (!e)
		return 400; /* CUDA_ERROR_INVALID_HANDLE */
	fake_op *o = fake_log('R', s);
	if (o)
		o->event = e;
	BUMP(records);
	return 0;
}

API CUresult cuEventSynchronize(void *e)
{
	fake_op *o = fake_log('E', NULL);
	if (o)
		o->event = e;
	BUMP(syncs);
	return 0;
}
/* the old name only, as a driver before 12.8 has it */
API CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a, (void)b; *ms = 0.5f; return 0; }

/* Streams: a handle per cuStreamCreate holding the device it was made on
 * (the current context's); the fake runs all work at once, in call order,
 * which is one order the device could choose. */
API CUresult cuStreamCreate(void **s, unsigned flags)
{
	(void)flags;
	if (!cur)
		return 201; /* CUDA_ERROR_INVALID_CONTEXT */
	*s = malloc(16);
	if (!*s)
		return 2;
	*(int *)*s = fake_current_device(); /* the stream's device */
	BUMP(streams);
	return 0;
}

API CUresult cuStreamDestroy_v2(void *s)
{
	if (!s)
		return 400; /* CUDA_ERROR_INVALID_HANDLE */
	free(s);
	__atomic_fetch_sub(&fake_cuda.streams, 1, __ATOMIC_RELAXED);
	return 0;
}

/* Graphs: not faked yet (CUDA_ERROR_NOT_SUPPORTED). */
API CUresult cuStreamBeginCapture_v2(void *s, int mode) { (void)s, (void)mode; return 801; }
API CUresult cuStreamEndCapture(void *s, void **g) { (void)s; *g = NULL; return 801; }
API CUresult cuGraphInstantiateWithFlags(void **x, void *g, unsigned long long f) { (void)g, (void)f; *x = NULL; return 801; }
API CUresult cuGraphLaunch(void *x, void *s) { (void)x, (void)s; return 801; }
API CUresult cuGraphExecDestroy(void *x) { (void)x; return 801; }
API CUresult cuGraphDestroy(void *g) { (void)g; return 801; }
