/* lower_builtins.c: expressions → IR values: arithmetic, names, layer calls, and the
 * built-in functions and operators (matmul, softmax, layernorm, slice, reshape, ...).
 *
 * lower_expr is here with the builtins rather than in lower.c because each builtin
 * lowers its arguments through it: the recursion stays in this file, and lower.c needs
 * only lower_expr. Names and layer calls go back to lower.c (lower_resolve_path,
 * lower_call_layer). */
#include "lower_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suggest.h"

/* ---- values ---------------------------------------------------------------------------- */

static ir_value *make(lowerer *L, scope *s, ir_op op, const int *operands, int n, dm_loc loc) {
    ir_value *v = ir_add(L->g, op, operands, n, loc);
    if (s->prefix[0]) v->name = ir_internf(L->g, "%s%s", s->prefix, ir_op_info_of(op)->name);
    return v;
}

/* Makes the value and types it; -1 when its shape rule failed. */
static int make_typed(lowerer *L, scope *s, ir_op op, const int *operands, int n, dm_loc loc) {
    ir_value *v = make(L, s, op, operands, n, loc);
    return shapes_infer(L->g, v, L->d) ? -1 : v->id;
}

static int make_const(lowerer *L, double value, dm_loc loc) {
    ir_value *v = ir_add(L->g, OP_CONST, NULL, 0, loc);
    v->scalar = value;
    v->role = ROLE_CONST;
    shapes_infer(L->g, v, L->d);
    return v->id;
}

/* A constant the program computes is an f32 in the generated code: one past f32's range,
 * inf or NaN (1e39, 0 / 0, exp(1000), log(0)) would poison every value it reaches, so it
 * is refused where it is made. what describes it ("1e+39", "0 / 0 = nan"). Returns 1 after
 * reporting. */
static int refuse_nonfinite(lowerer *L, double value, dm_loc loc, const char *what) {
    if (fabs(value) <= FLT_MAX) return 0;
    dm_error(L->d, loc, "constant %s is not a finite f32 number (f32 holds magnitudes up to %.2g)", what, FLT_MAX);
    return 1;
}

/* %g's text, but NaN as "nan" whatever its sign bit (0.0 / 0.0 is -nan on x86). */
static const char *number_text(double x, char *buf, size_t size) {
    snprintf(buf, size, isnan(x) ? "nan" : "%g", x);
    return buf;
}

/* make_const of a value computed from the program's constants; -1 after refusing it. */
static int make_checked_const(lowerer *L, double value, dm_loc loc, const char *what) {
    return refuse_nonfinite(L, value, loc, what) ? -1 : make_const(L, value, loc);
}

/* ---- expressions ----------------------------------------------------------------------- */

static int lower_builtin(lowerer *L, scope *s, const dm_expr *e, int *out);
static void report_unknown_call(lowerer *L, scope *s, const dm_expr *e);

static int is_call_of(const dm_expr *e, const char *name, int n_args) {
    return e->kind == EXPR_CALL && strcmp(e->name, name) == 0 && e->n_args == n_args && !e->has_dim_args;
}

/* a @ b. `a @ transpose(b)` multiplies by b transposed in place (no copy of b), which
 * is how a tied head (x @ transpose(wte.weight)) and attention scores (q @
 * transpose(k)) are written. A right operand of rank 3 or more makes a batched
 * product over the leading dims. */
static int lower_matmul(lowerer *L, scope *s, const dm_expr *e) {
    int trans_b = is_call_of(e->rhs, "transpose", 1) && e->rhs->args[0]->kind != EXPR_KWARG;
    int a = lower_expr(L, s, e->lhs);
    int b = lower_expr(L, s, trans_b ? e->rhs->args[0] : e->rhs);
    if (a < 0 || b < 0) return -1;
    const ir_type *tb = &val(L, b)->type;
    if (trans_b && tb->rank < 2) {
        dm_error(L->d, e->rhs->loc, "transpose needs at least two dimensions");
        return -1;
    }
    ir_value *v = make(L, s, OP_MATMUL, (int[]){a, b}, 2, e->loc);
    v->trans_b = trans_b;
    v->batch_dims = tb->rank > 2 ? tb->rank - 2 : 0;
    return shapes_infer(L->g, v, L->d) ? -1 : v->id;
}

/* A unary function of a constant, computed now (sqrt(HS) in a scale). */
static int fold_unary(ir_op op, double x, double *out) {
    switch (op) {
    case OP_IDENTITY: *out = x; return 1;
    case OP_NEG: *out = -x; return 1;
    case OP_RELU: *out = x > 0 ? x : 0; return 1;
    case OP_TANH: *out = tanh(x); return 1;
    case OP_SIGMOID: *out = 1 / (1 + exp(-x)); return 1;
    case OP_EXP: *out = exp(x); return 1;
    case OP_LOG: *out = log(x); return x > 0;
    case OP_SQRT: *out = sqrt(x); return x >= 0;
    case OP_RSQRT: *out = 1 / sqrt(x); return x > 0;
    case OP_SILU: *out = x / (1 + exp(-x)); return 1;
    case OP_SIN: *out = sin(x); return 1;
    case OP_COS: *out = cos(x); return 1;
    default: return 0;
    }
}

int lower_expr(lowerer *L, scope *s, const dm_expr *e) {
    switch (e->kind) {
    case EXPR_NUM: {
        char what[64];
        snprintf(what, sizeof what, "%g", e->num);
        return make_checked_const(L, e->num, e->loc, what);
    }
    case EXPR_NAME: {
        binding *b = lower_resolve_path(L, s, e->name, e->loc);
        if (!b) {
            char near[160];
            lower_near_name(L, s, e->name, 1u << B_VALUE | 1u << B_DIM, near, sizeof near);
            dm_error(L->d, e->loc, "unknown name '%s'%s", e->name, near);
            return -1;
        }
        if (b->failed) return -1;
        if (b->kind == B_DIM) return make_const(L, (double)b->dim, e->loc);
        if (b->kind != B_VALUE) {
            dm_error(L->d, e->loc, "'%s' is a %s, not a value%s", e->name, lower_binding_kind_name(b->kind),
                     b->kind == B_LAYER ? " (call it: name(x))" : "");
            return -1;
        }
        return b->value;
    }
    case EXPR_NEG: {
        int x = lower_expr(L, s, e->lhs);
        if (x < 0) return -1;
        if (val(L, x)->op == OP_CONST) return make_const(L, -val(L, x)->scalar, e->loc);
        return make_typed(L, s, OP_NEG, &x, 1, e->loc);
    }
    case EXPR_BINARY: {
        if (e->op == '@') return lower_matmul(L, s, e);
        int a = lower_expr(L, s, e->lhs);
        int b = lower_expr(L, s, e->rhs);
        if (a < 0 || b < 0) return -1;
        ir_value *va = val(L, a), *vb = val(L, b);
        if (va->op == OP_CONST && vb->op == OP_CONST) {
            double x = va->scalar, y = vb->scalar;
            double r = e->op == '+' ? x + y : e->op == '-' ? x - y : e->op == '*' ? x * y : x / y;
            char what[128], rs[32];
            snprintf(what, sizeof what, "%g %c %g = %s", x, e->op, y, number_text(r, rs, sizeof rs));
            return make_checked_const(L, r, e->loc, what);
        }
        ir_op op = e->op == '+' ? OP_ADD : e->op == '-' ? OP_SUB : e->op == '*' ? OP_MUL : OP_DIV;
        int ab[2] = {a, b};
        return make_typed(L, s, op, ab, 2, e->loc);
    }
    case EXPR_CALL: {
        int out;
        if (lower_builtin(L, s, e, &out)) return out;
        binding *b = lower_resolve_path(L, s, e->name, e->loc);
        if (b && b->failed) return -1;
        if (!b || b->kind != B_LAYER) {
            if (b && b->kind == B_BLOCK)
                dm_error(L->d, e->loc, "'%s' is a block; declare a layer first: layer NAME = %s[...]", e->name, e->name);
            else if (b)
                dm_error(L->d, e->loc, "'%s' is a %s, not a function or layer", e->name, lower_binding_kind_name(b->kind));
            else
                report_unknown_call(L, s, e);
            return -1;
        }
        if (e->has_dim_args) {
            dm_error(L->d, e->loc, "layer '%s' is called with ( ) only; its dimensions were given when it was declared", e->name);
            return -1;
        }
        if (!b->layer) return -1; /* its declaration failed and was reported */
        int args[16];
        if (e->n_args > 16) {
            dm_error(L->d, e->loc, "too many arguments");
            return -1;
        }
        for (int i = 0; i < e->n_args; i++) {
            if (e->args[i]->kind == EXPR_KWARG) {
                dm_error(L->d, e->args[i]->loc, "layers take positional arguments");
                return -1;
            }
            args[i] = lower_expr(L, s, e->args[i]);
            if (args[i] < 0) return -1;
        }
        return lower_call_layer(L, b->layer, args, e->n_args, e);
    }
    case EXPR_LIST:
        dm_error(L->d, e->loc, "a list is only allowed as the shape argument of reshape or expand, or the order of permute");
        return -1;
    case EXPR_KWARG:
        dm_error(L->d, e->loc, "keyword argument outside a call");
        return -1;
    }
    return -1;
}

/* A dim of x named by a dimension name or an integer index (negative from the end). */
static int resolve_axis(lowerer *L, const ir_type *t, const dm_expr *e) {
    if (e->kind == EXPR_NAME) {
        int found = -1;
        for (int i = 0; i < t->rank; i++)
            if (t->dim_name[i] && strcmp(t->dim_name[i], e->name) == 0) {
                if (found >= 0) {
                    dm_error(L->d, e->loc, "dimension '%s' appears twice in the operand; use an index", e->name);
                    return -1;
                }
                found = i;
            }
        if (found < 0) {
            char ts[256];
            ir_format_type(L->g, t, ts, sizeof ts);
            dm_error(L->d, e->loc, "operand of type %s has no dimension named '%s'", ts, e->name);
        }
        return found;
    }
    int64_t k;
    const dm_expr *num = e;
    int negative = 0;
    if (e->kind == EXPR_NEG && e->lhs->kind == EXPR_NUM) num = e->lhs, negative = 1;
    if (num->kind != EXPR_NUM || !num->is_int) {
        dm_error(L->d, e->loc, "expected a dimension name or index");
        return -1;
    }
    k = negative ? -num->inum : num->inum;
    if (k < 0) k += t->rank;
    if (k < 0 || k >= t->rank) {
        dm_error(L->d, e->loc, "dimension index out of range for rank %d", t->rank);
        return -1;
    }
    return (int)k;
}

static int want_args(lowerer *L, const dm_expr *e, int lo, int hi) {
    for (int i = 0; i < e->n_args; i++)
        if (e->args[i]->kind == EXPR_KWARG) {
            dm_error(L->d, e->args[i]->loc, "%s takes no keyword arguments", e->name);
            return -1;
        }
    if (e->has_dim_args) {
        dm_error(L->d, e->loc, "%s is a function; call it with ( )", e->name);
        return -1;
    }
    if (e->n_args < lo || e->n_args > hi) {
        if (lo == hi) dm_error(L->d, e->loc, "%s takes %d argument%s, got %d", e->name, lo, lo == 1 ? "" : "s", e->n_args);
        else dm_error(L->d, e->loc, "%s takes %d to %d arguments, got %d", e->name, lo, hi, e->n_args);
        return -1;
    }
    return 0;
}

/* layernorm(x, weight, bias) or layernorm(x, weight, bias, eps = E); E defaults to 1e-5
 * (GPT-2's and torch's). */
static int lower_layernorm(lowerer *L, scope *s, const dm_expr *e, int *out) {
    double eps = 1e-5;
    int n = e->n_args;
    if (n > 0 && e->args[n - 1]->kind == EXPR_KWARG) {
        const dm_expr *kw = e->args[--n];
        if (strcmp(kw->name, "eps") != 0) {
            dm_error(L->d, kw->loc, "layernorm has no argument '%s' (it takes eps)", kw->name);
            return 1;
        }
        if (lower_eval_number(L, s, kw->lhs, &eps)) return 1;
        if (!(eps > 0 && eps <= FLT_MAX)) {
            dm_error(L->d, kw->lhs->loc, "layernorm eps must be positive%s, got %g", eps > 0 ? " and a finite f32" : "", eps);
            return 1;
        }
    }
    for (int i = 0; i < n; i++)
        if (e->args[i]->kind == EXPR_KWARG) {
            dm_error(L->d, e->args[i]->loc, "layernorm's only keyword argument is eps, and it comes last");
            return 1;
        }
    if (e->has_dim_args || n != 3) {
        dm_error(L->d, e->loc, "layernorm takes (x, weight, bias) and optionally eps = E, got %d arguments", n);
        return 1;
    }
    int ops[3];
    for (int i = 0; i < 3; i++)
        if ((ops[i] = lower_expr(L, s, e->args[i])) < 0) return 1;
    ir_value *v = make(L, s, OP_LAYERNORM, ops, 3, e->loc);
    v->scalar = eps;
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

/* slice(x, DIM, START, END): elements START..END-1 of one dim (by name or index),
 * START and END dim expressions (negative from the end, as in Python). */
static int lower_slice(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 4, 4)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    const ir_type *t = &val(L, x)->type;
    int axis = resolve_axis(L, t, e->args[1]);
    int64_t start, end, size;
    if (axis < 0 || lower_eval_dim(L, s, e->args[2], &start) || lower_eval_dim(L, s, e->args[3], &end)) return 1;
    size = t->shape[axis];
    if (start < 0) start += size;
    if (end < 0) end += size;
    if (start < 0 || end > size || start >= end) {
        char ts[256];
        ir_format_type(L->g, t, ts, sizeof ts);
        dm_error(L->d, e->loc, "slice %lld:%lld of dim %d is empty or outside %s", (long long)start, (long long)end, axis, ts);
        return 1;
    }
    ir_value *v = make(L, s, OP_SLICE, &x, 1, e->loc);
    v->type = *t;
    v->type.shape[axis] = end - start;
    v->type.dim_name[axis] = end - start == size ? t->dim_name[axis] : NULL;
    v->axis = axis;
    v->offset = start;
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

static int concat_values(lowerer *L, scope *s, const int *xs, int n, int axis, int64_t total, dm_loc loc);

/* concat(x1, x2, ..., dim = D): the operands end to end along dim D (by name or index),
 * every other dim equal, as torch.cat. Lowered to a pad of each operand into its window
 * of the result and the sum of the pads: memory_windows.c assembles such a sum in one
 * buffer, each piece written into its window, so no zeros are added; each pad's gradient
 * is the slice of the incoming gradient at its window, and the sharding rule of pads
 * (the concatenated dim whole, the others keep their split) is the concat's. */
static int lower_concat(lowerer *L, scope *s, const dm_expr *e, int *out) {
    int n = e->n_args;
    const dm_expr *dim = NULL;
    if (n > 0 && e->args[n - 1]->kind == EXPR_KWARG) {
        dim = e->args[--n];
        if (strcmp(dim->name, "dim") != 0) {
            dm_error(L->d, dim->loc, "concat has no argument '%s' (it takes dim)", dim->name);
            return 1;
        }
    }
    for (int i = 0; i < n; i++)
        if (e->args[i]->kind == EXPR_KWARG) {
            dm_error(L->d, e->args[i]->loc, "concat's only keyword argument is dim, and it comes last");
            return 1;
        }
    if (e->has_dim_args) {
        dm_error(L->d, e->loc, "concat is a function; call it with ( )");
        return 1;
    }
    if (n < 1 || n > 16) {
        dm_error(L->d, e->loc, "concat takes 1 to 16 tensors, got %d", n);
        return 1;
    }
    if (!dim) {
        dm_error(L->d, e->loc, "concat needs the dim to join along: concat(a, b, dim = -1)");
        return 1;
    }
    int xs[16];
    for (int i = 0; i < n; i++)
        if ((xs[i] = lower_expr(L, s, e->args[i])) < 0) return 1;
    const ir_type *t0 = &val(L, xs[0])->type;
    for (int i = 0; i < n; i++) {
        const ir_type *t = &val(L, xs[i])->type;
        if (val(L, xs[i])->op == OP_CONST || t->dtype != DT_F32 || t->rank == 0) {
            dm_error(L->d, e->args[i]->loc, "concat takes f32 tensors of rank 1 or more, not a constant, scalar or i32");
            return 1;
        }
    }
    int axis = resolve_axis(L, t0, dim->lhs);
    if (axis < 0) return 1;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const ir_type *t = &val(L, xs[i])->type;
        int same = t->rank == t0->rank;
        for (int k = 0; same && k < t->rank; k++) same = k == axis || t->shape[k] == t0->shape[k];
        if (!same) {
            char sa[256], sb[256];
            ir_format_type(L->g, t0, sa, sizeof sa);
            ir_format_type(L->g, t, sb, sizeof sb);
            dm_error(L->d, e->args[i]->loc, "concat along dim %d: %s and %s differ in another dim or in rank", axis, sa, sb);
            return 1;
        }
        total += t->shape[axis];
    }
    *out = concat_values(L, s, xs, n, axis, total, e->loc);
    return 1;
}

/* The pieces xs (n of them, checked alike but along axis, total along it together)
 * joined along axis: each padded into its window, the pads summed; -1 on error. */
static int concat_values(lowerer *L, scope *s, const int *xs, int n, int axis, int64_t total, dm_loc loc) {
    if (n == 1) return xs[0];
    const ir_type *t0 = &val(L, xs[0])->type;
    ir_type whole = *t0;
    whole.shape[axis] = total;
    whole.dim_name[axis] = NULL;
    whole.partial = 0;
    for (int k = 0; k < whole.rank; k++) whole.split[k] = IR_REPLICATED; /* the sharding pass decides */
    int64_t offset = 0;
    int sum = -1;
    for (int i = 0; i < n; i++) {
        ir_value *p = make(L, s, OP_PAD, &xs[i], 1, loc);
        p->type = whole;
        p->axis = axis;
        p->offset = offset;
        offset += val(L, xs[i])->type.shape[axis];
        int piece = shapes_infer(L->g, p, L->d) ? -1 : p->id;
        if (piece < 0) return -1;
        sum = sum < 0 ? piece : make_typed(L, s, OP_ADD, (int[]){sum, piece}, 2, loc);
        if (sum < 0) return -1;
    }
    return sum;
}

/* arange(END), arange(START, END), arange(START, END, STEP): f32[n], START + STEP * i for
 * i in [0, n), n = ceil((END - START) / STEP), as torch.arange; the bounds are constants
 * (numbers, dims). No op makes an index, so the counting [0, n) is built by doubling from
 * [0]: c(2m) = concat(c(m), c(m) + m), the last step joining only the slice that reaches
 * n. That is about 4 log2(n) small ops and 2n elements written, computed in each step (the
 * program has no tensor constants made once); they depend on no parameter, so nothing of
 * them is differentiated, and every dialect and mesh runs them with the ops' own rules. */
static int lower_arange(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 1, 3)) return 1;
    double a[3] = {0, 0, 1};
    for (int i = 0; i < e->n_args; i++)
        if (lower_eval_number(L, s, e->args[i], &a[e->n_args == 1 ? 1 : i])) return 1;
    for (int i = 0; i < e->n_args; i++) {
        char what[64];
        snprintf(what, sizeof what, "%g", a[e->n_args == 1 ? 1 : i]);
        if (refuse_nonfinite(L, a[e->n_args == 1 ? 1 : i], e->args[i]->loc, what)) return 1;
    }
    double start = a[0], end = a[1], step = a[2];
    double count = step != 0 ? ceil((end - start) / step) : 0;
    if (!(count >= 1) || count > (double)(1 << 24)) {
        dm_error(L->d, e->loc, "arange(%g, %g, %g) must have 1 to 2^24 elements", start, end, step);
        return 1;
    }
    int64_t n = (int64_t)count;
    int zero = make_const(L, 0, e->loc);
    ir_value *b = make(L, s, OP_BROADCAST, &zero, 1, e->loc);
    b->type.dtype = DT_F32;
    b->type.rank = 1;
    b->type.shape[0] = 1;
    b->type.split[0] = IR_REPLICATED;
    b->axes = 1;
    int c = shapes_infer(L->g, b, L->d) ? -1 : b->id;
    for (int64_t m = 1; c >= 0 && m < n; m *= 2) {
        int64_t take = m < n - m ? m : n - m;
        int hi = c;
        if (take < m) {
            ir_value *sl = make(L, s, OP_SLICE, &c, 1, e->loc);
            sl->type = val(L, c)->type;
            sl->type.shape[0] = take;
            sl->axis = 0;
            sl->offset = 0;
            hi = shapes_infer(L->g, sl, L->d) ? -1 : sl->id;
        }
        if (hi >= 0) hi = make_typed(L, s, OP_ADD, (int[]){hi, make_const(L, (double)m, e->loc)}, 2, e->loc);
        c = hi < 0 ? -1 : concat_values(L, s, (int[]){c, hi}, 2, 0, m + take, e->loc);
    }
    if (c >= 0 && step != 1) c = make_typed(L, s, OP_MUL, (int[]){c, make_const(L, step, e->loc)}, 2, e->loc);
    if (c >= 0 && start != 0) c = make_typed(L, s, OP_ADD, (int[]){c, make_const(L, start, e->loc)}, 2, e->loc);
    *out = c;
    return 1;
}

/* permute(x, [D0, D1, ...]): result dim i is x's dim Di (names or indices), as
 * torch.permute; one transpose op, whose rules take any permutation (its gradient the
 * inverse permutation, a split moving with its dim). */
static int lower_permute(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 2, 2)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    const dm_expr *list = e->args[1];
    const ir_type *t = &val(L, x)->type;
    if (list->kind != EXPR_LIST) {
        dm_error(L->d, list->loc, "permute takes the new order of the dims as a list: permute(x, [0, 2, 1, 3])");
        return 1;
    }
    if (list->n_args != t->rank) {
        char ts[256];
        ir_format_type(L->g, t, ts, sizeof ts);
        dm_error(L->d, list->loc, "permute of %s needs %d dims in its list, got %d", ts, t->rank, list->n_args);
        return 1;
    }
    int perm[IR_MAX_RANK], seen = 0, identity = 1;
    for (int i = 0; i < t->rank; i++) {
        perm[i] = resolve_axis(L, t, list->args[i]);
        if (perm[i] < 0) return 1;
        if (seen >> perm[i] & 1) {
            dm_error(L->d, list->args[i]->loc, "permute names dim %d twice", perm[i]);
            return 1;
        }
        seen |= 1 << perm[i];
        identity &= perm[i] == i;
    }
    if (identity) {
        *out = x;
        return 1;
    }
    ir_value *v = make(L, s, OP_TRANSPOSE, &x, 1, e->loc);
    memcpy(v->perm, perm, sizeof perm);
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

/* x reshaped to the shape `to` (rank to_rank, dim names kept): one reshape op, or x. */
static int reshape_to(lowerer *L, scope *s, int x, const ir_type *to, dm_loc loc) {
    const ir_type *t = &val(L, x)->type;
    int same = t->rank == to->rank;
    for (int i = 0; same && i < t->rank; i++) same = t->shape[i] == to->shape[i];
    if (same) return x;
    ir_value *v = make(L, s, OP_RESHAPE, &x, 1, loc);
    v->type = *to;
    return shapes_infer(L->g, v, L->d) ? -1 : v->id;
}

/* expand(x, [S0, S1, ...]): x repeated along new leading dims and along its dims of size 1
 * (to S_i), as torch.Tensor.expand; -1, or x's own size, keeps a dim. One broadcast (after
 * a reshape that drops the size-1 dims it widens): its gradient sums over the repeats, and
 * a split dim keeps its split. Hugging Face's repeat_kv is
 * reshape(expand(reshape(k, [B, NKV, 1, T, HD]), [B, NKV, R, T, HD]), [B, NKV * R, T, HD]). */
static int lower_expand(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 2, 2)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    const dm_expr *list = e->args[1];
    const ir_type *t = &val(L, x)->type;
    char ts[256];
    ir_format_type(L->g, t, ts, sizeof ts);
    if (list->kind != EXPR_LIST) {
        dm_error(L->d, list->loc, "expand takes the new shape as a list: expand(x, [B, R, T, C])");
        return 1;
    }
    if (val(L, x)->op == OP_CONST || t->dtype != DT_F32) {
        dm_error(L->d, e->args[0]->loc, "expand takes an f32 tensor, not a constant or i32");
        return 1;
    }
    int n = list->n_args, lead = n - t->rank;
    if (lead < 0 || n > IR_MAX_RANK) {
        dm_error(L->d, list->loc, "expand of %s needs %d to %d sizes in its list, got %d", ts, t->rank, IR_MAX_RANK, n);
        return 1;
    }
    ir_type to = *t, kept = *t;
    to.rank = n, kept.rank = 0, to.partial = kept.partial = 0;
    uint32_t axes = 0;
    for (int i = 0; i < n; i++) {
        int64_t size;
        if (lower_eval_dim(L, s, list->args[i], &size)) return 1;
        const char *dn = lower_dim_name_of(s, list->args[i]);
        int xi = i - lead;
        to.split[i] = IR_REPLICATED;
        if (xi >= 0 && (size == -1 || size == t->shape[xi])) {
            to.shape[i] = t->shape[xi], to.dim_name[i] = t->dim_name[xi];
            kept.shape[kept.rank] = t->shape[xi], kept.dim_name[kept.rank] = t->dim_name[xi];
            kept.split[kept.rank++] = IR_REPLICATED;
            continue;
        }
        if (size <= 0 || (xi >= 0 && t->shape[xi] != 1)) {
            if (xi < 0) dm_error(L->d, list->args[i]->loc, "expand: a new dim must have a positive size, got %lld", (long long)size);
            else
                dm_error(L->d, list->args[i]->loc, "expand cannot make dim %d of %s (size %lld) %lld: only a dim of size 1 grows",
                         xi, ts, (long long)t->shape[xi], (long long)size);
            return 1;
        }
        to.shape[i] = size, to.dim_name[i] = dn ? ir_intern(L->g, dn) : NULL;
        axes |= 1u << i;
    }
    if (!axes) {
        *out = x;
        return 1;
    }
    int base = reshape_to(L, s, x, &kept, e->loc);
    if (base < 0) return 1;
    ir_value *b = make(L, s, OP_BROADCAST, &base, 1, e->loc);
    b->type = to;
    b->axes = axes;
    *out = shapes_infer(L->g, b, L->d) ? -1 : b->id;
    return 1;
}

/* sum(x, DIMS...) and mean(x, DIMS...), over every dim when none is named; with
 * keepdim = true (last, as torch's keepdim) the reduced dims stay as size 1, so that the
 * result broadcasts against x (RMSNorm: x * rsqrt(mean(x * x, -1, keepdim = true) +
 * eps)). The kept form is the reduction and a reshape to the kept shape: the reshape
 * shares the reduction's buffer, and both have their gradient and sharding rules. */
static int lower_reduce(lowerer *L, scope *s, const dm_expr *e, int *out) {
    int n = e->n_args;
    int keep = 0;
    if (n > 0 && e->args[n - 1]->kind == EXPR_KWARG) {
        const dm_expr *kw = e->args[--n];
        if (strcmp(kw->name, "keepdim") != 0) {
            dm_error(L->d, kw->loc, "%s has no argument '%s' (it takes keepdim)", e->name, kw->name);
            return 1;
        }
        if (lower_eval_flag(L, s, kw->lhs, "keepdim", &keep)) return 1;
    }
    for (int i = 0; i < n; i++)
        if (e->args[i]->kind == EXPR_KWARG) {
            dm_error(L->d, e->args[i]->loc, "%s's only keyword argument is keepdim, and it comes last", e->name);
            return 1;
        }
    if (e->has_dim_args) {
        dm_error(L->d, e->loc, "%s is a function; call it with ( )", e->name);
        return 1;
    }
    if (n < 1 || n > 1 + IR_MAX_RANK) {
        dm_error(L->d, e->loc, "%s takes 1 to %d arguments, got %d", e->name, 1 + IR_MAX_RANK, n);
        return 1;
    }
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    const ir_type *t = &val(L, x)->type;
    uint32_t axes = 0;
    if (n == 1) axes = (1u << t->rank) - 1;
    for (int i = 1; i < n; i++) {
        int a = resolve_axis(L, t, e->args[i]);
        if (a < 0) return 1;
        /* sum(x, T, T): a slip for another dim, not a reduction over T twice */
        if (axes >> a & 1) {
            dm_error(L->d, e->args[i]->loc, "%s names dim %d twice: each dim is reduced once", e->name, a);
            return 1;
        }
        axes |= 1u << a;
    }
    ir_type kept = *t;
    ir_value *v = make(L, s, e->name[0] == 's' ? OP_SUM : OP_MEAN, &x, 1, e->loc);
    v->axes = axes;
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    if (*out < 0 || !keep || kept.rank == 0) return 1;
    ir_value *r = make(L, s, OP_RESHAPE, out, 1, e->loc);
    r->type = kept;
    for (int i = 0; i < kept.rank; i++) {
        r->type.split[i] = IR_REPLICATED; /* the sharding pass decides */
        if (axes >> i & 1) r->type.shape[i] = 1, r->type.dim_name[i] = NULL;
    }
    r->type.partial = 0;
    *out = shapes_infer(L->g, r, L->d) ? -1 : r->id;
    return 1;
}

/* softmax(causal_mask(s / c)), the attention pattern, becomes one softmax that scales
 * by 1 / c and sees only the keys up to each query: no masked or scaled copy of the
 * scores is made, and only the visible keys are exponentiated. *x is the mask just
 * made (and the division, when there is one); they are dropped from the graph when
 * nothing else can reference them: the last values, and not named (a value bound to a
 * name, `sc = s / 2`, stays for the name's other uses). */
static int fuse_causal(lowerer *L, int *x, double *scale) {
    ir_graph *g = L->g;
    ir_value *mask = val(L, *x);
    if (mask->op != OP_CAUSAL_MASK || *x != g->n_values - 1 || *x <= L->newest_bound) return 0;
    int inner = mask->operands[0];
    ir_drop_last(g);
    ir_value *in = val(L, inner);
    if ((in->op == OP_DIV || in->op == OP_MUL) && inner == g->n_values - 1 && inner > L->newest_bound) {
        ir_value *c = val(L, in->operands[1]);
        if (c->op == OP_CONST && c->scalar > 0) {
            *scale = in->op == OP_DIV ? 1.0 / c->scalar : c->scalar;
            inner = in->operands[0];
            ir_drop_last(g);
        }
    }
    *x = inner;
    return 1;
}

/* Builtin functions. Returns 1 when e names one (result in *out, -1 on error). */
/* The built-in functions lower_builtin knows besides the elementwise ops of ops.def. */
static const char *const builtin_functions[] = {"softmax", "causal_mask", "layernorm", "slice", "embed", "sum", "mean",
                                                "reshape", "transpose", "permute", "expand", "concat", "arange",
                                                "cross_entropy", "recompute"};

/* "unknown function or layer": the nearest function or layer in scope, and the functions. */
static void report_unknown_call(lowerer *L, scope *s, const dm_expr *e) {
    enum { MAX_NAMES = 4096 };
    const char **names = malloc(MAX_NAMES * sizeof *names);
    if (!names) abort();
    int n_functions = 0;
    for (int op = 0; op < OP_COUNT; op++)
        if (ir_op_info_of((ir_op)op)->cls == OPC_UNARY) names[n_functions++] = ir_op_info_of((ir_op)op)->name;
    for (size_t k = 0; k < sizeof builtin_functions / sizeof *builtin_functions; k++)
        names[n_functions++] = builtin_functions[k];
    int n = n_functions + lower_visible_names(s, 1u << B_LAYER, names + n_functions, MAX_NAMES - n_functions);
    char hint[1024];
    dm_format_suggestion(hint, sizeof hint, dm_nearest_name(e->name, names, n), "functions", names, n_functions);
    dm_error(L->d, e->loc, "unknown function or layer '%s'%s", e->name, hint);
    free(names);
}

/* dropout(x, p): p a constant in [0, 1); dropout(x, 0) is x itself, no op at all. */
static int lower_dropout(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 2, 2)) return 1;
    double p;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0 || lower_eval_number(L, s, e->args[1], &p)) return 1;
    if (!(p >= 0.0 && p < 1.0)) {
        dm_error(L->d, e->args[1]->loc, "dropout's probability must be in [0, 1), got %g", p);
        return 1;
    }
    if (val(L, x)->op == OP_CONST || val(L, x)->type.dtype != DT_F32) {
        dm_error(L->d, e->args[0]->loc, "dropout takes an f32 tensor, not a constant or i32");
        return 1;
    }
    if (p == 0.0) {
        *out = x;
        return 1;
    }
    ir_value *v = make(L, s, OP_DROPOUT, &x, 1, e->loc);
    v->scalar = p;
    v->rng_op = L->dropouts++;
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

/* recompute(h(x)): the layer calls inside keep only their inputs for the backward */
static int lower_recompute(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 1, 1)) return 1;
    L->in_recompute++;
    *out = lower_expr(L, s, e->args[0]);
    L->in_recompute--;
    return 1;
}

/* softmax(x[, dim]): a causal_mask directly inside (with its scale) is fused in. */
static int lower_softmax(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 1, 2)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    const ir_type *t = &val(L, x)->type;
    int axis = e->n_args == 2 ? resolve_axis(L, t, e->args[1]) : t->rank - 1;
    if (axis < 0) {
        if (t->rank == 0) dm_error(L->d, e->loc, "softmax of a scalar");
        return 1;
    }
    double scale = 1.0;
    int causal = axis == t->rank - 1 && is_call_of(e->args[0], "causal_mask", 1) && fuse_causal(L, &x, &scale);
    ir_value *v = make(L, s, OP_SOFTMAX, &x, 1, e->loc);
    v->axis = axis;
    v->causal = causal;
    v->scalar = scale;
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

/* causal_mask(x): keys after the query become -inf. */
static int lower_causal_mask(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 1, 1)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    ir_value *v = make(L, s, OP_CAUSAL_MASK, &x, 1, e->loc);
    v->scalar = -INFINITY;
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

/* embed(table, ids): the ids' rows of the table. */
static int lower_embed(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 2, 2)) return 1;
    int ops[2] = {lower_expr(L, s, e->args[0]), lower_expr(L, s, e->args[1])};
    if (ops[0] >= 0 && ops[1] >= 0) *out = make_typed(L, s, OP_EMBED, ops, 2, e->loc);
    return 1;
}

/* reshape(x, [S0, S1, ...]): one size may be -1, inferred from the others. */
static int lower_reshape(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 2, 2)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    const dm_expr *shape = e->args[1];
    if (x < 0) return 1;
    if (shape->kind != EXPR_LIST) {
        dm_error(L->d, shape->loc, "reshape takes the new shape as a list: reshape(x, [B, T, C])");
        return 1;
    }
    if (shape->n_args > IR_MAX_RANK) {
        dm_error(L->d, shape->loc, "rank %d exceeds the maximum of %d", shape->n_args, IR_MAX_RANK);
        return 1;
    }
    ir_value *v = make(L, s, OP_RESHAPE, &x, 1, e->loc);
    v->type.rank = shape->n_args;
    int infer = -1;
    int64_t known = 1, total = ir_numel(&val(L, x)->type);
    for (int i = 0; i < shape->n_args; i++) {
        int64_t size;
        if (lower_eval_dim(L, s, shape->args[i], &size)) return 1;
        if (size == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (size <= 0) {
            dm_error(L->d, shape->args[i]->loc, "dimension must be positive (or -1 once), got %lld", (long long)size);
            return 1;
        }
        v->type.shape[i] = size;
        const char *dn = lower_dim_name_of(s, shape->args[i]);
        v->type.dim_name[i] = dn ? ir_intern(L->g, dn) : NULL;
        if (mul_checked(known, size, &known) || known > MAX_NUMEL) {
            dm_error(L->d, shape->loc, "tensor is too large (more than 2^40 elements)");
            return 1;
        }
    }
    if (infer >= 0) {
        if (known == 0 || total % known != 0) {
            dm_error(L->d, shape->loc, "cannot infer the -1 dimension: %lld elements do not divide by %lld",
                     (long long)total, (long long)known);
            return 1;
        }
        v->type.shape[infer] = total / known;
    }
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

/* transpose(x): the last two dims swapped; transpose(x, d0, d1): those two. */
static int lower_transpose(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (e->n_args != 1 && want_args(L, e, 3, 3)) return 1;
    if (want_args(L, e, 1, 3)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    const ir_type *t = &val(L, x)->type;
    if (t->rank < 2) {
        dm_error(L->d, e->loc, "transpose needs at least two dimensions");
        return 1;
    }
    int d0 = t->rank - 2, d1 = t->rank - 1;
    if (e->n_args == 3) {
        d0 = resolve_axis(L, t, e->args[1]);
        d1 = resolve_axis(L, t, e->args[2]);
        if (d0 < 0 || d1 < 0) return 1;
        /* transpose(x, T, T) would be x: a slip for another dim */
        if (d0 == d1) {
            dm_error(L->d, e->args[2]->loc, "transpose swaps two different dims; both arguments name dim %d", d0);
            return 1;
        }
    }
    ir_value *v = make(L, s, OP_TRANSPOSE, &x, 1, e->loc);
    for (int i = 0; i < t->rank; i++) v->perm[i] = i;
    v->perm[d0] = d1;
    v->perm[d1] = d0;
    *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
    return 1;
}

/* cross_entropy(logits, targets): the rows' statistics (named after the logits), then the
 * loss from them. */
static int lower_cross_entropy(lowerer *L, scope *s, const dm_expr *e, int *out) {
    if (want_args(L, e, 2, 2)) return 1;
    int ab[2] = {lower_expr(L, s, e->args[0]), lower_expr(L, s, e->args[1])};
    if (ab[0] < 0 || ab[1] < 0) return 1;
    int stats = make_typed(L, s, OP_XENT_STATS, ab, 2, e->loc);
    if (stats >= 0 && val(L, ab[0])->name) val(L, stats)->name = ir_internf(L->g, "%s_stats", val(L, ab[0])->name);
    if (stats >= 0) *out = make_typed(L, s, OP_CROSS_ENTROPY, &stats, 1, e->loc);
    return 1;
}

/* The builtins lowered by a function of their own; the other elementwise unary ones (exp,
 * tanh, ...: ir/ops.def's OPC_UNARY ops) are found by their op's name. */
typedef struct builtin_lowering {
    const char *name;
    int (*lower)(lowerer *L, scope *s, const dm_expr *e, int *out);
} builtin_lowering;

static const builtin_lowering builtin_lowerings[] = {
    {"dropout", lower_dropout},     {"recompute", lower_recompute}, {"softmax", lower_softmax},
    {"causal_mask", lower_causal_mask}, {"layernorm", lower_layernorm}, {"slice", lower_slice},
    {"concat", lower_concat},       {"permute", lower_permute},     {"expand", lower_expand},
    {"arange", lower_arange},       {"embed", lower_embed},         {"sum", lower_reduce},
    {"mean", lower_reduce},         {"reshape", lower_reshape},     {"transpose", lower_transpose},
    {"cross_entropy", lower_cross_entropy},
};

/* A unary elementwise op of x, folded when x is a constant. */
static int lower_unary(lowerer *L, scope *s, const dm_expr *e, ir_op unary, int *out) {
    if (want_args(L, e, 1, 1)) return 1;
    int x = lower_expr(L, s, e->args[0]);
    if (x < 0) return 1;
    double folded = 0;
    /* (log, sqrt, rsqrt of a constant outside their domain are not folded, but computed
     * they would be inf or NaN all the same: refused as folded ones are) */
    if (val(L, x)->op == OP_CONST && (fold_unary(unary, val(L, x)->scalar, &folded) || !(fabs(folded) <= FLT_MAX))) {
        char what[128], rs[32];
        snprintf(what, sizeof what, "%s(%g) = %s", e->name, val(L, x)->scalar, number_text(folded, rs, sizeof rs));
        *out = make_checked_const(L, folded, e->loc, what);
    } else {
        *out = make_typed(L, s, unary, &x, 1, e->loc);
    }
    return 1;
}

int lower_is_builtin_function(const char *name) {
    for (size_t i = 0; i < sizeof builtin_lowerings / sizeof *builtin_lowerings; i++)
        if (strcmp(name, builtin_lowerings[i].name) == 0) return 1;
    ir_op unary = ir_op_by_name(name);
    return unary != OP_COUNT && ir_op_info_of(unary)->cls == OPC_UNARY;
}

/* Lowers a call of a builtin into *out (-1 after an error); 0 when e->name is none. */
static int lower_builtin(lowerer *L, scope *s, const dm_expr *e, int *out) {
    *out = -1;
    /* (the table first: dropout is a unary op with a lowering of its own) */
    for (size_t i = 0; i < sizeof builtin_lowerings / sizeof *builtin_lowerings; i++)
        if (strcmp(e->name, builtin_lowerings[i].name) == 0) return builtin_lowerings[i].lower(L, s, e, out);
    ir_op unary = ir_op_by_name(e->name);
    if (unary != OP_COUNT && ir_op_info_of(unary)->cls == OPC_UNARY) return lower_unary(L, s, e, unary, out);
    return 0;
}
