/* tied_partials.c: a tied parameter's partial gradients summed where they are made.
 *
 * A parameter read on two pipeline ranks (GPT's token embedding on the first stage, the
 * head tied to it on the last) gets a partial gradient on each; autodiff adds them on the
 * owner's stage, the one that updates it. Left so, the last stage sends its partial (as
 * large as the parameter: V x C) to the owner after every micro-batch's backward pass. The
 * sum over micro-batches is linear, so this pass moves the addition after them: the add is
 * dropped (the owner's own partial becomes the micro-batch gradient it sums), and the other
 * rank's partial is marked (tied_partial_of). Code generation adds that partial into a sum
 * of its own on its rank, sends the sum once a step, and the owner adds it into the step's
 * gradient sum before anything reads it (the mean, the reductions, clipping, the loss
 * scaler's check). Megatron-LM likewise reduces the two copies' gradients once a step.
 *
 * Only where a step has several micro-batches whose gradients one update sums (GPipe,
 * 1F1B, interleaved): 2bw and pipedream keep the per-micro-batch sends, and one
 * micro-batch sends once a step already. A partial made on the owner's own rank (another
 * of its model chunks) moves nothing between ranks: left as it is. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* How many ops read value id (each operand slot once). */
static int readers_of(const ir_graph *g, int id) {
    int n = 0;
    for (int i = id + 1; i < g->n_values; i++)
        for (int k = 0; k < g->values[i]->n_operands; k++) n += g->values[i]->operands[k] == id;
    return n;
}

/* A partial made on another rank that the micro-batch gradient of parameter p adds: sets
 * *own to the owner's operand and returns the other's id, or -1. */
static int off_rank_partial(const ir_graph *g, const dm_pipeline_plan *pipe, int p, int *own) {
    const ir_value *sum = g->values[dm_micro_grad(g, p)];
    int owner = g->values[g->params[p]]->stage;
    if (sum->op != OP_ADD || sum->phase != PHASE_BACKWARD || sum->stage != owner) return -1;
    for (int k = 0; k < 2; k++) {
        const ir_value *other = g->values[sum->operands[k]], *mine = g->values[sum->operands[1 - k]];
        if (dm_rank_of_stage(pipe, other->stage) == dm_rank_of_stage(pipe, owner) || mine->stage != owner) continue;
        if (other->phase != PHASE_BACKWARD || other->role != ROLE_TEMP || mine->phase != PHASE_BACKWARD) continue;
        if (!ir_same_type(&other->type, &sum->type) || !ir_same_type(&mine->type, &sum->type)) continue;
        if (readers_of(g, other->id) != 1 || readers_of(g, mine->id) != 1) continue;
        *own = mine->id;
        return other->id;
    }
    return -1;
}

/* Drops value `drop` (an add) from the graph; its readers read `keep` instead, which takes
 * over its name and role. */
static void drop_add(ir_graph *g, int drop, int keep, dm_pipeline_plan *pipe, dm_reshard_list *reshards) {
    int n = g->n_values;
    ir_value **old = g->values;
    int *map = malloc(((size_t)n + 1) * sizeof(int));
    if (!map) abort();
    old[keep]->name = old[drop]->name;
    old[keep]->role = old[drop]->role;
    g->values = NULL;
    g->n_values = g->cap_values = 0;
    for (int i = 0; i < n; i++) {
        if (i == drop) {
            map[i] = map[keep];
            continue;
        }
        ir_value *v = old[i];
        for (int k = 0; k < v->n_operands; k++) v->operands[k] = map[v->operands[k]];
        ir_append_value(g, v);
        map[i] = v->id;
    }
    free(old);
    ir_renumber_lists(g, map);
    dm_plans_renumber(map, pipe, reshards);
    free(map);
}

int pass_tied_partials(ir_graph *g, dm_pipeline_plan *pipe, dm_reshard_list *reshards) {
    if (pipe->ranks <= 1 || !pipe->n_tied || g->microbatches <= 1 || !g->grads || g->loss < 0 || dm_runs_2bw(g))
        return 0;
    int marked = 0;
    for (int p = 0; p < g->n_params; p++) {
        int own, other;
        while (g->grads[p] >= 0 && (other = off_rank_partial(g, pipe, p, &own)) >= 0) {
            g->values[other]->tied_partial_of = p + 1;
            drop_add(g, dm_micro_grad(g, p), own, pipe, reshards);
            marked++;
        }
    }
    return marked;
}
