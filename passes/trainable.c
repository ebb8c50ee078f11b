/* trainable.c: is the lowered program a training step? requires: lower (typed forward
 * graph, loss, optimizer). leaves: every parameter the loss does not depend on marked
 * unreached, with a warning; reports the statements a training step cannot do without.
 *
 * Code generation needs a loss and an optimizer, and a step without a parameter to update
 * trains nothing: these used to pass --check and fail at -o or at the first step of
 * `dmc run`, with no location. Each error points where the missing statement belongs:
 * the minimize statement (no optimizer), the optimizer (no loss), the end of the file
 * (neither), its start (an empty program). */
#include <stdlib.h>

#include "passes.h"

/* reaches[i]: the loss depends on value i (a path of operands from i to the loss). */
static char *values_reaching_loss(const ir_graph *g) {
    char *reaches = calloc((size_t)g->n_values + 1, 1);
    if (!reaches) abort();
    reaches[g->loss] = 1;
    for (int i = g->loss; i >= 0; i--)
        for (int k = 0; reaches[i] && k < g->values[i]->n_operands; k++) reaches[g->values[i]->operands[k]] = 1;
    return reaches;
}

static const char *loss_name(const ir_graph *g) {
    const char *name = g->values[g->loss]->name;
    return name ? name : "the loss";
}

/* Marks and warns about each parameter the loss does not reach; an error when none
 * does. */
static int check_parameters(ir_graph *g, dm_diag *d) {
    if (g->n_params == 0) {
        dm_error(d, g->loss_loc, "nothing to train: the program declares no parameters (param NAME : f32[...] = INIT)");
        return 1;
    }
    char *reaches = values_reaching_loss(g);
    int reached = 0;
    for (int p = 0; p < g->n_params; p++) reached += reaches[g->params[p]];
    if (!reached) {
        dm_error(d, g->loss_loc, "nothing to train: the loss '%s' depends on no parameter", loss_name(g));
        free(reaches);
        return 1;
    }
    for (int p = 0; p < g->n_params; p++) {
        ir_value *param = g->values[g->params[p]];
        if (reaches[param->id]) continue;
        param->unreached = 1;
        dm_warning(d, param->loc,
                   "parameter '%s' does not reach the loss '%s': it gets no gradient, and the optimizer neither "
                   "updates nor decays it", param->name, loss_name(g));
    }
    free(reaches);
    return 0;
}

int pass_trainable(ir_graph *g, dm_diag *d) {
    int has_optimizer = g->optimizer.kind != OPTIM_NONE;
    if (g->n_values == 0 && !has_optimizer && g->loss < 0) {
        dm_error(d, (dm_loc){1, 1, 1}, "the program is empty: a model needs inputs, parameters, a loss "
                                       "(minimize NAME) and an optimizer (optimizer adamw(lr = 1e-3))");
        return 1;
    }
    if (g->loss < 0 && !has_optimizer) {
        dm_error(d, dm_source_end(d->src), "the program has no loss and no optimizer: add `minimize NAME` (an f32 scalar) "
                                           "and `optimizer sgd(lr = 0.1)` or `optimizer adamw(lr = 1e-3)`");
        return 1;
    }
    if (g->loss < 0) {
        dm_error(d, g->optimizer.loc, "the optimizer has no loss to minimize: add `minimize NAME` (an f32 scalar)");
        return 1;
    }
    if (!has_optimizer) {
        dm_error(d, g->loss_loc, "'%s' is minimized, but the program declares no optimizer: add `optimizer sgd(lr = 0.1)` "
                                 "or `optimizer adamw(lr = 1e-3)`", loss_name(g));
        return 1;
    }
    return check_parameters(g, d);
}
