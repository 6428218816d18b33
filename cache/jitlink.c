/*
 * jitlink.c: cubins from PTX through nvJitLink, opened at run time.
 *
 * A GPU that loads PTX compiles it first (the driver's JIT), which costs
 * tens of milliseconds per module and is exactly the work a warm start
 * should not do. Where libnvJitLink is installed (it ships with the CUDA
 * toolkit and needs no GPU and no driver), `fusec compile --target sm_90`
 * turns each kernel's PTX into machine code for sm_90 and stores it in the
 * entry beside the PTX; the runtime loads the cubin when the device's arch
 * matches and falls back to the PTX otherwise.
 *
 * The library is opened once with dlopen (libnvJitLink.so.13, then
 * libnvJitLink.so, from the loader path and /usr/local/cuda/lib64), its
 * functions found by their versioned names first (the header maps
 * nvJitLinkCreate to __nvJitLinkCreate_13_0) and their plain names after.
 * Absent, every call says FZ_EUNSUPPORTED and the caller stores PTX only.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

typedef int (*jl_create)(void **h, uint32_t n, const char **opts);
typedef int (*jl_destroy)(void **h);
typedef int (*jl_add_data)(void *h, int kind, const void *data, size_t n,
			   const char *name);
typedef int (*jl_complete)(void *h);
typedef int (*jl_size)(void *h, size_t *n);
typedef int (*jl_get)(void *h, void *buf);

enum { JL_INPUT_PTX = 2 };

static struct {
	void *lib;
	jl_create create;
	jl_destroy destroy;
	jl_add_data add_data;
	jl_complete complete;
	jl_size cubin_size, log_size;
	jl_get cubin, log;
} jl;

static pthread_once_t jl_once = PTHREAD_ONCE_INIT;

static void *sym(const char *versioned, const char *plain)
{
	void *p = dlsym(jl.lib, versioned);
	return p ? p : dlsym(jl.lib, plain);
}

static void jl_open(void)
{
	static const char *const names[] = {
		"libnvJitLink.so.13", "libnvJitLink.so",
		"/usr/local/cuda/lib64/libnvJitLink.so.13",
		"/usr/local/cuda/lib64/libnvJitLink.so",
	};
	for (size_t i = 0; i < sizeof names / sizeof *names && !jl.lib; i++)
		jl.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!jl.lib)
		return;
	jl.create = (jl_create)sym("__nvJitLinkCreate_13_0", "nvJitLinkCreate");
	jl.destroy = (jl_destroy)sym("__nvJitLinkDestroy_13_0", "nvJitLinkDestroy");
	jl.add_data = (jl_add_data)sym("__nvJitLinkAddData_13_0", "nvJitLinkAddData");
	jl.complete = (jl_complete)sym("__nvJitLinkComplete_13_0", "nvJitLinkComplete");
	jl.cubin_size = (jl_size)sym("__nvJitLinkGetLinkedCubinSize_13_0",
				     "nvJitLinkGetLinkedCubinSize");
	jl.cubin = (jl_get)sym("__nvJitLinkGetLinkedCubin_13_0",
			       "nvJitLinkGetLinkedCubin");
	jl.log_size = (jl_size)sym("__nvJitLinkGetErrorLogSize_13_0",
				   "nvJitLinkGetErrorLogSize");
	jl.log = (jl_get)sym("__nvJitLinkGetErrorLog_13_0", "nvJitLinkGetErrorLog");
	if (!jl.create || !jl.destroy || !jl.add_data || !jl.complete ||
	    !jl.cubin_size || !jl.cubin) {
		dlclose(jl.lib);
		memset(&jl, 0, sizeof jl);
	}
}

bool fz_jitlink_available(void)
{
	pthread_once(&jl_once, jl_open);
	return jl.lib != NULL;
}

fz_status fz_jitlink_cubin(const char *ptx, size_t len, int sm, void **cubin,
			   size_t *cubin_len, char **err)
{
	*cubin = NULL;
	*cubin_len = 0;
	if (!fz_jitlink_available()) {
		if (err)
			*err = fz_strdup("nvJitLink is not available");
		return FZ_EUNSUPPORTED;
	}
	char arch[32];
	snprintf(arch, sizeof arch, "-arch=sm_%d", sm);
	const char *opts[] = {arch, "-O3"};
	void *h = NULL;
	fz_status st = FZ_ERUNTIME;
	size_t n = 0;
	int rc = jl.create(&h, 2, opts);
	if (rc == 0)
		rc = jl.add_data(h, JL_INPUT_PTX, ptx, len, "fusec.ptx");
	if (rc == 0)
		rc = jl.complete(h);
	if (rc == 0)
		rc = jl.cubin_size(h, &n);
	if (rc == 0 && n > 0) {
		*cubin = malloc(n);
		if (!*cubin) {
			st = FZ_ENOMEM;
		} else if ((rc = jl.cubin(h, *cubin)) == 0) {
			*cubin_len = n;
			st = FZ_OK;
		}
	}
	if (st != FZ_OK) {
		free(*cubin);
		*cubin = NULL;
		if (err) {
			size_t ln = 0;
			char *log = NULL;
			if (h && jl.log_size && jl.log && jl.log_size(h, &ln) == 0 &&
			    ln > 0 && (log = calloc(1, ln + 1)))
				jl.log(h, log);
			*err = fz_strdup_printf("nvJitLink failed for sm_%d (error %d)%s%s",
						sm, rc, log && *log ? ": " : "",
						log ? log : "");
			free(log);
		}
	}
	if (h)
		jl.destroy(&h);
	return st;
}
