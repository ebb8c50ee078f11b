/* schedule.c: the learning rate of each update under a .dm's schedule (docs/language.md,
 * "Schedules and clipping"). The generated code calls it once a step, on the host. */
#include "dmrt.h"

#include <math.h>

static const double pi = 3.14159265358979323846; /* M_PI is not C11 */

double dmrt_lr_at(const dmrt_lr_schedule *s, int64_t step, int64_t total_steps) {
    int64_t w = s->warmup;
    if (step <= w) return s->lr * (double)step / (double)w;
    if (s->decay == DMRT_DECAY_NONE) return s->lr;
    /* at the last step the decay reaches min_lr, and stays there past it (also when the
     * warmup takes the whole run: no step is left to decay over) */
    if (step >= total_steps) return s->min_lr;
    double progress = (double)(step - w) / (double)(total_steps - w);
    if (s->decay == DMRT_DECAY_COSINE) return s->min_lr + (s->lr - s->min_lr) * (1.0 + cos(pi * progress)) / 2.0;
    return s->min_lr + (s->lr - s->min_lr) * (1.0 - progress);
}
