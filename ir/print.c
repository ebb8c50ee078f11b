/* print.c: the textual IR (`dmc --emit=ir`). Stable: golden tests compare it. */
#include <stdio.h>
#include <string.h>

#include "ir.h"

void ir_format_type(const ir_graph *g, const ir_type *t, char *buf, size_t size) {
    size_t n = 0;
#define PUT(...) do { int k_ = snprintf(buf + n, n < size ? size - n : 0, __VA_ARGS__); if (k_ > 0) n += (size_t)k_; } while (0)
    PUT("%s", ir_dtype_name(t->dtype));
    if (t->dtype != DT_VOID) {
        PUT("[");
        for (int i = 0; i < t->rank; i++) {
            if (i) PUT(", ");
            if (t->dim_name[i]) PUT("%s", t->dim_name[i]);
            else PUT("%lld", (long long)t->shape[i]);
            if (t->split[i] != IR_REPLICATED) PUT("@%s", g->axes[t->split[i]].name);
        }
        PUT("]");
    }
    if (t->partial) {
        PUT("{");
        int first = 1;
        for (int a = 0; a < g->n_axes; a++)
            if (t->partial & (1u << a)) {
                PUT("%s+%s", first ? "" : ", ", g->axes[a].name);
                first = 0;
            }
        PUT("}");
    }
#undef PUT
}

void ir_format_sizes(const ir_type *t, char *buf, size_t size) {
    size_t n = 0;
#define PUT(...) do { int k_ = snprintf(buf + n, n < size ? size - n : 0, __VA_ARGS__); if (k_ > 0) n += (size_t)k_; } while (0)
    PUT("%s[", ir_dtype_name(t->dtype));
    for (int i = 0; i < t->rank; i++) {
        if (t->dim_name[i]) PUT("%s%s=%lld", i ? ", " : "", t->dim_name[i], (long long)t->shape[i]);
        else PUT("%s%lld", i ? ", " : "", (long long)t->shape[i]);
    }
    PUT("]");
#undef PUT
}

static const char *role_name(ir_role r) {
    switch (r) {
    case ROLE_TEMP: return "";
    case ROLE_INPUT: return "input ";
    case ROLE_PARAM: return "param ";
    case ROLE_GRAD: return "grad ";
    case ROLE_STATE: return "state ";
    case ROLE_CONST: return "";
    }
    return "";
}

static void print_attrs(const ir_graph *g, const ir_value *v, FILE *out) {
    const ir_op_info *info = ir_op_info_of(v->op);
    switch (info->cls) {
    case OPC_REDUCE:
        fprintf(out, " axes=[");
        for (int i = 0, first = 1; i < 32; i++)
            if (v->axes & (1u << i)) {
                fprintf(out, "%s%d", first ? "" : ",", i);
                first = 0;
            }
        fprintf(out, "]");
        break;
    case OPC_TRANSPOSE:
        fprintf(out, " perm=[");
        for (int i = 0; i < v->type.rank; i++) fprintf(out, "%s%d", i ? "," : "", v->perm[i]);
        fprintf(out, "]");
        break;
    case OPC_MATMUL:
        if (v->trans_a) fprintf(out, " trans_a");
        if (v->trans_b) fprintf(out, " trans_b");
        if (v->batch_dims) fprintf(out, " batch_dims=%d", v->batch_dims);
        break;
    case OPC_SOFTMAX:
        fprintf(out, " axis=%d", v->axis);
        if (v->causal) fprintf(out, " causal");
        if (v->scalar != 1.0) fprintf(out, " scale=%.9g", v->scalar);
        break;
    case OPC_MASK:
        fprintf(out, " fill=%.9g", v->scalar);
        break;
    case OPC_NORM:
        fprintf(out, " eps=%.9g", v->scalar);
        break;
    case OPC_SLICE:
        fprintf(out, " axis=%d offset=%lld", v->axis, (long long)v->offset);
        if (v->slice_view) fprintf(out, " in_place");
        if (v->slice_rows_apart) fprintf(out, " rows_apart=%lld", (long long)v->slice_rows_apart);
        break;
    case OPC_COLLECTIVE:
        fprintf(out, " over=%s", g->axes[v->mesh_axis].name);
        if (v->op != OP_ALLREDUCE && v->op != OP_ZERO_GATHER && v->op != OP_AS_PENDING) fprintf(out, " dim=%d", v->axis);
        if (v->op == OP_ALLTOALL) fprintf(out, " to_dim=%d", v->axis2);
        break;
    case OPC_RESHAPE:
        if (v->op == OP_PARAM_VIEW) fprintf(out, " offset=%lld", (long long)v->offset);
        break;
    case OPC_ATTENTION:
        if (v->causal) fprintf(out, " causal");
        if (v->heads_inner) fprintf(out, " heads_inner");
        if (v->kv_group > 1) fprintf(out, " kv_group=%d", v->kv_group);
        fprintf(out, " scale=%.9g", v->scalar);
        break;
    case OPC_VIEW:
        if (v->op == OP_STACKED_PART) fprintf(out, " part=%lld", (long long)v->offset);
        break;
    case OPC_UNARY_GRAD:
        fprintf(out, " of=%s", ir_op_info_of(v->unary)->name);
        break;
    case OPC_UNARY:
        if (v->op == OP_DROPOUT) fprintf(out, " p=%.9g stream=%d", v->scalar, v->rng_op);
        break;
    default:
        break;
    }
    if (v->op == OP_CONST) fprintf(out, " %.9g", v->scalar);
    if (v->op == OP_PARAM) {
        static const char *const inits[] = {"zeros", "ones", "normal", "uniform", "xavier"};
        fprintf(out, " init=%s", inits[v->init.kind]);
        if (v->init.kind == INIT_NORMAL || v->init.kind == INIT_UNIFORM)
            fprintf(out, "(%.9g, %.9g)", v->init.a, v->init.b);
    }
}

void ir_print(const ir_graph *g, FILE *out) {
    fprintf(out, "model %s\n", g->model);
    if (g->n_dims) {
        fprintf(out, "dims");
        for (int i = 0; i < g->n_dims; i++)
            fprintf(out, " %s=%lld", g->dim_names[i], (long long)g->dim_values[i]);
        fprintf(out, "\n");
    }
    if (g->n_axes) {
        fprintf(out, "mesh");
        for (int i = 0; i < g->n_axes; i++)
            fprintf(out, " %s=%lld", g->axes[i].name, (long long)g->axes[i].size);
        fprintf(out, "\n");
    }
    static const char *const phases[] = {"forward", "backward", "update"};
    int phase = -1;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if ((int)v->phase != phase) {
            phase = (int)v->phase;
            fprintf(out, "%s:\n", phases[phase]);
        }
        char type[256];
        ir_format_type(g, &v->type, type, sizeof type);
        fprintf(out, "  %%%d", v->id);
        if (v->name) fprintf(out, " %s", v->name);
        fprintf(out, " : %s%s = %s", role_name(v->role), type, ir_op_info_of(v->op)->name);
        for (int k = 0; k < v->n_operands; k++) fprintf(out, "%s%%%d", k ? ", " : " ", v->operands[k]);
        print_attrs(g, v, out);
        fprintf(out, "  # line %d\n", v->loc.line);
    }
    if (g->loss >= 0) fprintf(out, "loss %%%d\n", g->loss);
    for (int i = 0; i < g->n_outputs; i++) fprintf(out, "output %%%d\n", g->outputs[i]);
    if (g->optimizer.kind != OPTIM_NONE) {
        const ir_optimizer *o = &g->optimizer;
        if (o->kind == OPTIM_SGD)
            fprintf(out, "optimizer sgd lr=%.9g momentum=%.9g dampening=%.9g weight_decay=%.9g nesterov=%d\n",
                    o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov);
        else
            fprintf(out, "optimizer adamw lr=%.9g beta1=%.9g beta2=%.9g eps=%.9g weight_decay=%.9g\n",
                    o->lr, o->beta1, o->beta2, o->eps, o->weight_decay);
        if (o->warmup > 0 || o->decay != DECAY_NONE)
            fprintf(out, "schedule warmup=%.9g decay=%s min_lr=%.9g\n", o->warmup, ir_decay_name(o->decay), o->min_lr);
        if (o->clip > 0) fprintf(out, "clip max_norm=%.9g\n", o->clip);
        if (o->no_decay_1d) fprintf(out, "weight_decay_1d=false (no decay on the 1-D parameters)\n");
    }
}
