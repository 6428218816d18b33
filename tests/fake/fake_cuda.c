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

typedef struct fake_fn fake_fn;
typedef struct fake_module {
	int dev, index;         /* the index-th module loaded on dev */
	int copy;               /* fusec's gather, which the fake runs */
	fake_fn *fns;
} fake_module;
struct fake_fn {
	char name[64];          /* first: tests read a function as its name */
	fake_module *m;
	fake_fn *next;
};

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
	fake_module *fm = calloc(1, sizeof *fm);
	if (!fm)
		return 2;
	fm->dev = fake_current_device();
	/* fusec's strided gather (cuda.c) the fake runs itself; the others
	 * are numbered per device in load order, for the kernel hook */
	fm->copy = strstr(s, "fusec: strided gather") != NULL;
	if (!fm->copy && fm->dev >= 0 && fm->dev < FAKE_MAX_DEVICES)
		fm->index = __atomic_fetch_add(&fake_cuda.modules_loaded[fm->dev], 1,
		                               __ATOMIC_RELAXED);
	*m = fm;
	return 0;
}

/* A function: its entry's name first (tests read it as a string). */
API CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
	fake_module *fm = m;
	for (fake_fn *g = fm->fns; g; g = g->next)
		if (!strcmp(g->name, name)) {
			*f = g;
			return 0;
		}
	if (strlen(name) >= sizeof ((fake_fn *)0)->name)
		return 500; /* CUDA_ERROR_NOT_FOUND */
	fake_fn *g = calloc(1, sizeof *g);
	if (!g)
		return 2;
	strcpy(g->name, name);
	g->m = fm;
	g->next = fm->fns;
	fm->fns = g;
	*f = g;
	return 0;
}

API CUresult cuModuleUnload(void *m)
{
	fake_module *fm = m;
	while (fm->fns) {
		fake_fn *g = fm->fns;
		fm->fns = g->next;
		free(g);
	}
	free(fm);
	BUMP(unloads);
	return 0;
}

API CUresult cuFuncGetAttribute(int *v, int attr, void *f)
{
	(void)f;
	*v = attr == 0 ? fake_cuda.max_threads : 0;
	return 0;
}

API CUresult cuFuncSetAttribute(void *f, int attr, int v)
{
	(void)f;
	if (attr != 8) /* MAX_DYNAMIC_SHARED_SIZE_BYTES, the one fusec sets */
		return 1;
	fake_cuda.dyn_smem = v;
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

/* ---- streams, events and graphs --------------------------------------------
 *
 * A stream is a fake_stream: the device it was made on (the current
 * context's), whether it is blocking (synchronizes with the legacy stream),
 * and the capture it is part of. Work on a stream that is not capturing
 * runs at once, in call order, which is one order the device could
 * choose. Work on a capturing stream becomes a node of the capture's graph
 * instead (its arguments copied, as the driver copies a launch's
 * parameters) and runs, in capture order, at each cuGraphLaunch.
 *
 * As the driver documents capture:
 *   - cuStreamBeginCapture on the legacy stream (NULL) fails
 *     (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); so does synchronizing a
 *     capturing stream or one of its events, which also invalidates the
 *     capture (cuStreamEndCapture then fails with _INVALIDATED);
 *   - work on the legacy stream while a blocking stream of this thread
 *     captures fails (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
 *   - an event recorded in a capture, waited on by another stream, forks
 *     that stream into the capture; every forked stream must be joined
 *     back (the origin waits on an event recorded after its last captured
 *     work) before cuStreamEndCapture, else CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
 *   - a capturing stream waiting on an event recorded outside the
 *     capture fails (CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
 */
#define MAX_MEMBERS 8

typedef struct fake_node {
	char kind;
	void *stream;
	void (*run)(void *ctx, void *stream);
	void *ctx;
	size_t ctx_size;        /* ctx is a flat copy: instantiate copies it */
} fake_node;

typedef struct fake_graph {
	fake_node *nodes;
	int n, cap;
	struct fake_stream *member[MAX_MEMBERS]; /* [0]: the origin */
	long joined[MAX_MEMBERS]; /* the origin waited on member's work up to */
	int n_members;
	int invalid;
} fake_graph;

typedef struct fake_stream {
	int dev;                /* first: fake_nccl.c reads it */
	int blocking;
	fake_graph *cap;        /* the capture it is part of, or NULL */
	long seq;               /* nodes it added to that capture */
} fake_stream;

typedef struct fake_event {
	int recorded;
	fake_graph *g;          /* recorded in this capture (NULL: outside) */
	fake_stream *s;
	long seq;
} fake_event;

static _Thread_local int blocking_captures; /* this thread's */

/* 0: run now; 1: captured (ctx copied into the graph); else a CUresult. */
int fake_defer(void *stream, char kind, void (*run)(void *, void *), const void *ctx,
               size_t size)
{
	fake_stream *s = stream;
	if (!s)
		return blocking_captures ? 906 /* CUDA_ERROR_STREAM_CAPTURE_IMPLICIT */ : 0;
	if (!s->cap)
		return 0;
	fake_graph *g = s->cap;
	if (g->n == g->cap) {
		int nc = g->cap ? 2 * g->cap : 16;
		fake_node *nn = realloc(g->nodes, sizeof *nn * (size_t)nc);
		if (!nn)
			return 2;
		g->nodes = nn;
		g->cap = nc;
	}
	void *c = malloc(size ? size : 1);
	if (!c)
		return 2;
	memcpy(c, ctx, size);
	g->nodes[g->n++] = (fake_node){kind, stream, run, c, size};
	if (kind != 'R' && kind != 'W') /* work; an event's node is only order */
		s->seq++;
	return 1;
}

/* Runs op now, or captures it: what every stream-ordered call does. */
#define STREAM_OP(kind, stream, fn, args)                                      \
	do {                                                                   \
		int d_ = fake_defer(stream, kind, fn, &(args), sizeof(args));  \
		if (d_ > 1)                                                    \
			return d_;                                             \
		if (d_ == 0)                                                   \
			fn(&(args), stream);                                   \
		return 0;                                                      \
	} while (0)

typedef struct launch_args {
	fake_fn *f;
	unsigned g[3], b[3], sh;
	unsigned char param[FAKE_MAX_PARAMS][8];
	void **params;
	int n_val;                   /* the values a run of the kernel reads */
	uint64_t val[FAKE_MAX_VALUES];
} launch_args;

/* fusec's gather (cuda.c, fz_copy_b<bits>): dst[i] = src[offset of i's
 * index in shape, innermost last, dotted with strides]. */
static void run_gather(const launch_args *a)
{
	int bytes = atoi(a->f->name + strlen("fz_copy_b")) / 8;
	char *dst = (char *)(uintptr_t)a->val[0];
	const char *src = (const char *)(uintptr_t)a->val[1];
	uint64_t n = a->val[2], rank = (uint32_t)a->val[3];
	for (uint64_t i = 0; i < n; i++) {
		uint64_t r = i, off = 0;
		for (int d = (int)rank - 1; d >= 0; d--) {
			off += (r % a->val[4 + d]) * a->val[12 + d];
			r /= a->val[4 + d];
		}
		memcpy(dst + i * (uint64_t)bytes, src + off * (uint64_t)bytes, (size_t)bytes);
	}
}

static void run_launch(void *ctx, void *stream)
{
	launch_args *a = ctx;
	if (a->f->m->copy)
		run_gather(a);
	else if (fake_cuda.hook_run && a->n_val)
		fake_cuda.hook_run(fake_cuda.hook_ctx, a->f->m->index, a->f->name, a->val);
	fake_log('K', stream);
	int at = BUMP(n_launches);
	if (at < FAKE_MAX_LAUNCHES) {
		fake_launch *l = &fake_cuda.launch[at];
		l->fn = a->f->name;
		memcpy(l->grid, a->g, sizeof l->grid);
		memcpy(l->block, a->b, sizeof l->block);
		l->shmem = a->sh;
		l->stream = stream;
		l->params = a->params;
		memcpy(l->param, a->param, sizeof l->param);
	}
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
	/* the values are read now, as the driver reads them */
	fake_fn *fn = f;
	launch_args a = {fn, {gx, gy, gz}, {bx, by, bz}, sh, {{0}}, params, 0, {0}};
	for (int i = 0; i < fake_cuda.n_params && i < FAKE_MAX_PARAMS; i++) {
		int sz = fake_cuda.param_size[i] ? fake_cuda.param_size[i] : 8;
		memcpy(a.param[i], params[i], (size_t)sz);
	}
	/* what the kernel itself will read: the gather's 20 (rank a u32),
	 * or as many 8-byte values as the hook says the kernel takes */
	a.n_val = fn->m->copy ? 20 : fake_cuda.hook_params ?
	          fake_cuda.hook_params(fake_cuda.hook_ctx, fn->m->index, fn->name) : 0;
	if (a.n_val > FAKE_MAX_VALUES)
		return 1;
	for (int i = 0; i < a.n_val; i++)
		memcpy(&a.val[i], params[i], fn->m->copy && i == 3 ? 4 : 8);
	STREAM_OP('K', stream, run_launch, a);
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
	fake_cuda.legacy_memsets++;
	return 0;
}

typedef struct fill_args { unsigned long long p; unsigned v; size_t n; } fill_args;

static void run_fill(void *ctx, void *stream)
{
	fill_args *a = ctx;
	for (size_t i = 0; i < a->n; i++)
		((uint32_t *)(uintptr_t)a->p)[i] = a->v;
	fake_log('Z', stream);
	BUMP(memsets);
}

API CUresult cuMemsetD32Async(unsigned long long p, unsigned v, size_t n, void *st)
{
	if (p % 4)
		return 1; /* CUDA_ERROR_INVALID_VALUE: not 4-byte aligned */
	fill_args a = {p, v, n};
	STREAM_OP('Z', st, run_fill, a);
}

typedef struct copy_args { void *d; const void *s; size_t n; char kind; } copy_args;

static void run_copy(void *ctx, void *stream)
{
	copy_args *a = ctx;
	memmove(a->d, a->s, a->n);
	fake_op *o = fake_log(a->kind, stream);
	if (o) {
		o->x = a->s;
		o->y = a->d;
	}
	if (a->kind == 'H')
		BUMP(uploads);
}

API CUresult cuMemcpyHtoDAsync_v2(unsigned long long d, const void *s, size_t n, void *st)
{
	copy_args a = {(void *)(uintptr_t)d, s, n, 'H'};
	STREAM_OP('H', st, run_copy, a);
}

API CUresult cuMemcpyDtoHAsync_v2(void *d, unsigned long long s, size_t n, void *st)
{
	copy_args a = {d, (const void *)(uintptr_t)s, n, 'h'};
	STREAM_OP('h', st, run_copy, a);
}

API CUresult cuMemcpyDtoDAsync_v2(unsigned long long d, unsigned long long s, size_t n,
                                  void *st)
{
	copy_args a = {(void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, 'D'};
	STREAM_OP('D', st, run_copy, a);
}

static void invalidate(fake_stream *s)
{
	if (s && s->cap)
		s->cap->invalid = 1;
}

API CUresult cuStreamSynchronize(void *s)
{
	fake_log('S', s);
	BUMP(syncs);
	if (s && ((fake_stream *)s)->cap) {
		invalidate(s);
		return 900; /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
	}
	return 0;
}


/* An event's record or wait inside a capture: a node that logs it where
 * it replays. */
typedef struct event_node { char kind; void *e; } event_node;

static void run_event(void *ctx, void *stream)
{
	event_node *n = ctx;
	fake_op *o = fake_log(n->kind, stream);
	if (o)
		o->event = n->e;
	if (n->kind == 'W')
		BUMP(waits);
	else
		BUMP(records);
}

API CUresult cuStreamWaitEvent(void *stream, void *ev, unsigned f)
{
	fake_stream *s = stream;
	fake_event *e = ev;
	if (!e || f)
		return 1; /* CUDA_ERROR_INVALID_VALUE: flags must be 0 */
	if (!s && e->g && blocking_captures)
		return 906;
	if (s && e->g) {
		fake_graph *g = e->g;
		if (s->cap && s->cap != g)
			return 905; /* CUDA_ERROR_STREAM_CAPTURE_ISOLATION */
		if (!s->cap) { /* forked into the capture */
			if (g->n_members == MAX_MEMBERS)
				return 2;
			s->cap = g;
			s->seq = 0;
			g->joined[g->n_members] = 0;
			g->member[g->n_members++] = s;
		}
		if (s == g->member[0])
			for (int i = 1; i < g->n_members; i++)
				if (g->member[i] == e->s && e->seq > g->joined[i])
					g->joined[i] = e->seq;
	} else if (s && s->cap && e->recorded) {
		return 905; /* captured work cannot wait on uncaptured work */
	}
	event_node n = {'W', e};
	STREAM_OP('W', s, run_event, n);
}

API CUresult cuEventCreate(void **e, unsigned f)
{
	(void)f;
	*e = calloc(1, sizeof(fake_event));
	BUMP(events);
	return 0;
}

API CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }

API CUresult cuEventRecord(void *ev, void *stream)
{
	fake_event *e = ev;
	fake_stream *s = stream;
	if (!e)
		return 400; /* CUDA_ERROR_INVALID_HANDLE */
	if (!s && blocking_captures)
		return 906;
	e->recorded = 1;
	e->g = s ? s->cap : NULL;
	e->s = s;
	e->seq = s ? s->seq : 0;
	event_node n = {'R', e};
	STREAM_OP('R', s, run_event, n);
}

API CUresult cuEventSynchronize(void *ev)
{
	fake_event *e = ev;
	fake_op *o = fake_log('E', NULL);
	if (o)
		o->event = e;
	BUMP(syncs);
	if (e && e->g && e->s && e->s->cap == e->g) {
		invalidate(e->s);
		return 900;
	}
	return 0;
}

/* the old name only, as a driver before 12.8 has it */
API CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a, (void)b; *ms = 0.5f; return 0; }

API CUresult cuStreamCreate(void **s, unsigned flags)
{
	if (!cur)
		return 201; /* CUDA_ERROR_INVALID_CONTEXT */
	fake_stream *f = calloc(1, sizeof *f);
	if (!f)
		return 2;
	f->dev = fake_current_device();
	f->blocking = !(flags & 1); /* CU_STREAM_NON_BLOCKING */
	*s = f;
	BUMP(streams);
	return 0;
}

API CUresult cuStreamDestroy_v2(void *s)
{
	if (!s)
		return 400; /* CUDA_ERROR_INVALID_HANDLE */
	if (((fake_stream *)s)->cap)
		return 900;
	free(s);
	__atomic_fetch_sub(&fake_cuda.streams, 1, __ATOMIC_RELAXED);
	return 0;
}

API CUresult cuStreamBeginCapture_v2(void *stream, int mode)
{
	fake_stream *s = stream;
	if (!s)
		return 900; /* the legacy stream cannot be captured */
	if (s->cap || mode < 0 || mode > 2)
		return s->cap ? 401 /* CUDA_ERROR_ILLEGAL_STATE */ : 1;
	fake_graph *g = calloc(1, sizeof *g);
	if (!g)
		return 2;
	g->member[0] = s;
	g->n_members = 1;
	s->cap = g;
	s->seq = 0;
	blocking_captures += s->blocking;
	BUMP(captures);
	return 0;
}

static void graph_free(fake_graph *g)
{
	for (int i = 0; g && i < g->n; i++)
		free(g->nodes[i].ctx);
	if (g)
		free(g->nodes);
	free(g);
}

API CUresult cuStreamEndCapture(void *stream, void **out)
{
	fake_stream *s = stream;
	*out = NULL;
	if (!s || !s->cap || s->cap->member[0] != s)
		return 401; /* not capturing, or not the origin */
	fake_graph *g = s->cap;
	CUresult r = g->invalid ? 901 /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */ : 0;
	for (int i = 1; i < g->n_members && !r; i++)
		if (g->joined[i] < g->member[i]->seq)
			r = 904; /* CUDA_ERROR_STREAM_CAPTURE_UNJOINED */
	for (int i = 0; i < g->n_members; i++) {
		g->member[i]->cap = NULL;
		g->member[i]->seq = 0;
	}
	blocking_captures -= s->blocking;
	if (r) {
		graph_free(g);
		return r;
	}
	BUMP(graphs);
	*out = g;
	return 0;
}

API CUresult cuGraphInstantiateWithFlags(void **x, void *graph, unsigned long long f)
{
	fake_graph *g = graph, *e = calloc(1, sizeof *e);
	*x = NULL;
	if (!g || f || !e) {
		free(e);
		return !g || f ? 1 : 2;
	}
	e->nodes = calloc((size_t)g->n + 1, sizeof *e->nodes);
	for (int i = 0; e->nodes && i < g->n; i++) {
		e->nodes[i] = g->nodes[i];
		e->nodes[i].ctx = malloc(g->nodes[i].ctx_size ? g->nodes[i].ctx_size : 1);
		memcpy(e->nodes[i].ctx, g->nodes[i].ctx, g->nodes[i].ctx_size);
		e->n = i + 1;
	}
	BUMP(execs);
	*x = e;
	return 0;
}

/* Replays the graph's nodes, in capture order, now. */
API CUresult cuGraphLaunch(void *x, void *stream)
{
	fake_graph *e = x;
	if (!e)
		return 400;
	if (stream && ((fake_stream *)stream)->cap)
		return 900; /* a graph launch into a capture: not faked */
	fake_log('G', stream);
	BUMP(graph_launches);
	for (int i = 0; i < e->n; i++)
		e->nodes[i].run(e->nodes[i].ctx, e->nodes[i].stream);
	return 0;
}

API CUresult cuGraphExecDestroy(void *x)
{
	if (!x)
		return 400;
	graph_free(x);
	__atomic_fetch_sub(&fake_cuda.execs, 1, __ATOMIC_RELAXED);
	return 0;
}

API CUresult cuGraphDestroy(void *g)
{
	if (!g)
		return 400;
	graph_free(g);
	__atomic_fetch_sub(&fake_cuda.graphs, 1, __ATOMIC_RELAXED);
	return 0;
}
