/* explain_compress.c: what --compress does to the plan (passes/compress.c), in --explain:
 * the bytes each rank sends per step for the data axis's gradients, compressed and as
 * the plain allreduce would (under ZeRO: its reduce-scatters, in 16 bits and in f32), and
 * the error-feedback state it keeps. */
#include <stdio.h>

#include "explain.h"

/* One compressed gradient: its bytes sent compressed and uncompressed (ring algorithms). */
typedef struct compressed_grad {
    const ir_value *grad;
    double sent, plain;
} compressed_grad;

static double plain_sent(const ir_graph *g, const ir_value *v) {
    double n = (double)g->axes[v->mesh_axis].size;
    return 4.0 * (double)ir_local_numel(g, &v->type) * 2 * (n - 1) / n;
}

/* Sums over the compressed gradients of the pipeline stage sending the most (all of them
 * without a pipeline: every rank holds every gradient), and, with each, calls fn. */
static void total(const ir_graph *g, double *sent, double *plain, double *state,
                  void (*fn)(const ir_graph *, const compressed_grad *, FILE *), FILE *out) {
    int pipe = ir_pipeline_axis(g), stages = pipe >= 0 ? (int)g->axes[pipe].size : 1;
    double by_stage[3][64] = {{0}};
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        double messages;
        compressed_grad c = {v, 0, 0};
        if (dm_compressed_allreduce(g, v)) {
            c.sent = dm_compress_sent(g, v, &messages), c.plain = plain_sent(g, v);
        } else if (dm_zero_half_reduction(g, v)) {
            /* ZeRO's reduce-scatter of it, in 16 bits (what an f32 one sends: half the allreduce's) */
            c.plain = plain_sent(g, v) / 2, c.sent = c.plain / 2;
        } else {
            continue;
        }
        int s = stages > 1 && v->stage >= 0 && v->stage < 64 ? v->stage : 0;
        by_stage[0][s] += c.sent;
        by_stage[1][s] += c.plain;
        by_stage[2][s] += 4.0 * (double)dm_compress_state_elems(g, v);
        if (fn) fn(g, &c, out);
    }
    int most = 0;
    for (int s = 1; s < stages && s < 64; s++)
        if (by_stage[1][s] > by_stage[1][most]) most = s;
    *sent = by_stage[0][most], *plain = by_stage[1][most], *state = by_stage[2][most];
}

static const char *rule_text(const ir_graph *g) {
    switch (g->compress.kind) {
    case COMPRESS_BF16: return "bfloat16 values on the wire: each rank's rounded, summed in float, the sum rounded";
    case COMPRESS_FP16: return "IEEE half values on the wire: each rank's rounded, summed in float, the sum rounded";
    case COMPRESS_TOPK:
        return "each rank sends the elements of each gradient largest in magnitude (values and indices);\n"
               "  what it does not send stays as its residual, added to the next step's";
    default:
        return "each matrix as rank-r factors P = M Q and Q = M^T P (P orthonormalised, Q carried to the\n"
               "  next step); what they miss stays as the rank's residual; vectors summed exactly";
    }
}

static void human(double bytes, char *buf, size_t size) {
    if (bytes >= 1024.0 * 1024.0) snprintf(buf, size, "%.2f MiB", bytes / (1024.0 * 1024.0));
    else snprintf(buf, size, "%.2f KiB", bytes / 1024.0);
}

static void grad_line(const ir_graph *g, const compressed_grad *c, FILE *out) {
    const ir_value *param = g->values[g->params[c->grad->param_index]];
    int64_t n = ir_local_numel(g, &c->grad->type), rows, cols;
    char sent[32], plain[32], how[96];
    human(c->sent, sent, sizeof sent);
    human(c->plain, plain, sizeof plain);
    if (g->compress.kind == COMPRESS_TOPK)
        snprintf(how, sizeof how, "%lld of %lld", (long long)dm_topk_keep(&g->compress, n), (long long)n);
    else if (g->compress.kind == COMPRESS_POWERSGD && dm_powersgd_matrix(g, c->grad, &rows, &cols))
        snprintf(how, sizeof how, "%lld x %lld, rank %d", (long long)rows, (long long)cols, g->compress.rank);
    else if (g->compress.kind == COMPRESS_POWERSGD)
        snprintf(how, sizeof how, "%lld, exact", (long long)n);
    else
        snprintf(how, sizeof how, "%lld", (long long)n);
    fprintf(out, "  %-44s %-24s %12s %12s\n", param->name, how, sent, plain);
}

void explain_compress_text(const ir_graph *g, int full, FILE *out) {
    if (g->compress.kind == COMPRESS_NONE) return;
    char name[64];
    dm_compress_name(&g->compress, name, sizeof name);
    int axis = dm_compress_axis(g);
    if (axis < 0) {
        fprintf(out, "gradient compression (--compress %s): nothing to compress, no mesh axis named data has more than "
                     "one rank\n\n", name);
        return;
    }
    double sent, plain, state;
    total(g, &sent, &plain, &state, NULL, out);
    char s[32], p[32], st[32];
    human(sent, s, sizeof s);
    human(plain, p, sizeof p);
    human(state, st, sizeof st);
    fprintf(out, "gradient compression over %s (--compress %s):\n  %s\n", g->axes[axis].name, name, rule_text(g));
    if (g->zero)
        fprintf(out, "  in ZeRO %d's reduce-scatters of the gradients (the parameters' all-gathers stay f32): per step\n"
                     "  and rank%s, %s sent, %s in f32 (%.1fx less)\n", g->zero,
                ir_pipeline_axis(g) >= 0 ? " of the stage sending most" : "", s, p, sent > 0 ? plain / sent : 0.0);
    else
        fprintf(out, "  bytes per step on the data axis, per rank%s (ring algorithms): %s sent, %s uncompressed (%.1fx less)\n",
                ir_pipeline_axis(g) >= 0 ? " of the stage sending most" : "", s, p, sent > 0 ? plain / sent : 0.0);
    if (state > 0) fprintf(out, "  error-feedback state %s per rank, kept with the optimizer state\n", st);
    if (full) {
        fprintf(out, "  %-44s %-24s %12s %12s\n", "gradient", "sent as", "sent", "uncompressed");
        total(g, &sent, &plain, &state, grad_line, out);
    }
    fprintf(out, "\n");
}

void explain_compress_json(const ir_graph *g, FILE *out) {
    if (g->compress.kind == COMPRESS_NONE) return;
    char name[64];
    dm_compress_name(&g->compress, name, sizeof name);
    double sent, plain, state;
    total(g, &sent, &plain, &state, NULL, out);
    int axis = dm_compress_axis(g);
    fprintf(out, ", \"compress\": {\"mode\": \"%s\", \"axis\": ", name);
    if (axis >= 0) explain_json_string(out, g->axes[axis].name);
    else fprintf(out, "null");
    fprintf(out, ", \"sent_bytes_per_rank\": %.0f, \"uncompressed_sent_bytes_per_rank\": %.0f, \"state_bytes_per_rank\": %.0f}",
            sent, plain, state);
}
