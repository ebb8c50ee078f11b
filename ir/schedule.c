/* schedule.c: the optimizer's learning-rate schedule and gradient clipping as the .dm
 * writes them (`adamw(lr = 6e-4, warmup = 100, decay = cosine, min_lr = 6e-5, clip = 1.0)`):
 * the decay's names and the checks of the settings once all are read. The schedule runs
 * in the generated code (dmrt_lr_at, docs/language.md "Schedules and clipping"). */
#include <math.h>
#include <string.h>

#include "ir.h"

static const char *const decay_names[] = {"none", "cosine", "linear"};

const char *ir_decay_name(ir_decay decay) {
    return decay >= DECAY_NONE && decay <= DECAY_LINEAR ? decay_names[decay] : "?";
}

int ir_decay_from_name(const char *name, ir_decay *decay) {
    for (int k = DECAY_NONE; k <= DECAY_LINEAR; k++)
        if (strcmp(name, decay_names[k]) == 0) {
            *decay = (ir_decay)k;
            return 0;
        }
    return -1;
}

/* The settings the per-setting checks (finite, >= 0) cannot see alone. A setting with no
 * effect is an error rather than ignored: min_lr without a decay is most likely a decay
 * forgotten. */
void ir_check_schedule(const ir_optimizer *o, dm_loc loc, dm_diag *d) {
    if (o->warmup != floor(o->warmup) || o->warmup > 1e15)
        dm_error(d, loc, "warmup is a number of steps, a whole number, got %g", o->warmup);
    if (o->decay == DECAY_NONE && o->min_lr != 0)
        dm_error(d, loc, "min_lr is where a decay ends: set decay = cosine or decay = linear");
    else if (o->decay != DECAY_NONE && o->lr >= 0 && o->min_lr > o->lr) /* (a negative lr has its error) */
        dm_error(d, loc, "min_lr (%g) is above lr (%g): the decay falls from lr to min_lr", o->min_lr, o->lr);
}
