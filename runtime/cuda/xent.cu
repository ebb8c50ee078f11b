/* xent.cu: cross-entropy over rows of logits and its gradient, whole or vocabulary-parallel
 * (Megatron-LM: each rank holds a block of every row's classes; row maxima are
 * all-gathered and the sums of exp allreduced, as c_xent_split_stats in
 * codegen/dialect_c.c). Per row: max in float, sum of exp(logit - max) in double,
 * loss log(sum) + max - logit[target] in double; the rows' losses are added by one block
 * in a fixed order, so the loss has the same bits on every run. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "dmrt_cuda_sizes.h"
#include "gpu_internal.h"

/* ---- kernels --------------------------------------------------------------------------- */

/* A row's maximum (float), as every thread of the block sees it (c_xent_row_max). */
__device__ static float row_max_of(const float *row, int64_t classes, float *shared) {
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) mx = fmaxf(mx, row[c]);
    return gpu_block_reduce(mx, gpu_max_op(), shared);
}

/* A row's sum of exp(logit - mx), in double (c_xent_sum_exp). */
__device__ static double row_sum_exp(const float *row, int64_t classes, float mx, double *shared) {
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) sum += exp((double)(row[c] - mx));
    return gpu_block_reduce(sum, gpu_sum_op(), shared);
}

/* row_loss[r] = log(sum exp(row - max)) + max - row[target]; a target outside
 * [0, classes) records the fault and gives 0. */
__global__ static void xent_rows_kernel(const float *logits, const int32_t *targets,
                                        double *row_loss, int64_t rows, int64_t classes,
                                        dmrt_fault *fault, int site) {
    __shared__ float fshared[32];
    __shared__ double dshared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *row = logits + r * classes;
        const int32_t t = targets[r];
        if (t < 0 || t >= classes) {  /* the same for every thread of the block */
            if (threadIdx.x == 0) {
                gpu_record_fault(fault, site, t, r);
                row_loss[r] = 0.0;
            }
            continue;
        }
        const float mx = row_max_of(row, classes, fshared);
        const double sum = row_sum_exp(row, classes, mx, dshared);
        if (threadIdx.x == 0) row_loss[r] = log(sum) + (double)mx - (double)row[t];
    }
}

/* out[0] = sum of row_loss / mean_rows: one block, a fixed order. */
__global__ static void xent_total_kernel(const double *row_loss, float *out, int64_t rows,
                                         int64_t mean_rows) {
    __shared__ double shared[32];
    double sum = 0.0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += row_loss[r];
    sum = gpu_block_reduce(sum, gpu_sum_op(), shared);
    if (threadIdx.x == 0) out[0] = (float)(sum / (double)mean_rows);
}

/* dlogits = (softmax - onehot(target)) * dloss / mean_rows, with the C target's roundings:
 * the probability rounded to float, times scale, minus scale at the target. */
__global__ static void xent_grad_kernel(const float *logits, const int32_t *targets,
                                        const float *dloss_dev, float dloss_value,
                                        float *dlogits, int64_t rows, int64_t classes,
                                        int64_t mean_rows) {
    __shared__ float fshared[32];
    __shared__ double dshared[32];
    const float dloss = dloss_dev ? *dloss_dev : dloss_value;
    const float scale = dloss / (float)mean_rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *row = logits + r * classes;
        float *drow = dlogits + r * classes;
        const int64_t t = targets[r];  /* out of range: matches no class */
        const float mx = row_max_of(row, classes, fshared);
        const double sum = row_sum_exp(row, classes, mx, dshared);
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
            float v = __fmul_rn((float)(exp((double)(row[c] - mx)) / sum), scale);
            if (c == t) v = __fsub_rn(v, scale);
            drow[c] = v;
        }
    }
}

/* Split, step 1: maxima_mine[r] = the max of this rank's classes of row r; the forward
 * also checks the target against every rank's classes. */
__global__ static void xent_local_max_kernel(const float *logits, const int32_t *targets,
                                             float *maxima_mine, int64_t rows, int64_t classes,
                                             int64_t all_classes, dmrt_fault *fault, int site) {
    __shared__ float shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        if (site && threadIdx.x == 0) {
            const int32_t t = targets[r];
            if (t < 0 || t >= all_classes) gpu_record_fault(fault, site, t, r);
        }
        const float *row = logits + r * classes;
        const float mx = row_max_of(row, classes, shared);
        if (threadIdx.x == 0) maxima_mine[r] = mx;
    }
}

/* Split, step 2 (after the all-gather of maxima (comm_size, rows)): row_max[r] = the
 * max over ranks, in rank order as the C target; sums[r] = (float) this rank's sum of
 * exp(logit - row_max); forward: sums[rows + r] = the target's logit when this rank holds
 * it, else 0 (the allreduce that follows brings it to every rank). */
__global__ static void xent_split_sums_kernel(const float *logits, const int32_t *targets,
                                              const float *maxima, float *row_max, float *sums,
                                              int64_t rows, int64_t classes, int64_t comm_size,
                                              int64_t first_class, int forward) {
    __shared__ double shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *row = logits + r * classes;
        float mx = maxima[r];
        for (int64_t j = 1; j < comm_size; j++) mx = maxima[j * rows + r] > mx ? maxima[j * rows + r] : mx;
        const double sum = row_sum_exp(row, classes, mx, shared);
        if (threadIdx.x == 0) {
            row_max[r] = mx;
            sums[r] = (float)sum;
            if (forward) {
                const int64_t t = (int64_t)targets[r] - first_class;
                sums[rows + r] = t >= 0 && t < classes ? row[t] : 0.0f;
            }
        }
    }
}

/* Split forward, step 3: out[0] = sum over rows with a valid target of
 * log(sums) + row_max - target logit, / mean_rows (one block, a fixed order). */
__global__ static void xent_split_total_kernel(const int32_t *targets, const float *row_max,
                                               const float *sums, float *out, int64_t rows,
                                               int64_t all_classes, int64_t mean_rows) {
    __shared__ double shared[32];
    double total = 0.0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        const int32_t t = targets[r];
        if (t < 0 || t >= all_classes) continue;
        total += log((double)sums[r]) + (double)row_max[r] - (double)sums[rows + r];
    }
    total = gpu_block_reduce(total, gpu_sum_op(), shared);
    if (threadIdx.x == 0) out[0] = (float)(total / (double)mean_rows);
}

/* Split grad, step 3: as xent_grad_kernel with the statistics of every rank's classes. */
__global__ static void xent_split_grad_kernel(const float *logits, const int32_t *targets,
                                              const float *row_max, const float *sums,
                                              const float *dloss_dev, float dloss_value,
                                              float *dlogits, int64_t rows, int64_t classes,
                                              int64_t first_class, int64_t mean_rows) {
    const float dloss = dloss_dev ? *dloss_dev : dloss_value;
    const float scale = dloss / (float)mean_rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *row = logits + r * classes;
        float *drow = dlogits + r * classes;
        const int64_t t = (int64_t)targets[r] - first_class;
        const float mx = row_max[r];
        const double sum = (double)sums[r];
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
            float v = __fmul_rn((float)(exp((double)(row[c] - mx)) / sum), scale);
            if (c == t) v = __fsub_rn(v, scale);
            drow[c] = v;
        }
    }
}

/* ---- host ------------------------------------------------------------------------------------ */

/* The bound both sides agree on (dmrt_cuda_sizes.h). What is laid out, well inside it:
 * split: maxima (comm_size, rows), row_max (rows), sums (2, rows), (comm_size + 3) rows
 * in all; whole: the rows' losses as doubles (2 floats each, plus one to reach 8-byte
 * alignment). */
int64_t dmrt_gpu_xent_scratch(int64_t rows, int64_t comm_size) {
    return dmrt_cuda_xent_scratch_floats(rows, comm_size);
}

static int check_xent(dmrt_gpu *g, const char *what, int64_t rows, int64_t classes,
                      int64_t mean_rows) {
    if (rows < 0 || classes < 0 || mean_rows <= 0)
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                             "%s: bad sizes rows=%lld classes=%lld mean_rows=%lld", what,
                             (long long)rows, (long long)classes, (long long)mean_rows);
    return DMRT_OK;
}

int dmrt_gpu_cross_entropy(dmrt_gpu *g, const float *logits, const int32_t *targets,
                           float *out_loss, int64_t rows, int64_t classes, int64_t mean_rows,
                           float *scratch, int site) {
    GPU_ENTER(g);
    int rc = check_xent(g, "dmrt_gpu_cross_entropy", rows, classes, mean_rows);
    if (rc != DMRT_OK) return rc;
    ARG_CHECK(g, out_loss != NULL && (rows == 0 || scratch != NULL));
    double *row_loss = (double *)(((uintptr_t)scratch + 7) & ~(uintptr_t)7);
    if (rows > 0) {
        xent_rows_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
            logits, targets, row_loss, rows, classes, g->fault, site);
        LAUNCH_CHECK(g, "xent_rows_kernel");
    }
    xent_total_kernel<<<1, 256, 0, g->stream>>>(row_loss, out_loss, rows, mean_rows);
    LAUNCH_CHECK(g, "xent_total_kernel");
    return DMRT_OK;
}

int dmrt_gpu_cross_entropy_grad(dmrt_gpu *g, const float *logits, const int32_t *targets,
                                const float *dloss_dev, float dloss_value, float *dlogits,
                                int64_t rows, int64_t classes, int64_t mean_rows,
                                float *scratch) {
    (void)scratch;  /* each row's statistics stay in its block */
    GPU_ENTER(g);
    int rc = check_xent(g, "dmrt_gpu_cross_entropy_grad", rows, classes, mean_rows);
    if (rc != DMRT_OK) return rc;
    if (rows == 0 || classes == 0) return DMRT_OK;
    xent_grad_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
        logits, targets, dloss_dev, dloss_value, dlogits, rows, classes, mean_rows);
    LAUNCH_CHECK(g, "xent_grad_kernel");
    return DMRT_OK;
}

/* Steps 1 and 2 of both split directions, with their collectives; the statistics end in
 * scratch as the layout of dmrt_gpu_xent_scratch says. */
static int split_stats(dmrt_gpu *g, dmrt_comm *comm, int64_t coord, int64_t comm_size,
                       const float *logits, const int32_t *targets, int64_t rows,
                       int64_t classes, float *scratch, int site, const char *what,
                       int forward) {
    float *maxima = scratch;                    /* (comm_size, rows) */
    float *row_max = maxima + comm_size * rows; /* (rows) */
    float *sums = row_max + rows;               /* (2, rows) sums, target logits */
    const char *label = what ? what : "cross-entropy";
    char text[256];
    if (rows > 0) {
        xent_local_max_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
            logits, targets, maxima + coord * rows, rows, classes, comm_size * classes, g->fault,
            forward ? site : 0);
        LAUNCH_CHECK(g, "xent_local_max_kernel");
    }
    snprintf(text, sizeof text, "allgather of the row maxima of %s", label);
    int rc = dmrt_gpu_allgather(g, comm, maxima + coord * rows, maxima, rows, text);
    if (rc != DMRT_OK) return rc;
    if (rows > 0) {
        xent_split_sums_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
            logits, targets, maxima, row_max, sums, rows, classes, comm_size, coord * classes,
            forward);
        LAUNCH_CHECK(g, "xent_split_sums_kernel");
    }
    snprintf(text, sizeof text, "allreduce of the row sums of %s", label);
    return dmrt_gpu_allreduce_sum(g, comm, sums, forward ? 2 * rows : rows, text);
}

/* The maxima are all-gathered in place, so this rank's block must sit where the
 * communicator puts its rank: coord and comm_size are comm's. */
static int check_split(dmrt_gpu *g, const char *what, dmrt_comm *comm, int64_t coord,
                       int64_t comm_size, int64_t rows, int64_t classes, int64_t mean_rows,
                       const float *scratch) {
    int rc = check_xent(g, what, rows, classes, mean_rows);
    if (rc != DMRT_OK) return rc;
    if (!comm || comm_size != dmrt_comm_size(comm) || coord != dmrt_comm_rank(comm) || !scratch)
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                             "%s: coord %lld of %lld ranks, but the communicator is %s with "
                             "this rank at %d of %d (scratch %p)",
                             what, (long long)coord, (long long)comm_size,
                             comm ? dmrt_comm_axis_name(comm) : "NULL",
                             comm ? dmrt_comm_rank(comm) : -1, comm ? dmrt_comm_size(comm) : 0,
                             (const void *)scratch);
    return DMRT_OK;
}

int dmrt_gpu_cross_entropy_split(dmrt_gpu *g, dmrt_comm *comm, int64_t coord,
                                 int64_t comm_size, const float *logits,
                                 const int32_t *targets, float *out_loss, int64_t rows,
                                 int64_t classes, int64_t mean_rows, float *scratch, int site,
                                 const char *what) {
    GPU_ENTER(g);
    int rc = check_split(g, "dmrt_gpu_cross_entropy_split", comm, coord, comm_size, rows,
                         classes, mean_rows, scratch);
    if (rc != DMRT_OK) return rc;
    rc = split_stats(g, comm, coord, comm_size, logits, targets, rows, classes, scratch, site,
                     what, 1);
    if (rc != DMRT_OK) return rc;
    const float *row_max = scratch + comm_size * rows, *sums = row_max + rows;
    xent_split_total_kernel<<<1, 256, 0, g->stream>>>(targets, row_max, sums, out_loss, rows,
                                                      comm_size * classes, mean_rows);
    LAUNCH_CHECK(g, "xent_split_total_kernel");
    return DMRT_OK;
}

int dmrt_gpu_cross_entropy_grad_split(dmrt_gpu *g, dmrt_comm *comm, int64_t coord,
                                      int64_t comm_size, const float *logits,
                                      const int32_t *targets, const float *dloss_dev,
                                      float dloss_value, float *dlogits, int64_t rows,
                                      int64_t classes, int64_t mean_rows, float *scratch,
                                      const char *what) {
    GPU_ENTER(g);
    int rc = check_split(g, "dmrt_gpu_cross_entropy_grad_split", comm, coord, comm_size,
                         rows, classes, mean_rows, scratch);
    if (rc != DMRT_OK) return rc;
    rc = split_stats(g, comm, coord, comm_size, logits, targets, rows, classes, scratch, 0,
                     what, 0);
    if (rc != DMRT_OK) return rc;
    if (rows == 0 || classes == 0) return DMRT_OK;
    const float *row_max = scratch + comm_size * rows, *sums = row_max + rows;
    xent_split_grad_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
        logits, targets, row_max, sums, dloss_dev, dloss_value, dlogits, rows, classes,
        coord * classes, mean_rows);
    LAUNCH_CHECK(g, "xent_split_grad_kernel");
    return DMRT_OK;
}
