/* emit_descriptor.c: the dmrt_model descriptor that generic tools (the trainer, weights
 * files, checkpoints) read: the tensors' tables and the descriptor itself. */
#include <ctype.h>
#include <string.h>

#include "emitter.h"
#include "hardware.h"

/* A tensor as files and tools see it: a parameter in its stored shape. */
void emit_tensor_desc(emitter *E, const ir_value *v, const char *name) {
    char dims[256] = "";
    size_t n = 0;
    int rank = v->stored_rank ? v->stored_rank : v->type.rank;
    const int64_t *shape = v->stored_rank ? v->stored_shape : v->type.shape;
    /* a step's inputs and outputs hold every micro-batch */
    int64_t micro = v->op != OP_PARAM && E->g->microbatches > 1 ? E->g->microbatches : 1;
    for (int d = 0; d < rank; d++) {
        int k = snprintf(dims + n, sizeof dims - n, "%s%lld", d ? ", " : "", (long long)(shape[d] * (d ? 1 : micro)));
        if (k > 0) n += (size_t)k;
    }
    cg_line(&E->w, "{\"%s\", %s, %d, {%s}, %lld},", name, v->type.dtype == DT_I32 ? "DMRT_I32" : "DMRT_F32", rank,
            rank ? dims : "0", (long long)(ir_numel(&v->type) * micro));
}

static void emit_desc_table(emitter *E, const char *name, const int *ids, int n) {
    cg_writer *w = &E->w;
    cg_line(w, "static const dmrt_tensor_desc %s[%d] = {", name, n ? n : 1);
    w->indent++;
    for (int i = 0; i < n; i++) emit_tensor_desc(E, V(E, ids[i]), V(E, ids[i])->name);
    if (!n) cg_line(w, "{\"\", DMRT_F32, 0, {0}, 0},");
    w->indent--;
    cg_line(w, "};");
}

/* Tensors as tools see them, and where each parameter and gradient lives. */
void emit_descs(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    emit_desc_table(E, "input_descs", g->inputs, g->n_inputs);
    emit_desc_table(E, "param_descs", g->params, g->n_params);
    emit_desc_table(E, "output_descs", g->outputs, g->n_outputs);
    /* by pipeline coordinate: interleaved, a rank holds several stages */
    int S = E->plan->stages > 1 ? E->plan->ranks : 1, np = g->n_params ? g->n_params : 1;
    for (int grad = 0; grad < 2; grad++) {
        if (grad && !(g->loss >= 0 && g->grads)) break;
        if (!grad)
            cg_line(w, "/* Offset of each parameter in ctx->params (its gradient's in ctx->grads, below)%s. */",
                    S > 1 ? ", by\n * pipeline stage: a stage's ranks hold only its own parameters (and copies of tied\n"
                            " * ones), and gradients of the parameters they update (-1: not held)" : "");
        cg_line(w, "static const int64_t stage_%s_offsets[%d][%d] = {", grad ? "grad" : "param", S, np);
        for (int s = 0; s < S; s++) {
            char row[8192];
            size_t n = 0;
            for (int p = 0; p < g->n_params && n + 32 < sizeof row; p++) {
                /* a gradient has no copies: it is held by the stage updating it only */
                int id = grad ? g->grads[p] : g->params[p];
                long long off = (long long)(S == 1 ? dm_offset_on(E->plan, g, id, -1) : dm_offset_on_rank(E->plan, g, id, s));
                n += (size_t)snprintf(row + n, sizeof row - n, "%s%lld", p ? ", " : "", off);
            }
            if (!g->n_params) snprintf(row, sizeof row, "0");
            cg_line(w, "    {%s},", row);
        }
        cg_line(w, "};");
    }
    if (S > 1) {
        cg_line(w, "/* Elements of each stage's regions: parameters, gradients, optimizer state, the");
        cg_line(w, " * temporaries of its micro-batches in flight, and the micro-batches' gradient sum. */");
        cg_line(w, "static const int64_t stage_elems[%d][5] = {", S);
        for (int s = 0; s < S; s++) {
            const dm_stage_memory *m = dm_rank_memory(E->plan, s);
            cg_line(w, "    {%lld, %lld, %lld, %lld, %lld}, /* stage %d */", (long long)m->param_elems, (long long)m->grad_elems,
                    (long long)m->state_elems, (long long)m->held_elems, (long long)dm_grad_sum_elems(E->plan, s), s);
        }
        cg_line(w, "};");
    }
    cg_blank(w);
}

/* The descriptor's functions: the model's, called through void pointers. */
static void emit_model_wrappers(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    int trains = g->loss >= 0 && g->grads, copies = E->partitioned || E->dialect->separate_memory || E->n_narrow_only;
    if (E->partitioned) {
        cg_line(w, "static void *model_create_rank(uint64_t seed, dmrt_rank *rank, char *err, size_t errlen) {");
        cg_line(w, "    return %s_create_rank(seed, rank, err, errlen);", m);
        cg_line(w, "}");
        cg_line(w, "static int model_rank_id(void *ctx) { return dmrt_rank_id(((struct_ctx *)ctx)->rank); }");
    } else {
        cg_line(w, "static void *model_create(uint64_t seed, char *err, size_t errlen) {");
        cg_line(w, "    return %s_create(seed, err, errlen);", m);
        cg_line(w, "}");
        cg_line(w, "static void *model_create_beside(uint64_t seed, dmrt_rank *beside, char *err, size_t errlen) {");
        cg_line(w, "    return %s_create_beside(seed, beside, err, errlen);", m);
        cg_line(w, "}");
    }
    if (copies) {
        cg_line(w, "static int model_gather(void *ctx, int i, int grad, float *whole) {");
        cg_line(w, "    return gather_param((struct_ctx *)ctx, i, grad, whole);");
        cg_line(w, "}");
        cg_line(w, "static int model_scatter(void *ctx, int i, const float *whole) {");
        cg_line(w, "    return scatter_param((struct_ctx *)ctx, i, whole);");
        cg_line(w, "}");
    }
    cg_line(w, "static void model_destroy(void *ctx) { %s_destroy((struct_ctx *)ctx); }", m);
    cg_line(w, "/* Parameter i's storage on this rank (NULL: another pipeline stage's), and its gradient's. */");
    cg_line(w, "static void *model_param(void *ctx, int i) {");
    cg_line(w, "    struct_ctx *c = (struct_ctx *)ctx;");
    cg_line(w, "    return c->param_offsets[i] < 0 ? NULL : c->params + c->param_offsets[i];");
    cg_line(w, "}");
    if (trains) {
        cg_line(w, "static void *model_grad(void *ctx, int i) {");
        cg_line(w, "    struct_ctx *c = (struct_ctx *)ctx;");
        cg_line(w, "    return c->grad_offsets[i] < 0 ? NULL : c->grads + c->grad_offsets[i];");
        cg_line(w, "}");
    }
    else
        cg_line(w, "static void *model_grad(void *ctx, int i) { (void)ctx; (void)i; return NULL; }");
    cg_line(w, "static %s_batch batch_of(const void *const *inputs) {", m);
    cg_line(w, "    %s_batch batch;", m);
    cg_line(w, "    memset(&batch, 0, sizeof batch);");
    if (!g->n_inputs) cg_line(w, "    (void)inputs;");
    for (int i = 0; i < g->n_inputs; i++)
        cg_line(w, "    batch.%s = (const %s *)inputs[%d];", E->cname[g->inputs[i]], ctype(V(E, g->inputs[i])->type.dtype), i);
    cg_line(w, "    return batch;");
    cg_line(w, "}");
    cg_line(w, "static int model_forward(void *ctx, const void *const *inputs, float *loss) {");
    cg_line(w, "    %s_batch batch = batch_of(inputs);", m);
    cg_line(w, "    return %s_forward((struct_ctx *)ctx, &batch, loss);", m);
    cg_line(w, "}");
    cg_line(w, "static int model_train_step(void *ctx, const void *const *inputs, float *loss) {");
    cg_line(w, "    %s_batch batch = batch_of(inputs);", m);
    cg_line(w, "    return %s_train_step((struct_ctx *)ctx, &batch, loss);", m);
    cg_line(w, "}");
    cg_line(w, "static const void *model_output(void *ctx, int i) {");
    if (!g->n_outputs) cg_line(w, "    (void)ctx;");
    cg_line(w, "    switch (i) {");
    for (int i = 0; i < g->n_outputs; i++)
        cg_line(w, "    case %d: return %s_output_%s((struct_ctx *)ctx);", i, m, E->cname[g->outputs[i]]);
    cg_line(w, "    default: return NULL;");
    cg_line(w, "    }");
    cg_line(w, "}");
    emit_predict_wrapper(E);
    emit_quant_accessor(E);
    cg_line(w, "static const char *model_error(void *ctx) { return %s_error((struct_ctx *)ctx); }", m);
    cg_line(w, "static size_t model_memory_peak(void *ctx) {");
    cg_line(w, "    const struct_ctx *c = (const struct_ctx *)ctx;");
    cg_line(w, "    return %s;", E->dialect->memory_peak);
    cg_line(w, "}");
    cg_blank(w);
}

/* dmc --explain's prediction of each stage's forward and backward time (where the plan has
 * one), and into hardware (size bytes) the name of the hardware it is for: from a user's
 * file, so only its plain characters go in the C source. */
static void emit_predicted_times(emitter *E, char *hardware, size_t size) {
    cg_writer *w = &E->w;
    const dm_pipeline_plan *pl = E->predicted;
    hardware[0] = 0;
    if (pl) {
        const char *name = cost_hardware(&pl->cost)->name;
        size_t n = 0;
        for (; *name && n + 1 < size; name++) hardware[n++] = isalnum((unsigned char)*name) || strchr("-_.+ ", *name) ? *name : '?';
        hardware[n] = 0;
        cg_line(w, "/* dmc --explain's prediction for this plan on %s: the step %.6g s */", hardware, pl->step_seconds);
        for (int part = 0; part < 2; part++) {
            cg_line(w, "static const double predicted_%s_seconds[%d] = {", part ? "backward" : "forward", pl->stages);
            for (int k = 0; k < pl->stages; k++)
                cg_line(w, "    %.6g, /* stage %d */", part ? pl->stage[k].backward_seconds : pl->stage[k].forward_seconds, k);
            cg_line(w, "};");
        }
    }
}

/* The dmrt_model descriptor of the generated code, for generic tools; its fields in
 * their declaration order (the file may be compiled as C++). */
void emit_descriptor(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    int copies = E->partitioned || E->dialect->separate_memory || E->n_narrow_only;
    const dm_pipeline_plan *pl = E->predicted;
    char hardware[64];
    emit_model_wrappers(E);
    emit_predicted_times(E, hardware, sizeof hardware);
    cg_line(w, "const dmrt_model %s_model = {", m);
    w->indent++;
    cg_line(w, ".name = \"%s\",", m);
    cg_line(w, ".n_inputs = %d,", g->n_inputs);
    cg_line(w, ".inputs = input_descs,");
    cg_line(w, ".n_params = %d,", g->n_params);
    cg_line(w, ".params = param_descs,");
    cg_line(w, ".n_outputs = %d,", g->n_outputs);
    cg_line(w, ".outputs = output_descs,");
    cg_line(w, ".create = %s,", E->partitioned ? "NULL" : "model_create");
    cg_line(w, ".destroy = model_destroy,");
    cg_line(w, ".param = model_param,");
    cg_line(w, ".grad = model_grad,");
    cg_line(w, ".forward = model_forward,");
    cg_line(w, ".train_step = model_train_step,");
    cg_line(w, ".output = model_output,");
    cg_line(w, ".error = model_error,");
    /* every field named (C++ warns of missing ones) */
    cg_line(w, ".n_ranks = %lld,", E->partitioned ? (long long)ir_mesh_ranks(g) : 1LL);
    cg_line(w, ".n_mesh_axes = %d,", E->partitioned ? g->n_axes : 0);
    cg_line(w, ".mesh_axis_names = %s,", E->partitioned ? "mesh_axis_names" : "NULL");
    cg_line(w, ".mesh_axis_sizes = %s,", E->partitioned ? "mesh_axis_sizes" : "NULL");
    cg_line(w, ".pipeline_chunks = %d,", pl ? pl->chunks : 1);
    cg_line(w, ".create_rank = %s,", E->partitioned ? "model_create_rank" : "NULL");
    cg_line(w, ".gather = %s,", copies ? "model_gather" : "NULL");
    cg_line(w, ".scatter = %s,", copies ? "model_scatter" : "NULL");
    cg_line(w, ".rank_id = %s,", E->partitioned ? "model_rank_id" : "NULL");
    cg_line(w, ".memory_peak = model_memory_peak,");
    cg_line(w, ".predicted_bubble = %.6f,", pl && E->scheduled ? pl->bubble : 0.0);
    cg_line(w, ".predicted_step_seconds = %.6g,", pl ? pl->step_seconds : 0.0);
    cg_line(w, ".predicted_on = \"%s\",", hardware);
    cg_line(w, ".n_predicted_stages = %d,", pl ? pl->stages : 0);
    cg_line(w, ".predicted_forward_seconds = %s,", pl ? "predicted_forward_seconds" : "NULL");
    cg_line(w, ".predicted_backward_seconds = %s,", pl ? "predicted_backward_seconds" : "NULL");
    emit_schedule_descriptor(E);
    emit_predict_fields(E);
    emit_state_descriptor(E);
    cg_line(w, ".drain = %s,", emits_2bw(E) || emits_param_servers(E) ? "model_drain" : "NULL");
    cg_line(w, ".set_threads = model_set_threads,");
    emit_ps_descriptor(E);
    cg_line(w, ".product_dtype = \"%s\",", ir_dtype_name(g->product_dtype));
    cg_line(w, ".loss_scale = %s,", g->loss_scale > 0 ? "model_loss_scale" : "NULL");
    emit_quant_descriptor(E);
    cg_line(w, ".create_beside = %s,", E->partitioned ? "NULL" : "model_create_beside");
    emit_ps_checkpoint_descriptor(E);
    w->indent--;
    cg_line(w, "};");
}
