/* emit_prune_heads.c: --prune RATIO:rows over an attention's heads (passes/prune_heads.c,
 * docs/compression.md "Attention heads"). The weights of one attention (q, k, v and the
 * output projection, each with its mask) are pruned together: after the last of their
 * updates, one dmrt_prune_heads call ranks the heads by their norm over all of them. */
#include <stdio.h>

#include "emitter.h"

/* The update op whose mask (its last operand) is mask_id. */
static const ir_value *update_of_mask(const emitter *E, int mask_id) {
    for (int i = mask_id + 1; i < E->g->n_values; i++) {
        const ir_value *u = V(E, i);
        if (ir_op_info_of(u->op)->cls == OPC_UPDATE && u->operands[u->n_operands - 1] == mask_id) return u;
    }
    return NULL;
}

/* The masks of head group `group`, in graph order; returns their count. */
static int group_masks(const emitter *E, int group, int *masks) {
    int n = 0;
    for (int i = 0; i < E->g->n_values; i++)
        if (V(E, i)->prune_mask && V(E, i)->prune_group == group) masks[n++] = i;
    return n;
}

int prunes_heads(const emitter *E) {
    for (int i = 0; i < E->g->n_values; i++)
        if (V(E, i)->prune_mask && V(E, i)->prune_group) return 1;
    return 0;
}

int prune_heads_span_stages(const emitter *E) {
    for (int i = 0; i < E->g->n_values; i++) {
        const ir_value *m = V(E, i);
        int masks[8] = {0};
        if (m->prune_mask && m->prune_group)
            for (int k = 0, n = group_masks(E, m->prune_group, masks); k < n; k++)
                if (V(E, masks[k])->stage != m->stage) return 1;
    }
    return 0;
}

void emit_prune_heads(emitter *E, int mask_id) {
    int masks[8] = {0};
    int n = group_masks(E, V(E, mask_id)->prune_group, masks), last = masks[0];
    for (int k = 1; k < n; k++)
        if (update_of_mask(E, masks[k])->id > update_of_mask(E, last)->id) last = masks[k];
    cg_writer *w = &E->w;
    const ir_value *param = V(E, E->g->params[V(E, mask_id)->param_index]);
    if (last != mask_id) {
        cg_line(w, "/* --prune %g:rows: %s's heads are chosen with its attention's other weights, after %s's update */",
                E->g->prune.ratio, param->name, V(E, E->g->params[V(E, last)->param_index])->name);
        return;
    }
    int64_t units = 0;
    cg_line(w, "{");
    cg_line(w, "    /* --prune %g:rows: the attention's heads, each pruned whole in all of its weights */", E->g->prune.ratio);
    cg_line(w, "    const dmrt_prune_part parts[] = {");
    for (int k = 0; k < n; k++) {
        const ir_value *m = V(E, masks[k]);
        const ir_value *p = V(E, E->g->params[m->param_index]);
        int64_t channels = m->type.shape[m->axis], inner = 1;
        for (int d = m->axis + 1; d < m->type.rank; d++) inner *= m->type.shape[d];
        units = channels / m->prune_unit;
        cg_line(w, "        {%s, %s, %lld, %lld, %lld, %lld}, /* %s: dim %d, %lld per head unit */", E->cname[p->id],
                E->cname[m->id], (long long)ir_numel(&m->type), (long long)channels, (long long)inner,
                (long long)m->prune_unit, p->name, m->axis, (long long)m->prune_unit);
    }
    cg_line(w, "    };");
    w->indent++;
    cg_prune_heads k = {.n_parts = n, .units = units, .updates = cg_updates_done(E), .name = param->name};
    E->dialect->prune_heads(w, &k);
    w->indent--;
    cg_line(w, "}");
}
