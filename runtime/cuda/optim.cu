/* optim.cu: the optimizer updates, elementwise. Every float operation is an explicit
 * round-to-nearest intrinsic in the C target's order (codegen/dialect_c.c, c_sgd and
 * c_adamw), so that nvcc cannot fuse a multiply and an add: the results are those of the
 * C target bit for bit (IEEE single precision on both; the C target's x86-64 build does
 * not fuse either). */
#include "gpu_internal.h"

/* torch.optim.SGD: d = g + wd * p; buf = first step ? d : momentum * buf +
 * (1 - dampening) * d; d = nesterov ? d + momentum * buf : buf; p -= lr * d. */
__global__ static void sgd_kernel(float *param, const float *grad, float *buf, int64_t n,
                                  float lr, float weight_decay, float momentum,
                                  float one_minus_dampening, int nesterov, int first_step,
                                  const int32_t *fault_site) {
    if (*fault_site) return; /* a bad index this step: the step fails, nothing is updated */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float p = param[i];
        /* without weight decay the C target reads g alone (no 0 * p: p may be inf) */
        float d = weight_decay != 0.0f ? __fadd_rn(grad[i], __fmul_rn(weight_decay, p)) : grad[i];
        if (buf) {
            const float b = first_step ? d
                                       : __fadd_rn(__fmul_rn(momentum, buf[i]),
                                                   __fmul_rn(one_minus_dampening, d));
            buf[i] = b;
            d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, b)) : b;
        }
        param[i] = __fsub_rn(p, __fmul_rn(lr, d));
    }
}

/* torch.optim.AdamW (single-tensor path): p *= decay; m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g g; p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)). */
__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v,
                                    int64_t n, float beta1, float one_minus_beta1, float beta2,
                                    float one_minus_beta2, float eps, float decay,
                                    float step_size, float bc2_sqrt, const int32_t *fault_site) {
    if (*fault_site) return; /* a bad index this step: the step fails, nothing is updated */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = grad[i];
        const float p = __fmul_rn(param[i], decay);
        const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_minus_beta1, g));
        const float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        param[i] = __fsub_rn(p, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
    }
}

int dmrt_gpu_sgd(dmrt_gpu *g, float *param, const float *grad, float *momentum_buf, int64_t n,
                 float lr, float weight_decay, float momentum, float one_minus_dampening,
                 int nesterov, int64_t step) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0);
    if (n == 0) return DMRT_OK;
    sgd_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(param, grad, momentum_buf, n, lr,
                                                          weight_decay, momentum,
                                                          one_minus_dampening, nesterov,
                                                          step == 1, &g->fault->site);
    LAUNCH_CHECK(g, "sgd_kernel");
    return DMRT_OK;
}

int dmrt_gpu_adamw(dmrt_gpu *g, float *param, const float *grad, float *m, float *v, int64_t n,
                   float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                   float eps, float decay, float step_size, float bc2_sqrt) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0);
    if (n == 0) return DMRT_OK;
    adamw_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(param, grad, m, v, n, beta1,
                                                            one_minus_beta1, beta2,
                                                            one_minus_beta2, eps, decay,
                                                            step_size, bc2_sqrt, &g->fault->site);
    LAUNCH_CHECK(g, "adamw_kernel");
    return DMRT_OK;
}

/* ---- gradient clipping (torch.nn.utils.clip_grad_norm_) ---------------------------------- */

enum { SQUARES_BLOCKS = 256, SQUARES_THREADS = 256 };

/* Each block's sum of x[i]^2 (in double) over its grid-stride elements into partial[block]. */
__global__ static void sum_squares_kernel(const float *x, int64_t n, double *partial) {
    __shared__ double shared[32];
    double s = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = gpu_block_reduce(s, gpu_sum_op(), shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* A fixed launch shape and the blocks' partial sums added on the host in block order:
 * the same bits every time (the partials live in the sum-partials area, stream-ordered). */
int dmrt_gpu_sum_squares(dmrt_gpu *g, const float *x, int64_t n, double *sum) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0 && sum != NULL);
    if (n == 0) return DMRT_OK;
    double *partial = (double *)g->sum_partials, host[SQUARES_BLOCKS];
    sum_squares_kernel<<<SQUARES_BLOCKS, SQUARES_THREADS, 0, g->stream>>>(x, n, partial);
    LAUNCH_CHECK(g, "sum_squares_kernel");
    CUDA_CHECK(g, cudaMemcpyAsync(host, partial, sizeof host, cudaMemcpyDeviceToHost, g->stream));
    int rc = dmrt_gpu_wait_stream(g, g->stream);
    if (rc != DMRT_OK) return rc;
    for (int b = 0; b < SQUARES_BLOCKS; b++) *sum += host[b];
    return DMRT_OK;
}

/* ---- clipping without a wait (a serial step: dmrt_gpu_step_end) ---------------------------- */

int dmrt_gpu_clip_reserve(dmrt_gpu *g, int gradients) {
    GPU_ENTER(g);
    ARG_CHECK(g, gradients >= 0 && g->clip_partials == NULL);
    void *p = NULL;
    int rc = dmrt_gpu_alloc(g, &p, ((size_t)gradients * SQUARES_BLOCKS + 1) * sizeof(double));
    if (rc != DMRT_OK) return rc;
    g->clip_partials = (double *)p;
    g->clip_factor = (float *)(g->clip_partials + (size_t)gradients * SQUARES_BLOCKS);
    g->clip_gradients = gradients;
    return DMRT_OK;
}

int dmrt_gpu_clip_squares(dmrt_gpu *g, const float *x, int64_t n, int slot) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0 && slot >= 0 && slot < g->clip_gradients);
    double *partial = g->clip_partials + (size_t)slot * SQUARES_BLOCKS;
    if (n == 0) {  /* dmrt_gpu_sum_squares adds nothing; zeros add nothing */
        CUDA_CHECK(g, cudaMemsetAsync(partial, 0, SQUARES_BLOCKS * sizeof(double), g->stream));
        return DMRT_OK;
    }
    sum_squares_kernel<<<SQUARES_BLOCKS, SQUARES_THREADS, 0, g->stream>>>(x, n, partial);
    LAUNCH_CHECK(g, "sum_squares_kernel");
    return DMRT_OK;
}

/* One thread: the partials in the order the host adds dmrt_gpu_sum_squares' (gradient by
 * gradient, block by block), then the generated code's float arithmetic of
 * clip / (sqrtf(norm_squared) + 1e-6f): the same bits. */
__global__ static void clip_factor_kernel(const double *partial, int64_t count, float clip, float *factor) {
    double s = 0.0;
    for (int64_t i = 0; i < count; i++) s += partial[i];
    const float norm_squared = __double2float_rn(s);
    *factor = __fdiv_rn(clip, __fadd_rn(__fsqrt_rn(norm_squared), 1e-6f));
}

int dmrt_gpu_clip_factor(dmrt_gpu *g, int gradients, float clip) {
    GPU_ENTER(g);
    ARG_CHECK(g, gradients >= 0 && gradients <= g->clip_gradients && g->clip_factor != NULL);
    clip_factor_kernel<<<1, 1, 0, g->stream>>>(g->clip_partials, (int64_t)gradients * SQUARES_BLOCKS, clip,
                                              g->clip_factor);
    LAUNCH_CHECK(g, "clip_factor_kernel");
    return DMRT_OK;
}

/* x *= factor where factor < 1 (not where it is NaN, as the host's `if (f < 1.0f)`). */
__global__ static void clip_scale_kernel(float *x, int64_t n, const float *factor) {
    const float f = *factor;
    if (!(f < 1.0f)) return;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], f);
}

int dmrt_gpu_clip_scale(dmrt_gpu *g, float *x, int64_t n) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0 && g->clip_factor != NULL);
    if (n == 0) return DMRT_OK;
    clip_scale_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(x, n, g->clip_factor);
    LAUNCH_CHECK(g, "clip_scale_kernel");
    return DMRT_OK;
}

__global__ static void scale_kernel(float *x, int64_t n, float factor) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], factor);
}

int dmrt_gpu_scale(dmrt_gpu *g, float *x, int64_t n, float factor) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0);
    if (n == 0) return DMRT_OK;
    scale_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(x, n, factor);
    LAUNCH_CHECK(g, "scale_kernel");
    return DMRT_OK;
}

/* ---- magnitude pruning (--prune, codegen/emit_prune.c) ----------------------------------- */

/* What the C target's dmrt_prune does outside the ramp: the pruned elements set to 0. */
__global__ static void prune_apply_kernel(float *w, const float *mask, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        if (mask[i] != 0.0f) w[i] = 0.0f;
}

/* The masks of parts applied on the device: dmrt_prune's work off the ramp. */
static int apply_masks(dmrt_gpu *g, const dmrt_prune_part *parts, int n_parts) {
    for (int k = 0; k < n_parts; k++) {
        if (parts[k].n == 0) continue;
        prune_apply_kernel<<<gpu_blocks(parts[k].n, 256), 256, 0, g->stream>>>(parts[k].w, parts[k].mask, parts[k].n);
        LAUNCH_CHECK(g, "prune_apply_kernel");
    }
    return DMRT_OK;
}

/* Each part's weight and mask copied into the staging buffer, host[k] the part there (at
 * most 8 parts); the stream drained, so the host may read them. */
static int stage_parts_out(dmrt_gpu *g, const dmrt_prune_part *parts, int n_parts, dmrt_prune_part *host) {
    int64_t total = 0;
    for (int k = 0; k < n_parts; k++) total += 2 * parts[k].n;
    float *at;
    int rc = dmrt_gpu_wait_stream(g, g->stream); /* the staging buffer may be reallocated */
    if (rc != DMRT_OK || (rc = dmrt_gpu_staging(g, (size_t)total * sizeof(float), &at)) != DMRT_OK) return rc;
    for (int k = 0; k < n_parts; k++) {
        const size_t bytes = (size_t)parts[k].n * sizeof(float);
        host[k] = parts[k];
        host[k].w = at;
        host[k].mask = at + parts[k].n;
        at += 2 * parts[k].n;
        CUDA_CHECK(g, cudaMemcpyAsync(host[k].w, parts[k].w, bytes, cudaMemcpyDeviceToHost, g->stream));
        CUDA_CHECK(g, cudaMemcpyAsync(host[k].mask, parts[k].mask, bytes, cudaMemcpyDeviceToHost, g->stream));
    }
    return dmrt_gpu_wait_stream(g, g->stream);
}

/* The host's weights and masks back into the parts; asynchronous: the next staged call
 * drains the stream before it touches the staging. */
static int stage_parts_in(dmrt_gpu *g, const dmrt_prune_part *parts, int n_parts, const dmrt_prune_part *host) {
    for (int k = 0; k < n_parts; k++) {
        const size_t bytes = (size_t)parts[k].n * sizeof(float);
        CUDA_CHECK(g, cudaMemcpyAsync(parts[k].w, host[k].w, bytes, cudaMemcpyHostToDevice, g->stream));
        CUDA_CHECK(g, cudaMemcpyAsync(parts[k].mask, host[k].mask, bytes, cudaMemcpyHostToDevice, g->stream));
    }
    return DMRT_OK;
}

/* On the ramp the weights and the mask go to host memory, where runtime/prune.c chooses the
 * mask from the same floats as the C target would, and come back; elsewhere the mask is
 * applied on the device. */
int dmrt_gpu_prune(dmrt_gpu *g, float *w, float *mask, int64_t n, int64_t channels, int64_t inner,
                   int64_t t, int64_t total_steps, const dmrt_prune_schedule *s) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0 && s != NULL);
    const dmrt_prune_part part = {w, mask, n, channels, inner, 1};
    if (n == 0) return DMRT_OK;
    if (!dmrt_prune_chooses(s, t, total_steps)) return apply_masks(g, &part, 1);
    dmrt_prune_part host;
    int rc = stage_parts_out(g, &part, 1, &host);
    if (rc != DMRT_OK) return rc;
    if (dmrt_prune(host.w, host.mask, n, channels, inner, t, total_steps, s) != DMRT_OK)
        return dmrt_gpu_fail(g, DMRT_ERR_NOMEM, __FILE__, __LINE__, "--prune: out of memory choosing a mask of %lld elements",
                             (long long)n);
    return stage_parts_in(g, &part, 1, &host);
}

int dmrt_gpu_prune_heads(dmrt_gpu *g, const dmrt_prune_part *parts, int n_parts, int64_t units, int64_t t,
                         int64_t total_steps, const dmrt_prune_schedule *s) {
    GPU_ENTER(g);
    ARG_CHECK(g, parts != NULL && n_parts > 0 && n_parts <= 8 && s != NULL);
    if (!dmrt_prune_chooses(s, t, total_steps)) return apply_masks(g, parts, n_parts);
    dmrt_prune_part host[8];
    int rc = stage_parts_out(g, parts, n_parts, host);
    if (rc != DMRT_OK) return rc;
    if (dmrt_prune_heads(host, n_parts, units, t, total_steps, s) != DMRT_OK)
        return dmrt_gpu_fail(g, DMRT_ERR_NOMEM, __FILE__, __LINE__, "--prune: out of memory choosing %lld heads",
                             (long long)units);
    return stage_parts_in(g, parts, n_parts, host);
}
