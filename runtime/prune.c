/* prune.c: magnitude pruning's schedule and masks (dmc --prune; dmrt.h, docs/compression.md).
 *
 * The mask lives in the optimizer state, so the mask of update t is a function of the
 * weights after that update and the mask before it: a resumed run chooses the same. A
 * channel is pruned whole (element by element: each element is a channel) by its L2 norm;
 * the threshold is selected in O(channels) on a copy of the norms. An attention's heads
 * (dmrt_prune_heads) are units spread over several weights, ranked by one norm over all. */
#include <math.h>
#include <stdlib.h>

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

/* Channel c's L2 norm: its elements are those of outer block o at (o * channels + c) * inner + j. */
static float channel_norm(const float *w, int64_t n, int64_t channels, int64_t inner, int64_t c) {
    double sum = 0.0;
    for (int64_t base = c * inner; base < n; base += channels * inner)
        for (int64_t j = 0; j < inner; j++) sum += (double)w[base + j] * (double)w[base + j];
    return (float)sqrt(sum);
}

/* Of norm[0..channels), which it sets to 1.0 or 0.0, the count smallest pruned (ties at the
 * threshold: the lower index first); scratch holds channels floats. */
static void choose_smallest(float *norm, float *scratch, int64_t channels, int64_t count) {
    for (int64_t c = 0; c < channels; c++) scratch[c] = norm[c];
    float threshold = count > 0 ? kth_smallest(scratch, channels, count - 1) : 0.0f;
    int64_t below = 0;
    for (int64_t c = 0; c < channels && count > 0; c++) below += norm[c] < threshold;
    int64_t ties = count - below;
    for (int64_t c = 0; c < channels; c++) {
        int pruned = count > 0 && (norm[c] < threshold || (norm[c] == threshold && ties > 0));
        if (pruned && norm[c] == threshold) ties--;
        norm[c] = pruned ? 1.0f : 0.0f;
    }
}

/* The mask of the count channels of the smallest L2 norm. Element by element (channels n),
 * the mask's own buffer is the scratch. */
static int choose_mask(const float *w, float *mask, int64_t n, int64_t channels, int64_t inner, int64_t count) {
    if (channels == n) {
        float *norm = mask;
        for (int64_t i = 0; i < n; i++) norm[i] = fabsf(w[i]);
        /* the selection's copy: the weights' magnitudes again, read where a copy would be */
        float *scratch = malloc((size_t)n * sizeof *scratch);
        if (!scratch) return DMRT_ERR_NOMEM;
        choose_smallest(norm, scratch, n, count);
        free(scratch);
        return DMRT_OK;
    }
    float *norm = malloc(2 * (size_t)channels * sizeof *norm);
    if (!norm) return DMRT_ERR_NOMEM;
    for (int64_t c = 0; c < channels; c++) norm[c] = channel_norm(w, n, channels, inner, c);
    choose_smallest(norm, norm + channels, channels, count);
    for (int64_t i = 0; i < n; i++) mask[i] = norm[(i / inner) % channels];
    free(norm);
    return DMRT_OK;
}

/* The pruned elements of w set to 0. */
static void apply_mask(float *w, const float *mask, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (mask[i] != 0.0f) w[i] = 0.0f;
}

int dmrt_prune_chooses(const dmrt_prune_schedule *s, int64_t t, int64_t total_steps) {
    return total_steps > 0 && (double)t > s->start * (double)total_steps && (double)(t - 1) < s->end * (double)total_steps;
}

int dmrt_prune(float *w, float *mask, int64_t n, int64_t channels, int64_t inner, int64_t t, int64_t total_steps,
               const dmrt_prune_schedule *s) {
    if (dmrt_prune_chooses(s, t, total_steps)) {
        /* what was pruned is 0, the smallest: a growing count keeps it pruned */
        apply_mask(w, mask, n);
        int64_t count = (int64_t)nearbyint(dmrt_prune_sparsity(s, t, total_steps) * (double)channels);
        if (choose_mask(w, mask, n, channels, inner, count) != DMRT_OK) return DMRT_ERR_NOMEM;
    }
    apply_mask(w, mask, n);
    return DMRT_OK;
}

static int64_t unit_of(const dmrt_prune_part *p, int64_t i) {
    return (i / p->inner) % p->channels / p->unit;
}

int dmrt_prune_heads(const dmrt_prune_part *parts, int n_parts, int64_t units, int64_t t, int64_t total_steps,
                     const dmrt_prune_schedule *s) {
    if (dmrt_prune_chooses(s, t, total_steps)) {
        double *sum = calloc((size_t)units, sizeof *sum);
        float *norm = malloc(2 * (size_t)units * sizeof *norm);
        if (!sum || !norm) {
            free(sum);
            free(norm);
            return DMRT_ERR_NOMEM;
        }
        for (int k = 0; k < n_parts; k++) {
            const dmrt_prune_part *p = &parts[k];
            apply_mask(p->w, p->mask, p->n);
            for (int64_t i = 0; i < p->n; i++) sum[unit_of(p, i)] += (double)p->w[i] * (double)p->w[i];
        }
        for (int64_t u = 0; u < units; u++) norm[u] = (float)sqrt(sum[u]);
        int64_t count = (int64_t)nearbyint(dmrt_prune_sparsity(s, t, total_steps) * (double)units);
        choose_smallest(norm, norm + units, units, count);
        for (int k = 0; k < n_parts; k++)
            for (int64_t i = 0; i < parts[k].n; i++) parts[k].mask[i] = norm[unit_of(&parts[k], i)];
        free(sum);
        free(norm);
    }
    for (int k = 0; k < n_parts; k++) apply_mask(parts[k].w, parts[k].mask, parts[k].n);
    return DMRT_OK;
}
