/*
 * cg.h: the code generator's private state, for the files of codegen/ only.
 *
 * codegen.h is what the rest of fusec sees: options, the compiler as an
 * opaque handle, kernels and their launch records. This header adds the
 * LLVM side: the compiler's context, target machine and JIT, and the
 * emitter's state that emit.c, math.c and the skeletons share while one
 * region becomes one module. Nothing outside codegen/ includes it, so LLVM
 * types never leak into the runtime, the cache or the tools.
 */
#ifndef FUSEC_CG_H
#define FUSEC_CG_H

#include <llvm-c/Core.h>

#include "attention.h"
#include "codegen.h"

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
	int vector_bytes;    /* host: widest vector register the JIT may use */
	bool host_bf16;      /* host: AVX512-BF16's vcvtneps2bf16 (emit.c) */
	int host_streams;    /* host: most outputs one loop may stream (emit.c) */
	bool host_model;     /* host: AVX2 making AVX-512's choices (fz_host_model) */
};
fz_status cg_nvptx_init(fz_compiler *c, char **err);
fz_status cg_host_init(fz_compiler *c, char **err);
void cg_host_free(fz_compiler *c);
fz_status cg_llvm_error(fz_compiler *c, void *llvm_error, const char *what,
                        int region, char **err);

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

#define CG_TAB_MAX 4

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
	LLVMValueRef part, nparts; /* host: which chunk of the grid (ity) */
	bool serial;          /* host: part 0 does all (cg_host_chunk) */
	const fz_node *by_rows; /* host: index_add split by rows of its
	                        * result (pointwise.c, "the scatter by rows") */
	LLVMValueRef scratch; /* host: the kernel's scratch block (bufs[n_in +
	                       * n_out], where k->n_scratch; pointwise.c's "the
	                       * scatter as a gather") */
	bool stream;          /* host: cg_store's vector stores bypass the cache */
	bool nan_clean;       /* host: every NaN the kernel computes has a zero
	                       * low half, so bf16 rounding skips its NaN test
	                       * (cg_nan_clean, emit.c) */
	bool streamed;        /* host: one did (cg_function_end fences them) */
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
	LLVMValueRef emu;     /* EMU: the thread's context (fz_emu_thread *) */
	LLVMValueRef *ext;    /* EMU: each buffer's element count, i64 */
	int emu_site;         /* EMU: numbers barriers and shuffles */
	const char *emu_smem[10]; /* EMU: named shared arrays (cg_smem32) */
	int n_emu_smem;
	LLVMValueRef tile;    /* NVPTX: the tile memory array (mma.c) */
	int tile_bytes;       /* its size (0: none) */
	/* host: costly expressions of one 16-bit input read from tables
	 * (table.c); tab by value id: 1 + its table's index, or 0 */
	struct cg_table {
		const fz_value *root, *leaf;
		LLVMValueRef glob;
	} tabs[CG_TAB_MAX];
	int n_tabs;
	int *tab;
	LLVMValueRef tab_init; /* <kernel>_tables */
	bool tab_fill;        /* emitting it: roots are computed */
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
/* v's lanes at ix are those that output o (same dtype and shape) holds
 * there, stored by this thread: read from o, and memoized as v's. */
void cg_value_reload(cg *g, const fz_value *v, const fz_value *o, int nl,
                     cg_ix (*ix)[FZ_MAX_RANK]);
/* Rounds an f32 compute value to f16 or bf16 precision (else x itself):
 * every op whose result is f16/bf16 rounds, as the interpreter does. */
LLVMValueRef cg_round_half(cg *g, LLVMValueRef x, fz_dtype d);
/* Wraps an i64 compute value to the width of integer dtype d, as a store
 * and a load would (x itself for i64 and bool). */
LLVMValueRef cg_wrap_int(cg *g, LLVMValueRef x, fz_dtype d);
/* Whether the host kernel of region r computes only NaNs with a zero low
 * half (emit.c): g->nan_clean. */
bool cg_nan_clean(const cg *g, const fz_region *r);
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
/* The host with AVX-512 F, BW, VL and DQ (target_host.c's 64-byte vectors):
 * math.c may use its instructions (vscalefps) on f32 vectors. */
static inline bool cg_host_avx512(const cg *g)
{
	return g->o.target == FZ_CG_HOST && g->c && g->c->vector_bytes == 64;
}
/* ... and may use its instructions: not where an AVX2 host only models
 * its choices (fz_host_model), which takes generic IR for the same
 * results (math.c's scalef, attention.c's vexp, table.c's gathers). */
static inline bool cg_host_avx512_isa(const cg *g)
{
	return cg_host_avx512(g) && !g->c->host_model;
}
/* GPU semantics: the NVPTX flavour and its emulation make the same
 * skeleton choices (rows per warp or block, atomics, a second entry). */
static inline bool cg_gpu(const cg *g)
{
	return g->o.target == FZ_CG_NVPTX || g->o.target == FZ_CG_EMU;
}
/* The address of element off of buffer slot s for an access of n
 * elements aligned to `align` bytes: cg_elem_ptr, and on EMU checked
 * against the buffer's extent and the alignment. */
LLVMValueRef cg_access_ptr(cg *g, int s, fz_dtype d, LLVMValueRef off, int n,
                           bool store, unsigned align);
/* Shared array arr (32 elements of t): the address of element i, for a
 * load or a store (EMU: checked for races). */
LLVMValueRef cg_smem_ptr(cg *g, LLVMTypeRef t, int arr, LLVMValueRef i, bool store);
/* EMU: the shared array id (6 ...) of a named array (scan, select). */
int cg_emu_smem_array(cg *g, const char *name);
/* EMU: a 32-bit shuffle through the runtime: lane ^ arg (butterfly), or
 * with CG_SHFL_UP, lane - (arg & 31) (lanes below keep their value). */
enum { CG_SHFL_UP = 0x100 };
LLVMValueRef cg_emu_shfl(cg *g, LLVMValueRef x, int arg);
LLVMValueRef cg_shfl_bfly(cg *g, LLVMValueRef x, int lane_mask);

/* A host pointwise lane group of 16-bit values (pointwise.c, "even and
 * odd lanes") holds its L elements in the order 0, 2, 4, ..., 1, 3, 5,
 * ...: lane l is element cg_lane_elem(L, l) of the group. */
static inline int cg_lane_elem(int L, int l)
{
	return l < L / 2 ? 2 * l : 2 * (l - L / 2) + 1;
}
/* Whether a host group of L lanes may take that order: no AVX-512, L even
 * and at least 4, and every value the region reads or writes 16 bits wide
 * (with `last`, only those whose last extent is *last: a row's values). */
bool cg_even_odd(cg *g, int L, const fz_ext *last);

/* Host: the iterations [*begin, *end) of a loop of `total` that this
 * call's part runs: the part-th of nparts contiguous chunks (all of them
 * in part 0, none in the others, when g->serial). */
void cg_host_chunk(cg *g, LLVMValueRef total, LLVMValueRef *begin, LLVMValueRef *end);
/* The host's vector registers in bytes (16, or 32 with AVX); 16 on NVPTX. */
int cg_vector_bytes(cg *g);
/* Host (x86): the region writes FZ_HOST_STREAM_BYTES (16 MiB) or more,
 * known at compile time, and not serially, and a loop storing n outputs
 * may stream that many (c->host_streams): its final stores may be
 * streaming ones (g->stream; emit.c's "streaming stores"). */
bool cg_stream_fits(cg *g, int n);

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
/* The n lanes x[0..n) of unary op as one vector, into out[0..n) (extracted
 * again): true where math.c has a vector form of op that differs from its
 * lanes' (the host's exp and sigmoid on 4, 8 or 16 f32 lanes), false
 * (and nothing made) elsewhere. */
bool cg_math_lanes(cg *g, fz_opcode op, int n, const LLVMValueRef *x, LLVMValueRef *out);
LLVMValueRef cg_math_pow(cg *g, LLVMValueRef a, LLVMValueRef b);
/* op is one of the math functions above that cost a polynomial or more
 * (exp, log, sin, tanh, sigmoid, erf, pow and their kin): what makes an
 * expression worth a stash (reduction.c) or a table (table.c). */
bool cg_math_costly(fz_opcode op);
LLVMValueRef cg_math_fmod(cg *g, LLVMValueRef a, LLVMValueRef b);

/* table.c: at a host entry point, after its parameters: picks the
 * region's tabled expressions once (the first call), emits the function
 * that fills their tables, and calls it. */
void cg_tables_begin(cg *g);
/* v's lanes at ix read from its table, where v has one (else false and
 * nothing made). */
bool cg_table_lanes(cg *g, const fz_value *v, int n, cg_ix (*ix)[FZ_MAX_RANK],
		    LLVMValueRef *out);

/* The skeletons. */
void cg_pointwise(cg *g);
void cg_scatter(cg *g, const fz_node *ia);
void cg_rows(cg *g);
void cg_scan(cg *g);    /* scan.c: a region that is one cumsum */
void cg_select(cg *g);  /* select.c: a region that is one topk/argmax/argmin */
/* attention.c: an attention region (ir/attention.h): described, then the
 * host kernel (FlashAttention-2, tiled and vectorized) or, for NVPTX and
 * EMU, cg_attention_gpu (attention_gpu.c: the tensor-core kernels). */
void cg_attention(cg *g);
void cg_attention_gpu(cg *g, const fz_attn *A);

/* attention.c, shared by the host and GPU emitters: the logits of nl
 * consecutive keys j0, j0 + 1, ... of query row i of head h in flattened
 * batch b (all of type g->ity), from s[0..nl), the raw products q.k (f32;
 * f64 for f64 traces). out[l]: the logit, -inf where the key is hidden
 * (beyond Tk included, so a tile may run past the end); dlogit (NULL: not
 * wanted): d logit / d s per lane, 0 where hidden. The trace's score
 * modification (scale, softcap, the mask read where it lies, iota masks,
 * the decomposed form's whole expression) is emitted here by the shared
 * expression emitter, so the calls of one loop body share their loads. */
void cg_attn_scores(cg *g, const fz_attn *A, LLVMValueRef b, LLVMValueRef h,
		    LLVMValueRef i, cg_ix j0, int nl, const LLVMValueRef *s,
		    LLVMValueRef *out, LLVMValueRef *dlogit);
/* The keys [*lo, *hi) that some query row in [i0, i1) sees (A->causal,
 * A->window); [0, Tk) otherwise. Keys outside are hidden from every row
 * of the block, so their blocks may be skipped. */
void cg_attn_key_range(cg *g, const fz_attn *A, LLVMValueRef i0, LLVMValueRef i1,
		       LLVMValueRef *lo, LLVMValueRef *hi);
/* The mirror: the query rows [*lo, *hi) that see some key in [j0, j1). */
void cg_attn_query_range(cg *g, const fz_attn *A, LLVMValueRef j0, LLVMValueRef j1,
			 LLVMValueRef *lo, LLVMValueRef *hi);
/* Whether the logits are the primitive's scores scaled and hidden only by
 * the length, causal and window rules (no mask operand, no softcap). */
bool cg_attn_simple(const fz_attn *A);
/* An i1: every query row of [i0, i1) sees every key of [j0, j1) by those
 * rules (both ranges non-empty): a block that needs no mask. */
LLVMValueRef cg_attn_block_whole(cg *g, const fz_attn *A, LLVMValueRef i0,
				 LLVMValueRef i1, LLVMValueRef j0, LLVMValueRef j1);
/* emit.c: vals[0..nl) are v's lanes at ix (a value the skeleton computed
 * itself, as attention's products): memoized, so cg_value reads them. */
void cg_value_given(cg *g, const fz_value *v, int nl, cg_ix (*ix)[FZ_MAX_RANK],
		    const LLVMValueRef *vals);

/* scan.c, shared with select.c: a single-op row region's geometry, x seen
 * as [outer, n, inner] around the op's dim (rows = outer * inner). */
typedef struct cg_rowgeo {
	fz_ext outer, n, inner, rows;
} cg_rowgeo;
bool cg_row_geometry(cg *g, const fz_node *n, cg_rowgeo *G);
/* Whether the region is exactly one op of class cls (else fails g). */
bool cg_region_is_one(cg *g, fz_opclass cls);
/* The offset of element 0 of row `row` (ity). */
LLVMValueRef cg_row_base(cg *g, const cg_rowgeo *G, LLVMValueRef row);
/* shfl.sync.up by d lanes, any 32- or 64-bit type. */
LLVMValueRef cg_shfl_up(cg *g, LLVMValueRef x, int d);
/* Slot w of a 32-entry shared array of type t named `name`. */
LLVMValueRef cg_smem32(cg *g, LLVMTypeRef t, const char *name, LLVMValueRef w,
                       bool store);

/* ---- mma.c: the tensor cores' warp-level operations and tile memory -----
 * The fields of fz_emu_thread (codegen.h) after emit.c's eight, and a call
 * through one of them (emit.c). */
enum { CG_EMU_TILE = 8, CG_EMU_LDMATRIX, CG_EMU_MMA, CG_EMU_CP_ASYNC, CG_EMU_CP_GROUP,
       CG_EMU_FIELDS };
LLVMValueRef cg_emu_call(cg *g, int field, LLVMTypeRef ret, LLVMTypeRef *ps,
                         LLVMValueRef *args, unsigned n);

/* The block's tile memory: one shared array of `bytes`, declared once per
 * kernel before any use: static up to FZ_TILE_STATIC_MAX, else dynamic
 * (g->k->smem = bytes, at most FZ_TILE_DYN_MAX). Offsets are i32 byte
 * offsets into it. */
void cg_tile_alloc(cg *g, int bytes);
/* The address of bytes [off, off + bytes) for a load or a store (EMU:
 * checked for bounds and races). */
LLVMValueRef cg_tile_ptr(cg *g, LLVMValueRef off, int bytes, bool store);
/* ldmatrix.x{n}[.trans] with this lane's row at off: out[0..n), i32. */
void cg_ldmatrix(cg *g, int n, bool trans, LLVMValueRef off, LLVMValueRef *out);
/* mma.sync m16n8k16: d[4] = a b + c, a[4] and b[2] i32 registers of bf16
 * or f16 pairs (dtype d), c and d f32. */
void cg_mma(cg *g, fz_dtype d, LLVMValueRef *a, LLVMValueRef *b, LLVMValueRef *c,
            LLVMValueRef *out);
/* cp.async: 16 bytes at element off (ity) of buffer slot s (dtype d) into
 * tile offset dst, all of them (valid) or none (zeros; off must still be
 * inside the buffer). */
void cg_cp_async(cg *g, LLVMValueRef dst, int s, fz_dtype d, LLVMValueRef off,
                 LLVMValueRef valid);
void cg_cp_commit(cg *g);
void cg_cp_wait(cg *g, int n);
/* The lane (0-31) and warp of this thread, i32. */
LLVMValueRef cg_lane(cg *g);
LLVMValueRef cg_warp(cg *g);

/* A tile of rows x cols 16-bit elements in tile memory (cols a multiple of
 * 8: rows of 16-byte chunks), `stages` copies for double buffering. Rows
 * are `pitch` chunks apart: cols / 8 with the chunks XOR-swizzled by the
 * row when that is a multiple of 8, else the next odd number, so the 8
 * rows an ldmatrix reads fall in distinct banks either way. */
typedef struct cg_tile {
	int off, rows, cols, pitch, stages, stage_bytes;
} cg_tile;
/* Lays a tile out at *next (bytes), advancing it. */
cg_tile cg_tile_make(int *next, int rows, int cols, int stages);
/* The byte offset of chunk ch (8 elements) of row r (i32) of stage st. */
LLVMValueRef cg_tile_chunk(cg *g, const cg_tile *t, LLVMValueRef st, LLVMValueRef r,
                           LLVMValueRef ch);
/* All FZ_TILE_BLOCK threads copy rows [0, rows) x cols of the tile from
 * buffer slot s at element base + r * stride + c (ity), rows >= rows_valid
 * and columns >= cols_valid (a multiple of 16 bytes) zero-filled: cp.async,
 * not committed. A tile of 4-byte elements has cols = 2 x their count
 * (cols count 16-bit units). */
void cg_tile_fetch(cg *g, const cg_tile *t, LLVMValueRef st, int s, fz_dtype d,
                   LLVMValueRef base, LLVMValueRef stride, LLVMValueRef rows_valid,
                   LLVMValueRef cols_valid);
/* This warp's A fragment (16 x 16, row-major) at rows r0 (i32) and column
 * k0 (constant, a multiple of 16) of a tile: ldmatrix.x4. */
void cg_frag_a(cg *g, const cg_tile *t, LLVMValueRef st, LLVMValueRef r0, int k0,
               LLVMValueRef *a);
/* B fragments of two n-tiles (n0 and n0 + 8) for k0 .. k0 + 15: from a tile
 * stored [n][k] (trans false: the K of Q Kᵀ) or [k][n] (trans true: the V of
 * P V). b[0..1] the first n-tile's, b[2..3] the second's. */
void cg_frag_b2(cg *g, const cg_tile *t, LLVMValueRef st, int n0, int k0, bool kn,
                LLVMValueRef *b);
/* Two f32 as a register of two bf16 or f16 (lo first), rounded to nearest. */
LLVMValueRef cg_pack_half2(cg *g, fz_dtype d, LLVMValueRef lo, LLVMValueRef hi);

/* A GEMM tile kernel through these operations, for the tests: C[M, N] (f32)
 * = A[M, K] · B with B [N, K] (kn false) or [K, N] (kn true), bf16 or f16,
 * K a multiple of 8; blocks of 64 x 32 over C, a k loop of 32 with
 * cp.async double buffering. One entry point, inputs A and B, output C. */
typedef struct cg_gemm_spec {
	int64_t M, N, K;
	fz_dtype dtype;
	bool kn;
} cg_gemm_spec;
fz_status cg_gemm_build(fz_compiler *c, const cg_gemm_spec *s, fz_kernel **out,
                        char **err);

/* Lanes a region can use: a vector register (16 bytes on the GPU, 32 on
 * an AVX host) over its widest element, at most
 * FZ_VW_MAX; 1 when vectorization is off. */
int cg_lanes_for(cg *g);
/* Lanes L or fewer that divide a constant innermost extent; 1 if none. */
int cg_lanes_fit(cg *g, int L, fz_ext inner);

#endif
