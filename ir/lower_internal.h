/* lower_internal.h: what the files of the lowering share; not part of lower.h.
 *
 * lower_scopes.c owns the names (scopes) and the evaluation of types; lower.c the layer
 * instances and the walk over the program; lower_constants.c evaluates constant expressions (dims, numbers).
 * lower_builtins.c lowers expressions, and lower_settings.c the statements that set up
 * the training rather than compute (dim, mesh, optimizer, schedule, zero). They read and
 * extend the lowerer's graph and scopes, and lower.c hands them every expression and
 * setting statement: hence the types here.
 *
 * The functions declared here cross files, so the library exports them: they all carry
 * the lower_ prefix, as the library's other modules carry theirs (emit_, pipe_, ...). */
#ifndef DM_LOWER_INTERNAL_H
#define DM_LOWER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "lower.h"

/* The elements one tensor may have (ir.h says who holds tensors to it). */
#define MAX_NUMEL IR_MAX_NUMEL

typedef enum { B_DIM, B_VALUE, B_LAYER, B_BLOCK } binding_kind;

/* Only lower.c makes and walks instances: the other files pass them on, opaque. */
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
    int of_batch;         /* B_DIM: the batch dim micro-batches split, or a dim computed from it
                           * (lowered at a micro-batch's size) */
} binding;

typedef struct scope {
    struct scope *parent;
    binding *items;       /* (n) */
    int n, cap;
    int *slots;           /* (n_slots) open-addressing index into items, -1 empty */
    int n_slots;
    const char *prefix;   /* value names made here start with it ("fc1."), "" at top */
} scope;

typedef struct lowerer {
    ir_graph *g;
    dm_diag *d;
    int too_large;            /* the size limit was hit and reported: stop lowering */
    int n_instances;          /* layer instances made, bounded by MAX_INSTANCES */
    const dm_lower_options *opts;
    const dm_program *prog;   /* the program (settings read first look ahead in it) */
    scope global;
    /* the top-level dims as written (or --set: the whole batch, not one micro-batch), for
     * the settings read before the program (mesh sizes, microbatches, accumulate, chunks):
     * lower_read_settings fills it as it reaches each dim */
    scope setting_dims;
    instance *instances;
    instance *instantiating;  /* the instance whose block's body is being instantiated, or NULL */
    int depth;                /* nested instantiation / calls */
    int segments;             /* recomputation segments so far (ir_value.segment; close_segment) */
    int member_depth;         /* calls of repeated layers' members open */
    int in_recompute;         /* lowering the argument of recompute(...) */
    int dropouts;             /* dropout ops so far (ir_value.rng_op) */
    const dm_expr *cuts;      /* the schedule's cuts = [...], resolved after the program */
    /* the first statement of each setting: a second would silently replace it */
    const dm_stmt *mesh_stmt, *schedule_stmt, *accumulate_stmt, *zero_stmt, *precision_stmt;
    binding failed_path;      /* what a dotted path into a failed layer resolves to */
    const char *layer_path;   /* the top-level layer being instantiated, or NULL */
    int newest_bound;         /* the largest value id a name was bound to (-1: none): the
                               * fusion of softmax(causal_mask(s / c)) drops no value a
                               * name may still read (lower_bind_value) */
    dm_loc layer_loc;         /* its declaration: where errors in its block's body come from */
} lowerer;

/* One-line helpers called all over the lowering: inline, they are no exported
 * symbol, so their short names need no prefix. */
static inline ir_value *val(lowerer *L, int id) { return L->g->values[id]; }
static inline int mul_checked(int64_t a, int64_t b, int64_t *out) { return __builtin_mul_overflow(a, b, out); }

/* ---- lower_scopes.c -------------------------------------------------------------------- */

/* The binding of name in s or the scopes around it, or NULL. */
binding *lower_scope_find(scope *s, const char *name);
/* The binding of name in s itself, or NULL. */
binding *lower_scope_find_local(scope *s, const char *name);
/* A new binding of name in s (a redefinition or a dotted name is reported). */
binding *lower_scope_add(lowerer *L, scope *s, const char *name, binding_kind kind, dm_loc loc);
void lower_scope_free(scope *s);
const char *lower_binding_kind_name(binding_kind k);
void lower_report_redefinition(lowerer *L, const char *name, dm_loc loc, const binding *old);
void lower_report_dotted(lowerer *L, const char *name, dm_loc loc);
binding *lower_bind(lowerer *L, scope *s, const char *name, binding_kind kind, dm_loc loc);
/* b names value v (B_VALUE), noted in L->newest_bound. */
void lower_bind_value(lowerer *L, binding *b, int v);
int lower_visible_names(const scope *s, unsigned kinds, const char **out, int max);
void lower_near_name(lowerer *L, scope *s, const char *name, unsigned kinds, char *buf, size_t size);
int lower_axis_index(const ir_graph *g, const char *name);
const char *lower_dim_name_of(scope *s, const dm_expr *e);
/* The type written as t into out, for the tensor named what: 0, or -1 when reported. */
int lower_eval_type(lowerer *L, scope *s, const dm_type *t, const char *what, ir_type *out);

/* ---- lower.c --------------------------------------------------------------------------- */

void lower_bind_failed(lowerer *L, scope *s, const dm_stmt *st, binding_kind kind);
binding *lower_resolve_path(lowerer *L, scope *s, const char *name, dm_loc loc);
int lower_call_layer(lowerer *L, instance *in, const int *args, int n_args, const dm_expr *call);

/* ---- lower_constants.c ----------------------------------------------------------------- */

/* Integer dimension arithmetic over dim names: 0 and *out, or reported and -1. */
int lower_eval_dim(lowerer *L, scope *s, const dm_expr *e, int64_t *out);
/* Whether dimension expression e reads a dim of the batch (binding.of_batch). */
int lower_dim_reads_batch(scope *s, const dm_expr *e);
/* Real-valued constants (hyper-parameters, initialisers' arguments): 0 and *out, or -1. */
int lower_eval_number(lowerer *L, scope *s, const dm_expr *e, double *out);
/* A flag (keepdim, nesterov): true or false (or 1 or 0) into *out and 0, or reported
 * ("WHAT must be true or false") and -1. */
int lower_eval_flag(lowerer *L, scope *s, const dm_expr *e, const char *what, int *out);

/* ---- lower_builtins.c ------------------------------------------------------------------ */

int lower_expr(lowerer *L, scope *s, const dm_expr *e);
/* Whether name is a built-in function (relu, softmax, sum, ...): a call by that name
 * always means the function. */
int lower_is_builtin_function(const char *name);

/* ---- lower_settings.c ------------------------------------------------------------------ */

/* Blocks declare dims too (overridable 0): lower.c calls it for those as well. */
void lower_dim(lowerer *L, scope *s, const dm_stmt *st, int overridable);
/* The settings read before the rest of the program, in program order: the mesh (types
 * anywhere may name its axes), the schedule and accumulate (the batch dim is lowered as
 * one micro-batch); the dims written before each may size it. *micro and *micro_loc:
 * the micro-batches given (0: none) and where. */
void lower_read_settings(lowerer *L, int *micro, dm_loc *micro_loc);
void lower_optimizer(lowerer *L, const dm_stmt *st);
void lower_zero(lowerer *L, const dm_stmt *st);
void lower_precision(lowerer *L, const dm_stmt *st);
void lower_resolve_cuts(lowerer *L, const dm_expr *list);
int lower_layer_result(lowerer *L, const char *name, dm_loc loc, int *value);

#endif
