/*
 * bench_cuda.c: host overhead of a launch, and warm start, on a GPU.
 *
 *     bench_cuda launch [--iters 10000] [--json FILE]
 *     bench_cuda warmstart TRACE --bind B=1,T=1 [--t0 NS] [--json FILE]
 *
 * launch. The host time of one cuLaunchKernel of an empty kernel (raw),
 * against one fz_exec_run of a program that is one kernel (the same grid
 * of one block: `y = add(x, 1)` over f32[1]): each call timed on its own
 * with CLOCK_MONOTONIC, the median of --iters calls each; the queue is
 * drained (cuStreamSynchronize, not timed) every 256 calls so that a full
 * launch queue never blocks a timed call. overhead_us = fusec - raw: what
 * the runner adds per launch (binding pointers, the step list, the flag
 * word, the context check). The goal is <= 2 us.
 *
 * warmstart. Process start to every module of TRACE loaded: the script
 * passes its clock (date +%s%N) before exec as --t0; the bench parses the
 * trace, prepares it for "cuda" and runs it once at --bind on zeroed
 * device inputs (a run is what resolves and loads the kernels: from the
 * disk cache's cubins when `fusec compile --target sm_XX` warmed it), and
 * reports the time at each step since t0. Weights are cuMemAlloc'd, not
 * filled: the bench measures start-up, not data.
 *
 * Both exit 77 with "no CUDA device" where there is none. JSON: device
 * name, compute capability, driver version, date, and the figures.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_target.h"
#include "fusec.h"
#include "ir.h"
#include "target.h"


static int64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, char *err)
{
	fprintf(stderr, "bench_cuda: %s: %s\n", what, err ? err : "?");
	exit(1);
}

static fz_device *dev;

static void header_json(FILE *f, const char *bench)
{
	char name[256];
	int cc = 0, drv = 0;
	fz_cuda_describe(dev, name, sizeof name, &cc, &drv);
	time_t t = time(NULL);
	char date[64];
	strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
	fprintf(f, "{\n  \"bench\": \"%s\",\n  \"device\": \"%s\",\n"
	        "  \"compute_capability\": \"%d.%d\",\n  \"driver\": \"%d.%d\",\n"
	        "  \"date\": \"%s\"", bench, name, cc / 10, cc % 10, drv / 1000,
	        drv % 1000 / 10, date);
}

static const char EMPTY_PTX[] =
	".version 6.0\n.target sm_70\n.address_size 64\n"
	".visible .entry fz_empty()\n{\n\tret;\n}\n";

static int bench_launch(int iters, const char *json)
{
	cu_dev *d = (cu_dev *)dev;
	const fz_cu_api *cu = d->cu;
	bool pushed = false;
	CUresult r = fz_cuda_enter(d, &pushed);
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	if (r == FZ_CUDA_SUCCESS)
		r = cu->ModuleLoadDataEx(&mod, EMPTY_PTX, 0, NULL, NULL);
	if (r == FZ_CUDA_SUCCESS)
		r = cu->ModuleGetFunction(&fn, mod, "fz_empty");
	if (r != FZ_CUDA_SUCCESS) {
		char *err = NULL;
		fz_cu_fail(cu, &err, r, "cuModuleLoadDataEx", "the empty kernel");
		die("raw launch", err);
	}
	double *raw = malloc((size_t)iters * sizeof *raw);
	double *fus = malloc((size_t)iters * sizeof *fus);
	for (int i = 0; i < iters + 100; i++) {
		if (i % 256 == 0)
			cu->StreamSynchronize(NULL);
		double t0 = fz_now();
		r = cu->LaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
		double t1 = fz_now();
		if (r != FZ_CUDA_SUCCESS) {
			char *err = NULL;
			fz_cu_fail(cu, &err, r, "cuLaunchKernel", "the empty kernel");
			die("raw launch", err);
		}
		if (i >= 100) /* warm-up */
			raw[i - 100] = t1 - t0;
	}
	cu->StreamSynchronize(NULL);
	fz_cuda_leave(d, pushed);

	const char *text = "trace one(x: f32[1]) {\n  y = add(x, 1.0)\n  return y\n}\n";
	fz_module *m = NULL;
	char *err = NULL;
	if (fz_module_parse(text, strlen(text), "one.trace", &m, &err) != FZ_OK)
		die("parse", err);
	fz_trace *t = fz_module_trace(m, 0);
	void *x = NULL, *y = NULL;
	if (fz_target_cuda.alloc(dev, 4, &x, &err) != FZ_OK ||
	    fz_target_cuda.alloc(dev, 4, &y, &err) != FZ_OK)
		die("alloc", err);
	fz_tensor in = {x, FZ_F32, 1, {1}, {1}}, out = {y, FZ_F32, 1, {1}, {1}};
	fz_exec *ex = NULL;
	if (fz_exec_new(t, "cuda", NULL, &ex, &err) != FZ_OK)
		die("fz_exec_new", err);
	for (int i = 0; i < iters + 100; i++) {
		if (i % 256 == 0 && fz_exec_sync(ex, NULL, &err) != FZ_OK)
			die("fz_exec_sync", err);
		double t0 = fz_now();
		fz_status st = fz_exec_run(ex, NULL, &in, 1, &out, 1, NULL, &err);
		double t1 = fz_now();
		if (st != FZ_OK)
			die("fz_exec_run", err);
		if (i >= 100)
			fus[i - 100] = t1 - t0;
	}
	if (fz_exec_sync(ex, NULL, &err) != FZ_OK)
		die("fz_exec_sync", err);
	double mr = median(raw, iters) * 1e6, mf = median(fus, iters) * 1e6;
	printf("raw cuLaunchKernel (empty kernel): median %.3f us over %d\n", mr, iters);
	printf("fz_exec_run (one kernel):          median %.3f us over %d\n", mf, iters);
	printf("overhead per launch:               %.3f us (goal <= 2 us)\n", mf - mr);
	if (json) {
		FILE *f = fopen(json, "w");
		if (!f) {
			perror(json);
			return 1;
		}
		header_json(f, "launch_overhead");
		fprintf(f, ",\n  \"iters\": %d,\n  \"raw_launch_us_median\": %.4f,\n"
		        "  \"fz_exec_run_us_median\": %.4f,\n  \"overhead_us\": %.4f,\n"
		        "  \"goal_us\": 2.0\n}\n", iters, mr, mf, mf - mr);
		fclose(f);
	}
	fz_exec_free(ex);
	fz_target_cuda.release(dev, x);
	fz_target_cuda.release(dev, y);
	fz_module_free(m);
	free(raw);
	free(fus);
	return 0;
}

/* "B=1,T=1" into syms by the trace's symbol names. */
static void parse_bind(const fz_trace *t, const char *s, int64_t *syms)
{
	for (int i = 0; i < FZ_MAX_SYMS; i++)
		syms[i] = -1;
	char buf[256];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
		char *eq = strchr(tok, '=');
		if (!eq) {
			fprintf(stderr, "bench_cuda: --bind wants NAME=SIZE, got '%s'\n", tok);
			exit(2);
		}
		*eq = 0;
		for (int i = 0; i < fz_trace_symbol_count(t); i++)
			if (!strcmp(fz_trace_symbol(t, i), tok))
				syms[i] = strtoll(eq + 1, NULL, 10);
	}
}

static int bench_warmstart(const char *path, const char *bind, int64_t t0_ns,
                           const char *json)
{
	double t_open = (double)(realtime_ns() - t0_ns) * 1e-9;
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *text = malloc((size_t)len + 1);
	if (fread(text, 1, (size_t)len, f) != (size_t)len) {
		perror(path);
		return 1;
	}
	text[len] = 0;
	fclose(f);
	fz_module *m = NULL;
	char *err = NULL;
	if (fz_module_parse(text, (size_t)len, path, &m, &err) != FZ_OK)
		die("parse", err);
	fz_trace *t = fz_module_trace(m, 0);
	int64_t syms[FZ_MAX_SYMS];
	parse_bind(t, bind, syms);
	double t_parsed = (double)(realtime_ns() - t0_ns) * 1e-9;
	int ni = fz_trace_param_count(t), no = fz_trace_output_count(t);
	fz_tensor *in = calloc((size_t)ni, sizeof *in), *out = calloc((size_t)no, sizeof *out);
	double bytes = 0;
	for (int k = 0; k < ni + no; k++) {
		fz_value *v = k < ni ? fz_trace_param(t, k) : fz_trace_output(t, k - ni);
		fz_tensor *x = k < ni ? &in[k] : &out[k - ni];
		x->dtype = fz_value_dtype(v);
		x->rank = fz_value_rank(v);
		int64_t n = 1;
		for (int d = x->rank - 1; d >= 0; d--) {
			x->shape[d] = fz_value_extent(v, d, syms);
			if (x->shape[d] < 0) {
				fprintf(stderr, "bench_cuda: %s: a size is unbound (--bind)\n", path);
				return 2;
			}
			x->strides[d] = n;
			n *= x->shape[d];
		}
		size_t sz = (size_t)n * fz_dtype_size(x->dtype);
		bytes += (double)sz;
		if (fz_target_cuda.alloc(dev, sz, &x->data, &err) != FZ_OK)
			die("alloc", err);
	}
	double t_alloc = (double)(realtime_ns() - t0_ns) * 1e-9;
	fz_exec *ex = NULL;
	if (fz_exec_new(t, "cuda", NULL, &ex, &err) != FZ_OK)
		die("fz_exec_new", err);
	if (fz_exec_run(ex, syms, in, ni, out, no, NULL, &err) != FZ_OK)
		die("fz_exec_run", err);
	double t_loaded = (double)(realtime_ns() - t0_ns) * 1e-9;
	if (fz_exec_sync(ex, NULL, &err) != FZ_OK)
		die("fz_exec_sync", err);
	double t_done = (double)(realtime_ns() - t0_ns) * 1e-9;
	/* a second run: the steady state, for comparison */
	double r0 = fz_now();
	if (fz_exec_run(ex, syms, in, ni, out, no, NULL, &err) != FZ_OK ||
	    fz_exec_sync(ex, NULL, &err) != FZ_OK)
		die("second run", err);
	double t_second = fz_now() - r0;
	printf("%s at %s (%.2f GB of tensors):\n", path, bind, bytes / 1e9);
	printf("  process start to main            %.4f s\n", t_open);
	printf("  parsed                           %.4f s\n", t_parsed);
	printf("  inputs allocated on the device   %.4f s\n", t_alloc);
	printf("  first run queued (modules loaded) %.4f s\n", t_loaded);
	printf("  first run done                   %.4f s\n", t_done);
	printf("  a second run                     %.4f s\n", t_second);
	if (json) {
		FILE *o = fopen(json, "w");
		if (!o) {
			perror(json);
			return 1;
		}
		header_json(o, "warm_start");
		fprintf(o, ",\n  \"trace\": \"%s\",\n  \"bind\": \"%s\",\n"
		        "  \"tensor_bytes\": %.0f,\n  \"main_s\": %.4f,\n  \"parsed_s\": %.4f,\n"
		        "  \"allocated_s\": %.4f,\n  \"modules_loaded_s\": %.4f,\n"
		        "  \"first_run_done_s\": %.4f,\n  \"second_run_s\": %.4f\n}\n",
		        path, bind, bytes, t_open, t_parsed, t_alloc, t_loaded, t_done,
		        t_second);
		fclose(o);
	}
	fz_exec_free(ex);
	for (int k = 0; k < ni; k++)
		fz_target_cuda.release(dev, in[k].data);
	for (int k = 0; k < no; k++)
		fz_target_cuda.release(dev, out[k].data);
	fz_module_free(m);
	free(text);
	return 0;
}

static void usage(FILE *f)
{
	fputs("usage: bench_cuda launch [--iters N] [--json FILE]\n"
	      "       bench_cuda warmstart TRACE --bind B=1,T=1 [--t0 NS] [--json FILE]\n"
	      "\n"
	      "launch: median host time of raw cuLaunchKernel (empty kernel) and\n"
	      "of fz_exec_run of a one-kernel program, and their difference.\n"
	      "warmstart: seconds from --t0 (date +%s%N before exec; default: the\n"
	      "start of main) to the trace parsed, its inputs allocated, and its\n"
	      "first run queued with every module loaded. Exit 77: no CUDA device.\n",
	      f);
}

int main(int argc, char **argv)
{
	int64_t t0 = realtime_ns();
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	const char *json = NULL, *bind = NULL, *trace = NULL;
	int iters = 10000;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--json") && i + 1 < argc)
			json = argv[++i];
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--bind") && i + 1 < argc)
			bind = argv[++i];
		else if (!strcmp(argv[i], "--t0") && i + 1 < argc)
			t0 = strtoll(argv[++i], NULL, 10);
		else if (argv[i][0] != '-' && !trace)
			trace = argv[i];
		else {
			fprintf(stderr, "bench_cuda: unknown argument '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (iters < 1) {
		fprintf(stderr, "bench_cuda: --iters must be positive\n");
		return 2;
	}
	bool launch = !strcmp(argv[1], "launch"), warm = !strcmp(argv[1], "warmstart");
	if (!launch && !(warm && trace && bind)) {
		usage(stderr);
		return 2;
	}
	char *err = NULL;
	fz_status st = fz_target_cuda.open(NULL, &dev, &err);
	if (st == FZ_EUNSUPPORTED) {
		fprintf(stderr, "bench_cuda: %s\n", err ? err : "no CUDA device");
		return 77;
	}
	if (st != FZ_OK)
		die("open", err);
	int rc = launch ? bench_launch(iters, json) : bench_warmstart(trace, bind, t0, json);
	fz_device_release(dev);
	return rc;
}
