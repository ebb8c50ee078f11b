/* emit_quant.c: a quantized inference program (dmc --quantize int8-weights | int4-weights,
 * docs/compression.md). Every 2-D parameter that a forward product reads as its right
 * operand (x @ weight: weight [in, out]) gets a narrow copy in the context, a dmrt_qweight,
 * made from the f32 parameter at create (and again by the trainer after --init of an f32
 * file, or read from a --save-quantized file), and those products call dmrt_gemm_wq_split
 * on it. The rest of the program (biases, norms, softmax, the loss) is the f32 program's. */
#include <stdlib.h>

#include "emitter.h"

/* Whether forward product v reads a parameter as a plain [k, n] right operand. */
static int reads_weight(const emitter *E, const ir_value *v) { return dm_quantized_weight_of(E->g, v) >= 0; }

void quant_mark(emitter *E) {
    const ir_graph *g = E->g;
    E->quant_slot = malloc(((size_t)g->n_values + 1) * sizeof(int));
    E->quant_param = malloc(((size_t)g->n_params + 1) * sizeof(int));
    if (!E->quant_slot || !E->quant_param) abort();
    for (int i = 0; i < g->n_values; i++) E->quant_slot[i] = -1;
    if (!E->quant_bits) return;
    for (int i = 0; i < g->n_values; i++)
        if (reads_weight(E, V(E, i))) E->quant_slot[V(E, i)->operands[1]] = 0;
    for (int p = 0; p < g->n_params; p++)
        if (E->quant_slot[g->params[p]] == 0) {
            E->quant_slot[g->params[p]] = E->n_quant;
            E->quant_param[E->n_quant++] = p;
        }
    for (int i = 0; i < g->n_values; i++)
        if (E->quant_slot[i] == 0 && V(E, i)->role != ROLE_PARAM) E->quant_slot[i] = -1;
}

/* "int8", "int8-weights", "int4-weights:64": --quantize's spelling of the mode */
static void quant_mode(const emitter *E, char *out, size_t len) {
    if (E->quant_act) snprintf(out, len, "int8");
    else if (E->quant_bits == 8) snprintf(out, len, "int8-weights");
    else snprintf(out, len, "int4-weights:%lld", (long long)E->quant_group);
}

void emit_quant_fields(emitter *E) {
    if (!E->n_quant) return;
    char mode[48];
    quant_mode(E, mode, sizeof mode);
    cg_line(&E->w, "dmrt_qweight quant[%d]; /* (--quantize %s) the weights the forward's products read */", E->n_quant, mode);
}

/* In create, after init_params: the narrow weights' storage and values. */
void emit_quant_create(emitter *E) {
    cg_writer *w = &E->w;
    for (int j = 0; j < E->n_quant; j++) {
        int p = E->quant_param[j];
        const ir_value *v = V(E, E->g->params[p]);
        cg_line(w, "/* %s */", v->name);
        cg_line(w, "if (dmrt_qweight_init(&ctx->quant[%d], %d, %lld, %lld, %lld) != 0) goto oom;", j, E->quant_bits,
                (long long)v->type.shape[0], (long long)v->type.shape[1], (long long)E->quant_group);
        cg_line(w, "dmrt_quantize_weight(&ctx->quant[%d], ctx->params + ctx->param_offsets[%d]);", j, p);
        cg_line(w, "dmrt_dequantize_rows(&ctx->quant[%d], 0, %lld, ctx->params + ctx->param_offsets[%d]);", j,
                (long long)v->type.shape[0], p);
        /* int8: its input scale comes from the trainer's calibration or a --save-quantized file */
        if (E->quant_act) cg_line(w, "ctx->quant[%d].quantize_input = 1;", j);
    }
}

void emit_quant_destroy(emitter *E) {
    for (int j = 0; j < E->n_quant; j++) cg_line(&E->w, "dmrt_qweight_free(&ctx->quant[%d]);", j);
}

/* model_qweight, the descriptor's accessor */
void emit_quant_accessor(emitter *E) {
    cg_writer *w = &E->w;
    if (!E->n_quant) return;
    cg_line(w, "static dmrt_qweight *model_qweight(void *ctx, int i) {");
    cg_line(w, "    switch (i) {");
    for (int j = 0; j < E->n_quant; j++)
        cg_line(w, "    case %d: return &((struct_ctx *)ctx)->quant[%d];", E->quant_param[j], j);
    cg_line(w, "    default: return NULL;");
    cg_line(w, "    }");
    cg_line(w, "}");
}

void emit_quant_descriptor(emitter *E) {
    char mode[48];
    quant_mode(E, mode, sizeof mode);
    if (E->n_quant) cg_line(&E->w, ".quantize = \"%s\",", mode);
    else cg_line(&E->w, ".quantize = NULL,");
    cg_line(&E->w, ".qweight = %s,", E->n_quant ? "model_qweight" : "NULL");
}

int emit_quant_product(emitter *E, const ir_value *v, const cg_gemm *k) {
    if (!reads_weight(E, v) || E->quant_slot[v->operands[1]] < 0) return 0;
    if (E->quant_act) {
        /* the f32 weight: what the calibration's f32 forward multiplies */
        int j = E->quant_slot[v->operands[1]];
        cg_line(&E->w, "dmrt_gemm_i8_split(ctx->threads, &ctx->quant[%d], ctx->params + ctx->param_offsets[%d], %lld, %s, %lld, %s, %s, %lld);",
                j, E->quant_param[j], (long long)k->m, k->a, (long long)k->lda, k->accumulate ? "1.0f" : "0.0f", k->c,
                (long long)k->ldc);
        return 1;
    }
    cg_line(&E->w, "dmrt_gemm_wq_split(ctx->threads, &ctx->quant[%d], %lld, %s, %lld, %s, %s, %lld);",
            E->quant_slot[v->operands[1]], (long long)k->m, k->a, (long long)k->lda, k->accumulate ? "1.0f" : "0.0f", k->c,
            (long long)k->ldc);
    return 1;
}
