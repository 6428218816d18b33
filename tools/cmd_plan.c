/*
 * cmd_plan.c: `fusec plan`, the program fusec makes of a trace.
 *
 *     fusec plan FILE [--bind B=8,T=2048] [--json] [--dot OUT] [--no-horizontal]
 *                     [--dump-after=partition|bookend|schedule|horizontal|
 *                                   waits|prefetch|scatter|bucket|memplan]
 *                     [--print-trace] [communication flags]
 *
 * The plan itself is a library feature (fz_plan, ir/plan.c); this command
 * prints it: a table of regions (kind, ops, inputs, outputs, bytes read and
 * written, vector width) in execution order, the peak live bytes of that
 * order and of the trace's own order, and the arena. --json prints the keys
 * DESIGN.md promises (regions, kernels, library_calls, collectives,
 * peak_bytes, peak_bytes_trace_order) and a few more; --dot draws each
 * region as a Graphviz cluster. Symbols left unbound count as 1, and the
 * output says which.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "tool.h"

static int cmd_plan(int argc, char **argv);

const fz_command fz_cmd_plan = {"plan", "partition and schedule a trace",
	cmd_plan,
	 "usage: fusec plan FILE [--bind B=8,T=2048] [--world N] [--json]\n"
	 "                       [--dot OUT] [--dump-after=PASS] [--no-horizontal]\n"
	 "                       [--print-trace] [--max-inflight-bytes SIZE]\n"
	 "                       [--bucket-bytes SIZE] [--no-prefetch]\n"
	 "                       [--no-comm-waits] [--no-early-scatter]\n"
	 "                       [--no-comm-schedule]\n"
	 "\n"
	 "Partition every trace of FILE into regions (kernels, library calls,\n"
	 "collectives, waits, views), order them to keep peak memory low, and\n"
	 "place every intermediate in one arena. Prints the regions in order,\n"
	 "the peak live bytes planned and in the trace's written order.\n"
	 "\n"
	 "  --bind LIST       sizes of symbolic extents, NAME=SIZE[,...]; a\n"
	 "                    symbol left unbound counts as 1 (and is listed)\n"
	 "  --world N         the world the run will have: an error when a\n"
	 "                    trace declares another\n"
	 "  --json            one JSON object: regions, kernels, library_calls,\n"
	 "                    collectives, views, peak_bytes,\n"
	 "                    peak_bytes_trace_order, arena_bytes,\n"
	 "                    unbound_symbols_as_1, traces (one object each)\n"
	 "  --dot OUT         write a Graphviz picture, one cluster per region\n"
	 "  --no-horizontal   keep independent sibling kernels apart (to see\n"
	 "                    what horizontal fusion merged)\n"
	 "  --dump-after=PASS print the program after partition, bookend,\n"
	 "                    schedule, horizontal, waits, prefetch, scatter,\n"
	 "                    bucket or memplan (to stderr with --json)\n"
	 "  --print-trace     print the scheduled trace instead: the nodes in\n"
	 "                    the order the program runs them (a trace that\n"
	 "                    parses back and plans to the same order)\n"
	 "\n"
	 "Communication scheduling (FSDP / ZeRO-3 traces), on by default:\n"
	 "  --max-inflight-bytes SIZE  cap on all-gathered bytes not yet\n"
	 "                    released; gathers are issued in order of first use\n"
	 "                    as early as the cap allows (default 1G; 0: no cap)\n"
	 "  --bucket-bytes SIZE  coalesce back-to-back all-gathers smaller than\n"
	 "                    SIZE into buckets of at most SIZE (default 25M; 0:\n"
	 "                    off)\n"
	 "  --no-comm-waits   leave each wait where the memory scheduler put it\n"
	 "                    (default: right before its first consumer)\n"
	 "  --no-prefetch     leave all-gathers where they are\n"
	 "  --no-early-scatter  leave reduce-scatters and all-reduces where they\n"
	 "                    are (default: right after their operand)\n"
	 "  --no-comm-schedule  all four off\n"
	 "SIZE: bytes, or with K, M, G (powers of 1024).\n"};

typedef struct plan_opts {
	tool_binding binds[FZ_MAX_SYMS];
	int n_binds;
	bool json;
	const char *dot;
	int dump_after;
	bool no_horizontal;
	bool print_trace;
	int world;
	fz_plan_options po;
} plan_opts;

static int64_t read_bytes(const fz_program *p, const fz_value *v)
{
	fz_value *b = fz_view_root(p, (fz_value *)v);
	int64_t e = fz_type_numel_at(&v->type, p->sym_sizes);
	if (e < 0)
		return 0;
	int64_t eb = b != v ? fz_type_numel_at(&b->type, p->sym_sizes) : -1;
	if (eb >= 0 && eb < e)
		e = eb; /* a broadcast view reads its base once */
	return e * (int64_t)fz_dtype_size(v->type.dtype);
}

static int64_t written_bytes(const fz_program *p, const fz_region *R)
{
	int64_t w = 0;
	for (int k = 0; k < R->n_out; k++)
		if (!p->view_of[R->out[k]->id])
			w += p->bytes[R->out[k]->id];
	return w;
}

static void ops_summary(const fz_region *R, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	for (int j = 0; j < R->n_nodes; j++) {
		const char *name = fz_ops[R->nodes[j]->op].name;
		if (!strcmp(name, "broadcast_in_dim"))
			name = "bcast";
		if (len + strlen(name) + 5 >= n) {
			snprintf(buf + len, n - len, " ...");
			return;
		}
		len += (size_t)snprintf(buf + len, n - len, "%s%s", j ? " " : "", name);
	}
}

static const char *method_name(fz_sched_method m)
{
	return m == FZ_SCHED_EXACT ? "exact search" :
	       m == FZ_SCHED_TRACE ? "the written order" :
	       m == FZ_SCHED_FUSED ? "the order horizontal fusion was judged on" :
	       "greedy";
}

static void print_unbound(const fz_program *p, FILE *f, bool json)
{
	const fz_trace *t = p->trace;
	int k = 0;
	for (int s = 0; s < t->n_syms; s++) {
		if (!(p->unbound_syms >> s & 1))
			continue;
		if (json)
			fprintf(f, "%s\"%s\"", k ? ", " : "", t->syms[s]);
		else
			fprintf(f, "%s%s", k ? ", " : "", t->syms[s]);
		k++;
	}
}

static void print_human(const fz_program *p)
{
	const fz_trace *t = p->trace;
	printf("trace %s: %d regions: %d kernels, %d library calls, %d "
	       "collectives, %d waits, %d views\n", t->name, p->n_regions,
	       fz_program_kernels(p), fz_program_count(p, FZ_REGION_LIBRARY),
	       fz_program_count(p, FZ_REGION_COLLECTIVE),
	       fz_program_count(p, FZ_REGION_WAIT),
	       fz_program_count(p, FZ_REGION_VIEW));
	if (p->unbound_syms) {
		printf("  symbols taken as 1 (bind them with --bind): ");
		print_unbound(p, stdout, false);
		printf("\n");
	}
	printf("  %4s  %-13s %-44s %3s %3s %12s %12s  %s\n", "id", "kind", "ops",
	       "in", "out", "read", "written", "vector");
	for (int s = 0; s < p->n_regions; s++) {
		const fz_region *R = p->regions[p->order[s]];
		char ops[45];
		int64_t rd = 0;
		ops_summary(R, ops, sizeof ops);
		for (int k = 0; k < R->n_in; k++)
			if (R->kind != FZ_REGION_VIEW)
				rd += read_bytes(p, R->in[k]);
		printf("  %4d  %-13s %-44s %3d %3d %12lld %12lld", R->id,
		       fz_region_kind_names[R->kind], ops, R->n_in, R->n_out,
		       (long long)rd, (long long)written_bytes(p, R));
		if (fz_region_is_kernel(R->kind))
			printf("  %d x %dB", p->vec_width[R->id],
			       p->vec_bytes[R->id] / p->vec_width[R->id]);
		printf("\n");
	}
	printf("  order:");
	for (int s = 0; s < p->n_regions; s++)
		printf(" %d", p->order[s]);
	printf("\n  peak: %lld bytes planned (%s%s), %lld bytes in the written "
	       "order\n", (long long)p->peak_bytes, method_name(p->method),
	       p->peak_proven_optimal ? ", optimal" : "",
	       (long long)p->peak_bytes_trace_order);
	printf("  arena: %lld bytes\n", (long long)p->arena_bytes);
	if (p->horizontal_merged || p->horizontal_refused_peak ||
	    p->horizontal_refused_path)
		printf("  horizontal fusion: %d merged, %d refused (the peak would "
		       "rise), %d refused (a path between them)\n",
		       p->horizontal_merged, p->horizontal_refused_peak,
		       p->horizontal_refused_path);
	if (fz_program_count(p, FZ_REGION_COLLECTIVE))
		printf("  communication: %d buckets, at most %lld gathered bytes "
		       "not yet released\n", p->comm_buckets,
		       (long long)p->comm_peak_inflight);
}

static void print_json_one(const fz_program *p)
{
	const fz_trace *t = p->trace;
	printf("{\"trace\": \"%s\", \"regions\": %d, \"kernels\": %d, "
	       "\"library_calls\": %d, \"collectives\": %d, \"waits\": %d, "
	       "\"views\": %d, \"peak_bytes\": %lld, "
	       "\"peak_bytes_trace_order\": %lld, \"arena_bytes\": %lld, "
	       "\"schedule\": \"%s\", \"peak_optimal\": %s, "
	       "\"horizontal_merged\": %d, \"horizontal_refused_peak\": %d, "
	       "\"horizontal_refused_path\": %d, "
	       "\"unbound_symbols_as_1\": [", t->name, p->n_regions,
	       fz_program_kernels(p), fz_program_count(p, FZ_REGION_LIBRARY),
	       fz_program_count(p, FZ_REGION_COLLECTIVE),
	       fz_program_count(p, FZ_REGION_WAIT),
	       fz_program_count(p, FZ_REGION_VIEW), (long long)p->peak_bytes,
	       (long long)p->peak_bytes_trace_order, (long long)p->arena_bytes,
	       p->method == FZ_SCHED_EXACT ? "exact" :
	       p->method == FZ_SCHED_TRACE ? "trace" :
	       p->method == FZ_SCHED_FUSED ? "fused" : "greedy",
	       p->peak_proven_optimal ? "true" : "false", p->horizontal_merged,
	       p->horizontal_refused_peak, p->horizontal_refused_path);
	print_unbound(p, stdout, true);
	printf("], \"comm_buckets\": %d, \"comm_peak_inflight_bytes\": %lld",
	       p->comm_buckets, (long long)p->comm_peak_inflight);
	printf(", \"order\": [");
	for (int s = 0; s < p->n_regions; s++)
		printf("%s%d", s ? ", " : "", p->order[s]);
	printf("], \"region_list\": [");
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = p->regions[r];
		printf("%s{\"id\": %d, \"kind\": \"%s\", \"ops\": %d, \"in\": %d, "
		       "\"out\": %d, \"vector_bytes\": %d}", r ? ", " : "", R->id,
		       fz_region_kind_names[R->kind], R->n_nodes, R->n_in, R->n_out,
		       fz_region_is_kernel(R->kind) ? p->vec_bytes[r] : 0);
	}
	printf("]}");
}

static void dot_value_name(const fz_value *v, char *buf, size_t n)
{
	if (v->name)
		snprintf(buf, n, "%s", v->name);
	else
		snprintf(buf, n, "%%%d", v->id);
}

static void write_dot(FILE *f, const fz_program *p, int ti)
{
	const fz_trace *t = p->trace;
	char nm[128];
	for (int i = 0; i < t->n_params; i++) {
		dot_value_name(t->params[i], nm, sizeof nm);
		fprintf(f, "  t%d_v%d [shape=ellipse, label=\"%s\"];\n", ti,
			t->params[i]->id, nm);
	}
	for (int r = 0; r < p->n_regions; r++) {
		const fz_region *R = p->regions[r];
		fprintf(f, "  subgraph cluster_t%d_r%d {\n    label=\"%s region %d: %s\";"
			"\n    style=%s;\n", ti, r, t->name, r,
			fz_region_kind_names[R->kind],
			R->kind == FZ_REGION_VIEW ? "dashed" : "rounded");
		for (int j = 0; j < R->n_nodes; j++) {
			const fz_node *n = R->nodes[j];
			dot_value_name(n->out[0], nm, sizeof nm);
			fprintf(f, "    t%d_n%d [shape=box, label=\"%s\\n%s\"];\n", ti,
				n->id, fz_ops[n->op].name, nm);
		}
		fprintf(f, "  }\n");
	}
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *n = t->nodes[i];
		for (int k = 0; k < n->n_in; k++) {
			const fz_value *v = n->in[k];
			if (v->def)
				fprintf(f, "  t%d_n%d -> t%d_n%d;\n", ti, v->def->id, ti, n->id);
			else
				fprintf(f, "  t%d_v%d -> t%d_n%d;\n", ti, v->id, ti, n->id);
		}
	}
}

static int cmd_plan(int argc, char **argv)
{
	const fz_command *c = &fz_cmd_plan;
	plan_opts o = {.dump_after = -1};
	fz_plan_defaults(&o.po);
	const char *file = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_next = i + 1 < argc;
		int took = tool_comm_option(c, argc, argv, &i, &o.po);
		if (took < 0)
			return EXIT_USAGE;
		if (took)
			continue;
		if (!strcmp(a, "--json")) {
			o.json = true;
		} else if (!strcmp(a, "--print-trace")) {
			o.print_trace = true;
		} else if (!strcmp(a, "--no-horizontal")) {
			o.no_horizontal = true;
		} else if (!strcmp(a, "--bind") && has_next) {
			if (tool_bind_option(c, argv[++i], o.binds, &o.n_binds))
				return EXIT_USAGE;
		} else if (!strcmp(a, "--world") && has_next) {
			char *end;
			long w = strtol(argv[++i], &end, 10);
			if (*end || w < 1 || w > 1 << 20)
				return tool_usage_error(c, "bad world size '%s'", argv[i]);
			o.world = (int)w;
		} else if (!strcmp(a, "--dot") && has_next) {
			o.dot = argv[++i];
		} else if (!strncmp(a, "--dump-after=", 13) ||
			   (!strcmp(a, "--dump-after") && has_next)) {
			const char *name = a[12] == '=' ? a + 13 : argv[++i];
			fz_pass ps;
			if (!fz_pass_from_name(name, &ps))
				return tool_usage_error(c, "--dump-after takes partition, "
						   "bookend, schedule, horizontal, waits, "
						   "prefetch, scatter, bucket or memplan, "
						   "not '%s'", name);
			o.dump_after = (int)ps;
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
	if (o.print_trace && (o.json || o.dot))
		return tool_usage_error(c, "--print-trace prints a trace; it does not "
				   "go with --json or --dot%s", "");
	fz_module *m = tool_load(file);
	if (!m)
		return EXIT_BAD;
	if (tool_check_world("plan", m, o.world)) {
		fz_module_free(m);
		return EXIT_BAD;
	}
	FILE *dot = NULL;
	if (o.dot && !(dot = fopen(o.dot, "w"))) {
		perror(o.dot);
		fz_module_free(m);
		return EXIT_BAD;
	}
	if (dot)
		fprintf(dot, "digraph plan {\n  compound=true;\n  node [fontsize=10];\n");
	int n = fz_module_count(m), rc = 0;
	int tot[5] = {0};
	int64_t peak = 0, peak_trace = 0, arena = 0;
	if (o.json) {
		printf("{\"file\": ");
		tool_json_str(file);
		printf(", \"traces\": [");
	}
	for (int i = 0; i < n && !rc; i++) {
		const fz_trace *t = fz_module_trace(m, i);
		int64_t syms[FZ_MAX_SYMS];
		tool_bind_symbols(t, o.binds, o.n_binds, syms);
		fz_plan_options po = o.po;
		po.sym_sizes = syms;
		po.dump_after = o.dump_after;
		po.horizontal = !o.no_horizontal;
		fz_program *p = NULL;
		char *err = NULL;
		fz_status st = fz_plan(t, &po, &p, &err);
		if (st != FZ_OK) {
			fprintf(stderr, "fusec plan: %s\n", err ? err : fz_status_name(st));
			fz_free(err);
			rc = EXIT_BAD;
			break;
		}
		if (p->dump)
			fputs(p->dump, o.json || o.print_trace ? stderr : stdout);
		if (o.print_trace) {
			char *text = NULL;
			if (fz_program_print_trace(p, &text) != FZ_OK) {
				fprintf(stderr, "fusec plan: out of memory\n");
				rc = EXIT_BAD;
			} else {
				fputs(text, stdout);
			}
			fz_free(text);
		} else if (o.json) {
			if (i)
				printf(", ");
			print_json_one(p);
		} else {
			print_human(p);
		}
		tot[0] += p->n_regions;
		tot[1] += fz_program_kernels(p);
		tot[2] += fz_program_count(p, FZ_REGION_LIBRARY);
		tot[3] += fz_program_count(p, FZ_REGION_COLLECTIVE);
		tot[4] += fz_program_count(p, FZ_REGION_VIEW);
		if (p->peak_bytes > peak)
			peak = p->peak_bytes;
		if (p->peak_bytes_trace_order > peak_trace)
			peak_trace = p->peak_bytes_trace_order;
		if (p->arena_bytes > arena)
			arena = p->arena_bytes;
		if (dot)
			write_dot(dot, p, i);
		fz_program_free(p);
	}
	if (o.json && !rc) {
		/* one trace: its numbers; several: totals, and the largest peaks */
		printf("], \"regions\": %d, \"kernels\": %d, \"library_calls\": %d, "
		       "\"collectives\": %d, \"views\": %d, \"peak_bytes\": %lld, "
		       "\"peak_bytes_trace_order\": %lld, \"arena_bytes\": %lld, "
		       "\"unbound_symbols_as_1\": [", tot[0], tot[1], tot[2], tot[3],
		       tot[4], (long long)peak, (long long)peak_trace,
		       (long long)arena);
		int k = 0;
		for (int i = 0; i < n; i++) {
			const fz_trace *t = fz_module_trace(m, i);
			int64_t syms[FZ_MAX_SYMS];
			tool_bind_symbols(t, o.binds, o.n_binds, syms);
			for (int s = 0; s < fz_trace_symbol_count(t); s++) {
				if (syms[s] >= 0)
					continue;
				bool dup = false; /* listed by an earlier trace */
				for (int j = 0; j < i && !dup; j++) {
					const fz_trace *u = fz_module_trace(m, j);
					int64_t us[FZ_MAX_SYMS];
					tool_bind_symbols(u, o.binds, o.n_binds, us);
					for (int q = 0; q < fz_trace_symbol_count(u); q++)
						if (us[q] < 0 && !strcmp(fz_trace_symbol(u, q),
									 fz_trace_symbol(t, s)))
							dup = true;
				}
				for (int q = 0; q < s && !dup; q++)
					dup = syms[q] < 0 && !strcmp(fz_trace_symbol(t, q),
								     fz_trace_symbol(t, s));
				if (!dup)
					printf("%s\"%s\"", k++ ? ", " : "", fz_trace_symbol(t, s));
			}
		}
		printf("]}\n");
	} else if (o.json) {
		printf("]}\n");
	}
	if (dot) {
		fprintf(dot, "}\n");
		if (fclose(dot) != 0) {
			perror(o.dot);
			rc = EXIT_BAD;
		}
	}
	for (int b = 0; b < o.n_binds && !rc; b++)
		if (!o.binds[b].used)
			fprintf(stderr, "fusec plan: warning: --bind %s: no trace in %s has "
				"that symbol\n", o.binds[b].name, file);
	fz_module_free(m);
	return rc;
}
