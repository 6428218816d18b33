/*
 * codegen.h: the code generator's internal API.
 *
 * A compiler (fz_compiler) owns one LLVMContext and one target: the NVPTX
 * backend (PTX text for a GPU) or the host, through ORC LLJIT. It turns one
 * region (ir/plan.h: kind, nodes in topological order, in, out) at a time
 * into one LLVM module, optimizes it with a pipeline tailored to kernels
 * (codegen.c), and emits it.
 *
 *     fz_compiler *c;  fz_compiler_new(&opts, &c, &err);
 *     fz_kernel *k;    fz_compiler_build(c, trace, region, &k, &err);   IR
 *                      fz_compiler_optimize(c, k, &err);               passes
 *                      fz_kernel_ptx(c, k, &ptx, &err);    or  fz_kernel_jit(c, k, &err)
 *
 * How a region becomes a kernel. One emitter of elementwise expressions
 * (emit.c) computes any value of the region at any index, by walking the
 * value's definition backwards: an elementwise op computes its operands at
 * the same index; a meta op (broadcast, reshape, permute, slice, squeeze,
 * unsqueeze, cat) maps the index to its operand's index; take and
 * take_along load an index and check it; a region input is a load. Three
 * skeletons drive it:
 *
 *   pointwise.c   one grid-stride loop per output shape (and the scatter of
 *                 index_add, a second entry point);
 *   reduction.c   rows: the kept dims of the reductions are rows, the reduced
 *                 dims a row's elements; every reduction of the region is a
 *                 pass over the row (a block, a warp or a thread per row),
 *                 and the region's full-shape outputs a last pass that uses
 *                 the reduced values: that is the normalization skeleton
 *                 (layer_norm, rms_norm, softmax, cross_entropy) and plain
 *                 reductions are the case with no last pass.
 *
 * Indices are affine per lane. An index is `b + o` with b an LLVM value
 * known to be a multiple of m, and o a constant. A skeleton hands the
 * emitter up to FZ_VW_MAX lanes whose innermost index differs only in o
 * (0, 1, 2, ...); meta ops keep that form where they can, so a load whose
 * lanes land on consecutive addresses becomes one vector load (16 bytes,
 * ld.global.v4.b32 on the GPU), a load whose lanes coincide (a broadcast
 * weight along the rows) becomes one scalar load, and anything else one
 * load per lane. Values are memoized per (value, lane indices) within a
 * loop body, so a value read twice at the same index is computed once.
 *
 * Numerics. f16 and bf16 compute in f32, and the result of every op whose
 * dtype is f16 or bf16 is rounded to it (an f32 value on the bits, no
 * memory traffic): the eager semantics the interpreter defines, so a bf16
 * a*c + b*s that cancels in eager mode cancels here too. Normalizations
 * and softmax are lowered with explicit casts to f32, so their arithmetic
 * is f32 throughout and rounds once at the output. Integers compute in i64
 * and wrap to their width after every op; bool is i1. Math functions
 * (exp, log, tanh, erf, sin, ...) are emitted as IR (math.c), the same on
 * both targets, so the CPU tests also test the GPU's math.
 *
 * Fast math. The trace's own add, sub and mul carry no flags: the
 * interpreter rounds every op's result, and so do we, so f32 + - * / sqrt
 * are bit-equal to it. Inside the math library and the reductions' own
 * arithmetic (var's squared deviations), float add, sub and mul carry only
 * `contract`: the backend may fuse a multiply and an add into an fma, which
 * rounds once instead of twice and so never moves a result further from
 * the f64 reference. nnan, ninf
 * and nsz are not used: maximum, minimum, isfinite and where must see NaN
 * and inf as they are, and amax must propagate NaN. reassoc is not used:
 * the order of every reduction is spelled out by the skeleton (lanes, then
 * threads, then a tree over warps), so results do not depend on what the
 * optimizer chose. afn and arcp are not used: division and sqrt stay IEEE
 * (div.rn, sqrt.rn on the GPU), which keeps f32 results bit-equal to the
 * interpreter's f64-then-round for + - * / sqrt (an f64 result rounded to
 * f32 is the f32 result for these: double rounding is innocuous when
 * 53 >= 2*24 + 2). rsqrt, which is not one of them, is computed in f64 and
 * rounded once (sqrt.rn.f64, rcp.rn.f64 on the GPU: once per row in a
 * normalization), and float sums carry their rounding errors (reduction.c),
 * so rms_norm and layer_norm are bit-equal to the interpreter nearly
 * always. The math functions (exp, tanh, ...) are within a few ulp, not
 * correctly rounded: the one remaining source of f32 differences.
 */
#ifndef FUSEC_CODEGEN_H
#define FUSEC_CODEGEN_H

#include <llvm-c/Core.h>
#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
#include "plan.h"

#define FZ_VW_MAX 8          /* lanes per thread: 16 bytes of bf16 */
#define FZ_CODEGEN_VERSION 2 /* part of a kernel's cache key */
#define FZ_ROW_BLOCK 256     /* threads of a block-per-row kernel (launch dims) */
#define FZ_ROW_REGS 32       /* row elements a thread may hold in registers */

typedef enum fz_cg_target { FZ_CG_HOST, FZ_CG_NVPTX } fz_cg_target;

typedef struct fz_cg_options {
	fz_cg_target target;
	int sm;         /* NVPTX: compute capability, 90 for sm_90 */
	bool idx32;     /* 32-bit index arithmetic: every extent and offset fits */
	bool vectorize; /* lanes and 16-byte accesses where the shapes allow */
} fz_cg_options;

/* The options for a target name: "host" or "sm_80", "sm_90", ... */
fz_status fz_cg_options_parse(const char *target, fz_cg_options *o, char **err);

typedef enum fz_skeleton { FZ_SK_POINTWISE, FZ_SK_ROW, FZ_SK_SCATTER } fz_skeleton;
typedef enum fz_rowpar { FZ_PAR_THREAD, FZ_PAR_WARP, FZ_PAR_BLOCK } fz_rowpar;

/* The host entry point of a kernel: region inputs then outputs in bufs,
 * every trace symbol's size in syms, and a word that receives 1 + the node
 * id of an op that met a bad index (0 when none). */
typedef void (*fz_host_fn)(void **bufs, const int64_t *syms, int32_t *err);

/* One region's kernel: its module until emitted, and what a launcher needs.
 * GPU entry points take (ptr in0, ..., ptr outN, ptr err, i64 sym...) with
 * the symbols of syms[] in order. */
typedef struct fz_kernel {
	int region;
	fz_skeleton sk;
	fz_rowpar par;         /* rows: how a row is spread over threads */
	int vec;               /* lanes per thread */
	int n_in, n_out;
	int n_syms;
	int syms[FZ_MAX_SYMS]; /* trace symbol ids, in parameter order */
	int n_entries;         /* 2 for index_add: init, then scatter */
	char names[2][64];
	int n_work[2];
	fz_ext work[2][8];     /* iterations per entry: the max of these */
	LLVMModuleRef mod;     /* owned until emitted or given to the JIT */
	fz_host_fn host;       /* after fz_kernel_jit (entry 0 does all) */
	double t_build, t_opt, t_emit; /* seconds */
} fz_kernel;

typedef struct fz_compiler fz_compiler;

/* Private to the files of codegen/: one context, one target machine, and for the
 * host the JIT that owns the code. */
struct fz_compiler {
	fz_cg_options o;
	LLVMContextRef ctx;
	void *tsc;           /* host: LLVMOrcThreadSafeContextRef */
	void *jit;           /* host: LLVMOrcLLJITRef */
	void *tm;            /* LLVMTargetMachineRef */
	char *triple, *layout;
	char diag[1024];     /* the last LLVM error diagnostic */
	int counter;         /* makes host symbol names unique */
};
fz_status cg_nvptx_init(fz_compiler *c, char **err);
fz_status cg_host_init(fz_compiler *c, char **err);
void cg_host_free(fz_compiler *c);
fz_status cg_llvm_error(fz_compiler *c, void *llvm_error, const char *what,
                        int region, char **err);

fz_status fz_compiler_new(const fz_cg_options *o, fz_compiler **out, char **err);
void fz_compiler_free(fz_compiler *c);
const fz_cg_options *fz_compiler_options(const fz_compiler *c);

/* Builds the module of region r of trace t: FZ_EUNSUPPORTED when the
 * region's shape is not one the skeletons handle (the message says which
 * op), FZ_ERUNTIME when LLVM rejects what was built. */
fz_status fz_compiler_build(fz_compiler *c, const fz_trace *t,
                            const fz_region *r, fz_kernel **out, char **err);
fz_status fz_compiler_optimize(fz_compiler *c, fz_kernel *k, char **err);
/* The module as LLVM IR text (a complete module). */
fz_status fz_kernel_llvm(const fz_kernel *k, char **out, char **err);
/* PTX text (NVPTX compilers); the module is consumed. */
fz_status fz_kernel_ptx(fz_compiler *c, fz_kernel *k, char **out, char **err);
/* Host code through ORC (host compilers); the module is consumed and
 * k->host set. The code lives as long as the compiler. */
fz_status fz_kernel_jit(fz_compiler *c, fz_kernel *k, char **err);
/* Host objects for the kernel cache (target_host.c). Renames a host
 * kernel's single entry point (before it is emitted); FZ_EINVAL when the
 * module is gone or the name does not fit. */
fz_status fz_kernel_set_entry(fz_kernel *k, const char *name);
/* A relocatable object file of the optimized module for this host, made
 * by the compiler's target machine; the module is consumed. *obj is freed
 * with free. */
fz_status fz_kernel_object(fz_compiler *c, fz_kernel *k, void **obj,
                           size_t *len, char **err);
/* Links object obj[0..len) into the compiler's JIT (copying it) and looks
 * up entry point name; a name the JIT already defines is returned as it
 * is. The code lives as long as the compiler. */
fz_status fz_host_load(fz_compiler *c, const void *obj, size_t len,
                       const char *name, fz_host_fn *fn, char **err);
void fz_kernel_free(fz_kernel *k);

/* Grid and block for entry e at the bound sizes: a small heuristic per
 * skeleton (see reduction.c and pointwise.c). A block-per-row kernel gets
 * FZ_ROW_BLOCK threads, which its register-held row depends on. */
void fz_kernel_launch_dims(const fz_kernel *k, int e, const int64_t *syms,
                           int64_t *grid, int *block);

/* Every kernel of a trace, planned at sym_sizes (NULL or -1: symbolic):
 * each kernel region as one module, or one module per op where the
 * skeletons cannot take the region whole. For each, `fn` gets the region,
 * the op index within it (-1 for the whole region), the kernel (optimized;
 * fn may emit it, and owns nothing) and `ud`. only_region >= 0 keeps one
 * region. Stops at the first error, or when fn returns a status. */
typedef fz_status (*fz_kernel_fn)(const fz_region *r, int op, fz_kernel *k,
                                  void *ud, char **err);
fz_status fz_compile_trace(fz_compiler *c, const fz_trace *t,
                           const int64_t *sym_sizes, int only_region,
                           fz_kernel_fn fn, void *ud, char **err);

/* ---- the emitter's state (shared by emit.c, math.c and the skeletons) ---- */

typedef struct cg_ix {
	LLVMValueRef b; /* NULL: 0 */
	int64_t o;
	int64_t m;      /* b is a multiple of m (>= 1) */
} cg_ix;

typedef struct cg_memo {
	const fz_value *v;
	int nl;
	uint64_t h;
	cg_ix ix[FZ_VW_MAX][FZ_MAX_RANK];
	LLVMValueRef out[FZ_VW_MAX];
} cg_memo;

typedef struct cg {
	fz_compiler *c;
	LLVMContextRef ctx;
	LLVMModuleRef mod;
	LLVMBuilderRef b;
	LLVMValueRef fn;
	LLVMBasicBlockRef entry;
	const fz_trace *t;
	const fz_region *r;
	fz_cg_options o;
	fz_kernel *k;
	LLVMTypeRef ity;      /* index type: i32 or i64 */
	unsigned as;          /* address space of buffers: 1 on the GPU */
	LLVMValueRef *buf;    /* region inputs then outputs */
	LLVMValueRef sym[FZ_MAX_SYMS]; /* sizes as ity (NULL: unused) */
	LLVMValueRef err;
	int *slot;            /* by value id: index in buf, or -1 */
	LLVMValueRef *red;    /* by value id: a reduction's value for this row */
	bool *is_red;         /* by value id: made by a row reduction */
	bool row_valid;
	int row_rank;
	cg_ix row[FZ_MAX_RANK]; /* the domain index of the current row's kept dims */
	bool row_kept[FZ_MAX_RANK];
	cg_memo *memo;
	int n_memo, cap_memo;
	struct cg_cse { int op; LLVMValueRef a, b, r; } *cse; /* index arithmetic */
	int n_cse, cap_cse;
	LLVMValueRef smem[6]; /* shared scratch for block reductions, by type and part */
	const fz_node *cur;   /* the op being emitted, for messages */
	fz_status st;
	char msg[FZ_ERRLEN];
} cg;

typedef cg_ix cg_lanes[FZ_VW_MAX][FZ_MAX_RANK];

/* emit.c */
void cg_fail(cg *g, fz_status st, const fz_node *n, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
LLVMTypeRef cg_ctype(cg *g, fz_dtype d);   /* compute type */
LLVMTypeRef cg_stype(cg *g, fz_dtype d);   /* storage type */
LLVMValueRef cg_ext(cg *g, fz_ext e);      /* an extent as ity */
LLVMValueRef cg_ix_value(cg *g, cg_ix x);  /* b + o as ity */
static inline cg_ix cg_ix_of(LLVMValueRef b, int64_t m)
{
	cg_ix x = {b, 0, m > 0 ? m : 1};
	return x;
}
static inline cg_ix cg_ix_zero(void)
{
	cg_ix x = {NULL, 0, 1};
	return x;
}
/* Lanes of value v at indices ix[0..nl) into out[0..nl). */
void cg_value(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK], LLVMValueRef *out);
/* Stores lanes of v (a region output) at indices ix. */
void cg_store(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK], LLVMValueRef *vals);
/* Rounds an f32 compute value to f16 or bf16 precision (else x itself):
 * every op whose result is f16/bf16 rounds, as the interpreter does. */
LLVMValueRef cg_round_half(cg *g, LLVMValueRef x, fz_dtype d);
/* Converts a compute value of dtype d to storage, and back. */
LLVMValueRef cg_to_storage(cg *g, LLVMValueRef x, fz_dtype d);
LLVMValueRef cg_from_storage(cg *g, LLVMValueRef x, fz_dtype d);
/* Pointer to element off (ity) of buffer slot s of dtype d. */
LLVMValueRef cg_elem_ptr(cg *g, int s, fz_dtype d, LLVMValueRef off);
/* Row-major linear offset of an index in a value's shape: b part, o part. */
void cg_linear(cg *g, const fz_type *ty, const cg_ix *ix, cg_ix *out);
/* ix[0..rank) from a linear index lin (ity) over the dims of ty; the
 * innermost index carries multiple `m` when the caller knows it. */
void cg_delinearize(cg *g, const fz_type *ty, LLVMValueRef lin, int64_t inner_m,
                    cg_ix *ix);
int cg_memo_mark(cg *g);
void cg_memo_pop(cg *g, int mark);
/* Index arithmetic (add, mul, udiv, urem on ity) built once per operands
 * while the block that made it is open, so lanes share their bases. */
LLVMValueRef cg_iop(cg *g, int op, LLVMValueRef a, LLVMValueRef b);
enum { CG_ADD, CG_MUL, CG_UDIV, CG_UREM, CG_SUB };
/* Sets *err to 1 + node id where bad is true (a branch around a store). */
void cg_flag_error(cg *g, const fz_node *n, LLVMValueRef bad);

/* Function skeleton plumbing: entry point with the target's ABI, thread
 * indices (0 and 1 on the host), loops, barriers and warp shuffles. */
void cg_function_begin(cg *g, const char *name);
void cg_function_end(cg *g);
LLVMValueRef cg_tid(cg *g);    /* threadIdx.x as ity */
LLVMValueRef cg_ntid(cg *g);   /* blockDim.x */
LLVMValueRef cg_ctaid(cg *g);  /* blockIdx.x */
LLVMValueRef cg_nctaid(cg *g); /* gridDim.x */
void cg_barrier(cg *g);
LLVMValueRef cg_shfl_bfly(cg *g, LLVMValueRef x, int lane_mask);

typedef struct cg_loop {
	LLVMBasicBlockRef pre, head, body, exit;
	LLVMValueRef iv, start, step;
	int mark, cse_mark;
} cg_loop;
/* for (iv = start; iv < limit; iv += step): unsigned compare, ity. */
void cg_loop_begin(cg *g, cg_loop *L, LLVMValueRef start, LLVMValueRef limit,
                   LLVMValueRef step);
void cg_loop_end(cg *g, cg_loop *L);
LLVMValueRef cg_entry_alloca(cg *g, LLVMTypeRef t);

/* math.c: f32 and f64 math on compute values. */
LLVMValueRef cg_math_unary(cg *g, fz_opcode op, LLVMValueRef x);
LLVMValueRef cg_math_pow(cg *g, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef cg_math_fmod(cg *g, LLVMValueRef a, LLVMValueRef b);

/* The skeletons. */
void cg_pointwise(cg *g);
void cg_scatter(cg *g, const fz_node *ia);
void cg_rows(cg *g);

/* Lanes a region can use: 16 bytes over its widest element, at most
 * FZ_VW_MAX; 1 when vectorization is off. */
int cg_lanes_for(cg *g);

#endif
