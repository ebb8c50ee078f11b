/* ast.h: the syntax tree of a .dm file, as the parser builds it. Lowering (ir/lower.c)
 * resolves names, evaluates dimension expressions and instantiates blocks. */
#ifndef DM_AST_H
#define DM_AST_H

#include <stdint.h>

#include "diag.h"

typedef enum dm_expr_kind {
    EXPR_NUM,     /* 3, 1e-3 */
    EXPR_NAME,    /* x, fc1.weight (dotted paths are one name) */
    EXPR_BINARY,  /* a + b, a @ b ... ; op is the character */
    EXPR_NEG,     /* -a */
    EXPR_CALL,    /* f(a, b, k = v) and block instances f[D, H] */
    EXPR_LIST,    /* [a, b, c] */
    EXPR_KWARG,   /* k = v inside a call: name = k, lhs = v */
} dm_expr_kind;

typedef struct dm_expr dm_expr;
struct dm_expr {
    dm_expr_kind kind;
    dm_loc loc;
    double num;         /* EXPR_NUM */
    int64_t inum;       /* EXPR_NUM when is_int */
    int is_int;
    char *name;         /* EXPR_NAME, EXPR_CALL callee, EXPR_KWARG key */
    int op;             /* EXPR_BINARY: '+', '-', '*', '/', '@' */
    dm_expr *lhs, *rhs; /* EXPR_BINARY, EXPR_NEG (lhs), EXPR_KWARG (lhs) */
    dm_expr **args;     /* (n_args) EXPR_CALL arguments, EXPR_LIST items */
    int n_args;
    dm_expr **dim_args; /* (n_dim_args) EXPR_CALL of a block: name[D, H] */
    int n_dim_args;
    int has_dim_args;   /* brackets were written, even if empty */
    int depth;          /* height of this subtree, bounded by the parser */
};

/* f32[B@data, 4*C]: dtype and dims, each dim with an optional mesh axis. */
typedef struct dm_type {
    char *dtype;
    dm_loc dtype_loc;
    int rank;
    dm_expr **dims;     /* (rank) */
    char **axes;        /* (rank), NULL where replicated */
    dm_loc *axis_locs;  /* (rank) */
    dm_loc loc;
} dm_type;

typedef enum dm_stmt_kind {
    STMT_DIM,       /* dim B = 128 */
    STMT_MESH,      /* mesh(data = 2, tensor = 2): kwargs in args */
    STMT_INPUT,     /* input x : f32[B, D] */
    STMT_PARAM,     /* param w : f32[D, H] = xavier */
    STMT_LAYER,     /* layer fc1 = linear[D, H]; layer h = repeat L block[C] */
    STMT_LET,       /* h = relu(x) ; h : f32[B, H] = ... */
    STMT_RETURN,    /* return h */
    STMT_OUTPUT,    /* output logits, probs */
    STMT_MINIMIZE,  /* minimize loss */
    STMT_OPTIMIZER, /* optimizer adamw(lr = 1e-3) */
    STMT_SCHEDULE,  /* schedule 1f1b(microbatches = 8) */
    STMT_ACCUMULATE,/* accumulate = 4 */
    STMT_ZERO,      /* zero = 2: ZeRO stage (optimizer state, gradients split over data) */
    STMT_PRECISION, /* precision bf16: the matrix products' operands (docs/precision.md) */
    STMT_BLOCK,     /* block linear[IN, OUT](x) { ... } */
} dm_stmt_kind;

typedef struct dm_stmt dm_stmt;
struct dm_stmt {
    dm_stmt_kind kind;
    dm_loc loc;          /* the keyword or the name */
    char *name;          /* DIM, INPUT, PARAM, LAYER, LET, MINIMIZE, BLOCK */
    dm_loc name_loc;
    dm_type *type;       /* INPUT, PARAM, LET (optional) */
    dm_type *stored;     /* PARAM: the shape in weight files (`as [C, 3 * C]`), or NULL */
    dm_expr *value;      /* DIM, PARAM init, LET, RETURN, OPTIMIZER and SCHEDULE call, LAYER block
                          * call, ACCUMULATE count */
    dm_expr *repeat;     /* LAYER: repeat count, NULL for one instance */
    dm_expr **args;      /* (n_args) MESH kwargs, OUTPUT names */
    int n_args;
    char **params;       /* (n_params) BLOCK dim parameters */
    dm_loc *param_locs;
    int n_params;
    char **inputs;       /* (n_inputs) BLOCK tensor arguments */
    dm_loc *input_locs;
    int n_inputs;
    dm_stmt **body;      /* (n_body) BLOCK statements */
    int n_body;
};

typedef struct dm_program {
    dm_stmt **stmts;     /* (n_stmts) top level, in source order */
    int n_stmts;
} dm_program;

/* Parses src; every syntax error is reported to d. Returns the program (possibly
 * partial when d->n_errors > 0); never NULL. */
dm_program *dm_parse(dm_diag *d);
void dm_program_free(dm_program *p);

#endif
