/* shapes.c: type and shape check. requires operands typed; leaves every value typed.
 * Rules are chosen per op class (ir/ops.def), so an op of a known class needs no code
 * here. Dim names travel with the dims they describe. */
#include <string.h>

#include "ir.h"

static void type_str(const ir_graph *g, const ir_type *t, char *buf, size_t n) {
    ir_format_type(g, t, buf, n);
}

/* Two types as an error message shows them. Formatted only for the message: the rules run
 * on every value of every compile, and formatting each operand's type up front was a tenth
 * of the planner's compiles. */
typedef struct type_strs {
    char a[256], b[256];
} type_strs;

static const type_strs *two_types(const ir_graph *g, const ir_type *a, const ir_type *b, type_strs *out) {
    type_str(g, a, out->a, sizeof out->a);
    type_str(g, b, out->b, sizeof out->b);
    return out;
}

static const ir_type *operand_type(const ir_graph *g, const ir_value *v, int k) {
    return &g->values[v->operands[k]]->type;
}

static void set_scalar(ir_type *t, ir_dtype dtype) {
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    for (int i = 0; i < IR_MAX_RANK; i++) t->split[i] = IR_REPLICATED;
}

static void copy_dim(ir_type *dst, int di, const ir_type *src, int si) {
    dst->shape[di] = src->shape[si];
    dst->dim_name[di] = src->dim_name[si];
    dst->split[di] = src->split[si];
}

static int want_f32(ir_graph *g, ir_value *v, int k, dm_diag *d) {
    const ir_type *t = operand_type(g, v, k);
    if (t->dtype == DT_F32) return 0;
    char s[256];
    type_str(g, t, s, sizeof s);
    dm_error(d, v->loc, "%s expects f32 operands, got %s", ir_op_info_of(v->op)->name, s);
    return 1;
}

static int rule_source(ir_graph *g, ir_value *v, dm_diag *d) {
    (void)g; (void)d;
    if (v->op == OP_CONST) set_scalar(&v->type, DT_F32);
    return 0;
}

static int rule_unary(ir_graph *g, ir_value *v, dm_diag *d) {
    v->type = *operand_type(g, v, 0);
    return want_f32(g, v, 0, d);
}

static int rule_unary_grad(ir_graph *g, ir_value *v, dm_diag *d) {
    (void)d;
    v->type = *operand_type(g, v, 0);
    return 0;
}

/* numpy broadcasting: align from the right, sizes equal or one of them 1. */
static int rule_binary(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *a = operand_type(g, v, 0), *b = operand_type(g, v, 1);
    int errors = want_f32(g, v, 0, d);
    if (!errors) errors += want_f32(g, v, 1, d);
    int rank = a->rank > b->rank ? a->rank : b->rank;
    set_scalar(&v->type, DT_F32);
    v->type.rank = rank;
    for (int i = 0; i < rank; i++) {
        int ai = a->rank - rank + i, bi = b->rank - rank + i;
        int64_t as = ai >= 0 ? a->shape[ai] : 1, bs = bi >= 0 ? b->shape[bi] : 1;
        if (as != bs && as != 1 && bs != 1 && !errors) {
            char sa[256], sb[256];
            type_str(g, a, sa, sizeof sa);
            type_str(g, b, sb, sizeof sb);
            dm_error(d, v->loc, "shapes %s and %s cannot be broadcast together (dim %d: %lld vs %lld)",
                     sa, sb, i, (long long)as, (long long)bs);
            errors++;
        }
        if (ai >= 0 && (as != 1 || bi < 0 || bs == 1)) copy_dim(&v->type, i, a, ai);
        else copy_dim(&v->type, i, b, bi);
    }
    return errors;
}

static int rule_reduce(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *x = operand_type(g, v, 0);
    int errors = want_f32(g, v, 0, d);
    if (v->op == OP_SUM_TO) {
        /* the target shape was set by the maker; check it is x with axes summed away */
        if (v->type.rank > x->rank) errors++;
        return errors;
    }
    ir_type t;
    set_scalar(&t, DT_F32);
    for (int i = 0; i < x->rank; i++)
        if (!(v->axes & (1u << i))) copy_dim(&t, t.rank++, x, i);
    v->type = t;
    return errors;
}

static int rule_keep_preset(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *x = operand_type(g, v, 0);
    if (v->op == OP_RESHAPE && ir_numel(x) != ir_numel(&v->type)) {
        char sa[256], sb[256];
        type_str(g, x, sa, sizeof sa);
        type_str(g, &v->type, sb, sizeof sb);
        dm_error(d, v->loc, "cannot reshape %s (%lld elements) to %s (%lld elements)", sa,
                 (long long)ir_numel(x), sb, (long long)ir_numel(&v->type));
        return 1;
    }
    v->type.dtype = x->dtype;
    return 0;
}

static int rule_transpose(ir_graph *g, ir_value *v, dm_diag *d) {
    (void)d;
    const ir_type *x = operand_type(g, v, 0);
    ir_type t;
    set_scalar(&t, x->dtype);
    t.rank = x->rank;
    for (int i = 0; i < x->rank; i++) copy_dim(&t, i, x, v->perm[i]);
    v->type = t;
    return 0;
}

static int same_dims(const ir_type *a, const ir_type *b, int n) {
    for (int i = 0; i < n; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* Batched: (batch..., M, K) @ (batch..., K, N), the last two dims of either transposed
 * by trans_a / trans_b. */
static int rule_batched_matmul(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *a = operand_type(g, v, 0), *b = operand_type(g, v, 1);
    int nb = v->batch_dims;
    type_strs s;
    if (a->rank != nb + 2 || b->rank != nb + 2 || !same_dims(a, b, nb)) {
        two_types(g, a, b, &s);
        dm_error(d, v->loc, "batched matmul needs operands of the same rank with the same leading dims, got %s @ %s", s.a, s.b);
        return 1;
    }
    int am = v->trans_a ? nb + 1 : nb, ak = v->trans_a ? nb : nb + 1;
    int bk = v->trans_b ? nb + 1 : nb, bn = v->trans_b ? nb : nb + 1;
    if (a->shape[ak] != b->shape[bk]) {
        two_types(g, a, b, &s);
        dm_error(d, v->loc, "matmul inner dimensions differ: %s @ %s (%lld vs %lld)", s.a, s.b,
                 (long long)a->shape[ak], (long long)b->shape[bk]);
        return 1;
    }
    ir_type t;
    set_scalar(&t, DT_F32);
    for (int i = 0; i < nb; i++) copy_dim(&t, t.rank++, a, i);
    copy_dim(&t, t.rank++, a, am);
    copy_dim(&t, t.rank++, b, bn);
    v->type = t;
    return 0;
}

/* See ir/ops.def for the layouts of a and b. */
static int rule_matmul(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *a = operand_type(g, v, 0), *b = operand_type(g, v, 1);
    int errors = want_f32(g, v, 0, d);
    if (!errors) errors += want_f32(g, v, 1, d);
    if (errors) return errors;
    if (v->batch_dims > 0) return rule_batched_matmul(g, v, d);
    type_strs s;
    ir_type t;
    set_scalar(&t, DT_F32);
    if (v->trans_a) {
        if (a->rank < 1 || b->rank < 1 ||
            ir_numel(a) / a->shape[a->rank - 1] != ir_numel(b) / b->shape[b->rank - 1]) {
            two_types(g, a, b, &s);
            dm_error(d, v->loc, "matmul rows differ: %s^T @ %s", s.a, s.b);
            return 1;
        }
        copy_dim(&t, t.rank++, a, a->rank - 1);
        copy_dim(&t, t.rank++, b, b->rank - 1);
        v->type = t;
        return 0;
    }
    if (a->rank < 1 || b->rank != 2) {
        two_types(g, a, b, &s);
        dm_error(d, v->loc, "matmul needs a matrix on the right and at least a vector on the left, got %s @ %s", s.a, s.b);
        return 1;
    }
    int bk = v->trans_b ? 1 : 0, bn = 1 - bk;
    if (a->shape[a->rank - 1] != b->shape[bk]) {
        two_types(g, a, b, &s);
        dm_error(d, v->loc, "matmul inner dimensions differ: %s @ %s (%lld vs %lld)", s.a, s.b,
                 (long long)a->shape[a->rank - 1], (long long)b->shape[bk]);
        return 1;
    }
    for (int i = 0; i < a->rank - 1; i++) copy_dim(&t, t.rank++, a, i);
    copy_dim(&t, t.rank++, b, bn);
    v->type = t;
    return 0;
}

/* cross_entropy(stats): the mean, a scalar; xent_stats(logits, targets): (..., 3) */
static int rule_loss(ir_graph *g, ir_value *v, dm_diag *d) {
    if (v->op == OP_CROSS_ENTROPY) {
        set_scalar(&v->type, DT_F32);
        return 0;
    }
    const ir_type *logits = operand_type(g, v, 0), *targets = operand_type(g, v, 1);
    type_strs s;
    set_scalar(&v->type, DT_F32);
    if (logits->dtype != DT_F32 || targets->dtype != DT_I32) {
        two_types(g, logits, targets, &s);
        dm_error(d, v->loc, "cross_entropy expects f32 logits and i32 targets, got %s and %s", s.a, s.b);
        return 1;
    }
    int ok = logits->rank >= 1 && targets->rank == logits->rank - 1;
    for (int i = 0; ok && i < targets->rank; i++) ok = targets->shape[i] == logits->shape[i];
    if (!ok) {
        two_types(g, logits, targets, &s);
        dm_error(d, v->loc, "cross_entropy targets must have the logits' shape without its last dim: %s vs %s", s.a, s.b);
        return 1;
    }
    v->type = *logits;
    v->type.partial = 0;
    v->type.shape[logits->rank - 1] = 3;
    v->type.dim_name[logits->rank - 1] = NULL;
    v->type.split[logits->rank - 1] = IR_REPLICATED;
    return 0;
}

static int rule_loss_grad(ir_graph *g, ir_value *v, dm_diag *d) {
    (void)d;
    v->type = *operand_type(g, v, 0);
    v->type.partial = 0;
    return 0;
}

static int rule_update(ir_graph *g, ir_value *v, dm_diag *d) {
    (void)g; (void)d;
    set_scalar(&v->type, DT_VOID);
    return 0;
}

static int rule_softmax(ir_graph *g, ir_value *v, dm_diag *d) {
    int errors = 0;
    for (int k = 0; k < v->n_operands && !errors; k++) errors += want_f32(g, v, k, d);
    v->type = *operand_type(g, v, 0);
    v->type.partial = 0;
    if (!errors && (v->axis < 0 || v->axis >= v->type.rank)) {
        dm_error(d, v->loc, "%s needs a dimension to work along", ir_op_info_of(v->op)->name);
        errors++;
    }
    return errors;
}

static int rule_mask(ir_graph *g, ir_value *v, dm_diag *d) {
    int errors = want_f32(g, v, 0, d);
    v->type = *operand_type(g, v, 0);
    if (!errors && v->type.rank < 2) {
        char sa[256];
        type_str(g, &v->type, sa, sizeof sa);
        dm_error(d, v->loc, "causal_mask needs at least two dims (query, key), got %s", sa);
        errors++;
    }
    return errors;
}

/* layernorm (x, weight, bias), its x gradient (x, weight, dy) and weight gradient (x, dy):
 * weight and bias are vectors as long as x's last dim. */
static int rule_norm(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *x = operand_type(g, v, 0);
    int errors = 0;
    for (int k = 0; k < v->n_operands && !errors; k++) errors += want_f32(g, v, k, d);
    if (errors) return errors;
    type_strs s;
    if (x->rank < 1) {
        type_str(g, x, s.a, sizeof s.a);
        dm_error(d, v->loc, "layernorm needs at least one dim, got %s", s.a);
        return 1;
    }
    int64_t c = x->shape[x->rank - 1];
    int n_vectors = v->op == OP_LAYERNORM ? 2 : v->op == OP_LAYERNORM_GRAD ? 1 : 0;
    for (int k = 1; k <= n_vectors; k++) {
        const ir_type *p = operand_type(g, v, k);
        if (p->rank != 1 || p->shape[0] != c) {
            const char *what = k == 1 ? "weight" : "bias";
            two_types(g, x, p, &s);
            dm_error(d, v->loc, "layernorm %s must be a vector as long as x's last dim: x %s, %s %s", what, s.a, what, s.b);
            return 1;
        }
    }
    if (v->op == OP_LAYERNORM_WGRAD) {
        set_scalar(&v->type, DT_F32);
        v->type.rank = 1;
        copy_dim(&v->type, 0, x, x->rank - 1);
    } else {
        v->type = *x;
        v->type.partial = 0;
    }
    return 0;
}

/* slice and pad: the result's type is preset by the maker; checked against the operand. */
static int rule_slice(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *x = operand_type(g, v, 0);
    const ir_type *small = v->op == OP_SLICE ? &v->type : x, *big = v->op == OP_SLICE ? x : &v->type;
    int ok = small->rank == big->rank && v->axis >= 0 && v->axis < big->rank && v->offset >= 0 &&
             v->offset + small->shape[v->axis] <= big->shape[v->axis];
    for (int i = 0; ok && i < big->rank; i++) ok = i == v->axis || small->shape[i] == big->shape[i];
    v->type.dtype = x->dtype;
    if (!ok) {
        char sa[256], sb[256];
        type_str(g, x, sa, sizeof sa);
        type_str(g, &v->type, sb, sizeof sb);
        dm_error(d, v->loc, "%s of %s to %s at offset %lld of dim %d is out of bounds", ir_op_info_of(v->op)->name, sa,
                 sb, (long long)v->offset, v->axis);
        return 1;
    }
    return 0;
}

/* embed (table (N, C), ids (...)) -> (..., C); embed_grad (ids, dy) -> the table's
 * shape, preset by autodiff. */
static int rule_gather(ir_graph *g, ir_value *v, dm_diag *d) {
    int grad = v->op == OP_EMBED_GRAD;
    const ir_type *table = grad ? &v->type : operand_type(g, v, 0);
    const ir_type *ids = operand_type(g, v, grad ? 0 : 1);
    if (table->dtype != DT_F32 || table->rank != 2 || ids->dtype != DT_I32 || ids->rank + 1 > IR_MAX_RANK) {
        type_strs s;
        two_types(g, table, ids, &s);
        dm_error(d, v->loc, "embed expects an f32 table [N, C] and i32 ids, got %s and %s", s.a, s.b);
        return 1;
    }
    if (grad) {
        v->type.dtype = DT_F32;
        return 0;
    }
    ir_type t;
    set_scalar(&t, DT_F32);
    for (int i = 0; i < ids->rank; i++) copy_dim(&t, t.rank++, ids, i);
    copy_dim(&t, t.rank++, table, 1);
    v->type = t;
    return 0;
}

/* attention (q, k, v): three f32 tensors of one shape (..., T, D), or (..., T, H, D) with
 * heads_inner, the result the same; with kv_group R > 1, k and v have q's shape but for
 * the heads' dim (..., H / R, T, D). attention_grad (q, k, v, out, lse, dout): the three
 * gradients stacked, (3, ...) of q's shape (k and v's, smaller when grouped, each at the
 * start of its part). */
static int rule_attention(ir_graph *g, ir_value *v, dm_diag *d) {
    const ir_type *q = operand_type(g, v, 0);
    int errors = 0;
    for (int k = 0; k < v->n_operands && !errors; k++) errors += want_f32(g, v, k, d);
    if (errors) return errors;
    int group = v->kv_group > 1 ? v->kv_group : 1, heads_dim = q->rank - 3;
    for (int k = 1; k < 3; k++) {
        const ir_type *t = operand_type(g, v, k);
        int fits = q->rank >= 2 + (v->heads_inner || group > 1) && q->rank < IR_MAX_RANK && t->rank == q->rank;
        for (int i = 0; fits && i < q->rank; i++)
            fits = i == heads_dim && group > 1 ? t->shape[i] * group == q->shape[i] : t->shape[i] == q->shape[i];
        if (!fits) {
            type_strs s;
            two_types(g, q, t, &s);
            if (group > 1)
                dm_error(d, v->loc, "grouped attention needs k and v of q's shape (..., H, T, D) with H / %d heads, got %s and %s",
                         group, s.a, s.b);
            else
                dm_error(d, v->loc, "attention needs q, k and v of one shape (..., T, D), got %s and %s", s.a, s.b);
            return 1;
        }
    }
    ir_type t = *q;
    t.partial = 0;
    if (v->op == OP_ATTENTION_GRAD) {
        set_scalar(&t, DT_F32);
        t.rank = q->rank + 1;
        t.shape[0] = 3;
        for (int i = 0; i < q->rank; i++) copy_dim(&t, i + 1, q, i);
    }
    v->type = t;
    return 0;
}

/* attention_lse: the attention's type without its last dim (a value per row);
 * stacked_part: the gradient's part of an attention_grad, typed as the operand it is the
 * gradient of (q, k or v). */
static int rule_view(ir_graph *g, ir_value *v, dm_diag *d) {
    (void)d;
    const ir_type *x = operand_type(g, v, 0);
    ir_type t;
    if (v->op == OP_STACKED_PART) {
        const ir_value *stacked = g->values[v->operands[0]];
        t = g->values[stacked->operands[v->offset]]->type;
        for (int i = 0; i < t.rank; i++) t.split[i] = x->split[i + 1];
        t.partial = x->partial;
        v->type = t;
        return 0;
    }
    set_scalar(&t, x->dtype);
    for (int i = 0; i < x->rank - 1; i++) copy_dim(&t, t.rank++, x, i);
    t.partial = x->partial;
    v->type = t;
    return 0;
}

/* A collective changes the sharding only: the operand's type with the split of one dim
 * or the pending sum over one mesh axis changed. */
static int rule_collective(ir_graph *g, ir_value *v, dm_diag *d) {
    (void)d;
    if (v->op == OP_ZERO_GATHER) return 0; /* a flat range, typed by its maker */
    ir_type t = *operand_type(g, v, 0);
    uint32_t bit = 1u << v->mesh_axis;
    switch (v->op) {
    case OP_ALLREDUCE: t.partial &= ~bit; break;
    case OP_AS_PENDING: t.partial |= bit; break;
    case OP_ALLGATHER: t.split[v->axis] = IR_REPLICATED; break;
    case OP_REDUCE_SCATTER:
        t.partial &= ~bit;
        t.split[v->axis] = (int8_t)v->mesh_axis;
        break;
    case OP_ALLTOALL:
        t.split[v->axis] = IR_REPLICATED;
        t.split[v->axis2] = (int8_t)v->mesh_axis;
        break;
    default: t.split[v->axis] = (int8_t)v->mesh_axis; break;
    }
    v->type = t;
    return 0;
}

typedef int (*shape_rule)(ir_graph *, ir_value *, dm_diag *);

static const shape_rule rules_by_class[] = {
    [OPC_SOURCE] = rule_source,       [OPC_UNARY] = rule_unary,
    [OPC_UNARY_GRAD] = rule_unary_grad, [OPC_BINARY] = rule_binary,
    [OPC_REDUCE] = rule_reduce,       [OPC_BROADCAST] = rule_keep_preset,
    [OPC_RESHAPE] = rule_keep_preset, [OPC_TRANSPOSE] = rule_transpose,
    [OPC_MATMUL] = rule_matmul,       [OPC_LOSS] = rule_loss,
    [OPC_LOSS_GRAD] = rule_loss_grad, [OPC_UPDATE] = rule_update,
    [OPC_SOFTMAX] = rule_softmax,     [OPC_MASK] = rule_mask,
    [OPC_NORM] = rule_norm,           [OPC_SLICE] = rule_slice,
    [OPC_GATHER] = rule_gather,       [OPC_COLLECTIVE] = rule_collective,
    [OPC_ATTENTION] = rule_attention, [OPC_VIEW] = rule_view,
    [OPC_CAST] = rule_keep_preset,
};

/* The size limit, checked here once for every result rather than in each rule: a
 * broadcast, a product or an expand multiplies sizes that each passed it, and their
 * product may not (nor fit in int64). */
static int check_numel(ir_value *v, dm_diag *d) {
    int64_t n = 1;
    int over = 0;
    double approx = 1;
    for (int i = 0; i < v->type.rank; i++) {
        over |= __builtin_mul_overflow(n, v->type.shape[i], &n);
        approx *= (double)v->type.shape[i];
    }
    if (!over && n <= IR_MAX_NUMEL) return 0;
    char sizes[512];
    ir_format_sizes(&v->type, sizes, sizeof sizes);
    dm_error(d, v->loc, "tensor is too large: %s has %.3g elements (at most 2^40)", sizes, approx);
    return 1;
}

int shapes_infer(ir_graph *g, ir_value *v, dm_diag *d) {
    int errors = rules_by_class[ir_op_info_of(v->op)->cls](g, v, d);
    return errors ? errors : check_numel(v, d);
}

int pass_shapes(ir_graph *g, dm_diag *d) {
    int errors = 0;
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        ir_type before = v->type;
        errors += shapes_infer(g, v, d);
        /* user annotations on sharding survive re-inference */
        if (v->annotated)
            for (int k = 0; k < before.rank && k < v->type.rank; k++) v->type.split[k] = before.split[k];
    }
    return errors;
}
