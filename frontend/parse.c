/*
 * parse.c: the trace text parser.
 *
 * This file turns the text of DESIGN.md's trace format into traces. It is a
 * hand-written lexer and a recursive-descent parser with one function per
 * grammar rule, the rule in a comment above it, as in chibicc:
 *
 *     trace rms(x: f32[B, 4096]) {         parse_trace, parse_param, parse_type
 *       y = mul(x, rsqrt(add(x, 1e-5)))    parse_stmt, parse_expr, parse_arg
 *       return y                           parse_return
 *     }
 *
 * The parser knows the syntax and nothing about ops. It builds the IR only
 * through the public builder (fz_param, fz_op, fz_name, fz_return), inner
 * expressions first, so `mul(x, rsqrt(add(x, 1e-5)))` makes the calls
 * fz_op("add") then fz_op("rsqrt") then fz_op("mul"). Which ops exist, how
 * many operands they take and which attributes they accept all come from the
 * op table through the builder; the parser only asks the table whether a
 * name is an op, to report an unknown one at its own token. Before each
 * builder call it stamps t->line and t->col, so every node remembers where
 * it was written.
 *
 * Lexing is done once, up front, into an array of tokens, because the
 * grammar needs a little look-ahead (`a, b = ...` starts a statement, `k=v`
 * is an attribute, `f(` is a call) and because error recovery wants to look
 * at whole lines. The input is a byte range, not a C string: it may hold
 * NUL bytes and need not end in a newline, and the lexer never reads past
 * its end. A byte that cannot start a token becomes a "bad" token that
 * carries its own message ("NUL byte in input"); the parser reports it when
 * it reaches it, so diagnostics come out in source order.
 *
 * Errors. Every diagnostic reads
 *
 *     model.trace:3:18: error: undefined value 'xs'
 *       y = mul(x, add(xs, 1))
 *                      ^
 *
 * with the source line echoed (tabs kept, so the caret lines up) and the
 * caret under the first byte of the offending token. Two kinds of error are
 * told apart. A syntax error (an unexpected token, a bad number) leaves the
 * parser lost inside a statement, so it skips to the next line that starts
 * a statement, a `return`, a `}` or a `trace`, and goes on. A semantic error
 * (an undefined value, an unknown op, a builder's type error) leaves the
 * syntax intact: the parser keeps reading the statement, just builds nothing
 * for it. The names a failed statement would have defined are "poisoned":
 * using them later fails silently rather than burying the first error
 * under a cascade of "undefined value" reports. After 20 errors the parser
 * says "too many errors" and stops. Any error means no module: everything
 * built is freed and the caller gets only the diagnostics.
 *
 * The status tells the two kinds apart too: FZ_EPARSE when any error was
 * lexical or syntactic, FZ_EVERIFY when the text was well formed but meant
 * something wrong (an undefined name, a type error, a failed verify).
 *
 * Beyond DESIGN.md's grammar the lexer reads what the printer writes for
 * values the grammar cannot spell: `inf`, `-inf` and `nan` are numbers, and
 * inside an attribute a product of extents, `shape=[B*T, 4096]`, becomes
 * the one name "B*T" that the builder reads as an extent.
 *
 * Extents may be sums of products, in a parameter's type and in an
 * attribute alike, which extends DESIGN.md's grammar:
 *
 *     dim    := ['-'] prod (('+' | '-') prod)*     # B*T, T+1, B*T-B, 2*T
 *     prod   := term ('*' term)*
 *     term   := INT | NAME
 *
 *     trace shift(x: f32[B, T+1]) {
 *       y = slice(x, start=[0, 1], end=[B, T+1])    # f32[B, T]
 *       ...
 *
 * `T-1` lexes as NAME and the signed INT `-1`; the parser takes that INT as
 * the operator and the next term at once. The extent's tokens become one
 * name without spaces, "B*T-B", read by fz_trace_ext_parse (ir/type.c): a
 * sum is a derived symbol, sized at run time from the free ones.
 *
 * Limits are checked before they can hurt: nesting (of calls and of lists)
 * beyond MAX_DEPTH is an error raised before recursing, so 100000 nested
 * `neg(` cost no stack; integers that overflow int64 and numbers beyond the
 * range of a double are errors, not wrapped values.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "ir.h"

#define MAX_ERRORS 20
#define MAX_DEPTH 200
#define MAX_INPUT_BYTES ((size_t)1 << 30)

/* ---- Tokens --------------------------------------------------------------- */

typedef enum tkind {
	TK_NAME,   /* identifiers; keywords, dtypes, true/false are NAMEs */
	TK_INT,    /* an integer literal, optionally signed */
	TK_NUMBER, /* a literal with a fraction or an exponent */
	TK_PUNCT,  /* one of ( ) [ ] { } , = : * + - */
	TK_BAD,    /* a byte that starts no token, or a malformed number */
	TK_EOF,
} tkind;

/* 40 bytes: a 32-layer Llama has 146k tokens, and memory first touched
 * costs a page fault (offsets fit 32 bits: input is at most 1 GiB) */
typedef struct token {
	uint32_t pos, len;  /* bytes src[pos..pos+len) */
	uint32_t line_start; /* offset of the first byte of its line */
	int line, col;      /* 1-based; col counts bytes */
	unsigned char kind; /* tkind */
	bool bol;           /* the first token on its line */
	bool overflow;      /* INT beyond int64, NUMBER beyond double */
	int64_t i;          /* TK_INT */
	double f;           /* TK_INT and TK_NUMBER */
} token;
_Static_assert(sizeof(token) <= 40, "token grew");

/* A name bound in the current trace: where it was defined, or that the
 * statement defining it failed. */
typedef struct binding {
	const char *name;
	int line;
	bool poisoned;
	fz_value *value;    /* what the name is bound to (NULL: poisoned) */
} binding;

typedef struct parser {
	const char *src;
	size_t len;
	const char *file;

	token *toks;
	size_t ntoks, cap_toks, pos;
	/* a big input lexed in two halves: tokens n1 and after are in toks2
	 * (tok_at), where the second half's thread wrote them */
	token *toks2;
	size_t n1;
	size_t toks_mapped, toks2_mapped; /* fz_huge_alloc'd, or 0: malloc */

	char *diag;
	size_t diag_len, diag_cap;
	int nerrors;
	bool syntax_errors;  /* some error was lexical or syntactic */
	bool stop;           /* too many errors, or out of memory */
	bool oom;

	fz_module *mod;
	int *trace_lines;    /* where each trace of mod was declared */

	/* The trace being parsed. */
	fz_trace *t;
	bool t_failed;       /* an error inside it: no return, no verify */
	bool header_failed;  /* its parameter list was broken: names unknown */
	fz_arena scratch;    /* C strings of names, attribute lists; per trace */
	binding *binds;
	size_t nbinds, cap_binds; /* open addressing, cap a power of two */
	size_t binds_mapped;      /* fz_huge_alloc'd bytes, or 0: calloc */
	size_t binds_hint;        /* the cap to start with (from the text) */
	int depth;
} parser;

/* ---- Diagnostics ---------------------------------------------------------- */

static void diag_put(parser *P, const char *s, size_t n)
{
	if (P->oom)
		return;
	if (P->diag_len + n + 1 > P->diag_cap) {
		size_t cap = P->diag_cap ? P->diag_cap : 256;
		while (cap < P->diag_len + n + 1)
			cap *= 2;
		char *p = realloc(P->diag, cap);
		if (!p) {
			P->oom = P->stop = true;
			return;
		}
		P->diag = p;
		P->diag_cap = cap;
	}
	memcpy(P->diag + P->diag_len, s, n);
	P->diag_len += n;
	P->diag[P->diag_len] = '\0';
}

static void diag_puts(parser *P, const char *s) { diag_put(P, s, strlen(s)); }

static void diag_char(parser *P, char c) { diag_put(P, &c, 1); }

/* Echoes the line of `tk` and puts a caret under its first byte. A very long
 * line is shown as a window around the token, marked with "...". */
static void diag_show(parser *P, const token *tk)
{
	size_t from = tk->line_start, end = tk->line_start;
	while (end < P->len && P->src[end] != '\n')
		end++;
	if (end > from && P->src[end - 1] == '\r')
		end--;
	if (tk->pos > end)
		end = tk->pos;
	bool lcut = false, rcut = false;
	if (tk->pos - from > 100) {
		from = tk->pos - 60;
		lcut = true;
	}
	size_t to = end;
	if (to - from > 200) {
		to = from + 200;
		rcut = true;
	}
	if (lcut)
		diag_puts(P, "...");
	for (size_t i = from; i < to; i++) {
		unsigned char c = (unsigned char)P->src[i];
		diag_char(P, c == '\t' ? '\t' : c < 0x20 || c == 0x7f ? ' ' : (char)c);
	}
	if (rcut)
		diag_puts(P, "...");
	diag_char(P, '\n');
	if (lcut)
		diag_puts(P, "   ");
	for (size_t i = from; i < tk->pos; i++)
		diag_char(P, P->src[i] == '\t' ? '\t' : ' ');
	diag_puts(P, "^\n");
}

static void diag_emit(parser *P, const token *tk, const char *msg)
{
	char head[128];
	diag_puts(P, P->file);
	snprintf(head, sizeof head, ":%d:%d: error: ", tk->line, tk->col);
	diag_puts(P, head);
	diag_puts(P, msg);
	diag_char(P, '\n');
	diag_show(P, tk);
}

static void verror_at(parser *P, bool syntax, const token *tk, const char *fmt,
                      va_list ap)
{
	if (P->stop)
		return;
	if (P->t)
		P->t_failed = true;
	if (syntax)
		P->syntax_errors = true;
	if (P->nerrors == MAX_ERRORS) {
		diag_emit(P, tk, "too many errors; stopping");
		P->stop = true;
		return;
	}
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	diag_emit(P, tk, msg);
	P->nerrors++;
}

/* A syntax error: the parser must resynchronize after it. Returns false. */
__attribute__((format(printf, 3, 4)))
static bool syntax_error(parser *P, const token *tk, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror_at(P, true, tk, fmt, ap);
	va_end(ap);
	return false;
}

/* A semantic error: the text is well formed, its meaning is not. */
__attribute__((format(printf, 3, 4)))
static void sem_error(parser *P, const token *tk, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror_at(P, false, tk, fmt, ap);
	va_end(ap);
}

/* The bytes of a token for a message: quoted, and cut if long. */
static const char *tok_quote(const parser *P, const token *tk, char *buf,
                             size_t n)
{
	if (tk->kind == TK_EOF)
		return "end of file";
	int len = tk->len > 40 ? 40 : (int)tk->len;
	snprintf(buf, n, "'%.*s%s'", len, P->src + tk->pos,
		 tk->len > 40 ? "..." : "");
	return buf;
}

/* What a bad token is: the first offending byte, or a malformed number. */
static bool bad_token(parser *P, const token *tk)
{
	unsigned char c = (unsigned char)P->src[tk->pos];
	char q[64];
	if ((c >= '0' && c <= '9') || c == '-' || c == '+')
		return syntax_error(P, tk, "bad number %s",
				    tok_quote(P, tk, q, sizeof q));
	if (c == 0)
		return syntax_error(P, tk, "NUL byte in input");
	if (c < 0x20 || c >= 0x7f)
		return syntax_error(P, tk, "invalid byte 0x%02x in input", c);
	return syntax_error(P, tk, "unexpected character '%c'", c);
}

/* "expected X, found Y", or the lexer's own complaint about Y. */
static bool expected(parser *P, const token *tk, const char *what)
{
	if (tk->kind == TK_BAD)
		return bad_token(P, tk);
	char q[64];
	return syntax_error(P, tk, "expected %s, found %s", what,
			    tok_quote(P, tk, q, sizeof q));
}

/* ---- Lexer ---------------------------------------------------------------- */

static bool is_alpha(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

static bool is_punct(int c) { return c && strchr("()[]{},=:*+-", c) != NULL; }

static bool is_space(int c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' ||
	       c == '\v';
}

/* Whether src[i..len) begins with the whole word w. */
static bool is_word(const char *s, size_t i, size_t len, const char *w)
{
	size_t n = strlen(w);
	return len - i >= n && memcmp(s + i, w, n) == 0 &&
	       (i + n == len || !(is_alpha(s[i + n]) || is_digit(s[i + n])));
}

static token *new_token(parser *P)
{
	if (P->ntoks == P->cap_toks) {
		size_t cap = P->cap_toks ? P->cap_toks * 2 : 256;
		/* (a mapped buffer is sized to its bound and never fills; were
		 * it to, it moves to the heap) */
		token *p = P->toks_mapped ? malloc(cap * sizeof *p) :
			   realloc(P->toks, cap * sizeof *p);
		if (!p) {
			P->oom = P->stop = true;
			return NULL;
		}
		if (P->toks_mapped) {
			memcpy(p, P->toks, P->ntoks * sizeof *p);
			fz_huge_free(P->toks, P->toks_mapped);
			P->toks_mapped = 0;
		}
		P->toks = p;
		P->cap_toks = cap;
	}
	token *tk = &P->toks[P->ntoks++];
	memset(tk, 0, sizeof *tk);
	return tk;
}

/* Checks a number's bytes against
 *     [+-]? digit+ ('.' digit*)? ([eE] [+-]? digit+)?
 * and gives its kind and value. */
static void lex_number(parser *P, token *tk)
{
	const char *s = P->src + tk->pos;
	size_t n = tk->len, i = 0;
	bool neg = false, frac = false, exp = false;
	if (s[i] == '+' || s[i] == '-')
		neg = s[i++] == '-';
	size_t d0 = i;
	while (i < n && is_digit(s[i]))
		i++;
	if (i == d0)
		goto bad;
	if (i < n && s[i] == '.') {
		frac = true;
		i++;
		while (i < n && is_digit(s[i]))
			i++;
	}
	if (i < n && (s[i] == 'e' || s[i] == 'E')) {
		exp = true;
		i++;
		if (i < n && (s[i] == '+' || s[i] == '-'))
			i++;
		size_t e0 = i;
		while (i < n && is_digit(s[i]))
			i++;
		if (i == e0)
			goto bad;
	}
	if (i != n)
		goto bad;

	if (!frac && !exp) {
		tk->kind = TK_INT;
		uint64_t mag = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : INT64_MAX;
		for (i = d0; i < n; i++) {
			unsigned d = (unsigned)(s[i] - '0');
			if (mag > (lim - d) / 10) {
				tk->overflow = true;
				break;
			}
			mag = mag * 10 + d;
		}
		if (!tk->overflow)
			tk->i = neg ? (int64_t)(0 - mag) : (int64_t)mag;
		tk->f = neg ? -(double)mag : (double)mag;
		return;
	}

	tk->kind = TK_NUMBER;
	char small[64], *buf = small;
	if (n >= sizeof small && !(buf = malloc(n + 1))) {
		P->oom = P->stop = true;
		return;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	errno = 0;
	double v = strtod(buf, NULL);
	if (errno == ERANGE && (v > 1.0 || v < -1.0))
		tk->overflow = true;
	tk->f = v;
	if (buf != small)
		free(buf);
	return;
bad:
	tk->kind = TK_BAD;
}

/* Splits src[from..to) into tokens appended to P's, src[from] being the
 * first byte of line `line` (and `to` the end or a line's first byte: no
 * token spans a newline). */
static void lex_range(parser *P, size_t from, size_t to, int line)
{
	const char *s = P->src;
	size_t len = to, i = from, line_start = from;
	bool bol = true;

	while (i < len && !P->stop) {
		unsigned char c = (unsigned char)s[i];
		if (c == '\n') {
			i++;
			line++;
			line_start = i;
			bol = true;
			continue;
		}
		if (is_space(c)) {
			i++;
			continue;
		}
		if (c == '#') {
			/* A comment runs to the end of the line; a NUL inside
			 * it is still an error, so that no byte goes unread. */
			while (i < len && s[i] != '\n') {
				if (s[i] == '\0')
					break;
				i++;
			}
			if (i < len && s[i] == '\0') {
				token *tk = new_token(P);
				if (!tk)
					return;
				tk->kind = TK_BAD;
				tk->pos = i;
				tk->len = 1;
				tk->line_start = line_start;
				tk->line = line;
				tk->col = (int)(i - line_start + 1);
				tk->bol = bol;
				bol = false;
				/* Skip the rest of the comment. */
				while (i < len && s[i] != '\n')
					i++;
			}
			continue;
		}

		token *tk = new_token(P);
		if (!tk)
			return;
		tk->pos = i;
		tk->line_start = line_start;
		tk->line = line;
		tk->col = (int)(i - line_start + 1);
		tk->bol = bol;
		bol = false;

		if ((c == '-' || c == '+') && is_word(s, i + 1, len, "inf")) {
			/* -inf and +inf, as the printer writes infinities */
			i += 4;
			tk->kind = TK_NUMBER;
			tk->f = c == '-' ? -HUGE_VAL : HUGE_VAL;
		} else if (is_alpha(c)) {
			while (i < len && (is_alpha(s[i]) || is_digit(s[i])))
				i++;
			tk->kind = TK_NAME;
			if (i - tk->pos == 3 && (is_word(s, tk->pos, len, "inf") ||
						 is_word(s, tk->pos, len, "nan"))) {
				tk->kind = TK_NUMBER;
				tk->f = c == 'i' ? HUGE_VAL : NAN;
			}
		} else if (is_digit(c) ||
			   ((c == '-' || c == '+') && i + 1 < len &&
			    is_digit(s[i + 1]))) {
			/* Take the whole run that could belong to a number,
			 * so that `12abc` is one bad number, not two tokens. */
			size_t j = i + 1;
			while (j < len) {
				char d = s[j];
				if (is_alpha(d) || is_digit(d) || d == '.')
					j++;
				else if ((d == '+' || d == '-') &&
					 (s[j - 1] == 'e' || s[j - 1] == 'E'))
					j++;
				else
					break;
			}
			tk->len = j - i;
			lex_number(P, tk);
			i = j;
			continue;
		} else if (is_punct(c)) {
			i++;
			tk->kind = TK_PUNCT;
		} else {
			/* A run of bytes that start nothing: one token, named
			 * by its first byte. */
			i++;
			while (i < len && !is_space(s[i]) && !is_alpha(s[i]) &&
			       !is_digit(s[i]) && !is_punct(s[i]) &&
			       s[i] != '#' && s[i] != '\0' && s[i - 1] != '\0')
				i++;
			tk->kind = TK_BAD;
		}
		tk->len = i - tk->pos;
	}
}

/* The second half of a big input, lexed on a thread of its own. */
typedef struct lex_half {
	parser Q;            /* its own tokens and oom flag; src as P's */
	size_t from;
} lex_half;

static void *lex_half_run(void *arg)
{
	lex_half *h = arg;
	int line = 1;
	for (const char *p = h->Q.src, *end = h->Q.src + h->from;
	     (p = memchr(p, '\n', (size_t)(end - p))); p++)
		line++;
	lex_range(&h->Q, h->from, h->Q.len, line);
	return NULL;
}

/* Inputs past this many bytes (a deep model's step: 574 KB for 32 layers)
 * are lexed in two halves at once, split at a line: a token never spans
 * one, so the halves' tokens, put end to end, are the whole input's. */
#define LEX_SPLIT_BYTES (256 << 10)

static token *tok_at(parser *P, size_t i)
{
	return P->toks2 && i >= P->n1 ? &P->toks2[i - P->n1] : &P->toks[i];
}

/* Splits src[0..len) into tokens, ending with one TK_EOF. */
static void lex(parser *P)
{
	const char *nl = P->len >= LEX_SPLIT_BYTES ?
			 memchr(P->src + P->len / 2, '\n', P->len - P->len / 2) : NULL;
	size_t split = nl ? (size_t)(nl - P->src) + 1 : P->len;
	lex_half h = {.from = split};
	pthread_t th;
	bool two = false;
	if (split < P->len) {
		/* every token takes a byte: the half's tokens fit, and the
		 * pages the thread does not write are never touched */
		h.Q.src = P->src;
		h.Q.len = P->len;
		h.Q.cap_toks = P->len - split + 1;
		h.Q.toks = fz_huge_alloc(h.Q.cap_toks * sizeof(token),
					 &h.Q.toks_mapped);
		two = h.Q.toks && pthread_create(&th, NULL, lex_half_run, &h) == 0;
		if (!two) {
			fz_huge_free(h.Q.toks, h.Q.toks_mapped);
			split = P->len;
		}
	}
	/* every token takes a byte, so split + 1 tokens hold the first half
	 * and the end: one buffer, in huge pages, never grown (a page fault
	 * per 4 KiB of tokens was a fifth of lexing) */
	if (split >= LEX_SPLIT_BYTES / 2) {
		token *t = fz_huge_alloc((split + 1) * sizeof(token), &P->toks_mapped);
		if (t) {
			P->toks = t;
			P->cap_toks = split + 1;
		}
	}
	lex_range(P, 0, split, 1);
	token *eof;
	if (two) {
		/* the second half's tokens stay where its thread wrote them
		 * (copying them would fault in as many pages again) */
		pthread_join(th, NULL);
		P->n1 = P->ntoks;
		P->toks2 = h.Q.toks;
		P->toks2_mapped = h.Q.toks_mapped;
		P->ntoks += h.Q.ntoks;
		if (h.Q.oom || P->oom) {
			P->oom = P->stop = true;
			return;
		}
		eof = &P->toks2[h.Q.ntoks]; /* room: cap is one past the bytes */
		memset(eof, 0, sizeof *eof);
		P->ntoks++;
	} else {
		if (P->stop)
			return;
		eof = new_token(P);
		if (!eof)
			return;
	}
	eof->kind = TK_EOF;
	eof->line = 1;
	eof->col = 1;
	if (P->ntoks > 1) {
		/* Just past the last token: "expected ')', found end of
		 * file" points where the ')' should have been. */
		const token *last = tok_at(P, P->ntoks - 2);
		eof->pos = last->pos + last->len;
		eof->line_start = last->line_start;
		eof->line = last->line;
		eof->col = last->col + (int)last->len;
	}
}

/* ---- Token helpers -------------------------------------------------------- */

static token *peek_at(parser *P, size_t k)
{
	size_t i = P->pos + k;
	if (P->stop || i >= P->ntoks)
		i = P->ntoks - 1;
	return tok_at(P, i);
}

static token *peek(parser *P) { return peek_at(P, 0); }

static token *next(parser *P)
{
	token *tk = peek(P);
	if (tk->kind != TK_EOF)
		P->pos++;
	return tk;
}

static bool punct_is(const parser *P, const token *tk, char c)
{
	return tk->kind == TK_PUNCT && P->src[tk->pos] == c;
}

static bool name_is(const parser *P, const token *tk, const char *kw)
{
	size_t n = strlen(kw);
	return tk->kind == TK_NAME && tk->len == n &&
	       memcmp(P->src + tk->pos, kw, n) == 0;
}

/* Consumes punctuation c, or reports what was found instead. */
static bool expect(parser *P, char c, const char *what)
{
	token *tk = peek(P);
	if (punct_is(P, tk, c)) {
		next(P);
		return true;
	}
	return expected(P, tk, what);
}

/* A token's bytes as a C string in the scratch arena. */
static const char *tok_str(parser *P, const token *tk)
{
	char *p = fz_arena_alloc(&P->scratch, tk->len + 1);
	if (!p) {
		P->oom = P->stop = true;
		return "";
	}
	memcpy(p, P->src + tk->pos, tk->len);
	p[tk->len] = '\0';
	return p;
}

static void stamp(parser *P, const token *tk)
{
	P->t->line = tk->line;
	P->t->col = tk->col;
}

/* ---- Names of the current trace ------------------------------------------- */

/* XXH3: a Llama's names are 30 to 60 bytes, which a byte-at-a-time hash
 * walks at a few instructions a byte */
static size_t hash_mem(const char *s, size_t n)
{
	return (size_t)XXH3_64bits(s, n);
}

static size_t hash_str(const char *s) { return hash_mem(s, strlen(s)); }

/* The binding of the n bytes at name (no terminator needed), or NULL: a
 * use of a name looks it up where it lies in the source, with no copy. */
static binding *bind_find_n(parser *P, const char *name, size_t n)
{
	if (!P->cap_binds)
		return NULL;
	size_t m = P->cap_binds - 1;
	for (size_t i = hash_mem(name, n) & m;; i = (i + 1) & m) {
		const char *b = P->binds[i].name;
		if (!b)
			return NULL;
		if (strncmp(b, name, n) == 0 && b[n] == '\0')
			return &P->binds[i];
	}
}

static binding *bind_find(parser *P, const char *name)
{
	return bind_find_n(P, name, strlen(name));
}

/* Records name (a scratch string) as defined at line as value v, or as
 * poisoned (v NULL). */
static void binds_free(parser *P)
{
	if (P->binds_mapped)
		fz_huge_free(P->binds, P->binds_mapped);
	else
		free(P->binds);
	P->binds = NULL;
	P->binds_mapped = 0;
}

static void bind_add(parser *P, const char *name, int line, fz_value *v)
{
	bool poisoned = v == NULL;
	binding *b = bind_find(P, name);
	if (b) {
		if (b->poisoned && !poisoned) /* defined again after an error */
			*b = (binding){name, line, false, v};
		return;
	}
	if (2 * (P->nbinds + 1) > P->cap_binds) {
		size_t cap = P->cap_binds ? 2 * P->cap_binds :
			     P->binds_hint > 64 ? P->binds_hint : 64;
		/* a big table in huge pages: its slots are touched all over */
		size_t mapped = 0;
		binding *nb = cap * sizeof *nb >= ((size_t)1 << 20) ?
			      fz_huge_alloc(cap * sizeof *nb, &mapped) : NULL;
		if (!nb)
			nb = calloc(cap, sizeof *nb);
		if (!nb) {
			P->oom = P->stop = true;
			return;
		}
		for (size_t i = 0; i < P->cap_binds; i++) {
			if (!P->binds[i].name)
				continue;
			size_t j = hash_str(P->binds[i].name) & (cap - 1);
			while (nb[j].name)
				j = (j + 1) & (cap - 1);
			nb[j] = P->binds[i];
		}
		binds_free(P);
		P->binds = nb;
		P->binds_mapped = mapped;
		P->cap_binds = cap;
	}
	size_t j = hash_str(name) & (P->cap_binds - 1);
	while (P->binds[j].name)
		j = (j + 1) & (P->cap_binds - 1);
	P->binds[j] = (binding){name, line, poisoned, v};
	P->nbinds++;
}

/* Checks that the name at tk is free to define. */
static bool check_new_name(parser *P, const token *tk, const char *name)
{
	binding *b = bind_find(P, name);
	if (!b || b->poisoned)
		return true;
	char q[64];
	sem_error(P, tk, "redefinition of %s (first defined at line %d)",
		  tok_quote(P, tk, q, sizeof q), b->line);
	return false;
}

/* The value named at tk, or NULL: reported as undefined unless an earlier
 * error explains its absence. */
static fz_value *use_name(parser *P, const token *tk)
{
	binding *b = bind_find_n(P, P->src + tk->pos, tk->len);
	if (b && b->poisoned)
		return NULL;
	fz_value *v = b ? b->value : NULL;
	if (!v && !P->header_failed) {
		char q[64];
		sem_error(P, tk, "undefined value %s",
			  tok_quote(P, tk, q, sizeof q));
	}
	return v;
}

/* ---- Growing arrays for one call ------------------------------------------ */

typedef struct vec {
	void *data;
	int n, cap;
	size_t size;
} vec;

static void *vec_push(parser *P, vec *v)
{
	if (v->n == v->cap) {
		int cap = v->cap ? 2 * v->cap : 8;
		void *p = realloc(v->data, (size_t)cap * v->size);
		if (!p) {
			P->oom = P->stop = true;
			return NULL;
		}
		v->data = p;
		v->cap = cap;
	}
	void *slot = (char *)v->data + (size_t)v->n++ * v->size;
	memset(slot, 0, v->size);
	return slot;
}

/* ---- Parser --------------------------------------------------------------- */

/* Whether the op table has an op of this name (primitive or composite). */
static bool is_op(const char *name)
{
	fz_opcode op;
	return fz_op_from_name(name, &op);
}

/* A signed integer token: "-1" in T-1 is the operator and a factor. */
static bool signed_int(const parser *P, const token *tk)
{
	return tk->kind == TK_INT && (P->src[tk->pos] == '-' ||
				      P->src[tk->pos] == '+');
}

/* Whether the token after an extent's first factor continues it. */
static bool ext_continues(parser *P, const token *tk)
{
	return punct_is(P, tk, '*') || punct_is(P, tk, '+') ||
	       punct_is(P, tk, '-') || signed_int(P, tk);
}

/* An extent that is more than one token, a product or a sum of products:
 *     ext    := ['-'] factor ('*' factor)* (sign factor ('*' factor)*)*
 *     sign   := '+' | '-'            (or the sign of an INT: T-1, B*T+2)
 *     factor := INT | NAME
 * as the printer writes a reshaped extent (B*T), a derived one (T+1,
 * B*T-B) or a shape. It becomes one NAME value, "B*T-B" without spaces,
 * which the builder reads as an extent (fz_trace_ext_parse). Nothing is
 * consumed yet. */
static bool parse_extent(parser *P, const char **out)
{
	size_t first = P->pos, n = 0;
	bool want_factor = true;
	if (punct_is(P, peek(P), '-'))
		next(P);
	for (;;) {
		token *tk = peek(P);
		if (want_factor) {
			if (!(tk->kind == TK_NAME || (tk->kind == TK_INT &&
			      !tk->overflow && (P->pos == first || !signed_int(P, tk)))))
				return expected(P, tk, "an extent (an integer or a "
						"name)");
			next(P);
			want_factor = false;
			continue;
		}
		if (signed_int(P, tk) && !tk->overflow) {
			next(P); /* sign and factor at once */
			continue;
		}
		if (punct_is(P, tk, '*') || punct_is(P, tk, '+') ||
		    punct_is(P, tk, '-')) {
			next(P);
			want_factor = true;
			continue;
		}
		break;
	}
	for (size_t i = first; i < P->pos; i++)
		n += tok_at(P, i)->len;
	char *s = fz_arena_alloc(&P->scratch, n + 1);
	if (!s) {
		P->oom = P->stop = true;
		return false;
	}
	size_t k = 0;
	for (size_t i = first; i < P->pos; i++) {
		const token *tk = tok_at(P, i);
		memcpy(s + k, P->src + tk->pos, tk->len);
		k += tk->len;
	}
	s[k] = '\0';
	*out = s;
	return true;
}

static int parse_expr(parser *P, fz_value **outs, int max_outs);

/* Whether the tokens from P->pos + k look like the start of a statement:
 *     NAME (',' NAME)* '=' NAME '('
 * Error recovery uses it to find where the next statement begins. */
static bool looks_like_stmt(parser *P, size_t k)
{
	if (peek_at(P, k)->kind != TK_NAME)
		return false;
	for (int names = 0; names < 64; names++) {
		token *tk = peek_at(P, ++k);
		if (punct_is(P, tk, '='))
			return peek_at(P, k + 1)->kind == TK_NAME &&
			       punct_is(P, peek_at(P, k + 2), '(');
		if (!punct_is(P, tk, ',') || peek_at(P, ++k)->kind != TK_NAME)
			return false;
	}
	return false;
}

static bool at_trace_start(parser *P)
{
	token *tk = peek(P);
	return tk->bol && name_is(P, tk, "trace") &&
	       peek_at(P, 1)->kind == TK_NAME && punct_is(P, peek_at(P, 2), '(');
}

/* After a syntax error in a statement begun at token `start`: skips to the
 * next line that begins a statement, a return or a trace, or to a '}'. */
static void recover_stmt(parser *P, size_t start)
{
	for (;;) {
		token *tk = peek(P);
		if (tk->kind == TK_EOF || punct_is(P, tk, '}'))
			return;
		if (tk->bol && P->pos > start &&
		    (looks_like_stmt(P, 0) || name_is(P, tk, "return") ||
		     at_trace_start(P)))
			return;
		next(P);
	}
}

/* value := NUMBER | NAME | DTYPE | 'true' | 'false'
 *        | '[' (value (',' value)*)? ']' | ext
 * Returns false on a syntax error; *ok turns false on a semantic one. */
static bool parse_value(parser *P, const char *key, fz_attr_value *out,
                        bool *ok)
{
	token *tk = peek(P);
	char q[64];

	if (((tk->kind == TK_NAME || (tk->kind == TK_INT && !tk->overflow)) &&
	     ext_continues(P, peek_at(P, 1))) ||
	    (punct_is(P, tk, '-') && peek_at(P, 1)->kind == TK_NAME)) {
		out->kind = FZ_AV_NAME;
		return parse_extent(P, &out->name);
	}
	if (tk->kind == TK_INT) {
		next(P);
		if (tk->overflow) {
			sem_error(P, tk, "integer %s out of range",
				  tok_quote(P, tk, q, sizeof q));
			*ok = false;
		}
		out->kind = FZ_AV_INT;
		out->i = tk->i;
		return true;
	}
	if (tk->kind == TK_NUMBER) {
		next(P);
		if (tk->overflow) {
			sem_error(P, tk, "number %s out of range",
				  tok_quote(P, tk, q, sizeof q));
			*ok = false;
		}
		out->kind = FZ_AV_FLOAT;
		out->f = tk->f;
		return true;
	}
	if (tk->kind == TK_NAME) {
		next(P);
		const char *name = tok_str(P, tk);
		fz_dtype d;
		if (strcmp(name, "true") == 0 || strcmp(name, "false") == 0) {
			out->kind = FZ_AV_BOOL;
			out->i = name[0] == 't';
		} else if (fz_dtype_from_name(name, &d)) {
			out->kind = FZ_AV_DTYPE;
			out->i = d;
		} else if (strcmp(key, "dtype") == 0) {
			sem_error(P, tk, "unknown dtype %s",
				  tok_quote(P, tk, q, sizeof q));
			*ok = false;
		} else {
			out->kind = FZ_AV_NAME;
			out->name = name;
		}
		return true;
	}
	if (!punct_is(P, tk, '['))
		return expected(P, tk, "a value (a number, a name or a list)");

	if (P->depth + 1 >= MAX_DEPTH)
		return syntax_error(P, tk, "list nested too deeply (more than "
				    "%d levels)", MAX_DEPTH);
	next(P);
	vec items = {.size = sizeof(fz_attr_value)};
	bool good = true;
	P->depth++;
	if (!punct_is(P, peek(P), ']')) {
		for (;;) {
			fz_attr_value *item = vec_push(P, &items);
			if (!item || !parse_value(P, key, item, ok)) {
				good = false;
				break;
			}
			if (punct_is(P, peek(P), ']'))
				break;
			if (!expect(P, ',', "',' or ']' in a list")) {
				good = false;
				break;
			}
		}
	}
	P->depth--;
	if (good)
		next(P); /* ']' */
	out->kind = FZ_AV_LIST;
	out->n = items.n;
	if (good && items.n) {
		size_t bytes = (size_t)items.n * sizeof(fz_attr_value);
		fz_attr_value *copy = fz_arena_alloc(&P->scratch, bytes);
		if (copy)
			memcpy(copy, items.data, bytes);
		else
			P->oom = P->stop = true, good = false;
		out->items = copy;
	}
	free(items.data);
	return good;
}

/* arg := expr | NAME | NUMBER | KEY '=' value
 * An operand goes to args, an attribute to attrs. Returns false on a
 * syntax error; *ok turns false on a semantic one. */
static bool parse_arg(parser *P, vec *args, vec *attrs, bool *ok)
{
	token *tk = peek(P);
	char q[64];

	if (tk->kind == TK_NAME && punct_is(P, peek_at(P, 1), '=')) {
		next(P);
		next(P);
		const char *key = tok_str(P, tk);
		fz_attr_id id;
		if (!fz_attr_from_name(key, &id)) {
			sem_error(P, tk, "unknown attribute %s",
				  tok_quote(P, tk, q, sizeof q));
			*ok = false;
		}
		for (int i = 0; i < attrs->n; i++) {
			if (strcmp(((fz_attr *)attrs->data)[i].key, key) == 0) {
				sem_error(P, tk, "attribute %s given twice",
					  tok_quote(P, tk, q, sizeof q));
				*ok = false;
				break;
			}
		}
		fz_attr *a = vec_push(P, attrs);
		if (!a)
			return false;
		a->key = key;
		return parse_value(P, key, &a->value, ok);
	}

	if (tk->kind == TK_NAME && punct_is(P, peek_at(P, 1), '(')) {
		if (P->depth + 1 >= MAX_DEPTH)
			return syntax_error(P, tk, "expression nested too deeply"
					    " (more than %d levels)", MAX_DEPTH);
		P->depth++;
		fz_value *v = NULL;
		int n = parse_expr(P, &v, 1);
		P->depth--;
		if (n < 0)
			return false;
		if (n == 0)
			*ok = false;
		fz_arg *a = vec_push(P, args);
		if (!a)
			return false;
		*a = fz_arg_value(v);
		return true;
	}

	if (tk->kind == TK_NAME) {
		next(P);
		fz_value *v = use_name(P, tk);
		if (!v)
			*ok = false;
		fz_arg *a = vec_push(P, args);
		if (!a)
			return false;
		*a = fz_arg_value(v);
		return true;
	}

	if (tk->kind == TK_INT || tk->kind == TK_NUMBER) {
		next(P);
		if (tk->overflow) {
			sem_error(P, tk, "%s %s out of range",
				  tk->kind == TK_INT ? "integer" : "number",
				  tok_quote(P, tk, q, sizeof q));
			*ok = false;
		}
		fz_arg *a = vec_push(P, args);
		if (!a)
			return false;
		*a = tk->kind == TK_INT ? fz_arg_int(tk->i) : fz_arg_number(tk->f);
		return true;
	}

	return expected(P, tk, "an operand or an attribute");
}

/* expr := OP '(' (arg (',' arg)*)? ')'
 * Builds the op (after its operands) and stores its results in outs.
 * Returns how many there are, 0 after a semantic error (reported, or
 * explained by an earlier one), -1 after a syntax error. */
static int parse_expr(parser *P, fz_value **outs, int max_outs)
{
	token *op = peek(P);
	char q[64];

	if (op->kind != TK_NAME)
		return expected(P, op, "an op name"), -1;
	if (!punct_is(P, peek_at(P, 1), '('))
		return expected(P, peek_at(P, 1), "'(' after the op name"), -1;
	next(P);
	next(P);

	const char *name = tok_str(P, op);
	bool ok = true;
	if (!is_op(name)) {
		sem_error(P, op, "unknown op %s", tok_quote(P, op, q, sizeof q));
		ok = false;
	}

	vec args = {.size = sizeof(fz_arg)};
	vec attrs = {.size = sizeof(fz_attr)};
	int result = -1;
	if (!punct_is(P, peek(P), ')')) {
		for (;;) {
			if (!parse_arg(P, &args, &attrs, &ok))
				goto out;
			if (punct_is(P, peek(P), ')'))
				break;
			if (!expect(P, ',', "',' or ')' after an argument"))
				goto out;
		}
	}
	next(P); /* ')' */

	result = 0;
	if (!ok || P->stop)
		goto out;
	if (args.n > FZ_MAX_ARGS) {
		sem_error(P, op, "too many operands (%d; at most %d)", args.n,
			  FZ_MAX_ARGS);
		goto out;
	}
	fz_value *res[8] = {0};
	stamp(P, op);
	int n = fz_op(P->t, name, args.data, args.n, attrs.data, attrs.n, res, 8);
	if (n < 0) {
		sem_error(P, op, "%s", fz_trace_error(P->t));
		goto out;
	}
	if (n == 0 || n > 8) {
		sem_error(P, op, "op %s gave %d results", tok_quote(P, op, q,
			  sizeof q), n);
		goto out;
	}
	if (max_outs == 1 && n != 1) {
		sem_error(P, op, "op %s returns %d values; only an op with one "
			  "result can be nested", tok_quote(P, op, q, sizeof q), n);
		goto out;
	}
	for (int i = 0; i < n && i < max_outs; i++)
		outs[i] = res[i];
	result = n;
out:
	free(args.data);
	free(attrs.data);
	return result;
}

/* stmt := NAME (',' NAME)* '=' expr */
static bool parse_stmt(parser *P)
{
	vec names = {.size = sizeof(token *)};
	bool ok = true, good = false;

	for (;;) {
		token *tk = peek(P);
		if (tk->kind != TK_NAME) {
			expected(P, tk, names.n ? "a name after ','" :
				 "a statement ('name = op(...)') or 'return'");
			goto out;
		}
		next(P);
		token **slot = vec_push(P, &names);
		if (!slot)
			goto out;
		*slot = tk;
		if (!punct_is(P, peek(P), ','))
			break;
		next(P);
	}
	if (!expect(P, '=', "'=' or ',' after a name"))
		goto out;

	token **lhs = names.data;
	for (int i = 0; i < names.n; i++) {
		const char *name = tok_str(P, lhs[i]);
		if (!check_new_name(P, lhs[i], name))
			ok = false;
		for (int j = 0; j < i && ok; j++) {
			if (lhs[j]->len == lhs[i]->len &&
			    memcmp(P->src + lhs[j]->pos, P->src + lhs[i]->pos,
				   lhs[i]->len) == 0) {
				char q[64];
				sem_error(P, lhs[i], "%s is bound twice",
					  tok_quote(P, lhs[i], q, sizeof q));
				ok = false;
			}
		}
	}

	token *op = peek(P);
	fz_value *outs[8] = {0};
	int n = parse_expr(P, outs, 8);
	if (n < 0)
		goto out;
	good = true;
	if (n == 0 || !ok)
		goto out;
	if (n != names.n) {
		char q[64];
		sem_error(P, op, "op %s returns %d value%s but %d name%s given",
			  tok_quote(P, op, q, sizeof q), n, n == 1 ? "" : "s",
			  names.n, names.n == 1 ? " is" : "s are");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		stamp(P, lhs[i]);
		const char *name = tok_str(P, lhs[i]);
		if (fz_name(P->t, outs[i], name) != FZ_OK) {
			sem_error(P, lhs[i], "%s", fz_trace_error(P->t));
			goto out;
		}
		bind_add(P, name, lhs[i]->line, outs[i]);
	}
	free(names.data);
	return true;
out:
	/* Whatever this statement meant to define is now unknown; later uses
	 * of it fail quietly. */
	for (int i = 0; i < names.n; i++) {
		token *tk = ((token **)names.data)[i];
		bind_add(P, tok_str(P, tk), tk->line, NULL);
	}
	free(names.data);
	return good;
}

/* dim := INT | NAME | ext     (ext: a product B*T or a sum T+1, B*T-B)
 * Returns false on a syntax error; *ok turns false on a semantic one. */
static bool parse_dim(parser *P, fz_dim *out, bool *ok)
{
	token *tk = peek(P);
	if (((tk->kind == TK_NAME || (tk->kind == TK_INT && !tk->overflow)) &&
	     ext_continues(P, peek_at(P, 1))) ||
	    (punct_is(P, tk, '-') && peek_at(P, 1)->kind == TK_NAME)) {
		out->size = 0;
		return parse_extent(P, &out->sym);
	}
	if (tk->kind == TK_NAME) {
		next(P);
		out->size = 0;
		out->sym = tok_str(P, tk);
		return true;
	}
	if (tk->kind == TK_INT) {
		next(P);
		if (tk->overflow) {
			char q[64];
			sem_error(P, tk, "extent %s out of range",
				  tok_quote(P, tk, q, sizeof q));
			*ok = false;
		}
		out->size = tk->i;
		out->sym = NULL;
		return true;
	}
	return expected(P, tk, "an extent (an integer or a name)");
}

/* type := DTYPE '[' (dim (',' dim)*)? ']' */
static bool parse_type(parser *P, fz_dtype *dtype, int *rank, fz_dim *dims,
                       bool *ok)
{
	token *tk = peek(P);
	if (tk->kind != TK_NAME)
		return expected(P, tk, "a dtype");
	next(P);
	if (!fz_dtype_from_name(tok_str(P, tk), dtype)) {
		char q[64];
		sem_error(P, tk, "unknown dtype %s (expected one of f64 f32 "
			  "f16 bf16 i64 i32 i8 u8 bool)",
			  tok_quote(P, tk, q, sizeof q));
		*ok = false;
	}
	if (!expect(P, '[', "'[' after the dtype"))
		return false;
	*rank = 0;
	if (punct_is(P, peek(P), ']')) {
		next(P);
		return true;
	}
	for (;;) {
		fz_dim extra;
		if (*rank == FZ_MAX_RANK) {
			sem_error(P, peek(P), "too many extents (the largest "
				  "rank is %d)", FZ_MAX_RANK);
			*ok = false;
		}
		if (!parse_dim(P, *rank < FZ_MAX_RANK ? &dims[*rank] : &extra,
			       ok))
			return false;
		if (*rank <= FZ_MAX_RANK)
			++*rank;
		if (punct_is(P, peek(P), ']')) {
			next(P);
			return true;
		}
		if (!expect(P, ',', "',' or ']' after an extent"))
			return false;
	}
}

/* param := NAME ':' type */
static bool parse_param(parser *P)
{
	token *tk = peek(P);
	if (tk->kind != TK_NAME)
		return expected(P, tk, "a parameter name");
	next(P);
	const char *name = tok_str(P, tk);
	if (!expect(P, ':', "':' after the parameter name"))
		return false;
	fz_dtype dtype = FZ_F32;
	int rank = 0;
	fz_dim dims[FZ_MAX_RANK];
	bool ok = true;
	if (!parse_type(P, &dtype, &rank, dims, &ok)) {
		bind_add(P, name, tk->line, NULL);
		return false;
	}
	if (!check_new_name(P, tk, name))
		return true;
	if (ok) {
		stamp(P, tk);
		fz_value *v = fz_param(P->t, name, dtype, rank, dims);
		if (v) {
			bind_add(P, name, tk->line, v);
			return true;
		}
		sem_error(P, tk, "%s", fz_trace_error(P->t));
	}
	bind_add(P, name, tk->line, NULL);
	return true;
}

/* params := param (',' param)* */
static bool parse_params(parser *P)
{
	if (punct_is(P, peek(P), ')'))
		return true;
	for (;;) {
		if (!parse_param(P))
			return false;
		if (punct_is(P, peek(P), ')'))
			return true;
		if (!expect(P, ',', "',' or ')' after a parameter"))
			return false;
	}
}

/* The tail of trace: 'return' NAME (',' NAME)* '}' */
static bool parse_return(parser *P)
{
	token *ret = next(P);
	vec vals = {.size = sizeof(fz_value *)};
	bool ok = true, good = false;
	for (;;) {
		token *tk = peek(P);
		if (tk->kind != TK_NAME) {
			expected(P, tk, "the name of a value to return");
			goto out;
		}
		next(P);
		fz_value *v = use_name(P, tk);
		if (!v)
			ok = false;
		fz_value **slot = vec_push(P, &vals);
		if (!slot)
			goto out;
		*slot = v;
		if (!punct_is(P, peek(P), ','))
			break;
		next(P);
	}
	if (ok && !P->t_failed && !P->stop) {
		stamp(P, ret);
		if (fz_return(P->t, vals.data, vals.n) != FZ_OK)
			sem_error(P, ret, "%s", fz_trace_error(P->t));
	}
	if (peek(P)->kind == TK_EOF)
		goto out; /* the caller reports the unterminated trace */
	good = expect(P, '}', "'}' after the returned values");
out:
	free(vals.data);
	return good;
}

/* A verifier's complaint. When it names a line ("line 7: ..."), it is
 * reported at the first token of that line, else at the trace's name. */
static void verify_error(parser *P, const token *name_tk, const char *err)
{
	const token *at = name_tk;
	int line = 0, col = 0, skip = 0;
	if (!err)
		err = "trace fails to verify";
	/* "line L:C: " names the token; "line L: " its line's first */
	if (sscanf(err, "line %d:%d: %n", &line, &col, &skip) == 2 && skip > 0) {
		for (size_t i = 0; i < P->ntoks && tok_at(P, i)->kind != TK_EOF; i++)
			if (tok_at(P, i)->line == line && tok_at(P, i)->col == col) {
				sem_error(P, tok_at(P, i), "%s", err + skip);
				return;
			}
		skip = 0;
	}
	if (sscanf(err, "line %d: %n", &line, &skip) == 1 && skip > 0) {
		size_t lo = 0, hi = P->ntoks - 1; /* first token on that line */
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;
			if (tok_at(P, mid)->line < line)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (tok_at(P, lo)->line == line && tok_at(P, lo)->kind != TK_EOF) {
			at = tok_at(P, lo);
			err += skip;
		}
	}
	sem_error(P, at, "%s", err);
}

static void trace_reset(parser *P)
{
	fz_arena_release(&P->scratch);
	binds_free(P);
	P->nbinds = P->cap_binds = 0;
	P->t = NULL;
	P->t_failed = P->header_failed = false;
	P->depth = 0;
}

static bool module_add(parser *P, fz_trace *t, int line)
{
	fz_module *m = P->mod;
	fz_trace **tr = realloc(m->traces, (size_t)(m->n_traces + 1) * sizeof *tr);
	if (tr)
		m->traces = tr;
	int *ln = realloc(P->trace_lines, (size_t)(m->n_traces + 1) * sizeof *ln);
	if (ln)
		P->trace_lines = ln;
	if (!tr || !ln) {
		P->oom = P->stop = true;
		return false;
	}
	m->traces[m->n_traces] = t;
	P->trace_lines[m->n_traces++] = line;
	return true;
}

/* trace := 'trace' NAME '(' params? ')' ('world' INT)? '{'
 *          stmt* 'return' NAME (',' NAME)* '}' */
static void parse_trace(parser *P)
{
	next(P); /* 'trace' */
	token *name_tk = peek(P);
	if (name_tk->kind != TK_NAME) {
		expected(P, name_tk, "a trace name after 'trace'");
		while (peek(P)->kind != TK_EOF && !at_trace_start(P))
			next(P);
		return;
	}
	next(P);
	const char *name = tok_str(P, name_tk);
	fz_module *m = P->mod;
	for (int i = 0; i < m->n_traces; i++) {
		if (strcmp(fz_trace_name(m->traces[i]), name) == 0) {
			char q[64];
			sem_error(P, name_tk, "redefinition of trace %s (first "
				  "defined at line %d)",
				  tok_quote(P, name_tk, q, sizeof q),
				  P->trace_lines[i]);
			break;
		}
	}
	fz_trace *t = fz_trace_new(name);
	if (!t) {
		P->oom = P->stop = true;
		return;
	}
	/* a big trace's nodes, values and names take about 12 bytes of arena
	 * per byte of text (a 32-layer Llama: 574 KB of text): reserved at
	 * once, in huge pages, rather than grown from 4 KiB chunks */
	size_t rest = P->len - name_tk->pos;
	P->binds_hint = 0;
	if (rest >= (64 << 10)) {
		size_t r = rest < ((size_t)64 << 20) ? rest : ((size_t)64 << 20);
		fz_arena_reserve(&t->arena, 16 * r);
		/* and a name per 40 bytes or so, at most half the slots full */
		size_t cap = 64;
		while (cap < r / 16)
			cap *= 2;
		P->binds_hint = cap;
	}
	if (!module_add(P, t, name_tk->line)) {
		fz_trace_free(t);
		return;
	}
	P->t = t;

	/* The header. After an error in it the names of the parameters are
	 * unknown, so the body is read for its own errors only. */
	bool header = expect(P, '(', "'(' after the trace name") &&
		      parse_params(P) &&
		      expect(P, ')', "')' after the parameters");
	if (header && name_is(P, peek(P), "world")) {
		next(P);
		token *w = peek(P);
		if (w->kind != TK_INT) {
			header = expected(P, w, "the number of ranks after "
					  "'world'");
		} else {
			next(P);
			if (w->overflow || w->i < INT_MIN || w->i > INT_MAX) {
				sem_error(P, w, "world size %s out of range",
					  tok_quote(P, w, (char[64]){0}, 64));
			} else if (fz_trace_set_world(t, (int)w->i) != FZ_OK) {
				sem_error(P, w, "%s", fz_trace_error(t));
			}
		}
	}
	if (header)
		header = expect(P, '{', "'{' to open the trace body");
	if (!header) {
		P->header_failed = true;
		for (;;) {
			token *tk = peek(P);
			if (tk->kind == TK_EOF || at_trace_start(P))
				return;
			next(P);
			if (punct_is(P, tk, '{'))
				break;
		}
	}

	/* stmt* 'return' ... '}' */
	bool returned = false;
	for (;;) {
		token *tk = peek(P);
		if (tk->kind == TK_EOF || at_trace_start(P)) {
			char q[64];
			syntax_error(P, name_tk, "unterminated trace %s: the %s "
				  "comes before its closing '}'",
				  tok_quote(P, name_tk, q, sizeof q),
				  tk->kind == TK_EOF ? "end of file" :
				  "next trace");
			return;
		}
		if (punct_is(P, tk, '}')) {
			next(P);
			if (!returned) {
				char q[64];
				syntax_error(P, tk, "missing return in trace %s",
					  tok_quote(P, name_tk, q, sizeof q));
			}
			break;
		}
		size_t start = P->pos;
		if (name_is(P, tk, "return") && !punct_is(P, peek_at(P, 1), '=')
		    && !punct_is(P, peek_at(P, 1), ',')) {
			returned = true;
			if (parse_return(P))
				break;
		} else if (parse_stmt(P)) {
			continue;
		}
		recover_stmt(P, start);
	}

	if (!P->t_failed && !P->stop) {
		char *err = NULL;
		/* every node was typed by fz_node_add as it was added */
		if (fz_trace_verify_typed(t, false, &err) != FZ_OK)
			verify_error(P, name_tk, err);
		fz_free(err);
	}
}

/* file := trace+ */
static void parse_file(parser *P)
{
	if (peek(P)->kind == TK_EOF) {
		syntax_error(P, peek(P), "no trace in file");
		return;
	}
	while (peek(P)->kind != TK_EOF) {
		token *tk = peek(P);
		if (name_is(P, tk, "trace")) {
			parse_trace(P);
			trace_reset(P);
			continue;
		}
		size_t start = P->pos;
		expected(P, tk, "'trace'");
		while (peek(P)->kind != TK_EOF &&
		       !(P->pos > start && at_trace_start(P)))
			next(P);
	}
}

/* ---- Public functions ----------------------------------------------------- */

void fz_module_free(fz_module *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_traces; i++)
		fz_trace_free(m->traces[i]);
	free(m->traces);
	free(m);
}

int fz_module_count(const fz_module *m) { return m ? m->n_traces : 0; }

fz_trace *fz_module_trace(const fz_module *m, int i)
{
	return m && i >= 0 && i < m->n_traces ? m->traces[i] : NULL;
}

fz_status fz_module_parse(const char *src, size_t len, const char *filename,
                          fz_module **out, char **diag)
{
	if (out)
		*out = NULL;
	if (diag)
		*diag = NULL;
	if (!src && len)
		return FZ_EINVAL;

	parser P = {0};
	P.src = src ? src : "";
	P.len = len;
	P.file = filename ? filename : "<input>";
	P.mod = calloc(1, sizeof *P.mod);
	if (!P.mod)
		return FZ_ENOMEM;

	if (len > MAX_INPUT_BYTES) {
		diag_puts(&P, P.file);
		diag_puts(&P, ": error: input too large (more than 1 GiB)\n");
		P.nerrors = 1;
		P.syntax_errors = true;
	} else {
		lex(&P);
		if (!P.oom)
			parse_file(&P);
		trace_reset(&P);
	}

	fz_status st = FZ_OK;
	if (P.oom)
		st = FZ_ENOMEM;
	else if (P.nerrors || P.stop)
		st = P.syntax_errors ? FZ_EPARSE : FZ_EVERIFY;

	if (P.toks_mapped)
		fz_huge_free(P.toks, P.toks_mapped);
	else
		free(P.toks);
	fz_huge_free(P.toks2, P.toks2_mapped);
	free(P.trace_lines);
	if (st == FZ_OK && out) {
		*out = P.mod;
	} else if (st == FZ_OK) {
		fz_module_free(P.mod);
	} else {
		fz_module_free(P.mod);
	}
	if (st != FZ_OK && diag && !P.oom) {
		*diag = P.diag;
		P.diag = NULL;
	}
	free(P.diag);
	return st;
}

fz_status fz_module_parse_file(const char *path, fz_module **out, char **diag)
{
	if (out)
		*out = NULL;
	if (diag)
		*diag = NULL;
	if (!path)
		return FZ_EINVAL;

	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int err = 0;
	if (!f) {
		err = errno;
	} else {
		for (;;) {
			if (len == cap) {
				cap = cap ? cap * 2 : 65536;
				char *p = realloc(buf, cap);
				if (!p) {
					free(buf);
					fclose(f);
					return FZ_ENOMEM;
				}
				buf = p;
			}
			errno = 0;
			size_t n = fread(buf + len, 1, cap - len, f);
			len += n;
			if (n == 0) {
				if (ferror(f))
					err = errno ? errno : EIO;
				break;
			}
		}
		fclose(f);
	}
	if (err) {
		free(buf);
		if (diag)
			*diag = fz_strdup_printf("cannot read %s: %s\n", path,
						 strerror(err));
		return FZ_EIO;
	}
	fz_status st = fz_module_parse(buf, len, path, out, diag);
	free(buf);
	return st;
}
