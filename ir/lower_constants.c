/* lower_constants.c: the constant expressions of a .dm file, evaluated as lower.c and
 * lower_builtins.c read them: integer dimension arithmetic over dim names (sizes, shapes,
 * repeat counts) and real-valued constants (hyper-parameters, initialisers' arguments). */
#include "lower_internal.h"

#include <math.h>
#include <string.h>

/* Integer dimension arithmetic over dimension names. Returns 0 and sets *out, or reports
 * and returns -1. */
int lower_eval_dim(lowerer *L, scope *s, const dm_expr *e, int64_t *out) {
    switch (e->kind) {
    case EXPR_NUM:
        if (!e->is_int) {
            dm_error(L->d, e->loc, "a dimension must be an integer, not %g", e->num);
            return -1;
        }
        *out = e->inum;
        return 0;
    case EXPR_NAME: {
        binding *b = lower_scope_find(s, e->name);
        if (!b) {
            char near[160];
            lower_near_name(L, s, e->name, 1u << B_DIM, near, sizeof near);
            dm_error(L->d, e->loc, "unknown dimension '%s'%s", e->name, near);
            return -1;
        }
        if (b->failed) return -1;
        if (b->kind != B_DIM) {
            dm_error(L->d, e->loc, "'%s' is a %s, not a dimension", e->name, lower_binding_kind_name(b->kind));
            return -1;
        }
        *out = b->dim;
        return 0;
    }
    case EXPR_NEG: {
        int64_t v;
        if (lower_eval_dim(L, s, e->lhs, &v)) return -1;
        if (!__builtin_sub_overflow((int64_t)0, v, out)) return 0;
        dm_error(L->d, e->loc, "dimension arithmetic overflows");
        return -1;
    }
    case EXPR_BINARY: {
        int64_t a, b;
        if (lower_eval_dim(L, s, e->lhs, &a) || lower_eval_dim(L, s, e->rhs, &b)) return -1;
        int overflow = 0;
        switch (e->op) {
        case '+': overflow = __builtin_add_overflow(a, b, out); break;
        case '-': overflow = __builtin_sub_overflow(a, b, out); break;
        case '*': overflow = mul_checked(a, b, out); break;
        case '/':
            /* INT64_MIN / -1 is the one quotient past int64 (and a trap, as its remainder) */
            overflow = b == -1 && a == INT64_MIN;
            if (b == 0 || (!overflow && a % b != 0)) {
                if (b == 0) dm_error(L->d, e->loc, "division by zero: %lld / 0", (long long)a);
                else dm_error(L->d, e->loc, "%lld / %lld is not a whole number", (long long)a, (long long)b);
                if (L->layer_path) dm_note(L->d, L->layer_loc, "in layer '%s', declared here", L->layer_path);
                return -1;
            }
            if (!overflow) *out = a / b;
            break;
        default:
            dm_error(L->d, e->loc, "'%c' is not allowed in a dimension", e->op);
            return -1;
        }
        if (overflow) {
            dm_error(L->d, e->loc, "dimension arithmetic overflows");
            return -1;
        }
        return 0;
    }
    default:
        dm_error(L->d, e->loc, "expected a dimension expression");
        return -1;
    }
}

int lower_dim_reads_batch(scope *s, const dm_expr *e) {
    switch (e->kind) {
    case EXPR_NAME: {
        binding *b = lower_scope_find(s, e->name);
        return b && b->kind == B_DIM && b->of_batch;
    }
    case EXPR_NEG: return lower_dim_reads_batch(s, e->lhs);
    case EXPR_BINARY: return lower_dim_reads_batch(s, e->lhs) || lower_dim_reads_batch(s, e->rhs);
    default: return 0;
    }
}

/* Real-valued constants (hyper-parameters, initialiser arguments): numbers, dims and
 * arithmetic. */
int lower_eval_number(lowerer *L, scope *s, const dm_expr *e, double *out) {
    switch (e->kind) {
    case EXPR_NUM:
        *out = e->num;
        return 0;
    case EXPR_NAME: {
        binding *b = lower_scope_find(s, e->name);
        if (b && b->failed) return -1;
        if (b && b->kind == B_DIM) {
            *out = (double)b->dim;
            return 0;
        }
        /* `lr = true` is a slip, not 1 (flags are lower_eval_flag's) */
        if (strcmp(e->name, "true") == 0 || strcmp(e->name, "false") == 0) {
            dm_error(L->d, e->loc, "'%s' is a flag (true or false), not a number", e->name);
            return -1;
        }
        dm_error(L->d, e->loc, "'%s' is not a constant", e->name);
        return -1;
    }
    case EXPR_NEG:
        if (lower_eval_number(L, s, e->lhs, out)) return -1;
        *out = -*out;
        return 0;
    case EXPR_CALL:
        if (strcmp(e->name, "sqrt") == 0 && e->n_args == 1 && !e->has_dim_args && e->args[0]->kind != EXPR_KWARG) {
            if (lower_eval_number(L, s, e->args[0], out)) return -1;
            if (*out < 0) {
                dm_error(L->d, e->loc, "sqrt of a negative number (%g)", *out);
                return -1;
            }
            *out = sqrt(*out);
            return 0;
        }
        dm_error(L->d, e->loc, "only sqrt(...) may be called in a constant");
        return -1;
    case EXPR_BINARY: {
        double a, b;
        if (lower_eval_number(L, s, e->lhs, &a) || lower_eval_number(L, s, e->rhs, &b)) return -1;
        switch (e->op) {
        case '+': *out = a + b; return 0;
        case '-': *out = a - b; return 0;
        case '*': *out = a * b; return 0;
        case '/': *out = a / b; return 0;
        default: break;
        }
        dm_error(L->d, e->loc, "'%c' is not allowed in a constant", e->op);
        return -1;
    }
    default:
        dm_error(L->d, e->loc, "expected a number");
        return -1;
    }
}

int lower_eval_flag(lowerer *L, scope *s, const dm_expr *e, const char *what, int *out) {
    if (e->kind == EXPR_NAME && (strcmp(e->name, "true") == 0 || strcmp(e->name, "false") == 0)) {
        binding *b = lower_scope_find(s, e->name);
        if (!b || b->kind != B_DIM) { /* (a dim named true is a number) */
            *out = e->name[0] == 't';
            return 0;
        }
    }
    double v;
    if (lower_eval_number(L, s, e, &v)) return -1;
    if (v != 0 && v != 1) {
        dm_error(L->d, e->loc, "%s must be true or false, got %g", what, v);
        return -1;
    }
    *out = v == 1;
    return 0;
}
