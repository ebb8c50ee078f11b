/* powersgd.c: a gradient reduction of low rank with error feedback (PowerSGD, Vogels et
 * al. 2019), in the form docs/parallelism.md states: per matrix M (this rank's gradient
 * plus its residual), P = M Q, P summed over ranks and orthonormalised, Q = M^T P summed
 * over ranks, and the result P Q^T; the rank keeps M - P (its own M^T P)^T as its residual,
 * and the summed Q is the next step's starting point. Two allreduces per bucket: all P
 * (with the tensors reduced exactly) at once, then all Q.
 *
 * Matrices are row-major; P is rows x rank and Q is cols x rank, both row-major. Sums of
 * products are in float, in index order; the dot products and norms of the
 * orthonormalisation in double. */
#include "comm_internal.h"

#include <math.h>
#include <string.h>

/* ---- the shared random start ----------------------------------------------------------- */

/* splitmix64's output function on a counter: a different stream per parameter. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define GOLDEN 0x9e3779b97f4a7c15ull /* splitmix64's increment */

void dmrt_powersgd_random(float *q, int64_t n, uint64_t seed, uint64_t stream) {
    uint64_t key = mix64(seed + GOLDEN * (stream + 1));
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = mix64(key + GOLDEN * ((uint64_t)i + 1));
        /* the top 24 bits as an integer in [-2^23, 2^23), scaled into [-1, 1): exact in float */
        q[i] = (float)((int64_t)(z >> 40) - 8388608) * (1.0f / 8388608.0f);
    }
}

static int64_t q_elems(const dmrt_powersgd_segment *g, int rank) { return g->compressed ? g->cols * rank : 0; }

void dmrt_powersgd_init(float *q, const dmrt_powersgd_segment *segs, int n_segs, int rank, uint64_t seed) {
    for (int s = 0; s < n_segs; s++) {
        int64_t n = q_elems(&segs[s], rank);
        dmrt_powersgd_random(q, n, seed, segs[s].stream);
        q += n;
    }
}

/* ---- the products ------------------------------------------------------------------------ */

/* p (rows x rank) = m (rows x cols) q (cols x rank). */
static void times_q(const float *restrict m, const float *restrict q, float *restrict p, int64_t rows, int64_t cols,
                    int rank) {
    memset(p, 0, (size_t)(rows * rank) * sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
        float *pi = p + i * rank;
        const float *mi = m + i * cols;
        for (int64_t j = 0; j < cols; j++)
            for (int c = 0; c < rank; c++) pi[c] += mi[j] * q[j * rank + c];
    }
}

/* q (cols x rank) = m^T p. */
static void transposed_times_p(const float *restrict m, const float *restrict p, float *restrict q, int64_t rows,
                               int64_t cols, int rank) {
    memset(q, 0, (size_t)(cols * rank) * sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
        const float *mi = m + i * cols, *pi = p + i * rank;
        for (int64_t j = 0; j < cols; j++)
            for (int c = 0; c < rank; c++) q[j * rank + c] += mi[j] * pi[c];
    }
}

/* out = p q^T, or with `subtract` out -= p q^T: element (i, j) is sum_c p[i, c] q[j, c]. */
static void outer_product(const float *restrict p, const float *restrict q, float *restrict out, int64_t rows,
                          int64_t cols, int rank, int subtract) {
    for (int64_t i = 0; i < rows; i++) {
        const float *pi = p + i * rank;
        float *oi = out + i * cols;
        for (int64_t j = 0; j < cols; j++) {
            float sum = 0.0f;
            for (int c = 0; c < rank; c++) sum += pi[c] * q[j * rank + c];
            oi[j] = subtract ? oi[j] - sum : sum;
        }
    }
}

/* Gram-Schmidt on the columns of p (rows x rank), in order: each loses its components
 * along the columns before it, then is divided by its norm; a column of zeros stays zero. */
static void orthonormalise(float *p, int64_t rows, int rank) {
    for (int c = 0; c < rank; c++) {
        for (int d = 0; d < c; d++) {
            double dot = 0;
            for (int64_t i = 0; i < rows; i++) dot += (double)p[i * rank + d] * (double)p[i * rank + c];
            float f = (float)dot;
            for (int64_t i = 0; i < rows; i++) p[i * rank + c] -= f * p[i * rank + d];
        }
        double squares = 0;
        for (int64_t i = 0; i < rows; i++) squares += (double)p[i * rank + c] * (double)p[i * rank + c];
        float norm = (float)sqrt(squares);
        if (norm > 0.0f)
            for (int64_t i = 0; i < rows; i++) p[i * rank + c] /= norm;
    }
}

/* Whether q (cols x rank) must be drawn again: a column of all zeros (every later P would
 * have a zero column there, and the factor would never recover), or an element not finite
 * (a NaN or inf would spread into every later P and Q: a defence, since the generated code
 * keeps fp16's non-finite steps out, docs/comm.md). */
static int needs_redraw(const float *q, int64_t cols, int rank) {
    for (int64_t i = 0; i < cols * rank; i++)
        if (!isfinite(q[i])) return 1;
    for (int c = 0; c < rank; c++) {
        int64_t j = 0;
        while (j < cols && q[j * rank + c] == 0.0f) j++;
        if (j == cols) return 1;
    }
    return 0;
}

/* ---- the reduction -------------------------------------------------------------------------- */

int64_t dmrt_allreduce_powersgd_work(const dmrt_powersgd_segment *segs, int n_segs, int rank) {
    int64_t total = 0;
    for (int s = 0; s < n_segs; s++) total += segs[s].compressed ? segs[s].rows * rank : segs[s].rows * segs[s].cols;
    return total;
}

static int check_powersgd_segments(dmrt_comm *c, int64_t n, const dmrt_powersgd_segment *segs, int n_segs, int rank,
                                   const char *what) {
    if (rank < 1) return dmrt_comm_compress_fail(c, what, "PowerSGD rank %d (at least 1)", rank);
    for (int s = 0; s < n_segs; s++) {
        const dmrt_powersgd_segment *g = &segs[s];
        if (g->offset < 0 || g->rows < 0 || g->cols < 0 || g->offset + g->rows * g->cols > n)
            return dmrt_comm_compress_fail(c, what, "segment %d (offset %lld, %lld x %lld) does not fit a range of %lld", s,
                                           (long long)g->offset, (long long)g->rows, (long long)g->cols, (long long)n);
    }
    return 0;
}

int dmrt_allreduce_powersgd(dmrt_comm *c, float *grads, float *residual, float *q, int64_t n,
                            const dmrt_powersgd_segment *segs, int n_segs, int rank, uint64_t seed, int64_t step,
                            float *work, int64_t work_elems, const char *what) {
    if (!c) return DMRT_ERR_COMM;
    if (check_powersgd_segments(c, n, segs, n_segs, rank, what)) return DMRT_ERR_COMM;
    int64_t sent = dmrt_allreduce_powersgd_work(segs, n_segs, rank), q_total = 0;
    for (int s = 0; s < n_segs; s++) q_total += q_elems(&segs[s], rank);
    if ((sent > 0 && !grads) || (q_total > 0 && (!residual || !q))) return dmrt_comm_compress_fail(c, what, "a NULL buffer");
    if (dmrt_comm_check_work(c, what, work, work_elems, sent)) return DMRT_ERR_COMM;
    /* first exchange: every P, then the tensors reduced exactly */
    int64_t at = 0, q_at = 0;
    for (int s = 0; s < n_segs; s++) {
        const dmrt_powersgd_segment *g = &segs[s];
        if (!g->compressed) continue;
        float *m = residual + g->offset;
        const float *grad = grads + g->offset;
        dmrt_comm_feedback_add(m, grad, g->rows * g->cols);
        times_q(m, q + q_at, work + at, g->rows, g->cols, rank);
        at += g->rows * rank;
        q_at += g->cols * rank;
    }
    for (int s = 0; s < n_segs; s++)
        if (!segs[s].compressed) {
            memcpy(work + at, grads + segs[s].offset, (size_t)(segs[s].rows * segs[s].cols) * sizeof(float));
            at += segs[s].rows * segs[s].cols;
        }
    if (dmrt_allreduce_sum(c, work, sent, what)) return DMRT_ERR_COMM;
    /* this rank's Q from the common P; what P Q^T leaves of M stays as the residual */
    at = q_at = 0;
    for (int s = 0; s < n_segs; s++) {
        const dmrt_powersgd_segment *g = &segs[s];
        if (!g->compressed) continue;
        float *m = residual + g->offset, *p = work + at, *qs = q + q_at;
        orthonormalise(p, g->rows, rank);
        transposed_times_p(m, p, qs, g->rows, g->cols, rank);
        outer_product(p, qs, m, g->rows, g->cols, rank, 1);
        at += g->rows * rank;
        q_at += g->cols * rank;
    }
    for (int s = 0; s < n_segs; s++)
        if (!segs[s].compressed) {
            memcpy(grads + segs[s].offset, work + at, (size_t)(segs[s].rows * segs[s].cols) * sizeof(float));
            at += segs[s].rows * segs[s].cols;
        }
    if (dmrt_allreduce_sum(c, q, q_total, what)) return DMRT_ERR_COMM;
    /* the result P (sum of Q)^T; the sum of Q starts the next step */
    at = q_at = 0;
    for (int s = 0; s < n_segs; s++) {
        const dmrt_powersgd_segment *g = &segs[s];
        if (!g->compressed) continue;
        float *qs = q + q_at;
        outer_product(work + at, qs, grads + g->offset, g->rows, g->cols, rank, 0);
        if (needs_redraw(qs, g->cols, rank)) dmrt_powersgd_random(qs, g->cols * rank, seed, g->stream + ((uint64_t)step << 32));
        at += g->rows * rank;
        q_at += g->cols * rank;
    }
    return 0;
}
