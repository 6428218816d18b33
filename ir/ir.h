/*
 * ir.h: the internal IR of fusec, shared by every stage.
 *
 * A trace is a list of nodes in SSA form. Each node applies one primitive op
 * (ops.def) to operand values and defines one value (two for var_mean).
 * Every value carries a type: a dtype, a rank, and one extent per dim.
 *
 * An extent is a monomial: a coefficient times a product of symbols, so
 * that reshaping [B, T, 4096] to [-1, 4096] gives the honest extent B*T
 * rather than losing it, and a [T, T] mask has T*T elements. `syms` packs
 * one 4-bit exponent per symbol (symbol i in bits 4i..4i+3), so a trace has
 * at most 16 symbols and a symbol's power is at most 15. A concrete extent
 * has no symbols.
 *
 *     {.c = 4096, .syms = 0}                    4096
 *     {.c = 1, .syms = fz_ext_sym(B).syms}      B
 *     {.c = 2, .syms = B + T (as nibbles)}      2*B*T
 *     {.c = 1, .syms = 2 << 4*T}                T*T
 *
 * An extent that is a sum, T+1 or B*T-B, is a derived symbol: a trace
 * symbol whose size is not bound by anyone but computed from the others
 * by its definition, a polynomial over the free symbols (sym_def). The
 * sum is kept in a canonical form, so that each value has one spelling:
 * the terms' common factor comes out as a monomial and what is left,
 * primitive, is the symbol. B*T-B is B * (T-1): the monomial B times the
 * derived symbol named "T-1"; 2*T+2 is 2 * "T+1". A derived symbol's name
 * is its definition as the printer writes it, so two spellings of one sum
 * meet in one symbol, and passes and kernels see only monomials: a kernel
 * takes "T+1" as one more size, bound at run time (fz_trace_syms_derive).
 *
 * Everything a trace holds (nodes, values, shapes, names, attribute lists)
 * comes from its arena and is freed at once with the trace. Nothing frees a
 * single node.
 *
 * Broken invariants abort through FZ_ASSERT, which names file and line;
 * errors in input never do: they are statuses.
 */
#ifndef FUSEC_IR_H
#define FUSEC_IR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fusec.h"

#define FZ_ASSERT(c) \
	((c) ? (void)0 : fz_assert_fail(#c, __FILE__, __LINE__))
_Noreturn void fz_assert_fail(const char *what, const char *file, int line);

#define FZ_MAX_SYMS 16    /* symbols per trace: one 4-bit exponent each */
#define FZ_SYM_BITS 4
#define FZ_MAX_ARGS 256   /* operands of one op (cat) */
#define FZ_ERRLEN 512

/* ---- Arena --------------------------------------------------------------- */

typedef struct fz_chunk fz_chunk;
typedef struct fz_arena {
	fz_chunk *head;
	size_t total;
} fz_arena;

void *fz_arena_alloc(fz_arena *a, size_t n);     /* zeroed; NULL if no memory */
char *fz_arena_strdup(fz_arena *a, const char *s);
void fz_arena_release(fz_arena *a);
/* Makes room for n more bytes in one chunk (in huge pages when big), for a
 * caller that knows roughly what is coming: a parser that has the text's
 * size. Nothing happens when it cannot (allocations go on as usual). */
void fz_arena_reserve(fz_arena *a, size_t n);
/* Hands the whole 2 MiB pages inside p[0..n) to transparent huge pages
 * (madvise), for a big buffer about to be filled: it then faults in a
 * page per 2 MiB, not per 4 KiB (util.c). */
void fz_huge_pages(void *p, size_t n);
/* At least n zeroed bytes mapped whole in huge pages (2 MiB aligned at both
 * ends), or NULL; *mapped says how many, for fz_huge_free. */
void *fz_huge_alloc(size_t n, size_t *mapped);
void fz_huge_free(void *p, size_t mapped);

/* ---- Extents and types --------------------------------------------------- */

typedef struct fz_ext {
	int64_t c;
	uint64_t syms;
} fz_ext;

static inline fz_ext fz_ext_const(int64_t c)
{
	fz_ext e = {c, 0};
	return e;
}

static inline bool fz_ext_eq(fz_ext a, fz_ext b)
{
	return a.c == b.c && a.syms == b.syms;
}

static inline bool fz_ext_is_const(fz_ext e) { return e.syms == 0; }
static inline bool fz_ext_is_one(fz_ext e) { return e.syms == 0 && e.c == 1; }

/* The extent that is symbol s. */
static inline fz_ext fz_ext_sym(int s)
{
	fz_ext e = {1, 1ull << (FZ_SYM_BITS * s)};
	return e;
}

/* The power of symbol s in e (0 if absent). */
static inline int fz_ext_power(fz_ext e, int s)
{
	return (int)(e.syms >> (FZ_SYM_BITS * s) & 15);
}

/* The symbol e is (coefficient 1, one symbol, power 1), else -1. */
static inline int fz_ext_as_sym(fz_ext e)
{
	if (e.c != 1 || e.syms == 0 || (e.syms & (e.syms - 1)))
		return -1;
	int bit = __builtin_ctzll(e.syms);
	return bit % FZ_SYM_BITS ? -1 : bit / FZ_SYM_BITS;
}

/* A sum of monomials over free symbols: a derived symbol's definition,
 * or an extent multiplied out. Canonical: like terms merged, no zero
 * coefficient, terms by falling degree, the constant last. */
#define FZ_POLY_TERMS 8
typedef struct fz_poly {
	int n;
	fz_ext term[FZ_POLY_TERMS];
} fz_poly;

/* a*b; false on coefficient overflow or a power above 15. */
bool fz_ext_mul(fz_ext a, fz_ext b, fz_ext *out);
/* a/b exactly; false when b does not divide a. */
bool fz_ext_div(fz_ext a, fz_ext b, fz_ext *out);
/* Size under bindings; -1 if a needed symbol is unbound or it overflows. */
int64_t fz_ext_eval(fz_ext e, const int64_t *sym_sizes);
/* "4096", "B", "2*B*T" into buf. */
const char *fz_ext_str(const fz_trace *t, fz_ext e, char *buf, size_t n);

typedef struct fz_type {
	fz_dtype dtype;
	int rank;
	bool future;          /* the result of a collective, not yet waited */
	fz_ext dims[FZ_MAX_RANK];
} fz_type;

bool fz_type_eq(const fz_type *a, const fz_type *b);
bool fz_type_numel(const fz_type *t, fz_ext *out); /* false on overflow */
/* The element count at sizes; -1 if a symbol is unbound or it overflows. */
int64_t fz_type_numel_at(const fz_type *t, const int64_t *sizes);
/* "bf16[B, T, 4096]" into buf. */
const char *fz_type_str(const fz_trace *t, const fz_type *ty, char *buf, size_t n);

static inline bool fz_dtype_is_float(fz_dtype d)
{
	return d == FZ_F64 || d == FZ_F32 || d == FZ_F16 || d == FZ_BF16;
}

static inline bool fz_dtype_is_int(fz_dtype d)
{
	return d == FZ_I64 || d == FZ_I32 || d == FZ_I8 || d == FZ_U8;
}

/* ---- The op table -------------------------------------------------------- */

typedef enum fz_opclass {
	FZ_CLASS_UNARY, FZ_CLASS_BINARY, FZ_CLASS_TERNARY, FZ_CLASS_CREATION,
	FZ_CLASS_META, FZ_CLASS_REDUCTION, FZ_CLASS_INDEXING, FZ_CLASS_LIBRARY,
	FZ_CLASS_COLLECTIVE, FZ_CLASS_WAIT, FZ_CLASS_COMPOSITE,
	FZ_CLASS_SCAN,       /* cumsum: a running combine along one dim */
	FZ_CLASS_SELECT,     /* topk, argmax, argmin: the best of a row */
	FZ_CLASS_ATTENTION,  /* attention and its backward (ir/attention.h) */
	FZ_CLASS_COUNT
} fz_opclass;

enum {
	FL_FLOAT = 1 << 0,       /* operands must be floating */
	FL_NOBOOL = 1 << 1,      /* operands must not be bool */
	FL_BOOL = 1 << 2,        /* operands must be bool */
	FL_BOOLRES = 1 << 3,     /* result is bool */
	FL_FLOATRES = 1 << 4,    /* result dtype (attribute) must be floating */
	FL_TWO_RESULTS = 1 << 5, /* defines two values */
};

/* The attributes. ATTR(id, key, kind) */
#define FZ_ATTRS(ATTR) \
	ATTR(DTYPE, "dtype", DTYPE) \
	ATTR(SHAPE, "shape", EXTS) \
	ATTR(DIMS, "dims", INTS) \
	ATTR(DIM, "dim", INT) \
	ATTR(KEEPDIM, "keepdim", BOOL) \
	ATTR(VALUE, "value", SCALAR) \
	ATTR(LENGTH, "length", EXT) \
	ATTR(SEED, "seed", INT) \
	ATTR(OFFSET, "offset", INT) \
	ATTR(START, "start", INTS) \
	ATTR(END, "end", EXTS) \
	ATTR(STEP, "step", INTS) \
	ATTR(CORRECTION, "correction", INT) \
	ATTR(APPROXIMATE, "approximate", NAME) \
	ATTR(EPS, "eps", FLOAT) \
	ATTR(K, "k", INT) \
	ATTR(CAUSAL, "causal", BOOL) \
	ATTR(SCALE, "scale", FLOAT) \
	ATTR(WINDOW, "window", INT) \
	ATTR(SOFTCAP, "softcap", FLOAT)

typedef enum fz_attr_id {
#define ATTR(id, key, kind) FZ_ATTR_##id,
	FZ_ATTRS(ATTR)
#undef ATTR
	FZ_ATTR_COUNT
} fz_attr_id;

#define AT(id) (1u << FZ_ATTR_##id)

typedef enum fz_opcode {
#define OP(id, name, lo, hi, cls, flags, attrs, req) FZ_OP_##id,
#include "ops.def"
#undef OP
	FZ_OP_COUNT
} fz_opcode;

typedef struct fz_opinfo {
	const char *name;
	int min_args, max_args; /* max -1: variadic */
	fz_opclass cls;
	unsigned flags;
	unsigned attrs, required;
} fz_opinfo;

extern const fz_opinfo fz_ops[FZ_OP_COUNT];
extern const char *const fz_attr_names[FZ_ATTR_COUNT];
extern const char *const fz_class_names[FZ_CLASS_COUNT];
int fz_op_from_name(const char *name, fz_opcode *out);          /* 1 if found */
int fz_attr_from_name(const char *name, fz_attr_id *out);   /* 1 if found */

static inline bool fz_op_is_elementwise(fz_opcode op)
{
	fz_opclass c = fz_ops[op].cls;
	return c == FZ_CLASS_UNARY || c == FZ_CLASS_BINARY || c == FZ_CLASS_TERNARY;
}

/* ---- Attributes ---------------------------------------------------------- */

enum { FZ_APPROX_NONE, FZ_APPROX_TANH };

/* One wide struct for every op's attributes; `present` says which are set.
 * Lists (shape, dims, start, end, step) live in the trace's arena. Defaults
 * are filled in by the builder, so every present field is meaningful. */
typedef struct fz_attrs {
	uint32_t present;
	fz_dtype dtype;
	int n_shape;
	fz_ext *shape;
	int n_dims;
	int *dims;          /* normalized to 0..rank-1 */
	int dim;            /* normalized */
	bool keepdim;
	double value;       /* full: value, or the size of symbol value_sym */
	int value_sym;      /* -1, or the symbol whose size is the value */
	fz_ext length;      /* iota: a number or an extent name */
	int64_t seed, offset;
	int n_slice;
	int64_t *start, *step;
	fz_ext *end;
	int64_t correction;
	int approximate;
	double eps;
	int64_t k;          /* topk: how many */
	bool causal;        /* attention: keys after the query are hidden */
	double scale;       /* attention: scores = scale * q.k (default 1/sqrt(D)) */
	int64_t window;     /* attention: sliding window (0: none) */
	double softcap;     /* attention: c * tanh(s / c) (0: none) */
} fz_attrs;

/* ---- Values, nodes, traces ----------------------------------------------- */

typedef struct fz_node fz_node;

/* The fields every pass walks (id, def, param_index) come first, in one
 * cache line with the dtype and rank; the 128 bytes of extents follow. On
 * a deep trace (tens of megabytes of nodes and values) a pass that follows
 * an edge then misses once per value, not twice. */
struct fz_value {
	int id;             /* index in trace->values */
	int out_index;      /* which result of def */
	int param_index;    /* -1 unless a parameter */
	int n_uses;         /* operand slots that read it, plus returns */
	fz_node *def;       /* NULL for a parameter */
	const char *name;   /* user name, or NULL: the printer makes one up */
	fz_type type;
};

struct fz_node {
	int id;             /* index in trace->nodes: a topological order */
	fz_opcode op;
	int n_in;
	fz_value **in;
	int n_out;
	fz_value *out[2];
	fz_attrs attrs;
	fz_opcode origin;       /* the composite it was lowered from, or op */
	int line, col;      /* where it was written (0 when built by API) */
};

typedef struct fz_name_slot {
	const char *name;
	fz_value *value;
} fz_name_slot;

struct fz_trace {
	fz_arena arena;
	const char *name;
	int world;          /* 1 unless declared */
	int line, col;      /* location stamped on nodes built now */

	fz_value **params;
	int n_params, cap_params;
	fz_node **nodes;
	int n_nodes, cap_nodes;
	fz_value **values;
	int n_values, cap_values;
	fz_value **outputs;
	int n_outputs;
	const char *syms[FZ_MAX_SYMS];
	const fz_poly *sym_def[FZ_MAX_SYMS]; /* NULL: free; else derived */
	int n_syms;

	fz_name_slot *names;  /* open addressing; cap is a power of two */
	int n_names, cap_names;

	char error[FZ_ERRLEN];
};

struct fz_module {
	fz_trace **traces;
	int n_traces;
};

/* ---- Internal services of the stages ------------------------------------- */

/* Formats into t->error; returns -1 so callers can `return fz_fail(...)`. */
int fz_fail(fz_trace *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
char *fz_strdup_printf(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
char *fz_strdup(const char *s);
/* The one way a library function reports: *err takes msg (a heap string,
 * NULL meaning out of memory), releasing what it held; with err NULL, msg
 * is released. */
void fz_set_err(char **err, char *msg);
/* The one clock: seconds on a monotonic clock. */
double fz_now(void);

/* The symbol index of `name`, adding it if new; -1 past FZ_MAX_SYMS. */
int fz_trace_symbol_intern(fz_trace *t, const char *name);
int fz_trace_symbol_find(const fz_trace *t, const char *name);

/* Extents that are sums (type.c; see the essay above). */
/* e multiplied out over the free symbols; false past FZ_POLY_TERMS terms
 * or on overflow. */
bool fz_ext_expand(const fz_trace *t, fz_ext e, fz_poly *out);
/* a + sign*b, canonical; false past FZ_POLY_TERMS terms or on overflow. */
bool fz_poly_add(const fz_poly *a, const fz_poly *b, int sign, fz_poly *out);
/* The canonical extent of p, interning its derived symbol; false when p
 * is negative for all sizes (no positive term), on overflow, or past
 * FZ_MAX_SYMS. Passes that compute extents (slice, cat) come here, so
 * the trace is written even when reached through a const pointer: a
 * symbol already interned is found, never added twice. */
bool fz_trace_ext_of_poly(fz_trace *t, const fz_poly *p, fz_ext *out);
/* "B*T+2", "T-1", "2*T" (no spaces) into *out; false on bad text. */
bool fz_trace_ext_parse(fz_trace *t, const char *s, fz_ext *out);
/* a - b as a polynomial: equality is a zero polynomial; false when it
 * cannot be multiplied out. */
bool fz_ext_diff(const fz_trace *t, fz_ext a, fz_ext b, fz_poly *out);
/* Fills the size of each derived symbol from the free ones and checks a
 * derived size already given (by an input's dim or by the caller),
 * solving for a free symbol that one derived size determines (an input
 * f32[T+1] of 8 rows binds T to 7). Returns how many symbols it bound, or
 * -1 with a message in msg when sizes disagree or a sum is negative. */
int fz_trace_syms_derive(const fz_trace *t, int64_t *syms, char *msg, size_t n);

/* Shape and dtype inference for one primitive op: fills out[0..n) and
 * returns n, or returns -1 with a message naming the op, the operand and
 * what was expected in err. The builder calls it to type new nodes; the
 * verifier calls it again to check them. */
int fz_infer(const fz_trace *t, fz_opcode op, fz_value *const *in, int n_in,
             const fz_attrs *a, fz_type *out, char *err, size_t errlen);

/* Appends a primitive node with explicit, already normalized attributes.
 * Passes use this to build IR; the builder's fz_opcode uses it underneath. */
fz_node *fz_node_add(fz_trace *t, fz_opcode op, fz_value *const *in, int n_in,
                     const fz_attrs *attrs);

/* Drops nodes and values added since a mark (n_nodes, n_values), undoing
 * their use counts; the builder calls it when a composite fails halfway. */
void fz_trace_rollback(fz_trace *t, int n_nodes, int n_values);

/* fz_trace_verify; with retype false, the stored result types are taken
 * as fz_infer's (true of a trace fresh from the builder: verify.c). */
fz_status fz_trace_verify_typed(const fz_trace *t, bool retype, char **err);

/* The live max, min, argmax or argmin that reduces an extent of 0 into a
 * result with elements, where the extents are concrete (syms NULL) or at
 * the bound sizes syms: FZ_EVERIFY (FZ_ERANGE with syms) and a message
 * naming it; FZ_OK when there is none (verify.c). */
fz_status fz_trace_empty_extremum(const fz_trace *t, const int64_t *syms,
				  char **err);

/* Which nodes are live (ir/dce.c): live[i] is true when a result of node
 * i is returned or read by a live node. Returns the number of dead nodes,
 * -1 when out of memory. */
int fz_trace_live(const fz_trace *t, bool *live);

/* Structural equality of two traces: same params, same nodes in the same
 * order with the same ops, attributes, operands and types, same outputs.
 * Names of unnamed values do not matter. On a difference, says where. */
bool fz_trace_equal(const fz_trace *a, const fz_trace *b, char *why, size_t n);

/* The trace as text, appended to a growing string. */
typedef struct fz_buf {
	char *data;
	size_t len, cap;
	bool oom;
} fz_buf;

/* What collective `op` gives rank `rank` of `world`, whose operands (one
 * per rank, each of dtype dt and extents xshape[0..nd)) are xs[0..world),
 * into y (ir/collective.c): exact, the same for the interpreter and the
 * CPU communicator. FZ_EINVAL for a bad op, rank or dim. */
fz_status fz_collective_eval(fz_opcode op, fz_dtype dt, int nd,
			     const int64_t *xshape, int dim, int world, int rank,
			     const void *const *xs, void *y);

/* C[M,N] = A[M,K] B[K,N], all contiguous, in f64, each element's terms
 * added in order of k (ir/interp.c): the interpreter's matmul, and the
 * emulated GPU's library call (runtime/emu.c), the same sums. */
void fz_matmul_f64(const double *A, const double *B, double *C, int64_t M,
		   int64_t K, int64_t N);

/* The trace as text with its nodes in `order` (a topological order of all
 * t->n_nodes nodes), so a scheduled order can be written and read back. */
fz_status fz_trace_print_ordered(const fz_trace *t, const fz_node *const *order,
				 char **out);

void fz_buf_printf(fz_buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void fz_buf_puts(fz_buf *b, const char *s);
void fz_buf_putc(fz_buf *b, char c);
void fz_buf_put_int(fz_buf *b, int64_t v); /* as "%lld" writes it */
char *fz_buf_take(fz_buf *b); /* NULL if it ran out of memory */

#endif
