/* compile.c: the passes in order (compile.h). */
#include <string.h>

#include "codegen.h"
#include "compile.h"
#include "hardware.h"

static int stops_at(const dm_compile_request *req, const char *pass) {
    return req->stop_after && strcmp(req->stop_after, pass) == 0;
}

#ifndef NDEBUG
#define VERIFY(pass) do { if (ir_verify(g, pass, stderr)) return 1; } while (0)
#else
#define VERIFY(pass) do { } while (0)
#endif

/* Lowering's checks, the attention's fusion and autodiff: what neither ZeRO nor
 * recomputation changes. A forward-only graph (--quantize: a program that predicts and
 * evaluates, never trains) stops before autodiff: no backward, so no gradients, and no
 * activations kept for one. */
static int differentiate(ir_graph *g, const char *target, int forward_only, dm_diag *d) {
    VERIFY("lower");
    if (pass_trainable(g, d)) return 1;
    if (pass_microbatch_loss(g, d)) return 1;
    g->attention_heads_inner = codegen_attention_heads_inner(target);
    g->attention_kv_groups = codegen_attention_kv_groups(target);
    g->residual_norms = codegen_residual_norms(target);
    pass_fuse_attention(g);
    VERIFY("fuse_attention");
    if (forward_only) return 0;
    if (pass_autodiff(g, d)) return 1;
    VERIFY("autodiff");
    return 0;
}

/* The products' precision: --precision where given, else the program's precision
 * statement (fp32 without one); the plan is costed at it. fp16's loss scale: --loss-scale
 * and --loss-scale-interval over GradScaler's defaults. */
static void choose_precision(ir_graph *g, const dm_compile_request *req, dm_pipeline_options *po) {
    *po = *req->pipeline;
    if (req->precision_given) {
        int p = po->cost.precision;
        g->product_dtype = p == DM_BF16 ? DT_BF16 : p == DM_FP16 ? DT_F16 : DT_F32;
        g->loss_scale = 0;
    } else if (g->product_dtype != DT_F32) {
        po->cost.precision = g->product_dtype == DT_BF16 ? DM_BF16 : DM_FP16;
    }
    g->attention_16bit = g->product_dtype != DT_F32 && codegen_attention_16bit(req->target, g->product_dtype);
    g->casts_with_producer = g->product_dtype != DT_F32 && !req->no_fuse_casts && codegen_fuses_casts(req->target);
    g->loss_grad_16bit = g->product_dtype != DT_F32 && codegen_loss_grad_16bit(req->target);
    if (g->product_dtype == DT_F16) {
        g->loss_scale = req->loss_scale > 0 ? req->loss_scale : 65536.0;
        g->loss_scale_interval = req->loss_scale_interval > 0 ? req->loss_scale_interval : 2000;
    }
}

static int run_after_autodiff(ir_graph *g, const dm_compile_request *req, dm_diag *d, dm_compiled *out) {
    dm_pipeline_options po;
    choose_precision(g, req, &po);
    g->prune = req->prune;
    g->quantize_bits = req->quantize_bits;
    g->quantize_group = req->quantize_group;
    g->quantize_activations = req->quantize_activations;
    g->quantize_embeddings = req->quantize_embeddings;
    /* int8 keeps every f32 weight: its calibration's f32 forward multiplies them */
    g->quantize_narrow_only = req->quantize_bits && !req->quantize_activations && codegen_narrow_only(req->target);
    /* a forward-only graph (--quantize) has no backward to recompute for and no update */
    int forward_only = req->quantize_bits != 0;
    if (!forward_only && pass_recompute(g, d)) return 1;
    VERIFY("recompute");
    if (!forward_only && pass_optimizer(g, d)) return 1;
    VERIFY("optimizer");
    if (stops_at(req, "optimizer")) return 0;
    if (pass_shard(g, &out->reshards, d)) return 1;
    VERIFY("shard");
    if (stops_at(req, "shard")) return 0;
    if (pass_pipeline(g, &po, &out->pipeline, d)) return 1;
    if (pass_supported(g, d)) return 1;
    pass_tied_partials(g, &out->pipeline, &out->reshards);
    VERIFY("tied_partials");
    pass_zero_gather(g, req->bucket_floats, &out->pipeline, &out->reshards);
    VERIFY("zero_gather");
    /* the pipeline pass timed the step before the gathers existed */
    pipeline_retime_zero_gathers(g, &out->pipeline, po.bucket_bytes);
    pass_precision(g, &out->pipeline, &out->reshards);
    VERIFY("precision");
    pass_slice_views(g);
    VERIFY("slice_views");
    return 0;
}

static int run_passes(ir_graph *g, const dm_compile_request *req, dm_diag *d, dm_compiled *out) {
    if (stops_at(req, "lower")) {
        VERIFY("lower");
        return 0;
    }
    if (differentiate(g, req->target, req->quantize_bits != 0, d)) return 1;
    if (stops_at(req, "autodiff")) return 0;
    return run_after_autodiff(g, req, d, out);
}

/* --memory-gb against the memory plan. The cut search fits its own estimate of a stage
 * (parameters, gradients, optimizer state, activations in flight), which leaves out the
 * gradient sums, scratch, outputs and weight versions the plan allocates: a cut it
 * accepted could still be over the limit (gpt.dm B=8 on pipeline=4, 8 micro-batches,
 * --memory-gb 2.6: stage 3 allocates 4206 MiB). Each pipeline rank's planned peak, what
 * --explain's memory table prints, must fit; without stages, the one rank's (--mesh auto
 * --memory-gb takes a plan --plan sized so: it must not compile one over the limit).
 * Returns the errors. */
static int check_memory_limit(const dm_compile_request *req, const dm_compiled *out, dm_diag *d) {
    double limit = req->pipeline ? req->pipeline->memory_limit_bytes : 0;
    const ir_graph *g = out->g;
    const dm_memory_plan *plan = &out->memory;
    if (limit <= 0) return 0;
    const double mib = 1024.0 * 1024.0;
    int staged = plan->stages > 1, ranks = staged ? plan->ranks : 1;
    int errors = 0, chunked = plan->stages > plan->ranks;
    dm_loc at = g->pipe_axis >= 0 ? g->axes[g->pipe_axis].loc : (dm_loc){0};
    for (int k = 0; k < ranks; k++) {
        dm_memory_peak pk;
        dm_memory_peak_of(plan, g, &out->pipeline, plan->scratch_elems, k, &pk);
        if ((double)pk.total <= limit) continue;
        if (!staged) {
            /* no pipeline declaration to point at: the message stands alone (counted as
             * dm_error counts, printed while under max_errors) */
            if (++d->n_errors <= d->max_errors)
                fprintf(d->out, "dmc: error: a rank allocates %.2f MiB at its peak (the memory plan, --explain's "
                                "memory table), over --memory-gb %.3g (%.2f MiB)\n",
                        pk.total / mib, limit / (mib * 1024), limit / mib);
        } else {
            dm_error(d, at, "pipeline %s %d allocates %.2f MiB at its peak (the memory plan, --explain's memory table), "
                     "over --memory-gb %.3g (%.2f MiB)", chunked ? "rank" : "stage", k, pk.total / mib,
                     limit / (mib * 1024), limit / mib);
        }
        errors++;
    }
    if (errors && !staged) {
        if (d->n_errors <= d->max_errors)
            fprintf(d->out, "dmc: note: raise --memory-gb, or split the model over more ranks (tensor, pipeline), its "
                            "optimizer state (--zero) or its activations (--recompute, more micro-batches)\n");
    } else if (errors) {
        dm_note(d, at, "the cut search fits a looser estimate of a stage, without its gradient sums, scratch, outputs "
                       "and weight versions: raise --memory-gb, or use more stages, fewer micro-batches or 1f1b");
    }
    return errors;
}

/* Memory, each pipeline stage's share of it, gradient buckets, ZeRO's shares, and the
 * bias adds activations complete (on the final memory plan). */
static void plan_memory(const dm_compile_request *req, dm_compiled *out) {
    ir_graph *g = out->g;
    pass_memory(g, &out->memory);
    pipeline_plan_readers(&out->pipeline, g, &out->memory);
    memory_plan_stages(&out->memory, g, &out->pipeline);
    if (codegen_flat_update(req->target)) memory_update_layout(&out->memory, g);
    dm_scratch_rules scratch_rules;
    codegen_scratch_rules(req->target, &scratch_rules);
    out->memory.scratch_elems = dm_scratch_elems(g, &scratch_rules);
    pass_buckets(g, &out->memory, req->bucket_floats, &out->buckets);
    pass_zero(g, &out->memory, &out->buckets, &out->zero);
    memory_plan_tied_sums(&out->memory, g);
    if (out->zero.scratch_elems > out->memory.scratch_elems) out->memory.scratch_elems = out->zero.scratch_elems;
    pass_compress(g, &out->memory, &out->buckets, &out->compress);
    pass_fuse_bias(g, &out->memory, codegen_fuses_bias(req->target), &out->bias);
    out->planned = 1;
}

/* After the passes: the memory plan, where asked for (not when stopping after a pass), and
 * --memory-gb checked against it. Returns the errors. */
static int finish_plan(const dm_compile_request *req, dm_compiled *out, dm_diag *d) {
    if (!req->plan_memory || req->stop_after) return 0;
    plan_memory(req, out);
    return check_memory_limit(req, out, d);
}

int dm_compile(const dm_program *prog, const dm_compile_request *req, dm_diag *d, dm_compiled *out) {
    memset(out, 0, sizeof *out);
    int before = d->n_errors;
    out->g = dm_lower(prog, req->lower, d);
    if (!out->g) return d->n_errors > before ? d->n_errors - before : 1;
    if (req->compact && pass_compact_channels(out->g, req->compact, d)) return d->n_errors > before ? d->n_errors - before : 1;
    if (req->distill_temperature > 0 && pass_distill(out->g, req->distill_temperature, req->distill_alpha, d))
        return d->n_errors > before ? d->n_errors - before : 1;
    if (run_passes(out->g, req, d, out)) return d->n_errors > before ? d->n_errors - before : 1;
    if (finish_plan(req, out, d)) return d->n_errors > before ? d->n_errors - before : 1;
    return 0;
}

ir_graph *dm_lower_differentiated(const dm_program *prog, const dm_lower_options *lower, const char *target,
                                  dm_diag *d) {
    ir_graph *g = dm_lower(prog, lower, d);
    if (g && differentiate(g, target, 0, d)) {
        ir_graph_free(g);
        return NULL;
    }
    return g;
}

int dm_compile_differentiated(ir_graph *g, const dm_compile_request *req, dm_diag *d, dm_compiled *out) {
    memset(out, 0, sizeof *out);
    int before = d->n_errors;
    out->g = g;
    if (run_after_autodiff(g, req, d, out)) return d->n_errors > before ? d->n_errors - before : 1;
    if (finish_plan(req, out, d)) return d->n_errors > before ? d->n_errors - before : 1;
    return 0;
}

void dm_compiled_free(dm_compiled *c) {
    if (c->planned) {
        dm_zero_plan_free(&c->zero);
        dm_compress_plan_free(&c->compress);
        dm_bucket_plan_free(&c->buckets);
        dm_bias_plan_free(&c->bias);
        dm_memory_plan_free(&c->memory);
    }
    dm_reshard_list_free(&c->reshards);
    dm_pipeline_plan_free(&c->pipeline);
    ir_graph_free(c->g);
    memset(c, 0, sizeof *c);
}

int64_t dm_compiled_peak_bytes(const dm_compiled *c) {
    int64_t peak = 0;
    int stages = c->pipeline.stages > 1 ? c->pipeline.stages : 1;
    for (int k = 0; k < stages; k++) {
        dm_memory_peak pk;
        dm_memory_peak_of(&c->memory, c->g, &c->pipeline, c->memory.scratch_elems, k, &pk);
        if (pk.total > peak) peak = pk.total;
    }
    return peak;
}
