/*
 * blas.c: matrix products on the CPU (blas.h).
 *
 * The library. OpenBLAS from Debian (libopenblas0-pthread: setup.sh
 * installs it), opened at run time with dlopen, and BLIS or the system's
 * libblas.so.3 where OpenBLAS is absent. Why OpenBLAS: its sgemm kernels
 * are hand-written for each x86 generation and chosen at run time from
 * the CPU it finds (Debian builds it with DYNAMIC_ARCH), so one package
 * serves the Haswell-era AVX2 machines of CI and the Zen and AVX-512
 * servers alike; Debian's BLIS also selects its kernels at run time but
 * has no bf16 either, and the reference BLAS is a plain loop. Why at run
 * time rather than linked: like the CUDA libraries, a BLAS is an
 * acceleration, not a build dependency: fusec builds with no BLAS
 * headers or -dev package, and without the library it still runs every
 * product, through the built-in loop below, a warning-free fallback that
 * fz_blas_name reports as "none". Only the Fortran symbols sgemm_ and
 * dgemm_ are used: every BLAS exports them, CBLAS not always.
 *
 * The kernels. Debian's OpenBLAS (0.3.21) picks its kernels from the
 * CPU's family and model numbers and falls back to its oldest, Prescott's
 * SSE3 loops, on a model it does not know: on this project's machine (a
 * VM whose Xeon reports AVX-512 and bf16 under a model number the library
 * predates) every product ran at 3.4 GFLOP/s where the SkylakeX kernels
 * run at 50-150 and PyTorch's MKL at 50-160, and the Llama step at hidden
 * 1024 took twice eager's time. On an Intel CPU the right kernels follow
 * from the features alone (AVX-512 with bf16: Cooperlake, AVX-512:
 * SkylakeX, AVX2 with FMA: Haswell; OpenBLAS's own table maps the newer
 * models onto these), so the library is opened with OPENBLAS_CORETYPE
 * naming them, unless the user set it; the variable is read once, while
 * the library loads, and taken out of the environment again right after.
 * fz_blas_name says which kernels run ("openblas (SkylakeX)").
 *
 * MKL, where the process has it already. PyTorch's CPU build carries
 * Intel's MKL inside libtorch_cpu.so and exports its Fortran and service
 * symbols; aten::mm runs on it. So when fusec runs inside such a process
 * (the torch.compile backend, fusec.Program) and finds a loaded object
 * exporting sgemm_, dgemm_ and MKL_Set_Num_Threads_Local (walking the
 * loaded objects with dl_iterate_phdr; fusec never loads MKL itself), its
 * products run there too, on the threads aten::mm would use: in the
 * Llama step of tools/bench/step_bench.py (hidden 256, T=128) the
 * products ran at 282 GFLOP/s on two threads against OpenBLAS's 263 in
 * the same run, the same at one thread (143 and 145). The thread count
 * goes through MKL_Set_Num_Threads_Local, the C entry, which takes its
 * count by value and returns the thread's previous setting (restored
 * after each call); the lower-case mkl_set_num_threads_local that MKL
 * also exports is the Fortran entry, taking a pointer. $FUSEC_BLAS
 * naming a library (libopenblas.so.0) skips the search.
 *
 * Threads. The BLAS is told to use one thread (openblas_set_num_threads,
 * bli_thread_set_num_threads) and the product is split across the CPU
 * target's own pool: a second pool of spinning BLAS threads would fight
 * the kernels' threads for the same cores right after every product.
 * Not Debian's serial build (libopenblas0-serial), which would start no
 * threads at all: it is not safe to call from several threads at once
 * (four threads each repeating one sgemm on their own matrices got wrong
 * results in about 1% of the calls, measured here), and the pool's parts
 * are such calls. The pthread build starts its threads when it is loaded
 * and they spin for a while before being told one thread suffices. Where
 * the library the system names is a sequential OpenBLAS all the same
 * (openblas_get_parallel() == 0: libblas.so.3 or libopenblas.so.0 can be
 * that build through Debian's alternatives), every product runs whole on
 * the calling thread under one lock per process.
 * MKL splits a product across its own OpenMP threads better than slices
 * would (it packs each operand once), and those threads are the team the
 * pool runs on inside PyTorch (pool.c), so there a product short of
 * batches is one call on the calling thread with MKL told the pool's
 * thread count, and batched products go to the pool a batch at a time
 * with MKL told one thread each.
 * The work is cut into units: whole batches when there are enough of them
 * (attention's B*H products), else slices of at least 256 rows of one
 * product (a linear layer over B*T tokens), else slices of columns; one
 * to four units per thread, which the pool hands to whichever thread is
 * free, so a core taken by another process does not hold up the rest
 * (on one thread, the product whole). Each sgemm call packs its own
 * copy of the operand it does not slice; product() says what that costs.
 *
 * Few rows. A bf16 or f16 product of STREAM_MAX_ROWS rows or fewer (a
 * decode step's, a short prompt's) is about a pass over its weight, and
 * widening the whole weight to f32 first tripled that pass's memory
 * traffic: such a product widens its weight in the units that use it, a
 * bf16 or f16 linear weight of STREAM_ROWS rows or fewer row by row in
 * registers (dots), anything else a block of columns at a time on the
 * unit's stack (streamed). An f32 linear weight of so few rows goes to
 * dots too, as it lies: the BLAS packed the whole weight for every call
 * (MKL inside PyTorch, four rows of K 4096 by N 11008: 40-44 ms for a
 * 180 MB weight that one pass reads in 9.6).
 *
 * bf16 as it lies. Where the library multiplies bf16 itself (MKL's
 * gemm_bf16bf16f32_, OpenBLAS's sbgemm_ where it was built with it: not
 * Debian's) and the CPU is an Intel one with bf16 arithmetic (AVX-512
 * BF16; the CPUs with AMX have it too), a bf16 product goes to it whole,
 * with no widening: on a Xeon with AMX, inside PyTorch, widened products
 * ran at 0.14-0.32 of aten::mm's speed, MKL's at 0.7-1.05
 * (tools/bench/matmul_bench.py). On a
 * CPU without (Zen 3, Haswell), MKL converts inside and the widening here
 * is the known quantity, so it stays (on AMD's Zen 4 too: MKL does not use
 * its AVX-512 there, unmeasured); $FUSEC_BLAS_BF16 says otherwise
 * ("1": wherever the library has one, "0": never). MKL's f16 product
 * (gemm_f16f16f32_) is not taken: on that Xeon it was no faster than
 * widening by F16C.
 *
 * Precision. y = a · op(b) accumulates in f32 for f32, bf16 and f16 (as
 * PyTorch's CPU kernels do) and in f64 for f64. bf16 and f16 operands are
 * widened to f32 panels first (exact) or multiplied as they lie into f32
 * sums, the f32 result and the bias are rounded once to the output dtype
 * (nearest even). The interpreter stays the f64 oracle; the f32 sums stay
 * well inside run --check's tolerances.
 *
 * Row-major through a column-major BLAS: y[M,N] = a[M,K] · w[K,N] is, seen
 * column-major, yᵀ = wᵀ · aᵀ, so the call is gemm(N, N, n=N, m=M, k=K,
 * b, a, y) with b's transpose flag for linear's w[N, K], and a's for an a
 * stored as its transpose [K, M] (a weight gradient's dYᵀ, read where it
 * lies: its rows r0.. start at element r0, not r0 * lda).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "blas.h"
#include "numeric.h"

typedef void (*sgemm_fn)(const char *ta, const char *tb, const int *m, const int *n,
			 const int *k, const float *alpha, const float *a, const int *lda,
			 const float *b, const int *ldb, const float *beta, float *c,
			 const int *ldc);
typedef void (*dgemm_fn)(const char *ta, const char *tb, const int *m, const int *n,
			 const int *k, const double *alpha, const double *a, const int *lda,
			 const double *b, const int *ldb, const double *beta, double *c,
			 const int *ldc);
/* bf16 operands, f32 sums and result: MKL's gemm_bf16bf16f32_, OpenBLAS's
 * sbgemm_ (the same arguments as sgemm_ but a and b) */
typedef void (*bgemm_fn)(const char *ta, const char *tb, const int *m, const int *n,
			 const int *k, const float *alpha, const uint16_t *a, const int *lda,
			 const uint16_t *b, const int *ldb, const float *beta, float *c,
			 const int *ldc);

struct fz_blas {
	void *dl;
	const char *name;
	char namebuf[64];      /* "openblas (SkylakeX)" */
	sgemm_fn sgemm;
	dgemm_fn dgemm;
	bgemm_fn bgemm;        /* bf16 products as they lie (bf16_gemm), or NULL */
	pthread_mutex_t mu;    /* guards scratch: one widened product at a time */
	bool sequential;       /* not safe to call from two threads at once */
	int (*mkl_threads)(int); /* MKL's MKL_Set_Num_Threads_Local, or NULL */
	pthread_mutex_t seq_mu; /* then: one product at a time */
	void *scratch;
	size_t cap;
};

static const struct {
	const char *file, *name, *threads;
} libs[] = {
	{"libopenblas.so.0", "openblas", "openblas_set_num_threads"},
	{"libblis.so.4", "blis", "bli_thread_set_num_threads"},
	{"libblas.so.3", "blas", NULL},
};

/* The OpenBLAS core an Intel CPU's features call for, or NULL: leave it to
 * the library (another vendor, another architecture, or the user's own
 * OPENBLAS_CORETYPE). */
static const char *openblas_core(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
	if (getenv("OPENBLAS_CORETYPE"))
		return NULL;
	__builtin_cpu_init();
	if (!__builtin_cpu_is("intel"))
		return NULL;
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
		return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
#endif
	return NULL;
}

/* The library's bf16 product, where $FUSEC_BLAS_BF16 and the CPU allow
 * it: unset, on an Intel CPU that multiplies bf16 itself (AVX-512 BF16,
 * which every CPU with AMX's bf16 tiles also has; MKL takes its AVX2 paths
 * on AMD's, whose AVX-512 BF16 it leaves unused, and that was not
 * measured); "1", wherever the library has one (a CPU without converts
 * inside it); "0", never. */
static bgemm_fn bf16_gemm(void *dl, const char *sym)
{
	const char *env = getenv("FUSEC_BLAS_BF16");
	if (env && env[0])
		return strcmp(env, "0") ? (bgemm_fn)dlsym(dl, sym) : NULL;
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	if (__builtin_cpu_is("intel") && __builtin_cpu_supports("avx512bf16"))
		return (bgemm_fn)dlsym(dl, sym);
#endif
	return NULL;
}

static bool try_open(fz_blas *b, const char *file, const char *name, const char *threads)
{
	const char *core = openblas_core(); /* a BLAS that is not OpenBLAS ignores it */
	if (core)
		setenv("OPENBLAS_CORETYPE", core, 0);
	void *dl = dlopen(file, RTLD_NOW | RTLD_LOCAL);
	if (core)
		unsetenv("OPENBLAS_CORETYPE");
	if (!dl)
		return false;
	sgemm_fn s = (sgemm_fn)dlsym(dl, "sgemm_");
	dgemm_fn d = (dgemm_fn)dlsym(dl, "dgemm_");
	if (!s || !d) {
		dlclose(dl);
		return false;
	}
	if (threads) {
		void (*set)(int) = (void (*)(int))dlsym(dl, threads);
		if (set)
			set(1);
	}
	int (*parallel)(void) = (int (*)(void))dlsym(dl, "openblas_get_parallel");
	b->sequential = parallel && parallel() == 0;
	b->dl = dl;
	b->name = b->sequential ? "openblas (sequential build: one product at a time)" : name;
	b->bgemm = b->sequential ? NULL : bf16_gemm(dl, "sbgemm_");
	char *(*corename)(void) = (char *(*)(void))dlsym(dl, "openblas_get_corename");
	if (corename && !b->sequential) {
		snprintf(b->namebuf, sizeof b->namebuf, "openblas (%s%s)", corename(),
			 b->bgemm ? "; bf16 products in bf16" : "");
		b->name = b->namebuf;
	}
	b->sgemm = s;
	b->dgemm = d;
	return true;
}

/* dl_iterate_phdr's walk: the first loaded object that exports MKL's
 * sgemm_ and its C thread control. */
static int find_mkl(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	fz_blas *b = arg;
	if (!info->dlpi_name || !info->dlpi_name[0])
		return 0;
	void *dl = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
	if (!dl)
		return 0;
	sgemm_fn s = (sgemm_fn)dlsym(dl, "sgemm_");
	dgemm_fn d = (dgemm_fn)dlsym(dl, "dgemm_");
	int (*threads)(int) = (int (*)(int))dlsym(dl, "MKL_Set_Num_Threads_Local");
	if (!s || !d || !threads) {
		dlclose(dl);
		return 0;
	}
	b->dl = dl;
	b->sgemm = s;
	b->dgemm = d;
	b->bgemm = bf16_gemm(dl, "gemm_bf16bf16f32_");
	b->mkl_threads = threads;
	b->name = b->bgemm ? "mkl (already in the process; bf16 products in bf16)" :
			     "mkl (already in the process)";
	return 1;
}

fz_status fz_blas_open(fz_blas **out, char **err)
{
	*out = NULL;
	fz_blas *b = calloc(1, sizeof *b);
	if (!b) {
		if (err)
			*err = fz_strdup("out of memory");
		return FZ_ENOMEM;
	}
	pthread_mutex_init(&b->mu, NULL);
	pthread_mutex_init(&b->seq_mu, NULL);
	b->name = "none";
	const char *env = getenv("FUSEC_BLAS");
	if (env && env[0]) {
		/* the user's choice, by path: "none" keeps the built-in loop */
		if (strcmp(env, "none"))
			try_open(b, env, strstr(env, "blis") ? "blis" : strstr(env, "openblas") ?
				 "openblas" : "blas", strstr(env, "blis") ?
				 "bli_thread_set_num_threads" : "openblas_set_num_threads");
	} else {
		dl_iterate_phdr(find_mkl, b);
		for (size_t i = 0; i < sizeof libs / sizeof libs[0] && !b->dl; i++)
			try_open(b, libs[i].file, libs[i].name, libs[i].threads);
	}
	*out = b;
	return FZ_OK;
}

void fz_blas_close(fz_blas *b)
{
	if (!b)
		return;
	if (b->dl)
		dlclose(b->dl);
	free(b->scratch);
	pthread_mutex_destroy(&b->mu);
	pthread_mutex_destroy(&b->seq_mu);
	free(b);
}

const char *fz_blas_name(const fz_blas *b) { return b ? b->name : "none"; }

/* ---- conversions to and from f32 panels ------------------------------------ */

static void bf16_to_f32(float *dst, const uint16_t *src, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)src[i] << 16;
		memcpy(&dst[i], &u, 4);
	}
}

/* one f16 widened, exactly (the compiler's conversion: F16C where the
 * build has it, else libgcc's) */
static inline float f16_one(const uint16_t *p)
{
	_Float16 h;
	memcpy(&h, p, sizeof h);
	return (float)h;
}

/* f16 widened eight at a time by F16C's vcvtph2ps where the CPU has it
 * (every AVX2 CPU does; GCC's conversion of _Float16 in the baseline
 * build is a libgcc call an element: an f16 product of 64 rows by a 4096
 * x 4096 weight spent half its time here), else one at a time */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *dst,
								  const uint16_t *src,
								  int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m128i h;
		memcpy(&h, src + i, sizeof h);
		__m256 f = _mm256_cvtph_ps(h);
		memcpy(dst + i, &f, sizeof f);
	}
	for (; i < n; i++)
		dst[i] = _cvtsh_ss(src[i]);
}

/* rounded to nearest even once (as fz_store_f64 of the exact f64 does);
 * a NaN stays a quiet NaN */
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *dst,
								  const float *src,
								  int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 f;
		memcpy(&f, src + i, sizeof f);
		__m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
		memcpy(dst + i, &h, sizeof h);
	}
	for (; i < n; i++)
		dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}
#endif

static void f16_to_f32(float *dst, const uint16_t *src, int64_t n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (__builtin_cpu_supports("f16c")) {
		f16_to_f32_f16c(dst, src, n);
		return;
	}
#endif
	for (int64_t i = 0; i < n; i++)
		dst[i] = f16_one(src + i);
}

/* nearest even; a NaN stays a (quiet) NaN */
static void f32_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &src[i], 4);
		uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
		bool nan = (u & 0x7fffffffu) > 0x7f800000u;
		dst[i] = (uint16_t)(nan ? (u >> 16) | 0x40u : r);
	}
}

static void to_f32(float *dst, const void *src, fz_dtype d, int64_t off, int64_t n)
{
	if (d == FZ_BF16) {
		bf16_to_f32(dst, (const uint16_t *)src + off, n);
		return;
	}
	if (d == FZ_F32) {
		memcpy(dst, (const float *)src + off, (size_t)n * 4);
		return;
	}
	if (d == FZ_F16) {
		f16_to_f32(dst, (const uint16_t *)src + off, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		dst[i] = (float)fz_load_f64(src, d, off + i);
}

static void from_f32(void *dst, fz_dtype d, int64_t off, const float *src, int64_t n)
{
	if (d == FZ_BF16) {
		f32_to_bf16((uint16_t *)dst + off, src, n);
		return;
	}
	if (d == FZ_F32) {
		memcpy((float *)dst + off, src, (size_t)n * 4);
		return;
	}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (d == FZ_F16 && __builtin_cpu_supports("f16c")) {
		f32_to_f16_f16c((uint16_t *)dst + off, src, n);
		return;
	}
#endif
	for (int64_t i = 0; i < n; i++)
		fz_store_f64(dst, d, off + i, src[i]);
}

/* ---- the split ------------------------------------------------------------------ */

typedef struct job {
	fz_blas *b;
	const fz_matmul *m;
	int64_t nb;                   /* batches */
	int64_t slices;               /* units per batch */
	bool by_rows;                 /* slices of rows, else of columns */
	const float *a32, *b32;       /* widened operands (bf16, f16), else NULL */
	float *y32;                   /* f32 result before rounding, or NULL */
	int64_t a_elems, b_elems;     /* what the widen pass converts */
	bool plain;                   /* no BLAS, or integers: the loop */
	bool stream_b;                /* b widened a block at a time (streamed) */
	bool dots;                    /* few rows by b's rows in registers (dots) */
	bool native;                  /* bf16 operands as they lie (fz_blas.bgemm) */
	bool round_after;             /* y32 rounded by the pool after (narrow) */
	int blas_threads;             /* MKL's threads for each unit, or 0 */
} job;

/* A bf16 or f16 product of few rows (M <= STREAM_MAX_ROWS: a decode
 * step's linear layers, M = 1, or a short prompt's) widens b a block of
 * columns at a time, in the unit that uses them, into STREAM_FLOATS floats
 * of its stack (256 KiB, inside every L2 since Haswell's), where
 * otherwise the whole of b is widened first: a weight read as bf16,
 * written as f32 and read again out of memory, three times its own
 * traffic, where the product itself is a pass over it (the lm head of a
 * 32000-word Llama of hidden 512, one token: 7 ms of a 16 ms decode step
 * went to it). Each block is an sgemm call that packs a (M x K) again,
 * about 1/w of the block's own work for w columns: the panel is that
 * large so that w is 16 at K 4096 (at 16384 floats, w = 4, a product of
 * 32 rows took 2.4x the whole widening's time). Up to 64 rows streaming
 * wins; at 128 the whole widening does (f16, on a Xeon: M 9 to 64,
 * torch/fusec 0.31-0.50 -> 0.59-0.92; M 128 K N 4096 30.1 -> 35.8 ms).
 * STREAM_ROWS or fewer of a linear weight go to dots instead. */
#define STREAM_ROWS 8
#define STREAM_MAX_ROWS 64
#define STREAM_FLOATS 65536

/* Element offsets of batch t in a and b. */
static void batch_offsets(const fz_matmul *m, int64_t t, int64_t *ao, int64_t *bo)
{
	*ao = *bo = 0;
	for (int d = m->nbd - 1; d >= 0; d--) {
		int64_t i = t % m->bshape[d];
		t /= m->bshape[d];
		*ao += i * m->a_bstride[d];
		*bo += i * m->b_bstride[d];
	}
}

/* Row strides of a and b (fz_matmul.lda/ldb, 0: dense); of the stored
 * [K, M] when a_trans. */
static int64_t lda_of(const fz_matmul *m)
{
	return m->lda ? m->lda : m->a_trans ? m->M : m->K;
}
static int64_t ldb_of(const fz_matmul *m)
{
	return m->ldb ? m->ldb : m->b_trans ? m->K : m->N;
}

/* The elements one matrix of an operand spans from its first: `rows`
 * stored rows of `cols` elements, `ld` apart (a strided view's gaps
 * included: they lie inside the buffer it views). */
static int64_t mat_span(int64_t rows, int64_t cols, int64_t ld)
{
	return rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0;
}

/* The elements an operand spans over every batch (broadcast ones once). */
static int64_t span(const fz_matmul *m, const int64_t *st, int64_t mat)
{
	int64_t n = mat;
	for (int d = 0; d < m->nbd; d++)
		n += (m->bshape[d] - 1) * st[d];
	return n;
}

static double load_num(const void *p, fz_dtype d, int64_t i)
{
	return fz_dtype_is_float(d) ? fz_load_f64(p, d, i) : (double)fz_load_i64(p, d, i);
}

/* y[r0..r1, c0..c1) of one batch by the plain loop: f32 sums (f64 for f64),
 * exact i64 sums for integers. */
static void plain_block(const job *J, int64_t ao, int64_t bo, int64_t yo, int64_t r0,
			int64_t r1, int64_t c0, int64_t c1)
{
	const fz_matmul *m = J->m;
	fz_dtype d = m->dtype;
	int64_t K = m->K, N = m->N, LA = lda_of(m), LB = ldb_of(m);
	int64_t as = m->a_trans ? LA : 1; /* a[i, k] at ai + k * as */
	for (int64_t i = r0; i < r1; i++)
		for (int64_t j = c0; j < c1; j++) {
			int64_t ai = m->a_trans ? ao + i : ao + i * LA;
			int64_t bi = m->b_trans ? bo + j * LB : bo + j;
			int64_t bs = m->b_trans ? 1 : LB;
			if (!fz_dtype_is_float(d)) {
				int64_t s = m->bias ? fz_load_i64(m->bias, d, j) : 0;
				for (int64_t k = 0; k < K; k++)
					s += fz_load_i64(m->a, d, ai + k * as) *
					     fz_load_i64(m->b, d, bi + k * bs);
				fz_store_i64(m->y, d, yo + i * N + j, s);
			} else if (d == FZ_F64) {
				double s = 0;
				for (int64_t k = 0; k < K; k++)
					s += load_num(m->a, d, ai + k * as) *
					     load_num(m->b, d, bi + k * bs);
				if (m->bias)
					s += fz_load_f64(m->bias, d, j);
				fz_store_f64(m->y, d, yo + i * N + j, s);
			} else {
				float s = 0;
				for (int64_t k = 0; k < K; k++)
					s += (float)load_num(m->a, d, ai + k * as) *
					     (float)load_num(m->b, d, bi + k * bs);
				if (m->bias)
					s += (float)fz_load_f64(m->bias, d, j);
				fz_store_f64(m->y, d, yo + i * N + j, s);
			}
		}
}

/* y[r0..r1, c0..c1) (+)= A's rows . b's rows for a bf16, f16 or f32 b
 * stored [N, K] (linear's weight, job.dots: b_trans, at most STREAM_ROWS
 * rows of A): each row of b loaded (widened) in registers, eight lanes at a
 * time, and multiplied into the rows of A as it passes; no panel, no call
 * per block.
 * With K = 11008 (a 7B model's down projection) the panels of streamed()
 * were one column wide: 15.9 ms for a token's product where PyTorch takes
 * 4.9. Every sum stays in a register: an array of them indexed by a row
 * count known only at run time is kept in memory by the compiler, a load
 * and a store around every fma (the first form here, with STREAM_ROWS x 4
 * sums: one thread, K = N = 4096, 7.0 ms for two rows, 9.9 for four, 16.5
 * for eight). So:
 *
 *   one row (a decode step's token; DOTS1_BODY): four sums (one sum's
 *     chain of additions held a core to 10 GB/s) and, where a row of b is
 *     8 KiB or more, two rows of b at a time, so that two streams of the
 *     weight are in flight (shorter rows follow one another in one stream
 *     anyway, and two at a time ran slower there: K 1024, 2.4 ms against
 *     3.8). One thread, N 2048: K 11008 5.4 -> 3.9 ms; K 512 (N 16000)
 *     2.4-3.1 -> 1.4-1.6 ms. On an Intel core (a Xeon of AVX-512) more
 *     streams pay more: four rows of b at a time, two sums each, read an
 *     f32 weight at 18 GB/s a core where pairs read 13.6 (one thread, K
 *     4096, a test outside the project), and fusec.Program's products of
 *     one row, alternating (matmul_bench.py, two threads): f32 K 4096 N
 *     11008 8.2-8.9 -> 6.8-7.9 ms (MKL 6.6-7.5), bf16 widened 5.3-5.8 ->
 *     4.3-4.9; K 512 N 32000 (short rows, where Zen 3 took them one at
 *     a time) 2.9-3.2 -> 2.2-2.9 (MKL 2.0-2.8). So there the rows go four
 *     at a time at any K, then in pairs; on the Zen 3 of the figures
 *     above the rows of 8 KiB or more go in pairs, shorter ones alone
 *     (four at a time not measured there).
 *   two to eight rows (a batch of tokens, or a few at once; DOTS_BODY):
 *     four rows at a time, two sums each, from one widening of b's lanes;
 *     b's row is read again for rows 5 to 8, from the cache. 4.2, 5.0 and
 *     8.6 ms for the cases above.
 *
 * The sums of a row run in order along k, so a row's result does not
 * depend on the rows beside it, only on whether it is alone.
 * Built for AVX2 with FMA where the CPU has them (dots_avx2), and for the
 * baseline ISA otherwise: the same source, GCC's vector extensions. */
typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef _Float16 v8hf __attribute__((vector_size(16)));

/* b's eight bf16 at p widened, and A's eight floats at p */
#define WIDEN8(p)                                                                      \
	({                                                                             \
		v8h h_;                                                                \
		memcpy(&h_, (p), sizeof h_);                                           \
		v8u u_ = __builtin_convertvector(h_, v8u) << 16;                       \
		v8f w_;                                                                \
		memcpy(&w_, &u_, sizeof w_);                                           \
		w_;                                                                    \
	})
#define LOAD8(p)                                                                       \
	({                                                                             \
		v8f x_;                                                                \
		memcpy(&x_, (p), sizeof x_);                                           \
		x_;                                                                    \
	})

/* b's eight f16 at p widened: by F16C's vcvtph2ps in the AVX2 build
 * (GCC converts a vector of _Float16 a lane at a time), else lane by lane */
#define F16_8(p)                                                                       \
	({                                                                             \
		v8hf h_;                                                               \
		memcpy(&h_, (p), sizeof h_);                                           \
		__builtin_convertvector(h_, v8f);                                      \
	})
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define F16_8_F16C(p)                                                                  \
	({                                                                             \
		__m128i h_;                                                            \
		memcpy(&h_, (p), sizeof h_);                                           \
		(v8f)_mm256_cvtph_ps(h_);                                              \
	})
#endif

/* The bodies below read b through three names, defined before each
 * family of functions is made from them (DOTS_FNS): BT, the type of b's
 * elements; B8(p), b's eight lanes at p as floats; B1(p), one. */
static inline float bf16_one(const uint16_t *p)
{
	float w;
	bf16_to_f32(&w, p, 1);
	return w;
}


/* a row's vector sum a folded to a float t, then its tail from k: b's
 * row bj against A's row ai */
#define DOTS_FOLD(a, bj, ai, k, t)                                                     \
	do {                                                                           \
		v8f a_ = (a);                                                          \
		t = 0;                                                                 \
		for (int l_ = 0; l_ < 8; l_++)                                         \
			t += a_[l_];                                                   \
		for (int64_t kk_ = k; kk_ < K; kk_++)                                  \
			t += (ai)[kk_] * B1((bj) + kk_);                               \
	} while (0)

/* row i of the four at Ai: its two sums, then its result (constant i
 * throughout, so the sums stay registers) */
#define DOTS_ROW(i)                                                                    \
	if (i < n) {                                                                   \
		s[i][0] += LOAD8(Ai + i * lda + k) * w0;                               \
		s[i][1] += LOAD8(Ai + i * lda + k + 8) * w1;                           \
	}
#define DOTS_ROW_END(i)                                                                \
	if (i < n) {                                                                   \
		float t_;                                                              \
		DOTS_FOLD(s[i][0] + s[i][1], bj, Ai + i * lda, k, t_);                 \
		float *yi_ = y + (i0 + i) * ldc + j;                                   \
		*yi_ = (acc_y ? *yi_ : 0.0f) + t_;                                     \
	}

#define DOTS_BODY                                                                      \
	for (int64_t j = c0; j < c1; j++) {                                            \
		const BT *bj = b + j * ldb;                                            \
		for (int i0 = 0; i0 < mm; i0 += 4) {                                   \
			const float *Ai = A + i0 * lda;                                \
			int n = mm - i0 < 4 ? mm - i0 : 4;                             \
			v8f s[4][2] = {{{0}}};                                         \
			int64_t k = 0;                                                 \
			for (; k + 16 <= K; k += 16) {                                 \
				v8f w0 = B8(bj + k), w1 = B8(bj + k + 8);              \
				DOTS_ROW(0) DOTS_ROW(1) DOTS_ROW(2) DOTS_ROW(3)        \
			}                                                              \
			DOTS_ROW_END(0) DOTS_ROW_END(1) DOTS_ROW_END(2) DOTS_ROW_END(3) \
		}                                                                      \
	}

#define DOTS1_PAIRS 4096 /* K from which DOTS1_BODY takes b's rows in pairs */

/* Whether DOTS1_BODY takes b's rows four at a time before pairs: on an
 * Intel CPU (see "one row" above) */
static bool dots1_fours(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
	return __builtin_cpu_is("intel");
#else
	return false;
#endif
}

/* row i of four (b0 .. b3): its two sums over x0 and x1, A's 16 lanes at k,
 * then its result */
#define DOTS1_FOUR(i) s##i##0 += x0 * B8(b##i + k), s##i##1 += x1 * B8(b##i + k + 8)
#define DOTS1_FOUR_END(i)                                                              \
	do {                                                                           \
		float t_;                                                              \
		DOTS_FOLD(s##i##0 + s##i##1, b##i, A, k, t_);                          \
		y[j + i] = (acc_y ? y[j + i] : 0.0f) + t_;                             \
	} while (0)

#define DOTS1_BODY                                                                     \
	int64_t j = c0, j4 = dots1_fours() ? c1 : c0; /* fours end by j4 */          \
	for (; j + 4 <= j4; j += 4) {                                                  \
		const BT *b0 = b + j * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb,             \
			 *b3 = b2 + ldb;                                               \
		v8f s00 = {0}, s01 = {0}, s10 = {0}, s11 = {0}, s20 = {0}, s21 = {0},   \
		    s30 = {0}, s31 = {0};                                              \
		int64_t k = 0;                                                         \
		for (; k + 16 <= K; k += 16) {                                         \
			v8f x0 = LOAD8(A + k), x1 = LOAD8(A + k + 8);                  \
			DOTS1_FOUR(0);                                                 \
			DOTS1_FOUR(1);                                                 \
			DOTS1_FOUR(2);                                                 \
			DOTS1_FOUR(3);                                                 \
		}                                                                      \
		DOTS1_FOUR_END(0);                                                     \
		DOTS1_FOUR_END(1);                                                     \
		DOTS1_FOUR_END(2);                                                     \
		DOTS1_FOUR_END(3);                                                     \
	}                                                                              \
	for (; K >= DOTS1_PAIRS && j + 2 <= c1; j += 2) {                              \
		const BT *b0 = b + j * ldb, *b1 = b0 + ldb;                            \
		v8f s[4] = {{0}}, r[4] = {{0}};                                        \
		int64_t k = 0;                                                         \
		for (; k + 32 <= K; k += 32)                                           \
			for (int q = 0; q < 4; q++) {                                  \
				v8f x = LOAD8(A + k + 8 * q);                          \
				s[q] += x * B8(b0 + k + 8 * q);                        \
				r[q] += x * B8(b1 + k + 8 * q);                        \
			}                                                              \
		float t0, t1;                                                          \
		DOTS_FOLD((s[0] + s[1]) + (s[2] + s[3]), b0, A, k, t0);               \
		DOTS_FOLD((r[0] + r[1]) + (r[2] + r[3]), b1, A, k, t1);               \
		y[j] = (acc_y ? y[j] : 0.0f) + t0;                                     \
		y[j + 1] = (acc_y ? y[j + 1] : 0.0f) + t1;                             \
	}                                                                              \
	for (; j < c1; j++) {                                                          \
		const BT *b0 = b + j * ldb;                                            \
		v8f s[4] = {{0}};                                                      \
		int64_t k = 0;                                                         \
		for (; k + 32 <= K; k += 32)                                           \
			for (int q = 0; q < 4; q++)                                    \
				s[q] += LOAD8(A + k + 8 * q) * B8(b0 + k + 8 * q);     \
		float t0;                                                              \
		DOTS_FOLD((s[0] + s[1]) + (s[2] + s[3]), b0, A, k, t0);               \
		y[j] = (acc_y ? y[j] : 0.0f) + t0;                                     \
	}

/* dots1_SFX and dots_SFX for b's BT: for AVX2 with FMA (and F16C, which
 * every such CPU has) where the CPU has them, and for the baseline ISA
 * otherwise */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DOTS_AVX2(sfx)                                                                 \
	__attribute__((target("avx2,fma,f16c"))) static void dots1_avx2_##sfx(         \
		const float *A, const BT *b, int64_t ldb, int64_t K, float *y,         \
		int64_t c0, int64_t c1, bool acc_y)                                    \
	{                                                                              \
		DOTS1_BODY                                                             \
	}                                                                              \
	__attribute__((target("avx2,fma,f16c"))) static void dots_avx2_##sfx(          \
		const float *A, int64_t lda, int mm, const BT *b, int64_t ldb,         \
		int64_t K, float *y, int64_t ldc, int64_t c0, int64_t c1, bool acc_y)  \
	{                                                                              \
		DOTS_BODY                                                              \
	}
#define DOTS_CALL_AVX2(sfx)                                                            \
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&         \
	    __builtin_cpu_supports("f16c")) {                                          \
		if (mm == 1)                                                           \
			dots1_avx2_##sfx(A, b, ldb, K, y, c0, c1, acc_y);             \
		else                                                                   \
			dots_avx2_##sfx(A, lda, mm, b, ldb, K, y, ldc, c0, c1, acc_y); \
		return;                                                                \
	}
#else
#define DOTS_AVX2(sfx)
#define DOTS_CALL_AVX2(sfx)
#endif

#define DOTS_FNS(sfx) DOTS_AVX2(sfx) DOTS_BASE(sfx)
#define DOTS_BASE(sfx)                                                                 \
	static void dots_##sfx(const float *A, int64_t lda, int mm, const BT *b,       \
			       int64_t ldb, int64_t K, float *y, int64_t ldc,          \
			       int64_t c0, int64_t c1, bool acc_y)                     \
	{                                                                              \
		DOTS_CALL_AVX2(sfx)                                                    \
		if (mm == 1) {                                                         \
			DOTS1_BODY                                                     \
		} else {                                                               \
			DOTS_BODY                                                      \
		}                                                                      \
	}

#define BT uint16_t
#define B8(p) WIDEN8(p)
#define B1(p) bf16_one(p)
DOTS_FNS(bf16)
#undef BT
#undef B8
#undef B1
#define BT float
#define B8(p) LOAD8(p)
#define B1(p) (*(p))
DOTS_FNS(f32)
#undef BT
#undef B8
#undef B1
#define BT uint16_t
#define B1(p) f16_one(p)
#define B8(p) F16_8_F16C(p)
DOTS_AVX2(f16)
#undef B8
#define B8(p) F16_8(p)
DOTS_BASE(f16)
#undef BT
#undef B8
#undef B1

/* y[r0..r1, c0..c1) = A's rows . b's columns (+ y, beta 1), b widened
 * STREAM_FLOATS / K columns at a time (job.stream_b, where dots does not
 * serve): linear's b [N, K] (b_trans) a block of its rows, else a block of
 * the columns of [K, N]. */
static void streamed(const job *J, int64_t bo, const float *A, int lda, const char *ta,
		     float *y, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float beta)
{
	const fz_matmul *m = J->m;
	float panel[STREAM_FLOATS];
	int64_t K = m->K, N = m->N, LB = ldb_of(m);
	int64_t w = STREAM_FLOATS / K; /* >= 1: stream_b holds K <= STREAM_FLOATS */
	int mm = (int)(r1 - r0), kk = (int)K, ldc = (int)N;
	float one = 1.0f;
	for (int64_t cb = c0; cb < c1; cb += w) {
		int64_t ce = cb + w < c1 ? cb + w : c1;
		int nn = (int)(ce - cb), ldp;
		if (m->b_trans) { /* rows cb..ce of [N, K], each K long */
			for (int64_t j = cb; j < ce; j++)
				to_f32(panel + (j - cb) * K, m->b, m->dtype, bo + j * LB, K);
			ldp = kk;
		} else { /* columns cb..ce of [K, N]: K rows of nn */
			for (int64_t k = 0; k < K; k++)
				to_f32(panel + k * nn, m->b, m->dtype, bo + k * LB + cb, nn);
			ldp = nn;
		}
		J->b->sgemm(m->b_trans ? "T" : "N", ta, &nn, &mm, &kk, &one, panel, &ldp, A,
			    &lda, &beta, y + r0 * N + cb, &ldc);
	}
}

/* Unit u: batch u / slices, rows or columns [lo, hi) of it. */
static void unit_range(const job *J, int64_t u, int64_t *t, int64_t *lo, int64_t *hi)
{
	const fz_matmul *m = J->m;
	int64_t ext = J->by_rows ? m->M : m->N;
	int64_t s = u % J->slices, chunk = (ext + J->slices - 1) / J->slices;
	*t = u / J->slices;
	*lo = s * chunk < ext ? s * chunk : ext;
	*hi = *lo + chunk < ext ? *lo + chunk : ext;
}

static void unit(const job *J, int part)
{
	const fz_matmul *m = J->m;
	int64_t t, lo, hi, ao, bo;
	unit_range(J, part, &t, &lo, &hi);
	if (lo >= hi)
		return;
	batch_offsets(m, t, &ao, &bo);
	int64_t M = m->M, N = m->N, K = m->K, yo = t * M * N;
	int64_t r0 = J->by_rows ? lo : 0, r1 = J->by_rows ? hi : M;
	int64_t c0 = J->by_rows ? 0 : lo, c1 = J->by_rows ? N : hi;
	if (J->plain) {
		plain_block(J, ao, bo, yo, r0, r1, c0, c1);
		return;
	}
	int mm = (int)(r1 - r0), nn = (int)(c1 - c0), kk = (int)K;
	int lda = (int)lda_of(m), ldb = (int)ldb_of(m), ldc = (int)N;
	const char *tb = m->b_trans ? "T" : "N", *ta = m->a_trans ? "T" : "N";
	int64_t boff = m->b_trans ? bo + c0 * ldb : bo + c0;
	int64_t aoff = m->a_trans ? ao + r0 : ao + r0 * lda;
	if (m->dtype == FZ_F64) {
		double *y = (double *)m->y + yo;
		const double *bias = m->bias;
		double beta = bias ? 1.0 : 0.0, one = 1.0;
		for (int64_t i = r0; bias && i < r1; i++)
			memcpy(y + i * N + c0, bias + c0, sizeof *y * (size_t)nn);
		if (kk == 0) {
			for (int64_t i = r0; !bias && i < r1; i++)
				memset(y + i * N + c0, 0, sizeof *y * (size_t)nn);
			return;
		}
		J->b->dgemm(tb, ta, &nn, &mm, &kk, &one, (const double *)m->b + boff, &ldb,
			    (const double *)m->a + aoff, &lda, &beta, y + r0 * N + c0, &ldc);
		return;
	}
	/* f32 directly into y; bf16 and f16 into the f32 panel, then rounded */
	const float *A = J->a32 ? J->a32 : (const float *)m->a;
	const float *B = J->b32 ? J->b32 : (const float *)m->b;
	float *y = J->y32 ? J->y32 + yo : (float *)m->y + yo;
	float beta = m->bias ? 1.0f : 0.0f, one = 1.0f;
	for (int64_t i = r0; m->bias && i < r1; i++)
		to_f32(y + i * N + c0, m->bias, m->dtype, c0, nn);
	if (kk == 0) {
		for (int64_t i = r0; !m->bias && i < r1; i++)
			memset(y + i * N + c0, 0, sizeof *y * (size_t)nn);
	} else if (J->native) {
		J->b->bgemm(tb, ta, &nn, &mm, &kk, &one, (const uint16_t *)m->b + boff, &ldb,
			    (const uint16_t *)m->a + aoff, &lda, &beta, y + r0 * N + c0, &ldc);
	} else if (J->dots && m->dtype == FZ_BF16) {
		dots_bf16(A + aoff, lda, mm, (const uint16_t *)m->b + bo, ldb, K,
			  y + r0 * N, N, c0, c1, m->bias != NULL);
	} else if (J->dots && m->dtype == FZ_F16) {
		dots_f16(A + aoff, lda, mm, (const uint16_t *)m->b + bo, ldb, K,
			 y + r0 * N, N, c0, c1, m->bias != NULL);
	} else if (J->dots) {
		dots_f32(A + aoff, lda, mm, (const float *)m->b + bo, ldb, K,
			 y + r0 * N, N, c0, c1, m->bias != NULL);
	} else if (J->stream_b) {
		streamed(J, bo, A + aoff, lda, ta, y, r0, r1, c0, c1, beta);
	} else {
		J->b->sgemm(tb, ta, &nn, &mm, &kk, &one, B + boff, &ldb, A + aoff, &lda,
			    &beta, y + r0 * N + c0, &ldc);
	}
	if (J->y32 && !J->round_after)
		for (int64_t i = r0; i < r1; i++)
			from_f32(m->y, m->dtype, yo + i * N + c0, y + i * N + c0, nn);
}

/* Unit `part` on this thread, with MKL told J->blas_threads threads for
 * it (this thread's setting given back after). */
static void run_unit(void *arg, int part, int nparts)
{
	(void)nparts;
	const job *J = arg;
	int prev = J->blas_threads ? J->b->mkl_threads(J->blas_threads) : 0;
	unit(J, part);
	if (J->blas_threads)
		J->b->mkl_threads(prev);
}

/* The widening pass: part p of n converts its share of a, then of b. */
static void widen(void *arg, int part, int nparts)
{
	const job *J = arg;
	const fz_matmul *m = J->m;
	int64_t tot = J->a_elems + J->b_elems;
	int64_t chunk = (tot + nparts - 1) / nparts;
	int64_t s = part * chunk, e = s + chunk < tot ? s + chunk : tot;
	if (s < J->a_elems) {
		int64_t ae = e < J->a_elems ? e : J->a_elems;
		to_f32((float *)J->a32 + s, m->a, m->dtype, s, ae - s);
		s = ae;
	}
	if (s < e) {
		int64_t o = s - J->a_elems;
		to_f32((float *)J->b32 + o, m->b, m->dtype, o, e - s);
	}
}

/* The rounding pass after a product made whole (MKL's threads): part p of
 * n rounds its share of the f32 result into y. */
static void narrow(void *arg, int part, int nparts)
{
	const job *J = arg;
	const fz_matmul *m = J->m;
	int64_t tot = J->nb * m->M * m->N;
	int64_t chunk = (tot + nparts - 1) / nparts;
	int64_t s = part * chunk, e = s + chunk < tot ? s + chunk : tot;
	if (s < e)
		from_f32(m->y, m->dtype, s, J->y32 + s, e - s);
}

static fz_status product(fz_blas *b, fz_pool *pool, const fz_matmul *m, int64_t M,
			 int64_t N, int64_t K, int64_t nb, bool plain, char **err);

fz_status fz_cpu_matmul(fz_blas *b, fz_pool *pool, const fz_matmul *m, char **err)
{
	int64_t M = m->M, N = m->N, K = m->K, nb = 1;
	for (int d = 0; d < m->nbd; d++)
		nb *= m->bshape[d];
	if (M <= 0 || N <= 0 || nb <= 0)
		return FZ_OK;
	bool plain = !b || !b->dl || !fz_dtype_is_float(m->dtype);
	if (!plain && (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)) {
		if (err)
			*err = fz_strdup_printf("region %d: a matrix product of %lld x %lld "
						"x %lld passes the BLAS's 32-bit extents",
						m->region, (long long)M, (long long)K,
						(long long)N);
		return FZ_EUNSUPPORTED;
	}
	bool seq = !plain && b->sequential;
	if (seq) {
		pthread_mutex_lock(&b->seq_mu);
		pool = NULL; /* its parts would call the library at once */
	}
	fz_status st = product(b, pool, m, M, N, K, nb, plain, err);
	if (seq)
		pthread_mutex_unlock(&b->seq_mu);
	return st;
}

static fz_status product(fz_blas *b, fz_pool *pool, const fz_matmul *m, int64_t M,
			 int64_t N, int64_t K, int64_t nb, bool plain, char **err)
{
	int T = fz_pool_threads(pool);
	job J = {.b = b, .m = m, .nb = nb, .slices = 1, .by_rows = true, .plain = plain};
	/* Whole batches, about four per thread, where there are enough;
	 * else slices of rows or of columns. A slice's sgemm packs the whole
	 * operand it does not slice (b, K x N, for rows; a, M x K, for
	 * columns), once per slice, so a slice of r rows costs about 1/r
	 * more than its share of the whole product: products of the Llama
	 * step (M = 512 or 2048, K and N 256 to 2048) cut into slices one
	 * after another on one thread ran at 0.78 of the whole product's
	 * GFLOP/s in slices of 64 rows or columns, 0.87 at 128, 0.97 at 256
	 * (medians of two runs here). So slices are of 256 or more, at
	 * least one per thread (down to 64 where the product is too small
	 * for that), at most four per thread (the spare ones balance a
	 * core busy with something else). Where both ways give enough
	 * slices, the product is cut so that the smaller operand is the one
	 * packed again. One thread takes the product whole. */
	int64_t want = 4 * (int64_t)T;
	bool widened = !plain && m->dtype != FZ_F32 && m->dtype != FZ_F64;
	/* bf16 to the library's bf16 product where it has one (only the
	 * result, f32, is rounded after); else few rows: each unit widens b's
	 * columns as it goes, a linear weight's rows (bf16, or f32 as it lies)
	 * in registers */
	J.native = widened && m->dtype == FZ_BF16 && b->bgemm;
	J.stream_b = widened && !J.native && M <= STREAM_MAX_ROWS && K <= STREAM_FLOATS;
	J.dots = !plain && !J.native && M <= STREAM_ROWS && m->b_trans && !m->a_trans &&
		 (J.stream_b || m->dtype == FZ_F32);
	bool whole = !plain && b->mkl_threads && nb < want && !J.stream_b && !J.dots;
	if (!plain && b->mkl_threads)
		J.blas_threads = whole ? T : 1;
	if (nb < want && T > 1 && !whole) {
		int64_t per = (want + nb - 1) / nb, least = (T + nb - 1) / nb;
		int64_t rows = M / 64 > 0 ? M / 64 : 1, cols = N / 64 > 0 ? N / 64 : 1;
		if (rows >= per && cols >= per)
			J.by_rows = N <= M;
		else
			J.by_rows = rows >= per || (cols < per && rows >= cols);
		int64_t lim = J.by_rows ? rows : cols;
		int64_t n = (J.by_rows ? M : N) / 256;
		n = n < least ? least : n > per ? per : n;
		J.slices = n < lim ? n : lim;
	}
	bool locked = false;
	if (widened) {
		/* the panels keep the operands' layouts (strides, transposes):
		 * each element widened where it lies; b not at all when the
		 * units stream it */
		J.a_elems = J.native ? 0 :
			    span(m, m->a_bstride, m->a_trans ? mat_span(K, M, lda_of(m))
							     : mat_span(M, K, lda_of(m)));
		J.b_elems = J.stream_b || J.native ? 0 :
			    span(m, m->b_bstride, m->b_trans ? mat_span(N, K, ldb_of(m))
							     : mat_span(K, N, ldb_of(m)));
		size_t need = sizeof(float) * (size_t)(J.a_elems + J.b_elems + nb * M * N);
		pthread_mutex_lock(&b->mu);
		locked = true;
		if (need > b->cap) {
			free(b->scratch);
			b->cap = 0;
			b->scratch = aligned_alloc(64, (need + 63) / 64 * 64);
			if (!b->scratch) {
				pthread_mutex_unlock(&b->mu);
				if (err)
					*err = fz_strdup_printf("region %d: out of memory for "
								"the f32 panels of a product",
								m->region);
				return FZ_ENOMEM;
			}
			b->cap = need;
		}
		float *s = b->scratch;
		J.a32 = s;
		J.b32 = J.stream_b ? NULL : s + J.a_elems;
		J.y32 = s + J.a_elems + J.b_elems;
		if (J.a_elems + J.b_elems > 0)
			fz_pool_run(pool, T, widen, &J);
	}
	int64_t units = nb * J.slices; /* slices > 1 only when nb < 4 T */
	if (units > INT32_MAX) {
		if (locked)
			pthread_mutex_unlock(&b->mu);
		if (err)
			*err = fz_strdup_printf("region %d: %lld batches of a product",
						m->region, (long long)nb);
		return FZ_EUNSUPPORTED;
	}
	if (whole) {
		/* the product on MKL's threads, its rounding on the pool's */
		J.round_after = J.y32 != NULL;
		for (int64_t t = 0; t < nb; t++)
			run_unit(&J, (int)t, (int)nb);
		if (J.round_after)
			fz_pool_run(pool, T, narrow, &J);
	} else {
		fz_pool_run(pool, (int)units, run_unit, &J);
	}
	if (locked)
		pthread_mutex_unlock(&b->mu);
	return FZ_OK;
}
