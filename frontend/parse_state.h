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
    dm_loc open_locs[DM_MAX_NESTING]; /* (nesting) where each open ( and [ is, */
    char open_chars[DM_MAX_NESTING];  /* and which it is */
    int nl_pending;   /* a newline was read as a space since the last token, */
    int nl_before_last; /* and before the last one */
    void *last_value; /* the last token's value (a NAME's text, a NUMBER's expr), */
    int replay;       /* for lexing it again after a syntax error: 1 an end of line first, 2 the token */
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
