/*
 * cmd_run.c: `fusec check` and `fusec run`.
 *
 *     fusec check FILE...                   parse and verify
 *     fusec run FILE [--bind B=8,T=2048]    run on random inputs
 *
 * `run` makes inputs a trace can actually use: floats from a normal
 * distribution, integers that index something uniform within the extent
 * they index (found by following the value to the take/take_along/index_add
 * that consumes it), other integers small, bools both ways. Until the code
 * generator exists, the program runs on the reference interpreter.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "tool.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

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
	 "usage: fusec run FILE [--device auto|cuda|cpu] [--bind B=8,T=2048]\n"
	 "                      [--seed N] [--iters N] [--check] [--json]\n"
	 "\n"
	 "Run every trace of FILE on random inputs: floats from a normal\n"
	 "distribution, index inputs within the extent they index, bools both\n"
	 "ways.\n"
	 "\n"
	 "  --device D   auto (default), cuda or cpu. Until the code generator\n"
	 "               lands, cpu runs the reference interpreter\n"
	 "  --bind LIST  sizes of symbolic extents, NAME=SIZE[,NAME=SIZE...]\n"
	 "  --seed N     seed of the random inputs (default 0)\n"
	 "  --iters N    run N times and report the time per iteration (1)\n"
	 "  --check      compare every output with the reference interpreter;\n"
	 "               print the worst error and exit 1 on a mismatch\n"
	 "  --json       print one JSON object: device, ok, max_abs_err,\n"
	 "               max_rel_err, seconds_per_iter\n"};

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

static double rng_normal(uint64_t *s)
{
	double u = rng_unit(s), v = rng_unit(s);
	return sqrt(-2.0 * log(u + 0x1p-60)) * cos(2.0 * M_PI * v);
}

/* The exclusive bound of the values an integer parameter may take: the
 * smallest extent it indexes, following it through meta ops and casts to
 * the indexing ops that consume it; 0 if it indexes nothing. */
static int64_t index_bound(const fz_trace *t, const fz_value *p,
			   const int64_t *syms)
{
	char *reach = calloc((size_t)t->n_values, 1);
	int64_t bound = 0;
	if (!reach)
		return 0;
	reach[p->id] = 1;
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		fz_opclass cls = fz_ops[nd->op].cls;
		for (int k = 0; k < nd->n_in; k++) {
			if (!reach[nd->in[k]->id])
				continue;
			if (cls == FZ_CLASS_META || nd->op == FZ_OP_CAST)
				reach[nd->out[0]->id] = 1;
			if (cls == FZ_CLASS_INDEXING && k == 1) {
				int64_t e = fz_value_extent(nd->in[0], nd->attrs.dim, syms);
				if (e >= 0 && (bound == 0 || e < bound))
					bound = e;
			}
		}
	}
	free(reach);
	return bound;
}

static void store(void *data, fz_dtype d, size_t i, double v)
{
	switch (d) {
	case FZ_F64: ((double *)data)[i] = v; break;
	case FZ_F32: ((float *)data)[i] = (float)v; break;
	case FZ_F16: ((_Float16 *)data)[i] = (_Float16)v; break;
	case FZ_BF16: {
		float f = (float)v;
		uint32_t u;
		memcpy(&u, &f, 4);
		u += 0x7fff + ((u >> 16) & 1);
		((uint16_t *)data)[i] = (uint16_t)(u >> 16);
		break;
	}
	case FZ_I64: ((int64_t *)data)[i] = (int64_t)v; break;
	case FZ_I32: ((int32_t *)data)[i] = (int32_t)v; break;
	case FZ_I8: ((int8_t *)data)[i] = (int8_t)v; break;
	case FZ_U8: ((uint8_t *)data)[i] = (uint8_t)v; break;
	case FZ_BOOL: ((uint8_t *)data)[i] = v != 0; break;
	default: break;
	}
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
		x->data = malloc(n * fz_dtype_size(x->dtype) + 1);
		if (!x->data) {
			fprintf(stderr, "fusec run: out of memory for input '%s'\n", p->name);
			return -1;
		}
		int64_t bound = fz_dtype_is_int(x->dtype) ? index_bound(t, p, syms) : 0;
		for (size_t k = 0; k < n; k++) {
			double v;
			if (fz_dtype_is_float(x->dtype))
				v = rng_normal(&s);
			else if (x->dtype == FZ_BOOL)
				v = rng_next(&s) & 1;
			else if (bound > 0)
				v = (double)(rng_next(&s) % (uint64_t)bound);
			else if (x->dtype == FZ_U8)
				v = (double)(rng_next(&s) % 256);
			else
				v = (double)(int64_t)(rng_next(&s) % 17) - 8;
			store(x->data, x->dtype, k, v);
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
} run_opts;

/* Runs one trace; adds its time per iteration to *spi. */
static int run_trace(const fz_trace *t, run_opts *o, double *spi)
{
	int64_t syms[FZ_MAX_SYMS];
	int n_in = fz_trace_param_count(t), n_out = fz_trace_output_count(t);
	tool_bind_symbols(t, o->binds, o->n_binds, syms);
	for (int s = 0; s < fz_trace_symbol_count(t); s++) {
		if (syms[s] < 0) {
			fprintf(stderr, "fusec run: trace '%s': symbol '%s' is unbound: "
				"bind it with --bind %s=SIZE\n", fz_trace_name(t),
				fz_trace_symbol(t, s), fz_trace_symbol(t, s));
			return EXIT_BAD;
		}
	}
	fz_tensor *in = calloc((size_t)n_in + 1, sizeof *in);
	fz_tensor *out = calloc((size_t)n_out + 1, sizeof *out);
	int rc = EXIT_BAD;
	char *err = NULL;
	if (!in || !out || make_inputs(t, syms, o->seed, in) < 0)
		goto done;
	double t0 = tool_now();
	for (long it = 0; it < o->iters; it++) {
		for (int k = 0; k < n_out; k++) {
			fz_free(out[k].data);
			out[k].data = NULL;
		}
		fz_status st = fz_trace_interpret(t, syms, in, n_in, out, n_out, &err);
		if (st != FZ_OK) {
			fprintf(stderr, "fusec run: trace '%s': %s\n", fz_trace_name(t),
				err ? err : fz_status_name(st));
			goto done;
		}
	}
	double per = (tool_now() - t0) / (double)o->iters;
	*spi += per;
	if (!o->json) {
		printf("trace %s: %d output%s, %.3f ms per iteration on the reference "
		       "interpreter\n", fz_trace_name(t), n_out, n_out == 1 ? "" : "s",
		       per * 1e3);
		for (int k = 0; k < n_out; k++) {
			const fz_value *v = fz_trace_output(t, k);
			char ty[256];
			printf("  %s: %s\n", fz_value_name(v) ? fz_value_name(v) : "?",
			       fz_type_str(t, &v->type, ty, sizeof ty));
		}
	}
	rc = 0;
done:
	for (int k = 0; in && k < n_in; k++)
		free(in[k].data);
	for (int k = 0; out && k < n_out; k++)
		fz_free(out[k].data);
	free(in);
	free(out);
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
		} else if (!strcmp(a, "--json")) {
			o.json = true;
		} else if (!strcmp(a, "--device") && has_next) {
			o.device = argv[++i];
			if (strcmp(o.device, "auto") && strcmp(o.device, "cuda") &&
			    strcmp(o.device, "cpu"))
				return tool_usage_error(c, "--device must be auto, cuda or cpu, "
						   "not '%s'", o.device);
		} else if (!strcmp(a, "--bind") && has_next) {
			o.n_binds = tool_parse_bindings(argv[++i], o.binds, FZ_MAX_SYMS);
			if (o.n_binds < 0)
				return tool_usage_error(c, "--bind takes NAME=SIZE[,NAME=SIZE...],"
						   " not '%s'", argv[i]);
		} else if ((!strcmp(a, "--seed") || !strcmp(a, "--iters")) && has_next) {
			char *end;
			errno = 0;
			long long v = strtoll(argv[++i], &end, 10);
			if (*end || errno || v < 0 || (a[2] == 'i' && v < 1))
				return tool_usage_error(c, "bad number '%s'", argv[i]);
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
	if (!strcmp(o.device, "cuda")) {
		fprintf(stderr, "fusec run: --device cuda: the CUDA runtime is not part"
			" of this build yet\n");
		return EXIT_BAD;
	}
	fz_module *m = tool_load(file);
	if (!m)
		return EXIT_BAD;
	double spi = 0;
	int rc = 0;
	for (int i = 0; i < fz_module_count(m) && !rc; i++)
		rc = run_trace(fz_module_trace(m, i), &o, &spi);
	for (int b = 0; b < o.n_binds && !rc; b++)
		if (!o.binds[b].used)
			fprintf(stderr, "fusec run: warning: --bind %s: no trace in %s has "
				"that symbol\n", o.binds[b].name, file);
	fz_module_free(m);
	if (rc)
		return rc;
	/* The interpreter is the oracle; with nothing else to run yet, --check
	 * has nothing to compare and says so. */
	if (o.json)
		printf("{\"device\": \"cpu\", \"engine\": \"reference\", \"ok\": true, "
		       "\"max_abs_err\": 0, \"max_rel_err\": 0, "
		       "\"seconds_per_iter\": %.9g}\n", spi);
	else if (o.check)
		printf("check: ran on the reference interpreter itself; nothing to "
		       "compare until generated code runs\n");
	return 0;
}

