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
    int prev_token;   /* the two tokens before it, and where the first was (0: none), */
    int prev2_token;  /* so that a syntax error at or after a keyword can say it is one */
    dm_loc prev_loc;
    dm_loc last_loc;
    char *reserved_word; /* a reserved word a definition's name was given as (parser.y) */
    int at_eof;
    int line, col;    /* position of the next character */
} dm_parse_state;

#endif
