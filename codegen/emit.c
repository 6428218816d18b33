/*
 * emit.c: the one emitter of elementwise expressions.
 *
 * cg_value(g, v, nl, ix, out) computes value v of the region at nl lane
 * indices and returns one LLVM value per lane. It walks v's definition:
 *
 *   region input     a load from its buffer (one vector load when the lanes
 *                    are consecutive, one scalar load when they coincide)
 *   elementwise op   its operands at the same indices, then the op per lane
 *   meta op          the operand at a mapped index (broadcast: a stretched
 *                    dim reads index 0; permute: dims swap; slice: start +
 *                    step * i; reshape: matching leading and trailing dims
 *                    map straight through, the middle is linearized and
 *                    split again; cat: each operand at a clamped index, then
 *                    a select; an operand no lane takes, where the indices
 *                    are constants, is not read)
 *   full, iota,      constants, the index itself, Philox4x32-10 of the
 *   uniform          linear index (ir/philox.h is the definition)
 *   take,            the index tensor at the mapped index, checked against
 *   take_along       the extent (a bad one sets the error word and reads
 *                    element 0 instead, or nothing where the extent may be
 *                    0), then the operand at it
 *   a reduction      the row's reduced value, set by the row skeleton, when
 *                    the index is the current row
 *
 * Worked example: layer_norm's tail at lanes (r, jb+0..7) of [16,128,1600]
 * bf16 reads x at offset r*1600 + jb + l: one <8 x i16> load; w at jb + l
 * through broadcast_in_dim (dims=[2]): one <8 x i16> load; the mean at
 * (r, 0) through broadcast: index equals the row, so the row's scalar.
 *
 * Results are memoized per (value, lane indices) while the loop body that
 * made them is open (cg_memo_mark/cg_memo_pop), so a value used twice at one
 * index is computed once, and nothing is reused outside the block that
 * dominates it. Errors are sticky: the first sets g->st and g->msg, later
 * calls return harmless values, and the skeleton gives up at its end.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Target.h>

#include "cg.h"
#include "llvm.h"
#include "numeric.h"

/* ---- errors ------------------------------------------------------------------ */

void cg_fail(cg *g, fz_status st, const fz_node *n, const char *fmt, ...)
{
	if (g->st != FZ_OK)
		return;
	char msg[400], where[96] = "";
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (n && n->line > 0)
		snprintf(where, sizeof where, ", %s at %d:%d", fz_ops[n->op].name,
			 n->line, n->col);
	else if (n)
		snprintf(where, sizeof where, ", %s (node %d)", fz_ops[n->op].name, n->id);
	snprintf(g->msg, sizeof g->msg, "region %d%s: %s", g->r->id, where, msg);
	g->st = st;
}

/* ---- types ------------------------------------------------------------------- */

LLVMTypeRef cg_ctype(cg *g, fz_dtype d)
{
	switch (d) {
	case FZ_F64: return t_f64(g);
	case FZ_F32: case FZ_F16: case FZ_BF16: return t_f32(g);
	case FZ_BOOL: return t_i1(g);
	default: return t_i64(g);
	}
}

LLVMTypeRef cg_stype(cg *g, fz_dtype d)
{
	switch (d) {
	case FZ_F64: return t_f64(g);
	case FZ_F32: return t_f32(g);
	case FZ_F16: return t_f16(g);
	case FZ_BF16: return t_i16(g);
	case FZ_I64: return t_i64(g);
	case FZ_I32: return t_i32(g);
	default: return t_i8(g);
	}
}

/* bf16 <-> f32 on the bits: exact one way, round-to-nearest-even the other,
 * NaN kept quiet. Done in integers so neither target needs a libcall;
 * except on sm_80 and later, where the GPU converts with one instruction
 * (cvt.rn.bf16.f32: round to nearest even, subnormals kept, as the integer
 * form; a NaN becomes a NaN, not necessarily of the integer form's
 * payload) and the conversions are LLVM's fptrunc and fpext to and from
 * bfloat, so that LLVM folds a rounding of a value already rounded
 * (fptrunc of fpext). The integer form is eight instructions a
 * conversion, and a bf16 row kernel rounds every op's result: they were
 * half its PTX.
 *
 * The host with AVX512-BF16 (c->host_bf16) converts with vcvtneps2bf16,
 * LLVM's fptrunc to bfloat there: the integer form's result bit for bit
 * (NaN's quiet bit included) except that it takes a subnormal input for
 * zero. So a lane whose exponent field is 0 (zero or subnormal) gets that
 * field's lowest bit set first, which makes it the normal number whose
 * mantissa bits are the subnormal's: the instruction rounds that mantissa
 * exactly as the integer form rounds the subnormal's, a carry included
 * (0x007fffff: 0x00ffffff -> 0x0100), and taking 0x0080 back off the
 * result's exponent leaves the integer form's answer (zeros too: +-2^-126
 * -> 0x0080 -> 0). Checked against the integer form on all 2^32 inputs.
 * vptestnmd, a masked vpord, vcvtneps2bf16 (two uops) and a masked vpsubw:
 * five uops for 16 lanes where the integer form and its narrowing take
 * ten. */
static bool bf16_native(const cg *g)
{
	return g->o.target == FZ_CG_NVPTX && g->o.sm >= 80;
}

static bool bf16_host_cvt(const cg *g)
{
	return g->o.target == FZ_CG_HOST && g->c && g->c->host_bf16;
}

static V bf16_to_f32(cg *g, V h)
{
	return bitcast(g, shl(g, zext(g, h, t_i32(g)), c_i32(g, 16)), t_f32(g));
}

/* the host's vcvtneps2bf16 with subnormals kept (above): x's bf16 bits */
static V f32_to_bf16_host(cg *g, V x)
{
	V u = bitcast(g, x, t_i32(g));
	V tiny = icmp(g, LLVMIntEQ, and_(g, u, c_i32(g, 0x7f800000)), c_i32(g, 0));
	V xn = bitcast(g, sel(g, tiny, or_(g, u, c_i32(g, 0x00800000)), u), t_f32(g));
	V h = bitcast(g, fptrunc(g, xn, t_bf16(g)), t_i16(g));
	return sel(g, tiny, sub(g, h, c_int(t_i16(g), 0x80)), h);
}

static V round_bf16_quiet(cg *g, V x);

static V f32_to_bf16(cg *g, V x)
{
	if (bf16_native(g))
		return bitcast(g, fptrunc(g, x, t_bf16(g)), t_i16(g));
	if (bf16_host_cvt(g))
		return f32_to_bf16_host(g, x);
	if (g->nan_clean)
		return trunc_(g, lshr(g, bitcast(g, round_bf16_quiet(g, x), t_i32(g)),
				      c_i32(g, 16)), t_i16(g));
	V u = bitcast(g, x, t_i32(g));
	V lsb = and_(g, lshr(g, u, c_i32(g, 16)), c_i32(g, 1));
	V r = lshr(g, add(g, u, add(g, lsb, c_i32(g, 0x7fff))), c_i32(g, 16));
	V q = or_(g, lshr(g, u, c_i32(g, 16)), c_i32(g, 0x40));
	V nan = fcmp(g, LLVMRealUNO, x, x);
	return trunc_(g, sel(g, nan, q, r), t_i16(g));
}

/* Rounds an f32 compute value to the precision of d (f16, bf16). */
static V round_to(cg *g, V x, fz_dtype d)
{
	if (d == FZ_F16)
		return fpext(g, fptrunc(g, x, t_f16(g)), t_f32(g));
	if (d == FZ_BF16 && bf16_native(g))
		return fpext(g, fptrunc(g, x, t_bf16(g)), t_f32(g));
	if (d == FZ_BF16 && bf16_host_cvt(g))
		/* an fpext of bfloat, which stored() takes apart again: a
		 * rounded value stored costs no narrowing */
		return fpext(g, bitcast(g, f32_to_bf16_host(g, x), t_bf16(g)), t_f32(g));
	if (d == FZ_BF16 && g->nan_clean)
		return round_bf16_quiet(g, x);
	if (d == FZ_BF16) {
		/* f32_to_bf16's rounding kept in f32: the low half cleared
		 * once, not shifted out and back (and the NaN's quiet bit set
		 * before), an instruction fewer a vector */
		V u = bitcast(g, x, t_i32(g));
		V lsb = and_(g, lshr(g, u, c_i32(g, 16)), c_i32(g, 1));
		V r = add(g, u, add(g, lsb, c_i32(g, 0x7fff)));
		V q = or_(g, u, c_i32(g, 0x400000));
		r = sel(g, fcmp(g, LLVMRealUNO, x, x), q, r);
		return bitcast(g, and_(g, r, c_i32(g, (int)0xffff0000u)), t_f32(g));
	}
	return x;
}

/* An f64 value to f32 rounded to odd: the nearest f32 when x is one,
 * else whichever of the two f32 neighbours of x has an odd last bit (an
 * overflow becomes the largest finite f32, an underflow the smallest
 * subnormal). Rounding that to f16 or bf16 (11 or 8 bits, at least two
 * fewer than f32's 24) to nearest even is then the correctly rounded
 * f64 -> f16/bf16, as the interpreter's one rounding; rounding f64 to f32
 * to nearest first can land a value just off a half-type halfway point
 * on it, and the tie then goes to even: one ulp off. */
static V f64_to_f32_odd(cg *g, V x)
{
	V y = fptrunc(g, x, t_f32(g));
	V yx = fpext(g, y, t_f64(g));
	V inexact = fcmp(g, LLVMRealONE, yx, x);
	V bits = bitcast(g, y, t_i32(g));
	V even = icmp(g, LLVMIntEQ, and_(g, bits, c_i32(g, 1)), c_i32(g, 0));
	/* the neighbour toward x: one step down in magnitude if y is beyond
	 * x, else one up (the bits of an f32 order its magnitude) */
	V ay = call_intrinsic(g, "llvm.fabs", t_f64(g), t_f64(g), &yx, 1);
	V ax = call_intrinsic(g, "llvm.fabs", t_f64(g), t_f64(g), &x, 1);
	V step = sel(g, fcmp(g, LLVMRealOGT, ay, ax), c_i32(g, -1), c_i32(g, 1));
	V odd = bitcast(g, add(g, bits, step), t_f32(g));
	return sel(g, and_(g, inexact, even), odd, y);
}

/* The host's rounding to bf16 of an add, sub, mul or div of two bf16
 * values (each rounded already, widened from storage, or a constant
 * rounded to the dtype), where the host has no vcvtneps2bf16:
 * round_to's integer form without its NaN test, and bit for bit the
 * same. Both operands' low 16 bits are 0, and x86's arithmetic makes a
 * NaN either one of its operands', quieted, or the default one
 * (0xffc00000): a NaN's low half is 0 as well, so adding 0x7fff and the
 * low bit carries nothing into the high half, which is kept: the quiet
 * NaN the test would have picked. Three of seven instructions a vector
 * (vcmpunordps, vorps, vblendvps; llvm-mca for Zen 3: rotary's loop 409
 * -> 338 cycles). u + 0x7fff is added first: with lsb + 0x7fff first,
 * instcombine narrowed that sum to 16 bits and widened it back, a
 * vpackusdw and a vpmovzxwd a vector. cpu_bench.py on a Zen 3, two runs
 * alternated, with against without: rotary bf16 4.49 and 4.33 ms
 * against 4.78 and 6.22, add_rms_norm 2.85 and 2.96 against 3.16 and
 * 3.47, swiglu 6.39 and 7.77 against 7.30 and 8.78, gelu_bias 7.00 and
 * 8.00 against 8.84 and 8.87 (test_codegen's host_bf16_quiet_rounding
 * holds the bits to emu's full rounding over every bf16 x). */
static V round_bf16_quiet(cg *g, V x)
{
	V u = bitcast(g, x, t_i32(g));
	V lsb = and_(g, lshr(g, u, c_i32(g, 16)), c_i32(g, 1));
	V r = add(g, add(g, u, c_i32(g, 0x7fff)), lsb);
	return bitcast(g, and_(g, r, c_i32(g, (int)0xffff0000u)), t_f32(g));
}

/* A host kernel whose inputs are all 16-bit floats, integers and bools
 * (no f32 or f64 buffer: the one source of a NaN with an arbitrary
 * payload) computes only NaNs whose low 16 bits are 0: a NaN enters as a
 * bf16 or f16 value widened (its payload in the high bits), or is made by
 * an operation (x86's default NaN, 0xffc00000), and arithmetic passes an
 * operand's NaN on with its payload, quieted; the math functions' NaN
 * paths return their operand or such a NaN; integers and comparisons
 * make none. Every bf16 rounding in it, of any op's result and of a
 * store, is then round_bf16_quiet's: its NaN test would pick the very
 * bits the addition gives. That is three of seven instructions a vector
 * for every rounding that quiet_bf16_op (below) does not cover: a cast of
 * an f32 result (a normalization's output), a unary op's result. (Cross
 * entropy's gradient keeps it: its scale is an f32 input. Attention
 * kernels keep it: their exp is their own.) One thread, 8 rows in cache:
 * a bf16 rms_norm 17% faster, add + layer_norm 8%. test_codegen's
 * host_bf16_clean_nans holds every unary math op and a normalization,
 * over every bf16 pattern, to emu's full rounding. */
bool cg_nan_clean(const cg *g, const fz_region *r)
{
	if (g->o.target != FZ_CG_HOST || bf16_host_cvt(g) || !r ||
	    r->kind == FZ_REGION_ATTENTION)
		return false;
	for (int k = 0; k < r->n_in; k++) {
		fz_dtype d = r->in[k]->type.dtype;
		if (d == FZ_F32 || d == FZ_F64)
			return false;
	}
	return true;
}

/* The binary op nd's result rounds by round_bf16_quiet */
static bool quiet_bf16_op(const cg *g, const fz_node *nd)
{
	return g->o.target == FZ_CG_HOST && !bf16_host_cvt(g) &&
	       nd->out[0]->type.dtype == FZ_BF16 && nd->in[0]->type.dtype == FZ_BF16 &&
	       nd->in[1]->type.dtype == FZ_BF16 &&
	       (nd->op == FZ_OP_ADD || nd->op == FZ_OP_SUB || nd->op == FZ_OP_MUL ||
		nd->op == FZ_OP_DIV);
}

LLVMValueRef cg_round_half(cg *g, V x, fz_dtype d)
{
	if (d != FZ_F16 && d != FZ_BF16)
		return x;
	return round_to(g, x, d);
}

LLVMValueRef cg_to_storage(cg *g, V x, fz_dtype d)
{
	switch (d) {
	case FZ_F16: return fptrunc(g, x, t_f16(g));
	case FZ_BF16: return f32_to_bf16(g, x);
	case FZ_I32: case FZ_I8: case FZ_U8: return trunc_(g, x, cg_stype(g, d));
	case FZ_BOOL: return zext(g, x, t_i8(g));
	default: return x;
	}
}

LLVMValueRef cg_from_storage(cg *g, V x, fz_dtype d)
{
	switch (d) {
	case FZ_F16: return fpext(g, x, t_f32(g));
	case FZ_BF16: return bf16_to_f32(g, x);
	case FZ_I32: case FZ_I8: return sext(g, x, t_i64(g));
	case FZ_U8: return zext(g, x, t_i64(g));
	case FZ_BOOL: return icmp(g, LLVMIntNE, x, c_int(t_i8(g), 0));
	default: return x;
	}
}

/* an i64 compute value wrapped to d's width (cg.h) */
LLVMValueRef cg_wrap_int(cg *g, V x, fz_dtype d)
{
	if (d == FZ_I64 || d == FZ_BOOL)
		return x;
	return cg_from_storage(g, cg_to_storage(g, x, d), d);
}

/* ---- extents and indices ------------------------------------------------------ */

LLVMValueRef cg_ext(cg *g, fz_ext e)
{
	V v = c_int(g->ity, e.c);
	for (int s = 0; s < FZ_MAX_SYMS; s++)
		for (int p = fz_ext_power(e, s); p > 0; p--)
			v = cg_iop(g, CG_MUL, v, g->sym[s]);
	return v;
}

LLVMValueRef cg_ix_value(cg *g, cg_ix x)
{
	V o = c_int(g->ity, x.o);
	if (!x.b)
		return o;
	return x.o ? cg_iop(g, CG_ADD, x.b, o) : x.b;
}

static int64_t gcd64(int64_t a, int64_t b)
{
	if (a < 0) a = -a;
	if (b < 0) b = -b;
	while (b) {
		int64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* m of the sum of two index parts, where a NULL base is 0 (any multiple). */
static void ix_addb(cg *g, cg_ix *acc, V b, int64_t m)
{
	if (!b)
		return;
	if (!acc->b) {
		acc->b = b;
		acc->m = m;
		return;
	}
	acc->b = cg_iop(g, CG_ADD, acc->b, b);
	acc->m = gcd64(acc->m, m);
}

void cg_linear(cg *g, const fz_type *ty, const cg_ix *ix, cg_ix *out)
{
	cg_ix acc = {NULL, 0, 1};
	fz_ext stride = fz_ext_const(1);
	V sv = NULL; /* stride as a value, when symbolic */
	bool sym_ok = true;
	for (int d = ty->rank - 1; d >= 0; d--) {
		cg_ix x = ix[d];
		bool cst = sym_ok && fz_ext_is_const(stride);
		if (x.b) {
			if (cst) {
				V t = cg_iop(g, CG_MUL, x.b, c_int(g->ity, stride.c));
				ix_addb(g, &acc, t, x.m * stride.c);
			} else {
				ix_addb(g, &acc, cg_iop(g, CG_MUL, x.b, sv), x.m * (sym_ok ? stride.c : 1));
			}
		}
		if (x.o) {
			if (cst)
				acc.o += x.o * stride.c;
			else
				ix_addb(g, &acc, cg_iop(g, CG_MUL, c_int(g->ity, x.o), sv), 1);
		}
		if (d == 0)
			break;
		fz_ext next;
		if (sym_ok && fz_ext_mul(stride, ty->dims[d], &next)) {
			stride = next;
			sv = fz_ext_is_const(stride) ? NULL : cg_ext(g, stride);
		} else {
			if (!sv)
				sv = cg_ext(g, stride);
			sv = cg_iop(g, CG_MUL, sv, cg_ext(g, ty->dims[d]));
			sym_ok = false;
		}
	}
	*out = acc;
}

/* Splits an affine index x over extent e into (x / e, x % e), keeping the
 * lanes' constant parts where e is a constant multiple of x's base multiple
 * and the constant part stays below it. */
static void split_ix(cg *g, cg_ix x, fz_ext e, cg_ix *hi, cg_ix *lo)
{
	if (fz_ext_is_const(e) && e.c > 0 && x.b && x.m % e.c == 0 && x.o >= 0 &&
	    x.o < e.c) {
		/* b is a multiple of e: hi = b / e, lo = o */
		*hi = cg_ix_of(cg_iop(g, CG_UDIV, x.b, c_int(g->ity, e.c)), x.m / e.c);
		*lo = (cg_ix){NULL, x.o, 1};
		return;
	}
	if (fz_ext_is_const(e) && e.c > 0 && x.b && e.c % x.m == 0 && x.o >= 0 &&
	    x.o < x.m) {
		V ev = c_int(g->ity, e.c);
		*hi = cg_ix_of(cg_iop(g, CG_UDIV, x.b, ev), 1);
		*lo = (cg_ix){cg_iop(g, CG_UREM, x.b, ev), x.o, x.m};
		return;
	}
	if (!x.b && fz_ext_is_const(e) && e.c > 0) {
		*hi = (cg_ix){NULL, x.o / e.c, 1};
		*lo = (cg_ix){NULL, x.o % e.c, 1};
		return;
	}
	V xv = cg_ix_value(g, x), ev = cg_ext(g, e);
	*hi = cg_ix_of(cg_iop(g, CG_UDIV, xv, ev), 1);
	*lo = cg_ix_of(cg_iop(g, CG_UREM, xv, ev), 1);
}

/* Delinearizes an affine index over dims[lo..hi) of ty into ix. */
static void delin_range(cg *g, const fz_type *ty, int lo, int hi, cg_ix lin, cg_ix *ix)
{
	int outer = -1;
	for (int d = lo; d < hi; d++)
		if (!fz_ext_is_one(ty->dims[d])) {
			outer = d;
			break;
		}
	for (int d = hi - 1; d >= lo; d--) {
		if (fz_ext_is_one(ty->dims[d])) {
			ix[d] = cg_ix_zero();
			continue;
		}
		if (d == outer) {
			ix[d] = lin;
			break;
		}
		cg_ix q, r;
		split_ix(g, lin, ty->dims[d], &q, &r);
		ix[d] = r;
		lin = q;
	}
	for (int d = lo; d < hi && outer >= 0 && d < outer; d++)
		ix[d] = cg_ix_zero();
}

void cg_delinearize(cg *g, const fz_type *ty, V lin, int64_t inner_m, cg_ix *ix)
{
	delin_range(g, ty, 0, ty->rank, cg_ix_of(lin, inner_m), ix);
}

/* Linearizes ix over dims[lo..hi) of ty (row-major within that range). */
static cg_ix lin_range(cg *g, const fz_type *ty, int lo, int hi, const cg_ix *ix)
{
	fz_type sub = {0};
	sub.dtype = ty->dtype;
	sub.rank = hi - lo;
	for (int d = lo; d < hi; d++)
		sub.dims[d - lo] = ty->dims[d];
	cg_ix out;
	cg_linear(g, &sub, ix + lo, &out);
	return out;
}

/* ---- memo ------------------------------------------------------------------------ */

static uint64_t memo_hash(const fz_value *v, int nl, int rank, cg_ix (*ix)[FZ_MAX_RANK])
{
	uint64_t h = (uint64_t)(uintptr_t)v * 0x9e3779b97f4a7c15ull ^ (uint64_t)nl;
	for (int l = 0; l < nl; l++)
		for (int d = 0; d < rank; d++) {
			h = (h ^ (uint64_t)(uintptr_t)ix[l][d].b) * 0x100000001b3ull;
			h = (h ^ (uint64_t)ix[l][d].o) * 0x100000001b3ull;
		}
	return h;
}

static bool ix_eq(cg_ix a, cg_ix b) { return a.b == b.b && a.o == b.o; }

static cg_memo *memo_find(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK], uint64_t h)
{
	int rank = v->type.rank;
	for (int i = g->n_memo - 1; i >= 0; i--) {
		cg_memo *e = &g->memo[i];
		if (e->h != h || e->v != v || e->nl != nl)
			continue;
		bool same = true;
		for (int l = 0; same && l < nl; l++)
			for (int d = 0; same && d < rank; d++)
				same = ix_eq(e->ix[l][d], ix[l][d]);
		if (same)
			return e;
	}
	return NULL;
}

static void memo_put(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK], uint64_t h, V *out)
{
	if (g->n_memo == g->cap_memo) {
		int cap = g->cap_memo ? 2 * g->cap_memo : 64;
		cg_memo *m = realloc(g->memo, sizeof *m * (size_t)cap);
		if (!m) {
			cg_fail(g, FZ_ENOMEM, NULL, "out of memory");
			return;
		}
		g->memo = m;
		g->cap_memo = cap;
	}
	cg_memo *e = &g->memo[g->n_memo++];
	e->v = v;
	e->nl = nl;
	e->h = h;
	for (int l = 0; l < nl; l++) {
		memcpy(e->ix[l], ix[l], sizeof(cg_ix) * (size_t)v->type.rank);
		e->out[l] = out[l];
	}
}

int cg_memo_mark(cg *g) { return g->n_memo; }
void cg_memo_pop(cg *g, int mark) { g->n_memo = mark; }

LLVMValueRef cg_iop(cg *g, int op, V a, V b)
{
	if (op == CG_ADD && is_const(b) && LLVMConstIntGetSExtValue(b) == 0)
		return a;
	if ((op == CG_MUL || op == CG_UDIV) && is_const(b) &&
	    LLVMConstIntGetSExtValue(b) == 1)
		return a;
	for (int i = g->n_cse - 1; i >= 0; i--)
		if (g->cse[i].op == op && g->cse[i].a == a && g->cse[i].b == b)
			return g->cse[i].r;
	V r;
	switch (op) {
	case CG_ADD: r = add(g, a, b); break;
	case CG_SUB: r = sub(g, a, b); break;
	case CG_MUL: r = mul(g, a, b); break;
	case CG_UDIV: r = udiv(g, a, b); break;
	default: r = urem(g, a, b); break;
	}
	if (g->n_cse == g->cap_cse) {
		int cap = g->cap_cse ? 2 * g->cap_cse : 64;
		struct cg_cse *c = realloc(g->cse, sizeof *c * (size_t)cap);
		if (!c)
			return r;
		g->cse = c;
		g->cap_cse = cap;
	}
	g->cse[g->n_cse++] = (struct cg_cse){op, a, b, r};
	return r;
}

/* ---- errors at run time ------------------------------------------------------------ */

void cg_flag_error(cg *g, const fz_node *n, V bad)
{
	/* after a failure cg_value's lanes are undef: nothing to test (fuzz
	 * seed 2002, an integer fmod after a failed row kernel on emu, where
	 * LLVMConstIntGetZExtValue read an undef as a ConstantInt) */
	if (g->st != FZ_OK || (is_const(bad) && !LLVMConstIntGetZExtValue(bad)))
		return;
	LLVMBasicBlockRef yes = block(g, "bad"), cont = block(g, "ok");
	cond_br(g, bad, yes, cont);
	at_end(g, yes);
	V st = store(g, c_i32(g, n->id + 1), g->err, 4);
	LLVMSetVolatile(st, 1);
	br(g, cont);
	at_end(g, cont);
}

/* ---- loads and stores ----------------------------------------------------------------- */

LLVMValueRef cg_elem_ptr(cg *g, int s, fz_dtype d, V off)
{
	return gep(g, cg_stype(g, d), g->buf[s], off);
}

/* ---- the emulated GPU's side of the ABI ------------------------------------------
 * fz_emu_thread (codegen.h) as LLVM sees it: four i32, then pointers (the
 * warp-level matrix operations' after these, CG_EMU_TILE ... in cg.h). */
enum { EMU_CTX_TID, EMU_CTX_NTID, EMU_CTX_CTAID, EMU_CTX_NCTAID, EMU_CTX_BARRIER,
       EMU_CTX_SHFL, EMU_CTX_SMEM, EMU_CTX_OOB };

static T emu_ctx_type(cg *g)
{
	T f[CG_EMU_FIELDS];
	for (int i = 0; i < CG_EMU_FIELDS; i++)
		f[i] = i < 4 ? t_i32(g) : t_ptr(g, 0);
	return LLVMStructTypeInContext(g->ctx, f, CG_EMU_FIELDS, 0);
}

static V emu_field(cg *g, int i, T t)
{
	V p = LLVMBuildStructGEP2(g->b, emu_ctx_type(g), g->emu, (unsigned)i, "");
	return load(g, t, p, 8);
}

/* ctx->fn(ctx, args...) through the context's function pointer i. */
V cg_emu_call(cg *g, int i, T ret, T *ps, V *args, unsigned n)
{
	T all[8];
	V av[8];
	all[0] = t_ptr(g, 0);
	av[0] = g->emu;
	for (unsigned k = 0; k < n; k++) {
		all[k + 1] = ps[k];
		av[k + 1] = args[k];
	}
	T fty = LLVMFunctionType(ret, all, n + 1, 0);
	return LLVMBuildCall2(g->b, fty, emu_field(g, i, t_ptr(g, 0)), av, n + 1, "");
}

LLVMValueRef cg_access_ptr(cg *g, int s, fz_dtype d, V off, int n, bool st,
			   unsigned align)
{
	if (g->o.target != FZ_CG_EMU)
		return cg_elem_ptr(g, s, d, off);
	fz_emu_fault f = g->o.emu_fault;
	/* the seeded fault: one access further on (n elements, so that a
	 * vector access keeps the alignment its instruction assumes) */
	if ((f == FZ_EMU_FAULT_LOAD && !st) || (f == FZ_EMU_FAULT_STORE && st))
		off = add(g, off, c_int(type_of(off), n));
	V p = cg_elem_ptr(g, s, d, off);
	/* [off, off + n) within the extent, in i64 whatever the index width:
	 * an i32 offset that wrapped reads as a huge one */
	V o = zext_or_trunc(g, off, t_i64(g));
	V bad = icmp(g, LLVMIntUGT, add(g, o, c_i64(g, n)), g->ext[s]);
	/* and aligned as the instruction says (a GPU faults on a misaligned
	 * vector access; the runner picks vectorized variants by alignment) */
	V mis = c_i1(g, 0);
	if (align > fz_dtype_size(d)) {
		V a = and_(g, LLVMBuildPtrToInt(g->b, p, t_i64(g), ""), c_i64(g, align - 1));
		mis = icmp(g, LLVMIntNE, a, c_i64(g, 0));
		bad = or_(g, bad, mis);
	}
	LLVMBasicBlockRef from = current(g), yes = block(g, "oob"), cont = block(g, "inb");
	cond_br(g, bad, yes, cont);
	at_end(g, yes);
	T ps[5] = {t_i32(g), t_i64(g), t_i64(g), t_i64(g), t_i32(g)};
	V how = or_(g, c_i32(g, st), shl(g, zext(g, mis, t_i32(g)), c_i32(g, 1)));
	V args[5] = {c_i32(g, s), o, c_i64(g, n), g->ext[s], how};
	V q = cg_emu_call(g, EMU_CTX_OOB, t_ptr(g, 0), ps, args, 5);
	br(g, cont);
	at_end(g, cont);
	V r = phi(g, t_ptr(g, 0));
	phi_add(r, p, from);
	phi_add(r, q, yes);
	return r;
}

int cg_emu_smem_array(cg *g, const char *name)
{
	int i = 0;
	while (i < g->n_emu_smem && strcmp(g->emu_smem[i], name))
		i++;
	if (i == g->n_emu_smem) {
		if (i == (int)(sizeof g->emu_smem / sizeof *g->emu_smem)) {
			cg_fail(g, FZ_EUNSUPPORTED, NULL, "more than %d shared arrays", i);
			return 6;
		}
		g->emu_smem[g->n_emu_smem++] = name;
	}
	return 6 + i; /* after the reductions' 6 (reduction.c, smem_slot) */
}

LLVMValueRef cg_smem_ptr(cg *g, T t, int arr, V i, bool st)
{
	if (g->o.target == FZ_CG_EMU) {
		unsigned bytes = (unsigned)LLVMABISizeOfType(
			LLVMGetModuleDataLayout(g->mod), t);
		T ps[5] = {t_i32(g), t_i64(g), t_i32(g), t_i32(g), t_i32(g)};
		V args[5] = {c_i32(g, arr), zext_or_trunc(g, i, t_i64(g)),
			     c_i32(g, bytes), c_i32(g, st), c_i32(g, g->emu_site++)};
		return cg_emu_call(g, EMU_CTX_SMEM, t_ptr(g, 0), ps, args, 5);
	}
	if (!g->smem[arr]) {
		T at = t_arr(t, 32);
		g->smem[arr] = LLVMAddGlobalInAddressSpace(g->mod, at, "fz_smem", 3);
		LLVMSetInitializer(g->smem[arr], c_undef(at));
		LLVMSetLinkage(g->smem[arr], LLVMInternalLinkage);
		LLVMSetAlignment(g->smem[arr], 8);
	}
	V idx[2] = {c_i32(g, 0), zext_or_trunc(g, i, t_i32(g))};
	return LLVMBuildInBoundsGEP2(g->b, t_arr(t, 32), g->smem[arr], idx, 2, "");
}

/* Lane offsets of elements of es bytes: 0 coincide, 1 consecutive
 * (o = o0 + l), 2 even and odd 16-bit ones (o = o0 + cg_lane_elem(nl, l):
 * pointwise.c, which makes them only where every value is 16 bits wide),
 * -1 otherwise. */
static int lane_shape(int nl, const cg_ix *lin, unsigned es)
{
	bool same = true, cons = true, eo = es == 2 && nl >= 4 && nl % 2 == 0;
	for (int l = 1; l < nl; l++) {
		if (lin[l].b != lin[0].b)
			return -1;
		same = same && lin[l].o == lin[0].o;
		cons = cons && lin[l].o == lin[0].o + l;
		eo = eo && lin[l].o == lin[0].o + cg_lane_elem(nl, l);
	}
	return same ? 0 : cons ? 1 : eo ? 2 : -1;
}

static bool lanes_aligned(int nl, cg_ix x)
{
	return (!x.b || x.m % nl == 0) && x.o % nl == 0;
}

/* The alignment an aligned lane group may claim: its size, but at most
 * the 16 bytes the runtime guarantees a vectorized kernel's buffers (the
 * host's 32-byte lane groups are 16-byte aligned, not 32). */
static unsigned lanes_align(unsigned es, int nl)
{
	unsigned a = es * (unsigned)nl;
	return a > 16 ? 16 : a;
}

/* The address of element x of slot s. The host's is its base's element,
 * then the constant part on top (a second GEP): the backend folds that
 * into the instruction's displacement, where b + o in 32-bit indices
 * (idx32) is a sum it must widen first (rotary's row of 8 lane groups of
 * 3 operands: a leal and a movslq a load). */
static V ix_ptr(cg *g, int s, fz_dtype d, cg_ix x, int n, bool st, unsigned align)
{
	if (g->o.target != FZ_CG_HOST || !x.b || !x.o)
		return cg_access_ptr(g, s, d, cg_ix_value(g, x), n, st, align);
	return gep(g, cg_stype(g, d), cg_elem_ptr(g, s, d, x.b), c_i64(g, x.o));
}

static void load_lanes(cg *g, int s, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK], V *out)
{
	fz_dtype d = v->type.dtype;
	T st = cg_stype(g, d);
	unsigned es = (unsigned)fz_dtype_size(d);
	cg_ix lin[FZ_VW_MAX] = {{0}};
	for (int l = 0; l < nl; l++)
		cg_linear(g, &v->type, ix[l], &lin[l]);
	int shape = nl == 1 ? 0 : lane_shape(nl, lin, es);
	if (shape == 0) {
		V x = load(g, st, ix_ptr(g, s, d, lin[0], 1, false, es), es);
		x = cg_from_storage(g, x, d);
		for (int l = 0; l < nl; l++)
			out[l] = x;
		return;
	}
	if (shape > 0) {
		unsigned al = lanes_aligned(nl, lin[0]) ? lanes_align(es, nl) : es;
		V p = ix_ptr(g, s, d, lin[0], nl, false, al);
		if (shape == 1) {
			V vec = load(g, t_vec(st, (unsigned)nl), p, al);
			for (int l = 0; l < nl; l++)
				out[l] = cg_from_storage(g, extract(g, vec, (unsigned)l), d);
			return;
		}
		/* even and odd lanes (pointwise.c): the low and high halves
		 * of 32-bit words, a shift and a mask each for half of the
		 * group */
		int h = nl / 2;
		V vec = load(g, t_vec(t_i32(g), (unsigned)h), p, al);
		for (int j = 0; j < h; j++) {
			V w = extract(g, vec, (unsigned)j);
			V lo = trunc_(g, w, t_i16(g));
			V hi = trunc_(g, lshr(g, w, c_i32(g, 16)), t_i16(g));
			out[j] = cg_from_storage(g, bitcast(g, lo, st), d);
			out[h + j] = cg_from_storage(g, bitcast(g, hi, st), d);
		}
		return;
	}
	for (int l = 0; l < nl; l++)
		out[l] = cg_from_storage(g, load(g, st, ix_ptr(g, s, d, lin[l], 1, false, es),
						 es), d);
}

/* The storage form of a value cg_value made. A bf16 compute value is
 * bf16-exact already (every op rounds its result, loads and constants are
 * exact), so its storage is its high half, without rounding it again
 * (cg_to_storage rounds: a scan's f32 running sum goes through it). */
static V stored(cg *g, V x, fz_dtype d)
{
	/* round_to's host form: the bf16 it widened */
	if (d == FZ_BF16 && bf16_host_cvt(g) && LLVMIsAFPExtInst(x) &&
	    type_of(LLVMGetOperand(x, 0)) == t_bf16(g))
		return bitcast(g, LLVMGetOperand(x, 0), t_i16(g));
	if (d == FZ_BF16 && !bf16_native(g))
		return trunc_(g, lshr(g, bitcast(g, x, t_i32(g)), c_i32(g, 16)), t_i16(g));
	return cg_to_storage(g, x, d);
}

/* ---- streaming stores (host) -------------------------------------------------
 * A store to memory that is not in the cache first reads the line it
 * writes (a read for ownership): a kernel that reads 32 MB and writes 32 MB
 * moves 96 MB. x86's non-temporal stores (movnt) write whole lines
 * through write-combining buffers without reading them and without
 * filling the cache with what nobody reads soon: a copy (glibc's memcpy
 * past the cache's size) moves data that way, and a plain loop with
 * ordinary stores gets about two thirds of its bandwidth (a 256 MB
 * scale in place of a copy on an Intel Xeon: 14 GB/s with ordinary stores, 22 with
 * movnt, memcpy 25; at 64 MB 18 against 32; at 16 MB 21 against 25; at
 * 8 MB even, at 4 MB the cache wins; and a kernel that reads what the
 * one before wrote would find it in the cache no more). So a region that
 * writes FZ_HOST_STREAM_BYTES (16 MiB) or more, all
 * of it in sizes known when it is compiled, stores its outputs' final
 * values with !nontemporal (g->stream, set by the skeleton around the
 * stores that write a value nobody in the kernel reads back: pointwise
 * outputs, a row's tail; not the stash or the keep, which the tail
 * reads, nor a serial scatter's copy, which part 0's adds read back; a
 * scatter along dim 0 streams every row of its result, each written once:
 * pointwise.c's "the scatter as a gather"). Only whole
 * aligned lane groups of 16 bytes or more stream (LLVM makes them movntps
 * or movntdq; an unaligned or scalar store would not be one). Streaming
 * stores are weakly ordered: the function ends in an sfence, so that
 * what the part wrote is visible to the thread that waits for the part
 * (runtime/pool.c's mutex then orders it).
 *
 * How many outputs one loop may stream is the host's (c->host_streams,
 * target_host.c): on AMD's Zen cores one. There, two streamed outputs
 * lose to plain stores, and lose badly where an input runs a little
 * behind an output in the address bits below 4 KiB: (out - in) mod 4096
 * within 16 to 128 bytes, a load then waits on the streaming store it
 * seems to alias (the 4 KiB check of the load-store unit), and streaming
 * stores drain slowly. An input from malloc (16 bytes into its page)
 * beside an output from the host cache (64 bytes into its page) is
 * exactly that. Measured on a Zen 3 (EPYC, two threads,
 * tools/bench/stream_stores.c, GB/s streamed against plain): one input,
 * one output 20-22 against 18-21; 1 in, 2 out 17 against 21-24; 2 in, 2
 * out 18-19 against 23-25; 4 in, 3 out (an AdamW step of one tensor) 15-17
 * against 19-23; 1 in, 2 out with the input 48 bytes behind 2.4-3.0
 * against 20. Through fusec (`fusec run`, random inputs from malloc): a
 * multiply with two outputs of 64 MB 73.5 ms streamed, 8.4 ms plain; an
 * AdamW step of one 4096 x 4096 tensor 154 against 20 ms. One streamed
 * output never lost there, aliased or not (6.0 against 6.8 ms). Intel's
 * cores keep every output streaming, as measured before. */
#define FZ_HOST_STREAM_BYTES (16 << 20)

bool cg_stream_fits(cg *g, int n)
{
	if (g->o.target != FZ_CG_HOST || g->serial || !g->c->triple ||
	    strncmp(g->c->triple, "x86_64", 6) != 0 || n > g->c->host_streams)
		return false;
	int64_t bytes = 0;
	for (int i = 0; i < g->r->n_out; i++) {
		fz_ext n;
		if (!fz_type_numel(&g->r->out[i]->type, &n) || !fz_ext_is_const(n))
			return false;
		bytes += n.c * (int64_t)fz_dtype_size(g->r->out[i]->type.dtype);
	}
	return bytes >= FZ_HOST_STREAM_BYTES;
}

static void stream_store(cg *g, V st)
{
	LLVMMetadataRef one = LLVMValueAsMetadata(c_i32(g, 1));
	LLVMMetadataRef md = LLVMMDNodeInContext2(g->ctx, &one, 1);
	LLVMSetMetadata(st, LLVMGetMDKindIDInContext(g->ctx, "nontemporal", 11),
			LLVMMetadataAsValue(g->ctx, md));
	g->streamed = true;
}

void cg_store(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK], V *vals)
{
	int s = g->slot[v->id];
	FZ_ASSERT(s >= g->r->n_in);
	fz_dtype d = v->type.dtype;
	T st = cg_stype(g, d);
	unsigned es = (unsigned)fz_dtype_size(d);
	cg_ix lin[FZ_VW_MAX];
	for (int l = 0; l < nl; l++)
		cg_linear(g, &v->type, ix[l], &lin[l]);
	int shape = nl == 1 ? 0 : lane_shape(nl, lin, es);
	if (shape > 0) {
		unsigned al = lanes_aligned(nl, lin[0]) ? lanes_align(es, nl) : es;
		V vec;
		if (shape == 1) {
			vec = c_undef(t_vec(st, (unsigned)nl));
			for (int l = 0; l < nl; l++)
				vec = insert(g, vec, stored(g, vals[l], d), (unsigned)l);
		} else {
			/* even and odd lanes: paired into 32-bit words, an even
			 * lane's in the low half */
			int h = nl / 2;
			vec = c_undef(t_vec(t_i32(g), (unsigned)h));
			for (int j = 0; j < h; j++) {
				V lo = zext(g, bitcast(g, stored(g, vals[j], d), t_i16(g)), t_i32(g));
				V hi = zext(g, bitcast(g, stored(g, vals[h + j], d), t_i16(g)), t_i32(g));
				vec = insert(g, vec, or_(g, lo, shl(g, hi, c_i32(g, 16))), (unsigned)j);
			}
		}
		/* (split by hand into 16-byte stores, the SLP vectorizer
		 * narrows the whole expression to them and the backend folds
		 * the bf16 narrowing into a plain vpmovdw store: not streamed) */
		V sv = store(g, vec, ix_ptr(g, s, d, lin[0], nl, true, al), al);
		if (g->stream && al == 16) /* aligned, 16 bytes or more */
			stream_store(g, sv);
		return;
	}
	int n = shape == 0 ? 1 : nl;
	for (int l = 0; l < n; l++)
		store(g, stored(g, vals[l], d), ix_ptr(g, s, d, lin[l], 1, true, es), es);
}

/* ---- elementwise ops --------------------------------------------------------------- */

static V const_of(cg *g, fz_dtype d, double x)
{
	if (fz_dtype_is_float(d)) {
		unsigned char buf[8];
		fz_store_f64(buf, d, 0, x); /* rounded to the dtype, as stored */
		return c_real(cg_ctype(g, d), fz_load_f64(buf, d, 0));
	}
	if (d == FZ_BOOL)
		return c_i1(g, x != 0);
	unsigned char buf[8];
	fz_store_f64(buf, d, 0, x);
	return c_i64(g, fz_load_i64(buf, d, 0));
}

static V is_nan(cg *g, V x) { return fcmp(g, LLVMRealUNO, x, x); }

static V op_unary(cg *g, const fz_node *n, V x)
{
	fz_dtype xd = n->in[0]->type.dtype, yd = n->out[0]->type.dtype;
	bool isf = fz_dtype_is_float(xd);
	T xt = type_of(x);
	switch (n->op) {
	case FZ_OP_CAST:
		if (xd == FZ_BOOL) {
			if (fz_dtype_is_float(yd))
				return uitofp(g, x, cg_ctype(g, yd));
			return yd == FZ_BOOL ? x : zext(g, x, t_i64(g));
		}
		if (isf) {
			if (yd == FZ_BOOL)
				return fcmp(g, LLVMRealUNE, x, c_real(xt, 0));
			if (fz_dtype_is_float(yd)) {
				T yt = cg_ctype(g, yd);
				V y = xt == yt ? x : xt != t_f64(g) ? fpext(g, x, yt) :
				      yd == FZ_F32 ? fptrunc(g, x, yt) : f64_to_f32_odd(g, x);
				return round_to(g, y, yd);
			}
			/* saturating, NaN to 0: the cast semantics of numeric.h */
			T it = cg_stype(g, yd);
			const char *nm = yd == FZ_U8 ? "llvm.fptoui.sat" : "llvm.fptosi.sat";
			unsigned id = LLVMLookupIntrinsicID(nm, strlen(nm));
			T tys[2] = {it, xt};
			V f = LLVMGetIntrinsicDeclaration(g->mod, id, tys, 2);
			T fty = LLVMIntrinsicGetType(g->ctx, id, tys, 2);
			V r = LLVMBuildCall2(g->b, fty, f, &x, 1, "");
			return cg_from_storage(g, r, yd);
		}
		/* integer source */
		if (yd == FZ_BOOL)
			return icmp(g, LLVMIntNE, x, c_i64(g, 0));
		if (fz_dtype_is_float(yd))
			return round_to(g, sitofp(g, x, cg_ctype(g, yd)), yd);
		return cg_wrap_int(g, x, yd);
	case FZ_OP_ISFINITE: {
		V a = call_intrinsic(g, "llvm.fabs", xt, xt, &x, 1);
		return fcmp(g, LLVMRealOLT, a, c_real(xt, INFINITY));
	}
	case FZ_OP_LOGICAL_NOT:
		return xor_(g, x, c_i1(g, 1));
	default:
		break;
	}
	if (isf)
		return cg_math_unary(g, n->op, x);
	V zero = c_i64(g, 0), r;
	switch (n->op) {
	case FZ_OP_NEG: r = sub(g, zero, x); break;
	case FZ_OP_ABS: r = sel(g, icmp(g, LLVMIntSLT, x, zero), sub(g, zero, x), x); break;
	case FZ_OP_SIGN:
		r = sub(g, zext(g, icmp(g, LLVMIntSGT, x, zero), t_i64(g)),
			zext(g, icmp(g, LLVMIntSLT, x, zero), t_i64(g)));
		break;
	default:
		cg_fail(g, FZ_EUNSUPPORTED, n, "no integer form of this op");
		return x;
	}
	return cg_wrap_int(g, r, yd);
}

static V op_compare(cg *g, fz_opcode op, bool isf, V a, V b)
{
	if (isf) {
		static const LLVMRealPredicate fp[] = {LLVMRealOEQ, LLVMRealUNE,
			LLVMRealOLT, LLVMRealOLE, LLVMRealOGT, LLVMRealOGE};
		return fcmp(g, fp[op - FZ_OP_EQ], a, b);
	}
	static const LLVMIntPredicate ip[] = {LLVMIntEQ, LLVMIntNE, LLVMIntSLT,
		LLVMIntSLE, LLVMIntSGT, LLVMIntSGE};
	return icmp(g, ip[op - FZ_OP_EQ], a, b);
}

static V op_binary(cg *g, const fz_node *n, V a, V b)
{
	fz_dtype xd = n->in[0]->type.dtype, yd = n->out[0]->type.dtype;
	bool isf = fz_dtype_is_float(xd);
	if (n->op >= FZ_OP_EQ && n->op <= FZ_OP_GE)
		return op_compare(g, n->op, isf, a, b);
	if (n->op == FZ_OP_LOGICAL_AND)
		return and_(g, a, b);
	if (n->op == FZ_OP_LOGICAL_OR)
		return or_(g, a, b);
	if (isf) {
		T t = type_of(a);
		switch (n->op) {
		case FZ_OP_ADD: return fadd_exact(g, a, b);
		case FZ_OP_SUB: return fsub_exact(g, a, b);
		case FZ_OP_MUL: return fmul_exact(g, a, b);
		case FZ_OP_DIV: return fdiv(g, a, b);
		case FZ_OP_POW: return cg_math_pow(g, a, b);
		case FZ_OP_FMOD: return cg_math_fmod(g, a, b);
		case FZ_OP_MAXIMUM:
		case FZ_OP_MINIMUM: {
			V nan = or_(g, is_nan(g, a), is_nan(g, b));
			V pick = fcmp(g, n->op == FZ_OP_MAXIMUM ? LLVMRealOGT : LLVMRealOLT, a, b);
			return sel(g, nan, c_real(t, NAN), sel(g, pick, a, b));
		}
		default: break;
		}
	}
	V r;
	switch (n->op) {
	case FZ_OP_ADD: r = add(g, a, b); break;
	case FZ_OP_SUB: r = sub(g, a, b); break;
	case FZ_OP_MUL: r = mul(g, a, b); break;
	case FZ_OP_MAXIMUM: r = sel(g, icmp(g, LLVMIntSGT, a, b), a, b); break;
	case FZ_OP_MINIMUM: r = sel(g, icmp(g, LLVMIntSLT, a, b), a, b); break;
	case FZ_OP_FMOD: {
		V zero = c_i64(g, 0), m1 = c_i64(g, -1);
		cg_flag_error(g, n, icmp(g, LLVMIntEQ, b, zero));
		V special = or_(g, icmp(g, LLVMIntEQ, b, zero), icmp(g, LLVMIntEQ, b, m1));
		V safe = sel(g, special, c_i64(g, 1), b);
		r = sel(g, special, zero, srem(g, a, safe));
		break;
	}
	default:
		cg_fail(g, FZ_EUNSUPPORTED, n, "no integer form of this op");
		return a;
	}
	return cg_wrap_int(g, r, yd);
}

/* ---- Philox ------------------------------------------------------------------------ */

/* Four words of Philox4x32-10 for counter n (i64) and the key's two i32
 * words. A constant key (seed=S) stays constant: the builder folds the
 * Weyl bumps, so the code is the same as with the key written in; a key
 * read at run time (the seed operand) costs two adds a round. */
static void philox(cg *g, V n, V k0, V k1, V w[4])
{
	T i32 = t_i32(g), i64 = t_i64(g);
	V c[4] = {trunc_(g, n, i32), trunc_(g, lshr(g, n, c_i64(g, 32)), i32),
		  c_i32(g, 0), c_i32(g, 0)};
	for (int r = 0; r < 10; r++) {
		if (r > 0) {
			k0 = add(g, k0, c_int(i32, (int64_t)0x9E3779B9u));
			k1 = add(g, k1, c_int(i32, (int64_t)0xBB67AE85u));
		}
		V p0 = mul(g, zext(g, c[0], i64), c_i64(g, 0xD2511F53));
		V p1 = mul(g, zext(g, c[2], i64), c_i64(g, 0xCD9E8D57));
		V hi0 = trunc_(g, lshr(g, p0, c_i64(g, 32)), i32), lo0 = trunc_(g, p0, i32);
		V hi1 = trunc_(g, lshr(g, p1, c_i64(g, 32)), i32), lo1 = trunc_(g, p1, i32);
		V n0 = xor_(g, xor_(g, hi1, c[1]), k0);
		V n2 = xor_(g, xor_(g, hi0, c[3]), k1);
		c[0] = n0;
		c[1] = lo1;
		c[2] = n2;
		c[3] = lo0;
	}
	for (int i = 0; i < 4; i++)
		w[i] = c[i];
}

static V philox_unit(cg *g, V w, fz_dtype d)
{
	switch (d) {
	case FZ_F32: return fmul(g, uitofp(g, lshr(g, w, c_i32(g, 8)), t_f32(g)), c_f32(g, 0x1p-24));
	case FZ_F16: return fmul(g, uitofp(g, lshr(g, w, c_i32(g, 21)), t_f32(g)), c_f32(g, 0x1p-11));
	case FZ_BF16: return fmul(g, uitofp(g, lshr(g, w, c_i32(g, 24)), t_f32(g)), c_f32(g, 0x1p-8));
	default: return fmul(g, uitofp(g, w, t_f64(g)), c_f64(g, 0x1p-32));
	}
}

static void uniform_lanes(cg *g, const fz_node *n, int nl, cg_ix (*ix)[FZ_MAX_RANK], V *out)
{
	const fz_value *v = n->out[0];
	uint64_t off = (uint64_t)n->attrs.offset;
	/* the key: seed=S written in, or the seed operand's value (rank 0:
	 * one scalar load, shared by the lanes) */
	T i32 = t_i32(g);
	V seed;
	if (n->n_in == 1) {
		cg_ix at[1][FZ_MAX_RANK] = {{{NULL, 0, 1}}};
		cg_value(g, n->in[0], 1, at, &seed);
		seed = zext_or_trunc(g, seed, t_i64(g));
	} else {
		seed = c_i64(g, n->attrs.seed);
	}
	V k0 = trunc_(g, seed, i32), k1 = trunc_(g, lshr(g, seed, c_i64(g, 32)), i32);
	cg_ix lin[FZ_VW_MAX];
	for (int l = 0; l < nl; l++)
		cg_linear(g, &v->type, ix[l], &lin[l]);
	/* Lanes that share a counter share one Philox call. */
	V cache_n[FZ_VW_MAX], cache_w[FZ_VW_MAX][4];
	int nc = 0;
	for (int l = 0; l < nl; l++) {
		V cnt, word;
		int64_t wconst = -1;
		if ((!lin[l].b || lin[l].m % 4 == 0) && lin[l].o >= 0) {
			V b = lin[l].b ? zext_or_trunc(g, lin[l].b, t_i64(g)) : c_i64(g, 0);
			if (lin[l].b)
				b = lshr(g, b, c_i64(g, 2));
			cnt = add(g, b, c_i64(g, (int64_t)(off + (uint64_t)lin[l].o / 4)));
			wconst = lin[l].o % 4;
			word = NULL;
		} else {
			V i = zext_or_trunc(g, cg_ix_value(g, lin[l]), t_i64(g));
			cnt = add(g, lshr(g, i, c_i64(g, 2)), c_i64(g, (int64_t)off));
			word = trunc_(g, and_(g, i, c_i64(g, 3)), t_i32(g));
		}
		int hit = -1;
		for (int k = 0; k < nc; k++)
			if (cache_n[k] == cnt || (is_const(cnt) && is_const(cache_n[k]) &&
				LLVMConstIntGetZExtValue(cnt) == LLVMConstIntGetZExtValue(cache_n[k])))
				hit = k;
		if (hit < 0) {
			hit = nc++;
			cache_n[hit] = cnt;
			philox(g, cnt, k0, k1, cache_w[hit]);
		}
		V w;
		if (wconst >= 0) {
			w = cache_w[hit][wconst];
		} else {
			w = cache_w[hit][3];
			for (int k = 2; k >= 0; k--)
				w = sel(g, icmp(g, LLVMIntEQ, word, c_i32(g, k)), cache_w[hit][k], w);
		}
		out[l] = philox_unit(g, w, v->type.dtype);
	}
}

/* ---- meta ops: index maps ------------------------------------------------------------ */

static void reshape_ix(cg *g, const fz_type *xt, const fz_type *yt,
		       const cg_ix *yi, cg_ix *xi)
{
	int xd[FZ_MAX_RANK], yd[FZ_MAX_RANK], nx = 0, ny = 0;
	for (int d = 0; d < xt->rank; d++) {
		xi[d] = cg_ix_zero();
		if (!fz_ext_is_one(xt->dims[d]))
			xd[nx++] = d;
	}
	for (int d = 0; d < yt->rank; d++)
		if (!fz_ext_is_one(yt->dims[d]))
			yd[ny++] = d;
	int px = 0, py = 0;
	while (nx > px && ny > py && fz_ext_eq(xt->dims[xd[nx - 1]], yt->dims[yd[ny - 1]])) {
		xi[xd[nx - 1]] = yi[yd[ny - 1]];
		nx--;
		ny--;
	}
	while (px < nx && py < ny && fz_ext_eq(xt->dims[xd[px]], yt->dims[yd[py]])) {
		xi[xd[px]] = yi[yd[py]];
		px++;
		py++;
	}
	if (px == nx)
		return; /* the rest of y is extents equal to 1 at run time */
	/* middle: y's dims [yd[py], yd[ny-1]] linearized, split over x's */
	fz_type ym = {0}, xm = {0};
	cg_ix yv[FZ_MAX_RANK], xv[FZ_MAX_RANK];
	for (int k = py; k < ny; k++) {
		ym.dims[ym.rank] = yt->dims[yd[k]];
		yv[ym.rank++] = yi[yd[k]];
	}
	for (int k = px; k < nx; k++)
		xm.dims[xm.rank++] = xt->dims[xd[k]];
	cg_ix lin = ym.rank ? lin_range(g, &ym, 0, ym.rank, yv) : cg_ix_zero();
	delin_range(g, &xm, 0, xm.rank, lin, xv);
	for (int k = px; k < nx; k++)
		xi[xd[k]] = xv[k - px];
}

static void meta_lanes(cg *g, const fz_node *n, int nl, cg_ix (*ix)[FZ_MAX_RANK], V *out);

/* ---- the dispatcher ------------------------------------------------------------------ */

static void check_row(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK])
{
	int nk = 0;
	for (int d = 0; d < g->row_rank; d++)
		nk += g->row_kept[d];
	for (int l = 0; l < nl; l++) {
		int k = 0;
		for (int d = 0; d < g->row_rank; d++) {
			if (!g->row_kept[d])
				continue;
			int vd = v->type.rank == g->row_rank ? d : v->type.rank == nk ? k : -1;
			k++;
			if (vd < 0) {
				cg_fail(g, FZ_EUNSUPPORTED, v->def, "a reduced value of "
					"rank %d read off its row", v->type.rank);
				return;
			}
			if (fz_ext_is_one(v->type.dims[vd]))
				continue;
			if (!ix_eq(ix[l][vd], g->row[d])) {
				cg_fail(g, FZ_EUNSUPPORTED, v->def, "a reduced value is read "
					"at an index other than its own row");
				return;
			}
		}
	}
}

static void gather_lanes(cg *g, const fz_node *n, int nl, cg_ix (*ix)[FZ_MAX_RANK], V *out)
{
	const fz_value *x = n->in[0], *idx = n->in[1], *y = n->out[0];
	int dim = n->attrs.dim, ir = idx->type.rank;
	cg_ix ii[FZ_VW_MAX][FZ_MAX_RANK], xi[FZ_VW_MAX][FZ_MAX_RANK];
	for (int l = 0; l < nl; l++) {
		if (n->op == FZ_OP_TAKE)
			for (int d = 0; d < ir; d++)
				ii[l][d] = ix[l][dim + d];
		else
			memcpy(ii[l], ix[l], sizeof(cg_ix) * (size_t)ir);
	}
	V k[FZ_VW_MAX];
	cg_value(g, idx, nl, ii, k);
	V E = zext_or_trunc(g, cg_ext(g, x->type.dims[dim]), t_i64(g));
	V kk[FZ_VW_MAX];
	for (int l = 0; l < nl; l++) {
		if (l > 0 && k[l] == k[l - 1]) {
			kk[l] = kk[l - 1];
			continue;
		}
		V bad = icmp(g, LLVMIntUGE, k[l], E);
		cg_flag_error(g, n, bad);
		kk[l] = zext_or_trunc(g, sel(g, bad, c_i64(g, 0), k[l]), g->ity);
	}
	for (int l = 0; l < nl; l++) {
		if (n->op == FZ_OP_TAKE) {
			for (int d = 0; d < dim; d++)
				xi[l][d] = ix[l][d];
			xi[l][dim] = cg_ix_of(kk[l], 1);
			for (int d = dim + 1; d < x->type.rank; d++)
				xi[l][d] = ix[l][d - 1 + ir];
		} else {
			memcpy(xi[l], ix[l], sizeof(cg_ix) * (size_t)y->type.rank);
			xi[l][dim] = cg_ix_of(kk[l], 1);
		}
	}
	fz_ext ext = x->type.dims[dim];
	if (fz_ext_is_const(ext) && ext.c > 0) {
		cg_value(g, x, nl, xi, out);
		return;
	}
	/* An operand that may have no elements along dim: then every index
	 * is bad and element 0 does not exist either, so x is computed (and
	 * its inputs loaded) only where it has elements, else the lanes are
	 * 0. The branch is the same for every element: the optimizer may
	 * hoist it out of the loop. */
	LLVMBasicBlockRef pre = current(g), rd = block(g, "gather"),
			  join = block(g, "gathered");
	cond_br(g, icmp(g, LLVMIntEQ, E, c_i64(g, 0)), join, rd);
	at_end(g, rd);
	int mark = cg_memo_mark(g), cse = g->n_cse;
	V vals[FZ_VW_MAX];
	cg_value(g, x, nl, xi, vals);
	LLVMBasicBlockRef end = current(g);
	br(g, join);
	at_end(g, join);
	cg_memo_pop(g, mark); /* what rd computed does not dominate the rest */
	g->n_cse = cse;
	V zero = const_of(g, y->type.dtype, 0.0);
	for (int l = 0; l < nl; l++) {
		if (l > 0 && vals[l] == vals[l - 1]) {
			out[l] = out[l - 1];
			continue;
		}
		out[l] = phi(g, type_of(vals[l]));
		phi_add(out[l], zero, pre);
		phi_add(out[l], vals[l], end);
	}
}

/* Lanes that coincide are computed once: 1 when every lane's index is
 * lane 0's, else nl. */
static int lanes_distinct(const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK])
{
	for (int l = 1; l < nl; l++)
		for (int d = 0; d < v->type.rank; d++)
			if (!ix_eq(ix[l][d], ix[0][d]))
				return nl;
	return 1;
}

/* iota at lanes of one base (i0 + o_l: consecutive, or pointwise.c's even
 * and odd lanes) as one vector, splat(i0) + <o_0, o_1, ...> (o_0 = 0), whose
 * lanes the consumers extract: the SLP vectorizer then uses
 * the vector as it is. Built from n scalars i0 + l instead, the lanes are
 * not alike (instcombine makes i0 + l an `or disjoint` where i0 is a
 * multiple of the lane count, and lane 0 is i0 itself), and SLP pieced
 * them together from vectors of 8, 4, 2 and 1 with shuffles: 14 of the 75
 * instructions a 16-lane step of cross_entropy's last pass. NULL where
 * the lanes' bases differ. */
static V iota_lanes(cg *g, int n, cg_ix (*ix)[FZ_MAX_RANK])
{
	if (n < 2)
		return NULL;
	for (int l = 1; l < n; l++)
		if (ix[l][0].b != ix[0][0].b)
			return NULL;
	T vt = t_vec(t_i64(g), (unsigned)n);
	V i0 = zext_or_trunc(g, cg_ix_value(g, ix[0][0]), t_i64(g));
	V lanes[FZ_VW_MAX];
	for (int l = 0; l < n; l++)
		lanes[l] = c_i64(g, ix[l][0].o - ix[0][0].o);
	V splat = insert(g, c_undef(vt), i0, 0);
	splat = LLVMBuildShuffleVector(g->b, splat, c_undef(vt),
				       LLVMConstNull(t_vec(t_i32(g), (unsigned)n)), "");
	return LLVMBuildAdd(g->b, splat, LLVMConstVector(lanes, (unsigned)n), "");
}

void cg_value(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK], V *out)
{
	if (g->st != FZ_OK) {
		for (int l = 0; l < nl; l++)
			out[l] = c_undef(cg_ctype(g, v->type.dtype));
		return;
	}
	if (g->is_red[v->id]) {
		check_row(g, v, nl, ix);
		V r = g->red[v->id];
		if (!r) {
			cg_fail(g, FZ_EUNSUPPORTED, v->def, "a reduced value is used "
				"before its reduction is complete");
			r = c_undef(cg_ctype(g, v->type.dtype));
		}
		for (int l = 0; l < nl; l++)
			out[l] = r;
		return;
	}
	int n = lanes_distinct(v, nl, ix);
	uint64_t h = memo_hash(v, n, v->type.rank, ix);
	cg_memo *e = memo_find(g, v, n, ix, h);
	if (e) {
		for (int l = 0; l < nl; l++)
			out[l] = e->out[n == 1 ? 0 : l];
		return;
	}
	int s = g->slot[v->id];
	const fz_node *nd = v->def;
	if (s >= 0 && s < g->r->n_in) {
		load_lanes(g, s, v, n, ix, out);
	} else if (!nd) {
		cg_fail(g, FZ_EINVAL, NULL, "value #%d is neither a region input nor "
			"made in the region", v->id);
	} else if (cg_table_lanes(g, v, n, ix, out)) {
		/* read from its table (table.c) */
	} else {
		const fz_node *saved = g->cur;
		g->cur = nd;
		fz_opclass cls = fz_ops[nd->op].cls;
		V a[FZ_VW_MAX], b[FZ_VW_MAX], c[FZ_VW_MAX];
		switch (cls) {
		case FZ_CLASS_UNARY:
			cg_value(g, nd->in[0], n, ix, a);
			if (fz_dtype_is_float(nd->in[0]->type.dtype) &&
			    cg_math_lanes(g, nd->op, n, a, out)) {
				for (int l = 0; l < n; l++)
					out[l] = cg_round_half(g, out[l], v->type.dtype);
				break;
			}
			/* a cast to f16 or bf16 rounds already, and neg and abs
			 * of a value of the dtype are one (rounding again is no
			 * change but for the NaN test, which LLVM cannot fold:
			 * 3 to 8 instructions a vector: every bf16 norm's tail,
			 * rotary's neg) */
			for (int l = 0; l < n; l++)
				out[l] = l && a[l] == a[l - 1] ? out[l - 1] :
					 nd->op == FZ_OP_CAST || ((nd->op == FZ_OP_NEG ||
					 nd->op == FZ_OP_ABS) && nd->in[0]->type.dtype ==
					 v->type.dtype) ? op_unary(g, nd, a[l]) :
					 cg_round_half(g, op_unary(g, nd, a[l]), v->type.dtype);
			break;
		case FZ_CLASS_BINARY: {
			bool quiet = quiet_bf16_op(g, nd);
			cg_value(g, nd->in[0], n, ix, a);
			cg_value(g, nd->in[1], n, ix, b);
			for (int l = 0; l < n; l++)
				out[l] = l && a[l] == a[l - 1] && b[l] == b[l - 1] ? out[l - 1] :
					 quiet ? round_bf16_quiet(g, op_binary(g, nd, a[l], b[l])) :
					 cg_round_half(g, op_binary(g, nd, a[l], b[l]), v->type.dtype);
			break;
		}
		case FZ_CLASS_TERNARY:
			cg_value(g, nd->in[0], n, ix, c);
			cg_value(g, nd->in[1], n, ix, a);
			cg_value(g, nd->in[2], n, ix, b);
			for (int l = 0; l < n; l++)
				out[l] = sel(g, c[l], a[l], b[l]);
			break;
		case FZ_CLASS_CREATION:
			if (nd->op == FZ_OP_FULL) {
				V k;
				if (nd->attrs.value_sym >= 0) {
					fz_dtype d = v->type.dtype;
					V sv = zext_or_trunc(g, g->sym[nd->attrs.value_sym], t_i64(g));
					k = fz_dtype_is_float(d) ? round_to(g, sitofp(g, sv, cg_ctype(g, d)), d) :
					    d == FZ_BOOL ? icmp(g, LLVMIntNE, sv, c_i64(g, 0)) :
					    cg_wrap_int(g, sv, d);
				} else {
					k = const_of(g, v->type.dtype, nd->attrs.value);
				}
				for (int l = 0; l < n; l++)
					out[l] = k;
			} else if (nd->op == FZ_OP_IOTA) {
				fz_dtype d = v->type.dtype;
				V iv = iota_lanes(g, n, ix);
				for (int l = 0; l < n; l++) {
					V i = iv ? extract(g, iv, (unsigned)l) :
						   zext_or_trunc(g, cg_ix_value(g, ix[l][0]), t_i64(g));
					out[l] = fz_dtype_is_float(d) ? round_to(g, sitofp(g, i, cg_ctype(g, d)), d) :
						 d == FZ_BOOL ? icmp(g, LLVMIntNE, i, c_i64(g, 0)) :
						 cg_wrap_int(g, i, d);
				}
			} else {
				uniform_lanes(g, nd, n, ix, out);
			}
			break;
		case FZ_CLASS_META:
			meta_lanes(g, nd, n, ix, out);
			break;
		case FZ_CLASS_INDEXING:
			if (nd->op == FZ_OP_INDEX_ADD) {
				cg_fail(g, FZ_EUNSUPPORTED, nd, "the result of index_add is "
					"read inside its own region");
				break;
			}
			gather_lanes(g, nd, n, ix, out);
			break;
		default:
			cg_fail(g, FZ_EUNSUPPORTED, nd, "a %s op cannot be part of a "
				"kernel", fz_class_names[cls]);
			break;
		}
		g->cur = saved;
	}
	if (g->st != FZ_OK) {
		for (int l = 0; l < nl; l++)
			out[l] = c_undef(cg_ctype(g, v->type.dtype));
		return;
	}
	memo_put(g, v, n, ix, h, out);
	for (int l = n; l < nl; l++)
		out[l] = out[0];
}

void cg_value_given(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK],
		    const V *vals)
{
	if (g->st != FZ_OK)
		return;
	V out[FZ_VW_MAX];
	int n = lanes_distinct(v, nl, ix);
	for (int l = 0; l < n; l++)
		out[l] = vals[l];
	memo_put(g, v, n, ix, memo_hash(v, n, v->type.rank, ix), out);
}

/* v's lanes at ix are what cg_store put in output o (v's dtype and shape)
 * at ix earlier in this thread: loaded from o's buffer and memoized as
 * v's, so that what uses v at ix reads it instead of computing it again
 * (reduction.c's stash). A stored compute value reads back as itself:
 * cg_value rounded it to its dtype already. */
void cg_value_reload(cg *g, const fz_value *v, const fz_value *o, int nl,
		     cg_ix (*ix)[FZ_MAX_RANK])
{
	FZ_ASSERT(o->type.dtype == v->type.dtype && o->type.rank == v->type.rank);
	if (g->st != FZ_OK)
		return;
	int n = lanes_distinct(v, nl, ix);
	V out[FZ_VW_MAX];
	load_lanes(g, g->slot[o->id], o, n, ix, out);
	memo_put(g, v, n, ix, memo_hash(v, n, v->type.rank, ix), out);
}

static void meta_lanes(cg *g, const fz_node *n, int nl, cg_ix (*ix)[FZ_MAX_RANK], V *out)
{
	const fz_value *x = n->in[0], *y = n->out[0];
	const fz_attrs *a = &n->attrs;
	cg_ix xi[FZ_VW_MAX][FZ_MAX_RANK];
	switch (n->op) {
	case FZ_OP_BROADCAST_IN_DIM:
		for (int l = 0; l < nl; l++)
			for (int i = 0; i < x->type.rank; i++)
				xi[l][i] = fz_ext_is_one(x->type.dims[i]) ? cg_ix_zero() : ix[l][a->dims[i]];
		break;
	case FZ_OP_RESHAPE:
	case FZ_OP_SQUEEZE:
	case FZ_OP_UNSQUEEZE:
		for (int l = 0; l < nl; l++)
			reshape_ix(g, &x->type, &y->type, ix[l], xi[l]);
		break;
	case FZ_OP_PERMUTE:
		for (int l = 0; l < nl; l++)
			for (int i = 0; i < y->type.rank; i++)
				xi[l][a->dims[i]] = ix[l][i];
		break;
	case FZ_OP_SLICE:
		for (int l = 0; l < nl; l++)
			for (int d = 0; d < y->type.rank; d++) {
				cg_ix t = ix[l][d];
				int64_t st = a->step ? a->step[d] : 1;
				if (st != 1 && t.b)
					t.b = cg_iop(g, CG_MUL, t.b, c_int(g->ity, st));
				t.m *= st;
				t.o = t.o * st + a->start[d];
				xi[l][d] = t;
			}
		break;
	case FZ_OP_CAT: {
		int k = a->dim;
		V acc[FZ_VW_MAX];
		bool have = false;
		/* fast path: constant bounds that are multiples of the lanes' base */
		bool fast = true;
		int64_t m = ix[0][k].m;
		for (int l = 0; l < nl && fast; l++)
			fast = ix[l][k].b == ix[0][k].b && ix[l][k].o >= 0 && ix[l][k].o < m;
		int64_t s = 0;
		for (int p = 0; p < n->n_in && fast; p++) {
			fz_ext e = n->in[p]->type.dims[k];
			fast = fz_ext_is_const(e) && e.c % m == 0;
			s += e.c;
		}
		fz_ext start = fz_ext_const(0);
		V startv = c_int(g->ity, 0);
		for (int p = 0; p < n->n_in; p++) {
			const fz_value *xp = n->in[p];
			fz_ext e = xp->type.dims[k];
			if (fz_ext_is_const(e) && e.c == 0)
				continue;
			V ev = cg_ext(g, e);
			V vals[FZ_VW_MAX], in[FZ_VW_MAX];
			/* fast: the lanes share their base, so the whole group
			 * lies in one operand: one test and one index for all
			 * of them, and their loads stay one vector load */
			V in0 = NULL, rel0 = NULL;
			if (fast) {
				V b = ix[0][k].b ? ix[0][k].b : c_int(g->ity, 0);
				V rel = sub(g, b, startv);
				in0 = icmp(g, LLVMIntULT, rel, ev);
				rel0 = sel(g, in0, rel, c_int(g->ity, 0));
			}
			for (int l = 0; l < nl; l++) {
				memcpy(xi[l], ix[l], sizeof(cg_ix) * (size_t)y->type.rank);
				if (fast) {
					in[l] = in0;
					xi[l][k] = (cg_ix){rel0, ix[l][k].o, m};
				} else {
					V rel = sub(g, cg_ix_value(g, ix[l][k]), startv);
					in[l] = icmp(g, LLVMIntULT, rel, ev);
					if (is_const(rel) && is_const(in[l]))
						/* a constant index stays one (lanes
						 * o, o + 1, ...: one vector load) */
						xi[l][k] = (cg_ix){NULL, LLVMConstIntGetZExtValue(in[l]) ?
								   LLVMConstIntGetSExtValue(rel) : 0, 1};
					else
						xi[l][k] = cg_ix_of(sel(g, in[l], rel,
									c_int(g->ity, 0)), 1);
				}
			}
			/* a step of constant indices (pointwise.c's "a row at a
			 * time") takes no lane from most operands: not read */
			bool none = true;
			for (int l = 0; l < nl && none; l++)
				none = is_const(in[l]) && !LLVMConstIntGetZExtValue(in[l]);
			if (!none) {
				cg_value(g, xp, nl, xi, vals);
				for (int l = 0; l < nl; l++)
					acc[l] = have ? sel(g, in[l], vals[l], acc[l]) : vals[l];
				have = true;
			}
			fz_ext ns;
			if (fz_ext_is_const(start) && fz_ext_is_const(e)) {
				start = fz_ext_const(start.c + e.c);
				startv = c_int(g->ity, start.c);
			} else {
				start = fz_ext_sym(0); /* symbolic from here on */
				startv = add(g, startv, ev);
			}
			(void)ns;
		}
		(void)s;
		for (int l = 0; l < nl; l++)
			out[l] = have ? acc[l] : c_undef(cg_ctype(g, y->type.dtype));
		return;
	}
	default:
		cg_fail(g, FZ_EUNSUPPORTED, n, "unknown meta op");
		return;
	}
	cg_value(g, x, nl, xi, out);
}

/* ---- function plumbing ----------------------------------------------------------------- */

LLVMValueRef cg_entry_alloca(cg *g, T t)
{
	LLVMBasicBlockRef cur = current(g);
	LLVMValueRef first = LLVMGetFirstInstruction(g->entry);
	if (first)
		LLVMPositionBuilderBefore(g->b, first);
	else
		at_end(g, g->entry);
	V a = alloca_(g, t);
	at_end(g, cur);
	return a;
}

static V sreg(cg *g, const char *name, int field)
{
	if (g->o.target != FZ_CG_NVPTX && g->o.target != FZ_CG_EMU)
		return NULL;
	LLVMBasicBlockRef cur = current(g);
	at_end(g, g->entry);
	V v;
	if (g->o.target == FZ_CG_EMU) {
		v = zext_or_trunc(g, emu_field(g, field, t_i32(g)), g->ity);
	} else {
		T fty = LLVMFunctionType(t_i32(g), NULL, 0, 0);
		v = zext_or_trunc(g, call_named(g, name, fty, NULL, 0), g->ity);
	}
	at_end(g, cur);
	return v;
}

LLVMValueRef cg_tid(cg *g)
{
	V v = sreg(g, "llvm.nvvm.read.ptx.sreg.tid.x", EMU_CTX_TID);
	return v ? v : c_int(g->ity, 0);
}
LLVMValueRef cg_ntid(cg *g)
{
	V v = sreg(g, "llvm.nvvm.read.ptx.sreg.ntid.x", EMU_CTX_NTID);
	return v ? v : c_int(g->ity, 1);
}
LLVMValueRef cg_ctaid(cg *g)
{
	V v = sreg(g, "llvm.nvvm.read.ptx.sreg.ctaid.x", EMU_CTX_CTAID);
	return v ? v : c_int(g->ity, 0);
}
LLVMValueRef cg_nctaid(cg *g)
{
	V v = sreg(g, "llvm.nvvm.read.ptx.sreg.nctaid.x", EMU_CTX_NCTAID);
	return v ? v : c_int(g->ity, 1);
}

void cg_barrier(cg *g)
{
	if (g->o.target == FZ_CG_EMU) {
		if (g->o.emu_fault == FZ_EMU_FAULT_BARRIER)
			return; /* the seeded fault: a missing __syncthreads() */
		T ps[1] = {t_i32(g)};
		V args[1] = {c_i32(g, g->emu_site++)};
		cg_emu_call(g, EMU_CTX_BARRIER, t_void(g), ps, args, 1);
		return;
	}
	if (g->o.target != FZ_CG_NVPTX)
		return;
	T fty = LLVMFunctionType(t_void(g), NULL, 0, 0);
	call_named(g, "llvm.nvvm.barrier0", fty, NULL, 0);
}

/* EMU: one shuffle through the runtime; the seeded fault has the last
 * lane of each warp skip it (returning its own value). */
LLVMValueRef cg_emu_shfl(cg *g, V x, int lane_mask)
{
	bool isf = type_of(x) == t_f32(g);
	V xi = isf ? bitcast(g, x, t_i32(g)) : x;
	T ps[3] = {t_i32(g), t_i32(g), t_i32(g)};
	V args[3] = {xi, c_i32(g, lane_mask), c_i32(g, g->emu_site++)};
	V r;
	if (g->o.emu_fault == FZ_EMU_FAULT_SHFL) {
		V lane = urem(g, cg_tid(g), c_int(g->ity, 32));
		V skip = icmp(g, LLVMIntEQ, lane, c_int(g->ity, 31));
		LLVMBasicBlockRef from = current(g), call = block(g, "shfl"),
			cont = block(g, "shfl.done");
		cond_br(g, skip, cont, call);
		at_end(g, call);
		V y = cg_emu_call(g, EMU_CTX_SHFL, t_i32(g), ps, args, 3);
		br(g, cont);
		at_end(g, cont);
		r = phi(g, t_i32(g));
		phi_add(r, xi, from);
		phi_add(r, y, call);
	} else {
		r = cg_emu_call(g, EMU_CTX_SHFL, t_i32(g), ps, args, 3);
	}
	return isf ? bitcast(g, r, t_f32(g)) : r;
}

static V shfl32(cg *g, V x, int lane_mask)
{
	if (g->o.target == FZ_CG_EMU)
		return cg_emu_shfl(g, x, lane_mask);
	bool isf = type_of(x) == t_f32(g);
	T ty = isf ? t_f32(g) : t_i32(g);
	T ps[4] = {t_i32(g), ty, t_i32(g), t_i32(g)};
	T fty = LLVMFunctionType(ty, ps, 4, 0);
	V args[4] = {c_i32(g, -1), x, c_i32(g, lane_mask), c_i32(g, 0x1f)};
	return call_named(g, isf ? "llvm.nvvm.shfl.sync.bfly.f32" :
			  "llvm.nvvm.shfl.sync.bfly.i32", fty, args, 4);
}

LLVMValueRef cg_shfl_bfly(cg *g, V x, int lane_mask)
{
	T t = type_of(x);
	if (t == t_f32(g) || t == t_i32(g))
		return shfl32(g, x, lane_mask);
	if (t == t_i1(g))
		return trunc_(g, shfl32(g, zext(g, x, t_i32(g)), lane_mask), t_i1(g));
	/* 64-bit: two halves */
	V u = t == t_f64(g) ? bitcast(g, x, t_i64(g)) : x;
	V lo = shfl32(g, trunc_(g, u, t_i32(g)), lane_mask);
	V hi = shfl32(g, trunc_(g, lshr(g, u, c_i64(g, 32)), t_i32(g)), lane_mask);
	V r = or_(g, zext(g, lo, t_i64(g)), shl(g, zext(g, hi, t_i64(g)), c_i64(g, 32)));
	return t == t_f64(g) ? bitcast(g, r, t_f64(g)) : r;
}

void cg_host_chunk(cg *g, V total, V *begin, V *end)
{
	if (g->serial) {
		/* part 0: [0, total); the others: [total, total) */
		V first = icmp(g, LLVMIntEQ, g->part, c_int(g->ity, 0));
		*begin = sel(g, first, c_int(g->ity, 0), total);
		*end = total;
		return;
	}
	/* chunk = ceil(total / nparts); begin = min(part * chunk, total):
	 * part * chunk < total + chunk, which fits the index type as total
	 * does (idx32 leaves 8x headroom) */
	V n = g->nparts;
	V chunk = udiv(g, add(g, total, sub(g, n, c_int(g->ity, 1))), n);
	V b = mul(g, g->part, chunk);
	V e = add(g, b, chunk);
	*begin = sel(g, icmp(g, LLVMIntULT, b, total), b, total);
	*end = sel(g, icmp(g, LLVMIntULT, e, total), e, total);
}

int cg_vector_bytes(cg *g)
{
	return g->o.target == FZ_CG_HOST && g->c->vector_bytes > 16 ? g->c->vector_bytes : 16;
}

void cg_loop_begin(cg *g, cg_loop *L, V start, V limit, V step)
{
	L->pre = current(g);
	L->head = block(g, "loop");
	L->body = block(g, "body");
	L->exit = block(g, "done");
	L->start = start;
	L->step = step;
	br(g, L->head);
	at_end(g, L->head);
	L->iv = phi(g, g->ity);
	phi_add(L->iv, start, L->pre);
	cond_br(g, icmp(g, LLVMIntULT, L->iv, limit), L->body, L->exit);
	at_end(g, L->body);
	L->mark = cg_memo_mark(g);
	L->cse_mark = g->n_cse;
}

void cg_loop_end(cg *g, cg_loop *L)
{
	V next = add(g, L->iv, L->step);
	phi_add(L->iv, next, current(g));
	br(g, L->head);
	at_end(g, L->exit);
	cg_memo_pop(g, L->mark);
	g->n_cse = L->cse_mark;
}

/* EMU: the context, and each buffer's element count at the bound sizes
 * in i64 from the symbols as passed (not from the index arithmetic the
 * checks are to check). */
static void emu_extents(cg *g, V syms)
{
	const fz_region *r = g->r;
	g->emu = param(g, 3);
	V s64[FZ_MAX_SYMS] = {0};
	for (int i = 0; i < g->k->n_syms; i++) {
		int s = g->k->syms[i];
		s64[s] = load(g, t_i64(g), gep(g, t_i64(g), syms, c_i64(g, s)), 8);
	}
	for (int i = 0; i < r->n_in + r->n_out; i++) {
		const fz_type *ty = &(i < r->n_in ? r->in[i] : r->out[i - r->n_in])->type;
		fz_ext e;
		if (!fz_type_numel(ty, &e)) {
			cg_fail(g, FZ_EUNSUPPORTED, NULL, "element count overflows");
			e = fz_ext_const(0);
		}
		V v = c_i64(g, e.c);
		for (int s = 0; s < FZ_MAX_SYMS; s++)
			for (int p = fz_ext_power(e, s); p > 0 && s64[s]; p--)
				v = mul(g, v, s64[s]);
		g->ext[i] = v;
	}
}

void cg_function_begin(cg *g, const char *name)
{
	const fz_region *r = g->r;
	int nb = r->n_in + r->n_out;
	T fty;
	if (g->o.target == FZ_CG_NVPTX) {
		int np = nb + 1 + g->k->n_syms;
		T *ps = calloc((size_t)np, sizeof *ps);
		if (!ps) {
			cg_fail(g, FZ_ENOMEM, NULL, "out of memory");
			return;
		}
		for (int i = 0; i < nb + 1; i++)
			ps[i] = t_ptr(g, g->as);
		for (int i = 0; i < g->k->n_syms; i++)
			ps[nb + 1 + i] = t_i64(g);
		fty = LLVMFunctionType(t_void(g), ps, (unsigned)np, 0);
		free(ps);
	} else {
		/* host: (bufs, syms, err, part, nparts); EMU: (bufs, syms, err,
		 * the thread's context) */
		T ps[5] = {t_ptr(g, 0), t_ptr(g, 0), t_ptr(g, 0), t_i64(g), t_i64(g)};
		if (g->o.target == FZ_CG_EMU)
			ps[3] = t_ptr(g, 0);
		fty = LLVMFunctionType(t_void(g), ps, g->o.target == FZ_CG_EMU ? 4 : 5, 0);
	}
	g->fn = LLVMAddFunction(g->mod, name, fty);
	/* zmm for the skeletons' lanes (target_host.c); attention's host
	 * kernels pick their own widths */
	if (cg_host_avx512(g) && g->r->kind != FZ_REGION_ATTENTION)
		LLVMAddAttributeAtIndex(g->fn, LLVMAttributeFunctionIndex,
					LLVMCreateStringAttribute(g->ctx, "prefer-vector-width", 19,
								  "512", 3));
	g->entry = block(g, "entry");
	LLVMBasicBlockRef body = block(g, "start");
	at_end(g, g->entry);
	unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
	unsigned readonly = LLVMGetEnumAttributeKindForName("readonly", 8);
	unsigned nocapture = LLVMGetEnumAttributeKindForName("nocapture", 9);
	if (g->o.target == FZ_CG_NVPTX) {
		LLVMSetFunctionCallConv(g->fn, LLVMPTXKernelCallConv);
		/* inputs are noalias readonly: said here, not left to the
		 * optimizer to infer, so that loads are ld.global.nc whatever
		 * the pass pipeline */
		for (int i = 0; i < nb; i++) {
			g->buf[i] = param(g, (unsigned)i);
			LLVMAddAttributeAtIndex(g->fn, (unsigned)i + 1,
						LLVMCreateEnumAttribute(g->ctx, noalias, 0));
			LLVMAddAttributeAtIndex(g->fn, (unsigned)i + 1,
						LLVMCreateEnumAttribute(g->ctx, nocapture, 0));
			if (i < r->n_in)
				LLVMAddAttributeAtIndex(g->fn, (unsigned)i + 1,
							LLVMCreateEnumAttribute(g->ctx, readonly, 0));
		}
		g->err = param(g, (unsigned)nb);
		for (int i = 0; i < g->k->n_syms; i++)
			g->sym[g->k->syms[i]] = zext_or_trunc(g, param(g, (unsigned)(nb + 1 + i)),
							       g->ity);
		/* nvvm.annotations: {fn, "kernel", 1} for the NVPTX backend */
		V md[3] = {g->fn, LLVMMDStringInContext(g->ctx, "kernel", 6),
			   c_i32(g, 1)};
		LLVMAddNamedMetadataOperand(g->mod, "nvvm.annotations",
					    LLVMMDNodeInContext(g->ctx, md, 3));
	} else {
		V bufs = param(g, 0), syms = param(g, 1);
		g->err = param(g, 2);
		if (g->o.target == FZ_CG_EMU) {
			/* one part: the GPU's grid is the runtime's business */
			g->part = c_int(g->ity, 0);
			g->nparts = c_int(g->ity, 1);
		} else {
			g->part = zext_or_trunc(g, param(g, 3), g->ity);
			g->nparts = zext_or_trunc(g, param(g, 4), g->ity);
		}
		for (int i = 0; i < nb; i++)
			g->buf[i] = load(g, t_ptr(g, 0), gep(g, t_ptr(g, 0), bufs, c_i64(g, i)), 8);
		if (g->k->n_scratch > 0)
			g->scratch = load(g, t_ptr(g, 0), gep(g, t_ptr(g, 0), bufs,
							      c_i64(g, nb)), 8);
		for (int i = 0; i < g->k->n_syms; i++) {
			int s = g->k->syms[i];
			V x = load(g, t_i64(g), gep(g, t_i64(g), syms, c_i64(g, s)), 8);
			g->sym[s] = zext_or_trunc(g, x, g->ity);
		}
		if (g->o.target == FZ_CG_EMU)
			emu_extents(g, syms);
		else
			cg_tables_begin(g);
	}
	at_end(g, body);
}

void cg_function_end(cg *g)
{
	if (g->streamed) {
		/* the part's streaming stores done before it returns */
		T ft = LLVMFunctionType(t_void(g), NULL, 0, 0);
		V f = LLVMGetNamedFunction(g->mod, "llvm.x86.sse.sfence");
		if (!f)
			f = LLVMAddFunction(g->mod, "llvm.x86.sse.sfence", ft);
		LLVMBuildCall2(g->b, ft, f, NULL, 0, "");
		g->streamed = false;
	}
	ret_void(g);
	LLVMBasicBlockRef first = LLVMGetNextBasicBlock(g->entry);
	at_end(g, g->entry);
	br(g, first);
}
