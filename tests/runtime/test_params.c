/* test_params: dmrt_save_params / dmrt_load_params on the hand-written model,
 * including all-or-nothing loading of bad files and the "transformer." prefix of
 * Hugging Face GPT-2 checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dmrt.h"
#include "softmax.h"
#include "testutil.h"

static int same_params(const dmrt_model *m, void *a, void *b) {
    for (int i = 0; i < m->n_params; i++)
        if (memcmp(m->param(a, i), m->param(b, i), (size_t)m->params[i].numel * 4) != 0) return 0;
    return 1;
}

/* Parameters named as Hugging Face's GPT2LMHeadModel saves them ("transformer." + the
 * model's name), next to an attention mask buffer the model does not have. */
static int test_hf_prefix(const dmrt_model *m, const char *dir) {
    int fails = 0;
    char path[4096], err[1024];
    float w[12], w_plain[12], bias[3] = {7.0f, 8.0f, 9.0f}, bias4[4] = {0}, mask[16];
    for (int i = 0; i < 12; i++) w[i] = 200.0f + (float)i, w_plain[i] = -1.0f - (float)i;
    for (int i = 0; i < 16; i++) mask[i] = i % 5 == 0;
    const dmrt_tensor_desc wd = {.name = "transformer.fc.weight", .dtype = DMRT_F32, .rank = 2, .shape = {3, 4}, .numel = 12};
    const dmrt_tensor_desc wd_plain = {.name = "fc.weight", .dtype = DMRT_F32, .rank = 2, .shape = {3, 4}, .numel = 12};
    const dmrt_tensor_desc bd = {.name = "transformer.fc.bias", .dtype = DMRT_F32, .rank = 1, .shape = {3}, .numel = 3};
    const dmrt_tensor_desc bd_shape = {.name = "transformer.fc.bias", .dtype = DMRT_F32, .rank = 1, .shape = {4}, .numel = 4};
    const dmrt_tensor_desc bd_other = {.name = "transformer_fc.bias", .dtype = DMRT_F32, .rank = 1, .shape = {3}, .numel = 3};
    const dmrt_tensor_desc maskd = {.name = "h.0.attn.bias", .dtype = DMRT_F32, .rank = 4, .shape = {1, 1, 4, 4}, .numel = 16};
    void *ctx = m->create(3, err, sizeof err), *snap = m->create(3, err, sizeof err);
    if (!ctx || !snap) return 1;

    /* all prefixed, plus an extra buffer: loads */
    dmrt_tensor_desc d1[3] = {maskd, wd, bd};
    const void *v1[3] = {mask, w, bias};
    tu_path(path, sizeof path, dir, "hf.safetensors");
    CHECK(dmrt_st_write(path, 3, d1, v1, err, sizeof err) == 0, "write: %s", err);
    CHECK(dmrt_load_params(m, ctx, path, err, sizeof err) == 0, "prefixed load: %s", err);
    CHECK(memcmp(m->param(ctx, 0), w, sizeof w) == 0 &&
              memcmp(m->param(ctx, 1), bias, sizeof bias) == 0,
          "prefixed tensors not loaded");

    /* both spellings of fc.weight: the exact name wins */
    dmrt_tensor_desc d2[3] = {wd, wd_plain, bd};
    const void *v2[3] = {w, w_plain, bias};
    tu_path(path, sizeof path, dir, "hf_both.safetensors");
    CHECK(dmrt_st_write(path, 3, d2, v2, err, sizeof err) == 0, "write: %s", err);
    CHECK(dmrt_load_params(m, ctx, path, err, sizeof err) == 0, "mixed load: %s", err);
    CHECK(memcmp(m->param(ctx, 0), w_plain, sizeof w_plain) == 0,
          "with fc.weight and transformer.fc.weight, the prefixed one was loaded");

    /* a prefixed tensor of the wrong shape, or a near miss of the prefix: nothing changes */
    struct {
        const char *file;
        dmrt_tensor_desc bias;
        const void *data;
        const char *phrase;
    } bad[] = {
        {"hf_shape.safetensors", bd_shape, bias4,
         "tensor 'transformer.fc.bias': shape [4] in the file but the model expects [3] for parameter 'fc.bias'"},
        {"hf_near.safetensors", bd_other, bias,
         "parameter 'fc.bias' (F32 [3]) of model 'softmax_small' is missing from the file (also as 'transformer.fc.bias')"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        dmrt_tensor_desc d3[2] = {wd, bad[c].bias};
        const void *v3[2] = {w, bad[c].data};
        tu_path(path, sizeof path, dir, bad[c].file);
        CHECK(dmrt_st_write(path, 2, d3, v3, err, sizeof err) == 0, "write: %s", err);
        for (int i = 0; i < m->n_params; i++)
            memcpy(m->param(snap, i), m->param(ctx, i), (size_t)m->params[i].numel * 4);
        err[0] = '\0';
        CHECK(dmrt_load_params(m, ctx, path, err, sizeof err) != 0, "%s: accepted", bad[c].file);
        CHECK_MSG(err, path, bad[c].phrase);
        CHECK(same_params(m, ctx, snap), "%s: failed load changed the context", bad[c].file);
    }
    m->destroy(ctx);
    m->destroy(snap);
    return fails;
}

int main(void) {
    int fails = 0;
    const dmrt_model *m = &softmax_small_model;
    char dir[4096], path[4096], err[1024];
    if (tu_mkdtemp(dir, sizeof dir) != 0) return 1;
    void *a = m->create(1, err, sizeof err), *b = m->create(2, err, sizeof err);
    void *snap = m->create(2, err, sizeof err);
    CHECK(a && b && snap, "create: %s", err);
    if (!a || !b || !snap) return 1;
    CHECK(!same_params(m, a, b), "seeds 1 and 2 give the same parameters");
    void *a2 = m->create(1, err, sizeof err);
    CHECK(same_params(m, a, a2), "seed 1 twice gives different parameters");
    m->destroy(a2);

    tu_path(path, sizeof path, dir, "a.safetensors");
    CHECK(dmrt_save_params(m, a, path, err, sizeof err) == 0, "save: %s", err);
    CHECK(dmrt_load_params(m, b, path, err, sizeof err) == 0, "load: %s", err);
    CHECK(same_params(m, a, b), "loaded parameters differ from saved");

    /* Bad files: fc.weight fine (other values), then a problem with fc.bias; the
     * context must keep its parameters. */
    float w[12], bias[4] = {0};
    int32_t ib[3] = {0};
    for (int i = 0; i < 12; i++) w[i] = 100.0f + (float)i;
    const dmrt_tensor_desc wd = {.name = "fc.weight", .dtype = DMRT_F32, .rank = 2, .shape = {3, 4}, .numel = 12};
    struct {
        const char *name;
        dmrt_tensor_desc bias;
        const void *data;
        const char *phrase;
    } cases[] = {
        {"shape", {.name = "fc.bias", .dtype = DMRT_F32, .rank = 1, .shape = {4}, .numel = 4}, bias,
         "tensor 'fc.bias': shape [4] in the file but the model expects [3]"},
        {"rank", {.name = "fc.bias", .dtype = DMRT_F32, .rank = 2, .shape = {1, 3}, .numel = 3}, bias,
         "shape [1, 3] in the file but the model expects [3]"},
        {"dtype", {.name = "fc.bias", .dtype = DMRT_I32, .rank = 1, .shape = {3}, .numel = 3}, ib,
         "tensor 'fc.bias': dtype I32 but the model expects F32"},
        {"missing", {.name = "fc.bias_", .dtype = DMRT_F32, .rank = 1, .shape = {3}, .numel = 3}, bias,
         "parameter 'fc.bias' (F32 [3]) of model 'softmax_small' is missing"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dmrt_tensor_desc descs[2] = {wd, cases[c].bias};
        const void *data[2] = {w, cases[c].data};
        char name[64];
        snprintf(name, sizeof name, "bad_%s.safetensors", cases[c].name);
        tu_path(path, sizeof path, dir, name);
        CHECK(dmrt_st_write(path, 2, descs, data, err, sizeof err) == 0, "write: %s", err);
        for (int i = 0; i < m->n_params; i++)
            memcpy(m->param(snap, i), m->param(b, i), (size_t)m->params[i].numel * 4);
        err[0] = '\0';
        CHECK(dmrt_load_params(m, b, path, err, sizeof err) != 0, "%s: accepted", cases[c].name);
        CHECK_MSG(err, path, cases[c].phrase);
        CHECK(same_params(m, b, snap), "%s: failed load changed the context", cases[c].name);
    }
    fails += test_hf_prefix(m, dir);
    tu_path(path, sizeof path, dir, "none.safetensors");
    CHECK(dmrt_load_params(m, b, path, err, sizeof err) != 0, "missing file accepted");
    CHECK_MSG(err, path, "cannot open");

    m->destroy(a);
    m->destroy(b);
    m->destroy(snap);
    tu_rmdir(dir);
    if (fails) fprintf(stderr, "test_params: %d failures\n", fails);
    return fails != 0;
}
