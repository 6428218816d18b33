/*
 * codegen.h: the code generator as the cache, the runtime and the tools see it.
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
 * take_along load an index and check it; a region input is a load. The
 * skeletons drive it (scan.c and select.c load and store their one op's
 * operand and results themselves):
 *
 *   pointwise.c   one grid-stride loop per output shape (and the scatter of
 *                 index_add, a second entry point);
 *   reduction.c   rows: the kept dims of the reductions are rows, the reduced
 *                 dims a row's elements; every reduction of the region is a
 *                 pass over the row (a block, a warp or a thread per row),
 *                 and the region's full-shape outputs a last pass that uses
 *                 the reduced values: that is the normalization skeleton
 *                 (layer_norm, rms_norm, softmax, cross_entropy) and plain
 *                 reductions are the case with no last pass;
 *   scan.c        a region that is one cumsum: a running sum per row on
 *                 the host, a block per row on the GPU (warp shfl.up
 *                 scan, then the warps' totals through shared memory);
 *   select.c      a region that is one topk, argmax or argmin: k passes of
 *                 an arg-extremum per row in one total order (NaN, value,
 *                 lower index), combined across threads by butterfly
 *                 shuffles and shared memory on the GPU.
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

/* No LLVM header reaches the runtime or the tools: the module a kernel
 * carries is an opaque pointer outside codegen/ (cg.h has the LLVM view). */

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
#include "plan.h"

#define FZ_VW_MAX 16         /* lanes per thread: a 64-byte register of f32
                              * on the host (AVX-512) */
#define FZ_VW_GPU 8          /* lanes per GPU thread: 16 bytes of bf16 */
#define FZ_CODEGEN_VERSION 54 /* part of a kernel's cache key (3: host entry
                              * points take a part of the grid; 4: host row
                              * passes take turns over four accumulators,
                              * f32 sums in f64; 5: pow by a constant 0, 1,
                              * 2 or -1, bf16 rounding by cvt on sm_80+;
                              * 6: host rows stash the last pass's values
                              * for the tail, bf16 stored without a second
                              * rounding; 7: integer sums wrap to their
                              * dtype, f64 -> f16/bf16 round once, no access
                              * through a bad index, f64 math and byte
                              * index_add on the GPU, chained passes; 8:
                              * attention regions, on the host, the GPU and
                              * emu; 9: host lanes sized with i64 as 4
                              * bytes, the last host pass keeps an output
                              * for the tail, host f32/f64 index_add by
                              * lanes; 10: host lanes fill a 64-byte
                              * register with AVX-512, zmm code; 11: f32
                              * attention backward on the GPU and emu; 12:
                              * host attention products in AVX-512
                              * registers; 13: host outer reductions walk
                              * blocks of columns; 14: the GPU's bf16/f16
                              * attention exp by ex2.approx; 15: host
                              * streaming stores of large outputs, rows
                              * stash in a stack scratch, casts to
                              * f16/bf16 round once; 16: host column
                              * walks store the domain's outputs; 17-19
                              * (two branches of session 8, each its own
                              * numbers): host attention exp without
                              * underflow, vector stores, causal diagonal
                              * blocks by their triangle, bool mask blocks
                              * classified; the keep stored by the first
                              * pass that computes it, with the scratch;
                              * host index_add by rows, exp's scaling by an
                              * exponent add; bf16 rounding kept in f32;
                              * 20: both merged; 21: host attention reads
                              * strided operands, and one pass does
                              * attention_dq and attention_dkv (s9-attn);
                              * 22: host bf16 by vcvtneps2bf16 with
                              * AVX512-BF16, f32 tanh a rational function,
                              * iota lanes as one vector, f32 exp's degree-6
                              * polynomial and rounding by 1.5 2^23
                              * (s9-rows); 23: both merged; 24: host
                              * index_add along dim 0 into rows of 64 or
                              * more as a gather by rows of its result
                              * through the index's inverse, elementwise followers fused,
                              * with a scratch block (s10-emb); 25: a sum
                              * over a one-hot select picked at the row,
                              * row invariants once per row, the tail's
                              * exp(y - c) from the stashed exp(y) (s10-ce);
                              * 26: host row tails prefetch the rows
                              * ahead; 27: host f32 exp and sigmoid in
                              * vectors with vscalefps, tanh's select
                              * as the division's mask (s11-exp); 28: a
                              * host pointwise step takes up to 8 lane
                              * groups along the innermost dim (whole
                              * rows where a cat runs along them), a
                              * cat's unused operands unread (s11-rot);
                              * 29: host sums of terms never negative add
                              * blocks of four steps in f32 before f64,
                              * the amax step in four instructions
                              * (s11-sm); 30: all three merged; 31: a
                              * host pointwise step of one lane group
                              * that streams prefetches its inputs; 32:
                              * host tables of costly expressions of one
                              * bf16/f16 input, table.c; 33: the rescale's
                              * steps test no lane for infinity where
                              * exp's argument is x - amax(x); 34: f32
                              * sums in f64 on sm_70, sm_80, sm_90; 35:
                              * there, var_mean of a row in registers in
                              * one pass; 36: a cat's lane group that lies
                              * in one operand loads as one vector; 37: the
                              * GPU's lanes sized by the region's values of
                              * its highest rank only; 38: f32 sigmoid as
                              * 1/(1 + e^-|x|) or its e times that, tanh's
                              * quotient by a reciprocal, both without the
                              * GPU's slow path; f32 exp scaled by two
                              * multiplications, no NaN select; 39: var_mean
                              * in one pass: both sums in one round of the
                              * threads; 40: a host loop streams at most
                              * host_streams outputs, one on AMD's Zen;
                              * the scratch wherever the region is large
                              * enough to stream; a host loop for each
                              * independent part of a shape group; 41:
                              * host bf16 add, sub, mul, div of bf16
                              * operands round without the NaN test; 42:
                              * host f32 exp and sigmoid in vectors without
                              * AVX-512 too, 2^k by an exponent add where
                              * every lane is within 86 of 0; the host's
                              * passes lower branch hints; 43: host
                              * pointwise groups of 16-bit values in even
                              * and odd lanes without AVX-512; 44: host
                              * tables read lane by lane without AVX-512;
                              * 45: host rows of 16-bit values in even and
                              * odd lanes without AVX-512; 46: host rows'
                              * lanes sized as the GPU's, by values of the
                              * region's highest rank only; 47: an
                              * index_add gathered by rows gives the rows
                              * no index names a loop of their own; 48:
                              * host sums of 16 f64 lanes over two
                              * accumulators, not four; 49: the AVX-512
                              * host's vector exp scales by its own k, not
                              * by an unset one; 50: host bf16 roundings
                              * without a NaN test in kernels of no f32
                              * or f64 input, cg_nan_clean; 51: host
                              * attention's forward products stop at the
                              * work item's rows, not BQ; 52: f32 pow
                              * through f64's log2, product and exp2;
                              * 53: host var_mean in one pass; 54: a host
                              * loop prefetches only its own inputs) */
#define FZ_ROW_BLOCK 256     /* threads of a block-per-row kernel (launch dims) */
#define FZ_ROW_REGS 32       /* row elements a thread may hold in registers */

/* HOST: the skeletons' parallel loops as plain loops, for the CPU.
 * NVPTX: PTX for a GPU. EMU: the NVPTX flavour's kernels (same skeleton
 * choices, launch geometry, index width, lanes), compiled for the host
 * with the SIMT primitives as calls into runtime/emu_sched.c and every
 * global and shared access checked (see "The emulated GPU" below). */
typedef enum fz_cg_target { FZ_CG_HOST, FZ_CG_NVPTX, FZ_CG_EMU } fz_cg_target;

/* Faults the EMU flavour can seed into the kernels it makes, so that a
 * test proves the emulator's checks fire (FUSEC_EMU_FAULT; runtime/emu.c). */
typedef enum fz_emu_fault {
	FZ_EMU_FAULT_NONE,
	FZ_EMU_FAULT_BARRIER, /* every barrier dropped */
	FZ_EMU_FAULT_LOAD,    /* every global load one access further on */
	FZ_EMU_FAULT_STORE,   /* every global store one access further on */
	FZ_EMU_FAULT_SHFL,    /* the last lane of a warp skips each shuffle */
	FZ_EMU_FAULT_MMA,     /* the last lane of a warp skips each mma.sync */
	FZ_EMU_FAULT_CPWAIT,  /* every cp.async.wait_group dropped */
	FZ_EMU_FAULT_COUNT
} fz_emu_fault;

typedef struct fz_cg_options {
	fz_cg_target target;
	int sm;         /* NVPTX and EMU: compute capability, 90 for sm_90 */
	bool idx32;     /* 32-bit index arithmetic: every extent and offset fits */
	bool vectorize; /* lanes and 16-byte accesses where the shapes allow */
	fz_emu_fault emu_fault; /* EMU only; part of the cache key's target */
	bool emu_idx64; /* EMU only: 64-bit indices even where idx32 is asked
	                 * for, so tests run the 64-bit variant at small sizes
	                 * (part of the cache key's target) */
} fz_cg_options;

/* The options for a target name: "host", "sm_80", "sm_90", ..., or "emu"
 * ("emu-sm_80": the kernels of that GPU, emulated). */
fz_status fz_cg_options_parse(const char *target, fz_cg_options *o, char **err);

/* ATTENTION: attention.c (host): work[0] = blocks of (batch, head, query
 * rows) or (batch, kv head, keys). TILE: warps over tiles of matrix
 * products (codegen/mma.c, attention_gpu.c): FZ_TILE_BLOCK threads, k->vec
 * rows of work[0] per tile times work[1], fibers on emu. */
typedef enum fz_skeleton {
	FZ_SK_POINTWISE, FZ_SK_ROW, FZ_SK_SCATTER, FZ_SK_ATTENTION, FZ_SK_TILE,
} fz_skeleton;
#define FZ_TILE_BLOCK 128
typedef enum fz_rowpar { FZ_PAR_THREAD, FZ_PAR_WARP, FZ_PAR_BLOCK } fz_rowpar;

/* The host entry point of a kernel: region inputs then outputs in bufs
 * (then its scratch block, where it has one: fz_kernel.scratch),
 * every trace symbol's size in syms, a word that receives 1 + the node
 * id of an op that met a bad index (0 when none), and which part of the
 * kernel's grid to run: part p of n runs the p-th of n contiguous chunks
 * of the grid-stride loops' iterations (elements, or rows), so the parts
 * 0 .. n-1 of one launch, on any threads in any order, together do what
 * the call (0, 1) does. A kernel whose loops cannot be split (index_add's
 * scatter, but along dim 0 of f32 or f64 lanes or into wide rows, split
 * by the rows of its result: pointwise.c) does everything in part 0 and nothing in the
 * others. */
typedef void (*fz_host_fn)(void **bufs, const int64_t *syms, int32_t *err,
                           int64_t part, int64_t nparts);

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
	int row_passes;        /* rows: loops over each row's elements before
	                        * its tail (reduction.c; set when built, 0 in
	                        * a kernel the cache loaded) */
	int n_scratch;         /* host: the kernel's scratch memory, in bytes */
	fz_ext scratch[2];     /* the sum of these terms at the bound sizes (0
	                        * terms: none), which a launch hands it after
	                        * its outputs, in bufs[n_in + n_out], 64-byte
	                        * aligned (pointwise.c's "the scatter as a
	                        * gather": an index's inverse) */
	int smem;              /* bytes of dynamic shared memory a launch of an
	                        * entry gives it (0: none; over
	                        * FZ_TILE_STATIC_MAX, the function's limit is
	                        * raised to it when it is loaded) */
	struct LLVMOpaqueModule *mod; /* owned until emitted or given to the JIT;
	                               * opaque here: only codegen/ looks inside */
	fz_host_fn host;       /* after fz_kernel_jit (entry 0 does all) */
	double t_build, t_opt, t_emit; /* seconds */
} fz_kernel;

typedef struct fz_compiler fz_compiler;

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
/* FUSEC_HOST_MODEL=avx512 (tests): a host with AVX2 but not AVX-512 makes
 * the choices an AVX-512 host makes (64-byte lane groups, its exp, no even
 * and odd lanes) in instructions it has, so that a machine without
 * AVX-512 tests that host's code. Its objects have their own cache key
 * (fz_cache_target). AVX512-BF16's conversion is not modeled. */
bool fz_host_model(void);

/* Grid and block for entry e at the bound sizes: a small heuristic per
 * skeleton (see reduction.c and pointwise.c). A block-per-row kernel gets
 * FZ_ROW_BLOCK threads, which its register-held row depends on. */
/* ---- The emulated GPU (FZ_CG_EMU) -----------------------------------------
 * An EMU entry point is fz_emu_fn: the host ABI plus the calling thread's
 * context. The kernel reads its thread and block indices from the context
 * and calls back through it for the SIMT primitives; the runtime
 * (runtime/emu_sched.c) runs the threads of a block as fibers. The layout
 * is an ABI between codegen/emit.c and the runtime: the code generator
 * addresses the fields by position (EMU_CTX_* in emit.c). */
typedef struct fz_emu_thread fz_emu_thread;
struct fz_emu_thread {
	int32_t tid, ntid, ctaid, nctaid;      /* threadIdx.x ... gridDim.x */
	/* bar.sync 0 */
	void (*barrier)(fz_emu_thread *t, int32_t site);
	/* shfl.sync with a full mask: x of lane (lane ^ arg), butterfly; or
	 * with arg 0x100 | d, shfl.up: of lane (lane - d), own x below d */
	int32_t (*shfl)(fz_emu_thread *t, int32_t x, int32_t arg, int32_t site);
	/* The address of element i (of `bytes` bytes) of shared array `arr`
	 * (32 elements of at most 8 bytes each; 0-5 the reductions', 6-15
	 * named ones) for a load or a store, checked for races */
	void *(*smem)(fz_emu_thread *t, int32_t arr, int64_t i, int32_t bytes,
	              int32_t store, int32_t site);
	/* A global access [off, off + n) of buffer slot past its extent ext,
	 * or misaligned (how: 1 store, 2 misaligned): reported; returns
	 * scratch memory the access may touch instead */
	void *(*oob)(fz_emu_thread *t, int32_t slot, int64_t off, int64_t n,
	             int64_t ext, int32_t how);
	/* The warp-level matrix operations (codegen/mma.c) and the block's tile
	 * memory they use: one shared array of `size` bytes (the kernel's), up
	 * to FZ_EMU_TILE_MAX, raced and bounded per 2-byte element as above.
	 * tile: the address of bytes [off, off + bytes) for a load or a store */
	void *(*tile)(fz_emu_thread *t, int64_t off, int32_t bytes, int32_t store,
	              int32_t size, int32_t site);
	/* ldmatrix.sync.m8n8.x{n}[.trans].b16 (how: n, | 16 for .trans) with
	 * this lane's row at tile offset off: n registers into out[]; every
	 * lane of the warp takes part */
	void (*ldmatrix)(fz_emu_thread *t, int64_t off, int32_t how, int32_t size,
	                 int32_t *out, int32_t site);
	/* mma.sync.m16n8k16.row.col, f32 accumulators (kind 0: bf16, 1: f16
	 * operands): this lane's fragments a[4], b[2], c[4] in, d[4] out;
	 * every lane of the warp takes part */
	void (*mma)(fz_emu_thread *t, int32_t kind, const int32_t *a, const int32_t *b,
	            const float *c, float *d, int32_t site);
	/* cp.async of 16 bytes from global src (bounds checked by the kernel)
	 * to tile offset dst, the first src_bytes read and the rest zeros:
	 * visible to this thread after the wait_group that retires it */
	void (*cp_async)(fz_emu_thread *t, int64_t dst, const void *src,
	                 int32_t src_bytes, int32_t size, int32_t site);
	/* cp.async.commit_group (n < 0), or cp.async.wait_group n */
	void (*cp_group)(fz_emu_thread *t, int32_t n, int32_t site);
};
#define FZ_EMU_TILE_MAX (227 * 1024) /* an sm_90 block's shared memory */
/* Tile memory up to FZ_TILE_STATIC_MAX is a static shared array; above,
 * up to FZ_TILE_DYN_MAX (the opt-in limit of sm_86 and sm_89, under sm_80's
 * 163 KiB and sm_90's 227 KiB), the kernel's dynamic shared memory: k->smem
 * bytes at every launch, after cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
 * at load (runtime/cuda.c); the emulator checks that a launch gives a
 * kernel the dynamic shared memory its tiles use. */
#define FZ_TILE_STATIC_MAX (48 * 1024)
#define FZ_TILE_DYN_MAX (99 * 1024)
typedef void (*fz_emu_fn)(void **bufs, const int64_t *syms, int32_t *err,
                          fz_emu_thread *t);

void fz_kernel_launch_dims(const fz_kernel *k, int e, const int64_t *syms,
                           int64_t *grid, int *block);
/* The same for a GPU of sm_count multiprocessors (fz_kernel_launch_dims:
 * an H100's 132): a grid-stride loop gets 32 blocks per multiprocessor. */
void fz_kernel_launch_dims_on(const fz_kernel *k, int e, const int64_t *syms,
                              int sm_count, int64_t *grid, int *block);

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

#endif
