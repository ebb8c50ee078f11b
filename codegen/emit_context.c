/* emit_context.c: the context: this rank's storage as the memory plan lays it out, the
 * helpers that take it (faults' messages, the communicators' errors), and create and
 * destroy, which allocate and free every buffer it owns. */
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

/* The context: this rank's storage, planned by dmc. */
void emit_context_struct(emitter *E) {
    const ir_graph *g = E->g;
    const dm_memory_plan *P = E->plan;
    cg_writer *w = &E->w;
    int trains = g->loss >= 0 && g->grads;
    cg_line(w, "/* Storage of one rank, planned by dmc (%s). */", E->dialect->storage_note);
    cg_line(w, "struct %s_ctx {", g->model);
    w->indent++;
    cg_line(w, "float *params; /* (%lld) every parameter, in declaration order */", (long long)P->param_elems);
    cg_line(w, "float *grads;  /* (%lld) gradient of each parameter after train_step */", (long long)P->grad_elems);
    cg_line(w, "float *state;  /* (%lld) optimizer state */", (long long)P->state_elems);
    if (E->scheduled) {
        cg_line(w, "float *arena;  /* temporaries, reused by liveness (%lld for one micro-batch, %lld without reuse);",
                (long long)P->arena_elems, (long long)P->arena_unshared_elems);
        cg_line(w, "                * of what the backward pass reads, a copy per micro-batch in flight on this");
        cg_line(w, "                * rank's stage (stage_slots) */");
        if (trains && g->microbatches > 1)
            cg_line(w, "float *grad_sum; /* (%lld) the micro-batches' gradients, summed; laid out as grads%s */",
                    (long long)dm_grad_sum_elems(P, -1), P->sum_offset ? " are whole (ZeRO keeps shares)" : "");
        cg_line(w, "double loss_sum; /* the micro-batches' losses, summed */");
        cg_line(w, "float loss;      /* the step's: their mean */");
        for (int i = 0; i < g->n_outputs; i++)
            cg_line(w, "%s *output_%s; /* (%d, %lld) output %s of the step, by micro-batch */", ctype(V(E, g->outputs[i])->type.dtype),
                    E->cname[g->outputs[i]], g->microbatches, (long long)ir_numel(T(E, g->outputs[i])), V(E, g->outputs[i])->name);
    } else {
        cg_line(w, "float *arena;  /* (%lld) temporaries of one step, reused by liveness (%lld without reuse) */",
                (long long)P->arena_elems, (long long)P->arena_unshared_elems);
    }
    if (E->scratch_elems) cg_line(w, "float *scratch; /* (%lld) collectives rearrange blocks here; kernels' room */", (long long)E->scratch_elems);
    if (E->dialect->separate_memory) { /* the batch copied in, the outputs' host copies */
        int64_t micro = g->microbatches > 1 ? g->microbatches : 1;
        for (int i = 0; i < g->n_inputs; i++) {
            const ir_value *v = V(E, g->inputs[i]);
            cg_line(w, "%s *input_%s; /* (%lld) the step's input %s, copied from the caller's batch */", ctype(v->type.dtype),
                    E->cname[v->id], (long long)(ir_numel(&v->type) * micro), v->name);
        }
        for (int i = 0; i < g->n_outputs; i++) {
            const ir_value *v = V(E, g->outputs[i]);
            cg_line(w, "%s *host_output_%s; /* host memory: what %s_output_%s returns */", ctype(v->type.dtype), E->cname[v->id],
                    g->model, E->cname[v->id]);
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        if (dm_output_gathered(E->g, v))
            cg_line(w, "float *whole_output_%s; /* host memory: output %s gathered whole, allocated when first asked for */", E->cname[v->id],
                    v->name);
    }
    cg_line(w, "int64_t step;  /* optimizer updates done */");
    if (E->g->loss_scale > 0)
        cg_line(w, "dmrt_loss_scale loss_scale; /* fp16: seeds the loss's gradient; its updates skipped, halved, doubled */");
    emit_2bw_fields(E);
    emit_schedule_fields(E);
    emit_compress_fields(E);
    emit_ps_fields(E);
    if (E->dropout) {
        cg_line(w, "uint64_t seed; /* create's: with step, a dropout's number and an element's index, its random key */");
        cg_line(w, "int training;  /* set by train_step, cleared by forward: dropout is the identity in forward */");
    }
    if (E->partitioned) {
        cg_line(w, "dmrt_rank *rank;           /* this rank of the run (the launcher's) */");
        cg_line(w, "dmrt_comm *comm[%d];        /* (mesh axes) the ranks differing from this one along each axis */", g->n_axes);
        cg_line(w, "int64_t coord[%d];          /* (mesh axes) this rank's coordinate: the block of a split dim it holds */", g->n_axes);
    }
    E->dialect->ctx_fields(w);
    cg_line(w, "const int64_t *param_offsets; /* (params) this rank's: stage_param_offsets[its stage] */");
    if (trains) cg_line(w, "const int64_t *grad_offsets;  /* (params) likewise */");
    if (E->dialect->block_alignment)
        cg_line(w, "char *device_block; /* every device buffer above, in one allocation made by create */");
    cg_line(w, "dmrt_alloc_stats memory; /* the host memory this context allocated (dmrt_alloc_tracked) */");
    cg_line(w, "dmrt_fault fault; /* a kernel's bad index (data_fault) */");
    cg_line(w, "int threads;    /* the loops and products of this rank run on this many threads (%s_set_threads) */", g->model);
    emit_quant_fields(E);
    cg_line(w, "int predicting; /* in %s_predict: the forward skips what only the loss needs */", g->model);
    cg_line(w, "char error[512];");
    w->indent--;
    cg_line(w, "};");
    cg_line(w, "typedef struct %s_ctx struct_ctx;", g->model);
    cg_blank(w);
}

/* comm_failed, data_fault and the dialect's helpers. */
/* The messages of the kernels' range checks (ctx->fault.site), and for each the columns of
 * the batch input it reads (0: one per row). A fault's position is in the step's whole
 * batch (cg_fault_position_base): [row, column] of a [B, T] input such as a GPT's tokens, the
 * row of a [B] one; the format takes the value, the row and the column. */
static void emit_fault_formats(emitter *E) {
    cg_writer *w = &E->w;
    long long *columns = calloc((size_t)E->n_faults + 1, sizeof *columns);
    if (!columns) abort();
    cg_line(w, "/* What each range check of a kernel (ctx->fault.site) found out of range. */");
    cg_line(w, "static const char *const fault_formats[%d] = {", E->n_faults + 1);
    cg_line(w, "    \"\",");
    for (int i = 0; i < E->g->n_values; i++) {
        if (!E->fault_site[i]) continue;
        const ir_value *v = V(E, i);
        int embed = v->op == OP_EMBED;
        const ir_type *t = &V(E, v->operands[0])->type;
        long long limit = (long long)(embed ? t->shape[0] : t->shape[t->rank - 1]);
        int ids = v->operands[1]; /* the ids of an embedding, the targets of the statistics */
        const ir_value *read = V(E, E->plan->region[ids] == REGION_INPUT ? E->plan->storage_of[ids] : ids);
        const char *what = embed ? "id" : "target";
        if (E->plan->region[ids] == REGION_INPUT && read->type.rank == 2) {
            columns[E->fault_site[i]] = (long long)read->type.shape[1];
            cg_line(w, "    \"%s:%d: %s %%d at [%%lld, %%lld] of '%s' is outside [0, %lld)\",", E->source_path, v->loc.line,
                    what, read->name ? read->name : "?", limit);
        } else {
            cg_line(w, "    \"%s:%d: %s %%d %s %%lld is outside [0, %lld)\",", E->source_path, v->loc.line, what,
                    E->plan->region[ids] == REGION_INPUT ? "of row" : "at position", limit);
        }
    }
    cg_line(w, "};");
    char row[4096];
    size_t n = (size_t)snprintf(row, sizeof row, "0");
    for (int s = 1; s <= E->n_faults && n < sizeof row; s++)
        n += (size_t)snprintf(row + n, sizeof row - n, ", %lld", columns[s]);
    cg_line(w, "static const long long fault_columns[%d] = {%s};", E->n_faults + 1, row);
    free(columns);
}

void emit_context_helpers(emitter *E) {
    cg_writer *w = &E->w;
    if (E->partitioned) {
        cg_line(w, "/* A failed collective fails the step with the communicator's message (rank, axis, op, step). */");
        cg_line(w, "static int comm_failed(struct_ctx *ctx) {");
        cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%%s\", %s);", E->dialect->comm_error);
        cg_line(w, "    return DMRT_ERR_COMM;");
        cg_line(w, "}");
        cg_blank(w);
    }
    if (E->n_faults) {
        emit_fault_formats(E);
        cg_line(w, "/* Fails the step with the message of the fault a kernel recorded, and clears it. */");
        cg_line(w, "static int data_fault(struct_ctx *ctx) {");
        cg_line(w, "    const long long position = (long long)ctx->fault.position, columns = fault_columns[ctx->fault.site];");
        cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, fault_formats[ctx->fault.site], (int)ctx->fault.value,");
        cg_line(w, "             columns ? position / columns : position, columns ? position %% columns : 0);");
        cg_line(w, "    memset(&ctx->fault, 0, sizeof ctx->fault);");
        cg_line(w, "    return DMRT_ERR_DATA;");
        cg_line(w, "}");
        cg_blank(w);
    }
    E->dialect->ctx_helpers(w);
}

/* The buffers a context owns: (field, elements, element type), as create allocates them. */
typedef struct owned_buffer {
    char field[160];
    char elems[160];   /* C expression: elements */
    const char *type;
    int host;          /* host memory even where the rest is separate (separate_memory) */
    int lazy;          /* (host) allocated when first used, not by create */
    char at[16];       /* in one block (the dialect's block_alignment): its offset there ("at[3]") */
} owned_buffer;

static int owned_buffers(const emitter *E, owned_buffer *b, int max) {
    const ir_graph *g = E->g;
    const dm_memory_plan *P = E->plan;
    int n = 0, trains = g->loss >= 0 && g->grads;
#define OWN(name_fmt, name_arg, count, ty, on_host) \
    do { \
        if (n < max) { \
            snprintf(b[n].field, sizeof b[n].field, name_fmt, name_arg); \
            snprintf(b[n].elems, sizeof b[n].elems, "%s", count); \
            b[n].type = ty, b[n].host = on_host, b[n].lazy = 0; \
            n++; \
        } \
    } while (0)
    /* a pipeline stage's ranks: their stage's sizes (stage_elems, ctx->coord known by then) */
    char num[5][96];
    if (P->stages > 1) {
        for (int r = 0; r < 5; r++) snprintf(num[r], sizeof num[r], "stage_elems[ctx->coord[PIPELINE_AXIS]][%d]", r);
    } else {
        snprintf(num[0], sizeof num[0], "%lld", (long long)P->param_elems);
        snprintf(num[1], sizeof num[1], "%lld", (long long)P->grad_elems);
        snprintf(num[2], sizeof num[2], "%lld", (long long)P->state_elems);
        snprintf(num[3], sizeof num[3], "%lld", (long long)P->arena_elems);
        snprintf(num[4], sizeof num[4], "%lld", (long long)dm_grad_sum_elems(P, -1));
    }
    char count[160];
    if (emits_2bw(E) && dm_runs_pipedream(g)) { /* P - s versions on stage s: ctx->params points at one */
        for (int k = 0; k < E->ranks; k++) {
            char stashed[160];
            snprintf(stashed, sizeof stashed, "ctx->coord[PIPELINE_AXIS] < %d ? %s : 0", E->ranks - k, num[0]);
            OWN("weights[%d]", k, stashed, "float", 0);
        }
    } else if (emits_2bw(E)) { /* two versions: ctx->params points at one */
        OWN("%s", "weights[0]", num[0], "float", 0);
        OWN("%s", "weights[1]", num[0], "float", 0);
    } else {
        OWN("%s", "params", num[0], "float", 0);
    }
    OWN("%s", "grads", num[1], "float", 0);
    OWN("%s", "state", num[2], "float", 0);
    if (E->scheduled) {
        if (P->stages > 1)
            snprintf(count, sizeof count, "%s", num[3]);
        else
            snprintf(count, sizeof count, "(int64_t)stage_slots[0] * %s", num[3]);
        OWN("%s", "arena", count, "float", 0);
        if (trains && g->microbatches > 1) OWN("%s", "grad_sum", num[4], "float", 0);
        for (int i = 0; i < g->n_outputs; i++) {
            long long kept = (long long)(g->microbatches * ir_numel(T(E, g->outputs[i])));
            if (P->stages > 1) /* only the output's stage computes and keeps it */
                snprintf(count, sizeof count, "ctx->coord[PIPELINE_AXIS] == %d ? %lld : 0", rank_of(E, V(E, g->outputs[i])->stage),
                         kept);
            else
                snprintf(count, sizeof count, "%lld", kept);
            OWN("output_%s", E->cname[g->outputs[i]], count, ctype(V(E, g->outputs[i])->type.dtype), 0);
        }
    } else {
        OWN("%s", "arena", num[3], "float", 0);
    }
    if (E->scratch_elems) {
        snprintf(count, sizeof count, "%lld", (long long)E->scratch_elems);
        OWN("%s", "scratch", count, "float", 0);
    }
    for (int i = 0; i < g->n_inputs; i++)
        if (emit_2bw_kept_count(E, i, count, sizeof count))
            OWN("previous_%s", E->cname[g->inputs[i]], count, ctype(V(E, g->inputs[i])->type.dtype), 0);
    int64_t micro = g->microbatches > 1 ? g->microbatches : 1;
    int separate = E->dialect->separate_memory;
    for (int i = 0; separate && i < g->n_inputs; i++) {
        snprintf(count, sizeof count, "%lld", (long long)(ir_numel(&V(E, g->inputs[i])->type) * micro));
        OWN("input_%s", E->cname[g->inputs[i]], count, ctype(V(E, g->inputs[i])->type.dtype), 0);
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int o = g->outputs[i];
        if (!dm_output_gathered(E->g, V(E, o))) continue;
        snprintf(count, sizeof count, "%lld", (long long)((E->scheduled ? g->microbatches : 1) * ir_numel(&V(E, o)->type)));
        int at = n;
        OWN("whole_output_%s", E->cname[o], count, "float", 1);
        if (n > at) b[at].lazy = 1; /* by the output's accessor */
    }
    for (int i = 0; separate && i < g->n_outputs; i++) {
        int o = g->outputs[i];
        snprintf(count, sizeof count, "%lld", (long long)((E->scheduled ? g->microbatches : 1) * ir_numel(T(E, o))));
        OWN("host_output_%s", E->cname[o], count, ctype(V(E, o)->type.dtype), 1);
    }
#undef OWN
    return n;
}

/* create's start: the mesh joined (a partitioned program), the context allocated, its
 * threads and this stage's offsets set; the dialect's opening. */
static void emit_create_open(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    if (E->partitioned) {
        cg_line(w, "%s_ctx *%s_create_rank(uint64_t seed, dmrt_rank *rank, char *err, size_t errlen) {", m, m);
        w->indent++;
        if (emits_param_servers(E)) /* the servers are world ranks after the mesh's */
            cg_line(w, "if (dmrt_mesh_init_outside(rank, %d, mesh_axis_names, mesh_axis_sizes, %d, err, errlen) != 0) return NULL;",
                    g->n_axes, g->param_servers.servers);
        else
            cg_line(w, "if (dmrt_mesh_init(rank, %d, mesh_axis_names, mesh_axis_sizes, err, errlen) != 0) return NULL;", g->n_axes);
    } else {
        cg_line(w, "%s_ctx *%s_create_beside(uint64_t seed, dmrt_rank *beside, char *err, size_t errlen) {", m, m);
        w->indent++;
    }
    cg_line(w, "struct_ctx *ctx = (struct_ctx *)calloc(1, sizeof *ctx);");
    cg_line(w, "if (!ctx) {");
    cg_line(w, "    snprintf(err, errlen, \"%s: out of memory\");", m);
    cg_line(w, "    return NULL;");
    cg_line(w, "}");
    if (E->partitioned) {
        cg_line(w, "ctx->rank = rank;");
        cg_line(w, "for (int axis = 0; axis < %d; axis++) {", g->n_axes);
        cg_line(w, "    ctx->comm[axis] = dmrt_mesh_axis(rank, axis);");
        cg_line(w, "    ctx->coord[axis] = dmrt_mesh_coord(rank, axis);");
        cg_line(w, "}");
    }
    /* the ranks on this machine share its cores */
    cg_line(w, "ctx->threads = dmrt_threads_beside(%s);", E->partitioned ? "rank" : "beside");
    cg_line(w, "ctx->param_offsets = stage_param_offsets[%s];", E->pipe_axis >= 0 ? "ctx->coord[PIPELINE_AXIS]" : "0");
    if (g->loss >= 0 && g->grads)
        cg_line(w, "ctx->grad_offsets = stage_grad_offsets[%s];", E->pipe_axis >= 0 ? "ctx->coord[PIPELINE_AXIS]" : "0");
    E->dialect->ctx_open(w, E->partitioned, E->tf32, "goto fail;");
    emit_upload_reserve(E);
    emit_clip_reserve(E);
}

/* The context's buffers allocated: host ones tracked, device ones one by one or, where
 * the dialect has a block alignment, carved out of one allocation. */
static void emit_create_buffers(emitter *E, owned_buffer *bufs, int n_bufs) {
    cg_writer *w = &E->w;
    int align = E->dialect->block_alignment;
    if (align) {
        /* in a block: the gotos above must not jump over its declarations (C++) */
        cg_line(w, "{");
        w->indent++;
        cg_line(w, "/* one device allocation holds every buffer, each at a %d-byte boundary */", align);
        cg_line(w, "size_t at[%d];", n_bufs + 1);
        cg_line(w, "at[0] = 0;");
    }
    int n_block = 0;
    for (int i = 0; i < n_bufs; i++) {
        char lhs[200], bytes[240];
        snprintf(lhs, sizeof lhs, "ctx->%.150s", bufs[i].field);
        snprintf(bytes, sizeof bytes, "(size_t)(%.150s) * sizeof(%s)", bufs[i].elems, bufs[i].type);
        if (bufs[i].lazy) {
            continue;
        } else if (bufs[i].host) {
            cg_line(w, "%s = (%s *)dmrt_alloc_tracked(&ctx->memory, %s);", lhs, bufs[i].type, bytes);
            cg_line(w, "if (!%s) goto oom;", lhs);
        } else if (align) {
            cg_line(w, "at[%d] = at[%d] + (%s + %d) / %d * %d; /* %s */", n_block + 1, n_block, bytes, align - 1, align, align,
                    bufs[i].field);
            snprintf(bufs[i].at, sizeof bufs[i].at, "at[%d]", n_block++);
        } else {
            E->dialect->alloc(w, lhs, bytes, "goto oom;");
        }
    }
    if (align) {
        char total[32];
        snprintf(total, sizeof total, "at[%d]", n_block);
        E->dialect->alloc(w, "ctx->device_block", total, "{ (void)device_failed(ctx); goto fail; }");
        for (int i = 0; i < n_bufs; i++)
            if (!bufs[i].host)
                cg_line(w, "ctx->%.150s = (%s *)(ctx->device_block + %s);", bufs[i].field, bufs[i].type, bufs[i].at);
        w->indent--;
        cg_line(w, "}");
    }
}

/* destroy: collectives still in flight waited for, every buffer freed. */
static void emit_destroy(emitter *E, const owned_buffer *bufs, int n_bufs) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    int align = E->dialect->block_alignment;
    cg_line(w, "void %s_destroy(%s_ctx *ctx) {", m, m);
    w->indent++;
    cg_line(w, "if (!ctx) return;");
    if (E->partitioned) {
        /* a step that failed may have left gradient buckets reducing ctx->grads */
        char callee[96];
        cg_line(w, "for (int axis = 0; axis < %d; axis++)", g->n_axes);
        cg_line(w, "    if (ctx->comm[axis]) (void)%sctx->comm[axis]);", cg_comm_callee(E, "comm_wait", callee, sizeof callee));
        emit_ps_finish(E);
    }
    for (int i = 0; i < n_bufs; i++) {
        char ptr[200];
        snprintf(ptr, sizeof ptr, "ctx->%.150s", bufs[i].field);
        if (bufs[i].host) cg_line(w, "dmrt_free_tracked(&ctx->memory, %s);", ptr);
        else if (!align) E->dialect->free(w, ptr);
    }
    if (align) E->dialect->free(w, "ctx->device_block");
    emit_quant_destroy(E);
    E->dialect->ctx_close(w);
    cg_line(w, "free(ctx);");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

void emit_create_destroy(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    owned_buffer bufs[64 + 64 + 2 * IR_MAX_AXES]; /* (pipedream: up to 64 weight versions) */
    int n_bufs = owned_buffers(E, bufs, (int)(sizeof bufs / sizeof *bufs));
    emit_create_open(E);
    emit_create_buffers(E, bufs, n_bufs);
    if (E->dropout) cg_line(w, "ctx->seed = seed;");
    if (E->g->loss_scale > 0)
        cg_line(w, "ctx->loss_scale = (dmrt_loss_scale){.scale = %.17g, .interval = %lld, .good_steps = 0, .skipped = 0, "
                   ".last_skipped = 0}; /* GradScaler's start */",
                E->g->loss_scale, (long long)E->g->loss_scale_interval);
    emit_2bw_create(E);
    emit_compress_create(E);
    emit_quant_alloc(E);
    cg_line(w, "if (init_params(ctx, seed) != DMRT_OK) {");
    cg_line(w, "    if (!ctx->error[0]) goto oom;");
    cg_line(w, "    goto fail;");
    cg_line(w, "}");
    emit_constants_call(E);
    emit_quant_create(E);
    cg_line(w, "return ctx;");
    w->indent--;
    cg_line(w, "oom:");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: out of memory\");", m);
    cg_line(w, "fail:");
    cg_line(w, "    snprintf(err, errlen, \"%%s\", ctx->error);");
    cg_line(w, "    %s_destroy(ctx);", m);
    cg_line(w, "    return NULL;");
    cg_line(w, "}");
    cg_blank(w);
    if (!E->partitioned) {
        cg_line(w, "%s_ctx *%s_create(uint64_t seed, char *err, size_t errlen) {", m, m);
        cg_line(w, "    return %s_create_beside(seed, NULL, err, errlen);", m);
        cg_line(w, "}");
        cg_blank(w);
    }
    emit_destroy(E, bufs, n_bufs);
}
