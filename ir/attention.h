/*
 * attention.h: an attention region as the code generators read it.
 *
 * An attention region (FZ_REGION_ATTENTION) is one pass of attention:
 * the forward (o, and the log-sum-exp where something reads it), or one
 * half of the backward (dq; or dk and dv). It comes from the primitive
 * (ops.def: attention, attention_dq, attention_dkv) or from the
 * decomposed form the partitioner recognizes (ir/attention.c):
 *
 *     s  = matmul(q, permute(k))            # S: [batch..., Hq, Tq, Tk]
 *     l  = where(mask, mul(s, 0.125), -1e9) # anything elementwise of S,
 *                                           # iota, constants and inputs
 *     p  = softmax(l, dim=-1)               # (lowered: amax sub exp sum div,
 *                                           #  with casts to f32 and back)
 *     o  = matmul(p, v)                     # [batch..., Hq, Tq, Dv]
 *
 * with GQA written as kv heads repeated by broadcast_in_dim/reshape. No
 * value between the two products may be read outside the region: then
 * nothing of size T x T is ever written, and the kernel computes S block
 * by block (FlashAttention-2).
 *
 * fz_attn_describe(t, R, &A) fills the struct below from the region's
 * nodes alone (so a program read back from the plan cache describes the
 * same way). It is all a code generator needs:
 *
 *   - buffers: bufs[A.in_q] ... are region inputs, bufs[n_in + A.out_o] ...
 *     outputs, contiguous row-major in the shapes below, except that on
 *     the host q, k, v, o and do may be views of their inputs inside the
 *     region (A.stride; the runtime stages strided views for the GPU).
 *     An index -1 is absent: out_lse is -1 when nothing reads the
 *     log-sum-exp (the decomposed form has none);
 *   - shapes: q [batch..., Hq, Tq, D], k [batch..., Hkv, Tk, D],
 *     v [batch..., Hkv, Tk, Dv], o and do [batch..., Hq, Tq, Dv], lse f32
 *     [batch..., Hq, Tq]; dq, dk, dv as q, k, v. The batch dims flatten to
 *     one extent `batch`; every extent may be symbolic (cg_ext); D and Dv
 *     are concrete. Query head h reads kv head h / group;
 *   - arithmetic: products accumulate in f32 (f64 for f64 traces);
 *     softmax is online over blocks of keys: m, l per query row, o
 *     rescaled by exp(m_old - m_new); a row that sees no key has m = -inf,
 *     and uses 0 in its place, so its p are 0, its o 0 and its lse -inf;
 *   - the scores: a GPU or CPU emitter never interprets scale, softcap,
 *     the mask or the decomposed expression itself. It calls
 *     cg_attn_scores (codegen/cg.h) with the raw products q.k of a few
 *     lanes at indices (b, h, i, j) and gets the logits (f32, -inf where
 *     hidden) and, for the backward, d logits / d (q.k) per lane: the
 *     shared expression emitter (emit.c) makes that code, reading a mask
 *     or bias where it lies, computing iota masks from the indices;
 *   - skipping: when A.causal or A.window is set, every key outside
 *     cg_attn_key_range's [lo, hi) for a block of query rows is hidden, so
 *     a kernel skips those key blocks (and, in the dk/dv pass, query blocks
 *     by the mirror rule, fz_attn_query_range);
 *   - the backward (pass DQ or DKV) recomputes p = exp(logit - lse) per
 *     block; with di = rowsum(do * o): dp = do . v, ds = p (dp - di) times
 *     the derivative cg_attn_scores gives; dq = ds . k; dk = ds^T . q;
 *     dv = p^T . do. The DKV pass owns a block of keys and walks the
 *     queries; the DQ pass owns a block of queries and walks the keys: no
 *     atomics, and no T x T buffer anywhere.
 *
 * What a GPU emitter must do with it: the same as codegen/attention.c does
 * for the host, with its own tiles: one thread block per (batch, head,
 * block of query rows) for FWD and DQ, per (batch, kv head, block of keys)
 * for DKV (the DKV pass sums the `group` query heads that share a kv head);
 * products on tensor cores, accumulated in f32; the logits of each tile
 * through cg_attn_scores at the tile's (b, h, i, j); the key range of a
 * query block through cg_attn_key_range. Store o (and lse where out_lse >=
 * 0) rounded once to their dtype.
 */
#ifndef FUSEC_ATTENTION_H
#define FUSEC_ATTENTION_H

#include "plan.h"

typedef enum fz_attn_pass {
	FZ_ATTN_FWD,  /* o (and lse) */
	FZ_ATTN_DQ,   /* dq */
	FZ_ATTN_DKV,  /* dk and dv */
	FZ_ATTN_BWD,  /* dq, dk and dv: attention_dq and attention_dkv of the
	               * same operands in one region (the host's one pass) */
} fz_attn_pass;

/* The operands a strided view may feed (fz_attn.stride). */
enum { FZ_ATTN_Q, FZ_ATTN_K, FZ_ATTN_V, FZ_ATTN_O, FZ_ATTN_DO };

typedef struct fz_attn {
	fz_attn_pass pass;
	bool decomposed;       /* recognized matmul/softmax/matmul, not the op */
	fz_dtype dtype;        /* q, k, v, o, do, dq, dk, dv: f32, bf16, f16, f64 */

	/* shapes (see above) */
	int n_batch;           /* batch dims before the head dim (0 or more) */
	fz_ext batch;          /* their product (1 when none) */
	fz_ext hq, hkv, tq, tk;
	int64_t d, dv;         /* head dims of q/k and of v/o: concrete */
	int64_t group;         /* Hq / Hkv when both are concrete, else 1 with
	                        * hq == hkv */

	/* score modification of the primitive (the decomposed form has scale
	 * 1, softcap 0 and its expression in `logits`) */
	double scale;
	double softcap;        /* 0: none */
	bool causal;           /* key j hidden from query i when j > i */
	int64_t window;        /* 0: none; else hidden when i - j >= window, and
	                        * j - i >= window when not causal */

	/* region slots: an index into R->in, R->out; -1 when absent */
	int in_q, in_k, in_v, in_mask, in_o, in_lse, in_do;
	/* where the primitive reads q, k, v, o and do (FZ_ATTN_Q ...): the
	 * region input in_q ... itself, row-major, or a view of it made by
	 * view ops inside the region (a runner folds a permuted projection
	 * in: kernels.c), at these strides in elements, one per dim of the
	 * operand (monomials over the symbols; the head dim's is 1) */
	fz_ext stride[5][FZ_MAX_RANK];
	bool views;            /* some operand is such a view */
	int out_o, out_lse, out_dq, out_dk, out_dv;

	/* the mask operand (primitive), a region input: bool (false hides) or
	 * additive of dtype `dtype`, broadcast (numpy rules) to [batch..., Hq,
	 * Tq, Tk]; NULL when none */
	const fz_value *mask;

	/* the decomposed form */
	const fz_value *score;  /* the first product's result, [batch..., Hq,
	                         * Tq, Tk]: the kernel supplies its elements */
	const fz_value *logits; /* what the softmax normalizes, an elementwise
	                         * function of score (same shape) */
	fz_dtype score_dtype;   /* dtype of score (each product rounds to it) */
	fz_dtype p_dtype;       /* the probabilities are rounded to it before
	                         * the second product (the softmax's result) */
	const fz_node *first, *last; /* the two products */
	const fz_node *op;      /* the primitive (attention_dkv in FZ_ATTN_BWD);
	                         * NULL in the decomposed form */
} fz_attn;

/* Fills A from attention region R of t; false (with a reason in why) when
 * R is not one of the forms above. */
bool fz_attn_describe(const fz_trace *t, const fz_region *R, fz_attn *A,
		      char *why, size_t n);

/* The decomposed form whose second product is node m2: the ids of the
 * nodes it takes (at most max) into ids, and their count; 0 when m2 ends
 * no such form. The partitioner makes them one region. */
int fz_attn_match(const fz_trace *t, const fz_node *m2, int *ids, int max);

/* GQA written as repeated kv heads (HF's repeat_kv before SDPA: k and v
 * broadcast_in_dim to [batch..., Hkv, g, T, D] and reshaped to [batch...,
 * Hkv g, T, D]) is read unrepeated by the attention ops, so no repeated
 * copy is planned: an op whose k and v are both repeated by one g reads
 * the unrepeated values instead (query head h reads kv head h / g, as
 * the kernels index a shared head anyway; the values read are the same).
 * attention_dkv's dk and dv then have the kv heads' shape, which is the
 * shape of the sum over each group that the backward of the repeat
 * writes next (reshape to [.., Hkv, g, T, D], sum over g): so it folds
 * only when each of its results is read by exactly that, and its region
 * takes the reshapes and the sums, writing the sums' results (the group's
 * heads summed in the kernel's accumulator, not rounded per head first).
 * folds[i] for every node i: k and v what attention op i reads in place of
 * operands 1 and 2 (NULL: it reads them as written); for attention_dkv,
 * sum[r] the reshape and the sum of result r. dce.c marks the repeats
 * that nothing else reads dead; partition.c links the unrepeated values
 * and groups the sums with the op. The count of folded ops, -1 when out
 * of memory. */
int fz_attn_fold_find(const fz_trace *t, fz_attn_fold *folds);

/* The strides (elements, monomials over the symbols) at which value v,
 * made inside region R from one of R's inputs by view ops (permute,
 * reshape, squeeze, unsqueeze, broadcast_in_dim), reads that input, laid
 * out row-major; *in its index in R->in. v an input itself: row-major.
 * False when v is made otherwise, or a reshape merges dims that do not lie
 * one after another. */
bool fz_attn_view_strides(const fz_region *R, const fz_value *v, int *in, fz_ext *st);

/* The value region R reads for operand k of its node n: n->in[k], or for
 * a folded attention op's k and v the unrepeated value R reads instead. */
const fz_value *fz_attn_operand(const fz_region *R, const fz_node *n, int k);

/* Flops of the pass at sizes (the simulator's and the benches' count):
 * 4 B Hq Tq Tk D forward (2 products), 2.5x that for the backward's two
 * passes together; causal counts about half the pairs. */
double fz_attn_flops(const fz_attn *A, const int64_t *sizes);

#endif
