/*
 * mma.c: the tensor cores' warp-level operations, for the kernels that
 * multiply tiles of matrices (attention, attention_nvptx.c), and on EMU
 * their emulation through the thread's context.
 *
 * Three PTX instructions do the work of a tile product on sm_80 and later:
 *
 *   cp.async     global memory to shared memory, 16 bytes per thread, in
 *                the background: a thread issues copies, closes them into a
 *                group (commit_group), and waits until at most n groups are
 *                still in flight (wait_group n). Two stages of a tile then
 *                overlap: copy block k+1 while the warps multiply block k.
 *   ldmatrix     a warp reads up to four 8 x 8 matrices of 16-bit elements
 *                from shared memory, each lane naming one 16-byte row, and
 *                each lane gets the two elements of each matrix the tensor
 *                core wants in its register (with .trans, transposed).
 *   mma.sync     m16n8k16: D (16 x 8, f32) = A (16 x 16) B (16 x 8) + C,
 *                bf16 or f16 operands, spread over the 32 lanes.
 *
 * The fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"),
 * with g = lane / 4 and t = lane % 4, each register two 16-bit elements,
 * the lower index in the low half:
 *
 *   A  a0: row g,     cols 2t, 2t+1      a1: row g+8, cols 2t, 2t+1
 *      a2: row g,     cols 2t+8, 2t+9    a3: row g+8, cols 2t+8, 2t+9
 *   B  b0: rows 2t, 2t+1 of col g        b1: rows 2t+8, 2t+9 of col g
 *   C  c0, c1: row g, cols 2t, 2t+1      c2, c3: row g+8, cols 2t, 2t+1
 *   ldmatrix: matrix m's rows come from lanes 8m .. 8m+7; lane l gets row
 *      l / 4, cols 2(l % 4), +1 of each matrix (.trans: col l / 4, rows
 *      2(l % 4), +1).
 *
 * So an ldmatrix.x4 of a row-major tile at rows r0 + (l % 16), column k0 +
 * 8 (l / 16) is exactly an A fragment, a non-transposed one of a tile
 * stored [n][k] two B fragments, a transposed one of a tile stored [k][n]
 * two B fragments; and the C fragments of a row of n-tiles, rounded to
 * 16 bits in pairs, are the A fragments of the next product (the
 * probabilities of attention never leave the registers).
 *
 * Tile memory is one shared array per kernel: static shared memory up to
 * 48 KiB (FZ_TILE_STATIC_MAX), so that a launch needs no dynamic size; a
 * kernel whose tiles need more (attention's backward at head dims over
 * 128) declares it extern, dynamic shared memory of k->smem bytes, up to
 * FZ_TILE_DYN_MAX (codegen.h). Tiles in it are laid out by
 * cg_tile_make: rows of 16-byte chunks, swizzled (chunk ^ row % 8) where a
 * row has a multiple of 8 chunks, else padded to an odd number of chunks,
 * so that the 8 rows of an ldmatrix hit 8 distinct groups of banks.
 *
 * EMU. The kernel calls the thread's context (fz_emu_thread, codegen.h):
 * tile() for a plain access, ldmatrix() and mma() with the lane's
 * registers in memory (the whole warp meets in runtime/emu_sched.c, which
 * moves the elements between lanes by the layouts above, and says which
 * lane never came), cp_async() and cp_group() (the copy lands in shared
 * memory at the wait_group that retires it, and a read of its bytes before
 * that is a violation). Seeded faults: FZ_EMU_FAULT_MMA has lane 31 skip
 * every mma.sync, FZ_EMU_FAULT_CPWAIT drops every wait_group.
 */
#include <llvm-c/Analysis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "llvm.h"

static bool emu(const cg *g) { return g->o.target == FZ_CG_EMU; }

/* ---- tile memory ------------------------------------------------------------------- */

void cg_tile_alloc(cg *g, int bytes)
{
	if (bytes <= 0 || bytes > FZ_TILE_DYN_MAX) {
		cg_fail(g, FZ_EUNSUPPORTED, NULL, "%d bytes of tile memory (at most %d)", bytes,
			FZ_TILE_DYN_MAX);
		bytes = 16;
	}
	bool dyn = bytes > FZ_TILE_STATIC_MAX;
	g->tile_bytes = bytes;
	g->k->smem = dyn ? bytes : 0;
	if (g->o.target != FZ_CG_NVPTX)
		return;
	/* dynamic: .extern .shared .b8 fz_tile[], sized by the launch */
	T at = t_arr(t_i8(g), dyn ? 0 : (unsigned)bytes);
	g->tile = LLVMAddGlobalInAddressSpace(g->mod, at, "fz_tile", 3);
	if (!dyn) {
		LLVMSetInitializer(g->tile, c_undef(at));
		LLVMSetLinkage(g->tile, LLVMInternalLinkage);
	}
	LLVMSetAlignment(g->tile, dyn ? 16 : 128);
}

/* NVPTX: the shared address of byte off. */
static V tile_addr(cg *g, V off)
{
	if (g->tile_bytes > FZ_TILE_STATIC_MAX)
		return LLVMBuildInBoundsGEP2(g->b, t_i8(g), g->tile, &off, 1, "");
	V idx[2] = {c_i32(g, 0), off};
	return LLVMBuildInBoundsGEP2(g->b, t_arr(t_i8(g), (unsigned)g->tile_bytes), g->tile,
				     idx, 2, "");
}

LLVMValueRef cg_tile_ptr(cg *g, V off, int bytes, bool store)
{
	if (!emu(g))
		return tile_addr(g, off);
	T ps[5] = {t_i64(g), t_i32(g), t_i32(g), t_i32(g), t_i32(g)};
	V args[5] = {zext(g, off, t_i64(g)), c_i32(g, bytes), c_i32(g, store),
		     c_i32(g, g->tile_bytes), c_i32(g, g->emu_site++)};
	return cg_emu_call(g, CG_EMU_TILE, t_ptr(g, 0), ps, args, 5);
}

LLVMValueRef cg_lane(cg *g)
{
	return and_(g, zext_or_trunc(g, cg_tid(g), t_i32(g)), c_i32(g, 31));
}

LLVMValueRef cg_warp(cg *g)
{
	return lshr(g, zext_or_trunc(g, cg_tid(g), t_i32(g)), c_i32(g, 5));
}

/* ---- the three instructions ------------------------------------------------------------ */

void cg_ldmatrix(cg *g, int n, bool trans, V off, V *out)
{
	if (!emu(g)) {
		V r = nv_ldmatrix(g, n, trans, tile_addr(g, off));
		for (int i = 0; i < n; i++)
			out[i] = n == 1 ? r : extract_value(g, r, (unsigned)i);
		return;
	}
	V regs = cg_entry_alloca(g, t_arr(t_i32(g), 4));
	T ps[5] = {t_i64(g), t_i32(g), t_i32(g), t_ptr(g, 0), t_i32(g)};
	V args[5] = {zext(g, off, t_i64(g)), c_i32(g, n | (trans ? 16 : 0)),
		     c_i32(g, g->tile_bytes), regs, c_i32(g, g->emu_site++)};
	cg_emu_call(g, CG_EMU_LDMATRIX, t_void(g), ps, args, 5);
	for (int i = 0; i < n; i++)
		out[i] = load(g, t_i32(g), gep(g, t_i32(g), regs, c_i32(g, i)), 4);
}

void cg_mma(cg *g, fz_dtype d, V *a, V *b, V *c, V *out)
{
	bool bf16 = d == FZ_BF16;
	if (!emu(g)) {
		V A[4], B[2];
		T h2 = t_vec(t_f16(g), 2);
		for (int i = 0; i < 4; i++)
			A[i] = bf16 ? a[i] : bitcast(g, a[i], h2);
		for (int i = 0; i < 2; i++)
			B[i] = bf16 ? b[i] : bitcast(g, b[i], h2);
		V r = nv_mma_m16n8k16(g, bf16, A, B, c);
		for (int i = 0; i < 4; i++)
			out[i] = extract_value(g, r, (unsigned)i);
		return;
	}
	/* the lane's registers in memory: a[4] b[2] as i32, c[4] d[4] as f32 */
	V ab = cg_entry_alloca(g, t_arr(t_i32(g), 6));
	V cd = cg_entry_alloca(g, t_arr(t_f32(g), 8));
	for (int i = 0; i < 4; i++)
		store(g, a[i], gep(g, t_i32(g), ab, c_i32(g, i)), 4);
	for (int i = 0; i < 2; i++)
		store(g, b[i], gep(g, t_i32(g), ab, c_i32(g, 4 + i)), 4);
	for (int i = 0; i < 4; i++)
		store(g, c[i], gep(g, t_f32(g), cd, c_i32(g, i)), 4);
	T ps[6] = {t_i32(g), t_ptr(g, 0), t_ptr(g, 0), t_ptr(g, 0), t_ptr(g, 0), t_i32(g)};
	V args[6] = {c_i32(g, bf16 ? 0 : 1), ab, gep(g, t_i32(g), ab, c_i32(g, 4)), cd,
		     gep(g, t_f32(g), cd, c_i32(g, 4)), c_i32(g, g->emu_site++)};
	if (g->o.emu_fault == FZ_EMU_FAULT_MMA) {
		/* the seeded fault: lane 31 of each warp skips it (d = c) */
		for (int i = 0; i < 4; i++)
			store(g, c[i], gep(g, t_f32(g), cd, c_i32(g, 4 + i)), 4);
		LLVMBasicBlockRef call = block(g, "mma"), cont = block(g, "mma.done");
		cond_br(g, icmp(g, LLVMIntEQ, cg_lane(g), c_i32(g, 31)), cont, call);
		at_end(g, call);
		cg_emu_call(g, CG_EMU_MMA, t_void(g), ps, args, 6);
		br(g, cont);
		at_end(g, cont);
	} else {
		cg_emu_call(g, CG_EMU_MMA, t_void(g), ps, args, 6);
	}
	for (int i = 0; i < 4; i++)
		out[i] = load(g, t_f32(g), gep(g, t_f32(g), cd, c_i32(g, 4 + i)), 4);
}

void cg_cp_async(cg *g, V dst, int s, fz_dtype d, V off, V valid)
{
	int n = 16 / (int)fz_dtype_size(d);
	V src = cg_access_ptr(g, s, d, off, n, false, 16);
	V bytes = sel(g, valid, c_i32(g, 16), c_i32(g, 0));
	if (!emu(g)) {
		nv_cp_async16(g, false, tile_addr(g, dst), src, bytes);
		return;
	}
	T ps[5] = {t_i64(g), t_ptr(g, 0), t_i32(g), t_i32(g), t_i32(g)};
	V args[5] = {zext(g, dst, t_i64(g)), src, bytes, c_i32(g, g->tile_bytes),
		     c_i32(g, g->emu_site++)};
	cg_emu_call(g, CG_EMU_CP_ASYNC, t_void(g), ps, args, 5);
}

static void cp_group(cg *g, int n)
{
	T ps[2] = {t_i32(g), t_i32(g)};
	V args[2] = {c_i32(g, n), c_i32(g, g->emu_site++)};
	cg_emu_call(g, CG_EMU_CP_GROUP, t_void(g), ps, args, 2);
}

void cg_cp_commit(cg *g)
{
	if (emu(g))
		cp_group(g, -1);
	else
		nv_cp_async_commit(g);
}

void cg_cp_wait(cg *g, int n)
{
	if (!emu(g))
		nv_cp_async_wait(g, n);
	else if (g->o.emu_fault != FZ_EMU_FAULT_CPWAIT) /* seeded: none */
		cp_group(g, n);
}

/* ---- tiles and fragments ------------------------------------------------------------ */

cg_tile cg_tile_make(int *next, int rows, int cols, int stages)
{
	cg_tile t = {0};
	int chunks = cols / 8;
	t.rows = rows;
	t.cols = cols;
	t.pitch = chunks % 8 == 0 ? chunks : chunks | 1;
	t.stages = stages;
	t.stage_bytes = rows * t.pitch * 16;
	t.off = *next;
	*next += t.stage_bytes * stages;
	return t;
}

LLVMValueRef cg_tile_chunk(cg *g, const cg_tile *t, V st, V r, V ch)
{
	if (t->pitch % 8 == 0)
		ch = xor_(g, ch, and_(g, r, c_i32(g, 7)));
	V o = add(g, mul(g, r, c_i32(g, t->pitch * 16)), shl(g, ch, c_i32(g, 4)));
	o = add(g, o, c_i32(g, t->off));
	return st ? add(g, o, mul(g, st, c_i32(g, t->stage_bytes))) : o;
}

void cg_tile_fetch(cg *g, const cg_tile *t, V st, int s, fz_dtype d, V base, V stride,
		   V rows_valid, V cols_valid)
{
	int cpr = t->cols / 8, total = t->rows * cpr, epc = 16 / (int)fz_dtype_size(d);
	V tid = zext_or_trunc(g, cg_tid(g), t_i32(g));
	T it = g->ity;
	for (int i0 = 0; i0 < total; i0 += FZ_TILE_BLOCK) {
		V c = add(g, tid, c_i32(g, i0));
		LLVMBasicBlockRef body = NULL, cont = NULL;
		if (total - i0 < FZ_TILE_BLOCK) {
			body = block(g, "fetch");
			cont = block(g, "fetch.done");
			cond_br(g, icmp(g, LLVMIntULT, c, c_i32(g, total)), body, cont);
			at_end(g, body);
		}
		V r = udiv(g, c, c_i32(g, cpr)), ch = urem(g, c, c_i32(g, cpr));
		V col = mul(g, ch, c_i32(g, epc));
		V ok = and_(g, icmp(g, LLVMIntULT, zext_or_trunc(g, r, it), rows_valid),
			    icmp(g, LLVMIntULT, zext_or_trunc(g, col, it), cols_valid));
		/* an invalid chunk still names an address inside the buffer: the
		 * tile's first element */
		V rr = zext_or_trunc(g, sel(g, ok, r, c_i32(g, 0)), it);
		V cc = zext_or_trunc(g, sel(g, ok, col, c_i32(g, 0)), it);
		V off = add(g, base, add(g, mul(g, rr, stride), cc));
		cg_cp_async(g, cg_tile_chunk(g, t, st, r, ch), s, d, off, ok);
		if (body) {
			br(g, cont);
			at_end(g, cont);
		}
	}
}

void cg_frag_a(cg *g, const cg_tile *t, V st, V r0, int k0, V *a)
{
	V l = cg_lane(g);
	V r = add(g, r0, and_(g, l, c_i32(g, 15)));
	V ch = add(g, lshr(g, l, c_i32(g, 4)), c_i32(g, k0 / 8));
	cg_ldmatrix(g, 4, false, cg_tile_chunk(g, t, st, r, ch), a);
}

void cg_frag_b2(cg *g, const cg_tile *t, V st, int n0, int k0, bool kn, V *b)
{
	V l = cg_lane(g);
	V lo = and_(g, l, c_i32(g, 7));
	V m8 = and_(g, lshr(g, l, c_i32(g, 3)), c_i32(g, 1)); /* matrix bit 0 */
	V m16 = lshr(g, l, c_i32(g, 4));                      /* matrix bit 1 */
	V r, ch;
	if (!kn) { /* [n][k]: matrices (n0, k0) (n0, k0+8) (n0+8, k0) (n0+8, k0+8) */
		r = add(g, c_i32(g, n0), add(g, lo, shl(g, m16, c_i32(g, 3))));
		ch = add(g, c_i32(g, k0 / 8), m8);
	} else {   /* [k][n], transposed: (k0, n0) (k0+8, n0) (k0, n0+8) (k0+8, n0+8) */
		r = add(g, c_i32(g, k0), add(g, lo, shl(g, m8, c_i32(g, 3))));
		ch = add(g, c_i32(g, n0 / 8), m16);
	}
	cg_ldmatrix(g, 4, kn, cg_tile_chunk(g, t, st, r, ch), b);
}

/* f32 to the 16 bits of d, as every store of d rounds (emit.c) */
static V half_bits(cg *g, fz_dtype d, V x)
{
	V s = cg_to_storage(g, x, d);
	return zext(g, type_of(s) == t_i16(g) ? s : bitcast(g, s, t_i16(g)), t_i32(g));
}

LLVMValueRef cg_pack_half2(cg *g, fz_dtype d, V lo, V hi)
{
	return or_(g, half_bits(g, d, lo), shl(g, half_bits(g, d, hi), c_i32(g, 16)));
}

/* ---- a GEMM tile kernel (the tests' proof of the pieces above) ------------------------ */

enum { GEMM_BM = 64, GEMM_BN = 32, GEMM_BK = 32 };

static void gemm_body(cg *g, const cg_gemm_spec *s)
{
	T it = g->ity;
	int next = 0;
	cg_tile ta = cg_tile_make(&next, GEMM_BM, GEMM_BK, 2);
	cg_tile tb = s->kn ? cg_tile_make(&next, GEMM_BK, GEMM_BN, 2)
			   : cg_tile_make(&next, GEMM_BN, GEMM_BK, 2);
	cg_tile_alloc(g, next);
	int64_t tiles_n = (s->N + GEMM_BN - 1) / GEMM_BN;
	int64_t tiles = (s->M + GEMM_BM - 1) / GEMM_BM * tiles_n, nk = (s->K + GEMM_BK - 1) / GEMM_BK;
	V M = c_int(it, s->M), N = c_int(it, s->N), K = c_int(it, s->K);
	V acc = cg_entry_alloca(g, t_arr(t_f32(g), 16));
	V kbp = cg_entry_alloca(g, it);
	V warp = cg_warp(g), lane = cg_lane(g);
	cg_loop L;
	cg_loop_begin(g, &L, cg_ctaid(g), c_int(it, tiles), cg_nctaid(g));
	V m0 = mul(g, udiv(g, L.iv, c_int(it, tiles_n)), c_int(it, GEMM_BM));
	V n0 = mul(g, urem(g, L.iv, c_int(it, tiles_n)), c_int(it, GEMM_BN));
	for (int i = 0; i < 16; i++)
		store(g, c_f32(g, 0), gep(g, t_f32(g), acc, c_i32(g, i)), 4);
	/* the tiles of k block kb (ity) into stage st (i32) */
#define GEMM_FETCH(kb, st) do { \
		V k0_ = mul(g, kb, c_int(it, GEMM_BK)); \
		cg_tile_fetch(g, &ta, st, 0, s->dtype, add(g, mul(g, m0, K), k0_), K, \
			      sub(g, M, m0), sub(g, K, k0_)); \
		if (s->kn) \
			cg_tile_fetch(g, &tb, st, 1, s->dtype, add(g, mul(g, k0_, N), n0), N, \
				      sub(g, K, k0_), sub(g, N, n0)); \
		else \
			cg_tile_fetch(g, &tb, st, 1, s->dtype, add(g, mul(g, n0, K), k0_), K, \
				      sub(g, N, n0), sub(g, K, k0_)); \
	} while (0)
	GEMM_FETCH(c_int(it, 0), c_i32(g, 0));
	cg_cp_commit(g);
	cg_loop K_;
	cg_loop_begin(g, &K_, c_int(it, 0), c_int(it, nk), c_int(it, 1));
	store(g, K_.iv, kbp, 8);
	V kb = K_.iv, kn1 = add(g, kb, c_int(it, 1));
	V st = zext_or_trunc(g, and_(g, kb, c_int(it, 1)), t_i32(g));
	LLVMBasicBlockRef pre = block(g, "prefetch"), go = block(g, "compute");
	cond_br(g, icmp(g, LLVMIntULT, kn1, c_int(it, nk)), pre, go);
	at_end(g, pre);
	GEMM_FETCH(kn1, xor_(g, st, c_i32(g, 1)));
	br(g, go);
	at_end(g, go);
	cg_cp_commit(g);
	cg_cp_wait(g, 1);
	cg_barrier(g);
	for (int ks = 0; ks < GEMM_BK; ks += 16) {
		V a[4], c[4], d[4];
		cg_frag_a(g, &ta, st, mul(g, warp, c_i32(g, 16)), ks, a);
		for (int p = 0; p < GEMM_BN; p += 16) {
			V b[4];
			cg_frag_b2(g, &tb, st, p, ks, s->kn, b);
			for (int h = 0; h < 2; h++) {
				int j = p / 8 + h;
				for (int i = 0; i < 4; i++)
					c[i] = load(g, t_f32(g), gep(g, t_f32(g), acc, c_i32(g, 4 * j + i)), 4);
				cg_mma(g, s->dtype, a, b + 2 * h, c, d);
				for (int i = 0; i < 4; i++)
					store(g, d[i], gep(g, t_f32(g), acc, c_i32(g, 4 * j + i)), 4);
			}
		}
	}
	cg_barrier(g);
	cg_loop_end(g, &K_);
#undef GEMM_FETCH
	/* C fragments: c0 c1 at row g, cols 2t, 2t+1; c2 c3 at row g + 8 */
	V gr = zext_or_trunc(g, lshr(g, lane, c_i32(g, 2)), it);
	V tc = zext_or_trunc(g, shl(g, and_(g, lane, c_i32(g, 3)), c_i32(g, 1)), it);
	V rbase = add(g, m0, add(g, zext_or_trunc(g, mul(g, warp, c_i32(g, 16)), it), gr));
	for (int j = 0; j < GEMM_BN / 8; j++)
		for (int i = 0; i < 4; i++) {
			V row = add(g, rbase, c_int(it, i >= 2 ? 8 : 0));
			V col = add(g, n0, add(g, tc, c_int(it, 8 * j + (i & 1))));
			V ok = and_(g, icmp(g, LLVMIntULT, row, M), icmp(g, LLVMIntULT, col, N));
			LLVMBasicBlockRef yes = block(g, "st"), no = block(g, "st.done");
			cond_br(g, ok, yes, no);
			at_end(g, yes);
			V v = load(g, t_f32(g), gep(g, t_f32(g), acc, c_i32(g, 4 * j + i)), 4);
			store(g, v, cg_access_ptr(g, 2, FZ_F32, add(g, mul(g, row, N), col), 1, true, 4), 4);
			br(g, no);
			at_end(g, no);
		}
	cg_loop_end(g, &L);
}

fz_status cg_gemm_build(fz_compiler *c, const cg_gemm_spec *s, fz_kernel **out, char **err)
{
	*out = NULL;
	if (err)
		*err = NULL;
	fz_value v[3];
	fz_value *in[2] = {&v[0], &v[1]}, *outv[1] = {&v[2]};
	memset(v, 0, sizeof v);
	int64_t dims[3][2] = {{s->M, s->K}, {s->kn ? s->K : s->N, s->kn ? s->N : s->K},
			      {s->M, s->N}};
	for (int i = 0; i < 3; i++) {
		v[i].id = i;
		v[i].type.dtype = i < 2 ? s->dtype : FZ_F32;
		v[i].type.rank = 2;
		v[i].type.dims[0] = fz_ext_const(dims[i][0]);
		v[i].type.dims[1] = fz_ext_const(dims[i][1]);
	}
	fz_region r = {.id = 0, .n_in = 2, .in = in, .n_out = 1, .out = outv};
	fz_kernel *k = calloc(1, sizeof *k);
	V buf[3], ext[3];
	cg G, *g = &G;
	memset(g, 0, sizeof G);
	if (!k)
		return FZ_ENOMEM;
	if ((s->dtype != FZ_BF16 && s->dtype != FZ_F16) || s->K % 8 || (s->kn && s->N % 8) ||
	    s->M < 1 || s->N < 1 || s->K < 1 || s->M * s->K >= INT32_MAX / 2 ||
	    s->N * s->K >= INT32_MAX / 2 || s->M * s->N >= INT32_MAX / 2) {
		free(k);
		fz_set_err(err, fz_strdup("gemm tile: bf16 or f16, K (and N when kn) a "
					  "multiple of 8, sizes under 2^30"));
		return FZ_EINVAL;
	}
	g->c = c;
	g->ctx = c->ctx;
	g->r = &r;
	g->o = c->o;
	g->k = k;
	g->ity = t_i32(g);
	g->as = c->o.target == FZ_CG_NVPTX ? 1 : 0;
	g->buf = buf;
	g->ext = ext;
	k->region = 0;
	k->n_in = 2;
	k->n_out = 1;
	k->n_entries = 1;
	k->sk = FZ_SK_TILE;
	k->vec = GEMM_BM;
	k->n_work[0] = 2;
	k->work[0][0] = fz_ext_const(s->M);
	k->work[0][1] = fz_ext_const((s->N + GEMM_BN - 1) / GEMM_BN);
	snprintf(k->names[0], sizeof k->names[0], "fz_gemm_tile_%d", c->counter++);
	g->mod = LLVMModuleCreateWithNameInContext("gemm-tile", c->ctx);
	LLVMSetTarget(g->mod, c->triple);
	LLVMSetDataLayout(g->mod, c->layout);
	g->b = LLVMCreateBuilderInContext(c->ctx);
	cg_function_begin(g, k->names[0]);
	if (g->st == FZ_OK)
		gemm_body(g, s);
	cg_function_end(g);
	LLVMDisposeBuilder(g->b);
	char *msg = NULL;
	if (g->st == FZ_OK && LLVMVerifyModule(g->mod, LLVMReturnStatusAction, &msg)) {
		snprintf(g->msg, sizeof g->msg, "gemm tile: LLVM rejects the IR: %.400s",
			 msg ? msg : "?");
		g->st = FZ_ERUNTIME;
	}
	LLVMDisposeMessage(msg);
	free(g->memo);
	free(g->cse);
	if (g->st != FZ_OK) {
		LLVMDisposeModule(g->mod);
		free(k);
		fz_set_err(err, fz_strdup(g->msg));
		return g->st;
	}
	k->mod = g->mod;
	fz_status st = fz_compiler_optimize(c, k, err);
	if (st != FZ_OK)
		fz_kernel_free(k);
	else
		*out = k;
	return st;
}
