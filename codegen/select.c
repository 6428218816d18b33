/*
 * select.c: the selection skeleton, for a region that is one topk, argmax
 * or argmin.
 *
 * Rows as in scan.c: x seen as [outer, N, inner] around dim. Selection
 * follows one total order on a row's elements (value, index): NaN first,
 * then larger values (smaller for argmin), then the lower index, so the
 * result never depends on which thread saw what first, and ties go to the
 * lower index, as DESIGN.md asks and torch does.
 *
 * topk(k) is k rounds of an arg-extremum, each over the elements that come
 * after the previous round's pick in that order: round r finds the r-th
 * element of the sorted row without sorting it. argmax and argmin are the
 * case k = 1 with the index alone stored. k is small where this is used
 * (mixture-of-experts routing picks 1 to 8 of at most a few hundred
 * experts), so k passes over a row that stays in L1 cost less than a sort.
 *
 * Host: one row per iteration of the rows loop, each round a plain loop.
 * GPU: a block of FZ_ROW_BLOCK threads per row; each thread keeps the best
 * (value, index) of its elements (stride: the block), then the pairs
 * combine by butterfly shuffles within each warp and through one shared
 * slot per warp across warps; every thread ends the round with the same
 * pick, and thread 0 stores it.
 *
 * Values compare in their compute type (f32 for f16/bf16/f32, f64, i64),
 * which holds every stored value exactly, so the order is the exact one
 * the interpreter uses.
 */
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "llvm.h"

/* Does (a, ia) come before (b, ib)? hb: b is a real candidate (not the
 * empty start); a always is. */
static V before(cg *g, bool least, V a, V ia, V b, V ib, V hb)
{
	V lower = icmp(g, LLVMIntSLT, ia, ib);
	V r;
	if (type_of(a) == t_i64(g)) {
		V better = icmp(g, least ? LLVMIntSLT : LLVMIntSGT, a, b);
		r = or_(g, better, and_(g, icmp(g, LLVMIntEQ, a, b), lower));
	} else {
		V an = fcmp(g, LLVMRealUNO, a, a), bn = fcmp(g, LLVMRealUNO, b, b);
		V better = fcmp(g, least ? LLVMRealOLT : LLVMRealOGT, a, b);
		V eq = fcmp(g, LLVMRealOEQ, a, b);
		V nobn = xor_(g, bn, c_i1(g, 1));
		V num = and_(g, nobn, or_(g, better, and_(g, eq, lower)));
		r = sel(g, an, or_(g, nobn, lower), num);
	}
	return or_(g, r, xor_(g, hb, c_i1(g, 1)));
}

typedef struct pick {
	V v, i, has; /* allocas: value, index (i64), whether one is held */
} pick;

/* (v, i) into the best P holds, if it comes first. */
static void pick_offer(cg *g, bool least, pick *P, T t, V v, V i, V ok)
{
	V bv = load(g, t, P->v, 8), bi = load(g, t_i64(g), P->i, 8);
	V bh = load(g, t_i1(g), P->has, 1);
	V take = and_(g, ok, before(g, least, v, i, bv, bi, bh));
	store(g, sel(g, take, v, bv), P->v, 8);
	store(g, sel(g, take, i, bi), P->i, 8);
	store(g, or_(g, bh, take), P->has, 1);
}

/* Every thread's pick combined: warps by butterfly shuffles, then one
 * shared slot per warp. */
static void pick_across(cg *g, bool least, pick *P, T t)
{
	for (int m = 16; m >= 1; m /= 2) {
		V ov = cg_shfl_bfly(g, load(g, t, P->v, 8), m);
		V oi = cg_shfl_bfly(g, load(g, t_i64(g), P->i, 8), m);
		V oh = cg_shfl_bfly(g, load(g, t_i1(g), P->has, 1), m);
		pick_offer(g, least, P, t, ov, oi, oh);
	}
	V tid = cg_tid(g), c32 = c_int(g->ity, 32);
	V lane = urem(g, tid, c32), warp = udiv(g, tid, c32);
	V nw = udiv(g, cg_ntid(g), c32);
	const char *vn = t == t_i64(g) ? "fz_sel_vi" : t == t_f64(g) ? "fz_sel_vd" : "fz_sel_vf";
	LLVMBasicBlockRef w = block(g, "sel.wr"), wd = block(g, "sel.wr.done");
	cond_br(g, icmp(g, LLVMIntEQ, lane, c_int(g->ity, 0)), w, wd);
	at_end(g, w);
	store(g, load(g, t, P->v, 8), cg_smem32(g, t, vn, warp), 8);
	/* no pick: index -1, which no candidate has */
	V bi = load(g, t_i64(g), P->i, 8);
	store(g, sel(g, load(g, t_i1(g), P->has, 1), bi, c_i64(g, -1)),
	      cg_smem32(g, t_i64(g), "fz_sel_i", warp), 8);
	br(g, wd);
	at_end(g, wd);
	cg_barrier(g);
	cg_loop L;
	cg_loop_begin(g, &L, c_int(g->ity, 0), nw, c_int(g->ity, 1));
	V ov = load(g, t, cg_smem32(g, t, vn, L.iv), 8);
	V oi = load(g, t_i64(g), cg_smem32(g, t_i64(g), "fz_sel_i", L.iv), 8);
	pick_offer(g, least, P, t, ov, oi, icmp(g, LLVMIntSGE, oi, c_i64(g, 0)));
	cg_loop_end(g, &L);
	cg_barrier(g);
}

void cg_select(cg *g)
{
	if (!cg_region_is_one(g, FZ_CLASS_SELECT))
		return;
	const fz_node *n = g->r->nodes[0];
	cg_rowgeo G;
	if (!cg_row_geometry(g, n, &G))
		return;
	bool gpu = g->o.target == FZ_CG_NVPTX, topk = n->op == FZ_OP_TOPK;
	bool least = n->op == FZ_OP_ARGMIN;
	int64_t K = topk ? n->attrs.k : 1;
	fz_dtype d = n->in[0]->type.dtype;
	T t = cg_ctype(g, d);
	g->k->sk = FZ_SK_ROW;
	g->k->par = gpu ? FZ_PAR_BLOCK : FZ_PAR_THREAD;
	g->k->vec = 1;
	g->k->n_work[0] = 1;
	g->k->work[0][0] = G.rows;
	cg_function_begin(g, g->k->names[0]);
	if (g->st != FZ_OK) {
		cg_function_end(g);
		return;
	}
	V inner = cg_ext(g, G.inner), N = cg_ext(g, G.n);
	cg_flag_error(g, n, icmp(g, LLVMIntULT, N, c_int(g->ity, K)));
	V tid = gpu ? cg_tid(g) : c_int(g->ity, 0);
	V nthr = gpu ? cg_ntid(g) : c_int(g->ity, 1);
	pick P = {cg_entry_alloca(g, t), cg_entry_alloca(g, t_i64(g)),
		  cg_entry_alloca(g, t_i1(g))};
	V pv = cg_entry_alloca(g, t), pi = cg_entry_alloca(g, t_i64(g));
	V zero = t == t_i64(g) ? c_i64(g, 0) : c_real(t, 0.0);
	cg_loop RL;
	V row0 = gpu ? cg_ctaid(g) : c_int(g->ity, 0);
	V rstep = gpu ? cg_nctaid(g) : c_int(g->ity, 1);
	V rows = cg_ext(g, G.rows);
	if (!gpu) /* this part's rows */
		cg_host_chunk(g, rows, &row0, &rows);
	cg_loop_begin(g, &RL, row0, rows, rstep);
	V base = cg_row_base(g, &G, RL.iv);
	store(g, zero, pv, 8);
	store(g, c_i64(g, -1), pi, 8);
	V o = udiv(g, RL.iv, inner), i = urem(g, RL.iv, inner);
	V obase = add(g, mul(g, mul(g, o, c_int(g->ity, K)), inner), i);
	cg_loop KL;
	cg_loop_begin(g, &KL, c_int(g->ity, 0), c_int(g->ity, K), c_int(g->ity, 1));
	V first = icmp(g, LLVMIntEQ, KL.iv, c_int(g->ity, 0));
	V prev_v = load(g, t, pv, 8), prev_i = load(g, t_i64(g), pi, 8);
	store(g, zero, P.v, 8);
	store(g, c_i64(g, -1), P.i, 8);
	store(g, c_i1(g, 0), P.has, 1);
	cg_loop EL;
	cg_loop_begin(g, &EL, tid, N, nthr);
	V x = cg_from_storage(g, load(g, cg_stype(g, d),
				      cg_elem_ptr(g, 0, d, add(g, base, mul(g, EL.iv, inner))),
				      (unsigned)fz_dtype_size(d)), d);
	V j = zext_or_trunc(g, EL.iv, t_i64(g));
	/* eligible: after the previous round's pick */
	V after = or_(g, first, before(g, least, prev_v, prev_i, x, j, c_i1(g, 1)));
	pick_offer(g, least, &P, t, x, j, after);
	cg_loop_end(g, &EL);
	if (gpu)
		pick_across(g, least, &P, t);
	V bv = load(g, t, P.v, 8), bi = load(g, t_i64(g), P.i, 8);
	store(g, bv, pv, 8);
	store(g, bi, pi, 8);
	V leader = icmp(g, LLVMIntEQ, tid, c_int(g->ity, 0));
	LLVMBasicBlockRef st = block(g, "sel.st"), sd = block(g, "sel.st.done");
	cond_br(g, leader, st, sd);
	at_end(g, st);
	V off = add(g, obase, mul(g, KL.iv, inner));
	int si = g->r->n_in;
	if (topk) {
		store(g, cg_to_storage(g, bv, d), cg_elem_ptr(g, si, d, off),
		      (unsigned)fz_dtype_size(d));
		si++;
	}
	store(g, bi, cg_elem_ptr(g, si, FZ_I64, off), 8);
	br(g, sd);
	at_end(g, sd);
	cg_loop_end(g, &KL);
	cg_loop_end(g, &RL);
	cg_function_end(g);
}
