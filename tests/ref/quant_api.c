/* quant_api.c: a --quantize int8-weights or int4-weights mlp.c (B=8, H=63) through its C
 * API, for tests/ref/test_quantize.py: train_step is refused with its reason and changes
 * nothing (the logits of a forward before and after, and the weights save_weights writes,
 * are bit for bit the same), while forward and predict run. Its products read the narrow weights made at create, which an update would
 * not change: training would lose every update. Then load_weights of the saved f32 file
 * into a context from another seed predicts the same logits (to the scales' ulp): it
 * quantizes the file's weights, where it left create's. Exits 0 when every check holds, else 1
 * with the failed check on stderr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBE "quant_api"
#include "api_check.h"
#include "mlp.h"

enum { B = 8, D = 784, K = 10 };

/* Whether the two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb, ca = 0, cb = 0;
    while (same && (ca = fgetc(fa)) == (cb = fgetc(fb)) && ca != EOF) {
    }
    same = same && ca == cb;
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int main(void) {
    static float x[B * D], before[B * K], after[B * K], predicted[B * K];
    static int32_t y[B];
    char err[256];
    for (int i = 0; i < B * D; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (int i = 0; i < B; i++) y[i] = i % K;
    mlp_ctx *ctx = mlp_create(5, err, sizeof err);
    CHECK(ctx, "create: %s", err);
    mlp_batch batch = {.x = x, .y = y};
    float loss = 0, loss_after = 0, trained = -1;
    CHECK(mlp_forward(ctx, &batch, &loss) == DMRT_OK, "forward: %s", mlp_error(ctx));
    memcpy(before, mlp_output_logits(ctx), sizeof before);
    CHECK(mlp_save_weights(ctx, "before.safetensors") == DMRT_OK, "save: %s", mlp_error(ctx));
    for (int step = 0; step < 3; step++) {
        CHECK(mlp_train_step(ctx, &batch, &trained) == DMRT_ERR_ARG, "train_step %d was not refused", step);
        CHECK(strstr(mlp_error(ctx), "train_step: a --quantize program predicts and evaluates only"),
              "train_step's message: '%s'", mlp_error(ctx));
    }
    CHECK(mlp_forward(ctx, &batch, &loss_after) == DMRT_OK, "forward after: %s", mlp_error(ctx));
    memcpy(after, mlp_output_logits(ctx), sizeof after);
    CHECK(memcmp(before, after, sizeof before) == 0 && loss == loss_after,
          "the refused train_steps changed the logits or the loss (%g, then %g)", loss, loss_after);
    CHECK(mlp_save_weights(ctx, "after.safetensors") == DMRT_OK, "save: %s", mlp_error(ctx));
    CHECK(same_file("before.safetensors", "after.safetensors"), "the refused train_steps changed the saved weights");
    mlp_outputs out = {.logits = predicted};
    CHECK(mlp_predict(ctx, &batch, B, &out) == DMRT_OK, "predict: %s", mlp_error(ctx));
    CHECK(memcmp(predicted, before, sizeof before) == 0, "predict's logits differ from forward's");
    mlp_destroy(ctx);
    /* load_weights of that f32 file into a context from another seed quantizes it again (it
     * left create's narrow weights): the integers come back, the scales to an ulp */
    ctx = mlp_create(9, err, sizeof err);
    CHECK(ctx, "create: %s", err);
    CHECK(mlp_load_weights(ctx, "before.safetensors") == DMRT_OK, "load: %s", mlp_error(ctx));
    CHECK(mlp_predict(ctx, &batch, B, &out) == DMRT_OK, "predict after load: %s", mlp_error(ctx));
    float largest = 0;
    for (int i = 0; i < B * K; i++) largest = fabsf(before[i]) > largest ? fabsf(before[i]) : largest;
    for (int i = 0; i < B * K; i++) /* written so that a NaN fails */
        CHECK(fabsf(predicted[i] - before[i]) <= 1e-5f * largest,
              "logit %d after load_weights is %g, the saved context's %g (largest %g)", i, predicted[i], before[i], largest);
    mlp_destroy(ctx);
    printf("train_step refused 3 times, logits and saved weights unchanged; forward and predict run; "
           "load_weights into another context predicts the same\n");
    return 0;
}
