/* lower.c: syntax tree → forward IR. requires: a parsed program; leaves: a typed forward
 * graph with params, inputs, outputs, loss, optimizer and mesh filled in.
 *
 * Names live in scopes: the global scope (dims, blocks, inputs, params, layers, lets),
 * an instance scope per layer instance (its dim parameters, params and nested layers,
 * created when the layer is declared so that parameters are registered in declaration
 * order, as in PyTorch), and a call scope for the lets of one call of a block.
 *
 * Scopes and written types are lower_scopes.c's; expressions are lowered in
 * lower_builtins.c, constant expressions evaluated in lower_constants.c, the setting
 * statements (dim, mesh, optimizer, schedule, zero) in lower_settings.c; lower_internal.h
 * is what they share. */
#include "lower_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suggest.h"

#define MAX_REPEAT 4096
#define MAX_INSTANCE_DEPTH 32
/* The forward graph's size limit: far above any real model (GPT-2 XL lowers to about
 * 2,000 values), low enough that every pass stays fast on hostile input. */
#define MAX_FORWARD_VALUES (1 << 19)
#define MAX_INSTANCES 65536
#define MAX_PATH 4096

struct instance {
    const char *path;         /* "h.0.attn" */
    const dm_stmt *block;     /* NULL for a repeat group */
    scope env;                /* dim parameters, params, nested layers */
    instance **members;       /* (n_members) repeat group: h.0, h.1, ... */
    int n_members;
    int calls;                /* calls lowered (a group: calls of the whole chain) */
    int result;               /* the value the last of them returned (a cut after the layer) */
    const dm_stmt *decl;      /* the layer statement that declared it; NULL for a repeat's member */
    int reached;              /* a dotted path read into it (wte.weight): used, if never called */
    instance *parent;         /* the instance whose block declared it, or NULL at the top level */
    instance *next_alloc;     /* every instance, for freeing */
};

/* ---- layers and blocks ----------------------------------------------------------------- */

static instance *instantiate(lowerer *L, const dm_stmt *block, const char *path, const dm_expr *call, scope *caller);

static instance *new_instance(lowerer *L, const char *path) {
    instance *in = calloc(1, sizeof *in);
    if (!in) abort();
    in->path = ir_intern(L->g, path);
    in->env.parent = &L->global;
    in->env.prefix = ir_internf(L->g, "%s.", path);
    in->parent = L->instantiating;
    in->next_alloc = L->instances;
    L->instances = in;
    return in;
}

static const dm_stmt *find_block(lowerer *L, scope *s, const dm_expr *call) {
    binding *b = lower_scope_find(s, call->name);
    if (!b || b->kind != B_BLOCK) {
        if (b) dm_error(L->d, call->loc, "'%s' is a %s, not a block", call->name, lower_binding_kind_name(b->kind));
        else {
            char near[160];
            lower_near_name(L, s, call->name, 1u << B_BLOCK, near, sizeof near);
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
        lower_bind_failed(L, s, st, B_LAYER);
        return;
    }
    binding *b = lower_bind(L, s, st->name, B_LAYER, st->name_loc);
    if (!b) return;
    if (!st->repeat) {
        b->layer = instantiate(L, block, path, st->value, s);
        if (b->layer) b->layer->decl = st;
        return;
    }
    int64_t count;
    if (lower_eval_dim(L, s, st->repeat, &count)) return;
    if (count < 1 || count > MAX_REPEAT) {
        dm_error(L->d, st->repeat->loc, "repeat count must be between 1 and %d, got %lld", MAX_REPEAT, (long long)count);
        return;
    }
    instance *group = new_instance(L, path);
    group->decl = st;
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
    if (lower_eval_type(L, s, st->type, full_name, &t)) return -1;
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
    if (want_args && (lower_eval_number(L, s, e->args[0], &init.a) || lower_eval_number(L, s, e->args[1], &init.b))) return -1;
    /* as torch's normal_ and uniform_ refuse them: every weight would be NaN or inf (f32:
     * past its range too) */
    if (want_args && (!(fabs(init.a) <= FLT_MAX) || !(fabs(init.b) <= FLT_MAX))) {
        dm_error(L->d, e->loc, "%s's arguments must be finite, got %g and %g", kind, init.a, init.b);
        return -1;
    }
    if (init.kind == INIT_NORMAL && init.b < 0) {
        dm_error(L->d, e->loc, "normal's std must not be negative, got %g", init.b);
        return -1;
    }
    if (init.kind == INIT_UNIFORM && init.a > init.b) {
        dm_error(L->d, e->loc, "uniform's lo %g is above its hi %g", init.a, init.b);
        return -1;
    }
    if (init.kind == INIT_XAVIER && t.rank < 1) {
        dm_error(L->d, e->loc, "xavier needs at least one dimension");
        return -1;
    }
    ir_type stored = {0};
    if (st->stored) {
        /* the checkpoint's shape: the same elements, row-major, seen as other dims */
        dm_type shape = *st->stored;
        shape.dtype = "f32";
        if (lower_eval_type(L, s, &shape, full_name, &stored)) return -1;
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

/* A parameter whose shape has a dim computed from the batch (not the batch dim itself, which
 * passes/microbatch_loss.c refuses by name): under micro-batches the program is lowered for
 * one micro-batch, so the parameter would be made at that size, not the serial program's.
 * Returns the errors. */
static int param_of_derived_batch(lowerer *L, scope *s, const dm_stmt *st, const char *full_name) {
    const ir_graph *g = L->g;
    if (g->microbatches <= 1 || !g->batch_dim || !st->type) return 0;
    for (int d = 0; d < st->type->rank; d++) {
        const dm_expr *e = st->type->dims[d];
        const char *name = lower_dim_name_of(s, e);
        if ((name && strcmp(name, g->batch_dim) == 0) || !lower_dim_reads_batch(s, e)) continue;
        const dm_expr *first = e; /* the caret at the expression's start, not its operator */
        while (first->kind == EXPR_BINARY) first = first->lhs;
        dm_error(L->d, first->loc, "parameter '%s' has a dim computed from the batch dim '%s', which %d micro-batches "
                 "split: it would be sized from a micro-batch's %lld rows, not the batch's %lld (give it a dim of its "
                 "own)", full_name, g->batch_dim, g->microbatches, (long long)(g->batch_whole / g->microbatches),
                 (long long)g->batch_whole);
        if (g->schedule_loc.line > 0) dm_note(L->d, g->schedule_loc, "the micro-batches are set here");
        return 1;
    }
    return 0;
}

static void lower_param(lowerer *L, scope *s, const dm_stmt *st, const char *full_name) {
    ir_value proto = {0};
    if (param_of_derived_batch(L, s, st, full_name) || define_param(L, s, st, full_name, &proto)) {
        lower_bind_failed(L, s, st, B_VALUE);
        return;
    }
    binding *b = lower_bind(L, s, st->name, B_VALUE, st->name_loc);
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
    lower_bind_value(L, b, v->id);
}

static int statement_allowed_in_block(dm_stmt_kind k) {
    return k == STMT_DIM || k == STMT_PARAM || k == STMT_LAYER || k == STMT_LET || k == STMT_RETURN;
}

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
        if (lower_eval_dim(L, caller, call->dim_args[i], &v)) return NULL;
        binding *b = lower_bind(L, &in->env, block->params[i], B_DIM, block->param_locs[i]);
        if (b) {
            b->dim = v;
            b->display = lower_dim_name_of(caller, call->dim_args[i]);
            b->of_batch = lower_dim_reads_batch(caller, call->dim_args[i]);
        }
    }
    L->depth++;
    instance *enclosing = L->instantiating;
    L->instantiating = in;
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
    L->instantiating = enclosing;
    L->depth--;
    return in;
}

/* `NAME : TYPE = EXPR`, at the top level or in a block: the value must have TYPE's dtype
 * and shape; the sharding TYPE writes is kept as an annotation (passes/shard.c reshards
 * the value to it). Returns nonzero after an error. */
static int check_let_type(lowerer *L, scope *s, const dm_stmt *st, int v) {
    if (!st->type) return 0;
    ir_type want;
    if (lower_eval_type(L, s, st->type, st->name, &want)) return 1;
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

/* Binds an input or a let of a call. A name the instance has too (a param, a dim, a
 * layer) was reported with the block (check_block_names); it is left unbound so that the
 * instance's stays visible and its uses do not cascade into more errors. */
static binding *bind_call_name(lowerer *L, instance *in, scope *locals, const char *name, dm_loc loc) {
    if (lower_scope_find_local(&in->env, name)) return NULL;
    return lower_bind(L, locals, name, B_VALUE, loc);
}

/* The values a call made since call_start, one recomputation segment (passes/recompute.c):
 * a transformer block. Segments are the calls of a repeated layer's members (the outermost,
 * where repeats nest: llama.dm's decoder layers inside its model), and the top-level calls
 * that hold none. A value of a top-level call outside its members (llama.dm's embedding)
 * is in no segment, kept as the top level's are. */
static void close_segment(lowerer *L, int call_start, int member, int segments_before) {
    if (!(member && L->member_depth == 0) && !(L->depth == 0 && L->segments == segments_before)) return;
    int segment = ++L->segments;
    for (int i = call_start; i < L->g->n_values; i++)
        if (val(L, i)->role == ROLE_TEMP && val(L, i)->segment == 0) {
            val(L, i)->segment = segment;
            val(L, i)->marked = L->in_recompute > 0;
        }
}

/* Calls one instance on its arguments: binds them, lowers the lets, returns the value
 * of `return`. member: the instance is a member of a repeated layer. */
static int call_instance(lowerer *L, instance *in, const int *args, int n_args, const dm_expr *call, int member) {
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
        binding *b = bind_call_name(L, in, &locals, block->inputs[i], block->input_locs[i]);
        if (b) lower_bind_value(L, b, args[i]);
    }
    /* values made by this call (not aliases of earlier ones) take names from it */
    int result = -1, returned = 0, call_start = L->g->n_values, segments_before = L->segments;
    L->depth++;
    L->member_depth += member;
    for (int i = 0; i < block->n_body && !returned; i++) {
        const dm_stmt *st = block->body[i];
        if (st->kind == STMT_LET) {
            int let_start = L->g->n_values;
            int v = lower_expr(L, &locals, st->value);
            if (v < 0 || check_let_type(L, &locals, st, v)) {
                lower_bind_failed(L, &locals, st, B_VALUE);
                continue;
            }
            if (v >= let_start && val(L, v)->role == ROLE_TEMP) /* not an alias of an earlier value */
                val(L, v)->name = ir_internf(L->g, "%s.%s", in->path, st->name);
            binding *b = bind_call_name(L, in, &locals, st->name, st->name_loc);
            if (b) lower_bind_value(L, b, v);
        } else if (st->kind == STMT_RETURN) {
            result = lower_expr(L, &locals, st->value);
            returned = 1;
        }
    }
    L->depth--;
    L->member_depth -= member;
    lower_scope_free(&locals);
    close_segment(L, call_start, member, segments_before);
    if (!returned) {
        dm_error(L->d, call->loc, "block '%s' has no return statement", block->name);
        return -1;
    }
    if (result >= call_start && val(L, result)->role == ROLE_TEMP) val(L, result)->name = in->path;
    if (result >= 0) in->calls++, in->result = result;
    return result;
}

int lower_call_layer(lowerer *L, instance *in, const int *args, int n_args, const dm_expr *call) {
    if (!in->members) return call_instance(L, in, args, n_args, call, 0);
    /* a repeat group chains its members: x -> h.0 -> h.1 -> ... */
    if (n_args != 1) {
        dm_error(L->d, call->loc, "repeated layer '%s' takes exactly one argument, got %d", in->path, n_args);
        return -1;
    }
    int x = args[0];
    for (int i = 0; i < in->n_members && x >= 0; i++) x = call_instance(L, in->members[i], &x, 1, call, 1);
    if (x >= 0) in->calls++, in->result = x;
    return x;
}

/* The layer instance a dotted path names (fc1, h.0, model.layers.3, a repeat group), or
 * NULL. */
static instance *find_instance(scope *s, const char *name) {
    binding *b = lower_scope_find(s, name);
    if (b) return b->kind == B_LAYER ? b->layer : NULL;
    const char *dot = strchr(name, '.');
    char head[MAX_PATH];
    if (!dot || (size_t)(dot - name) >= sizeof head) return NULL;
    memcpy(head, name, (size_t)(dot - name));
    head[dot - name] = 0;
    b = lower_scope_find(s, head);
    if (!b || b->kind != B_LAYER || !b->layer) return NULL;
    instance *in = b->layer;
    const char *rest = dot + 1;
    while (in->members) {
        char *end;
        long idx = strtol(rest, &end, 10);
        if (end == rest || (*end && *end != '.') || idx < 0 || idx >= in->n_members) return NULL;
        in = in->members[idx];
        if (!*end) return in;
        rest = end + 1;
    }
    return find_instance(&in->env, rest);
}

/* A cut after a layer (cuts = [model.layers.0]): the value its one call returned. Returns
 * 1 when name is no layer, 0 with *value, -1 when the layer is called never or more than
 * once (said at loc). */
int lower_layer_result(lowerer *L, const char *name, dm_loc loc, int *value) {
    const instance *in = find_instance(&L->global, name);
    if (!in) return 1;
    if (in->calls != 1) {
        dm_error(L->d, loc, "a cut after layer '%s' needs it called once; it is called %d times (name the value to cut after)",
                 name, in->calls);
        return -1;
    }
    *value = in->result;
    return 0;
}

/* Resolves a dotted path (fc1.weight, h.0.attn) through layer instances. */
binding *lower_resolve_path(lowerer *L, scope *s, const char *name, dm_loc loc) {
    binding *b = lower_scope_find(s, name);
    if (b) return b;
    const char *dot = strchr(name, '.');
    if (!dot) return NULL;
    char head[MAX_PATH];
    size_t n = (size_t)(dot - name);
    if (n >= sizeof head) return NULL;
    memcpy(head, name, n);
    head[n] = 0;
    binding *h = lower_scope_find(s, head);
    if (h && h->kind == B_LAYER && !h->layer) return &L->failed_path; /* its declaration failed */
    if (!h || h->kind != B_LAYER) return NULL;
    instance *in = h->layer;
    const char *rest = dot + 1;
    if (in) in->reached = 1;
    while (in && in->members) {
        /* a repeat group: the next component is the member index */
        char *end;
        long idx = strtol(rest, &end, 10);
        if (end == rest || (*end && *end != '.') || idx < 0 || idx >= in->n_members) {
            dm_error(L->d, loc, "'%s': layer '%s' has members 0 to %d", name, in->path, in->n_members - 1);
            return NULL;
        }
        in = in->members[idx];
        in->reached = 1;
        if (!*end) return NULL;
        rest = end + 1;
    }
    if (!in) return NULL;
    return lower_resolve_path(L, &in->env, rest, loc);
}

/* A statement whose definition failed (a let, dim, input, param or layer) still defines
 * its name, as failed, so that later uses do not each report it as unknown. */
void lower_bind_failed(lowerer *L, scope *s, const dm_stmt *st, binding_kind kind) {
    binding *b = lower_bind(L, s, st->name, kind, st->name_loc);
    if (b) {
        b->value = -1;
        b->failed = 1;
    }
}

/* ---- statements ------------------------------------------------------------------------ */

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
            dm_error(L->d, lead->loc,
                     "micro-batches split the inputs' leading dim: '%s' here, '%s' before; every input must lead with "
                     "the batch (a table the same for every row, as RoPE's, is computed in the program instead, from "
                     "arange, sin and cos: docs/language.md)",
                     lead->name, name);
            return NULL;
        }
        name = lead->name;
    }
    return name;
}

/* A block's names live in two scopes: its dim parameters, dims, params and layers in the
 * instance's (made at the layer declaration), its inputs and lets in each call's. Each
 * scope refuses its own repeats as it is filled, but a name in both would shadow the
 * instance's silently (`w = relu(h)` hiding `param w`): that is checked here, once per
 * block, in the order the names are written. */
typedef struct block_names {
    scope instance, call;
} block_names;

static int defines_name(dm_stmt_kind k) {
    return k == STMT_DIM || k == STMT_INPUT || k == STMT_PARAM || k == STMT_LAYER || k == STMT_LET || k == STMT_BLOCK;
}

static binding_kind kind_defined(dm_stmt_kind k) {
    return k == STMT_DIM ? B_DIM : k == STMT_LAYER ? B_LAYER : k == STMT_BLOCK ? B_BLOCK : B_VALUE;
}

static void add_block_name(lowerer *L, block_names *n, int in_call, const char *name, binding_kind kind, dm_loc loc) {
    if (strchr(name, '.')) {
        lower_report_dotted(L, name, loc);
        return;
    }
    scope *mine = in_call ? &n->call : &n->instance, *other = in_call ? &n->instance : &n->call;
    binding *old = lower_scope_find_local(other, name);
    if (old) lower_report_redefinition(L, name, loc, old);
    else if (!lower_scope_find_local(mine, name)) lower_scope_add(L, mine, name, kind, loc);
}

static void check_block_names(lowerer *L, const dm_stmt *block) {
    block_names n = {{0}, {0}};
    for (int i = 0; i < block->n_params; i++) add_block_name(L, &n, 0, block->params[i], B_DIM, block->param_locs[i]);
    for (int i = 0; i < block->n_inputs; i++) add_block_name(L, &n, 1, block->inputs[i], B_VALUE, block->input_locs[i]);
    for (int i = 0; i < block->n_body; i++) {
        const dm_stmt *st = block->body[i];
        /* (a block's body holds no inputs or blocks: check_block_body refuses them) */
        if (defines_name(st->kind) && st->kind != STMT_INPUT && st->kind != STMT_BLOCK)
            add_block_name(L, &n, st->kind == STMT_LET, st->name, kind_defined(st->kind), st->name_loc);
    }
    lower_scope_free(&n.instance);
    lower_scope_free(&n.call);
}

/* A layer or block named after a built-in function could never be called by its name:
 * `relu(x)` always calls the function (lower_expr tries the builtins first), so the
 * definition is refused, as one named with a reserved word is. Reported once per
 * statement (a layer inside a block: with the block, not per instance). */
static void refuse_builtin_name(lowerer *L, const dm_stmt *st) {
    if ((st->kind == STMT_LAYER || st->kind == STMT_BLOCK) && lower_is_builtin_function(st->name))
        dm_error(L->d, st->name_loc, "'%s' is a built-in function and cannot name a %s", st->name,
                 st->kind == STMT_BLOCK ? "block" : "layer");
}

static void check_block_body(lowerer *L, const dm_stmt *block) {
    refuse_builtin_name(L, block);
    for (int i = 0; i < block->n_body; i++) refuse_builtin_name(L, block->body[i]);
    check_block_names(L, block);
    int has_return = 0;
    for (int i = 0; i < block->n_body; i++) {
        const dm_stmt *st = block->body[i];
        if (!statement_allowed_in_block(st->kind)) dm_error(L->d, st->loc, "this statement is not allowed inside a block");
        /* a call stops at the return (call_instance): what follows would be neither run nor
         * checked, so it is an error, once per block */
        else if (has_return == 1) {
            dm_error(L->d, st->loc, "this statement follows the return of block '%s' and would never run", block->name);
            has_return = 2;
        }
        if (st->kind == STMT_RETURN && !has_return) has_return = 1;
    }
    if (!has_return) dm_error(L->d, block->name_loc, "block '%s' has no return statement", block->name);
}

/* input NAME : TYPE: an input value of the step, its sharding as written. */
static void lower_input(lowerer *L, scope *s, const dm_stmt *st) {
    ir_graph *g = L->g;
    ir_type t;
    if (lower_eval_type(L, s, st->type, st->name, &t)) {
        lower_bind_failed(L, s, st, B_VALUE);
        return;
    }
    binding *b = lower_bind(L, s, st->name, B_VALUE, st->name_loc);
    if (!b) return;
    ir_value *v = ir_add(g, OP_INPUT, NULL, 0, st->name_loc);
    v->type = t;
    v->annotated = 1;
    v->role = ROLE_INPUT;
    v->name = b->name;
    ir_append_id(g, &g->inputs, &g->n_inputs, v->id);
    lower_bind_value(L, b, v->id);
}

/* NAME = EXPR (with an optional type to check): the value gets the name where it is new. */
static void lower_let(lowerer *L, scope *s, const dm_stmt *st) {
    ir_graph *g = L->g;
    int first_new = g->n_values;
    int v = lower_expr(L, s, st->value);
    if (v < 0) {
        lower_bind_failed(L, s, st, B_VALUE);
        return;
    }
    if (check_let_type(L, s, st, v)) {
        lower_bind_failed(L, s, st, B_VALUE);
        return;
    }
    binding *b = lower_bind(L, s, st->name, B_VALUE, st->name_loc);
    if (!b) return;
    if (v >= first_new && val(L, v)->role == ROLE_TEMP) val(L, v)->name = b->name;
    lower_bind_value(L, b, v);
}

/* output NAMES: values the caller reads after a step, each once. */
static void lower_output(lowerer *L, scope *s, const dm_stmt *st) {
    ir_graph *g = L->g;
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
        g->output_locs = ir_grow(g->output_locs, g->n_outputs, sizeof *g->output_locs);
        g->output_locs[g->n_outputs] = e->loc;
        ir_append_id(g, &g->outputs, &g->n_outputs, v);
    }
}

/* minimize NAME: the loss, an f32 scalar, chosen once (*loss_loc: where). */
static void lower_minimize(lowerer *L, scope *s, const dm_stmt *st, dm_loc *loss_loc) {
    ir_graph *g = L->g;
    if (g->loss >= 0) {
        dm_error(L->d, st->loc, "the loss is already chosen");
        dm_note(L->d, *loss_loc, "by this statement");
        return;
    }
    binding *b = lower_scope_find(s, st->name);
    if (b && b->failed) return; /* its definition failed and was reported */
    if (!b || b->kind != B_VALUE) {
        dm_error(L->d, st->name_loc, b ? "'%s' is not a value" : "unknown name '%s'", st->name);
        return;
    }
    if (b->value < 0) return; /* its definition failed and was reported */
    const ir_type *t = &val(L, b->value)->type;
    if (t->rank != 0 || t->dtype != DT_F32) {
        char ts[256];
        ir_format_type(g, t, ts, sizeof ts);
        dm_error(L->d, st->name_loc, "the loss must be an f32 scalar, '%s' is %s", st->name, ts);
        return;
    }
    g->loss = b->value;
    g->loss_loc = *loss_loc = st->loc;
}

/* A dotted name reaches into a layer (fc1.weight): defining one would shadow what the
 * layer defines, or give two parameters one name in weight files, so it is refused; as a
 * redefinition where the path names something already. Returns whether it was. */
static int refuse_dotted(lowerer *L, scope *s, const dm_stmt *st) {
    if (!defines_name(st->kind) || !strchr(st->name, '.')) return 0;
    int errors = L->d->n_errors;
    binding *old = lower_resolve_path(L, s, st->name, st->name_loc);
    if (L->d->n_errors > errors || old == &L->failed_path) return 1; /* reported already */
    if (old) {
        lower_report_redefinition(L, st->name, st->name_loc, old);
        return 1; /* unbound: its uses still reach the layer's */
    }
    lower_report_dotted(L, st->name, st->name_loc);
    lower_bind_failed(L, s, st, kind_defined(st->kind));
    return 1;
}

static void lower_top(lowerer *L, const dm_stmt *st, dm_loc *loss_loc) {
    scope *s = &L->global;
    if (refuse_dotted(L, s, st)) return;
    switch (st->kind) {
    case STMT_DIM: lower_dim(L, s, st, 1); break;
    case STMT_MESH: break; /* lowered first, see dm_lower */
    case STMT_BLOCK: {
        check_block_body(L, st);
        binding *b = lower_bind(L, s, st->name, B_BLOCK, st->name_loc);
        if (b) b->block = st;
        break;
    }
    case STMT_INPUT: lower_input(L, s, st); break;
    case STMT_PARAM: lower_param(L, s, st, st->name); break;
    case STMT_LAYER:
        refuse_builtin_name(L, st);
        L->layer_path = st->name;
        L->layer_loc = st->loc;
        lower_layer(L, s, st, st->name);
        L->layer_path = NULL;
        break;
    case STMT_LET: lower_let(L, s, st); break;
    case STMT_OUTPUT: lower_output(L, s, st); break;
    case STMT_MINIMIZE: lower_minimize(L, s, st, loss_loc); break;
    case STMT_OPTIMIZER: lower_optimizer(L, st); break;
    case STMT_SCHEDULE:
    case STMT_ACCUMULATE: break; /* lowered first, see dm_lower */
    case STMT_ZERO: lower_zero(L, st); break;
    case STMT_PRECISION: lower_precision(L, st); break;
    case STMT_RETURN: dm_error(L->d, st->loc, "return is only allowed inside a block"); break;
    }
}

static int by_declaration(const void *a, const void *b) {
    const dm_stmt *x = *(const dm_stmt *const *)a, *y = *(const dm_stmt *const *)b;
    if (x->name_loc.line != y->name_loc.line) return x->name_loc.line < y->name_loc.line ? -1 : 1;
    if (x->name_loc.col != y->name_loc.col) return x->name_loc.col < y->name_loc.col ? -1 : 1;
    return x == y ? 0 : x < y ? -1 : 1;
}

/* A layer declared and never called (nor read into by a path: `wte.weight`) computes
 * nothing: its block's lets and return are never lowered, so their errors would go
 * unreported. A warning at the declaration, once per statement (a layer of a block many
 * layers use), in source order; only the outermost of nested uncalled layers (the inner
 * ones' blocks never ran either). */
static void warn_uncalled_layers(lowerer *L) {
    int n = 0, cap = 0;
    const dm_stmt **decls = NULL;
    for (instance *in = L->instances; in; in = in->next_alloc) {
        if (!in->decl || in->calls || in->reached || (in->parent && !in->parent->calls)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            decls = realloc(decls, (size_t)cap * sizeof *decls);
            if (!decls) abort();
        }
        decls[n++] = in->decl;
    }
    if (n) qsort(decls, (size_t)n, sizeof *decls, by_declaration);
    for (int i = 0; i < n; i++)
        if (i == 0 || decls[i] != decls[i - 1])
            dm_warning(L->d, decls[i]->name_loc, "layer '%s' is never called: its block '%s' computes nothing, and its "
                       "lets and return are not checked", decls[i]->name, decls[i]->value->name);
    free(decls);
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
    lowerer L = {.g = ir_graph_new(opts->model), .d = d, .opts = opts, .prog = prog, .newest_bound = -1,
                 .failed_path = {.kind = B_VALUE, .value = -1, .failed = 1}};
    L.global.prefix = "";
    int errors_before = d->n_errors;
    /* The mesh and the micro-batches first: types anywhere in the file may name the mesh's
     * axes, and the batch dim is lowered as one micro-batch. */
    int micro = 0;
    dm_loc micro_loc = {0};
    lower_read_settings(&L, &micro, &micro_loc);
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
    if (L.cuts) lower_resolve_cuts(&L, L.cuts);
    dm_lower_set_choices(L.g, opts);
    L.g->fuse_attention = opts->fuse_attention;
    L.g->constants_every_step = opts->constants_every_step;
    if (L.g->batch_dim && !L.g->batch_whole && d->n_errors == errors_before) {
        fprintf(d->out, "dmc: error: micro-batches split the inputs' leading dim '%s', which is not declared with dim\n",
                L.g->batch_dim);
        d->n_errors++;
    }
    report_unused_overrides(&L);
    check_sequence_parallel(&L);
    if (d->n_errors == errors_before) warn_uncalled_layers(&L);
    for (instance *in = L.instances, *next; in; in = next) {
        next = in->next_alloc;
        lower_scope_free(&in->env);
        free(in->members);
        free(in);
    }
    lower_scope_free(&L.global);
    lower_scope_free(&L.setting_dims);
    if (d->n_errors > errors_before) {
        ir_graph_free(L.g);
        return NULL;
    }
    return L.g;
}
