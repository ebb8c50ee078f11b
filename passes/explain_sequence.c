/* explain_sequence.c: what --sequence-parallel does to the plan (passes/shard.c), in
 * --explain: the forward's reduce-scatters and all-gathers over the rows (where tensor
 * parallelism alone allreduces), and the activations the backward reads that are held in
 * row blocks, per rank next to what they would hold whole. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "explain.h"

/* Per rank and micro-batch, on the pipeline stage holding the most: the forward values
 * split over the sequence axis on a row dim (not the last) that a backward op reads. */
typedef struct sequence_split {
    int axis;                 /* the sequence axis, or -1: sequence parallelism is off */
    int reduce_scatters, all_gathers; /* forward collectives over the axis along a row dim */
    int kept;                 /* values kept for the backward, row-split */
    double kept_elems, whole_elems;
} sequence_split;

/* Whether t is split over axis on the dim named sequence (the one the reduce-scatters
 * split: T of [B, T, C]; heads split by tensor parallelism are not rows). */
static int row_split(const ir_type *t, int axis, const char *sequence) {
    for (int i = 0; sequence && i + 1 < t->rank; i++)
        if (t->split[i] == axis && t->dim_name[i] && strcmp(t->dim_name[i], sequence) == 0) return 1;
    return 0;
}

/* The name of the dim the first forward reduce-scatter over axis splits, or NULL. */
static const char *sequence_dim(const ir_graph *g, int axis) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase == PHASE_FORWARD && v->op == OP_REDUCE_SCATTER && v->mesh_axis == axis && v->axis + 1 < v->type.rank)
            return v->type.dim_name[v->axis];
    }
    return NULL;
}

static sequence_split sequence_splits(const ir_graph *g) {
    sequence_split s = {.axis = dm_sequence_axis(g)};
    if (s.axis < 0) return s;
    const char *sequence = sequence_dim(g, s.axis);
    char *read_back = calloc((size_t)g->n_values + 1, 1);
    if (!read_back) abort();
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_BACKWARD) continue;
        for (int k = 0; k < v->n_operands; k++)
            if (ir_reads_operand(v, k)) read_back[v->operands[k]] = 1;
    }
    int pipe = ir_pipeline_axis(g), stages = pipe >= 0 ? (int)g->axes[pipe].size : 1;
    double kept[64] = {0}, whole[64] = {0};
    int count[64] = {0};
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_FORWARD) continue;
        if (v->mesh_axis == s.axis && (v->op == OP_REDUCE_SCATTER || v->op == OP_ALLGATHER)) {
            const ir_type *rows = v->op == OP_REDUCE_SCATTER ? &v->type : &g->values[v->operands[0]]->type;
            if (row_split(rows, s.axis, sequence)) {
                if (v->op == OP_REDUCE_SCATTER) s.reduce_scatters++;
                else s.all_gathers++;
            }
        }
        if (!read_back[i] || !row_split(&v->type, s.axis, sequence)) continue;
        int at = stages > 1 && v->stage >= 0 && v->stage < 64 ? v->stage : 0;
        double local = (double)ir_local_numel(g, &v->type);
        count[at]++;
        kept[at] += local;
        whole[at] += local * (double)g->axes[s.axis].size;
    }
    free(read_back);
    int most = 0;
    for (int k = 1; k < stages && k < 64; k++)
        if (kept[k] > kept[most]) most = k;
    s.kept = count[most], s.kept_elems = kept[most], s.whole_elems = whole[most];
    return s;
}

void explain_sequence_text(const ir_graph *g, int full, FILE *out) {
    sequence_split s = sequence_splits(g);
    if (s.axis < 0) return;
    char kept[32], whole[32];
    explain_mib(s.kept_elems, kept, sizeof kept);
    explain_mib(s.whole_elems, whole, sizeof whole);
    fprintf(out, "sequence parallelism over %s: %d reduce-scatters and %d all-gathers of rows in the forward pass; %d values\n"
                 "  the backward reads held as row blocks: %s per rank instead of %s\n",
            g->axes[s.axis].name, s.reduce_scatters, s.all_gathers, s.kept, kept, whole);
    if (full)
        fprintf(out, "  (one micro-batch, the stage holding the most): tensor parallelism alone allreduces where the\n"
                     "  reduce-scatters are and holds those values whole; the backward mirrors the forward\n");
    fprintf(out, "\n");
}

void explain_sequence_json(const ir_graph *g, FILE *out) {
    sequence_split s = sequence_splits(g);
    if (s.axis < 0) return;
    fprintf(out, ", \"sequence_parallel\": {\"axis\": ");
    explain_json_string(out, g->axes[s.axis].name);
    fprintf(out, ", \"forward_reduce_scatters\": %d, \"forward_all_gathers\": %d, \"kept_values\": %d, "
                 "\"kept_bytes\": %.0f, \"whole_bytes\": %.0f}",
            s.reduce_scatters, s.all_gathers, s.kept, 4 * s.kept_elems, 4 * s.whole_elems);
}
