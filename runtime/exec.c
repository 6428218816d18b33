/*
 * exec.c: prepared programs, and the one runner every target shares.
 *
 * A framework calls fusec thousands of times per training step, so the
 * work is split in two. Preparing (once per binding of the symbolic sizes,
 * kept in a small LRU) does everything that thinks:
 *
 *     plan the trace at the sizes                     ir/plan.h
 *     its kernels, keyed, found or compiled, loaded   kernels.c
 *     a slot per value: where its bytes are           below
 *     a list of steps with their argument slots
 *     each launch packed where the target can (target.h: pack):
 *       geometry and parameter block fixed, only pointers refilled
 *     one arena for the plan (memplan's offsets, then staging)
 *
 * and a run only binds pointers and walks the steps:
 *
 *     bind the sizes from the inputs' shapes (no allocation)
 *     pick the prepared plan (the last one, else a scan of the few kept)
 *     base pointers: each input (copied to staging only when strided or
 *       not 16-byte aligned), each output (the caller's buffer), the arena
 *     every slot = its base + its byte offset
 *     for each step: launch / matmul / collective / copy, through the target
 *
 * or, on a target with graphs (fz_exec_run_graph, CUDA), that whole walk
 * captured once into a graph on the caller's stream and replayed while
 * the inputs' and outputs' pointers and layouts are unchanged; a change
 * captures again
 *
 * Slots. A value lives in one of three places: a parameter (the caller's
 * input, read in place), an output (the caller's buffer, written in place
 * when the output is a value with storage of its own), or the arena at
 * memplan's offset. A view is its root's place plus an offset when it is
 * contiguous; a strided view a kernel reads is gathered into a staging
 * block by a copy step placed before its first reader; a reshape that is
 * not a view at these sizes runs its copy kernel. An output that is a
 * view, an input or another output's value is copied into the caller's
 * buffer by a last step. Staging blocks, the values inside a region run
 * per op, and the error flag follow memplan's arena in the same
 * allocation.
 *
 *     y = add(mul(x, w), 1.0) over x: f32[16]:   slots x=param 0,
 *     t=arena+0, y=out 0; steps: kernel(x, w -> y)   (one region)
 *
 * The runner never touches memory itself: every copy, launch and library
 * call is a slot of the target's table (target.h), so the CPU, CUDA and
 * emulated targets run the very same walk. A kernel that meets an index
 * out of range writes 1 + the op's node id into the flag word; host-memory
 * targets check it after each launch, device targets at fz_exec_sync,
 * which also clears it (so a run on a GPU queues nothing for the flag:
 * it is cleared once when its arena is new, then only after an error, by
 * the target's zero where it has one, else an upload).
 *
 * Profiling. With FUSEC_PROFILE=1 in the environment when the program is
 * made, every step of a run is timed on the host's clock (two clock
 * reads a step, nothing when off) and summed per step of each kept plan;
 * fz_exec_profile returns the table: region, kind (kernel, matmul, copy,
 * collective, wait), runs, seconds, the product's flops, and what the step
 * is (the region's kind and op count, the product's extents). On the CPU
 * the steps are synchronous, so the seconds are the step's; on a GPU they
 * are only the host's time to queue it.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "exec.h"

#define EXEC_MAGIC 0x66e7ec01u
#define EXEC_DEAD 0xdeadec01u
#define BLOCK 256



static int64_t round_up(int64_t x) { return (x + BLOCK - 1) / BLOCK * BLOCK; }

/* ---- plans ------------------------------------------------------------------- */

enum { B_PARAM, B_OUT, B_ARENA };

typedef struct slot {
	uint8_t base;        /* B_* */
	int idx;             /* parameter or output index */
	int64_t off;         /* bytes from the base */
} slot;

enum { S_KERNEL, S_MATMUL, S_COLL, S_COPY, S_WAIT };

typedef struct step {
	uint8_t kind;
	int region;
	/* S_KERNEL */
	const fz_kinst *ki;
	int n_args;
	int *args;           /* slots, in the kernel's parameter order */
	void **bufs;         /* their pointers, per run */
	void *pk;            /* the target's packed launch (tg->pack), or NULL */
	/* S_MATMUL */
	fz_matmul mm;
	int sa, sb, sbias;   /* -1: no bias */
	/* S_COLL */
	fz_collective co;
	/* S_MATMUL, S_COLL, S_COPY: the result; S_COLL, S_COPY: the source */
	int sy, sx;
	/* S_COPY: sx's base seen through lay */
	fz_layout lay;
	size_t es;
} step;

typedef struct pplan {
	int64_t syms[FZ_MAX_SYMS];
	fz_program *p;
	fz_kset *ks;
	fz_arena mem;        /* slots, steps and their arrays */
	int n_slots, cap_slots;
	slot *slots;
	void **ptr;          /* per slot, per run */
	int *vslot;          /* per value id: its contiguous slot, or -1 */
	int n_steps, cap_steps;
	step *steps;
	int64_t arena_bytes; /* memplan's, then staging, then the flag */
	int64_t flag_off;
	bool flag_clear;     /* device targets: the flag is known to be 0 */
	bool unsynced;       /* has run since the last fz_exec_sync read its flag */
	void *stream;        /* the stream it last ran on */
	int64_t ws_off;      /* the matmuls' workspace (-1: none) */
	void *arena;
	void **pstage;       /* per parameter: its staging copy, made on need */
	int launches;
	void *graph;         /* fz_exec_run_graph: the run captured, or NULL */
	fz_tensor *g_in;     /* the inputs it was captured with */
	void **g_out;        /* and the outputs' pointers */
	int g_n_in, g_n_out;
	double *prof_s;      /* FUSEC_PROFILE: seconds per step, summed */
	int64_t prof_runs;
} pplan;

struct fz_exec {
	uint32_t magic;
	const fz_trace *t;
	fz_device *dev;
	fz_exec_options o;
	fz_disk *disk;
	fz_kctx *kx;
	pplan **plans;       /* most recently used first */
	int n_plans;
	fz_exec_stats st;
	char device[16];
	struct fz_comm *comm; /* fz_exec_set_comm: world N; NULL: world 1 */
	int rank;
	long host_syncs;      /* the device's host syncs inside runs */
	int32_t lost_flag;    /* the flag of a plan that left the LRU unsynced */
	bool profile;         /* FUSEC_PROFILE: time every step */
	atomic_bool busy;     /* a thread is inside run, sync or profile (claim) */
};

static void pplan_free(fz_exec *x, pplan *pp)
{
	if (!pp)
		return;
	fz_device *dev = x->dev;
	for (int i = 0; i < pp->n_steps; i++)
		if (pp->steps[i].pk)
			dev->tg->unpack(dev, pp->steps[i].pk);
	if (pp->graph)
		dev->tg->graph_free(dev, pp->graph);
	free(pp->g_in);
	free(pp->g_out);
	if (pp->arena) {
		if (x->o.release)
			x->o.release(x->o.alloc_ctx, pp->arena);
		else
			dev->tg->release(dev, pp->arena);
	}
	for (int i = 0; pp->pstage && i < x->t->n_params; i++)
		if (pp->pstage[i])
			dev->tg->release(dev, pp->pstage[i]);
	free(pp->pstage);
	free(pp->slots);
	free(pp->ptr);
	free(pp->vslot);
	free(pp->steps);
	free(pp->prof_s);
	fz_kset_free(pp->ks);
	fz_program_free(pp->p);
	fz_arena_release(&pp->mem);
	free(pp);
}

typedef struct builder {
	fz_exec *x;
	pplan *pp;
	const fz_trace *t;
	const fz_program *p;
	const int64_t *syms;
	fz_status st;
	char **err;
	int *ev_of;          /* per region: its collective's event, or -1 */
	int n_ev;            /* events handed out: one per collective region */
} builder;

static void fail(builder *B, fz_status st, char *msg)
{
	if (B->st == FZ_OK) {
		B->st = st;
		fz_set_err(B->err, msg ? msg : fz_strdup("out of memory"));
	} else {
		free(msg);
	}
}

static int add_slot(builder *B, uint8_t base, int idx, int64_t off)
{
	pplan *pp = B->pp;
	if (pp->n_slots == pp->cap_slots) {
		int nc = pp->cap_slots ? 2 * pp->cap_slots : 64;
		slot *ns = realloc(pp->slots, sizeof *ns * (size_t)nc);
		if (!ns) {
			fail(B, FZ_ENOMEM, NULL);
			return -1;
		}
		pp->slots = ns;
		pp->cap_slots = nc;
	}
	pp->slots[pp->n_slots] = (slot){base, idx, off};
	return pp->n_slots++;
}

/* A staging block of `bytes` after memplan's arena. */
static int stage(builder *B, int64_t bytes)
{
	int64_t off = B->pp->arena_bytes;
	B->pp->arena_bytes += round_up(bytes > 0 ? bytes : 1);
	return add_slot(B, B_ARENA, 0, off);
}

static step *add_step(builder *B, uint8_t kind, int region)
{
	pplan *pp = B->pp;
	if (B->st != FZ_OK)
		return NULL;
	if (pp->n_steps == pp->cap_steps) {
		int nc = pp->cap_steps ? 2 * pp->cap_steps : 32;
		step *ns = realloc(pp->steps, sizeof *ns * (size_t)nc);
		if (!ns) {
			fail(B, FZ_ENOMEM, NULL);
			return NULL;
		}
		pp->steps = ns;
		pp->cap_steps = nc;
	}
	step *s = &pp->steps[pp->n_steps++];
	memset(s, 0, sizeof *s);
	s->kind = kind;
	s->region = region;
	s->sbias = -1;
	return s;
}

static int64_t value_bytes(builder *B, const fz_value *v)
{
	int64_t n = fz_type_numel_at(&v->type, B->syms);
	return (n > 0 ? n : 0) * (int64_t)fz_dtype_size(v->type.dtype);
}


static void add_kernel(builder *B, const fz_kinst *ki);

/* A slot for a view's elements read where they lie: the layout's offset
 * (in elements of es bytes) into its root's slot rs. */
static int slot_into(builder *B, int rs, const fz_layout *lay, size_t es)
{
	slot r = B->pp->slots[rs];
	return add_slot(B, r.base, r.idx, r.off + lay->offset * (int64_t)es);
}

/* The slot of v's elements, contiguous: emits the copy of a strided view
 * or the copy kernel of a reshape that is not a view, the first time. */
static int need(builder *B, const fz_value *v)
{
	pplan *pp = B->pp;
	if (B->st != FZ_OK)
		return -1;
	if (pp->vslot[v->id] >= 0)
		return pp->vslot[v->id];
	const fz_program *p = B->p;
	if (!p->view_of || !p->view_of[v->id]) {
		fail(B, FZ_EINVAL, fz_strdup_printf("value #%d is read before it "
						    "is made", v->id));
		return -1;
	}
	fz_layout lay;
	if (fz_view_eval(p, v, B->syms, &lay) != FZ_OK) {
		const fz_kinst *ki = B->pp->ks->copy[v->id];
		if (!ki) {
			fail(B, FZ_EINVAL, fz_strdup_printf("value #%d: no copy kernel "
							    "was made", v->id));
			return -1;
		}
		add_kernel(B, ki); /* sets vslot[v] */
		return pp->vslot[v->id];
	}
	fz_value *root = fz_view_root(p, (fz_value *)v);
	int rs = pp->vslot[root->id];
	if (rs < 0) {
		fail(B, FZ_EINVAL, fz_strdup_printf("value #%d is a view of #%d, "
			"which has no storage", v->id, root->id));
		return -1;
	}
	size_t es = fz_dtype_size(v->type.dtype);
	int s;
	if (fz_layout_is_contiguous(&lay)) {
		s = slot_into(B, rs, &lay, es);
	} else {
		s = stage(B, value_bytes(B, v));
		step *c = add_step(B, S_COPY, -1);
		if (c) {
			c->sx = rs;
			c->sy = s;
			c->lay = lay;
			c->es = es;
		}
	}
	pp->vslot[v->id] = s;
	return s;
}

/* The slot a kernel writes v into: its own storage, or a staging block
 * for a value with none (inside a region run per op, or a reshape's
 * copy). */
static int out_slot(builder *B, const fz_value *v)
{
	pplan *pp = B->pp;
	if (pp->vslot[v->id] < 0)
		pp->vslot[v->id] = stage(B, value_bytes(B, v));
	return pp->vslot[v->id];
}

static void add_kernel(builder *B, const fz_kinst *ki)
{
	const fz_region *r = &ki->view;
	int n = r->n_in + r->n_out;
	int *args = fz_arena_alloc(&B->pp->mem, sizeof *args * (size_t)(n + 1));
	void **bufs = fz_arena_alloc(&B->pp->mem, sizeof *bufs * (size_t)(n + 1));
	if (!args || !bufs) {
		fail(B, FZ_ENOMEM, NULL);
		return;
	}
	for (int i = 0; i < r->n_in; i++)
		args[i] = need(B, r->in[i]);
	for (int i = 0; i < r->n_out; i++)
		args[r->n_in + i] = out_slot(B, r->out[i]);
	/* a host kernel's scratch (an index's inverse): a staging block of its
	 * own after its outputs, which no other step reads */
	const fz_kernel *k = &ki->code->k;
	if (k->n_scratch > 0) {
		int64_t bytes = 0;
		for (int i = 0; i < k->n_scratch && i < 2; i++)
			bytes += fz_ext_eval(k->scratch[i], B->syms);
		args[n++] = stage(B, bytes);
	}
	step *s = add_step(B, S_KERNEL, ki->region);
	if (!s)
		return;
	s->ki = ki;
	s->n_args = n;
	s->args = args;
	s->bufs = bufs;
}

/* A product's operand read where it lies, not gathered: v is a strided
 * view whose matrices (its last two dims) have contiguous rows, or
 * contiguous columns (*trans: the operand seen as its transpose, as
 * linear's weight is), at non-negative strides. Its slot, layout and row
 * stride; -1: need() gathers it. Attention's transposed k and permuted q
 * and v are such views, and so is the transposed activation or gradient
 * of every weight gradient (dW = dYᵀ·X: a, [N, M] read down its columns;
 * gathered, these copies were 5% of the Llama backward at hidden 1024). */
static int matrix_in_place(builder *B, const fz_value *v, fz_layout *lay, int64_t *ld,
			   bool *trans)
{
	const fz_program *p = B->p;
	pplan *pp = B->pp;
	if (pp->vslot[v->id] >= 0 || !p->view_of || !p->view_of[v->id] ||
	    fz_view_eval(p, v, B->syms, lay) != FZ_OK)
		return -1;
	int r = lay->rank;
	if (r < 2 || fz_layout_is_contiguous(lay))
		return -1;
	for (int d = 0; d < r; d++)
		if (lay->strides[d] < 0)
			return -1;
	int64_t rows = lay->shape[r - 2], cols = lay->shape[r - 1];
	int64_t sr = lay->strides[r - 2], sc = lay->strides[r - 1];
	*trans = false;
	if ((sc == 1 || cols == 1) && sr >= cols && sr > 0 && sr <= INT32_MAX) {
		*ld = sr;
	} else if ((sr == 1 || rows == 1) && sc >= rows && sc > 0 &&
		   sc <= INT32_MAX) {
		*ld = sc;
		*trans = true;
	} else {
		return -1;
	}
	const fz_value *root = fz_view_root(p, (fz_value *)v);
	int rs = pp->vslot[root->id];
	return rs < 0 ? -1 : slot_into(B, rs, lay, fz_dtype_size(v->type.dtype));
}

/* torch.matmul and linear as one fz_matmul at the bound sizes. */
static void add_library(builder *B, const fz_region *reg)
{
	const fz_node *n = reg->nodes[0];
	const fz_value *a = n->in[0], *b = n->in[1], *y = n->out[0];
	/* operands first: their copies are steps that must come before */
	fz_layout la, lb;
	int64_t lda = 0, ldb = 0;
	bool ta = false, tb = false;
	bool strided = B->x->dev->tg->matmul_strided && n->op == FZ_OP_MATMUL;
	int ka = strided ? matrix_in_place(B, a, &la, &lda, &ta) : -1;
	int kb = strided ? matrix_in_place(B, b, &lb, &ldb, &tb) : -1;
	if (ka < 0) {
		lda = 0;
		ka = need(B, a);
	}
	if (kb < 0) {
		ldb = 0;
		kb = need(B, b);
	}
	int kbias = n->n_in == 3 ? need(B, n->in[2]) : -1;
	int ky = out_slot(B, y);
	step *s = add_step(B, S_MATMUL, reg->id);
	if (!s)
		return;
	s->sa = ka;
	s->sb = kb;
	s->sbias = kbias;
	s->sy = ky;
	fz_matmul *m = &s->mm;
	m->region = reg->id;
	m->dtype = y->type.dtype;
	int64_t sa[FZ_MAX_RANK] = {0}, sb[FZ_MAX_RANK] = {0};
	int ra = a->type.rank, rb = b->type.rank;
	for (int d = 0; d < ra; d++)
		sa[d] = fz_ext_eval(a->type.dims[d], B->syms);
	for (int d = 0; d < rb; d++)
		sb[d] = fz_ext_eval(b->type.dims[d], B->syms);
	if (n->op == FZ_OP_LINEAR) {
		m->K = sa[ra - 1];
		m->N = sb[0];
		m->M = 1;
		for (int d = 0; d < ra - 1; d++)
			m->M *= sa[d];
		m->b_trans = true;
		return;
	}
	m->M = ra >= 2 ? sa[ra - 2] : 1;
	m->K = sa[ra - 1];
	m->N = rb >= 2 ? sb[rb - 1] : 1;
	int ab = ra > 2 ? ra - 2 : 0, bb = rb > 2 ? rb - 2 : 0;
	int nbd = ab > bb ? ab : bb;
	int64_t as = m->M * m->K, bs = m->K * m->N;
	m->nbd = nbd;
	m->lda = lda;
	m->ldb = ldb;
	m->b_trans = tb;
	m->a_trans = ta;
	for (int i = nbd - 1; i >= 0; i--) {
		int ia = i - (nbd - ab), ib = i - (nbd - bb);
		int64_t ea = ia >= 0 ? sa[ia] : 1, eb = ib >= 0 ? sb[ib] : 1;
		m->bshape[i] = ea == 1 ? eb : ea;
		m->a_bstride[i] = ea == 1 ? 0 : lda ? la.strides[ia] : as;
		m->b_bstride[i] = eb == 1 ? 0 : ldb ? lb.strides[ib] : bs;
		as *= ea;
		bs *= eb;
	}
}

static bool same_place(const pplan *pp, int a, int b)
{
	const slot *x = &pp->slots[a], *y = &pp->slots[b];
	return a == b || (x->base == y->base && x->idx == y->idx && x->off == y->off);
}

/* A collective region (one collective, or a bucket of all-gathers: one
 * step each, back to back) or a wait region (a wait, or a bucket's waits):
 * the compute stream waits on the collective's event, then the future's
 * bytes become the tensor's, in place where memplan gave the wait the
 * future's buffer (ir/comm.c), else by a copy. */
static void add_collective(builder *B, const fz_region *reg)
{
	for (int j = 0; j < reg->n_nodes && B->st == FZ_OK; j++) {
		const fz_node *n = reg->nodes[j];
		const fz_value *x = n->in[0], *y = n->out[0];
		int sx = need(B, x), sy = out_slot(B, y);
		if (B->st != FZ_OK)
			return;
		/* events numbered by collective region, in order: a bucket's
		 * members and their waits share one */
		int cr = B->p->region_of[(reg->kind == FZ_REGION_WAIT ? x->def : n)->id];
		if (reg->kind == FZ_REGION_COLLECTIVE && j == 0)
			B->ev_of[cr] = B->n_ev++;
		int ev = B->ev_of[cr];
		if (reg->kind == FZ_REGION_WAIT) {
			step *w = add_step(B, S_WAIT, reg->id);
			if (!w)
				return;
			w->co.event = ev;
			if (same_place(B->pp, sx, sy))
				continue;
		}
		step *s = add_step(B, reg->kind == FZ_REGION_WAIT ? S_COPY : S_COLL,
				   reg->id);
		if (!s)
			return;
		s->sx = sx;
		s->sy = sy;
		s->es = fz_dtype_size(x->type.dtype);
		if (reg->kind == FZ_REGION_WAIT) {
			if (!fz_layout_contiguous(x, B->syms, &s->lay))
				fail(B, FZ_EINVAL, fz_strdup("a tensor too large to lay out"));
			continue;
		}
		fz_collective *c = &s->co;
		c->region = reg->id;
		c->event = ev;
		c->bucket = reg->n_nodes < 2 ? 0 : j == 0 ? 1 : j == reg->n_nodes - 1 ? 3 : 2;
		c->dtype = x->type.dtype;
		c->kind = n->op == FZ_OP_ALL_GATHER ? FZ_COLL_ALL_GATHER
			  : n->op == FZ_OP_REDUCE_SCATTER ? FZ_COLL_REDUCE_SCATTER
			  : FZ_COLL_ALL_REDUCE;
		int dim = n->op == FZ_OP_ALL_REDUCE ? -1 : (int)n->attrs.dim;
		c->outer = c->inner = 1;
		c->extent = 1;
		for (int d = 0; d < x->type.rank; d++) {
			int64_t e = fz_ext_eval(x->type.dims[d], B->syms);
			if (dim < 0 || d == dim)
				c->extent *= e;
			else if (d < dim)
				c->outer *= e;
			else
				c->inner *= e;
		}
	}
}

/* Slots for parameters, the outputs written in place, and memplan's
 * blocks; views are made on need. */
static void assign_slots(builder *B)
{
	const fz_trace *t = B->t;
	const fz_program *p = B->p;
	pplan *pp = B->pp;
	for (int v = 0; v < t->n_values; v++)
		pp->vslot[v] = -1;
	for (int i = 0; i < t->n_params; i++)
		pp->vslot[t->params[i]->id] = add_slot(B, B_PARAM, i, 0);
	for (int k = 0; k < t->n_outputs; k++) {
		const fz_value *v = t->outputs[k];
		if (v->param_index < 0 && pp->vslot[v->id] < 0 &&
		    fz_view_root(p, (fz_value *)v) == v)
			pp->vslot[v->id] = add_slot(B, B_OUT, k, 0);
	}
	/* an output that is a view of all of its root's bytes in order (a
	 * reshape, a squeeze: AOTAutograd's weight gradients are views of a
	 * product's result) has the root written into the caller's buffer,
	 * where it would have been copied there at the end (11 MB each,
	 * four per layer, in the Llama step at hidden 1024) */
	for (int k = 0; k < t->n_outputs; k++) {
		const fz_value *v = t->outputs[k];
		fz_value *root = fz_view_root(p, (fz_value *)v);
		fz_layout lay;
		if (root == v || v->param_index >= 0 || pp->vslot[v->id] >= 0 ||
		    root->param_index >= 0 || pp->vslot[root->id] >= 0 ||
		    p->offset[root->id] < 0 || fz_view_eval(p, v, B->syms, &lay) != FZ_OK ||
		    lay.offset != 0 || !fz_layout_is_contiguous(&lay) ||
		    value_bytes(B, v) != value_bytes(B, root))
			continue;
		pp->vslot[root->id] = add_slot(B, B_OUT, k, 0);
		pp->vslot[v->id] = add_slot(B, B_OUT, k, 0);
	}
	for (int v = 0; v < t->n_values; v++) {
		const fz_value *val = t->values[v];
		if (pp->vslot[v] >= 0 || val->param_index >= 0 ||
		    (p->view_of && p->view_of[v]) || p->offset[v] < 0)
			continue;
		pp->vslot[v] = add_slot(B, B_ARENA, 0, p->offset[v]);
	}
}

/* The trace's outputs not written in place: copied into the caller's
 * buffer at the end. */
static void add_output_copies(builder *B)
{
	const fz_trace *t = B->t;
	const fz_program *p = B->p;
	pplan *pp = B->pp;
	for (int k = 0; k < t->n_outputs && B->st == FZ_OK; k++) {
		const fz_value *v = t->outputs[k];
		int s = pp->vslot[v->id];
		if (s >= 0 && pp->slots[s].base == B_OUT && pp->slots[s].idx == k)
			continue;
		fz_layout lay;
		int src;
		fz_value *root = fz_view_root(p, (fz_value *)v);
		if (root != v && fz_view_eval(p, v, B->syms, &lay) == FZ_OK) {
			src = pp->vslot[root->id];
		} else {
			src = need(B, v);
			if (!fz_layout_contiguous(v, B->syms, &lay))
				fail(B, FZ_EINVAL, fz_strdup("a tensor too large to lay out"));
		}
		int dst = add_slot(B, B_OUT, k, 0);
		step *c = add_step(B, S_COPY, -1);
		if (!c || src < 0)
			continue;
		c->sx = src;
		c->sy = dst;
		c->lay = lay;
		c->es = fz_dtype_size(v->type.dtype);
	}
}

static fz_status prepare(fz_exec *x, const int64_t *syms, pplan **out, char **err)
{
	double t0 = fz_now();
	const fz_trace *t = x->t;
	pplan *pp = calloc(1, sizeof *pp);
	if (!pp) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	memcpy(pp->syms, syms, sizeof(int64_t) * (size_t)t->n_syms);
	fz_plan_options po;
	fz_plan_defaults(&po);
	po.sym_sizes = syms;
	/* a program planned before at these sizes comes from the disk cache
	 * (cache/plan_cache.c); without one, it is planned */
	fz_status st = fz_plan_cached(x->disk, t, &po, &pp->p, NULL, err);
	if (st == FZ_OK)
		st = fz_kset_build(x->kx, pp->p, syms, &pp->ks, err);
	if (st != FZ_OK) {
		pplan_free(x, pp);
		return st;
	}
	const fz_program *p = pp->p;
	builder B = {x, pp, t, p, pp->syms, FZ_OK, err, NULL, 0};
	B.ev_of = fz_arena_alloc(&pp->mem, sizeof(int) * ((size_t)p->n_regions + 1));
	if (!B.ev_of)
		fail(&B, FZ_ENOMEM, NULL);
	pp->vslot = malloc(sizeof *pp->vslot * ((size_t)t->n_values + 1));
	pp->pstage = calloc((size_t)t->n_params + 1, sizeof *pp->pstage);
	if (!pp->vslot || !pp->pstage)
		fail(&B, FZ_ENOMEM, NULL);
	pp->arena_bytes = round_up(p->arena_bytes);
	if (B.st == FZ_OK)
		assign_slots(&B);
	for (int i = 0; i < p->n_regions && B.st == FZ_OK; i++) {
		const fz_region *reg = p->regions[p->order[i]];
		switch (reg->kind) {
		case FZ_REGION_VIEW:
			break;
		case FZ_REGION_LIBRARY:
			add_library(&B, reg);
			break;
		case FZ_REGION_COLLECTIVE:
		case FZ_REGION_WAIT:
			add_collective(&B, reg);
			break;
		default:
			if (pp->ks->joined[reg->id])
				break; /* an earlier region's kernel made its values */
			if (pp->ks->ops[reg->id])
				for (int j = 0; j < reg->n_nodes; j++) {
					/* a product of an attention region the
					 * target has no kernel for: a library call */
					fz_node *nd = reg->nodes[j];
					fz_region one = {.id = reg->id, .kind = FZ_REGION_LIBRARY,
							 .n_nodes = 1, .nodes = &nd};
					if (fz_ops[nd->op].cls == FZ_CLASS_LIBRARY)
						add_library(&B, &one);
					else if (pp->ks->ops[reg->id][j]) /* else split
						* in two (fz_scatter_split) */
						add_kernel(&B, pp->ks->ops[reg->id][j]);
				}
			else if (pp->ks->whole[reg->id])
				add_kernel(&B, pp->ks->whole[reg->id]);
			else
				fail(&B, FZ_EINVAL, fz_strdup_printf("region %d has no "
								     "kernel", reg->id));
		}
	}
	if (B.st == FZ_OK)
		add_output_copies(&B);
	pp->flag_off = pp->arena_bytes;
	pp->arena_bytes += BLOCK;
	/* the library's scratch, shared by the plan's matmuls (one stream) */
	pp->ws_off = -1;
	for (int i = 0; i < pp->n_steps && x->dev->tg->matmul_workspace; i++)
		if (pp->steps[i].kind == S_MATMUL) {
			pp->ws_off = (pp->arena_bytes + 255) / 256 * 256;
			pp->arena_bytes = pp->ws_off +
					  (int64_t)x->dev->tg->matmul_workspace;
			break;
		}
	if (B.st == FZ_OK && !(pp->ptr = calloc((size_t)pp->n_slots + 1, sizeof *pp->ptr)))
		fail(&B, FZ_ENOMEM, NULL);
	if (B.st == FZ_OK) {
		fz_device *dev = x->dev;
		if (x->o.alloc) {
			pp->arena = x->o.alloc(x->o.alloc_ctx, (size_t)pp->arena_bytes);
			if (!pp->arena)
				fail(&B, FZ_ENOMEM, fz_strdup_printf("the caller's "
					"allocator gave no arena of %lld bytes",
					(long long)pp->arena_bytes));
		} else {
			B.st = dev->tg->alloc(dev, (size_t)pp->arena_bytes, &pp->arena, err);
		}
	}
	/* a target that can fixes each launch now: geometry, parameters */
	int32_t *flag = pp->arena ? (int32_t *)((char *)pp->arena + pp->flag_off) : NULL;
	for (int i = 0; i < pp->n_steps && B.st == FZ_OK && x->dev->tg->pack; i++) {
		step *s = &pp->steps[i];
		if (s->kind != S_KERNEL)
			continue;
		const fz_kcode_rec *c = s->ki->code;
		B.st = x->dev->tg->pack(x->dev, &c->k, c->fn, s->bufs, pp->syms, flag,
					&s->pk, err);
	}
	if (B.st != FZ_OK) {
		pplan_free(x, pp);
		return B.st;
	}
	x->st.plans++;
	x->st.prepare_seconds += fz_now() - t0;
	*out = pp;
	return FZ_OK;
}

/* ---- the public API ---------------------------------------------------------- */

void fz_exec_options_init(fz_exec_options *o)
{
	memset(o, 0, sizeof *o);
	o->disk_cache = 1;
	o->max_plans = 8;
}

static void warn_stderr(void *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "fusec: %s\n", msg);
}

static bool live(const fz_exec *x, char **err)
{
	if (x && x->magic == EXEC_MAGIC)
		return true;
	fz_set_err(err, fz_strdup(x && x->magic == EXEC_DEAD ? "the fz_exec was freed"
			       : "not an fz_exec handle"));
	return false;
}

/* One fz_exec runs on one thread at a time (fusec.h). Two threads inside
 * it at once would bind their pointers into the same plan and compute in
 * the same arena, each from the other's intermediates: wrong results at
 * best, a corrupted heap when one of them replans. So the entry points
 * that touch the plans claim x first, and a second thread is refused with
 * an error that says why, instead of racing (one atomic exchange a run). */
static bool claim(fz_exec *x, const char *what, char **err)
{
	if (!live(x, err))
		return false;
	if (!atomic_exchange_explicit(&x->busy, true, memory_order_acquire))
		return true;
	fz_set_err(err, fz_strdup_printf("%s: this fz_exec is running already, on another "
					 "thread or in the call this one comes from (one fz_exec "
					 "runs on one thread at a time: hold a lock around it, "
					 "or make one per thread)", what));
	return false;
}

static void let_go(fz_exec *x) { atomic_store_explicit(&x->busy, false, memory_order_release); }

fz_status fz_exec_new(const fz_trace *t, const char *device,
		      const fz_exec_options *o, fz_exec **out, char **err)
{
	if (err)
		*err = NULL;
	if (!out) {
		fz_set_err(err, fz_strdup("fz_exec_new: out is NULL"));
		return FZ_EINVAL;
	}
	*out = NULL;
	if (!t) {
		fz_set_err(err, fz_strdup("fz_exec_new: trace is NULL"));
		return FZ_EINVAL;
	}
	fz_exec_options def;
	if (!o) {
		fz_exec_options_init(&def);
		o = &def;
	}
	if (!device)
		device = "auto";
	const fz_target *tg = fz_target_find(strcmp(device, "auto") ? device : "cpu");
	if (!tg && !strcmp(device, "cuda")) {
		fz_set_err(err, fz_strdup("no CUDA device: this build of fusec has no "
				       "CUDA target"));
		return FZ_EUNSUPPORTED;
	}
	if (!tg) {
		fz_set_err(err, fz_strdup_printf("unknown device '%s' (devices: auto, %s)",
					      device, fz_target_names()));
		return FZ_EINVAL;
	}
	fz_status st = fz_trace_verify(t, err);
	if (st != FZ_OK)
		return st;
	fz_exec *x = calloc(1, sizeof *x);
	if (!x) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	x->magic = EXEC_MAGIC;
	const char *prof = getenv("FUSEC_PROFILE");
	x->profile = prof && prof[0] && strcmp(prof, "0");
	x->t = t;
	x->o = *o;
	if (!x->o.warn)
		x->o.warn = warn_stderr;
	if (x->o.max_plans < 1)
		x->o.max_plans = 1;
	if (!strcmp(device, "auto")) {
		/* the GPU where one exists, else the CPU, said once */
		const fz_target *cuda = fz_target_find("cuda");
		char *why = NULL;
		if (cuda && cuda->open(&x->o, &x->dev, &why) == FZ_OK) {
			tg = cuda;
		} else {
			x->dev = NULL;
			x->o.warn(x->o.warn_ctx, "no CUDA device; running on the CPU");
		}
		free(why);
	}
	if (!x->dev && (st = tg->open(&x->o, &x->dev, err)) != FZ_OK)
		goto fail;
	snprintf(x->device, sizeof x->device, "%s", x->dev->tg->name);
	x->plans = calloc((size_t)x->o.max_plans, sizeof *x->plans);
	if (!x->plans) {
		st = FZ_ENOMEM;
		goto fail;
	}
	if (x->o.disk_cache) {
		fz_disk_options dopt = {x->o.cache_dir, 0, x->o.warn, x->o.warn_ctx};
		if ((st = fz_disk_open(&dopt, &x->disk, err)) != FZ_OK)
			goto fail;
	}
	fz_kctx_options ko = {x->dev->cg, x->disk, x->dev,
			      x->dev->cg.target == FZ_CG_NVPTX, 0, NULL, NULL};
	if ((st = fz_kctx_new(&ko, &x->kx, err)) != FZ_OK)
		goto fail;
	*out = x;
	return FZ_OK;
fail:
	if (st == FZ_ENOMEM && err && !*err)
		fz_set_err(err, fz_strdup("out of memory"));
	fz_exec_free(x);
	return st;
}

void fz_exec_free(fz_exec *x)
{
	if (!x || x->magic != EXEC_MAGIC)
		return;
	for (int i = 0; i < x->n_plans; i++)
		pplan_free(x, x->plans[i]);
	free(x->plans);
	fz_kctx_free(x->kx);
	fz_disk_close(x->disk);
	fz_device_release(x->dev);
	x->magic = EXEC_DEAD;
	free(x);
}

fz_device *fz_exec_dev(const fz_exec *x)
{
	return x && x->magic == EXEC_MAGIC ? x->dev : NULL;
}

const char *fz_exec_device(const fz_exec *x)
{
	return x && x->magic == EXEC_MAGIC ? x->device : NULL;
}

const fz_exec_stats *fz_exec_stats_of(const fz_exec *x)
{
	((fz_exec *)x)->st.k = *fz_kctx_stats(x->kx);
	return &x->st;
}

const fz_program *fz_exec_plan(const fz_exec *x)
{
	return x->n_plans ? x->plans[0]->p : NULL;
}

/* A plan's flag word (an index out of range, as the kernels report it),
 * as the host sees it after the work queued on stream. */
static fz_status read_flag(fz_exec *x, const pplan *pp, void *stream, int32_t *flag,
			   char **err)
{
	fz_device *dev = x->dev;
	const int32_t *f = (const int32_t *)((char *)pp->arena + pp->flag_off);
	if (dev->tg->host_memory) {
		*flag = *f;
		return FZ_OK;
	}
	return dev->tg->download(dev, flag, f, sizeof *flag, stream, err);
}

/* A plan that leaves the LRU before fz_exec_sync read its flag (a device
 * target's runs at many sizes): the flag is read now, before its arena
 * goes (the download waits for the stream it last ran on), and kept for
 * the next sync, so that an index out of range is not lost with it. */
static fz_status keep_flag(fz_exec *x, pplan *pp, char **err)
{
	if (!pp->unsynced || x->dev->tg->host_memory)
		return FZ_OK;
	int32_t flag = 0;
	fz_status st = read_flag(x, pp, pp->stream, &flag, err);
	if (st == FZ_OK && flag && !x->lost_flag)
		x->lost_flag = flag;
	return st;
}

/* Binds the sizes and finds (or prepares) the plan for them, most
 * recently used first. */
static fz_status bind_plan(fz_exec *x, const int64_t *sym_sizes,
			   const fz_tensor *in, int n_in, int64_t *syms, pplan **out,
			   char **err)
{
	const fz_trace *t = x->t;
	for (int s = 0; s < t->n_syms; s++)
		syms[s] = sym_sizes ? sym_sizes[s] : -1;
	fz_status st = fz_trace_bind(t, in, n_in, syms, err);
	if (st != FZ_OK)
		return st;
	size_t sb = sizeof(int64_t) * (size_t)t->n_syms;
	for (int i = 0; i < x->n_plans; i++) {
		pplan *pp = x->plans[i];
		if (memcmp(pp->syms, syms, sb))
			continue;
		memmove(&x->plans[1], &x->plans[0], sizeof *x->plans * (size_t)i);
		x->plans[0] = pp;
		*out = pp;
		return FZ_OK;
	}
	pplan *pp = NULL;
	if ((st = prepare(x, syms, &pp, err)) != FZ_OK)
		return st;
	if (x->n_plans == x->o.max_plans) {
		pplan *old = x->plans[--x->n_plans];
		st = keep_flag(x, old, err);
		pplan_free(x, old);
		if (st != FZ_OK) {
			pplan_free(x, pp);
			return st;
		}
	}
	memmove(&x->plans[1], &x->plans[0], sizeof *x->plans * (size_t)x->n_plans);
	x->plans[0] = pp;
	x->n_plans++;
	*out = pp;
	return FZ_OK;
}

fz_status fz_exec_prepare(fz_exec *x, const int64_t *sym_sizes,
			  const fz_tensor *inputs, int n_in, char **err)
{
	if (err)
		*err = NULL;
	if (!live(x, err))
		return FZ_EINVAL;
	int64_t syms[FZ_MAX_SYMS];
	pplan *pp = NULL;
	fz_status st = bind_plan(x, sym_sizes, inputs, n_in, syms, &pp, err);
	if (st == FZ_OK) {
		x->st.regions = pp->p->n_regions;
		x->st.steps = pp->n_steps;
		x->st.arena_bytes = pp->arena_bytes;
	}
	return st;
}

static const char *out_desc(const fz_trace *t, int k, char *buf, size_t n)
{
	const fz_value *v = t->outputs[k];
	if (v->name)
		snprintf(buf, n, "output %d ('%s')", k, v->name);
	else
		snprintf(buf, n, "output %d", k);
	return buf;
}

/* The caller's output buffers: dtype, shape, contiguous and aligned. */
static fz_status check_outputs(fz_exec *x, const int64_t *syms, fz_tensor *out,
			       int n_out, char **err)
{
	const fz_trace *t = x->t;
	char d[160];
	if (n_out != t->n_outputs || (n_out && !out)) {
		fz_set_err(err, fz_strdup_printf("trace '%s' returns %d value%s; %d "
			"output tensors given", t->name, t->n_outputs,
			t->n_outputs == 1 ? "" : "s", n_out));
		return FZ_EINVAL;
	}
	for (int k = 0; k < n_out; k++) {
		const fz_value *v = t->outputs[k];
		const fz_tensor *o = &out[k];
		if (o->dtype != v->type.dtype || o->rank != v->type.rank) {
			fz_set_err(err, fz_strdup_printf("%s is given a %s tensor of rank %d; "
				"expected %s of rank %d", out_desc(t, k, d, sizeof d),
				fz_dtype_name(o->dtype), o->rank,
				fz_dtype_name(v->type.dtype), v->type.rank));
			return FZ_EINVAL;
		}
		int64_t acc = 1;
		for (int i = v->type.rank - 1; i >= 0; i--) {
			int64_t e = fz_ext_eval(v->type.dims[i], syms);
			if (o->shape[i] != e) {
				fz_set_err(err, fz_strdup_printf("%s is given extent %lld in "
					"dim %d; expected %lld", out_desc(t, k, d, sizeof d),
					(long long)o->shape[i], i, (long long)e));
				return FZ_EINVAL;
			}
			if (e != 1 && o->strides[i] != acc) {
				fz_set_err(err, fz_strdup_printf("%s is not contiguous (dim %d "
					"has stride %lld; expected %lld)",
					out_desc(t, k, d, sizeof d), i,
					(long long)o->strides[i], (long long)acc));
				return FZ_EINVAL;
			}
			acc *= e;
		}
		if (acc > 0 && (!o->data || (uintptr_t)o->data % 16)) {
			fz_set_err(err, fz_strdup_printf("%s: data is %s", out_desc(t, k, d,
				sizeof d), o->data ? "not 16-byte aligned" : "NULL"));
			return FZ_EINVAL;
		}
	}
	return FZ_OK;
}

/* An input read in place, or its copy when it is strided or misaligned
 * (a kernel takes contiguous, 16-byte-aligned buffers). */
static bool in_place(const fz_tensor *in)
{
	int64_t acc = 1;
	bool ok = ((uintptr_t)in->data % 16) == 0;
	for (int d = in->rank - 1; d >= 0 && ok; d--) {
		ok = in->shape[d] == 1 || in->strides[d] == acc;
		acc *= in->shape[d];
	}
	return ok;
}

static void *input_ptr(fz_exec *x, pplan *pp, int i, const fz_tensor *in,
		       void *stream, fz_status *st, char **err)
{
	if (in_place(in))
		return in->data;
	fz_device *dev = x->dev;
	size_t es = fz_dtype_size(in->dtype);
	int64_t n = fz_type_numel_at(&x->t->params[i]->type, pp->syms);
	if (!pp->pstage[i] &&
	    (*st = dev->tg->alloc(dev, (size_t)(n > 0 ? n : 1) * es, &pp->pstage[i],
				  err)) != FZ_OK)
		return NULL;
	fz_layout lay = {in->rank, {0}, {0}, 0};
	memcpy(lay.shape, in->shape, sizeof lay.shape);
	memcpy(lay.strides, in->strides, sizeof lay.strides);
	*st = dev->tg->copy(dev, pp->pstage[i], in->data, es, &lay, stream, err);
	return *st == FZ_OK ? pp->pstage[i] : NULL;
}

static fz_status bad_index(fz_exec *x, int region, int32_t flag, char **err)
{
	const fz_trace *t = x->t;
	char where[64] = "";
	const char *op = "an op";
	if (flag > 0 && flag <= t->n_nodes) {
		const fz_node *n = t->nodes[flag - 1];
		op = fz_ops[n->op].name;
		if (n->line > 0)
			snprintf(where, sizeof where, " at %d:%d", n->line, n->col);
	}
	char reg[32] = "";
	if (region >= 0)
		snprintf(reg, sizeof reg, "region %d: ", region);
	/* the flag names the node; its op says which check it failed */
	const char *what = "an index is out of range (or an integer fmod divides "
			   "by zero)";
	if (flag > 0 && flag <= t->n_nodes) {
		fz_opcode o = t->nodes[flag - 1]->op;
		what = fz_ops[o].cls == FZ_CLASS_INDEXING ? "an index is out of range" :
		       o == FZ_OP_FMOD ? "an integer fmod divides by zero" :
		       o == FZ_OP_AMAX || o == FZ_OP_AMIN || o == FZ_OP_ARGMAX ||
		       o == FZ_OP_ARGMIN ? "it reduces an extent of 0: there is no "
		       "maximum or minimum of no elements" : what;
	}
	fz_set_err(err, fz_strdup_printf("%s%s%s: %s", reg, op, where, what));
	return FZ_ERANGE;
}

void fz_exec_set_comm(fz_exec *x, struct fz_comm *c, int rank)
{
	x->comm = c;
	x->rank = rank;
}

long fz_exec_host_syncs(const fz_exec *x) { return x->host_syncs; }

/* A trace declared `world N` runs only as one of N ranks. */
static fz_status check_world(const fz_exec *x, char **err)
{
	int world = x->comm ? fz_comm_world(x->comm) : 1;
	if (x->t->world == world)
		return FZ_OK;
	fz_set_err(err, fz_strdup_printf("trace '%s' is written for world %d; this "
				      "program runs %d rank%s", x->t->name,
				      x->t->world, world, world == 1 ? "" :
				      "s"));
	return FZ_EINVAL;
}

static fz_status exec_run(fz_exec *x, const int64_t *sym_sizes,
			  const fz_tensor *in, int n_in, fz_tensor *out,
			  int n_out, void *stream, char **err);

fz_status fz_exec_run(fz_exec *x, const int64_t *sym_sizes, const fz_tensor *in,
		      int n_in, fz_tensor *out, int n_out, void *stream, char **err)
{
	if (err)
		*err = NULL;
	if (!claim(x, "fz_exec_run", err))
		return FZ_EINVAL;
	fz_status st = check_world(x, err);
	long syncs = fz_host_sync_count();
	if (st == FZ_OK)
		st = exec_run(x, sym_sizes, in, n_in, out, n_out, stream, err);
	x->host_syncs += fz_host_sync_count() - syncs;
	if (st != FZ_OK && x->comm) /* the other ranks must not wait for us */
		fz_comm_abort(x->comm, x->rank, err && *err ? *err : fz_status_name(st));
	let_go(x);
	return st;
}

static fz_status exec_run(fz_exec *x, const int64_t *sym_sizes,
			  const fz_tensor *in, int n_in, fz_tensor *out,
			  int n_out, void *stream, char **err)
{
	int64_t syms[FZ_MAX_SYMS];
	pplan *pp = NULL;
	fz_status st = bind_plan(x, sym_sizes, in, n_in, syms, &pp, err);
	if (st == FZ_OK)
		st = check_outputs(x, syms, out, n_out, err);
	if (st != FZ_OK)
		return st;
	fz_device *dev = x->dev;
	const fz_target *tg = dev->tg;
	void *ibase[64], **ib = ibase;
	if (n_in > 64 && !(ib = malloc(sizeof *ib * (size_t)n_in))) {
		fz_set_err(err, fz_strdup("out of memory"));
		return FZ_ENOMEM;
	}
	for (int i = 0; i < n_in && st == FZ_OK; i++)
		ib[i] = input_ptr(x, pp, i, &in[i], stream, &st, err);
	for (int k = 0; k < n_out && tg->fresh; k++) {
		size_t n = fz_dtype_size(out[k].dtype);
		for (int d = 0; d < out[k].rank; d++)
			n *= (size_t)out[k].shape[d];
		tg->fresh(dev, out[k].data, n);
	}
	char *arena = pp->arena;
	int32_t *flag = (int32_t *)(arena + pp->flag_off);
	static const int32_t zero = 0;
	if (st == FZ_OK && tg->host_memory)
		*flag = 0;
	else if (st == FZ_OK && !pp->flag_clear &&
		 (st = tg->zero ? tg->zero(dev, flag, sizeof zero, stream, err)
			: tg->upload(dev, flag, &zero, sizeof zero, stream, err)) == FZ_OK)
		pp->flag_clear = true;
	pp->unsynced = true;
	pp->stream = stream;
	for (int s = 0; s < pp->n_slots && st == FZ_OK; s++) {
		const slot *sl = &pp->slots[s];
		char *base = sl->base == B_ARENA ? arena
			     : sl->base == B_PARAM ? (char *)ib[sl->idx]
			     : (char *)out[sl->idx].data;
		pp->ptr[s] = base + sl->off;
	}
	void **ptr = pp->ptr;
	int launches = 0;
	if (x->profile && !pp->prof_s)
		pp->prof_s = calloc((size_t)pp->n_steps + 1, sizeof *pp->prof_s);
	double *prof = x->profile ? pp->prof_s : NULL; /* NULL: out of memory */
	if (prof)
		pp->prof_runs++;
	for (int i = 0; i < pp->n_steps && st == FZ_OK; i++) {
		step *s = &pp->steps[i];
		double t0 = prof ? fz_now() : 0;
		switch (s->kind) {
		case S_KERNEL: {
			for (int a = 0; a < s->n_args; a++)
				s->bufs[a] = ptr[s->args[a]];
			const fz_kcode_rec *c = s->ki->code;
			st = s->pk ? tg->launch_packed(dev, s->pk, stream, err)
				   : tg->launch(dev, &c->k, c->fn, s->bufs, syms, flag,
						stream, err);
			launches++;
			if (st == FZ_OK && tg->host_memory && *flag)
				st = bad_index(x, s->region, *flag, err);
			break;
		}
		case S_MATMUL:
			s->mm.a = ptr[s->sa];
			s->mm.b = ptr[s->sb];
			s->mm.bias = s->sbias >= 0 ? ptr[s->sbias] : NULL;
			s->mm.y = ptr[s->sy];
			s->mm.workspace = pp->ws_off >= 0 ? arena + pp->ws_off : NULL;
			s->mm.workspace_bytes = pp->ws_off >= 0 ? tg->matmul_workspace : 0;
			st = tg->matmul(dev, &s->mm, stream, err);
			break;
		case S_COLL:
			s->co.x = ptr[s->sx];
			s->co.y = ptr[s->sy];
			s->co.comm = x->comm;
			s->co.rank = x->rank;
			st = tg->collective(dev, &s->co, stream, err);
			break;
		case S_WAIT: /* the compute stream waits; the host does not */
			st = tg->event_wait(dev, s->co.event, stream, err);
			break;
		case S_COPY:
			st = tg->copy(dev, ptr[s->sy], ptr[s->sx], s->es, &s->lay, stream,
				      err);
			break;
		}
		if (prof)
			prof[i] += fz_now() - t0;
	}
	if (ib != ibase)
		free(ib);
	x->st.launches = launches;
	x->st.regions = pp->p->n_regions;
	x->st.steps = pp->n_steps;
	x->st.arena_bytes = pp->arena_bytes;
	if (st != FZ_OK && err && !*err)
		fz_set_err(err, fz_strdup_printf("the run failed: %s", fz_status_name(st)));
	return st;
}

/* ---- the profile ---------------------------------------------------------------- */

static const char *const step_kinds[] = {"kernel", "matmul", "collective", "copy", "wait"};

static fz_status profile_text(fz_exec *x, int reset, char **out)
{
	fz_buf b = {0};
	fz_buf_puts(&b, "region\tkind\truns\tseconds\tflop\twhat\n");
	for (int p = 0; p < x->n_plans; p++) {
		pplan *pp = x->plans[p];
		for (int i = 0; out && pp->prof_s && i < pp->n_steps; i++) {
			const step *s = &pp->steps[i];
			fz_buf_printf(&b, "%d\t%s\t%lld\t%.9f\t", s->region, step_kinds[s->kind],
				      (long long)pp->prof_runs, pp->prof_s[i]);
			if (s->kind == S_MATMUL) {
				int64_t nb = 1;
				for (int d = 0; d < s->mm.nbd; d++)
					nb *= s->mm.bshape[d];
				double flop = 2.0 * (double)nb * (double)s->mm.M *
					      (double)s->mm.N * (double)s->mm.K;
				fz_buf_printf(&b, "%.0f\t%s %lldx%lldx%lld%s%s x%lld\n", flop,
					      fz_dtype_name(s->mm.dtype), (long long)s->mm.M,
					      (long long)s->mm.K, (long long)s->mm.N,
					      s->mm.a_trans ? " (a transposed)" : "",
					      s->mm.b_trans ? " (b transposed)" : "",
					      (long long)nb);
			} else if (s->kind == S_KERNEL && s->ki->region < 0 &&
				   s->ki->src.n_nodes == 1 && s->ki->node[0]->n_out == 1) {
				/* a reshape that no strides express: by its value */
				const fz_value *v = s->ki->node[0]->out[0];
				char ty[96];
				fz_buf_printf(&b, "0\treshape copy of %s %s\n",
					      v->name ? v->name : "(unnamed)",
					      fz_type_str(x->t, &v->type, ty, sizeof ty));
			} else if (s->kind == S_KERNEL) {
				fz_buf_printf(&b, "0\t%s of %d ops\n",
					      fz_region_kind_names[s->ki->src.kind],
					      s->ki->src.n_nodes);
			} else if (s->kind == S_COPY) {
				int64_t n = 1;
				fz_buf_printf(&b, "0\t%s[", pp->slots[s->sy].base == B_OUT ?
					      "into an output " : "staging ");
				for (int d = 0; d < s->lay.rank; d++) {
					n *= s->lay.shape[d];
					fz_buf_printf(&b, "%s%lld", d ? "," : "",
						      (long long)s->lay.shape[d]);
				}
				fz_buf_puts(&b, "] strides [");
				for (int d = 0; d < s->lay.rank; d++)
					fz_buf_printf(&b, "%s%lld", d ? "," : "",
						      (long long)s->lay.strides[d]);
				fz_buf_printf(&b, "], %lld bytes\n", (long long)(n * (int64_t)s->es));
			} else {
				fz_buf_puts(&b, "0\t-\n");
			}
		}
		if (reset && pp->prof_s) {
			memset(pp->prof_s, 0, sizeof *pp->prof_s * (size_t)pp->n_steps);
			pp->prof_runs = 0;
		}
	}
	if (!out) {
		free(b.data);
		return FZ_OK;
	}
	*out = fz_buf_take(&b);
	return *out ? FZ_OK : FZ_ENOMEM;
}

fz_status fz_exec_profile(fz_exec *x, int reset, char **out)
{
	if (out)
		*out = NULL;
	if (!claim(x, "fz_exec_profile", NULL))
		return FZ_EINVAL;
	fz_status st = profile_text(x, reset, out);
	let_go(x);
	return st;
}

/* ---- graphs -------------------------------------------------------------------- */

static bool same_tensor(const fz_tensor *a, const fz_tensor *b)
{
	if (a->data != b->data || a->dtype != b->dtype || a->rank != b->rank)
		return false;
	for (int d = 0; d < a->rank; d++)
		if (a->shape[d] != b->shape[d] || a->strides[d] != b->strides[d])
			return false;
	return true;
}

/* Whether pp's graph was captured with these inputs and outputs. */
static bool graph_fits(const pplan *pp, const fz_tensor *in, int n_in,
		       const fz_tensor *out, int n_out)
{
	if (!pp->graph || pp->g_n_in != n_in || pp->g_n_out != n_out)
		return false;
	for (int i = 0; i < n_in; i++)
		if (!same_tensor(&pp->g_in[i], &in[i]))
			return false;
	for (int k = 0; k < n_out; k++)
		if (pp->g_out[k] != out[k].data)
			return false;
	return true;
}

/* Captures one run of pp on stream as its graph. What a run would
 * allocate or reset on the way (staging for strided inputs, the flag
 * word) is done first, outside the capture. */
static fz_status capture(fz_exec *x, pplan *pp, const int64_t *syms,
			 const fz_tensor *in, int n_in, fz_tensor *out, int n_out,
			 void *stream, char **err)
{
	fz_device *dev = x->dev;
	const fz_target *tg = dev->tg;
	if (pp->graph) {
		tg->graph_free(dev, pp->graph);
		pp->graph = NULL;
	}
	fz_status st = FZ_OK;
	for (int i = 0; i < n_in && st == FZ_OK; i++) {
		int64_t n = fz_type_numel_at(&x->t->params[i]->type, pp->syms);
		if (!in_place(&in[i]) && !pp->pstage[i])
			st = tg->alloc(dev, (size_t)(n > 0 ? n : 1) * fz_dtype_size(in[i].dtype),
				       &pp->pstage[i], err);
	}
	fz_tensor *gi = malloc(sizeof *gi * ((size_t)n_in + 1));
	void **go = malloc(sizeof *go * ((size_t)n_out + 1));
	if (st == FZ_OK && (!gi || !go)) {
		fz_set_err(err, fz_strdup("out of memory"));
		st = FZ_ENOMEM;
	}
	if (st == FZ_OK)
		st = tg->capture_begin(dev, stream, err);
	if (st == FZ_OK) {
		st = exec_run(x, syms, in, n_in, out, n_out, stream, err);
		void *g = NULL;
		fz_status end = tg->capture_end(dev, stream, &g, st == FZ_OK ? err : NULL);
		if (st == FZ_OK)
			st = end;
		if (st == FZ_OK) {
			pp->graph = g;
			memcpy(gi, in, sizeof *gi * (size_t)n_in);
			for (int k = 0; k < n_out; k++)
				go[k] = out[k].data;
			free(pp->g_in);
			free(pp->g_out);
			pp->g_in = gi;
			pp->g_out = go;
			pp->g_n_in = n_in;
			pp->g_n_out = n_out;
			gi = NULL;
			go = NULL;
			x->st.graph_captures++;
		} else if (g) {
			tg->graph_free(dev, g);
		}
	}
	free(gi);
	free(go);
	return st;
}

static fz_status run_graph(fz_exec *x, const int64_t *sym_sizes, const fz_tensor *in,
			   int n_in, fz_tensor *out, int n_out, void *stream, char **err)
{
	fz_device *dev = x->dev;
	const fz_target *tg = dev->tg;
	if (!tg->capture_begin) {
		fz_set_err(err, fz_strdup_printf("device '%s' cannot capture a run into "
			"a graph (graphs are CUDA graphs: device cuda)", x->device));
		return FZ_EUNSUPPORTED;
	}
	if (!stream) {
		fz_set_err(err, fz_strdup("a graph is captured on a stream of the "
			"caller's; the legacy default stream (NULL) cannot be captured"));
		return FZ_EINVAL;
	}
	long syncs = fz_host_sync_count();
	int64_t syms[FZ_MAX_SYMS];
	pplan *pp = NULL;
	fz_status st = check_world(x, err);
	if (st == FZ_OK)
		st = bind_plan(x, sym_sizes, in, n_in, syms, &pp, err);
	if (st == FZ_OK)
		st = check_outputs(x, syms, out, n_out, err);
	static const int32_t zero = 0;
	int32_t *flag = pp ? (int32_t *)((char *)pp->arena + pp->flag_off) : NULL;
	if (st == FZ_OK && !pp->flag_clear &&
	    (st = tg->zero ? tg->zero(dev, flag, sizeof zero, stream, err)
		: tg->upload(dev, flag, &zero, sizeof zero, stream, err)) == FZ_OK)
		pp->flag_clear = true;
	if (pp) {
		pp->unsynced = true;
		pp->stream = stream;
	}
	if (st == FZ_OK && !graph_fits(pp, in, n_in, out, n_out))
		st = capture(x, pp, syms, in, n_in, out, n_out, stream, err);
	if (st == FZ_OK && (st = tg->graph_launch(dev, pp->graph, stream, err)) == FZ_OK)
		x->st.graph_launches++;
	x->host_syncs += fz_host_sync_count() - syncs;
	if (st != FZ_OK && x->comm)
		fz_comm_abort(x->comm, x->rank, err && *err ? *err : fz_status_name(st));
	return st;
}

fz_status fz_exec_run_graph(fz_exec *x, const int64_t *sym_sizes,
			    const fz_tensor *in, int n_in, fz_tensor *out,
			    int n_out, void *stream, char **err)
{
	if (err)
		*err = NULL;
	if (!claim(x, "fz_exec_run_graph", err))
		return FZ_EINVAL;
	fz_status st = run_graph(x, sym_sizes, in, n_in, out, n_out, stream, err);
	let_go(x);
	return st;
}

static fz_status sync_plans(fz_exec *x, void *stream, char **err)
{
	fz_device *dev = x->dev;
	fz_status st = dev->tg->sync(dev, stream, err);
	/* the flag of every binding that ran since the last sync: runs at
	 * other sizes (other plans) may be the ones that went out of range,
	 * and one that left the LRU since kept its flag (keep_flag) */
	int32_t flag = 0;
	for (int i = 0; i < x->n_plans && st == FZ_OK && !flag; i++) {
		pplan *pp = x->plans[i];
		if (!pp->unsynced)
			continue;
		pp->unsynced = false;
		if ((st = read_flag(x, pp, stream, &flag, err)) != FZ_OK)
			return st;
		if (flag && !dev->tg->host_memory)
			pp->flag_clear = false; /* cleared by the next run */
	}
	if (st != FZ_OK)
		return st;
	if (!flag)
		flag = x->lost_flag;
	x->lost_flag = 0;
	return flag ? bad_index(x, -1, flag, err) : FZ_OK;
}

fz_status fz_exec_sync(fz_exec *x, void *stream, char **err)
{
	if (err)
		*err = NULL;
	if (!claim(x, "fz_exec_sync", err))
		return FZ_EINVAL;
	fz_status st = sync_plans(x, stream, err);
	let_go(x);
	return st;
}

/* ---- one shot -------------------------------------------------------------------- */

fz_status fz_trace_run(const fz_trace *t, const char *device, const int64_t *sym_sizes,
		       const fz_tensor *inputs, int n_in, fz_tensor *outputs,
		       int n_out, char **err)
{
	if (err)
		*err = NULL;
	fz_exec_options o;
	fz_exec_options_init(&o);
	o.disk_cache = 0;
	o.max_plans = 1;
	fz_exec *x = NULL;
	fz_status st = fz_exec_new(t, device, &o, &x, err);
	int64_t syms[FZ_MAX_SYMS];
	if (st == FZ_OK) {
		for (int s = 0; s < t->n_syms; s++)
			syms[s] = sym_sizes ? sym_sizes[s] : -1;
		st = fz_trace_bind(t, inputs, n_in, syms, err);
	}
	if (st == FZ_OK && (n_out != t->n_outputs || (n_out && !outputs))) {
		fz_set_err(err, fz_strdup_printf("trace '%s' returns %d values; %d output "
					      "slots given", t->name, t->n_outputs, n_out));
		st = FZ_EINVAL;
	}
	if (st == FZ_OK && !x->dev->tg->host_memory) {
		fz_set_err(err, fz_strdup_printf("fz_trace_run takes host tensors; use "
			"fz_exec_run for device '%s'", x->device));
		st = FZ_EINVAL;
	}
	for (int k = 0; k < n_out && st == FZ_OK; k++) {
		const fz_value *v = t->outputs[k];
		int64_t shape[FZ_MAX_RANK], n = 1;
		for (int d = 0; d < v->type.rank; d++)
			n *= shape[d] = fz_ext_eval(v->type.dims[d], syms);
		size_t bytes = (size_t)n * fz_dtype_size(v->type.dtype);
		fz_tensor_contiguous(&outputs[k], aligned_alloc(64, (bytes + 63) / 64 * 64 + 64),
				     v->type.dtype, v->type.rank, shape);
		if (!outputs[k].data) {
			fz_set_err(err, NULL);
			st = FZ_ENOMEM;
		}
	}
	if (st == FZ_OK)
		st = fz_exec_run(x, syms, inputs, n_in, outputs, n_out, NULL, err);
	if (st != FZ_OK)
		for (int k = 0; k < n_out && k < t->n_outputs && outputs; k++) {
			free(outputs[k].data);
			outputs[k].data = NULL;
		}
	fz_exec_free(x);
	return st;
}
