/* parse.c: dm_parse, the entry point that ties the flex scanner to the bison parser. */
#include <stdio.h>
#include <stdlib.h>

#include "ast.h"
#include "parse_state.h"
#include "parser.h"
#include "lexer.h"

struct dm_program_owner {
    dm_program program;
    dm_pool *pool;
};

dm_program *dm_parse(dm_diag *d) {
    dm_pool *pool = dm_pool_new();
    struct dm_program_owner *owner = dm_pool_alloc(pool, sizeof *owner);
    owner->pool = pool;
    /* the scanner takes an int length; dm_source_read refuses larger files, and a text
     * from elsewhere (dm_source_from_string) is held to the same limit */
    if (d->src->len > DM_MAX_SOURCE_BYTES) {
        fprintf(d->out, "dmc: error: %s is larger than %d MiB, the most a source may have\n", d->src->path,
                DM_MAX_SOURCE_BYTES >> 20);
        d->n_errors++;
        return &owner->program;
    }
    dm_parse_state state = {.diag = d, .pool = pool, .program = &owner->program, .line = 1, .col = 1};
    yyscan_t scanner;
    if (dm_yylex_init_extra(&state, &scanner) != 0) abort();
    YY_BUFFER_STATE buf = dm_yy_scan_bytes(d->src->text, (int)d->src->len, scanner);
    dm_yyparse(scanner, &state);
    dm_yy_delete_buffer(buf, scanner);
    dm_yylex_destroy(scanner);
    return &owner->program;
}

void dm_program_free(dm_program *p) {
    if (p) dm_pool_free(((struct dm_program_owner *)p)->pool);
}
