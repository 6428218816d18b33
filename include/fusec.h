/*
 * fusec.h: the public C API of fusec.
 *
 * A framework hands fusec a trace: the unrolled list of tensor operations of
 * one training or inference step. It can hand it over as text (the trace
 * format of DESIGN.md) or build it op by op with the builder below; both
 * paths produce the same IR, because the parser is itself a client of the
 * builder.
 *
 *     fz_trace *t = fz_trace_new("rms");
 *     fz_dim xd[] = {{0, "B"}, {4096, NULL}};
 *     fz_value *x = fz_param(t, "x", FZ_F32, 2, xd);
 *     fz_arg a[] = {fz_arg_value(x), fz_arg_value(x)};
 *     fz_value *sq = fz_op(t, "mul", a, 2, NULL, 0);
 *     ...
 *     fz_return(t, &y, 1);
 *     if (fz_trace_verify(t, &err) != FZ_OK) ...
 *
 * Users see handles and functions, never fields. Every function that can
 * fail returns a status; a message, where there is one, is a heap string the
 * caller releases with fz_free. The library never exits the process.
 */
#ifndef FUSEC_H
#define FUSEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FZ_VERSION_MAJOR 0
#define FZ_VERSION_MINOR 1
#define FZ_MAX_RANK 8

/* The library exports exactly the functions marked FZ_API; everything else
 * in libfusec.so is hidden (built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define FZ_API __attribute__((visibility("default")))
#else
#define FZ_API
#endif

typedef enum fz_status {
	FZ_OK = 0,
	FZ_EPARSE,       /* malformed trace text */
	FZ_EVERIFY,      /* a well-formed trace that breaks a typing rule */
	FZ_EBIND,        /* a symbolic extent unbound, or bound inconsistently */
	FZ_ERANGE,       /* an index out of range met at run time */
	FZ_ENOMEM,
	FZ_EIO,
	FZ_EINVAL,       /* a bad argument to an API function */
	FZ_EUNSUPPORTED, /* valid, but not (yet) handled by this part */
	FZ_ERUNTIME,     /* a device or library failure */
	FZ_STATUS_COUNT
} fz_status;

typedef enum fz_dtype {
	FZ_F64, FZ_F32, FZ_F16, FZ_BF16, FZ_I64, FZ_I32, FZ_I8, FZ_U8, FZ_BOOL,
	FZ_DTYPE_COUNT
} fz_dtype;

typedef struct fz_module fz_module; /* a parsed file: one or more traces */
typedef struct fz_trace fz_trace;   /* one trace; owns its arena */
typedef struct fz_value fz_value;   /* a value of a trace; lives in its arena */

FZ_API const char *fz_status_name(fz_status s);
FZ_API const char *fz_dtype_name(fz_dtype d);
FZ_API int fz_dtype_from_name(const char *name, fz_dtype *out); /* 1 if known */
FZ_API size_t fz_dtype_size(fz_dtype d);
FZ_API void fz_free(void *p); /* releases strings and buffers the library returns */

/* ---- Parsing ------------------------------------------------------------ */

/* Parses the trace text src[0..len) named `filename` in diagnostics. On
 * failure *diag receives every diagnostic, each
 * "FILE:LINE:COL: error: MESSAGE\n<source line>\n<caret>\n". */
FZ_API fz_status fz_module_parse(const char *src, size_t len, const char *filename,
                          fz_module **out, char **diag);
FZ_API fz_status fz_module_parse_file(const char *path, fz_module **out, char **diag);
FZ_API void fz_module_free(fz_module *m);
FZ_API int fz_module_count(const fz_module *m);
FZ_API fz_trace *fz_module_trace(const fz_module *m, int i);
/* The whole module in the trace format; parses back to the same graphs. */
FZ_API fz_status fz_module_print(const fz_module *m, char **out);

/* ---- Building ----------------------------------------------------------- */

/* An extent: a concrete size, or (sym != NULL) a symbolic name. */
typedef struct fz_dim {
	int64_t size;
	const char *sym;
} fz_dim;

typedef enum fz_arg_kind { FZ_ARG_VALUE, FZ_ARG_NUMBER } fz_arg_kind;

/* An operand: a value, or a number literal (which takes the dtype of the
 * tensor beside it). is_int records how the literal was written. */
typedef struct fz_arg {
	fz_arg_kind kind;
	fz_value *value;
	double number;
	int is_int;
} fz_arg;

typedef enum fz_attr_kind {
	FZ_AV_INT, FZ_AV_FLOAT, FZ_AV_BOOL, FZ_AV_DTYPE, FZ_AV_NAME, FZ_AV_LIST
} fz_attr_kind;

typedef struct fz_attr_value {
	fz_attr_kind kind;
	int64_t i;      /* INT, BOOL (0/1), DTYPE (an fz_dtype) */
	double f;       /* FLOAT */
	const char *name;                   /* NAME */
	int n;                              /* LIST */
	const struct fz_attr_value *items;  /* LIST */
} fz_attr_value;

typedef struct fz_attr {
	const char *key;
	fz_attr_value value;
} fz_attr;

static inline fz_arg fz_arg_value(fz_value *v)
{
	fz_arg a = {FZ_ARG_VALUE, v, 0.0, 0};
	return a;
}

static inline fz_arg fz_arg_number(double x)
{
	fz_arg a = {FZ_ARG_NUMBER, NULL, x, 0};
	return a;
}

static inline fz_arg fz_arg_int(int64_t x)
{
	fz_arg a = {FZ_ARG_NUMBER, NULL, (double)x, 1};
	return a;
}

FZ_API fz_trace *fz_trace_new(const char *name); /* NULL only when out of memory */
FZ_API void fz_trace_free(fz_trace *t);
FZ_API const char *fz_trace_name(const fz_trace *t);
FZ_API fz_status fz_trace_set_world(fz_trace *t, int world);
FZ_API int fz_trace_world(const fz_trace *t);

/* Each builder call returns NULL (or a status) on error and leaves the
 * message in fz_trace_error(t), valid until the next builder call. */
FZ_API fz_value *fz_param(fz_trace *t, const char *name, fz_dtype dtype, int rank,
                   const fz_dim *dims);
/* Applies op (primitive or composite) to args with attrs. Returns the number
 * of results written to outs (at most max_outs), or -1 on error. Composite
 * ops are lowered to primitives here; numpy broadcasting is made explicit.
 *
 * uniform's seed is an attribute (seed=S, compiled into the kernel) or its
 * one operand, a rank-0 i64 or i32 read at run time, so a framework that
 * draws a new seed every step compiles nothing:
 *
 *     fz_value *s = fz_param(t, "seed", FZ_I64, 0, NULL);
 *     fz_arg a = fz_arg_value(s);
 *     fz_value *u = fz_op1(t, "uniform", &a, 1, shape_offset_dtype, 3); */
FZ_API int fz_op(fz_trace *t, const char *op, const fz_arg *args, int nargs,
          const fz_attr *attrs, int nattrs, fz_value **outs, int max_outs);
/* fz_op for ops with one result. */
FZ_API fz_value *fz_op1(fz_trace *t, const char *op, const fz_arg *args, int nargs,
                 const fz_attr *attrs, int nattrs);
/* Gives v a user-visible name (a statement's left-hand side). */
FZ_API fz_status fz_name(fz_trace *t, fz_value *v, const char *name);
FZ_API fz_value *fz_lookup(const fz_trace *t, const char *name);
FZ_API fz_status fz_return(fz_trace *t, fz_value *const *vals, int n);
FZ_API const char *fz_trace_error(const fz_trace *t);

/* Whole-trace checks the builder cannot make one op at a time (a future
 * never waited on, a missing return), plus a re-inference of every op. */
FZ_API fz_status fz_trace_verify(const fz_trace *t, char **err);
FZ_API fz_status fz_trace_print(const fz_trace *t, char **out);

/* ---- Inspecting --------------------------------------------------------- */

FZ_API int fz_trace_param_count(const fz_trace *t);
FZ_API fz_value *fz_trace_param(const fz_trace *t, int i);
FZ_API int fz_trace_output_count(const fz_trace *t);
FZ_API fz_value *fz_trace_output(const fz_trace *t, int i);
FZ_API int fz_trace_op_count(const fz_trace *t); /* primitive ops after lowering */
FZ_API int fz_trace_symbol_count(const fz_trace *t);
FZ_API const char *fz_trace_symbol(const fz_trace *t, int i);

FZ_API fz_dtype fz_value_dtype(const fz_value *v);
FZ_API int fz_value_rank(const fz_value *v);
FZ_API const char *fz_value_name(const fz_value *v); /* NULL if unnamed */
/* Extent i under the bindings (sizes per symbol index; NULL if none):
 * -1 when it needs a symbol that is unbound. */
FZ_API int64_t fz_value_extent(const fz_value *v, int i, const int64_t *sym_sizes);

/* ---- Running ------------------------------------------------------------ */

/* A strided view of memory. Strides count elements. */
typedef struct fz_tensor {
	void *data;
	fz_dtype dtype;
	int rank;
	int64_t shape[FZ_MAX_RANK];
	int64_t strides[FZ_MAX_RANK];
} fz_tensor;

/* *t = a contiguous (row-major) tensor over data. */
FZ_API void fz_tensor_contiguous(fz_tensor *t, void *data, fz_dtype dtype,
                                 int rank, const int64_t *shape);

/* Symbol sizes: sym_sizes[i] for fz_trace_symbol(t, i), or -1 if unknown.
 * Unknown symbols are taken from the inputs' shapes. Fills sizes on success;
 * on a conflict or a symbol left unbound it says which. */
FZ_API fz_status fz_trace_bind(const fz_trace *t, const fz_tensor *inputs, int n_in,
                        int64_t *sym_sizes, char **err);
/* Runs the reference interpreter: every op in f64, rounded to its dtype at
 * its output. Outputs are contiguous and allocated by the library; release
 * each outputs[i].data with fz_free. */
FZ_API fz_status fz_trace_interpret(const fz_trace *t, const int64_t *sym_sizes,
                             const fz_tensor *inputs, int n_in,
                             fz_tensor *outputs, int n_out, char **err);
/* The reference interpreter for a trace declared `world N`: all N ranks
 * run in lockstep, each from its own inputs (inputs[r * n_in + i], outputs
 * likewise), and every collective is computed exactly across them:
 * all_gather concatenates the ranks' operands along dim in rank order,
 * reduce_scatter sums them (in f64, rank order, one rounding) and gives
 * rank r its r-th slice along dim, all_reduce sums. world must be the
 * trace's; every rank binds the same sizes. */
FZ_API fz_status fz_trace_interpret_world(const fz_trace *t, const int64_t *sym_sizes,
                                   int world, const fz_tensor *inputs, int n_in,
                                   fz_tensor *outputs, int n_out, char **err);


/* ---- Prepared programs -------------------------------------------------- */

/* A framework prepares a trace once and runs it many times:
 *
 *     fz_exec_options o;  fz_exec_options_init(&o);
 *     fz_exec *x;         fz_exec_new(trace, "cpu", &o, &x, &err);
 *     for (each step)     fz_exec_run(x, NULL, in, 2, out, 1, stream, &err);
 *     fz_exec_free(x);
 *
 * The first run at a binding of the symbolic sizes plans the trace at those
 * sizes, resolves its kernels through the in-memory and disk caches and
 * allocates the plan's arena (one allocation); the plan is kept (a small
 * LRU of bindings), so every later run at those sizes only binds pointers
 * and launches: no planning, allocation, hashing or string work. Inputs
 * are read in place (strided ones too; copied only where a kernel cannot
 * take the layout); outputs are written into the caller's contiguous
 * buffers.
 *
 * Devices: "cpu" (generated host code), "cuda" (an NVIDIA GPU; the trace's
 * tensors are device pointers), "emu" (the GPU's kernels emulated on the
 * CPU with bounds and race checks), "auto" (cuda where a device exists,
 * else cpu, with one warning saying so).
 *
 * Threads: fz_exec_new may be called from any thread (kernels are loaded
 * once per process under a lock). One fz_exec runs on one thread at a
 * time: a run, sync or profile that enters it while another call is inside
 * is refused (FZ_EINVAL, saying so), never let in to share its arena; a
 * caller with several threads holds a lock around it or makes one per
 * thread. Different fz_exec objects may run concurrently. The trace must
 * outlive the fz_exec. A freed or foreign handle is caught in debug builds
 * (FZ_EINVAL, never a read of freed memory where the allocator allows). */
typedef struct fz_exec fz_exec;

typedef struct fz_exec_options {
	int disk_cache;          /* 1 (default): kernels through the disk cache */
	const char *cache_dir;   /* NULL: $FUSEC_CACHE_DIR, $XDG_CACHE_HOME/fusec,
	                            ~/.cache/fusec */
	int max_plans;           /* bindings kept prepared (default 8) */
	int threads;             /* cpu: threads a kernel may use (0: all) */
	int device;              /* cuda: device ordinal (default 0) */
	int tf32;                /* cuda: f32 matmuls may round their inputs
	                            to TF32 (default 0: full f32) */
	/* The caller's allocator for arenas (the PyTorch bridge passes the
	 * caching allocator's); NULL: the target's own. */
	void *(*alloc)(void *ctx, size_t bytes);
	void (*release)(void *ctx, void *p);
	void *alloc_ctx;
	/* One-line notices (no GPU, a disabled cache, ...); NULL: stderr. */
	void (*warn)(void *ctx, const char *msg);
	void *warn_ctx;
} fz_exec_options;

FZ_API void fz_exec_options_init(fz_exec_options *o);
/* Prepares t for device (see above); o may be NULL for the defaults. An
 * unknown device, or one this machine lacks, is an error naming it. */
FZ_API fz_status fz_exec_new(const fz_trace *t, const char *device,
                             const fz_exec_options *o, fz_exec **out,
                             char **err);
/* Runs once. sym_sizes (NULL, or -1 for symbols taken from the inputs'
 * shapes) as in fz_trace_bind. outputs[k] must be contiguous, of the
 * output's dtype and shape at the bound sizes, with data set by the
 * caller. A wrong dtype, rank, shape or an unbound size is FZ_EINVAL or
 * FZ_EBIND naming the input; an index out of range is FZ_ERANGE naming the
 * op (on a GPU target: reported by fz_exec_sync). */
FZ_API fz_status fz_exec_run(fz_exec *x, const int64_t *sym_sizes,
                             const fz_tensor *inputs, int n_in,
                             fz_tensor *outputs, int n_out, void *stream,
                             char **err);
/* Waits for the runs queued on stream and reports a device-side error
 * (an index out of range) that they met. */
FZ_API fz_status fz_exec_sync(fz_exec *x, void *stream, char **err);
FZ_API void fz_exec_free(fz_exec *x);
/* The target that runs: "cpu", "cuda" or "emu". */
FZ_API const char *fz_exec_device(const fz_exec *x);
/* Where the runs' time went, when FUSEC_PROFILE=1 was in the environment
 * as x was made (else the table has only its header): a tab-separated
 * table with a header line, one row per step of each prepared binding:
 * region, kind (kernel, matmul, copy, collective, wait), runs, seconds
 * summed over them, flop per run (products), what the step is. out
 * (NULL: only the reset) is released with fz_free; reset != 0 zeroes the
 * sums after. */
FZ_API fz_status fz_exec_profile(fz_exec *x, int reset, char **out);
/* Kernels this process has compiled (found in neither cache, so built
 * with LLVM), on every thread: a framework reads it before and after a
 * step to count what the step compiled. */
FZ_API int64_t fz_kernel_builds(void);
/* The BLAS the CPU target's matrix products run on while a "cpu" program
 * exists ("openblas (SkylakeX)", "mkl (already in the process)", "none":
 * the built-in loop), NULL when none does; valid until that program's
 * fz_exec_free. */
FZ_API const char *fz_cpu_blas(void);

/* Host memory for outputs, from a process-wide cache of released blocks.
 * A caller that hands every run fresh memory for its outputs (torch.empty
 * of a large tensor is a new mapping from glibc each time) pays a page
 * fault per 4 KiB page at the first touch, often more than the kernel
 * that writes them; a block released here is kept mapped, already
 * faulted in, for the next request of its size class (64 KiB steps up
 * to 4 MiB, 2 MiB steps above, blocks 2 MiB aligned and advised to use
 * huge pages). At most the limit stays cached (default a quarter of
 * physical memory, or $FUSEC_HOST_CACHE_MB); the blocks released longest
 * ago are unmapped first. Thread-safe: a block may be released on any
 * thread. fz_host_alloc returns NULL when the system has no memory. */
typedef struct fz_host_block fz_host_block;
FZ_API fz_host_block *fz_host_alloc(size_t bytes, void **data);
FZ_API void fz_host_release(fz_host_block *b); /* accepts NULL */
/* b as a DLPack tensor (a DLManagedTensor *, for torch.from_dlpack and any
 * other DLPack consumer): contiguous, of dtype and shape, on the CPU; its
 * deleter releases b. NULL where the shape's bytes exceed the block or
 * rank is out of range. Once made, b belongs to the tensor. */
FZ_API void *fz_host_block_dlpack(fz_host_block *b, fz_dtype dtype, int rank,
                                  const int64_t *shape);
typedef struct fz_host_stats {
	size_t live_bytes;    /* in blocks handed out and not released */
	size_t cached_bytes;  /* in released blocks kept for reuse */
	size_t limit_bytes;   /* the most kept cached */
	int64_t hits, misses; /* requests served from the cache, and not */
} fz_host_stats;
FZ_API void fz_host_cache_stats(fz_host_stats *out);
/* Sets the limit and unmaps cached blocks, longest released first, down
 * to it; fz_host_cache_empty unmaps them all, the limit left as it was. */
FZ_API void fz_host_cache_set_limit(size_t bytes);
FZ_API void fz_host_cache_empty(void);

/* One-shot: prepares, runs once and frees. Outputs are contiguous,
 * allocated by the library, and released with fz_free (the interpreter's
 * contract). */
FZ_API fz_status fz_trace_run(const fz_trace *t, const char *device,
                              const int64_t *sym_sizes, const fz_tensor *inputs,
                              int n_in, fz_tensor *outputs, int n_out,
                              char **err);

#ifdef __cplusplus
}
#endif
#endif
