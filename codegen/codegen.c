/*
 * codegen.c: the compiler object and the path of one region through it.
 *
 *     fz_compiler_new      targets initialized once (pthread_once), one
 *                          LLVMContext, the target machine (NVPTX) or the
 *                          ORC LLJIT (host), a diagnostic handler that keeps
 *                          LLVM's last error for the status message
 *     fz_compiler_build    one module per region: the skeleton is chosen by
 *                          what the region holds (index_add: scatter; a
 *                          reduction: rows; else pointwise), the module is
 *                          verified; a region the skeletons cannot take is
 *                          FZ_EUNSUPPORTED naming the region and the op
 *     fz_compiler_optimize LLVMRunPasses with a pipeline tailored to the
 *                          kernels (see PIPELINE_NVPTX) and the target
 *                          machine, so the NVPTX and x86 passes take part
 *     fz_kernel_ptx / _jit target_nvptx.c, target_host.c
 *
 * Every string LLVM hands back (messages, printed modules, host CPU names)
 * is copied into a fusec string and released with LLVMDisposeMessage.
 */
#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg.h"
#include "llvm.h"

fz_status fz_cg_options_parse(const char *target, fz_cg_options *o, char **err)
{
	memset(o, 0, sizeof *o);
	o->vectorize = true;
	if (!target || !strcmp(target, "host")) {
		o->target = FZ_CG_HOST;
		return FZ_OK;
	}
	/* emu, emu-sm_80: that GPU's kernels, emulated on the host */
	bool emu = !strncmp(target, "emu", 3) && (!target[3] || target[3] == '-');
	const char *gpu = emu ? (target[3] ? target + 4 : "sm_90") : target;
	int sm = 0;
	char tail[8] = "";
	if (sscanf(gpu, "sm_%d%7s", &sm, tail) >= 1 && sm >= 70 && sm <= 90 &&
	    (!tail[0] || !strcmp(tail, "a"))) {
		o->target = emu ? FZ_CG_EMU : FZ_CG_NVPTX;
		o->sm = sm;
		return FZ_OK;
	}
	fz_set_err(err, fz_strdup_printf("unknown target '%s': expected host, "
				      "sm_70 ... sm_90, or emu[-sm_NN]", target));
	return FZ_EINVAL;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_targets(void)
{
	LLVMInitializeNVPTXTargetInfo();
	LLVMInitializeNVPTXTarget();
	LLVMInitializeNVPTXTargetMC();
	LLVMInitializeNVPTXAsmPrinter();
	LLVMInitializeNativeTarget();
	LLVMInitializeNativeAsmPrinter();
}

static void on_diagnostic(LLVMDiagnosticInfoRef di, void *arg)
{
	fz_compiler *c = arg;
	if (LLVMGetDiagInfoSeverity(di) != LLVMDSError)
		return;
	char *m = LLVMGetDiagInfoDescription(di);
	snprintf(c->diag, sizeof c->diag, "%s", m ? m : "?");
	LLVMDisposeMessage(m);
}

fz_status cg_llvm_error(fz_compiler *c, void *e, const char *what, int region,
			char **err)
{
	char *m = LLVMGetErrorMessage((LLVMErrorRef)e);
	fz_set_err(err, fz_strdup_printf("region %d: %s: %s%s%s", region, what,
				      m ? m : "?", c->diag[0] ? "; " : "", c->diag));
	LLVMDisposeErrorMessage(m);
	c->diag[0] = 0;
	return FZ_ERUNTIME;
}

fz_status fz_compiler_new(const fz_cg_options *o, fz_compiler **out, char **err)
{
	if (err)
		*err = NULL;
	*out = NULL;
	pthread_once(&init_once, init_targets);
	fz_compiler *c = calloc(1, sizeof *c);
	if (!c)
		return FZ_ENOMEM;
	c->o = *o;
	fz_status st = o->target == FZ_CG_NVPTX ? cg_nvptx_init(c, err) :
		       cg_host_init(c, err);
	if (st != FZ_OK)
		goto fail;
	LLVMContextSetDiagnosticHandler(c->ctx, on_diagnostic, c);
	*out = c;
	return FZ_OK;
fail:
	fz_compiler_free(c);
	return st;
}

void fz_compiler_free(fz_compiler *c)
{
	if (!c)
		return;
	if (c->o.target != FZ_CG_NVPTX) {
		cg_host_free(c);
	} else if (c->ctx) {
		LLVMContextDispose(c->ctx);
	}
	if (c->tm)
		LLVMDisposeTargetMachine(c->tm);
	free(c->triple);
	free(c->layout);
	free(c);
}

const fz_cg_options *fz_compiler_options(const fz_compiler *c) { return &c->o; }

void fz_kernel_free(fz_kernel *k)
{
	if (!k)
		return;
	if (k->mod)
		LLVMDisposeModule(k->mod);
	free(k);
}

static bool kernel_op(fz_opclass c)
{
	return c == FZ_CLASS_UNARY || c == FZ_CLASS_BINARY || c == FZ_CLASS_TERNARY ||
	       c == FZ_CLASS_CREATION || c == FZ_CLASS_META ||
	       c == FZ_CLASS_REDUCTION || c == FZ_CLASS_INDEXING ||
	       c == FZ_CLASS_SCAN || c == FZ_CLASS_SELECT;
}

fz_status fz_compiler_build(fz_compiler *c, const fz_trace *t, const fz_region *r,
			    fz_kernel **out, char **err)
{
	double t0 = fz_now();
	if (err)
		*err = NULL;
	*out = NULL;
	cg g;
	memset(&g, 0, sizeof g);
	fz_kernel *k = calloc(1, sizeof *k);
	g.slot = malloc(sizeof *g.slot * (size_t)(t->n_values + 1));
	g.red = calloc((size_t)t->n_values + 1, sizeof *g.red);
	g.is_red = calloc((size_t)t->n_values + 1, sizeof *g.is_red);
	g.buf = calloc((size_t)(r->n_in + r->n_out) + 1, sizeof *g.buf);
	g.ext = calloc((size_t)(r->n_in + r->n_out) + 1, sizeof *g.ext);
	if (!k || !g.slot || !g.red || !g.is_red || !g.buf || !g.ext) {
		free(k);
		k = NULL;
		g.st = FZ_ENOMEM;
		snprintf(g.msg, sizeof g.msg, "region %d: out of memory", r->id);
		goto done;
	}
	g.c = c;
	g.ctx = c->ctx;
	g.t = t;
	g.r = r;
	g.o = c->o;
	g.nan_clean = cg_nan_clean(&g, r);
	g.k = k;
	bool idx32 = c->o.idx32 && !(c->o.target == FZ_CG_EMU && c->o.emu_idx64);
	g.ity = idx32 ? t_i32(&g) : t_i64(&g);
	g.as = c->o.target == FZ_CG_NVPTX ? 1 : 0;
	k->region = r->id;
	k->n_in = r->n_in;
	k->n_out = r->n_out;
	k->n_entries = 1;
	k->vec = 1;
	k->n_syms = t->n_syms;
	for (int s = 0; s < t->n_syms; s++)
		k->syms[s] = s;
	/* a kernel of no region (the copy of a reshape that is not a view)
	 * has id -1, and '-' is no character of a PTX name */
	char base[32];
	if (r->id >= 0)
		snprintf(base, sizeof base, "fz_region_%d", r->id);
	else
		snprintf(base, sizeof base, "fz_copy");
	if (c->o.target == FZ_CG_NVPTX) {
		snprintf(k->names[0], sizeof k->names[0], "%s", base);
		snprintf(k->names[1], sizeof k->names[1], "%s_scatter", base);
	} else {
		int n = c->counter++;
		snprintf(k->names[0], sizeof k->names[0], "%s_%d", base, n);
		snprintf(k->names[1], sizeof k->names[1], "%s_%d_s", base, n);
	}
	for (int v = 0; v < t->n_values; v++)
		g.slot[v] = -1;
	for (int i = 0; i < r->n_in; i++)
		g.slot[r->in[i]->id] = i;
	for (int i = 0; i < r->n_out; i++) {
		if (g.slot[r->out[i]->id] >= 0) {
			cg_fail(&g, FZ_EUNSUPPORTED, r->out[i]->def, "value #%d is both "
				"an input and an output of the region", r->out[i]->id);
			goto done;
		}
		g.slot[r->out[i]->id] = r->n_in + i;
	}
	bool attn = false;
	for (int i = 0; i < r->n_nodes; i++)
		attn |= fz_ops[r->nodes[i]->op].cls == FZ_CLASS_ATTENTION ||
			r->nodes[i]->op == FZ_OP_MATMUL;
	const fz_node *ia = NULL;
	bool has_red = false;
	fz_opclass row_op = FZ_CLASS_COUNT; /* a scan or a selection */
	for (int i = 0; i < r->n_nodes; i++) {
		const fz_node *n = r->nodes[i];
		if (!attn && !kernel_op(fz_ops[n->op].cls)) {
			cg_fail(&g, FZ_EUNSUPPORTED, n, "a %s op is not part of a kernel",
				fz_class_names[fz_ops[n->op].cls]);
			goto done;
		}
		has_red |= fz_ops[n->op].cls == FZ_CLASS_REDUCTION;
		if (fz_ops[n->op].cls == FZ_CLASS_SCAN ||
		    fz_ops[n->op].cls == FZ_CLASS_SELECT)
			row_op = fz_ops[n->op].cls;
		if (n->op == FZ_OP_INDEX_ADD) {
			if (ia) {
				cg_fail(&g, FZ_EUNSUPPORTED, n, "two index_add in one region");
				goto done;
			}
			ia = n;
		}
	}
	if (r->n_out == 0) {
		cg_fail(&g, FZ_EUNSUPPORTED, NULL, "the region has no outputs");
		goto done;
	}
	if (ia && has_red && !attn) {
		cg_fail(&g, FZ_EUNSUPPORTED, ia, "index_add and a reduction in one region");
		goto done;
	}
	char modname[32];
	snprintf(modname, sizeof modname, "region-%d", r->id);
	g.mod = LLVMModuleCreateWithNameInContext(modname, c->ctx);
	LLVMSetTarget(g.mod, c->triple);
	LLVMSetDataLayout(g.mod, c->layout);
	g.b = LLVMCreateBuilderInContext(c->ctx);
	k->sk = ia ? FZ_SK_SCATTER : has_red ? FZ_SK_ROW : FZ_SK_POINTWISE;
	if (attn)
		cg_attention(&g);
	else if (row_op == FZ_CLASS_SCAN)
		cg_scan(&g);
	else if (row_op == FZ_CLASS_SELECT)
		cg_select(&g);
	else if (ia)
		cg_scatter(&g, ia);
	else if (has_red)
		cg_rows(&g);
	else
		cg_pointwise(&g);
	LLVMDisposeBuilder(g.b);
	if (g.st == FZ_OK) {
		char *msg = NULL;
		if (LLVMVerifyModule(g.mod, LLVMReturnStatusAction, &msg)) {
			snprintf(g.msg, sizeof g.msg, "region %d: LLVM rejects the "
				 "generated IR (a code generator bug): %.400s", r->id,
				 msg ? msg : "?");
			g.st = FZ_ERUNTIME;
		}
		LLVMDisposeMessage(msg);
	}
	if (g.st == FZ_OK) {
		k->mod = g.mod;
		g.mod = NULL;
	}
done:
	if (g.mod)
		LLVMDisposeModule(g.mod);
	free(g.slot);
	free(g.red);
	free(g.is_red);
	free(g.buf);
	free(g.ext);
	free(g.memo);
	free(g.cse);
	free(g.tab);
	if (g.st != FZ_OK) {
		fz_kernel_free(k);
		fz_set_err(err, fz_strdup(g.msg));
		return g.st;
	}
	k->t_build = fz_now() - t0;
	*out = k;
	return FZ_OK;
}

/* The pass pipelines. A kernel is a few loops (grid-stride, rows, a pass
 * over a row) around straight-line code the emitter has already
 * specialized, vectorized into lanes and memoized, so most of O3 finds
 * nothing to do: inlining (there are no calls), loop rotation, unswitching,
 * the loop vectorizer (the lanes are explicit; sums may not be reordered).
 * What the generated IR needs is: accumulators out of allocas into
 * registers (sroa), the lanes' and passes' repeated index arithmetic and
 * constants folded and shared (early-cse, instcombine, gvn), and the
 * branches of the emitter's masks and error checks merged (simplifycfg).
 * The NVPTX backend then runs its own IR passes when it emits (address
 * space inference, GEP splitting, strength reduction, the load/store
 * vectorizer that makes ld.global.v4), and ptxas optimizes again, loop
 * invariants included: hoisting them here (licm) only raised the register
 * count of pointwise kernels (rotary: 40 to 48). The host has no ptxas, so
 * it adds licm, the SLP vectorizer, which turns a thread's lanes into
 * SIMD instructions, and lower-expect, which makes math.c's branch hints
 * weights (the vector exp's rare branch laid out of the loop's way).
 * Against default<O3>, on the 32-layer Llama for
 * sm_90: the same PTX loads (v4, .nc), no .local, registers within a few
 * of O3's, and a third of the compile time (tools/bench/bench_codegen).
 * FUSEC_CODEGEN_PASSES overrides both (debugging: "default<O0>", or
 * "default<O3>" to compare). */
static const char PIPELINE_NVPTX[] =
	"function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,"
	"gvn,instcombine<no-verify-fixpoint>,simplifycfg)";
static const char PIPELINE_HOST[] =
	"function(lower-expect,sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,"
	"loop-mssa(licm),gvn,instcombine<no-verify-fixpoint>,simplifycfg,slp-vectorizer,"
	"instcombine<no-verify-fixpoint>)";

fz_status fz_compiler_optimize(fz_compiler *c, fz_kernel *k, char **err)
{
	if (err)
		*err = NULL;
	double t0 = fz_now();
	const char *pipeline = getenv("FUSEC_CODEGEN_PASSES");
	if (!pipeline || !pipeline[0])
		pipeline = c->o.target == FZ_CG_NVPTX ? PIPELINE_NVPTX : PIPELINE_HOST;
	LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
	LLVMErrorRef e = LLVMRunPasses(k->mod, pipeline, c->tm, po);
	LLVMDisposePassBuilderOptions(po);
	if (e)
		return cg_llvm_error(c, e, "optimizing", k->region, err);
	k->t_opt = fz_now() - t0;
	return FZ_OK;
}

fz_status fz_kernel_llvm(const fz_kernel *k, char **out, char **err)
{
	if (err)
		*err = NULL;
	*out = NULL;
	if (!k->mod) {
		fz_set_err(err, fz_strdup_printf("region %d: the module was already "
					      "emitted", k->region));
		return FZ_EINVAL;
	}
	char *s = LLVMPrintModuleToString(k->mod);
	*out = fz_strdup(s ? s : "");
	LLVMDisposeMessage(s);
	return *out ? FZ_OK : FZ_ENOMEM;
}
