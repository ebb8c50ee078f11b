/* dialect_cuda.c: the CUDA dialect. Loop nests (elementwise, reductions, broadcasts,
 * transposes, slices, pads) become __global__ kernels generated into the file
 * (dialect_cuda_nest.c); every other kernel, the matrix products (cuBLAS), device memory
 * and the collectives on device buffers are calls into libdmrt_cuda
 * (runtime/cuda/dmrt_cuda.h) on the rank's dmrt_gpu, ctx->gpu. All work goes to the rank's
 * one stream, in program order. */
#include <stdlib.h>
#include <string.h>

#include "dialect.h"
#include "dialect_cuda_internal.h"
#include "../runtime/cuda/dmrt_cuda_sizes.h"

/* ---- host scaffolding ------------------------------------------------------------------------ */

static void cuda_header_note(cg_writer *w, const char *m) {
    cg_line(w, "/* Target cuda: the context's storage (parameters, gradients, optimizer state, temporaries)");
    cg_line(w, " * is GPU memory, one device per context. Every pointer this API takes or returns is host");
    cg_line(w, " * memory: batches are copied to the device by forward and train_step, outputs back by");
    cg_line(w, " * %s_output_*, weight files through host buffers. */", m);
}

static void cuda_preamble(cg_writer *w) {
    cg_line(w, "#include <cuda_runtime.h>");
    cg_line(w, "#include <math.h>");
    cg_line(w, "#include <stdio.h>");
    cg_line(w, "#include <stdlib.h>");
    cg_line(w, "#include <string.h>");
    cg_blank(w);
    cg_line(w, "#include \"dmrt_cuda.h\"");
    cg_blank(w);
    cg_line(w, "/* Kernels of the loop nests (elementwise, reductions, layout) are below; the other kernels,");
    cg_line(w, " * matrix products, device memory and collectives are libdmrt_cuda's, on ctx->gpu. A kernel");
    cg_line(w, " * runs one thread per output position (int64 p, a grid-stride loop); a thread walks the");
    cg_line(w, " * dims it sums in order, as the C target's loops do. */");
}

static void cuda_ctx_fields(cg_writer *w) { cg_line(w, "dmrt_gpu *gpu; /* this rank's device, stream and handles */"); }

static void cuda_ctx_helpers(cg_writer *w) {
    cg_line(w, "/* A failed device call: its message (naming the call, file:line and CUDA's words) into");
    cg_line(w, " * ctx->error. */");
    cg_line(w, "static inline int device_failed(struct_ctx *ctx) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%%s\", dmrt_gpu_error(ctx->gpu));");
    cg_line(w, "    return DMRT_ERR_DEVICE;");
    cg_line(w, "}");
}

static void cuda_ctx_open(cg_writer *w, int partitioned, int tf32, const char *on_fail) {
    cg_line(w, "{");
    /* serial: on the device of the rank it is created beside (create_beside), if any */
    cg_line(w, "    const dmrt_gpu_options gpu_options = {%d /* tf32 */, DMRT_GPU_COMM_AUTO, %s};", tf32 ? 1 : 0,
            partitioned ? "NULL" : "beside");
    cg_line(w, "    ctx->gpu = dmrt_gpu_create(%s, &gpu_options, ctx->error, sizeof ctx->error);", partitioned ? "ctx->rank" : "NULL");
    cg_line(w, "}");
    cg_line(w, "if (!ctx->gpu) %s", on_fail);
}

static void cuda_ctx_close(cg_writer *w) { cg_line(w, "dmrt_gpu_destroy(ctx->gpu);"); }

static void cuda_alloc(cg_writer *w, const char *lhs, const char *bytes, const char *on_fail) {
    cg_line(w, "if (dmrt_gpu_alloc(ctx->gpu, (void **)&%s, %s) != DMRT_OK) %s", lhs, bytes, on_fail);
}

static void cuda_free(cg_writer *w, const char *ptr) { cg_line(w, "dmrt_gpu_free(ctx->gpu, %s);", ptr); }

static void cuda_copy(cg_writer *w, const char *dst, const char *src, const char *bytes, cg_copy_kind kind, const char *on_fail) {
    const char *k = kind == CG_HOST_TO_DEVICE ? "DMRT_HOST_TO_DEVICE"
                  : kind == CG_DEVICE_TO_HOST ? "DMRT_DEVICE_TO_HOST"
                                              : "DMRT_DEVICE_TO_DEVICE";
    cg_line(w, "if (dmrt_gpu_copy(ctx->gpu, %s, %s, %s, %s) != DMRT_OK) %s", dst, src, bytes, k, on_fail);
}

static void cuda_zero(cg_writer *w, const char *ptr, const char *bytes, const char *on_fail) {
    cg_line(w, "if (dmrt_gpu_zero(ctx->gpu, %s, %s) != DMRT_OK) %s", ptr, bytes, on_fail);
}

static void cuda_comm_callee(char *buf, size_t size, const char *op) { snprintf(buf, size, "dmrt_gpu_%s(ctx->gpu, ", op); }

/* Kernels skip rows with a bad index and record the first; the host learns of it once,
 * at the end of the phase (dmrt_gpu_fault_take synchronises) or of the step (step_end). */
static void cuda_fault_check(cg_writer *w, int end_of_phase) {
    if (!end_of_phase) return;
    cg_line(w, "if (dmrt_gpu_fault_take(ctx->gpu, &ctx->fault) != DMRT_OK) return device_failed(ctx);");
    cg_line(w, "if (ctx->fault.site) return data_fault(ctx);");
}

static int64_t cuda_xent_scratch_floats(int64_t rows, int64_t comm_size) {
    return dmrt_cuda_xent_scratch_floats(rows, comm_size);
}

static int64_t cuda_embed_grad_scratch_bytes(int64_t rows) { return dmrt_cuda_embed_grad_scratch_bytes(rows); }
static int64_t cuda_wgrad_scratch_floats(int64_t rows, int64_t n) { return dmrt_cuda_layernorm_wgrad_scratch_floats(rows, n); }

/* ---- library kernels ------------------------------------------------------------------------- */

void cg_cuda_checked(cg_writer *w, const char *call) {
    cg_line(w, "if (%s) != DMRT_OK)", call);
    cg_line(w, "    return device_failed(ctx);");
}

/* fp32 operands: dmrt_gpu_sgemm; 16-bit ones (their uint16_t bits): dmrt_gpu_gemm_half,
 * accumulated in fp32 as the C target's products of them are */
static void cuda_gemm(cg_writer *w, const cg_gemm *k) {
    char call[1024], callee[64];
    if (k->bias || k->bias_grad) {
        /* one call: cuBLASLt adds the bias, or sums the bias's gradient, in the product's kernel */
        static const char *operands[] = {[DT_F32] = "DMRT_GPU_OPERANDS_F32", [DT_BF16] = "DMRT_GPU_OPERANDS_BF16",
                                         [DT_F16] = "DMRT_GPU_OPERANDS_F16"};
        snprintf(call, sizeof call,
                 "dmrt_gpu_gemm_epilogue(ctx->gpu, %s, %d, %d, %lld, %lld, %lld, %s, %lld, %s, %lld, %s, %s, %lld, %s, %s",
                 operands[k->operands], k->trans_a, k->trans_b, (long long)k->m, (long long)k->n, (long long)k->k, k->a,
                 (long long)k->lda, k->b, (long long)k->ldb, k->accumulate ? "1.0f" : "0.0f", k->c, (long long)k->ldc,
                 k->bias ? k->bias : "NULL", k->bias_grad ? k->bias_grad : "NULL");
        cg_cuda_checked(w, call);
        return;
    }
    if (k->operands == DT_F32) snprintf(callee, sizeof callee, "dmrt_gpu_sgemm(ctx->gpu, ");
    else snprintf(callee, sizeof callee, "dmrt_gpu_gemm_half(ctx->gpu, %d, ", k->operands == DT_BF16);
    snprintf(call, sizeof call, "%s%d, %d, %lld, %lld, %lld, %s, %lld, %s, %lld, %s, %s, %lld, %lld, %lld, %lld, %lld",
             callee, k->trans_a, k->trans_b, (long long)k->m, (long long)k->n, (long long)k->k, k->a, (long long)k->lda, k->b,
             (long long)k->ldb, cg_gemm_beta(k), k->c, (long long)k->ldc, (long long)(k->batch > 1 ? k->batch : 1),
             (long long)k->batch_stride_a, (long long)k->batch_stride_b, (long long)k->batch_stride_c);
    cg_cuda_checked(w, call);
}

/* --quantize: libdmrt_cuda's products of the narrow weight's device copy (quant.cu); the
 * host copy ctx->quant[slot] gives its shape, input scale and calibration record. The
 * weight-only modes widen the columns a product reads into ctx->quant_work, as the C
 * target widens into its thread's buffer (a weight only they read has no f32 parameter);
 * int8's calibration multiplies the f32 parameter, w_f32. */
static void cuda_quant_gemm(cg_writer *w, const cg_quant_gemm *k) {
    char call[1024], weight[160], window[64] = "";
    snprintf(weight, sizeof weight, "&ctx->quant[%d], ctx->quant_data[%d], ctx->quant_scale[%d]", k->slot, k->slot, k->slot);
    if (k->cols > 0) snprintf(window, sizeof window, ", %lld, %lld", (long long)k->col0, (long long)k->cols);
    if (k->activations)
        snprintf(call, sizeof call, "dmrt_gpu_gemm_i8%s(ctx->gpu, %s, %s, ctx->quant_work%s, %lld, %s, %lld, %s, %s, %lld",
                 k->cols > 0 ? "_window" : "", weight, k->w_f32, window, (long long)k->m, k->a, (long long)k->lda,
                 k->accumulate ? "1.0f" : "0.0f", k->c, (long long)k->ldc);
    else
        snprintf(call, sizeof call, "dmrt_gpu_gemm_wq%s(ctx->gpu, %s, ctx->quant_work%s, %lld, %s, %lld, %s, %s, %lld",
                 k->cols > 0 ? "_window" : "", weight, window, (long long)k->m, k->a, (long long)k->lda,
                 k->accumulate ? "1.0f" : "0.0f", k->c, (long long)k->ldc);
    cg_cuda_checked(w, call);
}

/* The collectives' label of a vocabulary-parallel cross-entropy. */
static void xent_what(const cg_xent *k, char *buf, size_t size) {
    char raw[512];
    snprintf(raw, sizeof raw, "cross-entropy of %s (%s)", k->logits_name ? k->logits_name : k->logits, k->where ? k->where : "?");
    cg_cuda_c_string(raw, buf, size);
}

static void cuda_xent_stats(cg_writer *w, const cg_xent *k) {
    char call[2048];
    if (k->comm) {
        char what[600];
        xent_what(k, what, sizeof what);
        snprintf(call, sizeof call, "dmrt_gpu_xent_stats_split(ctx->gpu, %s, %s, %lld, %s, %s, %s, %lld, %lld, %s, %d, %s, \"%s\"",
                 k->comm, k->coord, (long long)k->comm_size, k->logits, k->targets, k->out, (long long)k->rows,
                 (long long)k->classes, k->scratch ? k->scratch : "NULL", k->fault_site,
                 k->position_base ? k->position_base : "0", what);
    } else {
        snprintf(call, sizeof call, "dmrt_gpu_xent_stats(ctx->gpu, %s, %s, %s, %lld, %lld, %d, %s", k->logits, k->targets, k->out,
                 (long long)k->rows, (long long)k->classes, k->fault_site, k->position_base ? k->position_base : "0");
    }
    cg_cuda_checked(w, call);
}

static void cuda_cross_entropy(cg_writer *w, const cg_xent *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_cross_entropy(ctx->gpu, %s, %s, %lld, %lld", k->stats, k->out, (long long)k->rows,
             (long long)k->mean_rows);
    cg_cuda_checked(w, call);
}

static void cuda_cross_entropy_grad(cg_writer *w, const cg_xent *k) {
    char call[2048], first_class[160];
    /* dloss: a device scalar, or a literal */
    const char *dev = k->dloss_is_buffer ? k->dloss : "NULL", *value = k->dloss_is_buffer ? "0.0f" : k->dloss;
    if (k->coord) snprintf(first_class, sizeof first_class, "(int64_t)%s * %lld", k->coord, (long long)k->classes);
    else snprintf(first_class, sizeof first_class, "0");
    /* a 16-bit gradient (can.loss_grad_16bit): the _half call, its type first */
    char callee[96];
    if (k->out_dtype == DT_F32) snprintf(callee, sizeof callee, "dmrt_gpu_cross_entropy_grad(ctx->gpu, ");
    else snprintf(callee, sizeof callee, "dmrt_gpu_cross_entropy_grad_half(ctx->gpu, %d, ", k->out_dtype == DT_BF16);
    snprintf(call, sizeof call, "%s%s, %s, %s, %s, %s, %s, %lld, %lld, %s, %lld, %lld", callee, k->logits,
             k->targets, k->stats, dev, value, k->out, (long long)k->rows, (long long)k->classes, first_class,
             (long long)k->all_classes, (long long)k->mean_rows);
    cg_cuda_checked(w, call);
}

/* torch.optim.SGD (dmrt_gpu_sgd; dialect_c.c's c_sgd) */
static void cuda_sgd(cg_writer *w, const cg_update *k) {
    const ir_optimizer *o = k->opt;
    char wd[64], mom[64], damp[64], call[1024];
    cg_float_literal(o->weight_decay, wd, sizeof wd);
    cg_float_literal(o->momentum, mom, sizeof mom);
    cg_float_literal(1.0 - o->dampening, damp, sizeof damp);
    snprintf(call, sizeof call, "dmrt_gpu_sgd(ctx->gpu, %s, %s, %s, %s, %s, %s, %s, %s, %d, %s", k->param, k->grad,
             k->state0 ? k->state0 : "NULL", k->count, "(float)ctx->lr", wd, mom, damp, o->nesterov ? 1 : 0, k->updates);
    cg_cuda_checked(w, call);
}

/* torch.optim.AdamW (dmrt_gpu_adamw): the step's factors in double on the host, exactly
 * as dialect_c.c's c_adamw computes them. */
static void cuda_adamw(cg_writer *w, const cg_update *k) {
    cg_adamw_literals lit;
    char call[1024];
    cg_line(w, "{");
    w->indent++;
    cg_adamw_prologue(w, k, &lit);
    snprintf(call, sizeof call, "dmrt_gpu_adamw(ctx->gpu, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, decay, step_size, bc2_sqrt",
             k->param, k->grad, k->state0, k->state1, k->count, lit.beta1, lit.one_minus_beta1, lit.beta2,
             lit.one_minus_beta2, lit.eps);
    cg_cuda_checked(w, call);
    w->indent--;
    cg_line(w, "}");
}

/* gradient clipping (dmrt_gpu_sum_squares, dmrt_gpu_scale) */
static void cuda_sum_squares(cg_writer *w, const char *x, const char *count, const char *sum) {
    char call[512];
    snprintf(call, sizeof call, "dmrt_gpu_sum_squares(ctx->gpu, %s, %s, &%s", x, count, sum);
    cg_cuda_checked(w, call);
}

static void cuda_scale(cg_writer *w, const char *x, const char *count, const char *factor) {
    char call[512];
    snprintf(call, sizeof call, "dmrt_gpu_scale(ctx->gpu, %s, %s, %s", x, count, factor);
    cg_cuda_checked(w, call);
}

/* --prune (dmrt_gpu_prune): the mask chosen in host memory on the ramp, applied on the device */
static void cuda_prune(cg_writer *w, const cg_prune *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_prune(ctx->gpu, %s, %s, %lld, %lld, %lld, %s, ctx->total_steps, &prune_schedule",
             k->weight, k->mask, (long long)k->n, (long long)k->channels, (long long)k->inner, k->updates);
    cg_cuda_checked(w, call);
}

static void cuda_prune_heads(cg_writer *w, const cg_prune_heads *k) {
    char call[512];
    snprintf(call, sizeof call, "dmrt_gpu_prune_heads(ctx->gpu, parts, %d, %lld, %s, ctx->total_steps, &prune_schedule",
             k->n_parts, (long long)k->units, k->updates);
    cg_cuda_checked(w, call);
}

/* dmrt_gpu_dropout: the levels as a dmrt_dropout_shape, each split level's offset this
 * rank's coordinate times its size */
static void cuda_dropout(cg_writer *w, const cg_dropout *k) {
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "dmrt_dropout_shape shape = {}; /* C++: zeroed */");
    cg_line(w, "shape.levels = %d;", k->levels);
    for (int l = 0; l < k->levels; l++) {
        char offset[96];
        if (k->split_axis[l] >= 0) snprintf(offset, sizeof offset, "ctx->coord[%d] * %lld", k->split_axis[l], (long long)k->size[l]);
        else snprintf(offset, sizeof offset, "0");
        cg_line(w, "shape.size[%d] = %lld, shape.whole[%d] = %lld, shape.offset[%d] = %s;", l, (long long)k->size[l], l,
                (long long)k->whole[l], l, offset);
    }
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_dropout(ctx->gpu, %s, %s, %lld, &shape, %s, ctx->seed, ctx->step, %d, %lluu, %s", k->x,
             k->out, (long long)k->count, k->first, k->op, k->threshold, k->scale);
    cg_cuda_checked(w, call);
    w->indent--;
    cg_line(w, "}");
}

static void cuda_softmax(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_softmax(ctx->gpu, %s, %s, %lld, %lld, %lld, %s, %lld", k->x, k->out, (long long)k->outer,
             (long long)k->n, (long long)k->inner, k->scale ? k->scale : "1.0f", (long long)k->causal_queries);
    cg_cuda_checked(w, call);
}

static void cuda_softmax_grad(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_softmax_grad(ctx->gpu, %s, %s, %s, %lld, %lld, %lld, %s, %lld", k->y, k->dy, k->out,
             (long long)k->outer, (long long)k->n, (long long)k->inner, k->scale ? k->scale : "1.0f", (long long)k->causal_queries);
    cg_cuda_checked(w, call);
}

/* (outer, n queries, inner keys) */
static void cuda_causal_mask(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_causal_mask(ctx->gpu, %s, %s, %lld, %lld, %lld, %s", k->x, k->out, (long long)k->outer,
             (long long)k->n, (long long)k->inner, k->fill);
    cg_cuda_checked(w, call);
}

/* Layernorm works along the last dim (inner 1): rows = outer. */
/* "out16, bf16" of the runtime's layernorm calls: the 16-bit copy they store too
 * (can.fused_cast_layernorm), or "NULL, 0". */
static void layernorm_copy_args(const cg_rowwise *k, char *buf, size_t size) {
    if (k->cast_out) snprintf(buf, size, "%s, %d", k->cast_out, k->cast_dtype == DT_BF16);
    else snprintf(buf, size, "NULL, 0");
}

static void cuda_layernorm(cg_writer *w, const cg_rowwise *k) {
    char call[1024], sum[512] = "", copy[256];
    /* a residual add made in the same kernel: dmrt_gpu_add_layernorm(.., a, b, x, ..) */
    if (k->sum_a) snprintf(sum, sizeof sum, "%s, %s, ", k->sum_a, k->sum_b);
    layernorm_copy_args(k, copy, sizeof copy);
    snprintf(call, sizeof call, "dmrt_gpu_%slayernorm(ctx->gpu, %s%s, %s, %s, %s, %s, %lld, %lld, %s", k->sum_a ? "add_" : "",
             sum, k->x, k->weight, k->bias, k->out, copy, (long long)(k->outer * k->inner), (long long)k->n, k->eps);
    cg_cuda_checked(w, call);
}

static void cuda_layernorm_grad(cg_writer *w, const cg_rowwise *k) {
    char call[1024], copy[256];
    layernorm_copy_args(k, copy, sizeof copy);
    snprintf(call, sizeof call, "dmrt_gpu_layernorm_grad(ctx->gpu, %s, %s, %s, %s, %d, %s, %lld, %lld, %s", k->x, k->weight, k->dy,
             k->out, k->accumulate, copy, (long long)(k->outer * k->inner), (long long)k->n, k->eps);
    cg_cuda_checked(w, call);
}

static void cuda_layernorm_wgrad(cg_writer *w, const cg_rowwise *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_layernorm_wgrad(ctx->gpu, %s, %s, %s, %s, %lld, %lld, %s, %s", k->x, k->dy, k->out,
             k->bias_grad_out ? k->bias_grad_out : "NULL", (long long)(k->outer * k->inner), (long long)k->n, k->eps,
             k->scratch ? k->scratch : "NULL");
    cg_cuda_checked(w, call);
}

static void cuda_embed(cg_writer *w, const cg_embed *k) {
    char call[1024];
    if (k->qtable) { /* a table held narrow only (serial: the whole vocabulary), its device copy */
        snprintf(call, sizeof call,
                 "dmrt_gpu_embed_narrow(ctx->gpu, %s, ctx->quant_data[%d], ctx->quant_scale[%d], %s, %s, %lld, %d, %s",
                 k->qtable, k->qslot, k->qslot, k->ids, k->out, (long long)k->rows, k->fault_site,
                 k->position_base ? k->position_base : "0");
        cg_cuda_checked(w, call);
        return;
    }
    snprintf(call, sizeof call, "dmrt_gpu_embed(ctx->gpu, %s, %s, %s, %lld, %lld, %lld, %lld, %s, %d, %s", k->table, k->ids,
             k->out, (long long)k->rows, (long long)k->n, (long long)k->cols, (long long)k->vocab,
             k->first_row ? k->first_row : "0", k->fault_site, k->position_base ? k->position_base : "0");
    cg_cuda_checked(w, call);
}

static void cuda_embed_grad(cg_writer *w, const cg_embed *k) {
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_embed_grad(ctx->gpu, %s, %s, %s, %lld, %lld, %lld, %s, %s, %s", k->ids, k->dy, k->out,
             (long long)k->rows, (long long)k->n, (long long)k->cols, k->first_row ? k->first_row : "0",
             k->accumulate ? "1" : k->accumulate_if ? k->accumulate_if : "0", k->scratch ? k->scratch : "NULL");
    cg_cuda_checked(w, call);
}

const cg_dialect cg_dialect_cuda = {
    .name = "cuda",
    .source_suffix = "cu",
    .separate_memory = 1,
    .block_alignment = 256, /* one cudaMalloc per context, at cudaMalloc's own alignment */
    /* a device collective's message is the gpu's (a staged one's host failure is copied
     * there too); a host collective's (gathering weights) the rank's */
    .storage_note = "device memory",
    .comm_error = "(dmrt_gpu_error(ctx->gpu)[0] ? dmrt_gpu_error(ctx->gpu) : dmrt_rank_error(ctx->rank))",
    .memory_peak = "dmrt_gpu_peak_bytes(c->gpu)",
    /* the rest not yet (docs/gpu.md, "Not done yet") */
    .can = {.predict = 1, .checkpoints = 1, .dropout = 1, .bf16 = 1, .f16 = 1, .zero = 1, .interleaved = 1, .weight_versions = 1,
            .compress = 1, .param_servers = 1, .quantize = 1, .flat_update = 1, .attention_bf16 = 1, .attention_f16 = 1,
            .fused_cast = 1, .attention_heads_inner = 1, .attention_kv_groups = 1, .bias_activation = 1, .wgrad_bias = 1, .gemm_bias = 1, .gemm_bias_grad = 1,
            .residual_norm = 1, .fused_cast_layernorm = 1, .loss_grad_16bit = 1, .narrow_only = 1},
    .round_to = {[DT_BF16] = "dmrt_bf16_round(x)", [DT_F16] = "dmrt_f16_round(x)"},
    .toolchain = {.compiler = "nvcc", .compiler_env = "NVCC", .toolkit = "CUDA",
                  .libraries = "-ldmrt_cuda -lcudart -lcublas -lcublasLt -lnccl -lcudnn -lstdc++", .toolkit_libs = 1, .tf32 = 1},
    .header_note = cuda_header_note,
    .create_failures = ", \"no CUDA device: ...\"",
    .threads_note = " This target's kernels run on the GPU: it changes nothing there.",
    .preamble = cuda_preamble,
    .ctx_fields = cuda_ctx_fields,
    .ctx_helpers = cuda_ctx_helpers,
    .ctx_open = cuda_ctx_open,
    .ctx_close = cuda_ctx_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .upload = cuda_upload,
    .upload_reserve = cuda_upload_reserve,
    .step_end = cuda_step_end,
    .clip_reserve = cuda_clip_reserve,
    .clip_squares = cuda_clip_squares,
    .clip_factor = cuda_clip_factor,
    .clip_scale = cuda_clip_scale,
    .comm_callee = cuda_comm_callee,
    .fault_check = cuda_fault_check,
    .xent_scratch_floats = cuda_xent_scratch_floats,
    .embed_grad_scratch_bytes = cuda_embed_grad_scratch_bytes,
    .wgrad_scratch_floats = cuda_wgrad_scratch_floats,
    .loop_nest = cg_cuda_loop_nest,
    .gemm = cuda_gemm,
    .xent_stats = cuda_xent_stats,
    .cross_entropy = cuda_cross_entropy,
    .cross_entropy_grad = cuda_cross_entropy_grad,
    .sgd = cuda_sgd,
    .adamw = cuda_adamw,
    .sum_squares = cuda_sum_squares,
    .scale = cuda_scale,
    .prune = cuda_prune,
    .prune_heads = cuda_prune_heads,
    .dropout = cuda_dropout,
    .attention_scratch_floats = cg_cuda_attention_scratch_floats,
    .attention = cg_cuda_attention,
    .attention_grad = cg_cuda_attention_grad,
    .softmax = cuda_softmax,
    .softmax_grad = cuda_softmax_grad,
    .causal_mask = cuda_causal_mask,
    .layernorm = cuda_layernorm,
    .layernorm_grad = cuda_layernorm_grad,
    .layernorm_wgrad = cuda_layernorm_wgrad,
    .embed = cuda_embed,
    .embed_grad = cuda_embed_grad,
    .quant_gemm = cuda_quant_gemm,
    .quant_work_bytes = dmrt_cuda_quant_work_bytes,
    .finish = cg_cuda_finish,
};
