/*
 * attention.c: attention regions found and described (ir/attention.h).
 *
 * Two forms make an attention region. The primitive (attention,
 * attention_dq, attention_dkv) is a region by itself. The decomposed form
 * is what eager attention writes, and what the partitioner looks for at
 * every matmul whose left operand is a softmax's result (fz_attn_match):
 *
 *     S  = matmul(Q, permute(K, [.., -1, -2]))  [batch..., Hq, Tq, Tk]
 *     L  = f(S, mask, iota, constants)           elementwise in S
 *     P  = cast?(softmax(L, dim=-1))             (lowered: cast, amax, sub,
 *                                                 exp, sum, div, cast)
 *     O  = matmul(P, V)
 *
 * K and V may be kv heads repeated to the query heads (GQA: HF's repeat_kv
 * writes broadcast_in_dim to [B, Hkv, g, T, D], then reshape to
 * [B, Hkv g, T, D], with or without an unsqueeze first); the region then
 * reads the unrepeated heads, and the kernel indexes head h / g.
 *
 * The primitive's operands may be repeated the same way (HF's SDPA path
 * repeats k and v before the call when it passes a mask), and there one
 * repeat feeds three ops (attention, attention_dq, attention_dkv), so no
 * region can take it. fz_attn_fold_find decides instead, for the whole
 * program, which ops read the unrepeated values (fz_attn_operand says
 * what a region reads): dce drops a repeat only attention ops read, and
 * attention_dkv, whose dk and dv then have the kv heads' shape, takes the
 * backward's sums over each group into its region:
 *
 *     kr = reshape(broadcast_in_dim(unsqueeze(k, dim=2), [B, 2, 4, T, D]))
 *     o, lse = attention(q, kr, vr)            reads k, v: [B, 2, T, D]
 *     dkr, dvr = attention_dkv(q, kr, vr, ..)  one region with the two
 *     dk = sum(reshape(dkr, [B, 2, 4, T, D]), dims=[2])   sums: writes dk, dv
 *
 * The match takes S, P and everything between only when nothing outside
 * reads them: the region then writes O alone, and nothing of T x T size is
 * ever stored. It takes the nodes of f that depend on S, and those feeding
 * f that nothing else reads (a mask built from iota, a broadcast of a
 * bias, a scalar), so they become code in the kernel; a value that others
 * read too (one causal mask shared by every layer) stays an input, read
 * where it lies. f must be elementwise along S's path (no meta op moves
 * S's elements), so that the kernel can give it S one element at a time.
 *
 * The match also refuses a form that rounds the probabilities to a
 * narrower float before the second product (a bf16 softmax, or HF's
 * softmax in f32 then `.to(bf16)`): FlashAttention's one pass never holds
 * the normalized P, so it cannot round it where the trace does, and the
 * difference is half a bf16 ulp in every probability, not a rare flip. The
 * fused kernel would be the more accurate of the two, but a trace means
 * what it says: such a form runs as written (its T x T buffers included),
 * and a framework that wants FlashAttention's numerics writes the
 * attention primitive (tools/gen/llama.py does by default).
 *
 * fz_attn_describe reads a region (made either way) back into fz_attn,
 * from its nodes alone, so the partitioner, the code generators and a
 * program the plan cache loaded all describe it the same way.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

#define MATCH_MAX 96 /* nodes of one decomposed attention, at most */

typedef struct match {
	const fz_node *nodes[MATCH_MAX];
	int n;
	const fz_value *q, *k, *v;    /* the sources the kernel reads */
	int64_t kgroup, vgroup;
	const fz_value *score, *logits, *p;
	const fz_node *m1, *m2;
} match;

static bool has(const match *M, const fz_node *n)
{
	for (int i = 0; i < M->n; i++)
		if (M->nodes[i] == n)
			return true;
	return false;
}

static bool add(match *M, const fz_node *n)
{
	if (has(M, n))
		return true;
	if (M->n >= MATCH_MAX)
		return false;
	M->nodes[M->n++] = n;
	return true;
}

/* A cast from a float to a narrower float (P rounded to bf16, say). */
static bool narrows(const fz_node *n)
{
	fz_dtype from = n->in[0]->type.dtype, to = n->out[0]->type.dtype;
	return n->op == FZ_OP_CAST && fz_dtype_is_float(from) &&
	       fz_dtype_is_float(to) && fz_dtype_size(to) < fz_dtype_size(from);
}

static const fz_node *def_op(const fz_value *v, fz_opcode op)
{
	return v && v->def && v->def->op == op ? v->def : NULL;
}

/* Is v [batch..., H, T, D] kv heads repeated to H (HF's repeat_kv:
 * broadcast_in_dim to [batch..., Hkv, g, T, D], with or without an
 * unsqueeze first, then reshape to [batch..., Hkv g, T, D])? Then the
 * unrepeated [batch..., Hkv, T, D] is returned, *g is the repeat, and
 * chain[] the reshape, the broadcast and the unsqueeze (or NULL). Head h
 * of v is head h / g of the source, which is how the kernels index a kv
 * head. Structure only: who else reads the values is the caller's
 * question. */
static const fz_value *repeat_source(const fz_value *v, int64_t *g,
				     const fz_node *chain[3])
{
	const fz_node *rs = def_op(v, FZ_OP_RESHAPE);
	int r = v->type.rank;
	if (!rs || r < 3)
		return NULL;
	const fz_value *y = rs->in[0];
	const fz_node *bc = def_op(y, FZ_OP_BROADCAST_IN_DIM);
	if (!bc || y->type.rank != r + 1)
		return NULL;
	/* y [batch..., Hkv, g, T, D] */
	int hd = r - 3;
	for (int i = 0; i < hd; i++)
		if (!fz_ext_eq(y->type.dims[i], v->type.dims[i]))
			return NULL;
	fz_ext gx = y->type.dims[hd + 1], hq;
	if (!fz_ext_is_const(gx) || !fz_ext_mul(y->type.dims[hd], gx, &hq) ||
	    !fz_ext_eq(hq, v->type.dims[hd]) ||
	    !fz_ext_eq(y->type.dims[hd + 2], v->type.dims[hd + 1]) ||
	    !fz_ext_eq(y->type.dims[hd + 3], v->type.dims[hd + 2]))
		return NULL;
	const fz_value *x = bc->in[0];
	const fz_node *un = NULL;
	if (x->type.rank == r) {
		/* broadcast_in_dim(k, dims=[0.., hd, hd+2, hd+3]) */
		for (int i = 0; i < r; i++)
			if (bc->attrs.dims[i] != (i <= hd ? i : i + 1))
				return NULL;
	} else if (x->type.rank == r + 1 && fz_ext_eq(x->type.dims[hd + 1],
						       fz_ext_const(1))) {
		for (int i = 0; i <= r; i++)
			if (bc->attrs.dims[i] != i)
				return NULL;
		un = x->def;
		if (!un || !(un->op == FZ_OP_UNSQUEEZE || un->op == FZ_OP_RESHAPE) ||
		    un->in[0]->type.rank != r)
			return NULL;
		x = un->in[0];
	} else {
		return NULL;
	}
	for (int i = 0; i < r; i++)
		if (!fz_ext_eq(x->type.dims[i], i == hd ? y->type.dims[hd] : v->type.dims[i]))
			return NULL;
	chain[0] = rs;
	chain[1] = bc;
	chain[2] = un;
	*g = gx.c;
	return x;
}

/* repeat_source for the decomposed form, whose region takes the meta
 * nodes (added to M): only when nothing else reads them. Else *src = v,
 * *g = 1. */
static bool unrepeat(match *M, const fz_value *v, const fz_value **src, int64_t *g)
{
	*src = v;
	*g = 1;
	const fz_node *chain[3];
	const fz_value *x = repeat_source(v, g, chain);
	if (!x || v->n_uses != 1 || chain[0]->in[0]->n_uses != 1 ||
	    (chain[2] && chain[1]->in[0]->n_uses != 1)) {
		*g = 1;
		return true;
	}
	for (int i = 0; i < 3; i++)
		if (chain[i] && !add(M, chain[i]))
			return false;
	*src = x;
	return true;
}

/* Is sm = sum(reshape(d, [batch..., Hkv, g, T, D]), dims=[head + 1]),
 * the sum over each group of d = dk (or dv) of the repeated heads, so of
 * the shape of src, the unrepeated k (v)? (The backward of repeat_kv.) */
static bool group_sum(const fz_value *d, const fz_value *src, int64_t g,
		      const fz_node *rs, const fz_node *sm)
{
	int r = d->type.rank, hd = r - 3;
	if (!rs || !sm || rs->op != FZ_OP_RESHAPE || rs->in[0] != d ||
	    sm->op != FZ_OP_SUM || sm->in[0] != rs->out[0] ||
	    sm->attrs.n_dims != 1 || sm->attrs.dims[0] != hd + 1 ||
	    sm->out[0]->type.dtype != d->type.dtype)
		return false;
	const fz_type *y = &rs->out[0]->type;
	if (y->rank != r + 1 || !fz_ext_eq(y->dims[hd + 1], fz_ext_const(g)))
		return false;
	for (int i = 0; i < r; i++)
		if (!fz_ext_eq(y->dims[i < hd + 1 ? i : i + 1], src->type.dims[i]))
			return false;
	return true;
}

int fz_attn_fold_find(const fz_trace *t, fz_attn_fold *folds)
{
	/* the one reader of each value read once (returns count as uses) */
	const fz_node **user = calloc((size_t)t->n_values + 1, sizeof *user);
	if (!user)
		return -1;
	for (int i = 0; i < t->n_nodes; i++)
		for (int k = 0; k < t->nodes[i]->n_in; k++)
			if (t->nodes[i]->in[k]->n_uses == 1)
				user[t->nodes[i]->in[k]->id] = t->nodes[i];
	int found = 0;
	for (int i = 0; i < t->n_nodes; i++) {
		const fz_node *nd = t->nodes[i];
		fz_attn_fold *f = &folds[i];
		memset(f, 0, sizeof *f);
		if (fz_ops[nd->op].cls != FZ_CLASS_ATTENTION)
			continue;
		int64_t gk, gv;
		const fz_node *ck[3], *cv[3];
		const fz_value *k = repeat_source(nd->in[1], &gk, ck);
		const fz_value *v = repeat_source(nd->in[2], &gv, cv);
		if (!k || !v || gk != gv || gk < 2)
			continue;
		bool ok = true;
		for (int r = 0; nd->op == FZ_OP_ATTENTION_DKV && r < 2; r++) {
			const fz_value *d = nd->out[r];
			const fz_node *rs = d->n_uses == 1 ? user[d->id] : NULL;
			const fz_node *sm = rs && rs->out[0]->n_uses == 1 ?
					    user[rs->out[0]->id] : NULL;
			ok = ok && group_sum(d, r ? v : k, gk, rs, sm);
			f->sum[r][0] = rs;
			f->sum[r][1] = sm;
		}
		if (!ok) {
			memset(f, 0, sizeof *f);
			continue;
		}
		f->k = k;
		f->v = v;
		found++;
	}
	free(user);
	return found;
}

static int index_in(fz_value *const *vs, int n, const fz_value *v)
{
	for (int i = 0; v && i < n; i++)
		if (vs[i] == v)
			return i;
	return -1;
}

const fz_value *fz_attn_operand(const fz_region *R, const fz_node *n, int k)
{
	const fz_value *v = n->in[k];
	int64_t g;
	const fz_node *chain[3];
	if (fz_ops[n->op].cls != FZ_CLASS_ATTENTION || (k != 1 && k != 2) ||
	    index_in(R->in, R->n_in, v) >= 0)
		return v;
	const fz_value *x = repeat_source(v, &g, chain);
	return x && index_in(R->in, R->n_in, x) >= 0 ? x : v;
}

static bool ext1(fz_ext e) { return fz_ext_is_const(e) && e.c == 1; }

static bool in_region(const fz_region *R, const fz_node *n)
{
	for (int i = 0; n && i < R->n_nodes; i++)
		if (R->nodes[i] == n)
			return true;
	return false;
}

/* y's strides from x's across reshape n (x -> y), the way emit.c's
 * reshape_ix maps indices: the dims of extent 1 left out, equal extents
 * matched from the back and then from the front, and the middle of y laid
 * over the middle of x, which must lie one dim after another. */
static bool reshape_strides(const fz_type *xt, const fz_ext *xs, const fz_type *yt,
			    fz_ext *ys)
{
	int xd[FZ_MAX_RANK], yd[FZ_MAX_RANK], nx = 0, ny = 0;
	for (int d = 0; d < xt->rank; d++)
		if (!ext1(xt->dims[d]))
			xd[nx++] = d;
	for (int d = 0; d < yt->rank; d++) {
		ys[d] = fz_ext_const(0);
		if (!ext1(yt->dims[d]))
			yd[ny++] = d;
	}
	int px = 0, py = 0;
	while (nx > px && ny > py && fz_ext_eq(xt->dims[xd[nx - 1]], yt->dims[yd[ny - 1]]))
		ys[yd[--ny]] = xs[xd[--nx]];
	while (px < nx && py < ny && fz_ext_eq(xt->dims[xd[px]], yt->dims[yd[py]]))
		ys[yd[py++]] = xs[xd[px++]];
	if (px == nx)
		return true; /* the rest of y: extents of 1 at run time */
	for (int k = px; k + 1 < nx; k++) {
		fz_ext want;
		if (!fz_ext_mul(xs[xd[k + 1]], xt->dims[xd[k + 1]], &want) ||
		    !fz_ext_eq(want, xs[xd[k]]))
			return false;
	}
	fz_ext s = xs[xd[nx - 1]];
	for (int k = ny - 1; k >= py; k--) {
		ys[yd[k]] = s;
		if (!fz_ext_mul(s, yt->dims[yd[k]], &s))
			return false;
	}
	return true;
}

static bool view_strides(const fz_region *R, const fz_value *v, int *in, fz_ext *st,
			 int depth)
{
	const fz_type *t = &v->type;
	if ((*in = index_in(R->in, R->n_in, v)) >= 0) {
		fz_ext s = fz_ext_const(1);
		for (int d = t->rank - 1; d >= 0; d--) {
			st[d] = s;
			if (!fz_ext_mul(s, t->dims[d], &s))
				return false;
		}
		return true;
	}
	const fz_node *n = v->def;
	if (depth > 16 || !in_region(R, n) || n->n_in != 1)
		return false;
	fz_ext xs[FZ_MAX_RANK];
	const fz_value *x = n->in[0];
	if (!view_strides(R, x, in, xs, depth + 1))
		return false;
	const fz_attrs *a = &n->attrs;
	switch (n->op) {
	case FZ_OP_PERMUTE:
		for (int d = 0; d < t->rank; d++)
			st[d] = xs[a->dims[d]];
		return true;
	case FZ_OP_BROADCAST_IN_DIM:
		for (int d = 0; d < t->rank; d++)
			st[d] = fz_ext_const(0);
		for (int i = 0; i < x->type.rank; i++)
			if (!ext1(x->type.dims[i]))
				st[a->dims[i]] = xs[i];
		return true;
	case FZ_OP_RESHAPE:
	case FZ_OP_SQUEEZE:
	case FZ_OP_UNSQUEEZE:
		return reshape_strides(&x->type, xs, t, st);
	default:
		return false;
	}
}

bool fz_attn_view_strides(const fz_region *R, const fz_value *v, int *in, fz_ext *st)
{
	*in = -1;
	if (!view_strides(R, v, in, st, 0)) {
		*in = -1;
		return false;
	}
	return true;
}

/* A view op that may make an operand of the primitive in its region. */
static bool operand_view(const fz_node *n)
{
	return n->op == FZ_OP_PERMUTE || n->op == FZ_OP_RESHAPE || n->op == FZ_OP_SQUEEZE ||
	       n->op == FZ_OP_UNSQUEEZE || n->op == FZ_OP_BROADCAST_IN_DIM;
}

/* Operand x of the primitive: its region input and strides (the head
 * dim's 1). */
static bool operand(const fz_region *R, const fz_value *x, int *in, fz_ext *st)
{
	return fz_attn_view_strides(R, x, in, st) &&
	       fz_ext_eq(st[x->type.rank - 1], fz_ext_const(1));
}

/* Do the nodes of M alone read value v (besides `except` readers)? */
static bool read_only_in(const match *M, const fz_value *v)
{
	int uses = 0;
	for (int i = 0; i < M->n; i++)
		for (int k = 0; k < M->nodes[i]->n_in; k++)
			uses += M->nodes[i]->in[k] == v;
	return uses == v->n_uses;
}

/* Is v an elementwise function of s (through ops of s's shape alone, the
 * only way S's path may go)? */
static bool depends_on(const fz_value *v, const fz_value *s, int depth)
{
	if (v == s)
		return true;
	if (!v->def || depth > 48 || !fz_op_is_elementwise(v->def->op) ||
	    !fz_same_shape(&v->type, &s->type))
		return false;
	for (int k = 0; k < v->def->n_in; k++)
		if (depends_on(v->def->in[k], s, depth + 1))
			return true;
	return false;
}

/* The nodes of f: those on S's path (elementwise, S's shape), and what
 * feeds them that only they read and that has no other input than
 * iota/full (so the kernel computes it from the indices); `other`
 * collects candidates to check once the set is complete. */
static bool take_expr(match *M, const fz_value *v, const fz_value *s, int depth)
{
	if (v == s || depth > 48)
		return v == s;
	const fz_node *n = v->def;
	if (!n)
		return true; /* a parameter: an input */
	if (has(M, n))
		return true;
	bool on_path = depends_on(v, s, 0);
	fz_opclass c = fz_ops[n->op].cls;
	if (on_path) {
		if (!fz_op_is_elementwise(n->op) || !fz_same_shape(&v->type, &s->type))
			return false;
	} else if (!(fz_op_is_elementwise(n->op) || c == FZ_CLASS_CREATION ||
		     (c == FZ_CLASS_META && n->op != FZ_OP_CAT))) {
		return true; /* computed elsewhere: an input */
	}
	if (!add(M, n))
		return false;
	for (int k = 0; k < n->n_in; k++)
		if (!take_expr(M, n->in[k], s, depth + 1))
			return false;
	return true;
}

/* Drops the nodes off S's path that something outside reads (they stay
 * where they are: their values become inputs), until none is left. */
static void drop_shared(match *M, const fz_value *s)
{
	for (bool changed = true; changed;) {
		changed = false;
		for (int i = 0; i < M->n; i++) {
			const fz_node *n = M->nodes[i];
			if (n == M->m1 || n == M->m2 || depends_on(n->out[0], s, 0) ||
			    fz_ops[n->op].cls == FZ_CLASS_LIBRARY)
				continue;
			bool shared = false;
			for (int k = 0; k < n->n_out; k++)
				shared |= !read_only_in(M, n->out[k]);
			if (n->n_out == 0 || shared || n->out[0]->n_uses == 0) {
				M->nodes[i] = M->nodes[--M->n];
				changed = true;
				i--;
			}
		}
	}
}

/* The leading dims of the same extents (their product) on both sides. */
static bool lead_eq(const fz_type *a, const fz_type *b)
{
	fz_ext x = fz_ext_const(1), y = fz_ext_const(1);
	for (int i = 0; i < a->rank - 2; i++)
		if (!fz_ext_mul(x, a->dims[i], &x))
			return false;
	for (int i = 0; i < b->rank - 2; i++)
		if (!fz_ext_mul(y, b->dims[i], &y))
			return false;
	return a->rank >= 2 && b->rank >= 2 && fz_ext_eq(x, y) &&
	       fz_ext_eq(a->dims[a->rank - 1], b->dims[b->rank - 1]) &&
	       fz_ext_eq(a->dims[a->rank - 2], b->dims[b->rank - 2]);
}

/* Is n a reshape that only merges or splits the dims before the last two
 * (torch's bmm form: [B, H, T, D] seen as [B*H, T, D])? The same memory. */
static bool lead_reshape(const fz_node *n)
{
	return n && n->op == FZ_OP_RESHAPE && lead_eq(&n->in[0]->type, &n->out[0]->type);
}

/* v through such reshapes read by nothing else, which M takes. */
static const fz_value *unflat(match *M, const fz_value *v)
{
	/* (not the reshape of repeated kv heads: unrepeat reads that) */
	while (lead_reshape(v->def) && v->n_uses == 1 &&
	       !def_op(v->def->in[0], FZ_OP_BROADCAST_IN_DIM) && add(M, v->def))
		v = v->def->in[0];
	return v;
}

/* The matmul an elementwise path of shape ty from v reaches; NULL if none,
 * (fz_node *)1 if two. */
static const fz_node *find_product(const fz_value *v, const fz_type *ty, int depth)
{
	const fz_node *n = v->def;
	if (!n || depth > 48 || !fz_same_shape(&v->type, ty))
		return NULL;
	if (n->op == FZ_OP_MATMUL || (lead_reshape(n) && n->in[0]->def &&
					n->in[0]->def->op == FZ_OP_MATMUL))
		return n;  /* the product, or the bmm form's reshape of it */
	if (!fz_op_is_elementwise(n->op))
		return NULL;
	const fz_node *found = NULL;
	for (int k = 0; k < n->n_in; k++) {
		const fz_node *f = find_product(n->in[k], ty, depth + 1);
		if (!f || f == found)
			continue;
		if (found || f == (const fz_node *)1)
			return (const fz_node *)1;
		found = f;
	}
	return found;
}

/* The decomposed form ending at m2 (a matmul): false when it is not one. */
static bool match_at(const fz_node *m2, match *M)
{
	memset(M, 0, sizeof *M);
	if (m2->op != FZ_OP_MATMUL)
		return false;
	const fz_value *p = m2->in[0], *pv = m2->in[1];
	if (p->type.rank < 3 || pv->type.rank != p->type.rank)
		return false;
	M->m2 = m2;
	add(M, m2);
	/* casts after the softmax, reshapes of the bmm form */
	const fz_value *x = unflat(M, p);
	while (x->def && x->def->op == FZ_OP_CAST && x->def->origin != FZ_OP_SOFTMAX) {
		if (x->n_uses != 1 || narrows(x->def) || !add(M, x->def))
			return false;
		x = unflat(M, x->def->in[0]);
	}
	int r = x->type.rank; /* the scores' rank */
	/* the softmax: nodes of origin softmax, back from its div */
	const fz_node *last = x->def;
	if (!last || last->origin != FZ_OP_SOFTMAX || x->n_uses != 1)
		return false;
	const fz_value *logits = NULL;
	const fz_node *stack[32];
	int sp = 0, n_sm = 0;
	stack[sp++] = last;
	while (sp) {
		const fz_node *n = stack[--sp];
		if (has(M, n))
			continue;
		if (narrows(n) || !add(M, n) || ++n_sm > 16)
			return false;
		if (n->op == FZ_OP_AMAX || n->op == FZ_OP_SUM)
			if (n->attrs.n_dims != 1 || n->attrs.dims[0] != r - 1)
				return false;
		for (int k = 0; k < n->n_in; k++) {
			const fz_value *u = n->in[k];
			if (u->def && u->def->origin == FZ_OP_SOFTMAX && sp < 32) {
				stack[sp++] = u->def;
			} else if (!logits || logits == u) {
				logits = u;
			} else {
				return false;
			}
		}
	}
	if (!logits || logits->type.rank != r)
		return false;
	/* the scores back to the first product: the one matmul that an
	 * elementwise path of L's shape reaches */
	const fz_node *m1 = find_product(logits, &logits->type, 0);
	if (!m1 || m1 == (const fz_node *)1)
		return false;
	const fz_value *s = m1->out[0];
	if (m1->op == FZ_OP_RESHAPE) { /* S is the reshape of the product */
		add(M, m1);
		m1 = m1->in[0]->def;
		if (m1->out[0]->n_uses != 1)
			return false;
	}
	if (!fz_same_shape(&s->type, &logits->type) || s->n_uses != 1)
		return false;
	M->m1 = m1;
	add(M, m1);
	if (!take_expr(M, logits, s, 0))
		return false;
	/* the operands: Q, permute(K) (through the bmm form's reshapes) */
	const fz_value *qx = unflat(M, m1->in[0]), *kt = unflat(M, m1->in[1]);
	const fz_node *perm = def_op(kt, FZ_OP_PERMUTE);
	int rk = kt->type.rank;
	if (!perm || kt->n_uses != 1)
		return false;
	for (int i = 0; i < rk; i++)
		if (perm->attrs.dims[i] != (i < rk - 2 ? i : i == rk - 2 ? rk - 1 : rk - 2))
			return false;
	add(M, perm);
	const fz_value *kx = perm->in[0];
	pv = unflat(M, pv);
	/* shapes: Q [b.., Hq, Tq, D], K [b.., Hq, Tk, D], V [b.., Hq, Tk, Dv]
	 * (their leading dims may be flattened), S [b.., Hq, Tq, Tk] */
	fz_type sq = s->type, sk = s->type;
	sq.dims[r - 1] = qx->type.dims[qx->type.rank - 1];
	sk.dims[r - 2] = kx->type.dims[kx->type.rank - 2];
	sk.dims[r - 1] = kx->type.dims[kx->type.rank - 1];
	fz_type sv = sk;
	sv.dims[r - 1] = pv->type.dims[pv->type.rank - 1];
	if (!lead_eq(&qx->type, &sq) || !lead_eq(&kx->type, &sk) || !lead_eq(&pv->type, &sv) ||
	    !fz_ext_eq(sq.dims[r - 1], sk.dims[r - 1]) ||
	    !fz_ext_is_const(sq.dims[r - 1]) || !fz_ext_is_const(sv.dims[r - 1]))
		return false;
	fz_dtype dt = qx->type.dtype;
	if (!fz_dtype_is_float(dt) || kx->type.dtype != dt || pv->type.dtype != dt ||
	    m2->out[0]->type.dtype != dt)
		return false;
	/* repeated kv heads are seen in [b.., Hq, T, D] form alone */
	if ((kx->type.rank == r && !unrepeat(M, kx, &M->k, &M->kgroup)) ||
	    (pv->type.rank == r && !unrepeat(M, pv, &M->v, &M->vgroup)))
		return false;
	if (kx->type.rank != r) {
		M->k = kx;
		M->kgroup = 1;
	}
	if (pv->type.rank != r) {
		M->v = pv;
		M->vgroup = 1;
	}
	if (M->kgroup != M->vgroup)
		return false;
	M->q = qx;
	drop_shared(M, s);
	/* everything between the products is read here alone */
	for (int i = 0; i < M->n; i++) {
		const fz_node *n = M->nodes[i];
		if (n == m2)
			continue;
		for (int k = 0; k < n->n_out; k++)
			if (!read_only_in(M, n->out[k]))
				return false;
	}
	M->score = s;
	M->logits = logits;
	M->p = p;
	return true;
}

int fz_attn_match(const fz_trace *t, const fz_node *m2, int *ids, int max)
{
	(void)t;
	match M;
	if (!match_at(m2, &M) || M.n > max)
		return 0;
	for (int i = 0; i < M.n; i++)
		ids[i] = M.nodes[i]->id;
	return M.n;
}

static bool why_not(char *why, size_t n, const char *msg)
{
	if (why && n)
		snprintf(why, n, "%s", msg);
	return false;
}

static void shapes(fz_attn *A, const fz_type *q, const fz_type *k, const fz_type *v)
{
	int r = q->rank;
	A->n_batch = r - 3;
	A->batch = fz_ext_const(1);
	for (int i = 0; i < r - 3; i++)
		fz_ext_mul(A->batch, q->dims[i], &A->batch);
	A->hq = q->dims[r - 3];
	A->tq = q->dims[r - 2];
	A->d = q->dims[r - 1].c;
	A->hkv = k->dims[r - 3];
	A->tk = k->dims[r - 2];
	A->dv = v->dims[r - 1].c;
	fz_ext g;
	A->group = fz_ext_div(A->hq, A->hkv, &g) && fz_ext_is_const(g) ? g.c : 1;
}

bool fz_attn_describe(const fz_trace *t, const fz_region *R, fz_attn *A,
		      char *why, size_t n)
{
	(void)t;
	memset(A, 0, sizeof *A);
	A->in_q = A->in_k = A->in_v = A->in_mask = A->in_o = A->in_lse = A->in_do = -1;
	A->out_o = A->out_lse = A->out_dq = A->out_dk = A->out_dv = -1;
	const fz_node *prim = NULL, *dq = NULL, *m2 = NULL;
	for (int i = 0; i < R->n_nodes; i++) {
		const fz_node *nd = R->nodes[i];
		if (fz_ops[nd->op].cls == FZ_CLASS_ATTENTION) {
			if (prim && dq)
				return why_not(why, n, "three attention ops share a region");
			if (prim)
				dq = nd;
			else
				prim = nd;
		}
		if (nd->op == FZ_OP_MATMUL && index_in(R->out, R->n_out, nd->out[0]) >= 0)
			m2 = nd;
	}
	if (dq) {
		/* attention_dq and attention_dkv of one set of operands (the
		 * host's one backward pass, kernels.c): prim the dkv */
		if (prim->op == FZ_OP_ATTENTION_DQ) {
			const fz_node *x = prim;
			prim = dq;
			dq = x;
		}
		bool same = prim->op == FZ_OP_ATTENTION_DKV && dq->op == FZ_OP_ATTENTION_DQ &&
			    prim->n_in == dq->n_in && prim->attrs.scale == dq->attrs.scale &&
			    prim->attrs.softcap == dq->attrs.softcap &&
			    prim->attrs.causal == dq->attrs.causal &&
			    prim->attrs.window == dq->attrs.window;
		for (int k = 0; same && k < prim->n_in; k++)
			same = fz_attn_operand(R, prim, k) == fz_attn_operand(R, dq, k);
		if (!same)
			return why_not(why, n, "attention_dq and attention_dkv of "
				       "other operands share a region");
	}
	if (prim) {
		/* alone; or, reading repeated kv heads unrepeated (fz_attn_fold_find),
		 * attention_dkv with the sums of dk and dv over each group; with
		 * the views that make its operands from the region's inputs (a
		 * runner's folding) */
		const fz_value *kx = fz_attn_operand(R, prim, 1);
		const fz_value *vx = fz_attn_operand(R, prim, 2);
		bool folded = kx != prim->in[1];
		const fz_node *sums[2] = {NULL, NULL};
		for (int i = 0; i < R->n_nodes; i++) {
			const fz_node *nd = R->nodes[i];
			if (nd == prim || nd == dq)
				continue;
			/* a reshape of dk or dv to [.., Hkv, g, T, D], or its sum */
			const fz_node *rs = nd->op == FZ_OP_SUM ? nd->in[0]->def : nd;
			int r = rs && rs->op == FZ_OP_RESHAPE && rs->in[0]->def == prim ?
				rs->in[0]->out_index : -1;
			if (r < 0 && operand_view(nd))
				continue; /* checked by operand() below */
			if (!folded || prim->op != FZ_OP_ATTENTION_DKV || r < 0)
				return why_not(why, n, "an attention op shares its region");
			if (nd == rs)
				continue;
			fz_ext gx = rs->out[0]->type.dims[rs->out[0]->type.rank - 3];
			if (!fz_ext_is_const(gx) ||
			    !group_sum(prim->out[r], r ? vx : kx, gx.c, rs, nd))
				return why_not(why, n, "not the sum of dk or dv over a group");
			sums[r] = nd;
		}
		if (folded != (vx != prim->in[2]) ||
		    (folded && prim->op == FZ_OP_ATTENTION_DKV &&
		     (index_in(R->out, R->n_out, prim->out[0]) >= 0 ||
		      index_in(R->out, R->n_out, prim->out[1]) >= 0)))
			return why_not(why, n, "k and v are not read alike");
		const fz_attrs *a = &prim->attrs;
		A->pass = dq ? FZ_ATTN_BWD : prim->op == FZ_OP_ATTENTION ? FZ_ATTN_FWD :
			  prim->op == FZ_OP_ATTENTION_DQ ? FZ_ATTN_DQ : FZ_ATTN_DKV;
		A->dtype = prim->in[0]->type.dtype;
		A->op = prim;
		shapes(A, &prim->in[0]->type, &kx->type, &vx->type);
		A->scale = a->scale;
		A->softcap = a->softcap;
		A->causal = a->causal;
		A->window = a->window;
		bool ok = operand(R, prim->in[0], &A->in_q, A->stride[FZ_ATTN_Q]) &&
			  operand(R, kx, &A->in_k, A->stride[FZ_ATTN_K]) &&
			  operand(R, vx, &A->in_v, A->stride[FZ_ATTN_V]);
		int nm = A->pass == FZ_ATTN_FWD ? 3 : 6;
		if (A->pass != FZ_ATTN_FWD) {
			ok = ok && operand(R, prim->in[3], &A->in_o, A->stride[FZ_ATTN_O]) &&
			     operand(R, prim->in[5], &A->in_do, A->stride[FZ_ATTN_DO]);
			A->in_lse = index_in(R->in, R->n_in, prim->in[4]);
		}
		if (!ok)
			return why_not(why, n, "an operand is not a view of a region input "
				       "with its head dim contiguous");
		bool bwd = A->pass != FZ_ATTN_FWD;
		const fz_value *opv[5] = {prim->in[0], kx, vx, bwd ? prim->in[3] : NULL,
					  bwd ? prim->in[5] : NULL};
		for (int w = 0; w < (bwd ? 5 : 3); w++)
			A->views |= index_in(R->in, R->n_in, opv[w]) < 0;
		if (prim->n_in > nm) {
			A->mask = prim->in[nm];
			A->in_mask = index_in(R->in, R->n_in, A->mask);
		}
		int o0 = index_in(R->out, R->n_out, sums[0] ? sums[0]->out[0] : prim->out[0]);
		int o1 = prim->n_out < 2 ? -1 : index_in(R->out, R->n_out, sums[1] ?
							  sums[1]->out[0] : prim->out[1]);
		switch (A->pass) {
		case FZ_ATTN_FWD: A->out_o = o0; A->out_lse = o1; break;
		case FZ_ATTN_DQ: A->out_dq = o0; break;
		case FZ_ATTN_BWD: A->out_dq = index_in(R->out, R->n_out, dq->out[0]); /* fallthrough */
		case FZ_ATTN_DKV: A->out_dk = o0; A->out_dv = o1; break;
		}
		return true;
	}
	if (!m2)
		return why_not(why, n, "no attention op and no product written out");
	match M;
	if (!match_at(m2, &M))
		return why_not(why, n, "not matmul, scores, softmax, matmul");
	if (M.n != R->n_nodes)
		return why_not(why, n, "the region holds more than the attention");
	A->pass = FZ_ATTN_FWD;
	A->decomposed = true;
	A->dtype = M.q->type.dtype;
	{
		/* from the scores [b.., Hq, Tq, Tk]: q, k and v may flatten
		 * their leading dims; the kv heads are Hq / group */
		const fz_type *st = &M.score->type;
		int r = st->rank;
		A->n_batch = r - 3;
		A->batch = fz_ext_const(1);
		for (int i = 0; i < r - 3; i++)
			fz_ext_mul(A->batch, st->dims[i], &A->batch);
		A->hq = st->dims[r - 3];
		A->tq = st->dims[r - 2];
		A->tk = st->dims[r - 1];
		A->d = M.q->type.dims[M.q->type.rank - 1].c;
		A->dv = M.v->type.dims[M.v->type.rank - 1].c;
		A->group = M.kgroup;
		if (!fz_ext_div(A->hq, fz_ext_const(M.kgroup), &A->hkv))
			return why_not(why, n, "the kv heads do not divide the heads");
	}
	A->scale = 1;
	A->in_q = index_in(R->in, R->n_in, M.q);
	A->in_k = index_in(R->in, R->n_in, M.k);
	A->in_v = index_in(R->in, R->n_in, M.v);
	A->out_o = index_in(R->out, R->n_out, m2->out[0]);
	A->score = M.score;
	A->logits = M.logits;
	A->score_dtype = M.score->type.dtype;
	A->p_dtype = M.p->type.dtype;
	A->first = M.m1;
	A->last = M.m2;
	if (A->in_q < 0 || A->in_k < 0 || A->in_v < 0 || A->out_o < 0)
		return why_not(why, n, "q, k, v or o is not where the region has it");
	int in;
	fz_attn_view_strides(R, M.q, &in, A->stride[FZ_ATTN_Q]);
	fz_attn_view_strides(R, M.k, &in, A->stride[FZ_ATTN_K]);
	fz_attn_view_strides(R, M.v, &in, A->stride[FZ_ATTN_V]);
	return true;
}

double fz_attn_flops(const fz_attn *A, const int64_t *sizes)
{
	double b = (double)fz_ext_eval(A->batch, sizes), h = (double)fz_ext_eval(A->hq, sizes);
	double tq = (double)fz_ext_eval(A->tq, sizes), tk = (double)fz_ext_eval(A->tk, sizes);
	double pairs = tq * tk;
	if (A->causal)
		pairs = tq * tk - (tk > 1 ? tk * (tk - 1) / 2 : 0);
	if (A->window > 0 && (double)A->window < tk)
		pairs = fmin(pairs, tq * (double)A->window);
	if (pairs < 0)
		pairs = tq;
	double f = 2 * b * h * pairs * (double)(A->d + A->dv);
	/* the backward's passes: dq recomputes s and dp (3 products), dk/dv
	 * recomputes s and dp and forms dk, dv (4) */
	return A->pass == FZ_ATTN_FWD ? f : A->pass == FZ_ATTN_DQ ? 1.5 * f : 2 * f;
}
