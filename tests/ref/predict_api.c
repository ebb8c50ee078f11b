/* predict_api.c: mlp_predict through the C API, for tests/ref/test_predict.py (examples/mlp.dm
 * compiled with B=8, H=64, D=784, K=10). Exits 0 when every check holds, else 1 with
 * the failed check on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBE "predict_api"
#include "api_check.h"
#include "mlp.h"

enum { B = 8, D = 784, K = 10 };

int main(void) {
    static float x[B * D], padded[B * D], logits[B * K], forward_logits[B * K];
    static int32_t y[B];
    char err[256];
    for (int i = 0; i < B * D; i++) x[i] = (float)((i * 37) % 101) / 101.0f;
    for (int i = 0; i < B; i++) y[i] = i % K;
    mlp_ctx *a = mlp_create(5, err, sizeof err), *b = mlp_create(5, err, sizeof err);
    CHECK(a && b, "create: %s", err);
    mlp_outputs out = {.logits = logits};
    mlp_batch in = {.x = x, .y = NULL}; /* the targets are not read */

    /* bad row counts and a missing input */
    CHECK(mlp_predict(a, &in, 0, &out) == DMRT_ERR_ARG && strstr(mlp_error(a), "0 rows, expected 1 to 8"), "rows 0: %s",
          mlp_error(a));
    CHECK(mlp_predict(a, &in, 9, &out) == DMRT_ERR_ARG && strstr(mlp_error(a), "9 rows"), "rows 9: %s", mlp_error(a));
    mlp_batch none = {.x = NULL, .y = y};
    CHECK(mlp_predict(a, &none, 3, &out) == DMRT_ERR_ARG && strstr(mlp_error(a), "input x is NULL"), "NULL x: %s",
          mlp_error(a));

    /* 3 rows == the first 3 rows of forward on the batch padded with zeros, bit for bit;
     * nothing past them is written */
    for (int i = 0; i < B * K; i++) logits[i] = -7.0f;
    CHECK(mlp_predict(a, &in, 3, &out) == DMRT_OK, "predict: %s", mlp_error(a));
    memcpy(padded, x, sizeof(float) * 3 * D);
    mlp_batch whole = {.x = padded, .y = y};
    float loss;
    CHECK(mlp_forward(a, &whole, &loss) == DMRT_OK, "forward: %s", mlp_error(a));
    memcpy(forward_logits, mlp_output_logits(a), sizeof forward_logits);
    CHECK(memcmp(logits, forward_logits, sizeof(float) * 3 * K) == 0, "predict's rows differ from forward's");
    for (int i = 3 * K; i < B * K; i++) CHECK(logits[i] == -7.0f, "predict wrote past its rows (element %d)", i);

    /* predict changes nothing training sees: the same steps after it as without it */
    mlp_batch train = {.x = x, .y = y};
    for (int step = 0; step < 3; step++) {
        float la, lb;
        CHECK(mlp_predict(a, &in, B, &out) == DMRT_OK, "predict: %s", mlp_error(a));
        CHECK(mlp_train_step(a, &train, &la) == DMRT_OK && mlp_train_step(b, &train, &lb) == DMRT_OK, "train_step");
        CHECK(la == lb, "step %d: loss %.9g after predict, %.9g without", step, la, lb);
    }
    mlp_destroy(a);
    mlp_destroy(b);
    printf("predict_api: ok\n");
    return 0;
}
