/*
 * bookend.c: meta ops at the edges of regions become views.
 *
 * A reshape, permute, slice, squeeze, unsqueeze or broadcast_in_dim that
 * reads what a region gets from outside (a parameter, another region's
 * output, another view), or that makes what a region hands out with no
 * compute after it, needs no kernel: it is new extents and strides over the
 * same buffer, worked out on the host in nanoseconds. This pass peels such
 * ops off every kernel region, input edge first, then output edge, and puts
 * them in view regions, which launch nothing. Meta ops deeper inside stay
 * in their region, where the code generator turns them into index
 * arithmetic. A region left with nothing but views disappears into them.
 *
 *     v0 = slice(qkv5, ...)  v = permute(squeeze(v0))   return ..., v
 *  qkv is the linear's output; v is a view of it: strides
 *  [196608, 64, 1536, 1], offset 1024. Nothing runs.
 *
 * Not every meta op can be a view: cat never is; a reshape is one only when
 * the strides allow it (the rule of torch's view: merged dims must be
 * contiguous with each other); a view fed to a library call must still look
 * like a matrix to it (one of its last two dims of stride 1), and one fed
 * to a collective must be contiguous. What fails stays in a kernel.
 *
 * Vectorization is then decided for every kernel region, on the innermost
 * dim of its iteration domain: each value gets the widest access (in
 * elements, at most 16) that its inputs allow: a unit-stride innermost dim
 * allows the largest power of two dividing its extent, its offset and the
 * other strides; a stride-0 (broadcast) dim or a constant allows anything;
 * any other stride allows 1. Elementwise ops take the narrowest operand;
 * meta ops inside the region pass a width through when they keep the
 * innermost dim. The width is finally capped at 16 bytes of the widest
 * dtype the region loads with unit stride or stores. Broadcast outer dims
 * never narrow it: the bf16 layer norm over [16, 128, 1600] with its weight
 * and bias broadcast loads and stores 8 elements (16 bytes) at a time.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

bool fz_layout_contiguous(const fz_value *v, const int64_t *sizes,
			  fz_layout *out)
{
	memset(out, 0, sizeof *out);
	out->rank = v->type.rank;
	int64_t st = 1;
	for (int i = v->type.rank - 1; i >= 0; i--) {
		int64_t e = fz_ext_eval(v->type.dims[i], sizes);
		if (e < 0)
			return false;
		out->shape[i] = e;
		out->strides[i] = st;
		if (__builtin_mul_overflow(st, e > 0 ? e : 1, &st))
			return false;
	}
	return true;
}

/* torch's view rule: the strides of `shape` over a tensor laid out as in,
 * or false when a copy is needed. */
static bool reshape_strides(const fz_layout *in, fz_layout *out)
{
	int view_d = out->rank - 1;
	if (in->rank == 0) {
		for (int d = 0; d < out->rank; d++)
			out->strides[d] = 1;
		return true;
	}
	int64_t chunk = in->strides[in->rank - 1], tn = 1, vn = 1;
	for (int d = in->rank - 1; d >= 0; d--) {
		tn *= in->shape[d];
		if (d == 0 || (in->shape[d - 1] != 1 &&
			       in->strides[d - 1] != tn * chunk)) {
			while (view_d >= 0 && (vn < tn || out->shape[view_d] == 1)) {
				out->strides[view_d] = vn * chunk;
				vn *= out->shape[view_d];
				view_d--;
			}
			if (vn != tn)
				return false;
			if (d > 0) {
				chunk = in->strides[d - 1];
				tn = vn = 1;
			}
		}
	}
	return view_d == -1;
}

bool fz_meta_layout(const fz_node *n, const int64_t *sizes,
		    const fz_layout *in, fz_layout *out)
{
	const fz_attrs *a = &n->attrs;
	const fz_type *ty = &n->out[0]->type;
	memset(out, 0, sizeof *out);
	out->rank = ty->rank;
	out->offset = in->offset;
	for (int i = 0; i < ty->rank; i++)
		if ((out->shape[i] = fz_ext_eval(ty->dims[i], sizes)) < 0)
			return false;
	switch (n->op) {
	case FZ_OP_BROADCAST_IN_DIM:
		for (int k = 0; k < in->rank && k < a->n_dims; k++)
			if (in->shape[k] == out->shape[a->dims[k]])
				out->strides[a->dims[k]] = in->strides[k];
		return true;
	case FZ_OP_RESHAPE:
		return reshape_strides(in, out);
	case FZ_OP_PERMUTE:
		for (int i = 0; i < out->rank; i++)
			out->strides[i] = in->strides[a->dims[i]];
		return true;
	case FZ_OP_SLICE:
		for (int i = 0; i < out->rank && i < a->n_slice; i++) {
			out->strides[i] = in->strides[i] * a->step[i];
			out->offset += a->start[i] * in->strides[i];
		}
		return true;
	case FZ_OP_SQUEEZE: {
		int j = 0;
		for (int i = 0; i < in->rank; i++) {
			bool drop = false;
			for (int k = 0; k < a->n_dims; k++)
				drop |= a->dims[k] == i;
			if (!drop && j < out->rank)
				out->strides[j++] = in->strides[i];
		}
		return true;
	}
	case FZ_OP_UNSQUEEZE: {
		int j = 0;
		for (int i = 0; i < out->rank; i++) {
			if (i == a->dim)
				out->strides[i] = 1;
			else
				out->strides[i] = in->strides[j++];
		}
		return true;
	}
	default:
		return false;
	}
}

/* ---- the pass ---- */

typedef struct bk {
	fz_program *p;
	const fz_trace *t;
	bool *peeled;          /* per node */
	fz_layout *probe;      /* per value: layout at probe sizes, if a view */
	bool *has_probe;
	bool *is_output;       /* per value */
	int *cons_start, *cons;
} bk;

static bool probe_layout(bk *s, const fz_value *v, fz_layout *out)
{
	if (s->has_probe[v->id]) {
		*out = s->probe[v->id];
		return true;
	}
	return fz_layout_contiguous(v, s->p->probe_sizes, out);
}

static bool matrix_ok(const fz_layout *l)
{
	int r = l->rank;
	for (int i = 0; i < r; i++)
		if (l->strides[i] < 0)
			return false;
	if (r == 0)
		return true;
	if (r == 1)
		return l->shape[0] <= 1 || l->strides[0] == 1;
	int64_t s1 = l->strides[r - 1], s0 = l->strides[r - 2];
	int64_t e1 = l->shape[r - 1], e0 = l->shape[r - 2];
	if (e1 <= 1)
		s1 = 1;
	if (e0 <= 1)
		s0 = s1 * e1;
	return (s1 == 1 && s0 >= e1) || (s0 == 1 && s1 >= e0);
}

static bool contiguous_ok(const fz_layout *l)
{
	int64_t st = 1;
	for (int i = l->rank - 1; i >= 0; i--) {
		if (l->shape[i] > 1 && l->strides[i] != st)
			return false;
		st *= l->shape[i];
	}
	return true;
}

/* Do the regions outside r that read value v accept it laid out as l? */
static bool readers_accept(bk *s, const fz_value *v, int r, const fz_layout *l)
{
	s->p->work += 1 + s->cons_start[v->id + 1] - s->cons_start[v->id];
	for (int c = s->cons_start[v->id]; c < s->cons_start[v->id + 1]; c++) {
		const fz_node *u = s->t->nodes[s->cons[c]];
		if (s->p->region_of[u->id] == r && !s->peeled[u->id])
			continue;
		fz_opclass cls = fz_ops[u->op].cls;
		if (cls == FZ_CLASS_LIBRARY && !matrix_ok(l))
			return false;
		if ((cls == FZ_CLASS_COLLECTIVE || cls == FZ_CLASS_WAIT) &&
		    !contiguous_ok(l))
			return false;
	}
	return true;
}

static bool is_view_op(fz_opcode op)
{
	return fz_ops[op].cls == FZ_CLASS_META && op != FZ_OP_CAT;
}

/* The views peeled already that read v (output edge: they were peeled
 * first, over v as the region would have written it, contiguous): are
 * they still views, and still accepted by their readers, with v laid out
 * as l? A reshape of a permute is no view of the permute's operand, so
 * the permute under a peeled reshape stays in its kernel, which writes
 * the permuted value once (else the reshape's reader, a product, found
 * no strides for it and the runner gathered the permute every run). */
static bool peeled_readers_keep(bk *s, const fz_value *v, int r, const fz_layout *l,
				int depth)
{
	s->p->work += 1 + s->cons_start[v->id + 1] - s->cons_start[v->id];
	for (int c = s->cons_start[v->id]; c < s->cons_start[v->id + 1]; c++) {
		const fz_node *u = s->t->nodes[s->cons[c]];
		fz_layout ul;
		if (!s->peeled[u->id] || s->p->region_of[u->id] != r)
			continue;
		if (depth > 16 || !fz_meta_layout(u, s->p->probe_sizes, l, &ul) ||
		    !readers_accept(s, u->out[0], r, &ul) ||
		    !peeled_readers_keep(s, u->out[0], r, &ul, depth + 1))
			return false;
	}
	return true;
}

/* Peels n off region r as a view of its operand's buffer. */
static bool try_view(bk *s, const fz_node *n, int r)
{
	fz_layout in, out, inp, outp;
	fz_value *x = n->in[0];
	if (!probe_layout(s, x, &inp) || !fz_meta_layout(n, s->p->probe_sizes, &inp,
							  &outp))
		return false;
	if (!readers_accept(s, n->out[0], r, &outp) ||
	    !peeled_readers_keep(s, n->out[0], r, &outp, 0))
		return false;
	if (fz_view_eval(s->p, x, s->p->sym_sizes, &in) != FZ_OK ||
	    !fz_meta_layout(n, s->p->sym_sizes, &in, &out))
		return false;
	fz_view *w = fz_arena_alloc(&s->p->arena, sizeof *w);
	if (!w)
		return false;
	w->value = n->out[0];
	w->base = fz_view_root(s->p, x);
	w->node = (fz_node *)n;
	w->lay = out;
	s->p->view_of[n->out[0]->id] = w;
	s->probe[n->out[0]->id] = outp;
	s->has_probe[n->out[0]->id] = true;
	s->peeled[n->id] = true;
	s->p->n_views++;
	return true;
}

static bool defined_in(bk *s, const fz_value *v, int r)
{
	return v->def && s->p->region_of[v->def->id] == r && !s->peeled[v->def->id];
}

static bool read_in(bk *s, const fz_value *v, int r)
{
	s->p->work += 1 + s->cons_start[v->id + 1] - s->cons_start[v->id];
	for (int c = s->cons_start[v->id]; c < s->cons_start[v->id + 1]; c++) {
		int u = s->cons[c];
		if (s->p->region_of[u] == r && !s->peeled[u])
			return true;
	}
	return false;
}

static bool written(bk *s, const fz_value *v, int r)
{
	if (s->is_output[v->id])
		return true;
	s->p->work += 1 + s->cons_start[v->id + 1] - s->cons_start[v->id];
	for (int c = s->cons_start[v->id]; c < s->cons_start[v->id + 1]; c++) {
		int u = s->cons[c];
		if (s->p->region_of[u] != r || s->peeled[u])
			return true;
	}
	return false;
}

static int64_t numel_probe(bk *s, const fz_value *v)
{
	return fz_type_numel_at(&v->type, s->p->probe_sizes);
}

/* After peeling n off the output edge, r would write n's operand: does the
 * region still write one domain? */
static bool output_peel_keeps_domain(bk *s, const fz_region *R, const fz_node *n)
{
	int64_t e = numel_probe(s, n->in[0]);
	const fz_node *red = NULL;
	s->p->work += 2 * R->n_nodes;
	for (int j = 0; j < R->n_nodes && !red; j++)
		if (fz_ops[R->nodes[j]->op].cls == FZ_CLASS_REDUCTION)
			red = R->nodes[j];
	if (red)
		return e == numel_probe(s, red->in[0]) ||
		       e == numel_probe(s, red->out[0]);
	for (int j = 0; j < R->n_nodes; j++) {
		const fz_node *m = R->nodes[j];
		if (m == n || s->peeled[m->id])
			continue;
		for (int k = 0; k < m->n_out; k++)
			if (written(s, m->out[k], R->id) && numel_probe(s, m->out[k]) != e)
				return false;
	}
	return true;
}

static void peel_region(bk *s, const fz_region *R)
{
	int r = R->id;
	s->p->work += 2 * R->n_nodes;
	/* input edge, in topological order, so chains peel link by link */
	for (int j = 0; j < R->n_nodes; j++) {
		const fz_node *n = R->nodes[j];
		if (is_view_op(n->op) && !defined_in(s, n->in[0], r))
			try_view(s, n, r);
	}
	/* output edge, backwards */
	for (int j = R->n_nodes - 1; j >= 0; j--) {
		const fz_node *n = R->nodes[j];
		if (s->peeled[n->id] || !is_view_op(n->op) || n->op == FZ_OP_SLICE ||
		    !defined_in(s, n->in[0], r) || read_in(s, n->out[0], r) ||
		    !written(s, n->out[0], r) || !output_peel_keeps_domain(s, R, n))
			continue;
		try_view(s, n, r);
	}
}

/* ---- vector width ---- */

static int pow2div(int64_t x)
{
	if (x == 0)
		return 16;
	int w = 1;
	while (w < 16 && x % (w * 2) == 0)
		w *= 2;
	return w;
}

static int imin(int a, int b) { return a < b ? a : b; }

static int input_width(const fz_layout *l)
{
	if (l->rank == 0 || l->shape[l->rank - 1] <= 1 || l->strides[l->rank - 1] == 0)
		return 16;
	if (l->strides[l->rank - 1] != 1)
		return 1;
	int w = imin(pow2div(l->shape[l->rank - 1]), pow2div(l->offset));
	for (int i = 0; i < l->rank - 1; i++)
		if (l->shape[i] > 1)
			w = imin(w, pow2div(l->strides[i]));
	return w;
}

static int64_t last_ext(bk *s, const fz_value *v)
{
	if (v->type.rank == 0)
		return 1;
	return fz_ext_eval(v->type.dims[v->type.rank - 1], s->p->probe_sizes);
}

static void vectorize(bk *s, const fz_region *R, int *width, int *wv)
{
	const int64_t *ps = s->p->probe_sizes;
	int W = 16;
	size_t big = 1;
	for (int k = 0; k < R->n_in; k++) {
		fz_layout l;
		const fz_value *v = R->in[k];
		wv[v->id] = probe_layout(s, v, &l) ? input_width(&l) : 1;
		if (l.rank && l.shape[l.rank - 1] > 1 && l.strides[l.rank - 1] == 1 &&
		    fz_dtype_size(v->type.dtype) > big)
			big = fz_dtype_size(v->type.dtype);
	}
	for (int j = 0; j < R->n_nodes; j++) {
		const fz_node *n = R->nodes[j];
		if (s->peeled[n->id])
			continue;
		const fz_attrs *a = &n->attrs;
		fz_value *x = n->n_in ? n->in[0] : NULL;
		int w = 16;
		int64_t lo = n->out[0]->type.rank ? last_ext(s, n->out[0]) : 1;
		int64_t li = x && x->type.rank ? last_ext(s, x) : 1;
		switch (fz_ops[n->op].cls) {
		case FZ_CLASS_UNARY: case FZ_CLASS_BINARY: case FZ_CLASS_TERNARY:
			for (int k = 0; k < n->n_in; k++)
				w = imin(w, wv[n->in[k]->id]);
			break;
		case FZ_CLASS_CREATION:
			break;
		case FZ_CLASS_REDUCTION:
			W = imin(W, wv[x->id]);
			break;
		case FZ_CLASS_INDEXING:
			if (n->op == FZ_OP_INDEX_ADD)
				w = 1;
			else if (n->op == FZ_OP_TAKE_ALONG && R->kind == FZ_REGION_NORMALIZATION)
				w = 16;
			else if (a->dim == x->type.rank - 1)
				w = 1;
			else
				w = imin(wv[x->id], imin(wv[n->in[1]->id], pow2div(li)));
			break;
		case FZ_CLASS_META:
			if (lo <= 1 || n->out[0]->type.rank == 0) {
				w = 16;
			} else if (n->op == FZ_OP_BROADCAST_IN_DIM) {
				int last = n->out[0]->type.rank - 1, k = -1;
				for (int i = 0; i < a->n_dims; i++)
					if (a->dims[i] == last)
						k = i;
				w = k < 0 || fz_ext_eval(x->type.dims[k], ps) == 1 ? 16 :
				    k == x->type.rank - 1 ? wv[x->id] : 1;
			} else if (n->op == FZ_OP_RESHAPE) {
				w = li == lo ? wv[x->id] :
				    li % lo == 0 ? imin(wv[x->id], pow2div(lo)) :
				    lo % li == 0 ? imin(wv[x->id], pow2div(li)) : 1;
			} else if (n->op == FZ_OP_PERMUTE) {
				w = a->dims[x->type.rank - 1] == x->type.rank - 1 ? wv[x->id] : 1;
			} else if (n->op == FZ_OP_SLICE) {
				int l = x->type.rank - 1;
				w = a->step[l] != 1 ? 1 :
				    imin(wv[x->id], imin(pow2div(a->start[l]), pow2div(lo)));
			} else if (n->op == FZ_OP_CAT) {
				int last = n->out[0]->type.rank - 1;
				for (int k = 0; k < n->n_in; k++) {
					w = imin(w, wv[n->in[k]->id]);
					if (a->dim == last)
						w = imin(w, pow2div(last_ext(s, n->in[k])));
				}
			} else {
				w = li == lo ? wv[x->id] : 1;
			}
			break;
		default:
			w = 1;
		}
		for (int k = 0; k < n->n_out; k++)
			wv[n->out[k]->id] = fz_ops[n->op].cls == FZ_CLASS_REDUCTION ? 16 : w;
	}
	for (int k = 0; k < R->n_out; k++) {
		const fz_value *v = R->out[k];
		int64_t le = last_ext(s, v); /* a per-row result: no constraint */
		W = imin(W, imin(wv[v->id], le <= 1 ? 16 : pow2div(le)));
		if (fz_dtype_size(v->type.dtype) > big)
			big = fz_dtype_size(v->type.dtype);
	}
	for (int j = 0; j < R->n_nodes; j++)
		for (int k = 0; k < R->nodes[j]->n_out; k++)
			W = imin(W, wv[R->nodes[j]->out[k]->id]);
	W = imin(W, (int)(16 / big));
	width[0] = W < 1 ? 1 : W;
	width[1] = width[0] * (int)big;
}

fz_status fz_bookend(fz_program *p)
{
	const fz_trace *t = p->trace;
	int n = t->n_nodes, nv = t->n_values;
	bk s = {.p = p, .t = t};
	fz_status st = FZ_ENOMEM;
	int *wv = NULL, *vreg = NULL, *cnt = NULL;
	p->view_of = fz_arena_alloc(&p->arena, sizeof(fz_view *) * ((size_t)nv + 1));
	s.peeled = calloc((size_t)n + 1, sizeof(bool));
	s.probe = calloc((size_t)nv + 1, sizeof(fz_layout));
	s.has_probe = calloc((size_t)nv + 1, sizeof(bool));
	s.is_output = calloc((size_t)nv + 1, sizeof(bool));
	s.cons_start = calloc((size_t)nv + 2, sizeof(int));
	wv = calloc((size_t)nv + 1, sizeof(int));
	vreg = calloc((size_t)n + 1, sizeof(int));
	cnt = calloc((size_t)n * 2 + 4, sizeof(int));
	if (!p->view_of || !s.peeled || !s.probe || !s.has_probe || !s.is_output ||
	    !s.cons_start || !wv || !vreg || !cnt)
		goto done;
	/* the consumer lists from the graph as ids (partition.c) */
	FZ_ASSERT(p->node_in && p->node_in_start && p->def_of);
	const int *ins = p->node_in, *in_start = p->node_in_start;
	int edges = in_start[n];
	for (int e = 0; e < edges; e++)
		s.cons_start[ins[e] + 1]++;
	for (int v = 0; v < nv; v++)
		s.cons_start[v + 1] += s.cons_start[v];
	s.cons = calloc((size_t)edges + 1, sizeof(int));
	if (!s.cons)
		goto done;
	{
		int *fill = wv; /* borrowed, zeroed */
		for (int i = 0; i < n; i++)
			for (int e = in_start[i]; e < in_start[i + 1]; e++) {
				int v = ins[e];
				s.cons[s.cons_start[v] + fill[v]++] = i;
			}
		memset(wv, 0, sizeof(int) * (size_t)nv);
	}
	for (int i = 0; i < t->n_outputs; i++)
		s.is_output[t->outputs[i]->id] = true;

	/* an attention region keeps its meta ops: they say where its q, k
	 * and v come from (ir/attention.c reads them), and it reads its
	 * inputs contiguous anyway */
	for (int r = 0; r < p->n_regions; r++)
		if (fz_region_is_kernel(p->regions[r]->kind) &&
		    p->regions[r]->kind != FZ_REGION_ATTENTION)
			peel_region(&s, p->regions[r]);

	/* rebuild the region list: what is left of the old regions plus one
	 * view region per chain of peeled nodes, renumbered below */
	int old_n = p->n_regions, new_n = 0, n_vr = 0;
	fz_region **old = p->regions;
	int *anchor = cnt, *vcount = cnt + n + 1; /* per view region */
	for (int i = 0; i < n; i++) {
		vreg[i] = -1;
		if (!s.peeled[i])
			continue;
		int x = p->def_of[ins[in_start[i]]]; /* the operand's node */
		int vr = x >= 0 && s.peeled[x] ? vreg[x] : -1;
		if (vr < 0) {
			vr = n_vr++;
			anchor[vr] = p->region_of[i];
		}
		vreg[i] = vr;
		vcount[vr]++;
	}
	fz_region **vrs = fz_arena_alloc(&p->arena, sizeof(fz_region *) *
					 ((size_t)n_vr + 1));
	fz_region **regs = fz_arena_alloc(&p->arena, sizeof(fz_region *) *
					  ((size_t)old_n + (size_t)n_vr + 1));
	if (!vrs || !regs)
		goto done;
	for (int v = 0; v < n_vr; v++) {
		fz_region *V = fz_arena_alloc(&p->arena, sizeof *V);
		if (!V || !(V->nodes = fz_arena_alloc(&p->arena, sizeof(fz_node *) *
						       (size_t)vcount[v])))
			goto done;
		V->kind = FZ_REGION_VIEW;
		vrs[v] = V;
	}
	for (int i = 0; i < n; i++)
		if (vreg[i] >= 0)
			vrs[vreg[i]]->nodes[vrs[vreg[i]]->n_nodes++] = t->nodes[i];
	/* view regions bucketed by anchor, in creation order */
	int *head = calloc((size_t)old_n + 1, sizeof(int));
	int *nxt = calloc((size_t)n_vr + 1, sizeof(int));
	if (!head || !nxt) {
		free(head);
		free(nxt);
		goto done;
	}
	for (int v = n_vr - 1; v >= 0; v--) {
		nxt[v] = head[anchor[v]] - 1;
		head[anchor[v]] = v + 1;
	}
	for (int r = 0; r < old_n; r++) {
		fz_region *R = old[r];
		for (int v = head[r] - 1; v >= 0; v = nxt[v])
			regs[new_n++] = vrs[v];
		int kept = 0;
		for (int j = 0; j < R->n_nodes; j++)
			if (!s.peeled[R->nodes[j]->id])
				R->nodes[kept++] = R->nodes[j];
		R->n_nodes = kept;
		if (kept)
			regs[new_n++] = R;
	}
	free(head);
	free(nxt);
	/* number regions as the partition does: by the canonical rank of
	 * their last node, so names and written order do not enter */
	uint64_t *keys = malloc(sizeof(uint64_t) * ((size_t)new_n + 1));
	fz_region **by_key = malloc(sizeof(fz_region *) * ((size_t)new_n + 1));
	if (!keys || !by_key) {
		free(keys);
		free(by_key);
		goto done;
	}
	for (int r = 0; r < new_n; r++) {
		int key = -1;
		for (int j = 0; j < regs[r]->n_nodes; j++)
			if (p->canon_rank[regs[r]->nodes[j]->id] > key)
				key = p->canon_rank[regs[r]->nodes[j]->id];
		keys[r] = (uint64_t)key << 32 | (uint32_t)r; /* keys distinct */
	}
	fz_sort_u64(keys, new_n);
	for (int r = 0; r < new_n; r++)
		by_key[r] = regs[(uint32_t)keys[r]];
	memcpy(regs, by_key, sizeof(fz_region *) * (size_t)new_n);
	free(keys);
	free(by_key);
	/* the consumer lists, the chains, the rebuild, the renumbering, the
	 * sort and the links: each a pass over nodes, values and edges */
	p->work += 6 * ((int64_t)n + edges) + nv + old_n + fz_nlogn(new_n);
	for (int r = 0; r < new_n; r++) {
		fz_region *R = regs[r];
		R->id = r;
		for (int j = 0; j < R->n_nodes; j++)
			p->region_of[R->nodes[j]->id] = r;
	}
	p->regions = regs;
	p->n_regions = new_n;
	if ((st = fz_regions_link(p)) != FZ_OK)
		goto done;

	st = FZ_ENOMEM;
	p->vec_width = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)new_n + 1));
	p->vec_bytes = fz_arena_alloc(&p->arena, sizeof(int) * ((size_t)new_n + 1));
	if (!p->vec_width || !p->vec_bytes)
		goto done;
	for (int r = 0; r < new_n; r++) {
		if (!fz_region_is_kernel(p->regions[r]->kind))
			continue;
		int w[2];
		p->work += 1 + p->regions[r]->n_nodes + p->regions[r]->n_in;
		vectorize(&s, p->regions[r], w, wv);
		p->vec_width[r] = w[0];
		p->vec_bytes[r] = w[1];
	}
	st = fz_program_index_views(p);
done:
	free(s.peeled);
	free(s.probe);
	free(s.has_probe);
	free(s.is_output);
	free(s.cons_start);
	free(s.cons);
	free(wv);
	free(vreg);
	free(cnt);
	return st;
}
