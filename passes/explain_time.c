/* explain_time.c: `--explain`'s predicted step: the pipeline schedule timed with each
 * stage's forward and backward times on the chosen hardware (passes/cost.c), then the
 * update phase; samples and tokens per second; model TFLOP/s per device. */
#include <string.h>

#include "explain.h"
#include "hardware.h"

double samples_per_step(const ir_graph *g, double *tokens) {
    *tokens = 0;
    if (g->n_inputs == 0) return 0;
    const ir_type *t = &g->values[g->inputs[0]]->type;
    if (t->rank < 1) return 0;
    double samples = g->batch_dim ? (double)g->batch_whole : (double)t->shape[0];
    if (t->dtype == DT_I32 && t->rank >= 2) *tokens = samples * (double)t->shape[1];
    return samples;
}

/* A --quantize program never trains: its graph is the forward alone (driver/compile.c), priced
 * with f32 products. */
static void explain_quantize_note(const ir_graph *g, FILE *out) {
    if (!g->quantize_bits) return;
    fprintf(out, "  (--quantize: this program predicts and evaluates only, so the step above is one forward of the\n"
                 "  batch, priced with f32 products, not with its %s products)\n",
            g->quantize_activations ? "int8 x int8" : "narrow-weight");
}

/* What a step runs: a forward-only graph (--quantize) has no backward and no update. */
static const char *passes_phrase(const ir_graph *g) { return g->grads ? "forward and backward" : "forward"; }

/* Under --precision bf16: what passes/precision.c made of the products, and what runs them. */
static void explain_precision_note(const ir_graph *g, FILE *out) {
    explain_quantize_note(g, out);
    if (g->product_dtype == DT_F32) return;
    int casts = 0;
    int64_t elems = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i]->op == OP_CAST) casts++, elems += ir_local_numel(g, &g->values[i]->type);
    fprintf(out, "  (%s products: %d casts round their operands (%.3g M elements a micro-batch, 2 bytes each), the\n"
                 "  products sum in f32; master weights, optimizer state, norms, softmax and the loss stay f32.\n"
                 "  The C target multiplies them with oneDNN where the CPU has AVX512-BF16, else converts them\n"
                 "  for OpenBLAS's sgemm; the trainer's banner says which: docs/precision.md)\n",
            ir_dtype_name(g->product_dtype), casts, (double)elems / 1e6);
}

/* --param-servers: the model still times the gradient allreduces the servers replace and
 * the workers' optimizer update (docs/parallelism.md, "Parameter servers", says why). */
static void explain_param_servers_note(const ir_graph *g, FILE *out) {
    if (!g->param_servers.servers) return;
    fprintf(out, "  (not priced: the %d parameter server%s; this times the allreduces and update they replace)\n",
            g->param_servers.servers, g->param_servers.servers == 1 ? "" : "s");
}

/* Every figure, with what each covers and what the model leaves out (--explain=full). */
static void time_text_full(const ir_graph *g, const dm_pipeline_plan *pl, FILE *out) {
    const dm_hardware *hw = cost_hardware(&pl->cost);
    double tokens, samples = samples_per_step(g, &tokens), step = pl->step_seconds;
    fprintf(out, "predicted step on %s (%s), %s products: %.3f ms\n", hw->name, hw->source,
            dm_precision_name((dm_precision)pl->cost.precision), step * 1e3);
    fprintf(out, "  %s of %d micro-batch%s on %d stage%s: %.3f ms (bubble %.1f%%)\n", passes_phrase(g),
            g->microbatches, g->microbatches == 1 ? "" : "es", pl->stages, pl->stages == 1 ? "" : "s",
            pl->timed.step * 1e3, 100 * pl->bubble);
    if (g->grads)
        fprintf(out, "  update: %.3f ms (the optimizer, and the gradient reductions by buckets less what the backward\n"
                     "  pass hides of them: %s)\n", pl->update_seconds * 1e3,
                hw->overlap > 0 ? "the hardware overlaps them by its efficiency.overlap" : "nothing on this hardware");
    if (step > 0 && samples > 0) {
        fprintf(out, "  %.4g samples/s", samples / step);
        if (tokens > 0) fprintf(out, ", %.4g tokens/s", tokens / step);
        fprintf(out, ";\n  %.3g TFLOP/s per device of model flops (matrix products %s: %.3g GFLOP per device\n"
                     "  and step)\n", pl->model_flops / step / 1e12, passes_phrase(g), pl->model_flops / 1e9);
    }
    explain_precision_note(g, out);
    explain_param_servers_note(g, out);
    fprintf(out, "  (%s; docs/cost.md)\n\n",
            strcmp(hw->name, "nominal") == 0 ? "a nominal roofline, not a machine: --hardware picks one"
                                             : "the hardware's peaks times its efficiencies");
}

/* The same figures in three lines. */
static void time_text_compact(const ir_graph *g, const dm_pipeline_plan *pl, FILE *out) {
    const dm_hardware *hw = cost_hardware(&pl->cost);
    double tokens, samples = samples_per_step(g, &tokens), step = pl->step_seconds;
    fprintf(out, "predicted step on %s (%s), %s products: %.3f ms (%s)\n", hw->name, hw->source,
            dm_precision_name((dm_precision)pl->cost.precision), step * 1e3,
            strcmp(hw->name, "nominal") == 0 ? "a nominal roofline, not a machine: --hardware picks one"
                                             : "the hardware's peaks times its efficiencies");
    fprintf(out, "  %s of %d micro-batch%s on %d stage%s: %.3f ms (bubble %.1f%%)", passes_phrase(g), g->microbatches,
            g->microbatches == 1 ? "" : "es", pl->stages, pl->stages == 1 ? "" : "s", pl->timed.step * 1e3,
            100 * pl->bubble);
    if (g->grads) fprintf(out, "; update: %.3f ms", pl->update_seconds * 1e3);
    fprintf(out, "\n");
    if (step > 0 && samples > 0) {
        fprintf(out, "  %.4g samples/s", samples / step);
        if (tokens > 0) fprintf(out, ", %.4g tokens/s", tokens / step);
        fprintf(out, ", %.3g TFLOP/s per device of model flops (%.3g GFLOP per device and step)\n",
                pl->model_flops / step / 1e12, pl->model_flops / 1e9);
    }
    explain_precision_note(g, out);
    explain_param_servers_note(g, out);
    fprintf(out, "\n");
}

void explain_time_text(const ir_graph *g, const dm_pipeline_plan *pl, int full, FILE *out) {
    if (!pl || !pl->timed.actions) return;
    if (full) time_text_full(g, pl, out);
    else time_text_compact(g, pl, out);
}

void explain_time_json(const ir_graph *g, const dm_pipeline_plan *pl, FILE *out) {
    if (!pl || !pl->timed.actions) return;
    const dm_hardware *hw = cost_hardware(&pl->cost);
    double tokens, samples = samples_per_step(g, &tokens), step = pl->step_seconds;
    fprintf(out, ", \"predicted\": {\"hardware\": ");
    explain_json_string(out, hw->name);
    fprintf(out, ", \"hardware_source\": ");
    explain_json_string(out, hw->source);
    fprintf(out, ", \"precision\": \"%s\", \"step_seconds\": %.10g, \"schedule_seconds\": %.10g, \"update_seconds\": %.10g, "
                 "\"bubble\": %.10g, \"samples_per_second\": %.10g, \"tokens_per_second\": %.10g, "
                 "\"model_flops_per_device\": %.10g, \"tflops_per_device\": %.10g%s}",
            dm_precision_name((dm_precision)pl->cost.precision), step, pl->timed.step, pl->update_seconds, pl->bubble,
            step > 0 ? samples / step : 0, step > 0 ? tokens / step : 0, pl->model_flops,
            step > 0 ? pl->model_flops / step / 1e12 : 0,
            g->param_servers.servers ? ", \"param_servers_priced\": false" : "");
}
