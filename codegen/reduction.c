/*
 * reduction.c: the row skeleton, for reduction and normalization regions.
 *
 * Every reduction of the region must reduce the same dims of the same
 * shape, the domain D. The kept dims of D are rows (K of them), the reduced
 * dims a row's elements (R). For each row, in order:
 *
 *   1. every reduction, in the region's order, is a pass over the row: each
 *      thread accumulates its elements (lanes of 16 bytes along the row when
 *      the innermost dim is reduced and its extent allows; float sums with
 *      Kahan's compensation, so a long row sums as accurately in f32 as the
 *      interpreter's f64 rounded once, nearly), the lanes are
 *      combined, then the threads: butterfly warp shuffles, then one slot
 *      per warp in shared memory read back by every thread in warp order.
 *      var_mean is two passes (the mean, then squared deviations), as the
 *      interpreter does. Later passes may use earlier reduced values (softmax
 *      sums exp(x - max)); the emitter reads them from the row's registers.
 *   2. outputs of the row's shape (a loss per row, a mean kept for backward)
 *      are computed at the row's index and stored by one thread;
 *   3. outputs of D's shape are a last pass over the row (the normalization
 *      tail: (x - mean) * rstd * w + b), stored by every thread.
 *
 * How a row is spread over threads (fz_kernel.par):
 *   BLOCK   innermost dim reduced, long rows: a block per row
 *   WARP    innermost dim reduced, rows of at most 1024 lanes: a warp per row
 *   THREAD  innermost dim kept (an outer reduction, sum over dim 0): rows
 *           are columns, one per thread, so consecutive threads read
 *           consecutive addresses; and every row on the host, where the
 *           parallel loops are plain loops
 *
 * Worked example: softmax over [B, 12, T, T] f32, dims=[3]: K = B*12*T rows
 * of R = T; pass 1 amax, pass 2 sum(exp(x - max)), pass 3 stores
 * exp(x - max) / sum. Accumulation is in f32 for f16/bf16/f32 and f64 for
 * f64; the row is re-read by each pass (from L1/L2 on the GPU), not held in
 * registers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "llvm.h"

typedef struct rows {
	const fz_type *D;
	bool red[FZ_MAX_RANK];
	fz_type kt, rt;        /* kept dims, reduced dims */
	int kd[FZ_MAX_RANK], rd[FZ_MAX_RANK]; /* their positions in D */
	int L;                 /* lanes along the row */
	fz_rowpar par;
	V tid_in_row, nthr;    /* a thread's position in its row's group */
	V count;               /* R as ity */
} rows;

static V identity(cg *g, fz_opcode op, T t)
{
	bool isf = t != t_i64(g);
	if (op == FZ_OP_AMAX)
		return isf ? c_real(t, -INFINITY) : c_i64(g, INT64_MIN);
	if (op == FZ_OP_AMIN)
		return isf ? c_real(t, INFINITY) : c_i64(g, INT64_MAX);
	return isf ? c_real(t, 0.0) : c_i64(g, 0);
}

static V combine(cg *g, fz_opcode op, V acc, V v)
{
	bool isf = type_of(acc) != t_i64(g);
	if (op != FZ_OP_AMAX && op != FZ_OP_AMIN)
		return isf ? fadd(g, acc, v) : add(g, acc, v);
	if (!isf)
		return sel(g, icmp(g, op == FZ_OP_AMAX ? LLVMIntSGT : LLVMIntSLT, v, acc), v, acc);
	/* NaN sticks, as in the interpreter */
	V accnan = fcmp(g, LLVMRealUNO, acc, acc);
	V take = or_(g, fcmp(g, LLVMRealUNO, v, v),
		     fcmp(g, op == FZ_OP_AMAX ? LLVMRealOGT : LLVMRealOLT, v, acc));
	return sel(g, accnan, acc, sel(g, take, v, acc));
}

static V smem_slot(cg *g, T t, V i)
{
	int kind = t == t_f32(g) ? 0 : t == t_f64(g) ? 1 : 2;
	if (!g->smem[kind]) {
		T at = t_arr(t, 32);
		g->smem[kind] = LLVMAddGlobalInAddressSpace(g->mod, at, "fz_smem", 3);
		LLVMSetInitializer(g->smem[kind], c_undef(at));
		LLVMSetLinkage(g->smem[kind], LLVMInternalLinkage);
		LLVMSetAlignment(g->smem[kind], 8);
	}
	V idx[2] = {c_i32(g, 0), zext_or_trunc(g, i, t_i32(g))};
	return LLVMBuildInBoundsGEP2(g->b, t_arr(t, 32), g->smem[kind], idx, 2, "");
}

/* Combines a per-thread value across the threads that share a row. */
static V across_threads(cg *g, rows *R, fz_opcode op, V v)
{
	if (R->par == FZ_PAR_THREAD)
		return v;
	for (int m = 16; m >= 1; m /= 2)
		v = combine(g, op, v, cg_shfl_bfly(g, v, m));
	if (R->par == FZ_PAR_WARP)
		return v;
	T t = type_of(v);
	V tid = cg_tid(g);
	V warp = udiv(g, tid, c_int(g->ity, 32));
	V lane = urem(g, tid, c_int(g->ity, 32));
	V nw = udiv(g, cg_ntid(g), c_int(g->ity, 32));
	LLVMBasicBlockRef w = block(g, "wr"), cont = block(g, "wr.done");
	cond_br(g, icmp(g, LLVMIntEQ, lane, c_int(g->ity, 0)), w, cont);
	at_end(g, w);
	store(g, v, smem_slot(g, t, warp), 4);
	br(g, cont);
	at_end(g, cont);
	cg_barrier(g);
	V acc = cg_entry_alloca(g, t);
	store(g, identity(g, op, t), acc, 8);
	cg_loop L;
	cg_loop_begin(g, &L, c_int(g->ity, 0), nw, c_int(g->ity, 1));
	store(g, combine(g, op, load(g, t, acc, 8), load(g, t, smem_slot(g, t, L.iv), 4)), acc, 8);
	cg_loop_end(g, &L);
	V r = load(g, t, acc, 8);
	cg_barrier(g);
	return r;
}

/* The full domain index of lanes at reduced position jb (+ l). */
static void row_lanes(cg *g, rows *R, V jb, cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK])
{
	cg_ix rj[FZ_MAX_RANK];
	cg_delinearize(g, &R->rt, jb, R->L, rj);
	for (int l = 0; l < R->L; l++) {
		for (int d = 0; d < R->D->rank; d++)
			if (!R->red[d])
				ix[l][d] = g->row[d];
		for (int i = 0; i < R->rt.rank; i++)
			ix[l][R->rd[i]] = rj[i];
		if (l > 0)
			ix[l][R->rd[R->rt.rank - 1]].o += l;
	}
}

/* The loop over a row's elements for this thread: body(ix) per step. */
static void row_loop_begin(cg *g, rows *R, cg_loop *L)
{
	V start = mul(g, R->tid_in_row, c_int(g->ity, R->L));
	V step = mul(g, R->nthr, c_int(g->ity, R->L));
	cg_loop_begin(g, L, start, R->count, step);
}

/* One pass: op-accumulate f(x) over the row; mean != NULL squares x - mean. */
static V pass(cg *g, rows *R, fz_opcode op, const fz_value *x, V mean)
{
	T t = cg_ctype(g, x->type.dtype);
	bool kahan = op == FZ_OP_SUM && t != t_i64(g);
	V acc[FZ_VW_MAX], comp[FZ_VW_MAX];
	for (int l = 0; l < R->L; l++) {
		acc[l] = cg_entry_alloca(g, t);
		store(g, identity(g, op, t), acc[l], 8);
		if (kahan) {
			comp[l] = cg_entry_alloca(g, t);
			store(g, c_real(t, 0.0), comp[l], 8);
		}
	}
	cg_loop L;
	row_loop_begin(g, R, &L);
	cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
	row_lanes(g, R, L.iv, ix);
	V vals[FZ_VW_MAX];
	cg_value(g, x, R->L, ix, vals);
	for (int l = 0; l < R->L; l++) {
		V v = vals[l];
		if (mean) {
			V dv = fsub(g, v, mean);
			v = fmul(g, dv, dv);
		}
		if (kahan) {
			/* compensated: the sum of a row of 50257 exps stays
			 * within an ulp or two, independent of the row length */
			V a0 = load(g, t, acc[l], 8), c0 = load(g, t, comp[l], 8);
			V y = fsub_exact(g, v, c0);
			V s1 = fadd_exact(g, a0, y);
			store(g, fsub_exact(g, fsub_exact(g, s1, a0), y), comp[l], 8);
			store(g, s1, acc[l], 8);
			continue;
		}
		store(g, combine(g, op, load(g, t, acc[l], 8), v), acc[l], 8);
	}
	cg_loop_end(g, &L);
	V a[FZ_VW_MAX];
	for (int l = 0; l < R->L; l++)
		a[l] = load(g, t, acc[l], 8);
	for (int w = 1; w < R->L; w *= 2)
		for (int l = 0; l + w < R->L; l += 2 * w)
			a[l] = combine(g, op, a[l], a[l + w]);
	return across_threads(g, R, op, a[0]);
}

static void reduce_node(cg *g, rows *R, const fz_node *n)
{
	const fz_value *x = n->in[0];
	if (n->op == FZ_OP_AMAX || n->op == FZ_OP_AMIN)
		cg_flag_error(g, n, icmp(g, LLVMIntEQ, R->count, c_int(g->ity, 0)));
	fz_dtype d = n->out[0]->type.dtype;
	if (n->op != FZ_OP_VAR_MEAN) {
		g->red[n->out[0]->id] = cg_round_half(g, pass(g, R, n->op, x, NULL), d);
		return;
	}
	T t = cg_ctype(g, x->type.dtype);
	V cnt = uitofp(g, R->count, t);
	V mean = fdiv(g, pass(g, R, FZ_OP_SUM, x, NULL), cnt);
	V m2 = pass(g, R, FZ_OP_SUM, x, mean);
	V dv = fsub(g, cnt, c_real(t, (double)n->attrs.correction));
	dv = sel(g, fcmp(g, LLVMRealOGT, dv, c_real(t, 0.0)), dv, c_real(t, 0.0));
	g->red[n->out[0]->id] = cg_round_half(g, fdiv(g, m2, dv), d);
	g->red[n->out[1]->id] = cg_round_half(g, mean, d);
}

static bool ext_is1(fz_ext e) { return e.syms == 0 && e.c == 1; }

/* 1: o has the row's shape (ix filled), 2: D's shape, 0: neither. */
static int classify(cg *g, rows *R, const fz_value *o, cg_ix *ix)
{
	const fz_type *ty = &o->type, *D = R->D;
	if (ty->rank == D->rank) {
		bool dom = true, row = true;
		for (int d = 0; d < D->rank; d++) {
			dom = dom && fz_ext_eq(ty->dims[d], D->dims[d]);
			row = row && (R->red[d] ? ext_is1(ty->dims[d]) :
				      fz_ext_eq(ty->dims[d], D->dims[d]));
		}
		if (dom)
			return 2;
		if (row) {
			for (int d = 0; d < D->rank; d++)
				ix[d] = R->red[d] ? cg_ix_zero() : g->row[d];
			return 1;
		}
		return 0;
	}
	if (ty->rank != R->kt.rank)
		return 0;
	for (int i = 0; i < R->kt.rank; i++) {
		if (!fz_ext_eq(ty->dims[i], R->kt.dims[i]))
			return 0;
		ix[i] = g->row[R->kd[i]];
	}
	return 1;
}

void cg_rows(cg *g)
{
	const fz_region *r = g->r;
	const fz_node *reds[64];
	int nr = 0;
	for (int i = 0; i < r->n_nodes; i++)
		if (fz_ops[r->nodes[i]->op].cls == FZ_CLASS_REDUCTION) {
			if (nr == 64) {
				cg_fail(g, FZ_EUNSUPPORTED, r->nodes[i], "more than 64 reductions");
				return;
			}
			reds[nr++] = r->nodes[i];
		}
	rows R;
	memset(&R, 0, sizeof R);
	R.D = &reds[0]->in[0]->type;
	for (int i = 0; i < reds[0]->attrs.n_dims; i++)
		R.red[reds[0]->attrs.dims[i]] = true;
	for (int k = 1; k < nr; k++) {
		const fz_type *t = &reds[k]->in[0]->type;
		bool same = t->rank == R.D->rank && reds[k]->attrs.n_dims == reds[0]->attrs.n_dims;
		for (int d = 0; same && d < t->rank; d++)
			same = fz_ext_eq(t->dims[d], R.D->dims[d]);
		for (int i = 0; same && i < reds[k]->attrs.n_dims; i++)
			same = R.red[reds[k]->attrs.dims[i]];
		if (!same) {
			cg_fail(g, FZ_EUNSUPPORTED, reds[k], "reduces other dims or another "
				"shape than the region's first reduction");
			return;
		}
	}
	for (int d = 0; d < R.D->rank; d++) {
		if (R.red[d]) {
			R.rd[R.rt.rank] = d;
			R.rt.dims[R.rt.rank++] = R.D->dims[d];
		} else {
			R.kd[R.kt.rank] = d;
			R.kt.dims[R.kt.rank++] = R.D->dims[d];
		}
	}
	for (int i = 0; i < nr; i++)
		for (int j = 0; j < reds[i]->n_out; j++)
			g->is_red[reds[i]->out[j]->id] = true;

	fz_ext K, Rn;
	if (!fz_type_numel(&R.kt, &K) || !fz_type_numel(&R.rt, &Rn)) {
		cg_fail(g, FZ_EUNSUPPORTED, reds[0], "element count overflows");
		return;
	}
	bool inner = R.rt.rank > 0 && R.red[R.D->rank - 1];
	fz_ext last = R.rt.rank ? R.rt.dims[R.rt.rank - 1] : fz_ext_const(1);
	R.L = cg_lanes_for(g);
	if (!inner || !fz_ext_is_const(last) || last.c % R.L)
		R.L = 1;
	if (g->o.target != FZ_CG_NVPTX || !inner)
		R.par = FZ_PAR_THREAD;
	else if (fz_ext_is_const(Rn) && Rn.c / R.L <= 1024)
		R.par = FZ_PAR_WARP;
	else
		R.par = FZ_PAR_BLOCK;
	g->k->par = R.par;
	g->k->vec = R.L;
	g->k->n_work[0] = 1;
	g->k->work[0][0] = K;

	cg_function_begin(g, g->k->names[0]);
	if (g->st != FZ_OK) {
		cg_function_end(g);
		return;
	}
	R.count = cg_ext(g, Rn);
	V row0, rstep;
	V tid = cg_tid(g), ntid = cg_ntid(g), cta = cg_ctaid(g), ncta = cg_nctaid(g);
	if (R.par == FZ_PAR_BLOCK) {
		row0 = cta;
		rstep = ncta;
		R.tid_in_row = tid;
		R.nthr = ntid;
	} else if (R.par == FZ_PAR_WARP) {
		V wpb = udiv(g, ntid, c_int(g->ity, 32));
		row0 = add(g, mul(g, cta, wpb), udiv(g, tid, c_int(g->ity, 32)));
		rstep = mul(g, ncta, wpb);
		R.tid_in_row = urem(g, tid, c_int(g->ity, 32));
		R.nthr = c_int(g->ity, 32);
	} else {
		row0 = add(g, mul(g, cta, ntid), tid);
		rstep = mul(g, ncta, ntid);
		R.tid_in_row = c_int(g->ity, 0);
		R.nthr = c_int(g->ity, 1);
	}
	cg_loop RL;
	cg_loop_begin(g, &RL, row0, cg_ext(g, K), rstep);
	cg_ix kix[FZ_MAX_RANK];
	cg_delinearize(g, &R.kt, RL.iv, 1, kix);
	g->row_rank = R.D->rank;
	for (int d = 0; d < R.D->rank; d++) {
		g->row_kept[d] = !R.red[d];
		g->row[d] = cg_ix_zero();
	}
	for (int i = 0; i < R.kt.rank; i++)
		g->row[R.kd[i]] = kix[i];
	g->row_valid = true;

	for (int i = 0; i < nr && g->st == FZ_OK; i++)
		reduce_node(g, &R, reds[i]);

	/* row-shaped outputs, then the tail over the row */
	V leader = icmp(g, LLVMIntEQ, R.tid_in_row, c_int(g->ity, 0));
	int n_tail = 0;
	for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
		cg_ix ix[1][FZ_MAX_RANK];
		int kind = classify(g, &R, r->out[i], ix[0]);
		if (kind == 0) {
			cg_fail(g, FZ_EUNSUPPORTED, r->out[i]->def, "an output whose shape "
				"is neither the rows' nor the reduced domain's");
			break;
		}
		if (kind == 2) {
			n_tail++;
			continue;
		}
		V v;
		cg_value(g, r->out[i], 1, ix, &v);
		int cse = g->n_cse;
		LLVMBasicBlockRef st = block(g, "row.out"), cont = block(g, "row.next");
		cond_br(g, leader, st, cont);
		at_end(g, st);
		cg_store(g, r->out[i], 1, ix, &v);
		br(g, cont);
		at_end(g, cont);
		g->n_cse = cse; /* what the store built lives in row.out only */
	}
	if (n_tail && g->st == FZ_OK) {
		cg_loop L;
		row_loop_begin(g, &R, &L);
		cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
		row_lanes(g, &R, L.iv, ix);
		for (int i = 0; i < r->n_out && g->st == FZ_OK; i++) {
			cg_ix tmp[FZ_MAX_RANK];
			if (classify(g, &R, r->out[i], tmp) != 2)
				continue;
			V vals[FZ_VW_MAX];
			cg_value(g, r->out[i], R.L, ix, vals);
			cg_store(g, r->out[i], R.L, ix, vals);
		}
		cg_loop_end(g, &L);
	}
	cg_loop_end(g, &RL);
	g->row_valid = false;
	cg_function_end(g);
}
