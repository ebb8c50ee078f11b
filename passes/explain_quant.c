/* explain_quant.c: --quantize in --explain (docs/compression.md, "Quantization"): each
 * narrow weight's bytes per parameter, the parameters' bytes quantized (the tensors of the
 * --save-quantized file) against f32, and what the quantized program allocates. The sizes
 * are the runtime's own (runtime/dmrt_quant_size.h, by which gemm_quant.c allocates). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt_quant_size.h"
#include "explain.h"

typedef struct quant_weight {
    int value;               /* the parameter */
    int64_t rows, cols;      /* its narrow copy's: the product's [k, n] */
    int transposed;          /* read x @ transpose(W): the parameter is [cols, rows] */
    int f32_copy;            /* the program keeps its f32 parameter too (not dm_weight_held_narrow) */
    int64_t data_bytes;      /* the integers */
    int64_t scale_bytes;     /* the f32 scales (int8: its product's input scale too) */
} quant_weight;

typedef struct quant_sizes {
    int n;
    quant_weight *weights;   /* (n) in the order of the parameters, as the program holds them */
    int held_narrow;         /* of them, those without an f32 copy */
    int64_t narrow_bytes;    /* the weights' integers and scales */
    int64_t param_bytes;     /* every parameter as the --save-quantized file holds it */
    int64_t param_bytes_f32; /* every parameter in f32 */
    int64_t widening_bytes;  /* the most a product widens (a weight, or a window of its columns) in f32: a
                              * product thread's buffer (not int8) */
    int64_t activation_bytes;/* int8: the largest product's input in int8 and its int32 sums (a thread's) */
    int64_t f32_peak;        /* the tracked peak (the memory plan's): the f32 parameters kept and the forward's buffers */
} quant_sizes;

static int64_t group_of(const ir_graph *g, int64_t rows) {
    return dmrt_qweight_group_of(g->quantize_bits, rows, g->quantize_group);
}

static void quant_sizes_of(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline,
                           quant_sizes *q) {
    memset(q, 0, sizeof *q);
    char *narrow = calloc((size_t)g->n_values + 1, 1); /* 1: read x @ W, 2: x @ transpose(W) */
    q->weights = calloc((size_t)g->n_params + 1, sizeof *q->weights);
    if (!narrow || !q->weights) abort();
    int64_t qa = 0, acc = 0; /* int8: runtime/gemm_int8.c's buffers grow to the largest call's */
    for (int i = 0; i < g->n_values; i++) {
        int64_t col0, n; /* the columns of the weight's [k, n] the product reads */
        if (dm_quantized_window(g, g->values[i], &col0, &n) < 0) continue;
        int w = dm_quantized_weight_of(g, g->values[i]);
        const int tr = g->values[i]->trans_b;
        narrow[w] = (char)(1 + tr);
        const ir_type *wt = &g->values[w]->type;
        const int64_t k = wt->shape[tr ? 1 : 0];
        int64_t m = ir_numel(&g->values[i]->type) / n;
        if (m * k > qa) qa = m * k;
        if (m * n * 4 > acc) acc = m * n * 4;
        /* the weight-only modes widen what the product reads a block of its columns at a
         * time (gemm_quant.c, and the CUDA target's quant.cu alike) */
        int64_t widened = k * dmrt_qweight_widen_cols(k, n) * 4;
        if (widened > q->widening_bytes && !g->quantize_activations) q->widening_bytes = widened;
    }
    if (g->quantize_activations) q->activation_bytes = qa + acc;
    /* a table only embeddings read (--quantize-embeddings), laid out as read transposed */
    for (int i = 0; i < g->n_values; i++) {
        int w = dm_quantized_table(g, g->values[i]);
        if (w >= 0 && !narrow[w]) narrow[w] = 2;
    }
    for (int p = 0; p < g->n_params; p++) {
        const ir_value *v = g->values[g->params[p]];
        int64_t f32 = ir_numel(&v->type) * 4;
        q->param_bytes_f32 += f32;
        if (!narrow[g->params[p]]) {
            q->param_bytes += f32;
            continue;
        }
        quant_weight *w = &q->weights[q->n++];
        w->value = g->params[p];
        const int tr = narrow[g->params[p]] == 2; /* stored as the product's [k, n]: the transpose */
        w->rows = v->type.shape[tr ? 1 : 0];
        w->cols = ir_numel(&v->type) / w->rows; /* [its first dim, the rest] */
        w->transposed = tr;
        w->f32_copy = !dm_weight_held_narrow(g, g->params[p]);
        q->held_narrow += !w->f32_copy;
        w->data_bytes = dmrt_qweight_data_bytes(g->quantize_bits, w->rows, w->cols);
        w->scale_bytes = (dmrt_qweight_scale_count(w->rows, w->cols, group_of(g, w->rows)) + (g->quantize_activations ? 1 : 0)) * 4;
        q->narrow_bytes += w->data_bytes + w->scale_bytes;
        q->param_bytes += w->data_bytes + w->scale_bytes;
    }
    free(narrow);
    dm_memory_peak pk;
    dm_memory_peak_of(plan, g, pipeline, plan->scratch_elems, 0, &pk);
    q->f32_peak = pk.total;
}

static double bytes_per_param(const quant_weight *w) {
    return (double)(w->data_bytes + w->scale_bytes) / ((double)w->rows * (double)w->cols);
}

/* "int4-weights:64" */
static void mode_name(const ir_graph *g, char *buf, size_t size) {
    if (g->quantize_activations) snprintf(buf, size, "int8");
    else if (g->quantize_bits == 8) snprintf(buf, size, "int8-weights");
    else snprintf(buf, size, "int4-weights:%lld", (long long)g->quantize_group);
}

/* one weight's line after its name: "f32[784, 1024]  0.5625 bytes/param (0.5 + 4 / 64 rows)  451584 bytes" */
static void weight_tag(const ir_graph *g, const quant_weight *w, char *buf, size_t size) {
    char shape[48];
    /* the parameter's shape; a transposed one's scales are per row of it, its groups along a row */
    snprintf(shape, sizeof shape, "f32[%lld, %lld]", (long long)(w->transposed ? w->cols : w->rows),
             (long long)(w->transposed ? w->rows : w->cols));
    snprintf(buf, size, "%-20s %.4f bytes/param (%s + 4 / %lld %s%s)  %lld bytes", shape, bytes_per_param(w),
             g->quantize_bits == 8 ? "1" : "0.5", (long long)group_of(g, w->rows), w->transposed ? "columns" : "rows",
             g->quantize_activations ? " + its input scale" : "", (long long)(w->data_bytes + w->scale_bytes));
}

static void weight_lines(const ir_graph *g, const quant_sizes *q, int full, FILE *out) {
    const char **names = calloc((size_t)q->n + 1, sizeof *names);
    char **tags = calloc((size_t)q->n + 1, sizeof *tags);
    if (!names || !tags) abort();
    for (int i = 0; i < q->n; i++) {
        names[i] = g->values[q->weights[i].value]->name ? g->values[q->weights[i].value]->name : "?";
        if (!(tags[i] = malloc(128))) abort();
        weight_tag(g, &q->weights[i], tags[i], 128);
    }
    explain_name_group *groups = NULL;
    int n_groups = q->n;
    if (!full) n_groups = explain_collapse_names(names, (const char *const *)tags, q->n, &groups, NULL);
    for (int k = 0; k < n_groups; k++) {
        int first = full ? k : groups[k].first;
        fprintf(out, "  %-32s %s\n", full ? names[k] : groups[k].name, tags[first]);
    }
    if (!full) explain_name_groups_free(groups, n_groups);
    for (int i = 0; i < q->n; i++) free(tags[i]);
    free(tags);
    free(names);
}

void explain_quant_text(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, int full,
                        FILE *out) {
    if (!g->quantize_bits) return;
    quant_sizes q;
    quant_sizes_of(g, plan, pipeline, &q);
    char mode[48], narrow[32], peak[32], widening[32], total[32];
    mode_name(g, mode, sizeof mode);
    if (g->quantize_activations)
        fprintf(out, "\nquantized (--quantize int8): %d weight%s stored in int8, and the inputs x of the products x @ W\n"
                     "  that read them quantized as they run (int8 x int8, int32 sums; bytes/param: the integers, the\n"
                     "  f32 scales, one per column, and the product's input scale):\n", q.n, q.n == 1 ? "" : "s");
    else
        fprintf(out, "\nquantized (--quantize %s): %d weight%s stored narrow, widened to f32 inside the products x @ W\n"
                     "  that read them (bytes/param: the integers and the f32 scales, one per column and group of rows):\n",
                mode, q.n, q.n == 1 ? "" : "s");
    weight_lines(g, &q, full, out);
    fprintf(out, "  parameters: %lld bytes quantized (the --save-quantized file's tensors) vs %lld bytes f32 (%.3f)\n",
            (long long)q.param_bytes, (long long)q.param_bytes_f32,
            q.param_bytes_f32 ? (double)q.param_bytes / (double)q.param_bytes_f32 : 0.0);
    explain_mib((double)q.narrow_bytes / 4, narrow, sizeof narrow);
    explain_mib((double)q.f32_peak / 4, peak, sizeof peak);
    explain_mib((double)(q.widening_bytes + q.activation_bytes) / 4, widening, sizeof widening);
    explain_mib((double)(q.f32_peak + q.narrow_bytes + q.widening_bytes + q.activation_bytes) / 4, total, sizeof total);
    if (g->quantize_activations)
        fprintf(out, "  the program allocates %s: the tracked peak %s above (every parameter in f32, which the\n"
                     "  calibration's f32 forward reads, and one forward's activations: no gradients or optimizer\n"
                     "  state) + the int8 weights %s + buffers %s (the largest product's input in int8 and its int32\n"
                     "  sums) per thread that runs products (one in a serial program, and on the GPU)\n",
                total, peak, narrow, widening);
    else if (q.held_narrow)
        fprintf(out, "  the program allocates %s: the tracked peak %s above (the f32 parameters but the %d weight%s\n"
                     "  held narrow only, and one forward's activations: no gradients or optimizer state) + the\n"
                     "  narrow weights %s + a widening buffer %s (the largest weight or window a product widens,\n"
                     "  in f32) per thread that runs products (one in a serial program, and on the GPU)\n",
                total, peak, q.held_narrow, q.held_narrow == 1 ? "" : "s", narrow, widening);
    else
        fprintf(out, "  the program allocates %s: the tracked peak %s above (every parameter in f32 and one\n"
                     "  forward's activations: no gradients or optimizer state) + the narrow weights %s + a widening\n"
                     "  buffer %s (the largest weight or window a product widens, in f32) per thread that runs\n"
                     "  products (one in a serial program, and on the GPU)\n",
                total, peak, narrow, widening);
    /* the peak above and `dmc run --memory` count the context's tracked buffers; the narrow
     * weights (dmrt_qweight_init) and the products' buffers are allocated untracked */
    char apart[32];
    explain_mib((double)(q.narrow_bytes + q.widening_bytes + q.activation_bytes) / 4, apart, sizeof apart);
    fprintf(out, "  (the memory table's peak, --explain=json's peak_bytes_per_rank and `dmc run --memory`'s model peak\n"
                 "  are the tracked %s alone: the %s of narrow weights and buffers are allocated untracked)\n",
            peak, apart);
    free(q.weights);
}

void explain_quant_json(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, FILE *out) {
    if (!g->quantize_bits) return;
    quant_sizes q;
    quant_sizes_of(g, plan, pipeline, &q);
    char mode[48];
    mode_name(g, mode, sizeof mode);
    fprintf(out, ", \"quantized\": {\"mode\": \"%s\", \"bits\": %d, \"weights\": [", mode, g->quantize_bits);
    for (int i = 0; i < q.n; i++) {
        const quant_weight *w = &q.weights[i];
        fprintf(out, "%s{\"name\": ", i ? ", " : "");
        explain_json_string(out, g->values[w->value]->name ? g->values[w->value]->name : "?");
        fprintf(out, ", \"rows\": %lld, \"cols\": %lld, \"transposed\": %s, \"group\": %lld, \"data_bytes\": %lld, "
                     "\"scale_bytes\": %lld, \"bytes_per_param\": %.17g, \"f32_copy\": %s}",
                (long long)w->rows, (long long)w->cols, w->transposed ? "true" : "false", (long long)group_of(g, w->rows),
                (long long)w->data_bytes, (long long)w->scale_bytes, bytes_per_param(w), w->f32_copy ? "true" : "false");
    }
    fprintf(out, "], \"narrow_bytes\": %lld, \"param_bytes\": %lld, \"param_bytes_f32\": %lld, "
                 "\"widening_buffer_bytes\": %lld, \"activation_buffer_bytes\": %lld, \"f32_peak_bytes\": %lld, "
                 "\"program_bytes\": %lld}",
            (long long)q.narrow_bytes, (long long)q.param_bytes, (long long)q.param_bytes_f32,
            (long long)q.widening_bytes, (long long)q.activation_bytes, (long long)q.f32_peak,
            (long long)(q.f32_peak + q.narrow_bytes + q.widening_bytes + q.activation_bytes));
    free(q.weights);
}
