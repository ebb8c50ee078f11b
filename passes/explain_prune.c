/* explain_prune.c: --prune in --explain: the ratio, its schedule, and which weight matrices
 * are pruned (those whose update takes a mask: passes/optimizer.c) and what the masks cost. */
#include <stdio.h>
#include <stdlib.h>

#include "explain.h"
#include "passes.h"

/* The name of the weight that value i masks, or NULL when i is no mask. */
static const char *pruned_weight(const ir_graph *g, int i) {
    const ir_value *v = g->values[i];
    return v->prune_mask ? g->values[g->params[v->param_index]]->name : NULL;
}

static void explain_prune_heads(const ir_graph *g, FILE *out);
static void explain_prune_heads_json(const ir_graph *g, FILE *out);

void explain_prune_text(const ir_graph *g, FILE *out) {
    const ir_prune *p = &g->prune;
    if (p->ratio <= 0) return;
    double elems = 0;
    for (int i = 0; i < g->n_values; i++)
        if (pruned_weight(g, i)) elems += (double)ir_numel(&g->values[i]->type);
    fprintf(out, "pruning %g of each weight matrix (%s, per tensor), ramped from 0 over updates %g N to %g N of\n"
                 "  the run's N (cubic schedule), masks in the optimizer state (%.3g M floats):", p->ratio,
            p->rows ? "whole output channels by L2 norm" : "magnitude", p->start, p->end,
            elems / 1e6);
    for (int i = 0; i < g->n_values; i++)
        if (pruned_weight(g, i)) fprintf(out, " %s", pruned_weight(g, i));
    fprintf(out, "\n");
    if (p->rows) explain_prune_heads(g, out);
    fprintf(out, "\n");
}

/* Under RATIO:rows, each attention: its heads, the unit of its weights, or why not. */
static void explain_prune_heads(const ir_graph *g, FILE *out) {
    int n;
    prune_head_group *groups = prune_heads_find(g, &n);
    for (int i = 0; i < n; i++) {
        const prune_head_group *h = &groups[i];
        fprintf(out, "  attention at line %d: ", g->values[h->attention]->loc.line);
        if (h->why) {
            fprintf(out, "heads not recognised (%s): its weights stay per channel\n", h->why);
            continue;
        }
        if (h->units == h->q_heads)
            fprintf(out, "%lld heads of %lld, pruned whole (round(s * %lld) per step) in", (long long)h->units,
                    (long long)h->head_size, (long long)h->units);
        else
            fprintf(out, "%lld kv groups (a k/v head and its %lld query heads, heads of %lld), pruned whole in",
                    (long long)h->units, (long long)(h->q_heads / h->units), (long long)h->head_size);
        for (int m = 0; m < h->n_members; m++)
            fprintf(out, " %s (dim %d)", g->values[h->members[m].param]->name, h->members[m].axis);
        fprintf(out, "\n");
    }
    free(groups);
}

void explain_prune_json(const ir_graph *g, FILE *out) {
    const ir_prune *p = &g->prune;
    if (p->ratio <= 0) return;
    fprintf(out, ", \"prune\": {\"ratio\": %.17g, \"rows\": %s, \"start\": %.17g, \"end\": %.17g, \"weights\": [", p->ratio,
            p->rows ? "true" : "false", p->start, p->end);
    for (int i = 0, n = 0; i < g->n_values; i++)
        if (pruned_weight(g, i)) {
            fprintf(out, "%s", n++ ? ", " : "");
            explain_json_string(out, pruned_weight(g, i));
        }
    fprintf(out, "]");
    if (p->rows) explain_prune_heads_json(g, out);
    fprintf(out, "}");
}

/* "heads": one object per attention (under RATIO:rows, when the model has any). */
static void explain_prune_heads_json(const ir_graph *g, FILE *out) {
    int n;
    prune_head_group *groups = prune_heads_find(g, &n);
    if (n) fprintf(out, ", \"heads\": [");
    for (int i = 0; i < n; i++) {
        const prune_head_group *h = &groups[i];
        fprintf(out, "%s{\"line\": %d, ", i ? ", " : "", g->values[h->attention]->loc.line);
        if (h->why) {
            fprintf(out, "\"not_recognised\": ");
            explain_json_string(out, h->why);
            fprintf(out, "}");
            continue;
        }
        fprintf(out, "\"units\": %lld, \"q_heads\": %lld, \"head_size\": %lld, \"weights\": [", (long long)h->units,
                (long long)h->q_heads, (long long)h->head_size);
        for (int m = 0; m < h->n_members; m++) {
            fprintf(out, "%s{\"name\": ", m ? ", " : "");
            explain_json_string(out, g->values[h->members[m].param]->name);
            fprintf(out, ", \"dim\": %d, \"per_unit\": %lld}", h->members[m].axis, (long long)h->members[m].unit);
        }
        fprintf(out, "]}");
    }
    if (n) fprintf(out, "]");
    free(groups);
}
