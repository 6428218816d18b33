/*
 * llvm.h: thin helpers over the LLVM C API, one LLVM call each.
 *
 * The kernel emitters read like the kernel when the builder calls are short:
 * `fadd(g, a, b)` rather than `LLVMBuildFAdd(g->b, a, b, "")`. Every helper
 * takes the emitter's state (cg, defined in codegen.h) only for its builder
 * and context, names nothing (LLVM numbers the values), and adds no logic
 * beyond the one call, except where a comment says so (fast-math flags on
 * float arithmetic, explained in codegen.h).
 *
 * Helpers that need a module-level declaration (intrinsics) look it up by
 * name and declare it on first use, so a module only holds what it calls.
 */
#ifndef FUSEC_CODEGEN_LLVM_H
#define FUSEC_CODEGEN_LLVM_H

#include <llvm-c/Core.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cg.h"

typedef LLVMValueRef V;
typedef LLVMTypeRef T;

/* ---- types ---------------------------------------------------------------- */

static inline T t_void(cg *g) { return LLVMVoidTypeInContext(g->ctx); }
static inline T t_i1(cg *g) { return LLVMInt1TypeInContext(g->ctx); }
static inline T t_i8(cg *g) { return LLVMInt8TypeInContext(g->ctx); }
static inline T t_i16(cg *g) { return LLVMInt16TypeInContext(g->ctx); }
static inline T t_i32(cg *g) { return LLVMInt32TypeInContext(g->ctx); }
static inline T t_i64(cg *g) { return LLVMInt64TypeInContext(g->ctx); }
static inline T t_f16(cg *g) { return LLVMHalfTypeInContext(g->ctx); }
static inline T t_bf16(cg *g) { return LLVMBFloatTypeInContext(g->ctx); }
static inline T t_f32(cg *g) { return LLVMFloatTypeInContext(g->ctx); }
static inline T t_f64(cg *g) { return LLVMDoubleTypeInContext(g->ctx); }
static inline T t_ptr(cg *g, unsigned as) { return LLVMPointerTypeInContext(g->ctx, as); }
static inline T t_vec(T el, unsigned n) { return LLVMVectorType(el, n); }
static inline T t_arr(T el, unsigned n) { return LLVMArrayType2(el, n); }
static inline T type_of(V v) { return LLVMTypeOf(v); }

/* ---- constants ------------------------------------------------------------ */

static inline V c_int(T t, int64_t x) { return LLVMConstInt(t, (unsigned long long)x, 1); }
static inline V c_i1(cg *g, int x) { return LLVMConstInt(t_i1(g), x != 0, 0); }
static inline V c_i32(cg *g, int64_t x) { return c_int(t_i32(g), x); }
static inline V c_i64(cg *g, int64_t x) { return c_int(t_i64(g), x); }
static inline V c_real(T t, double x) { return LLVMConstReal(t, x); }
static inline V c_f32(cg *g, double x) { return c_real(t_f32(g), x); }
static inline V c_f64(cg *g, double x) { return c_real(t_f64(g), x); }
static inline V c_undef(T t) { return LLVMGetUndef(t); }
static inline V c_poison(T t) { return LLVMGetPoison(t); }
/* an integer constant (not undef, not poison: LLVMConstInt*Value reads
 * only a ConstantInt) */
static inline int is_const(V v) { return LLVMIsAConstantInt(v) != NULL; }

/* ---- integer arithmetic --------------------------------------------------- */

static inline V add(cg *g, V a, V b) { return LLVMBuildAdd(g->b, a, b, ""); }
static inline V sub(cg *g, V a, V b) { return LLVMBuildSub(g->b, a, b, ""); }
static inline V mul(cg *g, V a, V b) { return LLVMBuildMul(g->b, a, b, ""); }
static inline V udiv(cg *g, V a, V b) { return LLVMBuildUDiv(g->b, a, b, ""); }
static inline V urem(cg *g, V a, V b) { return LLVMBuildURem(g->b, a, b, ""); }
static inline V srem(cg *g, V a, V b) { return LLVMBuildSRem(g->b, a, b, ""); }
static inline V shl(cg *g, V a, V b) { return LLVMBuildShl(g->b, a, b, ""); }
static inline V lshr(cg *g, V a, V b) { return LLVMBuildLShr(g->b, a, b, ""); }
static inline V ashr(cg *g, V a, V b) { return LLVMBuildAShr(g->b, a, b, ""); }
static inline V and_(cg *g, V a, V b) { return LLVMBuildAnd(g->b, a, b, ""); }
static inline V or_(cg *g, V a, V b) { return LLVMBuildOr(g->b, a, b, ""); }
static inline V xor_(cg *g, V a, V b) { return LLVMBuildXor(g->b, a, b, ""); }
static inline V neg(cg *g, V a) { return LLVMBuildNeg(g->b, a, ""); }
static inline V icmp(cg *g, LLVMIntPredicate p, V a, V b) { return LLVMBuildICmp(g->b, p, a, b, ""); }

/* ---- float arithmetic ------------------------------------------------------
 * add, sub and mul carry `contract` (see codegen.h, "fast math") inside the
 * math library and the reductions: the backend may fuse a*b+c into one fma.
 * The trace's own ops use the _exact forms. Nothing else is relaxed. */

static inline V fm(V v) { if (LLVMIsAInstruction(v)) LLVMSetFastMathFlags(v, LLVMFastMathAllowContract); return v; }
static inline V fadd(cg *g, V a, V b) { return fm(LLVMBuildFAdd(g->b, a, b, "")); }
static inline V fsub(cg *g, V a, V b) { return fm(LLVMBuildFSub(g->b, a, b, "")); }
static inline V fmul(cg *g, V a, V b) { return fm(LLVMBuildFMul(g->b, a, b, "")); }
/* The ops of the trace itself: no flags at all, so an f32 a*b+c rounds the
 * product as the interpreter does (bit-equal results). */
static inline V fadd_exact(cg *g, V a, V b) { return LLVMBuildFAdd(g->b, a, b, ""); }
static inline V fsub_exact(cg *g, V a, V b) { return LLVMBuildFSub(g->b, a, b, ""); }
static inline V fmul_exact(cg *g, V a, V b) { return LLVMBuildFMul(g->b, a, b, ""); }
static inline V fdiv(cg *g, V a, V b) { return LLVMBuildFDiv(g->b, a, b, ""); }
static inline V fneg(cg *g, V a) { return LLVMBuildFNeg(g->b, a, ""); }
static inline V fcmp(cg *g, LLVMRealPredicate p, V a, V b) { return LLVMBuildFCmp(g->b, p, a, b, ""); }
static inline V sel(cg *g, V c, V a, V b) { return LLVMBuildSelect(g->b, c, a, b, ""); }

/* ---- conversions ---------------------------------------------------------- */

static inline V zext(cg *g, V a, T t) { return LLVMBuildZExt(g->b, a, t, ""); }
static inline V sext(cg *g, V a, T t) { return LLVMBuildSExt(g->b, a, t, ""); }
static inline V trunc_(cg *g, V a, T t) { return LLVMBuildTrunc(g->b, a, t, ""); }
static inline V sext_or_trunc(cg *g, V a, T t) { return LLVMBuildIntCast2(g->b, a, t, 1, ""); }
static inline V zext_or_trunc(cg *g, V a, T t) { return LLVMBuildIntCast2(g->b, a, t, 0, ""); }
static inline V fpext(cg *g, V a, T t) { return LLVMBuildFPExt(g->b, a, t, ""); }
static inline V fptrunc(cg *g, V a, T t) { return LLVMBuildFPTrunc(g->b, a, t, ""); }
static inline V sitofp(cg *g, V a, T t) { return LLVMBuildSIToFP(g->b, a, t, ""); }
static inline V uitofp(cg *g, V a, T t) { return LLVMBuildUIToFP(g->b, a, t, ""); }
static inline V fptosi(cg *g, V a, T t) { return LLVMBuildFPToSI(g->b, a, t, ""); }
static inline V bitcast(cg *g, V a, T t) { return LLVMBuildBitCast(g->b, a, t, ""); }

/* ---- memory --------------------------------------------------------------- */

static inline V gep(cg *g, T el, V p, V i) { return LLVMBuildInBoundsGEP2(g->b, el, p, &i, 1, ""); }
static inline V load(cg *g, T t, V p, unsigned align)
{
	V v = LLVMBuildLoad2(g->b, t, p, "");
	LLVMSetAlignment(v, align);
	return v;
}
static inline V store(cg *g, V v, V p, unsigned align)
{
	V s = LLVMBuildStore(g->b, v, p);
	LLVMSetAlignment(s, align);
	return s;
}
static inline V alloca_(cg *g, T t) { return LLVMBuildAlloca(g->b, t, ""); }
static inline V extract(cg *g, V vec, unsigned i) { return LLVMBuildExtractElement(g->b, vec, c_i32(g, i), ""); }
static inline V insert(cg *g, V vec, V x, unsigned i) { return LLVMBuildInsertElement(g->b, vec, x, c_i32(g, i), ""); }
static inline V atomic_add(cg *g, LLVMAtomicRMWBinOp op, V p, V x)
{
	return LLVMBuildAtomicRMW(g->b, op, p, x, LLVMAtomicOrderingMonotonic, 0);
}

/* ---- control -------------------------------------------------------------- */

static inline LLVMBasicBlockRef block(cg *g, const char *name) { return LLVMAppendBasicBlockInContext(g->ctx, g->fn, name); }
static inline void at_end(cg *g, LLVMBasicBlockRef bb) { LLVMPositionBuilderAtEnd(g->b, bb); }
static inline LLVMBasicBlockRef current(cg *g) { return LLVMGetInsertBlock(g->b); }
static inline void br(cg *g, LLVMBasicBlockRef bb) { LLVMBuildBr(g->b, bb); }
static inline void cond_br(cg *g, V c, LLVMBasicBlockRef t, LLVMBasicBlockRef f) { LLVMBuildCondBr(g->b, c, t, f); }
static inline void ret_void(cg *g) { LLVMBuildRetVoid(g->b); }
static inline V phi(cg *g, T t) { return LLVMBuildPhi(g->b, t, ""); }
static inline void phi_add(V p, V v, LLVMBasicBlockRef bb) { LLVMAddIncoming(p, &v, &bb, 1); }
static inline V param(cg *g, unsigned i) { return LLVMGetParam(g->fn, i); }

/* A call of the function `name` of type `fty`, declared on first use. */
static inline V call_named(cg *g, const char *name, T fty, V *args, unsigned n)
{
	V f = LLVMGetNamedFunction(g->mod, name);
	if (!f)
		f = LLVMAddFunction(g->mod, name, fty);
	return LLVMBuildCall2(g->b, fty, f, args, n, "");
}

/* An overloaded intrinsic (llvm.floor.f32, ...) on one type, called. */
static inline V call_intrinsic(cg *g, const char *name, T over, T ret, V *args, unsigned n)
{
	unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
	T tys[1] = {over};
	V f = LLVMGetIntrinsicDeclaration(g->mod, id, tys, over ? 1 : 0);
	T fty = LLVMIntrinsicGetType(g->ctx, id, tys, over ? 1 : 0);
	(void)ret;
	return LLVMBuildCall2(g->b, fty, f, args, n, "");
}

/* x[0..n) as the lanes of one vector (vt: n of their type). */
static inline V pack(cg *g, T vt, const V *x, int n)
{
	V v = c_undef(vt);
	for (int l = 0; l < n; l++)
		v = insert(g, v, x[l], (unsigned)l);
	return v;
}

/* The constant c in each of n lanes (n at most 16). */
static inline V c_splat(V c, int n)
{
	V e[16];
	for (int l = 0; l < n; l++)
		e[l] = c;
	return LLVMConstVector(e, (unsigned)n);
}

/* A prefetch of the line at p for a read, into every cache level
 * (prefetcht0 on x86; an address past a buffer's end never faults). */
static inline void prefetch(cg *g, V p)
{
	V args[4] = {p, c_i32(g, 0), c_i32(g, 3), c_i32(g, 1)};
	call_intrinsic(g, "llvm.prefetch", t_ptr(g, 0), t_void(g), args, 4);
}

/* ---- warp-level matrix operations (NVVM, sm_80+) ---------------------------
 * The tensor cores' instructions as LLVM 19 spells them; the fragment
 * layouts and what emu makes of them are in codegen/mma.c. Every operand
 * is a 32-bit register holding two 16-bit elements (lower index in the
 * low half), as PTX has them. */

/* A non-overloaded NVVM intrinsic by name (declared on first use), called. */
static inline V call_nvvm(cg *g, const char *name, V *args, unsigned n)
{
	unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
	V f = LLVMGetIntrinsicDeclaration(g->mod, id, NULL, 0);
	return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, NULL, 0), f, args, n, "");
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: d = a b + c
 * for one warp; a four registers, b two, c four floats; the result is a
 * struct of four floats (extractvalue). f16 operands are <2 x half>. */
static inline V nv_mma_m16n8k16(cg *g, bool bf16, V *a, V *b, V *c)
{
	V args[10] = {a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]};
	return call_nvvm(g, bf16 ? "llvm.nvvm.mma.m16n8k16.row.col.bf16" :
			 "llvm.nvvm.mma.m16n8k16.row.col.f32.f32", args, 10);
}

/* ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 from p (a shared
 * pointer, this lane's row): i32 for x1, a struct of n i32 for x2, x4. */
static inline V nv_ldmatrix(cg *g, int n, bool trans, V p)
{
	char name[64];
	snprintf(name, sizeof name, "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x%d%s.b16", n,
		 trans ? ".trans" : "");
	unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
	T over[1] = {type_of(p)};
	V f = LLVMGetIntrinsicDeclaration(g->mod, id, over, 1);
	return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, over, 1), f, &p, 1, "");
}

/* cp.async.{ca,cg}.shared.global [dst], [src], 16, src_bytes: 16 bytes,
 * of which the first src_bytes (i32, 0 to 16) are read and the rest
 * zero-filled. ca caches in L1, cg in L2 only. */
static inline V nv_cp_async16(cg *g, bool l1, V dst, V src, V src_bytes)
{
	V args[3] = {dst, src, src_bytes};
	return call_nvvm(g, l1 ? "llvm.nvvm.cp.async.ca.shared.global.16.s" :
			 "llvm.nvvm.cp.async.cg.shared.global.16.s", args, 3);
}
static inline V nv_cp_async_commit(cg *g) { return call_nvvm(g, "llvm.nvvm.cp.async.commit.group", NULL, 0); }
/* cp.async.wait_group n: all but the n most recent groups have landed. */
static inline V nv_cp_async_wait(cg *g, int n)
{
	V a = c_i32(g, n);
	return call_nvvm(g, "llvm.nvvm.cp.async.wait.group", &a, 1);
}
static inline V extract_value(cg *g, V agg, unsigned i) { return LLVMBuildExtractValue(g->b, agg, i, ""); }

#endif
