/* The IR verifier accepts a well-formed graph and reports each kind of broken
 * invariant: an operand defined later, a wrong arity, a non-positive dim, an unknown
 * mesh axis, a param whose role disagrees with its op. */
#include <stdio.h>
#include <string.h>

#include "ir.h"
#include "passes.h"

static dm_loc here = {1, 1, 1};

static ir_graph *small_graph(void) {
    ir_graph *g = ir_graph_new("t");
    ir_value *x = ir_add(g, OP_INPUT, NULL, 0, here);
    x->role = ROLE_INPUT;
    x->type.dtype = DT_F32;
    x->type.rank = 2;
    x->type.shape[0] = 4, x->type.shape[1] = 3;
    ir_value *r = ir_add(g, OP_RELU, (int[]){0}, 1, here);
    dm_diag d;
    dm_diag_init(&d, NULL, stderr);
    if (shapes_infer(g, r, &d)) printf("FAIL relu of f32[4, 3] does not type\n");
    return g;
}

static int expect(const char *what, ir_graph *g, int want_problems) {
    FILE *sink = fopen("/dev/null", "w");
    int got = ir_verify(g, "test", sink);
    fclose(sink);
    ir_graph_free(g);
    if ((got > 0) != (want_problems > 0)) {
        printf("FAIL %s: verifier reported %d problems, expected %s\n", what, got, want_problems ? "some" : "none");
        return 1;
    }
    printf("ok   %s (%d)\n", what, got);
    return 0;
}

int main(void) {
    int failures = 0;
    failures += expect("well-formed graph", small_graph(), 0);

    ir_graph *g = small_graph();
    g->values[1]->operands[0] = 1;   /* uses itself */
    failures += expect("operand not defined earlier", g, 1);

    g = small_graph();
    ir_add(g, OP_RELU, (int[]){0, 1}, 2, here); /* relu of two operands */
    g->values[2]->type = g->values[1]->type;
    failures += expect("wrong arity", g, 1);

    g = small_graph();
    g->values[1]->type.shape[1] = 0;
    failures += expect("non-positive dim", g, 1);

    g = small_graph();
    g->values[0]->type.split[0] = 3;   /* the graph has no mesh */
    failures += expect("unknown mesh axis", g, 1);

    g = small_graph();
    g->values[1]->role = ROLE_PARAM;
    failures += expect("param role on a non-param op", g, 1);

    g = small_graph();
    g->loss = 1;   /* not a scalar */
    failures += expect("loss is not a scalar", g, 1);

    printf("%d passed, %d failed\n", 7 - failures, failures);
    return failures ? 1 : 0;
}
