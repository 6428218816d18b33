/*
 * kernels.h: which kernels a plan launches, and their code.
 *
 * One module answers it for `fusec compile`, `fusec run` and the library,
 * so that what compile puts in the cache is exactly what a run at the same
 * sizes looks for. See kernels.c for how.
 *
 *     fz_kctx *cx;  fz_kctx_new(&opts, &cx, &err);       disk, target, device
 *     fz_kset *ks;  fz_kset_build(cx, plan, syms, &ks, &err);
 *                   ks->whole[region], ks->ops[region][j], ks->copy[value]
 *     fz_kset_free(ks);  fz_kctx_free(cx);
 */
#ifndef FUSEC_RUNTIME_KERNELS_H
#define FUSEC_RUNTIME_KERNELS_H

#include "cache.h"
#include "target.h"

/* A key's code, as loaded on a device (kept in the device's store) or
 * only known to the cache (compile). */
typedef struct fz_kcode_rec {
	fz_key key;
	char *canon;
	size_t len;
	bool unsupported;       /* the skeletons do not take the region */
	fz_kernel k;            /* the launch record (no module) */
	void *fn[2];            /* per entry, after tg->load */
} fz_kcode_rec;

/* One kernel a plan launches: a whole region, op j of a region the
 * skeletons do not take whole, or the copy standing in for a reshape that
 * is not a view at these sizes. */
typedef struct fz_kinst {
	fz_region src;              /* what it computes */
	fz_node *node[1];           /* src's nodes when it is one op */
	fz_node **folded;           /* src's nodes when strided views are
	                             * folded in (malloc) */
	void *pair;                 /* two regions' nodes, inputs and outputs
	                             * when it computes both (malloc) */
	int region;                 /* plan region id (-1: a reshape copy) */
	int op;                     /* -1: the whole region; else the op's index */
	int variant;                /* idx32 * 2 + vectorize */
	fz_canon *cn;
	fz_region view;             /* src in canonical order: parameter order */
	const fz_kcode_rec *code;   /* set by fz_kset_build */
	fz_value *ins[];            /* src's inputs when it is one op, or when
	                             * views are folded in (as many as the op's
	                             * operands, or the region's inputs) */
} fz_kinst;

typedef struct fz_kset {
	int n_regions, n_values;
	fz_kinst **whole;           /* per region id: its kernel, or NULL */
	fz_kinst ***ops;            /* per region id: per op when split, or NULL */
	fz_kinst **copy;            /* per value id: a reshape's copy, or NULL */
	bool *joined;               /* per region id: made by the kernel of an
	                             * earlier region (the host's one attention
	                             * backward pass for attention_dq and
	                             * attention_dkv: kernels.c) */
	int n_inst, cap_inst;
	fz_kinst **inst;            /* every instance, in plan order */
	bool idx32;                 /* the index width chosen (bound sizes) */
} fz_kset;

/* Counters since fz_kctx_new. */
typedef struct fz_kstats {
	int regions;                /* kernel regions seen */
	int instances;              /* kernels launched per run (all sets) */
	int unique;                 /* distinct keys */
	int compiled;               /* compiled by this process */
	int cache_hits;             /* found in the disk cache */
	int mem_hits;               /* found loaded on the device (other programs) */
	int unsupported;            /* keys the skeletons do not take (split) */
	int cubins;                 /* cubins built while compiling */
	double seconds;             /* resolving: canon, disk, compile, load */
} fz_kstats;

typedef struct fz_kctx_options {
	fz_cg_options cg;           /* target and sm (idx32, vectorize: per kernel) */
	fz_disk *disk;              /* NULL: none; borrowed */
	fz_device *dev;             /* NULL: only make sure the cache holds code */
	bool cubins;                /* NVPTX: build cubins where nvJitLink is */
	int jobs;                   /* compile threads (0: the CPUs) */
	/* progress: called after each compile (done of total); may be NULL */
	void (*progress)(void *ctx, int done, int total);
	void *progress_ctx;
} fz_kctx_options;

typedef struct fz_kctx fz_kctx;

fz_status fz_kctx_new(const fz_kctx_options *o, fz_kctx **out, char **err);
void fz_kctx_free(fz_kctx *cx);
const fz_kstats *fz_kctx_stats(const fz_kctx *cx);
/* The key's target string ("sm_90", "host-x86_64-...-znver3"). */
const char *fz_kctx_target(const fz_kctx *cx);
/* The first compile failure's message and the first unsupported op's,
 * or NULL. */
const char *fz_kctx_first_unsupported(const fz_kctx *cx);

/* Every kernel of plan p at sizes syms (-1 for a symbol left unbound:
 * both index widths are made, for `fusec compile` without --bind), keyed
 * and resolved: with a device, loaded (from its store, the disk cache, or
 * compiled and stored); without, made sure to be in the disk cache. A
 * kernel op the skeletons cannot take is FZ_EUNSUPPORTED naming it. */
fz_status fz_kset_build(fz_kctx *cx, const fz_program *p, const int64_t *syms,
                        fz_kset **out, char **err);
void fz_kset_free(fz_kset *ks);

/* 32-bit index arithmetic for a trace at bound sizes: every value has
 * fewer than 2^31 / 8 elements. */
bool fz_kernels_idx32(const fz_trace *t, const int64_t *syms);

/* The device's store of loaded kernels (freed with the device). */
void fz_kstore_free(fz_kstore *s);

#endif
