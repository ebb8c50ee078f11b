/* parse_state.h: what the reentrant lexer and parser share (flex's yyextra). Private
 * to frontend/. */
#ifndef DM_PARSE_STATE_H
#define DM_PARSE_STATE_H

#include "ast.h"
#include "pool.h"

/* Deeper nesting than this is an error, not a stack overflow later. */
#define DM_MAX_NESTING 200

typedef struct dm_parse_state {
    dm_diag *diag;
    dm_pool *pool;
    dm_program *program;
    int nesting;      /* open ( and [ : newlines inside them are spaces */
    int brace_depth;  /* open { */
    int last_token;   /* to insert a separator before '}' and at the end */
    int at_eof;
    int line, col;    /* position of the next character */
} dm_parse_state;

#endif
