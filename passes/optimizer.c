/* optimizer.c: appends the update of every parameter (phase update) and the optimizer
 * state it keeps (role state, zero at creation). A parameter the loss does not reach
 * (passes/trainable.c) gets neither, as torch.optim skips a parameter whose .grad is
 * None: no step, no weight decay. requires: autodiff (g->grads). */
#include "passes.h"

static int add_state(ir_graph *g, const ir_value *param, int p, const char *what) {
    ir_value *s = ir_add(g, OP_STATE, NULL, 0, param->loc);
    s->phase = PHASE_UPDATE;
    s->role = ROLE_STATE;
    s->type = param->type;
    s->param_index = p;
    s->name = ir_internf(g, "%s.%s", param->name, what);
    return s->id;
}

int pass_optimizer(ir_graph *g, dm_diag *d) {
    const ir_optimizer *o = &g->optimizer;
    if (o->kind == OPTIM_NONE || !g->grads) return 0;
    int errors = 0;
    for (int p = 0; p < g->n_params; p++) {
        const ir_value *param = g->values[g->params[p]];
        if (param->unreached) continue;
        int ops[4] = {param->id, g->grads[p], -1, -1};
        int n = 2;
        ir_op op;
        if (o->kind == OPTIM_SGD) {
            op = OP_SGD_UPDATE;
            if (o->momentum != 0) ops[n++] = add_state(g, param, p, "momentum_buffer");
        } else {
            op = OP_ADAMW_UPDATE;
            ops[n++] = add_state(g, param, p, "exp_avg");
            ops[n++] = add_state(g, param, p, "exp_avg_sq");
        }
        ir_value *u = ir_add(g, op, ops, n, o->loc);
        u->phase = PHASE_UPDATE;
        u->param_index = p;
        u->name = ir_internf(g, "%s.update", param->name);
        errors += shapes_infer(g, u, d);
    }
    return errors;
}
