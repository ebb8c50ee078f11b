/* test_trainer: runs softmax_train (dmrt_trainer_main on the hand-written model) as a
 * subprocess and checks its output against the same model driven in-process.
 *
 *   test_trainer PATH/softmax_train batch   --batch-file, options, errors
 *   test_trainer PATH/softmax_train mnist   fashion-mnist (skipped without the data set)
 *   test_trainer PATH/softmax_train tiny    generated IDX data set: padding in evaluation */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "dmrt.h"
#include "softmax.h"
#include "testutil.h"

#define SKIP 77
enum { S = 3, B = 8, D = 4, C = 3 }; /* batch file slices; softmax_small's shapes */

/* Runs the trainer with NULL-terminated args after the model name. */
static tu_output trainer(const char *exe, const char *dir, const char *model, const char **args) {
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)exe;
    argv[n++] = (char *)model;
    for (; *args && n < 62; args++) argv[n++] = (char *)*args;
    argv[n] = NULL;
    return tu_run_capture(argv, dir);
}

/* Losses of the "step N loss V" lines, in order; returns how many (-1 if a line is
 * malformed or N is out of sequence). */
static int step_losses(const char *out, float *loss, int max) {
    int n = 0;
    for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        if (strncmp(l, "step ", 5) != 0) continue;
        long long k;
        char val[64];
        if (sscanf(l, "step %lld loss %63s", &k, val) != 2 || k != n + 1) return -1;
        if (n < max) loss[n] = strtof(val, NULL);
        n++;
    }
    return n;
}

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* x: f32[S, B, D] normal, y: i32[S, B] in [0, C) (or `bad_label` at [0][0] if >= 0). */
static void make_batches(float *x, int32_t *y, int bad_label) {
    dmrt_rng r;
    dmrt_rng_init(&r, 5, 0);
    dmrt_fill_normal(x, S * B * D, 0.0f, 1.0f, &r);
    for (int i = 0; i < S * B; i++) y[i] = (int32_t)(dmrt_rng_u64(&r) % C);
    if (bad_label >= 0) y[0] = bad_label;
}

static int write_batches(const char *path, int bad_label, const dmrt_tensor_desc *xd,
                         const dmrt_tensor_desc *yd) {
    float x[S * B * D];
    int32_t y[S * B];
    make_batches(x, y, bad_label);
    float extra = 1.0f;
    dmrt_tensor_desc descs[3] = {
        {.name = "unused", .dtype = DMRT_F32, .rank = 1, .shape = {1}, .numel = 1}};
    descs[1] = xd ? *xd : (dmrt_tensor_desc){.name = "x", .dtype = DMRT_F32, .rank = 3, .shape = {S, B, D}, .numel = S * B * D};
    descs[2] = yd ? *yd : (dmrt_tensor_desc){.name = "y", .dtype = DMRT_I32, .rank = 2, .shape = {S, B}, .numel = S * B};
    /* big enough for any variant the tests write */
    float *xbuf = calloc(1024, sizeof(float));
    int32_t *ybuf = calloc(1024, sizeof(int32_t));
    memcpy(xbuf, x, sizeof x);
    memcpy(ybuf, y, sizeof y);
    const void *data[3] = {&extra, xbuf, ybuf};
    char err[1024];
    int rc = dmrt_st_write(path, 3, descs, data, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    free(xbuf);
    free(ybuf);
    return rc;
}

static int params_equal_file(const dmrt_model *m, void *ctx, const char *path, int grads) {
    dmrt_st_file f;
    char err[1024];
    if (dmrt_st_read(&f, path, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 0;
    }
    int ok = f.n_tensors == m->n_params;
    for (int i = 0; ok && i < m->n_params; i++) {
        const dmrt_st_tensor *t = dmrt_st_find(&f, m->params[i].name);
        const void *mine = grads ? m->grad(ctx, i) : m->param(ctx, i);
        ok = t && t->numel == m->params[i].numel &&
             memcmp(t->data, mine, (size_t)t->numel * 4) == 0;
    }
    dmrt_st_close(&f);
    return ok;
}

/* DMRT_BLAS_TIME=1: every step line ends in blas_ms (at most the step's ms) and a summary
 * counts softmax_small's two products a step, of 2 B C D flops each; unset, neither. */
static int test_blas_report(const char *exe, const char *dir, const char *bpath) {
    int fails = 0;
    const char *args[] = {"--batch-file", bpath, "--steps", "5", "--quiet", NULL};
    for (int on = 0; on <= 1; on++) {
        if (on) setenv("DMRT_BLAS_TIME", "1", 1);
        else unsetenv("DMRT_BLAS_TIME");
        tu_output r = trainer(exe, dir, "small", args);
        CHECK(r.status == 0, "DMRT_BLAS_TIME %s: status %d: %s", on ? "1" : "unset", r.status, r.err);
        int steps = 0;
        for (const char *l = strstr(r.out, "step "); l; l = strstr(l + 1, "\nstep ")) {
            l += l[0] == '\n';
            double ms, blas_ms;
            const char *field = strstr(l, " blas_ms ");
            const char *eol = strchr(l, '\n');
            int has = field && (!eol || field < eol);
            CHECK(has == on, "step line %d %s blas_ms", steps + 1, on ? "lacks" : "has");
            if (has && sscanf(l, "step %*d loss %*s ms %lf", &ms) == 1 && sscanf(field, " blas_ms %lf", &blas_ms) == 1)
                CHECK(blas_ms >= 0.0 && blas_ms <= ms, "step %d: blas_ms %.3f of ms %.3f", steps + 1, blas_ms, ms);
            steps++;
        }
        CHECK(steps == 5, "%d step lines", steps);
        const char *sum = strstr(r.out, "\nblas ");
        CHECK((sum != NULL) == on, "summary line %s:\n%s", on ? "missing" : "printed while off", r.out);
        double blas_s, step_s, pct, gflop;
        long long calls;
        if (on && sum && sscanf(sum, "\nblas %lf s of train_step's %lf s (%lf%%), %lld products, %lf GFLOP", &blas_s,
                                &step_s, &pct, &calls, &gflop) == 5) {
            double want = 5 * 2 * 2e-9 * B * C * D;
            CHECK(calls == 10, "%lld products in 5 steps, want 10", calls);
            CHECK(fabs(gflop - want) <= 1e-5 * want, "%.9g GFLOP, want %.9g", gflop, want);
            CHECK(blas_s <= step_s && pct <= 100.0, "blas %.3f s of %.3f s (%.1f%%)", blas_s, step_s, pct);
        } else if (on) {
            CHECK(0, "malformed summary: %s", sum ? sum : "(none)");
        }
        tu_output_free(&r);
    }
    unsetenv("DMRT_BLAS_TIME");
    return fails;
}

/* 5 steps through the trainer against the same steps in-process: losses, --dump-grads,
 * --save. */
static int batch_run(const char *exe, const char *dir, const char *bpath, const char *save) {
    int fails = 0;
    const dmrt_model *m = &softmax_small_model;
    char grads[4096], err[1024];
    tu_path(grads, sizeof grads, dir, "grads.safetensors");
    /* 5 steps cycle through the 3 slices: 0 1 2 0 1 */
    const char *a1[] = {"--batch-file", bpath, "--steps", "5", "--seed", "7", "--save", save,
                        "--dump-grads", grads, "--quiet", NULL};
    tu_output r = trainer(exe, dir, "small", a1);
    CHECK(r.status == 0, "status %d, stderr: %s", r.status, r.err);
    float got[16];
    int n = step_losses(r.out, got, 16);
    CHECK(n == 5, "%d step lines in:\n%s", n, r.out);
    CHECK(contains(r.out, "\ntrained 5 steps in "), "no summary line in:\n%s", r.out);
    CHECK(r.err[0] == '\0', "--quiet run wrote to stderr: %s", r.err);
    tu_output_free(&r);

    /* the same in-process */
    void *ctx = m->create(7, err, sizeof err);
    float x[S * B * D];
    int32_t y[S * B];
    make_batches(x, y, -1);
    for (int s = 0; s < 5 && n == 5; s++) {
        const void *in[2] = {x + (s % S) * B * D, y + (s % S) * B};
        float loss;
        CHECK(m->train_step(ctx, in, &loss) == 0, "train_step");
        CHECK(got[s] == loss, "step %d: trainer printed loss %.9g, in-process %.9g", s + 1,
              (double)got[s], (double)loss);
        if (s == 0) CHECK(params_equal_file(m, ctx, grads, 1), "--dump-grads differ from step 1");
    }
    CHECK(params_equal_file(m, ctx, save, 0), "--save differs from the in-process parameters");
    void *ctx2 = m->create(0, err, sizeof err);
    CHECK(dmrt_load_params(m, ctx2, save, err, sizeof err) == 0, "load --save file: %s", err);
    m->destroy(ctx2);
    m->destroy(ctx);

    return fails;
}

/* Defaults and limits (one pass; --epochs; both), and --init then --save unchanged. */
static int batch_limits(const char *exe, const char *dir, const char *bpath, const char *save) {
    int fails = 0;
    char save2[4096];
    float got[16];
    int n;
    tu_output r;
    tu_path(save2, sizeof save2, dir, "out2.safetensors");
    /* defaults and limits: one pass; --epochs; both */
    struct {
        const char *args[6];
        int steps;
    } lim[] = {{{NULL}, 3}, {{"--epochs", "2"}, 6}, {{"--epochs", "2", "--steps", "4"}, 4},
               {{"--steps=2", "--epochs=3"}, 2}, {{"--steps", "0"}, 0}};
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
        const char *args[10] = {"--batch-file", bpath, "--quiet"};
        for (int k = 0; k < 6 && lim[i].args[k]; k++) args[3 + k] = lim[i].args[k];
        r = trainer(exe, dir, "small", args);
        n = step_losses(r.out, got, 16);
        CHECK(r.status == 0 && n == lim[i].steps, "limits case %zu: status %d, %d steps", i,
              r.status, n);
        tu_output_free(&r);
    }

    /* --init then --steps 0 --save: the same parameters */
    const char *a2[] = {"--batch-file", bpath, "--init", save, "--steps", "0", "--save", save2,
                        NULL};
    r = trainer(exe, dir, "small", a2);
    CHECK(r.status == 0, "init/save: status %d: %s", r.status, r.err);
    size_t s1, s2;
    char *f1 = tu_read(save, &s1), *f2 = tu_read(save2, &s2);
    CHECK(f1 && f2 && s1 == s2 && memcmp(f1, f2, s1) == 0, "--init + --save changed the file");
    free(f1);
    free(f2);
    CHECK(contains(r.err, "model 'softmax_small'"), "no summary on stderr without --quiet: %s",
          r.err);
    tu_output_free(&r);

    return fails;
}

/* Usage errors: exit 2, the message and the usage on stderr; and --help. */
static int batch_usage(const char *exe, const char *dir) {
    int fails = 0;
    tu_output r;
    /* usage errors: exit 2, message and usage on stderr */
    struct {
        const char *args[5];
        const char *phrase;
    } usage[] = {
        {{"--bogus"}, "unknown option '--bogus'"},
        {{"--quiet=1"}, "option --quiet takes no value"},
        {{"--steps", "abc"}, "bad value 'abc' for --steps"},
        {{"--steps", "-1"}, "bad value '-1' for --steps"},
        {{"--steps", " -5"}, "bad value ' -5' for --steps"},
        {{"--seed", "0x-5"}, "bad value '0x-5' for --seed"},
        {{"--seed"}, "option --seed needs a value"},
        {{"extra"}, "unexpected argument 'extra'"},
        {{"--data", "cifar"}, "unknown data set 'cifar'"},
        {{"--batch-file", "x", "--data", "fashion-mnist"}, "cannot be combined"},
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        r = trainer(exe, dir, "small", usage[i].args);
        CHECK(r.status == 2, "%s: status %d", usage[i].phrase, r.status);
        CHECK(contains(r.err, usage[i].phrase) && contains(r.err, "usage:"),
              "stderr lacks \"%s\" or the usage: %s", usage[i].phrase, r.err);
        CHECK(r.out[0] == '\0', "usage error wrote to stdout: %s", r.out);
        tu_output_free(&r);
    }
    const char *none[] = {NULL};
    r = trainer(exe, dir, "small", none);
    CHECK(r.status == 2 && contains(r.err, "pass --batch-file"),
          "no data: status %d: %s", r.status, r.err);
    tu_output_free(&r);
    const char *help[] = {"--help", NULL};
    r = trainer(exe, dir, "small", help);
    CHECK(r.status == 0, "--help status %d", r.status);
    static const char *const opts[] = {"--steps", "--epochs", "--seed", "--init", "--save",
                                       "--batch-file", "--data", "--data-dir", "--dump-grads",
                                       "--quiet", "--help"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        CHECK(contains(r.out, opts[i]), "--help does not mention %s", opts[i]);
    tu_output_free(&r);

    return fails;
}

/* Runtime errors: exit 1, a message naming the file. */
static int batch_runtime_errors(const char *exe, const char *dir, const char *bpath) {
    int fails = 0;
    char bad[4096];
    float got[16];
    tu_output r;
    tu_path(bad, sizeof bad, dir, "bad.safetensors");
    /* runtime errors: exit 1, message naming the file */
    const dmrt_tensor_desc xd_shape = {.name = "x", .dtype = DMRT_F32, .rank = 3, .shape = {S, B, D + 1}, .numel = S * B * (D + 1)};
    const dmrt_tensor_desc yd_dtype = {.name = "y", .dtype = DMRT_F32, .rank = 2, .shape = {S, B}, .numel = S * B};
    const dmrt_tensor_desc yd_steps = {.name = "y", .dtype = DMRT_I32, .rank = 2, .shape = {S - 1, B}, .numel = (S - 1) * B};
    const dmrt_tensor_desc yd_name = {.name = "labels", .dtype = DMRT_I32, .rank = 2, .shape = {S, B}, .numel = S * B};
    struct {
        const dmrt_tensor_desc *xd, *yd;
        int bad_label;
        const char *phrase;
    } rt[] = {
        {&xd_shape, NULL, -1, "tensor 'x': shape [3, 8, 5] but model input x: f32[8, 4] needs [steps, 8, 4]"},
        {NULL, &yd_dtype, -1, "tensor 'y': dtype F32 but model input y: i32[8] needs I32"},
        {NULL, &yd_steps, -1, "tensor 'y' has 2 steps but tensor 'x' has 3"},
        {NULL, &yd_name, -1, "no tensor 'y' for model input y: i32[8]"},
        {NULL, NULL, 9, "step 1: label 9 of example 0 is outside [0, 3)"},
    };
    for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) {
        write_batches(bad, rt[i].bad_label, rt[i].xd, rt[i].yd);
        const char *args[] = {"--batch-file", bad, "--quiet", NULL};
        r = trainer(exe, dir, "small", args);
        CHECK(r.status == 1, "%s: status %d", rt[i].phrase, r.status);
        CHECK(contains(r.err, rt[i].phrase), "stderr lacks \"%s\": %s", rt[i].phrase, r.err);
        if (rt[i].bad_label < 0) CHECK(contains(r.err, bad), "stderr does not name %s", bad);
        tu_output_free(&r);
    }
    char nodir[4096];
    tu_path(nodir, sizeof nodir, dir, "nodir/out.safetensors");
    const char *a3[] = {"--batch-file", bpath, "--save", nodir, "--quiet", NULL};
    r = trainer(exe, dir, "small", a3);
    CHECK(r.status == 1 && contains(r.err, nodir), "--save into a missing directory: %d %s",
          r.status, r.err);
    tu_output_free(&r);
    /* --trace records every step's time: a count past memory is refused, not overflowed */
    char trace[4096];
    tu_path(trace, sizeof trace, dir, "trace.json");
    const char *a5[] = {"--batch-file", bpath, "--steps", "2305843009213693953", "--trace", trace, "--quiet", NULL};
    r = trainer(exe, dir, "small", a5);
    CHECK(r.status == 1 && contains(r.err, "--trace: no memory to record the times of 2305843009213693953 steps"),
          "--trace of 2^61 + 1 steps: %d %s", r.status, r.err);
    CHECK(step_losses(r.out, got, 16) == 0, "trained despite a --trace it cannot record");
    tu_output_free(&r);
    const char *a4[] = {"--batch-file", bpath, "--init", nodir, "--quiet", NULL};
    r = trainer(exe, dir, "small", a4);
    CHECK(r.status == 1 && contains(r.err, nodir) && contains(r.err, "cannot open"),
          "--init of a missing file: %d %s", r.status, r.err);
    CHECK(step_losses(r.out, got, 16) == 0, "trained despite a bad --init");
    tu_output_free(&r);
    return fails;
}

static int test_batch(const char *exe, const char *dir) {
    char bpath[4096], save[4096];
    tu_path(bpath, sizeof bpath, dir, "batches.safetensors");
    tu_path(save, sizeof save, dir, "out.safetensors");
    if (write_batches(bpath, -1, NULL, NULL) != 0) return 1;
    /* in this order: batch_limits starts from the parameters batch_run saved */
    int fails = batch_run(exe, dir, bpath, save);
    fails += batch_limits(exe, dir, bpath, save);
    fails += batch_usage(exe, dir);
    fails += batch_runtime_errors(exe, dir, bpath);
    return fails + test_blas_report(exe, dir, bpath);
}

/* ---- fashion-mnist ---------------------------------------------------------------------- */

static double parse_acc(const char *out, const char *prefix) {
    const char *p = strstr(out, prefix);
    /* the final line, not "epoch N test accuracy" */
    while (p && p != out && p[-1] != '\n') p = strstr(p + 1, prefix);
    return p ? strtod(p + strlen(prefix), NULL) : -1.0;
}

static int test_mnist(const char *exe, const char *dir) {
    int fails = 0;
    const char *data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
    if (!tu_exists(data)) {
        fprintf(stderr, "%s missing: skipped\n", data);
        return SKIP;
    }
    const char *args[] = {"--epochs", "1", "--seed", "1", "--quiet", NULL};
    tu_output r = trainer(exe, dir, "mnist", args);
    CHECK(r.status == 0, "status %d: %s", r.status, r.err);
    float got[4];
    int n = step_losses(r.out, got, 4);
    CHECK(n == 600, "%d step lines, want 60000 / 100", n);
    CHECK(got[0] > 2.0f && got[0] < 2.5f, "first loss %g, want about ln 10", (double)got[0]);
    CHECK(contains(r.out, "\nepoch 1 test accuracy 0."), "no epoch line");
    double acc = parse_acc(r.out, "test accuracy ");
    CHECK(acc > 0.75 && acc < 1.0, "test accuracy %g", acc);
    CHECK(contains(r.out, "\ntrained 600 steps in "), "no summary");
    fprintf(stderr, "fashion-mnist softmax regression, 1 epoch: test accuracy %.4f\n", acc);
    tu_output_free(&r);
    return fails;
}

static int write_idx_gz(const char *path, uint32_t magic, uint32_t n, const unsigned char *data) {
    unsigned char hdr[16];
    uint32_t w[4] = {magic, n, 28, 28};
    int nw = magic == 0x803u ? 4 : 2;
    for (int i = 0; i < nw; i++)
        for (int k = 0; k < 4; k++) hdr[4 * i + k] = (unsigned char)(w[i] >> (24 - 8 * k));
    size_t bytes = (size_t)n * (magic == 0x803u ? 784 : 1);
    gzFile gz = gzopen(path, "wb");
    if (!gz) return -1;
    gzwrite(gz, hdr, (unsigned)(4 * nw));
    gzwrite(gz, data, (unsigned)bytes);
    return gzclose(gz) == Z_OK ? 0 : -1;
}

/* A generated data set: 250 training examples (2 steps of 100, 50 dropped) and 150
 * test examples (the second evaluation batch is padded). With --steps 0 the test
 * accuracy is that of the initial parameters, checked against a direct computation. */
static int test_tiny(const char *exe, const char *dir) {
    int fails = 0;
    enum { NTR = 250, NTE = 150 };
    unsigned char *img = malloc((size_t)NTR * 784), lab[NTR];
    dmrt_rng r;
    dmrt_rng_init(&r, 3, 0);
    for (int i = 0; i < NTR * 784; i++) img[i] = (unsigned char)(dmrt_rng_u64(&r) & 255);
    for (int i = 0; i < NTR; i++) lab[i] = (unsigned char)(dmrt_rng_u64(&r) % 10);
    char p[4096];
    write_idx_gz(tu_path(p, sizeof p, dir, "train-images-idx3-ubyte.gz"), 0x803u, NTR, img);
    write_idx_gz(tu_path(p, sizeof p, dir, "train-labels-idx1-ubyte.gz"), 0x801u, NTR, lab);
    write_idx_gz(tu_path(p, sizeof p, dir, "t10k-images-idx3-ubyte.gz"), 0x803u, NTE, img);
    write_idx_gz(tu_path(p, sizeof p, dir, "t10k-labels-idx1-ubyte.gz"), 0x801u, NTE, lab);

    const char *a0[] = {"--data", "fashion-mnist", "--data-dir", dir, "--steps", "0", "--seed",
                        "11", "--quiet", NULL};
    tu_output o = trainer(exe, dir, "mnist", a0);
    CHECK(o.status == 0, "status %d: %s", o.status, o.err);
    double acc = parse_acc(o.out, "test accuracy ");
    /* the same directly: argmax of W x + b with the initial parameters */
    const dmrt_model *m = &softmax_mnist_model;
    char err[256];
    void *ctx = m->create(11, err, sizeof err);
    const float *w = m->param(ctx, 0), *b = m->param(ctx, 1);
    int correct = 0;
    for (int i = 0; i < NTE; i++) {
        int best = 0;
        double bv = -1e30;
        for (int c = 0; c < 10; c++) {
            double s = b[c];
            for (int k = 0; k < 784; k++) s += (double)w[c * 784 + k] * (img[i * 784 + k] / 255.0f);
            if (s > bv) bv = s, best = c;
        }
        correct += best == lab[i];
    }
    m->destroy(ctx);
    double want = correct / (double)NTE;
    /* allow one example of disagreement from rounding near ties */
    CHECK(fabs(acc - want) <= 1.0 / NTE + 1e-4, "test accuracy %g, direct %g", acc, want);
    tu_output_free(&o);

    /* 2 steps per epoch; 5 steps = epochs of 2, 2, 1: two epoch lines, then the final */
    const char *a1[] = {"--data-dir", dir, "--steps", "5", "--quiet", NULL};
    o = trainer(exe, dir, "mnist", a1);
    float got[8];
    CHECK(o.status == 0 && step_losses(o.out, got, 8) == 5, "5 steps: status %d\n%s%s", o.status,
          o.out, o.err);
    CHECK(contains(o.out, "\nepoch 1 test accuracy ") && contains(o.out, "\nepoch 2 test accuracy ") &&
              !contains(o.out, "epoch 3") && parse_acc(o.out, "test accuracy ") >= 0.0,
          "epoch lines:\n%s", o.out);
    tu_output_free(&o);

    /* a broken data set names the file */
    write_idx_gz(tu_path(p, sizeof p, dir, "t10k-labels-idx1-ubyte.gz"), 0x801u, NTE - 1, lab);
    o = trainer(exe, dir, "mnist", a1);
    CHECK(o.status == 1 && contains(o.err, "has 150 images but t10k-labels-idx1-ubyte.gz has 149"),
          "mismatched test set: status %d: %s", o.status, o.err);
    tu_output_free(&o);

    /* an empty test set: refused, not an accuracy of 0 measured on nothing */
    write_idx_gz(tu_path(p, sizeof p, dir, "t10k-images-idx3-ubyte.gz"), 0x803u, 0, img);
    write_idx_gz(tu_path(p, sizeof p, dir, "t10k-labels-idx1-ubyte.gz"), 0x801u, 0, lab);
    o = trainer(exe, dir, "mnist", a1);
    CHECK(o.status == 1 && contains(o.err, "t10k-images-idx3-ubyte.gz: holds no images") &&
              !contains(o.out, "test accuracy"),
          "empty test set: status %d: %s%s", o.status, o.out, o.err);
    tu_output_free(&o);
    free(img);
    return fails;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PATH/softmax_train batch|mnist|tiny\n", argv[0]);
        return 2;
    }
    char dir[4096];
    if (tu_mkdtemp(dir, sizeof dir) != 0) return 1;
    int fails;
    if (strcmp(argv[2], "batch") == 0) fails = test_batch(argv[1], dir);
    else if (strcmp(argv[2], "mnist") == 0) fails = test_mnist(argv[1], dir);
    else fails = test_tiny(argv[1], dir);
    tu_rmdir(dir);
    if (fails == SKIP) return SKIP;
    if (fails) fprintf(stderr, "test_trainer %s: %d failures\n", argv[2], fails);
    return fails != 0;
}
