/* fuzz_frontend.c: libFuzzer target over the whole front half of dmc.
 *
 * The input bytes are a .dm source. They go through the same sequence as the driver
 * (driver/dmc.c): parse, lower (only when parsing reported no error), the IR verifier
 * after each pass, the training-step checks, autodiff, optimizer, sharding, the memory plan, the IR printer and --explain;
 * then everything is freed, so LeakSanitizer sees any leak.
 *
 * Diagnostics go to /dev/null (opened once). A broken IR invariant (ir_verify) is an
 * internal error of dmc, so it traps: the fuzzer reports it as a crash.
 *
 * Built by tests/fuzz/run_fuzz.sh with clang -fsanitize=fuzzer,address,undefined. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ast.h"
#include "explain.h"
#include "ir.h"
#include "lower.h"
#include "passes.h"

static FILE *devnull;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void verify(const ir_graph *g, const char *pass) {
    if (ir_verify(g, pass, stderr) != 0) {
        fprintf(stderr, "fuzz_frontend: IR invariant broken after %s\n", pass);
        __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!devnull) {
        devnull = fopen("/dev/null", "w");
        if (!devnull) abort();
    }
    dm_source src;
    dm_source_from_string(&src, "fuzz.dm", (const char *)data, size);
    dm_diag diag;
    dm_diag_init(&diag, &src, devnull);
    dm_program *prog = dm_parse(&diag);
    ir_graph *g = NULL;
    if (diag.n_errors == 0) {
        dm_lower_options lo = {.model = "fuzz", .schedule = -1, .zero = -1};
        g = dm_lower(prog, &lo, &diag);
    }
    dm_program_free(prog);
    if (g) {
        verify(g, "lower");
        if (pass_trainable(g, &diag) == 0 && pass_autodiff(g, &diag) == 0) {
            verify(g, "autodiff");
            dm_reshard_list reshards = {0};
            dm_pipeline_plan pipeline = {0};
            if (pass_optimizer(g, &diag) == 0 && pass_shard(g, &reshards, &diag) == 0 &&
                pass_pipeline(g, NULL, &pipeline, &diag) == 0) {
                verify(g, "shard");
                dm_memory_plan plan;
                pass_memory(g, &plan);
                ir_print(g, devnull);
                explain_print(g, &plan, &reshards, &pipeline, NULL, "fuzz.dm", EXPLAIN_TEXT, devnull);
                explain_print(g, &plan, &reshards, &pipeline, NULL, "fuzz.dm", EXPLAIN_FULL, devnull);
                explain_print(g, &plan, &reshards, &pipeline, NULL, "fuzz.dm", EXPLAIN_JSON, devnull);
                dm_memory_plan_free(&plan);
            }
            dm_pipeline_plan_free(&pipeline);
            dm_reshard_list_free(&reshards);
        }
    }
    ir_graph_free(g);
    dm_source_free(&src);
    return 0;
}
