/* emit_util.c: the helpers every emitter file uses (emitter.h): copies and memsets through
 * the dialect, how a collective is spelled, comments quoting the source and shapes, loop
 * nests' strides, and where a value's storage is (the memory plan's offsets, this rank's
 * block of an input). */
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

/* n elements of type from src to dst, spelled by the dialect. */
void cg_copy_elems(emitter *E, const char *dst, const char *src, long long n, const char *type, cg_copy_kind kind) {
    char bytes[96];
    snprintf(bytes, sizeof bytes, "%lld * sizeof(%s)", n, type);
    E->dialect->copy(&E->w, dst, src, bytes, kind, E->on_fail);
}

void cg_zero_elems(emitter *E, const char *ptr, long long n, const char *type) {
    char bytes[96];
    snprintf(bytes, sizeof bytes, "%lld * sizeof(%s)", n, type);
    E->dialect->zero(&E->w, ptr, bytes, E->on_fail);
}

/* A dmrt_comm.h call on the context's buffers, as the dialect spells it: "callee(args" */
const char *cg_comm_callee(const emitter *E, const char *op, char *buf, size_t size) {
    E->dialect->comm_callee(buf, size, op);
    return buf;
}

void cg_shape_comment(const emitter *E, const ir_type *t, char *buf, size_t size) {
    ir_format_type(E->g, t, buf, size);
}

/* The .dm line of loc, trimmed and made safe inside a C comment. */
void cg_source_line(const emitter *E, int line, char *buf, size_t size) {
    const char *end = E->source_text + E->source_len;
    const char *p = line >= 1 && line <= E->n_lines ? E->source_text + E->line_start[line - 1] : end;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    size_t n = 0;
    for (; p < end && *p != '\n' && n + 1 < size && n < 100; p++) {
        char c = *p;
        if (c == '*' && p + 1 < end && p[1] == '/') c = '+';
        buf[n++] = (c >= 32 && c < 127) ? c : ' ';
    }
    while (n && buf[n - 1] == ' ') n--;
    buf[n] = 0;
}

void cg_contiguous_strides(const ir_type *t, int64_t *stride) {
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= t->shape[d];
    }
}

/* Merges adjacent dims that every array walks contiguously, and drops size-1 dims. */
void cg_coalesce(cg_loop_nest *k) {
    int r = 0;
    for (int d = 0; d < k->rank; d++) {
        if (k->size[d] == 1) continue;
        if (r > 0) {
            int mergeable = k->out_stride[r - 1] == k->out_stride[d] * k->size[d];
            for (int i = 0; i < k->n_in && mergeable; i++) mergeable = k->stride[i][r - 1] == k->stride[i][d] * k->size[d];
            if (mergeable) {
                k->size[r - 1] *= k->size[d];
                k->out_stride[r - 1] = k->out_stride[d];
                for (int i = 0; i < k->n_in; i++) k->stride[i][r - 1] = k->stride[i][d];
                continue;
            }
        }
        k->size[r] = k->size[d];
        k->out_stride[r] = k->out_stride[d];
        for (int i = 0; i < k->n_in; i++) k->stride[i][r] = k->stride[i][d];
        r++;
    }
    k->rank = r;
}

/* Where this rank's block of input id starts in the caller's whole batch, in elements (a
 * C expression; "0" when the block is the whole): the block of a split leading dim is
 * contiguous (passes/supported.c refuses other splits). */
void cg_input_block_offset(const emitter *E, int id, char *buf, size_t size) {
    const ir_type *t = &V(E, id)->type;
    int n = snprintf(buf, size, "0");
    if (E->in_micro && E->g->microbatches > 1 && n > 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, " + micro * %lld", (long long)ir_numel(t));
    for (int d = 0; d < t->rank && n > 0 && (size_t)n < size; d++)
        if (t->split[d] != IR_REPLICATED)
            n += snprintf(buf + n, size - (size_t)n, " + ctx->coord[%d] * %lld", t->split[d],
                          (long long)(T(E, id)->shape[d] * dims_product(t, d + 1, t->rank)));
}

/* The first element of this rank's block of input id in the caller's whole batch (or, in
 * a separate memory, in its copy there: emit_upload). */
static void input_block(const emitter *E, int id, char *buf, size_t size) {
    char offset[256];
    cg_input_block_offset(E, id, offset, sizeof offset);
    /* "0 + a + b" reads as "+ a + b" after the base */
    snprintf(buf, size, E->dialect->separate_memory ? "ctx->input_%s%s" : "batch->%s%s", E->cname[id], offset + 1);
}

/* Where a kernel reading the ids or targets `id` reports a bad one: its position in the
 * step's whole batch is this expression plus the position in the block (a value that is
 * not an input's block: "0", positions are the block's own). */
void cg_fault_position_base(const emitter *E, int id, char *buf, size_t size) {
    if (E->plan->region[id] == REGION_INPUT) cg_input_block_offset(E, E->plan->storage_of[id], buf, size);
    else snprintf(buf, size, "0");
}

const char *cg_sum_adds_if(const emitter *E, int id) {
    const ir_value *root = V(E, E->plan->storage_of[id]);
    if (root->id != id && add_made_by_operands(E, root)) {
        int first = root->operands[0] < root->operands[1] ? root->operands[0] : root->operands[1];
        if (id != first) return NULL;
    }
    return "micro > 0";
}

void cg_sum_made_in(const emitter *E, int id, char *buf, size_t size) {
    const dm_memory_plan *p = E->plan;
    int root = p->storage_of[id];
    long long at = -1;
    if (p->made_in_sum[root] == DM_IN_PARTIAL_SUM && p->partial_sum_offset) at = (long long)p->partial_sum_offset[root];
    for (int q = 0; p->made_in_sum[root] == DM_IN_GRAD_SUM && q < E->g->n_params; q++)
        if (E->g->grads[q] >= 0 && dm_micro_grad(E->g, q) == root) at = (long long)dm_grad_sum_offset(p, E->g->grads[q]);
    if (at < 0) {
        fprintf(stderr, "dmc: internal error: '%s' is made in a sum that has no place in ctx->grad_sum\n",
                V(E, id)->name ? V(E, id)->name : "?");
        abort();
    }
    snprintf(buf, size, "ctx->grad_sum + %lld", at + (long long)p->within[id]);
}

/* The pointer through which code reaches a value's storage. */
void cg_storage_expr(const emitter *E, int id, char *buf, size_t size) {
    const dm_memory_plan *p = E->plan;
    int root = p->storage_of[id];
    /* the offset on the stage being emitted (the value's own outside stage functions) */
    long long off = 0;
    if (p->region[id] != REGION_INPUT && p->region[id] != REGION_NONE) {
        off = (long long)dm_offset_on(p, E->g, id, E->cur_stage);
        if (off < 0) {
            /* the pipeline plan sends every value a stage reads to it */
            fprintf(stderr, "dmc: internal error: '%s' is used on stage %d, which holds no copy of it\n",
                    V(E, id)->name ? V(E, id)->name : "?", E->cur_stage);
            abort();
        }
    }
    if (E->in_micro && made_in_sum(E, id)) {
        cg_sum_made_in(E, id, buf, size);
        return;
    }
    if (!E->in_micro && E->summed && E->summed[id] >= 0) {
        snprintf(buf, size, "ctx->grad_sum + %lld", (long long)dm_grad_sum_offset(p, E->g->grads[E->summed[id]]));
        return;
    }
    switch (p->region[id]) {
    case REGION_INPUT: input_block(E, root, buf, size); break;
    case REGION_PARAMS: snprintf(buf, size, "ctx->params + %lld", off); break;
    case REGION_GRADS: snprintf(buf, size, "ctx->grads + %lld", off); break;
    case REGION_STATE: snprintf(buf, size, "ctx->state + %lld", off); break;
    case REGION_ARENA:
        snprintf(buf, size, "%s + %lld", E->kept_var && off >= stage_kept_from(E, E->cur_stage) ? E->kept_var : E->arena_var,
                 off);
        break;
    case REGION_NONE: snprintf(buf, size, "NULL"); break;
    }
}
