/* lower_settings.c: the statements that set up the training rather than compute: dim
 * (with --set), mesh (with --mesh), optimizer, schedule and accumulate, zero, and the
 * schedule's cuts once the program is lowered. They write the graph's settings and the
 * global scope's dims; dm_lower (lower.c) decides when each runs. */
#include "lower_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipe_kind.h"
#include "suggest.h"

/* ---- statements ------------------------------------------------------------------------ */

static dm_override *find_override(dm_override *list, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0) return &list[i];
    return NULL;
}

/* A second statement of a setting (precision, zero, schedule, accumulate) would silently
 * replace the first: an error at it, with a note at the first. Returns 1 when st is one. */
static int repeated_statement(lowerer *L, const dm_stmt *st, const dm_stmt **first, const char *what) {
    if (!*first) {
        *first = st;
        return 0;
    }
    dm_error(L->d, st->loc, "%s is already set", what);
    dm_note(L->d, (*first)->loc, "first set here");
    return 1;
}

/* A keyword argument given again in one call (`sgd(lr = 1, lr = 2)`) would silently
 * replace the first: an error at it, with a note at the first. *first is the one seen
 * before (NULL: none, and a becomes it). Returns 1 when a repeats it. */
static int repeated_setting(lowerer *L, const dm_expr *a, const dm_expr **first) {
    if (!*first) {
        *first = a;
        return 0;
    }
    dm_error(L->d, a->loc, "'%s' is given twice", a->name);
    dm_note(L->d, (*first)->loc, "first given here");
    return 1;
}

void lower_dim(lowerer *L, scope *s, const dm_stmt *st, int overridable) {
    int64_t v;
    if (lower_eval_dim(L, s, st->value, &v)) {
        lower_bind_failed(L, s, st, B_DIM);
        return;
    }
    dm_override *o = overridable ? find_override(L->opts->dims, L->opts->n_dims, st->name) : NULL;
    if (o) {
        v = o->value;
        o->used = 1;
    }
    if (v <= 0) {
        dm_error(L->d, st->value->loc, "dimension '%s' must be positive, got %lld", st->name, (long long)v);
        lower_bind_failed(L, s, st, B_DIM);
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
    int of_batch = gm->batch_dim && ((overridable && strcmp(gm->batch_dim, st->name) == 0) ||
                                     (!o && lower_dim_reads_batch(s, st->value)));
    binding *b = lower_bind(L, s, st->name, B_DIM, st->name_loc);
    if (!b) return;
    b->dim = v;
    b->of_batch = of_batch;
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

/* The ranks a mesh may have: an axis is at most 65536, and eight of them would multiply
 * past int64 (every rank count of the passes and the trainer is their product). */
#define MAX_MESH_RANKS (1 << 20)

/* The product of the axis sizes (after --mesh), held to MAX_MESH_RANKS. */
static void check_mesh_ranks(lowerer *L, const dm_stmt *st) {
    const ir_graph *g = L->g;
    int64_t ranks = 1;
    double product = 1;
    char axes[512];
    size_t n = 0;
    for (int a = 0; a < g->n_axes; a++) {
        /* at most 2^20 x 2^16 before the check stops it: no overflow */
        if (ranks <= MAX_MESH_RANKS) ranks *= g->axes[a].size;
        product *= (double)g->axes[a].size;
        int k = snprintf(axes + n, sizeof axes - n, "%s%s = %lld", a ? " x " : "", g->axes[a].name, (long long)g->axes[a].size);
        if (k > 0) n = n + (size_t)k < sizeof axes ? n + (size_t)k : sizeof axes - 1;
    }
    if (ranks <= MAX_MESH_RANKS) return;
    dm_error(L->d, st->loc, "the mesh has %.0f ranks (%s): at most %d (2^20)", product, axes, MAX_MESH_RANKS);
}

static void lower_mesh(lowerer *L, const dm_stmt *st) {
    ir_graph *g = L->g;
    /* (by the statement, not its axes: `mesh()` declares a mesh of none) */
    if (L->mesh_stmt) {
        const dm_stmt *first = L->mesh_stmt;
        dm_error(L->d, st->loc, "the mesh is already declared");
        dm_note(L->d, first->n_args ? first->args[0]->loc : first->loc, "first declared here");
        return;
    }
    L->mesh_stmt = st;
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
        if (lower_axis_index(g, a->name) >= 0) {
            dm_error(L->d, a->loc, "mesh axis '%s' declared twice", a->name);
            continue;
        }
        int64_t size;
        if (lower_eval_dim(L, &L->setting_dims, a->lhs, &size)) continue;
        dm_override *o = find_override(L->opts->mesh, L->opts->n_mesh, a->name);
        if (o) size = o->value, o->used = 1;
        if (size < 1 || size > 65536) {
            dm_error(L->d, a->lhs->loc, "mesh axis '%s' must have a size from 1 to 65536, got %lld", a->name, (long long)size);
            continue;
        }
        if (strcmp(a->name, "pipeline") == 0) g->pipe_axis = g->n_axes;
        if (strcmp(a->name, "data") == 0) g->data_axis = g->n_axes;
        if (strcmp(a->name, "tensor") == 0) g->tensor_axis = g->n_axes;
        g->axes[g->n_axes].name = ir_intern(g, a->name);
        g->axes[g->n_axes].size = size;
        g->axes[g->n_axes].loc = a->loc;
        g->n_axes++;
    }
    check_mesh_ranks(L, st);
}

void lower_optimizer(lowerer *L, const dm_stmt *st) {
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
    struct { const char *name; double *slot; const dm_expr *given; } hypers[10] = {{0}};
    const dm_expr *decay_given = NULL;
    int n = 0;
    double nesterov_value = 0;   /* a flag, read as a number: nesterov = true */
    double decay_1d_value = 1;   /* a flag: weight_decay_1d = false */
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
    hypers[n].name = "weight_decay_1d", hypers[n++].slot = &decay_1d_value;
    for (int i = 0; i < call->n_args; i++) {
        const dm_expr *a = call->args[i];
        if (a->kind != EXPR_KWARG) {
            dm_error(L->d, a->loc, "optimizer settings are written name = value");
            continue;
        }
        if (strcmp(a->name, "decay") == 0) {
            if (repeated_setting(L, a, &decay_given)) continue;
            if (a->lhs->kind != EXPR_NAME || ir_decay_from_name(a->lhs->name, &o->decay) != 0)
                dm_error(L->d, a->lhs->loc, "decay is none, cosine or linear%s%s%s", a->lhs->kind == EXPR_NAME ? ", not '" : "",
                         a->lhs->kind == EXPR_NAME ? a->lhs->name : "", a->lhs->kind == EXPR_NAME ? "'" : "");
            continue;
        }
        double *slot = NULL;
        const dm_expr **given = NULL;
        const char *names[sizeof hypers / sizeof *hypers + 1];
        for (int k = 0; k < n; k++) {
            names[k] = hypers[k].name;
            if (strcmp(hypers[k].name, a->name) == 0) slot = hypers[k].slot, given = &hypers[k].given;
        }
        names[n] = "decay"; /* a name, not a number: handled above, valid all the same */
        if (!slot) {
            char hint[512];
            dm_format_suggestion(hint, sizeof hint, dm_nearest_name(a->name, names, n + 1), "valid", names, n + 1);
            dm_error(L->d, a->loc, "unknown setting '%s' for %s%s", a->name, call->name, hint);
            continue;
        }
        if (repeated_setting(L, a, given)) continue;
        if (slot == &nesterov_value || slot == &decay_1d_value) { /* a flag: nesterov = 3 is a slip, not true */
            int flag;
            if (!lower_eval_flag(L, &L->global, a->lhs, a->name, &flag)) *slot = flag;
            continue;
        }
        if (lower_eval_number(L, &L->global, a->lhs, slot)) continue;
        /* the update computes in f32: a value past its range would be inf there */
        if (*slot < 0 || !(*slot <= FLT_MAX))
            dm_error(L->d, a->lhs->loc, "'%s' must be a finite, non-negative number", a->name);
        else if (slot == &o->clip && *slot == 0)
            dm_error(L->d, a->lhs->loc, "clip is the largest gradient norm let through, above 0 (leave it out not to clip)");
    }
    o->nesterov = nesterov_value != 0;
    o->no_decay_1d = decay_1d_value == 0;
    if (o->kind == OPTIM_SGD && o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        dm_error(L->d, call->loc, "nesterov momentum requires a momentum and zero dampening");
    if (o->kind == OPTIM_ADAMW && (o->beta1 >= 1 || o->beta2 >= 1))
        dm_error(L->d, call->loc, "adamw betas must be below 1");
    ir_check_schedule(o, call->loc, L->d);
}

/* The count of a schedule or accumulate statement: a positive integer. */
/* Whether the program's top level defines name as something other than a dim (accumulate
 * is read before the rest of the program is lowered). */
static int declared_not_dim(const dm_program *prog, const char *name) {
    for (int i = 0; i < prog->n_stmts; i++) {
        const dm_stmt *st = prog->stmts[i];
        int defines = st->kind == STMT_INPUT || st->kind == STMT_PARAM || st->kind == STMT_LAYER || st->kind == STMT_LET ||
                      st->kind == STMT_BLOCK;
        if (defines && strcmp(st->name, name) == 0) return 1;
    }
    return 0;
}

/* Whether e can be a dimension expression: numbers, names that are dims (or not known as
 * anything else: lower_eval_dim says what they are), - and + - * / of them. */
static int dim_like(lowerer *L, const dm_expr *e) {
    switch (e->kind) {
    case EXPR_NUM: return 1;
    case EXPR_NAME: {
        binding *b = lower_scope_find(&L->setting_dims, e->name);
        return b ? b->kind == B_DIM : !declared_not_dim(L->prog, e->name);
    }
    case EXPR_NEG: return dim_like(L, e->lhs);
    case EXPR_BINARY: return e->op != '@' && dim_like(L, e->lhs) && dim_like(L, e->rhs);
    default: return 0;
    }
}

/* `zero = relu(h)`, `accumulate = h`: a setting statement whose value is no count is a
 * value named with a reserved word. Returns -1 when it said so. */
static int reserved_setting(lowerer *L, const dm_stmt *st, const char *word, const char *meaning) {
    if (dim_like(L, st->value)) return 0;
    dm_error(L->d, st->loc, "'%s' is a reserved word and cannot name a value (`%s = N` %s)", word, word, meaning);
    return -1;
}

static int micro_count(lowerer *L, const dm_expr *e, const char *what, int *out) {
    int64_t v;
    if (lower_eval_dim(L, &L->setting_dims, e, &v)) return -1;
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
        if (reserved_setting(L, st, "accumulate", "sets the micro-batches of gradient accumulation") ||
            repeated_statement(L, st, &L->accumulate_stmt, "the accumulation") ||
            micro_count(L, st->value, "accumulate", &m))
            return;
    } else {
        if (repeated_statement(L, st, &L->schedule_stmt, "the schedule")) return;
        const dm_expr *call = st->value;
        int kind = pipe_kind_by_name(call->name);
        if (call->has_dim_args || kind < 0) {
            dm_error(L->d, call->loc, "unknown schedule '%s' (expected gpipe, 1f1b, interleaved, pipedream_2bw or pipedream)", call->name);
            return;
        }
        g->schedule = kind;
        const dm_expr *cuts = NULL, *chunks = NULL, *microbatches = NULL;
        for (int i = 0; i < call->n_args; i++) {
            const dm_expr *a = call->args[i];
            if (a->kind == EXPR_KWARG && strcmp(a->name, "cuts") == 0) {
                if (repeated_setting(L, a, &cuts)) continue;
                if (a->lhs->kind != EXPR_LIST) dm_error(L->d, a->lhs->loc, "cuts are a list of values: cuts = [h1, h2]");
                else L->cuts = a->lhs;
                continue;
            }
            if (a->kind == EXPR_KWARG && strcmp(a->name, "chunks") == 0) {
                if (repeated_setting(L, a, &chunks)) continue;
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
            if (repeated_setting(L, a, &microbatches)) continue;
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

/* A top-level dim into L->setting_dims, as lower_dim evaluates it but whole (the batch
 * is not yet divided into micro-batches) and silently: lower_dim reports its errors when
 * the program is lowered, and a dim that fails here is bound as failed, so that a setting
 * using it adds no error of its own. */
static void read_setting_dim(lowerer *L, const dm_stmt *st) {
    if (lower_scope_find_local(&L->setting_dims, st->name)) return; /* a redefinition: lower_dim says so */
    dm_diag *d = L->d;
    dm_diag silent = {.src = d->src, .out = d->out, .max_errors = -1}; /* past its limit from the start: prints nothing */
    L->d = &silent;
    int64_t v = 0;
    int failed = lower_eval_dim(L, &L->setting_dims, st->value, &v) != 0;
    dm_override *o = find_override(L->opts->dims, L->opts->n_dims, st->name);
    if (o) v = o->value, failed = 0;
    binding *b = lower_scope_add(L, &L->setting_dims, st->name, B_DIM, st->name_loc);
    L->d = d;
    if (!b) return;
    b->dim = v;
    b->display = b->name;
    b->failed = failed || v <= 0;
}

void lower_read_settings(lowerer *L, int *micro, dm_loc *micro_loc) {
    const dm_program *prog = L->prog;
    for (int i = 0; i < prog->n_stmts; i++) {
        const dm_stmt *st = prog->stmts[i];
        if (st->kind == STMT_DIM) read_setting_dim(L, st);
        else if (st->kind == STMT_MESH) lower_mesh(L, st);
        else if (st->kind == STMT_SCHEDULE || st->kind == STMT_ACCUMULATE) lower_schedule(L, st, micro, micro_loc);
    }
}

/* `zero = 2`: the ZeRO stage (passes/zero.c says what each splits). */
void lower_zero(lowerer *L, const dm_stmt *st) {
    int64_t v;
    if (reserved_setting(L, st, "zero", "sets the ZeRO stage") || repeated_statement(L, st, &L->zero_stmt, "the ZeRO stage") ||
        lower_eval_dim(L, &L->global, st->value, &v))
        return;
    if (v < 0 || v > 3) {
        dm_error(L->d, st->value->loc,
                 "zero is 0, 1 (optimizer state split over data), 2 (gradients too) or 3 (parameters too), got %lld",
                 (long long)v);
        return;
    }
    L->g->zero = (int)v;
    L->g->zero_loc = st->loc;
}

/* `precision bf16`: the products' operands (passes/precision.c); fp16 with GradScaler's
 * defaults. The driver's --precision, where given, replaces it. */
void lower_precision(lowerer *L, const dm_stmt *st) {
    ir_graph *g = L->g;
    if (repeated_statement(L, st, &L->precision_stmt, "the precision")) return;
    if (strcmp(st->name, "fp32") == 0) {
        g->product_dtype = DT_F32, g->loss_scale = 0;
    } else if (strcmp(st->name, "bf16") == 0) {
        g->product_dtype = DT_BF16, g->loss_scale = 0;
    } else if (strcmp(st->name, "fp16") == 0) {
        g->product_dtype = DT_F16, g->loss_scale = 65536.0, g->loss_scale_interval = 2000;
    } else {
        dm_error(L->d, st->name_loc, "precision is fp32, bf16 or fp16, got '%s'%s", st->name,
                 strcmp(st->name, "tf32") == 0 ? " (tf32 is the CUDA target's --tf32, a command-line choice)" : "");
        return;
    }
    g->precision_loc = st->loc;
}

/* cuts = [h1, h2]: each a value of the program, or a layer called once (h.0,
 * model.layers.3: the value it returns), in order; stage k + 1 starts after the k-th. */
void lower_resolve_cuts(lowerer *L, const dm_expr *list) {
    ir_graph *g = L->g;
    g->cuts_loc = list->loc;
    g->cut_after = calloc((size_t)list->n_args + 1, sizeof *g->cut_after);
    if (!g->cut_after) abort();
    for (int i = 0; i < list->n_args; i++) {
        const dm_expr *e = list->args[i];
        binding *b = e->kind == EXPR_NAME ? lower_scope_find(&L->global, e->name) : NULL;
        if (b && b->failed) continue;
        int id = b && b->kind == B_VALUE ? b->value : -1, found = 1;
        /* a layer (model.layers.0): the cut goes after the value its call returns */
        if (e->kind == EXPR_NAME && (!b || b->kind == B_LAYER)) found = lower_layer_result(L, e->name, e->loc, &id);
        if (found < 0) continue;
        if (id < 0 || val(L, id)->phase != PHASE_FORWARD || ir_op_info_of(val(L, id)->op)->cls == OPC_SOURCE) {
            dm_error(L->d, e->loc, "a cut names a value the program computes (h1 = ...) or a layer (h.0, model.layers.3)");
            continue;
        }
        ir_value *v = val(L, id);
        if (g->n_cuts && g->cut_after[g->n_cuts - 1]->id >= v->id) {
            dm_error(L->d, e->loc, "cuts are listed in program order: '%s' comes before the previous one", e->name);
            continue;
        }
        g->cut_after[g->n_cuts++] = v;
    }
}

