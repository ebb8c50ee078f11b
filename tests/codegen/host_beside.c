/* host_beside.c: a serial program's context created beside a rank of another program's
 * mesh (<model>_create_beside, what a distillation teacher is made with on each rank of its
 * student; meson test `codegen-create-beside`), for examples/mlp.dm (small sizes) on the C
 * target:
 *   - the serial program's descriptor has create_beside;
 *   - beside each of 4 thread ranks, the context runs on the threads a rank of 4 gets
 *     (dmrt_threads_per_rank(4), the formula of docs/runtime.md), where mlp_create's runs on
 *     a serial program's (dmrt_threads_per_rank(1)); beside NULL is mlp_create;
 *   - its parameters are mlp_create's from the same seed, bit for bit (it joins no mesh:
 *     nothing is split).
 * The generated file is included, so that the context's thread count can be read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.c"
#include "dmrt_comm.h"
#include "../runtime/check.h"

enum { RANKS = 4 };
static const uint64_t SEED = 11;

static _Atomic int fails = 0; /* CHECK's count, from the rank threads too */

static mlp_ctx *serial;

/* Parameter i of ctx is serial's, bit for bit. */
static int same_params(mlp_ctx *ctx) {
    for (int i = 0; i < mlp_model.n_params; i++) {
        size_t bytes = (size_t)mlp_model.params[i].numel * dmrt_dtype_size(mlp_model.params[i].dtype);
        if (memcmp(mlp_model.param(ctx, i), mlp_model.param(serial, i), bytes) != 0) return 0;
    }
    return 1;
}

static int beside_rank(dmrt_rank *rank, void *arg) {
    (void)arg;
    char err[256] = "";
    mlp_ctx *ctx = mlp_model.create_beside(SEED, rank, err, sizeof err);
    CHECK(ctx != NULL, "create_beside on rank %d: %s", dmrt_rank_id(rank), err);
    if (!ctx) return 1;
    CHECK(ctx->threads == dmrt_threads_per_rank(RANKS), "rank %d: %d threads, want %d (a rank of %d's)", dmrt_rank_id(rank),
          ctx->threads, dmrt_threads_per_rank(RANKS), RANKS);
    CHECK(same_params(ctx), "rank %d: the parameters differ from mlp_create's", dmrt_rank_id(rank));
    mlp_destroy(ctx);
    return 0;
}

int main(void) {
    unsetenv("DMC_THREADS"); /* the counts below are the cores' shares */
    char err[256] = "";
    CHECK(mlp_model.create_beside != NULL, "the serial program's descriptor has no create_beside");
    serial = mlp_create(SEED, err, sizeof err);
    CHECK(serial != NULL, "mlp_create: %s", err);
    if (!serial || !mlp_model.create_beside) return 1;
    CHECK(serial->threads == dmrt_threads_per_rank(1), "mlp_create: %d threads, want %d", serial->threads,
          dmrt_threads_per_rank(1));
    mlp_ctx *alone = mlp_create_beside(SEED, NULL, err, sizeof err);
    CHECK(alone && alone->threads == serial->threads && same_params(alone), "create_beside(NULL) is not mlp_create");
    mlp_destroy(alone);
    if (dmrt_threads_run(RANKS, beside_rank, NULL, err, sizeof err) != 0) CHECK(0, "%s", err);
    if (dmrt_threads_per_rank(RANKS) == dmrt_threads_per_rank(1))
        printf("note: %d cores: a rank of %d and a serial program get the same threads here\n", dmrt_cores(), RANKS);
    mlp_destroy(serial);
    printf("%s\n", fails ? "FAILED" : "create_beside: a rank's threads, mlp_create's parameters");
    return fails != 0;
}
