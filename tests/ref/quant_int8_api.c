/* quant_int8_api.c: a --quantize int8 mlp.c (B=8, H=63) through its C API, for
 * tests/ref/test_quantize_int8.py, run in a directory beside the test's ../w.st (f32
 * weights) and ../q.st (the trainer's --save-quantized file of them, calibrated): a forward
 * before any weights are loaded is refused, naming the uncalibrated scale (it aborted the
 * process); mlp_load_weights refuses the f32 file (it left the random weights of create)
 * and loads the quantized one, after which two contexts made from different seeds predict
 * the same logits bit for bit (the file's weights, not create's). Exits 0 when every check
 * holds, else 1 with the failed check on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBE "quant_int8_api"
#include "api_check.h"
#include "mlp.h"

enum { B = 8, D = 784, K = 10 };

/* A context from seed with ../q.st loaded; its logits for x in logits. */
static void predict_from_file(uint64_t seed, mlp_batch *batch, float *logits) {
    char err[256];
    mlp_ctx *ctx = mlp_create(seed, err, sizeof err);
    CHECK(ctx, "create: %s", err);
    float loss = 0;
    CHECK(mlp_forward(ctx, batch, &loss) == DMRT_ERR_ARG, "a forward before calibrated scales were loaded ran");
    CHECK(strstr(mlp_error(ctx), "has no calibrated input scale"), "the refused forward's message: '%s'", mlp_error(ctx));
    CHECK(mlp_load_weights(ctx, "../w.st") == DMRT_ERR_FILE, "an f32 file was loaded into an int8 program");
    CHECK(strstr(mlp_error(ctx), "also needs its products' input scales"), "the f32 file's message: '%s'",
          mlp_error(ctx));
    CHECK(mlp_load_weights(ctx, "../q.st") == DMRT_OK, "load of the --save-quantized file: %s", mlp_error(ctx));
    mlp_outputs out = {.logits = logits};
    CHECK(mlp_predict(ctx, batch, B, &out) == DMRT_OK, "predict: %s", mlp_error(ctx));
    mlp_destroy(ctx);
}

int main(void) {
    static float x[B * D], first[B * K], second[B * K];
    static int32_t y[B];
    for (int i = 0; i < B * D; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (int i = 0; i < B; i++) y[i] = i % K;
    mlp_batch batch = {.x = x, .y = y};
    predict_from_file(5, &batch, first);
    predict_from_file(9, &batch, second);
    CHECK(memcmp(first, second, sizeof first) == 0, "contexts from seeds 5 and 9 predict differently after loading q.st");
    int nonzero = 0;
    for (int i = 0; i < B * K; i++) nonzero += first[i] != 0;
    CHECK(nonzero > 0, "the logits are all 0");
    printf("forward refused before loading; f32 file refused; q.st loaded, the same logits from seeds 5 and 9\n");
    return 0;
}
