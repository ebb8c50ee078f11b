/* xent.cu: cross-entropy as dmc's IR has it (ir/ops.def), in three calls: the rows'
 * statistics (rows, 3) -- maximum, sum of exp(logit - maximum), the target's logit --
 * whole or vocabulary-parallel (Megatron-LM: each rank holds a block of every row's
 * classes; row maxima are all-gathered and the sums and target logits allreduced, as
 * c_xent_stats_split in codegen/dialect_c.c); the mean loss from the statistics; and the
 * gradient from the logits and the statistics, with no exchange. Per row: max in float,
 * sum of exp(logit - max) in double, rounded to float as stored; the loss
 * log(sum) + max - logit[target] in double, the rows added by one block in a fixed order,
 * so the loss has the same bits on every run. A row whose target is out of range records
 * the fault (the step fails) and gets the statistics (0, 1, 0), adding nothing to the
 * loss, and a zero gradient. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "dmrt_cuda_sizes.h"
#include "dmrt_half.h"
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

/* The statistics a row with an out-of-range target gets: its loss is log(1) + 0 - 0. */
__device__ static void store_bad_row(float *stats) {
    stats[0] = 0.0f, stats[1] = 1.0f, stats[2] = 0.0f;
}

/* Whole rows: stats[r] = (max, sum of exp(row - max), row[target]). */
__global__ static void xent_stats_kernel(const float *logits, const int32_t *targets, float *stats,
                                         int64_t rows, int64_t classes, dmrt_fault *fault,
                                         int site, int64_t position_base) {
    __shared__ float fshared[32];
    __shared__ double dshared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *row = logits + r * classes;
        const int32_t t = targets[r];
        if (t < 0 || t >= classes) {  /* the same for every thread of the block */
            if (threadIdx.x == 0) {
                gpu_record_fault(fault, site, t, position_base + r);
                store_bad_row(stats + r * 3);
            }
            continue;
        }
        const float mx = row_max_of(row, classes, fshared);
        const double sum = row_sum_exp(row, classes, mx, dshared);
        if (threadIdx.x == 0) {
            stats[r * 3] = mx;
            stats[r * 3 + 1] = (float)sum;
            stats[r * 3 + 2] = row[t];
        }
    }
}

/* Split, step 1: maxima_mine[r] = the max of this rank's classes of row r; the target is
 * checked against every rank's classes. */
__global__ static void xent_local_max_kernel(const float *logits, const int32_t *targets,
                                             float *maxima_mine, int64_t rows, int64_t classes,
                                             int64_t all_classes, dmrt_fault *fault, int site,
                                             int64_t position_base) {
    __shared__ float shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        if (threadIdx.x == 0) {
            const int32_t t = targets[r];
            if (t < 0 || t >= all_classes) gpu_record_fault(fault, site, t, position_base + r);
        }
        const float *row = logits + r * classes;
        const float mx = row_max_of(row, classes, shared);
        if (threadIdx.x == 0) maxima_mine[r] = mx;
    }
}

/* Split, step 2 (after the all-gather of maxima (comm_size, rows)): stats[r][0] = the max
 * over ranks, in rank order as the C target; sums[r] = (float) this rank's sum of
 * exp(logit - max); sums[rows + r] = the target's logit when this rank holds it, else 0
 * (the allreduce that follows brings both to every rank). */
__global__ static void xent_split_sums_kernel(const float *logits, const int32_t *targets,
                                              const float *maxima, float *stats, float *sums,
                                              int64_t rows, int64_t classes, int64_t comm_size,
                                              int64_t first_class) {
    __shared__ double shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *row = logits + r * classes;
        float mx = maxima[r];
        for (int64_t j = 1; j < comm_size; j++) mx = maxima[j * rows + r] > mx ? maxima[j * rows + r] : mx;
        const double sum = row_sum_exp(row, classes, mx, shared);
        if (threadIdx.x == 0) {
            stats[r * 3] = mx;
            sums[r] = (float)sum;
            const int64_t t = (int64_t)targets[r] - first_class;
            sums[rows + r] = t >= 0 && t < classes ? row[t] : 0.0f;
        }
    }
}

/* Split, step 3 (after the allreduce): the sums and target logits into the statistics. */
__global__ static void xent_split_pack_kernel(const int32_t *targets, const float *sums,
                                              float *stats, int64_t rows, int64_t all_classes) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
         r += (int64_t)gridDim.x * blockDim.x) {
        const int32_t t = targets[r];
        if (t < 0 || t >= all_classes) {
            store_bad_row(stats + r * 3);
            continue;
        }
        stats[r * 3 + 1] = sums[r];
        stats[r * 3 + 2] = sums[rows + r];
    }
}

/* out[0] = sum over rows of log(sum) + max - target logit, / mean_rows: one block, a
 * fixed order. */
__global__ static void xent_total_kernel(const float *stats, float *out, int64_t rows,
                                         int64_t mean_rows) {
    __shared__ double shared[32];
    double total = 0.0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        total += log((double)stats[r * 3 + 1]) + (double)stats[r * 3] - (double)stats[r * 3 + 2];
    total = gpu_block_reduce(total, gpu_sum_op(), shared);
    if (threadIdx.x == 0) out[0] = (float)(total / (double)mean_rows);
}

/* dlogits = (softmax - onehot(target)) * dloss / mean_rows from the statistics, with the C
 * target's roundings: the probability rounded to float, times scale, minus scale at the
 * target when this rank holds its class. */
/* dlogits (f32), or its 16-bit copy only (dlogits16, bf16 or IEEE binary16 bits: each
 * value rounded once from the f32 one, as dmrt_half.h rounds). The C target makes its
 * 16-bit copy from f32's expf (codegen/dialect_c.c, c_cross_entropy_grad) where this
 * kernel keeps the double exp: a value that close to a 16-bit rounding boundary may then
 * round one 16-bit ulp apart (the CUDA and glibc expf differ in their last bits anyway). */
__global__ static void xent_grad_kernel(const float *logits, const int32_t *targets,
                                        const float *stats, const float *dloss_dev,
                                        float dloss_value, float *dlogits, uint16_t *dlogits16,
                                        int bf16, int64_t rows, int64_t classes,
                                        int64_t first_class, int64_t all_classes,
                                        int64_t mean_rows) {
    const float dloss = dloss_dev ? *dloss_dev : dloss_value;
    const float scale = dloss / (float)mean_rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *row = logits + r * classes;
        const int64_t target = targets[r];
        const int bad = target < 0 || target >= all_classes;
        const int64_t t = target - first_class;
        const float mx = stats[r * 3];
        const double sum = (double)stats[r * 3 + 1];
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
            float v = __fmul_rn((float)(exp((double)(row[c] - mx)) / sum), scale);
            if (c == t) v = __fsub_rn(v, scale);
            if (bad) v = 0.0f;
            if (dlogits16) dlogits16[r * classes + c] = bf16 ? dmrt_bf16_round(v) : dmrt_f16_round(v);
            else dlogits[r * classes + c] = v;
        }
    }
}

/* ---- host ------------------------------------------------------------------------------------ */

/* The bound both sides agree on (dmrt_cuda_sizes.h). What is laid out, well inside it:
 * split statistics: maxima (comm_size, rows), then the sums and target logits (2, rows);
 * the rest: none. */
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

int dmrt_gpu_xent_stats(dmrt_gpu *g, const float *logits, const int32_t *targets, float *stats,
                        int64_t rows, int64_t classes, int site, int64_t position_base) {
    GPU_ENTER(g);
    int rc = check_xent(g, "dmrt_gpu_xent_stats", rows, classes, 1);
    if (rc != DMRT_OK) return rc;
    if (rows == 0) return DMRT_OK;
    ARG_CHECK(g, stats != NULL && classes > 0);
    xent_stats_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
        logits, targets, stats, rows, classes, g->fault, site, position_base);
    LAUNCH_CHECK(g, "xent_stats_kernel");
    return DMRT_OK;
}

/* The maxima are all-gathered in place, so this rank's block must sit where the
 * communicator puts its rank: coord and comm_size are comm's. */
static int check_split(dmrt_gpu *g, const char *what, dmrt_comm *comm, int64_t coord,
                       int64_t comm_size, int64_t rows, int64_t classes,
                       const float *scratch) {
    int rc = check_xent(g, what, rows, classes, 1);
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

int dmrt_gpu_xent_stats_split(dmrt_gpu *g, dmrt_comm *comm, int64_t coord, int64_t comm_size,
                              const float *logits, const int32_t *targets, float *stats,
                              int64_t rows, int64_t classes, float *scratch, int site,
                              int64_t position_base, const char *what) {
    GPU_ENTER(g);
    int rc = check_split(g, "dmrt_gpu_xent_stats_split", comm, coord, comm_size, rows, classes,
                         scratch);
    if (rc != DMRT_OK) return rc;
    float *maxima = scratch;                 /* (comm_size, rows) */
    float *sums = maxima + comm_size * rows; /* (2, rows) sums, target logits */
    const char *label = what ? what : "cross-entropy";
    char text[256];
    /* every rank joins both collectives, even with no rows of its own */
    if (rows > 0) {
        xent_local_max_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
            logits, targets, maxima + coord * rows, rows, classes, comm_size * classes, g->fault,
            site, position_base);
        LAUNCH_CHECK(g, "xent_local_max_kernel");
    }
    snprintf(text, sizeof text, "allgather of the row maxima of %s", label);
    rc = dmrt_gpu_allgather(g, comm, maxima + coord * rows, maxima, rows, text);
    if (rc != DMRT_OK) return rc;
    if (rows > 0) {
        xent_split_sums_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
            logits, targets, maxima, stats, sums, rows, classes, comm_size, coord * classes);
        LAUNCH_CHECK(g, "xent_split_sums_kernel");
    }
    snprintf(text, sizeof text, "allreduce of the row sums of %s", label);
    rc = dmrt_gpu_allreduce_sum(g, comm, sums, 2 * rows, text);
    if (rc != DMRT_OK || rows == 0) return rc;
    xent_split_pack_kernel<<<gpu_blocks(rows, 256), 256, 0, g->stream>>>(
        targets, sums, stats, rows, comm_size * classes);
    LAUNCH_CHECK(g, "xent_split_pack_kernel");
    return DMRT_OK;
}

int dmrt_gpu_cross_entropy(dmrt_gpu *g, const float *stats, float *out_loss, int64_t rows,
                           int64_t mean_rows) {
    GPU_ENTER(g);
    int rc = check_xent(g, "dmrt_gpu_cross_entropy", rows, 0, mean_rows);
    if (rc != DMRT_OK) return rc;
    ARG_CHECK(g, out_loss != NULL && (rows == 0 || stats != NULL));
    xent_total_kernel<<<1, 256, 0, g->stream>>>(stats, out_loss, rows, mean_rows);
    LAUNCH_CHECK(g, "xent_total_kernel");
    return DMRT_OK;
}

static int xent_grad(dmrt_gpu *g, const char *what, const float *logits, const int32_t *targets,
                     const float *stats, const float *dloss_dev, float dloss_value, float *dlogits,
                     uint16_t *dlogits16, int bf16, int64_t rows, int64_t classes,
                     int64_t first_class, int64_t all_classes, int64_t mean_rows) {
    GPU_ENTER(g);
    int rc = check_xent(g, what, rows, classes, mean_rows);
    if (rc != DMRT_OK) return rc;
    if (first_class < 0 || all_classes < first_class + classes)
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                             "%s: classes [%lld, %lld) are not within [0, %lld)", what,
                             (long long)first_class, (long long)(first_class + classes),
                             (long long)all_classes);
    if (rows == 0 || classes == 0) return DMRT_OK;
    xent_grad_kernel<<<gpu_row_blocks(rows), gpu_row_threads(classes), 0, g->stream>>>(
        logits, targets, stats, dloss_dev, dloss_value, dlogits, dlogits16, bf16 != 0, rows,
        classes, first_class, all_classes, mean_rows);
    LAUNCH_CHECK(g, "xent_grad_kernel");
    return DMRT_OK;
}

int dmrt_gpu_cross_entropy_grad(dmrt_gpu *g, const float *logits, const int32_t *targets,
                                const float *stats, const float *dloss_dev, float dloss_value,
                                float *dlogits, int64_t rows, int64_t classes,
                                int64_t first_class, int64_t all_classes, int64_t mean_rows) {
    return xent_grad(g, "dmrt_gpu_cross_entropy_grad", logits, targets, stats, dloss_dev,
                     dloss_value, dlogits, NULL, 0, rows, classes, first_class, all_classes,
                     mean_rows);
}

int dmrt_gpu_cross_entropy_grad_half(dmrt_gpu *g, int bf16, const float *logits,
                                     const int32_t *targets, const float *stats,
                                     const float *dloss_dev, float dloss_value, uint16_t *dlogits,
                                     int64_t rows, int64_t classes, int64_t first_class,
                                     int64_t all_classes, int64_t mean_rows) {
    GPU_ENTER(g);
    ARG_CHECK(g, dlogits != NULL || rows == 0 || classes == 0);
    return xent_grad(g, "dmrt_gpu_cross_entropy_grad_half", logits, targets, stats, dloss_dev,
                     dloss_value, NULL, dlogits, bf16, rows, classes, first_class, all_classes,
                     mean_rows);
}
