/* emit_step.c: the functions of a step: one per phase (forward, backward, update), or,
 * with micro-batches and pipeline stages, each stage's functions of one micro-batch and
 * its schedule as straight-line calls; sends and receives between stages. The public
 * forward, train_step and outputs that call them: emit_step_api.c. */
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

void cg_buffer_type(const emitter *E, int i, char *buf, size_t size) {
    snprintf(buf, size, "%s%s *", E->plan->region[i] == REGION_INPUT ? "const " : "", ctype(V(E, i)->type.dtype));
}

static void declare_buffers(emitter *E, const char *used) {
    const ir_graph *g = E->g;
    for (int i = 0; i < g->n_values; i++) {
        if (!used[i] || !has_storage(E, i)) continue;
        const ir_value *v = V(E, i);
        char where[128], type[256];
        cg_storage_expr(E, i, where, sizeof where);
        cg_shape_comment(E, &v->type, type, sizeof type);
        if (E->in_micro && made_in_sum(E, i))
            strncat(type, add_made_by_operands(E, V(E, E->plan->storage_of[i])) ? ", the sum over the micro-batches, which it and the add's other operand make"
                          : E->plan->storage_of[i] != i ? ", in its window of the sum over the micro-batches"
                          : v->op == OP_ADD        ? ", its sum over the micro-batches: its pieces' products add to it"
                          : v->op == OP_EMBED_GRAD ? ", its sum over the micro-batches: its rows are added to it"
                                                   : ", its sum over the micro-batches: its product adds to it",
                    sizeof type - strlen(type) - 1);
        char ptr[48];
        cg_buffer_type(E, i, ptr, sizeof ptr); /* (the outlined loops' parameters are declared so too) */
        if (v->type.dtype != DT_F32 && E->plan->region[i] == REGION_ARENA)
            cg_line(&E->w, "%s%s = (%s *)(%s); /* %s */", ptr, E->cname[i], ctype(v->type.dtype), where, type);
        else
            cg_line(&E->w, "%s%s = %s; /* %s */", ptr, E->cname[i], where, type);
    }
}


/* sum += part, n elements (both parenthesised C expressions). */
static void emit_accumulate(emitter *E, const char *sum, const char *part, long long n) {
    cg_loop_nest k = {.rank = 1, .size = {n}, .n_in = 2, .var = {"a", "b"}, .buffer = {sum, part}, .stride = {{1}, {1}},
                      .out = sum, .out_stride = {1}, .out_elems = n, .expr = "a + b"};
    E->dialect->loop_nest(&E->w, &k);
}

/* sum (+)= part, n elements: the first micro-batch's copied, the others' added. */
static void emit_add_to_sum(emitter *E, const char *sum, const char *part, long long n) {
    cg_line(&E->w, "if (micro == 0) {");
    E->w.indent++;
    cg_copy_elems(E, sum, part, n, "float", CG_DEVICE_TO_DEVICE);
    E->w.indent--;
    cg_line(&E->w, "} else {");
    E->w.indent++;
    emit_accumulate(E, sum, part, n);
    E->w.indent--;
    cg_line(&E->w, "}");
}

/* Adds a micro-batch's gradient of parameter p into ctx->grad_sum (the first one is
 * copied): the step's gradient is their mean. pipedream updates after every backward, with
 * that micro-batch's gradient alone: each is copied. */
static void emit_micro_grad_sum(emitter *E, int p) {
    long long n = (long long)ir_numel(T(E, E->g->grads[p]));
    const char *grad = E->cname[dm_micro_grad(E->g, p)];
    char sum[96];
    snprintf(sum, sizeof sum, "(ctx->grad_sum + %lld)", (long long)dm_grad_sum_offset(E->plan, E->g->grads[p]));
    if (made_in_sum(E, dm_micro_grad(E->g, p))) return; /* by its product */
    if (dm_runs_pipedream(E->g)) {
        cg_line(&E->w, "/* %s's gradient, for this micro-batch's update (ctx->grad_sum is laid out as ctx->grads) */",
                V(E, E->g->params[p])->name);
        cg_copy_elems(E, sum, grad, n, "float", CG_DEVICE_TO_DEVICE);
        return;
    }
    cg_line(&E->w, "/* %s's gradient, added to the step's (ctx->grad_sum is laid out as ctx->grads) */",
            V(E, E->g->params[p])->name);
    emit_add_to_sum(E, sum, grad, n);
}

/* A tied parameter's partial gradient made on this stage (passes/tied_partials.c), added
 * to its sum over the step's micro-batches, which goes to the owner once a step
 * (emit_tied_partial_sums). */
static void emit_tied_partial_add(emitter *E, int id) {
    const ir_value *v = V(E, id);
    if (made_in_sum(E, id)) return; /* by its product */
    if (!E->plan->partial_sum_offset || E->plan->partial_sum_offset[id] < 0) {
        fprintf(stderr, "dmc: internal error: the tied partial '%s' has no sum planned (memory_plan_tied_sums)\n",
                v->name ? v->name : "?");
        abort();
    }
    const ir_value *param = V(E, E->g->params[v->tied_partial_of - 1]);
    char sum[96];
    snprintf(sum, sizeof sum, "(ctx->grad_sum + %lld)", (long long)E->plan->partial_sum_offset[id]);
    cg_line(&E->w, "/* %s's partial gradient, added to the step's sum of it, which goes to stage %d once a step */",
            param->name, param->stage);
    emit_add_to_sum(E, sum, E->cname[id], (long long)ir_numel(T(E, id)));
}

/* Whether buffer owner r reaches `stage` from another stage in this phase's function:
 * forward values in the forward pass (even those only the backward reads), gradients in
 * the backward pass. */
static int received(const emitter *E, int r, ir_phase phase, int stage) {
    if (stage < 0 || E->creating || E->plan->region[r] != REGION_ARENA || V(E, r)->stage == stage) return 0;
    if (!(E->needed_on[r] >> stage & 1)) return 0;
    return V(E, r)->phase == phase;
}

/* With model chunks a pair of ranks carries several streams (interleaved, rank 0 sends
 * rank 1 the activations of stage 0 for stage 1 and of stage 2 for stage 3, and the
 * gradients of stage 2 for stage 1), which each side runs in its schedule's order: each
 * pair of stages and direction has a channel of its own, in which both sides go
 * micro-batch by micro-batch and value by value in program order. Tied parameters' new
 * values have channels after these. */
static int stage_channel(int from, int to, int gradient) { return (from * 64 + to) * 2 + gradient; }
static int tied_channel(int owner, int holder) { return 64 * 64 * 2 + owner * 64 + holder; }
static int tied_sum_channel(int owner, int holder) { return 64 * 64 * 3 + holder * 64 + owner; }

/* `callee` (send or recv) of pipeline traffic to or from stage peer's ranks: with model
 * chunks (or `tagged`) on channel `channel`, untagged without. */
static void p2p_call_on(emitter *E, const char *op, int peer, int channel, int tagged, char *buf, size_t size) {
    char callee[96], tagged_op[32];
    tagged = tagged || E->chunks > 1;
    snprintf(tagged_op, sizeof tagged_op, "%s_tagged", op);
    cg_comm_callee(E, tagged ? tagged_op : op, callee, sizeof callee);
    if (tagged) snprintf(buf, size, "%sctx->comm[%d], %d, %d", callee, E->pipe_axis, rank_of(E, peer), channel);
    else snprintf(buf, size, "%sctx->comm[%d], %d", callee, E->pipe_axis, rank_of(E, peer));
}

static void p2p_call(emitter *E, const char *op, int peer, int channel, char *buf, size_t size) {
    p2p_call_on(E, op, peer, channel, 0, buf, size);
}

static void emit_transfer(emitter *E, int r, int peer, int send) {
    const ir_value *v = V(E, r);
    char call[160];
    int to = send ? peer : E->cur_stage;
    p2p_call(E, send ? "send" : "recv", peer, stage_channel(v->stage, to, v->phase != PHASE_FORWARD), call, sizeof call);
    cg_line(&E->w, "if (%s, %s%s, %lld, \"%s of %s %s stage %d (%s:%d)\") != 0)", call,
            v->type.dtype == DT_I32 ? "(float *)" : "", E->cname[r], (long long)ir_numel(T(E, r)),
            V(E, r)->phase == PHASE_FORWARD ? "activation" : "gradient", E->cname[r], send ? "to" : "from", peer,
            E->source_path, v->loc.line);
    cg_line(&E->w, "    return comm_failed(ctx);");
}

/* After op id in a stage's function: its result to the stages that read it. */
static void emit_sends(emitter *E, int id, int stage) {
    if (stage < 0 || E->plan->region[id] != REGION_ARENA || shares_buffer(E, id)) return;
    uint64_t to = E->needed_on[id] & ~((uint64_t)1 << stage);
    if (to) cg_line(&E->w, "/* %s, to the stages that read it */", E->cname[id]);
    for (int t = 0; t < E->stages; t++)
        if (to >> t & 1) emit_transfer(E, id, t, 1);
}

/* The stages other than its own (the one that updates it) holding a copy of parameter p:
 * those whose ops read it (GPT's token embedding on the first, the tied head on the
 * last); with model chunks, one stage per other rank reading it, whose copy the rank's
 * stages share. 0 for a parameter on one stage. */
static uint64_t tied_holders(const emitter *E, int p) {
    const dm_memory_plan *P = E->plan;
    int root = P->storage_of[E->g->params[p]];
    uint64_t holders = 0;
    if (!E->needed_on || P->stages <= 1 || V(E, root)->stage >= 64) return 0;
    for (int k = P->copy_first[root]; k < P->copy_first[root + 1]; k++) holders |= (uint64_t)1 << P->copy_stage[k];
    return holders;
}

/* After the owner's update of a tied parameter, its new values to every other holder
 * (Megatron-LM allreduces the two stages' gradients and updates both; dmc sums the
 * gradient on the owner, which the backward pass already sends it, and sends the
 * weights: the same bytes, and one optimizer state). 2bw: the holder's next version waits
 * for the owner's matching one, so each copy is at its stage's own version; pipedream: a
 * holder takes each update in before the forward that reads it, every copy at the owner's
 * version (emit_2bw.c). Sends are buffered: no stage waits for another's update. which: TIED_SENDS, TIED_RECEIVES or both, parameter by parameter.
 * Inside a stage's update function the parameter is its local variable; in a rank's
 * (interleaved: after all its chunks' updates) its place in ctx->params. */
enum { TIED_SENDS = 1, TIED_RECEIVES = 2, TIED_IN_PARAMS = 4 };
static void emit_tied_updates_of(emitter *E, int stage, int which, int only_owner) {
    const ir_graph *g = E->g;
    for (int p = 0; p < g->n_params; p++) {
        uint64_t holders = tied_holders(E, p);
        const ir_value *v = V(E, g->params[p]);
        int owner = v->stage;
        if (!holders || (owner != stage && !(holders >> stage & 1))) continue;
        if (!(which & (owner == stage ? TIED_SENDS : TIED_RECEIVES)) || (only_owner >= 0 && owner != only_owner)) continue;
        char call[160], buf[128];
        if (E->chunks > 1 || (which & TIED_IN_PARAMS)) cg_storage_expr(E, v->id, buf, sizeof buf);
        else snprintf(buf, sizeof buf, "%s", E->cname[v->id]);
        cg_blank(&E->w);
        cg_line(&E->w, "/* %s is tied across stages: stage %d updates it, the others hold copies */", v->name, owner);
        for (int t = 0; t < E->stages; t++) {
            int send = owner == stage && (holders >> t & 1), recv = t == owner && owner != stage;
            if (!send && !recv) continue;
            /* 2bw and pipedream: on a channel of their own, since the owner's update runs
             * between its activations to the holder (pipeline=2), which the holder receives
             * after its own update */
            p2p_call_on(E, send ? "send" : "recv", t, tied_channel(owner, send ? t : stage), emits_2bw(E), call,
                        sizeof call);
            cg_line(&E->w, "if (%s, %s, %lld, \"updated parameter %s %s stage %d\") != 0)", call, buf,
                    (long long)ir_numel(T(E, v->id)), v->name, send ? "to" : "from", t);
            cg_line(&E->w, "    return comm_failed(ctx);");
        }
    }
}

static void emit_tied_updates(emitter *E, int stage, int which) { emit_tied_updates_of(E, stage, which, -1); }

/* Whether op v is in the function being emitted: the phase's (on `stage`; every stage's
 * when stage < 0) or, E->creating, create's: the values made at create run there, of
 * whichever phase, and in no step. */
static int in_function(const emitter *E, const ir_value *v, ir_phase phase, int stage) {
    if (stage >= 0 && v->stage != stage) return 0;
    if (dm_made_at_create(E->plan, v->id)) return E->creating;
    return !E->creating && v->phase == phase;
}

/* Whether stage holds a copy of a parameter stage `owner` updates (tied; owner < 0: any
 * other stage). */
int holds_tied_copies_of(const emitter *E, int stage, int owner) {
    for (int p = 0; p < E->g->n_params; p++) {
        int updater = V(E, E->g->params[p])->stage;
        if (updater != stage && (owner < 0 || updater == owner) && (tied_holders(E, p) >> stage & 1)) return 1;
    }
    return 0;
}

int holds_tied_copies(const emitter *E, int stage) { return holds_tied_copies_of(E, stage, -1); }

/* pipedream: an update of the tied parameters stage holds a copy of and stage `owner`
 * updates, received into ctx->params. */
void emit_tied_receives(emitter *E, int stage, int owner) {
    int saved = E->cur_stage;
    E->cur_stage = stage;
    emit_tied_updates_of(E, stage, TIED_RECEIVES | TIED_IN_PARAMS, owner);
    E->cur_stage = saved;
}

/* The ops of one phase function in order, each followed by its sends (pipelines), its
 * micro-batch gradient's sum (sum_after: the parameter whose micro-batch gradient value i
 * is, or -1; set to -1 once summed) and the buckets it completes (started early). */
static void emit_phase_ops(emitter *E, ir_phase phase, int stage, int *sum_after) {
    const ir_graph *g = E->g;
    /* a bucket's last partial is its own (partials are per gradient): one bucket per value */
    int *start_after = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!start_after) abort();
    for (int i = 0; i < g->n_values; i++) start_after[i] = -1;
    for (int lead = 0; phase == PHASE_BACKWARD && lead < g->n_values; lead++)
        if (bucket_started_early(E, lead)) start_after[E->bucket_ready[lead]] = lead;
    /* clipping needs every gradient reduced before the first update reads one: the
     * function's reductions, then the norm and scaling, then its updates */
    int clipped = phase == PHASE_UPDATE && g->optimizer.clip > 0, scaled = phase == PHASE_UPDATE && g->loss_scale > 0;
    int parts = clipped || scaled ? 2 : 1;
    int half = phase == PHASE_UPDATE ? E->update_half : 0; /* (interleaved fp16 or clipping: one part a function) */
    int guarded = 0; /* inside predict's guard (emit_predict.c) */
    for (int part = 1; part <= parts; part++) {
        if (half && part != half) continue;
        if (part == 2 && scaled) {
            if (half) emit_chunk_unscale(E, stage);
            else emit_loss_unscale(E, stage);
        }
        if (part == 2 && clipped) {
            if (half) emit_chunk_clip(E, stage);
            else emit_clip(E, stage);
        }
        E->update_part = parts == 2 ? part : 0;
        for (int i = 0; i < g->n_values; i++) {
            int updates = ir_op_info_of(V(E, i)->op)->cls == OPC_UPDATE;
            if (in_function(E, V(E, i), phase, stage) && (parts == 1 || updates == (part == 2))) {
                if (ir_op_info_of(V(E, i)->op)->cls != OPC_SOURCE && !emits_nothing(E, V(E, i)) && !E->creating)
                    predict_guard(E, i, &guarded);
                emit_op(E, V(E, i));
                emit_sends(E, i, stage);
                if (sum_after[i] >= 0) {
                    emit_micro_grad_sum(E, sum_after[i]);
                    sum_after[i] = -1;
                }
                if (E->in_micro && phase == PHASE_BACKWARD && V(E, i)->tied_partial_of) emit_tied_partial_add(E, i);
            }
            if (part == 1) emit_bucket_start(E, start_after, i);
        }
    }
    if (guarded) E->w.indent--, cg_line(&E->w, "}");
    if (half == 1) emit_chunk_squares(E, stage);
    E->update_part = 0;
    free(start_after);
}

/* Whether v's kernel reads operand k through its local name: a --quantize'd product reads
 * its weight through the narrow copy, and int8's calibration the f32 one through ctx
 * (emit_quant_product's w_f32). */
static int reads_local(const emitter *E, const ir_value *v, int k) {
    if (k == 0 && v->op == OP_EMBED && quant_gather_slot(E, v) >= 0) return 0; /* its narrow table, through ctx */
    return ir_reads_operand(v, k) && !(k == 1 && is_quant_product(E, v));
}

/* The buffers one phase (of one stage: stage >= 0) names, marked in used; *any: whether
 * it does anything (else its function leaves ctx unread). */
static void phase_buffers(emitter *E, ir_phase phase, int stage, char *used, int *any) {
    const ir_graph *g = E->g;
    int micro = stage >= 0 && phase != PHASE_UPDATE;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (!in_function(E, v, phase, stage) || ir_op_info_of(v->op)->cls == OPC_SOURCE) continue;
        /* an update split in two (interleaved fp16 or clipping): the reductions, or the updates */
        int updates = ir_op_info_of(v->op)->cls == OPC_UPDATE;
        if (phase == PHASE_UPDATE && E->update_half && updates != (E->update_half == 2)) {
            /* (the first half's check reads the gradients the updates will; a ZeRO bucket's
             * by its range) */
            if (E->update_half == 1 && !zero_bucket_of(E, v->param_index)) used[v->operands[1]] = *any = 1;
            continue;
        }
        *any = 1;
        /* a reshape that shares its operand's buffer emits no code: it touches nothing */
        if (emits_nothing(E, v)) continue;
        /* a bias's or a sum's add runs its product: it writes the product's buffer (its
         * own name is for its readers) */
        if (runs_product(E, v)) {
            const ir_value *product = V(E, dm_product_run_by(E->plan, v));
            used[product->id] = 1;
            /* a bias is read; a sum is the buffer the product (by its own name) adds to */
            if (E->plan->bias_add_of[product->id] == v->id) used[v->operands[1]] = 1;
            for (int k = 0; k < product->n_operands; k++)
                if (reads_local(E, product, k)) used[product->operands[k]] = 1;
            continue;
        }
        /* a window assembly's sum is made by its pieces (its adds emit a comment); it is
         * read only when sent */
        if (v->op == OP_ADD && (E->plan->assembled_in[i] >= 0 || (micro && add_made_by_operands(E, v)))) {
            if (stage >= 0 && (E->needed_on[i] & ~((uint64_t)1 << stage))) used[i] = 1;
            continue;
        }
        /* a ZeRO bucket reaches its members' gradients, state and parameters by offset */
        const dm_zero_bucket *zb = zero_bucket_of(E, v->param_index);
        if (zb && ir_op_info_of(v->op)->cls == OPC_UPDATE) continue;
        /* the parameter servers update: a worker's update reads nothing */
        if (emits_param_servers(E) && ir_op_info_of(v->op)->cls == OPC_UPDATE) continue;
        /* a cast its operand's kernel stores: that kernel names it; it reads nothing */
        if (v->op == OP_CAST && (cast_made_by_producer(E, v) || cast_summed_with(E, v) >= 0)) {
            used[i] = 1;
            continue;
        }
        /* one update call over the parameters laid end to end reaches them through ctx */
        if (ir_op_info_of(v->op)->cls == OPC_UPDATE && flat_update_covers(E, v)) continue;
        if (zb && v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE) {
            used[v->operands[0]] = 1;
            continue;
        }
        /* a bucket reduced during the backward pass reads nothing here */
        if (v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE && E->bucket_lead[i] >= 0 &&
            bucket_started_early(E, E->bucket_lead[i]))
            continue;
        /* a kernel storing its cast's copy alone does not name its own buffer */
        used[i] = v->type.dtype != DT_VOID && !cg_stores_copy_alone(E, v);
        for (int k = 0; k < v->n_operands; k++)
            if (reads_local(E, v, k)) used[v->operands[k]] = 1;
    }
    /* the buckets started in this pass: their partials and gradients */
    for (int i = 0; phase == PHASE_BACKWARD && i < g->n_values; i++)
        if (E->bucket_lead[i] >= 0 && bucket_started_early(E, E->bucket_lead[i])) used[i] = used[V(E, i)->operands[0]] = 1;
    for (int i = 0; i < g->n_values; i++)
        if (received(E, i, phase, stage)) used[i] = *any = 1;
    /* the micro-batch's gradients, summed; its loss and outputs, kept */
    int sums = micro && phase == PHASE_BACKWARD && g->microbatches > 1 && g->grads;
    for (int p = 0; sums && p < g->n_params; p++) /* (one made in its sum: by its op, or its pieces') */
        if (V(E, g->params[p])->stage == stage && !made_in_sum(E, dm_micro_grad(E->g, p))) used[dm_micro_grad(E->g, p)] = *any = 1;
    /* parameters tied across stages: the owner's update goes to the other holders' copies
     * (with model chunks, after the rank's updates: emit_rank_update; pipedream's holders
     * receive before a forward, not in their update) */
    int holders_receive = !(dm_runs_pipedream(g) && emits_2bw(E));
    for (int p = 0; phase == PHASE_UPDATE && stage >= 0 && E->chunks == 1 && p < g->n_params; p++) {
        uint64_t holders = tied_holders(E, p);
        int owner = V(E, g->params[p])->stage == stage;
        if (holders && (owner || (holders_receive && (holders >> stage & 1)))) used[g->params[p]] = *any = 1;
    }
    int keeps = micro && phase == PHASE_FORWARD && !E->creating;
    if (keeps && g->loss >= 0 && V(E, g->loss)->stage == stage) used[g->loss] = 1;
    for (int i = 0; keeps && i < g->n_outputs; i++)
        if (V(E, g->outputs[i])->stage == stage) used[g->outputs[i]] = 1;
}

/* A stage's function names the arena (arena), and under micro-batches in flight its
 * micro-batch's copy of the values the backward pass reads (kept). */
static void declare_stage_arena(emitter *E, int stage, int micro, const char *used) {
    int uses_arena = 0;
    for (int i = 0; i < E->g->n_values; i++) /* (outside a micro-batch, summed partials are in ctx->grad_sum) */
        if (used[i] && E->plan->region[i] == REGION_ARENA && (micro || !E->summed || E->summed[i] < 0)) uses_arena = 1;
    if (stage < 0 || !uses_arena) return;
    cg_line(&E->w, "float *arena = ctx->arena;");
    E->arena_var = "arena";
    /* (a stage whose backward reads none of its forward's values keeps nothing) */
    if (micro && E->slots[stage] > 1 && stage_kept_stride(E, stage) > 0) {
        cg_line(&E->w, "/* this micro-batch's copy of the values the backward pass reads: arena from %lld on */",
                (long long)stage_kept_from(E, stage));
        if (emits_2bw(E)) /* by the micro-batch's place in the stream: steps overlap */
            cg_line(&E->w, "float *kept = arena + kept_slot(ctx, micro, stage_slots[%d]) * %lld;", stage,
                    (long long)stage_kept_stride(E, stage));
        else
            cg_line(&E->w, "float *kept = arena + (micro %% stage_slots[%d]) * %lld;", stage,
                    (long long)stage_kept_stride(E, stage));
        /* (kept reads arena: a stage whose values are all kept ones uses it so, which nvcc
         * counts, where it warns of a variable set and never used despite a (void)) */
        E->kept_var = "kept";
    }
}

/* A stage's forward keeps its micro-batch's loss (summed into the step's) and outputs. */
static void emit_micro_results(emitter *E, int stage) {
    const ir_graph *g = E->g;
    if (g->loss >= 0 && V(E, g->loss)->stage == stage) {
        cg_blank(&E->w);
        cg_line(&E->w, "/* the step's loss: the mean of its micro-batches' (predict computes none) */");
        cg_line(&E->w, "if (!ctx->predicting) {");
        E->w.indent++;
        cg_line(&E->w, "float micro_loss;");
        cg_copy_elems(E, "&micro_loss", E->cname[g->loss], 1, "float", CG_DEVICE_TO_HOST);
        cg_line(&E->w, "ctx->loss_sum = (micro == 0 ? 0.0 : ctx->loss_sum) + (double)micro_loss;");
        E->w.indent--;
        cg_line(&E->w, "}");
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int o = g->outputs[i];
        if (V(E, o)->stage != stage) continue;
        long long n = (long long)ir_numel(T(E, o));
        char dst[160];
        snprintf(dst, sizeof dst, "ctx->output_%s + micro * %lld", E->cname[o], n);
        cg_line(&E->w, "/* the step's output, by micro-batch */");
        cg_copy_elems(E, dst, E->cname[o], n, ctype(V(E, o)->type.dtype), CG_DEVICE_TO_DEVICE);
    }
}

/* One phase as a function. stage < 0: every op (one step at once); else the ops of that
 * pipeline stage, for one micro-batch `micro` (forward and backward). */
void emit_phase(emitter *E, ir_phase phase, int stage, const char *fn, const char *what) {
    const ir_graph *g = E->g;
    char *used = calloc((size_t)g->n_values + 1, 1);
    if (!used) abort();
    int any = 0, uses_batch = 0, micro = stage >= 0 && phase != PHASE_UPDATE;
    phase_buffers(E, phase, stage, used, &any);
    int sums = micro && phase == PHASE_BACKWARD && g->microbatches > 1 && g->grads;
    int keeps = micro && phase == PHASE_FORWARD && !E->creating;
    for (int i = 0; i < g->n_values; i++)
        if (used[i] && has_storage(E, i) && E->plan->region[i] == REGION_INPUT && !E->dialect->separate_memory)
            uses_batch = 1; /* else the kernels read the batch's copy in the context */
    cg_line(&E->w, "/* %s */", what);
    if (micro)
        cg_line(&E->w, "static int %s(struct_ctx *ctx, const %s_batch *batch, int64_t micro) {", fn, g->model);
    else if (phase == PHASE_UPDATE && E->update_half == 1) /* (emit_chunk_squares; emit_rank_compress_check) */
        cg_line(&E->w, "static int %s(struct_ctx *ctx, const %s_batch *batch, double *rank_squares%s) {", fn, g->model,
                cg_compress_checks_scaled(E) ? ", float compress_not_finite" : "");
    else if (phase == PHASE_UPDATE && E->update_half == 2 && g->optimizer.clip > 0) /* (emit_chunk_clip) */
        cg_line(&E->w, "static int %s(struct_ctx *ctx, const %s_batch *batch, float clip_scale) {", fn, g->model);
    else
        cg_line(&E->w, "static int %s(struct_ctx *ctx, const %s_batch *batch) {", fn, g->model);
    E->w.indent++;
    E->in_micro = micro;
    E->phase_faults = 0;
    E->cur_stage = stage;
    if (!uses_batch) cg_line(&E->w, "(void)batch;");
    if (!any) cg_line(&E->w, "(void)ctx;");
    int traced = micro && E->partitioned && !E->creating;
    declare_stage_arena(E, stage, micro, used);
    if (micro) cg_line(&E->w, "(void)micro;");
    declare_buffers(E, used);
    for (int i = 0; i < g->n_values; i++) {
        if (!received(E, i, phase, stage)) continue;
        if (!predict_runs(E, i)) cg_line(&E->w, "if (!ctx->predicting) { /* only the loss needs it */"), E->w.indent++;
        emit_transfer(E, i, V(E, i)->stage, 0);
        if (!predict_runs(E, i)) E->w.indent--, cg_line(&E->w, "}");
    }
    /* the action starts when its inputs are here: waiting for them is the bubble */
    if (traced) cg_line(&E->w, "const double trace_start = dmrt_trace_now(ctx->rank);");
    /* a micro-batch's gradient is added to the step's sum where it is computed: its buffer
     * is free again from there (passes/memory.c plans it so) */
    int *sum_after = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!sum_after) abort();
    for (int i = 0; i < g->n_values; i++) sum_after[i] = -1;
    for (int p = 0; sums && p < g->n_params; p++)
        if (V(E, g->params[p])->stage == stage) sum_after[dm_micro_grad(E->g, p)] = p;
    outline_phase_begin(E, used);
    emit_phase_ops(E, phase, stage, sum_after);
    outline_phase_end(E);
    if (phase == PHASE_BACKWARD) emit_bucket_waits(E);
    if (phase == PHASE_UPDATE) emit_ps_exchange(E);
    /* (pipedream: a holder receives before its next forward, emit_tied_receives) */
    if (phase == PHASE_UPDATE && stage >= 0 && E->chunks == 1)
        emit_tied_updates(E, stage, TIED_SENDS | (dm_runs_pipedream(g) && emits_2bw(E) ? 0 : TIED_RECEIVES));
    if (E->phase_faults && !emits_step_end(E)) E->dialect->fault_check(&E->w, 1); /* else finish_step's */
    for (int i = 0; i < g->n_values; i++) /* gradients not computed by this pass's ops */
        if (sum_after[i] >= 0) emit_micro_grad_sum(E, sum_after[i]);
    free(sum_after);
    if (keeps) emit_micro_results(E, stage);
    if (traced && E->chunks > 1)
        cg_line(&E->w, "dmrt_trace_chunk_action(ctx->rank, '%c', micro, %d, trace_start);", phase == PHASE_FORWARD ? 'F' : 'B',
                stage / E->ranks);
    else if (traced)
        cg_line(&E->w, "dmrt_trace_action(ctx->rank, '%c', micro, trace_start);", phase == PHASE_FORWARD ? 'F' : 'B');
    cg_line(&E->w, "return DMRT_OK;");
    E->w.indent--;
    cg_line(&E->w, "}");
    cg_blank(&E->w);
    E->arena_var = "ctx->arena";
    E->kept_var = NULL;
    E->in_micro = 0;
    E->cur_stage = -1;
    free(used);
}

/* Whether pipeline stage st (every stage when st < 0) makes values at create. */
static int makes_constants(const emitter *E, int st) {
    for (int i = 0; i < E->g->n_values; i++)
        if (dm_made_at_create(E->plan, i) && (st < 0 || V(E, i)->stage == st)) return 1;
    return 0;
}

/* The values made once at create (passes/hoist_constants.c: computed from numbers alone,
 * the same in every step): one function (make_constants; with micro-batches or stages,
 * stage%d_constants per stage making any) whose ops the step's functions leave out. */
void emit_constants(emitter *E) {
    char fn[64], what[512];
    int n = 0, shown = 0, tables = 0;
    char *read = dm_read_by_steps(E->g, E->plan);
    int at = snprintf(what, sizeof what, "Made once, by create: the values that depend on no input, parameter or random\n"
                                         " * draw, which the steps only read");
    for (int i = 0; i < E->g->n_values; i++) {
        const ir_value *v = V(E, i);
        n += dm_made_at_create(E->plan, i);
        if (!read[i]) continue;
        tables++;
        if (v->name && shown < 3 && at < 400)
            at += snprintf(what + at, sizeof what - (size_t)at, "%s %s (line %d)", shown++ ? "," : ":", v->name, v->loc.line);
    }
    free(read);
    if (!n) return;
    snprintf(what + at, sizeof what - (size_t)at, "%s (%d tables, %d ops).", tables > shown ? ", ..." : "", tables, n);
    E->creating = 1;
    for (int st = 0; E->scheduled && st < E->stages; st++) {
        if (!makes_constants(E, st)) continue;
        snprintf(fn, sizeof fn, "stage%d_constants", st);
        emit_phase(E, PHASE_FORWARD, st, fn, what);
    }
    if (!E->scheduled) emit_phase(E, PHASE_FORWARD, -1, "make_constants", what);
    E->creating = 0;
}

/* In create: the calls of emit_constants's functions (this rank's stages'), each into
 * every copy of the arena a stage holds (micro-batches in flight), failing to `fail`. */
void emit_constants_call(emitter *E) {
    if (!makes_constants(E, -1)) return;
    if (!E->scheduled) {
        cg_line(&E->w, "if (make_constants(ctx, NULL) != DMRT_OK) goto fail;");
        return;
    }
    for (int st = 0; st < E->stages; st++) {
        if (!makes_constants(E, st)) continue;
        char call[128];
        snprintf(call, sizeof call, "stage%d_constants(ctx, NULL, slot) != DMRT_OK", st);
        if (E->stages > 1) cg_line(&E->w, "if (ctx->coord[PIPELINE_AXIS] == %d)", rank_of(E, st));
        cg_line(&E->w, "%sfor (int64_t slot = 0; slot < %d; slot++)", E->stages > 1 ? "    " : "", E->slots[st]);
        cg_line(&E->w, "%s    if (%s) goto fail;", E->stages > 1 ? "    " : "", call);
    }
}

/* Interleaved fp16 or clipping: each chunk's update is two functions, the rank's update
 * deciding between them, once for all its chunks, whether to skip the step (fp16) or by
 * what to scale the gradients (clipping) (emit_clip.c, emit_chunk_squares says why). */
static int splits_update(const emitter *E) { return E->chunks > 1 && (E->g->loss_scale > 0 || E->g->optimizer.clip > 0); }

/* Stage st's functions: forward and backward of one micro-batch, its update. */
static void emit_stage_functions(emitter *E, int st) {
    const ir_graph *g = E->g;
    char fn[64], what[256];
    int first = -1, last = -1;
    for (int i = 0; i < g->n_values; i++)
        if (V(E, i)->phase == PHASE_FORWARD && V(E, i)->stage == st && ir_op_info_of(V(E, i)->op)->cls != OPC_SOURCE) {
            if (first < 0) first = i;
            last = i;
        }
    snprintf(fn, sizeof fn, "stage%d_forward", st);
    snprintf(what, sizeof what, "Stage %d's forward pass of micro-batch `micro` (%s lines %d to %d).", st, E->source_path,
             first >= 0 ? V(E, first)->loc.line : 0, last >= 0 ? V(E, last)->loc.line : 0);
    emit_phase(E, PHASE_FORWARD, st, fn, what);
    if (!(g->loss >= 0 && g->grads)) return;
    snprintf(fn, sizeof fn, "stage%d_backward", st);
    snprintf(what, sizeof what, "Stage %d's backward pass of micro-batch `micro`.", st);
    emit_phase(E, PHASE_BACKWARD, st, fn, what);
    if (g->optimizer.kind == OPTIM_NONE) return;
    if (splits_update(E)) { /* fp16's one decision for a rank's chunks between the halves */
        snprintf(fn, sizeof fn, "stage%d_reduce", st);
        snprintf(what, sizeof what, "Stage %d's gradients reduced, and their squares added to *rank_squares (%s: rank%d_update\n"
                 " * decides for all its chunks).", st, g->loss_scale > 0 ? "fp16's check" : "clipping's norm", rank_of(E, st));
        E->update_half = 1;
        emit_phase(E, PHASE_UPDATE, st, fn, what);
        snprintf(fn, sizeof fn, "stage%d_update", st);
        if (g->loss_scale > 0)
            snprintf(what, sizeof what, "Stage %d's optimizer update: its gradients unscaled, then its parameters (rank%d_update\n"
                     " * calls it when no chunk's gradients overflowed; ctx->step already counts it).", st, rank_of(E, st));
        else
            snprintf(what, sizeof what, "Stage %d's optimizer update: its gradients clipped by clip_scale, which rank%d_update\n"
                     " * computed over every chunk's, then its parameters (ctx->step already counts it).", st, rank_of(E, st));
        E->update_half = 2;
        emit_phase(E, PHASE_UPDATE, st, fn, what);
        E->update_half = 0;
        return;
    }
    snprintf(fn, sizeof fn, "stage%d_update", st);
    snprintf(what, sizeof what, "Stage %d's optimizer update of its parameters (ctx->step already counts it).", st);
    emit_phase(E, PHASE_UPDATE, st, fn, what);
}

/* After the step's micro-batches, before their means: each tied partial's sum that stage
 * st made, to its parameter's owner (TIED_SENDS); on the owner st, each sum received into
 * the buffer of the micro-batch gradient (free once summed) and added to the step's sum of
 * the gradient, before the mean, the reductions, clipping or the loss scaler read it
 * (TIED_RECEIVES). Sends are buffered: a rank sends its sums before it receives. */
static void emit_tied_partial_sums(emitter *E, int st, int which) {
    const ir_graph *g = E->g;
    const dm_memory_plan *P = E->plan;
    for (int i = 0; P->partial_sum_offset && i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (!v->tied_partial_of || P->partial_sum_offset[i] < 0) continue;
        int p = v->tied_partial_of - 1, owner = V(E, g->params[p])->stage;
        const char *name = V(E, g->params[p])->name;
        long long n = (long long)ir_numel(T(E, i));
        char call[160], sum[96], part[128];
        if (which == TIED_SENDS && v->stage == st) {
            cg_line(&E->w, "/* %s's partial gradient from stage %d (%s:%d), summed over the micro-batches, to stage %d */",
                    name, st, E->source_path, v->loc.line, owner);
            snprintf(sum, sizeof sum, "ctx->grad_sum + %lld", (long long)P->partial_sum_offset[i]);
            p2p_call_on(E, "send", owner, tied_sum_channel(owner, st), 0, call, sizeof call);
            cg_line(&E->w, "if (%s, %s, %lld, \"micro-batches' sum of %s's partial gradient to stage %d\") != 0)", call, sum, n,
                    name, owner);
            cg_line(&E->w, "    return comm_failed(ctx);");
        }
        if (which == TIED_RECEIVES && owner == st) {
            int saved_micro = E->in_micro, saved_stage = E->cur_stage;
            E->in_micro = 1, E->cur_stage = st; /* the micro-batch gradient's own buffer, not its sum */
            cg_storage_expr(E, dm_micro_grad(g, p), part, sizeof part);
            E->in_micro = saved_micro, E->cur_stage = saved_stage;
            cg_line(&E->w, "/* %s: stage %d's partial gradient summed over the micro-batches (%s:%d), added to the step's */",
                    name, v->stage, E->source_path, v->loc.line);
            p2p_call_on(E, "recv", v->stage, tied_sum_channel(st, v->stage), 0, call, sizeof call);
            cg_line(&E->w, "if (%s, %s, %lld, \"micro-batches' sum of %s's partial gradient from stage %d\") != 0)", call, part, n,
                    name, v->stage);
            cg_line(&E->w, "    return comm_failed(ctx);");
            snprintf(sum, sizeof sum, "(ctx->grad_sum + %lld)", (long long)dm_grad_sum_offset(P, g->grads[p]));
            char from[140];
            snprintf(from, sizeof from, "(%s)", part);
            emit_accumulate(E, sum, from, n);
        }
    }
}

/* Stage st's gradients from ctx->grad_sum, divided by `divisor`, into where the update reads
 * them (with a data axis, the sums themselves: then a divisor of 1 has nothing to do). */
static void emit_summed_gradients(emitter *E, int st, int *any, int divisor, const char *title) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int M = g->microbatches;
    char mean[64];
    E->cur_stage = st; /* the mean goes where this stage keeps the gradient */
    if (divisor > 1) snprintf(mean, sizeof mean, "x * (1.0f / %d.0f)", divisor);
    else snprintf(mean, sizeof mean, "x");
    for (int p = 0; M > 1 && p < g->n_params; p++)
        if (V(E, g->params[p])->stage == st) {
            if (!*any) cg_line(w, "/* %s */", title);
            *any = 1;
            char where[128], grad[140], sum[96];
            cg_storage_expr(E, dm_micro_grad(E->g, p), where, sizeof where);
            snprintf(grad, sizeof grad, "(%s)", where);
            snprintf(sum, sizeof sum, "(ctx->grad_sum + %lld)", (long long)dm_grad_sum_offset(E->plan, g->grads[p]));
            long long n = (long long)ir_numel(T(E, g->grads[p]));
            if (divisor == 1 && strcmp(grad, sum) == 0) continue;
            cg_line(w, "/* %s */", V(E, g->params[p])->name);
            cg_loop_nest k = {.rank = 1, .size = {n}, .n_in = 1, .var = {"x"}, .buffer = {sum}, .stride = {{1}},
                              .out = grad, .out_stride = {1}, .out_elems = n, .expr = mean};
            E->dialect->loop_nest(w, &k);
        }
    E->cur_stage = -1;
}

void emit_gradient_means(emitter *E, int st, int *any) {
    /* each micro-batch's loss is a mean over its rows, the step's over all */
    emit_summed_gradients(E, st, any, E->g->microbatches, "the step's gradients: the mean of the micro-batches'");
}

void emit_micro_gradients(emitter *E, int st) {
    int any = 0;
    emit_summed_gradients(E, st, &any, 1, "the micro-batch's gradients");
}

/* Stage st's step (one stage per rank): its forward pass of every micro-batch in order
 * (inference), and its actions in the schedule's order as straight-line code: the grid of
 * --explain, row st. */
static void emit_stage_schedule(emitter *E, int st) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int M = g->microbatches;
    cg_line(w, "/* Stage %d's forward pass of the step's %d micro-batch%s. */", st, M, M == 1 ? "" : "es");
    cg_line(w, "static int stage%d_infer(struct_ctx *ctx, const %s_batch *batch) {", st, g->model);
    if (emits_2bw(E)) {
        cg_line(w, "    int status = DMRT_OK;");
        cg_line(w, "    ctx->inferring = 1; /* the kept values of the micro-batches this stage owes stay */");
        cg_line(w, "    for (int64_t micro = 0; micro < %d && status == DMRT_OK; micro++)", M);
        cg_line(w, "        status = stage%d_forward(ctx, batch, micro);", st);
        cg_line(w, "    ctx->inferring = 0;");
        cg_line(w, "    return status;");
    } else {
        cg_line(w, "    for (int64_t micro = 0; micro < %d; micro++) {", M);
        cg_line(w, "        int status = stage%d_forward(ctx, batch, micro);", st);
        cg_line(w, "        if (status != DMRT_OK) return status;");
        cg_line(w, "    }");
        cg_line(w, "    return DMRT_OK;");
    }
    cg_line(w, "}");
    cg_blank(w);
    if (!(g->loss >= 0 && g->grads)) return;
    if (emits_2bw(E)) {
        emit_2bw_stage(E, st);
        return;
    }
    cg_line(w, "/* Stage %d's forward and backward passes of the step: %s, %d stage%s, %d micro-batch%s; dmc --explain",
            st, E->stages > 1 ? pipe_kind_name(E->sched->kind) : "accumulation", E->stages, E->stages == 1 ? "" : "s", M,
            M == 1 ? "" : "es");
    cg_line(w, " * draws every stage's actions as a grid. */");
    cg_line(w, "static int stage%d_train(struct_ctx *ctx, const %s_batch *batch) {", st, g->model);
    w->indent++;
    cg_line(w, "int status;");
    for (int i = 0; i < 2 * M; i++) {
        const pipe_action *a = pipe_action_at(E->sched, st, i);
        cg_line(w, "if ((status = stage%d_%s(ctx, batch, %d)) != DMRT_OK) return status;", st,
                a->kind == 'F' ? "forward" : "backward", a->micro);
    }
    emit_tied_partial_sums(E, st, TIED_SENDS);
    emit_tied_partial_sums(E, st, TIED_RECEIVES);
    int any = 0;
    emit_gradient_means(E, st, &any);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* Interleaved: the step of the ranks at pipeline coordinate r, which hold stages r, r + P,
 * ... (their chunks a, b, ...). Inference runs each chunk's micro-batches in order, chunk
 * after chunk (sends are buffered: a chunk's forwards never wait on a later one's); the
 * step runs the rank's row of the schedule; the update each chunk's, then the tied
 * parameters' new values: the rank's sends, then its receives, so that no rank waits on
 * another before its own are out. */
static void emit_rank_schedule(emitter *E, int r) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int M = g->microbatches, P = E->ranks;
    cg_line(w, "/* The forward pass of the step's %d micro-batch%s on pipeline rank %d: its chunks' stages", M,
            M == 1 ? "" : "es", r);
    cg_line(w, " * one after the other. */");
    cg_line(w, "static int rank%d_infer(struct_ctx *ctx, const %s_batch *batch) {", r, g->model);
    w->indent++;
    for (int st = r; st < E->stages; st += P) {
        cg_line(w, "for (int64_t micro = 0; micro < %d; micro++) {", M);
        cg_line(w, "    int status = stage%d_forward(ctx, batch, micro);", st);
        cg_line(w, "    if (status != DMRT_OK) return status;");
        cg_line(w, "}");
    }
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    if (!(g->loss >= 0 && g->grads)) return;
    cg_line(w, "/* Pipeline rank %d's forward and backward passes of the step: interleaved 1F1B, %d stages x %d", r, P,
            E->chunks);
    cg_line(w, " * chunks, %d micro-batch%s; its chunks are stages %d + %d c. dmc --explain draws every rank's", M,
            M == 1 ? "" : "es", r, P);
    cg_line(w, " * actions as a grid (chunk c a letter). */");
    cg_line(w, "static int rank%d_train(struct_ctx *ctx, const %s_batch *batch) {", r, g->model);
    w->indent++;
    cg_line(w, "int status;");
    for (int i = 0; i < pipe_actions(E->sched); i++) {
        const pipe_action *a = pipe_action_at(E->sched, r, i);
        cg_line(w, "if ((status = stage%d_%s(ctx, batch, %d)) != DMRT_OK) return status; /* %c%d%c */", a->chunk * P + r,
                a->kind == 'F' ? "forward" : "backward", a->micro, a->kind, a->micro, 'a' + a->chunk);
    }
    for (int which = TIED_SENDS; which <= TIED_RECEIVES; which++)
        for (int st = r; st < E->stages; st += P) emit_tied_partial_sums(E, st, which);
    int any = 0;
    for (int st = r; st < E->stages; st += P) emit_gradient_means(E, st, &any);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    if (g->optimizer.kind == OPTIM_NONE) return;
    cg_line(w, "/* Pipeline rank %d's optimizer update: its chunks' stages, then the tied parameters. */", r);
    cg_line(w, "static int rank%d_update(struct_ctx *ctx, const %s_batch *batch) {", r, g->model);
    w->indent++;
    cg_line(w, "int status;");
    if (splits_update(E)) {
        if (cg_compress_checks_scaled(E)) emit_rank_compress_check(E, r);
        cg_line(w, "double rank_squares = 0.0; /* the squares of every chunk's gradients (NaN or inf: some element is not finite) */");
        for (int st = r; st < E->stages; st += P)
            cg_line(w, "if ((status = stage%d_reduce(ctx, batch, &rank_squares%s)) != DMRT_OK) return status;", st,
                    cg_compress_checks_scaled(E) ? ", compress_not_finite" : "");
        if (g->loss_scale > 0) emit_rank_loss_skip(E);
        if (g->optimizer.clip > 0) emit_rank_clip(E);
    }
    for (int st = r; st < E->stages; st += P)
        cg_line(w, "if ((status = stage%d_update(ctx, batch%s)) != DMRT_OK) return status;", st,
                splits_update(E) && g->optimizer.clip > 0 ? ", clip_scale" : "");
    if (splits_update(E) && g->loss_scale > 0) emit_rank_loss_clean(E);
    for (int which = TIED_SENDS; which <= TIED_RECEIVES; which++)
        for (int st = r; st < E->stages; st += P) {
            E->cur_stage = st;
            emit_tied_updates(E, st, which);
        }
    E->cur_stage = -1;
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* Every stage's functions, then each rank's step: its stage's schedule, or interleaved its
 * chunks' (the function names the dispatch uses: stage%d_ or rank%d_). */
void emit_stages(emitter *E) {
    cg_writer *w = &E->w;
    int copies = E->stages == 1; /* the arena's allocation reads the table; stages' kept values */
    for (int st = 0; st < E->stages; st++) copies |= E->slots[st] > 1;
    if (copies) {
        cg_line(w, "/* Micro-batches whose temporaries each stage holds at once (%s): a copy each of %s. */",
                E->stages > 1 ? pipe_kind_name(E->sched->kind) : "one after the other",
                E->stages > 1 ? "the values the backward pass reads" : "the arena");
        cg_line(w, "static const int stage_slots[%d] = {", E->stages);
        for (int st = 0; st < E->stages; st++) cg_line(w, "    %d,", E->slots[st]);
        cg_line(w, "};");
        cg_blank(w);
    }
    emit_2bw_helpers(E);
    for (int st = 0; st < E->stages; st++) {
        emit_stage_functions(E, st);
        if (E->chunks == 1) emit_stage_schedule(E, st);
    }
    for (int r = 0; E->chunks > 1 && r < E->ranks; r++) emit_rank_schedule(E, r);
}
