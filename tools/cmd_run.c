/*
 * cmd_run.c: `fusec check` and `fusec run`.
 *
 *     fusec check FILE...                   parse and verify
 *     fusec run FILE [--bind B=8,T=2048]    run on random inputs
 *     fusec run FILE --device emu           the GPU's kernels on the CPU,
 *                                           checked (runtime/emu.c)
 *
 * `run` makes inputs a trace can actually use: floats from a normal
 * distribution, integers that index something uniform within the extent
 * they index (found by following the value to the take/take_along/index_add
 * that consumes it), other integers small, bools both ways; an operand of a
 * matmul or linear is scaled by 1/sqrt(K) as weight initializers do. It runs
 * the planned program from generated code (`--device cpu`, and `auto` on a
 * machine without the CUDA runtime): every kernel region is LLVM IR
 * compiled to host code through ORC (runtime/cpu.c).
 *
 * `--check` runs the reference interpreter on the same inputs and compares
 * every element of every output. An element passes when
 *
 *     |got - want| <= atol * max(1, rms(want)) + rtol * |want|
 *
 * (NaN matches NaN, inf itself) with (rtol, atol) by the output's dtype:
 * f64 (1e-9, 1e-9), f32 (1e-5, 1e-5), f16 (1e-3, 2e-3), bf16 (1e-2, 4e-2),
 * and 0 for integers and bool.
 * The absolute part scales with the output's root mean square because an
 * element that is the small difference of large terms (attention scores of
 * unscaled random weights) carries the rounding error of the terms, not of
 * itself.
 *
 * Why these numbers. Generated code is built to agree with the interpreter
 * bit for bit where that is cheap (codegen/codegen.h, "numerics"): + - * /
 * sqrt round as the interpreter's f64-then-round does, rsqrt is computed
 * in f64 and rounded once, and float sums carry their rounding errors
 * (hi + lo pairs), so sums, means, variances, rms_norm and layer_norm are
 * the interpreter's f32 results nearly always. What is left: the f32 math
 * functions (exp, tanh, sigmoid, erf, ...) are within a few ulp, not
 * correctly rounded, and an f16/bf16 result of a function is rounded from
 * f32 rather than from f64. Where such an ulp flips the rounding of a
 * bf16 intermediate (a softmax probability, a silu gate: a few elements in
 * a million), the flip is one bf16 ulp (2^-8 relative) and travels
 * through every later layer: a matmul sums it into a row, a softmax over
 * 1000 keys and the next rms_norm pass it on, and each later bf16 rounding
 * can flip again. So a deep bf16 output is allowed a few ulps at the
 * tensor's scale: atol 4e-2 = about five bf16 ulps of rms(want), rtol 1e-2
 * about one ulp of the element. f16 (about two ulps) and f32 (1e-5, about
 * 80 ulps, for chains of few-ulp math functions) keep plain values: the
 * deep f32 traces of the corpus (the PyTorch Llama and GPT-2 exports) stay
 * under a tenth of them. Measured (B,T = 1,1 / 3,17 / 17,3 / 1,1000 over
 * tests/traces): every output passes, most bit-exact; the worst
 * is the two-layer bf16 Llama at T=1000, 0.26 to 0.55 of this tolerance
 * over seeds 0 to 3 (it was 1.58 before rsqrt and sums were made to round
 * once). The worst element (largest error relative to its tolerance) is
 * printed with its output and flat index.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <unistd.h>

#include "comm.h"
#include "cuda_target.h"
#include "exec.h"
#include "target.h"
#include "ir.h"
#include "numeric.h"
#include "tool.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* --iters: a benchmark's loop, not a way to run for centuries */
#define MAX_ITERS 10000000
#define STR_(x) #x
#define STR(x) STR_(x)

static int cmd_check(int argc, char **argv);
static int cmd_run(int argc, char **argv);

const fz_command fz_cmd_check = {"check", "parse and verify trace files",
	cmd_check,
	 "usage: fusec check FILE...\n"
	 "\n"
	 "Parse and verify each trace file ('-' reads standard input). Prints\n"
	 "nothing and exits 0 when every file is fine; otherwise prints each\n"
	 "diagnostic as FILE:LINE:COL: error: MESSAGE with the source line and\n"
	 "a caret, and exits 1.\n"};

const fz_command fz_cmd_run = {"run", "run a trace on random inputs", cmd_run,
	 "usage: fusec run FILE [--device auto|cuda|cpu|emu] [--bind B=8,T=2048]\n"
	 "                      [--seed N] [--iters N] [--check] [--json]\n"
	 "                      [--cache-dir DIR] [--no-cache] [--world N]\n"
	 "                      [--timeout S] [--graph]\n"
	 "\n"
	 "Run every trace of FILE on random inputs: floats from a normal\n"
	 "distribution, index inputs within the extent they index, bools both\n"
	 "ways.\n"
	 "\n"
	 "  --device D   auto (default), cuda, cpu or emu: cpu runs generated host\n"
	 "               code; auto is cpu where there is no CUDA runtime; emu\n"
	 "               runs the GPU's kernels on the CPU, each access checked\n"
	 "               (bounds, shared-memory races, shuffles, barriers; see\n"
	 "               FUSEC_EMU_* in runtime/emu.c)\n"
	 "  --bind LIST  sizes of symbolic extents, NAME=SIZE[,NAME=SIZE...]\n"
	 "  --seed N     seed of the random inputs (default 0)\n"
	 "  --iters N    run N times and report the time per iteration (1; at\n"
	 "               most 10000000)\n"
	 "  --check      compare every output with the reference interpreter;\n"
	 "               print the worst error and exit 1 on a mismatch\n"
	 "  --json       print one JSON object: device, ok, max_abs_err,\n"
	 "               max_rel_err, seconds_per_iter, worst_output,\n"
	 "               worst_index, compiled, cache_hits, unique,\n"
	 "               host_syncs_in_steps (host synchronizations the target\n"
	 "               made inside the runs; the contract is 0), graph\n"
	 "  --cache-dir DIR  the kernel cache (default $FUSEC_CACHE_DIR, else\n"
	 "               $XDG_CACHE_HOME/fusec, else ~/.cache/fusec); kernels\n"
	 "               found there are linked, not compiled\n"
	 "  --no-cache   use no disk cache: compile every distinct kernel\n"
	 "  --world N    run N ranks (a trace declared `world N`; default: the\n"
	 "               world the trace declares): on the CPU, N threads with\n"
	 "               exact collectives; on CUDA, rank r on device r, its\n"
	 "               collectives through NCCL on a communication stream\n"
	 "               (N = 1 included); each rank gets its own inputs (seed\n"
	 "               + rank), and --check compares every rank's outputs with\n"
	 "               the interpreter running all N ranks\n"
	 "  --timeout S  a rank that does not join a collective within S seconds\n"
	 "               (default 60) fails the run, naming the rank\n"
	 "  --graph      on CUDA: capture the first run on a stream into a CUDA\n"
	 "               graph and replay the graph for every iteration (captured\n"
	 "               again only if the pointers changed); --json adds\n"
	 "               graph_captures and graph_launches. Other devices refuse\n"
	 "               it (exit 1)\n"};

static int cmd_check(int argc, char **argv)
{
	const fz_command *c = &fz_cmd_check;
	int files = 0, bad = 0;
	for (int i = 1; i < argc; i++) {
		if (argv[i][0] == '-' && argv[i][1])
			return tool_usage_error(c, "unknown option '%s'", argv[i]);
		files++;
		fz_module *m = tool_load(argv[i]);
		if (!m)
			bad++;
		fz_module_free(m);
	}
	if (!files)
		return tool_usage_error(c, "no FILE given%s", "");
	return bad ? EXIT_BAD : 0;
}

/* ---- run ---- */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (rng_next(s) >> 11) * 0x1p-53; }

/* Two independent normal values (Box-Muller: both of its outputs, one log
 * and one sincos for two, where the cosine's alone took a third of a
 * large input's making) */
static void rng_normal2(uint64_t *s, double out[2])
{
	double u = rng_unit(s), v = rng_unit(s);
	double r = sqrt(-2.0 * log(u + 0x1p-60)), a = 2.0 * M_PI * v;
	out[0] = r * cos(a);
	out[1] = r * sin(a);
}

/* The values that are p seen another way: p, and what meta ops, casts,
 * collectives and waits make of them, and a where that picks between p and
 * something else (an ignore_index masked to 0 before a take_along, as a
 * cross-entropy exports it). NULL when out of memory. */
static char *same_data(const fz_trace *t, const fz_value *p)
{
	char *reach = calloc((size_t)t->n_values, 1);
	if (!reach)
		return NULL;
	reach[p->id] = 1;
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		fz_opclass cls = fz_ops[nd->op].cls;
		bool passes = cls == FZ_CLASS_META || nd->op == FZ_OP_CAST ||
			      cls == FZ_CLASS_COLLECTIVE || cls == FZ_CLASS_WAIT;
		for (int k = 0; passes && k < nd->n_in; k++)
			if (reach[nd->in[k]->id])
				reach[nd->out[0]->id] = 1;
		if (nd->op == FZ_OP_WHERE && (reach[nd->in[1]->id] || reach[nd->in[2]->id]))
			reach[nd->out[0]->id] = 1;
	}
	return reach;
}

/* The exclusive bound of the values an integer parameter may take: the
 * smallest extent it indexes (as the index operand of take, take_along or
 * index_add); 0 if it indexes nothing. */
static int64_t index_bound(const fz_trace *t, const fz_value *p,
			   const int64_t *syms)
{
	char *reach = same_data(t, p);
	int64_t bound = 0;
	for (int i = 0; reach && i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		if (fz_ops[nd->op].cls != FZ_CLASS_INDEXING || !reach[nd->in[1]->id])
			continue;
		int64_t e = fz_value_extent(nd->in[0], nd->attrs.dim, syms);
		if (e >= 0 && (bound == 0 || e < bound))
			bound = e;
	}
	free(reach);
	return bound;
}

/* The scale of a float parameter: 1/sqrt(K) where it is an operand of a
 * matmul or linear contracting over K, as initializers scale weights; else
 * 1. Unscaled weights make every layer multiply magnitudes by sqrt(K), and
 * the comparison with the reference would then judge rounding noise blown
 * up by the model. */
static double weight_scale(const fz_trace *t, const fz_value *p,
			   const int64_t *syms)
{
	char *reach = same_data(t, p);
	int64_t K = 0;
	for (int i = 0; reach && i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		if (fz_ops[nd->op].cls != FZ_CLASS_LIBRARY ||
		    !(reach[nd->in[0]->id] || reach[nd->in[1]->id]))
			continue;
		const fz_value *a = nd->in[0];
		int64_t e = fz_value_extent(a, a->type.rank - 1, syms);
		if (e > K)
			K = e;
	}
	free(reach);
	return K > 1 ? 1.0 / sqrt((double)K) : 1.0;
}

/* A buffer for a run's input or output: 64-byte aligned, with 64 bytes to
 * spare, as PyTorch's CPU allocator gives (a large one: a page + 64), so
 * that every large input and output starts at one offset in its page and
 * a kernel that writes one while it reads another is not timed at the
 * mercy of 4K aliasing (ir/memplan.c). Inputs had come from malloc (a page
 * + 16), 48 bytes behind the outputs: a bf16 rms_norm 4096x4096 on one
 * thread took 9.1 ms, 6.5 with this (medians of 5). */
static void *run_buffer(size_t bytes)
{
	return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

static int make_inputs(const fz_trace *t, const int64_t *syms, uint64_t seed,
		       fz_tensor *in)
{
	uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
	for (int i = 0; i < t->n_params; i++) {
		const fz_value *p = t->params[i];
		fz_tensor *x = &in[i];
		size_t n = 1;
		x->dtype = p->type.dtype;
		x->rank = p->type.rank;
		for (int d = x->rank - 1; d >= 0; d--) {
			x->shape[d] = fz_value_extent(p, d, syms);
			x->strides[d] = (int64_t)n;
			if (x->shape[d] < 0 ||
			    __builtin_mul_overflow(n, (size_t)x->shape[d], &n)) {
				fprintf(stderr, "fusec run: input '%s' is too large\n", p->name);
				return -1;
			}
		}
		x->data = run_buffer(n * fz_dtype_size(x->dtype));
		if (!x->data) {
			fprintf(stderr, "fusec run: out of memory for input '%s'\n", p->name);
			return -1;
		}
		int64_t bound = fz_dtype_is_int(x->dtype) ? index_bound(t, p, syms) : 0;
		double scale = fz_dtype_is_float(x->dtype) ? weight_scale(t, p, syms) : 1;
		double pair[2];
		for (size_t k = 0; k < n; k++) {
			double v;
			if (fz_dtype_is_float(x->dtype)) {
				if (k % 2 == 0)
					rng_normal2(&s, pair);
				v = pair[k % 2] * scale;
			} else if (x->dtype == FZ_BOOL)
				v = rng_next(&s) & 1;
			else if (bound > 0)
				v = (double)(rng_next(&s) % (uint64_t)bound);
			else if (x->dtype == FZ_U8)
				v = (double)(rng_next(&s) % 256);
			else
				v = (double)(int64_t)(rng_next(&s) % 17) - 8;
			fz_store_f64(x->data, x->dtype, (int64_t)k, v);
		}
	}
	return 0;
}

typedef struct run_opts {
	const char *device;
	tool_binding binds[FZ_MAX_SYMS];
	int n_binds;
	uint64_t seed;
	long iters;
	bool check, json;
	const char *cache_dir;  /* --cache-dir */
	bool no_cache;          /* --no-cache */
	int world;              /* --world, 0: the trace's */
	double timeout;         /* --timeout */
	int compiled, cache_hits, unique; /* kernels, summed over the traces */
	double setup_seconds;   /* preparing: plan, kernels, arena */
	long host_syncs;        /* host synchronizations inside steps */
	char ran_on[16];        /* the target that ran */
	bool graph;             /* --graph */
	int captures, replays;  /* graphs captured and launched, summed */
} run_opts;

/* What --check found over every output of every trace. */
typedef struct check_result {
	bool ok;
	double max_abs, max_rel, worst_ratio;
	char worst[160];   /* "trace.output[index]" */
	double worst_got, worst_want;
	int64_t worst_index;
	char worst_output[96];
} check_result;

static void tolerance(fz_dtype d, double *rtol, double *atol)
{
	switch (d) {
	case FZ_F64: *rtol = *atol = 1e-9; break;
	case FZ_F32: *rtol = *atol = 1e-5; break;
	case FZ_F16: *rtol = 1e-3; *atol = 2e-3; break;
	case FZ_BF16: *rtol = 1e-2; *atol = 4e-2; break;
	default: *rtol = *atol = 0; break;
	}
}

static void compare(const fz_trace *t, int k, const fz_tensor *got,
		    const fz_tensor *want, check_result *c)
{
	int64_t n = 1;
	for (int d = 0; d < want->rank; d++)
		n *= want->shape[d];
	double rtol, atol;
	tolerance(want->dtype, &rtol, &atol);
	const fz_value *v = fz_trace_output(t, k);
	double ss = 0;
	int64_t nf = 0;
	for (int64_t i = 0; i < n; i++) {
		double w = fz_load_f64(want->data, want->dtype, i);
		if (isfinite(w)) {
			ss += w * w;
			nf++;
		}
	}
	double rms = nf ? sqrt(ss / (double)nf) : 0;
	atol *= rms > 1 ? rms : 1;
	for (int64_t i = 0; i < n; i++) {
		double g = fz_load_f64(got->data, got->dtype, i);
		double w = fz_load_f64(want->data, want->dtype, i);
		double ae, re;
		if (isnan(g) && isnan(w))
			continue;
		if (isinf(w) || isinf(g))
			ae = g == w ? 0 : INFINITY;
		else
			ae = fabs(g - w);
		re = ae == 0 ? 0 : ae / fmax(fabs(w), 1e-30);
		if (isnan(g) != isnan(w))
			ae = re = INFINITY;
		double lim = atol + rtol * fabs(w);
		double ratio = ae == 0 ? 0 : lim > 0 ? ae / lim : INFINITY;
		if (ae > c->max_abs)
			c->max_abs = ae;
		if (re > c->max_rel && fabs(w) > atol)
			c->max_rel = re;
		if (ratio > 1)
			c->ok = false;
		if (ratio > c->worst_ratio) {
			c->worst_ratio = ratio;
			c->worst_got = g;
			c->worst_want = w;
			c->worst_index = i;
			snprintf(c->worst_output, sizeof c->worst_output, "%s.%s",
				 fz_trace_name(t), fz_value_name(v) ? fz_value_name(v) : "?");
		}
	}
}

static int run_trace_world(const fz_trace *t, run_opts *o, int world,
			   const int64_t *syms, double *spi, check_result *cr);

static void on_notice(void *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "fusec run: %s\n", msg);
}

static int64_t tensor_numel(const fz_tensor *x)
{
	int64_t n = 1;
	for (int d = 0; d < x->rank; d++)
		n *= x->shape[d];
	return n;
}

/* Contiguous, 64-byte-aligned output buffers at the bound sizes. */
static int make_outputs(const fz_trace *t, const int64_t *syms, fz_tensor *out)
{
	for (int k = 0; k < fz_trace_output_count(t); k++) {
		const fz_value *v = fz_trace_output(t, k);
		int64_t shape[FZ_MAX_RANK], n = 1;
		for (int d = 0; d < fz_value_rank(v); d++)
			n *= shape[d] = fz_value_extent(v, d, syms);
		size_t bytes = (size_t)n * fz_dtype_size(fz_value_dtype(v));
		fz_tensor_contiguous(&out[k], run_buffer(bytes), fz_value_dtype(v),
				     fz_value_rank(v), shape);
		if (!out[k].data)
			return -1;
		/* touched here, in set-up: a fresh page's first touch is not the
		 * run's (200 MB of outputs, an AdamW step's, took longer to fault
		 * in than the kernels took to fill, all in the first iteration) */
		memset(out[k].data, 0, bytes);
	}
	return 0;
}

/* Runs one trace; adds its time per iteration to *spi. */
static int run_trace(const fz_trace *t, run_opts *o, double *spi, check_result *cr)
{
	int64_t syms[FZ_MAX_SYMS];
	int n_in = fz_trace_param_count(t), n_out = fz_trace_output_count(t);
	tool_bind_symbols(t, o->binds, o->n_binds, syms);
	char msg[300];
	if (fz_trace_syms_derive(t, syms, msg, sizeof msg) < 0) {
		fprintf(stderr, "fusec run: trace '%s': %s\n", fz_trace_name(t), msg);
		return EXIT_BAD;
	}
	for (int s = 0; s < fz_trace_symbol_count(t); s++) {
		if (syms[s] < 0) {
			fprintf(stderr, "fusec run: trace '%s': symbol '%s' is unbound: "
				"bind it with --bind %s=SIZE\n", fz_trace_name(t),
				fz_trace_symbol(t, s), fz_trace_symbol(t, s));
			return EXIT_BAD;
		}
	}
	int world = fz_trace_world(t);
	if (o->world && o->world != world) {
		fprintf(stderr, "fusec run: trace '%s' is written for world %d (its "
			"collectives gather and scatter over %d ranks); --world %d does "
			"not match\n", fz_trace_name(t), world, world, o->world);
		return EXIT_BAD;
	}
	/* --world 1 on CUDA (or auto) too: the ranks' path, through NCCL */
	if (world > 1 || (o->world && strcmp(o->device, "cpu") && strcmp(o->device, "emu")))
		return run_trace_world(t, o, world, syms, spi, cr);
	fz_tensor *in = calloc((size_t)n_in + 1, sizeof *in);
	fz_tensor *out = calloc((size_t)n_out + 1, sizeof *out);
	fz_tensor *ref = calloc((size_t)n_out + 1, sizeof *ref);
	/* on a GPU: device copies of the inputs, device outputs */
	fz_tensor *din = calloc((size_t)n_in + 1, sizeof *din);
	fz_tensor *dout = calloc((size_t)n_out + 1, sizeof *dout);
	fz_device *dev = NULL;
	int rc = EXIT_BAD;
	char *err = NULL;
	fz_exec *x = NULL;
	void *stream = NULL; /* --graph: a stream of ours (NULL: the default) */
	if (!in || !out || !ref || !din || !dout ||
	    make_inputs(t, syms, o->seed, in) < 0 || make_outputs(t, syms, out) < 0)
		goto done;
	fz_exec_options xo;
	fz_exec_options_init(&xo);
	xo.disk_cache = !o->no_cache;
	xo.cache_dir = o->cache_dir;
	xo.warn = on_notice;
	xo.max_plans = 1;
	if (fz_exec_new(t, o->device, &xo, &x, &err) != FZ_OK)
		goto fail;
	snprintf(o->ran_on, sizeof o->ran_on, "%s", fz_exec_device(x));
	dev = fz_exec_dev(x);
	if (o->graph && !dev->tg->capture_begin) {
		err = fz_strdup_printf("--graph: device '%s' cannot capture a run into a "
				       "graph (CUDA graphs: --device cuda)", o->ran_on);
		goto fail;
	}
	if (o->graph && fz_cuda_stream_new(dev, &stream, &err) != FZ_OK)
		goto fail;
	bool on_dev = !dev->tg->host_memory;
	for (int k = 0; on_dev && k < n_in + n_out; k++) {
		const fz_tensor *h = k < n_in ? &in[k] : &out[k - n_in];
		fz_tensor *d = k < n_in ? &din[k] : &dout[k - n_in];
		*d = *h;
		d->data = NULL;
		size_t bytes = (size_t)tensor_numel(h) * fz_dtype_size(h->dtype);
		if (dev->tg->alloc(dev, bytes, &d->data, &err) != FZ_OK ||
		    (k < n_in && dev->tg->upload(dev, d->data, h->data, bytes, stream,
						 &err) != FZ_OK))
			goto fail;
	}
	const fz_tensor *rin = on_dev ? din : in;
	fz_tensor *rout = on_dev ? dout : out;
	/* set-up (plan, kernels, arena) apart from the runs it serves */
	double t0 = tool_now();
	if (fz_exec_prepare(x, syms, rin, n_in, &err) != FZ_OK)
		goto fail;
	double setup = tool_now() - t0;
	/* on CUDA the time per iteration is the device's, between events */
	bool events = !strcmp(dev->tg->name, "cuda");
	if (events && fz_cuda_timer(dev, stream, false, NULL, &err) != FZ_OK)
		goto fail;
	t0 = tool_now();
	for (long it = 0; it < o->iters; it++)
		if ((o->graph ? fz_exec_run_graph(x, syms, rin, n_in, rout, n_out, stream,
						  &err)
			      : fz_exec_run(x, syms, rin, n_in, rout, n_out, NULL, &err)) !=
		    FZ_OK)
			goto fail;
	double ms = 0;
	if (events && fz_cuda_timer(dev, stream, true, &ms, &err) != FZ_OK)
		goto fail;
	/* a device error (an index out of range) is reported by the sync */
	if (fz_exec_sync(x, stream, &err) != FZ_OK)
		goto fail;
	double per = (events ? ms * 1e-3 : tool_now() - t0) / (double)o->iters;
	*spi += per;
	for (int k = 0; on_dev && k < n_out; k++)
		if (dev->tg->download(dev, out[k].data, dout[k].data,
				      (size_t)tensor_numel(&out[k]) *
				      fz_dtype_size(out[k].dtype), stream, &err) != FZ_OK)
			goto fail;
	if (o->check) {
		fz_status st = fz_trace_interpret(t, syms, in, n_in, ref, n_out, &err);
		if (st != FZ_OK)
			goto fail;
		for (int k = 0; k < n_out; k++)
			compare(t, k, &out[k], &ref[k], cr);
	}
	const fz_exec_stats *es = fz_exec_stats_of(x);
	o->host_syncs += fz_exec_host_syncs(x);
	o->captures += es->graph_captures;
	o->replays += es->graph_launches;
	o->compiled += es->k.compiled;
	o->cache_hits += es->k.cache_hits;
	o->unique += es->k.unique;
	o->setup_seconds += setup;
	if (!o->json) {
		printf("trace %s: %d output%s, %.3f ms per iteration on the %s from "
		       "generated code (%d regions, %d launches, %d kernel keys: %d "
		       "compiled, %d cache hits; set-up %.1f ms%s)\n",
		       fz_trace_name(t), n_out, n_out == 1 ? "" : "s", per * 1e3,
		       o->ran_on, es->regions, es->launches, es->k.unique,
		       es->k.compiled, es->k.cache_hits, setup * 1e3,
		       es->k.unsupported ? ", some regions run per op" : "");
		if (o->graph)
			printf("  as a CUDA graph: captured %d time%s, launched %d times\n",
			       es->graph_captures, es->graph_captures == 1 ? "" : "s",
			       es->graph_launches);
		for (int k = 0; k < n_out; k++) {
			const fz_value *v = fz_trace_output(t, k);
			char ty[256];
			printf("  %s: %s\n", fz_value_name(v) ? fz_value_name(v) : "?",
			       fz_type_str(t, &v->type, ty, sizeof ty));
		}
	}
	rc = 0;
	goto done;
fail:
	fprintf(stderr, "fusec run: trace '%s': %s\n", fz_trace_name(t),
		err ? err : "failed");
done:
	if (stream)
		fz_cuda_stream_free(dev, stream);
	for (int k = 0; dev && din && k < n_in; k++)
		dev->tg->release(dev, din[k].data);
	for (int k = 0; dev && dout && k < n_out; k++)
		dev->tg->release(dev, dout[k].data);
	free(din);
	free(dout);
	fz_exec_free(x);
	for (int k = 0; in && k < n_in; k++)
		free(in[k].data);
	for (int k = 0; out && k < n_out; k++)
		free(out[k].data);
	for (int k = 0; ref && k < n_out; k++)
		fz_free(ref[k].data);
	free(in);
	free(out);
	free(ref);
	fz_free(err);
	return rc;
}

/* ---- N ranks on threads ---- */

typedef struct rank_job {
	const fz_trace *t;
	run_opts *o;
	fz_comm *comm;
	const char *idpath;   /* the NCCL id's file (CUDA ranks) */
	int rank;
	const int64_t *syms;
	fz_tensor *in, *out;
	fz_status st;
	char *err;
	fz_exec_stats stats;
	double seconds;
	long host_syncs;      /* inside the runs' steps: 0 */
} rank_job;

static void quiet(void *ctx, const char *msg)
{
	(void)ctx;
	(void)msg;
}

/* Rank j->rank on CUDA device j->rank: its inputs copied to the device,
 * NCCL joined through the id file once every rank is prepared (so no rank
 * gives NCCL work that a failed rank would never match), the runs, the
 * outputs copied back. */
static fz_status rank_cuda(rank_job *j, fz_exec *x, int n_in, int n_out)
{
	fz_device *dev = fz_exec_dev(x);
	int world = fz_comm_world(j->comm);
	fz_tensor *din = calloc((size_t)n_in + 1, sizeof *din);
	fz_tensor *dout = calloc((size_t)n_out + 1, sizeof *dout);
	struct fz_nccl *nc = NULL;
	void *stream = NULL; /* --graph: a stream of this rank's */
	fz_status st = din && dout ? FZ_OK : FZ_ENOMEM;
	if (st == FZ_OK && j->o->graph)
		st = fz_cuda_stream_new(dev, &stream, &j->err);
	for (int k = 0; st == FZ_OK && k < n_in + n_out; k++) {
		const fz_tensor *h = k < n_in ? &j->in[k] : &j->out[k - n_in];
		fz_tensor *d = k < n_in ? &din[k] : &dout[k - n_in];
		*d = *h;
		d->data = NULL;
		size_t bytes = (size_t)tensor_numel(h) * fz_dtype_size(h->dtype);
		st = dev->tg->alloc(dev, bytes, &d->data, &j->err);
		if (st == FZ_OK && k < n_in)
			st = dev->tg->upload(dev, d->data, h->data, bytes, stream, &j->err);
	}
	if (st == FZ_OK)
		st = fz_exec_prepare(x, j->syms, din, n_in, &j->err);
	if (st == FZ_OK)
		st = fz_comm_barrier(j->comm, j->rank, &j->err);
	unsigned char id[FZ_NCCL_ID_BYTES];
	if (st == FZ_OK)
		st = fz_nccl_bootstrap_file(j->rank, j->idpath, j->o->timeout, id, &j->err);
	if (st == FZ_OK)
		st = fz_cuda_nccl_new(dev, world, j->rank, id, j->o->timeout, &nc, &j->err);
	if (st == FZ_OK)
		fz_comm_set_nccl(j->comm, j->rank, nc);
	double t0 = tool_now();
	for (long it = 0; it < j->o->iters && st == FZ_OK; it++)
		st = j->o->graph ? fz_exec_run_graph(x, j->syms, din, n_in, dout, n_out,
						     stream, &j->err)
				 : fz_exec_run(x, j->syms, din, n_in, dout, n_out, NULL,
					       &j->err);
	j->host_syncs = fz_exec_host_syncs(x);
	/* every rank has queued all its work: else a peer failed (or this
	 * rank did), and NCCL is aborted rather than its collectives waited
	 * for by a sync that would never return */
	if (st == FZ_OK)
		st = fz_comm_barrier(j->comm, j->rank, &j->err);
	if (st != FZ_OK && nc) {
		fz_comm_abort(j->comm, j->rank, j->err ? j->err : fz_status_name(st));
		fz_comm_set_nccl(j->comm, j->rank, NULL);
		fz_cuda_nccl_abort(dev, nc);
		nc = NULL;
	}
	if (st == FZ_OK)
		st = fz_exec_sync(x, stream, &j->err);
	j->seconds = (tool_now() - t0) / (double)j->o->iters;
	for (int k = 0; st == FZ_OK && k < n_out; k++)
		st = dev->tg->download(dev, j->out[k].data, dout[k].data,
				       (size_t)tensor_numel(&j->out[k]) *
				       fz_dtype_size(j->out[k].dtype), stream, &j->err);
	if (stream)
		fz_cuda_stream_free(dev, stream);
	if (nc) {
		fz_comm_set_nccl(j->comm, j->rank, NULL);
		fz_cuda_nccl_free(dev, nc);
	}
	for (int k = 0; din && k < n_in; k++)
		dev->tg->release(dev, din[k].data);
	for (int k = 0; dout && k < n_out; k++)
		dev->tg->release(dev, dout[k].data);
	free(din);
	free(dout);
	if (st == FZ_ENOMEM && !j->err)
		j->err = fz_strdup("out of memory");
	return st;
}

static void *rank_main(void *arg)
{
	rank_job *j = arg;
	int n_in = fz_trace_param_count(j->t), n_out = fz_trace_output_count(j->t);
	fz_exec *x = NULL;
	fz_exec_options xo;
	fz_exec_options_init(&xo);
	xo.disk_cache = !j->o->no_cache;
	xo.cache_dir = j->o->cache_dir;
	xo.warn = j->rank ? quiet : on_notice; /* one notice, not one per rank */
	xo.max_plans = 1;
	xo.device = j->rank; /* on GPUs: one device per rank */
	j->st = fz_exec_new(j->t, j->o->device, &xo, &x, &j->err);
	if (j->st != FZ_OK) {
		fz_comm_abort(j->comm, j->rank, j->err ? j->err : "could not start");
		return NULL;
	}
	const char *on = fz_exec_device(x);
	if (strcmp(on, "cpu") && strcmp(on, "cuda")) {
		j->err = fz_strdup_printf("--world %d: ranks run on the cpu (emulated) "
					  "or on CUDA devices through NCCL, not on '%s'",
					  fz_comm_world(j->comm), on);
		j->st = FZ_EUNSUPPORTED;
		fz_comm_abort(j->comm, j->rank, j->err);
		fz_exec_free(x);
		return NULL;
	}
	if (!j->rank)
		snprintf(j->o->ran_on, sizeof j->o->ran_on, "%s", on);
	if (j->o->graph && !fz_exec_dev(x)->tg->capture_begin) {
		j->err = fz_strdup_printf("--graph: device '%s' cannot capture a run "
					  "into a graph (CUDA graphs: --device cuda)", on);
		j->st = FZ_EUNSUPPORTED;
		fz_comm_abort(j->comm, j->rank, j->err);
		fz_exec_free(x);
		return NULL;
	}
	fz_exec_set_comm(x, j->comm, j->rank);
	if (!strcmp(on, "cuda")) {
		j->st = rank_cuda(j, x, n_in, n_out);
	} else {
		j->st = fz_exec_prepare(x, j->syms, j->in, n_in, &j->err);
		double t0 = tool_now();
		for (long it = 0; it < j->o->iters && j->st == FZ_OK; it++)
			j->st = fz_exec_run(x, j->syms, j->in, n_in, j->out, n_out, NULL,
					    &j->err);
		if (j->st == FZ_OK)
			j->st = fz_exec_sync(x, NULL, &j->err);
		j->seconds = (tool_now() - t0) / (double)j->o->iters;
		j->host_syncs = fz_exec_host_syncs(x);
	}
	if (j->st != FZ_OK)
		fz_comm_abort(j->comm, j->rank, j->err ? j->err : fz_status_name(j->st));
	j->stats = *fz_exec_stats_of(x);
	fz_exec_free(x);
	return NULL;
}

static int run_trace_world(const fz_trace *t, run_opts *o, int world,
			   const int64_t *syms, double *spi, check_result *cr)
{
	int n_in = fz_trace_param_count(t), n_out = fz_trace_output_count(t);
	size_t W = (size_t)world;
	fz_tensor *in = calloc(W * (size_t)n_in + 1, sizeof *in);
	fz_tensor *out = calloc(W * (size_t)n_out + 1, sizeof *out);
	fz_tensor *ref = calloc(W * (size_t)n_out + 1, sizeof *ref);
	rank_job *jobs = calloc(W, sizeof *jobs);
	pthread_t *th = calloc(W, sizeof *th);
	bool *started = calloc(W, sizeof *started);
	fz_comm *comm = NULL;
	char *err = NULL;
	char idpath[64] = "";
	int rc = EXIT_BAD;
	if (!in || !out || !ref || !jobs || !th || !started) {
		fprintf(stderr, "fusec run: out of memory\n");
		goto done;
	}
	for (int r = 0; r < world; r++)
		if (make_inputs(t, syms, o->seed + (uint64_t)r * 1000003u,
				in + (size_t)r * (size_t)n_in) < 0 ||
		    make_outputs(t, syms, out + (size_t)r * (size_t)n_out) < 0)
			goto done;
	if (fz_comm_new(world, o->timeout, &comm) != FZ_OK) {
		fprintf(stderr, "fusec run: out of memory\n");
		goto done;
	}
	/* where the ranks are CUDA devices, rank 0 publishes NCCL's id here */
	char iddir[] = "/tmp/fusec-nccl-XXXXXX";
	if (!mkdtemp(iddir)) {
		fprintf(stderr, "fusec run: cannot make a folder for the NCCL id: %s\n",
			strerror(errno));
		goto done;
	}
	snprintf(idpath, sizeof idpath, "%s/id", iddir);
	for (int r = 0; r < world; r++) {
		jobs[r] = (rank_job){t, o, comm, idpath, r, syms,
				     in + (size_t)r * (size_t)n_in,
				     out + (size_t)r * (size_t)n_out, FZ_OK, NULL, {0}, 0, 0};
		if (pthread_create(&th[r], NULL, rank_main, &jobs[r]) != 0) {
			fz_comm_abort(comm, r, "could not start its thread");
			break;
		}
		started[r] = true;
	}
	bool failed = false;
	for (int r = 0; r < world; r++) {
		if (started[r])
			pthread_join(th[r], NULL);
		failed |= !started[r] || jobs[r].st != FZ_OK;
	}
	if (failed) {
		/* the cause first: a rank's own error, then those it took down */
		for (int pass = 0; pass < 2; pass++)
			for (int r = 0; r < world; r++) {
				const char *e = jobs[r].err ? jobs[r].err :
						!started[r] ? "not started" : NULL;
				if (!e || (jobs[r].st == FZ_OK && started[r]))
					continue;
				bool echo = strstr(e, "gave up") != NULL;
				if (echo == (pass == 1))
					fprintf(stderr, "fusec run: trace '%s': rank %d: %s\n",
						fz_trace_name(t), r, e);
			}
		goto done;
	}
	double per = 0;
	for (int r = 0; r < world; r++)
		if (jobs[r].seconds > per)
			per = jobs[r].seconds;
	*spi += per;
	if (o->check) {
		fz_status st = fz_trace_interpret_world(t, syms, world, in, n_in, ref,
							n_out, &err);
		if (st != FZ_OK) {
			fprintf(stderr, "fusec run: trace '%s': the interpreter: %s\n",
				fz_trace_name(t), err ? err : fz_status_name(st));
			goto done;
		}
		for (int r = 0; r < world; r++)
			for (int k = 0; k < n_out; k++)
				compare(t, k, &out[(size_t)r * (size_t)n_out + (size_t)k],
					&ref[(size_t)r * (size_t)n_out + (size_t)k], cr);
	}
	long syncs = 0;
	for (int r = 0; r < world; r++) {
		o->captures += jobs[r].stats.graph_captures;
		o->replays += jobs[r].stats.graph_launches;
		o->compiled += jobs[r].stats.k.compiled;
		o->cache_hits += jobs[r].stats.k.cache_hits;
		syncs += jobs[r].host_syncs;
	}
	o->unique += jobs[0].stats.k.unique;
	o->setup_seconds += jobs[0].stats.prepare_seconds;
	o->host_syncs += syncs;
	bool gpus = !strcmp(o->ran_on, "cuda");
	if (!o->json)
		printf("trace %s: world %d, %d ranks %s: %.3f ms per iteration (%d "
		       "regions, %d kernel keys; %ld host synchronizations inside the "
		       "steps)\n", fz_trace_name(t), world, world, gpus ?
		       "on CUDA devices 0.. (NCCL, a communication stream each)" :
		       "on the cpu (threads, exact collectives)", per * 1e3,
		       jobs[0].stats.regions, jobs[0].stats.k.unique, syncs);
	rc = 0;
done:
	for (size_t i = 0; in && i < W * (size_t)n_in; i++)
		free(in[i].data);
	for (size_t i = 0; out && i < W * (size_t)n_out; i++)
		free(out[i].data);
	for (size_t i = 0; ref && i < W * (size_t)n_out; i++) {
		bool dup = false; /* a value returned twice is one buffer per rank */
		for (size_t j = i - i % (size_t)(n_out ? n_out : 1); j < i && !dup; j++)
			dup = ref[j].data == ref[i].data;
		if (!dup)
			fz_free(ref[i].data);
	}
	for (int r = 0; jobs && r < world; r++)
		fz_free(jobs[r].err);
	free(in);
	free(out);
	free(ref);
	free(jobs);
	free(th);
	free(started);
	fz_comm_free(comm);
	if (idpath[0]) {
		unlink(idpath);
		*strrchr(idpath, '/') = 0;
		rmdir(idpath);
	}
	fz_free(err);
	return rc;
}

static int cmd_run(int argc, char **argv)
{
	const fz_command *c = &fz_cmd_run;
	run_opts o = {.device = "auto", .iters = 1};
	const char *file = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_next = i + 1 < argc;
		if (!strcmp(a, "--check")) {
			o.check = true;
		} else if (!strcmp(a, "--graph")) {
			o.graph = true;
		} else if (!strcmp(a, "--no-cache")) {
			o.no_cache = true;
		} else if (!strcmp(a, "--cache-dir") && has_next) {
			o.cache_dir = argv[++i];
		} else if (!strcmp(a, "--json")) {
			o.json = true;
		} else if (!strcmp(a, "--world") && has_next) {
			char *end;
			long w = strtol(argv[++i], &end, 10);
			if (*end || w < 1 || w > 4096)
				return tool_usage_error(c, "bad world size '%s' (1 to 4096)",
						   argv[i]);
			o.world = (int)w;
		} else if (!strcmp(a, "--timeout") && has_next) {
			char *end;
			double v = strtod(argv[++i], &end);
			if (*end || !(v > 0) || v > 86400)
				return tool_usage_error(c, "bad timeout '%s' (seconds)", argv[i]);
			o.timeout = v;
		} else if (!strcmp(a, "--device") && has_next) {
			o.device = argv[++i];
			if (strcmp(o.device, "auto") && strcmp(o.device, "cuda") &&
			    !fz_target_find(o.device))
			{
				char msg[160];
				snprintf(msg, sizeof msg, "--device must be auto, cuda or "
					 "one of %s, not '%%s'", fz_target_names());
				return tool_usage_error(c, msg, o.device);
			}
		} else if (!strcmp(a, "--bind") && has_next) {
			if (tool_bind_option(c, argv[++i], o.binds, &o.n_binds))
				return EXIT_USAGE;
		} else if ((!strcmp(a, "--seed") || !strcmp(a, "--iters")) && has_next) {
			char *end;
			errno = 0;
			long long v = strtoll(argv[++i], &end, 10);
			if (!isdigit((unsigned char)argv[i][0]) || *end || errno ||
			    (a[2] == 'i' && v < 1))
				return tool_usage_error(c, "bad number '%s'", argv[i]);
			if (a[2] == 'i' && v > MAX_ITERS)
				return tool_usage_error(c, "--iters %s: at most "
							STR(MAX_ITERS) " runs", argv[i]);
			if (a[2] == 's')
				o.seed = (uint64_t)v;
			else
				o.iters = (long)v;
		} else if (a[0] == '-' && a[1]) {
			return tool_usage_error(c, "unknown option or missing value: '%s'", a);
		} else if (file) {
			return tool_usage_error(c, "more than one FILE ('%s')", a);
		} else {
			file = a;
		}
	}
	if (!file)
		return tool_usage_error(c, "no FILE given%s", "");
	fz_module *m = tool_load(file);
	if (!m)
		return EXIT_BAD;
	double spi = 0;
	int rc = 0;
	check_result cr = {.ok = true};
	for (int i = 0; i < fz_module_count(m) && !rc; i++)
		rc = run_trace(fz_module_trace(m, i), &o, &spi, &cr);
	for (int b = 0; b < o.n_binds && !rc; b++)
		if (!o.binds[b].used)
			fprintf(stderr, "fusec run: warning: --bind %s: no trace in %s has "
				"that symbol\n", o.binds[b].name, file);
	fz_module_free(m);
	if (rc)
		return rc;
	bool ok = !o.check || cr.ok;
	if (o.json) {
		printf("{\"device\": \"%s\", \"engine\": \"generated\", \"ok\": %s, "
		       "\"max_abs_err\": %.9g, \"max_rel_err\": %.9g, "
		       "\"seconds_per_iter\": %.9g", o.ran_on, ok ? "true" : "false",
		       cr.max_abs, cr.max_rel, spi);
		printf(", \"compiled\": %d, \"cache_hits\": %d, \"unique\": %d, "
		       "\"setup_seconds\": %.6f, \"host_syncs_in_steps\": %ld",
		       o.compiled, o.cache_hits, o.unique, o.setup_seconds,
		       o.host_syncs);
		printf(", \"graph\": %s", o.graph ? "true" : "false");
		if (o.graph)
			printf(", \"graph_captures\": %d, \"graph_launches\": %d",
			       o.captures, o.replays);
		if (o.check && cr.worst_ratio > 0)
			printf(", \"worst_output\": \"%s\", \"worst_index\": %lld, "
			       "\"worst_got\": %.9g, \"worst_want\": %.9g",
			       cr.worst_output, (long long)cr.worst_index, cr.worst_got,
			       cr.worst_want);
		printf("}\n");
	} else if (o.check) {
		printf("check: %s: max abs error %.3g, max rel error %.3g", ok ?
		       "ok" : "MISMATCH", cr.max_abs, cr.max_rel);
		if (cr.worst_ratio > 0)
			printf("; worst %s[%lld]: got %.9g, want %.9g (%.2f x tolerance)",
			       cr.worst_output, (long long)cr.worst_index, cr.worst_got,
			       cr.worst_want, cr.worst_ratio);
		printf("\n");
	}
	return ok ? 0 : EXIT_BAD;
}
