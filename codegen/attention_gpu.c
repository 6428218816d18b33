/*
 * attention_gpu.c: the attention kernels for the GPU (NVPTX) and its
 * emulation (EMU): FlashAttention-2 on tensor cores (ir/attention.h says
 * what the passes compute; codegen/attention.c is the host's form).
 *
 * A block is four warps (FZ_TILE_BLOCK threads), each warp 16 rows of the
 * block's 64: query rows in the dq pass, key rows in the dk/dv pass; the
 * forward at head dims up to 64 gives each warp two tiles of 16 rows (128
 * a block), so that each K and V fragment read from tile memory serves
 * two products (FlashAttention-2's 32 rows a warp). Operands are bf16 or f16; the products run on mma.sync
 * m16n8k16 with f32 accumulators (mma.c); tiles come from global memory by
 * cp.async into tile memory (48 KiB of static shared memory, or where the
 * blocks need more, up to 99 KiB of dynamic shared memory: the backward
 * at head dims over 128), two stages where they fit, and into the warps'
 * registers by ldmatrix.
 *
 * Forward, for one block of 64 (or 128) query rows i0 .. and each block
 * of BC keys j0 .. its rows may see (cg_attn_key_range: causal and window
 * blocks are skipped):
 *
 *     S    = Q Kᵀ               A from the Q tile, B from the K tile
 *     L    = cg_attn_scores(S)  the trace's modification, per pair of keys
 *                               a lane holds (the shared emitter)
 *     m'   = max(m, rowmax L)   a row lives in the 4 lanes of a quad:
 *                               two butterfly shuffles
 *     P    = exp(L - m'), O = exp(m - m') O + P V
 *                               P's C fragments, rounded to bf16/f16 in
 *                               pairs, are the A fragments of P V; B from
 *                               the V tile by ldmatrix.trans
 *
 * then o = O / l (l summed over the quad at the end) and lse = m + log l,
 * a row that saw no key giving o = 0 and lse = -inf. exp is ex2.approx
 * on the GPU (fexp_mma). Where the logits are the scores times the scale
 * and nothing but the causal, window and length rules hides a pair (the
 * primitive with no mask operand nor softcap), a block every pair of
 * which is seen skips cg_attn_scores: P = 2^(S scale log2 e - m log2 e),
 * one fma and ex2 a score; the backward's passes do the same. The block
 * sizes come from the head dims and the 48 KiB (else 99 KiB): BC = 64
 * keys with two stages where Q and two stages of K and V fit, else 32,
 * else 16, else one stage (plan).
 *
 * The backward recomputes P block by block, with no atomics: the dq pass
 * owns 64 query rows and walks the keys (dP = dO Vᵀ, dS = P (dP - di) dl,
 * dq += dS K with K's tile read transposed); the dk/dv pass owns 64 keys
 * and walks the query rows of the `group` heads that share its kv head,
 * computing everything transposed (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ), so that Pᵀ and
 * dSᵀ are already the A fragments of dv += Pᵀ dO and dk += dSᵀ Q. di =
 * rowsum(dO o) is computed where it is needed (per row by the quad in the
 * dq pass, into tile memory per block of queries in the dk/dv pass).
 *
 * f32 runs on plain FMA instead (the tensor cores' f32 path would be
 * tf32, 10 bits of mantissa, which the f64 oracle's f32 tolerance does not
 * allow): the forward, dq and dk/dv passes below, 32 rows a block and a
 * quad of lanes per row. f64 regions are not taken here (FZ_EUNSUPPORTED),
 * nor head dims that are not multiples of 16 or over 256.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "llvm.h"

#define BR 64          /* rows of a block: 4 warps x 16 */

typedef struct gk {
	cg *g;
	const fz_attn *A;
	fz_dtype dt;
	int D, DV;
	int bc, stages;                /* keys (fwd, dq) or queries (dkv) per step */
	int mt;                        /* fwd: row tiles of 16 per warp (1 or 2) */
	int sq, sk, sv, so, slse, sdo; /* buffer slots (-1 absent) */
	V warp, lane, qg, qt;          /* qg = lane / 4, qt = lane % 4 (i32) */
} gk;

static V ci(cg *g, int64_t x) { return c_int(g->ity, x); }
static V i32(cg *g, V x) { return zext_or_trunc(g, x, t_i32(g)); }
static V ix(cg *g, V x) { return zext_or_trunc(g, x, g->ity); }
static V umin(cg *g, V a, V b) { return sel(g, icmp(g, LLVMIntULT, a, b), a, b); }
static V fmax_(cg *g, V a, V b)
{
	return call_intrinsic(g, "llvm.maxnum", t_f32(g), t_f32(g), (V[]){a, b}, 2);
}
static V fexp(cg *g, V x) { return cg_math_unary(g, FZ_OP_EXP, x); }

/* exp(k a - b) for the tensor-core kernels, whose probabilities are
 * rounded to bf16 or f16 before they meet V: on the GPU 2^(a k log2 e -
 * b log2 e) by an fma and ex2.approx (b's product is a row's, hoisted by
 * the optimizer; relative error near 2^-21 for the arguments that
 * matter), where cg_math_unary's exp, good to an f32 ulp, is some twenty
 * instructions and set the forward's pace (H100, run 3: 116 TFLOP/s
 * against SDPA's 344). emu keeps the exact one, and so do the f32
 * kernels, held to f32's tolerance. a = -inf gives 0. */
static V fexp_mma(cg *g, V a, V b, double k)
{
	if (g->o.target != FZ_CG_NVPTX)
		return fexp(g, fsub(g, k == 1.0 ? a : fmul(g, a, c_f32(g, k)), b));
	double l2e = 1.4426950408889634;
	/* contracted: an fma */
	V y = fsub(g, fmul(g, a, c_f32(g, k * l2e)), fmul(g, b, c_f32(g, l2e)));
	T f = t_f32(g);
	return call_named(g, "llvm.nvvm.ex2.approx.ftz.f", LLVMFunctionType(f, &f, 1, 0),
			  &y, 1);
}

/* Values carried across loop iterations live in allocas (sroa makes them
 * registers). */
static V slots(cg *g, int n) { return cg_entry_alloca(g, t_arr(t_f32(g), (unsigned)n)); }
static V get(cg *g, V a, int i) { return load(g, t_f32(g), gep(g, t_f32(g), a, c_i32(g, i)), 4); }
static void put(cg *g, V a, int i, V x) { store(g, x, gep(g, t_f32(g), a, c_i32(g, i)), 4); }

/* The tile plan: BC and stages for tiles of `fixed` bytes plus `per_row`
 * bytes per row of the walked block (per stage), in static shared memory
 * where some plan fits it, else in dynamic shared memory (mma.c); 0 when
 * nothing fits. */
static int plan(int fixed, int per_row, int *bc, int *stages)
{
	static const int opts[][2] = {{64, 2}, {32, 2}, {64, 1}, {32, 1}, {16, 2}, {16, 1}};
	static const int limits[2] = {FZ_TILE_STATIC_MAX, FZ_TILE_DYN_MAX};
	for (int l = 0; l < 2; l++)
		for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
			if (fixed + opts[i][0] * per_row * opts[i][1] <= limits[l]) {
				*bc = opts[i][0];
				*stages = opts[i][1];
				return 1;
			}
	return 0;
}

/* Bytes per row of a tile of n columns (cg_tile_make's pitch). */
static int row_bytes(int n)
{
	int ch = n / 8;
	return (ch % 8 == 0 ? ch : ch | 1) * 16;
}

/* The f32 kernels' plan: tiles of f32 rows (D and DV wide, plus `extra`
 * bytes per walked row), at most 32 rows a step (the scores, or the
 * walked rows, are unrolled in registers). */
static int plan_f32(int D, int DV, int extra, int *bc, int *stages)
{
	int ok = plan(0, row_bytes(2 * D) + row_bytes(2 * DV) + extra, bc, stages);
	if (*bc > 32)
		*bc = 32;
	return ok;
}

/* Element off on of slots a, as slots. */
static V at(cg *g, V a, int off) { return gep(g, t_f32(g), a, c_i32(g, off)); }

/* For each of the warp's mt row tiles m (16 rows each): acc_m[N/8][4] +=
 * A_m (16 rows x K) B (K x N), acc_m at element m N/2 of acc. A_m from
 * tile ta (rows ra + 16 m ..) or, ta NULL, from registers a[m][K/16][4];
 * B from tile tb, stored [n][k] or ([k][n], kn) transposed, each fragment
 * of it loaded once for the mt tiles (two tiles halve the tile-memory
 * reads per product: FlashAttention-2's 32 rows a warp). */
static void warp_mma(gk *G, int mt, const cg_tile *ta, V sta, V ra, const V *a,
		     const cg_tile *tb, V stb, int K, int N, bool kn, V acc)
{
	cg *g = G->g;
	for (int ks = 0; ks < K; ks += 16) {
		V af[2][4];
		for (int m = 0; m < mt; m++) {
			if (ta)
				cg_frag_a(g, ta, sta, add(g, ra, c_i32(g, 16 * m)), ks, af[m]);
			else
				memcpy(af[m], a + (m * (K / 16) + ks / 16) * 4, sizeof af[m]);
		}
		for (int n0 = 0; n0 < N; n0 += 16) {
			V b[4];
			cg_frag_b2(g, tb, stb, n0, ks, kn, b);
			for (int h = 0; h < 2 && n0 + 8 * h < N; h++)
				for (int m = 0; m < mt; m++) {
					int j = m * (N / 8) + n0 / 8 + h;
					V c[4], d[4];
					for (int i = 0; i < 4; i++)
						c[i] = get(g, acc, 4 * j + i);
					cg_mma(g, G->dt, af[m], b + 2 * h, c, d);
					for (int i = 0; i < 4; i++)
						put(g, acc, 4 * j + i, d[i]);
				}
		}
	}
}

/* The C fragments of acc (16 x N) as A fragments (N/16 steps of four
 * registers): c0 c1 of n-tiles 2s and 2s+1 are rows g, c2 c3 rows g + 8. */
static void c_to_a(gk *G, V acc, int N, V *a)
{
	cg *g = G->g;
	for (int s = 0; s < N / 16; s++)
		for (int r = 0; r < 4; r++) {
			int j = 2 * s + (r >= 2), e = (r & 1) * 2;
			a[4 * s + r] = cg_pack_half2(g, G->dt, get(g, acc, 4 * j + e),
						     get(g, acc, 4 * j + e + 1));
		}
}

static void fill(cg *g, V a, int n, double x)
{
	for (int i = 0; i < n; i++)
		put(g, a, i, c_f32(g, x));
}

/* The sum over the 4 lanes of a quad. */
static V quad_sum(cg *g, V x)
{
	x = fadd(g, x, cg_shfl_bfly(g, x, 1));
	return fadd(g, x, cg_shfl_bfly(g, x, 2));
}
static V quad_max(cg *g, V x)
{
	x = fmax_(g, x, cg_shfl_bfly(g, x, 1));
	return fmax_(g, x, cg_shfl_bfly(g, x, 2));
}

/* Stores x (f32) as element off of slot s (dtype d). */
static void put_global(cg *g, int s, fz_dtype d, V off, V x)
{
	V p = cg_access_ptr(g, s, d, off, 1, true, (unsigned)fz_dtype_size(d));
	store(g, cg_to_storage(g, x, d), p, (unsigned)fz_dtype_size(d));
}
static V get_global(cg *g, int s, fz_dtype d, V off)
{
	V p = cg_access_ptr(g, s, d, off, 1, false, (unsigned)fz_dtype_size(d));
	return cg_from_storage(g, load(g, cg_stype(g, d), p, (unsigned)fz_dtype_size(d)), d);
}

/* if (c) { ... }: opens the block, returns the join. */
static LLVMBasicBlockRef when(cg *g, V c)
{
	LLVMBasicBlockRef yes = block(g, "if"), no = block(g, "fi");
	cond_br(g, c, yes, no);
	at_end(g, yes);
	return no;
}
static void end_when(cg *g, LLVMBasicBlockRef join)
{
	br(g, join);
	at_end(g, join);
}

/* The tiles of the work loop: for (t = ctaid; t < n; t += nctaid). */
static void tile_loop(cg *g, cg_loop *L, V n)
{
	cg_loop_begin(g, L, cg_ctaid(g), n, cg_nctaid(g));
}

/* ---- the walk: blocks of keys (or queries) through tile memory ----------------------
 * A kernel owns a block of rows and walks blocks of the other side: block n
 * covers rows first + n blk .. of a matrix of `limit` rows (keys, or in the
 * dk/dv pass the query rows of head heads0 + n / per); its tiles t[0] and
 * t[1] (K and V, or Q and dO) come by cp.async, two stages ahead where the
 * plan gave two. */
typedef struct walk {
	const cg_tile *t[2];
	int slot[2], width[2];  /* buffer slot, elements per row */
	fz_dtype dt;
	V first, n, limit;      /* ity */
	int blk, stages;
	V base;                 /* the rows' matrix starts at row base (plain) */
	V heads0, per;          /* dkv: block n is of head heads0 + n / per */
} walk;

/* The first row (within its head) and the global row of block n. */
static void walk_rows(gk *G, const walk *W, V n, V *r0, V *grow)
{
	cg *g = G->g;
	if (!W->per) {
		*r0 = add(g, W->first, mul(g, n, ci(g, W->blk)));
		*grow = add(g, W->base, *r0);
		return;
	}
	V per = sel(g, icmp(g, LLVMIntEQ, W->per, ci(g, 0)), ci(g, 1), W->per);
	*r0 = add(g, W->first, mul(g, urem(g, n, per), ci(g, W->blk)));
	*grow = add(g, mul(g, add(g, W->heads0, udiv(g, n, per)), W->limit), *r0);
}

static void walk_fetch(gk *G, const walk *W, V n, V st)
{
	cg *g = G->g;
	V r0, grow;
	walk_rows(G, W, n, &r0, &grow);
	for (int k = 0; k < 2; k++)
		cg_tile_fetch(g, W->t[k], st, W->slot[k], W->dt, mul(g, grow, ci(g, W->width[k])),
			      ci(g, W->width[k]), sub(g, W->limit, r0), ci(g, W->width[k]));
}

/* The blocks of blk rows that cover [lo, hi): *first (aligned) and *n. */
static void blocks_of(cg *g, V lo, V hi, int blk, V *first, V *n)
{
	*first = mul(g, udiv(g, lo, ci(g, blk)), ci(g, blk));
	*n = sel(g, icmp(g, LLVMIntUGT, hi, *first),
		 udiv(g, add(g, sub(g, hi, *first), ci(g, blk - 1)), ci(g, blk)), ci(g, 0));
}

/* Opens the loop over the walk's blocks (L->iv the block): the first
 * block's copies before it (committed with whatever the kernel issued
 * before), the next block's (or with one stage this block's) in it,
 * committed. Returns the stage that holds block L->iv; walk_ready waits
 * for it. */
static V walk_begin(gk *G, const walk *W, cg_loop *L)
{
	cg *g = G->g;
	if (W->stages == 2) {
		LLVMBasicBlockRef j = when(g, icmp(g, LLVMIntUGT, W->n, ci(g, 0)));
		walk_fetch(G, W, ci(g, 0), c_i32(g, 0));
		end_when(g, j);
	}
	cg_cp_commit(g);
	cg_loop_begin(g, L, ci(g, 0), W->n, ci(g, 1));
	V st = W->stages == 2 ? i32(g, and_(g, L->iv, ci(g, 1))) : c_i32(g, 0);
	if (W->stages == 2) {
		V n1 = add(g, L->iv, ci(g, 1));
		LLVMBasicBlockRef j = when(g, icmp(g, LLVMIntULT, n1, W->n));
		walk_fetch(G, W, n1, xor_(g, st, c_i32(g, 1)));
		end_when(g, j);
	} else {
		walk_fetch(G, W, L->iv, st);
	}
	cg_cp_commit(g);
	return st;
}

static void walk_ready(gk *G, const walk *W)
{
	cg_cp_wait(G->g, W->stages - 1);
	cg_barrier(G->g);
}

/* Closes the loop: every warp is done with the stage before it is
 * fetched again; nothing in flight after. */
static void walk_end(gk *G, cg_loop *L)
{
	cg_barrier(G->g);
	cg_loop_end(G->g, L);
	cg_cp_wait(G->g, 0);
}

/* This lane's row (i32, within the block) of half hr of a warp's 16. */
static V frag_row(gk *G, V r0, int hr)
{
	cg *g = G->g;
	return add(g, r0, add(g, G->qg, c_i32(g, 8 * hr)));
}

/* This lane's column (ity) of element e of n-tile n. */
static V frag_col(gk *G, int n, int e)
{
	cg *g = G->g;
	return ix(g, add(g, c_i32(g, 8 * n + e), shl(g, G->qt, c_i32(g, 1))));
}

/* Stores half hr of acc (16 x N) times f (NULL: 1) as the row at element
 * rowoff of slot s. */
static void store_half(gk *G, V acc, int N, int hr, int s, V rowoff, V f)
{
	cg *g = G->g;
	for (int n = 0; n < N / 8; n++)
		for (int e = 0; e < 2; e++) {
			V x = get(g, acc, 4 * n + 2 * hr + e);
			put_global(g, s, G->dt, add(g, rowoff, frag_col(G, n, e)), f ? fmul(g, x, f) : x);
		}
}

/* The loop over the blocks of br query rows of every (batch, head): the
 * block's head bh (flattened), b and h, its kv head, rows [i0, i1). */
typedef struct qblock {
	V bh, b, h, kvh, i0, i1;
} qblock;

static void query_blocks(gk *G, cg_loop *W, int br, qblock *Q)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	V hq = cg_ext(g, A->hq), Tq = cg_ext(g, A->tq);
	V nqb = udiv(g, add(g, Tq, ci(g, br - 1)), ci(g, br));
	tile_loop(g, W, mul(g, mul(g, cg_ext(g, A->batch), hq), nqb));
	Q->bh = udiv(g, W->iv, nqb);
	Q->i0 = mul(g, urem(g, W->iv, nqb), ci(g, br));
	Q->b = udiv(g, Q->bh, hq);
	Q->h = urem(g, Q->bh, hq);
	Q->kvh = add(g, mul(g, Q->b, cg_ext(g, A->hkv)), udiv(g, Q->h, ci(g, A->group)));
	Q->i1 = umin(g, add(g, Q->i0, ci(g, br)), Tq);
}

/* The walk over the key blocks of bc keys that query block Q may see. */
static walk key_walk(gk *G, const qblock *Q, const cg_tile *tk, const cg_tile *tv, fz_dtype dt)
{
	cg *g = G->g;
	V Tk = cg_ext(g, G->A->tk);
	walk Wk = {{tk, tv}, {G->sk, G->sv}, {G->D, G->DV}, dt, NULL, NULL, Tk, G->bc, G->stages,
		   mul(g, Q->kvh, Tk), NULL, NULL};
	V klo, khi;
	cg_attn_key_range(g, G->A, Q->i0, Q->i1, &klo, &khi);
	blocks_of(g, klo, khi, G->bc, &Wk.first, &Wk.n);
	return Wk;
}

/* ---- forward -------------------------------------------------------------------- */

/* cg_attn_simple with a positive scale: the whole arms take the row
 * maximum over the raw scores and scale it once. */
static bool plain_scores(const fz_attn *A)
{
	return cg_attn_simple(A) && A->scale > 0;
}

/* if (c) { whole arm } else { edge arm }, the arms' values meeting in the
 * slots (allocas, which sroa turns into phis):
 *
 *     whole_or_edge(g, c, &edge, &join);
 *     ... the whole arm ...
 *     whole_end(g, edge, join);
 *     ... the edge arm ...
 *     edge_end(g, join);
 *
 * edge_end with join NULL (no whole_or_edge) leaves the edge arm's code
 * alone. */
static void whole_or_edge(cg *g, V c, LLVMBasicBlockRef *edge, LLVMBasicBlockRef *join)
{
	LLVMBasicBlockRef whole = block(g, "attn.whole");
	*edge = block(g, "attn.edge");
	*join = block(g, "attn.join");
	cond_br(g, c, whole, *edge);
	at_end(g, whole);
}
static void whole_end(cg *g, LLVMBasicBlockRef edge, LLVMBasicBlockRef join)
{
	br(g, join);
	at_end(g, edge);
}
static void edge_end(cg *g, LLVMBasicBlockRef join)
{
	if (join) {
		br(g, join);
		at_end(g, join);
	}
}

/* The forward's online softmax over one block of keys at j0, for each row
 * tile m and half hr (row g, g + 8) of the warp's: S's scores become
 * probabilities, O is rescaled, M and Lsum move on. whole (a block every
 * row sees, plain_scores): the row maximum over the raw scores, scaled
 * once, and each probability 2^(s scale log2 e - m log2 e), one fma and
 * ex2; else each logit from cg_attn_scores, masks and all. */
static void fwd_softmax(gk *G, V S, V O, V M, V Lsum, V r0, V i0, V j0, V b, V h,
			bool whole)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	int BC = G->bc, DV = G->DV;
	V Tq = cg_ext(g, A->tq);
	for (int m = 0; m < G->mt; m++) {
		V Sm = at(g, S, m * BC / 2), Om = at(g, O, m * DV / 2);
		V rm = add(g, r0, c_i32(g, 16 * m));
		for (int hr = 0; hr < 2; hr++) {
			V mx = c_f32(g, -INFINITY);
			if (whole) {
				for (int n = 0; n < BC / 8; n++)
					mx = fmax_(g, mx, fmax_(g, get(g, Sm, 4 * n + 2 * hr),
								get(g, Sm, 4 * n + 2 * hr + 1)));
				mx = fmul(g, mx, c_f32(g, A->scale));
			} else {
				V i = add(g, i0, ix(g, frag_row(G, rm, hr)));
				/* rows past Tq: any valid row */
				V ic = umin(g, i, sub(g, Tq, ci(g, 1)));
				for (int n = 0; n < BC / 8; n++) {
					V s[2] = {get(g, Sm, 4 * n + 2 * hr),
						  get(g, Sm, 4 * n + 2 * hr + 1)}, l[2];
					V jj = add(g, j0, frag_col(G, n, 0));
					cg_attn_scores(g, A, b, h, ic, cg_ix_of(jj, 2), 2, s, l, NULL);
					put(g, Sm, 4 * n + 2 * hr, l[0]);
					put(g, Sm, 4 * n + 2 * hr + 1, l[1]);
					mx = fmax_(g, mx, fmax_(g, l[0], l[1]));
				}
			}
			int r = 2 * m + hr;
			V mold = get(g, M, r), mnew = fmax_(g, mold, quad_max(g, mx));
			V muse = sel(g, fcmp(g, LLVMRealOEQ, mnew, c_f32(g, -INFINITY)), c_f32(g, 0.0),
				     mnew);
			V alpha = fexp_mma(g, mold, muse, 1.0), sum = c_f32(g, 0.0);
			for (int n = 0; n < BC / 8; n++)
				for (int e = 0; e < 2; e++) {
					V p = fexp_mma(g, get(g, Sm, 4 * n + 2 * hr + e), muse,
						       whole ? A->scale : 1.0);
					put(g, Sm, 4 * n + 2 * hr + e, p);
					sum = fadd(g, sum, p);
				}
			put(g, Lsum, r, fadd(g, fmul(g, get(g, Lsum, r), alpha), sum));
			put(g, M, r, mnew);
			for (int n = 0; n < DV / 8; n++)
				for (int e = 0; e < 2; e++)
					put(g, Om, 4 * n + 2 * hr + e,
					    fmul(g, get(g, Om, 4 * n + 2 * hr + e), alpha));
		}
	}
}

static void kernel_fwd(gk *G)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	int D = G->D, DV = G->DV, BC = G->bc, ST = G->stages, MT = G->mt, rows = BR * MT;
	int next = 0;
	cg_tile tq = cg_tile_make(&next, rows, D, 1);
	cg_tile tk = cg_tile_make(&next, BC, D, ST), tv = cg_tile_make(&next, BC, DV, ST);
	cg_tile_alloc(g, next);
	V Tq = cg_ext(g, A->tq);
	/* per row tile m: S and O at m BC/2 and m DV/2, M and Lsum at 2 m */
	V S = slots(g, MT * BC / 2), O = slots(g, MT * DV / 2);
	V M = slots(g, 2 * MT), Lsum = slots(g, 2 * MT);
	cg_loop W;
	qblock Q;
	query_blocks(G, &W, rows, &Q);
	V bh = Q.bh, b = Q.b, h = Q.h, i0 = Q.i0;
	V qbase = mul(g, add(g, mul(g, bh, Tq), i0), ci(g, D));
	cg_tile_fetch(g, &tq, NULL, G->sq, G->dt, qbase, ci(g, D), sub(g, Tq, i0), ci(g, D));
	walk Wk = key_walk(G, &Q, &tk, &tv, G->dt);
	fill(g, O, MT * DV / 2, 0.0);
	fill(g, M, 2 * MT, -INFINITY);
	fill(g, Lsum, 2 * MT, 0.0);
	V r0 = mul(g, G->warp, c_i32(g, 16 * MT));
	cg_loop K;
	V st = walk_begin(G, &Wk, &K);
	walk_ready(G, &Wk);
	V j0 = add(g, Wk.first, mul(g, K.iv, ci(g, BC)));
	fill(g, S, MT * BC / 2, 0.0);
	warp_mma(G, MT, &tq, NULL, r0, NULL, &tk, st, D, BC, false, S);
	/* logits, and the online softmax per row; a block every row sees
	 * whole, when the logits are the scaled scores, without their masks */
	LLVMBasicBlockRef edge = NULL, join = NULL;
	if (plain_scores(A)) {
		V j1 = add(g, j0, ci(g, BC));
		whole_or_edge(g, cg_attn_block_whole(g, A, i0, Q.i1, j0, j1), &edge, &join);
		fwd_softmax(G, S, O, M, Lsum, r0, i0, j0, b, h, true);
		whole_end(g, edge, join);
	}
	fwd_softmax(G, S, O, M, Lsum, r0, i0, j0, b, h, false);
	edge_end(g, join);
	V pa[2 * 64 / 16 * 4];
	for (int m = 0; m < MT; m++)
		c_to_a(G, at(g, S, m * BC / 2), BC, pa + m * (BC / 16) * 4);
	warp_mma(G, MT, NULL, NULL, NULL, pa, &tv, st, BC, DV, true, O);
	walk_end(G, &K);
	/* o = O / l, lse = m + log l, rows below Tq */
	for (int m = 0; m < MT; m++)
		for (int hr = 0; hr < 2; hr++) {
			int r = 2 * m + hr;
			V i = add(g, i0, ix(g, frag_row(G, add(g, r0, c_i32(g, 16 * m)), hr)));
			V l = quad_sum(g, get(g, Lsum, r));
			V empty = fcmp(g, LLVMRealOEQ, l, c_f32(g, 0.0));
			V inv = sel(g, empty, c_f32(g, 0.0), fdiv(g, c_f32(g, 1.0), l));
			LLVMBasicBlockRef j = when(g, icmp(g, LLVMIntULT, i, Tq));
			V row = add(g, mul(g, bh, Tq), i);
			if (G->so >= 0)
				store_half(G, at(g, O, m * DV / 2), DV, hr, G->so,
					   mul(g, row, ci(g, DV)), inv);
			if (G->slse >= 0) {
				LLVMBasicBlockRef j2 = when(g, icmp(g, LLVMIntEQ, G->qt, c_i32(g, 0)));
				V lse = fadd(g, get(g, M, r),
					     cg_math_unary(g, FZ_OP_LOG, sel(g, empty, c_f32(g, 1.0), l)));
				put_global(g, G->slse, FZ_F32, row,
					   sel(g, empty, c_f32(g, -INFINITY), lse));
				end_when(g, j2);
			}
			end_when(g, j);
		}
	cg_barrier(g); /* the next tile's copies overwrite what this one read */
	cg_loop_end(g, &W);
}

/* ---- forward, f32: plain FMA ---------------------------------------------------------
 * 32 query rows per block, a quad of lanes per row: lane t of the quad
 * holds the row's 16-byte chunks t, t + 4, ... of q (in registers) and of
 * o. A score is the quad's sum of its lanes' partial dots (two butterfly
 * shuffles); K and V come through tile memory by cp.async as for the
 * tensor cores, each lane reading its chunks of a key's row. */

#define BR32 32

/* The 4 floats of chunk ch (i32) of row r (i32) of f32 tile t. */
static void chunk4(cg *g, const cg_tile *t, V st, V r, V ch, V *x)
{
	V p = cg_tile_ptr(g, cg_tile_chunk(g, t, st, r, ch), 16, false);
	V v = load(g, t_vec(t_f32(g), 4), p, 16);
	for (int e = 0; e < 4; e++)
		x[e] = extract(g, v, (unsigned)e);
}

/* x[m][e] (m < n/16): element 16 m + 4 qt + e of row `row` of slot s. */
static void row_chunks(gk *G, int s, V row, int n, V x)
{
	cg *g = G->g;
	for (int m = 0; m < n / 16; m++)
		for (int e = 0; e < 4; e++) {
			V col = ix(g, add(g, c_i32(g, 16 * m + e), shl(g, G->qt, c_i32(g, 2))));
			put(g, x, 4 * m + e, get_global(g, s, FZ_F32, add(g, mul(g, row, ci(g, n)), col)));
		}
}

/* Stores x (as row_chunks lays it out) as row `row` of slot s. */
static void store_chunks(gk *G, int s, V row, int n, V x)
{
	cg *g = G->g;
	for (int m = 0; m < n / 16; m++)
		for (int e = 0; e < 4; e++) {
			V col = ix(g, add(g, c_i32(g, 16 * m + e), shl(g, G->qt, c_i32(g, 2))));
			put_global(g, s, FZ_F32, add(g, mul(g, row, ci(g, n)), col), get(g, x, 4 * m + e));
		}
}

static void kernel_fwd_f32(gk *G)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	int D = G->D, DV = G->DV, BC = G->bc, ST = G->stages, nq = D / 16, no = DV / 16;
	int next = 0;
	cg_tile tk = cg_tile_make(&next, BC, 2 * D, ST), tv = cg_tile_make(&next, BC, 2 * DV, ST);
	cg_tile_alloc(g, next);
	V Tq = cg_ext(g, A->tq);
	V Q = slots(g, D / 4), O = slots(g, DV / 4), S = slots(g, BC), ML = slots(g, 2);
	cg_loop W;
	qblock QB;
	query_blocks(G, &W, BR32, &QB);
	V bh = QB.bh, b = QB.b, h = QB.h, i0 = QB.i0;
	V tid = zext_or_trunc(g, cg_tid(g), t_i32(g));
	V i = add(g, i0, ix(g, lshr(g, tid, c_i32(g, 2))));
	V ic = umin(g, i, sub(g, Tq, ci(g, 1)));
	V row = add(g, mul(g, bh, Tq), ic);
	row_chunks(G, G->sq, row, D, Q);
	walk Wk = key_walk(G, &QB, &tk, &tv, FZ_F32);
	fill(g, O, DV / 4, 0.0);
	put(g, ML, 0, c_f32(g, -INFINITY));
	put(g, ML, 1, c_f32(g, 0.0));
	cg_loop K;
	V st = walk_begin(G, &Wk, &K);
	walk_ready(G, &Wk);
	V j0 = add(g, Wk.first, mul(g, K.iv, ci(g, BC)));
	for (int j = 0; j < BC; j++) {
		V part = c_f32(g, 0.0);
		for (int m = 0; m < nq; m++) {
			V kx[4];
			chunk4(g, &tk, st, c_i32(g, j), add(g, c_i32(g, 4 * m), G->qt), kx);
			for (int e = 0; e < 4; e++)
				part = fadd(g, part, fmul(g, get(g, Q, 4 * m + e), kx[e]));
		}
		put(g, S, j, quad_sum(g, part));
	}
	V mx = c_f32(g, -INFINITY);
	for (int j = 0; j < BC; j += 8) {
		V s[8], l[8];
		for (int e = 0; e < 8; e++)
			s[e] = get(g, S, j + e);
		cg_attn_scores(g, A, b, h, ic, cg_ix_of(add(g, j0, ci(g, j)), 8), 8, s, l, NULL);
		for (int e = 0; e < 8; e++) {
			put(g, S, j + e, l[e]);
			mx = fmax_(g, mx, l[e]);
		}
	}
	V mold = get(g, ML, 0), mnew = fmax_(g, mold, mx);
	V muse = sel(g, fcmp(g, LLVMRealOEQ, mnew, c_f32(g, -INFINITY)), c_f32(g, 0.0), mnew);
	V alpha = fexp(g, fsub(g, mold, muse)), sum = c_f32(g, 0.0);
	for (int n = 0; n < DV / 4; n++)
		put(g, O, n, fmul(g, get(g, O, n), alpha));
	for (int j = 0; j < BC; j++) {
		V p = fexp(g, fsub(g, get(g, S, j), muse));
		sum = fadd(g, sum, p);
		for (int m = 0; m < no; m++) {
			V vx[4];
			chunk4(g, &tv, st, c_i32(g, j), add(g, c_i32(g, 4 * m), G->qt), vx);
			for (int e = 0; e < 4; e++)
				put(g, O, 4 * m + e, fadd(g, get(g, O, 4 * m + e), fmul(g, p, vx[e])));
		}
	}
	put(g, ML, 1, fadd(g, fmul(g, get(g, ML, 1), alpha), sum));
	put(g, ML, 0, mnew);
	walk_end(G, &K);
	V l = get(g, ML, 1);
	V empty = fcmp(g, LLVMRealOEQ, l, c_f32(g, 0.0));
	V inv = sel(g, empty, c_f32(g, 0.0), fdiv(g, c_f32(g, 1.0), l));
	LLVMBasicBlockRef jr = when(g, icmp(g, LLVMIntULT, i, Tq));
	V orow = add(g, mul(g, bh, Tq), i);
	if (G->so >= 0)
		for (int m = 0; m < no; m++)
			for (int e = 0; e < 4; e++) {
				V col = ix(g, add(g, c_i32(g, 16 * m + e), shl(g, G->qt, c_i32(g, 2))));
				put_global(g, G->so, FZ_F32, add(g, mul(g, orow, ci(g, DV)), col),
					   fmul(g, get(g, O, 4 * m + e), inv));
			}
	if (G->slse >= 0) {
		LLVMBasicBlockRef j2 = when(g, icmp(g, LLVMIntEQ, G->qt, c_i32(g, 0)));
		V lse = fadd(g, get(g, ML, 0),
			     cg_math_unary(g, FZ_OP_LOG, sel(g, empty, c_f32(g, 1.0), l)));
		put_global(g, G->slse, FZ_F32, orow, sel(g, empty, c_f32(g, -INFINITY), lse));
		end_when(g, j2);
	}
	end_when(g, jr);
	cg_barrier(g);
	cg_loop_end(g, &W);
}

/* ---- backward ------------------------------------------------------------------ */

/* p = exp(logit - lse) (0 where hidden, or where `drop`), ds = p (dp - di) dl;
 * mma: the tensor-core kernels' exp (fexp_mma). */
static void grad_elem(cg *g, bool mma, V lg, V dl, V lse, V dp, V di, V drop, V *p,
		      V *ds)
{
	V hid = fcmp(g, LLVMRealOEQ, lg, c_f32(g, -INFINITY));
	if (drop)
		hid = or_(g, hid, drop);
	*p = sel(g, hid, c_f32(g, 0.0),
		 mma ? fexp_mma(g, lg, lse, 1.0) : fexp(g, fsub(g, lg, lse)));
	*ds = fmul(g, fmul(g, *p, fsub(g, dp, di)), dl);
}

/* di = rowsum(do o) of row `row` (ity), over the `parts` lanes that share
 * it (consecutive lanes, parts a power of two), lane `part` of them
 * summing columns part, part + parts, ... */
static V row_di(gk *G, V row, V part, int parts)
{
	cg *g = G->g;
	int DV = G->DV;
	V acc = c_f32(g, 0.0);
	cg_loop L;
	V sum = cg_entry_alloca(g, t_f32(g));
	store(g, acc, sum, 4);
	cg_loop_begin(g, &L, ix(g, part), ci(g, DV), ci(g, parts));
	V off = add(g, mul(g, row, ci(g, DV)), L.iv);
	V x = fmul(g, get_global(g, G->sdo, G->dt, off), get_global(g, G->so, G->dt, off));
	store(g, fadd(g, load(g, t_f32(g), sum, 4), x), sum, 4);
	cg_loop_end(g, &L);
	acc = load(g, t_f32(g), sum, 4);
	for (int m = 1; m < parts; m *= 2)
		acc = fadd(g, acc, cg_shfl_bfly(g, acc, m));
	return acc;
}

/* The loop over the blocks of br keys of every (batch, kv head): the
 * block's kv head bk (flattened), b and hk, its keys [j0, j1). */
static void key_blocks(gk *G, cg_loop *W, int br, V *bk, V *b, V *hk, V *j0, V *j1)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	V hkv = cg_ext(g, A->hkv), Tk = cg_ext(g, A->tk);
	V nkb = udiv(g, add(g, Tk, ci(g, br - 1)), ci(g, br));
	tile_loop(g, W, mul(g, mul(g, cg_ext(g, A->batch), hkv), nkb));
	*bk = udiv(g, W->iv, nkb);
	*j0 = mul(g, urem(g, W->iv, nkb), ci(g, br));
	*b = udiv(g, *bk, hkv);
	*hk = urem(g, *bk, hkv);
	*j1 = umin(g, add(g, *j0, ci(g, br)), Tk);
}

/* The dk/dv passes' walk: the query blocks of bq rows of the group's
 * heads (of kv head hk of batch b) that see keys [j0, j1). */
static walk query_walk(gk *G, const cg_tile *tq, const cg_tile *tdo, fz_dtype dt, V b, V hk,
		       V j0, V j1)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	walk Wq = {{tq, tdo}, {G->sq, G->sdo}, {G->D, G->DV}, dt, NULL, NULL, cg_ext(g, A->tq),
		   G->bc, G->stages, NULL,
		   add(g, mul(g, b, cg_ext(g, A->hq)), mul(g, hk, ci(g, A->group))), NULL};
	V qlo, qhi, nqb;
	cg_attn_query_range(g, A, j0, j1, &qlo, &qhi);
	blocks_of(g, qlo, qhi, G->bc, &Wq.first, &nqb);
	Wq.per = nqb;
	Wq.n = mul(g, nqb, ci(g, A->group));
	return Wq;
}

/* lse and di of the bq query rows i0 .. of flattened head bh into tile
 * memory at o_lse and o_di (4 bytes a row), FZ_TILE_BLOCK / bq threads a
 * row. */
static void stage_lse_di(gk *G, V i0, V bh, int bq, int o_lse, int o_di)
{
	cg *g = G->g;
	V Tq = cg_ext(g, G->A->tq);
	int parts = FZ_TILE_BLOCK / bq;
	V tid = zext_or_trunc(g, cg_tid(g), t_i32(g));
	V q = lshr(g, tid, c_i32(g, __builtin_ctz((unsigned)parts)));
	V part = and_(g, tid, c_i32(g, parts - 1));
	V i = umin(g, add(g, i0, ix(g, q)), sub(g, Tq, ci(g, 1)));
	V row = add(g, mul(g, bh, Tq), i);
	V di = row_di(G, row, part, parts);
	LLVMBasicBlockRef j = when(g, icmp(g, LLVMIntEQ, part, c_i32(g, 0)));
	V qo = shl(g, q, c_i32(g, 2));
	store(g, get_global(g, G->slse, FZ_F32, row),
	      cg_tile_ptr(g, add(g, qo, c_i32(g, o_lse)), 4, true), 4);
	store(g, di, cg_tile_ptr(g, add(g, qo, c_i32(g, o_di)), 4, true), 4);
	end_when(g, j);
}

static void kernel_dq(gk *G)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	int D = G->D, DV = G->DV, BC = G->bc, ST = G->stages;
	int next = 0;
	cg_tile tq = cg_tile_make(&next, BR, D, 1), tdo = cg_tile_make(&next, BR, DV, 1);
	cg_tile tk = cg_tile_make(&next, BC, D, ST), tv = cg_tile_make(&next, BC, DV, ST);
	cg_tile_alloc(g, next);
	V Tq = cg_ext(g, A->tq);
	V S = slots(g, BC / 2), dP = slots(g, BC / 2), dQ = slots(g, D / 2);
	V LSE = slots(g, 2), DI = slots(g, 2);
	cg_loop W;
	qblock Q;
	query_blocks(G, &W, BR, &Q);
	V bh = Q.bh, b = Q.b, h = Q.h, i0 = Q.i0;
	V rowbase = add(g, mul(g, bh, Tq), i0);
	cg_tile_fetch(g, &tq, NULL, G->sq, G->dt, mul(g, rowbase, ci(g, D)), ci(g, D),
		      sub(g, Tq, i0), ci(g, D));
	cg_tile_fetch(g, &tdo, NULL, G->sdo, G->dt, mul(g, rowbase, ci(g, DV)), ci(g, DV),
		      sub(g, Tq, i0), ci(g, DV));
	walk Wk = key_walk(G, &Q, &tk, &tv, G->dt);
	V r0 = mul(g, G->warp, c_i32(g, 16));
	V rows[2];
	for (int hr = 0; hr < 2; hr++) {
		V i = add(g, i0, ix(g, frag_row(G, r0, hr)));
		rows[hr] = umin(g, i, sub(g, Tq, ci(g, 1)));
		V row = add(g, mul(g, bh, Tq), rows[hr]);
		put(g, LSE, hr, get_global(g, G->slse, FZ_F32, row));
		put(g, DI, hr, row_di(G, row, G->qt, 4));
	}
	fill(g, dQ, D / 2, 0.0);
	cg_loop K;
	V st = walk_begin(G, &Wk, &K);
	walk_ready(G, &Wk);
	V j0 = add(g, Wk.first, mul(g, K.iv, ci(g, BC)));
	fill(g, S, BC / 2, 0.0);
	fill(g, dP, BC / 2, 0.0);
	warp_mma(G, 1, &tq, NULL, r0, NULL, &tk, st, D, BC, false, S);
	warp_mma(G, 1, &tdo, NULL, r0, NULL, &tv, st, DV, BC, false, dP);
	LLVMBasicBlockRef edge = NULL, join = NULL;
	if (plain_scores(A)) {
		/* a block every row sees whole: ds = p (dp - di) scale */
		V j1 = add(g, j0, ci(g, BC));
		whole_or_edge(g, cg_attn_block_whole(g, A, i0, Q.i1, j0, j1), &edge, &join);
		V k = c_f32(g, A->scale);
		for (int hr = 0; hr < 2; hr++)
			for (int n = 0; n < BC / 8; n++)
				for (int e = 0; e < 2; e++) {
					int c = 4 * n + 2 * hr + e;
					V p = fexp_mma(g, get(g, S, c), get(g, LSE, hr), A->scale);
					V dp = fsub(g, get(g, dP, c), get(g, DI, hr));
					put(g, S, c, fmul(g, fmul(g, p, dp), k));
				}
		whole_end(g, edge, join);
	}
	for (int hr = 0; hr < 2; hr++)
		for (int n = 0; n < BC / 8; n++) {
			int c0 = 4 * n + 2 * hr;
			V s[2] = {get(g, S, c0), get(g, S, c0 + 1)}, lg[2], dl[2];
			V jj = add(g, j0, frag_col(G, n, 0));
			cg_attn_scores(g, A, b, h, rows[hr], cg_ix_of(jj, 2), 2, s, lg, dl);
			for (int e = 0; e < 2; e++) {
				V p, ds;
				grad_elem(g, true, lg[e], dl[e], get(g, LSE, hr), get(g, dP, c0 + e),
					  get(g, DI, hr), NULL, &p, &ds);
				put(g, S, c0 + e, ds);
			}
		}
	edge_end(g, join);
	V da[64 / 16 * 4];
	c_to_a(G, S, BC, da);
	warp_mma(G, 1, NULL, NULL, NULL, da, &tk, st, BC, D, true, dQ);
	walk_end(G, &K);
	for (int hr = 0; hr < 2; hr++) {
		V i = add(g, i0, ix(g, frag_row(G, r0, hr)));
		LLVMBasicBlockRef j = when(g, icmp(g, LLVMIntULT, i, Tq));
		store_half(G, dQ, D, hr, g->r->n_in + A->out_dq,
			   mul(g, add(g, mul(g, bh, Tq), i), ci(g, D)), NULL);
		end_when(g, j);
	}
	cg_barrier(g);
	cg_loop_end(g, &W);
}

static void kernel_dkv(gk *G)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	int D = G->D, DV = G->DV, BQ = G->bc, ST = G->stages;
	int next = 0;
	cg_tile tk = cg_tile_make(&next, BR, D, 1), tv = cg_tile_make(&next, BR, DV, 1);
	cg_tile tq = cg_tile_make(&next, BQ, D, ST), tdo = cg_tile_make(&next, BQ, DV, ST);
	int o_lse = next, o_di = next + BQ * 4;
	cg_tile_alloc(g, next + BQ * 8);
	V hq = cg_ext(g, A->hq), Tq = cg_ext(g, A->tq), Tk = cg_ext(g, A->tk);
	V S = slots(g, BQ / 2), dP = slots(g, BQ / 2), dK = slots(g, D / 2), dV = slots(g, DV / 2);
	cg_loop W;
	V bk, b, hk, j0, j1;
	key_blocks(G, &W, BR, &bk, &b, &hk, &j0, &j1);
	V kbase = mul(g, add(g, mul(g, bk, Tk), j0), ci(g, D));
	V vbase = mul(g, add(g, mul(g, bk, Tk), j0), ci(g, DV));
	cg_tile_fetch(g, &tk, NULL, G->sk, G->dt, kbase, ci(g, D), sub(g, Tk, j0), ci(g, D));
	cg_tile_fetch(g, &tv, NULL, G->sv, G->dt, vbase, ci(g, DV), sub(g, Tk, j0), ci(g, DV));
	walk Wq = query_walk(G, &tq, &tdo, G->dt, b, hk, j0, j1);
	fill(g, dK, D / 2, 0.0);
	fill(g, dV, DV / 2, 0.0);
	V r0 = mul(g, G->warp, c_i32(g, 16));
	cg_loop N;
	V st = walk_begin(G, &Wq, &N), i0, grow;
	walk_rows(G, &Wq, N.iv, &i0, &grow);
	V bh = udiv(g, sub(g, grow, i0), Tq), h = urem(g, bh, hq);
	stage_lse_di(G, i0, bh, BQ, o_lse, o_di);
	walk_ready(G, &Wq);
	fill(g, S, BQ / 2, 0.0);
	fill(g, dP, BQ / 2, 0.0);
	warp_mma(G, 1, &tk, NULL, r0, NULL, &tq, st, D, BQ, false, S);
	warp_mma(G, 1, &tv, NULL, r0, NULL, &tdo, st, DV, BQ, false, dP);
	LLVMBasicBlockRef edge = NULL, join = NULL;
	if (plain_scores(A)) {
		/* a block every pair of which is seen, no query past Tq: p and
		 * ds = p (dp - di) scale from the raw scores */
		V i1 = add(g, i0, ci(g, BQ));
		V whole = and_(g, icmp(g, LLVMIntULE, i1, Tq),
			       cg_attn_block_whole(g, A, i0, i1, j0, add(g, j0, ci(g, BR))));
		whole_or_edge(g, whole, &edge, &join);
		V k = c_f32(g, A->scale);
		for (int n = 0; n < BQ / 8; n++)
			for (int e = 0; e < 2; e++) {
				V qo = shl(g, i32(g, frag_col(G, n, e)), c_i32(g, 2));
				V lse = load(g, t_f32(g), cg_tile_ptr(g, add(g, qo, c_i32(g, o_lse)), 4,
								    false), 4);
				V di = load(g, t_f32(g), cg_tile_ptr(g, add(g, qo, c_i32(g, o_di)), 4,
								   false), 4);
				for (int hr = 0; hr < 2; hr++) {
					int c = 4 * n + 2 * hr + e;
					V p = fexp_mma(g, get(g, S, c), lse, A->scale);
					put(g, S, c, p);
					put(g, dP, c, fmul(g, fmul(g, p, fsub(g, get(g, dP, c), di)), k));
				}
			}
		whole_end(g, edge, join);
	}
	for (int hr = 0; hr < 2; hr++) {
		V j = add(g, j0, ix(g, frag_row(G, r0, hr)));
		V jc = umin(g, j, sub(g, Tk, ci(g, 1)));
		for (int n = 0; n < BQ / 8; n++)
			for (int e = 0; e < 2; e++) {
				int c = 4 * n + 2 * hr + e;
				V i = add(g, i0, frag_col(G, n, e)), qi = i32(g, frag_col(G, n, e));
				V past = icmp(g, LLVMIntUGE, i, Tq);
				V ic = umin(g, i, sub(g, Tq, ci(g, 1)));
				V s = get(g, S, c), lg, dl;
				cg_attn_scores(g, A, b, h, ic, cg_ix_of(jc, 1), 1, &s, &lg, &dl);
				V qo = shl(g, qi, c_i32(g, 2));
				V lse = load(g, t_f32(g), cg_tile_ptr(g, add(g, qo, c_i32(g, o_lse)), 4,
								    false), 4);
				V di = load(g, t_f32(g), cg_tile_ptr(g, add(g, qo, c_i32(g, o_di)), 4,
								   false), 4);
				V p, ds;
				grad_elem(g, true, lg, dl, lse, get(g, dP, c), di, past, &p, &ds);
				put(g, S, c, p);
				put(g, dP, c, ds);
			}
	}
	edge_end(g, join);
	V pa[64 / 16 * 4];
	c_to_a(G, S, BQ, pa);
	warp_mma(G, 1, NULL, NULL, NULL, pa, &tdo, st, BQ, DV, true, dV);
	c_to_a(G, dP, BQ, pa);
	warp_mma(G, 1, NULL, NULL, NULL, pa, &tq, st, BQ, D, true, dK);
	walk_end(G, &N);
	for (int hr = 0; hr < 2; hr++) {
		V jr = ix(g, frag_row(G, r0, hr));
		LLVMBasicBlockRef j = when(g, icmp(g, LLVMIntULT, add(g, j0, jr), Tk));
		if (A->out_dk >= 0)
			store_half(G, dK, D, hr, g->r->n_in + A->out_dk,
				   add(g, kbase, mul(g, jr, ci(g, D))), NULL);
		if (A->out_dv >= 0)
			store_half(G, dV, DV, hr, g->r->n_in + A->out_dv,
				   add(g, vbase, mul(g, jr, ci(g, DV))), NULL);
		end_when(g, j);
	}
	cg_barrier(g);
	cg_loop_end(g, &W);
}

/* ---- backward, f32: plain FMA ----------------------------------------------------
 * As the f32 forward: 32 rows per block, a quad of lanes per row, lane t
 * holding the row's 16-byte chunks t, t + 4, ... in registers and the
 * walked side's tiles in tile memory. The dq pass owns 32 query rows (q,
 * do and the dq sums in registers) and walks the keys, 8 at a time
 * through cg_attn_scores; the dk/dv pass owns 32 keys (k, v, dk and dv)
 * and walks the query rows of the group's heads, their lse and di in tile
 * memory as in the tensor cores' pass. */

/* The quad's dot of registers x (n wide) with row r of f32 tile t. */
static V quad_dot(gk *G, V x, const cg_tile *t, V st, V r, int n)
{
	cg *g = G->g;
	V part = c_f32(g, 0.0);
	for (int m = 0; m < n / 16; m++) {
		V y[4];
		chunk4(g, t, st, r, add(g, c_i32(g, 4 * m), G->qt), y);
		for (int e = 0; e < 4; e++)
			part = fadd(g, part, fmul(g, get(g, x, 4 * m + e), y[e]));
	}
	return quad_sum(g, part);
}

/* acc += f times row r of f32 tile t (n wide). */
static void quad_axpy(gk *G, V acc, V f, const cg_tile *t, V st, V r, int n)
{
	cg *g = G->g;
	for (int m = 0; m < n / 16; m++) {
		V y[4];
		chunk4(g, t, st, r, add(g, c_i32(g, 4 * m), G->qt), y);
		for (int e = 0; e < 4; e++)
			put(g, acc, 4 * m + e, fadd(g, get(g, acc, 4 * m + e), fmul(g, f, y[e])));
	}
}

#define DQ_KEYS 2 /* keys per cg_attn_scores in the dq pass (4: 255 registers at D = 128) */

static void kernel_dq_f32(gk *G)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	int D = G->D, DV = G->DV, BC = G->bc, ST = G->stages;
	int next = 0;
	cg_tile tk = cg_tile_make(&next, BC, 2 * D, ST), tv = cg_tile_make(&next, BC, 2 * DV, ST);
	cg_tile_alloc(g, next);
	V Tq = cg_ext(g, A->tq);
	V Q = slots(g, D / 4), dO = slots(g, DV / 4), dQ = slots(g, D / 4);
	cg_loop W;
	qblock QB;
	query_blocks(G, &W, BR32, &QB);
	V bh = QB.bh, b = QB.b, h = QB.h, i0 = QB.i0;
	V tid = zext_or_trunc(g, cg_tid(g), t_i32(g));
	V i = add(g, i0, ix(g, lshr(g, tid, c_i32(g, 2))));
	V ic = umin(g, i, sub(g, Tq, ci(g, 1)));
	V row = add(g, mul(g, bh, Tq), ic);
	row_chunks(G, G->sq, row, D, Q);
	row_chunks(G, G->sdo, row, DV, dO);
	V lse = get_global(g, G->slse, FZ_F32, row), di = row_di(G, row, G->qt, 4);
	walk Wk = key_walk(G, &QB, &tk, &tv, FZ_F32);
	fill(g, dQ, D / 4, 0.0);
	cg_loop K;
	V st = walk_begin(G, &Wk, &K);
	walk_ready(G, &Wk);
	V j0 = add(g, Wk.first, mul(g, K.iv, ci(g, BC)));
	cg_loop J; /* a loop, not unrolled: registers for DQ_KEYS keys at a time */
	cg_loop_begin(g, &J, ci(g, 0), ci(g, BC), ci(g, DQ_KEYS));
	V j = i32(g, J.iv);
	V s[DQ_KEYS], dp[DQ_KEYS], lg[DQ_KEYS], dl[DQ_KEYS];
	for (int e = 0; e < DQ_KEYS; e++) {
		s[e] = quad_dot(G, Q, &tk, st, add(g, j, c_i32(g, e)), D);
		dp[e] = quad_dot(G, dO, &tv, st, add(g, j, c_i32(g, e)), DV);
	}
	cg_attn_scores(g, A, b, h, ic, cg_ix_of(add(g, j0, J.iv), DQ_KEYS), DQ_KEYS, s, lg, dl);
	for (int e = 0; e < DQ_KEYS; e++) {
		V p, ds;
		grad_elem(g, false, lg[e], dl[e], lse, dp[e], di, NULL, &p, &ds);
		quad_axpy(G, dQ, ds, &tk, st, add(g, j, c_i32(g, e)), D);
	}
	cg_loop_end(g, &J);
	walk_end(G, &K);
	LLVMBasicBlockRef jr = when(g, icmp(g, LLVMIntULT, i, Tq));
	store_chunks(G, g->r->n_in + A->out_dq, add(g, mul(g, bh, Tq), i), D, dQ);
	end_when(g, jr);
	cg_barrier(g);
	cg_loop_end(g, &W);
}

static void kernel_dkv_f32(gk *G)
{
	cg *g = G->g;
	const fz_attn *A = G->A;
	int D = G->D, DV = G->DV, BQ = G->bc, ST = G->stages;
	int next = 0;
	cg_tile tq = cg_tile_make(&next, BQ, 2 * D, ST), tdo = cg_tile_make(&next, BQ, 2 * DV, ST);
	int o_lse = next, o_di = next + BQ * 4;
	cg_tile_alloc(g, next + BQ * 8);
	V hq = cg_ext(g, A->hq), Tq = cg_ext(g, A->tq), Tk = cg_ext(g, A->tk);
	V Kr = slots(g, D / 4), Vr = slots(g, DV / 4), dK = slots(g, D / 4), dV = slots(g, DV / 4);
	cg_loop W;
	V bk, b, hk, j0, j1;
	key_blocks(G, &W, BR32, &bk, &b, &hk, &j0, &j1);
	V tid = zext_or_trunc(g, cg_tid(g), t_i32(g));
	V j = add(g, j0, ix(g, lshr(g, tid, c_i32(g, 2))));
	V jc = umin(g, j, sub(g, Tk, ci(g, 1)));
	V krow = add(g, mul(g, bk, Tk), jc);
	row_chunks(G, G->sk, krow, D, Kr);
	row_chunks(G, G->sv, krow, DV, Vr);
	walk Wq = query_walk(G, &tq, &tdo, FZ_F32, b, hk, j0, j1);
	fill(g, dK, D / 4, 0.0);
	fill(g, dV, DV / 4, 0.0);
	cg_loop N;
	V st = walk_begin(G, &Wq, &N), i0, grow;
	walk_rows(G, &Wq, N.iv, &i0, &grow);
	V bh = udiv(g, sub(g, grow, i0), Tq), h = urem(g, bh, hq);
	stage_lse_di(G, i0, bh, BQ, o_lse, o_di);
	walk_ready(G, &Wq);
	cg_loop R; /* the block's query rows, a loop (registers for one row) */
	cg_loop_begin(g, &R, ci(g, 0), ci(g, BQ), ci(g, 1));
	{
		V q = i32(g, R.iv), qo = shl(g, q, c_i32(g, 2));
		V s = quad_dot(G, Kr, &tq, st, q, D);
		V dp = quad_dot(G, Vr, &tdo, st, q, DV);
		V i = add(g, i0, R.iv);
		V past = icmp(g, LLVMIntUGE, i, Tq);
		V ic = umin(g, i, sub(g, Tq, ci(g, 1)));
		V lg, dl, p, ds;
		cg_attn_scores(g, A, b, h, ic, cg_ix_of(jc, 1), 1, &s, &lg, &dl);
		V lse = load(g, t_f32(g), cg_tile_ptr(g, add(g, qo, c_i32(g, o_lse)), 4, false), 4);
		V di = load(g, t_f32(g), cg_tile_ptr(g, add(g, qo, c_i32(g, o_di)), 4, false), 4);
		grad_elem(g, false, lg, dl, lse, dp, di, past, &p, &ds);
		quad_axpy(G, dV, p, &tdo, st, q, DV);
		quad_axpy(G, dK, ds, &tq, st, q, D);
	}
	cg_loop_end(g, &R);
	walk_end(G, &N);
	LLVMBasicBlockRef jr = when(g, icmp(g, LLVMIntULT, j, Tk));
	V orow = add(g, mul(g, bk, Tk), j);
	if (A->out_dk >= 0)
		store_chunks(G, g->r->n_in + A->out_dk, orow, D, dK);
	if (A->out_dv >= 0)
		store_chunks(G, g->r->n_in + A->out_dv, orow, DV, dV);
	end_when(g, jr);
	cg_barrier(g);
	cg_loop_end(g, &W);
}

/* ---- entry ---------------------------------------------------------------------- */

void cg_attention_gpu(cg *g, const fz_attn *A)
{
	bool f32 = A->dtype == FZ_F32;
	if (A->dtype != FZ_BF16 && A->dtype != FZ_F16 && !f32) {
		cg_fail(g, FZ_EUNSUPPORTED, A->first, "the GPU attention kernels take bf16 "
			"and f16 (tensor cores) and f32 (FMA); here %s", fz_dtype_name(A->dtype));
		return;
	}
	if (A->d % 16 || A->dv % 16 || A->d > 256 || A->dv > 256) {
		cg_fail(g, FZ_EUNSUPPORTED, A->first, "the GPU attention kernels take head "
			"dims that are multiples of 16 up to 256 (here %lld and %lld)",
			(long long)A->d, (long long)A->dv);
		return;
	}
	gk G = {g, A, A->dtype, (int)A->d, (int)A->dv, 0, 0, 1, A->in_q, A->in_k, A->in_v,
		-1, -1, -1, NULL, NULL, NULL, NULL};
	int n_in = g->r->n_in, ok = 0;
	fz_kernel *k = g->k;
	k->sk = FZ_SK_TILE;
	k->vec = f32 ? BR32 : BR;
	k->n_work[0] = 2;
	fz_ext w;
	switch (A->pass) {
	case FZ_ATTN_FWD:
		G.so = A->out_o >= 0 ? n_in + A->out_o : -1;
		G.slse = A->out_lse >= 0 ? n_in + A->out_lse : -1;
		if (f32) {
			ok = plan_f32(G.D, G.DV, 0, &G.bc, &G.stages);
		} else {
			/* two row tiles a warp (128 rows a block) at head dims up
			 * to 64 with no mask operand nor a decomposed form's
			 * logits: there the scores and O of both, 2 (BC + DV) / 2
			 * floats a lane, leave the registers room (ptxas: 247 of
			 * 255 at 64, causal; a mask's addresses spill); one tile
			 * otherwise */
			G.mt = G.D <= 64 && G.DV <= 64 && !A->mask && !A->decomposed ? 2 : 1;
			ok = plan(BR * G.mt * row_bytes(G.D), row_bytes(G.D) + row_bytes(G.DV),
				  &G.bc, &G.stages);
			k->vec = BR * G.mt;
		}
		k->work[0][0] = A->tq;
		ok = ok && fz_ext_mul(A->batch, A->hq, &w);
		break;
	case FZ_ATTN_DQ:
		G.so = A->in_o;
		G.slse = A->in_lse;
		G.sdo = A->in_do;
		if (f32)
			ok = plan_f32(G.D, G.DV, 0, &G.bc, &G.stages);
		else
			ok = plan(BR * (row_bytes(G.D) + row_bytes(G.DV)), row_bytes(G.D) +
				  row_bytes(G.DV), &G.bc, &G.stages);
		k->work[0][0] = A->tq;
		ok = ok && fz_ext_mul(A->batch, A->hq, &w);
		break;
	case FZ_ATTN_DKV:
		G.so = A->in_o;
		G.slse = A->in_lse;
		G.sdo = A->in_do;
		/* and 8 bytes of lse and di per query row */
		if (f32)
			ok = plan_f32(G.D, G.DV, 8, &G.bc, &G.stages);
		else
			ok = plan(BR * (row_bytes(G.D) + row_bytes(G.DV)), row_bytes(G.D) +
				  row_bytes(G.DV) + 8, &G.bc, &G.stages);
		k->work[0][0] = A->tk;
		ok = ok && fz_ext_mul(A->batch, A->hkv, &w);
		break;
	case FZ_ATTN_BWD: /* the host's alone: cg_attention turns it away */
		break;
	}
	if (!ok) {
		cg_fail(g, FZ_EUNSUPPORTED, A->first, "attention's tiles at head dims %lld "
			"and %lld do not fit %d bytes of shared memory", (long long)A->d,
			(long long)A->dv, FZ_TILE_DYN_MAX);
		return;
	}
	k->work[0][1] = w;
	cg_function_begin(g, k->names[0]);
	if (g->st != FZ_OK)
		return;
	G.warp = cg_warp(g);
	G.lane = cg_lane(g);
	G.qg = lshr(g, G.lane, c_i32(g, 2));
	G.qt = and_(g, G.lane, c_i32(g, 3));
	switch (A->pass) {
	case FZ_ATTN_FWD: f32 ? kernel_fwd_f32(&G) : kernel_fwd(&G); break;
	case FZ_ATTN_DQ: f32 ? kernel_dq_f32(&G) : kernel_dq(&G); break;
	case FZ_ATTN_DKV: f32 ? kernel_dkv_f32(&G) : kernel_dkv(&G); break;
	case FZ_ATTN_BWD: break;
	}
	cg_function_end(g);
}
