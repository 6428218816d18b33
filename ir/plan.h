/*
 * plan.h: a trace turned into a program: regions, their order, and where
 * every intermediate lives.
 *
 * The passes (ir/partition.c, ir/bookend.c, ir/schedule.c,
 * ir/horizontal.c, ir/comm.c, ir/memplan.c) run in order from fz_plan (ir/plan.c),
 * each able to dump its result. The
 * code generator reads one region at a time: its nodes (a topological
 * order), the values it reads from outside and the values it makes for
 * others. It never looks at the rest of the trace.
 *
 *     region 3: normalization  var_mean sub add rsqrt mul mul add cast
 *               in:  x bf16[16, 128, 1600], w bf16[1600], b bf16[1600]
 *               out: y bf16[16, 128, 1600]
 */
#ifndef FUSEC_PLAN_H
#define FUSEC_PLAN_H

#include "ir.h"

typedef enum fz_region_kind {
	FZ_REGION_POINTWISE,     /* one iteration domain, elementwise + meta */
	FZ_REGION_REDUCTION,     /* reductions (and their elementwise prologue) */
	FZ_REGION_NORMALIZATION, /* reduce, then use the reduced value */
	FZ_REGION_INDEXING,      /* take, take_along, index_add (+ elementwise) */
	FZ_REGION_LIBRARY,       /* matmul, linear: one library call */
	FZ_REGION_COLLECTIVE,    /* one collective */
	FZ_REGION_WAIT,          /* one wait */
	FZ_REGION_VIEW,          /* only bookended meta ops: launches nothing */
	FZ_REGION_SCAN,          /* one cumsum: a row scan (codegen/scan.c) */
	FZ_REGION_SELECT,        /* one topk, argmax or argmin (codegen/select.c) */
	FZ_REGION_ATTENTION,     /* one attention pass (ir/attention.h): an
	                          * attention op, or matmul / scores / softmax /
	                          * matmul recognized (codegen/attention.c) */
	FZ_REGION_KIND_COUNT
} fz_region_kind;

extern const char *const fz_region_kind_names[FZ_REGION_KIND_COUNT];

static inline bool fz_region_is_kernel(fz_region_kind k)
{
	return k == FZ_REGION_POINTWISE || k == FZ_REGION_REDUCTION ||
	       k == FZ_REGION_NORMALIZATION || k == FZ_REGION_INDEXING ||
	       k == FZ_REGION_SCAN || k == FZ_REGION_SELECT ||
	       k == FZ_REGION_ATTENTION;
}

/* The dims a reduction node reduces, as a bit mask. */
static inline uint32_t fz_reduced_dims(const fz_node *n)
{
	uint32_t m = 0;
	for (int i = 0; i < n->attrs.n_dims; i++)
		m |= 1u << n->attrs.dims[i];
	return m;
}

/* Same extents (dtype aside). */
static inline bool fz_same_shape(const fz_type *a, const fz_type *b)
{
	if (a->rank != b->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (!fz_ext_eq(a->dims[i], b->dims[i]))
			return false;
	return true;
}

/* Whether the host writes index_add ia's result by rows, each row once,
 * from the rows of its source gathered through the index's inverse
 * (codegen/pointwise.c, "the scatter as a gather"), so that elementwise
 * work in its region may read the result (partition.c): along dim 0, into
 * rows of 64 elements or more (or of a symbolic count). Narrower rows are
 * scattered: each row costs the gather a few words of the inverse and a
 * turn of its loops (at 16 f32 a row it took 1.2 to 1.4 times the scatter
 * by rows' time, at 64 about as long, at 256 less). */
static inline bool fz_index_add_gathers(const fz_node *ia)
{
	const fz_type *y = &ia->out[0]->type;
	if (ia->attrs.dim != 0 || y->rank < 2)
		return false;
	int64_t c = 1;
	for (int d = 1; d < y->rank && c < 64; d++)
		c = fz_ext_is_const(y->dims[d]) ? c * y->dims[d].c : 64;
	return c >= 64;
}

typedef struct fz_region {
	int id;
	fz_region_kind kind;
	int n_nodes;
	fz_node **nodes;  /* in topological order */
	int n_in;
	fz_value **in;    /* read here, defined outside (params or other regions);
	                   * a wait region also lists the operands of the
	                   * collectives it waits on (comm.c: they are read on
	                   * the communication stream until then) */
	int n_out;
	fz_value **out;   /* defined here, used by other regions or returned */
	/* The ids of in and out, where fz_regions_link filled them (else
	 * NULL; whoever changes in or out sets them NULL): the replays of a
	 * deep trace read ids from here rather than from each value. Read
	 * them through fz_in_id and fz_out_id. */
	int *in_id, *out_id;
} fz_region;

/* Whether v is one of vs[0 .. n). */
static inline bool fz_value_listed(fz_value *const *vs, int n, const fz_value *v)
{
	for (int i = 0; i < n; i++)
		if (vs[i] == v)
			return true;
	return false;
}

static inline int fz_in_id(const fz_region *R, int k)
{
	return R->in_id ? R->in_id[k] : R->in[k]->id;
}

static inline int fz_out_id(const fz_region *R, int k)
{
	return R->out_id ? R->out_id[k] : R->out[k]->id;
}

/* ---- The program: what fz_plan makes of a trace ------------------------- */

typedef enum fz_pass {
	FZ_PASS_DCE, FZ_PASS_PARTITION, FZ_PASS_BOOKEND, FZ_PASS_SCHEDULE, FZ_PASS_HORIZONTAL,
	FZ_PASS_WAITS, FZ_PASS_PREFETCH, FZ_PASS_SCATTER, FZ_PASS_BUCKET,
	FZ_PASS_MEMPLAN, FZ_PASS_COUNT
} fz_pass;

extern const char *const fz_pass_names[FZ_PASS_COUNT];
int fz_pass_from_name(const char *name, fz_pass *out); /* 1 if known */

/* The planner's version: it enters the key of every program the disk cache
 * keeps (cache/plan_cache.c), so a fusec whose passes plan differently never
 * loads a program an older one made. Bump it with any change to what the
 * passes produce. (2: dead ops in no region, attention regions, an output
 * placed only over an input it is computed from. 3: attention ops read
 * repeated kv heads unrepeated. 5: elementwise followers of an index_add
 * along dim 0 in its region. 6: buffers of a page or more planned on
 * pages, after the small ones: ir/memplan.c. 7: a horizontally merged
 * region's inputs and outputs in the rebuilt region's order, so its
 * in-place takeovers may differ: ir/horizontal.c.) */
#define FZ_PLAN_VERSION 7

typedef struct fz_plan_options {
	/* Sizes per symbol index (fz_trace_symbol); NULL, or -1 for a symbol
	 * left unbound: taken as 1 for bytes (and listed in unbound_syms). */
	const int64_t *sym_sizes;
	/* Dump the program after this pass into fz_program.dump; -1: none. */
	int dump_after;
	/* Horizontal fusion of independent kernels (pointwise with pointwise
	 * of one element count, reductions of one row shape), taken only when
	 * the planned peak does not rise (ir/horizontal.c). On by default
	 * (fz_plan_defaults). */
	bool horizontal;
	/* The exact scheduler gives up past this many downsets (0: 200000). */
	int exact_max_states;
	/* Communication scheduling (ir/comm.c), each pass on by default:
	 * waits right before their first consumer; all-gathers issued in
	 * order of first use, as early as max_inflight_bytes of gathered,
	 * not yet released bytes allow (default 1 GiB; 0: no cap); reduce-scatters and
	 * all-reduces issued as soon as their operand is complete; back-to-back
	 * all-gathers smaller than bucket_bytes coalesced into buckets of at
	 * most bucket_bytes (0: no buckets; default 25 MiB). */
	bool comm_waits, comm_prefetch, comm_scatter;
	int64_t max_inflight_bytes;
	int64_t bucket_bytes;
} fz_plan_options;

void fz_plan_defaults(fz_plan_options *o);

/* Extents and strides (elements) of a tensor over a buffer, and where in
 * the buffer it starts. */
typedef struct fz_layout {
	int rank;
	int64_t shape[FZ_MAX_RANK];
	int64_t strides[FZ_MAX_RANK];
	int64_t offset;
} fz_layout;

/* Is lay row-major contiguous (extents of 1 may have any stride)? */
bool fz_layout_is_contiguous(const fz_layout *lay);
/* Copies the elements of src seen through lay (offset included, strides in
 * elements of es bytes) into contiguous host memory dst: the strided copy
 * of the host-memory targets. Runs of contiguous elements move in one
 * memcpy. */
void fz_layout_gather(void *dst, const void *src, size_t es, const fz_layout *lay);
/* The contiguous layout of a value at sizes; false on overflow. */
bool fz_layout_contiguous(const fz_value *v, const int64_t *sizes,
                          fz_layout *out);
/* The layout meta op n gives its operand laid out as `in`; false when it
 * cannot be a view (cat, or a reshape that would need a copy). */
bool fz_meta_layout(const fz_node *n, const int64_t *sizes,
                    const fz_layout *in, fz_layout *out);

/* A bookended meta op: `value` is `base`'s buffer seen through new extents
 * and strides, computed on the host; no kernel, no copy. `lay` holds the
 * numbers at the plan's sizes; fz_view_eval recomputes them for other
 * bindings by replaying the chain of views from the base. */
typedef struct fz_view {
	fz_value *value;
	fz_value *base;        /* a parameter or a region's output: contiguous */
	fz_node *node;         /* the meta op that makes value */
	fz_layout lay;
} fz_view;

typedef enum fz_sched_method {
	FZ_SCHED_GREEDY,     /* the memory-aware list scheduler */
	FZ_SCHED_EXACT,      /* dynamic programming over all downsets */
	FZ_SCHED_TRACE,      /* the written order was better than both */
	FZ_SCHED_FUSED,      /* the order horizontal fusion was judged on */
} fz_sched_method;

/* An attention op that reads repeated kv heads unrepeated (ir/attention.h,
 * fz_attn_fold_find). */
typedef struct fz_attn_fold {
	const fz_value *k, *v;       /* read for operands 1 and 2; NULL: no fold */
	const fz_node *sum[2][2];    /* attention_dkv: per result, the reshape
	                              * and the sum over each group */
} fz_attn_fold;

typedef struct fz_program {
	fz_arena arena;              /* everything below lives here */
	const fz_trace *trace;
	int64_t sym_sizes[FZ_MAX_SYMS];   /* bytes are counted at these */
	int64_t probe_sizes[FZ_MAX_SYMS]; /* structure is judged at these */
	uint64_t unbound_syms;       /* symbols taken as 1 */
	fz_plan_options opts;

	int n_regions;
	fz_region **regions;         /* regions[i]->id == i */
	int *region_of;              /* per node id; -1 for a dead node */
	bool *dead;                  /* per node id: nothing needs its results
	                              * (dce.c); NULL when every node is live */
	int n_dead;
	fz_attn_fold *attn_fold;     /* per node id (dce.c); NULL when no
	                              * attention op reads repeated kv heads */
	int *def_of;                 /* per value id: its node's id, -1 for a
	                              * parameter (partition.c), so a pass asks
	                              * an array for a value's region, not
	                              * value->def->id (NULL in a program the
	                              * plan cache loaded: fz_def_id falls back) */
	/* The graph as ids, per node id i (partition.c; NULL in a program the
	 * plan cache loaded): its operands' value ids are
	 * node_in[node_in_start[i] .. node_in_start[i + 1]), its results'
	 * node_out[2 i], node_out[2 i + 1] (-1 past n_out). */
	int *node_in_start, *node_in, *node_out;
	int *canon_rank;             /* per node id: place in the canonical
	                              * order (partition.c), blind to names
	                              * and to the written order */

	int n_views;
	fz_view **view_of;           /* per value id: its view, or NULL */
	int *view_root;              /* per value id: fz_view_root's answer,
	                              * once the views are final (NULL before) */
	bool *is_param;              /* per value id: a parameter (filled with
	                              * view_root), so the replays ask an array,
	                              * not the value */
	int *vec_width;              /* per region: elements per vector access */
	int *vec_bytes;              /* per region: bytes per vector access */

	/* Schedule: region ids in execution order, and the written order. */
	int *order, *trace_order;
	fz_sched_method method;
	bool peak_proven_optimal;    /* exact search, or meets the lower bound */
	int64_t peak_lower_bound;    /* max over regions of what one step holds */

	/* Memory plan: per value id. bytes: element count x dtype size at
	 * sym_sizes (0 for views and parameters); buffer: the value whose
	 * storage it uses (itself, a view's base, an in-place donor); offset:
	 * in the arena, -1 where it has no storage of its own. */
	int64_t *bytes;
	int *buffer;
	/* In-place candidates: for value id o, n_donors[o] input buffers of its
	 * pointwise region that o may overwrite when o's region reads them
	 * last (same bytes, read only elementwise). */
	int *n_donors;
	int **donors;
	int64_t *offset;
	int64_t peak_bytes, peak_bytes_trace_order, arena_bytes;

	/* Horizontal fusion: merges taken, and candidates refused because the
	 * peak would rise or because one depends on the other. */
	int horizontal_merged, horizontal_refused_peak, horizontal_refused_path;

	/* Communication scheduling: the most gathered, not yet released bytes
	 * the prefetch order holds at once, and the buckets made. */
	int64_t comm_peak_inflight;
	int comm_buckets;

	char *dump;                  /* text of --dump-after, or NULL */
	/* The form the plan cache found or stored this program under
	 * (cache/plan_cache.c), kept so that the program's kernel keys
	 * (fz_program_canons) are filed under it without making it again;
	 * NULL for a program planned without the cache. */
	void *cache_form;
	size_t cache_form_len;
	double pass_seconds[FZ_PASS_COUNT]; /* wall time of each pass */
	/* Work of each pass, counted: nodes, regions and edges visited, heap
	 * and sort steps. A count per op that stays flat as the trace grows is
	 * the linearity each pass's essay argues (tests/test_plan.c checks it
	 * on generated Llama steps of 2 and 16 layers). */
	int64_t pass_work[FZ_PASS_COUNT];
	int64_t work;                /* the running count the passes add to */
} fz_program;

/* What sorting (or a heap of) n items costs, as pass_work counts it:
 * n ceil(log2 n). */
static inline int64_t fz_nlogn(int64_t n)
{
	int64_t l = 1;
	while (l < 62 && ((int64_t)1 << l) < n)
		l++;
	return n * l;
}

/* Sorts a[0..n) ascending. The passes sort ids by a key packed as
 * key << 32 | id, all keys distinct, so the order is one. */
void fz_sort_u64(uint64_t *a, int n);

/* Plans trace t (verified): dce, partition, bookend, schedule, horizontal,
 * waits, prefetch, scatter, bucket, memplan. */
fz_status fz_plan(const fz_trace *t, const fz_plan_options *o,
                  fz_program **out, char **err);
void fz_program_free(fz_program *p);

/* The passes, in the order fz_plan calls them. */
fz_status fz_dce(fz_program *p);
fz_status fz_partition(fz_program *p);
fz_status fz_bookend(fz_program *p);
fz_status fz_schedule(fz_program *p);
fz_status fz_horizontal(fz_program *p);
fz_status fz_comm_waits(fz_program *p);
fz_status fz_comm_prefetch(fz_program *p);
fz_status fz_comm_scatter(fz_program *p);
fz_status fz_comm_bucket(fz_program *p);
fz_status fz_memplan(fz_program *p);

/* A region whose elementwise work reads its index_add's result (an
 * embedding's backward and its cast: partition.c's scatter_follower),
 * which only the host's skeleton takes whole (it gathers by rows), as two
 * regions for the other targets, the form they had before the two were
 * one: the nodes that do not depend on the result (the scatter and what it
 * reads), then those that do: two regions in one malloc, freed at once. NULL
 * where r has no such index_add, or out of memory (*oom). */
fz_region *fz_scatter_split(const fz_region *r, bool *oom);

/* The trace with its nodes in the order the program runs them (regions in
 * scheduled order, each region's nodes in order): a trace that parses back
 * and plans to the same order. */
fz_status fz_program_print_trace(const fz_program *p, char **out);

/* Shared by the passes (plan.c). */
/* Rebuilds every region's in and out from its nodes and the views. */
fz_status fz_regions_link(fz_program *p);
/* The value whose buffer v occupies when v is a view (else v itself). */
fz_value *fz_view_root(const fz_program *p, fz_value *v);
/* The id of fz_view_root's answer, read from view_root where it is filled:
 * the replays of a deep trace then touch no value but the one they hold. */
static inline int fz_view_root_id(const fz_program *p, const fz_value *v)
{
	return p->view_root ? p->view_root[v->id] :
	       fz_view_root(p, (fz_value *)v)->id;
}
/* The id of the node that makes v, -1 for a parameter. */
static inline int fz_def_id(const fz_program *p, const fz_value *v)
{
	return p->def_of ? p->def_of[v->id] : v->def ? v->def->id : -1;
}
/* fz_view_root_id by id. */
static inline int fz_root_id(const fz_program *p, int v)
{
	return p->view_root ? p->view_root[v] :
	       fz_view_root(p, p->trace->values[v])->id;
}
/* Is value id v a parameter? */
static inline bool fz_id_is_param(const fz_program *p, int v)
{
	return p->is_param ? p->is_param[v] :
	       p->trace->values[v]->param_index >= 0;
}
/* Fills view_root once the views are final (the end of bookend, a program
 * read back from the cache): fz_view_root is then one load, not a walk. */
fz_status fz_program_index_views(fz_program *p);
/* Peak live bytes of running the regions in `order` (with in-place reuse),
 * the rule memplan follows; one replay, O(regions + edges). */
int64_t fz_order_peak(const fz_program *p, const int *order);
/* Per buffer (a view's root): readers[id] = the regions that read it;
 * pinned[id] for the buffers of program outputs. seen is scratch of
 * n_values ints, zeroed. The rule fz_order_peak and memplan share. */
void fz_program_count_readers(const fz_program *p, int *readers, int *seen,
			      bool *pinned);
/* The dying input buffer o may overwrite in place: one of its donors that
 * this region reads last (readers == 1), not an output's, not already
 * given away; -1 if none. */
int fz_pick_donor(const fz_program *p, int o, const int *readers,
		  const bool *pinned, const bool *donated);
/* The in-place rule for one region (schedule.c): count[k] inputs that
 * output k may take over, listed at list[k * R->n_in ...]. reach: n_values
 * bools, false on entry and on return. */
void fz_region_donors(const fz_program *p, const fz_region *R, bool *reach,
		      int *count, int *list);
/* The view of v (given its base's tensor) under other sizes. */
fz_status fz_view_eval(const fz_program *p, const fz_value *v,
                       const int64_t *sym_sizes, fz_layout *out);
/* Appends a readable account of the program after `pass`. */
void fz_program_dump(const fz_program *p, fz_pass pass, fz_buf *b);
/* Counts by kind. */
int fz_program_count(const fz_program *p, fz_region_kind k);
int fz_program_kernels(const fz_program *p);

/* Kernel region r as its kernel computes it, the strided views it reads
 * (broadcasts, permutes, slices; on the host attention's operands too)
 * folded in as the ops that make them from their bases, so that no gather
 * runs before it: what the runner launches (runtime/kernels.c) and `fusec
 * emit` prints. *out is r with those ops before its nodes, which *folded
 * holds (malloc'd; NULL, and *out = *r, when nothing folds); ins, with
 * room for r->n_in values, becomes out->in. False: out of memory. */
bool fz_region_fold_views(const fz_program *p, const fz_region *r, bool host,
			  fz_region *out, fz_node ***folded, fz_value **ins);

#endif
