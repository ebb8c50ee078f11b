/* lower.c: syntax tree → forward IR. requires: a parsed program; leaves: a typed forward
 * graph with params, inputs, outputs, loss, optimizer and mesh filled in.
 *
 * Names live in scopes: the global scope (dims, blocks, inputs, params, layers, lets),
 * an instance scope per layer instance (its dim parameters, params and nested layers,
 * created when the layer is declared so that parameters are registered in declaration
 * order, as in PyTorch), and a call scope for the lets of one call of a block. */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "schedule.h"
#include "suggest.h"

#define MAX_REPEAT 4096
#define MAX_INSTANCE_DEPTH 32
#define MAX_NUMEL ((int64_t)1 << 40)
/* The forward graph's size limit: far above any real model (GPT-2 XL lowers to about
 * 2,000 values), low enough that every pass stays fast on hostile input. */
#define MAX_FORWARD_VALUES (1 << 19)
#define MAX_INSTANCES 65536
#define MAX_PATH 4096

typedef enum { B_DIM, B_VALUE, B_LAYER, B_BLOCK } binding_kind;

typedef struct instance instance;

typedef struct binding {
    const char *name;
    binding_kind kind;
    dm_loc loc;
    int64_t dim;          /* B_DIM */
    const char *display;  /* B_DIM: the name types print for it (the caller's), or NULL */
    int value;            /* B_VALUE */
    instance *layer;      /* B_LAYER */
    const dm_stmt *block; /* B_BLOCK */
    int failed;           /* its definition failed and was reported: uses of it stay silent
                           * rather than cascade into "unknown name" */
} binding;

typedef struct scope {
    struct scope *parent;
    binding *items;       /* (n) */
    int n, cap;
    int *slots;           /* (n_slots) open-addressing index into items, -1 empty */
    int n_slots;
    const char *prefix;   /* value names made here start with it ("fc1."), "" at top */
} scope;

struct instance {
    const char *path;         /* "h.0.attn" */
    const dm_stmt *block;     /* NULL for a repeat group */
    scope env;                /* dim parameters, params, nested layers */
    instance **members;       /* (n_members) repeat group: h.0, h.1, ... */
    int n_members;
    instance *next_alloc;     /* every instance, for freeing */
};

typedef struct lowerer {
    ir_graph *g;
    dm_diag *d;
    int too_large;            /* the size limit was hit and reported: stop lowering */
    int n_instances;          /* layer instances made, bounded by MAX_INSTANCES */
    const dm_lower_options *opts;
    scope global;
    instance *instances;
    int depth;                /* nested instantiation / calls */
    int segments;             /* top-level layer calls so far (ir_value.segment) */
    int in_recompute;         /* lowering the argument of recompute(...) */
    int dropouts;             /* dropout ops so far (ir_value.rng_op) */
    const dm_expr *cuts;      /* the schedule's cuts = [...], resolved after the program */
    binding failed_path;      /* what a dotted path into a failed layer resolves to */
    const char *layer_path;   /* the top-level layer being instantiated, or NULL */
    dm_loc layer_loc;         /* its declaration: where errors in its block's body come from */
} lowerer;

/* ---- scopes ---------------------------------------------------------------------------- */

static binding *scope_find_local(scope *s, const char *name) {
    if (!s->n_slots) return NULL;
    for (unsigned i = ir_hash_string(name) & (unsigned)(s->n_slots - 1);; i = (i + 1) & (unsigned)(s->n_slots - 1)) {
        int k = s->slots[i];
        if (k < 0) return NULL;
        if (strcmp(s->items[k].name, name) == 0) return &s->items[k];
    }
}

static void slot_insert(scope *s, int k) {
    unsigned mask = (unsigned)(s->n_slots - 1), i = ir_hash_string(s->items[k].name) & mask;
    while (s->slots[i] >= 0) i = (i + 1) & mask;
    s->slots[i] = k;
}

/* Indexes the newest binding, keeping the index at most half full (rebuilt twice as
 * large when it would not be), so lookups stay short however many names. */
static void scope_index(scope *s) {
    if (s->n * 2 < s->n_slots) {
        slot_insert(s, s->n - 1);
        return;
    }
    free(s->slots);
    s->n_slots = s->n_slots ? s->n_slots * 2 : 32;
    s->slots = malloc((size_t)s->n_slots * sizeof(int));
    if (!s->slots) abort();
    for (int i = 0; i < s->n_slots; i++) s->slots[i] = -1;
    for (int k = 0; k < s->n; k++) slot_insert(s, k);
}

static binding *scope_find(scope *s, const char *name) {
    for (; s; s = s->parent) {
        binding *b = scope_find_local(s, name);
        if (b) return b;
    }
    return NULL;
}

static const char *binding_kind_name(binding_kind k) {
    static const char *const names[] = {"dimension", "value", "layer", "block"};
    return names[k];
}

/* Adds a binding; a name already bound in the same scope is a redefinition. */
static binding *bind(lowerer *L, scope *s, const char *name, binding_kind kind, dm_loc loc) {
    binding *old = scope_find_local(s, name);
    if (old) {
        dm_error(L->d, loc, "redefinition of '%s'", name);
        dm_note(L->d, old->loc, "previous definition of '%s' (a %s) is here", name, binding_kind_name(old->kind));
        return NULL;
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        binding *grown = realloc(s->items, (size_t)s->cap * sizeof *grown);
        if (!grown) abort();
        s->items = grown;
    }
    binding *b = &s->items[s->n++];
    memset(b, 0, sizeof *b);
    b->name = ir_intern(L->g, name);
    b->kind = kind;
    b->loc = loc;
    scope_index(s);
    return b;
}

/* Up to max names bound in s and the scopes around it, of the kinds in the mask (a bit
 * per binding_kind), for "did you mean". */
static int visible_names(const scope *s, unsigned kinds, const char **out, int max) {
    int n = 0;
    for (; s; s = s->parent)
        for (int k = 0; k < s->n && n < max; k++)
            if (kinds >> s->items[k].kind & 1) out[n++] = s->items[k].name;
    return n;
}

/* "; did you mean 'NAME'?" for a name unknown in s, or "" when none is near. Nothing is
 * searched once errors are no longer printed (hostile input with thousands of them). */
static void near_name(lowerer *L, scope *s, const char *name, unsigned kinds, char *buf, size_t size) {
    enum { MAX_CANDIDATES = 4096 };
    buf[0] = 0;
    if (L->d->n_errors >= L->d->max_errors) return;
    const char **names = malloc(MAX_CANDIDATES * sizeof *names);
    if (!names) abort();
    int n = visible_names(s, kinds, names, MAX_CANDIDATES);
    dm_format_suggestion(buf, size, dm_nearest_name(name, names, n), "", NULL, 0);
    free(names);
}

static void scope_free(scope *s) {
    free(s->items);
    free(s->slots);
}

/* ---- constants ------------------------------------------------------------------------- */

static int mul_checked(int64_t a, int64_t b, int64_t *out) { return __builtin_mul_overflow(a, b, out); }

/* Integer dimension arithmetic over dimension names. Returns 0 and sets *out, or reports
 * and returns -1. */
static int eval_dim(lowerer *L, scope *s, const dm_expr *e, int64_t *out) {
    switch (e->kind) {
    case EXPR_NUM:
        if (!e->is_int) {
            dm_error(L->d, e->loc, "a dimension must be an integer, not %g", e->num);
            return -1;
        }
        *out = e->inum;
        return 0;
    case EXPR_NAME: {
        binding *b = scope_find(s, e->name);
        if (!b) {
            char near[160];
            near_name(L, s, e->name, 1u << B_DIM, near, sizeof near);
            dm_error(L->d, e->loc, "unknown dimension '%s'%s", e->name, near);
            return -1;
        }
        if (b->failed) return -1;
        if (b->kind != B_DIM) {
            dm_error(L->d, e->loc, "'%s' is a %s, not a dimension", e->name, binding_kind_name(b->kind));
            return -1;
        }
        *out = b->dim;
        return 0;
    }
    case EXPR_NEG: {
        int64_t v;
        if (eval_dim(L, s, e->lhs, &v)) return -1;
        *out = -v;
        return 0;
    }
    case EXPR_BINARY: {
        int64_t a, b;
        if (eval_dim(L, s, e->lhs, &a) || eval_dim(L, s, e->rhs, &b)) return -1;
        int overflow = 0;
        switch (e->op) {
        case '+': overflow = __builtin_add_overflow(a, b, out); break;
        case '-': overflow = __builtin_sub_overflow(a, b, out); break;
        case '*': overflow = mul_checked(a, b, out); break;
        case '/':
            if (b == 0 || a % b != 0) {
                dm_error(L->d, e->loc, "%lld / %lld is not a whole number", (long long)a, (long long)b);
                if (L->layer_path) dm_note(L->d, L->layer_loc, "in layer '%s', declared here", L->layer_path);
                return -1;
            }
            *out = a / b;
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

/* Real-valued constants (hyper-parameters, initialiser arguments): numbers, dims and
 * arithmetic. */
static int eval_number(lowerer *L, scope *s, const dm_expr *e, double *out) {
    switch (e->kind) {
    case EXPR_NUM:
        *out = e->num;
        return 0;
    case EXPR_NAME: {
        binding *b = scope_find(s, e->name);
        if (b && b->failed) return -1;
        if (b && b->kind == B_DIM) {
            *out = (double)b->dim;
            return 0;
        }
        if (strcmp(e->name, "true") == 0 || strcmp(e->name, "false") == 0) {
            *out = e->name[0] == 't';
            return 0;
        }
        dm_error(L->d, e->loc, "'%s' is not a constant", e->name);
        return -1;
    }
    case EXPR_NEG:
        if (eval_number(L, s, e->lhs, out)) return -1;
        *out = -*out;
        return 0;
    case EXPR_CALL:
        if (strcmp(e->name, "sqrt") == 0 && e->n_args == 1 && !e->has_dim_args && e->args[0]->kind != EXPR_KWARG) {
            if (eval_number(L, s, e->args[0], out)) return -1;
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
        if (eval_number(L, s, e->lhs, &a) || eval_number(L, s, e->rhs, &b)) return -1;
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

/* ---- types ----------------------------------------------------------------------------- */

static int axis_index(const ir_graph *g, const char *name) {
    for (int i = 0; i < g->n_axes; i++)
        if (strcmp(g->axes[i].name, name) == 0) return i;
    return -1;
}

/* The name a type prints for a dim written as e: a global dimension's own name, a
 * block parameter's name at the call site (D, not IN), or NULL for arithmetic. */
static const char *dim_name_of(scope *s, const dm_expr *e) {
    if (e->kind != EXPR_NAME) return NULL;
    binding *b = scope_find(s, e->name);
    return b && b->kind == B_DIM ? b->display : NULL;
}

/* A tensor over the element limit: its name, its dims with their values (the sizes --set
 * made), and, in a block, the layer whose declaration gave them. */
static void report_too_large(lowerer *L, const dm_type *t, const char *what, const ir_type *shape) {
    char sizes[512];
    ir_format_sizes(shape, sizes, sizeof sizes);
    double numel = 1;
    for (int i = 0; i < shape->rank; i++) numel *= (double)shape->shape[i];
    dm_error(L->d, t->loc, "tensor '%s' is too large: %s has %.3g elements (at most 2^40)", what, sizes, numel);
    if (L->layer_path) dm_note(L->d, L->layer_loc, "in layer '%s', declared here", L->layer_path);
}

/* The type written as t, for the tensor named what (for messages). A split that does not
 * divide its dim is reported and left out, so that the name is still defined and later
 * uses of it do not cascade into more errors. */
static int eval_type(lowerer *L, scope *s, const dm_type *t, const char *what, ir_type *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < IR_MAX_RANK; i++) out->split[i] = IR_REPLICATED;
    if (strcmp(t->dtype, "f32") == 0) out->dtype = DT_F32;
    else if (strcmp(t->dtype, "i32") == 0) out->dtype = DT_I32;
    else {
        dm_error(L->d, t->dtype_loc, "unknown dtype '%s' (expected f32 or i32)", t->dtype);
        return -1;
    }
    if (t->rank > IR_MAX_RANK) {
        dm_error(L->d, t->loc, "rank %d exceeds the maximum of %d", t->rank, IR_MAX_RANK);
        return -1;
    }
    out->rank = t->rank;
    int errors = 0, too_large = 0;
    int64_t numel = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t size;
        if (eval_dim(L, s, t->dims[i], &size)) { errors++; continue; }
        if (size <= 0) {
            dm_error(L->d, t->dims[i]->loc, "dimension must be positive, got %lld", (long long)size);
            errors++;
            continue;
        }
        if (mul_checked(numel, size, &numel) || numel > MAX_NUMEL) too_large = 1;
        out->shape[i] = size;
        const char *dn = dim_name_of(s, t->dims[i]);
        out->dim_name[i] = dn ? ir_intern(L->g, dn) : NULL;
        if (too_large) continue;
        if (t->axes[i]) {
            int a = axis_index(L->g, t->axes[i]);
            if (a < 0) {
                dm_error(L->d, t->axis_locs[i], "unknown mesh axis '%s'", t->axes[i]);
                if (L->g->n_axes == 0) dm_note(L->d, t->axis_locs[i], "declare the mesh first: mesh(%s = 2)", t->axes[i]);
                errors++;
                continue;
            }
            if (a == L->g->pipe_axis) {
                dm_error(L->d, t->axis_locs[i], "the pipeline axis splits the model into stages, not dims");
                dm_note(L->d, t->axis_locs[i], "dmc chooses the stages (dmc --explain shows them); drop '@%s'", t->axes[i]);
                errors++;
                continue;
            }
            if (size % L->g->axes[a].size != 0) {
                int64_t parts = L->g->axes[a].size, padded = (size + parts - 1) / parts * parts;
                dm_error(L->d, t->axis_locs[i], "'%s' cannot be split evenly: dim %d has size %lld, mesh axis '%s' has size %lld",
                         what, i, (long long)size, t->axes[i], (long long)parts);
                dm_note(L->d, t->axis_locs[i], "dims are not padded: make it a multiple of %lld (%lld), or drop '@%s'",
                        (long long)parts, (long long)padded, t->axes[i]);
                continue;
            }
            for (int k = 0; k < i; k++)
                if (out->split[k] == a) {
                    dm_error(L->d, t->axis_locs[i], "mesh axis '%s' already splits dim %d", t->axes[i], k);
                    errors++;
                }
            out->split[i] = (int8_t)a;
        }
    }
    if (too_large && !errors) report_too_large(L, t, what, out);
    return errors || too_large ? -1 : 0;
}

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

static ir_value *val(lowerer *L, int id) { return L->g->values[id]; }

static int lower_expr(lowerer *L, scope *s, const dm_expr *e);
static void bind_failed(lowerer *L, scope *s, const dm_stmt *st, binding_kind kind);

/* ---- layers and blocks ----------------------------------------------------------------- */

static instance *instantiate(lowerer *L, const dm_stmt *block, const char *path, const dm_expr *call, scope *caller);

static instance *new_instance(lowerer *L, const char *path) {
    instance *in = calloc(1, sizeof *in);
    if (!in) abort();
    in->path = ir_intern(L->g, path);
    in->env.parent = &L->global;
    in->env.prefix = ir_internf(L->g, "%s.", path);
    in->next_alloc = L->instances;
    L->instances = in;
    return in;
}

static const dm_stmt *find_block(lowerer *L, scope *s, const dm_expr *call) {
    binding *b = scope_find(s, call->name);
    if (!b || b->kind != B_BLOCK) {
        if (b) dm_error(L->d, call->loc, "'%s' is a %s, not a block", call->name, binding_kind_name(b->kind));
        else {
            char near[160];
            near_name(L, s, call->name, 1u << B_BLOCK, near, sizeof near);
            dm_error(L->d, call->loc, "unknown block '%s'%s", call->name, near);
        }
        return NULL;
    }
    if (call->n_args) {
        dm_error(L->d, call->args[0]->loc, "a layer declaration takes dimensions in [ ], not arguments");
        return NULL;
    }
    return b->block;
}

/* layer NAME = block[dims]  or  layer NAME = repeat N block[dims] */
static void lower_layer(lowerer *L, scope *s, const dm_stmt *st, const char *path) {
    const dm_stmt *block = find_block(L, s, st->value);
    if (!block) {
        bind_failed(L, s, st, B_LAYER);
        return;
    }
    binding *b = bind(L, s, st->name, B_LAYER, st->name_loc);
    if (!b) return;
    if (!st->repeat) {
        b->layer = instantiate(L, block, path, st->value, s);
        return;
    }
    int64_t count;
    if (eval_dim(L, s, st->repeat, &count)) return;
    if (count < 1 || count > MAX_REPEAT) {
        dm_error(L->d, st->repeat->loc, "repeat count must be between 1 and %d, got %lld", MAX_REPEAT, (long long)count);
        return;
    }
    instance *group = new_instance(L, path);
    group->members = calloc((size_t)count, sizeof(instance *));
    if (!group->members) abort();
    int errors_before = L->d->n_errors;
    for (int64_t i = 0; i < count; i++) {
        char member_path[MAX_PATH];
        if (snprintf(member_path, sizeof member_path, "%s.%lld", path, (long long)i) >= (int)sizeof member_path) {
            dm_error(L->d, st->name_loc, "the path of layer '%s' is longer than %d characters", path, MAX_PATH - 1);
            return;
        }
        group->members[i] = instantiate(L, block, member_path, st->value, s);
        /* the members are alike: the errors of the first would repeat in every other */
        if (!group->members[i] || L->d->n_errors > errors_before) return;
        group->n_members++;
    }
    b->layer = group;
}

/* The parameter's type, stored shape and initialiser into *out (0), or -1 after
 * reporting why it has none. */
static int define_param(lowerer *L, scope *s, const dm_stmt *st, const char *full_name, ir_value *out) {
    ir_type t;
    if (eval_type(L, s, st->type, full_name, &t)) return -1;
    if (t.dtype != DT_F32) {
        dm_error(L->d, st->type->dtype_loc, "parameters must be f32, '%s' is %s", st->name, ir_dtype_name(t.dtype));
        return -1;
    }
    ir_init init = {0};
    const dm_expr *e = st->value;
    const char *kind = e->kind == EXPR_NAME || e->kind == EXPR_CALL ? e->name : NULL;
    int want_args = 0;
    if (kind && strcmp(kind, "zeros") == 0) init.kind = INIT_ZEROS;
    else if (kind && strcmp(kind, "ones") == 0) init.kind = INIT_ONES;
    else if (kind && strcmp(kind, "xavier") == 0) init.kind = INIT_XAVIER;
    else if (kind && strcmp(kind, "normal") == 0) init.kind = INIT_NORMAL, want_args = 2;
    else if (kind && strcmp(kind, "uniform") == 0) init.kind = INIT_UNIFORM, want_args = 2;
    else {
        dm_error(L->d, e->loc, "unknown initialiser (expected zeros, ones, xavier, normal(mean, std) or uniform(lo, hi))");
        return -1;
    }
    int n_args = e->kind == EXPR_CALL ? e->n_args : 0;
    if (n_args != want_args) {
        dm_error(L->d, e->loc, "%s takes %d argument%s, got %d", kind, want_args, want_args == 1 ? "" : "s", n_args);
        return -1;
    }
    if (want_args && (eval_number(L, s, e->args[0], &init.a) || eval_number(L, s, e->args[1], &init.b))) return -1;
    if (init.kind == INIT_XAVIER && t.rank < 1) {
        dm_error(L->d, e->loc, "xavier needs at least one dimension");
        return -1;
    }
    ir_type stored = {0};
    if (st->stored) {
        /* the checkpoint's shape: the same elements, row-major, seen as other dims */
        dm_type shape = *st->stored;
        shape.dtype = "f32";
        if (eval_type(L, s, &shape, full_name, &stored)) return -1;
        for (int d = 0; d < shape.rank; d++)
            if (shape.axes[d]) {
                dm_error(L->d, shape.axis_locs[d], "the stored shape of a parameter cannot be split (split the dims of its type)");
                return -1;
            }
        if (ir_numel(&stored) != ir_numel(&t)) {
            char a[256], b[256];
            ir_format_type(L->g, &t, a, sizeof a);
            ir_format_type(L->g, &stored, b, sizeof b);
            dm_error(L->d, st->stored->loc, "stored shape %s has %lld elements, parameter '%s' (%s) has %lld", b,
                     (long long)ir_numel(&stored), st->name, a, (long long)ir_numel(&t));
            return -1;
        }
    }
    out->type = t;
    out->stored_rank = stored.rank;
    for (int d = 0; d < stored.rank; d++) out->stored_shape[d] = stored.shape[d];
    out->init = init;
    return 0;
}

static void lower_param(lowerer *L, scope *s, const dm_stmt *st, const char *full_name) {
    ir_value proto = {0};
    if (define_param(L, s, st, full_name, &proto)) {
        bind_failed(L, s, st, B_VALUE);
        return;
    }
    binding *b = bind(L, s, st->name, B_VALUE, st->name_loc);
    if (!b) return;
    ir_value *v = ir_add(L->g, OP_PARAM, NULL, 0, st->name_loc);
    v->type = proto.type;
    v->stored_rank = proto.stored_rank;
    memcpy(v->stored_shape, proto.stored_shape, sizeof v->stored_shape);
    v->annotated = 1;
    v->role = ROLE_PARAM;
    v->init = proto.init;
    v->name = ir_intern(L->g, full_name);
    v->param_index = L->g->n_params;
    ir_append_id(L->g, &L->g->params, &L->g->n_params, v->id);
    b->value = v->id;
}

static int statement_allowed_in_block(dm_stmt_kind k) {
    return k == STMT_DIM || k == STMT_PARAM || k == STMT_LAYER || k == STMT_LET || k == STMT_RETURN;
}

static void lower_dim(lowerer *L, scope *s, const dm_stmt *st, int overridable);

/* Reports, once, that the program passed a size limit; lowering then stops. */
static int over_limit(lowerer *L, dm_loc loc) {
    if (L->too_large) return 1;
    if (L->g->n_values <= MAX_FORWARD_VALUES && L->n_instances <= MAX_INSTANCES) return 0;
    if (L->n_instances > MAX_INSTANCES)
        dm_error(L->d, loc, "the program is too large: more than %d layer instances", MAX_INSTANCES);
    else
        dm_error(L->d, loc, "the program is too large: more than %d operations in the forward pass", MAX_FORWARD_VALUES);
    L->too_large = 1;
    return 1;
}

/* Creates the instance scope: dim parameters bound to the call's dims, then the
 * block's dims, params and nested layers in order. */
static instance *instantiate(lowerer *L, const dm_stmt *block, const char *path, const dm_expr *call, scope *caller) {
    L->n_instances++;
    if (over_limit(L, call->loc)) return NULL;
    if (L->depth >= MAX_INSTANCE_DEPTH) {
        dm_error(L->d, call->loc, "layers nested deeper than %d (is block '%s' recursive?)", MAX_INSTANCE_DEPTH, block->name);
        L->too_large = 1; /* one report, not one per branch of the recursion */
        return NULL;
    }
    if (call->n_dim_args != block->n_params) {
        dm_error(L->d, call->loc, "block '%s' takes %d dimension%s, got %d", block->name, block->n_params,
                 block->n_params == 1 ? "" : "s", call->n_dim_args);
        dm_note(L->d, block->name_loc, "'%s' is defined here", block->name);
        return NULL;
    }
    instance *in = new_instance(L, path);
    in->block = block;
    for (int i = 0; i < block->n_params; i++) {
        int64_t v;
        if (eval_dim(L, caller, call->dim_args[i], &v)) return NULL;
        binding *b = bind(L, &in->env, block->params[i], B_DIM, block->param_locs[i]);
        if (b) {
            b->dim = v;
            b->display = dim_name_of(caller, call->dim_args[i]);
        }
    }
    L->depth++;
    for (int i = 0; i < block->n_body; i++) {
        const dm_stmt *st = block->body[i];
        char full[MAX_PATH];
        if ((st->kind == STMT_PARAM || st->kind == STMT_LAYER) &&
            snprintf(full, sizeof full, "%s.%s", path, st->name) >= (int)sizeof full) {
            dm_error(L->d, st->name_loc, "the path of '%s' in layer '%s' is longer than %d characters", st->name, path, MAX_PATH - 1);
            continue;
        }
        if (st->kind == STMT_DIM) lower_dim(L, &in->env, st, 0);
        else if (st->kind == STMT_PARAM) lower_param(L, &in->env, st, full);
        else if (st->kind == STMT_LAYER) lower_layer(L, &in->env, st, full);
    }
    L->depth--;
    return in;
}

/* `NAME : TYPE = EXPR`, at the top level or in a block: the value must have TYPE's dtype
 * and shape; the sharding TYPE writes is kept as an annotation (passes/shard.c reshards
 * the value to it). Returns nonzero after an error. */
static int check_let_type(lowerer *L, scope *s, const dm_stmt *st, int v) {
    if (!st->type) return 0;
    ir_type want;
    if (eval_type(L, s, st->type, st->name, &want)) return 1;
    ir_type *have = &val(L, v)->type;
    int same = want.dtype == have->dtype && want.rank == have->rank;
    for (int i = 0; same && i < want.rank; i++) same = want.shape[i] == have->shape[i];
    if (!same) {
        char ws[256], hs[256];
        ir_format_type(L->g, &want, ws, sizeof ws);
        ir_format_type(L->g, have, hs, sizeof hs);
        dm_error(L->d, st->type->loc, "'%s' is declared %s but its value is %s", st->name, ws, hs);
        return 1;
    }
    if (val(L, v)->role == ROLE_TEMP) {
        for (int i = 0; i < want.rank; i++) have->split[i] = want.split[i];
        val(L, v)->annotated = 1;
    }
    return 0;
}

/* Calls one instance on its arguments: binds them, lowers the lets, returns the value
 * of `return`. */
static int call_instance(lowerer *L, instance *in, const int *args, int n_args, const dm_expr *call) {
    const dm_stmt *block = in->block;
    if (over_limit(L, call->loc)) return -1;
    if (n_args != block->n_inputs) {
        dm_error(L->d, call->loc, "layer '%s' (block '%s') takes %d argument%s, got %d", in->path, block->name,
                 block->n_inputs, block->n_inputs == 1 ? "" : "s", n_args);
        return -1;
    }
    if (L->depth >= MAX_INSTANCE_DEPTH) {
        dm_error(L->d, call->loc, "layer calls nested deeper than %d", MAX_INSTANCE_DEPTH);
        return -1;
    }
    scope locals = {.parent = &in->env, .prefix = in->env.prefix};
    for (int i = 0; i < n_args; i++) {
        binding *b = bind(L, &locals, block->inputs[i], B_VALUE, block->input_locs[i]);
        if (b) b->value = args[i];
    }
    /* values made by this call (not aliases of earlier ones) take names from it */
    int result = -1, returned = 0, call_start = L->g->n_values;
    L->depth++;
    for (int i = 0; i < block->n_body && !returned; i++) {
        const dm_stmt *st = block->body[i];
        if (st->kind == STMT_LET) {
            int let_start = L->g->n_values;
            int v = lower_expr(L, &locals, st->value);
            if (v < 0 || check_let_type(L, &locals, st, v)) {
                bind_failed(L, &locals, st, B_VALUE);
                continue;
            }
            if (v >= let_start && val(L, v)->role == ROLE_TEMP) /* not an alias of an earlier value */
                val(L, v)->name = ir_internf(L->g, "%s.%s", in->path, st->name);
            binding *b = bind(L, &locals, st->name, B_VALUE, st->name_loc);
            if (b) b->value = v;
        } else if (st->kind == STMT_RETURN) {
            result = lower_expr(L, &locals, st->value);
            returned = 1;
        }
    }
    L->depth--;
    scope_free(&locals);
    if (L->depth == 0) {
        /* a top-level call: its values are one segment (passes/recompute.c) */
        int segment = ++L->segments;
        for (int i = call_start; i < L->g->n_values; i++)
            if (val(L, i)->role == ROLE_TEMP) {
                val(L, i)->segment = segment;
                val(L, i)->marked = L->in_recompute > 0;
            }
    }
    if (!returned) {
        dm_error(L->d, call->loc, "block '%s' has no return statement", block->name);
        return -1;
    }
    if (result >= call_start && val(L, result)->role == ROLE_TEMP) val(L, result)->name = in->path;
    return result;
}

static int call_layer(lowerer *L, instance *in, const int *args, int n_args, const dm_expr *call) {
    if (!in->members) return call_instance(L, in, args, n_args, call);
    /* a repeat group chains its members: x -> h.0 -> h.1 -> ... */
    if (n_args != 1) {
        dm_error(L->d, call->loc, "repeated layer '%s' takes exactly one argument, got %d", in->path, n_args);
        return -1;
    }
    int x = args[0];
    for (int i = 0; i < in->n_members && x >= 0; i++) x = call_instance(L, in->members[i], &x, 1, call);
    return x;
}

/* Resolves a dotted path (fc1.weight, h.0.attn) through layer instances. */
static binding *resolve_path(lowerer *L, scope *s, const char *name, dm_loc loc) {
    binding *b = scope_find(s, name);
    if (b) return b;
    const char *dot = strchr(name, '.');
    if (!dot) return NULL;
    char head[MAX_PATH];
    size_t n = (size_t)(dot - name);
    if (n >= sizeof head) return NULL;
    memcpy(head, name, n);
    head[n] = 0;
    binding *h = scope_find(s, head);
    if (h && h->kind == B_LAYER && !h->layer) return &L->failed_path; /* its declaration failed */
    if (!h || h->kind != B_LAYER) return NULL;
    instance *in = h->layer;
    const char *rest = dot + 1;
    while (in && in->members) {
        /* a repeat group: the next component is the member index */
        char *end;
        long idx = strtol(rest, &end, 10);
        if (end == rest || (*end && *end != '.') || idx < 0 || idx >= in->n_members) {
            dm_error(L->d, loc, "'%s': layer '%s' has members 0 to %d", name, in->path, in->n_members - 1);
            return NULL;
        }
        in = in->members[idx];
        if (!*end) return NULL;
        rest = end + 1;
    }
    if (!in) return NULL;
    return resolve_path(L, &in->env, rest, loc);
}

/* A statement whose definition failed (a let, dim, input, param or layer) still defines
 * its name, as failed, so that later uses do not each report it as unknown. */
static void bind_failed(lowerer *L, scope *s, const dm_stmt *st, binding_kind kind) {
    binding *b = bind(L, s, st->name, kind, st->name_loc);
    if (b) {
        b->value = -1;
        b->failed = 1;
    }
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
    default: return 0;
    }
}

static int lower_expr(lowerer *L, scope *s, const dm_expr *e) {
    switch (e->kind) {
    case EXPR_NUM:
        return make_const(L, e->num, e->loc);
    case EXPR_NAME: {
        binding *b = resolve_path(L, s, e->name, e->loc);
        if (!b) {
            char near[160];
            near_name(L, s, e->name, 1u << B_VALUE | 1u << B_DIM, near, sizeof near);
            dm_error(L->d, e->loc, "unknown name '%s'%s", e->name, near);
            return -1;
        }
        if (b->failed) return -1;
        if (b->kind == B_DIM) return make_const(L, (double)b->dim, e->loc);
        if (b->kind != B_VALUE) {
            dm_error(L->d, e->loc, "'%s' is a %s, not a value%s", e->name, binding_kind_name(b->kind),
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
            return make_const(L, r, e->loc);
        }
        ir_op op = e->op == '+' ? OP_ADD : e->op == '-' ? OP_SUB : e->op == '*' ? OP_MUL : OP_DIV;
        int ab[2] = {a, b};
        return make_typed(L, s, op, ab, 2, e->loc);
    }
    case EXPR_CALL: {
        int out;
        if (lower_builtin(L, s, e, &out)) return out;
        binding *b = resolve_path(L, s, e->name, e->loc);
        if (b && b->failed) return -1;
        if (!b || b->kind != B_LAYER) {
            if (b && b->kind == B_BLOCK)
                dm_error(L->d, e->loc, "'%s' is a block; declare a layer first: layer NAME = %s[...]", e->name, e->name);
            else if (b)
                dm_error(L->d, e->loc, "'%s' is a %s, not a function or layer", e->name, binding_kind_name(b->kind));
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
        return call_layer(L, b->layer, args, e->n_args, e);
    }
    case EXPR_LIST:
        dm_error(L->d, e->loc, "a list is only allowed as the shape argument of reshape");
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
        if (eval_number(L, s, kw->lhs, &eps)) return 1;
        if (!(eps > 0)) {
            dm_error(L->d, kw->lhs->loc, "layernorm eps must be positive, got %g", eps);
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
    if (axis < 0 || eval_dim(L, s, e->args[2], &start) || eval_dim(L, s, e->args[3], &end)) return 1;
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

/* softmax(causal_mask(s / c)), the attention pattern, becomes one softmax that scales
 * by 1 / c and sees only the keys up to each query: no masked or scaled copy of the
 * scores is made, and only the visible keys are exponentiated. *x is the mask just
 * made (and the division, when there is one); they are dropped from the graph, which
 * nothing else can reference yet. */
static int fuse_causal(lowerer *L, int *x, double *scale) {
    ir_graph *g = L->g;
    ir_value *mask = val(L, *x);
    if (mask->op != OP_CAUSAL_MASK || *x != g->n_values - 1) return 0;
    int inner = mask->operands[0];
    ir_drop_last(g);
    ir_value *in = val(L, inner);
    if ((in->op == OP_DIV || in->op == OP_MUL) && inner == g->n_values - 1) {
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
                                                "reshape", "transpose", "cross_entropy", "recompute"};

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
    int n = n_functions + visible_names(s, 1u << B_LAYER, names + n_functions, MAX_NAMES - n_functions);
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
    if (x < 0 || eval_number(L, s, e->args[1], &p)) return 1;
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

static int lower_builtin(lowerer *L, scope *s, const dm_expr *e, int *out) {
    const char *f = e->name;
    *out = -1;
    if (strcmp(f, "dropout") == 0) return lower_dropout(L, s, e, out);
    ir_op unary = ir_op_by_name(f);
    if (unary != OP_COUNT && ir_op_info_of(unary)->cls == OPC_UNARY) {
        if (want_args(L, e, 1, 1)) return 1;
        int x = lower_expr(L, s, e->args[0]);
        double folded;
        if (x >= 0 && val(L, x)->op == OP_CONST && fold_unary(unary, val(L, x)->scalar, &folded))
            *out = make_const(L, folded, e->loc);
        else if (x >= 0)
            *out = make_typed(L, s, unary, &x, 1, e->loc);
        return 1;
    }
    if (strcmp(f, "recompute") == 0) {
        /* recompute(h(x)): the layer calls inside keep only their inputs for the backward */
        if (want_args(L, e, 1, 1)) return 1;
        L->in_recompute++;
        *out = lower_expr(L, s, e->args[0]);
        L->in_recompute--;
        return 1;
    }
    if (strcmp(f, "softmax") == 0) {
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
    if (strcmp(f, "causal_mask") == 0) {
        if (want_args(L, e, 1, 1)) return 1;
        int x = lower_expr(L, s, e->args[0]);
        if (x < 0) return 1;
        ir_value *v = make(L, s, OP_CAUSAL_MASK, &x, 1, e->loc);
        v->scalar = -INFINITY;
        *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
        return 1;
    }
    if (strcmp(f, "layernorm") == 0) return lower_layernorm(L, s, e, out);
    if (strcmp(f, "slice") == 0) return lower_slice(L, s, e, out);
    if (strcmp(f, "embed") == 0) {
        if (want_args(L, e, 2, 2)) return 1;
        int ops[2] = {lower_expr(L, s, e->args[0]), lower_expr(L, s, e->args[1])};
        if (ops[0] >= 0 && ops[1] >= 0) *out = make_typed(L, s, OP_EMBED, ops, 2, e->loc);
        return 1;
    }
    if (strcmp(f, "sum") == 0 || strcmp(f, "mean") == 0) {
        if (want_args(L, e, 1, 1 + IR_MAX_RANK)) return 1;
        int x = lower_expr(L, s, e->args[0]);
        if (x < 0) return 1;
        const ir_type *t = &val(L, x)->type;
        uint32_t axes = 0;
        if (e->n_args == 1) axes = (1u << t->rank) - 1;
        for (int i = 1; i < e->n_args; i++) {
            int a = resolve_axis(L, t, e->args[i]);
            if (a < 0) return 1;
            axes |= 1u << a;
        }
        ir_value *v = make(L, s, f[0] == 's' ? OP_SUM : OP_MEAN, &x, 1, e->loc);
        v->axes = axes;
        *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
        return 1;
    }
    if (strcmp(f, "reshape") == 0) {
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
            if (eval_dim(L, s, shape->args[i], &size)) return 1;
            if (size == -1 && infer < 0) {
                infer = i;
                continue;
            }
            if (size <= 0) {
                dm_error(L->d, shape->args[i]->loc, "dimension must be positive (or -1 once), got %lld", (long long)size);
                return 1;
            }
            v->type.shape[i] = size;
            const char *dn = dim_name_of(s, shape->args[i]);
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
    if (strcmp(f, "transpose") == 0) {
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
        }
        ir_value *v = make(L, s, OP_TRANSPOSE, &x, 1, e->loc);
        for (int i = 0; i < t->rank; i++) v->perm[i] = i;
        v->perm[d0] = d1;
        v->perm[d1] = d0;
        *out = shapes_infer(L->g, v, L->d) ? -1 : v->id;
        return 1;
    }
    if (strcmp(f, "cross_entropy") == 0) {
        if (want_args(L, e, 2, 2)) return 1;
        int ab[2] = {lower_expr(L, s, e->args[0]), lower_expr(L, s, e->args[1])};
        if (ab[0] < 0 || ab[1] < 0) return 1;
        int stats = make_typed(L, s, OP_XENT_STATS, ab, 2, e->loc);
        if (stats >= 0 && val(L, ab[0])->name) val(L, stats)->name = ir_internf(L->g, "%s_stats", val(L, ab[0])->name);
        if (stats >= 0) *out = make_typed(L, s, OP_CROSS_ENTROPY, &stats, 1, e->loc);
        return 1;
    }
    return 0;
}

/* ---- statements ------------------------------------------------------------------------ */

static dm_override *find_override(dm_override *list, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0) return &list[i];
    return NULL;
}

static void lower_dim(lowerer *L, scope *s, const dm_stmt *st, int overridable) {
    int64_t v;
    if (eval_dim(L, s, st->value, &v)) {
        bind_failed(L, s, st, B_DIM);
        return;
    }
    dm_override *o = overridable ? find_override(L->opts->dims, L->opts->n_dims, st->name) : NULL;
    if (o) {
        v = o->value;
        o->used = 1;
    }
    if (v <= 0) {
        dm_error(L->d, st->value->loc, "dimension '%s' must be positive, got %lld", st->name, (long long)v);
        bind_failed(L, s, st, B_DIM);
        return;
    }
    ir_graph *gm = L->g;
    if (overridable && gm->batch_dim && strcmp(gm->batch_dim, st->name) == 0) {
        /* the graph is one micro-batch: the step's batch is its microbatches */
        if (v % gm->microbatches != 0) {
            dm_error(L->d, st->value->loc, "the batch '%s' = %lld cannot be split into %d micro-batches", st->name,
                     (long long)v, gm->microbatches);
            dm_note(L->d, gm->schedule_loc.line > 0 ? gm->schedule_loc : st->value->loc,
                    "micro-batches are equal: make '%s' a multiple of %d", st->name, gm->microbatches);
        } else {
            gm->batch_whole = v;
            v /= gm->microbatches;
        }
    }
    binding *b = bind(L, s, st->name, B_DIM, st->name_loc);
    if (!b) return;
    b->dim = v;
    b->display = overridable ? b->name : NULL;
    if (overridable) {
        ir_graph *g = L->g;
        g->dim_names = ir_grow(g->dim_names, g->n_dims, sizeof *g->dim_names);
        g->dim_values = ir_grow(g->dim_values, g->n_dims, sizeof *g->dim_values);
        g->dim_names[g->n_dims] = b->name;
        g->dim_values[g->n_dims] = v;
        g->n_dims++;
    }
}

static void lower_mesh(lowerer *L, const dm_stmt *st) {
    ir_graph *g = L->g;
    if (g->n_axes) {
        dm_error(L->d, st->loc, "the mesh is already declared");
        dm_note(L->d, g->axes[0].loc, "first declared here");
        return;
    }
    for (int i = 0; i < st->n_args; i++) {
        const dm_expr *a = st->args[i];
        if (a->kind != EXPR_KWARG) {
            dm_error(L->d, a->loc, "mesh axes are written name = size");
            continue;
        }
        if (g->n_axes == IR_MAX_AXES) {
            dm_error(L->d, a->loc, "at most %d mesh axes", IR_MAX_AXES);
            return;
        }
        if (axis_index(g, a->name) >= 0) {
            dm_error(L->d, a->loc, "mesh axis '%s' declared twice", a->name);
            continue;
        }
        int64_t size;
        if (eval_dim(L, &L->global, a->lhs, &size)) continue;
        dm_override *o = find_override(L->opts->mesh, L->opts->n_mesh, a->name);
        if (o) size = o->value, o->used = 1;
        if (size < 1 || size > 65536) {
            dm_error(L->d, a->lhs->loc, "mesh axis '%s' must have a size from 1 to 65536, got %lld", a->name, (long long)size);
            continue;
        }
        if (strcmp(a->name, "pipeline") == 0) g->pipe_axis = g->n_axes;
        g->axes[g->n_axes].name = ir_intern(g, a->name);
        g->axes[g->n_axes].size = size;
        g->axes[g->n_axes].loc = a->loc;
        g->n_axes++;
    }
}

static void lower_optimizer(lowerer *L, const dm_stmt *st) {
    ir_optimizer *o = &L->g->optimizer;
    const dm_expr *call = st->value;
    if (o->kind != OPTIM_NONE) {
        dm_error(L->d, st->loc, "the optimizer is already declared");
        return;
    }
    if (call->has_dim_args) {
        dm_error(L->d, call->loc, "%s is a function; call it with ( )", call->name);
        return;
    }
    struct { const char *name; double *slot; } hypers[10];
    int n = 0;
    double nesterov_value = 0;   /* a flag, read as a number: nesterov = true */
    *o = (ir_optimizer){.lr = 1e-3, .loc = st->loc};
    if (strcmp(call->name, "sgd") == 0) {
        o->kind = OPTIM_SGD;
        hypers[n].name = "lr", hypers[n++].slot = &o->lr;
        hypers[n].name = "momentum", hypers[n++].slot = &o->momentum;
        hypers[n].name = "dampening", hypers[n++].slot = &o->dampening;
        hypers[n].name = "weight_decay", hypers[n++].slot = &o->weight_decay;
        hypers[n].name = "nesterov", hypers[n++].slot = &nesterov_value;
    } else if (strcmp(call->name, "adamw") == 0) {
        o->kind = OPTIM_ADAMW;
        o->beta1 = 0.9, o->beta2 = 0.999, o->eps = 1e-8, o->weight_decay = 0.01;
        hypers[n].name = "lr", hypers[n++].slot = &o->lr;
        hypers[n].name = "beta1", hypers[n++].slot = &o->beta1;
        hypers[n].name = "beta2", hypers[n++].slot = &o->beta2;
        hypers[n].name = "eps", hypers[n++].slot = &o->eps;
        hypers[n].name = "weight_decay", hypers[n++].slot = &o->weight_decay;
    } else {
        static const char *const optimizers[] = {"sgd", "adamw"};
        char hint[160];
        dm_format_suggestion(hint, sizeof hint, dm_nearest_name(call->name, optimizers, 2), "valid", optimizers, 2);
        dm_error(L->d, call->loc, "unknown optimizer '%s'%s", call->name, hint);
        return;
    }
    /* the learning-rate schedule and clipping, either optimizer's (ir/schedule.c); decay is a name */
    hypers[n].name = "warmup", hypers[n++].slot = &o->warmup;
    hypers[n].name = "min_lr", hypers[n++].slot = &o->min_lr;
    hypers[n].name = "clip", hypers[n++].slot = &o->clip;
    for (int i = 0; i < call->n_args; i++) {
        const dm_expr *a = call->args[i];
        if (a->kind != EXPR_KWARG) {
            dm_error(L->d, a->loc, "optimizer settings are written name = value");
            continue;
        }
        if (strcmp(a->name, "decay") == 0) {
            if (a->lhs->kind != EXPR_NAME || ir_decay_from_name(a->lhs->name, &o->decay) != 0)
                dm_error(L->d, a->lhs->loc, "decay is none, cosine or linear%s%s%s", a->lhs->kind == EXPR_NAME ? ", not '" : "",
                         a->lhs->kind == EXPR_NAME ? a->lhs->name : "", a->lhs->kind == EXPR_NAME ? "'" : "");
            continue;
        }
        double *slot = NULL;
        const char *names[sizeof hypers / sizeof *hypers + 1];
        for (int k = 0; k < n; k++) {
            names[k] = hypers[k].name;
            if (strcmp(hypers[k].name, a->name) == 0) slot = hypers[k].slot;
        }
        names[n] = "decay"; /* a name, not a number: handled above, valid all the same */
        if (!slot) {
            char hint[512];
            dm_format_suggestion(hint, sizeof hint, dm_nearest_name(a->name, names, n + 1), "valid", names, n + 1);
            dm_error(L->d, a->loc, "unknown setting '%s' for %s%s", a->name, call->name, hint);
            continue;
        }
        if (eval_number(L, &L->global, a->lhs, slot)) continue;
        if (*slot < 0 || !isfinite(*slot)) dm_error(L->d, a->lhs->loc, "'%s' must be a finite, non-negative number", a->name);
        else if (slot == &o->clip && *slot == 0)
            dm_error(L->d, a->lhs->loc, "clip is the largest gradient norm let through, above 0 (leave it out not to clip)");
    }
    o->nesterov = nesterov_value != 0;
    if (o->kind == OPTIM_SGD && o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        dm_error(L->d, call->loc, "nesterov momentum requires a momentum and zero dampening");
    if (o->kind == OPTIM_ADAMW && (o->beta1 >= 1 || o->beta2 >= 1))
        dm_error(L->d, call->loc, "adamw betas must be below 1");
    ir_check_schedule(o, call->loc, L->d);
}

/* The count of a schedule or accumulate statement: a positive integer. */
static int micro_count(lowerer *L, const dm_expr *e, const char *what, int *out) {
    int64_t v;
    if (eval_dim(L, &L->global, e, &v)) return -1;
    if (v < 1 || v > 4096) {
        dm_error(L->d, e->loc, "%s must be from 1 to 4096, got %lld", what, (long long)v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* `schedule 1f1b(microbatches = 8)` and `accumulate = 4`: the micro-batches of a step
 * (the same count: Megatron-LM's number of micro-batches is its accumulation) and the
 * pipeline schedule. Read before anything else: the batch dim is lowered divided. */
static void lower_schedule(lowerer *L, const dm_stmt *st, int *micro, dm_loc *micro_loc) {
    ir_graph *g = L->g;
    int m = 0;
    dm_loc at = st->loc;
    if (st->kind == STMT_ACCUMULATE) {
        if (micro_count(L, st->value, "accumulate", &m)) return;
    } else {
        const dm_expr *call = st->value;
        int kind = pipe_kind_by_name(call->name);
        if (call->has_dim_args || kind < 0) {
            dm_error(L->d, call->loc, "unknown schedule '%s' (expected gpipe, 1f1b, interleaved or pipedream_2bw)", call->name);
            return;
        }
        g->schedule = kind;
        for (int i = 0; i < call->n_args; i++) {
            const dm_expr *a = call->args[i];
            if (a->kind == EXPR_KWARG && strcmp(a->name, "cuts") == 0) {
                if (a->lhs->kind != EXPR_LIST) dm_error(L->d, a->lhs->loc, "cuts are a list of values: cuts = [h1, h2]");
                else L->cuts = a->lhs;
                continue;
            }
            if (a->kind == EXPR_KWARG && strcmp(a->name, "chunks") == 0) {
                if (kind != PIPE_INTERLEAVED)
                    dm_error(L->d, a->loc, "chunks = v goes with the interleaved schedule, not %s", call->name);
                else if (!micro_count(L, a->lhs, "chunks", &g->chunks))
                    g->chunks_loc = a->loc;
                continue;
            }
            if (a->kind != EXPR_KWARG || strcmp(a->name, "microbatches") != 0) {
                dm_error(L->d, a->loc, "a schedule takes microbatches = M, cuts = [values] and (interleaved) chunks = v");
                continue;
            }
            if (micro_count(L, a->lhs, "microbatches", &m)) return;
            at = a->loc;
        }
    }
    if (m == 0) return;
    if (*micro && *micro != m) {
        dm_error(L->d, at, "%d micro-batches here, %d before", m, *micro);
        dm_note(L->d, *micro_loc, "accumulate and microbatches count the same micro-batches; give one");
        return;
    }
    *micro = m;
    *micro_loc = at;
}

/* `zero = 2`: the ZeRO stage (passes/zero.c says what each splits). */
static void lower_zero(lowerer *L, const dm_stmt *st) {
    int64_t v;
    if (eval_dim(L, &L->global, st->value, &v)) return;
    if (v < 0 || v > 3) {
        dm_error(L->d, st->value->loc,
                 "zero is 0, 1 (optimizer state split over data), 2 (gradients too) or 3 (parameters too), got %lld",
                 (long long)v);
        return;
    }
    L->g->zero = (int)v;
    L->g->zero_loc = st->loc;
}

/* cuts = [h1, h2]: each a value of the program, in order; stage k + 1 starts after
 * the k-th. */
static void resolve_cuts(lowerer *L, const dm_expr *list) {
    ir_graph *g = L->g;
    g->cuts_loc = list->loc;
    g->cut_after = calloc((size_t)list->n_args + 1, sizeof *g->cut_after);
    if (!g->cut_after) abort();
    for (int i = 0; i < list->n_args; i++) {
        const dm_expr *e = list->args[i];
        binding *b = e->kind == EXPR_NAME ? scope_find(&L->global, e->name) : NULL;
        if (b && b->failed) continue;
        if (!b || b->kind != B_VALUE || b->value < 0 || val(L, b->value)->phase != PHASE_FORWARD ||
            ir_op_info_of(val(L, b->value)->op)->cls == OPC_SOURCE) {
            dm_error(L->d, e->loc, "a cut names a value the program computes (h1 = ...)");
            continue;
        }
        ir_value *v = val(L, b->value);
        if (g->n_cuts && g->cut_after[g->n_cuts - 1]->id >= v->id) {
            dm_error(L->d, e->loc, "cuts are listed in program order: '%s' comes before the previous one", e->name);
            continue;
        }
        g->cut_after[g->n_cuts++] = v;
    }
}

/* The batch dim: the leading dim of every input, a global dimension by name. */
static const char *batch_dim_name(lowerer *L, const dm_program *prog) {
    const char *name = NULL;
    for (int i = 0; i < prog->n_stmts; i++) {
        const dm_stmt *st = prog->stmts[i];
        if (st->kind != STMT_INPUT || !st->type) continue;
        const dm_expr *lead = st->type->rank > 0 ? st->type->dims[0] : NULL;
        if (!lead || lead->kind != EXPR_NAME) {
            dm_error(L->d, lead ? lead->loc : st->type->loc,
                     "micro-batches split the inputs' leading dim: it must be the batch, named by a dim");
            return NULL;
        }
        if (name && strcmp(name, lead->name) != 0) {
            dm_error(L->d, lead->loc, "micro-batches split the inputs' leading dim: '%s' here, '%s' before", lead->name, name);
            return NULL;
        }
        name = lead->name;
    }
    return name;
}

static void check_block_body(lowerer *L, const dm_stmt *block) {
    int has_return = 0;
    for (int i = 0; i < block->n_body; i++) {
        const dm_stmt *st = block->body[i];
        if (!statement_allowed_in_block(st->kind)) dm_error(L->d, st->loc, "this statement is not allowed inside a block");
        if (st->kind == STMT_RETURN) has_return = 1;
    }
    if (!has_return) dm_error(L->d, block->name_loc, "block '%s' has no return statement", block->name);
}

static void lower_top(lowerer *L, const dm_stmt *st, dm_loc *loss_loc) {
    scope *s = &L->global;
    ir_graph *g = L->g;
    switch (st->kind) {
    case STMT_DIM: lower_dim(L, s, st, 1); break;
    case STMT_MESH: break; /* lowered first, see dm_lower */
    case STMT_BLOCK: {
        check_block_body(L, st);
        binding *b = bind(L, s, st->name, B_BLOCK, st->name_loc);
        if (b) b->block = st;
        break;
    }
    case STMT_INPUT: {
        ir_type t;
        if (eval_type(L, s, st->type, st->name, &t)) {
            bind_failed(L, s, st, B_VALUE);
            break;
        }
        binding *b = bind(L, s, st->name, B_VALUE, st->name_loc);
        if (!b) break;
        ir_value *v = ir_add(g, OP_INPUT, NULL, 0, st->name_loc);
        v->type = t;
        v->annotated = 1;
        v->role = ROLE_INPUT;
        v->name = b->name;
        ir_append_id(g, &g->inputs, &g->n_inputs, v->id);
        b->value = v->id;
        break;
    }
    case STMT_PARAM: lower_param(L, s, st, st->name); break;
    case STMT_LAYER:
        L->layer_path = st->name;
        L->layer_loc = st->loc;
        lower_layer(L, s, st, st->name);
        L->layer_path = NULL;
        break;
    case STMT_LET: {
        int first_new = g->n_values;
        int v = lower_expr(L, s, st->value);
        if (v < 0) {
            bind_failed(L, s, st, B_VALUE);
            break;
        }
        if (check_let_type(L, s, st, v)) {
            bind_failed(L, s, st, B_VALUE);
            break;
        }
        binding *b = bind(L, s, st->name, B_VALUE, st->name_loc);
        if (!b) break;
        if (v >= first_new && val(L, v)->role == ROLE_TEMP) val(L, v)->name = b->name;
        b->value = v;
        break;
    }
    case STMT_OUTPUT:
        for (int i = 0; i < st->n_args; i++) {
            const dm_expr *e = st->args[i];
            if (e->kind != EXPR_NAME) {
                dm_error(L->d, e->loc, "output takes names of values");
                continue;
            }
            int v = lower_expr(L, s, e);
            if (v < 0) continue;
            if (val(L, v)->role == ROLE_CONST) {
                dm_error(L->d, e->loc, "'%s' is a constant, not a computed value", e->name);
                continue;
            }
            int twice = 0;
            for (int k = 0; k < g->n_outputs; k++) twice |= g->outputs[k] == v;
            if (twice) {
                dm_error(L->d, e->loc, "'%s' is already an output", e->name);
                continue;
            }
            ir_append_id(g, &g->outputs, &g->n_outputs, v);
        }
        break;
    case STMT_MINIMIZE: {
        if (g->loss >= 0) {
            dm_error(L->d, st->loc, "the loss is already chosen");
            dm_note(L->d, *loss_loc, "by this statement");
            break;
        }
        binding *b = scope_find(s, st->name);
        if (b && b->failed) break; /* its definition failed and was reported */
        if (!b || b->kind != B_VALUE) {
            dm_error(L->d, st->name_loc, b ? "'%s' is not a value" : "unknown name '%s'", st->name);
            break;
        }
        if (b->value < 0) break; /* its definition failed and was reported */
        const ir_type *t = &val(L, b->value)->type;
        if (t->rank != 0 || t->dtype != DT_F32) {
            char ts[256];
            ir_format_type(g, t, ts, sizeof ts);
            dm_error(L->d, st->name_loc, "the loss must be an f32 scalar, '%s' is %s", st->name, ts);
            break;
        }
        g->loss = b->value;
        g->loss_loc = *loss_loc = st->loc;
        break;
    }
    case STMT_OPTIMIZER: lower_optimizer(L, st); break;
    case STMT_SCHEDULE:
    case STMT_ACCUMULATE: break; /* lowered first, see dm_lower */
    case STMT_ZERO: lower_zero(L, st); break;
    case STMT_RETURN: dm_error(L->d, st->loc, "return is only allowed inside a block"); break;
    }
}

/* --set and --mesh names the program does not have, with the nearest it has. */
static void report_unused_overrides(lowerer *L) {
    const dm_lower_options *opts = L->opts;
    const ir_graph *g = L->g;
    const char *axes[IR_MAX_AXES];
    for (int a = 0; a < g->n_axes; a++) axes[a] = g->axes[a].name;
    char hint[1024];
    for (int i = 0; i < opts->n_dims; i++)
        if (!opts->dims[i].used) {
            const char *name = opts->dims[i].name;
            dm_format_suggestion(hint, sizeof hint, dm_nearest_name(name, g->dim_names, g->n_dims), "dims", g->dim_names,
                                 g->n_dims);
            fprintf(L->d->out, "dmc: error: --set %s: the program has no dimension named '%s'%s\n", name, name, hint);
            L->d->n_errors++;
        }
    for (int i = 0; i < opts->n_mesh; i++)
        if (!opts->mesh[i].used) {
            const char *name = opts->mesh[i].name;
            dm_format_suggestion(hint, sizeof hint, dm_nearest_name(name, axes, g->n_axes), "axes", axes, g->n_axes);
            fprintf(L->d->out, "dmc: error: --mesh %s: the program's mesh has no axis named '%s'%s\n", name, name, hint);
            L->d->n_errors++;
        }
}

/* --sequence-parallel splits rows over the mesh axis named tensor: the mesh must have one
 * (of any size: one rank is the program without it). */
static void check_sequence_parallel(lowerer *L) {
    const ir_graph *g = L->g;
    if (!L->opts->sequence_parallel) return;
    const char *axes[IR_MAX_AXES];
    for (int a = 0; a < g->n_axes; a++) {
        axes[a] = g->axes[a].name;
        if (strcmp(axes[a], "tensor") == 0) return;
    }
    char hint[1024];
    dm_format_suggestion(hint, sizeof hint, NULL, "axes", axes, g->n_axes);
    fprintf(L->d->out, "dmc: error: --sequence-parallel splits rows over the mesh axis named 'tensor', which the "
                       "program's mesh does not have%s\n", hint);
    L->d->n_errors++;
}

void dm_lower_set_choices(ir_graph *g, const dm_lower_options *opts) {
    if (opts->zero >= 0) g->zero = opts->zero;
    g->recompute = opts->recompute;
    g->compress = opts->compress;
    g->sequence_parallel = opts->sequence_parallel;
    g->param_servers = opts->param_servers;
}

ir_graph *dm_lower(const dm_program *prog, const dm_lower_options *opts, dm_diag *d) {
    lowerer L = {.g = ir_graph_new(opts->model), .d = d, .opts = opts, .failed_path = {.kind = B_VALUE, .value = -1, .failed = 1}};
    L.global.prefix = "";
    int errors_before = d->n_errors;
    /* The mesh first: types anywhere in the file may name its axes. */
    for (int i = 0; i < prog->n_stmts; i++)
        if (prog->stmts[i]->kind == STMT_MESH) lower_mesh(&L, prog->stmts[i]);
    /* Then the micro-batches: the batch dim is lowered as one micro-batch. */
    int micro = 0;
    dm_loc micro_loc = {0};
    for (int i = 0; i < prog->n_stmts; i++)
        if (prog->stmts[i]->kind == STMT_SCHEDULE || prog->stmts[i]->kind == STMT_ACCUMULATE)
            lower_schedule(&L, prog->stmts[i], &micro, &micro_loc);
    /* --schedule replaces the program's schedule, its chunks with it unless --chunks gives them */
    if (opts->schedule >= 0 && opts->schedule != L.g->schedule) L.g->chunks = 0, L.g->chunks_loc = (dm_loc){0};
    if (opts->schedule >= 0) L.g->schedule = opts->schedule;
    if (opts->chunks > 0) L.g->chunks = opts->chunks, L.g->chunks_loc = (dm_loc){0};
    if (opts->microbatches > 0) micro = opts->microbatches;
    L.g->schedule_loc = micro_loc;
    if (micro > 1) {
        L.g->microbatches = micro;
        L.g->batch_dim = batch_dim_name(&L, prog);
        if (!L.g->batch_dim && d->n_errors == errors_before) {
            fprintf(d->out, "dmc: error: micro-batches split the batch, but the program has no inputs\n");
            d->n_errors++;
        }
        if (L.g->batch_dim) L.g->batch_dim = ir_intern(L.g, L.g->batch_dim);
    }
    dm_loc loss_loc = {0};
    for (int i = 0; i < prog->n_stmts && !over_limit(&L, prog->stmts[i]->loc); i++) {
        if (opts->stop_at_error && d->n_errors > errors_before) break;
        if (prog->stmts[i]->kind != STMT_MESH) lower_top(&L, prog->stmts[i], &loss_loc);
    }
    if (L.cuts) resolve_cuts(&L, L.cuts);
    dm_lower_set_choices(L.g, opts);
    L.g->fuse_attention = opts->fuse_attention;
    if (L.g->batch_dim && !L.g->batch_whole && d->n_errors == errors_before) {
        fprintf(d->out, "dmc: error: micro-batches split the inputs' leading dim '%s', which is not declared with dim\n",
                L.g->batch_dim);
        d->n_errors++;
    }
    report_unused_overrides(&L);
    check_sequence_parallel(&L);
    for (instance *in = L.instances, *next; in; in = next) {
        next = in->next_alloc;
        scope_free(&in->env);
        free(in->members);
        free(in);
    }
    scope_free(&L.global);
    if (d->n_errors > errors_before) {
        ir_graph_free(L.g);
        return NULL;
    }
    return L.g;
}
