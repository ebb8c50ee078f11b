/* emit_step_end.c: a serial program's step without host round trips, where the dialect
 * can (CUDA: docs/gpu.md, "What synchronises in a step"). The inputs go up through the
 * context's staging memory without a wait; the kernels, the backward and the update are
 * enqueued one after the other; the step ends with its one wait for the device, which
 * reads the fault record and the loss together (finish_step). A kernel's bad index fails
 * the step there, with the message the phase's own check gave before; the update
 * kernels, enqueued before the host could know, skip on the device while the fault
 * record is set, so the weights and the optimizer state stay as they were. */
#include <stdio.h>

#include "emitter.h"

int64_t emit_upload_elems(const emitter *E, const ir_value *v) {
    return ir_numel(&v->type) * (E->g->microbatches > 1 ? E->g->microbatches : 1);
}

/* Where input i starts in the staging memory: the inputs in order, each at a 256-byte
 * boundary (one micro-batch count of each, as the context's inputs hold). */
static long long upload_offset(const emitter *E, int upto) {
    long long at = 0;
    for (int i = 0; i < upto; i++) {
        const ir_value *v = V(E, E->g->inputs[i]);
        long long bytes = (long long)emit_upload_elems(E, v) * (long long)ir_dtype_bytes(v->type.dtype);
        at += (bytes + 255) / 256 * 256;
    }
    return at;
}

int emits_step_end(const emitter *E) {
    if (!E->dialect->step_end || E->scheduled || E->partitioned) return 0;
    /* host state changed by the update before the end (fp16's loss scale) or weights
     * changed by other than the skipping updates (--prune's masks): the phase checks */
    if (E->g->loss_scale > 0) return 0;
    for (int i = 0; i < E->g->n_values; i++)
        if (V(E, i)->prune_mask) return 0;
    return 1;
}

void emit_upload_reserve(emitter *E) {
    if (!E->dialect->separate_memory || !E->dialect->upload_reserve || E->g->n_inputs == 0) return;
    cg_line(&E->w, "/* pinned host memory the steps' inputs go up through without a wait */");
    E->dialect->upload_reserve(&E->w, upload_offset(E, E->g->n_inputs), "{ (void)device_failed(ctx); goto fail; }");
}

/* In a separate memory: the caller's batch (host memory) to the context's inputs. */
void emit_upload(emitter *E) {
    if (!E->dialect->separate_memory) return;
    for (int i = 0; i < E->g->n_inputs; i++) {
        const ir_value *v = V(E, E->g->inputs[i]);
        char dst[160], src[160], bytes[96];
        snprintf(dst, sizeof dst, "ctx->input_%s", E->cname[v->id]);
        snprintf(src, sizeof src, "batch->%s", E->cname[v->id]);
        long long n = (long long)emit_upload_elems(E, v);
        if (E->dialect->upload) {
            snprintf(bytes, sizeof bytes, "%lld * sizeof(%s)", n, ctype(v->type.dtype));
            E->dialect->upload(&E->w, dst, src, bytes, upload_offset(E, i), E->on_fail);
        } else {
            cg_copy_elems(E, dst, src, n, ctype(v->type.dtype), CG_HOST_TO_DEVICE);
        }
    }
}

void emit_finish_step(emitter *E) {
    if (!emits_step_end(E)) return;
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    char where[128];
    if (g->loss >= 0) cg_storage_expr(E, g->loss, where, sizeof where);
    cg_line(w, "/* The end of a step (forward, train_step, predict): its one wait for the device, which");
    cg_line(w, " * reads the fault record and the loss in one copy. A kernel's bad index fails the step");
    cg_line(w, " * here; the update kernels enqueued before skipped it on the device. */");
    cg_line(w, "static int finish_step(struct_ctx *ctx, float *loss) {");
    w->indent++;
    cg_line(w, "float device_loss;");
    E->dialect->step_end(w, g->loss >= 0 ? where : NULL, "&device_loss", "&ctx->fault");
    if (E->n_faults) cg_line(w, "if (ctx->fault.site) return data_fault(ctx);");
    cg_line(w, "if (loss) *loss = device_loss;%s", g->loss >= 0 ? "" : " /* the model declares no loss: 0 */");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* A serial program's <model>_forward up to its forward pass (status), left open. */
void emit_open_serial_forward(emitter *E) {
    const char *m = E->g->model;
    cg_line(&E->w, "int %s_forward(%s_ctx *ctx, const %s_batch *batch, float *loss) {", m, m, m);
    E->w.indent++;
    cg_line(&E->w, "ctx->error[0] = 0;");
    emit_quant_ready_check(E);
    emit_upload(E);
    cg_line(&E->w, "int status = run_forward(ctx, batch);");
}

/* <model>_forward and <model>_train_step of a program whose step ends in finish_step. */
void emit_serial_api_step_end(emitter *E, int (*open_train_step)(emitter *)) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    emit_open_serial_forward(E);
    cg_line(w, "if (status != DMRT_OK) return status;");
    cg_line(w, "return finish_step(ctx, loss);");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    if (open_train_step(E)) {
        cg_line(w, "ctx->error[0] = 0;");
        emit_upload(E);
        if (E->dropout) cg_line(w, "ctx->training = 1; /* dropout draws its masks */");
        cg_line(w, "int status = run_forward(ctx, batch);");
        if (E->dropout) cg_line(w, "ctx->training = 0;");
        cg_line(w, "if (status == DMRT_OK) status = run_backward(ctx, batch);");
        cg_line(w, "if (status != DMRT_OK) return status;");
        if (g->optimizer.kind != OPTIM_NONE) {
            cg_line(w, "ctx->step++;");
            cg_line(w, "status = run_update(ctx, batch);");
            cg_line(w, "if (status != DMRT_OK) return status;");
            cg_line(w, "status = finish_step(ctx, loss);");
            cg_line(w, "if (status == DMRT_ERR_DATA) ctx->step--; /* a bad index: the update kernels skipped the step */");
            cg_line(w, "return status;");
        } else {
            cg_line(w, "return finish_step(ctx, loss); /* no optimizer: gradients only */");
        }
    }
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}
