/* emit_flat_update.c: a serial program's optimizer update as one sgd or adamw call over
 * its parameters laid end to end (a target with can.flat_update: CUDA, where each call is a
 * kernel launch; C, where each is a parallel loop, whose threads wake and join), instead of
 * one call per parameter.
 *
 * It is the same arithmetic: the update is element-wise, and its hyper-parameters and this
 * step's factors are the program's, the same for every parameter; so each element gets
 * exactly the float operations its parameter's own call would give it. It applies only
 * where the parameters, their gradients and each optimizer state tensor (laid out so:
 * memory_update_layout) sit at the same relative offsets, one after another, with nothing
 * else between them but the regions' alignment padding; everything that differs per
 * parameter or runs between the gradients and the updates keeps the per-parameter calls. */
#include <stdio.h>

#include "emitter.h"

/* Where value id is in its region, or -1 where it shares another value's buffer or lies
 * outside `region`. */
static int64_t region_offset(const emitter *E, int id, dm_region region) {
    const dm_memory_plan *p = E->plan;
    if (p->region[id] != region || p->storage_of[id] != id) return -1;
    return p->offset[id];
}

/* What rules the single call out for the whole program: more than one rank or a pipeline,
 * the update split (clipping, loss scaling), ZeRO, parameter servers, --quantize,
 * micro-batches or accumulated gradients, weight_decay_1d = false (hyper-parameters that
 * differ by parameter). (The update's part, E->update_part, is asked
 * where the call is emitted.) */
static int program_allows(const emitter *E) {
    const ir_graph *g = E->g;
    for (int a = 0; a < g->n_axes; a++)
        if (g->axes[a].size > 1) return 0;
    return E->dialect->can.flat_update && E->ranks == 1 && E->plan->stages <= 1 && !E->scheduled &&
           g->microbatches <= 1 && !g->zero && !g->param_servers.servers && g->optimizer.clip <= 0 && g->loss_scale <= 0 &&
           !E->quant_bits && !g->optimizer.no_decay_1d;
}

/* Update op v as the next member of f (its parameter `expect` elements after the first's):
 * whether its parameter, gradient and state are where the single call would reach them. */
static int fits(const emitter *E, const ir_value *v, cg_flat_update *f, int64_t expect) {
    int mask = V(E, v->operands[v->n_operands - 1])->prune_mask, states = v->n_operands - 2 - mask;
    if (mask || states > 2 || (E->summed && E->summed[v->operands[1]] >= 0)) return 0;
    int64_t param = region_offset(E, v->operands[0], REGION_PARAMS), grad = region_offset(E, v->operands[1], REGION_GRADS);
    if (param < 0 || grad < 0) return 0;
    if (f->n_params == 0) {
        f->first = v->id, f->states = states, f->param_at = param, f->grad_at = grad;
        for (int j = 0; j < states; j++)
            if ((f->state_at[j] = region_offset(E, v->operands[2 + j], REGION_STATE)) < 0) return 0;
    }
    if (states != f->states || v->op != V(E, f->first)->op || param - f->param_at != expect || grad - f->grad_at != expect)
        return 0;
    for (int j = 0; j < states; j++)
        if (region_offset(E, v->operands[2 + j], REGION_STATE) - f->state_at[j] != expect) return 0;
    f->last = v->id;
    f->n_params++;
    f->count = expect + ir_numel(T(E, v->operands[0]));
    return 1;
}

/* Whether the program's update is one call, and which (f). Every op of the update phase
 * between the first update and the last is an update: nothing reads a parameter between.
 * A scan of every op: cg_plan_flat_update makes it once per program. */
static int scan_flat_update(const emitter *E, cg_flat_update *f) {
    const ir_graph *g = E->g;
    if (!program_allows(E)) return 0;
    *f = (cg_flat_update){.first = -1};
    int64_t expect = 0;
    int after_last = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        int cls = ir_op_info_of(v->op)->cls;
        if (v->phase != PHASE_UPDATE || cls == OPC_SOURCE) continue;
        if (cls != OPC_UPDATE) {
            after_last = f->n_params > 0;
            continue;
        }
        if (after_last || !fits(E, v, f, expect)) return 0;
        expect += dm_persistent_elems(g, ir_numel(T(E, v->operands[0])));
    }
    return f->n_params >= 2;
}

void cg_plan_flat_update(emitter *E) {
    if (!scan_flat_update(E, &E->flat_update)) E->flat_update = (cg_flat_update){.first = -1, .last = -1};
}

int flat_update_covers(const emitter *E, const ir_value *v) {
    return E->update_part == 0 && E->flat_update.first >= 0 && v->id >= E->flat_update.first &&
           v->id <= E->flat_update.last;
}

/* The single call at the first update, a comment at the others. Returns 0 where update v
 * takes its own call. */
int emit_flat_update(emitter *E, const ir_value *v) {
    if (!flat_update_covers(E, v)) return 0;
    const cg_flat_update f = E->flat_update;
    if (v->id != f.first) {
        cg_line(&E->w, "/* in the one update over every parameter at %s, above */", V(E, V(E, f.first)->operands[0])->name);
        return 1;
    }
    const char *first = V(E, V(E, f.first)->operands[0])->name, *last = V(E, V(E, f.last)->operands[0])->name;
    cg_line(&E->w, "/* One update for the %d parameters %s .. %s (every one this program updates), laid end to", f.n_params,
            first, last);
    cg_line(&E->w, " * end: ctx->params + [%lld, %lld), their gradients at ctx->grads + %lld and each state tensor",
            (long long)f.param_at, (long long)(f.param_at + f.count), (long long)f.grad_at);
    cg_line(&E->w, " * in the same order at the same relative offsets. The same arithmetic as an update per");
    cg_line(&E->w, " * parameter: the update is element-wise and its hyper-parameters and this step's factors");
    cg_line(&E->w, " * are the same for every parameter, so each element gets the same float operations. The");
    cg_line(&E->w, " * alignment padding between the parameters is zero in every region and stays zero. */");
    /* the ranges under names of their own: the dialect's loop or call indexes them */
    static const char *const adamw_states[2] = {"all_exp_avg", "all_exp_avg_sq"}, *const sgd_states[1] = {"all_momentum"};
    const char *const *state = v->op == OP_SGD_UPDATE ? sgd_states : adamw_states;
    char count[32];
    snprintf(count, sizeof count, "%lld", (long long)f.count);
    cg_line(&E->w, "{");
    E->w.indent++;
    cg_line(&E->w, "float *const all_params = ctx->params + %lld, *const all_grads = ctx->grads + %lld;", (long long)f.param_at,
            (long long)f.grad_at);
    for (int j = 0; j < f.states; j++)
        cg_line(&E->w, "float *const %s = ctx->state + %lld;", state[j], (long long)f.state_at[j]);
    cg_update k = {.opt = &E->g->optimizer, .count = count, .param = "all_params", .grad = "all_grads",
                   .updates = cg_updates_done(E)};
    if (f.states > 0) k.state0 = state[0];
    if (f.states > 1) k.state1 = state[1];
    if (v->op == OP_SGD_UPDATE) E->dialect->sgd(&E->w, &k);
    else E->dialect->adamw(&E->w, &k);
    E->w.indent--;
    cg_line(&E->w, "}");
    return 1;
}
