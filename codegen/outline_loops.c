/* outline_loops.c: an op's loops written once a file (dialects with can.outline_loops: C).
 *
 * A model's repeated blocks (`repeat L transformer_block`) give L ops whose loops differ
 * only in the buffers they name: gpt.dm's layernorm, its gradient, the GELU and the
 * residual adds were written out once a layer, and compiling them was most of a generated
 * file's compile (its forward and backward functions: 60% of the tiny gpt.dm's at -O2).
 * Here each op's text is captured as it is written; where it is self-contained (every name
 * it uses is its own local, one of the phase function's buffers or ctx / batch / micro /
 * arena / kept, a runtime or libm function, or a macro), its buffers become parameters
 * named after their role (out: the op's result; in0, in1, ...: its operands; buf0, ...:
 * other buffers) and the text is a static function in the kernels section, written the
 * first time and called by every op whose text is the same. The float operations are the
 * same, in the same order (ISO C's default -ffp-contract=off: no contraction either way):
 * unoptimised, the program computes the same bits; optimised, the compiler may vectorise a
 * helper's loop where it left the same loop in a long function scalar (or the reverse), and
 * libmvec's vector tanhf and expf round apart from libm's scalar ones in the last place. A
 * text that is not self-contained, or has no loop, is written in place as before. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

typedef struct outline_helper {
    uint64_t hash;
    char *key; /* its signature and body, as written */
    char name[96];
} outline_helper;

struct cg_outline {
    /* the phase function's buffers (declare_buffers): an open-addressing table of value ids by name */
    int *slots;
    int n_slots;
    outline_helper *helpers;
    int n_helpers, cap;
    /* the op being captured: the host writer's stream while it is, and the capture */
    FILE *saved;
    char *text;
    size_t len;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int enabled(const emitter *E) {
    const char *env = getenv("DMC_OUTLINE_LOOPS"); /* "off": every op's loops in place (the codegen tests that read them) */
    return E->dialect->can.outline_loops && !(env && strcmp(env, "off") == 0);
}

static struct cg_outline *state(emitter *E) {
    if (!E->outline && !(E->outline = calloc(1, sizeof *E->outline))) abort();
    return E->outline;
}

void outline_phase_begin(emitter *E, const char *used) {
    if (!enabled(E)) return;
    struct cg_outline *o = state(E);
    int n = 0;
    for (int i = 0; i < E->g->n_values; i++) n += used[i] && has_storage(E, i);
    o->n_slots = 16;
    while (o->n_slots < 2 * n) o->n_slots *= 2;
    free(o->slots);
    if (!(o->slots = malloc((size_t)o->n_slots * sizeof *o->slots))) abort();
    for (int s = 0; s < o->n_slots; s++) o->slots[s] = -1;
    for (int i = 0; i < E->g->n_values; i++) {
        if (!used[i] || !has_storage(E, i)) continue;
        uint64_t h = hash_bytes(E->cname[i], strlen(E->cname[i]));
        int s = (int)(h & (uint64_t)(o->n_slots - 1));
        while (o->slots[s] >= 0) s = (s + 1) & (o->n_slots - 1);
        o->slots[s] = i;
    }
}

void outline_phase_end(emitter *E) {
    if (!E->outline) return;
    free(E->outline->slots);
    E->outline->slots = NULL;
    E->outline->n_slots = 0;
}

/* The phase function's buffer named s[0..n), or -1. */
static int buffer_named(const emitter *E, const char *s, size_t n) {
    const struct cg_outline *o = E->outline;
    if (!o || !o->slots) return -1;
    for (int at = (int)(hash_bytes(s, n) & (uint64_t)(o->n_slots - 1));; at = (at + 1) & (o->n_slots - 1)) {
        int id = o->slots[at];
        if (id < 0) return -1;
        if (strlen(E->cname[id]) == n && memcmp(E->cname[id], s, n) == 0) return id;
    }
}

/* ---- the captured text's tokens ---- */

typedef enum { TOK_IDENT, TOK_NUMBER, TOK_STRING, TOK_COMMENT, TOK_PUNCT } tok_kind;

typedef struct token {
    const char *at;
    size_t len;
    tok_kind kind;
    int param; /* TOK_IDENT: the parameter it names; -2 where the text declares it; else -1 */
} token;

/* The tokens of text (NUL-terminated), malloc'd, or NULL where the text is not one this
 * module reads (a preprocessor line). */
static token *tokenize(const char *text, int *count) {
    size_t cap = 256;
    int n = 0;
    token *t = malloc(cap * sizeof *t);
    if (!t) abort();
    int line_start = 1;
    for (const char *p = text; *p;) {
        if (*p == '\n') line_start = 1;
        if (isspace((unsigned char)*p)) {
            p++;
            continue;
        }
        if (line_start && *p == '#') {
            free(t);
            return NULL;
        }
        line_start = 0;
        token k = {.at = p, .param = -1};
        if (p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            if (!end) { /* (never written so) */
                free(t);
                return NULL;
            }
            k.kind = TOK_COMMENT, k.len = (size_t)(end + 2 - p);
        } else if (*p == '"' || *p == '\'') {
            const char *q = p + 1;
            while (*q && *q != *p) q += q[0] == '\\' && q[1] ? 2 : 1;
            k.kind = TOK_STRING, k.len = (size_t)(q - p) + (*q ? 1 : 0);
        } else if (isdigit((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1]))) {
            const char *q = p;
            int hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
            while (isalnum((unsigned char)*q) || *q == '.' || *q == '_' ||
                   ((*q == '+' || *q == '-') && strchr(hex ? "pP" : "eE", q[-1])))
                q++;
            k.kind = TOK_NUMBER, k.len = (size_t)(q - p);
        } else if (isalpha((unsigned char)*p) || *p == '_') {
            const char *q = p;
            while (isalnum((unsigned char)*q) || *q == '_') q++;
            k.kind = TOK_IDENT, k.len = (size_t)(q - p);
        } else {
            k.kind = TOK_PUNCT, k.len = p[0] == '-' && p[1] == '>' ? 2 : 1;
        }
        if ((size_t)n == cap && !(t = realloc(t, (cap *= 2) * sizeof *t))) abort();
        t[n++] = k;
        p += k.len;
    }
    *count = n;
    return t;
}

static int is(const token *k, const char *s) { return k && k->len == strlen(s) && memcmp(k->at, s, k->len) == 0; }

static int in_list(const token *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (is(k, list[i])) return 1;
    return 0;
}

/* the type names a declaration of the generated loops starts with */
static const char *const type_names[] = {"void", "char", "short", "int", "long", "float", "double", "signed", "unsigned",
                                         "_Bool", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
                                         "uint32_t", "uint64_t", "size_t", "ptrdiff_t", NULL};
static const char *const keywords[] = {"for", "if", "else", "while", "do", "break", "continue", "sizeof", "switch", "case",
                                       "default", "static", "const", "restrict", "volatile", NULL};
/* functions a helper above the host functions may call: libm's and libc's (the runtime's are dmrt_) */
static const char *const library_functions[] = {
    "exp", "expf", "exp2f", "expm1f", "log", "logf", "log1pf", "sqrt", "sqrtf", "tanh", "tanhf", "erf", "erff", "fabs", "fabsf",
    "fmax", "fmaxf", "fmin", "fminf", "pow", "powf", "sin", "sinf", "cos", "cosf", "floor", "floorf", "ceil", "ceilf",
    "nearbyintf", "rintf", "roundf", "isnan", "isinf", "isfinite", "memcpy", "memset", "memmove", NULL};
/* the phase functions' own names a loop may read (emit_phase): they pass on by name, with
 * their type ("%s": the model's name); arena and kept reach the whole arena */
static const struct phase_name {
    const char *name, *type;
    int whole_arena;
} phase_names[] = {{"ctx", "struct_ctx *", 0}, {"batch", "const %s_batch *", 0}, {"micro", "int64_t ", 0},
                   {"arena", "float *", 1}, {"kept", "float *", 1}};

/* The phase function's own name k, or NULL. */
static const struct phase_name *phase_name(const token *k) {
    for (size_t i = 0; i < sizeof phase_names / sizeof *phase_names; i++)
        if (is(k, phase_names[i].name)) return &phase_names[i];
    return NULL;
}

static int prefixed(const token *k, const char *prefix) {
    return k->len > strlen(prefix) && memcmp(k->at, prefix, strlen(prefix)) == 0;
}

static int is_macro(const token *k) {
    for (size_t i = 0; i < k->len; i++)
        if (islower((unsigned char)k->at[i])) return 0;
    return 1;
}

/* A parameter of the helper: a buffer (value id >= 0) or one of phase_names (id -1). */
typedef struct outline_param {
    int id;
    const struct phase_name *phase; /* id -1: which */
    const char *at; /* the caller's name */
    size_t len;
    char name[40];  /* the helper's */
    char where[160]; /* a buffer's storage (cg_storage_expr): buffers at the same place are one parameter */
} outline_param;

#define OUTLINE_MAX_PARAMS 24

typedef struct outline_scan {
    const char *text; /* the op's, captured */
    token *t;
    int n;
    int first_code;            /* tokens before it are the leading comments */
    outline_param p[OUTLINE_MAX_PARAMS];
    int n_params;
    int apart;                 /* every buffer parameter's elements apart from the others' (buffers_apart) */
} outline_scan;

static int declared_here(const outline_scan *s, int i) {
    for (int j = s->first_code; j < i; j++)
        if (s->t[j].kind == TOK_IDENT && s->t[j].param == -2 && s->t[j].len == s->t[i].len &&
            memcmp(s->t[j].at, s->t[i].at, s->t[i].len) == 0)
            return 1;
    return 0;
}

/* Token i (buffer id, or -1: one of phase_names) as a parameter. Two names of one place
 * (an op made in its operand's buffer) of one C type are one parameter: the helper reads
 * and writes through one pointer, as the loops in place did, and its other pointers can be
 * restrict (buffers_apart). */
static int add_param(const emitter *E, outline_scan *s, int i, int id) {
    char where[160] = "";
    if (id >= 0) cg_storage_expr(E, id, where, sizeof where);
    for (int q = 0; q < s->n_params; q++) {
        int same_name = s->p[q].len == s->t[i].len && memcmp(s->p[q].at, s->t[i].at, s->t[i].len) == 0;
        int same_place = id >= 0 && s->p[q].id >= 0 && strcmp(s->p[q].where, where) == 0 &&
                         V(E, id)->type.dtype == V(E, s->p[q].id)->type.dtype &&
                         E->plan->region[id] == E->plan->region[s->p[q].id]; /* (the same C type) */
        if (same_name || same_place) return s->t[i].param = q, 0;
    }
    if (s->n_params == OUTLINE_MAX_PARAMS) return -1;
    s->p[s->n_params] = (outline_param){.id = id, .phase = id < 0 ? phase_name(&s->t[i]) : NULL, .at = s->t[i].at,
                                        .len = s->t[i].len};
    snprintf(s->p[s->n_params].where, sizeof s->p[s->n_params].where, "%s", where);
    s->t[i].param = s->n_params++;
    return 0;
}

/* Classifies every identifier of s: the text's own locals (param -2, at their
 * declaration), members, keywords, functions and macros (-1), and parameters (>= 0).
 * 0 when the text is self-contained and has a loop. */
static int classify(const emitter *E, outline_scan *s) {
    int depth = 0, decl_depth = -1, loops = 0;
    const token *prev = NULL, *prev2 = NULL;
    for (int i = 0; i < s->n; i++) {
        token *k = &s->t[i];
        if (k->kind == TOK_COMMENT) /* kept in the helper: only ops whose comments are the same too share it */
            continue;
        if (k->kind == TOK_PUNCT) {
            char c = k->at[0];
            if (c == '(' || c == '[' || c == '{') depth++;
            if (c == ')' || c == ']' || c == '}') depth--;
            if (c == ';' && depth <= decl_depth) decl_depth = -1;
        } else if (k->kind == TOK_IDENT) {
            const token *next = i + 1 < s->n ? &s->t[i + 1] : NULL;
            if (is(k, "return") || is(k, "goto")) return -1; /* leaves the phase function */
            loops += is(k, "for");
            if (prev && (is(prev, "->") || is(prev, "."))) {
                /* a member */
            } else if (in_list(k, type_names)) {
                int j = i + 1; /* a cast, "(float)" or "(float *)", declares nothing */
                while (j < s->n && (is(&s->t[j], "*") || is(&s->t[j], "const"))) j++;
                if (j < s->n && !is(&s->t[j], ")")) decl_depth = depth;
            } else if (in_list(k, keywords)) {
                /* "const": a declaration goes on */
            } else if ((prev && in_list(prev, type_names)) || (prev && (is(prev, "const") || is(prev, "restrict")) && prev2 && is(prev2, "*")) ||
                       (prev && is(prev, "*") && prev2 && (in_list(prev2, type_names) || is(prev2, "*"))) ||
                       (decl_depth == depth && prev && (is(prev, ",") || (is(prev, "*") && prev2 && is(prev2, ","))))) {
                k->param = -2; /* declared here */
            } else if (declared_here(s, i)) {
                /* one of its locals */
            } else {
                int id = buffer_named(E, k->at, k->len);
                if (id >= 0 || phase_name(k)) {
                    if (add_param(E, s, i, id) != 0) return -1;
                } else if (next && is(next, "(")) {
                    if (!prefixed(k, "dmrt_") && !prefixed(k, "DMRT_") && !in_list(k, library_functions)) return -1;
                } else if (!is_macro(k) && !prefixed(k, "dmrt_")) {
                    return -1; /* a name of the phase function's this module does not know */
                }
            }
        }
        prev2 = prev;
        prev = k;
    }
    return loops ? 0 : -1;
}

/* Whether identifier token k of s (not a parameter's) is spelled name. */
static int names_a_local(const outline_scan *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (s->t[i].kind == TOK_IDENT && s->t[i].param < 0 && is(&s->t[i], name)) return 1;
    return 0;
}

/* The parameters' names in the helper: out (v's result), in<k> (its operand k), buf<n>
 * (another buffer); the phase function's own names stay. */
static void name_params(const ir_value *v, outline_scan *s) {
    int others = 0;
    for (int q = 0; q < s->n_params; q++) {
        outline_param *p = &s->p[q];
        if (p->id < 0) {
            snprintf(p->name, sizeof p->name, "%.*s", (int)p->len, p->at);
            continue;
        }
        int operand = -1;
        for (int k = 0; k < v->n_operands && operand < 0; k++)
            if (v->operands[k] == p->id) operand = k;
        if (p->id == v->id) snprintf(p->name, sizeof p->name, "out");
        else if (operand >= 0) snprintf(p->name, sizeof p->name, "in%d", operand);
        else snprintf(p->name, sizeof p->name, "buf%d", others++);
        while (names_a_local(s, p->name) && strlen(p->name) + 1 < sizeof p->name) strcat(p->name, "_");
    }
}

/* Whether the buffers s's parameters name lie apart (no element of one is an element of
 * another), as the memory plan places values live at once: then each pointer is restrict,
 * and the compiler vectorises the helper's loops as it did the loops in place, whose
 * buffers it saw at constant offsets of one allocation (without, it would add a run-time
 * overlap check, which gcc's -O2 does not: the loops would stay scalar). Known only for
 * buffers at "BASE + N" of the context's allocations; the batch's inputs are only read;
 * anything else (the phase function's arena or kept pointer itself) and no pointer is
 * restrict. */
static int buffers_apart(const emitter *E, const outline_scan *s) {
    struct { char base[32]; long long from, to; } at[OUTLINE_MAX_PARAMS];
    int n = 0;
    for (int q = 0; q < s->n_params; q++) {
        const outline_param *p = &s->p[q];
        if (p->id < 0) {
            if (p->phase->whole_arena) return 0;
            continue; /* ctx, batch, micro */
        }
        if (E->plan->region[p->id] == REGION_INPUT) continue;
        char base[32];
        long long off;
        if (sscanf(p->where, "%31s + %lld", base, &off) != 2) return 0;
        if (strcmp(base, "arena") == 0) snprintf(base, sizeof base, "ctx->arena");
        if (strcmp(base, "ctx->params") && strcmp(base, "ctx->grads") && strcmp(base, "ctx->state") &&
            strcmp(base, "ctx->arena") && strcmp(base, "ctx->grad_sum"))
            return 0; /* (kept: a micro-batch's copy somewhere in the arena) */
        /* offsets count floats; a 16-bit value's elements take half as many */
        long long floats = ((long long)ir_numel(T(E, p->id)) * ir_dtype_bytes(V(E, p->id)->type.dtype) + 3) / 4;
        for (int r = 0; r < n; r++)
            if (strcmp(at[r].base, base) == 0 && off < at[r].to && at[r].from < off + floats) return 0;
        snprintf(at[n].base, sizeof at[n].base, "%s", base);
        at[n].from = off, at[n].to = off + floats;
        n++;
    }
    return 1;
}

/* The C type of parameter p (declare_buffers' for a buffer, restrict where they lie apart). */
static void param_type(const emitter *E, const outline_scan *s, const outline_param *p, char *buf, size_t size) {
    if (p->id < 0) {
        snprintf(buf, size, p->phase->type, E->g->model);
        return;
    }
    cg_buffer_type(E, p->id, buf, size);
    if (s->apart && strlen(buf) + 10 < size) strcat(buf, "restrict ");
}

/* The helper's text, malloc'd: its parameter list, a newline, then its body (the code,
 * each parameter renamed, each line indented one level instead of `indent`). NULL when a
 * line is indented less than the op's text (it is then not an op's own). */
static char *helper_text(const emitter *E, const outline_scan *s, int indent) {
    /* the code from its first line's start, parameters renamed */
    char *code = NULL;
    size_t code_len = 0;
    FILE *f = open_memstream(&code, &code_len);
    if (!f) abort();
    const char *p = s->t[s->first_code].at;
    while (p > s->text && p[-1] != '\n') p--;
    for (int i = s->first_code; i < s->n; i++) {
        const token *k = &s->t[i];
        fwrite(p, 1, (size_t)(k->at - p), f);
        if (k->kind == TOK_IDENT && k->param >= 0) fputs(s->p[k->param].name, f);
        else fwrite(k->at, 1, k->len, f);
        p = k->at + k->len;
    }
    if (fclose(f) != 0) abort();
    char *out = NULL;
    size_t len = 0;
    if (!(f = open_memstream(&out, &len))) abort();
    for (int q = 0; q < s->n_params; q++) {
        char type[96];
        param_type(E, s, &s->p[q], type, sizeof type);
        fprintf(f, "%s%s%s", q ? ", " : "", type, s->p[q].name);
    }
    fputc('\n', f);
    int bad = 0;
    for (char *line = code; line && *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        size_t spaces = 0;
        while (spaces < n && line[spaces] == ' ') spaces++;
        if (spaces < n) { /* (blank lines stay blank) */
            if (spaces < (size_t)(4 * indent)) bad = 1;
            else fprintf(f, "    %.*s", (int)(n - (size_t)(4 * indent)), line + 4 * indent);
        }
        fputc('\n', f);
        line = end ? end + 1 : NULL;
    }
    if (fclose(f) != 0) abort();
    free(code);
    if (bad) {
        free(out);
        return NULL;
    }
    return out;
}

/* The helper whose signature and body are key, written the first time: its name. */
static const char *helper_for(emitter *E, const ir_value *v, char *key) {
    struct cg_outline *o = E->outline;
    uint64_t h = hash_bytes(key, strlen(key));
    for (int i = 0; i < o->n_helpers; i++)
        if (o->helpers[i].hash == h && strcmp(o->helpers[i].key, key) == 0) {
            free(key);
            return o->helpers[i].name;
        }
    if (o->n_helpers == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 16;
        if (!(o->helpers = realloc(o->helpers, (size_t)o->cap * sizeof *o->helpers))) abort();
    }
    outline_helper *k = &o->helpers[o->n_helpers++];
    *k = (outline_helper){.hash = h, .key = key};
    snprintf(k->name, sizeof k->name, "%s_loops_%d", ir_op_info_of(v->op)->name, o->n_helpers);
    char *body = strchr(key, '\n');
    cg_writer *w = E->w.kernels;
    cg_line(w, "/* the loops of %s %s (%s:%d), written once for every op whose loops are the same (out: the op's", ir_op_info_of(v->op)->name,
            E->cname[v->id], E->source_path, v->loc.line);
    cg_line(w, " * result, in<k>: its operand k, buf<n>: another buffer it reads or writes) */");
    cg_line(w, "static void %s(%.*s) {", k->name, (int)(body - key), key);
    /* without OpenMP DMRT_PARALLEL_FOR is nothing, and ctx may be read nowhere else */
    if (strstr(body, "DMRT_PARALLEL_FOR") && strstr(key, "struct_ctx *ctx")) cg_line(w, "    (void)ctx;");
    fputs(body + 1, w->f);
    cg_line(w, "}");
    cg_blank(w);
    return k->name;
}

/* Writes text (op v's, captured) as a call of its helper: 1; 0 where it is not one. */
static int outline(emitter *E, const ir_value *v, const char *text) {
    outline_scan s = {.text = text};
    if (!(s.t = tokenize(text, &s.n))) return 0;
    while (s.first_code < s.n && s.t[s.first_code].kind == TOK_COMMENT) s.first_code++;
    char *key = NULL;
    if (s.first_code < s.n && classify(E, &s) == 0) {
        name_params(v, &s);
        s.apart = buffers_apart(E, &s);
        key = helper_text(E, &s, E->w.indent);
    }
    if (!key) {
        free(s.t);
        return 0;
    }
    const char *name = helper_for(E, v, key);
    const char *code_line = s.t[s.first_code].at;
    while (code_line > text && code_line[-1] != '\n') code_line--;
    fwrite(text, 1, (size_t)(code_line - text), E->w.f); /* its comments */
    char *args = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&args, &len);
    if (!f) abort();
    for (int q = 0; q < s.n_params; q++) fprintf(f, "%s%.*s", q ? ", " : "", (int)s.p[q].len, s.p[q].at);
    if (fclose(f) != 0) abort();
    cg_line(&E->w, "%s(%s);", name, args);
    free(args);
    free(s.t);
    return 1;
}

void outline_op_begin(emitter *E) {
    struct cg_outline *o = E->outline;
    if (!o || !o->slots) return; /* (outside a phase function, or not this dialect) */
    o->saved = E->w.f;
    o->text = NULL;
    o->len = 0;
    if (!(E->w.f = open_memstream(&o->text, &o->len))) abort();
}

void outline_op_end(emitter *E, const ir_value *v) {
    struct cg_outline *o = E->outline;
    if (!o || !o->saved) return;
    if (fclose(E->w.f) != 0) abort();
    E->w.f = o->saved;
    o->saved = NULL;
    if (o->len && !outline(E, v, o->text)) fwrite(o->text, 1, o->len, E->w.f);
    free(o->text);
    o->text = NULL;
}

void outline_free(emitter *E) {
    struct cg_outline *o = E->outline;
    if (!o) return;
    for (int i = 0; i < o->n_helpers; i++) free(o->helpers[i].key);
    free(o->helpers);
    free(o->slots);
    free(o);
    E->outline = NULL;
}
