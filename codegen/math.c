/*
 * math.c: the math functions of the float unary and binary ops, as IR.
 *
 * The NVPTX backend has no exp, log, sin or erf of its own (CUDA gets them
 * from libdevice, which fusec does not link), and the host's libm would make
 * the CPU compute something the GPU does not. So the f32 functions are
 * emitted here, inline, from the same code on both targets: the CPU tests
 * test the GPU's math. Each one is the textbook method, with its error
 * budget next to it; all stay within a few ulp of f32, far inside the f32
 * tolerance of 1e-5 relative that `run --check` applies:
 *
 *   exp     x = k ln2 + r, |r| <= ln2/2 (Cody-Waite with fma), a degree-6
 *           polynomial for e^r fitted for relative error (3.1e-9; f64:
 *           degree-13 Taylor), scaled by 2^k in two steps so that k down
 *           to -150 reaches the subnormals (f32: two multiplications,
 *           through which a NaN stays NaN)
 *   exp2    k = rint(x), r = (x - k) ln2 (exact subtraction), as exp
 *   expm1   degree-9 Taylor below |x| < ln2/2 (no cancellation), exp - 1
 *           above
 *   log     x = 2^e m, m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f/(2+f),
 *           log(1+f) = f - f^2/2 + s (f^2/2 + R(s^2)) (fdlibm's form with
 *           Taylor coefficients; truncation 1e-10); subnormals prescaled
 *   log2    e + log(m) log2(e);  log1p: Kahan's log(u) x / (u - 1)
 *   sin cos k = rint(x 2/pi), r by three-part Cody-Waite with fma, odd and
 *           even polynomials on |r| <= pi/4, quadrant k mod 4
 *   tanh    f32: a rational function of x on |x| <= 7.9 (5.1 ulp, see
 *           tanh32); f64: e / (e + 2) with e = expm1(2|x|), relative
 *           accuracy at 0 too
 *   sigmoid f32: 1/(1 + e) or e/(1 + e) with e = e^-|x| (sigmoid32),
 *           a divisor in [1, 2]
 *   erf     in f64, the Taylor series (56 terms) for |x| < 3.95, which
 *           loses at most 6 of f64's 16 digits to cancellation; 1 above
 *   pow     exp2(b log2 |a|) with C's special cases (negative base with an
 *           integer exponent, b = 0, a = 1), f32 through those steps in
 *           f64 (within an ulp; in f32 they were 28 ulp off for x^3 near
 *           1000); a constant b of 0, 1, 2 or -1 is 1, a, a a or 1/a, the
 *           correctly rounded result
 *   fmod    in f64: a - trunc(a/b) b, corrected by one b when the quotient
 *           rounded up; exact while the quotient is below 2^29
 *
 * The host with AVX-512 (cg_host_avx512) differs in one place, and not in
 * its results: cg_value hands the lanes of an f32 exp or sigmoid (4, 8 or
 * 16 of them) to cg_math_lanes as one vector, and vexpf_ computes expf_'s
 * steps in lanes but ends with vscalefps instead of the two
 * multiplications by powers of 2 (13 instructions for 16 lanes where the
 * generic IR took 22, register copies aside), and for sigmoid's e^-|x|
 * folds the negation into its constants. vscalefps scales by 2^k and
 * rounds once, as the exact first multiplication and the second do, a
 * NaN reaches it as NaN, and each negated step is the exact negative of
 * expf_'s; so the host's results are the generic path's bit for bit (all
 * 2^32 f32 inputs compared by tools/bench/exp_bits.sh, NaN as NaN;
 * test_codegen's host_exp_matches_generic sweeps the edges against the emu
 * target on every run), and the CPU tests of the math still test the
 * GPU's. A host without AVX-512 (AVX2) takes the same vector of lanes to
 * vexpf_near: where every lane is within 86 of 0 it scales by 2^k with an
 * integer addition to the exponent field (the product is a normal number
 * there, so exact, as the two multiplications are), and a vector with a
 * lane beyond branches to the generic IR (14 instructions for 8 lanes
 * where the generic IR takes 21; a softmax 1.2x, bits compared as above).
 * (Division stays vdivps: vrcp14ps and a Newton step, not
 * correctly rounded, measured slower in tanh; tanh32 keeps its IR, its
 * small-x select put so that the host masks its last multiplication with
 * it.)
 *
 * The GPU differs in one place, and not in its results either: the
 * reciprocals of sigmoid and tanh, whose divisors lie in [1, 185]
 * (recip_small), are rcp.approx and a Newton step there, the fast path of
 * ptxas's own correctly rounded division without the slow path it puts
 * around each one, and the division on the host and emu
 * (test_cuda's rcp_sequence_is_division and math_matches_host; test_emu's
 * math_matches_host holds emu to the host).
 *
 * f64 values on the host call libm (the JIT resolves exp, log, ... from the
 * process). On the GPU (and emu) the same methods run in f64, with longer
 * polynomials (exp and expm1 to r^13, log's R to z^11, sin and cos to
 * r^19 and r^18) and f64 splits of ln2 and pi/2, so each is within a few
 * ulp of f64 on its reduced range; erf in f64 is the series below 2 and a
 * continued fraction for erfc above (erf64_). pow is exp2(b log2|a|),
 * its error growing with |b log2|a|| (1e-13 relative at 1000).
 */
#include <math.h>
#include <string.h>

#include "cg.h"
#include "llvm.h"

static bool is_vec(V x) { return LLVMGetTypeKind(type_of(x)) == LLVMVectorTypeKind; }

/* x's type: f64 (true) or f32 */
static bool is64(cg *g, V x) { return type_of(x) == t_f64(g); }

/* the constant k of x's type (in every lane of a vector) */
static V kc(V x, double k)
{
	T t = type_of(x);
	if (!is_vec(x))
		return c_real(t, k);
	return c_splat(c_real(LLVMGetElementType(t), k), (int)LLVMGetVectorSize(t));
}

static V fma3(cg *g, V a, V b, V c)
{
	V args[3] = {a, b, c};
	return call_intrinsic(g, "llvm.fma", type_of(a), type_of(a), args, 3);
}

static V un(cg *g, const char *name, V x)
{
	return call_intrinsic(g, name, type_of(x), type_of(x), &x, 1);
}

/* c[0] + x (c[1] + x (c[2] + ...)) */
static V poly(cg *g, V x, const double *c, int n)
{
	V acc = kc(x, c[n - 1]);
	for (int i = n - 2; i >= 0; i--)
		acc = fadd(g, fmul(g, acc, x), kc(x, c[i]));
	return acc;
}

static V isnan_(cg *g, V x) { return fcmp(g, LLVMRealUNO, x, x); }

/* rint(x) as i32 (saturating: x is clamped to a few thousand anyway) */
static V to_i32(cg *g, V x)
{
	const char *sat = "llvm.fptosi.sat";
	unsigned id = LLVMLookupIntrinsicID(sat, strlen(sat));
	T tys[2] = {t_i32(g), type_of(x)};
	V f = LLVMGetIntrinsicDeclaration(g->mod, id, tys, 2);
	return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, tys, 2), f, &x, 1, "");
}

/* x's f32 lanes as i32 (a vector of them where x is one), and back */
static V as_i32(cg *g, V x)
{
	return bitcast(g, x, is_vec(x) ? t_vec(t_i32(g), LLVMGetVectorSize(type_of(x))) : t_i32(g));
}

static V as_f32(cg *g, V x)
{
	return bitcast(g, x, is_vec(x) ? t_vec(t_f32(g), LLVMGetVectorSize(type_of(x))) : t_f32(g));
}

/* the i32 constant k shaped as x (an i32 or a vector of them) */
static V ki32(cg *g, V x, int64_t k)
{
	return is_vec(x) ? c_splat(c_i32(g, k), (int)LLVMGetVectorSize(type_of(x))) : c_i32(g, k);
}

/* 2^k (k: i32, or f32 lanes' i32s) of p's type, k within its normal
 * exponents */
static V pow2(cg *g, V p, V k)
{
	if (!is64(g, p))
		return as_f32(g, shl(g, add(g, k, ki32(g, k, 127)), ki32(g, k, 23)));
	V e = add(g, sext(g, k, t_i64(g)), c_i64(g, 1023));
	return bitcast(g, shl(g, e, c_i64(g, 52)), t_f64(g));
}

/* f32 p 2^k (k: i32, or f32 lanes' i32s) as (p 2^k1) 2^k2, two
 * multiplications where scale2 adds k1 to p's exponent field: the first
 * is as exact, the second the same rounding, and a NaN p stays NaN
 * whatever k is, so no select for it (an instruction fewer on the GPU) */
static V mul_pow2(cg *g, V p, V k)
{
	V k1 = ashr(g, k, ki32(g, k, 1));
	return fmul_exact(g, fmul_exact(g, p, pow2(g, p, k1)), pow2(g, p, sub(g, k, k1)));
}

/* p * 2^k for p in [0.5, 2) and k (i32) in [-250, 250] (f32) or [-2040,
 * 2040] (f64): p * 2^k1 by adding k1 to p's exponent field (a normal
 * number: exact, as the multiplication by 2^k1 it replaces; one
 * instruction for two), then one multiplication by 2^k2, the only
 * rounding (a subnormal result) or overflow. */
static V scale2(cg *g, V p, V k)
{
	V k1 = ashr(g, k, c_i32(g, 1)), k2 = sub(g, k, k1);
	V s2 = pow2(g, p, k2);
	V p1;
	if (!is64(g, p)) {
		p1 = add(g, bitcast(g, p, t_i32(g)), shl(g, k1, c_i32(g, 23)));
		p1 = bitcast(g, p1, t_f32(g));
	} else {
		V e = shl(g, sext(g, k1, t_i64(g)), c_i64(g, 52));
		p1 = bitcast(g, add(g, bitcast(g, p, t_i64(g)), e), t_f64(g));
	}
	return fmul(g, p1, s2);
}

/* p 2^k in f32 lanes (4, 8 or 16: cg_math_lanes) for k a float holding an
 * integer in [-150, 128] and p in [0.7, 1.5]: one vscalefps (AVX-512F and
 * VL), for the generic path's eight. It computes p 2^floor(k) and
 * rounds once under the MXCSR (to nearest even by default; flushed to 0
 * with FTZ, as vmulps): exactly what expf_'s exact multiplication by
 * 2^k1 and its second by 2^k2 make, subnormal results and overflow to inf
 * included, so the two agree bit for bit
 * (tests/test_codegen.c's host_exp_matches_generic sweeps it). A NaN p
 * (from a NaN x, which clampf passes through) gives a NaN, as there. An
 * AVX2 host modeling AVX-512 (fz_host_model) makes those two
 * multiplications instead. */
static V scalef(cg *g, V p, V k)
{
	unsigned n = LLVMGetVectorSize(type_of(p));
	if (g->c->host_model) /* expf_'s two multiplications (fz_host_model) */
		return mul_pow2(g, p, LLVMBuildFPToSI(g->b, k, t_vec(t_i32(g), n), ""));
	V all = n == 16 ? c_int(t_i16(g), -1) : c_int(t_i8(g), -1);
	V args[5] = {p, k, kc(p, 0.0), all, c_i32(g, 4)}; /* 4: the MXCSR's rounding */
	return call_intrinsic(g, n == 16 ? "llvm.x86.avx512.mask.scalef.ps.512" :
			      n == 8 ? "llvm.x86.avx512.mask.scalef.ps.256" :
			      "llvm.x86.avx512.mask.scalef.ps.128", NULL, NULL, args, n == 16 ? 5 : 4);
}

/* 1/d correctly rounded, for f32 d in [1, 2^64] (or NaN): the division
 * on the host and emu; on the GPU rcp.approx.ftz (MUFU.RCP, within an ulp)
 * and one Newton step with fma, y0 + y0 (1 - d y0). That is the fast path
 * ptxas itself takes for rcp.rn.f32 and div.rn.f32 where the divisor's
 * exponent allows it (a normal result), and it is correctly rounded for
 * every such d: it depends only on d's mantissa there, and test_cuda's
 * rcp_sequence_is_division compares it with rcp.rn.f32 for all 2^23 of
 * them (at eight exponents), so the three targets agree bit for bit. What
 * it leaves out is the range test, branch and call of the slow path that
 * ptxas puts around every division (six instructions, and a convergence
 * barrier that keeps it from interleaving the elements of a thread):
 * sigmoid's and tanh's divisors are known to be in range. */
static V recip_small(cg *g, V d)
{
	if (g->o.target != FZ_CG_NVPTX || is_vec(d) || is64(g, d))
		return fdiv(g, kc(d, 1.0), d);
	V y0 = call_named(g, "llvm.nvvm.rcp.approx.ftz.f",
			  LLVMFunctionType(t_f32(g), (T[]){t_f32(g)}, 1, 0), &d, 1);
	V e = fma3(g, fneg(g, d), y0, kc(d, 1.0));
	return fma3(g, y0, e, y0);
}

/* 1/n!: e^r's Taylor coefficients; f32 takes 8 (truncation 3e-9 on
 * |r| <= ln2/2), f64 14 (4e-18) */
static const double EXP_C[] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120,
			       1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880,
			       1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600,
			       1.0 / 6227020800.0};

/* x within [lo, hi]; a NaN stays NaN (exp and exp2 return x for it, and
 * what they computed from it, poison after fptosi, is not selected) */
static V clampf(cg *g, V x, double lo, double hi)
{
	x = sel(g, fcmp(g, LLVMRealOGT, x, kc(x, hi)), kc(x, hi), x);
	return sel(g, fcmp(g, LLVMRealOLT, x, kc(x, lo)), kc(x, lo), x);
}

/* e^r on |r| <= ln2/2 for f32: 1 + r + r^2 (c2 + c3 r + ... + c6 r^4),
 * c2..c6 fitted for the least relative error (3.1e-9 in exact
 * arithmetic), one fma fewer than the degree-7 Taylor polynomial it
 * replaces (3e-9); the whole of expf_ in f32 with fma then rounds within
 * 0.88 ulp of exp (0.93 with Taylor), on 20 million points of [-87, 88.7]. */
static const double EXP32_C[] = {1.0, 1.0, 0.49999993433583884, 0.1666652043379395,
				 0.04166839072024309, 0.00836874093784797,
				 0.0013814522761762496};

static V expf_(cg *g, V x)
{
	const double ln2 = 0.69314718055994530942;
	bool d = is64(g, x);
	/* ln2 = hi + lo, each of x's type (f64: lo from the exact value) */
	double hi = d ? ln2 : (double)(float)ln2;
	double lo = d ? 2.3190468138462996e-17 : (double)(float)(ln2 - hi);
	V xc = d ? clampf(g, x, -746.0, 710.0) : clampf(g, x, -104.0, 89.0);
	V k, ki, p;
	if (d) {
		k = un(g, "llvm.rint", fmul(g, xc, kc(x, 1.4426950408889634)));
		ki = fptosi(g, k, t_i32(g));
	} else {
		/* k = x log2(e) rounded to an integer by adding 1.5 2^23, whose
		 * ulp is 1, in the fma (exact: |x log2 e| < 2^22) and taking it
		 * off again; the integer is the sum's low mantissa bits, so no
		 * rint and no conversion (two p0-only instructions for 16
		 * lanes) */
		V t = fma3(g, xc, kc(x, 1.4426950408889634), kc(x, 12582912.0));
		k = fsub_exact(g, t, kc(x, 12582912.0));
		ki = as_i32(g, t);
		ki = sub(g, ki, ki32(g, ki, 0x4b400000));
	}
	V r = fma3(g, fneg(g, k), kc(x, hi), xc);
	r = fma3(g, fneg(g, k), kc(x, lo), r);
	p = d ? poly(g, r, EXP_C, 14) : poly(g, r, EXP32_C, 7);
	if (d)
		return sel(g, isnan_(g, x), x, scale2(g, p, ki));
	/* f32: a NaN p comes of a NaN x, which the clamp and the fma pass
	 * through, and stays NaN (mul_pow2) */
	return mul_pow2(g, p, ki);
}

/* expf_'s steps in f32 lanes up to its polynomial, for the host's vector
 * exps below: p = e^r and t, the fma whose low mantissa bits hold k (the
 * float k as well), such that e^x = p 2^k (e^-x where neg); x within
 * expf_'s clamp already. For e^-x, x is not negated: the clamp of -x to
 * [-104, 89] is the negative of x's to [-89, 104]; k comes from the same
 * fma with log2 e negated; the two fma that reduce -x give the exact
 * negative s of its r when they reduce x (rounding to nearest is
 * symmetric); and the polynomial in r is Horner's in s with the odd
 * coefficients negated, each step the exact negative of expf_'s or the
 * same (one instruction fewer of sigmoid's). */
static V vexp_poly(cg *g, V xc, bool neg, V *t, V *k)
{
	const double ln2 = 0.69314718055994530942, hi = (double)(float)ln2;
	const double lo = (double)(float)(ln2 - hi);
	*t = fma3(g, xc, kc(xc, neg ? -1.4426950408889634 : 1.4426950408889634),
		  kc(xc, 12582912.0));
	*k = fsub_exact(g, *t, kc(xc, 12582912.0));
	V nk = neg ? *k : fneg(g, *k);
	V r = fma3(g, nk, kc(xc, hi), xc);
	r = fma3(g, nk, kc(xc, lo), r);
	double c[7];
	for (int i = 0; i < 7; i++)
		c[i] = neg && i % 2 ? -EXP32_C[i] : EXP32_C[i];
	return poly(g, r, c, 7);
}

/* expf_ of f32 lanes on the host with AVX-512 (cg_math_lanes): e^x, or
 * e^-x where neg (sigmoid's), the generic expf_'s result bit for bit:
 * vexp_poly's steps (vrangeps would clamp in one instruction, but it
 * returns the bound for a NaN), then 2^k by scalef, and no NaN select
 * (see scalef). */
static V vexpf_(cg *g, V x, bool neg)
{
	V xc = neg ? clampf(g, x, -89.0, 104.0) : clampf(g, x, -104.0, 89.0);
	V t, k;
	V p = vexp_poly(g, xc, neg, &t, &k); /* sets k: not in scalef's arguments */
	return scalef(g, p, k);
}

/* expf_ of f32 lanes on a host without AVX-512 (AVX2: cg_math_lanes):
 * e^x, or e^-x where neg, the generic expf_'s result bit for bit, in
 * fewer instructions where every lane has |x| <= 86, as a softmax's
 * x - max and the activations of a network have. There p 2^k is a normal
 * number (|k| <= 124, p in [0.7, 1.5]), the product exact, and an
 * integer addition to p's exponent field makes it: k << 23 is t's bits
 * shifted by 23, since t's are 0x4b400000 + k and 0x4b400000 << 23
 * leaves 0 in 32 bits. No clamp is needed below 86 either: the fast path
 * is 14 instructions for 8 lanes where expf_'s generic IR is 21 (its two
 * multiplications by powers of 2 take nine with their exponents). A
 * vector with a lane beyond (or a NaN: the compare is unordered) branches
 * to expf_ itself for all its lanes, whose vector form is the same IR as
 * its scalar one. */
static V vexpf_near(cg *g, V x, bool neg)
{
	unsigned n = LLVMGetVectorSize(type_of(x));
	V t, k;
	V p = vexp_poly(g, x, neg, &t, &k);
	V fast = as_f32(g, add(g, as_i32(g, p), shl(g, as_i32(g, t), ki32(g, t, 23))));
	V far = fcmp(g, LLVMRealUGT, un(g, "llvm.fabs", x), kc(x, 86.0));
	T bits = LLVMIntTypeInContext(g->ctx, n);
	V any = icmp(g, LLVMIntNE, bitcast(g, far, bits), c_int(bits, 0));
	V args[2] = {any, c_int(t_i1(g), 0)};
	any = call_intrinsic(g, "llvm.expect", t_i1(g), t_i1(g), args, 2);
	LLVMBasicBlockRef pre = current(g), wide = block(g, "exp.wide"),
			  join = block(g, "exp.done");
	cond_br(g, any, wide, join);
	at_end(g, wide);
	V slow = expf_(g, neg ? fneg(g, x) : x);
	LLVMBasicBlockRef end = current(g);
	br(g, join);
	at_end(g, join);
	V y = phi(g, type_of(x));
	phi_add(y, fast, pre);
	phi_add(y, slow, end);
	return y;
}

static V exp2f_(cg *g, V x)
{
	bool d = is64(g, x);
	V xc = d ? clampf(g, x, -1080.0, 1025.0) : clampf(g, x, -152.0, 129.0);
	V k = un(g, "llvm.rint", xc);
	V r = fmul(g, fsub(g, xc, k), kc(x, 0.69314718055994530942));
	V y = scale2(g, poly(g, r, EXP_C, d ? 14 : 8), fptosi(g, k, t_i32(g)));
	return sel(g, isnan_(g, x), x, y);
}

static V expm1f_(cg *g, V x)
{
	/* 1/(n+1)!: f32 takes 9, f64 14 */
	static const double c[] = {1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120,
				   1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880,
				   1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600,
				   1.0 / 6227020800.0, 1.0 / 87178291200.0};
	V small = fcmp(g, LLVMRealOLT, un(g, "llvm.fabs", x), kc(x, 0.34657359));
	V ps = fmul(g, x, poly(g, x, c, is64(g, x) ? 14 : 9));
	V pl = fsub(g, expf_(g, x), kc(x, 1.0));
	return sel(g, small, ps, pl);
}

/* log(m) for m in [sqrt(1/2), sqrt(2)) as f - hfsq + s (hfsq + R): R's
 * Taylor coefficients 2/(2k+1), f32 to z^5 (1e-10), f64 to z^11. */
static V log_core(cg *g, V m)
{
	static const double R[] = {0, 2.0 / 3, 2.0 / 5, 2.0 / 7, 2.0 / 9, 2.0 / 11,
				   2.0 / 13, 2.0 / 15, 2.0 / 17, 2.0 / 19, 2.0 / 21,
				   2.0 / 23};
	V f = fsub(g, m, kc(m, 1.0));
	V s = fdiv(g, f, fadd(g, kc(m, 2.0), f));
	V z = fmul(g, s, s);
	V Rz = poly(g, z, R, is64(g, m) ? 12 : 6);
	V hfsq = fmul(g, kc(m, 0.5), fmul(g, f, f));
	return fsub(g, f, fsub(g, hfsq, fmul(g, s, fadd(g, hfsq, Rz))));
}

/* x = 2^e m; returns m in [sqrt(1/2), sqrt(2)) and e in x's type. */
static V log_split(cg *g, V x, V *e_out)
{
	bool d = is64(g, x);
	T it = d ? t_i64(g) : t_i32(g);
	int mb = d ? 52 : 23; /* mantissa bits */
	V sub_ = fcmp(g, LLVMRealOLT, x, kc(x, d ? 0x1p-1022 : 0x1p-126));
	V xs = sel(g, sub_, fmul(g, x, kc(x, d ? 0x1p54 : 0x1p23)), x);
	V bits = bitcast(g, xs, it);
	V e = sext_or_trunc(g, sub(g, lshr(g, bits, c_int(it, mb)), c_int(it, d ? 1023 : 127)),
			    t_i32(g));
	e = sel(g, sub_, sub(g, e, c_i32(g, d ? 54 : 23)), e);
	V m = bitcast(g, or_(g, and_(g, bits, c_int(it, d ? 0xfffffffffffffll : 0x7fffff)),
			     c_int(it, d ? 0x3ff0000000000000ll : 0x3f800000)), type_of(x));
	V big = fcmp(g, LLVMRealOGT, m, kc(x, d ? 1.4142135623730951 : 1.41421356));
	m = sel(g, big, fmul(g, m, kc(x, 0.5)), m);
	e = sel(g, big, add(g, e, c_i32(g, 1)), e);
	*e_out = sitofp(g, e, type_of(x));
	return m;
}

static V log_special(cg *g, V x, V y)
{
	y = sel(g, fcmp(g, LLVMRealOEQ, x, kc(x, INFINITY)), x, y);
	y = sel(g, fcmp(g, LLVMRealOEQ, x, kc(x, 0.0)), kc(x, -INFINITY), y);
	return sel(g, fcmp(g, LLVMRealULT, x, kc(x, 0.0)), kc(x, NAN), y);
}

static V logf_(cg *g, V x)
{
	V e;
	V m = log_split(g, x, &e);
	V L = log_core(g, m);
	/* ln2 = hi + lo, hi with trailing zeros so that e hi is exact */
	bool d = is64(g, x);
	V hi = kc(x, d ? 6.93147180369123816490e-01 : 6.9313812256e-01);
	V lo = kc(x, d ? 1.90821492927058770002e-10 : 9.0580006145e-06);
	V y = fadd(g, fmul(g, e, hi), fadd(g, L, fmul(g, e, lo)));
	return log_special(g, x, y);
}

static V log2f_(cg *g, V x)
{
	V e;
	V m = log_split(g, x, &e);
	V y = fadd(g, e, fmul(g, log_core(g, m), kc(x, 1.4426950408889634)));
	return log_special(g, x, y);
}

static V log1pf_(cg *g, V x)
{
	V u = fadd(g, kc(x, 1.0), x);
	V d = fsub(g, u, kc(x, 1.0));
	V y = fmul(g, logf_(g, u), fdiv(g, x, d));
	y = sel(g, fcmp(g, LLVMRealOEQ, d, kc(x, 0.0)), x, y);
	y = sel(g, fcmp(g, LLVMRealOEQ, x, kc(x, INFINITY)), x, y);
	return sel(g, fcmp(g, LLVMRealOEQ, u, kc(x, 0.0)), kc(x, -INFINITY), y);
}

static V sincosf_(cg *g, V x, bool cosine)
{
	const double pio2 = 1.57079632679489661923;
	bool d = is64(g, x);
	/* pi/2 = p1 + p2 + p3, each of x's type */
	float f1 = (float)pio2;
	float f2 = (float)(pio2 - (double)f1);
	float f3 = (float)(pio2 - (double)f1 - (double)f2);
	double p1 = d ? pio2 : f1, p2 = d ? 6.123233995736766e-17 : f2,
	       p3 = d ? -1.4973849048591698e-33 : f3;
	V k = un(g, "llvm.rint", fmul(g, x, kc(x, 0.63661977236758134)));
	V nk = fneg(g, k);
	V r = fma3(g, nk, kc(x, p1), x);
	r = fma3(g, nk, kc(x, p2), r);
	r = fma3(g, nk, kc(x, p3), r);
	/* Taylor on |r| <= pi/4: f32 to r^9 and r^10, f64 to r^19, r^18 */
	static const double S[] = {-1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880,
				   -1.0 / 39916800, 1.0 / 6227020800.0,
				   -1.0 / 1307674368000.0, 1.0 / 355687428096000.0,
				   -1.0 / 121645100408832000.0};
	static const double C[] = {-0.5, 1.0 / 24, -1.0 / 720, 1.0 / 40320,
				   -1.0 / 3628800, 1.0 / 479001600,
				   -1.0 / 87178291200.0, 1.0 / 20922789888000.0,
				   -1.0 / 6402373705728000.0};
	V z = fmul(g, r, r);
	V s = fadd(g, r, fmul(g, fmul(g, r, z), poly(g, z, S, d ? 9 : 4)));
	V c = fadd(g, kc(x, 1.0), fmul(g, z, poly(g, z, C, d ? 9 : 5)));
	V q = to_i32(g, k);
	if (cosine)
		q = add(g, q, c_i32(g, 1));
	q = and_(g, q, c_i32(g, 3));
	V odd = icmp(g, LLVMIntNE, and_(g, q, c_i32(g, 1)), c_i32(g, 0));
	V negq = icmp(g, LLVMIntNE, and_(g, q, c_i32(g, 2)), c_i32(g, 0));
	V y = sel(g, odd, c, s);
	y = sel(g, negq, fneg(g, y), y);
	return sel(g, isnan_(g, r), kc(x, NAN), y);
}

/* tanh of an f32 value: x P(x^2) / Q(x^2) on x clamped to +-7.9053
 * (past it the quotient at the clamp, 1 - 2.7e-7, within 5 ulp of tanh,
 * which rounds to 1 from 9.01), P of degree 6 and Q of degree 3 in x^2:
 * Eigen's and TensorFlow's rational tanh, its coefficients divided by Q's
 * constant term (P(0) and Q(0) near 1); x itself where |x| < 2.9e-4, which
 * is tanh(x) correctly rounded (x^3/3 is below half an ulp of x there):
 * the quotient's P(0) of 1 - 1.3e-7 would put a small tanh(x) an ulp
 * inside x, and a comparison of the two (test_difftest's random DAGs
 * make them) would then go the other way than the interpreter's. The
 * quotient is x P times 1/Q (Q in [1, 185]: recip_small, the GPU's
 * reciprocal without a slow path), which rounds once more than a
 * division: 5.1 ulp at most against f64 tanh over 4.4 million points
 * spaced evenly in log from 1e-45 to 12 (4.7 with the division; the
 * generated code on the host, run through fz_trace_run). A NaN
 * passes through the clamp and the polynomials. Ten fma, three
 * multiplications, a reciprocal and a select, where expm1's two branches
 * (a Taylor polynomial and exp) and a division cost three times that:
 * gelu(approximate=tanh) is mostly its tanh. */
static V tanh32(cg *g, V x)
{
	static const double P[] = {0.9999998719479379, 0.1302255336823433,
				   0.0030360983153184112, 1.0467499187504161e-05,
				   -1.7583789182401143e-08, 4.087417207402143e-11,
				   -5.6416762410444755e-14};
	static const double Q[] = {1.0, 0.46355838509634517, 0.024222763997786688,
				   0.00024486609330362513};
	V xc = clampf(g, x, -7.90531110763549805, 7.90531110763549805);
	V z = fmul(g, xc, xc);
	V t = fmul(g, fmul(g, xc, poly(g, z, P, 7)), recip_small(g, poly(g, z, Q, 4)));
	/* t unless |x| < 2.9e-4, put so (UGE, a NaN too) that the host folds
	 * the select into its last multiplication as a write mask */
	return sel(g, fcmp(g, LLVMRealUGE, un(g, "llvm.fabs", x), kc(x, 2.9e-4)), t, x);
}

static V tanhf_(cg *g, V x)
{
	if (!is64(g, x))
		return tanh32(g, x);
	V a = un(g, "llvm.fabs", x);
	V e = expm1f_(g, fmul(g, a, kc(x, 2.0)));
	V t = fdiv(g, e, fadd(g, e, kc(x, 2.0)));
	/* past 22 (f64), tanh rounds to 1 */
	t = sel(g, fcmp(g, LLVMRealOGT, a, kc(x, 22.0)), kc(x, 1.0), t);
	return sel(g, fcmp(g, LLVMRealOLT, x, kc(x, 0.0)), fneg(g, t), t);
}

/* sigmoid of f32 x (or of f32 lanes) given e = e^-|x| in [0, 1]: 1/(1 + e)
 * where x >= 0, else e/(1 + e) as e (1/(1 + e)). The divisor is in [1, 2]
 * for every x, so its reciprocal takes recip_small's fast form on the GPU
 * (1/(1 + e^-x) had one up to inf: a division with its slow path); where
 * x < 0 the result rounds twice, within an ulp of the single rounding, and
 * below -87 (e subnormal) it keeps e's digits where 1/(1 + e^-x) was the
 * reciprocal of a huge number. A NaN x makes e, and the result, NaN. */
static V sigmoid32(cg *g, V x, V e)
{
	V r = recip_small(g, fadd_exact(g, kc(x, 1.0), e));
	return sel(g, fcmp(g, LLVMRealOGE, x, kc(x, 0.0)), r, fmul_exact(g, e, r));
}

/* A loop of n rounds (i32 counter i from 1 to n) over f64 states (erf's
 * series and continued fraction). */
typedef struct f64_loop {
	LLVMBasicBlockRef head, done;
	V i;
} f64_loop;

static void loop_begin(cg *g, f64_loop *L, V *state, int ns)
{
	LLVMBasicBlockRef pre = current(g);
	L->head = block(g, "erf");
	L->done = block(g, "erf.done");
	br(g, L->head);
	at_end(g, L->head);
	L->i = phi(g, t_i32(g));
	phi_add(L->i, c_i32(g, 1), pre);
	for (int j = 0; j < ns; j++) {
		V p = phi(g, t_f64(g));
		phi_add(p, state[j], pre);
		state[j] = p;
	}
}

static void loop_end(cg *g, f64_loop *L, V *phis, V *next, int ns, int n)
{
	V i2 = add(g, L->i, c_i32(g, 1));
	phi_add(L->i, i2, L->head);
	for (int j = 0; j < ns; j++)
		phi_add(phis[j], next[j], L->head);
	cond_br(g, icmp(g, LLVMIntSLE, i2, c_i32(g, n)), L->head, L->done);
	at_end(g, L->done);
}

/* sum over n of (-x^2)^n / n! x / (2n + 1), n = 0 .. N: erf(x) sqrt(pi)/2
 * for xd (f64) */
static V erf_series(cg *g, V xd, int N)
{
	V mx2 = fneg(g, fmul(g, xd, xd));
	/* for n in 1..N: p *= -x^2 / n; sum += p / (2n + 1) */
	V st[2] = {xd, xd};
	f64_loop L;
	loop_begin(g, &L, st, 2);
	V nf = sitofp(g, L.i, t_f64(g));
	V p2 = fdiv(g, fmul(g, st[0], mx2), nf);
	V s2 = fadd(g, st[1], fdiv(g, p2, fadd(g, fmul(g, nf, c_f64(g, 2.0)), c_f64(g, 1.0))));
	V nx[2] = {p2, s2};
	loop_end(g, &L, st, nx, 2, N);
	return s2;
}

/* erf of an f32 value, computed in f64 (see the essay). */
static V erff_(cg *g, V x)
{
	V a = un(g, "llvm.fabs", x);
	V ac = sel(g, fcmp(g, LLVMRealOLT, a, kc(x, 3.95)), a, kc(x, 3.95));
	V s2 = erf_series(g, fpext(g, ac, t_f64(g)), 56);
	V r = fptrunc(g, fmul(g, s2, c_f64(g, 1.1283791670955126)), t_f32(g));
	r = sel(g, fcmp(g, LLVMRealOGE, a, kc(x, 3.95)), kc(x, 1.0), r);
	r = sel(g, isnan_(g, x), x, r);
	return sel(g, fcmp(g, LLVMRealOLT, x, kc(x, 0.0)), fneg(g, r), r);
}

/* erf of an f64 value (the GPU's): below 2 the series (40 terms, which
 * loses 2 of 16 digits to cancellation there), from 2 on 1 - erfc, erfc
 * by Laplace's continued fraction exp(-x^2)/sqrt(pi) / (x + (1/2)/(x +
 * 1/(x + (3/2)/(x + ...)))) evaluated from its 60th term back (2e-16 at
 * x = 2), and 1 from 6 on (erfc(6) is below half an ulp of 1). */
static V erf64_(cg *g, V x)
{
	V a = un(g, "llvm.fabs", x);
	V as = sel(g, fcmp(g, LLVMRealOLT, a, c_f64(g, 2.0)), a, c_f64(g, 2.0));
	V small = fmul(g, erf_series(g, as, 40), c_f64(g, 1.1283791670955126));
	V al = sel(g, fcmp(g, LLVMRealOLT, a, c_f64(g, 2.0)), c_f64(g, 2.0),
		   sel(g, fcmp(g, LLVMRealOLT, a, c_f64(g, 6.0)), a, c_f64(g, 6.0)));
	/* t = x + (k/2) / t for k = 60 .. 1 */
	V st[1] = {al};
	f64_loop L;
	loop_begin(g, &L, st, 1);
	V half_k = fmul(g, sitofp(g, sub(g, c_i32(g, 61), L.i), t_f64(g)), c_f64(g, 0.5));
	V t2 = fadd(g, al, fdiv(g, half_k, st[0]));
	loop_end(g, &L, st, &t2, 1, 60);
	V erfc = fdiv(g, fmul(g, expf_(g, fneg(g, fmul(g, al, al))),
			      c_f64(g, 0.56418958354775628695)), t2);
	V large = fsub(g, c_f64(g, 1.0), erfc);
	V r = sel(g, fcmp(g, LLVMRealOLT, a, c_f64(g, 2.0)), small, large);
	r = sel(g, fcmp(g, LLVMRealOGE, a, c_f64(g, 6.0)), c_f64(g, 1.0), r);
	r = sel(g, isnan_(g, x), x, r);
	return sel(g, fcmp(g, LLVMRealOLT, x, c_f64(g, 0.0)), fneg(g, r), r);
}

static V libm(cg *g, const char *name, V x)
{
	T ps[1] = {t_f64(g)};
	return call_named(g, name, LLVMFunctionType(t_f64(g), ps, 1, 0), &x, 1);
}

static V libm2(cg *g, const char *name, V a, V b)
{
	T ps[2] = {t_f64(g), t_f64(g)};
	V args[2] = {a, b};
	return call_named(g, name, LLVMFunctionType(t_f64(g), ps, 2, 0), args, 2);
}

LLVMValueRef cg_math_unary(cg *g, fz_opcode op, V x)
{
	T t = type_of(x);
	V one = c_real(t, 1.0), zero = c_real(t, 0.0);
	switch (op) {
	case FZ_OP_NEG: return fneg(g, x);
	case FZ_OP_ABS: return un(g, "llvm.fabs", x);
	case FZ_OP_SQRT: return un(g, "llvm.sqrt", x);
	case FZ_OP_RSQRT:
		if (t == t_f32(g)) {
			/* in f64, rounded once: the interpreter's result bit
			 * for bit (sqrt and div each round in f64 exactly as
			 * there), where 1/sqrt in f32 rounds twice and is off
			 * by an ulp in a third of the cases */
			V d = fpext(g, x, t_f64(g));
			V r = fdiv(g, c_f64(g, 1.0), un(g, "llvm.sqrt", d));
			return fptrunc(g, r, t);
		}
		return fdiv(g, one, un(g, "llvm.sqrt", x));
	case FZ_OP_RECIPROCAL: return fdiv(g, one, x);
	case FZ_OP_FLOOR: return un(g, "llvm.floor", x);
	case FZ_OP_CEIL: return un(g, "llvm.ceil", x);
	case FZ_OP_ROUND: return un(g, "llvm.rint", x);
	case FZ_OP_SIGN: {
		V r = sel(g, fcmp(g, LLVMRealOGT, x, zero), one,
			  sel(g, fcmp(g, LLVMRealOLT, x, zero), c_real(t, -1.0), zero));
		return sel(g, isnan_(g, x), x, r);
	}
	default:
		break;
	}
	if (t == t_f64(g) && !cg_gpu(g)) {
		switch (op) {
		case FZ_OP_EXP: return libm(g, "exp", x);
		case FZ_OP_EXP2: return libm(g, "exp2", x);
		case FZ_OP_LOG: return libm(g, "log", x);
		case FZ_OP_LOG2: return libm(g, "log2", x);
		case FZ_OP_LOG1P: return libm(g, "log1p", x);
		case FZ_OP_EXPM1: return libm(g, "expm1", x);
		case FZ_OP_SIN: return libm(g, "sin", x);
		case FZ_OP_COS: return libm(g, "cos", x);
		case FZ_OP_TANH: return libm(g, "tanh", x);
		case FZ_OP_ERF: return libm(g, "erf", x);
		case FZ_OP_SIGMOID:
			return fdiv(g, one, fadd(g, one, libm(g, "exp", fneg(g, x))));
		default: break;
		}
	} else {
		switch (op) {
		case FZ_OP_EXP: return expf_(g, x);
		case FZ_OP_EXP2: return exp2f_(g, x);
		case FZ_OP_LOG: return logf_(g, x);
		case FZ_OP_LOG2: return log2f_(g, x);
		case FZ_OP_LOG1P: return log1pf_(g, x);
		case FZ_OP_EXPM1: return expm1f_(g, x);
		case FZ_OP_SIN: return sincosf_(g, x, false);
		case FZ_OP_COS: return sincosf_(g, x, true);
		case FZ_OP_TANH: return tanhf_(g, x);
		case FZ_OP_ERF: return t == t_f64(g) ? erf64_(g, x) : erff_(g, x);
		case FZ_OP_SIGMOID:
			if (t == t_f32(g))
				return sigmoid32(g, x, expf_(g, fneg(g, un(g, "llvm.fabs", x))));
			return fdiv(g, one, fadd(g, one, expf_(g, fneg(g, x))));
		default: break;
		}
	}
	cg_fail(g, FZ_EUNSUPPORTED, g->cur, "no float form of %s", fz_ops[op].name);
	return x;
}

bool cg_math_costly(fz_opcode op)
{
	switch (op) {
	case FZ_OP_EXP: case FZ_OP_EXP2: case FZ_OP_EXPM1: case FZ_OP_LOG:
	case FZ_OP_LOG2: case FZ_OP_LOG1P: case FZ_OP_SIN: case FZ_OP_COS:
	case FZ_OP_TANH: case FZ_OP_SIGMOID: case FZ_OP_ERF: case FZ_OP_POW:
		return true;
	default:
		return false;
	}
}

bool cg_math_lanes(cg *g, fz_opcode op, int n, const V *x, V *out)
{
	if (g->o.target != FZ_CG_HOST || !g->c || (n != 4 && n != 8 && n != 16) ||
	    type_of(x[0]) != t_f32(g) || (op != FZ_OP_EXP && op != FZ_OP_SIGMOID))
		return false;
	V (*vexp)(cg *, V, bool) = cg_host_avx512(g) ? vexpf_ : vexpf_near;
	V v = pack(g, t_vec(t_f32(g), (unsigned)n), x, n);
	V y = op == FZ_OP_EXP ? vexp(g, v, false) :
	      sigmoid32(g, v, vexp(g, un(g, "llvm.fabs", v), true));
	for (int l = 0; l < n; l++)
		out[l] = extract(g, y, (unsigned)l);
	return true;
}

/* pow by a constant exponent that C's pow gives exactly as one IEEE
 * operation: b = 0 (1, NaN base included), 1 (a), 2 (a a: one rounding of
 * the exact square, as pow's correctly rounded result), -1 (1/a, infinite
 * with a zero base's sign, as pow's). NULL for any other b. RMS norms
 * square through pow(x, 2): the general form below is exp2 and log2 with
 * special cases, 60-odd instructions an element that the row skeleton
 * unrolls per lane and step (the 32-layer Llama's row kernels were
 * 150 KB of PTX, nearly all of it pow; nvJitLink's time goes with it). */
static V pow_const(cg *g, V a, V b)
{
	if (!LLVMIsAConstantFP(b))
		return NULL;
	LLVMBool loses = 0;
	double y = LLVMConstRealGetDouble(b, &loses);
	T t = type_of(a);
	if (y == 0.0)
		return c_real(t, 1.0);
	if (y == 1.0)
		return a;
	if (y == 2.0)
		return fmul_exact(g, a, a);
	if (y == -1.0)
		return fdiv(g, c_real(t, 1.0), a);
	return NULL;
}

LLVMValueRef cg_math_pow(cg *g, V a, V b)
{
	T t = type_of(a);
	V k = pow_const(g, a, b);
	if (k)
		return k;
	if (t == t_f64(g) && !cg_gpu(g))
		return libm2(g, "pow", a, b);
	V one = kc(a, 1.0), zero = kc(a, 0.0);
	V aa = un(g, "llvm.fabs", a);
	V r;
	if (t == t_f64(g)) {
		r = exp2f_(g, fmul(g, b, log2f_(g, aa)));
	} else {
		/* f32 through the f64 steps: log2 |a| is rounded to f32 before
		 * b multiplies it, so exp2 gets b log2|a| wrong by up to |b
		 * log2 a| ulps of 1 (x^3 near 1000: 28 ulp of the result, 6.7
		 * on average; x^1.5 up to 10), where f64's log2, product and
		 * exp2, rounded once at the end, are within an ulp */
		T d = is_vec(a) ? LLVMVectorType(t_f64(g), LLVMGetVectorSize(t)) : t_f64(g);
		V l = log2f_(g, fpext(g, aa, d));
		r = fptrunc(g, exp2f_(g, fmul(g, fpext(g, b, d), l)), t);
	}
	V bint = fcmp(g, LLVMRealOEQ, un(g, "llvm.rint", b), b);
	V half = fmul(g, b, kc(a, 0.5));
	V odd = and_(g, bint, fcmp(g, LLVMRealONE, un(g, "llvm.rint", half), half));
	V aneg = fcmp(g, LLVMRealOLT, a, zero);
	V rn = sel(g, odd, fneg(g, r), r);
	r = sel(g, aneg, sel(g, bint, rn, kc(a, NAN)), r);
	/* -0 with an odd exponent keeps its sign */
	T it = t == t_f64(g) ? t_i64(g) : t_i32(g);
	V negzero = and_(g, fcmp(g, LLVMRealOEQ, a, zero),
			 icmp(g, LLVMIntSLT, bitcast(g, a, it), c_int(it, 0)));
	r = sel(g, and_(g, negzero, odd), fneg(g, r), r);
	r = sel(g, fcmp(g, LLVMRealOEQ, a, one), one, r);
	return sel(g, fcmp(g, LLVMRealOEQ, b, zero), one, r);
}

LLVMValueRef cg_math_fmod(cg *g, V a, V b)
{
	T t = type_of(a);
	if (t == t_f64(g) && !cg_gpu(g))
		return libm2(g, "fmod", a, b);
	bool f32 = t == t_f32(g);
	V ad = f32 ? fpext(g, a, t_f64(g)) : a, bd = f32 ? fpext(g, b, t_f64(g)) : b;
	V q = un(g, "llvm.trunc", fdiv(g, ad, bd));
	V r = fsub(g, ad, fmul(g, q, bd));
	V zero = c_f64(g, 0.0), ab = un(g, "llvm.fabs", bd);
	V fixp = and_(g, fcmp(g, LLVMRealOGE, ad, zero), fcmp(g, LLVMRealOLT, r, zero));
	V fixn = and_(g, fcmp(g, LLVMRealOLT, ad, zero), fcmp(g, LLVMRealOGT, r, zero));
	r = sel(g, fixp, fadd(g, r, ab), r);
	r = sel(g, fixn, fsub(g, r, ab), r);
	/* a finite and b infinite: a itself */
	V binf = fcmp(g, LLVMRealOEQ, ab, c_f64(g, INFINITY));
	V afin = fcmp(g, LLVMRealOLT, un(g, "llvm.fabs", ad), c_f64(g, INFINITY));
	r = sel(g, and_(g, binf, afin), ad, r);
	/* the sign of a zero result is a's */
	r = sel(g, fcmp(g, LLVMRealOEQ, r, zero), fmul(g, ad, zero), r);
	return f32 ? fptrunc(g, r, t_f32(g)) : r;
}
