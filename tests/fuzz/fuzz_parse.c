/*
 * fuzz_parse.c: a libFuzzer target for the trace parser.
 *
 * Every input must either parse or fail with a diagnostic that starts with
 * the file name; nothing may crash, hang, leak or read past the input's
 * end (libFuzzer hands over exactly `size` bytes, not NUL-terminated, so
 * ASan sees any over-read). What parses must print, and the printed text
 * must parse again to structurally equal traces: the printer and the
 * parser agree on the format. Any mismatch aborts, which libFuzzer keeps
 * as a crash artifact.
 *
 * Built and run by run.sh next to this file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusec.h"
#include "ir.h"

static void fail(const char *what, const char *text)
{
	fprintf(stderr, "fuzz_parse: %s\n%s\n", what, text ? text : "");
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse((const char *)data, size, "fuzz", &m, &diag);
	if (st != FZ_OK) {
		if (m)
			fail("a failed parse returned a module", diag);
		if (st != FZ_ENOMEM && (!diag || strncmp(diag, "fuzz:", 5) != 0))
			fail("a failed parse gave no diagnostic", diag);
		free(diag);
		return 0;
	}
	if (diag || !m || fz_module_count(m) < 1)
		fail("a successful parse without a module, or with a diagnostic",
		     diag);

	char *text = NULL;
	if (fz_module_print(m, &text) != FZ_OK || !text)
		fail("a parsed module does not print", NULL);
	fz_module *m2 = NULL;
	char *diag2 = NULL;
	if (fz_module_parse(text, strlen(text), "printed", &m2, &diag2) != FZ_OK) {
		fprintf(stderr, "%s", diag2 ? diag2 : "");
		fail("the printed module does not parse again", text);
	}
	if (fz_module_count(m2) != fz_module_count(m))
		fail("the printed module has another number of traces", text);
	for (int i = 0; i < fz_module_count(m); i++) {
		char why[256];
		if (!fz_trace_equal(fz_module_trace(m, i), fz_module_trace(m2, i),
				    why, sizeof why)) {
			fprintf(stderr, "trace %d: %s\n", i, why);
			fail("the printed module parses to another graph", text);
		}
	}
	fz_module_free(m2);
	fz_module_free(m);
	free(text);
	return 0;
}
