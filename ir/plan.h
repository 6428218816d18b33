/*
 * plan.h: a trace turned into a program: regions, their order, and where
 * every intermediate lives.
 *
 * The passes (ir/partition.c, ir/bookend.c, ir/schedule.c, ir/memplan.c)
 * run in order from fz_plan (ir/plan.c), each able to dump its result. The
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
	FZ_REGION_KIND_COUNT
} fz_region_kind;

extern const char *const fz_region_kind_names[FZ_REGION_KIND_COUNT];

static inline bool fz_region_is_kernel(fz_region_kind k)
{
	return k == FZ_REGION_POINTWISE || k == FZ_REGION_REDUCTION ||
	       k == FZ_REGION_NORMALIZATION || k == FZ_REGION_INDEXING;
}

typedef struct fz_region {
	int id;
	fz_region_kind kind;
	int n_nodes;
	fz_node **nodes;  /* in topological order */
	int n_in;
	fz_value **in;    /* read here, defined outside (params or other regions) */
	int n_out;
	fz_value **out;   /* defined here, used by other regions or returned */
} fz_region;

#endif
