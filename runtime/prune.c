/* prune.c: magnitude pruning's schedule and masks (dmc --prune; dmrt.h, docs/compression.md).
 *
 * The mask lives in the optimizer state, so the mask of update t is a function of the
 * weights after that update and the mask before it: a resumed run chooses the same. The
 * choice needs no memory of its own: the mask's buffer holds the magnitudes while the
 * threshold is selected, and is then written from the weights. */
#include <math.h>

#include "dmrt.h"

double dmrt_prune_sparsity(const dmrt_prune_schedule *s, int64_t t, int64_t total_steps) {
    if (total_steps <= 0) return 0.0;
    double t0 = s->start * (double)total_steps, t1 = s->end * (double)total_steps;
    double p = t1 > t0 ? ((double)t - t0) / (t1 - t0) : 1.0;
    if (p <= 0.0) return 0.0;
    if (p > 1.0) p = 1.0;
    double q = 1.0 - p;
    return s->ratio * (1.0 - q * q * q);
}

static void swap_f(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

/* The k-th smallest (from 0) of x[0..n), which it reorders (Hoare's selection, the
 * median of three as pivot). */
static float kth_smallest(float *x, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        if (x[mid] < x[lo]) swap_f(&x[mid], &x[lo]);
        if (x[hi] < x[lo]) swap_f(&x[hi], &x[lo]);
        if (x[hi] < x[mid]) swap_f(&x[hi], &x[mid]);
        float pivot = x[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (x[i] < pivot) i++;
            while (pivot < x[j]) j--;
            if (i <= j) swap_f(&x[i++], &x[j--]);
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return x[k];
    }
    return x[k];
}

/* The mask of the count smallest |w| (ties at the threshold: the lower index first). */
static void choose_mask(const float *w, float *mask, int64_t n, int64_t count) {
    if (count <= 0) {
        for (int64_t i = 0; i < n; i++) mask[i] = 0.0f;
        return;
    }
    for (int64_t i = 0; i < n; i++) mask[i] = fabsf(w[i]);
    float threshold = kth_smallest(mask, n, count - 1);
    int64_t below = 0;
    for (int64_t i = 0; i < n; i++) below += fabsf(w[i]) < threshold;
    int64_t ties = count - below;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(w[i]);
        int pruned = a < threshold || (a == threshold && ties > 0);
        if (a == threshold && pruned) ties--;
        mask[i] = pruned ? 1.0f : 0.0f;
    }
}

void dmrt_prune(float *w, float *mask, int64_t n, int64_t t, int64_t total_steps, const dmrt_prune_schedule *s) {
    int ramp = total_steps > 0 && (double)t > s->start * (double)total_steps &&
               (double)(t - 1) < s->end * (double)total_steps;
    if (ramp) {
        /* what was pruned is 0, the smallest: a growing count keeps it pruned */
        for (int64_t i = 0; i < n; i++)
            if (mask[i] != 0.0f) w[i] = 0.0f;
        choose_mask(w, mask, n, (int64_t)nearbyint(dmrt_prune_sparsity(s, t, total_steps) * (double)n));
    }
    for (int64_t i = 0; i < n; i++)
        if (mask[i] != 0.0f) w[i] = 0.0f;
}
