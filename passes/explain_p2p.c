/* explain_p2p.c: a pipeline's point-to-point traffic (--explain): what each pipeline rank
 * sends in a step besides its collectives, as the generated code sends it
 * (codegen/emit_step.c):
 *   - every value a stage makes that other stages read goes to each of them, once per
 *     micro-batch: activations in the forward, gradients in the backward;
 *   - a tied parameter's partial gradient made on another rank goes to its owner: summed
 *     over the micro-batches and sent once a step where the step has several and one
 *     update (passes/tied_partials.c), else with the other gradients (one micro-batch,
 *     2bw, pipedream);
 *   - a tied parameter's owner sends its new values to every other rank holding a copy,
 *     once per step, after the update.
 * Sends between stages of one rank (model chunks) move nothing between ranks: not
 * counted. */
#include <stdlib.h>

#include "explain.h"

/* The bytes of value v's buffer on one rank. */
static double value_bytes(const ir_graph *g, const ir_value *v) {
    return (double)ir_local_numel(g, &v->type) * ir_dtype_bytes(v->type.dtype);
}

/* Adds to p->by_rank (and the largest) one value's sends: bytes each, `times` a step, from
 * stage `from` to every stage of `to` on another rank. */
static void add_sends(explain_p2p *p, const dm_pipeline_plan *pl, int value, int from, uint64_t to, double bytes, int times) {
    int r = dm_rank_of_stage(pl, from);
    double all = 0; /* to every destination */
    for (int t = 0; t < pl->stages && t < 64; t++)
        if (to >> t & 1 && dm_rank_of_stage(pl, t) != r) all += bytes * times;
    p->by_rank[r] += all;
    if (all > p->largest_bytes) p->largest_bytes = all, p->largest = value;
}

int explain_p2p_of(const ir_graph *g, const dm_memory_plan *mem, const dm_pipeline_plan *pl, explain_p2p *p) {
    int P = explain_pipeline_ranks(pl);
    *p = (explain_p2p){.ranks = P, .largest = -1};
    if (P <= 1 || !pl->readers || !mem->storage_of) return 0;
    p->by_rank = calloc((size_t)P, sizeof(double));
    if (!p->by_rank) abort();
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->stage < 0 || v->stage >= 64 || mem->region[i] != REGION_ARENA || mem->storage_of[i] != i) continue;
        uint64_t to = pl->readers[i] & ~((uint64_t)1 << v->stage);
        if (to) add_sends(p, pl, i, v->stage, to, value_bytes(g, v), explain_per_step(g, v->phase));
    }
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (!v->tied_partial_of || v->stage >= 64) continue;
        int owner = g->values[g->params[v->tied_partial_of - 1]]->stage;
        if (owner < 64) add_sends(p, pl, i, v->stage, (uint64_t)1 << owner, value_bytes(g, v), 1);
    }
    for (int t = 0; t < pl->n_tied; t++) {
        const ir_value *v = g->values[pl->tied[t]];
        int root = mem->storage_of[v->id];
        uint64_t holders = 0;
        for (int k = mem->copy_first[root]; k < mem->copy_first[root + 1]; k++)
            if (mem->copy_stage[k] < 64) holders |= (uint64_t)1 << mem->copy_stage[k];
        add_sends(p, pl, v->id, v->stage, holders, value_bytes(g, v), 1);
    }
    return P;
}

void explain_p2p_free(explain_p2p *p) {
    free(p->by_rank);
    p->by_rank = NULL;
}

void explain_p2p_text(const ir_graph *g, const dm_memory_plan *mem, const dm_pipeline_plan *pl, int full, FILE *out) {
    explain_p2p p;
    if (explain_p2p_of(g, mem, pl, &p) <= 1) return;
    char s[32];
    fprintf(out, "  point to point in a step: pipeline rank");
    for (int r = 0; r < p.ranks; r++) {
        explain_mib(p.by_rank[r] / 4.0, s, sizeof s);
        fprintf(out, "%s %d sends %s", r ? "," : "", r, s);
    }
    if (full)
        fprintf(out, "\n  (each micro-batch's activations to the stages that read them and its gradients back; tied\n"
                     "  parameters' partial gradients %s, and their new values after the\n  update)\n ",
                dm_runs_2bw(g) ? "among those" : "summed over the micro-batches");
    if (p.largest >= 0) {
        const ir_value *v = g->values[p.largest];
        explain_mib(p.largest_bytes / 4.0, s, sizeof s);
        fprintf(out, "%s the most: %s (line %d), %s a step", full ? "" : ";", v->name ? v->name : ir_op_info_of(v->op)->name,
                v->loc.line, s);
    }
    fprintf(out, "\n");
    explain_p2p_free(&p);
}

void explain_p2p_json(const ir_graph *g, const dm_memory_plan *mem, const dm_pipeline_plan *pl, FILE *out) {
    explain_p2p p;
    if (explain_p2p_of(g, mem, pl, &p) <= 1) return;
    fprintf(out, ", \"p2p_sent_bytes_by_pipeline_rank\": [");
    for (int r = 0; r < p.ranks; r++) fprintf(out, "%s%.0f", r ? ", " : "", p.by_rank[r]);
    fprintf(out, "]");
    explain_p2p_free(&p);
}
