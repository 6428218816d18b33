/*
 * scan.c: the scan skeleton, for a region that is one cumsum.
 *
 * The operand x is seen as [outer, N, inner] around the scanned dim: a row
 * is the N elements at one (outer, inner) position, `inner` apart in
 * memory, and there are outer * inner rows. Every output element is the
 * inclusive sum of its row up to it.
 *
 * Accumulation: f16 and bf16 in f32, f32 in f64 (as PyTorch's CPU kernel,
 * whose accumulator for float is double), f64 in f64, integers in i64,
 * exactly, wrapped to the dtype at the store. Each output is its running
 * sum rounded once.
 *
 * Host (and any target where a row is one thread's): a running sum, one row
 * per iteration of the rows loop:
 *
 *     for row: acc = 0; for j < N: acc += x[row, j]; y[row, j] = acc
 *
 * GPU: a block of FZ_ROW_BLOCK threads per row (grid-stride over rows),
 * walking the row in chunks of one element per thread. Within a chunk:
 *
 *   1. each thread loads its element (0 past the row's end);
 *   2. a warp-level inclusive scan: five shfl.up steps (1, 2, 4, 8, 16),
 *      a lane adding what the lane `d` below it holds;
 *   3. the last lane of each warp writes the warp's total to shared
 *      memory; after a barrier every thread adds the totals of the warps
 *      below its own (the block-level step: 8 warps, a short loop);
 *   4. the carry, the sum of every earlier chunk, is added, the element
 *      stored, and the carry grows by the chunk's total (the sum of all
 *      warp totals), the same in every thread; a barrier before the next
 *      chunk reuses the shared slots.
 *
 * Worked example: position ids from an attention mask, cumsum over
 * i64[B, T] along dim 1: B rows of T; on the GPU a block per batch row,
 * T/256 chunks; on the host B running sums.
 */
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "llvm.h"

bool cg_row_geometry(cg *g, const fz_node *n, cg_rowgeo *G)
{
	const fz_type *x = &n->in[0]->type;
	int d = n->attrs.dim;
	fz_type o, i;
	memset(&o, 0, sizeof o);
	memset(&i, 0, sizeof i);
	for (int k = 0; k < d; k++)
		o.dims[o.rank++] = x->dims[k];
	for (int k = d + 1; k < x->rank; k++)
		i.dims[i.rank++] = x->dims[k];
	if (!fz_type_numel(&o, &G->outer) || !fz_type_numel(&i, &G->inner) ||
	    !fz_ext_mul(G->outer, G->inner, &G->rows)) {
		cg_fail(g, FZ_EUNSUPPORTED, n, "element count overflows");
		return false;
	}
	G->n = x->dims[d];
	return true;
}

/* The region must be exactly node n of class cls: its operand the one
 * input, its results the outputs in order. */
bool cg_region_is_one(cg *g, fz_opclass cls)
{
	const fz_region *r = g->r;
	const fz_node *n = r->nodes[0];
	if (r->n_nodes != 1 || fz_ops[n->op].cls != cls || r->n_in != 1 ||
	    r->in[0] != n->in[0] || r->n_out != n->n_out) {
		cg_fail(g, FZ_EUNSUPPORTED, n, "a %s region must be one %s op",
			fz_class_names[cls], fz_class_names[cls]);
		return false;
	}
	for (int k = 0; k < n->n_out; k++)
		if (r->out[k] != n->out[k]) {
			cg_fail(g, FZ_EUNSUPPORTED, n, "a %s region must hand out "
				"its op's results in order", fz_class_names[cls]);
			return false;
		}
	return true;
}

V cg_row_base(cg *g, const cg_rowgeo *G, V row)
{
	V inner = cg_ext(g, G->inner), n = cg_ext(g, G->n);
	V o = udiv(g, row, inner), i = urem(g, row, inner);
	return add(g, mul(g, mul(g, o, n), inner), i);
}

/* The accumulator's type for dtype d: f32 for f16/bf16, f64 for f32 and
 * f64, i64 for integers. */
static T acc_type(cg *g, fz_dtype d)
{
	return d == FZ_F32 ? t_f64(g) : cg_ctype(g, d);
}

static V load_acc(cg *g, int slot, fz_dtype d, V off)
{
	V x = cg_from_storage(g, load(g, cg_stype(g, d), cg_elem_ptr(g, slot, d, off),
				      (unsigned)fz_dtype_size(d)), d);
	return d == FZ_F32 ? fpext(g, x, t_f64(g)) : x;
}

static void store_acc(cg *g, int slot, fz_dtype d, V off, V acc)
{
	if (d == FZ_F32)
		acc = fptrunc(g, acc, t_f32(g));
	store(g, cg_to_storage(g, acc, d), cg_elem_ptr(g, slot, d, off),
	      (unsigned)fz_dtype_size(d));
}

static V plus(cg *g, V a, V b)
{
	return type_of(a) == t_i64(g) ? add(g, a, b) : fadd_exact(g, a, b);
}

static V zero_of(cg *g, T t)
{
	return t == t_i64(g) ? c_i64(g, 0) : c_real(t, 0.0);
}

/* shfl.sync.up by d lanes (lanes below d keep their own value). */
static V shfl_up32(cg *g, V x, int d)
{
	bool isf = type_of(x) == t_f32(g);
	T ty = isf ? t_f32(g) : t_i32(g);
	T ps[4] = {t_i32(g), ty, t_i32(g), t_i32(g)};
	T fty = LLVMFunctionType(ty, ps, 4, 0);
	V args[4] = {c_i32(g, -1), x, c_i32(g, d), c_i32(g, 0)};
	return call_named(g, isf ? "llvm.nvvm.shfl.sync.up.f32" :
			  "llvm.nvvm.shfl.sync.up.i32", fty, args, 4);
}

V cg_shfl_up(cg *g, V x, int d)
{
	T t = type_of(x);
	if (t == t_f32(g) || t == t_i32(g))
		return shfl_up32(g, x, d);
	V u = t == t_f64(g) ? bitcast(g, x, t_i64(g)) : x;
	V lo = shfl_up32(g, trunc_(g, u, t_i32(g)), d);
	V hi = shfl_up32(g, trunc_(g, lshr(g, u, c_i64(g, 32)), t_i32(g)), d);
	V r = or_(g, zext(g, lo, t_i64(g)), shl(g, zext(g, hi, t_i64(g)), c_i64(g, 32)));
	return t == t_f64(g) ? bitcast(g, r, t_f64(g)) : r;
}

/* Shared slot w (of 32) of an array of type t, made on first use. */
V cg_smem32(cg *g, T t, const char *name, V w)
{
	T at = t_arr(t, 32);
	V gv = LLVMGetNamedGlobal(g->mod, name);
	if (!gv) {
		gv = LLVMAddGlobalInAddressSpace(g->mod, at, name, 3);
		LLVMSetInitializer(gv, c_undef(at));
		LLVMSetLinkage(gv, LLVMInternalLinkage);
		LLVMSetAlignment(gv, 8);
	}
	V idx[2] = {c_i32(g, 0), zext_or_trunc(g, w, t_i32(g))};
	return LLVMBuildInBoundsGEP2(g->b, at, gv, idx, 2, "");
}

static void scan_host(cg *g, const cg_rowgeo *G, fz_dtype d, fz_dtype od)
{
	T at = acc_type(g, d);
	V inner = cg_ext(g, G->inner);
	cg_loop RL;
	V row0, rows = cg_ext(g, G->rows);
	cg_host_chunk(g, rows, &row0, &rows); /* this part's rows */
	cg_loop_begin(g, &RL, row0, rows, c_int(g->ity, 1));
	V base = cg_row_base(g, G, RL.iv);
	V acc = cg_entry_alloca(g, at);
	store(g, zero_of(g, at), acc, 8);
	cg_loop L;
	cg_loop_begin(g, &L, c_int(g->ity, 0), cg_ext(g, G->n), c_int(g->ity, 1));
	V off = add(g, base, mul(g, L.iv, inner));
	V s = plus(g, load(g, at, acc, 8), load_acc(g, 0, d, off));
	store(g, s, acc, 8);
	store_acc(g, 1, od, off, s);
	cg_loop_end(g, &L);
	cg_loop_end(g, &RL);
}

static void scan_block(cg *g, const cg_rowgeo *G, fz_dtype d, fz_dtype od)
{
	T at = acc_type(g, d);
	V inner = cg_ext(g, G->inner), n = cg_ext(g, G->n);
	V tid = cg_tid(g), ntid = cg_ntid(g);
	V c32 = c_int(g->ity, 32);
	V lane = urem(g, tid, c32), warp = udiv(g, tid, c32), nw = udiv(g, ntid, c32);
	V carry = cg_entry_alloca(g, at), pre = cg_entry_alloca(g, at),
	  tot = cg_entry_alloca(g, at);
	cg_loop RL;
	cg_loop_begin(g, &RL, cg_ctaid(g), cg_ext(g, G->rows), cg_nctaid(g));
	V base = cg_row_base(g, G, RL.iv);
	store(g, zero_of(g, at), carry, 8);
	cg_loop C;
	cg_loop_begin(g, &C, c_int(g->ity, 0), n, ntid);
	V j = add(g, C.iv, tid);
	V valid = icmp(g, LLVMIntULT, j, n);
	V off = add(g, base, mul(g, sel(g, valid, j, c_int(g->ity, 0)), inner));
	V v = sel(g, valid, load_acc(g, 0, d, off), zero_of(g, at));
	/* 2. the warp's inclusive scan */
	for (int s = 1; s < 32; s *= 2) {
		V o = cg_shfl_up(g, v, s);
		V take = icmp(g, LLVMIntUGE, lane, c_int(g->ity, s));
		v = sel(g, take, plus(g, v, o), v);
	}
	/* 3. warp totals, then the block-level step */
	LLVMBasicBlockRef w = block(g, "scan.wr"), wd = block(g, "scan.wr.done");
	cond_br(g, icmp(g, LLVMIntEQ, lane, c_int(g->ity, 31)), w, wd);
	at_end(g, w);
	store(g, v, cg_smem32(g, at, at == t_i64(g) ? "fz_scan_i" : at == t_f64(g) ?
			      "fz_scan_d" : "fz_scan_f", warp), 8);
	br(g, wd);
	at_end(g, wd);
	cg_barrier(g);
	store(g, zero_of(g, at), pre, 8);
	store(g, zero_of(g, at), tot, 8);
	cg_loop WL;
	cg_loop_begin(g, &WL, c_int(g->ity, 0), nw, c_int(g->ity, 1));
	V x = load(g, at, cg_smem32(g, at, at == t_i64(g) ? "fz_scan_i" : at == t_f64(g) ?
				     "fz_scan_d" : "fz_scan_f", WL.iv), 8);
	V below = icmp(g, LLVMIntULT, WL.iv, warp);
	store(g, sel(g, below, plus(g, load(g, at, pre, 8), x), load(g, at, pre, 8)), pre, 8);
	store(g, plus(g, load(g, at, tot, 8), x), tot, 8);
	cg_loop_end(g, &WL);
	/* 4. carry in, store, carry out */
	V c = load(g, at, carry, 8);
	V r = plus(g, plus(g, c, load(g, at, pre, 8)), v);
	LLVMBasicBlockRef st = block(g, "scan.st"), sd = block(g, "scan.st.done");
	cond_br(g, valid, st, sd);
	at_end(g, st);
	store_acc(g, 1, od, off, r);
	br(g, sd);
	at_end(g, sd);
	store(g, plus(g, c, load(g, at, tot, 8)), carry, 8);
	cg_barrier(g);
	cg_loop_end(g, &C);
	cg_loop_end(g, &RL);
}

void cg_scan(cg *g)
{
	if (!cg_region_is_one(g, FZ_CLASS_SCAN))
		return;
	const fz_node *n = g->r->nodes[0];
	cg_rowgeo G;
	if (!cg_row_geometry(g, n, &G))
		return;
	bool gpu = g->o.target == FZ_CG_NVPTX;
	g->k->sk = FZ_SK_ROW;
	g->k->par = gpu ? FZ_PAR_BLOCK : FZ_PAR_THREAD;
	g->k->vec = 1;
	g->k->n_work[0] = 1;
	g->k->work[0][0] = G.rows;
	cg_function_begin(g, g->k->names[0]);
	if (g->st == FZ_OK) {
		fz_dtype d = n->in[0]->type.dtype, od = n->out[0]->type.dtype;
		if (gpu)
			scan_block(g, &G, d, od);
		else
			scan_host(g, &G, d, od);
	}
	cg_function_end(g);
}
