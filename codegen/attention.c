/*
 * attention.c: attention regions (ir/attention.h) on the host: the
 * FlashAttention-2 algorithm, tiled and vectorized, one work item per
 * (batch, head, block of BQ query rows) for the forward and the dq pass,
 * per (batch, kv head, block of BK keys) for the dk/dv pass, the items
 * split across the pool (cg_host_chunk). No buffer of Tq x Tk exists: a
 * work item holds one block of keys (BK of them) at a time, in f32, on
 * its stack.
 *
 * Forward, for each block of keys a query block may see (the causal and
 * window ranges skip the others): K transposed into Kt [D][BK] and V into
 * Vs [BK][Dv], both f32; then per query row i
 *
 *     s[j]  = q_i . k_j                 S = Q Kt, one block product
 *     l[j]  = cg_attn_scores(s)         the trace's modification, -inf where
 *                                       hidden (the shared emitter)
 *     m'    = max(m, max_j l[j]);  a = exp(m - m');  p[j] = exp(l[j] - m')
 *     sum'  = a sum + sum_j p[j];  o_i = a o_i + sum_j p[j] v_j  (O = a O + P V)
 *
 * and at the end o_i / sum and lse_i = m + log(sum) (a row that saw no
 * key: o = 0, lse = -inf). The backward recomputes p = exp(l - lse) per
 * block: the dq pass (a block of queries walks its keys) forms
 * dp = do_i . v_j, ds = p (dp - di) dl/ds, dq_i += ds k_j; the dk/dv pass
 * (a block of keys walks the `group` query heads sharing its kv head and
 * their rows) adds dv_j += p do_i and dk_j += ds q_i. di = do_i . o_i.
 *
 * Where the time goes (B=1, H=16, T=2048, D=64, causal, f32): the block
 * products hold about three quarters of it, the rows' softmax (the logits,
 * exp, the running max and sum) the rest. So:
 *   - the products (gemm_s) are register tiles of 4 rows by 4 vectors of
 *     16 floats (16 zmm accumulators, 8 loads per 16 fmas) where the host
 *     has AVX-512, 4 rows by 2 vectors of 8 elsewhere;
 *   - the rows run in vectors of the same width (K->rw), exp by a
 *     polynomial (vexp, math.c's expf in lanes; vscalefps for 2^k with
 *     AVX-512);
 *   - a block of keys that every row of the block of queries sees whole
 *     (block_full: below a causal diagonal, nearly all of them) takes a
 *     row loop without masks (by_cond);
 *   - a causal diagonal block (its keys start at its rows, so keys j > i
 *     are hidden) computes its triangle only: the products' tiles stop at
 *     the diagonal (gemm_s's tri), the rows' pass covers the vectors left
 *     of it (row_loops), about 60% of a full block's work;
 *   - a bool mask that is a region input (what HF's Llama hands SDPA under
 *     torch.compile: its causal mask as a tensor) is read per block before
 *     the block (classify): a block it hides whole is skipped, one it
 *     shows whole runs without it, a diagonal it cuts exactly there runs
 *     as a causal diagonal block; only the rest read it per lane;
 *   - the forward's rescaling of O by exp(m - m') happens as the P V
 *     product loads its accumulators (gemm_s's rs), not in a pass of its
 *     own;
 *   - an item of one or two query rows (a decode step against a KV
 *     cache) copies no block: S's rows are dot products with the keys and
 *     O gathers the values where they lie (fwd_block_few), since the
 *     transposed copy the products amortize over BQ rows cost a decode
 *     step ten times PyTorch's time; the products of a part-filled item
 *     stop at its last tile of rows (gemm_s's mrows);
 *   - exp never computes below a normal float (vexp): with the MXCSR's
 *     default an underflow is a microcode assist per instruction, and
 *     the hidden half of every diagonal block underflowed.
 * At a training step's T = 128 (B=4, H=4, D=64, f32, one thread) the
 * passes took 1.16, 1.18 and 1.45 ms (half of the forward in the
 * assists); now about 0.4, 0.55 and 0.65, the block products 45 to 65%
 * of each, the rows' softmax 15 to 25%, the rest loads and stores.
 * Other vectors (loads, transposes, stores) are 8 floats. D and Dv must be
 * multiples of 16. A trace's own score modification (a mask, softcap, the
 * decomposed form) is per lane through cg_value, which the SLP vectorizer
 * packs where it can.
 *
 * Operands where they lie: q, k, v, o and do are read at the strides
 * fz_attn.stride gives (opnd_at), the head dim contiguous, so the [B, T,
 * H D] projections the exporter hands over as permuted [B, H, T, D] views
 * are read in place (kernels.c folds the views into the region); no
 * staging copy runs before the kernel.
 *
 * The backward is two passes (dq; dk and dv: two regions) that both
 * recompute S and dP, 7 block products where FlashAttention-2's one pass
 * needs 5; except where both regions read the same operands in f32 and
 * sit next to each other in the plan (a training step's backward): the
 * runner gives the two one kernel (kernels.c's attn_pair, FZ_ATTN_BWD),
 * and kernel_dkv's one-pass mode has a work item per (batch, kv head)
 * walk its key blocks and add dS K into dq (f32, in place: the item owns
 * those rows, so no two threads add to one) beside dV and dK, 5 products a
 * block pair, the sums in the dq pass's order (bit for bit its result).
 * B=4, H=4, T=128, D=64, f32, one thread: dq 0.76 + dk/dv 0.82 ms before,
 * one pass about 1.1 ms.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/TargetMachine.h>

#include "cg.h"
#include "llvm.h"

#define VW 8   /* floats per vector */
#define BK 64  /* keys per block */
#define BQ 64  /* query rows per work item */

/* ---- vector helpers -------------------------------------------------------- */

static T vfn(cg *g, int n) { return t_vec(t_f32(g), (unsigned)n); }

static T vf(cg *g) { return vfn(g, VW); }

static int lanes(V x) { return (int)LLVMGetVectorSize(type_of(x)); }

/* x in each of n lanes (an insert and a shuffle: one broadcast). */
static V splatn(cg *g, int n, V x)
{
	T vt = t_vec(type_of(x), (unsigned)n);
	return LLVMBuildShuffleVector(g->b, insert(g, c_undef(vt), x, 0), c_undef(vt),
				      LLVMConstNull(t_vec(t_i32(g), (unsigned)n)), "");
}

static V splat(cg *g, V x) { return splatn(g, VW, x); }

static V vconstn(cg *g, int n, double x) { return c_splat(c_f32(g, x), n); }

static V vconst(cg *g, double x) { return vconstn(g, VW, x); }

static V splat_i32(cg *g, int n, int x) { return c_splat(c_i32(g, x), n); }

static V vfma(cg *g, V a, V b, V c)
{
	V args[3] = {a, b, c};
	return call_intrinsic(g, "llvm.fma", type_of(a), type_of(a), args, 3);
}

static V vun(cg *g, const char *name, V x)
{
	return call_intrinsic(g, name, type_of(x), type_of(x), &x, 1);
}

/* The larger of a and b (b where either is NaN: one vmaxps, where
 * llvm.maxnum would add a test for NaN; there are none here). */
static V vmax(cg *g, V a, V b) { return sel(g, fcmp(g, LLVMRealOGT, a, b), a, b); }

/* exp in lanes: x = k ln2 + r, degree-7 polynomial, 2^k by exponent bits
 * (math.c's expf, in lanes), or with vscalefps where there are sixteen
 * lanes (only made where the host has AVX-512: gemm_lanes). Below -86 the
 * result is 0: x is clamped to [-86, 88] first and the lanes below -86
 * replaced by 0 after (with AVX-512 by vscalefps's zero-masking), so no
 * lane ever computes a denormal or an underflow. That matters: a causal
 * diagonal block's hidden keys are -inf, half its lanes, and with the
 * MXCSR's default (no flush to zero) every instruction that underflows
 * takes a microcode assist of a hundred cycles or more; at T=128 the rows
 * of the diagonal blocks took half the forward's time that way. exp(-86)
 * is 4e-38, so the lanes set to 0 would have added nothing a softmax row
 * (whose largest term is 1) can hold. */
static V vexp(cg *g, V x)
{
	const double ln2 = 0.69314718055994530942;
	float hi = (float)ln2;
	float lo = (float)(ln2 - (double)hi);
	int n = lanes(x);
	T vi = t_vec(t_i32(g), (unsigned)n);
	V low = fcmp(g, LLVMRealOLT, x, vconstn(g, n, -86.0));
	V xc = vmax(g, x, vconstn(g, n, -86.0));
	xc = sel(g, fcmp(g, LLVMRealOLT, xc, vconstn(g, n, 88.0)), xc, vconstn(g, n, 88.0));
	V k = vun(g, "llvm.rint", fmul(g, xc, vconstn(g, n, 1.4426950408889634)));
	V r = vfma(g, fneg(g, k), vconstn(g, n, hi), xc);
	r = vfma(g, fneg(g, k), vconstn(g, n, lo), r);
	static const double C[] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120,
				   1.0 / 720, 1.0 / 5040};
	V p = vconstn(g, n, C[7]);
	for (int i = 6; i >= 0; i--)
		p = vfma(g, p, r, vconstn(g, n, C[i]));
	if (n == 16 && cg_host_avx512_isa(g)) {
		/* k in [-124, 127], p in [0.7, 1.5]: 2^k p is a normal float */
		V keep = bitcast(g, LLVMBuildNot(g->b, low, ""), t_i16(g));
		V args[5] = {p, k, vconstn(g, n, 0.0), keep, c_i32(g, 4)};
		return call_intrinsic(g, "llvm.x86.avx512.mask.scalef.ps.512", NULL, NULL, args, 5);
	}
	V ki = LLVMBuildFPToSI(g->b, k, vi, "");
	V s = bitcast(g, shl(g, add(g, ki, splat_i32(g, n, 127)), splat_i32(g, n, 23)),
		      vfn(g, n));
	return sel(g, low, vconstn(g, n, 0.0), fmul(g, p, s));
}

/* The sum (or max) of v's lanes, by halves. */
static V hreduce(cg *g, V v, bool max)
{
	for (int n = lanes(v) / 2; n >= 1; n /= 2) {
		V lo[8], hi[8];
		for (int l = 0; l < n; l++) {
			lo[l] = c_i32(g, l);
			hi[l] = c_i32(g, n + l);
		}
		V a = LLVMBuildShuffleVector(g->b, v, v, LLVMConstVector(lo, (unsigned)n), "");
		V b = LLVMBuildShuffleVector(g->b, v, v, LLVMConstVector(hi, (unsigned)n), "");
		v = max ? vmax(g, a, b) : fadd(g, a, b);
	}
	return extract(g, v, 0);
}

/* ---- memory: region buffers in their dtype, scratch in f32 ----------------- */

/* VW elements of buffer slot s (dtype d) from element off, as f32. */
static V vload(cg *g, int s, fz_dtype d, V off)
{
	V p = cg_elem_ptr(g, s, d, off);
	switch (d) {
	case FZ_F32:
		return load(g, vf(g), p, 4);
	case FZ_F16:
		return LLVMBuildFPExt(g->b, load(g, t_vec(t_f16(g), VW), p, 2), vf(g), "");
	default: { /* bf16: the high half of an f32 */
		V h = load(g, t_vec(t_i16(g), VW), p, 2);
		V w = LLVMBuildZExt(g->b, h, t_vec(t_i32(g), VW), "");
		return bitcast(g, shl(g, w, splat_i32(g, VW, 16)), vf(g));
	}
	}
}

static V sload(cg *g, int s, fz_dtype d, V off)
{
	return cg_from_storage(g, load(g, cg_stype(g, d), cg_elem_ptr(g, s, d, off),
				       (unsigned)fz_dtype_size(d)), d);
}

/* Rounds f32 x to dtype d once and stores it at element off of slot s. */
static void sstore(cg *g, int s, fz_dtype d, V off, V x)
{
	store(g, cg_to_storage(g, cg_round_half(g, x, d), d), cg_elem_ptr(g, s, d, off),
	      (unsigned)fz_dtype_size(d));
}

/* The VW floats x rounded to dtype d once, stored at element off of slot s
 * (bf16: round to nearest even on the bits, a NaN kept quiet, as
 * cg_to_storage does for one lane). */
static void vstore(cg *g, int s, fz_dtype d, V off, V x)
{
	V p = cg_elem_ptr(g, s, d, off), y = x;
	if (d == FZ_F16) {
		y = LLVMBuildFPTrunc(g->b, x, t_vec(t_f16(g), VW), "");
	} else if (d == FZ_BF16) {
		V u = bitcast(g, x, t_vec(t_i32(g), VW)), sh = splat_i32(g, VW, 16);
		V hi = lshr(g, u, sh);
		V lsb = and_(g, hi, splat_i32(g, VW, 1));
		V r = lshr(g, add(g, u, add(g, lsb, splat_i32(g, VW, 0x7fff))), sh);
		V q = or_(g, hi, splat_i32(g, VW, 0x40));
		y = trunc_(g, sel(g, fcmp(g, LLVMRealUNO, x, x), q, r), t_vec(t_i16(g), VW));
	}
	store(g, y, p, (unsigned)fz_dtype_size(d));
}

/* n floats of stack, on a cache line of their own: rows of 64 floats
 * start lines too, so no vector of 16 straddles two. */
static V scratch(cg *g, int n)
{
	V a = cg_entry_alloca(g, t_arr(t_f32(g), (unsigned)n));
	LLVMSetAlignment(a, 64);
	return a;
}

static V at(cg *g, V base, V i) { return gep(g, t_f32(g), base, i); }

static V ci(cg *g, int64_t x) { return c_int(g->ity, x); }

static V umin(cg *g, V a, V b) { return sel(g, icmp(g, LLVMIntULT, a, b), a, b); }

/* Rows [0, n) of scratch X [rows][len] (len a multiple of VW), each times
 * rs[r] where rs is given, into slot s from element `first`: a block's o,
 * dq, dk or dv, rounded once to the slot's dtype. */
static void store_rows(cg *g, int s, fz_dtype d, V first, int64_t len, V n, V X,
		       const V *rs)
{
	cg_loop R;
	cg_loop_begin(g, &R, ci(g, 0), n, ci(g, 1));
	V src = mul(g, R.iv, ci(g, len)), dst = add(g, first, src);
	V f = rs ? splat(g, load(g, t_f32(g), at(g, *rs, R.iv), 4)) : NULL;
	for (int64_t e = 0; e < len; e += VW) {
		V x = load(g, vf(g), at(g, X, add(g, src, ci(g, e))), 4);
		vstore(g, s, d, add(g, dst, ci(g, e)), f ? fmul(g, x, f) : x);
	}
	cg_loop_end(g, &R);
}

/* Phis for loop-carried values in L's head, started from init; the body
 * then uses ph and hands the next values to loop_next. */
static void loop_phis(cg *g, cg_loop *L, int n, const V *init, V *ph)
{
	LLVMBasicBlockRef body = current(g);
	V ins = LLVMGetFirstInstruction(L->head);
	while (ins && LLVMGetInstructionOpcode(ins) == LLVMPHI)
		ins = LLVMGetNextInstruction(ins);
	LLVMPositionBuilderBefore(g->b, ins);
	for (int i = 0; i < n; i++) {
		ph[i] = phi(g, type_of(init[i]));
		phi_add(ph[i], init[i], L->pre);
	}
	at_end(g, body);
}

static void loop_next(cg *g, int n, const V *ph, const V *next)
{
	for (int i = 0; i < n; i++)
		phi_add(ph[i], next[i], current(g));
}

/* ---- the scores (shared with the GPU emitter) ------------------------------ */

static void mask_lanes(cg *g, const fz_attn *A, const fz_value *mv, const cg_ix *bix,
		       V h, V i, int nl, const cg_ix *jl, V *out)
{
	int r = A->n_batch + 3, mr = mv->type.rank;
	cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
	for (int l = 0; l < nl; l++)
		for (int d = 0; d < mr; d++) {
			int sd = r - mr + d;
			cg_ix x = sd < A->n_batch ? bix[sd] : sd == A->n_batch ? cg_ix_of(h, 1) :
				  sd == A->n_batch + 1 ? cg_ix_of(i, 1) : jl[l];
			fz_ext e = mv->type.dims[d];
			ix[l][d] = fz_ext_is_const(e) && e.c == 1 ? cg_ix_zero() : x;
		}
	cg_value(g, mv, nl, ix, out);
}

/* The scores at nl lanes of keys jl[], loads where they lie. */
static void scores_at(cg *g, const fz_attn *A, const cg_ix *bix, V h, V i, int nl,
		      const cg_ix *jl, const V *s, V *out, V *dl)
{
	if (A->decomposed) {
		const fz_value *sv = A->score;
		int r = sv->type.rank;
		cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
		V sr[FZ_VW_MAX] = {0};
		for (int l = 0; l < nl; l++) {
			for (int d = 0; d < A->n_batch; d++)
				ix[l][d] = bix[d];
			ix[l][r - 3] = cg_ix_of(h, 1);
			ix[l][r - 2] = cg_ix_of(i, 1);
			ix[l][r - 1] = jl[l];
			sr[l] = cg_round_half(g, s[l], A->score_dtype);
		}
		cg_value_given(g, sv, nl, ix, sr);
		cg_value(g, A->logits, nl, ix, out);
		for (int l = 0; l < nl; l++)
			if (A->logits->type.dtype == FZ_F64)
				out[l] = fptrunc(g, out[l], t_f32(g));
		if (dl)
			cg_fail(g, FZ_EUNSUPPORTED, A->last, "the backward of a "
				"decomposed attention is not a region");
		return;
	}
	V mk[FZ_VW_MAX] = {0};
	if (A->mask)
		mask_lanes(g, A, A->mask, bix, h, i, nl, jl, mk);
	for (int l = 0; l < nl; l++) {
		V x = fmul(g, s[l], c_f32(g, A->scale));
		V d = c_f32(g, A->scale);
		if (A->softcap > 0) {
			V th = cg_math_unary(g, FZ_OP_TANH, fmul(g, x, c_f32(g, 1.0 / A->softcap)));
			x = fmul(g, th, c_f32(g, A->softcap));
			d = fmul(g, d, fsub(g, c_f32(g, 1.0), fmul(g, th, th)));
		}
		V hidden = c_i1(g, 0);
		if (A->mask && A->mask->type.dtype == FZ_BOOL)
			hidden = icmp(g, LLVMIntEQ, mk[l], c_i1(g, 0));
		else if (A->mask)
			x = fadd(g, x, mk[l]);
		out[l] = sel(g, hidden, c_f32(g, -INFINITY), x);
		if (dl)
			dl[l] = sel(g, hidden, c_f32(g, 0.0), d);
	}
}

/* Whether key j is hidden from query i by the length, causal and window
 * rules (tk and w the key length and the window): scalars, or vectors of
 * them lane by lane. */
static V hidden_at(cg *g, const fz_attn *A, V j, V i, V tk, V w)
{
	V hidden = icmp(g, LLVMIntUGE, j, tk);
	if (A->causal)
		hidden = or_(g, hidden, icmp(g, LLVMIntUGT, j, i));
	if (A->window > 0) {
		hidden = or_(g, hidden, icmp(g, LLVMIntUGE, i, add(g, j, w)));
		if (!A->causal)
			hidden = or_(g, hidden, icmp(g, LLVMIntUGE, j, add(g, i, w)));
	}
	return hidden;
}

/* One arm of cg_attn_scores' branch: the scores, then on to join, with
 * what the arm memoized and its index arithmetic forgotten (the other arm
 * does not see them). Returns the arm's last block. */
static LLVMBasicBlockRef scores_arm(cg *g, const fz_attn *A, const cg_ix *bix, V h,
				    V i, int nl, const cg_ix *jl, const V *s, V *out,
				    V *dl, LLVMBasicBlockRef join, int mark, int cse)
{
	scores_at(g, A, bix, h, i, nl, jl, s, out, dl);
	LLVMBasicBlockRef bb = current(g);
	br(g, join);
	cg_memo_pop(g, mark);
	g->n_cse = cse;
	return bb;
}

void cg_attn_scores(cg *g, const fz_attn *A, V b, V h, V i, cg_ix j0, int nl,
		    const V *s, V *out, V *dl)
{
	FZ_ASSERT(nl >= 1 && nl <= FZ_VW_MAX);
	/* the batch dims of b */
	cg_ix bix[FZ_MAX_RANK];
	if (A->n_batch > 0) {
		const fz_type *qt = A->decomposed ? &A->score->type : NULL;
		fz_type bt = {0};
		bt.rank = A->n_batch;
		if (!A->decomposed) {
			/* the mask may lack batch dims; the q operand has them */
			qt = &A->op->in[0]->type;
		}
		for (int d = 0; d < A->n_batch; d++)
			bt.dims[d] = qt->dims[d];
		cg_delinearize(g, &bt, b, 1, bix);
	}
	bool need = A->decomposed || A->mask;
	V tk = cg_ext(g, A->tk);
	V jlast = add(g, cg_ix_value(g, j0), ci(g, nl - 1));
	V res[FZ_VW_MAX], dres[FZ_VW_MAX];
	if (need) {
		/* all lanes inside [0, Tk): the lanes' loads as one vector;
		 * else each lane at its key clamped to Tk - 1 */
		LLVMBasicBlockRef fast = block(g, "attn.in"), slow = block(g, "attn.edge"),
				  join = block(g, "attn.join"), bbf, bbs;
		cond_br(g, icmp(g, LLVMIntULT, jlast, tk), fast, slow);
		V fo[FZ_VW_MAX], fd[FZ_VW_MAX], so[FZ_VW_MAX], sd[FZ_VW_MAX];
		int mark = cg_memo_mark(g), cse = g->n_cse;
		at_end(g, fast);
		cg_ix jl[FZ_VW_MAX];
		for (int l = 0; l < nl; l++) {
			jl[l] = j0;
			jl[l].o += l;
		}
		bbf = scores_arm(g, A, bix, h, i, nl, jl, s, fo, dl ? fd : NULL, join, mark, cse);
		at_end(g, slow);
		V tk1 = sub(g, tk, ci(g, 1));
		for (int l = 0; l < nl; l++) {
			V j = add(g, cg_ix_value(g, j0), ci(g, l));
			jl[l] = cg_ix_of(umin(g, j, tk1), 1);
		}
		bbs = scores_arm(g, A, bix, h, i, nl, jl, s, so, dl ? sd : NULL, join, mark, cse);
		at_end(g, join);
		for (int l = 0; l < nl; l++) {
			res[l] = phi(g, t_f32(g));
			phi_add(res[l], fo[l], bbf);
			phi_add(res[l], so[l], bbs);
			if (dl) {
				dres[l] = phi(g, t_f32(g));
				phi_add(dres[l], fd[l], bbf);
				phi_add(dres[l], sd[l], bbs);
			}
		}
	} else {
		cg_ix jl[FZ_VW_MAX];
		for (int l = 0; l < nl; l++) {
			jl[l] = j0;
			jl[l].o += l;
		}
		scores_at(g, A, bix, h, i, nl, jl, s, res, dl ? dres : NULL);
	}
	/* beyond Tk, causal, window */
	for (int l = 0; l < nl; l++) {
		V j = add(g, cg_ix_value(g, j0), ci(g, l));
		V hidden = hidden_at(g, A, j, i, tk, ci(g, A->window));
		out[l] = sel(g, hidden, c_f32(g, -INFINITY), res[l]);
		if (dl)
			dl[l] = sel(g, hidden, c_f32(g, 0.0), dres[l]);
	}
}

void cg_attn_key_range(cg *g, const fz_attn *A, V i0, V i1, V *lo, V *hi)
{
	V tk = cg_ext(g, A->tk);
	*lo = ci(g, 0);
	*hi = tk;
	if (A->causal)
		*hi = umin(g, tk, i1);
	if (A->window > 0) {
		V w = ci(g, A->window), a = add(g, i0, ci(g, 1));
		*lo = sel(g, icmp(g, LLVMIntUGT, a, w), sub(g, a, w), ci(g, 0));
		if (!A->causal)
			*hi = umin(g, tk, add(g, sub(g, i1, ci(g, 1)), w));
	}
}

void cg_attn_query_range(cg *g, const fz_attn *A, V j0, V j1, V *lo, V *hi)
{
	V tq = cg_ext(g, A->tq);
	*lo = ci(g, 0);
	*hi = tq;
	if (A->causal)
		*lo = umin(g, j0, tq);
	if (A->window > 0) {
		V w = ci(g, A->window);
		*hi = umin(g, tq, add(g, sub(g, j1, ci(g, 1)), w));
		if (!A->causal) {
			V a = add(g, j0, ci(g, 1));
			*lo = sel(g, icmp(g, LLVMIntUGT, a, w), sub(g, a, w), ci(g, 0));
		}
	}
}

/* ---- the host kernels ------------------------------------------------------- */

typedef struct ak {
	cg *g;
	const fz_attn *A;
	int sq, sk, sv, so, slse, sdo; /* buffer slots (-1 absent) */
	fz_dtype dt;
	int64_t D, DV;
	int rw; /* floats per vector of the rows' softmax: gemm_lanes */
	bool mask_free; /* emitting a block where the bool mask is all true */
	bool mask_tri;  /* ... or exactly the lower triangle (keys j <= i) */
	bool few;       /* emitting the forward for an item of FEW rows or less */
} ak;

/* The element offset of row t of head h of batch item b of operand w
 * (FZ_ATTN_Q ...) where it lies: fz_attn.stride, the operand possibly a
 * permuted view of a projection's [B, T, H D] (the decomposed form's are
 * row-major in A's extents). */
static V opnd_at(ak *K, int w, V b, V h, V t)
{
	cg *g = K->g;
	const fz_attn *A = K->A;
	bool kv = w == FZ_ATTN_K || w == FZ_ATTN_V;
	if (A->decomposed) {
		int64_t len = w == FZ_ATTN_Q || w == FZ_ATTN_K ? K->D : K->DV;
		V hh = cg_ext(g, kv ? A->hkv : A->hq), tt = cg_ext(g, kv ? A->tk : A->tq);
		return mul(g, add(g, mul(g, add(g, mul(g, b, hh), h), tt), t), ci(g, len));
	}
	const fz_ext *st = A->stride[w];
	int nb = A->n_batch;
	V off = add(g, mul(g, h, cg_ext(g, st[nb])), mul(g, t, cg_ext(g, st[nb + 1])));
	if (nb == 1)
		return add(g, off, mul(g, b, cg_ext(g, st[0])));
	if (nb > 1) {
		fz_type bt = {0};
		cg_ix bix[FZ_MAX_RANK];
		bt.rank = nb;
		for (int d = 0; d < nb; d++)
			bt.dims[d] = A->op->in[0]->type.dims[d];
		cg_delinearize(g, &bt, b, 1, bix);
		for (int d = 0; d < nb; d++)
			off = add(g, off, mul(g, cg_ix_value(g, bix[d]), cg_ext(g, st[d])));
	}
	return off;
}

/* The elements from one row of operand w to the next. */
static V opnd_ld(ak *K, int w)
{
	const fz_attn *A = K->A;
	if (A->decomposed)
		return ci(K->g, w == FZ_ATTN_Q || w == FZ_ATTN_K ? K->D : K->DV);
	return cg_ext(K->g, A->stride[w][A->n_batch + 1]);
}


/* Rows [0, n) of slot s, the first at element `first`, the others `ld`
 * elements apart, `len` floats each (a multiple of VW), into scratch
 * X [rows][len] (rows from n to `cap` zero): a block of q, k, v or do
 * rows. With Xt, the rows go transposed into Xt [len][cap] instead. */
static void load_rows(ak *K, int s, V first, V ld, int64_t len, V n, int cap, V X, V Xt)
{
	cg *g = K->g;
	cg_loop L;
	int step = Xt ? VW : 1; /* transposed: 8 rows at a time, 8 x 8 tiles */
	cg_loop_begin(g, &L, ci(g, 0), ci(g, cap), ci(g, step));
	for (int64_t d = 0; d < len; d += VW) {
		V x[VW];
		for (int u = 0; u < step; u++) {
			V r = add(g, L.iv, ci(g, u));
			V valid = icmp(g, LLVMIntULT, r, n);
			V row = add(g, first, mul(g, sel(g, valid, r, ci(g, 0)), ld));
			x[u] = sel(g, valid, vload(g, s, K->dt, add(g, row, ci(g, d))),
				   vconst(g, 0.0));
			if (X)
				store(g, x[u], at(g, X, add(g, mul(g, r, ci(g, len)), ci(g, d))), 4);
		}
		if (!Xt)
			continue;
		/* transpose: at level k (1, 2, 4), rows i and i + k (bit k of i
		 * clear) trade the elements whose column has bit k clear for
		 * those that have it set: bit k moves from column to row */
		for (int k = 1; k < VW; k <<= 1)
			for (int i = 0; i < VW; i++) {
				if (i & k)
					continue;
				V lo[VW], hi[VW];
				for (int j = 0; j < VW; j++) {
					lo[j] = c_i32(g, j & k ? VW + j - k : j);
					hi[j] = c_i32(g, j & k ? VW + j : j + k);
				}
				V a = x[i], bb = x[i + k];
				x[i] = LLVMBuildShuffleVector(g->b, a, bb, LLVMConstVector(lo, VW), "");
				x[i + k] = LLVMBuildShuffleVector(g->b, a, bb, LLVMConstVector(hi, VW), "");
			}
		for (int l = 0; l < VW; l++)
			store(g, x[l], at(g, Xt, add(g, ci(g, (d + l) * cap), L.iv)), 4);
	}
	cg_loop_end(g, &L);
}

/* Rows [t, t + n) of head h of item b of operand w into scratch (as
 * load_rows). */
static void load_opnd(ak *K, int w, V b, V h, V t, V n, int cap, V X, V Xt)
{
	int s = w == FZ_ATTN_Q ? K->sq : w == FZ_ATTN_K ? K->sk : w == FZ_ATTN_V ? K->sv :
		w == FZ_ATTN_O ? K->so : K->sdo;
	int64_t len = w == FZ_ATTN_Q || w == FZ_ATTN_K ? K->D : K->DV;
	load_rows(K, s, opnd_at(K, w, b, h, t), opnd_ld(K, w), len, n, cap, X, Xt);
}

static void zero(cg *g, V X, int64_t n)
{
	cg_loop L;
	cg_loop_begin(g, &L, ci(g, 0), ci(g, n / VW), ci(g, 1));
	store(g, vconst(g, 0.0), at(g, X, mul(g, L.iv, ci(g, VW))), 4);
	cg_loop_end(g, &L);
}

#define MR 4 /* rows of a product's register tile */
#define NR 16 /* head dims are a multiple of this */

/* Floats per vector of the block products: 16 (a zmm register) where the
 * host has AVX-512 (cg_host_avx512), else VW. The products hold nearly all
 * the flops, and nothing else in a pass depends on their width. */
static int gemm_lanes(cg *g)
{
	return cg_host_avx512(g) ? 16 : VW;
}

/* The MR x nv vector tile of C at rows m0, columns n0 (see gemm_s). */
static void gemm_tile(cg *g, int gw, int nv, V A, int64_t am, int64_t ak, V B, int64_t ldb,
		      V C, int64_t ldc, V m0, V n0, V k0, V k1, bool acc, V rs)
{
	T vt = t_vec(t_f32(g), (unsigned)gw);
	cg_loop LK;
	V init[MR * 8], ph[MR * 8], next[MR * 8], cp[MR * 8], b[8];
	int na = MR * nv;
	for (int r = 0; r < MR; r++)
		for (int h = 0; h < nv; h++) {
			cp[r * nv + h] = at(g, C, add(g, mul(g, add(g, m0, ci(g, r)), ci(g, ldc)),
						      add(g, n0, ci(g, h * gw))));
			init[r * nv + h] = acc ? load(g, vt, cp[r * nv + h], 4) :
						 LLVMConstNull(vt);
			if (acc && rs)
				init[r * nv + h] = fmul(g, init[r * nv + h],
					splatn(g, gw, load(g, t_f32(g), at(g, rs, add(g, m0, ci(g, r))), 4)));
		}
	cg_loop_begin(g, &LK, k0, k1, ci(g, 1));
	loop_phis(g, &LK, na, init, ph);
	V k = LK.iv;
	V bp = add(g, mul(g, k, ci(g, ldb)), n0);
	for (int h = 0; h < nv; h++)
		b[h] = load(g, vt, at(g, B, add(g, bp, ci(g, h * gw))), 4);
	V ka = mul(g, k, ci(g, ak));
	for (int r = 0; r < MR; r++) {
		V x = load(g, t_f32(g), at(g, A, add(g, mul(g, add(g, m0, ci(g, r)), ci(g, am)), ka)), 4);
		V a = splatn(g, gw, x);
		for (int h = 0; h < nv; h++)
			next[r * nv + h] = vfma(g, a, b[h], ph[r * nv + h]);
	}
	loop_next(g, na, ph, next);
	cg_loop_end(g, &LK);
	for (int i = 0; i < na; i++)
		store(g, ph[i], cp[i], 4);
}

/* The part of a block product that a causal diagonal block needs (its
 * query rows and keys start at one index, so key j > row i is hidden, and
 * its p and ds there are 0): */
typedef enum tri {
	TRI_NONE,
	TRI_N,   /* C's row m needs columns n <= m (S = Q Kt, dP = dO Vt) */
	TRI_KLO, /* C's row m sums k <= m (O += P V, dQ += dS K) */
	TRI_KHI, /* C's row m sums k >= m (dV += Pt dO, dK += dSt Q) */
} tri;

/* C[m][n] (+)= sum over k < kn of A[m am + k ak] B[k ldb + n], m < M, n < N
 * (M a multiple of MR, N of NR), f32 scratch all: the block products of
 * every pass (S = Q Kt, dP = dO Vt, O += P V, dQ += dS K, dV += Pt dO,
 * dK += dSt Q); with rs, C's row m is scaled by rs[m] first (the forward's
 * rescaling of O, at no extra pass over it). A tile of MR rows by nv vectors sums in registers over k:
 * nv vector loads of B and MR broadcasts of A feed MR nv fmas. With
 * AVX-512 (32 registers of 16 floats) the tiles are 4 x 4 vectors (16
 * accumulators, 8 loads per 16 fmas) and a narrower one for what is left
 * of N; with AVX2 (16 registers of 8) 4 x 2.
 *
 * t (a diagonal block) leaves out what is 0 there: TRI_N takes the rows
 * in groups of gw, group c's tiles only c + 1 vectors wide (M a multiple
 * of gw; columns beyond are not written, and the rows' pass reads none of
 * them: row_loops); TRI_KLO and TRI_KHI cut each tile's k loop at its
 * rows. About 60% of the full product's fmas at BQ = BK = 64. */
static void gemm_s(cg *g, V A, int64_t am, int64_t ak, V B, int64_t ldb, V C,
		   int64_t ldc, int64_t M, V mrows, int64_t N, int64_t kn, bool acc, V rs,
		   tri t)
{
	int gw = gemm_lanes(g), nvm = gw == 16 ? 4 : 2;
	int groups = t == TRI_N ? (int)(M / gw) : 1;
	FZ_ASSERT(t != TRI_N || M % gw == 0);
	for (int c = 0; c < groups; c++) {
		int64_t m0 = t == TRI_N ? c * gw : 0, m1 = t == TRI_N ? m0 + gw : M;
		int64_t n = t == TRI_N && (c + 1) * gw < N ? (c + 1) * gw : N;
		int64_t nmain = n / (nvm * gw) * (nvm * gw);
		int tail = (int)((n - nmain) / gw);
		/* only the tiles that hold one of the first mrows rows */
		V mend = ci(g, m1);
		if (mrows && t != TRI_N)
			mend = umin(g, mul(g, udiv(g, add(g, mrows, ci(g, MR - 1)), ci(g, MR)),
					   ci(g, MR)), mend);
		cg_loop LM, LN;
		cg_loop_begin(g, &LM, ci(g, m0), mend, ci(g, MR));
		V k0 = t == TRI_KHI ? LM.iv : ci(g, 0);
		V k1 = t == TRI_KLO ? umin(g, add(g, LM.iv, ci(g, MR)), ci(g, kn)) : ci(g, kn);
		if (nmain > 0) {
			cg_loop_begin(g, &LN, ci(g, 0), ci(g, nmain), ci(g, nvm * gw));
			gemm_tile(g, gw, nvm, A, am, ak, B, ldb, C, ldc, LM.iv, LN.iv, k0, k1,
				  acc, rs);
			cg_loop_end(g, &LN);
		}
		if (tail > 0)
			gemm_tile(g, gw, tail, A, am, ak, B, ldb, C, ldc, LM.iv, ci(g, nmain),
				  k0, k1, acc, rs);
		cg_loop_end(g, &LM);
	}
}

/* A vector of ity in n lanes: x + (0, 1, ..., n - 1). */
static V iota_from(cg *g, int n, V x)
{
	V e[16];
	for (int l = 0; l < n; l++)
		e[l] = c_int(g->ity, l);
	return add(g, splatn(g, n, x), LLVMConstVector(e, (unsigned)n));
}

static void gemm(cg *g, V A, int64_t lda, V B, int64_t ldb, V C, int64_t ldc,
		 int64_t M, V mrows, int64_t N, int64_t kn, bool acc, V rs, tri t)
{
	gemm_s(g, A, lda, 1, B, ldb, C, ldc, M, mrows, N, kn, acc, rs, t);
}

bool cg_attn_simple(const fz_attn *A)
{
	return !A->decomposed && !A->mask && A->softcap == 0;
}

/* Simple scores here: cg_attn_simple, or a bool mask and nothing else in
 * a block where the mask is all true (mask_free). */
static bool simple(const ak *K)
{
	const fz_attn *A = K->A;
	return cg_attn_simple(A) ||
	       (K->mask_free && !A->decomposed && A->softcap == 0 && A->mask &&
		A->mask->type.dtype == FZ_BOOL);
}

/* Each rule hides a half plane of (i, j), so two corners decide: the last
 * key against the first row (length, causal, j - i >= window) and the
 * first key against the last row (i - j >= window). */
LLVMValueRef cg_attn_block_whole(cg *g, const fz_attn *A, V i0, V i1, V j0, V j1)
{
	V tk = cg_ext(g, A->tk), w = ci(g, A->window);
	V jlast = sub(g, j1, ci(g, 1)), ilast = sub(g, i1, ci(g, 1));
	V some = or_(g, hidden_at(g, A, jlast, i0, tk, w), hidden_at(g, A, j0, ilast, tk, w));
	return LLVMBuildNot(g->b, some, "");
}

/* An i1: simple scores, and every key of [kb, kb + BK) visible to every
 * query row of [i0, i1) (i1 > i0): the rows then need no mask at all
 * (below a causal diagonal, nearly every block). Constant false for other
 * scores. */
static V block_full(ak *K, V i0, V i1, V kb)
{
	cg *g = K->g;
	if (!simple(K))
		return c_i1(g, 0);
	return cg_attn_block_whole(g, K->A, i0, i1, kb, add(g, kb, ci(g, BK)));
}

/* fn(K, arg, x), then on to join, with what it memoized and its index
 * arithmetic forgotten (the other arms do not see them). */
static void arm(ak *K, void (*fn)(ak *, void *, bool), void *arg, bool x,
		LLVMBasicBlockRef join)
{
	cg *g = K->g;
	int mark = cg_memo_mark(g), cse = g->n_cse;
	fn(K, arg, x);
	br(g, join);
	cg_memo_pop(g, mark);
	g->n_cse = cse;
}

/* Emits fn(K, arg, true) where i1 c holds, fn(K, arg, false) where not
 * (only the one where c is a constant): a block without masks gets the
 * row loop without them, a diagonal block its triangular products. */
static void by_cond(ak *K, V c, void (*fn)(ak *, void *, bool), void *arg)
{
	cg *g = K->g;
	if (LLVMIsConstant(c)) {
		fn(K, arg, LLVMConstIntGetZExtValue(c) != 0);
		return;
	}
	LLVMBasicBlockRef yes = block(g, "attn.yes"), no = block(g, "attn.no"),
			  join = block(g, "attn.join");
	cond_br(g, c, yes, no);
	at_end(g, yes);
	arm(K, fn, arg, true, join);
	at_end(g, no);
	arm(K, fn, arg, false, join);
	at_end(g, join);
}

/* An i1: the block of keys from kb is the causal diagonal block of the
 * block of rows from i0 (BQ = BK: the same indices), whose keys j > i are
 * hidden (whatever else hides them). Constant false without causal. */
static V block_diag(ak *K, V i0, V kb)
{
	return K->A->causal ? icmp(K->g, LLVMIntEQ, i0, kb) : c_i1(K->g, 0);
}

/* ---- blocks of a bool mask ------------------------------------------------
 * A bool mask that is a region input (HF's Llama under torch.compile hands
 * SDPA its causal mask as a [B, 1, T, T] tensor, never is_causal) hides
 * keys the kernel cannot see coming; read per lane it made every block
 * the masked kind, and no block was skipped. So each block is first
 * classified by one pass over its mask bytes, a row of BK of them at a
 * time (64 bytes, one vector compare): all false, the block is skipped;
 * all true, it is a block without the mask (mask_free: simple scores
 * when the mask is all there is); on a diagonal (i0 = kb), exactly the
 * lower triangle, it is a causal diagonal block without the mask (its
 * triangle only); anything else, as before. The length, causal and
 * window rules (hidden_at) hold in every kind as ever. */

enum { BLOCK_SKIP, BLOCK_FREE, BLOCK_FREE_DIAG, BLOCK_MIXED };

/* Whether blocks are classified: a bool mask, a region input, whose rows
 * run along the keys (its last extent Tk, not a broadcast 1). */
static bool mask_blocks(const ak *K)
{
	const fz_attn *A = K->A;
	if (!A->mask || A->decomposed || A->in_mask < 0 || A->mask->type.dtype != FZ_BOOL ||
	    A->mask->type.rank < 1)
		return false;
	/* and (so that a row of the block lies inside it) each of its
	 * extents from the head on is 1 or the one it stands for */
	const fz_type *mt = &A->mask->type;
	fz_ext full[3] = {A->hq, A->tq, A->tk};
	for (int d = mt->rank - 1, f = 2; d >= 0 && f >= 0; d--, f--) {
		fz_ext e = mt->dims[d];
		bool one = fz_ext_is_const(e) && e.c == 1;
		if ((f == 2 && one) || (!one && !fz_ext_eq(e, full[f])))
			return false;
	}
	return BK == 64;
}

/* The element offset of the mask at (b, h, i, j): its own row-major
 * extents, aligned to [batch..., Hq, Tq, Tk] from the right, broadcast
 * extents of 1 read at 0. */
static V mask_offset(ak *K, V b, V h, V i, V j)
{
	cg *g = K->g;
	const fz_attn *A = K->A;
	const fz_value *mv = A->mask;
	int r = A->n_batch + 3, mr = mv->type.rank;
	cg_ix bix[FZ_MAX_RANK];
	if (A->n_batch > 0) {
		const fz_type *qt = &A->op->in[0]->type; /* q has the batch dims */
		fz_type bt = {0};
		bt.rank = A->n_batch;
		for (int d = 0; d < A->n_batch; d++)
			bt.dims[d] = qt->dims[d];
		cg_delinearize(g, &bt, b, 1, bix);
	}
	V off = ci(g, 0);
	for (int d = 0; d < mr; d++) {
		int sd = r - mr + d;
		fz_ext e = mv->type.dims[d];
		V x = sd < A->n_batch ? cg_ix_value(g, bix[sd]) : sd == A->n_batch ? h :
		      sd == A->n_batch + 1 ? i : j;
		if (fz_ext_is_const(e) && e.c == 1)
			x = ci(g, 0);
		off = add(g, mul(g, off, cg_ext(g, e)), x);
	}
	return off;
}

/* The block's kind (an i32 of the enum above) for rows [i0, i0 + nrows)
 * of head h and keys [kb, kb + nk): a partial block of keys (nk < BK) is
 * BLOCK_MIXED, unread. */
static V classify(ak *K, V b, V h, V i0, V nrows, V kb, V nk)
{
	cg *g = K->g;
	T i64 = t_i64(g), v8 = t_vec(t_i8(g), BK);
	LLVMBasicBlockRef scan = block(g, "attn.scan"), done = block(g, "attn.kind"),
			  entry = current(g);
	V whole = icmp(g, LLVMIntEQ, nk, ci(g, BK));
	cond_br(g, whole, scan, done);
	at_end(g, scan);
	cg_loop R;
	cg_loop_begin(g, &R, ci(g, 0), nrows, ci(g, 1));
	V init[3] = {c_i64(g, 0), c_i64(g, -1), c_i1(g, 1)}, ph[3];
	loop_phis(g, &R, 3, init, ph);
	V r = R.iv;
	V off = mask_offset(K, b, h, add(g, i0, r), kb);
	V bytes = load(g, v8, cg_elem_ptr(g, K->A->in_mask, FZ_BOOL, off), 1);
	V bits = bitcast(g, icmp(g, LLVMIntNE, bytes, LLVMConstNull(v8)), i64);
	/* the lower triangle of row r: keys 0..r (r < 64 here) */
	V r64 = LLVMBuildZExtOrBitCast(g->b, r, i64, "");
	V tri = sub(g, shl(g, c_i64(g, 2), r64), c_i64(g, 1));
	tri = sel(g, icmp(g, LLVMIntUGE, r64, c_i64(g, 63)), c_i64(g, -1), tri);
	V next[3] = {or_(g, ph[0], bits), and_(g, ph[1], bits),
		     and_(g, ph[2], icmp(g, LLVMIntEQ, bits, tri))};
	loop_next(g, 3, ph, next);
	cg_loop_end(g, &R);
	V none = icmp(g, LLVMIntEQ, ph[0], c_i64(g, 0));
	V all = icmp(g, LLVMIntEQ, ph[1], c_i64(g, -1));
	V diag = and_(g, ph[2], icmp(g, LLVMIntEQ, i0, kb));
	V kind = sel(g, none, c_i32(g, BLOCK_SKIP),
		     sel(g, all, c_i32(g, BLOCK_FREE),
			 sel(g, diag, c_i32(g, BLOCK_FREE_DIAG), c_i32(g, BLOCK_MIXED))));
	LLVMBasicBlockRef scanned = current(g);
	br(g, done);
	at_end(g, done);
	V k = phi(g, t_i32(g));
	phi_add(k, c_i32(g, BLOCK_MIXED), entry);
	phi_add(k, kind, scanned);
	return k;
}

/* An arm of by_kind: fn by the causal rule's diagonal (by_cond), then on
 * to join, forgetting what it memoized (as arm). */
static void diag_arm(ak *K, V i0, V kb, void (*fn)(ak *, void *, bool), void *arg,
		     LLVMBasicBlockRef join)
{
	cg *g = K->g;
	int mark = cg_memo_mark(g), cse = g->n_cse;
	by_cond(K, block_diag(K, i0, kb), fn, arg);
	br(g, join);
	cg_memo_pop(g, mark);
	g->n_cse = cse;
}

/* fn(K, arg, diag) for the block of keys from kb against rows [i0, i0 +
 * nrows) of head h: diag where it is a causal diagonal block (by the
 * causal rule, or with mask blocks by its mask), mask_free where the mask
 * is all true there; nothing where the mask hides it all. */
static void by_kind(ak *K, V b, V h, V i0, V nrows, V kb, V nk,
		    void (*fn)(ak *, void *, bool), void *arg)
{
	cg *g = K->g;
	if (!mask_blocks(K)) {
		by_cond(K, block_diag(K, i0, kb), fn, arg);
		return;
	}
	V kind = classify(K, b, h, i0, nrows, kb, nk);
	LLVMBasicBlockRef join = block(g, "attn.next"), free_ = block(g, "attn.free"),
			  fdiag = block(g, "attn.freediag"), mixed = block(g, "attn.mixed");
	LLVMValueRef sw = LLVMBuildSwitch(g->b, kind, mixed, 3);
	LLVMAddCase(sw, c_i32(g, BLOCK_SKIP), join);
	LLVMAddCase(sw, c_i32(g, BLOCK_FREE), free_);
	LLVMAddCase(sw, c_i32(g, BLOCK_FREE_DIAG), fdiag);
	K->mask_free = true;
	at_end(g, free_);
	diag_arm(K, i0, kb, fn, arg, join);
	at_end(g, fdiag);
	K->mask_tri = true;
	arm(K, fn, arg, true, join);
	K->mask_tri = false;
	K->mask_free = false;
	at_end(g, mixed);
	diag_arm(K, i0, kb, fn, arg, join);
	at_end(g, join);
}

/* A row's pass over the block: body(K, arg, r, nc, full) for row r's
 * first nc vectors of K->rw keys. */
typedef void rowfn(ak *K, void *arg, V r, int nc, bool full);

enum { ROWS_FULL, ROWS_MASKED, ROWS_DIAG };

/* body over rows [0, nrows): every vector of BK keys, with (ROWS_MASKED)
 * or without (ROWS_FULL) the masks; or (ROWS_DIAG, a diagonal block) in
 * groups of K->rw rows, group c masked over its first c + 1 vectors only,
 * the others lying wholly above the diagonal (hidden, and not computed:
 * gemm_s's TRI_N). */
static void row_loops(ak *K, V nrows, int mode, rowfn *body, void *arg)
{
	cg *g = K->g;
	int rw = K->rw, nc = BK / rw;
	cg_loop R;
	if (mode != ROWS_DIAG) {
		cg_loop_begin(g, &R, ci(g, 0), nrows, ci(g, 1));
		body(K, arg, R.iv, nc, mode == ROWS_FULL);
		cg_loop_end(g, &R);
		return;
	}
	for (int c = 0; c < nc; c++) {
		cg_loop_begin(g, &R, ci(g, c * rw), umin(g, ci(g, (c + 1) * rw), nrows), ci(g, 1));
		body(K, arg, R.iv, c + 1, false);
		cg_loop_end(g, &R);
	}
}

/* The logits (and, with dlg, their derivatives) of row r of S [..][BK],
 * keys from kb, in vectors of K->rw. Simple scores are computed here in
 * whole vectors (with full, no mask at all); anything else lane by lane
 * through cg_attn_scores, the expression emitter's way. */
static void row_logits(ak *K, V S, V r, V b, V h, V i, V kb, int nc, bool full, V *lg,
		       V *dlg)
{
	cg *g = K->g;
	const fz_attn *A = K->A;
	int rw = K->rw;
	V vs = vconstn(g, rw, A->scale);
	if (simple(K)) {
		V vi = splatn(g, rw, i), ninf = vconstn(g, rw, -INFINITY);
		V tkv = splatn(g, rw, cg_ext(g, A->tk)), vw = splatn(g, rw, ci(g, A->window));
		for (int c = 0; c < nc; c++) {
			V sv = load(g, vfn(g, rw), at(g, S, add(g, mul(g, r, ci(g, BK)), ci(g, c * rw))), 4);
			lg[c] = fmul(g, sv, vs);
			if (dlg)
				dlg[c] = vs;
			if (full)
				continue;
			V j = iota_from(g, rw, add(g, kb, ci(g, c * rw)));
			V hidden = hidden_at(g, A, j, vi, tkv, vw);
			if (K->mask_tri) /* the mask, known: the causal rule */
				hidden = or_(g, hidden, icmp(g, LLVMIntUGT, j, vi));
			lg[c] = sel(g, hidden, ninf, lg[c]);
			if (dlg)
				dlg[c] = sel(g, hidden, vconstn(g, rw, 0.0), vs);
		}
		return;
	}
	for (int c = 0; c < nc; c++) {
		V o[16], d[16];
		for (int u = 0; u < rw; u += VW) {
			V sv = load(g, vf(g), at(g, S, add(g, mul(g, r, ci(g, BK)),
							  ci(g, c * rw + u))), 4);
			V s[VW];
			for (int l = 0; l < VW; l++)
				s[l] = extract(g, sv, (unsigned)l);
			cg_ix j0 = cg_ix_of(add(g, kb, ci(g, c * rw + u)), VW);
			cg_attn_scores(g, K->A, b, h, i, j0, VW, s, o + u, dlg ? d + u : NULL);
		}
		lg[c] = c_undef(vfn(g, rw));
		if (dlg)
			dlg[c] = c_undef(vfn(g, rw));
		for (int l = 0; l < rw; l++) {
			lg[c] = insert(g, lg[c], o[l], (unsigned)l);
			if (dlg)
				dlg[c] = insert(g, dlg[c], d[l], (unsigned)l);
		}
	}
}

static V dot_rows(ak *K, int s1, V off1, int s2, V off2, int64_t n)
{
	cg *g = K->g;
	V acc = vconst(g, 0.0);
	for (int64_t e = 0; e < n; e += VW)
		acc = vfma(g, vload(g, s1, K->dt, add(g, off1, ci(g, e))),
			   vload(g, s2, K->dt, add(g, off2, ci(g, e))), acc);
	return hreduce(g, acc, false);
}

/* Work items over `outer` x ceil(len / blk): *o is the item's outer
 * index, *first its block's first element. */
static void work_loop(cg *g, cg_loop *L, V outer, V len, int blk, V *o, V *first)
{
	V nb = udiv(g, add(g, len, ci(g, blk - 1)), ci(g, blk));
	V total = mul(g, outer, nb), beg, end;
	cg_host_chunk(g, total, &beg, &end);
	cg_loop_begin(g, L, beg, end, ci(g, 1));
	*o = udiv(g, L->iv, nb);
	*first = mul(g, urem(g, L->iv, nb), ci(g, blk));
}

/* Where a work item over query rows [i0, i0 + BQ) of head h reads. */
typedef struct qitem {
	V b, h, hk, bh, i0, i1, nrows, rowbase; /* rowbase: the row of o, lse, dq */
} qitem;

static void query_item(ak *K, cg_loop *W, qitem *Q)
{
	cg *g = K->g;
	const fz_attn *A = K->A;
	V hq = cg_ext(g, A->hq), tq = cg_ext(g, A->tq);
	work_loop(g, W, mul(g, cg_ext(g, A->batch), hq), tq, BQ, &Q->bh, &Q->i0);
	Q->b = udiv(g, Q->bh, hq);
	Q->h = urem(g, Q->bh, hq);
	Q->hk = udiv(g, Q->h, ci(g, A->group));
	Q->i1 = umin(g, add(g, Q->i0, ci(g, BQ)), tq);
	Q->nrows = sub(g, Q->i1, Q->i0);
	Q->rowbase = add(g, mul(g, Q->bh, tq), Q->i0);
}

/* Opens the loop over the blocks of keys the item's rows may see: *kb
 * the block's first key, *nk its keys (BK but at the end). */
static void key_blocks(ak *K, const qitem *Q, cg_loop *KB, V *kb, V *nk)
{
	cg *g = K->g;
	V klo, khi;
	cg_attn_key_range(g, K->A, Q->i0, Q->i1, &klo, &khi);
	cg_loop_begin(g, KB, mul(g, udiv(g, klo, ci(g, BK)), ci(g, BK)), khi, ci(g, BK));
	*kb = KB->iv;
	*nk = umin(g, ci(g, BK), sub(g, cg_ext(g, K->A->tk), *kb));
}

/* A block's rows: the diagonal block's triangle (diag), else every row,
 * without masks where full holds (by_cond). */
typedef struct rowsel {
	rowfn *body;
	void *arg;
	V nrows;
} rowsel;

static void rows_by_fullness(ak *K, void *arg, bool full)
{
	rowsel *R = arg;
	row_loops(K, R->nrows, full ? ROWS_FULL : ROWS_MASKED, R->body, R->arg);
}

static void block_rows(ak *K, bool diag, V full, rowsel *R)
{
	if (diag)
		row_loops(K, R->nrows, ROWS_DIAG, R->body, R->arg);
	else
		by_cond(K, full, rows_by_fullness, R);
}

/* One block of keys of a forward item: its scratch and where it lies. */
typedef struct fblock {
	const qitem *Q;
	V Qs, Kt, Vs, Os, S, Ms, Ls, Al, kb, nk;
} fblock;

/* Row r's online softmax over the block's first nc vectors of keys: S's
 * row becomes p, Al[r] the rescaling of O. */
static void fwd_row(ak *K, void *arg, V r, int nc, bool full)
{
	cg *g = K->g;
	fblock *F = arg;
	int rw = K->rw;
	V lg[16];
	row_logits(K, F->S, r, F->Q->b, F->Q->h, add(g, F->Q->i0, r), F->kb, nc, full, lg, NULL);
	V bm = lg[0];
	for (int c = 1; c < nc; c++)
		bm = vmax(g, bm, lg[c]);
	V mold = load(g, t_f32(g), at(g, F->Ms, r), 4);
	V mnew = vmax(g, hreduce(g, bm, true), mold);
	/* a row that has seen no key yet: -inf, shifted by 0 */
	V muse = sel(g, fcmp(g, LLVMRealOEQ, mnew, c_f32(g, -INFINITY)), c_f32(g, 0.0), mnew);
	V alpha = extract(g, vexp(g, splat(g, fsub(g, mold, muse))), 0);
	V psum = vconstn(g, rw, 0.0), vm = splatn(g, rw, muse);
	for (int c = 0; c < nc; c++) {
		V p = vexp(g, fsub(g, lg[c], vm)); /* -inf - muse: 0 */
		psum = fadd(g, psum, p);
		store(g, p, at(g, F->S, add(g, mul(g, r, ci(g, BK)), ci(g, c * rw))), 4);
	}
	V lold = load(g, t_f32(g), at(g, F->Ls, r), 4);
	store(g, fadd(g, fmul(g, lold, alpha), hreduce(g, psum, false)), at(g, F->Ls, r), 4);
	store(g, mnew, at(g, F->Ms, r), 4);
	store(g, alpha, at(g, F->Al, r), 4);
}

/* A forward item of FEW query rows or less: a decode step's one row, or
 * the last rows of a length just past a block. The block products
 * amortize copying the block's keys transposed and its values over BQ
 * rows; one row pays it whole, and at T = 2048 a decode step took 4 to 6
 * ms where PyTorch's SDPA takes 0.2. Here the keys and values are read
 * where they lie: S's row r is q_r . k_j per key (four accumulators over
 * the head dim, then their lanes summed), and O's row is Al O + sum_j
 * p_j v_j, in the order of the block product's sum. */
#define FEW 2

static void fwd_block_few(ak *K, fblock *F)
{
	cg *g = K->g;
	int64_t D = K->D, DV = K->DV;
	const qitem *Q = F->Q;
	V k0 = opnd_at(K, FZ_ATTN_K, Q->b, Q->hk, F->kb), kld = opnd_ld(K, FZ_ATTN_K);
	V v0 = opnd_at(K, FZ_ATTN_V, Q->b, Q->hk, F->kb), vld = opnd_ld(K, FZ_ATTN_V);
	cg_loop R, J;
	cg_loop_begin(g, &R, ci(g, 0), Q->nrows, ci(g, 1));
	{
		V r = R.iv, qrow = mul(g, r, ci(g, D)), srow = mul(g, r, ci(g, BK));
		cg_loop_begin(g, &J, ci(g, 0), F->nk, ci(g, 1));
		V krow = add(g, k0, mul(g, J.iv, kld)), acc[4];
		for (int a = 0; a < 4; a++)
			acc[a] = vconst(g, 0.0);
		for (int64_t e = 0; e < D; e += VW) {
			V q = load(g, vf(g), at(g, F->Qs, add(g, qrow, ci(g, e))), 4);
			V kv = vload(g, K->sk, K->dt, add(g, krow, ci(g, e)));
			acc[e / VW % 4] = vfma(g, q, kv, acc[e / VW % 4]);
		}
		V sum = hreduce(g, fadd(g, fadd(g, acc[0], acc[1]), fadd(g, acc[2], acc[3])), false);
		store(g, sum, at(g, F->S, add(g, srow, J.iv)), 4);
		cg_loop_end(g, &J);
		/* keys past the block's end: 0, as the copy's zero rows give */
		cg_loop_begin(g, &J, F->nk, ci(g, BK), ci(g, 1));
		store(g, c_f32(g, 0.0), at(g, F->S, add(g, srow, J.iv)), 4);
		cg_loop_end(g, &J);
	}
	cg_loop_end(g, &R);
	/* the rows' softmax, masked per lane where the block is not whole (a
	 * causal diagonal block too: its rows see keys j <= i there) */
	rowsel RS = {fwd_row, F, Q->nrows};
	block_rows(K, false, block_full(K, Q->i0, Q->i1, F->kb), &RS);
	cg_loop_begin(g, &R, ci(g, 0), Q->nrows, ci(g, 1));
	{
		V r = R.iv, srow = mul(g, r, ci(g, BK)), orow = mul(g, r, ci(g, DV));
		V al = splat(g, load(g, t_f32(g), at(g, F->Al, r), 4));
		/* eight vectors of O's row at a time: sixteen registers with AVX2 */
		for (int64_t c0 = 0; c0 < DV; c0 += 8 * VW) {
			int nv = (int)((DV - c0) / VW < 8 ? (DV - c0) / VW : 8);
			V init[8], ph[8], next[8];
			for (int u = 0; u < nv; u++)
				init[u] = fmul(g, load(g, vf(g), at(g, F->Os, add(g, orow,
						ci(g, c0 + u * VW))), 4), al);
			cg_loop_begin(g, &J, ci(g, 0), F->nk, ci(g, 1));
			loop_phis(g, &J, nv, init, ph);
			V p = splat(g, load(g, t_f32(g), at(g, F->S, add(g, srow, J.iv)), 4));
			V vrow = add(g, v0, mul(g, J.iv, vld));
			for (int u = 0; u < nv; u++)
				next[u] = vfma(g, p, vload(g, K->sv, K->dt, add(g, vrow, ci(g, c0 + u * VW))),
					       ph[u]);
			loop_next(g, nv, ph, next);
			cg_loop_end(g, &J);
			for (int u = 0; u < nv; u++)
				store(g, ph[u], at(g, F->Os, add(g, orow, ci(g, c0 + u * VW))), 4);
		}
	}
	cg_loop_end(g, &R);
}

/* The block's keys and values; S = Q Kt, the rows' softmax, O = Al O +
 * P V (an item of FEW rows: fwd_block_few). */
static void fwd_block(ak *K, void *arg, bool diag)
{
	cg *g = K->g;
	fblock *F = arg;
	int64_t D = K->D, DV = K->DV;
	if (K->few) {
		fwd_block_few(K, F);
		return;
	}
	load_opnd(K, FZ_ATTN_K, F->Q->b, F->Q->hk, F->kb, F->nk, BK, NULL, F->Kt);
	load_opnd(K, FZ_ATTN_V, F->Q->b, F->Q->hk, F->kb, F->nk, BK, F->Vs, NULL);
	V nq = F->Q->nrows; /* a decode step's one row: one tile, not BQ / MR */
	gemm(g, F->Qs, D, F->Kt, BK, F->S, BK, BQ, nq, BK, D, false, NULL,
	     diag ? TRI_N : TRI_NONE);
	rowsel R = {fwd_row, F, F->Q->nrows};
	block_rows(K, diag, diag ? NULL : block_full(K, F->Q->i0, F->Q->i1, F->kb), &R);
	gemm(g, F->S, BK, F->Vs, DV, F->Os, DV, BQ, nq, DV, BK, true, F->Al,
	     diag ? TRI_KLO : TRI_NONE);
}

/* The loop over the blocks of keys a forward item's rows may see, each
 * block by fwd_block; few: the item has FEW rows or less
 * (fwd_block_few). arg: the item's fblock, its kb and nk set here. */
static void fwd_keys(ak *K, void *arg, bool few)
{
	fblock F = *(const fblock *)arg;
	cg_loop KB;
	K->few = few;
	key_blocks(K, F.Q, &KB, &F.kb, &F.nk);
	by_kind(K, F.Q->b, F.Q->h, F.Q->i0, F.Q->nrows, F.kb, F.nk, fwd_block, &F);
	cg_loop_end(K->g, &KB);
	K->few = false;
}

static void kernel_fwd(ak *K)
{
	cg *g = K->g;
	const fz_attn *A = K->A;
	int64_t D = K->D, DV = K->DV;
	V Qs = scratch(g, BQ * (int)D), Kt = scratch(g, (int)D * BK);
	V Vs = scratch(g, BK * (int)DV), Os = scratch(g, BQ * (int)DV);
	V S = scratch(g, BQ * BK), Ms = scratch(g, BQ), Ls = scratch(g, BQ);
	V Al = scratch(g, BQ);
	cg_loop W, R;
	qitem Q;
	query_item(K, &W, &Q);
	load_opnd(K, FZ_ATTN_Q, Q.b, Q.h, Q.i0, Q.nrows, BQ, Qs, NULL);
	zero(g, Os, BQ * DV);
	cg_loop_begin(g, &R, ci(g, 0), ci(g, BQ), ci(g, 1));
	store(g, c_f32(g, -INFINITY), at(g, Ms, R.iv), 4);
	store(g, c_f32(g, 0.0), at(g, Ls, R.iv), 4);
	store(g, c_f32(g, 0.0), at(g, Al, R.iv), 4); /* rows past nrows: O stays 0 */
	cg_loop_end(g, &R);
	/* the key blocks' loop twice: for items of FEW rows or less, and the
	 * rest */
	fblock F = {&Q, Qs, Kt, Vs, Os, S, Ms, Ls, Al, NULL, NULL};
	by_cond(K, icmp(g, LLVMIntULE, Q.nrows, ci(g, FEW)), fwd_keys, &F);
	/* 1 / l (0 for a row that saw no key) and lse; then o / l */
	cg_loop_begin(g, &R, ci(g, 0), Q.nrows, ci(g, 1));
	{
		V r = R.iv, row = add(g, Q.rowbase, r);
		V l = load(g, t_f32(g), at(g, Ls, r), 4);
		V empty = fcmp(g, LLVMRealOEQ, l, c_f32(g, 0.0));
		store(g, sel(g, empty, c_f32(g, 0.0), fdiv(g, c_f32(g, 1.0), l)), at(g, Al, r), 4);
		if (A->out_lse >= 0) {
			V m = load(g, t_f32(g), at(g, Ms, r), 4);
			V lse = fadd(g, m, cg_math_unary(g, FZ_OP_LOG, sel(g, empty, c_f32(g, 1.0), l)));
			sstore(g, K->slse, FZ_F32, row, sel(g, empty, c_f32(g, -INFINITY), lse));
		}
	}
	cg_loop_end(g, &R);
	if (A->out_o >= 0)
		store_rows(g, K->so, K->dt, mul(g, Q.rowbase, ci(g, DV)), DV, Q.nrows, Os, &Al);
	cg_loop_end(g, &W);
}

/* One block of keys against one block of query rows in the backward:
 * scratch, and where it lies. Qs, dOs [BQ][D], [BQ][DV]; Kt, Vt the
 * block's keys and values transposed; Ks [BK][D] (dq pass) the keys;
 * dX [BQ][D] (dq) or dKs, dVs [BK][D], [BK][DV] (dk/dv) the sums. */
typedef struct gblock {
	V Qs, dOs, Kt, Vt, Ks, dQs, dKs, dVs, S, dP, LSE, DI;
	V b, h, hk, i0, nrows, rowbase; /* rows [i0, i0 + nrows) of head h (kv
	                                 * head hk); their row in lse */
	V kb, nk;                       /* keys [kb, kb + nk) */
	bool keep_p; /* the dk/dv pass: S becomes p, dP ds (else S ds) */
	int sdq;     /* the one pass (FZ_ATTN_BWD): dq's slot, f32, summed in
	              * place (else -1) */
} gblock;

/* Row r's p and ds over the block's first nc vectors of keys, from S and
 * dP. */
static void grad_row(ak *K, void *arg, V r, int nc, bool full)
{
	cg *g = K->g;
	gblock *G = arg;
	int rw = K->rw;
	bool simple_ = simple(K);
	V lg[16], dl[16];
	row_logits(K, G->S, r, G->b, G->h, add(g, G->i0, r), G->kb, nc, full, lg,
		   simple_ ? NULL : dl);
	/* a row that saw no key has lse -inf: +inf in its place gives p 0 */
	V lse = load(g, t_f32(g), at(g, G->LSE, r), 4);
	lse = sel(g, fcmp(g, LLVMRealOEQ, lse, c_f32(g, -INFINITY)), c_f32(g, INFINITY), lse);
	V vl = splatn(g, rw, lse), vd = splatn(g, rw, load(g, t_f32(g), at(g, G->DI, r), 4));
	for (int c = 0; c < nc; c++) {
		V o = add(g, mul(g, r, ci(g, BK)), ci(g, c * rw));
		V dp = load(g, vfn(g, rw), at(g, G->dP, o), 4);
		V p = vexp(g, fsub(g, lg[c], vl));
		/* simple scores: d logit / d s is the scale where p is not 0 */
		V ds = fmul(g, fmul(g, p, fsub(g, dp, vd)),
			    simple_ ? vconstn(g, rw, K->A->scale) : dl[c]);
		if (G->keep_p) {
			store(g, p, at(g, G->S, o), 4);
			store(g, ds, at(g, G->dP, o), 4);
		} else {
			store(g, ds, at(g, G->S, o), 4);
		}
	}
}

/* lse and di = do . o of the rows [i0, i0 + nrows) of head h of item b
 * (lse's row rowbase the first) into LSE, DI. */
static void row_stats(ak *K, V b, V h, V i0, V rowbase, V nrows, V LSE, V DI)
{
	cg *g = K->g;
	cg_loop R;
	V d0 = opnd_at(K, FZ_ATTN_DO, b, h, i0), dld = opnd_ld(K, FZ_ATTN_DO);
	V o0 = opnd_at(K, FZ_ATTN_O, b, h, i0), old = opnd_ld(K, FZ_ATTN_O);
	cg_loop_begin(g, &R, ci(g, 0), nrows, ci(g, 1));
	V row = add(g, rowbase, R.iv);
	store(g, sload(g, K->slse, FZ_F32, row), at(g, LSE, R.iv), 4);
	store(g, dot_rows(K, K->sdo, add(g, d0, mul(g, R.iv, dld)), K->so,
			  add(g, o0, mul(g, R.iv, old)), K->DV), at(g, DI, R.iv), 4);
	cg_loop_end(g, &R);
}

/* The block's keys and values (dq pass) or rows of q and do, lse and di
 * (dk/dv pass); S = Q Kt and dP = dO Vt, the rows' p and ds (rows past
 * nrows: q and do are 0 there, so S and dP are 0, and so are p and ds);
 * then dQ += dS K, or dV += Pt dO and dK += dSt Q (P and dS read down
 * their columns). */
static void grad_block(ak *K, void *arg, bool diag)
{
	cg *g = K->g;
	gblock *G = arg;
	int64_t D = K->D, DV = K->DV;
	if (G->keep_p) {
		load_opnd(K, FZ_ATTN_Q, G->b, G->h, G->i0, G->nrows, BQ, G->Qs, NULL);
		load_opnd(K, FZ_ATTN_DO, G->b, G->h, G->i0, G->nrows, BQ, G->dOs, NULL);
		row_stats(K, G->b, G->h, G->i0, G->rowbase, G->nrows, G->LSE, G->DI);
	} else {
		load_opnd(K, FZ_ATTN_K, G->b, G->hk, G->kb, G->nk, BK, G->Ks, G->Kt);
		load_opnd(K, FZ_ATTN_V, G->b, G->hk, G->kb, G->nk, BK, NULL, G->Vt);
	}
	tri tn = diag ? TRI_N : TRI_NONE;
	gemm(g, G->Qs, D, G->Kt, BK, G->S, BK, BQ, NULL, BK, D, false, NULL, tn);
	gemm(g, G->dOs, DV, G->Vt, BK, G->dP, BK, BQ, NULL, BK, DV, false, NULL, tn);
	rowsel R = {grad_row, G, G->nrows};
	block_rows(K, diag, diag ? NULL : block_full(K, G->i0, add(g, G->i0, G->nrows), G->kb),
		   &R);
	if (!G->keep_p) {
		gemm(g, G->S, BK, G->Ks, D, G->dQs, D, BQ, NULL, D, BK, true, NULL,
		     diag ? TRI_KLO : TRI_NONE);
		return;
	}
	gemm_s(g, G->S, 1, BK, G->dOs, DV, G->dVs, DV, BK, NULL, DV, BQ, true, NULL,
	       diag ? TRI_KHI : TRI_NONE);
	gemm_s(g, G->dP, 1, BK, G->Qs, D, G->dKs, D, BK, NULL, D, BQ, true, NULL,
	       diag ? TRI_KHI : TRI_NONE);
	if (G->sdq < 0)
		return;
	/* the one pass: dQ += dS K on the rows' sums so far (f32, in dq's
	 * buffer: this work item alone writes them), in the order the dq
	 * pass adds them: the same sums, bit for bit */
	V first = mul(g, G->rowbase, ci(g, D));
	load_rows(K, G->sdq, first, ci(g, D), D, G->nrows, BQ, G->dQs, NULL);
	gemm(g, G->dP, BK, G->Ks, D, G->dQs, D, BQ, NULL, D, BK, true, NULL,
	     diag ? TRI_KLO : TRI_NONE);
	store_rows(g, G->sdq, FZ_F32, first, D, G->nrows, G->dQs, NULL);
}

static void kernel_dq(ak *K)
{
	cg *g = K->g;
	const fz_attn *A = K->A;
	int64_t D = K->D, DV = K->DV;
	gblock G = {0};
	G.sdq = -1;
	G.Qs = scratch(g, BQ * (int)D);
	G.dOs = scratch(g, BQ * (int)DV);
	G.Kt = scratch(g, (int)D * BK);
	G.Ks = scratch(g, BK * (int)D);
	G.Vt = scratch(g, (int)DV * BK);
	G.dQs = scratch(g, BQ * (int)D);
	G.LSE = scratch(g, BQ);
	G.DI = scratch(g, BQ);
	G.S = scratch(g, BQ * BK);
	G.dP = scratch(g, BQ * BK);
	cg_loop W, KB;
	qitem Q;
	query_item(K, &W, &Q);
	load_opnd(K, FZ_ATTN_Q, Q.b, Q.h, Q.i0, Q.nrows, BQ, G.Qs, NULL);
	load_opnd(K, FZ_ATTN_DO, Q.b, Q.h, Q.i0, Q.nrows, BQ, G.dOs, NULL);
	zero(g, G.dQs, BQ * D);
	row_stats(K, Q.b, Q.h, Q.i0, Q.rowbase, Q.nrows, G.LSE, G.DI);
	V kb, nk;
	key_blocks(K, &Q, &KB, &kb, &nk);
	G.b = Q.b;
	G.h = Q.h;
	G.hk = Q.hk;
	G.i0 = Q.i0;
	G.nrows = Q.nrows;
	G.kb = kb;
	G.nk = nk;
	by_kind(K, Q.b, Q.h, Q.i0, Q.nrows, kb, nk, grad_block, &G);
	cg_loop_end(g, &KB);
	store_rows(g, g->r->n_in + A->out_dq, K->dt, mul(g, Q.rowbase, ci(g, D)), D, Q.nrows,
		   G.dQs, NULL);
	cg_loop_end(g, &W);
}

/* The dk/dv pass: a work item per (batch, kv head, block of keys). With
 * `one` (FZ_ATTN_BWD, f32), the whole backward in one pass: a work item
 * per (batch, kv head) walks its blocks of keys in order, and each block
 * pair adds dS K to dq as well (grad_block), so S and dP are made once
 * for the three products (5 block products a pair, not 7); dq's rows are
 * this item's alone, so no two threads add to one. */
static void kernel_dkv(ak *K, bool one)
{
	cg *g = K->g;
	const fz_attn *A = K->A;
	int64_t D = K->D, DV = K->DV;
	gblock G = {0};
	G.sdq = one ? g->r->n_in + A->out_dq : -1;
	if (one)
		G.Ks = scratch(g, BK * (int)D), G.dQs = scratch(g, BQ * (int)D);
	G.Kt = scratch(g, (int)D * BK);
	G.Vt = scratch(g, (int)DV * BK);
	G.dKs = scratch(g, BK * (int)D);
	G.dVs = scratch(g, BK * (int)DV);
	G.Qs = scratch(g, BQ * (int)D);
	G.dOs = scratch(g, BQ * (int)DV);
	G.S = scratch(g, BQ * BK);
	G.dP = scratch(g, BQ * BK);
	G.LSE = scratch(g, BQ);
	G.DI = scratch(g, BQ);
	G.keep_p = true;
	V hq = cg_ext(g, A->hq), hkv = cg_ext(g, A->hkv), tq = cg_ext(g, A->tq), tk = cg_ext(g, A->tk);
	cg_loop W, GR, QB, KB;
	V bk, kb;
	work_loop(g, &W, mul(g, cg_ext(g, A->batch), hkv), one ? ci(g, 1) : tk,
		  one ? 1 : BK, &bk, &kb);
	V b = udiv(g, bk, hkv), hk = urem(g, bk, hkv);
	if (one) {
		/* dq of the item's query heads zeroed, then its blocks of keys */
		cg_loop Z;
		V rows = mul(g, ci(g, A->group), tq);
		V first = mul(g, mul(g, add(g, mul(g, b, hq), mul(g, hk, ci(g, A->group))), tq),
			      ci(g, D));
		cg_loop_begin(g, &Z, ci(g, 0), mul(g, rows, ci(g, D / VW)), ci(g, 1));
		vstore(g, G.sdq, FZ_F32, add(g, first, mul(g, Z.iv, ci(g, VW))), vconst(g, 0.0));
		cg_loop_end(g, &Z);
		cg_loop_begin(g, &KB, ci(g, 0), tk, ci(g, BK));
		kb = KB.iv;
	}
	V nk = umin(g, ci(g, BK), sub(g, tk, kb));
	V krow = add(g, mul(g, bk, tk), kb);
	load_opnd(K, FZ_ATTN_K, b, hk, kb, nk, BK, G.Ks, G.Kt);
	load_opnd(K, FZ_ATTN_V, b, hk, kb, nk, BK, NULL, G.Vt);
	zero(g, G.dKs, BK * D);
	zero(g, G.dVs, BK * DV);
	V qlo, qhi;
	cg_attn_query_range(g, A, kb, add(g, kb, nk), &qlo, &qhi);
	cg_loop_begin(g, &GR, ci(g, 0), ci(g, A->group), ci(g, 1));
	V h = add(g, mul(g, hk, ci(g, A->group)), GR.iv);
	V bh = add(g, mul(g, b, hq), h);
	cg_loop_begin(g, &QB, mul(g, udiv(g, qlo, ci(g, BQ)), ci(g, BQ)), qhi, ci(g, BQ));
	{
		V i0 = QB.iv, nrows = sub(g, umin(g, add(g, i0, ci(g, BQ)), tq), i0);
		G.b = b;
		G.h = h;
		G.hk = hk;
		G.i0 = i0;
		G.nrows = nrows;
		G.rowbase = add(g, mul(g, bh, tq), i0);
		G.kb = kb;
		G.nk = nk;
		by_kind(K, b, h, i0, nrows, kb, nk, grad_block, &G);
	}
	cg_loop_end(g, &QB);
	cg_loop_end(g, &GR);
	if (A->out_dk >= 0)
		store_rows(g, g->r->n_in + A->out_dk, K->dt, mul(g, krow, ci(g, D)), D, nk, G.dKs,
			   NULL);
	if (A->out_dv >= 0)
		store_rows(g, g->r->n_in + A->out_dv, K->dt, mul(g, krow, ci(g, DV)), DV, nk, G.dVs,
			   NULL);
	if (one)
		cg_loop_end(g, &KB);
	cg_loop_end(g, &W);
}

void cg_attention(cg *g)
{
	fz_attn A;
	char why[200];
	if (!fz_attn_describe(g->t, g->r, &A, why, sizeof why)) {
		cg_fail(g, FZ_EUNSUPPORTED, NULL, "not an attention region: %s", why);
		return;
	}
	g->k->sk = FZ_SK_ATTENTION;
	g->k->n_work[0] = 1;
	fz_ext w;
	bool kv = A.pass == FZ_ATTN_DKV || A.pass == FZ_ATTN_BWD;
	if (!fz_ext_mul(A.batch, kv ? A.hkv : A.hq, &w) ||
	    !fz_ext_mul(w, kv ? A.tk : A.tq, &w))
		w = A.batch;
	g->k->work[0][0] = w;
	if (cg_gpu(g)) {
		if (A.views || A.pass == FZ_ATTN_BWD) {
			cg_fail(g, FZ_EUNSUPPORTED, A.op, "the GPU attention kernels read "
				"their operands contiguous, one pass a region");
			return;
		}
		cg_attention_gpu(g, &A);
		return;
	}
	if (A.dtype == FZ_F64 || A.d % NR || A.dv % NR || A.d > 512 || A.dv > 512) {
		cg_fail(g, FZ_EUNSUPPORTED, A.first, "the host attention kernel takes "
			"f32, f16 and bf16 with head dims that are multiples of %d "
			"up to 512 (here %s, %lld and %lld)", NR, fz_dtype_name(A.dtype),
			(long long)A.d, (long long)A.dv);
		return;
	}
	if (A.pass == FZ_ATTN_BWD && A.dtype != FZ_F32) {
		cg_fail(g, FZ_EUNSUPPORTED, A.op, "the host's one backward pass sums dq "
			"in its f32 output (here %s)", fz_dtype_name(A.dtype));
		return;
	}
	ak K = {g, &A, A.in_q, A.in_k, A.in_v, -1, -1, -1, A.dtype, A.d, A.dv, gemm_lanes(g), false, false,
		false};
	int n_in = g->r->n_in;
	if (A.pass == FZ_ATTN_FWD) {
		K.so = A.out_o >= 0 ? n_in + A.out_o : -1;
		K.slse = A.out_lse >= 0 ? n_in + A.out_lse : -1;
	} else {
		K.so = A.in_o;
		K.slse = A.in_lse;
		K.sdo = A.in_do;
	}
	cg_function_begin(g, g->k->names[0]);
	if (g->st != FZ_OK)
		return;
	switch (A.pass) {
	case FZ_ATTN_FWD: kernel_fwd(&K); break;
	case FZ_ATTN_DQ: kernel_dq(&K); break;
	case FZ_ATTN_DKV: kernel_dkv(&K, false); break;
	case FZ_ATTN_BWD: kernel_dkv(&K, true); break;
	}
	cg_function_end(g);
}
