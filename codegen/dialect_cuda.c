/* dialect_cuda.c: the CUDA dialect. Loop nests (elementwise, reductions, broadcasts,
 * transposes, slices, pads) become __global__ kernels generated into the file; every
 * other kernel, the matrix products (cuBLAS), device memory and the collectives on device
 * buffers are calls into libdmrt_cuda (runtime/cuda/dmrt_cuda.h) on the rank's dmrt_gpu,
 * ctx->gpu. All work goes to the rank's one stream, in program order.
 *
 * A loop-nest kernel computes what dialect_c.c's loops compute, in the same order of
 * float operations for each output element: one thread per output position (a
 * grid-stride loop over them, int64 positions), which walks the summed dims, if any, in
 * increasing order (no atomics: results are deterministic). Sizes and strides are
 * literals in the kernel, pointers its arguments, and every pointer's element type a
 * template parameter (float, or int32_t where a loop nest copies ids), so that layers of
 * the same shape share one kernel: a kernel whose text was written before in the file is
 * reused (the table lives in w->kernels->dialect_state, freed by cuda_finish). A kernel
 * is named k<serial>_<its first output>, static (no external symbol), and launched on
 * the rank's stream with a dmrt_gpu_check_launch after it. */
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "dialect.h"
#include "dialect_cuda_internal.h"
#include "../runtime/cuda/dmrt_cuda_sizes.h"

#define THREADS 256       /* per block of a loop-nest kernel */
#define SUM_THREADS 64    /* per block of one that sums: its few long-running threads
                           * spread over more multiprocessors */
#define MAX_BLOCKS 65535  /* the grid-stride loop covers the rest */

/* ---- text --------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) abort();
        if (b->s && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap <= b->n + (size_t)w) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) abort();
        b->s = s, b->cap = cap;
    }
}

/* "ctx->scratch + 12" -> "ctx_scratch_12": a name part, at most 32 characters. */
static void sanitise(const char *s, char *out, size_t size) {
    size_t n = 0;
    int gap = 0;
    for (const char *p = s; *p && n + 2 < size && n < 32; p++) {
        if (isalnum((unsigned char)*p)) {
            if (gap && n) out[n++] = '_';
            out[n++] = *p;
            gap = 0;
        } else {
            gap = 1;
        }
    }
    out[n] = 0;
    if (!n) snprintf(out, size, "out");
}

/* s as the body of a C string literal */
static void c_string(const char *s, char *out, size_t size) {
    size_t n = 0;
    for (const char *p = s ? s : ""; *p && n + 3 < size; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') out[n++] = '\\', out[n++] = (char)c;
        else out[n++] = c >= 32 && c < 127 ? (char)c : '?';
    }
    out[n] = 0;
}

/* ---- the file's kernels, to reuse ------------------------------------------------------------ */

typedef struct kernel_entry {
    uint64_t hash;
    char *key;    /* the kernel's text with its name left out */
    char *name;
} kernel_entry;

typedef struct kernel_table {
    kernel_entry *e;
    int n, cap;
} kernel_table;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static kernel_table *table_of(cg_writer *w) {
    cg_writer *kw = w->kernels;
    if (!kw->dialect_state) {
        kernel_table *t = calloc(1, sizeof *t);
        if (!t) abort();
        kw->dialect_state = t;
    }
    return kw->dialect_state;
}

static void cuda_finish(cg_writer *w) {
    if (!w->kernels || !w->kernels->dialect_state) return;
    kernel_table *t = w->kernels->dialect_state;
    for (int i = 0; i < t->n; i++) {
        free(t->e[i].key);
        free(t->e[i].name);
    }
    free(t->e);
    free(t);
    w->kernels->dialect_state = NULL;
}

/* The name of the kernel whose text is head NAME tail: one written before, or a new one
 * (k<serial>_<out>) written now into the kernels section. */
static const char *kernel_named(cg_writer *w, const char *out, const sbuf *head, const sbuf *tail) {
    kernel_table *t = table_of(w);
    sbuf key = {0};
    sb_printf(&key, "%s\x01%s", head->s, tail->s);
    uint64_t h = fnv1a(key.s);
    for (int i = 0; i < t->n; i++)
        if (t->e[i].hash == h && strcmp(t->e[i].key, key.s) == 0) {
            free(key.s);
            return t->e[i].name;
        }
    char part[40], name[64];
    sanitise(out, part, sizeof part);
    snprintf(name, sizeof name, "k%d_%s", ++w->kernels->serial, part);
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 32;
        kernel_entry *e = realloc(t->e, (size_t)cap * sizeof *e);
        if (!e) abort();
        t->e = e, t->cap = cap;
    }
    kernel_entry *e = &t->e[t->n++];
    e->hash = h;
    e->key = key.s;
    e->name = strdup(name);
    if (!e->name) abort();
    /* the section's lines, at its indent */
    sbuf text = {0};
    sb_printf(&text, "%s%s%s", head->s, name, tail->s);
    for (const char *line = text.s; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len) cg_line(w->kernels, "%.*s", (int)len, line);
        else cg_blank(w->kernels);
        line += len + (nl ? 1 : 0);
    }
    cg_blank(w->kernels);
    free(text.s);
    return e->name;
}

/* ---- loop nests ------------------------------------------------------------------------------ */

/* Whether the identifier `name` occurs in expr (numbers such as 1e-5f are skipped). */
static int names(const char *expr, const char *name) {
    size_t len = strlen(name);
    for (const char *p = expr; *p;) {
        if (isalpha((unsigned char)*p) || *p == '_') {
            const char *start = p;
            while (isalnum((unsigned char)*p) || *p == '_') p++;
            if ((size_t)(p - start) == len && strncmp(start, name, len) == 0) return 1;
        } else if (isdigit((unsigned char)*p) || *p == '.') {
            while (isalnum((unsigned char)*p) || *p == '.' ||
                   ((*p == '+' || *p == '-') && (p[-1] == 'e' || p[-1] == 'E')))
                p++;
        } else {
            p++;
        }
    }
    return 0;
}

/* The statements of expr ("name = e; ...; result") at indent `ind`: the locals as const
 * floats, computed once per element; *result = the result expression. */
static void expr_locals(sbuf *b, const char *ind, const char *expr, const char **result) {
    const char *rest = expr;
    for (const char *semi; (semi = strchr(rest, ';')); rest = semi + 1) {
        const char *eq = NULL;
        for (const char *p = rest; p < semi && !eq; p++)
            if (*p == '=' && p[1] != '=' && (p == rest || !strchr("=!<>", p[-1]))) eq = p;
        if (!eq) continue;
        const char *name = rest, *name_end = eq, *value = eq + 1, *value_end = semi;
        while (name < name_end && isspace((unsigned char)*name)) name++;
        while (name_end > name && isspace((unsigned char)name_end[-1])) name_end--;
        while (value < value_end && isspace((unsigned char)*value)) value++;
        while (value_end > value && isspace((unsigned char)value_end[-1])) value_end--;
        sb_printf(b, "%sconst float %.*s = %.*s;\n", ind, (int)(name_end - name), name, (int)(value_end - value), value);
    }
    while (isspace((unsigned char)*rest)) rest++;
    *result = rest;
}

/* A loop nest with its size-1 dims dropped, seen by the threads: the kept dims (out
 * stride != 0), one thread position p per combination of them, and the summed dims
 * (out stride 0), which each thread walks. */
typedef struct nest {
    const cg_loop_nest *k;
    int rank;
    int64_t size[IR_MAX_RANK], out_stride[IR_MAX_RANK], stride[CG_MAX_OPERANDS][IR_MAX_RANK];
    int n_kept, kept[IR_MAX_RANK];     /* by out stride, fastest first: p's digits */
    int n_summed, summed[IR_MAX_RANK]; /* in order: the outermost loop first */
    int64_t canon[IR_MAX_RANK];        /* of a kept dim: its stride were p the flat index */
    int64_t kept_total, summed_total;
    int used[CG_MAX_OPERANDS];         /* operand named in expr */
} nest;

static void nest_init(nest *s, const cg_loop_nest *k) {
    memset(s, 0, sizeof *s);
    s->k = k;
    for (int d = 0; d < k->rank; d++) {
        if (k->size[d] == 1) continue;
        s->size[s->rank] = k->size[d];
        s->out_stride[s->rank] = k->out_stride[d];
        for (int i = 0; i < k->n_in; i++) s->stride[i][s->rank] = k->stride[i][d];
        s->rank++;
    }
    s->kept_total = s->summed_total = 1;
    for (int d = 0; d < s->rank; d++) {
        if (s->out_stride[d] == 0) {
            s->summed[s->n_summed++] = d;
            s->summed_total *= s->size[d];
            continue;
        }
        /* insertion by out stride, stable */
        int j = s->n_kept++;
        while (j > 0 && s->out_stride[s->kept[j - 1]] > s->out_stride[d]) {
            s->kept[j] = s->kept[j - 1];
            j--;
        }
        s->kept[j] = d;
        s->kept_total *= s->size[d];
    }
    int64_t c = 1;
    for (int j = 0; j < s->n_kept; j++) {
        s->canon[s->kept[j]] = c;
        c *= s->size[s->kept[j]];
    }
    for (int i = 0; i < k->n_in; i++) s->used[i] = names(k->expr, k->var[i]);
}

/* Whether distinct thread positions write distinct elements of out: by stride, each
 * kept dim's stride is positive and exceeds the largest offset the faster ones reach (a
 * sufficient condition). */
static int injective(const nest *s) {
    int64_t extent = 1;
    for (int j = 0; j < s->n_kept; j++) {
        int d = s->kept[j];
        if (s->out_stride[d] < extent) return 0;
        extent += s->out_stride[d] * (s->size[d] - 1);
    }
    return 1;
}

/* Whether the thread positions write every element of out [0, out_elems), given injective. */
static int covers(const nest *s) {
    int64_t last = s->k->out_offset;
    for (int j = 0; j < s->n_kept; j++) last += s->out_stride[s->kept[j]] * (s->size[s->kept[j]] - 1);
    return s->k->out_offset == 0 && s->kept_total == s->k->out_elems && last == s->k->out_elems - 1;
}

/* The flat index, at the thread's position, of an array with these strides: offset, then
 * p where its strides over the kept dims are p's own, else i_d * stride over them, then
 * the summed dims'. Marks the kept dims it names in *dims. */
static void array_index(const nest *s, const int64_t *stride, int64_t offset, unsigned *dims, sbuf *b) {
    size_t start = b->n;
    if (offset) sb_printf(b, "%lld", (long long)offset);
    int linear = s->n_kept > 0;
    for (int j = 0; j < s->n_kept; j++) linear &= stride[s->kept[j]] == s->canon[s->kept[j]];
    if (linear) sb_printf(b, "%sp", b->n > start ? " + " : "");
    for (int d = 0; d < s->rank; d++) {
        int kept = s->out_stride[d] != 0;
        if (stride[d] == 0 || (kept && linear)) continue;
        if (kept) *dims |= 1u << d;
        if (stride[d] == 1) sb_printf(b, "%si%d", b->n > start ? " + " : "", d);
        else sb_printf(b, "%si%d * %lld", b->n > start ? " + " : "", d, (long long)stride[d]);
    }
    if (b->n == start) sb_printf(b, "0");
}

/* "(8192, 768)" */
static void sizes_text(const nest *s, sbuf *b) {
    sb_printf(b, "(");
    for (int d = 0; d < s->rank; d++) sb_printf(b, "%s%lld", d ? ", " : "", (long long)s->size[d]);
    sb_printf(b, ")");
}

/* "template <...>\nstatic __global__ void " and, after the name, "(T_out *out, ...)"
 * (without out unless with_out) with the pointers of the operands expr names, then
 * `last` when given. */
static void kernel_signature_with(const nest *s, int with_out, const char *last, sbuf *head, sbuf *tail) {
    const cg_loop_nest *k = s->k;
    int params = 0;
    sb_printf(tail, "(");
    if (with_out) {
        sb_printf(head, "template <typename T_out");
        sb_printf(tail, "T_out *out");
        params = 1;
    }
    for (int i = 0; i < k->n_in; i++) {
        if (!s->used[i] || k->constant[i]) continue;
        sb_printf(head, "%stypename T_%s", params ? ", " : "template <", k->var[i]);
        sb_printf(tail, "%sconst T_%s *%s_", params ? ", " : "", k->var[i], k->var[i]);
        params++;
    }
    if (last) sb_printf(tail, "%s%s", params ? ", " : "", last);
    sb_printf(head, "%sstatic __global__ void ", params ? ">\n" : "");
    sb_printf(tail, ") {\n");
}

static void kernel_signature(const nest *s, sbuf *head, sbuf *tail) { kernel_signature_with(s, 1, NULL, head, tail); }

/* Each operand expr names as a local of its name: `const T_x x = x_[index];` or the
 * literal of a constant operand. */
static void operand_loads(const nest *s, const char *ind, unsigned *dims, sbuf *b) {
    const cg_loop_nest *k = s->k;
    for (int i = 0; i < k->n_in; i++) {
        if (!s->used[i]) continue;
        if (k->constant[i]) {
            sb_printf(b, "%sconst float %s = %s;\n", ind, k->var[i], k->constant[i]);
            continue;
        }
        sb_printf(b, "%sconst T_%s %s = %s_[", ind, k->var[i], k->var[i], k->var[i]);
        array_index(s, s->stride[i], k->offset[i], dims, b);
        sb_printf(b, "];\n");
    }
}

/* p's digits for the kept dims in dims, the fastest kept dim first: `const int64_t iD = ...;` */
static void kept_digits(const nest *s, unsigned dims, const char *ind, sbuf *b) {
    for (int d = 0; d < s->rank; d++) {
        if (!(dims >> d & 1u)) continue;
        int j = 0;
        while (s->kept[j] != d) j++;
        int64_t below = 1;
        for (int l = 0; l < j; l++) below *= s->size[s->kept[l]];
        sb_printf(b, "%sconst int64_t i%d = ", ind, d);
        if (below == 1) sb_printf(b, "p");
        else sb_printf(b, "p / %lld", (long long)below);
        if (j < s->n_kept - 1) sb_printf(b, " %% %lld", (long long)s->size[d]);
        sb_printf(b, ";\n");
    }
}

/* The kernel of a nest the threads can split: one thread per output position. */
static void parallel_kernel(const nest *s, int fold_scale, sbuf *head, sbuf *tail) {
    const cg_loop_nest *k = s->k;
    sb_printf(head, "/* out = %s over ", k->expr);
    sizes_text(s, head);
    if (s->n_summed) {
        sb_printf(head, ", summed over dim%s", s->n_summed > 1 ? "s" : "");
        for (int j = 0; j < s->n_summed; j++) sb_printf(head, "%s %d", j ? "," : "", s->summed[j]);
    }
    if (fold_scale) sb_printf(head, ", times %s", k->scale);
    if (k->cast_out) sb_printf(head, "; and cast_ = out rounded to %s", k->cast_dtype == DT_F16 ? "f16" : "bf16");
    sb_printf(head, " */\n");
    kernel_signature_with(s, 1, k->cast_out ? "uint16_t *cast_" : NULL, head, tail);

    /* the body first: it tells which kept dims need their index */
    unsigned dims = 0;
    sbuf body = {0};
    const char *ind = "        ";
    const char *result;
    char inner_ind[64];
    snprintf(inner_ind, sizeof inner_ind, "%s", ind);
    if (k->accumulate && s->n_summed) {
        sb_printf(&body, "%sfloat acc = 0.0f;\n", ind);
        for (int j = 0; j < s->n_summed; j++) {
            int d = s->summed[j];
            sb_printf(&body, "%sfor (int64_t i%d = 0; i%d < %lld; i%d++) {\n", inner_ind, d, d, (long long)s->size[d], d);
            strcat(inner_ind, "    ");
        }
        operand_loads(s, inner_ind, &dims, &body);
        expr_locals(&body, inner_ind, k->expr, &result);
        sb_printf(&body, "%sacc += %s;\n", inner_ind, result);
        for (int j = s->n_summed - 1; j >= 0; j--) {
            inner_ind[strlen(inner_ind) - 4] = 0;
            sb_printf(&body, "%s}\n", inner_ind);
        }
        sb_printf(&body, "%sout[", ind);
        array_index(s, s->out_stride, k->out_offset, &dims, &body);
        if (fold_scale) sb_printf(&body, "] = acc * %s;\n", k->scale);
        else sb_printf(&body, "] = acc;\n");
    } else {
        operand_loads(s, ind, &dims, &body);
        expr_locals(&body, ind, k->expr, &result);
        sbuf at = {0};
        array_index(s, s->out_stride, k->out_offset, &dims, &at);
        if (fold_scale) sb_printf(&body, "%sout[%s] = (%s) * %s;\n", ind, at.s, result, k->scale);
        else sb_printf(&body, "%sout[%s] = %s;\n", ind, at.s, result);
        /* the cast's copy (cast_out: out dense, so the same index) */
        if (k->cast_out)
            sb_printf(&body, "%scast_[%s] = %s((float)out[%s]);\n", ind, at.s,
                      k->cast_dtype == DT_F16 ? "dmrt_f16_round" : "dmrt_bf16_round", at.s);
        free(at.s);
    }

    sb_printf(tail, "    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < %lld; p += (int64_t)gridDim.x * blockDim.x) {\n",
              (long long)s->kept_total);
    kept_digits(s, dims, ind, tail);
    sb_printf(tail, "%s    }\n}\n", body.s);
    free(body.s);
}

/* A long sum with few outputs would leave most of the GPU idle at one thread per output:
 * it is split into chunks of the summed positions (flattened, the outermost summed dim
 * first, as C's loops walk them). The first kernel has a thread per (output, chunk) that
 * sums its chunk in order into dmrt_gpu_sum_partials; the second a thread per output that
 * adds its chunks in order. Deterministic, but not C's order of additions: results
 * differ from the C target's by rounding. */
#define SPLIT_MIN_SUMMED 128           /* shorter sums stay one thread per output */
#define SPLIT_MIN_WORK 65536           /* nor are small nests split: two launches cost more */
#define SPLIT_MAX_KEPT 131072          /* with this many outputs the GPU is busy already */
#define SPLIT_CHUNK 32                 /* summed positions a first-kernel thread adds */
#define SPLIT_MAX_CHUNKS 1024          /* the second kernel's sums stay short */

/* Positions of the summed dims per chunk when the nest's sum is split, else 0. */
static int64_t split_chunk(const nest *s, int parallel) {
    const cg_loop_nest *k = s->k;
    if (!parallel || !k->accumulate || !s->n_summed || s->summed_total < SPLIT_MIN_SUMMED ||
        s->kept_total > SPLIT_MAX_KEPT || s->kept_total * s->summed_total < SPLIT_MIN_WORK)
        return 0;
    int64_t chunk = SPLIT_CHUNK;
    for (;;) {
        int64_t chunks = (s->summed_total + chunk - 1) / chunk;
        if (chunks <= SPLIT_MAX_CHUNKS && chunks * s->kept_total <= DMRT_CUDA_SUM_PARTIALS_FLOATS) return chunk;
        chunk *= 2;
    }
}

int cg_cuda_sum_is_split(const cg_loop_nest *k) {
    nest s;
    nest_init(&s, k);
    return split_chunk(&s, injective(&s)) > 0;
}

/* The two kernels of a split sum (split_chunk): head1/tail1 the chunks', head2/tail2 the
 * one that adds them. */
static void split_kernels(const nest *s, int64_t chunk, int fold_scale, sbuf *head1, sbuf *tail1, sbuf *head2,
                          sbuf *tail2) {
    const cg_loop_nest *k = s->k;
    int64_t chunks = (s->summed_total + chunk - 1) / chunk, partials = chunks * s->kept_total;
    const char *ind = "        ", *inner = "            ";
    /* the chunks: partial[c * kept + p] = the sum of chunk c for output p */
    sb_printf(head1, "/* partial sums of %s over ", k->expr);
    sizes_text(s, head1);
    sb_printf(head1, ", summed over dim%s", s->n_summed > 1 ? "s" : "");
    for (int j = 0; j < s->n_summed; j++) sb_printf(head1, "%s %d", j ? "," : "", s->summed[j]);
    sb_printf(head1, ": %lld chunks of %lld */\n", (long long)chunks, (long long)chunk);
    kernel_signature_with(s, 0, "float *partial", head1, tail1);
    unsigned dims = 0;
    sbuf body = {0};
    sb_printf(&body, "%sfloat acc = 0.0f;\n", ind);
    sb_printf(&body, "%sconst int64_t end = (c + 1) * %lld < %lld ? (c + 1) * %lld : %lld;\n", ind, (long long)chunk,
              (long long)s->summed_total, (long long)chunk, (long long)s->summed_total);
    sb_printf(&body, "%sfor (int64_t r = c * %lld; r < end; r++) {\n", ind, (long long)chunk);
    int64_t after = s->summed_total;
    for (int j = 0; j < s->n_summed; j++) {
        int d = s->summed[j], named = 0;
        after /= s->size[d];
        for (int i = 0; i < k->n_in; i++) named |= s->used[i] && !k->constant[i] && s->stride[i][d] != 0;
        if (!named) continue;   /* an unused local is an nvcc warning */
        sb_printf(&body, "%sconst int64_t i%d = r", inner, d);
        if (after > 1) sb_printf(&body, " / %lld", (long long)after);
        if (j > 0) sb_printf(&body, " %% %lld", (long long)s->size[d]);
        sb_printf(&body, ";\n");
    }
    operand_loads(s, inner, &dims, &body);
    const char *result;
    expr_locals(&body, inner, k->expr, &result);
    sb_printf(&body, "%sacc += %s;\n%s}\n", inner, result, ind);
    sb_printf(&body, "%spartial[q] = acc;\n", ind);
    sb_printf(tail1, "    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < %lld; q += (int64_t)gridDim.x * blockDim.x) {\n",
              (long long)partials);
    if (s->n_kept && (dims || names(body.s, "p")))
        sb_printf(tail1, "%sconst int64_t p = q %% %lld, c = q / %lld;\n", ind, (long long)s->kept_total, (long long)s->kept_total);
    else
        sb_printf(tail1, "%sconst int64_t c = q;\n", ind);
    kept_digits(s, dims, ind, tail1);
    sb_printf(tail1, "%s    }\n}\n", body.s);
    free(body.s);

    /* the outputs: the chunks in order */
    sb_printf(head2, "/* out = the %lld chunk sums of each of %lld outputs, in order%s%s */\n", (long long)chunks,
              (long long)s->kept_total, fold_scale ? ", times " : "", fold_scale ? k->scale : "");
    sb_printf(head2, "template <typename T_out>\nstatic __global__ void ");
    sb_printf(tail2, "(T_out *out, const float *partial) {\n");
    dims = 0;
    body = (sbuf){0};
    sb_printf(&body, "%sfloat acc = 0.0f;\n", ind);
    sb_printf(&body, "%sfor (int64_t c = 0; c < %lld; c++) acc += partial[c * %lld + p];\n", ind, (long long)chunks,
              (long long)s->kept_total);
    sb_printf(&body, "%sout[", ind);
    array_index(s, s->out_stride, k->out_offset, &dims, &body);
    if (fold_scale) sb_printf(&body, "] = acc * %s;\n", k->scale);
    else sb_printf(&body, "] = acc;\n");
    sb_printf(tail2, "    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < %lld; p += (int64_t)gridDim.x * blockDim.x) {\n",
              (long long)s->kept_total);
    kept_digits(s, dims, ind, tail2);
    sb_printf(tail2, "%s    }\n}\n", body.s);
    free(body.s);
}

/* The kernel of a nest whose positions may write one element twice (never made by the
 * emitter; kept for completeness): C's loops in one thread, scale included. */
static void serial_kernel(const nest *s, sbuf *head, sbuf *tail) {
    const cg_loop_nest *k = s->k;
    sb_printf(head, "/* out %s %s over ", k->accumulate ? "+=" : "=", k->expr);
    sizes_text(s, head);
    sb_printf(head, ", in one thread (positions share elements of out) */\n");
    kernel_signature(s, head, tail);
    char ind[80] = "    ";
    for (int d = 0; d < s->rank; d++) {
        sb_printf(tail, "%sfor (int64_t i%d = 0; i%d < %lld; i%d++) {\n", ind, d, d, (long long)s->size[d], d);
        strcat(ind, "    ");
    }
    /* every dim is a loop here: p never appears (no kept dims in the index rule) */
    nest all = *s;
    all.n_kept = 0;
    for (int d = 0; d < all.rank; d++) all.out_stride[d] = 0;
    unsigned dims = 0;
    operand_loads(&all, ind, &dims, tail);
    const char *result;
    expr_locals(tail, ind, k->expr, &result);
    sb_printf(tail, "%sout[", ind);
    array_index(&all, s->out_stride, k->out_offset, &dims, tail);
    sb_printf(tail, "] %s %s;\n", k->accumulate ? "+=" : "=", result);
    for (int d = s->rank - 1; d >= 0; d--) {
        ind[strlen(ind) - 4] = 0;
        sb_printf(tail, "%s}\n", ind);
    }
    if (k->scale) sb_printf(tail, "    for (int64_t i = 0; i < %lld; i++) out[i] *= %s;\n", (long long)k->out_elems, k->scale);
    sb_printf(tail, "}\n");
}

static void check_launch(cg_writer *w, const char *name) {
    cg_line(w, "if (dmrt_gpu_check_launch(ctx->gpu, \"%s\", __FILE__, __LINE__) != DMRT_OK) return device_failed(ctx);", name);
}

static void launch(cg_writer *w, const char *name, int64_t positions, int threads, const char *args) {
    int64_t blocks = (positions + threads - 1) / threads;
    if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
    cg_line(w, "%s<<<%lld, %d, 0, (cudaStream_t)dmrt_gpu_stream(ctx->gpu)>>>(%s);", name, (long long)blocks, threads, args);
    check_launch(w, name);
}

/* ", buffer" for each operand the kernel takes (kernel_signature's order). */
static void operand_args(const nest *s, sbuf *args) {
    for (int i = 0; i < s->k->n_in; i++)
        if (s->used[i] && !s->k->constant[i]) sb_printf(args, ", %s", s->k->buffer[i]);
}

static void split_launch(cg_writer *w, const nest *s, int64_t chunk, int fold_scale) {
    const cg_loop_nest *k = s->k;
    sbuf head1 = {0}, tail1 = {0}, head2 = {0}, tail2 = {0}, args = {0};
    split_kernels(s, chunk, fold_scale, &head1, &tail1, &head2, &tail2);
    char part[64];
    snprintf(part, sizeof part, "%s_partial", k->out);
    const char *chunks_kernel = kernel_named(w, part, &head1, &tail1), *sum_kernel = kernel_named(w, k->out, &head2, &tail2);
    operand_args(s, &args);
    sb_printf(&args, ", dmrt_gpu_sum_partials(ctx->gpu)");
    int64_t chunks = (s->summed_total + chunk - 1) / chunk;
    cg_line(w, "/* a long sum, split in %lld chunks: their sums, then each output's in chunk order */", (long long)chunks);
    launch(w, chunks_kernel, chunks * s->kept_total, THREADS, args.s + 2);
    args.n = 0;
    sb_printf(&args, "%s, dmrt_gpu_sum_partials(ctx->gpu)", k->out);
    launch(w, sum_kernel, s->kept_total, SUM_THREADS, args.s);
    free(head1.s), free(tail1.s), free(head2.s), free(tail2.s), free(args.s);
}

static void cuda_loop_nest(cg_writer *w, const cg_loop_nest *k);

/* The nest, then its cast_out in a kernel of its own: for the nests whose kernel does not
 * write each element of out once, by one thread (sums, partial or serial nests). */
static void cast_after(cg_writer *w, const cg_loop_nest *k) {
    cg_loop_nest plain = *k;
    plain.cast_out = NULL;
    cuda_loop_nest(w, &plain);
    static const char *const round_to[] = {[DT_BF16] = "dmrt_bf16_round(x)", [DT_F16] = "dmrt_f16_round(x)"};
    cg_loop_nest cast = {.rank = 1, .size = {k->out_elems}, .n_in = 1, .var = {"x"}, .buffer = {k->out}, .stride = {{1}},
                         .out = k->cast_out, .out_stride = {1}, .out_elems = k->out_elems,
                         .expr = round_to[k->cast_dtype == DT_F16 ? DT_F16 : DT_BF16]};
    cuda_loop_nest(w, &cast);
}

static void cuda_loop_nest(cg_writer *w, const cg_loop_nest *k) {
    nest s;
    nest_init(&s, k);
    int64_t positions = s.kept_total * s.summed_total;
    /* a parallel kernel needs each output element written by one position at most; and
     * without accumulation, by one position */
    int parallel = injective(&s) && (k->accumulate || s.n_summed == 0);
    int full = parallel && covers(&s);
    /* the scale multiplies every element of out: folded into the store when the
     * positions cover out, or when the others are the zeros of accumulation */
    int fold_scale = k->scale && (full || k->accumulate);
    if (positions == 0 || k->out_elems == 0) {
        /* C's loops run no iteration: out is zero when accumulated, else untouched */
        if (k->accumulate && k->out_elems > 0)
            cg_line(w, "if (dmrt_gpu_zero(ctx->gpu, %s, %lld * sizeof(float)) != DMRT_OK) return device_failed(ctx);", k->out,
                    (long long)k->out_elems);
        else cg_line(w, "/* no elements */");
        return;
    }
    if (!parallel || (k->scale && !fold_scale)) parallel = 0;
    if (k->cast_out && !(parallel && full && !k->accumulate && !split_chunk(&s, parallel))) {
        cast_after(w, k);
        return;
    }
    if (k->accumulate && !(parallel && full))
        cg_line(w, "if (dmrt_gpu_zero(ctx->gpu, %s, %lld * sizeof(float)) != DMRT_OK) return device_failed(ctx);", k->out,
                (long long)k->out_elems);
    int64_t chunk = split_chunk(&s, parallel);
    if (chunk) {
        split_launch(w, &s, chunk, fold_scale);
        return;
    }
    sbuf head = {0}, tail = {0};
    if (parallel) parallel_kernel(&s, fold_scale, &head, &tail);
    else serial_kernel(&s, &head, &tail);
    const char *name = kernel_named(w, k->out, &head, &tail);
    free(head.s);
    free(tail.s);
    sbuf args = {0};
    sb_printf(&args, "%s", k->out);
    operand_args(&s, &args);
    if (k->cast_out) sb_printf(&args, ", %s", k->cast_out);
    if (parallel) launch(w, name, s.kept_total, s.n_summed ? SUM_THREADS : THREADS, args.s);
    else launch(w, name, 1, 1, args.s);
    free(args.s);
}

/* ---- host scaffolding ------------------------------------------------------------------------ */

static void cuda_header_note(cg_writer *w, const char *m) {
    cg_line(w, "/* Target cuda: the context's storage (parameters, gradients, optimizer state, temporaries)");
    cg_line(w, " * is GPU memory, one device per context. Every pointer this API takes or returns is host");
    cg_line(w, " * memory: batches are copied to the device by forward and train_step, outputs back by");
    cg_line(w, " * %s_output_*, weight files through host buffers. */", m);
}

static void cuda_preamble(cg_writer *w) {
    cg_line(w, "#include <cuda_runtime.h>");
    cg_line(w, "#include <math.h>");
    cg_line(w, "#include <stdio.h>");
    cg_line(w, "#include <stdlib.h>");
    cg_line(w, "#include <string.h>");
    cg_blank(w);
    cg_line(w, "#include \"dmrt_cuda.h\"");
    cg_blank(w);
    cg_line(w, "/* Kernels of the loop nests (elementwise, reductions, layout) are below; the other kernels,");
    cg_line(w, " * matrix products, device memory and collectives are libdmrt_cuda's, on ctx->gpu. A kernel");
    cg_line(w, " * runs one thread per output position (int64 p, a grid-stride loop); a thread walks the");
    cg_line(w, " * dims it sums in order, as the C target's loops do. */");
}

static void cuda_ctx_fields(cg_writer *w) { cg_line(w, "dmrt_gpu *gpu; /* this rank's device, stream and handles */"); }

static void cuda_ctx_helpers(cg_writer *w) {
    cg_line(w, "/* A failed device call: its message (naming the call, file:line and CUDA's words) into");
    cg_line(w, " * ctx->error. */");
    cg_line(w, "static inline int device_failed(struct_ctx *ctx) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%%s\", dmrt_gpu_error(ctx->gpu));");
    cg_line(w, "    return DMRT_ERR_DEVICE;");
    cg_line(w, "}");
}

static void cuda_ctx_open(cg_writer *w, int partitioned, int tf32, const char *on_fail) {
    cg_line(w, "{");
    /* serial: on the device of the rank it is created beside (create_beside), if any */
    cg_line(w, "    const dmrt_gpu_options gpu_options = {%d /* tf32 */, DMRT_GPU_COMM_AUTO, %s};", tf32 ? 1 : 0,
            partitioned ? "NULL" : "beside");
    cg_line(w, "    ctx->gpu = dmrt_gpu_create(%s, &gpu_options, ctx->error, sizeof ctx->error);", partitioned ? "ctx->rank" : "NULL");
    cg_line(w, "}");
    cg_line(w, "if (!ctx->gpu) %s", on_fail);
}

static void cuda_ctx_close(cg_writer *w) { cg_line(w, "dmrt_gpu_destroy(ctx->gpu);"); }

static void cuda_alloc(cg_writer *w, const char *lhs, const char *bytes, const char *on_fail) {
    cg_line(w, "if (dmrt_gpu_alloc(ctx->gpu, (void **)&%s, %s) != DMRT_OK) %s", lhs, bytes, on_fail);
}

static void cuda_free(cg_writer *w, const char *ptr) { cg_line(w, "dmrt_gpu_free(ctx->gpu, %s);", ptr); }

static void cuda_copy(cg_writer *w, const char *dst, const char *src, const char *bytes, cg_copy_kind kind, const char *on_fail) {
    const char *k = kind == CG_HOST_TO_DEVICE ? "DMRT_HOST_TO_DEVICE"
                  : kind == CG_DEVICE_TO_HOST ? "DMRT_DEVICE_TO_HOST"
                                              : "DMRT_DEVICE_TO_DEVICE";
    cg_line(w, "if (dmrt_gpu_copy(ctx->gpu, %s, %s, %s, %s) != DMRT_OK) %s", dst, src, bytes, k, on_fail);
}

static void cuda_zero(cg_writer *w, const char *ptr, const char *bytes, const char *on_fail) {
    cg_line(w, "if (dmrt_gpu_zero(ctx->gpu, %s, %s) != DMRT_OK) %s", ptr, bytes, on_fail);
}

static void cuda_comm_callee(char *buf, size_t size, const char *op) { snprintf(buf, size, "dmrt_gpu_%s(ctx->gpu, ", op); }

/* Kernels skip rows with a bad index and record the first; the host learns of it once,
 * at the end of the phase (dmrt_gpu_fault_take synchronises) or of the step (step_end). */
static void cuda_fault_check(cg_writer *w, int end_of_phase) {
    if (!end_of_phase) return;
    cg_line(w, "if (dmrt_gpu_fault_take(ctx->gpu, &ctx->fault) != DMRT_OK) return device_failed(ctx);");
    cg_line(w, "if (ctx->fault.site) return data_fault(ctx);");
}

static int64_t cuda_xent_scratch_floats(int64_t rows, int64_t comm_size) {
    return dmrt_cuda_xent_scratch_floats(rows, comm_size);
}

static int64_t cuda_embed_grad_scratch_bytes(int64_t rows) { return dmrt_cuda_embed_grad_scratch_bytes(rows); }
static int64_t cuda_wgrad_scratch_floats(int64_t rows, int64_t n) { return dmrt_cuda_layernorm_wgrad_scratch_floats(rows, n); }

/* ---- library kernels ------------------------------------------------------------------------- */

void cg_cuda_checked(cg_writer *w, const char *call) {
    cg_line(w, "if (%s) != DMRT_OK)", call);
    cg_line(w, "    return device_failed(ctx);");
}

/* fp32 operands: dmrt_gpu_sgemm; 16-bit ones (their uint16_t bits): dmrt_gpu_gemm_half,
 * accumulated in fp32 as the C target's products of them are */
static void cuda_gemm(cg_writer *w, const cg_gemm *k) {
    char call[1024], callee[64];
    if (k->operands == DT_F32) snprintf(callee, sizeof callee, "dmrt_gpu_sgemm(ctx->gpu, ");
    else snprintf(callee, sizeof callee, "dmrt_gpu_gemm_half(ctx->gpu, %d, ", k->operands == DT_BF16);
    snprintf(call, sizeof call, "%s%d, %d, %lld, %lld, %lld, %s, %lld, %s, %lld, %s, %s, %lld, %lld, %lld, %lld, %lld",
             callee, k->trans_a, k->trans_b, (long long)k->m, (long long)k->n, (long long)k->k, k->a, (long long)k->lda, k->b,
             (long long)k->ldb, k->accumulate ? "1.0f" : "0.0f", k->c, (long long)k->ldc, (long long)(k->batch > 1 ? k->batch : 1),
             (long long)k->batch_stride_a, (long long)k->batch_stride_b, (long long)k->batch_stride_c);
    cg_cuda_checked(w, call);
}

/* --quantize: libdmrt_cuda's products of the narrow weight's device copy (quant.cu); the
 * host copy ctx->quant[slot] gives its shape, input scale and calibration record. The
 * weight-only modes widen it into the f32 parameter's storage (which holds the same
 * dequantized values: create and the trainer set it so), int8's calibration multiplies
 * that parameter. */
static void cuda_quant_gemm(cg_writer *w, const cg_quant_gemm *k) {
    char call[1024], weight[160];
    snprintf(weight, sizeof weight, "&ctx->quant[%d], ctx->quant_data[%d], ctx->quant_scale[%d]", k->slot, k->slot, k->slot);
    if (k->activations)
        snprintf(call, sizeof call, "dmrt_gpu_gemm_i8(ctx->gpu, %s, %s, ctx->quant_work, %lld, %s, %lld, %s, %s, %lld", weight,
                 k->b, (long long)k->m, k->a, (long long)k->lda, k->accumulate ? "1.0f" : "0.0f", k->c, (long long)k->ldc);
    else
        snprintf(call, sizeof call, "dmrt_gpu_gemm_wq(ctx->gpu, %s, %s, %lld, %s, %lld, %s, %s, %lld", weight, k->b,
                 (long long)k->m, k->a, (long long)k->lda, k->accumulate ? "1.0f" : "0.0f", k->c, (long long)k->ldc);
    cg_cuda_checked(w, call);
}

/* The collectives' label of a vocabulary-parallel cross-entropy. */
static void xent_what(const cg_xent *k, char *buf, size_t size) {
    char raw[512];
    snprintf(raw, sizeof raw, "cross-entropy of %s (%s)", k->logits_name ? k->logits_name : k->logits, k->where ? k->where : "?");
    c_string(raw, buf, size);
}

static void cuda_xent_stats(cg_writer *w, const cg_xent *k) {
    char call[2048];
    if (k->comm) {
        char what[600];
        xent_what(k, what, sizeof what);
        snprintf(call, sizeof call, "dmrt_gpu_xent_stats_split(ctx->gpu, %s, %s, %lld, %s, %s, %s, %lld, %lld, %s, %d, %s, \"%s\"",
                 k->comm, k->coord, (long long)k->comm_size, k->logits, k->targets, k->out, (long long)k->rows,
                 (long long)k->classes, k->scratch ? k->scratch : "NULL", k->fault_site,
                 k->position_base ? k->position_base : "0", what);
    } else {
        snprintf(call, sizeof call, "dmrt_gpu_xent_stats(ctx->gpu, %s, %s, %s, %lld, %lld, %d, %s", k->logits, k->targets, k->out,
                 (long long)k->rows, (long long)k->classes, k->fault_site, k->position_base ? k->position_base : "0");
    }
    cg_cuda_checked(w, call);
}

static void cuda_cross_entropy(cg_writer *w, const cg_xent *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_cross_entropy(ctx->gpu, %s, %s, %lld, %lld", k->stats, k->out, (long long)k->rows,
             (long long)k->mean_rows);
    cg_cuda_checked(w, call);
}

static void cuda_cross_entropy_grad(cg_writer *w, const cg_xent *k) {
    char call[2048], first_class[160];
    /* dloss: a device scalar, or a literal */
    const char *dev = k->dloss_is_buffer ? k->dloss : "NULL", *value = k->dloss_is_buffer ? "0.0f" : k->dloss;
    if (k->coord) snprintf(first_class, sizeof first_class, "(int64_t)%s * %lld", k->coord, (long long)k->classes);
    else snprintf(first_class, sizeof first_class, "0");
    snprintf(call, sizeof call, "dmrt_gpu_cross_entropy_grad(ctx->gpu, %s, %s, %s, %s, %s, %s, %lld, %lld, %s, %lld, %lld", k->logits,
             k->targets, k->stats, dev, value, k->out, (long long)k->rows, (long long)k->classes, first_class,
             (long long)k->all_classes, (long long)k->mean_rows);
    cg_cuda_checked(w, call);
}

/* torch.optim.SGD (dmrt_gpu_sgd; dialect_c.c's c_sgd) */
static void cuda_sgd(cg_writer *w, const cg_update *k) {
    const ir_optimizer *o = k->opt;
    char wd[64], mom[64], damp[64], call[1024];
    cg_float_literal(o->weight_decay, wd, sizeof wd);
    cg_float_literal(o->momentum, mom, sizeof mom);
    cg_float_literal(1.0 - o->dampening, damp, sizeof damp);
    snprintf(call, sizeof call, "dmrt_gpu_sgd(ctx->gpu, %s, %s, %s, %s, %s, %s, %s, %s, %d, %s", k->param, k->grad,
             k->state0 ? k->state0 : "NULL", k->count, "(float)ctx->lr", wd, mom, damp, o->nesterov ? 1 : 0, k->updates);
    cg_cuda_checked(w, call);
}

/* torch.optim.AdamW (dmrt_gpu_adamw): the step's factors in double on the host, exactly
 * as dialect_c.c's c_adamw computes them. */
static void cuda_adamw(cg_writer *w, const cg_update *k) {
    cg_adamw_literals lit;
    char call[1024];
    cg_line(w, "{");
    w->indent++;
    cg_adamw_prologue(w, k, &lit);
    snprintf(call, sizeof call, "dmrt_gpu_adamw(ctx->gpu, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, decay, step_size, bc2_sqrt",
             k->param, k->grad, k->state0, k->state1, k->count, lit.beta1, lit.one_minus_beta1, lit.beta2,
             lit.one_minus_beta2, lit.eps);
    cg_cuda_checked(w, call);
    w->indent--;
    cg_line(w, "}");
}

/* gradient clipping (dmrt_gpu_sum_squares, dmrt_gpu_scale) */
static void cuda_sum_squares(cg_writer *w, const char *x, const char *count, const char *sum) {
    char call[512];
    snprintf(call, sizeof call, "dmrt_gpu_sum_squares(ctx->gpu, %s, %s, &%s", x, count, sum);
    cg_cuda_checked(w, call);
}

static void cuda_scale(cg_writer *w, const char *x, const char *count, const char *factor) {
    char call[512];
    snprintf(call, sizeof call, "dmrt_gpu_scale(ctx->gpu, %s, %s, %s", x, count, factor);
    cg_cuda_checked(w, call);
}

/* --prune (dmrt_gpu_prune): the mask chosen in host memory on the ramp, applied on the device */
static void cuda_prune(cg_writer *w, const cg_prune *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_prune(ctx->gpu, %s, %s, %lld, %lld, %lld, %s, ctx->total_steps, &prune_schedule",
             k->weight, k->mask, (long long)k->n, (long long)k->channels, (long long)k->inner, k->updates);
    cg_cuda_checked(w, call);
}

static void cuda_prune_heads(cg_writer *w, const cg_prune_heads *k) {
    char call[512];
    snprintf(call, sizeof call, "dmrt_gpu_prune_heads(ctx->gpu, parts, %d, %lld, %s, ctx->total_steps, &prune_schedule",
             k->n_parts, (long long)k->units, k->updates);
    cg_cuda_checked(w, call);
}

/* dmrt_gpu_dropout: the levels as a dmrt_dropout_shape, each split level's offset this
 * rank's coordinate times its size */
static void cuda_dropout(cg_writer *w, const cg_dropout *k) {
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "dmrt_dropout_shape shape = {}; /* C++: zeroed */");
    cg_line(w, "shape.levels = %d;", k->levels);
    for (int l = 0; l < k->levels; l++) {
        char offset[96];
        if (k->split_axis[l] >= 0) snprintf(offset, sizeof offset, "ctx->coord[%d] * %lld", k->split_axis[l], (long long)k->size[l]);
        else snprintf(offset, sizeof offset, "0");
        cg_line(w, "shape.size[%d] = %lld, shape.whole[%d] = %lld, shape.offset[%d] = %s;", l, (long long)k->size[l], l,
                (long long)k->whole[l], l, offset);
    }
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_dropout(ctx->gpu, %s, %s, %lld, &shape, %s, ctx->seed, ctx->step, %d, %lluu, %s", k->x,
             k->out, (long long)k->count, k->first, k->op, k->threshold, k->scale);
    cg_cuda_checked(w, call);
    w->indent--;
    cg_line(w, "}");
}

static void cuda_softmax(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_softmax(ctx->gpu, %s, %s, %lld, %lld, %lld, %s, %lld", k->x, k->out, (long long)k->outer,
             (long long)k->n, (long long)k->inner, k->scale ? k->scale : "1.0f", (long long)k->causal_queries);
    cg_cuda_checked(w, call);
}

static void cuda_softmax_grad(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_softmax_grad(ctx->gpu, %s, %s, %s, %lld, %lld, %lld, %s, %lld", k->y, k->dy, k->out,
             (long long)k->outer, (long long)k->n, (long long)k->inner, k->scale ? k->scale : "1.0f", (long long)k->causal_queries);
    cg_cuda_checked(w, call);
}

/* (outer, n queries, inner keys) */
static void cuda_causal_mask(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_causal_mask(ctx->gpu, %s, %s, %lld, %lld, %lld, %s", k->x, k->out, (long long)k->outer,
             (long long)k->n, (long long)k->inner, k->fill);
    cg_cuda_checked(w, call);
}

/* Layernorm works along the last dim (inner 1): rows = outer. */
static void cuda_layernorm(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_layernorm(ctx->gpu, %s, %s, %s, %s, %lld, %lld, %s", k->x, k->weight, k->bias, k->out,
             (long long)(k->outer * k->inner), (long long)k->n, k->eps);
    cg_cuda_checked(w, call);
}

static void cuda_layernorm_grad(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_layernorm_grad(ctx->gpu, %s, %s, %s, %s, %lld, %lld, %s", k->x, k->weight, k->dy, k->out,
             (long long)(k->outer * k->inner), (long long)k->n, k->eps);
    cg_cuda_checked(w, call);
}

static void cuda_layernorm_wgrad(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_layernorm_wgrad(ctx->gpu, %s, %s, %s, %lld, %lld, %s, %s", k->x, k->dy, k->out,
             (long long)(k->outer * k->inner), (long long)k->n, k->eps, k->scratch ? k->scratch : "NULL");
    cg_cuda_checked(w, call);
}

static void cuda_embed(cg_writer *w, const cg_embed *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_embed(ctx->gpu, %s, %s, %s, %lld, %lld, %lld, %lld, %s, %d, %s", k->table, k->ids,
             k->out, (long long)k->rows, (long long)k->n, (long long)k->cols, (long long)k->vocab,
             k->first_row ? k->first_row : "0", k->fault_site, k->position_base ? k->position_base : "0");
    cg_cuda_checked(w, call);
}

static void cuda_embed_grad(cg_writer *w, const cg_embed *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_embed_grad(ctx->gpu, %s, %s, %s, %lld, %lld, %lld, %s, %s", k->ids, k->dy, k->out,
             (long long)k->rows, (long long)k->n, (long long)k->cols, k->first_row ? k->first_row : "0",
             k->scratch ? k->scratch : "NULL");
    cg_cuda_checked(w, call);
}

const cg_dialect cg_dialect_cuda = {
    .name = "cuda",
    .source_suffix = "cu",
    .separate_memory = 1,
    .block_alignment = 256, /* one cudaMalloc per context, at cudaMalloc's own alignment */
    /* a device collective's message is the gpu's (a staged one's host failure is copied
     * there too); a host collective's (gathering weights) the rank's */
    .storage_note = "device memory",
    .comm_error = "(dmrt_gpu_error(ctx->gpu)[0] ? dmrt_gpu_error(ctx->gpu) : dmrt_rank_error(ctx->rank))",
    .memory_peak = "dmrt_gpu_peak_bytes(c->gpu)",
    /* the rest not yet (docs/gpu.md, "Not done yet") */
    .can = {.predict = 1, .checkpoints = 1, .dropout = 1, .bf16 = 1, .f16 = 1, .zero = 1, .interleaved = 1, .weight_versions = 1,
            .compress = 1, .param_servers = 1, .quantize = 1, .flat_update = 1, .attention_16bit = 1,
            .fused_cast = 1},
    .round_to = {[DT_BF16] = "dmrt_bf16_round(x)", [DT_F16] = "dmrt_f16_round(x)"},
    .toolchain = {.compiler = "nvcc", .compiler_env = "NVCC", .toolkit = "CUDA",
                  .libraries = "-ldmrt_cuda -lcudart -lcublas -lnccl -lcudnn -lstdc++", .toolkit_libs = 1, .tf32 = 1},
    .header_note = cuda_header_note,
    .create_failures = ", \"no CUDA device: ...\"",
    .threads_note = " This target's kernels run on the GPU: it changes nothing there.",
    .preamble = cuda_preamble,
    .ctx_fields = cuda_ctx_fields,
    .ctx_helpers = cuda_ctx_helpers,
    .ctx_open = cuda_ctx_open,
    .ctx_close = cuda_ctx_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .upload = cuda_upload,
    .upload_reserve = cuda_upload_reserve,
    .step_end = cuda_step_end,
    .clip_reserve = cuda_clip_reserve,
    .clip_squares = cuda_clip_squares,
    .clip_factor = cuda_clip_factor,
    .clip_scale = cuda_clip_scale,
    .comm_callee = cuda_comm_callee,
    .fault_check = cuda_fault_check,
    .xent_scratch_floats = cuda_xent_scratch_floats,
    .embed_grad_scratch_bytes = cuda_embed_grad_scratch_bytes,
    .wgrad_scratch_floats = cuda_wgrad_scratch_floats,
    .loop_nest = cuda_loop_nest,
    .gemm = cuda_gemm,
    .xent_stats = cuda_xent_stats,
    .cross_entropy = cuda_cross_entropy,
    .cross_entropy_grad = cuda_cross_entropy_grad,
    .sgd = cuda_sgd,
    .adamw = cuda_adamw,
    .sum_squares = cuda_sum_squares,
    .scale = cuda_scale,
    .prune = cuda_prune,
    .prune_heads = cuda_prune_heads,
    .dropout = cuda_dropout,
    .attention_scratch_floats = cg_cuda_attention_scratch_floats,
    .attention = cg_cuda_attention,
    .attention_grad = cg_cuda_attention_grad,
    .softmax = cuda_softmax,
    .softmax_grad = cuda_softmax_grad,
    .causal_mask = cuda_causal_mask,
    .layernorm = cuda_layernorm,
    .layernorm_grad = cuda_layernorm_grad,
    .layernorm_wgrad = cuda_layernorm_wgrad,
    .embed = cuda_embed,
    .embed_grad = cuda_embed_grad,
    .quant_gemm = cuda_quant_gemm,
    .quant_work_bytes = dmrt_cuda_quant_work_bytes,
    .finish = cuda_finish,
};
