/* dialect_cuda_nest.c: the CUDA dialect's loop nests (elementwise, reductions,
 * broadcasts, transposes, slices, pads) as __global__ kernels generated into the file.
 *
 * A loop-nest kernel computes what dialect_c.c's loops compute, in the same order of
 * float operations for each output element: one thread per output position (a
 * grid-stride loop over them, int64 positions), which walks the summed dims, if any, in
 * increasing order (no atomics: results are deterministic). Sizes and strides are
 * literals in the kernel, pointers its arguments, and every pointer's element type a
 * template parameter (float, or int32_t where a loop nest copies ids), so that layers of
 * the same shape share one kernel: a kernel whose text was written before in the file is
 * reused (the table lives in w->kernels->dialect_state, freed by cg_cuda_finish). A kernel
 * is named k<serial>_<its first output>, static (no external symbol), and launched on
 * the rank's stream with a dmrt_gpu_check_launch after it. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "dialect.h"
#include "dialect_cuda_internal.h"
#include "text_buf.h"
#include "../runtime/cuda/dmrt_cuda_sizes.h"

#define THREADS 256       /* per block of a loop-nest kernel */
#define SUM_THREADS 64    /* per block of one that sums: its few long-running threads
                           * spread over more multiprocessors */
#define MAX_BLOCKS 65535  /* the grid-stride loop covers the rest */

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

void cg_cuda_c_string(const char *s, char *out, size_t size) {
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

void cg_cuda_finish(cg_writer *w) {
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
static const char *kernel_named(cg_writer *w, const char *out, const dm_text *head, const dm_text *tail) {
    kernel_table *t = table_of(w);
    dm_text key = {0};
    dm_text_printf(&key, "%s\x01%s", head->s, tail->s);
    uint64_t h = fnv1a(key.s);
    for (int i = 0; i < t->n; i++)
        if (t->e[i].hash == h && strcmp(t->e[i].key, key.s) == 0) {
            dm_text_free(&key);
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
    dm_text text = {0};
    dm_text_printf(&text, "%s%s%s", head->s, name, tail->s);
    for (const char *line = text.s; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len) cg_line(w->kernels, "%.*s", (int)len, line);
        else cg_blank(w->kernels);
        line += len + (nl ? 1 : 0);
    }
    cg_blank(w->kernels);
    dm_text_free(&text);
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
/* The `=` of the statement from rest to end that assigns a local, or NULL (a comparison's
 * ==, !=, <=, >= is not one). */
static const char *local_equals(const char *rest, const char *end) {
    for (const char *p = rest; p < end; p++)
        if (*p == '=' && p[1] != '=' && (p == rest || !strchr("=!<>", p[-1]))) return p;
    return NULL;
}

static void expr_locals(dm_text *b, const char *ind, const char *expr, const char **result) {
    const char *rest = expr;
    for (const char *semi; (semi = strchr(rest, ';')); rest = semi + 1) {
        const char *eq = local_equals(rest, semi);
        if (!eq) continue;
        const char *name = rest, *name_end = eq, *value = eq + 1, *value_end = semi;
        while (name < name_end && isspace((unsigned char)*name)) name++;
        while (name_end > name && isspace((unsigned char)name_end[-1])) name_end--;
        while (value < value_end && isspace((unsigned char)*value)) value++;
        while (value_end > value && isspace((unsigned char)value_end[-1])) value_end--;
        dm_text_printf(b, "%sconst float %.*s = %.*s;\n", ind, (int)(name_end - name), name, (int)(value_end - value), value);
    }
    while (isspace((unsigned char)*rest)) rest++;
    *result = rest;
}

/* The name of expr's first local ("name = e; ..."), which also_out stores; expr_locals'
 * first statement. */
static void first_local(const char *expr, char *name, size_t size) {
    const char *semi = strchr(expr, ';'), *eq = semi ? local_equals(expr, semi) : NULL, *start = expr;
    while (isspace((unsigned char)*start)) start++;
    const char *end = eq ? eq : start;
    while (end > start && isspace((unsigned char)end[-1])) end--;
    snprintf(name, size, "%.*s", (int)(end - start), start);
}

/* The kernel's last parameters: also_out's and cast_out's copies, NULL for neither. */
static const char *extra_params(const cg_loop_nest *k, char *buf, size_t size) {
    if (!k->also_out && !k->cast_out) return NULL;
    snprintf(buf, size, "%s%s%s", k->also_out ? "float *also_" : "", k->also_out && k->cast_out ? ", " : "",
             k->cast_out ? "uint16_t *cast_" : "");
    return buf;
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
static void array_index(const nest *s, const int64_t *stride, int64_t offset, unsigned *dims, dm_text *b) {
    size_t start = b->n;
    if (offset) dm_text_printf(b, "%lld", (long long)offset);
    int linear = s->n_kept > 0;
    for (int j = 0; j < s->n_kept; j++) linear &= stride[s->kept[j]] == s->canon[s->kept[j]];
    if (linear) dm_text_printf(b, "%sp", b->n > start ? " + " : "");
    for (int d = 0; d < s->rank; d++) {
        int kept = s->out_stride[d] != 0;
        if (stride[d] == 0 || (kept && linear)) continue;
        if (kept) *dims |= 1u << d;
        if (stride[d] == 1) dm_text_printf(b, "%si%d", b->n > start ? " + " : "", d);
        else dm_text_printf(b, "%si%d * %lld", b->n > start ? " + " : "", d, (long long)stride[d]);
    }
    if (b->n == start) dm_text_printf(b, "0");
}

/* "(8192, 768)" */
static void sizes_text(const nest *s, dm_text *b) {
    dm_text_printf(b, "(");
    for (int d = 0; d < s->rank; d++) dm_text_printf(b, "%s%lld", d ? ", " : "", (long long)s->size[d]);
    dm_text_printf(b, ")");
}

/* "template <...>\nstatic __global__ void " and, after the name, "(T_out *out, ...)"
 * (without out unless with_out) with the pointers of the operands expr names, then
 * `last` when given. */
static void kernel_signature_with(const nest *s, int with_out, const char *last, dm_text *head, dm_text *tail) {
    const cg_loop_nest *k = s->k;
    int params = 0;
    dm_text_printf(tail, "(");
    if (with_out) {
        dm_text_printf(head, "template <typename T_out");
        dm_text_printf(tail, "T_out *out");
        params = 1;
    }
    for (int i = 0; i < k->n_in; i++) {
        if (!s->used[i] || k->constant[i]) continue;
        dm_text_printf(head, "%stypename T_%s", params ? ", " : "template <", k->var[i]);
        dm_text_printf(tail, "%sconst T_%s *%s_", params ? ", " : "", k->var[i], k->var[i]);
        params++;
    }
    if (last) dm_text_printf(tail, "%s%s", params ? ", " : "", last);
    dm_text_printf(head, "%sstatic __global__ void ", params ? ">\n" : "");
    dm_text_printf(tail, ") {\n");
}

/* Each operand expr names as a local of its name: `const T_x x = x_[index];` or the
 * literal of a constant operand. */
static void operand_loads(const nest *s, const char *ind, unsigned *dims, dm_text *b) {
    const cg_loop_nest *k = s->k;
    for (int i = 0; i < k->n_in; i++) {
        if (!s->used[i]) continue;
        if (k->constant[i]) {
            dm_text_printf(b, "%sconst float %s = %s;\n", ind, k->var[i], k->constant[i]);
            continue;
        }
        dm_text_printf(b, "%sconst T_%s %s = %s_[", ind, k->var[i], k->var[i], k->var[i]);
        array_index(s, s->stride[i], k->offset[i], dims, b);
        dm_text_printf(b, "];\n");
    }
}

/* p's digits for the kept dims in dims, the fastest kept dim first: `const int64_t iD = ...;` */
static void kept_digits(const nest *s, unsigned dims, const char *ind, dm_text *b) {
    for (int d = 0; d < s->rank; d++) {
        if (!(dims >> d & 1u)) continue;
        int j = 0;
        while (s->kept[j] != d) j++;
        int64_t below = 1;
        for (int l = 0; l < j; l++) below *= s->size[s->kept[l]];
        dm_text_printf(b, "%sconst int64_t i%d = ", ind, d);
        if (below == 1) dm_text_printf(b, "p");
        else dm_text_printf(b, "p / %lld", (long long)below);
        if (j < s->n_kept - 1) dm_text_printf(b, " %% %lld", (long long)s->size[d]);
        dm_text_printf(b, ";\n");
    }
}

/* The kernel of a nest the threads can split: one thread per output position. */
static void parallel_kernel(const nest *s, int fold_scale, dm_text *head, dm_text *tail) {
    const cg_loop_nest *k = s->k;
    dm_text_printf(head, "/* out = %s over ", k->expr);
    sizes_text(s, head);
    if (s->n_summed) {
        dm_text_printf(head, ", summed over dim%s", s->n_summed > 1 ? "s" : "");
        for (int j = 0; j < s->n_summed; j++) dm_text_printf(head, "%s %d", j ? "," : "", s->summed[j]);
    }
    if (fold_scale) dm_text_printf(head, ", times %s", k->scale);
    char also[64] = "", extra[64];
    if (k->also_out) first_local(k->expr, also, sizeof also);
    if (k->also_out) dm_text_printf(head, "; and also_ = %s", also);
    if (k->cast_out) dm_text_printf(head, "; and cast_ = %s(out)", cg_round_function(k->cast_dtype));
    dm_text_printf(head, " */\n");
    kernel_signature_with(s, 1, extra_params(k, extra, sizeof extra), head, tail);

    /* the body first: it tells which kept dims need their index */
    unsigned dims = 0;
    dm_text body = {0};
    const char *ind = "        ";
    const char *result;
    char inner_ind[64];
    snprintf(inner_ind, sizeof inner_ind, "%s", ind);
    if (k->accumulate && s->n_summed) {
        dm_text_printf(&body, "%sfloat acc = 0.0f;\n", ind);
        for (int j = 0; j < s->n_summed; j++) {
            int d = s->summed[j];
            dm_text_printf(&body, "%sfor (int64_t i%d = 0; i%d < %lld; i%d++) {\n", inner_ind, d, d, (long long)s->size[d], d);
            strcat(inner_ind, "    ");
        }
        operand_loads(s, inner_ind, &dims, &body);
        expr_locals(&body, inner_ind, k->expr, &result);
        dm_text_printf(&body, "%sacc += %s;\n", inner_ind, result);
        for (int j = s->n_summed - 1; j >= 0; j--) {
            inner_ind[strlen(inner_ind) - 4] = 0;
            dm_text_printf(&body, "%s}\n", inner_ind);
        }
        dm_text_printf(&body, "%sout[", ind);
        array_index(s, s->out_stride, k->out_offset, &dims, &body);
        if (fold_scale) dm_text_printf(&body, "] = acc * %s;\n", k->scale);
        else dm_text_printf(&body, "] = acc;\n");
    } else {
        operand_loads(s, ind, &dims, &body);
        expr_locals(&body, ind, k->expr, &result);
        dm_text at = {0};
        array_index(s, s->out_stride, k->out_offset, &dims, &at);
        /* also_out: out dense (a bias's activation), so the same index */
        if (k->also_out) dm_text_printf(&body, "%salso_[%s] = %s;\n", ind, at.s, also);
        if (fold_scale) dm_text_printf(&body, "%sout[%s] = (%s) * %s;\n", ind, at.s, result, k->scale);
        else dm_text_printf(&body, "%sout[%s] = %s;\n", ind, at.s, result);
        /* the cast's copy (cast_out: out dense, so the same index) */
        if (k->cast_out)
            dm_text_printf(&body, "%scast_[%s] = %s((float)out[%s]);\n", ind, at.s,
                      cg_round_function(k->cast_dtype), at.s);
        dm_text_free(&at);
    }

    dm_text_printf(tail, "    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < %lld; p += (int64_t)gridDim.x * blockDim.x) {\n",
              (long long)s->kept_total);
    kept_digits(s, dims, ind, tail);
    dm_text_printf(tail, "%s    }\n}\n", body.s);
    dm_text_free(&body);
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
static void split_kernels(const nest *s, int64_t chunk, int fold_scale, dm_text *head1, dm_text *tail1, dm_text *head2,
                          dm_text *tail2) {
    const cg_loop_nest *k = s->k;
    int64_t chunks = (s->summed_total + chunk - 1) / chunk, partials = chunks * s->kept_total;
    const char *ind = "        ", *inner = "            ";
    /* the chunks: partial[c * kept + p] = the sum of chunk c for output p */
    dm_text_printf(head1, "/* partial sums of %s over ", k->expr);
    sizes_text(s, head1);
    dm_text_printf(head1, ", summed over dim%s", s->n_summed > 1 ? "s" : "");
    for (int j = 0; j < s->n_summed; j++) dm_text_printf(head1, "%s %d", j ? "," : "", s->summed[j]);
    dm_text_printf(head1, ": %lld chunks of %lld */\n", (long long)chunks, (long long)chunk);
    kernel_signature_with(s, 0, "float *partial", head1, tail1);
    unsigned dims = 0;
    dm_text body = {0};
    dm_text_printf(&body, "%sfloat acc = 0.0f;\n", ind);
    dm_text_printf(&body, "%sconst int64_t end = (c + 1) * %lld < %lld ? (c + 1) * %lld : %lld;\n", ind, (long long)chunk,
              (long long)s->summed_total, (long long)chunk, (long long)s->summed_total);
    dm_text_printf(&body, "%sfor (int64_t r = c * %lld; r < end; r++) {\n", ind, (long long)chunk);
    int64_t after = s->summed_total;
    for (int j = 0; j < s->n_summed; j++) {
        int d = s->summed[j], named = 0;
        after /= s->size[d];
        for (int i = 0; i < k->n_in; i++) named |= s->used[i] && !k->constant[i] && s->stride[i][d] != 0;
        if (!named) continue;   /* an unused local is an nvcc warning */
        dm_text_printf(&body, "%sconst int64_t i%d = r", inner, d);
        if (after > 1) dm_text_printf(&body, " / %lld", (long long)after);
        if (j > 0) dm_text_printf(&body, " %% %lld", (long long)s->size[d]);
        dm_text_printf(&body, ";\n");
    }
    operand_loads(s, inner, &dims, &body);
    const char *result;
    expr_locals(&body, inner, k->expr, &result);
    dm_text_printf(&body, "%sacc += %s;\n%s}\n", inner, result, ind);
    dm_text_printf(&body, "%spartial[q] = acc;\n", ind);
    dm_text_printf(tail1, "    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < %lld; q += (int64_t)gridDim.x * blockDim.x) {\n",
              (long long)partials);
    /* q = c * kept + p: the chunk is q / kept also where no operand reads the output's
     * position p (every output the same sum) */
    if (s->n_kept && (dims || names(body.s, "p")))
        dm_text_printf(tail1, "%sconst int64_t p = q %% %lld, c = q / %lld;\n", ind, (long long)s->kept_total, (long long)s->kept_total);
    else if (s->n_kept && s->kept_total > 1)
        dm_text_printf(tail1, "%sconst int64_t c = q / %lld;\n", ind, (long long)s->kept_total);
    else
        dm_text_printf(tail1, "%sconst int64_t c = q;\n", ind);
    kept_digits(s, dims, ind, tail1);
    dm_text_printf(tail1, "%s    }\n}\n", body.s);
    dm_text_free(&body);

    /* the outputs: the chunks in order */
    dm_text_printf(head2, "/* out = the %lld chunk sums of each of %lld outputs, in order%s%s */\n", (long long)chunks,
              (long long)s->kept_total, fold_scale ? ", times " : "", fold_scale ? k->scale : "");
    dm_text_printf(head2, "template <typename T_out>\nstatic __global__ void ");
    dm_text_printf(tail2, "(T_out *out, const float *partial) {\n");
    dims = 0;
    body = (dm_text){0};
    dm_text_printf(&body, "%sfloat acc = 0.0f;\n", ind);
    dm_text_printf(&body, "%sfor (int64_t c = 0; c < %lld; c++) acc += partial[c * %lld + p];\n", ind, (long long)chunks,
              (long long)s->kept_total);
    dm_text_printf(&body, "%sout[", ind);
    array_index(s, s->out_stride, k->out_offset, &dims, &body);
    if (fold_scale) dm_text_printf(&body, "] = acc * %s;\n", k->scale);
    else dm_text_printf(&body, "] = acc;\n");
    dm_text_printf(tail2, "    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < %lld; p += (int64_t)gridDim.x * blockDim.x) {\n",
              (long long)s->kept_total);
    kept_digits(s, dims, ind, tail2);
    dm_text_printf(tail2, "%s    }\n}\n", body.s);
    dm_text_free(&body);
}

/* The kernel of a nest whose positions may write one element twice (never made by the
 * emitter; kept for completeness): C's loops in one thread, scale included. */
static void serial_kernel(const nest *s, dm_text *head, dm_text *tail) {
    const cg_loop_nest *k = s->k;
    dm_text_printf(head, "/* out %s %s over ", k->accumulate ? "+=" : "=", k->expr);
    sizes_text(s, head);
    dm_text_printf(head, ", in one thread (positions share elements of out) */\n");
    char also[64] = "", extra[64];
    if (k->also_out) first_local(k->expr, also, sizeof also);
    kernel_signature_with(s, 1, extra_params(k, extra, sizeof extra), head, tail);
    char ind[80] = "    ";
    for (int d = 0; d < s->rank; d++) {
        dm_text_printf(tail, "%sfor (int64_t i%d = 0; i%d < %lld; i%d++) {\n", ind, d, d, (long long)s->size[d], d);
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
    dm_text at = {0};
    array_index(&all, s->out_stride, k->out_offset, &dims, &at);
    if (k->also_out) dm_text_printf(tail, "%salso_[%s] = %s;\n", ind, at.s, also);
    dm_text_printf(tail, "%sout[%s] %s %s;\n", ind, at.s, k->accumulate ? "+=" : "=", result);
    dm_text_free(&at);
    for (int d = s->rank - 1; d >= 0; d--) {
        ind[strlen(ind) - 4] = 0;
        dm_text_printf(tail, "%s}\n", ind);
    }
    if (k->scale) dm_text_printf(tail, "    for (int64_t i = 0; i < %lld; i++) out[i] *= %s;\n", (long long)k->out_elems, k->scale);
    dm_text_printf(tail, "}\n");
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
static void operand_args(const nest *s, dm_text *args) {
    for (int i = 0; i < s->k->n_in; i++)
        if (s->used[i] && !s->k->constant[i]) dm_text_printf(args, ", %s", s->k->buffer[i]);
}

static void split_launch(cg_writer *w, const nest *s, int64_t chunk, int fold_scale) {
    const cg_loop_nest *k = s->k;
    dm_text head1 = {0}, tail1 = {0}, head2 = {0}, tail2 = {0}, args = {0};
    split_kernels(s, chunk, fold_scale, &head1, &tail1, &head2, &tail2);
    char part[64];
    snprintf(part, sizeof part, "%s_partial", k->out);
    const char *chunks_kernel = kernel_named(w, part, &head1, &tail1), *sum_kernel = kernel_named(w, k->out, &head2, &tail2);
    operand_args(s, &args);
    dm_text_printf(&args, ", dmrt_gpu_sum_partials(ctx->gpu)");
    int64_t chunks = (s->summed_total + chunk - 1) / chunk;
    cg_line(w, "/* a long sum, split in %lld chunks: their sums, then each output's in chunk order */", (long long)chunks);
    launch(w, chunks_kernel, chunks * s->kept_total, THREADS, args.s + 2);
    args.n = 0;
    dm_text_printf(&args, "%s, dmrt_gpu_sum_partials(ctx->gpu)", k->out);
    launch(w, sum_kernel, s->kept_total, SUM_THREADS, args.s);
    dm_text_free(&head1), dm_text_free(&tail1), dm_text_free(&head2), dm_text_free(&tail2), dm_text_free(&args);
}


/* The nest, then its cast_out in a kernel of its own: for the nests whose kernel does not
 * write each element of out once, by one thread (sums, partial or serial nests). */
static void cast_after(cg_writer *w, const cg_loop_nest *k) {
    cg_loop_nest plain = *k;
    plain.cast_out = NULL;
    cg_cuda_loop_nest(w, &plain);
    cg_loop_nest cast = {.rank = 1, .size = {k->out_elems}, .n_in = 1, .var = {"x"}, .buffer = {k->out}, .stride = {{1}},
                         .out = k->cast_out, .out_stride = {1}, .out_elems = k->out_elems,
                         .expr = cg_dialect_cuda.round_to[k->cast_dtype]};
    cg_cuda_loop_nest(w, &cast);
}

void cg_cuda_loop_nest(cg_writer *w, const cg_loop_nest *k) {
    if (k->also_out && k->accumulate) { /* the kernels store also_ only where they store out once */
        fprintf(stderr, "dmc: internal error: a CUDA loop nest with also_out accumulates (%s)\n", k->out);
        abort();
    }
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
    dm_text head = {0}, tail = {0};
    if (parallel) parallel_kernel(&s, fold_scale, &head, &tail);
    else serial_kernel(&s, &head, &tail);
    const char *name = kernel_named(w, k->out, &head, &tail);
    dm_text_free(&head);
    dm_text_free(&tail);
    dm_text args = {0};
    dm_text_printf(&args, "%s", k->out);
    operand_args(&s, &args);
    if (k->also_out) dm_text_printf(&args, ", %s", k->also_out);
    if (k->cast_out) dm_text_printf(&args, ", %s", k->cast_out);
    if (parallel) launch(w, name, s.kept_total, s.n_summed ? SUM_THREADS : THREADS, args.s);
    else launch(w, name, 1, 1, args.s);
    dm_text_free(&args);
}
