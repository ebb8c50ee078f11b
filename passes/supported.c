/* supported.c: what code generation cannot do yet, refused with a source location at
 * --check instead of when -o writes the code. requires: shard and pipeline (the splits and
 * collectives are final, the stages known). leaves: the graph unchanged.
 *
 * Each check here is one code generation relies on (codegen/emit.c): inputs are read from
 * the caller's whole batch, a rank's block of them is contiguous only when the split dim
 * is the leading one; with micro-batches, outputs are gathered row block by row block;
 * stage masks are 64-bit; all-to-all adds a dim to its operand. */
#include <stdio.h>
#include <string.h>

#include "passes.h"

/* Elements of dims [from, to) of t. */
static int64_t dims_numel(const ir_type *t, int from, int to) {
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= t->shape[d];
    return n;
}

static int check_inputs(const ir_graph *g, dm_diag *d) {
    int errors = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        const ir_value *v = g->values[g->inputs[i]];
        const ir_type *t = &v->type;
        for (int k = 0; k < t->rank; k++) {
            if (t->split[k] == IR_REPLICATED) continue;
            if (dims_numel(t, 0, k) != 1) {
                const char *axis = g->axes[t->split[k]].name;
                dm_error(d, v->loc, "input '%s' is split over '%s' on dim %d: generated code splits an input only on "
                                    "its leading dim (the batch); split that one, or drop '@%s'", v->name, axis, k, axis);
                errors++;
            }
            break;
        }
    }
    return errors;
}

/* The value whose buffer v is read from: v itself, or what a reshape or another view
 * reads in place (the memory plan gives them their operand's buffer). */
static const ir_value *buffer_owner(const ir_graph *g, const ir_value *v) {
    while (ir_in_operand_buffer(v)) v = g->values[v->operands[0]];
    return v;
}

/* With micro-batches or stages, an output is written by the op that computes it, each
 * micro-batch's rows copied into the step's: it must be the result of an op (not an
 * input or a parameter, nor a reshape of one, which live in the caller's buffers), and
 * with micro-batches lead with the batch. Said at the output statement. */
static int check_outputs(const ir_graph *g, dm_diag *d) {
    int errors = 0;
    for (int i = 0; ir_is_scheduled(g) && i < g->n_outputs; i++) {
        const ir_value *v = g->values[g->outputs[i]];
        const ir_type *t = &v->type;
        dm_loc at = g->output_locs ? g->output_locs[i] : v->loc;
        if (buffer_owner(g, v)->role != ROLE_TEMP) {
            dm_error(d, at, "output '%s' is not computed: with micro-batches or stages, outputs are results of ops "
                            "(not an input or parameter, nor a reshape of one)", v->name);
            errors++;
        } else if (g->microbatches > 1 && (t->rank == 0 || !t->dim_name[0] || strcmp(t->dim_name[0], g->batch_dim) != 0)) {
            dm_error(d, at, "output '%s' does not lead with the batch '%s': with micro-batches, outputs are the "
                            "step's rows", v->name, g->batch_dim);
            errors++;
        }
    }
    return errors;
}

/* With micro-batches, a dropout's elements are numbered in the step's whole tensor by
 * micro-batch row blocks (codegen/emit_dropout.c): its value must lead with the batch. */
static int check_dropout(const ir_graph *g, dm_diag *d) {
    for (int i = 0; g->microbatches > 1 && i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        const ir_type *t = &v->type;
        if (v->op != OP_DROPOUT || (t->rank > 0 && t->dim_name[0] && strcmp(t->dim_name[0], g->batch_dim) == 0)) continue;
        dm_error(d, v->loc, "dropout of a value that does not lead with the batch '%s': with micro-batches, its mask "
                            "is drawn by the step's rows", g->batch_dim);
        return 1;
    }
    return 0;
}

/* ZeRO turns the gradient allreduces into reduce-scatters: bf16 and fp16 compression
 * ride on those; top-k's and PowerSGD's error feedback, per allreduced gradient, do not
 * combine with them (yet). */
static int check_compress(const ir_graph *g, dm_diag *d) {
    if (g->compress.kind == COMPRESS_NONE || !g->zero) return 0;
    /* bf16 and fp16 ride on ZeRO's reduce-scatters (dm_zero_reduces_half) */
    if (g->compress.kind == COMPRESS_BF16 || g->compress.kind == COMPRESS_FP16) return 0;
    char name[64];
    dm_compress_name(&g->compress, name, sizeof name);
    if (g->zero_loc.line > 0) {
        dm_error(d, g->zero_loc, "--compress %s does not combine with ZeRO (zero = %d): its error feedback is per "
                                 "allreduced gradient, and ZeRO reduce-scatters them (bf16 and fp16 do combine); drop "
                                 "one of them", name, g->zero);
    } else {
        fprintf(d->out, "dmc: error: --compress %s does not combine with --zero %d: its error feedback is per allreduced "
                        "gradient, and ZeRO reduce-scatters them (bf16 and fp16 do combine); drop one of them\n", name,
                g->zero);
        d->n_errors++;
    }
    return 1;
}

/* Parameter servers take the place of the data axis's allreduce and of the update: a
 * mesh of that axis alone (>= 2 workers), an optimizer, and none of what changes the
 * allreduce or the update (ZeRO, compression, clipping, decay by parameter). */
static int check_param_servers(const ir_graph *g, dm_diag *d) {
    if (!g->param_servers.servers) return 0;
    const char *why = NULL;
    char buf[256];
    int data = -1;
    for (int a = 0; a < g->n_axes; a++) {
        if (a == g->data_axis) data = a;
        else if (g->axes[a].size > 1 && !why) {
            snprintf(buf, sizeof buf, "the mesh's axis %s has size %lld: parameter servers serve a mesh of the data axis alone",
                     g->axes[a].name, (long long)g->axes[a].size);
            why = buf;
        }
    }
    if (!why && (data < 0 || g->axes[data].size < 2))
        why = "parameter servers need workers: a mesh axis named data of size >= 2 (--mesh data=N)";
    else if (!why && g->optimizer.kind == OPTIM_NONE)
        why = "parameter servers run the optimizer's update: the program declares no optimizer";
    else if (!why && g->optimizer.clip > 0)
        why = "parameter servers do not clip gradients (the norm is over every server's shard): drop clip";
    else if (!why && g->zero)
        why = "parameter servers already hold the optimizer state in shards: drop ZeRO";
    else if (!why && g->compress.kind != COMPRESS_NONE)
        why = "parameter servers take whole gradients: drop --compress";
    else if (!why && g->optimizer.no_decay_1d && g->optimizer.weight_decay != 0)
        why = "parameter servers run one update for every shard: weight_decay_1d = false (decay by parameter) is not "
              "built for them";
    if (!why) return 0;
    fprintf(d->out, "dmc: error: --param-servers %d: %s\n", g->param_servers.servers, why);
    d->n_errors++;
    return 1;
}

int pass_supported(const ir_graph *g, dm_diag *d) {
    int pipe_axis = ir_pipeline_axis(g);
    if (pipe_axis >= 0 && g->axes[pipe_axis].size > 64) {
        dm_error(d, g->axes[pipe_axis].loc, "at most 64 pipeline stages, the mesh has %lld", (long long)g->axes[pipe_axis].size);
        return 1;
    }
    int errors = check_inputs(g, d) + check_outputs(g, d) + check_dropout(g, d) + check_compress(g, d) +
                 check_param_servers(g, d);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op == OP_ALLTOALL && v->type.rank + 1 > IR_MAX_RANK) {
            dm_error(d, v->loc, "an all-to-all of a rank-%d tensor is not supported (at most %d dims)", v->type.rank,
                     IR_MAX_RANK - 1);
            errors++;
        }
    }
    return errors;
}
