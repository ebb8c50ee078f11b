/* emit_prune.c: --prune (docs/compression.md, "Pruning"). A pruned weight matrix's update
 * takes its mask, optimizer state of the parameter's shape (1.0 where pruned; zero at
 * creation: nothing pruned), and after the optimizer's step runs the dialect's prune hook:
 * dmrt_prune (runtime/prune.c), which zeroes the pruned elements and, on the schedule's
 * updates, chooses the mask again from the weights' magnitudes (CUDA: dmrt_gpu_prune, which
 * stages the weight and its mask through host memory for that choice). The mask being state, checkpoints
 * hold it (emit_state.c) and --resume restores it.
 *
 * The choice ranks every element of the whole tensor on the host: where a rank holds only a
 * block (a tensor-parallel split, ZeRO's shares), or the target has no prune hook, or an
 * update is not one step of the whole (2bw's versions, parameter servers), code generation
 * refuses it (check_prune). Data parallelism's replicas hold equal
 * weights and choose equal masks, and pipeline stages prune their own parameters. */
#include <stdio.h>

#include "emitter.h"

/* Why this program cannot prune, or NULL. */
static const char *prune_unsupported(const emitter *E) {
    const ir_graph *g = E->g;
    if (!E->dialect->prune) return "this target's dialect has no prune hook: --prune is not built for it";
    if (E->zero->n_buckets) return "ZeRO's updates hold a share of each weight, and a mask ranks the whole tensor";
    if (emits_2bw(E)) return "the 2bw and pipedream schedules' weight versions are not pruned";
    if (g->param_servers.servers) return "the parameter servers update the weights, and they do not prune";
    if (prunes_heads(E) && !E->dialect->prune_heads)
        return ":rows prunes an attention's heads together, which this target's dialect does not build yet (no prune_heads "
               "hook): use --target c";
    if (prune_heads_span_stages(E)) return ":rows ranks an attention's heads over all its weights, which a pipeline cut splits";
    for (int i = 0; i < g->n_values; i++) {
        if (!g->values[i]->prune_mask) continue;
        const ir_type *t = &g->values[g->params[g->values[i]->param_index]]->type;
        for (int d = 0; d < t->rank; d++)
            if (t->split[d] != IR_REPLICATED)
                return "a weight matrix split over a mesh axis (tensor parallelism) is held in blocks, and a mask ranks "
                       "the whole tensor";
    }
    return NULL;
}

int check_prune(const emitter *E, FILE *err) {
    const char *why = E->g->prune.ratio > 0 ? prune_unsupported(E) : NULL;
    if (why) fprintf(err, "%s: error: --prune: %s\n", E->source_path, why);
    return why ? -1 : 0;
}

/* The schedule, before the update functions that read it. */
void emit_prune_schedule(emitter *E) {
    const ir_prune *p = &E->g->prune;
    if (p->ratio <= 0) return;
    cg_writer *w = &E->w;
    cg_line(w, "/* --prune %g%s: every weight matrix's sparsity ramps from 0 to %g over updates %g N to %g N of the",
            p->ratio, p->rows ? ":rows" : "", p->ratio, p->start, p->end);
    cg_line(w, " * run's N (Zhu and Gupta's cubic schedule, runtime/prune.c) */");
    cg_line(w, "static const dmrt_prune_schedule prune_schedule = {.ratio = %.17g, .start = %.17g, .end = %.17g};", p->ratio,
            p->start, p->end);
    cg_blank(w);
}

/* In next_learning_rate: the schedule spans the run's updates, which must be known. */
void emit_prune_needs_total(emitter *E) {
    if (E->g->prune.ratio <= 0) return;
    cg_writer *w = &E->w;
    cg_line(w, "if (ctx->total_steps <= 0) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"--prune's schedule spans the run's total steps, which are not \"");
    cg_line(w, "             \"set: call %s_set_total_steps first (dmc run sets them from --steps or --epochs)\");",
            E->g->model);
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
}

/* After the update of the weight that mask_id masks: the pruned elements zeroed, the mask
 * chosen again on the schedule's updates, element by element or (RATIO:rows) by output
 * channel, the mask's axis. */
void emit_prune(emitter *E, int mask_id) {
    const ir_value *mask = V(E, mask_id);
    if (mask->prune_group) {
        emit_prune_heads(E, mask_id);
        return;
    }
    const ir_value *param = V(E, E->g->params[mask->param_index]);
    int64_t n = ir_numel(&mask->type), channels = n, inner = 1;
    if (E->g->prune.rows) {
        channels = mask->type.shape[mask->axis];
        for (int d = mask->axis + 1; d < mask->type.rank; d++) inner *= mask->type.shape[d];
    }
    cg_writer *w = &E->w;
    if (E->g->prune.rows)
        cg_line(w, "/* --prune %g:rows: %lld output channels (dim %d) of %lld elements each, pruned whole */",
                E->g->prune.ratio, (long long)channels, mask->axis, (long long)(n / channels));
    else
        cg_line(w, "/* --prune %g: element by element */", E->g->prune.ratio);
    cg_line(w, "/* the pruned elements zeroed; on the schedule's updates the mask chosen again */");
    cg_prune k = {.weight = E->cname[param->id], .mask = E->cname[mask_id], .updates = cg_updates_done(E), .name = param->name,
                  .n = n, .channels = channels, .inner = inner};
    E->dialect->prune(w, &k);
}
