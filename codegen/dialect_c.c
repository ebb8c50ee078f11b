/* dialect_c.c: the C dialect. Plain loops the compiler can vectorise, CBLAS through
 * dmrt_sgemm, and the loss and optimizer kernels written to match PyTorch's order of
 * operations (so that results agree to float rounding). */
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "dialect_c_internal.h"
#include "../runtime/dmrt.h"
#include "../runtime/dmrt_attention.h"

void cg_line(cg_writer *w, const char *fmt, ...) {
    for (int i = 0; i < w->indent; i++) fputs("    ", w->f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(w->f, fmt, ap);
    va_end(ap);
    fputc('\n', w->f);
}

void cg_blank(cg_writer *w) { fputc('\n', w->f); }

void cg_float_literal(double v, char *buf, size_t size) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.9g", v);
    int has_point = strpbrk(tmp, ".e") != NULL;
    snprintf(buf, size, "%s%sf", tmp, has_point ? "" : ".0");
}

/* "i0 * 1024 + i1": the flat offset of an operand at the loop position. */
static void index_expr(const cg_loop_nest *k, const int64_t *stride, int64_t offset, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    if (offset) {
        int w = snprintf(buf, size, "%lld", (long long)offset);
        if (w > 0) n = (size_t)w;
    }
    for (int d = 0; d < k->rank; d++) {
        if (stride[d] == 0) continue;
        int w = stride[d] == 1 ? snprintf(buf + n, size - n, "%si%d", n ? " + " : "", d)
                               : snprintf(buf + n, size - n, "%si%d * %lld", n ? " + " : "", d, (long long)stride[d]);
        if (w > 0) n += (size_t)w;
        if (n >= size) break;
    }
    if (!n) snprintf(buf, size, "0");
}

/* expr with each operand variable replaced by its element (or literal). */
static void substitute(const cg_loop_nest *k, const char *expr, char *out, size_t size) {
    const char *p = expr;
    size_t n = 0;
    while (*p && n + 1 < size) {
        if (isalpha((unsigned char)*p) || *p == '_') {
            const char *start = p;
            while (isalnum((unsigned char)*p) || *p == '_') p++;
            size_t len = (size_t)(p - start);
            int done = 0;
            for (int i = 0; i < k->n_in && !done; i++) {
                if (strlen(k->var[i]) != len || strncmp(k->var[i], start, len) != 0) continue;
                char idx[256];
                int w;
                if (k->constant[i]) {
                    w = snprintf(out + n, size - n, "%s", k->constant[i]);
                } else {
                    index_expr(k, k->stride[i], k->offset[i], idx, sizeof idx);
                    w = snprintf(out + n, size - n, "%s[%s]", k->buffer[i], idx);
                }
                if (w > 0) n += (size_t)w;
                done = 1;
            }
            if (!done) {
                int w = snprintf(out + n, size - n, "%.*s", (int)len, start);
                if (w > 0) n += (size_t)w;
            }
        } else if (isdigit((unsigned char)*p) || *p == '.') {
            while (isdigit((unsigned char)*p) || *p == '.' || *p == 'f') out[n++] = *p++;
        } else {
            out[n++] = *p++;
        }
        if (n >= size) n = size - 1;
    }
    out[n] = 0;
}

/* ---- splitting loops over the rank's threads ---- */

/* The columns of a block of a reduction over rows (c_loop_nest's reduce_columns). */
#define REDUCE_BLOCK 64

void cg_c_parallel_for(cg_writer *w, int loops) {
    if (loops <= 1) cg_line(w, "DMRT_PARALLEL_FOR(ctx->threads)");
    else cg_line(w, "DMRT_PARALLEL_FOR_COLLAPSE(ctx->threads, %d)", loops);
}

/* The same for an innermost loop of `count` iterations (blocks at multiples of 16). */
static void parallel_for_vector_threads(cg_writer *w, const char *threads, const char *count) {
    cg_line(w, "DMRT_PARALLEL_FOR_VECTOR(%s, %s)", threads, count);
}

static void parallel_for_vector(cg_writer *w, const char *count) { parallel_for_vector_threads(w, "ctx->threads", count); }

/* Where a loop nest splits over threads: before the loop of dim `at`, over `loops` nested
 * loops (0: it stays on one thread). Only dims whose iterations write elements of their
 * own may split (a sum's reduced dims may not): the leading dims with an output stride.
 * The innermost loop is kept whole, for the vector unit, unless it is the only one left
 * with enough iterations. */
typedef struct loop_split {
    int at, loops;
} loop_split;

static loop_split split_of(const cg_loop_nest *k) {
    loop_split none = {0, 0};
    int64_t total = 1;
    for (int d = 0; d < k->rank; d++) total *= k->size[d];
    if (total < PARALLEL_MIN_ELEMS) return none;
    int own = 0;
    while (own < k->rank && k->out_stride[own] != 0) own++;
    if (own == 0) return none;
    int keep_inner = k->rank > 1 ? k->rank - 1 : 1;
    int64_t iterations = 1;
    for (int d = 0; d < own && d < keep_inner; d++) {
        iterations *= k->size[d];
        if (iterations >= PARALLEL_MIN_ITERATIONS) return (loop_split){0, d + 1};
    }
    if (own == k->rank && k->size[k->rank - 1] >= PARALLEL_MIN_ITERATIONS) return (loop_split){k->rank - 1, 1};
    return (loop_split){0, own < keep_inner ? own : keep_inner};
}

/* A sum over the rows of a (rows, columns) nest into (columns) (a bias's gradient): blocks
 * of columns on the threads, each summing its columns over every row in order, so that
 * each sum adds the same terms in the same order as one thread would. */
static int reduce_columns(const cg_loop_nest *k) {
    int64_t total = k->rank == 2 ? k->size[0] * k->size[1] : 0;
    return k->accumulate && k->rank == 2 && k->out_stride[0] == 0 && k->out_stride[1] != 0 &&
           k->size[1] >= 2 * REDUCE_BLOCK && total >= PARALLEL_MIN_ELEMS;
}

static void c_loop_nest(cg_writer *w, const cg_loop_nest *k) {
    if (k->accumulate) cg_line(w, "memset(%s, 0, %lld * sizeof(float));", k->out, (long long)k->out_elems);
    int base = w->indent;
    loop_split split = split_of(k);
    if (reduce_columns(k)) {
        long long columns = (long long)k->size[1];
        cg_c_parallel_for(w, 1);
        cg_line(w, "for (int64_t block = 0; block < %lld; block++) {", (columns + REDUCE_BLOCK - 1) / REDUCE_BLOCK);
        w->indent++;
        cg_line(w, "const int64_t first = block * %d, end = first + %d < %lld ? first + %d : %lld;", REDUCE_BLOCK, REDUCE_BLOCK,
                columns, REDUCE_BLOCK, columns);
        cg_line(w, "for (int64_t i0 = 0; i0 < %lld; i0++) {", (long long)k->size[0]);
        w->indent++;
        cg_line(w, "for (int64_t i1 = first; i1 < end; i1++) {");
        w->indent++;
    } else {
        for (int d = 0; d < k->rank; d++) {
            char count[32];
            snprintf(count, sizeof count, "%lld", (long long)k->size[d]);
            if (split.loops && d == split.at) {
                if (d == k->rank - 1) parallel_for_vector(w, count);
                else cg_c_parallel_for(w, split.loops);
            }
            cg_line(w, "for (int64_t i%d = 0; i%d < %lld; i%d++) {", d, d, (long long)k->size[d], d);
            w->indent++;
        }
    }
    char idx[256], expr[4096], local[4096];
    index_expr(k, k->out_stride, k->out_offset, idx, sizeof idx);
    /* "name = e1; ...; result": locals computed once per element, then the result */
    const char *rest = k->expr;
    int first_local = 1;
    for (const char *semi; (semi = strchr(rest, ';')); rest = semi + 1) {
        snprintf(local, sizeof local, "%.*s", (int)(semi - rest), rest);
        char *eq = strchr(local, '=');
        if (!eq) continue;
        *eq = 0;
        char *name = local;
        while (*name == ' ') name++;
        for (char *end = eq - 1; end > name && *end == ' '; end--) *end = 0;
        substitute(k, eq + 1, expr, sizeof expr);
        cg_line(w, "const float %s =%s;", name, expr);
        if (first_local && k->also_out) cg_line(w, "%s[%s] = %s;", k->also_out, idx, name);
        first_local = 0;
    }
    while (*rest == ' ') rest++;
    substitute(k, rest, expr, sizeof expr);
    if (k->cast_out && k->out_unread) {
        /* only the cast reads the value: its copy alone is stored */
        cg_line(w, "const float %s_value = %s;", k->out, expr);
        cg_line(w, "%s[%s] = %s(%s_value);", k->cast_out, idx, cg_round_function(k->cast_dtype), k->out);
    } else {
        cg_line(w, "%s[%s] %s %s;", k->out, idx, k->accumulate ? "+=" : "=", expr);
        if (k->cast_out) cg_line(w, "%s[%s] = %s(%s[%s]);", k->cast_out, idx, cg_round_function(k->cast_dtype), k->out, idx);
    }
    if (k->operand_cast_out) {
        char at[256], copy_at[256];
        index_expr(k, k->stride[0], k->offset[0], at, sizeof at);
        index_expr(k, k->stride[0], 0, copy_at, sizeof copy_at);
        cg_line(w, "%s[%s] = %s(%s[%s]);", k->operand_cast_out, copy_at, cg_round_function(k->cast_dtype), k->buffer[0], at);
    }
    while (w->indent > base) {
        w->indent--;
        cg_line(w, "}");
    }
    if (k->scale) {
        char count[32];
        snprintf(count, sizeof count, "%lld", (long long)k->out_elems);
        if (k->out_elems >= PARALLEL_MIN_ELEMS) parallel_for_vector(w, count);
        cg_line(w, "for (int64_t i = 0; i < %lld; i++) %s[i] *= %s;", (long long)k->out_elems, k->out, k->scale);
    }
}

static void c_gemm(cg_writer *w, const cg_gemm *k) {
    const char *beta = cg_gemm_beta(k);
    /* 16-bit operands: the runtime's product of them, accumulated in f32 (bf16: oneDNN where
     * the CPU has AVX512-BF16, else converted for sgemm; f16: converted) */
    const char *gemm = k->operands == DT_BF16 ? "dmrt_gemm_bf16" : k->operands == DT_F16 ? "dmrt_gemm_f16" : "dmrt_sgemm";
    if (k->bias) {
        /* the runtime fills each panel's rows with the bias just before its product */
        cg_line(w, "%s_bias_split(ctx->threads, %d, %d, %lld, %lld, %lld, %s, %lld, %s, %lld, %s, %s, %lld);", gemm, k->trans_a,
                k->trans_b, (long long)k->m, (long long)k->n, (long long)k->k, k->a, (long long)k->lda, k->b, (long long)k->ldb,
                k->bias, k->c, (long long)k->ldc);
        return;
    }
    if (k->batch <= 1) {
        cg_line(w, "%s_split(ctx->threads, %d, %d, %lld, %lld, %lld, 1.0f, %s, %lld, %s, %lld, %s, %s, %lld);", gemm, k->trans_a, k->trans_b,
                (long long)k->m, (long long)k->n, (long long)k->k, k->a, (long long)k->lda, k->b, (long long)k->ldb, beta,
                k->c, (long long)k->ldc);
        /* the bias's gradient: b's rows summed, each column in row order (the sum's loop's bits) */
        if (k->bias_grad)
            cg_line(w, "dmrt_sum_rows_split(ctx->threads, %lld, %lld, %s, %lld, %s);", (long long)k->k, (long long)k->n, k->b,
                    (long long)k->ldb, k->bias_grad);
        return;
    }
    /* the products of a batch are shared out whole, each on one thread */
    if ((double)k->batch * (double)k->m * (double)k->n * (double)k->k >= DMRT_SGEMM_SPLIT_MIN) cg_c_parallel_for(w, 1);
    cg_line(w, "for (int64_t ib = 0; ib < %lld; ib++)", (long long)k->batch);
    cg_line(w, "    %s(%d, %d, %lld, %lld, %lld, 1.0f, %s + ib * %lld, %lld, %s + ib * %lld, %lld, %s, %s + ib * %lld, %lld);",
            gemm, k->trans_a, k->trans_b, (long long)k->m, (long long)k->n, (long long)k->k, k->a, (long long)k->batch_stride_a,
            (long long)k->lda, k->b, (long long)k->batch_stride_b, (long long)k->ldb, beta, k->c,
            (long long)k->batch_stride_c, (long long)k->ldc);
}

/* --quantize: the runtime's products of the narrow weight, split over the rank's threads
 * (gemm_quant.c, gemm_int8.c). */
static void c_quant_gemm(cg_writer *w, const cg_quant_gemm *k) {
    const char *beta = k->accumulate ? "1.0f" : "0.0f";
    if (k->cols > 0 && k->activations)
        cg_line(w, "dmrt_gemm_i8_window_split(ctx->threads, &ctx->quant[%d], %s, %lld, %lld, %lld, %s, %lld, %s, %s, %lld);",
                k->slot, k->w_f32, (long long)k->col0, (long long)k->cols, (long long)k->m, k->a, (long long)k->lda, beta,
                k->c, (long long)k->ldc);
    else if (k->cols > 0)
        cg_line(w, "dmrt_gemm_wq_window_split(ctx->threads, &ctx->quant[%d], %lld, %lld, %lld, %s, %lld, %s, %s, %lld);",
                k->slot, (long long)k->col0, (long long)k->cols, (long long)k->m, k->a, (long long)k->lda, beta, k->c,
                (long long)k->ldc);
    else if (k->activations)
        cg_line(w, "dmrt_gemm_i8_split(ctx->threads, &ctx->quant[%d], %s, %lld, %s, %lld, %s, %s, %lld);", k->slot, k->w_f32,
                (long long)k->m, k->a, (long long)k->lda, beta, k->c, (long long)k->ldc);
    else
        cg_line(w, "dmrt_gemm_wq_split(ctx->threads, &ctx->quant[%d], %lld, %s, %lld, %s, %s, %lld);", k->slot,
                (long long)k->m, k->a, (long long)k->lda, beta, k->c, (long long)k->ldc);
}

/* Cross-entropy's row pieces, on `row` (the row's logits, `classes` of them). */
/* A bad index: recorded for the host's check (fault_check), and the loop left. */
static void c_record_fault(cg_writer *w, int site, const char *value, const char *base, const char *position) {
    if (base && strcmp(base, "0") != 0)
        cg_line(w, "    ctx->fault.site = %d, ctx->fault.value = (int32_t)%s, ctx->fault.position = %s + %s;", site, value,
                base, position);
    else
        cg_line(w, "    ctx->fault.site = %d, ctx->fault.value = (int32_t)%s, ctx->fault.position = %s;", site, value, position);
    cg_line(w, "    break;");
}

static void c_xent_target_check(cg_writer *w, const cg_xent *k) {
    cg_line(w, "int32_t target = %s[r];", k->targets);
    cg_line(w, "if (target < 0 || target >= %lld) {", (long long)k->all_classes);
    c_record_fault(w, k->fault_site, "target", k->position_base, "r");
    cg_line(w, "}");
}

static void c_xent_row_max(cg_writer *w, int64_t classes) {
    cg_line(w, "float max = row[0];");
    cg_line(w, "for (int64_t c = 1; c < %lld; c++) max = row[c] > max ? row[c] : max;", (long long)classes);
}

/* sum of exp(row[c] - max), in double */
static void c_xent_sum_exp(cg_writer *w, int64_t classes) {
    cg_line(w, "double sum = 0.0;");
    cg_line(w, "for (int64_t c = 0; c < %lld; c++) sum += exp((double)(row[c] - max));", (long long)classes);
}

/* Whole rows: each row's statistics from its own logits (rows, 3): its maximum, sum of
 * exp(logit - maximum), and the target's logit. */
static void c_xent_stats_whole(cg_writer *w, const cg_xent *k) {
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->rows);
    w->indent++;
    c_xent_target_check(w, k);
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "if (!ctx->fault.site) {");
    w->indent++;
    if (k->rows * k->classes >= PARALLEL_MIN_ELEMS) cg_c_parallel_for(w, 1);
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->rows);
    w->indent++;
    cg_line(w, "const int32_t target = %s[r];", k->targets);
    cg_line(w, "const float *row = %s + r * %lld;", k->logits, (long long)k->classes);
    c_xent_row_max(w, k->classes);
    c_xent_sum_exp(w, k->classes);
    cg_line(w, "float *stats = %s + r * 3;", k->out);
    cg_line(w, "stats[0] = max, stats[1] = (float)sum, stats[2] = row[target];");
    w->indent--;
    cg_line(w, "}");
    w->indent--;
    cg_line(w, "}");
}

/* Vocabulary-parallel (Megatron-LM): each rank holds a block of every row's classes.
 * Every rank's row maxima are gathered (the global maximum of a row is the max of them),
 * then each rank's sums of exp(logit - max) and the target's logit (from the one rank
 * holding it, 0 elsewhere) are summed over the ranks. In scratch: every rank's maxima
 * (comm_size x rows), then the sums and target logits (2 x rows) the allreduce adds. */
static void c_xent_stats_split(cg_writer *w, const cg_xent *k) {
    long long rows = (long long)k->rows, classes = (long long)k->classes;
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "float *maxima = %s;                  /* (%lld, %lld) every rank's row maxima */", k->scratch,
            (long long)k->comm_size, rows);
    cg_line(w, "float *sums = maxima + %lld;         /* (%lld) this rank's sums of exp(logit - max), then (%lld) target logits */",
            (long long)k->comm_size * rows, rows, rows);
    cg_line(w, "const int64_t first_class = (int64_t)%s * %lld;", k->coord, classes);
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", rows);
    w->indent++;
    cg_line(w, "const float *row = %s + r * %lld;", k->logits, classes);
    c_xent_target_check(w, k);
    c_xent_row_max(w, k->classes);
    cg_line(w, "maxima[(int64_t)%s * %lld + r] = max;", k->coord, rows);
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "if (dmrt_allgather(%s, maxima + (int64_t)%s * %lld, maxima, %lld, \"allgather of the row maxima of %s (%s)\") != 0)",
            k->comm, k->coord, rows, rows, k->logits_name, k->where);
    cg_line(w, "    return comm_failed(ctx);");
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", rows);
    w->indent++;
    cg_line(w, "const float *row = %s + r * %lld;", k->logits, classes);
    cg_line(w, "float max = maxima[r];");
    cg_line(w, "for (int64_t j = 1; j < %lld; j++) max = maxima[j * %lld + r] > max ? maxima[j * %lld + r] : max;",
            (long long)k->comm_size, rows, rows);
    c_xent_sum_exp(w, k->classes);
    cg_line(w, "sums[r] = (float)sum;");
    cg_line(w, "int64_t target = %s[r] - first_class;", k->targets);
    cg_line(w, "sums[%lld + r] = target >= 0 && target < %lld ? row[target] : 0.0f;", rows, classes);
    cg_line(w, "%s[r * 3] = max;", k->out);
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "if (dmrt_allreduce_sum(%s, sums, %lld, \"allreduce of the row sums of %s (%s)\") != 0)", k->comm, 2 * rows,
            k->logits_name, k->where);
    cg_line(w, "    return comm_failed(ctx);");
    cg_line(w, "for (int64_t r = 0; r < %lld; r++)", rows);
    cg_line(w, "    %s[r * 3 + 1] = sums[r], %s[r * 3 + 2] = sums[%lld + r];", k->out, k->out, rows);
    w->indent--;
    cg_line(w, "}");
}

static void c_xent_stats(cg_writer *w, const cg_xent *k) {
    if (k->comm) c_xent_stats_split(w, k);
    else c_xent_stats_whole(w, k);
}

/* The mean over rows of log(sum) + max - target logit, accumulated in double. */
static void c_cross_entropy(cg_writer *w, const cg_xent *k) {
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "double total = 0.0;");
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->rows);
    cg_line(w, "    const float *stats = %s + r * 3;", k->stats);
    cg_line(w, "    total += log((double)stats[1]) + (double)stats[0] - (double)stats[2];");
    cg_line(w, "}");
    cg_line(w, "%s[0] = (float)(total / %lld.0);", k->out, (long long)k->mean_rows);
    w->indent--;
    cg_line(w, "}");
}

/* softmax from the forward's statistics, minus one at the target (when this rank holds
 * its class), times dloss / mean_rows */
static void c_cross_entropy_grad(cg_writer *w, const cg_xent *k) {
    long long classes = (long long)k->classes;
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "float scale = %s%s / %lld.0f;", k->dloss, k->dloss_is_buffer ? "[0]" : "", (long long)k->mean_rows);
    if (k->coord) cg_line(w, "const int64_t first_class = (int64_t)%s * %lld;", k->coord, classes);
    if (k->rows * k->classes >= PARALLEL_MIN_ELEMS) cg_c_parallel_for(w, 1);
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->rows);
    w->indent++;
    cg_line(w, "const float *row = %s + r * %lld, *stats = %s + r * 3;", k->logits, classes, k->stats);
    /* element c's gradient, probability times scale (the target's less scale, below): in
     * f32 through a double exp, as the forward's sum; in 16 bits through f32's expf, which
     * vectorises (libmvec: the loop ~10x faster) and whose ulp or two of error reach the
     * rounded value only where it sits that close to a 16-bit rounding boundary (bf16:
     * about one value in 2^15, and then by one bf16 ulp) */
    int f32 = k->out_dtype == DT_F32;
    const char *grad_of = f32 ? "(float)(exp((double)(row[%s] - stats[0])) / (double)stats[1]) * scale"
                              : "expf(row[%s] - stats[0]) / stats[1] * scale";
    char grad_c[128], grad_target[128];
    snprintf(grad_c, sizeof grad_c, grad_of, "c");
    snprintf(grad_target, sizeof grad_target, grad_of, "target");
    /* 16 bits: each f32 value (the target's with scale taken off) rounded once */
    const char *round = f32 ? NULL : cg_round_function(k->out_dtype);
    cg_line(w, "%s *drow = %s + r * %lld;", f32 ? "float" : "uint16_t", k->out, classes);
    cg_line(w, "for (int64_t c = 0; c < %lld; c++)", classes);
    if (f32) cg_line(w, "    drow[c] = %s;", grad_c);
    else cg_line(w, "    drow[c] = %s(%s);", round, grad_c);
    cg_line(w, "int64_t target = %s[r]%s;", k->targets, k->coord ? " - first_class" : "");
    if (f32) {
        cg_line(w, "if (target >= 0 && target < %lld) drow[target] -= scale;", classes);
    } else {
        cg_line(w, "if (target >= 0 && target < %lld) {", classes);
        cg_line(w, "    const float d = %s;", grad_target);
        cg_line(w, "    drow[target] = %s(d - scale);", round);
        cg_line(w, "}");
    }
    w->indent--;
    cg_line(w, "}");
    w->indent--;
    cg_line(w, "}");
}

/* The file-scope helpers of the C dialect, written into w->kernels where first used. */
enum { C_HELPER_ATTENTION = 1, C_HELPER_SGD = 2, C_HELPER_SGD_NO_DECAY = 4, C_HELPER_ADAMW = 8 };

/* Whether this is the file's first use of helper (marked used now). */
static int first_use(cg_writer *w, unsigned helper) {
    if (w->kernels->c_helpers & helper) return 0;
    w->kernels->c_helpers |= helper;
    return 1;
}

/* What an optimizer's element loop reads and writes, as C expressions: the parameter, its
 * gradient and state (state1 AdamW's), the updates made (this one counted) and the
 * learning rate (float). */
typedef struct update_names {
    const char *param, *grad, *state0, *state1, *updates, *lr;
} update_names;

typedef void (*update_body)(cg_writer *w, const ir_optimizer *o, const update_names *n);

/* `for` over count elements (a C expression) with body's element i; split over `threads`
 * (a C expression), or on one thread where that is NULL. */
static void write_update_loop(cg_writer *w, const ir_optimizer *o, update_body body, const update_names *n,
                              const char *count, const char *threads) {
    if (threads) parallel_for_vector_threads(w, threads, count);
    cg_line(w, "for (int64_t i = 0; i < %s; i++) {", count);
    w->indent++;
    body(w, o, n);
    w->indent--;
    cg_line(w, "}");
}

/* Whether an update of count elements (a C expression) splits over the threads: a literal
 * of PARALLEL_MIN_ELEMS or more, or an expression known when it runs. */
static int update_splits(const char *count) {
    char *end;
    long long n = strtoll(count, &end, 10);
    return *end || n >= PARALLEL_MIN_ELEMS;
}

/* An optimizer's element loop lives in a helper written once a file and called for each
 * parameter: the same float operations as a loop written in place at each call, compiled
 * once (a loop a parameter was 10-15% of a small GPT's compile). The loop splits over
 * `threads`, 1 for a parameter of fewer than PARALLEL_MIN_ELEMS elements (no OpenMP region
 * entered). Its hyper-parameters are the program's one optimizer's (ir_graph.optimizer),
 * the same at every call in a file but the weight decay, which weight_decay_1d = false
 * takes off the 1-D parameters (cg_param_optimizer): AdamW's is an argument (its decay
 * factor), SGD has a helper without it (sgd_update_no_decay). Where the writer has no file-scope section (the
 * parameter servers' ps_update, written among the context's declarations), the loop is
 * written in place: whether the helper is there to call. */
static int write_update_helper(cg_writer *w, unsigned helper, const char *signature, const char *comment,
                               const ir_optimizer *o, update_body body, const update_names *n) {
    if (!w->kernels) return 0;
    if (!first_use(w, helper)) return 1;
    cg_writer *h = w->kernels;
    cg_line(h, "/* %s */", comment);
    cg_line(h, "static void %s {", signature);
    h->indent++;
    cg_line(h, "if (threads > 1) {");
    h->indent++;
    write_update_loop(h, o, body, n, "count", "threads");
    h->indent--;
    cg_line(h, "} else {");
    h->indent++;
    write_update_loop(h, o, body, n, "count", NULL);
    h->indent--;
    cg_line(h, "}");
    h->indent--;
    cg_line(h, "}");
    cg_blank(h);
    return 1;
}

/* torch.optim.SGD: d = g + wd * p; buf = d on the first step, else
 * momentum * buf + (1 - dampening) * d; d = nesterov ? d + momentum * buf : buf;
 * p -= lr * d, lr the update's (ctx->lr, emit_schedule.c). */
/* Before a loop over `count` elements (a literal, or an expression known when it runs). */
static void parallel_for_count(cg_writer *w, const char *count) {
    if (update_splits(count)) parallel_for_vector(w, count);
}

static void sgd_body(cg_writer *w, const ir_optimizer *o, const update_names *n) {
    char wd[64], mom[64], damp[64];
    cg_float_literal(o->weight_decay, wd, sizeof wd);
    cg_float_literal(o->momentum, mom, sizeof mom);
    cg_float_literal(1.0 - o->dampening, damp, sizeof damp);
    if (o->weight_decay != 0) cg_line(w, "float d = %s[i] + %s * %s[i];", n->grad, wd, n->param);
    else cg_line(w, "float d = %s[i];", n->grad);
    if (n->state0) {
        cg_line(w, "%s[i] = %s == 1 ? d : %s * %s[i] + %s * d;", n->state0, n->updates, mom, n->state0, damp);
        if (o->nesterov) cg_line(w, "d = d + %s * %s[i];", mom, n->state0);
        else cg_line(w, "d = %s[i];", n->state0);
    }
    cg_line(w, "%s[i] -= %s * d;", n->param, n->lr);
}

static void c_sgd(cg_writer *w, const cg_update *k) {
    /* with momentum or without: a program's parameters all have a buffer or none */
    int momentum = k->state0 != NULL, decay = k->opt->weight_decay != 0;
    const char *name = decay ? "sgd_update" : "sgd_update_no_decay";
    char signature[256], comment[512];
    snprintf(signature, sizeof signature, "%s(float *param, const float *grad, %sint64_t count, %sfloat lr, int threads)",
             name, momentum ? "float *momentum_buffer, " : "", momentum ? "int64_t updates, " : "");
    snprintf(comment, sizeof comment,
             "torch.optim.SGD on one parameter's count elements, the program's hyper-parameters%s;\n"
             "%s * threads 1: no OpenMP region",
             decay ? "" : ", no weight decay",
             momentum ? " * updates: the optimizer's updates, this one counted (the buffer is d on the first);\n" : "");
    const update_names helper = {"param", "grad", momentum ? "momentum_buffer" : NULL, NULL, "updates", "lr"};
    int splits = update_splits(k->count);
    const char *threads = splits ? "ctx->threads" : "1";
    if (!write_update_helper(w, decay ? C_HELPER_SGD : C_HELPER_SGD_NO_DECAY, signature, comment, k->opt, sgd_body,
                             &helper)) {
        const update_names here = {k->param, k->grad, k->state0, NULL, k->updates, "(float)ctx->lr"};
        write_update_loop(w, k->opt, sgd_body, &here, k->count, splits ? "ctx->threads" : NULL);
    } else if (momentum) {
        cg_line(w, "%s(%s, %s, %s, %s, %s, (float)ctx->lr, %s);", name, k->param, k->grad, k->state0, k->count,
                k->updates, threads);
    } else {
        cg_line(w, "%s(%s, %s, %s, (float)ctx->lr, %s);", name, k->param, k->grad, k->count, threads);
    }
}

/* torch.optim.AdamW (single-tensor path): p *= 1 - lr * wd; m = beta1 * m + (1 - beta1) * g;
 * v = beta2 * v + (1 - beta2) * g * g; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
void cg_adamw_literals_of(const ir_optimizer *o, cg_adamw_literals *lit) {
    cg_float_literal(o->beta1, lit->beta1, sizeof lit->beta1);
    cg_float_literal(1.0 - o->beta1, lit->one_minus_beta1, sizeof lit->one_minus_beta1);
    cg_float_literal(o->beta2, lit->beta2, sizeof lit->beta2);
    cg_float_literal(1.0 - o->beta2, lit->one_minus_beta2, sizeof lit->one_minus_beta2);
    cg_float_literal(o->eps, lit->eps, sizeof lit->eps);
}

void cg_adamw_prologue(cg_writer *w, const cg_update *k, cg_adamw_literals *lit) {
    const ir_optimizer *o = k->opt;
    cg_adamw_literals_of(o, lit);
    cg_line(w, "const float decay = (float)(1.0 - ctx->lr * %.17g);", o->weight_decay);
    cg_line(w, "const float step_size = (float)(ctx->lr / (1.0 - pow(%.17g, (double)%s)));", o->beta1, k->updates);
    cg_line(w, "const float bc2_sqrt = (float)sqrt(1.0 - pow(%.17g, (double)%s));", o->beta2, k->updates);
}

/* (decay, step_size and bc2_sqrt: cg_adamw_prologue's, in scope where the body is) */
static void adamw_body(cg_writer *w, const ir_optimizer *o, const update_names *n) {
    cg_adamw_literals lit;
    cg_adamw_literals_of(o, &lit);
    cg_line(w, "float g = %s[i];", n->grad);
    cg_line(w, "%s[i] *= decay;", n->param);
    cg_line(w, "%s[i] = %s * %s[i] + %s * g;", n->state0, lit.beta1, n->state0, lit.one_minus_beta1);
    cg_line(w, "%s[i] = %s * %s[i] + %s * g * g;", n->state1, lit.beta2, n->state1, lit.one_minus_beta2);
    cg_line(w, "float denom = sqrtf(%s[i]) / bc2_sqrt + %s;", n->state1, lit.eps);
    cg_line(w, "%s[i] -= step_size * (%s[i] / denom);", n->param, n->state0);
}

static void c_adamw(cg_writer *w, const cg_update *k) {
    static const update_names helper = {"param", "grad", "exp_avg", "exp_avg_sq", NULL, NULL};
    int called = write_update_helper(
        w, C_HELPER_ADAMW,
        "adamw_update(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, int64_t count, "
        "float decay, float step_size, float bc2_sqrt, int threads)",
        "torch.optim.AdamW (single-tensor) on one parameter's count elements, the program's\n"
        " * betas and eps; decay = 1 - lr * weight_decay, step_size = lr / (1 - beta1^step),\n"
        " * bc2_sqrt = sqrt(1 - beta2^step); threads 1: no OpenMP region",
        k->opt, adamw_body, &helper);
    cg_adamw_literals lit;
    cg_line(w, "{");
    w->indent++;
    cg_adamw_prologue(w, k, &lit);
    if (called) {
        cg_line(w, "adamw_update(%s, %s, %s, %s, %s, decay, step_size, bc2_sqrt, %s);", k->param, k->grad, k->state0,
                k->state1, k->count, update_splits(k->count) ? "ctx->threads" : "1");
    } else {
        const update_names here = {k->param, k->grad, k->state0, k->state1, k->updates, NULL};
        write_update_loop(w, k->opt, adamw_body, &here, k->count, update_splits(k->count) ? "ctx->threads" : NULL);
    }
    w->indent--;
    cg_line(w, "}");
}

static void c_sum_squares(cg_writer *w, const char *x, const char *count, const char *sum) {
    cg_line(w, "for (int64_t i = 0; i < %s; i++) %s += (double)%s[i] * %s[i];", count, sum, x, x);
}

static void c_scale(cg_writer *w, const char *x, const char *count, const char *factor) {
    parallel_for_count(w, count);
    cg_line(w, "for (int64_t i = 0; i < %s; i++) %s[i] *= %s;", count, x, factor);
}

/* --prune: runtime/prune.c's dmrt_prune on the weight in place */
static void c_prune(cg_writer *w, const cg_prune *k) {
    cg_line(w, "if (dmrt_prune(%s, %s, %lld, %lld, %lld, %s, ctx->total_steps, &prune_schedule) != DMRT_OK) {", k->weight, k->mask,
            (long long)k->n, (long long)k->channels, (long long)k->inner, k->updates);
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"--prune: out of memory choosing the mask of %s\");", k->name);
    cg_line(w, "    return DMRT_ERR_NOMEM;");
    cg_line(w, "}");
}

static void c_prune_heads(cg_writer *w, const cg_prune_heads *k) {
    cg_line(w, "if (dmrt_prune_heads(parts, %d, %lld, %s, ctx->total_steps, &prune_schedule) != DMRT_OK) {", k->n_parts,
            (long long)k->units, k->updates);
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"--prune: out of memory choosing the heads of %s\");", k->name);
    cg_line(w, "    return DMRT_ERR_NOMEM;");
    cg_line(w, "}");
}

/* Dropout: a loop per level, the global position along each counted level by level
 * (at_l), so the mask is keyed by the element's index in the whole tensor. */
static void c_dropout(cg_writer *w, const cg_dropout *k) {
    cg_line(w, "const uint64_t first = %s; /* this micro-batch's first element in the step's */", k->first);
    cg_line(w, "int64_t local = 0; /* the element in this rank's block */");
    for (int l = 0; l < k->levels; l++) {
        char pos[96]; /* the global position along this level */
        if (k->split_axis[l] >= 0) snprintf(pos, sizeof pos, "ctx->coord[%d] * %lld + i%d", k->split_axis[l], (long long)k->size[l], l);
        else snprintf(pos, sizeof pos, "i%d", l);
        cg_line(w, "for (int64_t i%d = 0; i%d < %lld; i%d++) {", l, l, (long long)k->size[l], l);
        w->indent++;
        if (l == 0) cg_line(w, "const uint64_t at_1 = (uint64_t)(%s);", pos);
        else cg_line(w, "const uint64_t at_%d = at_%d * %lldu + (uint64_t)(%s);", l + 1, l, (long long)k->whole[l], pos);
    }
    cg_line(w, "%s[local] = dmrt_dropout_keep(ctx->seed, ctx->step, %d, first + at_%d, %lluu) ? %s[local] * %s : 0.0f;", k->out,
            k->op, k->levels, k->threshold, k->x, k->scale);
    cg_line(w, "local++;");
    for (int l = 0; l < k->levels; l++) {
        w->indent--;
        cg_line(w, "}");
    }
}

/* The ids are checked first (a bad one stops at its row, as the host reports the first),
 * then the rows copied, split over the threads. */
static void c_embed(cg_writer *w, const cg_embed *k) {
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->rows);
    w->indent++;
    cg_line(w, "const int32_t id = %s[r];", k->ids);
    cg_line(w, "if (id < 0 || id >= %lld) {", (long long)k->vocab);
    c_record_fault(w, k->fault_site, "id", k->position_base, "r");
    cg_line(w, "}");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "if (!ctx->fault.site) {");
    w->indent++;
    if (k->qtable) { /* a table held narrow only (serial: the whole vocabulary) */
        cg_line(w, "dmrt_qweight_gather_rows(%s, %s, %lld, %s);", k->qtable, k->ids, (long long)k->rows, k->out);
        w->indent--;
        cg_line(w, "}");
        return;
    }
    if (k->rows * k->cols >= PARALLEL_MIN_ELEMS) cg_c_parallel_for(w, 1);
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->rows);
    w->indent++;
    if (k->first_row) {
        /* rows of another rank's window are zero here: the pending sum over ranks fills them */
        cg_line(w, "const int64_t row = (int64_t)%s[r] - (%s);", k->ids, k->first_row);
        cg_line(w, "if (row < 0 || row >= %lld) {", (long long)k->n);
        cg_line(w, "    memset(%s + r * %lld, 0, %lld * sizeof(float));", k->out, (long long)k->cols, (long long)k->cols);
        cg_line(w, "    continue;");
        cg_line(w, "}");
        cg_line(w, "memcpy(%s + r * %lld, %s + row * %lld, %lld * sizeof(float));", k->out, (long long)k->cols, k->table,
                (long long)k->cols, (long long)k->cols);
    } else {
        cg_line(w, "memcpy(%s + r * %lld, %s + (int64_t)%s[r] * %lld, %lld * sizeof(float));", k->out, (long long)k->cols,
                k->table, k->ids, (long long)k->cols, (long long)k->cols);
    }
    w->indent--;
    cg_line(w, "}");
    w->indent--;
    cg_line(w, "}");
}

/* The forward checked every id. Rows with the same id add into the same row of out: the
 * threads take blocks of columns, each adding every row's in order (the sums one thread
 * would make). */
static void c_embed_grad(cg_writer *w, const cg_embed *k) {
    long long c = (long long)k->cols;
    if (k->accumulate_if) cg_line(w, "if (!(%s))", k->accumulate_if), w->indent++;
    if (!k->accumulate) cg_line(w, "memset(%s, 0, %lld * sizeof(float));", k->out, (long long)k->n * c);
    if (k->accumulate_if) w->indent--;
    int split = k->rows * c >= PARALLEL_MIN_ELEMS && c >= 2 * REDUCE_BLOCK;
    if (split) {
        cg_c_parallel_for(w, 1);
        cg_line(w, "for (int64_t block = 0; block < %lld; block++) {", (c + REDUCE_BLOCK - 1) / REDUCE_BLOCK);
        w->indent++;
        cg_line(w, "const int64_t first = block * %d, end = first + %d < %lld ? first + %d : %lld;", REDUCE_BLOCK, REDUCE_BLOCK, c,
                REDUCE_BLOCK, c);
    } else {
        cg_line(w, "{");
        w->indent++;
        cg_line(w, "const int64_t first = 0, end = %lld;", c);
    }
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->rows);
    w->indent++;
    if (k->first_row) { /* a vocabulary split over ranks: this rank's rows only */
        cg_line(w, "const int64_t row = (int64_t)%s[r] - (%s);", k->ids, k->first_row);
        cg_line(w, "if (row < 0 || row >= %lld) continue;", (long long)k->n);
        cg_line(w, "float *out_row = %s + row * %lld;", k->out, c);
    } else {
        cg_line(w, "float *out_row = %s + (int64_t)%s[r] * %lld;", k->out, k->ids, c);
    }
    cg_line(w, "for (int64_t j = first; j < end; j++) out_row[j] += %s[r * %lld + j];", k->dy, c);
    w->indent--;
    cg_line(w, "}");
    w->indent--;
    cg_line(w, "}");
}

/* The kernels of fused attention are runtime/dmrt_attention.h's, included once per file
 * where the first one is used. */
static void include_attention_kernels(cg_writer *w) {
    if (!first_use(w, C_HELPER_ATTENTION)) return;
    cg_line(w->kernels, "#include \"dmrt_attention.h\"  /* fused attention: dmrt_attention_forward, _backward */");
    cg_blank(w->kernels);
}

/* The kernels' operand type for products of dtype: bf16 where the products are bf16
 * (can.attention_bf16), else f32; its value (for the scratch's size) and its name. */
static int attention_operands_of(ir_dtype dtype) { return dtype == DT_BF16 ? DMRT_ATTENTION_BF16 : DMRT_ATTENTION_F32; }

static const char *attention_operands(const cg_attention *k) {
    return attention_operands_of(k->operands) == DMRT_ATTENTION_BF16 ? "DMRT_ATTENTION_BF16" : "DMRT_ATTENTION_F32";
}

static void c_attention(cg_writer *w, const cg_attention *k) {
    include_attention_kernels(w);
    if (k->group > 1)
        cg_line(w, "dmrt_attention_forward_grouped(%s, %s, %s, %s, %s, %lld, %lld, %lld, %lld, %s, %d, %s, ctx->threads, %s);", k->q,
                k->k, k->v, k->out, k->lse, (long long)k->heads, (long long)k->group, (long long)k->positions,
                (long long)k->width, k->scale, k->causal, attention_operands(k), k->work);
    else
        cg_line(w, "dmrt_attention_forward(%s, %s, %s, %s, %s, %lld, %lld, %lld, %lld, %s, %d, %s, ctx->threads, %s);", k->q,
                k->k, k->v, k->out, k->lse, (long long)k->heads, (long long)k->inner, (long long)k->positions,
                (long long)k->width, k->scale, k->causal, attention_operands(k), k->work);
}

/* (grouped: the group in the inner count's place, which is then 1) */
static void c_attention_grad(cg_writer *w, const cg_attention *k) {
    include_attention_kernels(w);
    int grouped = k->group > 1;
    cg_line(w, "dmrt_attention_backward%s(%s, %s, %s, %s, %s, %s,", grouped ? "_grouped" : "", k->q, k->k, k->v, k->out,
            k->lse, k->dout);
    cg_line(w, "                        %s%s, %s, %s, %lld, %lld, %lld, %lld, %s, %d, %s, ctx->threads, %s);",
            grouped ? "        " : "", k->dq, k->dk, k->dv, (long long)k->heads, (long long)(grouped ? k->group : k->inner),
            (long long)k->positions, (long long)k->width, k->scale, k->causal, attention_operands(k), k->work);
}

static int64_t c_attention_scratch_floats(int64_t heads, int64_t positions, int64_t width, ir_dtype dtype) {
    (void)heads;
    return dmrt_attention_work_floats_of(attention_operands_of(dtype), positions, width);
}

/* ---- host scaffolding ---- */

static void c_preamble(cg_writer *w) {
    cg_line(w, "#include <math.h>");
    cg_line(w, "#include <stdio.h>");
    cg_line(w, "#include <stdlib.h>");
    cg_line(w, "#include <string.h>");
    cg_blank(w);
    cg_line(w, "/* glibc's libmvec (2.35 and later, linked through -lm) has vector versions of these:");
    cg_line(w, " * declaring them lets gcc vectorise the loops that call them (GELU, softmax). */");
    cg_line(w, "#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \\");
    cg_line(w, "    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))");
    cg_line(w, "float tanhf(float) __attribute__((simd(\"notinbranch\")));");
    cg_line(w, "float expf(float) __attribute__((simd(\"notinbranch\")));");
    cg_line(w, "#endif");
    cg_blank(w);
}

static void c_nothing(cg_writer *w) { (void)w; }

static void c_ctx_open(cg_writer *w, int partitioned, int tf32, const char *on_fail) {
    (void)w, (void)partitioned, (void)tf32, (void)on_fail;
}

/* Counted in ctx->memory: the trainer reports it next to --explain's prediction. */
static void c_alloc(cg_writer *w, const char *lhs, const char *bytes, const char *on_fail) {
    cg_line(w, "%s = dmrt_alloc_tracked(&ctx->memory, %s);", lhs, bytes);
    cg_line(w, "if (!%s) %s", lhs, on_fail);
}

static void c_free(cg_writer *w, const char *ptr) { cg_line(w, "dmrt_free_tracked(&ctx->memory, %s);", ptr); }

/* Host memory is all there is: every kind of copy is memcpy. */
static void c_copy(cg_writer *w, const char *dst, const char *src, const char *bytes, cg_copy_kind kind, const char *on_fail) {
    (void)kind, (void)on_fail;
    cg_line(w, "memcpy(%s, %s, %s);", dst, src, bytes);
}

static void c_zero(cg_writer *w, const char *ptr, const char *bytes, const char *on_fail) {
    (void)on_fail;
    cg_line(w, "memset(%s, 0, %s);", ptr, bytes);
}

static void c_comm_callee(char *buf, size_t size, const char *op) { snprintf(buf, size, "dmrt_%s(", op); }

/* The kernel left its loop at the bad index: nothing after it ran on it. */
static void c_fault_check(cg_writer *w, int end_of_phase) {
    if (!end_of_phase) cg_line(w, "if (ctx->fault.site) return data_fault(ctx);");
}

/* Vocabulary-parallel: every rank's row maxima, the sums and the targets' logits
 * (c_xent_stats_split); whole rows need none. */
static int64_t c_xent_scratch_floats(int64_t rows, int64_t comm_size) { return comm_size > 1 ? (comm_size + 2) * rows : 0; }

static int64_t c_embed_grad_scratch_bytes(int64_t rows) {
    (void)rows;
    return 0;
}

const cg_dialect *cg_dialect_find(const char *name) {
    if (strcmp(name, cg_dialect_c.name) == 0) return &cg_dialect_c;
    if (strcmp(name, cg_dialect_cuda.name) == 0) return &cg_dialect_cuda;
    return NULL;
}

const cg_dialect cg_dialect_c = {
    .name = "c",
    .source_suffix = "c",
    .separate_memory = 0,
    .block_alignment = 0,
    .storage_note = "elements of 4 bytes",
    .comm_error = "dmrt_rank_error(ctx->rank)",
    .memory_peak = "c->memory.peak",
    .can = {.zero = 1, .interleaved = 1, .weight_versions = 1, .compress = 1, .param_servers = 1, .dropout = 1,
            .predict = 1, .checkpoints = 1, .bias_activation = 1, .bf16 = 1, .f16 = 1, .quantize = 1, .narrow_only = 1, .fused_cast = 1,
            .fused_cast_layernorm = 1, .copy_alone = 1, .cast_with_sum = 1, .gemm_bias = 1, .gemm_bias_grad = 1, .flat_update = 1, .outline_loops = 1, .wgrad_bias = 1, .residual_norm = 1,
            .loss_grad_16bit = 1,
            .attention_heads_inner = 1, .attention_kv_groups = 1, .attention_bf16 = 1},
    .round_to = {[DT_BF16] = "dmrt_bf16_round(x)", [DT_F16] = "dmrt_f16_round(x)"},
    .toolchain = {.libraries = ""},
    .create_failures = "",
    .threads_note = "",
    .preamble = c_preamble,
    .ctx_fields = c_nothing,
    .ctx_helpers = c_nothing,
    .ctx_open = c_ctx_open,
    .ctx_close = c_nothing,
    .alloc = c_alloc,
    .free = c_free,
    .copy = c_copy,
    .zero = c_zero,
    .comm_callee = c_comm_callee,
    .fault_check = c_fault_check,
    .xent_scratch_floats = c_xent_scratch_floats,
    .embed_grad_scratch_bytes = c_embed_grad_scratch_bytes,
    .wgrad_scratch_floats = cg_c_wgrad_scratch_floats,
    .attention_scratch_floats = c_attention_scratch_floats,
    .loop_nest = c_loop_nest,
    .gemm = c_gemm,
    .xent_stats = c_xent_stats,
    .cross_entropy = c_cross_entropy,
    .cross_entropy_grad = c_cross_entropy_grad,
    .sgd = c_sgd,
    .adamw = c_adamw,
    .sum_squares = c_sum_squares,
    .scale = c_scale,
    .prune = c_prune,
    .prune_heads = c_prune_heads,
    .dropout = c_dropout,
    .softmax = cg_c_softmax,
    .softmax_grad = cg_c_softmax_grad,
    .causal_mask = cg_c_causal_mask,
    .layernorm = cg_c_layernorm,
    .layernorm_grad = cg_c_layernorm_grad,
    .layernorm_wgrad = cg_c_layernorm_wgrad,
    .embed = c_embed,
    .embed_grad = c_embed_grad,
    .attention = c_attention,
    .attention_grad = c_attention_grad,
    .quant_gemm = c_quant_gemm,
};
