/* compress_cases.c: the compressed gradient reductions of dmrt_comm (compress.c,
 * powersgd.c) against serial computations written here (see comm_cases.h). */
#include "comm_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *floats(int64_t n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) abort();
    return p;
}

/* ---- the 16-bit formats, against the nearest of every value the format has ----------- */

/* Every finite non-negative value of a format in increasing order, decoded with ldexp
 * (not with the library's bit tricks), and the value past the largest that rounding to
 * infinity is measured against (the next power of two). */
typedef struct half_table {
    double value[1 << 15];
    uint16_t bits[1 << 15];
    int n;
    double past_largest;
} half_table;

static void fill_table(half_table *t, dmrt_half_format f) {
    int mant_bits = f == DMRT_FP16 ? 10 : 7, bias = f == DMRT_FP16 ? 15 : 127, max_e = (1 << (15 - mant_bits)) - 1;
    t->n = 0;
    for (int e = 0; e < max_e; e++)
        for (int m = 0; m < 1 << mant_bits; m++) {
            t->value[t->n] = e == 0 ? ldexp(m, 1 - bias - mant_bits) : ldexp((1 << mant_bits) + m, e - bias - mant_bits);
            t->bits[t->n++] = (uint16_t)(e << mant_bits | m);
        }
    t->past_largest = ldexp(1, max_e - bias);
}

/* The nearest value to x, ties to the even encoding; beyond the largest, infinity. */
static uint16_t nearest(const half_table *t, float x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    uint16_t inf = t->bits[t->n - 1] + 1; /* the encoding after the largest finite one */
    int lo = 0, hi = t->n - 1;
    if (a >= t->value[hi]) {
        double below = a - t->value[hi], above = t->past_largest - a;
        if (below < above || (below == above && !(t->bits[hi] & 1))) return sign | t->bits[hi];
        return sign | inf;
    }
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (t->value[mid] <= a) lo = mid;
        else hi = mid;
    }
    double below = a - t->value[lo], above = t->value[hi] - a;
    int pick_lo = below < above || (below == above && !(t->bits[lo] & 1));
    return sign | (pick_lo ? t->bits[lo] : t->bits[hi]);
}

static int check_format(dmrt_half_format f, const char *name) {
    static half_table t;
    fill_table(&t, f);
    int fails = 0;
    uint16_t inf = (uint16_t)(t.bits[t.n - 1] + 1);
    for (int k = 0; k < t.n && fails < 5; k++) {
        /* every value widens exactly, with either sign */
        fails += CASE_EXPECT(NULL, dmrt_half_to_float(t.bits[k], f) == t.value[k] &&
                                       dmrt_half_to_float((uint16_t)(t.bits[k] | 0x8000), f) == -t.value[k],
                             "%s 0x%04x widens to %.9g, expected %.9g", name, t.bits[k],
                             (double)dmrt_half_to_float(t.bits[k], f), t.value[k]);
    }
    fails += CASE_EXPECT(NULL, isinf(dmrt_half_to_float(inf, f)), "%s: 0x%04x is not infinity", name, inf);
    uint64_t z = 12345;
    for (int i = 0; i < 2 * t.n + 400000 && fails < 5; i++) {
        float x;
        if (i < 2 * t.n) {
            /* every value, and every point halfway to the next (which float holds exactly) */
            int k = i / 2;
            double v = i % 2 && k + 1 < t.n ? (t.value[k] + t.value[k + 1]) / 2 : t.value[k];
            x = (float)(k % 3 ? v : -v);
        } else {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t u = (uint32_t)(z >> 32);
            memcpy(&x, &u, sizeof x);
            if (isnan(x)) continue;
        }
        uint16_t want = isinf(x) ? (uint16_t)((signbit(x) ? 0x8000 : 0) | inf) : nearest(&t, x);
        uint16_t got = dmrt_half_from_float(x, f);
        fails += CASE_EXPECT(NULL, got == want, "%s of %.9g: 0x%04x, expected 0x%04x", name, (double)x, got, want);
    }
    fails += CASE_EXPECT(NULL, isnan(dmrt_half_to_float(dmrt_half_from_float(NAN, f), f)), "%s: NaN did not stay NaN", name);
    return fails;
}

int case_half_formats(void) { return check_format(DMRT_BF16, "bf16") + check_format(DMRT_FP16, "fp16"); }

/* ---- 16-bit allreduce: every rank's value rounded, summed in rank order, rounded ------- */

static int check_half_allreduce(dmrt_comm *c, uint32_t seed, int64_t n, dmrt_half_format f) {
    dmrt_rank *r = dmrt_comm_owner(c);
    int size = dmrt_comm_size(c);
    float *got = floats(n), *want = floats(n), *other = floats(n);
    float *work = floats(dmrt_allreduce_half_work(n, size));
    case_fill(got, n, seed, dmrt_comm_member(c, dmrt_comm_rank(c)));
    for (int k = 0; k < size; k++) {
        case_fill(other, n, seed, dmrt_comm_member(c, k));
        for (int64_t i = 0; i < n; i++) {
            float x = dmrt_half_to_float(dmrt_half_from_float(other[i], f), f);
            want[i] = k == 0 ? x : want[i] + x;
        }
    }
    for (int64_t i = 0; i < n; i++) want[i] = dmrt_half_to_float(dmrt_half_from_float(want[i], f), f);
    char what[128];
    snprintf(what, sizeof what, "%s allreduce of %lld", f == DMRT_FP16 ? "fp16" : "bf16", (long long)n);
    int fails = CASE_EXPECT(r, dmrt_allreduce_sum_half(c, got, n, f, work, dmrt_allreduce_half_work(n, size), what) == 0, "%s", dmrt_rank_error(r));
    fails += !case_same(r, what, got, want, n);
    free(got), free(want), free(other), free(work);
    return fails;
}

/* ---- 16-bit reduce-scatter (ZeRO under --compress bf16|fp16): block me of every rank's
 * send, each value rounded, summed in rank order, rounded: the allreduce's rule ------------ */

static int check_half_reduce_scatter(dmrt_comm *c, uint32_t seed, int64_t n_per_rank, dmrt_half_format f) {
    dmrt_rank *r = dmrt_comm_owner(c);
    int size = dmrt_comm_size(c), me = dmrt_comm_rank(c);
    int64_t total = size * n_per_rank, need = dmrt_reduce_scatter_half_work(n_per_rank, size);
    float *send = floats(total), *got = floats(n_per_rank), *want = floats(n_per_rank), *other = floats(total);
    float *work = floats(need);
    case_fill(send, total, seed, dmrt_comm_member(c, me));
    for (int k = 0; k < size; k++) {
        case_fill(other, total, seed, dmrt_comm_member(c, k));
        for (int64_t i = 0; i < n_per_rank; i++) {
            float x = dmrt_half_to_float(dmrt_half_from_float(other[me * n_per_rank + i], f), f);
            want[i] = k == 0 ? x : want[i] + x;
        }
    }
    for (int64_t i = 0; i < n_per_rank; i++) want[i] = dmrt_half_to_float(dmrt_half_from_float(want[i], f), f);
    char what[128];
    snprintf(what, sizeof what, "%s reduce-scatter of %lld a rank", f == DMRT_FP16 ? "fp16" : "bf16", (long long)n_per_rank);
    int fails = CASE_EXPECT(r, dmrt_reduce_scatter_sum_half(c, send, got, n_per_rank, f, work, need, what) == 0, "%s",
                            dmrt_rank_error(r));
    fails += !case_same(r, what, got, want, n_per_rank);
    free(send), free(got), free(want), free(other), free(work);
    return fails;
}

/* ---- top-k: the serial rule with a sort ------------------------------------------------- */

typedef struct keyed {
    float magnitude;
    int64_t index;
} keyed;

static int by_magnitude_then_index(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    if (x->magnitude != y->magnitude) return x->magnitude > y->magnitude ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Three tensors with gaps between them in a range of n (one when n is small). */
static int topk_segments(int64_t n, int k_mode, dmrt_topk_segment *segs) {
    int count = n < 12 ? 1 : 3;
    int64_t third = n / 3;
    for (int s = 0; s < count; s++) {
        segs[s].offset = count == 1 ? 0 : s * third + s;
        segs[s].count = count == 1 ? n : (s < 2 ? third - 1 : n - segs[s].offset - 2);
        int64_t m = segs[s].count;
        segs[s].k = m == 0 ? 0 : k_mode == 0 ? 1 : k_mode == 1 ? m / 10 + 1 : m;
    }
    return count;
}

/* A rank's gradients in round t; with `ties`, from five magnitudes only, so that
 * selection must break ties by index. */
static void topk_input(float *g, int64_t n, uint32_t seed, int world_rank, int t, int ties) {
    case_fill(g, n, seed + 100 * (uint32_t)t, world_rank);
    if (ties)
        for (int64_t i = 0; i < n; i++) g[i] = (float)((int64_t)fabsf(g[i]) % 5) * (g[i] < 0 ? -0.5f : 0.5f);
}

/* Every rank's residual evolves here as the rule says; the sum of the pieces is the result. */
static void topk_serial(dmrt_comm *c, uint32_t seed, int64_t n, const dmrt_topk_segment *segs, int n_segs, int t, int ties,
                        float **residuals, float *want) {
    int size = dmrt_comm_size(c);
    float *g = floats(n);
    keyed *order = malloc((size_t)(n > 0 ? n : 1) * sizeof(keyed));
    memset(want, 0, (size_t)n * sizeof(float));
    for (int k = 0; k < size; k++) {
        float *acc = residuals[k];
        topk_input(g, n, seed, dmrt_comm_member(c, k), t, ties);
        for (int s = 0; s < n_segs; s++) {
            for (int64_t i = 0; i < segs[s].count; i++) acc[segs[s].offset + i] += g[segs[s].offset + i];
            for (int64_t i = 0; i < segs[s].count; i++)
                order[i] = (keyed){fabsf(acc[segs[s].offset + i]), segs[s].offset + i};
            qsort(order, (size_t)segs[s].count, sizeof *order, by_magnitude_then_index);
            for (int64_t j = 0; j < segs[s].k; j++) {
                want[order[j].index] += acc[order[j].index];
                acc[order[j].index] = 0.0f;
            }
        }
    }
    free(g);
    free(order);
}

static int check_topk(dmrt_comm *c, uint32_t seed, int64_t n, int k_mode, int ties) {
    dmrt_rank *r = dmrt_comm_owner(c);
    int size = dmrt_comm_size(c), me = dmrt_comm_rank(c), fails = 0;
    dmrt_topk_segment segs[3];
    int n_segs = topk_segments(n, k_mode, segs);
    float *grads = floats(n), *residual = floats(n), *want = floats(n), *exact = floats(n);
    float *work = floats(dmrt_allreduce_topk_work(segs, n_segs, size));
    float **residuals = malloc((size_t)size * sizeof(float *));
    for (int k = 0; k < size; k++) residuals[k] = floats(n);
    char what[128];
    snprintf(what, sizeof what, "top-k (%s%s) of %lld", k_mode == 0 ? "k 1" : k_mode == 1 ? "k 10%" : "k all",
             ties ? ", ties" : "", (long long)n);
    for (int t = 0; t < 3 && !fails; t++) {
        topk_input(grads, n, seed, dmrt_comm_member(c, me), t, ties);
        /* the gaps between tensors hold zeros, as in generated code's gradient ranges */
        for (int64_t i = 0; i < n; i++) {
            int inside = 0;
            for (int s = 0; s < n_segs; s++) inside |= i >= segs[s].offset && i < segs[s].offset + segs[s].count;
            if (!inside) grads[i] = 0.0f;
        }
        memcpy(exact, grads, (size_t)n * sizeof(float));
        topk_serial(c, seed, n, segs, n_segs, t, ties, residuals, want);
        fails += CASE_EXPECT(r, dmrt_allreduce_topk(c, grads, residual, n, segs, n_segs, work, dmrt_allreduce_topk_work(segs, n_segs, size), what) == 0, "%s",
                             dmrt_rank_error(r));
        fails += !case_same(r, what, grads, want, n);
        fails += !case_same(r, "the residual", residual, residuals[me], n);
        if (k_mode == 2) {
            /* keeping every element is the plain allreduce (0 + x0 + x1 ...: equal as numbers) */
            fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, exact, n, "exact") == 0, "%s", dmrt_rank_error(r));
            for (int64_t i = 0; i < n && !fails; i++)
                fails += CASE_EXPECT(r, grads[i] == exact[i], "%s: element %lld is %.9g, the allreduce %.9g", what,
                                     (long long)i, (double)grads[i], (double)exact[i]);
        }
    }
    for (int k = 0; k < size; k++) free(residuals[k]);
    free(residuals), free(grads), free(residual), free(want), free(exact), free(work);
    return fails;
}

/* ---- PowerSGD: properties the rule implies --------------------------------------------- */

/* The largest |a - b| over n, relative to the largest |b| (at least 1e-30). */
static double relative_difference(const float *a, const float *b, int64_t n) {
    double worst = 0, scale = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        worst = d == d ? fmax(worst, d) : INFINITY; /* a NaN is off by everything, not skipped */
        scale = fmax(scale, fabs((double)b[i]));
    }
    return worst / scale;
}

/* Whether every rank holds the same n floats as comm rank 0, bit for bit. */
static int same_everywhere(dmrt_comm *c, const char *what, const float *x, int64_t n) {
    dmrt_rank *r = dmrt_comm_owner(c);
    float *first = floats(n);
    memcpy(first, x, (size_t)n * sizeof(float));
    int fails = CASE_EXPECT(r, dmrt_broadcast(c, 0, first, n, "rank 0's copy") == 0, "%s", dmrt_rank_error(r));
    fails += !case_same(r, what, x, first, n);
    free(first);
    return fails;
}

/* A 5 x 7 matrix, a vector of 6 and a 3 x 9 matrix, gaps between them, at rank 2: over
 * three steps the result and Q are the same on every rank, the vector is the exact sum,
 * and nothing is lost: the residuals summed over ranks plus the result are the inputs
 * summed (the residuals and the result add up to every rank's M). */
static int check_powersgd_steps(dmrt_comm *c, uint32_t seed) {
    dmrt_rank *r = dmrt_comm_owner(c);
    const dmrt_powersgd_segment segs[3] = {{0, 5, 7, 1, 0}, {36, 1, 6, 0, 1}, {44, 3, 9, 1, 2}};
    const int rank = 2;
    const int64_t n = 72, q_n = (7 + 9) * rank;
    int fails = 0, me_world = dmrt_comm_member(c, dmrt_comm_rank(c));
    float *grads = floats(n), *residual = floats(n), *q = floats(q_n), *before = floats(n), *after = floats(n);
    float *exact = floats(n), *work = floats(dmrt_allreduce_powersgd_work(segs, 3, rank));
    dmrt_powersgd_init(q, segs, 3, rank, 7);
    for (int t = 0; t < 3 && !fails; t++) {
        case_fill(grads, n, seed + (uint32_t)t, me_world);
        for (int64_t i = 0; i < n; i++) {
            int inside = (i < 35) || (i >= 36 && i < 42) || (i >= 44 && i < 71);
            if (!inside) grads[i] = 0.0f;
            before[i] = residual[i] + grads[i];
        }
        memcpy(exact, grads, (size_t)n * sizeof(float));
        fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, before, n, "inputs") == 0, "%s", dmrt_rank_error(r));
        fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, exact, n, "exact") == 0, "%s", dmrt_rank_error(r));
        fails += CASE_EXPECT(r, dmrt_allreduce_powersgd(c, grads, residual, q, n, segs, 3, rank, 7, t + 1, work, dmrt_allreduce_powersgd_work(segs, 3, rank), "powersgd") == 0,
                             "%s", dmrt_rank_error(r));
        fails += same_everywhere(c, "PowerSGD's result", grads, n) + same_everywhere(c, "the summed Q", q, q_n);
        fails += !case_same(r, "the vector, summed exactly", grads + 36, exact + 36, 6);
        memcpy(after, residual, (size_t)n * sizeof(float));
        fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, after, n, "residuals") == 0, "%s", dmrt_rank_error(r));
        for (int64_t i = 0; i < n; i++) after[i] += grads[i];
        double lost = relative_difference(after, before, 35) + relative_difference(after + 44, before + 44, 27);
        fails += CASE_EXPECT(r, lost < 1e-5, "step %d: residuals plus result differ from the inputs by %.3g (relative)", t, lost);
    }
    free(grads), free(residual), free(q), free(before), free(after), free(exact), free(work);
    return fails;
}

/* At rank = rows the factors span every row: the result is the exact sum and the
 * residual zero, up to rounding. A zero gradient leaves a Q of zeros, drawn again. */
static int check_powersgd_full_rank(dmrt_comm *c, uint32_t seed) {
    dmrt_rank *r = dmrt_comm_owner(c);
    const dmrt_powersgd_segment seg = {0, 3, 8, 1, 5};
    const int rank = 3;
    float grads[24], residual[24] = {0}, q[24], exact[24], work[9], redrawn[24];
    dmrt_powersgd_init(q, &seg, 1, rank, 11);
    case_fill(grads, 24, seed, dmrt_comm_member(c, dmrt_comm_rank(c)));
    memcpy(exact, grads, sizeof exact);
    int fails = CASE_EXPECT(r, dmrt_allreduce_sum(c, exact, 24, "exact") == 0, "%s", dmrt_rank_error(r));
    fails += CASE_EXPECT(r, dmrt_allreduce_powersgd(c, grads, residual, q, 24, &seg, 1, rank, 11, 1, work, 9, "full rank") == 0,
                         "%s", dmrt_rank_error(r));
    double err = relative_difference(grads, exact, 24);
    fails += CASE_EXPECT(r, err < 1e-5, "rank = rows: the result differs from the sum by %.3g (relative)", err);
    memset(grads, 0, sizeof grads);
    memset(residual, 0, sizeof residual);
    fails += CASE_EXPECT(r, dmrt_allreduce_powersgd(c, grads, residual, q, 24, &seg, 1, rank, 11, 4, work, 9, "zeros") == 0,
                         "%s", dmrt_rank_error(r));
    dmrt_powersgd_random(redrawn, 24, 11, 5 + ((uint64_t)4 << 32));
    fails += !case_same(r, "Q drawn again after a zero gradient", q, redrawn, 24);
    return fails;
}

/* ---- non-finite state: a defence (the generated code keeps fp16's skipped steps out) -- */

/* A residual element that is inf or NaN starts again from the gradient: the call gives
 * what it gives from a residual with zeros there. */
static int check_topk_poisoned_residual(dmrt_comm *c, uint32_t seed) {
    dmrt_rank *r = dmrt_comm_owner(c);
    const dmrt_topk_segment seg = {0, 40, 4};
    float grads[40], grads_clean[40], residual[40], residual_clean[40], work[64];
    case_fill(grads, 40, seed, dmrt_comm_member(c, dmrt_comm_rank(c)));
    case_fill(residual, 40, seed + 1, dmrt_comm_member(c, dmrt_comm_rank(c)));
    memcpy(grads_clean, grads, sizeof grads);
    memcpy(residual_clean, residual, sizeof residual);
    residual[3] = INFINITY, residual[17] = -INFINITY, residual[29] = NAN;
    residual_clean[3] = residual_clean[17] = residual_clean[29] = 0.0f;
    int64_t need = dmrt_allreduce_topk_work(&seg, 1, dmrt_comm_size(c));
    int fails = CASE_EXPECT(r, need <= 64 && dmrt_allreduce_topk(c, grads, residual, 40, &seg, 1, work, 64, "poisoned") == 0 &&
                                   dmrt_allreduce_topk(c, grads_clean, residual_clean, 40, &seg, 1, work, 64, "clean") == 0,
                            "%s", dmrt_rank_error(r));
    fails += !case_same(r, "top-k from a residual with inf and NaN", grads, grads_clean, 40);
    fails += !case_same(r, "its residual", residual, residual_clean, 40);
    return fails;
}

/* PowerSGD: a residual with inf and NaN as top-k's; a Q with a NaN gives a NaN result
 * this step (the scaler skips it) and is drawn again, and the next step is finite. */
static int check_powersgd_poisoned(dmrt_comm *c, uint32_t seed) {
    dmrt_rank *r = dmrt_comm_owner(c);
    const dmrt_powersgd_segment seg = {0, 6, 8, 1, 3};
    const int rank = 2;
    float grads[48], grads_clean[48], residual[48], residual_clean[48], q[16], q_clean[16], work[12], redrawn[16];
    int me = dmrt_comm_member(c, dmrt_comm_rank(c));
    case_fill(grads, 48, seed, me);
    case_fill(residual, 48, seed + 1, me);
    memcpy(grads_clean, grads, sizeof grads);
    memcpy(residual_clean, residual, sizeof residual);
    residual[5] = NAN, residual[40] = INFINITY;
    residual_clean[5] = residual_clean[40] = 0.0f;
    dmrt_powersgd_init(q, &seg, 1, rank, 9);
    memcpy(q_clean, q, sizeof q);
    int fails = CASE_EXPECT(r, dmrt_allreduce_powersgd(c, grads, residual, q, 48, &seg, 1, rank, 9, 1, work, 12, "poisoned") == 0 &&
                                   dmrt_allreduce_powersgd(c, grads_clean, residual_clean, q_clean, 48, &seg, 1, rank, 9, 1, work, 12,
                                                           "clean") == 0,
                            "%s", dmrt_rank_error(r));
    fails += !case_same(r, "PowerSGD from a residual with inf and NaN", grads, grads_clean, 48);
    fails += !case_same(r, "its residual", residual, residual_clean, 48) + !case_same(r, "its Q", q, q_clean, 16);
    q[7] = NAN;
    case_fill(grads, 48, seed + 2, me);
    fails += CASE_EXPECT(r, dmrt_allreduce_powersgd(c, grads, residual, q, 48, &seg, 1, rank, 9, 2, work, 12, "NaN in Q") == 0, "%s",
                         dmrt_rank_error(r));
    dmrt_powersgd_random(redrawn, 16, 9, 3 + ((uint64_t)2 << 32));
    fails += !case_same(r, "Q drawn again after a NaN", q, redrawn, 16);
    case_fill(grads, 48, seed + 3, me);
    fails += CASE_EXPECT(r, dmrt_allreduce_powersgd(c, grads, residual, q, 48, &seg, 1, rank, 9, 3, work, 12, "after") == 0, "%s",
                         dmrt_rank_error(r));
    for (int i = 0; i < 48 && !fails; i++)
        fails += CASE_EXPECT(r, isfinite(grads[i]) && isfinite(residual[i]), "the step after a NaN in Q: element %d is %g, "
                             "its residual %g", i, (double)grads[i], (double)residual[i]);
    return fails;
}

int case_compressed(dmrt_comm *c, uint32_t seed) {
    static const int64_t sizes[] = {0, 1, 2, 3, 17, 1000, 4097, 100003};
    int fails = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !fails; i++) {
        uint32_t s = seed + 16 * (uint32_t)i;
        fails += check_half_allreduce(c, s, sizes[i], DMRT_BF16) + check_half_allreduce(c, s + 1, sizes[i], DMRT_FP16);
        fails += check_half_reduce_scatter(c, s + 4, sizes[i], DMRT_BF16) +
                 check_half_reduce_scatter(c, s + 5, sizes[i], DMRT_FP16);
        for (int k_mode = 0; k_mode < 3; k_mode++)
            fails += check_topk(c, s + 2, sizes[i], k_mode, 0) + check_topk(c, s + 3, sizes[i], k_mode, 1);
    }
    fails += check_powersgd_steps(c, seed + 200) + check_powersgd_full_rank(c, seed + 300);
    fails += check_topk_poisoned_residual(c, seed + 400) + check_powersgd_poisoned(c, seed + 500);
    /* too little scratch fails on every rank before anything is sent */
    dmrt_rank *r = dmrt_comm_owner(c);
    float buf[100] = {0}, work[1];
    fails += CASE_EXPECT(r, dmrt_allreduce_sum_half(c, buf, 100, DMRT_BF16, work, 1, "small") == DMRT_ERR_COMM &&
                                case_has(dmrt_rank_error(r), "small on axis world") &&
                                case_has(dmrt_rank_error(r), "scratch of 1 floats, it needs"),
                         "too little scratch: %s", dmrt_rank_error(r));
    fails += CASE_EXPECT(r, dmrt_reduce_scatter_sum_half(c, buf, buf + 50, 5, DMRT_FP16, work, 1, "small rs") ==
                                    DMRT_ERR_COMM && case_has(dmrt_rank_error(r), "scratch of 1 floats, it needs"),
                         "too little scratch for the reduce-scatter: %s", dmrt_rank_error(r));
    return fails;
}
