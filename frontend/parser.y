/* parser.y: grammar of the .dm language (docs/language.md has the summary). A pure,
 * reentrant parser with locations; syntax errors recover at the next statement. */
%define api.pure full
%define api.prefix {dm_yy}
%define parse.error custom
%locations
%define api.location.type {dm_loc}
%param {void *scanner}
%parse-param {dm_parse_state *state}

%code requires {
#include "parse_state.h"
}

%code provides {
int dm_yylex(DM_YYSTYPE *yylval, DM_YYLTYPE *yylloc, void *scanner);
}

%code {
#include <stdio.h>
#include <string.h>

#define YYLLOC_DEFAULT(Cur, Rhs, N)                                  \
    do {                                                             \
        if (N) {                                                     \
            (Cur) = YYRHSLOC(Rhs, 1);                                \
            dm_loc last_ = YYRHSLOC(Rhs, N);                         \
            if (last_.line == (Cur).line && last_.col >= (Cur).col)  \
                (Cur).len = last_.col + last_.len - (Cur).col;       \
        } else {                                                     \
            (Cur) = YYRHSLOC(Rhs, 0);                                \
            (Cur).len = 1;                                           \
        }                                                            \
    } while (0)

/* Expressions deeper than this are rejected here, so later recursive passes are safe. */
#define MAX_EXPR_DEPTH 500

static void dm_yyerror(DM_YYLTYPE *loc, void *scanner, dm_parse_state *state, const char *msg) {
    (void)scanner;
    dm_error(state->diag, *loc, "%s", msg);
}

static dm_expr *new_expr(dm_parse_state *s, dm_expr_kind kind, dm_loc loc) {
    dm_expr *e = dm_pool_alloc(s->pool, sizeof(dm_expr));
    e->kind = kind;
    e->loc = loc;
    e->depth = 1;
    return e;
}

static dm_expr *deepen(dm_parse_state *s, dm_expr *e, int child_depth) {
    e->depth = child_depth + 1;
    if (e->depth == MAX_EXPR_DEPTH)
        dm_error(s->diag, e->loc, "expression nested deeper than %d levels", MAX_EXPR_DEPTH);
    return e;
}

static dm_expr *binary(dm_parse_state *s, int op, dm_expr *l, dm_expr *r, dm_loc loc) {
    dm_expr *e = new_expr(s, EXPR_BINARY, loc);
    e->op = op;
    e->lhs = l;
    e->rhs = r;
    return deepen(s, e, l->depth > r->depth ? l->depth : r->depth);
}

static int items_depth(dm_expr **items, int n) {
    int d = 0;
    for (int i = 0; i < n; i++)
        if (items[i]->depth > d) d = items[i]->depth;
    return d;
}
#define list_depth(l) items_depth((l).items, (l).n)

/* A definition's name; a reserved word (def_name) is reported as one. */
static char *defined(dm_parse_state *s, char *name, dm_loc loc, const char *what) {
    if (name == s->reserved_word) {
        dm_error(s->diag, loc, "'%s' is a reserved word and cannot name %s", name, what);
        s->reserved_word = NULL;
    }
    return name;
}

static dm_stmt *new_stmt(dm_parse_state *s, dm_stmt_kind kind, dm_loc loc) {
    dm_stmt *st = dm_pool_alloc(s->pool, sizeof(dm_stmt));
    st->kind = kind;
    st->loc = loc;
    return st;
}
}

%union {
    dm_expr *expr;
    char *str;
    dm_stmt *stmt;
    dm_type *type;
    struct { dm_expr **items; int n; } list;
    struct { dm_stmt **items; int n; } stmts;
    struct { char **names; dm_loc *locs; int n; } names;
    struct { dm_type *type; int count; } dims;
}

%token <expr> NUMBER "number"
%token <str> NAME "name"
%token NL "end of line"
%token KW_DIM "'dim'" KW_MESH "'mesh'" KW_INPUT "'input'" KW_PARAM "'param'" KW_LAYER "'layer'"
%token KW_AS "'as'"
%token KW_REPEAT "'repeat'" KW_BLOCK "'block'" KW_RETURN "'return'" KW_OUTPUT "'output'"
%token KW_MINIMIZE "'minimize'" KW_OPTIMIZER "'optimizer'" KW_SCHEDULE "'schedule'" KW_ACCUMULATE "'accumulate'" KW_ZERO "'zero'"
%token KW_PRECISION "'precision'"
%token TOO_DEEP "too deep nesting"

%type <str> def_name reserved
%type <expr> expr dim_expr call arg layer_ref
%type <list> args arg_list exprs expr_list_opt
%type <stmt> stmt block
%type <stmts> stmts
%type <type> type
%type <dims> dims dim_list
%type <names> names name_list

%left '+' '-'
%left '*' '/' '@'
%precedence NEG

%start program

%%

program:
    stmts                       { state->program->stmts = $1.items; state->program->n_stmts = $1.n; }
    ;

stmts:
    %empty                      { $$.items = NULL; $$.n = 0; }
  | stmts NL                    { $$ = $1; }
  | stmts stmt NL               {
                                  $$ = $1;
                                  if ($2) $$.items = dm_pool_push(state->pool, $$.items, &$$.n,
                                                                  sizeof(dm_stmt *), &$2);
                                }
  | stmts error NL              { $$ = $1; yyerrok; }
  ;

stmt:
    KW_DIM def_name '=' dim_expr { $$ = new_stmt(state, STMT_DIM, @1); $$->name = defined(state, $2, @2, "a dimension"); $$->name_loc = @2; $$->value = $4; }
  | KW_MESH '(' arg_list ')'    { $$ = new_stmt(state, STMT_MESH, @1); $$->args = $3.items; $$->n_args = $3.n; }
  | KW_INPUT def_name ':' type  { $$ = new_stmt(state, STMT_INPUT, @2); $$->name = defined(state, $2, @2, "an input"); $$->name_loc = @2; $$->type = $4; }
  | KW_PARAM def_name ':' type '=' expr
                                { $$ = new_stmt(state, STMT_PARAM, @2); $$->name = defined(state, $2, @2, "a parameter"); $$->name_loc = @2; $$->type = $4; $$->value = $6; }
  | KW_PARAM def_name ':' type KW_AS '[' dim_list ']' '=' expr
                                { $$ = new_stmt(state, STMT_PARAM, @2); $$->name = defined(state, $2, @2, "a parameter"); $$->name_loc = @2; $$->type = $4;
                                  $$->stored = $7.type; $$->stored->loc = @7; $$->value = $10; }
  | KW_LAYER def_name '=' layer_ref { $$ = new_stmt(state, STMT_LAYER, @2); $$->name = defined(state, $2, @2, "a layer"); $$->name_loc = @2; $$->value = $4; }
  | KW_LAYER def_name '=' KW_REPEAT dim_expr layer_ref
                                { $$ = new_stmt(state, STMT_LAYER, @2); $$->name = defined(state, $2, @2, "a layer"); $$->name_loc = @2; $$->repeat = $5; $$->value = $6; }
  | NAME '=' expr               { $$ = new_stmt(state, STMT_LET, @1); $$->name = $1; $$->name_loc = @1; $$->value = $3; }
  | NAME ':' type '=' expr      { $$ = new_stmt(state, STMT_LET, @1); $$->name = $1; $$->name_loc = @1; $$->type = $3; $$->value = $5; }
  | KW_RETURN expr              { $$ = new_stmt(state, STMT_RETURN, @1); $$->value = $2; }
  | KW_OUTPUT exprs             { $$ = new_stmt(state, STMT_OUTPUT, @1); $$->args = $2.items; $$->n_args = $2.n; }
  | KW_MINIMIZE NAME            { $$ = new_stmt(state, STMT_MINIMIZE, @2); $$->name = $2; $$->name_loc = @2; }
  | KW_OPTIMIZER call           { $$ = new_stmt(state, STMT_OPTIMIZER, @1); $$->value = $2; }
  | KW_SCHEDULE call            { $$ = new_stmt(state, STMT_SCHEDULE, @1); $$->value = $2; }
  /* an expr, not a dim_expr, so that `zero = relu(h)` can be told that zero is reserved */
  | KW_ACCUMULATE '=' expr      { $$ = new_stmt(state, STMT_ACCUMULATE, @1); $$->value = $3; }
  | KW_ZERO '=' expr            { $$ = new_stmt(state, STMT_ZERO, @1); $$->value = $3; }
  | KW_PRECISION NAME           { $$ = new_stmt(state, STMT_PRECISION, @1); $$->name = $2; $$->name_loc = @2; }
  | block                       { $$ = $1; }
  ;

block:
    KW_BLOCK def_name names '(' name_list ')' '{' stmts '}'
                                {
                                  $$ = new_stmt(state, STMT_BLOCK, @2); $$->name = defined(state, $2, @2, "a block"); $$->name_loc = @2;
                                  $$->params = $3.names; $$->param_locs = $3.locs; $$->n_params = $3.n;
                                  $$->inputs = $5.names; $$->input_locs = $5.locs; $$->n_inputs = $5.n;
                                  $$->body = $8.items; $$->n_body = $8.n;
                                }
  ;

/* The name a definition gives: a reserved word there is reported (defined()) and the
 * statement parsed on, so that an error in a block's header does not leave its body to
 * the top level. */
def_name:
    NAME                        { $$ = $1; }
  | reserved                    { $$ = dm_pool_strndup(state->pool, $1, strlen($1)); state->reserved_word = $$; }
  ;

reserved:
    KW_DIM                      { $$ = "dim"; }
  | KW_MESH                     { $$ = "mesh"; }
  | KW_INPUT                    { $$ = "input"; }
  | KW_PARAM                    { $$ = "param"; }
  | KW_LAYER                    { $$ = "layer"; }
  | KW_AS                       { $$ = "as"; }
  | KW_REPEAT                   { $$ = "repeat"; }
  | KW_BLOCK                    { $$ = "block"; }
  | KW_RETURN                   { $$ = "return"; }
  | KW_OUTPUT                   { $$ = "output"; }
  | KW_MINIMIZE                 { $$ = "minimize"; }
  | KW_OPTIMIZER                { $$ = "optimizer"; }
  | KW_SCHEDULE                 { $$ = "schedule"; }
  | KW_ACCUMULATE               { $$ = "accumulate"; }
  | KW_ZERO                     { $$ = "zero"; }
  | KW_PRECISION                { $$ = "precision"; }
  ;

names:
    %empty                      { $$.names = NULL; $$.locs = NULL; $$.n = 0; }
  | '[' name_list ']'           { $$ = $2; }
  ;

name_list:
    %empty                      { $$.names = NULL; $$.locs = NULL; $$.n = 0; }
  | def_name                    {
                                  char *name = defined(state, $1, @1, "a block's parameter");
                                  $$.n = 0; $$.names = dm_pool_push(state->pool, NULL, &$$.n, sizeof(char *), &name);
                                  $$.n = 0; $$.locs = dm_pool_push(state->pool, NULL, &$$.n, sizeof(dm_loc), &@1);
                                }
  | name_list ',' def_name      {
                                  $$ = $1; int n = $$.n; char *name = defined(state, $3, @3, "a block's parameter");
                                  $$.names = dm_pool_push(state->pool, $$.names, &n, sizeof(char *), &name);
                                  $$.locs = dm_pool_push(state->pool, $$.locs, &$$.n, sizeof(dm_loc), &@3);
                                }
  ;

type:
    NAME                        { $$ = dm_pool_alloc(state->pool, sizeof(dm_type)); $$->dtype = $1; $$->dtype_loc = @1; $$->loc = @1; }
  | NAME '[' ']'                { $$ = dm_pool_alloc(state->pool, sizeof(dm_type)); $$->dtype = $1; $$->dtype_loc = @1; $$->loc = @$; }
  | NAME '[' dim_list ']'       { $$ = $3.type; $$->dtype = $1; $$->dtype_loc = @1; $$->loc = @$; }
  ;

dim_list:
    dims                        { $$ = $1; }
  ;

dims:
    dim_expr                    {
                                  $$.type = dm_pool_alloc(state->pool, sizeof(dm_type));
                                  dm_type *t = $$.type; int n = t->rank, m = t->rank; char *no_axis = NULL; dm_loc l = @1;
                                  t->dims = dm_pool_push(state->pool, t->dims, &n, sizeof(dm_expr *), &$1);
                                  t->axes = dm_pool_push(state->pool, t->axes, &m, sizeof(char *), &no_axis);
                                  t->axis_locs = dm_pool_push(state->pool, t->axis_locs, &t->rank, sizeof(dm_loc), &l);
                                }
  | dim_expr '@' NAME           {
                                  $$.type = dm_pool_alloc(state->pool, sizeof(dm_type));
                                  dm_type *t = $$.type; int n = t->rank, m = t->rank; dm_loc l = @3;
                                  t->dims = dm_pool_push(state->pool, t->dims, &n, sizeof(dm_expr *), &$1);
                                  t->axes = dm_pool_push(state->pool, t->axes, &m, sizeof(char *), &$3);
                                  t->axis_locs = dm_pool_push(state->pool, t->axis_locs, &t->rank, sizeof(dm_loc), &l);
                                }
  | dims ',' dim_expr           {
                                  $$ = $1; dm_type *t = $$.type; int n = t->rank, m = t->rank; char *no_axis = NULL; dm_loc l = @3;
                                  t->dims = dm_pool_push(state->pool, t->dims, &n, sizeof(dm_expr *), &$3);
                                  t->axes = dm_pool_push(state->pool, t->axes, &m, sizeof(char *), &no_axis);
                                  t->axis_locs = dm_pool_push(state->pool, t->axis_locs, &t->rank, sizeof(dm_loc), &l);
                                }
  | dims ',' dim_expr '@' NAME  {
                                  $$ = $1; dm_type *t = $$.type; int n = t->rank, m = t->rank; dm_loc l = @5;
                                  t->dims = dm_pool_push(state->pool, t->dims, &n, sizeof(dm_expr *), &$3);
                                  t->axes = dm_pool_push(state->pool, t->axes, &m, sizeof(char *), &$5);
                                  t->axis_locs = dm_pool_push(state->pool, t->axis_locs, &t->rank, sizeof(dm_loc), &l);
                                }
  ;

/* Dimension expressions: integers, names, + - * / and parentheses; no '@', which
 * marks the mesh axis in a type. */
dim_expr:
    NUMBER                      { $$ = $1; $$->depth = 1; }
  | NAME                        { $$ = new_expr(state, EXPR_NAME, @1); $$->name = $1; }
  | dim_expr '+' dim_expr       { $$ = binary(state, '+', $1, $3, @2); }
  | dim_expr '-' dim_expr       { $$ = binary(state, '-', $1, $3, @2); }
  | dim_expr '*' dim_expr       { $$ = binary(state, '*', $1, $3, @2); }
  | dim_expr '/' dim_expr       { $$ = binary(state, '/', $1, $3, @2); }
  | '(' dim_expr ')'            { $$ = $2; }
  ;

expr:
    NUMBER                      { $$ = $1; $$->depth = 1; }
  | NAME                        { $$ = new_expr(state, EXPR_NAME, @1); $$->name = $1; }
  | call                        { $$ = $1; }
  | '[' expr_list_opt ']'       { $$ = new_expr(state, EXPR_LIST, @$); $$->args = $2.items; $$->n_args = $2.n; deepen(state, $$, list_depth($2)); }
  | expr '+' expr               { $$ = binary(state, '+', $1, $3, @2); }
  | expr '-' expr               { $$ = binary(state, '-', $1, $3, @2); }
  | expr '*' expr               { $$ = binary(state, '*', $1, $3, @2); }
  | expr '/' expr               { $$ = binary(state, '/', $1, $3, @2); }
  | expr '@' expr               { $$ = binary(state, '@', $1, $3, @2); }
  | '-' expr %prec NEG          { $$ = new_expr(state, EXPR_NEG, @1); $$->lhs = $2; deepen(state, $$, $2->depth); }
  | '(' expr ')'                { $$ = $2; }
  ;

call:
    NAME '(' arg_list ')'       { $$ = new_expr(state, EXPR_CALL, @1); $$->name = $1; $$->args = $3.items; $$->n_args = $3.n; deepen(state, $$, list_depth($3)); }
  | NAME '[' expr_list_opt ']'  { $$ = new_expr(state, EXPR_CALL, @1); $$->name = $1; $$->dim_args = $3.items; $$->n_dim_args = $3.n; $$->has_dim_args = 1; deepen(state, $$, list_depth($3)); }
  | NAME '[' expr_list_opt ']' '(' arg_list ')'
                                {
                                  $$ = new_expr(state, EXPR_CALL, @1); $$->name = $1; $$->dim_args = $3.items; $$->n_dim_args = $3.n; $$->has_dim_args = 1;
                                  $$->args = $6.items; $$->n_args = $6.n;
                                  deepen(state, $$, list_depth($3) > list_depth($6) ? list_depth($3) : list_depth($6));
                                }
  ;

/* The block a layer instantiates: linear[D, H], or a bare name for a block without
 * dimension parameters. */
layer_ref:
    call                        { $$ = $1; }
  | NAME                        { $$ = new_expr(state, EXPR_CALL, @1); $$->name = $1; }
  ;

arg_list:
    %empty                      { $$.items = NULL; $$.n = 0; }
  | args                        { $$ = $1; }
  ;

args:
    arg                         { $$.items = NULL; $$.n = 0; $$.items = dm_pool_push(state->pool, $$.items, &$$.n, sizeof(dm_expr *), &$1); }
  | args ',' arg                { $$ = $1; $$.items = dm_pool_push(state->pool, $$.items, &$$.n, sizeof(dm_expr *), &$3); }
  ;

arg:
    expr                        { $$ = $1; }
  | NAME '=' expr               { $$ = new_expr(state, EXPR_KWARG, @1); $$->name = $1; $$->lhs = $3; deepen(state, $$, $3->depth); }
    /* concat(a, b, dim = -1): torch's keyword, a reserved word elsewhere */
  | KW_DIM '=' expr             { $$ = new_expr(state, EXPR_KWARG, @1); $$->name = "dim"; $$->lhs = $3; deepen(state, $$, $3->depth); }
  ;

expr_list_opt:
    %empty                      { $$.items = NULL; $$.n = 0; }
  | exprs                       { $$ = $1; }
  ;

exprs:
    expr                        { $$.items = NULL; $$.n = 0; $$.items = dm_pool_push(state->pool, $$.items, &$$.n, sizeof(dm_expr *), &$1); }
  | exprs ',' expr              { $$ = $1; $$.items = dm_pool_push(state->pool, $$.items, &$$.n, sizeof(dm_expr *), &$3); }
  ;

%%

static int is_keyword(int kind) {
    switch (kind) {
    case YYSYMBOL_KW_DIM: case YYSYMBOL_KW_MESH: case YYSYMBOL_KW_INPUT: case YYSYMBOL_KW_PARAM:
    case YYSYMBOL_KW_LAYER: case YYSYMBOL_KW_AS: case YYSYMBOL_KW_REPEAT: case YYSYMBOL_KW_BLOCK:
    case YYSYMBOL_KW_RETURN: case YYSYMBOL_KW_OUTPUT: case YYSYMBOL_KW_MINIMIZE: case YYSYMBOL_KW_OPTIMIZER:
    case YYSYMBOL_KW_SCHEDULE: case YYSYMBOL_KW_ACCUMULATE: case YYSYMBOL_KW_ZERO: case YYSYMBOL_KW_PRECISION: return 1;
    default: return 0;
    }
}

/* The keyword's text: its symbol's name without the quotes ("'zero'"). */
static const char *keyword_text(int kind, char *buf, size_t size) {
    const char *quoted = yysymbol_name((yysymbol_kind_t)kind);
    snprintf(buf, size, "%.*s", (int)strlen(quoted) - 2, quoted + 1);
    return buf;
}

/* What a name after token kind would have been (definitions are def_name's). */
static const char *named_after(int token) {
    return token == KW_OUTPUT || token == KW_RETURN || token == KW_MINIMIZE ? "cannot name a value" : "cannot be used as a name";
}

/* Syntax errors, as bison's detailed ones ("syntax error, unexpected X, expecting A or
 * B"), except where a reserved word stands for a name: where a name was expected
 * (`param zero : ...`, `y = zero * 2`), and a statement that begins with a keyword
 * followed by '=' or ':' that it does not take (`schedule = ...`, `input : ...`). */
static void describe_syntax_error(const yypcontext_t *ctx, dm_parse_state *state) {
    enum { MAX_LISTED = 4 };
    yysymbol_kind_t unexpected = yypcontext_token(ctx);
    const DM_YYLTYPE *loc = yypcontext_location(ctx);
    yysymbol_kind_t expected[YYNTOKENS];
    int n_expected = unexpected == YYSYMBOL_YYEMPTY ? 0 : yypcontext_expected_tokens(ctx, expected, YYNTOKENS);
    int name_expected = 0;
    for (int i = 0; i < n_expected; i++) name_expected |= expected[i] == YYSYMBOL_NAME;
    char word[32];
    if (is_keyword(unexpected) && name_expected) {
        dm_error(state->diag, *loc, "'%s' is a reserved word and %s", keyword_text(unexpected, word, sizeof word),
                 named_after(state->prev_token));
        return;
    }
    int at_start = state->prev2_token == 0 || state->prev2_token == NL || state->prev2_token == '{';
    int kw = YYTRANSLATE(state->prev_token);
    if ((unexpected == YYTRANSLATE('=') || unexpected == YYTRANSLATE(':')) && at_start && is_keyword(kw)) {
        dm_error(state->diag, state->prev_loc, "'%s' is a reserved word and cannot name a value",
                 keyword_text(kw, word, sizeof word));
        return;
    }
    char msg[512];
    int n = snprintf(msg, sizeof msg, "syntax error");
    if (unexpected != YYSYMBOL_YYEMPTY) {
        n += snprintf(msg + n, sizeof msg - (size_t)n, ", unexpected %s", yysymbol_name(unexpected));
        for (int i = 0; i < n_expected && n_expected <= MAX_LISTED && n < (int)sizeof msg; i++)
            n += snprintf(msg + n, sizeof msg - (size_t)n, "%s%s", i ? " or " : ", expecting ", yysymbol_name(expected[i]));
    }
    dm_error(state->diag, *loc, "%s", msg);
}

static int is_token(yysymbol_kind_t k) {
    return k != YYSYMBOL_YYEMPTY && k != YYSYMBOL_YYEOF && k != YYSYMBOL_YYerror && k != YYSYMBOL_YYUNDEF && k != YYSYMBOL_NL;
}

/* Recovery discards up to an end of line, which an unclosed ( or [ would keep from ever
 * coming (its newlines are spaces): the brackets open are dropped. Where the error is at
 * the first token after such a newline (`h = relu(x @ w` on the line before), the lexer
 * gives the end of line, then that token again, so its line is parsed rather than
 * skipped; there, and where the input ends, a note shows the bracket left open. */
static void recover_at_line_end(dm_parse_state *state, yysymbol_kind_t unexpected, dm_loc at) {
    int open = state->nesting < DM_MAX_NESTING ? state->nesting : DM_MAX_NESTING;
    if (unexpected == YYTRANSLATE('(') || unexpected == YYTRANSLATE('[')) open--; /* the token itself */
    int replay = state->nl_before_last && is_token(unexpected);
    /* on the error's own line the bracket is in the line the error shows */
    if (open > 0 && (replay || unexpected == YYSYMBOL_NL) && state->open_locs[open - 1].line != at.line)
        dm_note(state->diag, state->open_locs[open - 1], "this '%c' is not closed: inside ( ) and [ ] a newline does "
                "not end the statement", state->open_chars[open - 1]);
    state->nesting = 0;
    if (replay) state->replay = 1;
}

static int yyreport_syntax_error(const yypcontext_t *ctx, void *scanner, dm_parse_state *state) {
    (void)scanner;
    describe_syntax_error(ctx, state);
    recover_at_line_end(state, yypcontext_token(ctx), *yypcontext_location(ctx));
    return 0;
}
