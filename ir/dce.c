/*
 * dce.c: dead code, the first pass: ops whose results nothing needs.
 *
 * A trace is a function of its inputs to its returned values, and every op
 * is pure (index_add and uniform make new tensors; a collective whose
 * result is never used is dropped on every rank alike, since every rank
 * runs the same trace). So an op none of whose results is returned or read
 * by a needed op computes nothing anyone sees, and the program should not
 * plan a buffer for it, compile a kernel for it or launch one: a dead
 * reduction kept its input alive past its last real use and could raise
 * the planned peak; a dead softmax over an extent bound to 0 failed the
 * whole run (its max has no identity) though nothing asked for it.
 *
 * One walk backwards over the nodes (a trace is in topological order):
 * the returned values are needed; a node is live when one of its results
 * is needed, and then its operands are needed. Linear in nodes + edges.
 *
 *     trace t(x: f32[64], y: f32[64]) {
 *       a = exp(x)                     dead: only b reads it
 *       b = sum(a, dims=[0])           dead: nothing reads it
 *       c = mul(y, 2.0)                live: returned
 *       return c
 *     }
 *
 * The pass leaves the trace as it is and marks the program (fz_program.dead,
 * NULL when every op is live); the partitioner puts no dead node in a
 * region, so no later pass, the code generator or the runtime ever sees one.
 * The interpreter (interp.c) and the verifier's run-time checks skip the
 * same nodes through fz_trace_live, so the oracle and the generated code
 * agree on what runs. One difference, by design: an attention op that
 * reads kv heads repeated by broadcast_in_dim and reshape reads them
 * unrepeated in the program (ir/attention.h, fz_attn_fold_find), so a
 * repeat nothing else reads is dead here while the interpreter computes
 * it (a meta op whose extents agree by construction: it cannot fail).
 */
#include <stdlib.h>

#include "attention.h"

/* The walk; an attention op folds[i] reads its k and v unrepeated. */
static int trace_live(const fz_trace *t, const fz_attn_fold *folds, bool *live)
{
	bool *need = calloc((size_t)t->n_values + 1, sizeof *need);
	if (!need)
		return -1;
	for (int i = 0; i < t->n_outputs; i++)
		need[t->outputs[i]->id] = true;
	int dead = 0;
	for (int i = t->n_nodes - 1; i >= 0; i--) {
		const fz_node *n = t->nodes[i];
		bool l = false;
		for (int k = 0; k < n->n_out && !l; k++)
			l = need[n->out[k]->id];
		live[i] = l;
		dead += !l;
		const fz_attn_fold *f = folds && folds[i].k ? &folds[i] : NULL;
		for (int k = 0; l && k < n->n_in; k++)
			need[(f && k == 1 ? f->k : f && k == 2 ? f->v : n->in[k])->id] = true;
	}
	free(need);
	return dead;
}

int fz_trace_live(const fz_trace *t, bool *live)
{
	return trace_live(t, NULL, live);
}

fz_status fz_dce(fz_program *p)
{
	const fz_trace *t = p->trace;
	bool *live = malloc(sizeof *live * ((size_t)t->n_nodes + 1));
	if (!live)
		return FZ_ENOMEM;
	/* attention ops that read repeated kv heads unrepeated: the repeats
	 * nothing else reads are dead here (not in the interpreter, which
	 * runs the trace as written) */
	p->attn_fold = NULL;
	int folds = 0;
	for (int i = 0; i < t->n_nodes && !folds; i++)
		folds = fz_ops[t->nodes[i]->op].cls == FZ_CLASS_ATTENTION;
	if (folds) {
		p->attn_fold = fz_arena_alloc(&p->arena, sizeof(fz_attn_fold) *
					      ((size_t)t->n_nodes + 1));
		folds = p->attn_fold ? fz_attn_fold_find(t, p->attn_fold) : -1;
		if (folds < 0) {
			free(live);
			return FZ_ENOMEM;
		}
		if (folds == 0)
			p->attn_fold = NULL;
	}
	int dead = trace_live(t, p->attn_fold, live);
	fz_status st = dead < 0 ? FZ_ENOMEM : FZ_OK;
	p->dead = NULL;
	p->n_dead = 0;
	if (dead > 0) {
		p->dead = fz_arena_alloc(&p->arena, sizeof(bool) * ((size_t)t->n_nodes + 1));
		if (!p->dead)
			st = FZ_ENOMEM;
		for (int i = 0; p->dead && i < t->n_nodes; i++)
			p->dead[i] = !live[i];
		p->n_dead = dead;
	}
	for (int i = 0; i < t->n_nodes; i++)
		p->work += 1 + t->nodes[i]->n_in;
	free(live);
	return st;
}
