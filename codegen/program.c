/*
 * program.c: every kernel of a trace, for `fusec emit`, the tests and the
 * benchmark.
 *
 * The trace is planned (ir/plan.h) at the given sizes; symbols left unbound
 * stay kernel parameters, so the modules serve every binding. Each kernel
 * region becomes one module, with the strided views it reads folded in
 * (fz_region_fold_views) as the runner launches it (the host's one pass
 * for an adjacent attention_dq and attention_dkv, runtime/kernels.c's
 * attn_pair, shows as its two regions). A region the skeletons cannot
 * take whole (FZ_EUNSUPPORTED: two reductions over different dims, say)
 * becomes one module per op, or two where a GPU's scatter has elementwise
 * followers (fz_scatter_split), as the runner executes it
 * (runtime/kernels.c), so that every kernel a run would launch is also
 * what emit shows.
 */
#include <stdlib.h>
#include <string.h>

#include "cg.h"

static fz_status one(fz_compiler *c, const fz_trace *t, const fz_region *r,
		     int op, fz_kernel_fn fn, void *ud, char **err)
{
	fz_kernel *k = NULL;
	fz_status st = fz_compiler_build(c, t, r, &k, err);
	if (st == FZ_OK)
		st = fz_compiler_optimize(c, k, err);
	if (st == FZ_OK)
		st = fn(r, op, k, ud, err);
	fz_kernel_free(k);
	return st;
}

fz_status fz_compile_trace(fz_compiler *c, const fz_trace *t,
			   const int64_t *sym_sizes, int only_region,
			   fz_kernel_fn fn, void *ud, char **err)
{
	if (err)
		*err = NULL;
	fz_plan_options po;
	fz_plan_defaults(&po);
	po.sym_sizes = sym_sizes;
	fz_program *p = NULL;
	fz_status st = fz_plan(t, &po, &p, err);
	for (int i = 0; st == FZ_OK && i < p->n_regions; i++) {
		const fz_region *r = p->regions[p->order[i]];
		if (!fz_region_is_kernel(r->kind) ||
		    (only_region >= 0 && r->id != only_region))
			continue;
		/* the region as the runner launches it: the strided views it
		 * reads folded in (else its code reads a broadcast bias as a
		 * whole matrix) */
		fz_region src;
		fz_node **folded = NULL;
		fz_value **ins = malloc(sizeof *ins * ((size_t)r->n_in + 1));
		if (!ins || !fz_region_fold_views(p, r, fz_compiler_options(c)->target ==
						  FZ_CG_HOST, &src, &folded, ins)) {
			free(ins);
			st = FZ_ENOMEM;
			fz_set_err(err, fz_strdup("out of memory"));
			break;
		}
		char *msg = NULL;
		st = one(c, t, &src, -1, fn, ud, &msg);
		free(folded);
		free(ins);
		if (st != FZ_EUNSUPPORTED) {
			if (err)
				*err = msg;
			else
				free(msg);
			continue;
		}
		free(msg);
		st = FZ_OK;
		/* the scatter, then its followers, as runtime/kernels.c runs them */
		bool oom = false;
		fz_region *two = fz_scatter_split(r, &oom);
		if (oom) {
			fz_set_err(err, fz_strdup("out of memory"));
			st = FZ_ENOMEM;
		}
		for (int h = 0; two && st == FZ_OK && h < 2; h++)
			st = one(c, t, &two[h], h ? r->n_nodes - 1 : 0, fn, ud, err);
		bool split = two || oom;
		free(two);
		for (int j = 0; !split && st == FZ_OK && j < r->n_nodes; j++) {
			fz_node *n = r->nodes[j];
			fz_value *ins[FZ_MAX_ARGS];
			int ni = 0;
			for (int a = 0; a < n->n_in; a++) {
				bool dup = false;
				for (int b = 0; b < ni; b++)
					dup |= ins[b] == n->in[a];
				if (!dup)
					ins[ni++] = n->in[a];
			}
			fz_node *nodes[1] = {n};
			fz_region sub = {r->id, FZ_REGION_POINTWISE, 1, nodes, ni, ins,
					 n->n_out, n->out, NULL, NULL};
			st = one(c, t, &sub, j, fn, ud, err);
		}
	}
	fz_program_free(p);
	return st;
}
