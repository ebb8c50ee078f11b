/* compress.c: gradient reductions that send less than float32 (docs/comm.md, "Compressed
 * gradient reductions"): 16-bit allreduce (bf16, fp16) and top-k sparsification with
 * error feedback. PowerSGD is in powersgd.c. Each is built on the collectives of
 * dmrt_comm.h (alltoall, allgather), so every backend runs it, and its result is the same
 * on every rank: the additions happen in comm-rank order as in dmrt_allreduce_sum.
 *
 * 16-bit values and int32 indices travel in float slots, moved by memcpy only: the
 * collectives copy bytes, so any bit pattern arrives as sent. */
#include "comm_internal.h"

#include <math.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------------- */

int dmrt_comm_compress_fail(dmrt_comm *c, const char *what, const char *fmt, ...) {
    comm_call call = {COMM_OP_ALLREDUCE, what && *what ? what : "compressed allreduce",
                      dmrt_comm_now() + c->rank->timeout, 0};
    va_list ap;
    va_start(ap, fmt);
    int status = dmrt_comm_vfail(c, &call, fmt, ap);
    va_end(ap);
    return status;
}

/* ---- 16-bit formats ----------------------------------------------------------------- */

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* bf16 is float32's upper half: round the lower half away, ties to even. */
static uint16_t bf16_from_float(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE binary16: 5 exponent bits (bias 15), 10 mantissa bits, subnormals below 2^-14. */
static uint16_t fp16_from_float(float x) {
    uint32_t u = float_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    /* 65520 is halfway between the largest half, 65504, and 65536: ties to even go up */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    uint32_t h, rest, half;
    if (a >= 0x38800000u) {
        /* a normal half: rebias the exponent (127 to 15), keep 10 of the 23 mantissa bits */
        h = (a >> 13) - ((127u - 15u) << 10);
        rest = a & 0x1fffu;
        half = 0x1000u;
    } else {
        /* a subnormal half counts units of 2^-24: the float's significand m (with its
         * leading bit) times 2^(e - 150), shifted right by 126 - e */
        uint32_t e = a >> 23;
        if (e < 102) return (uint16_t)sign; /* below 2^-25: rounds to zero */
        uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        h = m >> shift;
        rest = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    }
    /* to nearest, ties to even, without a branch (gradients round up and down at random); a
     * carry out of the mantissa is the next exponent */
    h += (uint32_t)(rest > half) | ((uint32_t)(rest == half) & h & 1u);
    return (uint16_t)(sign | h);
}

static float fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) return sign ? -ldexpf((float)m, -24) : ldexpf((float)m, -24);
    return bits_float(sign | ((e + 127u - 15u) << 23) | (m << 13));
}

uint16_t dmrt_half_from_float(float x, dmrt_half_format format) {
    return format == DMRT_FP16 ? fp16_from_float(x) : bf16_from_float(x);
}

float dmrt_half_to_float(uint16_t h, dmrt_half_format format) {
    return format == DMRT_FP16 ? fp16_to_float(h) : bits_float((uint32_t)h << 16);
}

/* Two 16-bit values in one float slot: element 2j in the low half. */
static void pack_pair(float *slot, uint16_t lo, uint16_t hi) {
    uint32_t word = (uint32_t)lo | (uint32_t)hi << 16;
    memcpy(slot, &word, sizeof word);
}

static void unpack_pair(const float *slot, uint16_t *lo, uint16_t *hi) {
    uint32_t word;
    memcpy(&word, slot, sizeof word);
    *lo = (uint16_t)(word & 0xffffu);
    *hi = (uint16_t)(word >> 16);
}

/* Each rank's slice of the result, in 16-bit values: ceil(n / ranks), made even so that a
 * slice is whole float slots. */
static int64_t half_slice(int64_t n, int ranks) {
    int64_t s = (n + ranks - 1) / ranks;
    return s + (s & 1);
}

int64_t dmrt_allreduce_half_work(int64_t n, int ranks) {
    if (ranks < 1 || n <= 0) return 0;
    /* the packed send blocks, then the received ones (which the all-gather reuses) */
    return 2 * (int64_t)ranks * (half_slice(n, ranks) / 2);
}

/* The three loops of the 16-bit allreduce, each written once and inlined per format (fp16
 * a constant), so that the conversions inline into them. */
static inline uint16_t narrow(float x, int fp16) { return fp16 ? fp16_from_float(x) : bf16_from_float(x); }
static inline float widen(uint16_t h, int fp16) { return fp16 ? fp16_to_float(h) : bits_float((uint32_t)h << 16); }

/* slots[0 .. total / 2): buf[0 .. total) in 16 bits, zeros past n. */
static inline void pack_all(const float *buf, int64_t n, int64_t total, float *slots, int fp16) {
    for (int64_t i = 0; i < total; i += 2)
        pack_pair(slots + i / 2, i < n ? narrow(buf[i], fp16) : 0, i + 1 < n ? narrow(buf[i + 1], fp16) : 0);
}

/* blocks[me]'s `slots` float slots = the sum over the ranks' blocks, each widened, added
 * in rank order, rounded once (block `me` itself is read before it is overwritten). */
static inline void sum_blocks(float *blocks, int ranks, int me, int64_t slots, int fp16) {
    for (int64_t j = 0; j < slots; j++) {
        uint16_t lo, hi;
        unpack_pair(blocks + j, &lo, &hi);
        float sum_lo = widen(lo, fp16), sum_hi = widen(hi, fp16);
        for (int k = 1; k < ranks; k++) {
            unpack_pair(blocks + (int64_t)k * slots + j, &lo, &hi);
            sum_lo += widen(lo, fp16);
            sum_hi += widen(hi, fp16);
        }
        pack_pair(blocks + (int64_t)me * slots + j, narrow(sum_lo, fp16), narrow(sum_hi, fp16));
    }
}

static inline void unpack_all(const float *slots, int64_t n, float *buf, int fp16) {
    for (int64_t i = 0; i < n; i += 2) {
        uint16_t lo, hi;
        unpack_pair(slots + i / 2, &lo, &hi);
        buf[i] = widen(lo, fp16);
        if (i + 1 < n) buf[i + 1] = widen(hi, fp16);
    }
}

int dmrt_comm_check_work(dmrt_comm *c, const char *what, const float *work, int64_t work_elems, int64_t need) {
    if (need > 0 && (!work || work_elems < need))
        return dmrt_comm_compress_fail(c, what, "scratch of %lld floats, it needs %lld", work ? (long long)work_elems : 0LL,
                                       (long long)need);
    return 0;
}

int dmrt_allreduce_sum_half(dmrt_comm *c, float *buf, int64_t n, dmrt_half_format format, float *work,
                            int64_t work_elems, const char *what) {
    if (!c) return DMRT_ERR_COMM;
    if (format != DMRT_BF16 && format != DMRT_FP16)
        return dmrt_comm_compress_fail(c, what, "unknown 16-bit format %d", (int)format);
    if (n < 0) return dmrt_comm_compress_fail(c, what, "negative count %lld", (long long)n);
    if (n == 0) return 0;
    if (!buf) return dmrt_comm_compress_fail(c, what, "a NULL buffer for %lld floats", (long long)n);
    if (dmrt_comm_check_work(c, what, work, work_elems, dmrt_allreduce_half_work(n, c->size))) return DMRT_ERR_COMM;
    int ranks = c->size, me = c->me, fp16 = format == DMRT_FP16;
    int64_t slice = half_slice(n, ranks), slots = slice / 2;
    float *send = work, *recv = work + (int64_t)ranks * slots;
    /* block k of send: slice k of buf */
    if (fp16) pack_all(buf, n, ranks * slice, send, 1);
    else pack_all(buf, n, ranks * slice, send, 0);
    if (dmrt_alltoall(c, send, recv, slots, what)) return DMRT_ERR_COMM;
    /* block k of recv: this rank's slice of rank k's buf; the sum goes into block me for the all-gather */
    if (fp16) sum_blocks(recv, ranks, me, slots, 1);
    else sum_blocks(recv, ranks, me, slots, 0);
    if (dmrt_allgather(c, recv + (int64_t)me * slots, recv, slots, what)) return DMRT_ERR_COMM;
    if (fp16) unpack_all(recv, n, buf, 1);
    else unpack_all(recv, n, buf, 0);
    return 0;
}

int64_t dmrt_reduce_scatter_half_work(int64_t n_per_rank, int ranks) {
    if (ranks < 1 || n_per_rank <= 0) return 0;
    /* the packed send blocks, then the received ones */
    return 2 * (int64_t)ranks * ((n_per_rank + 1) / 2);
}

int dmrt_reduce_scatter_sum_half(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                                 dmrt_half_format format, float *work, int64_t work_elems, const char *what) {
    if (!c) return DMRT_ERR_COMM;
    if (format != DMRT_BF16 && format != DMRT_FP16)
        return dmrt_comm_compress_fail(c, what, "unknown 16-bit format %d", (int)format);
    if (n_per_rank < 0) return dmrt_comm_compress_fail(c, what, "negative count %lld", (long long)n_per_rank);
    if (n_per_rank == 0) return 0;
    if (!send || !recv) return dmrt_comm_compress_fail(c, what, "a NULL buffer for %lld floats", (long long)n_per_rank);
    int ranks = c->size, me = c->me, fp16 = format == DMRT_FP16;
    if (dmrt_comm_check_work(c, what, work, work_elems, dmrt_reduce_scatter_half_work(n_per_rank, ranks)))
        return DMRT_ERR_COMM;
    int64_t slots = (n_per_rank + 1) / 2;
    float *packed = work, *got = work + (int64_t)ranks * slots;
    /* block k of packed: block k of send, for rank k */
    for (int k = 0; k < ranks; k++) {
        if (fp16) pack_all(send + (int64_t)k * n_per_rank, n_per_rank, 2 * slots, packed + (int64_t)k * slots, 1);
        else pack_all(send + (int64_t)k * n_per_rank, n_per_rank, 2 * slots, packed + (int64_t)k * slots, 0);
    }
    if (dmrt_alltoall(c, packed, got, slots, what)) return DMRT_ERR_COMM;
    /* block k of got: rank k's values of this rank's block, summed into block me */
    if (fp16) {
        sum_blocks(got, ranks, me, slots, 1);
        unpack_all(got + (int64_t)me * slots, n_per_rank, recv, 1);
    } else {
        sum_blocks(got, ranks, me, slots, 0);
        unpack_all(got + (int64_t)me * slots, n_per_rank, recv, 0);
    }
    return 0;
}

/* ---- top-k --------------------------------------------------------------------------- */

void dmrt_comm_feedback_add(float *acc, const float *grad, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] = isfinite(acc[i]) ? acc[i] + grad[i] : grad[i];
}

/* The order of magnitudes as an integer: a float's bits without the sign (non-negative
 * floats sort as their bits do; a NaN's bits sort above infinity, so a NaN counts as the
 * largest and is sent, and shows). */
static uint32_t magnitude_key(float x) { return float_bits(x) & 0x7fffffffu; }

/* The key of the k-th largest magnitude of x[0..n) (1 <= k <= n), and in *ties how many
 * elements with that key the k largest hold: a radix select on the key's bits, 11, 11 and
 * 9 at a time (the sign bit is zero), counting into a histogram per pass (no branch on the
 * data but a prefix test that settles fast, and no copy of x). */
static uint32_t kth_largest_key(const float *x, int64_t n, int64_t k, int64_t *ties) {
    static const int shifts[3] = {20, 9, 0}, widths[3] = {11, 11, 9};
    uint32_t prefix = 0;     /* the answer's bits above the current pass */
    int64_t need = k;        /* its rank among the keys that share the prefix, from the top */
    int64_t counts[2048];
    for (int pass = 0; pass < 3; pass++) {
        int shift = shifts[pass], width = widths[pass];
        uint32_t mask = (1u << width) - 1u;
        memset(counts, 0, sizeof counts);
        for (int64_t i = 0; i < n; i++) {
            uint32_t key = magnitude_key(x[i]);
            if (pass == 0 || key >> (shift + width) == prefix) counts[(key >> shift) & mask]++;
        }
        uint32_t bin = mask;
        while (counts[bin] < need) need -= counts[bin--];
        prefix = prefix << width | bin;
    }
    *ties = need;
    return prefix;
}

/* The k elements of x[0..n) largest in magnitude, ties to the lower index, in index order:
 * their values and their indices (plus base) into values[0..k) and index_slots[0..k), and
 * zeros in their place in x (what this rank sends leaves its residual). */
static void take_top_k(float *x, int64_t n, int64_t k, int64_t base, float *values, float *index_slots) {
    int64_t ties;
    uint32_t threshold = kth_largest_key(x, n, k, &ties);
    for (int64_t i = 0, taken = 0; i < n && taken < k; i++) {
        uint32_t key = magnitude_key(x[i]);
        if (key < threshold || (key == threshold && ties == 0)) continue;
        if (key == threshold) ties--;
        int32_t index = (int32_t)(base + i);
        values[taken] = x[i];
        memcpy(index_slots + taken, &index, sizeof index);
        x[i] = 0.0f;
        taken++;
    }
}

/* The elements every rank sends: K, the sum of the segments' k. */
static int64_t topk_elements(const dmrt_topk_segment *segs, int n_segs) {
    int64_t total = 0;
    for (int s = 0; s < n_segs; s++) total += segs[s].k;
    return total;
}

int64_t dmrt_allreduce_topk_work(const dmrt_topk_segment *segs, int n_segs, int ranks) {
    /* every rank's piece: K values, K indices */
    return 2 * topk_elements(segs, n_segs) * (ranks > 0 ? ranks : 1);
}

static int check_topk_segments(dmrt_comm *c, int64_t n, const dmrt_topk_segment *segs, int n_segs, const char *what) {
    if (n < 0 || n > INT32_MAX) return dmrt_comm_compress_fail(c, what, "a range of %lld floats (at most 2^31 - 1)", (long long)n);
    for (int s = 0; s < n_segs; s++) {
        const dmrt_topk_segment *g = &segs[s];
        if (g->offset < 0 || g->count < 0 || g->offset + g->count > n || g->k < (g->count > 0) || g->k > g->count)
            return dmrt_comm_compress_fail(c, what, "segment %d (offset %lld, %lld floats, k %lld) does not fit a range of %lld",
                                           s, (long long)g->offset, (long long)g->count, (long long)g->k, (long long)n);
    }
    return 0;
}

int dmrt_allreduce_topk(dmrt_comm *c, float *grads, float *residual, int64_t n, const dmrt_topk_segment *segs,
                        int n_segs, float *work, int64_t work_elems, const char *what) {
    if (!c) return DMRT_ERR_COMM;
    if (check_topk_segments(c, n, segs, n_segs, what)) return DMRT_ERR_COMM;
    int64_t K = topk_elements(segs, n_segs);
    if (n > 0 && (!grads || !residual))
        return dmrt_comm_compress_fail(c, what, "a NULL buffer for %lld floats", (long long)n);
    if (dmrt_comm_check_work(c, what, work, work_elems, K > 0 ? dmrt_allreduce_topk_work(segs, n_segs, c->size) : 0))
        return DMRT_ERR_COMM;
    int ranks = c->size;
    float *pieces = work;
    float *values = pieces + 2 * K * c->me, *indices = values + K;
    int64_t at = 0;
    for (int s = 0; s < n_segs; s++) {
        const dmrt_topk_segment *g = &segs[s];
        float *acc = residual + g->offset;
        const float *grad = grads + g->offset;
        dmrt_comm_feedback_add(acc, grad, g->count); /* error feedback: what was not sent before, plus now */
        if (g->k > 0) take_top_k(acc, g->count, g->k, g->offset, values + at, indices + at);
        at += g->k;
    }
    if (dmrt_allgather(c, values, pieces, 2 * K, what)) return DMRT_ERR_COMM;
    if (n > 0) memset(grads, 0, (size_t)n * sizeof(float));
    for (int r = 0; r < ranks; r++) {
        const float *v = pieces + 2 * K * r, *slots = v + K;
        for (int64_t j = 0; j < K; j++) {
            int32_t index;
            memcpy(&index, slots + j, sizeof index);
            if (index < 0 || index >= n)
                return dmrt_comm_compress_fail(c, what, "rank %d sent index %d, outside the range of %lld", r, (int)index,
                                               (long long)n);
            grads[index] += v[j];
        }
    }
    return 0;
}
