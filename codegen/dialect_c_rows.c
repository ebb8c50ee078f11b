/* dialect_c_rows.c: the C dialect's kernels along the rows of a tensor (cg_rowwise):
 * softmax and its gradient, the causal mask, layernorm and its gradients. A row's sums
 * run in 8 lanes (the vector unit's), layernorm's in double; rows split over the threads
 * where none is summed over them. */
#include <stdio.h>

#include "dialect_c_internal.h"

/* Opens "for r, for i" over the (outer, inner) positions of a rowwise kernel and sets
 * `base`, the offset of element 0 of the row; elements are base + j * inner. Returns
 * the indent to close to. */
static int rowwise_open(cg_writer *w, const cg_rowwise *k, int split) {
    int indent = w->indent;
    /* rows are independent: split over the threads (by rows, or by rows and positions when
     * there are few rows) unless the kernel sums over them */
    if (split && k->outer * k->n * k->inner >= PARALLEL_MIN_ELEMS && k->outer * k->inner > 1)
        cg_c_parallel_for(w, k->inner == 1 || k->outer >= PARALLEL_MIN_ITERATIONS ? 1 : 2);
    cg_line(w, "for (int64_t r = 0; r < %lld; r++) {", (long long)k->outer);
    w->indent++;
    if (k->inner == 1) {
        cg_line(w, "const int64_t base = r * %lld;", (long long)k->n);
    } else {
        cg_line(w, "for (int64_t i = 0; i < %lld; i++) {", (long long)k->inner);
        w->indent++;
        cg_line(w, "const int64_t base = r * %lld + i;", (long long)(k->n * k->inner));
    }
    return indent;
}

static void close_to(cg_writer *w, int indent) {
    while (w->indent > indent) {
        w->indent--;
        cg_line(w, "}");
    }
}

/* "j" or "j * 64": the row element index. */
static const char *row_index(const cg_rowwise *k, char *buf, size_t size) {
    if (k->inner == 1) snprintf(buf, size, "j");
    else snprintf(buf, size, "j * %lld", (long long)k->inner);
    return buf;
}

/* Declares `keys`, how many elements of the row take part: with a fused causal mask,
 * the query's own position and those before it (bottom-right aligned when there are
 * more keys than queries), else the whole row. */
static void declare_keys(cg_writer *w, const cg_rowwise *k) {
    if (k->causal_queries)
        cg_line(w, "const int64_t keys = r %% %lld + %lld;", (long long)k->causal_queries,
                (long long)(k->n - k->causal_queries + 1));
    else
        cg_line(w, "const int64_t keys = %lld;", (long long)k->n);
}

/* template with every '@' replaced by index */
static void fill_index(const char *template, const char *index, char *out, size_t size) {
    size_t n = 0;
    for (const char *p = template; *p && n + 1 < size; p++) {
        if (*p != '@') {
            out[n++] = *p;
            continue;
        }
        int w = snprintf(out + n, size - n, "%s", index);
        if (w > 0) n += (size_t)w;
        if (n >= size) n = size - 1;
    }
    out[n] = 0;
}

/* Declares `float sum`, the terms for row elements 0 .. keys-1 (term: an expression
 * with '@' for the element index) added in 8 lanes, so that the loop vectorises (a
 * single running float sum cannot be reordered by the compiler). */
static void lane_sum(cg_writer *w, const cg_rowwise *k, const char *sum, const char *term) {
    char j[64], jl[80], lane_term[200], tail_term[200];
    row_index(k, j, sizeof j);
    snprintf(jl, sizeof jl, k->inner == 1 ? "j + lane" : "(j + lane) * %lld", (long long)k->inner);
    fill_index(term, jl, lane_term, sizeof lane_term);
    fill_index(term, j, tail_term, sizeof tail_term);
    cg_line(w, "float %s;", sum);
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "float lanes[8] = {0};");
    cg_line(w, "int64_t j = 0;");
    cg_line(w, "for (; j + 8 <= keys; j += 8)");
    cg_line(w, "    for (int lane = 0; lane < 8; lane++) lanes[lane] += %s;", lane_term);
    cg_line(w, "for (; j < keys; j++) lanes[0] += %s;", tail_term);
    cg_line(w, "%s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));", sum);
    w->indent--;
    cg_line(w, "}");
}

/* The keys a fused causal mask hides are exact zeros (and so is their gradient). */
static void zero_hidden_keys(cg_writer *w, const cg_rowwise *k, const char *j) {
    if (k->causal_queries) cg_line(w, "for (int64_t j = keys; j < %lld; j++) out_row[%s] = 0.0f;", (long long)k->n, j);
}

/* Subtracts the row max before exp, so that large logits cannot overflow; a fused
 * causal mask leaves the keys after the query at exactly 0 and skips their exp. */
void cg_c_softmax(cg_writer *w, const cg_rowwise *k) {
    char j[64];
    row_index(k, j, sizeof j);
    int indent = rowwise_open(w, k, 1);
    declare_keys(w, k);
    cg_line(w, "const float *row = %s + base;", k->x);
    cg_line(w, "float *out_row = %s + base;", k->out);
    cg_line(w, "float max = row[0];");
    cg_line(w, "for (int64_t j = 1; j < keys; j++) max = row[%s] > max ? row[%s] : max;", j, j);
    if (k->scale) {
        cg_line(w, "const float scaled_max = max * %s;", k->scale);
        cg_line(w, "for (int64_t j = 0; j < keys; j++) out_row[%s] = expf(row[%s] * %s - scaled_max);", j, j, k->scale);
    } else {
        cg_line(w, "for (int64_t j = 0; j < keys; j++) out_row[%s] = expf(row[%s] - max);", j, j);
    }
    lane_sum(w, k, "sum", "out_row[@]");
    cg_line(w, "const float inv_sum = 1.0f / sum;");
    cg_line(w, "for (int64_t j = 0; j < keys; j++) out_row[%s] *= inv_sum;", j);
    zero_hidden_keys(w, k, j);
    close_to(w, indent);
}

/* dx = scale * y * (dy - sum(y * dy)); keys a fused causal mask hid have y = 0, so
 * their gradient is 0. */
void cg_c_softmax_grad(cg_writer *w, const cg_rowwise *k) {
    char j[64];
    row_index(k, j, sizeof j);
    int indent = rowwise_open(w, k, 1);
    declare_keys(w, k);
    cg_line(w, "const float *y_row = %s + base, *dy_row = %s + base;", k->y, k->dy);
    cg_line(w, "float *out_row = %s + base;", k->out);
    lane_sum(w, k, "dot", "y_row[@] * dy_row[@]");
    if (k->scale)
        cg_line(w, "for (int64_t j = 0; j < keys; j++) out_row[%s] = %s * (y_row[%s] * (dy_row[%s] - dot));", j, k->scale, j, j);
    else
        cg_line(w, "for (int64_t j = 0; j < keys; j++) out_row[%s] = y_row[%s] * (dy_row[%s] - dot);", j, j, j);
    zero_hidden_keys(w, k, j);
    close_to(w, indent);
}

/* Query q sees keys 0 .. q + (keys - queries): with as many keys as queries, itself
 * and the earlier positions. */
void cg_c_causal_mask(cg_writer *w, const cg_rowwise *k) {
    long long nq = (long long)k->n, nk = (long long)k->inner;
    if (k->outer * nq * nk >= PARALLEL_MIN_ELEMS) cg_c_parallel_for(w, 2);
    cg_line(w, "for (int64_t r = 0; r < %lld; r++)", (long long)k->outer);
    cg_line(w, "    for (int64_t query = 0; query < %lld; query++)", nq);
    cg_line(w, "        for (int64_t key = 0; key < %lld; key++)", nk);
    cg_line(w, "            %s[(r * %lld + query) * %lld + key] = key > query + %lld ? %s : %s[(r * %lld + query) * %lld + key];",
            k->out, nq, nk, nk - nq, k->fill, k->x, nq, nk);
}

/* Declares `double sums[i]` for i < count: the terms (expressions with '@' for the
 * element index) of row elements 0 .. n-1, each added in 8 double lanes in one loop and
 * the lanes then in a fixed tree, so that the loop vectorises (a single running sum is a
 * chain of dependent adds the compiler may not reorder) and the bits do not depend on the
 * vector width. */
static void double_lane_sums(cg_writer *w, long long n, int count, const char *const *sums, const char *const *terms) {
    char lane_term[400], tail_term[400];
    for (int i = 0; i < count; i++) cg_line(w, "double %s;", sums[i]);
    cg_line(w, "{");
    w->indent++;
    for (int i = 0; i < count; i++) cg_line(w, "double %s_lanes[8] = {0};", sums[i]);
    if (n % 8) {
        cg_line(w, "int64_t j = 0;");
        cg_line(w, "for (; j + 8 <= %lld; j += 8) {", n);
    } else {
        cg_line(w, "for (int64_t j = 0; j < %lld; j += 8) {", n);
    }
    cg_line(w, "    for (int lane = 0; lane < 8; lane++) {");
    for (int i = 0; i < count; i++) {
        fill_index(terms[i], "j + lane", lane_term, sizeof lane_term);
        cg_line(w, "        %s_lanes[lane] += %s;", sums[i], lane_term);
    }
    cg_line(w, "    }");
    cg_line(w, "}");
    if (n % 8) {
        cg_line(w, "for (; j < %lld; j++) {", n);
        for (int i = 0; i < count; i++) {
            fill_index(terms[i], "j", tail_term, sizeof tail_term);
            cg_line(w, "    %s_lanes[0] += %s;", sums[i], tail_term);
        }
        cg_line(w, "}");
    }
    for (int i = 0; i < count; i++)
        cg_line(w, "%s = ((%s_lanes[0] + %s_lanes[1]) + (%s_lanes[2] + %s_lanes[3])) + ((%s_lanes[4] + %s_lanes[5]) + (%s_lanes[6] + %s_lanes[7]));",
                sums[i], sums[i], sums[i], sums[i], sums[i], sums[i], sums[i], sums[i], sums[i]);
    w->indent--;
    cg_line(w, "}");
}

/* The row's mean and 1 / sqrt(biased variance + eps), summed in double. */
static void layernorm_stats(cg_writer *w, const cg_rowwise *k) {
    long long n = (long long)k->n;
    cg_line(w, "const float *x_row = %s + base;", k->x);
    double_lane_sums(w, n, 1, (const char *const[]){"sum"}, (const char *const[]){"x_row[@]"});
    cg_line(w, "const float mean = (float)(sum / %lld.0);", n);
    double_lane_sums(w, n, 1, (const char *const[]){"sum_sq"}, (const char *const[]){"(double)(x_row[@] - mean) * (x_row[@] - mean)"});
    cg_line(w, "const float rstd = (float)(1.0 / sqrt(sum_sq / %lld.0 + %s));", n, k->eps);
}

/* The row just written, rounded into the cast's buffer too (cast_out), while it is in cache. */
static void cast_row(cg_writer *w, const cg_rowwise *k) {
    if (!k->cast_out) return;
    cg_line(w, "for (int64_t j = 0; j < %lld; j++) %s[base + j] = %s(out_row[j]);", (long long)k->n, k->cast_out,
            cg_round_function(k->cast_dtype));
}

void cg_c_layernorm(cg_writer *w, const cg_rowwise *k) {
    int indent = rowwise_open(w, k, 1);
    if (k->sum_a) { /* the residual add's row first, stored */
        cg_line(w, "float *sum_row = %s + base;", k->x);
        cg_line(w, "for (int64_t j = 0; j < %lld; j++) sum_row[j] = %s[base + j] + %s[base + j];", (long long)k->n, k->sum_a,
                k->sum_b);
    }
    layernorm_stats(w, k);
    /* only the cast reads the rows (out_unread): each made in a local array, its copy alone
     * stored */
    if (k->cast_out && k->out_unread)
        cg_line(w, "float out_row[%lld]; /* %s's row, which only its copy is made from */", (long long)k->n, k->out);
    else
        cg_line(w, "float *out_row = %s + base;", k->out);
    cg_line(w, "for (int64_t j = 0; j < %lld; j++) out_row[j] = (x_row[j] - mean) * rstd * %s[j] + %s[j];", (long long)k->n,
            k->weight, k->bias);
    cast_row(w, k);
    close_to(w, indent);
}

/* dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * weight. */
void cg_c_layernorm_grad(cg_writer *w, const cg_rowwise *k) {
    long long n = (long long)k->n;
    int indent = rowwise_open(w, k, 1);
    layernorm_stats(w, k);
    cg_line(w, "const float *dy_row = %s + base;", k->dy);
    cg_line(w, "float *out_row = %s + base;", k->out);
    char dxhat[200], dxhat_xhat[300];
    snprintf(dxhat, sizeof dxhat, "(double)(dy_row[@] * %s[@])", k->weight);
    snprintf(dxhat_xhat, sizeof dxhat_xhat, "%s * ((x_row[@] - mean) * rstd)", dxhat);
    double_lane_sums(w, n, 2, (const char *const[]){"sum_dxhat", "sum_dxhat_xhat"}, (const char *const[]){dxhat, dxhat_xhat});
    cg_line(w, "const float mean_dxhat = (float)(sum_dxhat / %lld.0), mean_dxhat_xhat = (float)(sum_dxhat_xhat / %lld.0);", n, n);
    cg_line(w, "for (int64_t j = 0; j < %lld; j++)%s", n, k->accumulate ? " {" : "");
    if (k->accumulate) {
        /* the residual's gradient in out_row plus this one: the add's float sum, in a
         * statement of its own so that no compiler fuses it into a multiply-add */
        cg_line(w, "    const float dx = rstd * (dy_row[j] * %s[j] - mean_dxhat - (x_row[j] - mean) * rstd * mean_dxhat_xhat);",
                k->weight);
        cg_line(w, "    out_row[j] = out_row[j] + dx;");
        cg_line(w, "}");
    } else {
        cg_line(w, "    out_row[j] = rstd * (dy_row[j] * %s[j] - mean_dxhat - (x_row[j] - mean) * rstd * mean_dxhat_xhat);",
                k->weight);
    }
    cast_row(w, k);
    close_to(w, indent);
}

/* A row's terms of the weight gradient (and of the bias's, bias_grad_out) added into
 * weight_sum (and bias_sum). */
static void wgrad_row_sums(cg_writer *w, const cg_rowwise *k, const char *weight_sum, const char *bias_sum) {
    long long n = (long long)k->n;
    cg_line(w, "const float *dy_row = %s + base;", k->dy);
    cg_line(w, "for (int64_t j = 0; j < %lld; j++) %s[j] += dy_row[j] * ((x_row[j] - mean) * rstd);", n, weight_sum);
    if (k->bias_grad_out) cg_line(w, "for (int64_t j = 0; j < %lld; j++) %s[j] += dy_row[j];", n, bias_sum);
}

/* The sum over rows of dy * xhat, and with bias_grad_out that of dy too. Large ones
 * (scratch given: c_wgrad_scratch_floats) sum WGRAD_GROUPS groups of rows apart, on the
 * threads, then add the groups' sums in order: the groups do not depend on the threads,
 * so neither do the bits. */
void cg_c_layernorm_wgrad(cg_writer *w, const cg_rowwise *k) {
    long long n = (long long)k->n, rows = (long long)k->outer;
    if (!k->scratch) {
        cg_line(w, "memset(%s, 0, %lld * sizeof(float));", k->out, n);
        if (k->bias_grad_out) cg_line(w, "memset(%s, 0, %lld * sizeof(float));", k->bias_grad_out, n);
        int indent = rowwise_open(w, k, 0);
        layernorm_stats(w, k);
        wgrad_row_sums(w, k, k->out, k->bias_grad_out);
        close_to(w, indent);
        return;
    }
    int sums = k->bias_grad_out ? 2 : 1;
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "float *group_sums = %s; /* (%d, %d, %lld) each group of rows' sum%s */", k->scratch, WGRAD_GROUPS, sums, n,
            sums > 1 ? "s: the weight's, the bias's" : "");
    cg_c_parallel_for(w, 1);
    cg_line(w, "for (int64_t group = 0; group < %d; group++) {", WGRAD_GROUPS);
    w->indent++;
    cg_line(w, "float *sum_out = group_sums + group * %lld;", sums * n);
    if (sums > 1) cg_line(w, "float *bias_sum_out = sum_out + %lld;", n);
    cg_line(w, "memset(sum_out, 0, %lld * sizeof(float));", sums * n);
    cg_line(w, "for (int64_t r = %lld * group / %d; r < %lld * (group + 1) / %d; r++) {", rows, WGRAD_GROUPS, rows, WGRAD_GROUPS);
    w->indent++;
    cg_line(w, "const int64_t base = r * %lld;", n);
    layernorm_stats(w, k);
    wgrad_row_sums(w, k, "sum_out", "bias_sum_out");
    w->indent--;
    cg_line(w, "}");
    w->indent--;
    cg_line(w, "}");
    for (int s = 0; s < sums; s++) {
        char at[48] = "j"; /* the bias's sums lie n floats after each group's weight sums */
        if (s) snprintf(at, sizeof at, "%lld + j", n);
        cg_line(w, "for (int64_t j = 0; j < %lld; j++) {", n);
        cg_line(w, "    float sum = group_sums[%s];", at);
        cg_line(w, "    for (int64_t group = 1; group < %d; group++) sum += group_sums[group * %lld + %s];", WGRAD_GROUPS,
                sums * n, at);
        cg_line(w, "    %s[j] = sum;", s ? k->bias_grad_out : k->out);
        cg_line(w, "}");
    }
    w->indent--;
    cg_line(w, "}");
}

/* Layernorm's weight gradient: room for its groups' sums, and its bias's (can.wgrad_bias),
 * when it is large enough to split (c_layernorm_wgrad); smaller ones sum row by row into
 * out. */
int64_t cg_c_wgrad_scratch_floats(int64_t rows, int64_t n) {
    return rows >= 2 * WGRAD_GROUPS && rows * n >= PARALLEL_MIN_ELEMS ? 2 * WGRAD_GROUPS * n : 0;
}
