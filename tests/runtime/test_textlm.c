/* test_textlm: runs bytelm_train (dmrt_trainer_main on the fake byte-level language
 * model of bytelm.c) as a subprocess and checks --data text:, the validation loss,
 * --eval-every and sampling against the rules of docs/trainer.md, written out again
 * here: the corpus split, the window draws, the validation windows, the sampler.
 *
 *   test_textlm PATH/bytelm_train */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bytelm.h"
#include "check.h"
#include "dmrt.h"
#include "testutil.h"

enum { B = LM_BATCH, T = LM_LEN, V = LM_VOCAB };
#define WINDOWS_STREAM UINT64_C(0x77696e646f7773) /* "windows" */
#define SAMPLE_STREAM UINT64_C(0x73616d706c65)    /* "sample" */
#define MAX_VAL_WINDOWS 32

static const char *exe; /* bytelm_train */
static char dir[4096];  /* scratch directory of this run */

/* Runs bytelm_train VARIANT CORPUS LOG with the NULL-terminated trainer options. */
static tu_output trainer(const char *variant, const char *corpus, const char *log,
                         const char **args) {
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)exe;
    argv[n++] = (char *)variant;
    argv[n++] = (char *)corpus;
    argv[n++] = (char *)log;
    for (; *args && n < 62; args++) argv[n++] = (char *)*args;
    argv[n] = NULL;
    return tu_run_capture(argv, dir);
}

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* Lines of out starting with prefix (at the start of a line). */
static int count_lines(const char *out, const char *prefix) {
    int n = 0;
    for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
        n += strncmp(l, prefix, strlen(prefix)) == 0;
    return n;
}

/* "step N loss X" lines (not "step N val loss X"), checking that N counts from 1;
 * -1 when it does not. */
static int count_steps(const char *out) {
    int n = 0;
    for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        long long k;
        int used = 0;
        if (sscanf(l, "step %lld%n", &k, &used) != 1 || strncmp(l + used, " loss ", 6) != 0)
            continue;
        if (k != n + 1) return -1;
        n++;
    }
    return n;
}

/* The value after the line prefix "val loss ", or NAN. */
static double final_val_loss(const char *out) {
    for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
        if (strncmp(l, "val loss ", 9) == 0) return strtod(l + 9, NULL);
    return NAN;
}

/* ---- the corpus and the log of the fake model ------------------------------------------ */

/* size bytes: random lowercase letters in the training part and uppercase ones in the
 * validation part, so that a window reaching into the held-out bytes cannot pass the
 * fake model's check. */
static unsigned char *make_corpus(int64_t size, uint64_t seed) {
    unsigned char *c = malloc((size_t)size);
    dmrt_rng r;
    dmrt_rng_init(&r, seed, 0);
    int64_t train = size - lm_val_bytes(size);
    for (int64_t i = 0; i < size; i++)
        c[i] = (unsigned char)((i < train ? 'a' : 'A') + dmrt_rng_u64(&r) % 26);
    return c;
}

/* Writes the corpus whole to all.txt (for the fake model) and in pieces to the named
 * files (sizes[i] bytes each, in order, for the trainer); "text:" + the list into spec. */
static void write_corpus(const unsigned char *c, int64_t size, int n, const char *const *names,
                         const int64_t *sizes, char *spec, size_t speclen) {
    char p[4096];
    tu_write(tu_path(p, sizeof p, dir, "all.txt"), c, (size_t)size);
    snprintf(spec, speclen, "text:");
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        tu_write(tu_path(p, sizeof p, dir, names[i]), c + at, (size_t)sizes[i]);
        at += sizes[i];
        size_t used = strlen(spec);
        snprintf(spec + used, speclen - used, "%s%s", i ? "," : "", p);
    }
}

typedef struct lm_log {
    int n_train, n_forward;
    long long train[4096][B], forward[64][B];
} lm_log;

static void read_log(const char *path, lm_log *log) {
    memset(log, 0, sizeof *log);
    char *text = tu_read(path, NULL);
    const char *l = text ? text : "";
    for (; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        long long o[B];
        if (sscanf(l, "train %lld %lld %lld", &o[0], &o[1], &o[2]) == B && log->n_train < 4096)
            memcpy(log->train[log->n_train++], o, sizeof o);
        else if (sscanf(l, "forward %lld %lld %lld", &o[0], &o[1], &o[2]) == B &&
                 log->n_forward < 64)
            memcpy(log->forward[log->n_forward++], o, sizeof o);
    }
    free(text);
}

/* ---- docs/trainer.md, written out again ------------------------------------------------- */

/* Offsets of the validation rows, batch after batch; returns how many (a multiple of B). */
static int val_rows(int64_t size, int64_t *rows) {
    int64_t val = lm_val_bytes(size), train = size - val;
    int64_t n = (val - 1) / T;
    if (n > MAX_VAL_WINDOWS) n = MAX_VAL_WINDOWS;
    if (n >= B) n -= n % B;
    int64_t stride = n > 1 ? (val - T - 1) / (n - 1) : 0;
    int64_t count = n >= B ? n : B;
    for (int64_t r = 0; r < count; r++) rows[r] = train + (r % n) * stride;
    return (int)count;
}

/* The fake's validation loss: the mean over batches of the mean target of the batch. */
static double expected_val_loss(const unsigned char *c, int64_t size) {
    int64_t rows[MAX_VAL_WINDOWS + B];
    int n = val_rows(size, rows);
    double sum = 0.0;
    for (int b = 0; b < n / B; b++) {
        double batch = 0.0;
        for (int r = 0; r < B; r++)
            for (int t = 0; t < T; t++) batch += c[rows[b * B + r] + t + 1];
        sum += (float)(batch / (B * T));
    }
    return sum / (n / B);
}

static uint64_t draw_below(dmrt_rng *rng, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
    do x = dmrt_rng_u64(rng);
    while (x >= limit);
    return x % n;
}

/* The sample the trainer must print after "sample:\n": the prompt, n bytes, "\n". With
 * the fake's logits only three bytes can follow c (logits 3, 1, 0), so the documented
 * draw reduces to: u = (u64 >> 11) 2^-53, p2 = exp(-2 / temperature), p3 =
 * exp(-3 / temperature) (0 when top-k is 2); the likeliest byte when 1 > u (1 + p2 + p3),
 * else the second when 1 + p2 > u (1 + p2 + p3), else the third. */
static size_t expected_sample(const char *prompt, int n, float temperature, int top_k,
                              uint64_t seed, unsigned char *out) {
    size_t len = strlen(prompt);
    memcpy(out, prompt, len);
    dmrt_rng rng;
    dmrt_rng_init(&rng, seed, SAMPLE_STREAM);
    for (int i = 0; i < n; i++, len++) {
        int c = out[len - 1];
        if (temperature == 0.0f || top_k == 1) {
            out[len] = (unsigned char)lm_likeliest(c);
            continue;
        }
        double second = exp((1.0 - 3.0) / (double)temperature);
        double third = top_k == 2 ? 0.0 : exp((0.0 - 3.0) / (double)temperature);
        double u = (double)(dmrt_rng_u64(&rng) >> 11) * 0x1.0p-53;
        double target = u * (1.0 + second + third);
        out[len] = (unsigned char)(1.0 > target            ? lm_likeliest(c)
                                   : 1.0 + second > target ? lm_second(c)
                                                           : lm_third(c));
    }
    out[len++] = '\n';
    return len;
}

/* The bytes after the line "sample:" (NULL if there is none); their count in *len. */
static const unsigned char *sample_of(const tu_output *r, size_t *len) {
    const char *s = strstr(r->out, "sample:\n");
    if (!s || (s != r->out && s[-1] != '\n')) return NULL;
    s += strlen("sample:\n");
    *len = r->out_size - (size_t)(s - r->out);
    return (const unsigned char *)s;
}

/* ---- tests ------------------------------------------------------------------------------ */

/* Two files, 1000 steps: every row a window of the training part (the fake fails the step
 * otherwise), the offsets those of the documented draws, all valid offsets reached;
 * --eval-every lines, the validation windows and loss; the order of the output. */
static int test_training(void) {
    int fails = 0;
    enum { SIZE = 300 };
    unsigned char *c = make_corpus(SIZE, 1);
    const char *names[] = {"a.txt", "b.txt"};
    const int64_t sizes[] = {100, 200};
    char spec[16384], all[4096], log[4096];
    write_corpus(c, SIZE, 2, names, sizes, spec, sizeof spec);
    tu_path(all, sizeof all, dir, "all.txt");
    tu_path(log, sizeof log, dir, "log.txt");
    const int64_t train = SIZE - lm_val_bytes(SIZE), offsets = train - T;

    const char *a1[] = {"--data", spec, "--steps", "1000", "--eval-every", "250", "--seed", "5",
                        "--quiet", NULL};
    tu_output r = trainer("lm", all, log, a1);
    CHECK(r.status == 0, "status %d: %s", r.status, r.err);
    CHECK(count_steps(r.out) == 1000, "%d step lines", count_steps(r.out));
    CHECK(count_lines(r.out, "step 250 val loss ") == 1 &&
              count_lines(r.out, "step 1000 val loss ") == 1 && count_lines(r.out, "step ") == 1004,
          "--eval-every 250: want val lines after steps 250, 500, 750, 1000");
    double want = expected_val_loss(c, SIZE), got = final_val_loss(r.out);
    CHECK(fabs(got - want) <= 1e-6 * want, "val loss %.9g, want %.9g", got, want);
    const char *val = strstr(r.out, "\nval loss ");
    const char *trained = strstr(r.out, "\ntrained 1000 steps in ");
    CHECK(val && trained && val < trained && !strstr(trained + 1, "\n" "step "),
          "want the step lines, then 'val loss', then 'trained':\n%s", r.out);
    tu_output_free(&r);

    lm_log *lg = malloc(sizeof *lg);
    read_log(log, lg);
    CHECK(lg->n_train == 1000, "%d train_step calls", lg->n_train);
    dmrt_rng rng;
    dmrt_rng_init(&rng, 5, WINDOWS_STREAM);
    char *seen = calloc((size_t)offsets, 1);
    int mismatches = 0, n_seen = 0;
    for (int s = 0; s < lg->n_train; s++)
        for (int row = 0; row < B; row++) {
            long long o = lg->train[s][row], w = (long long)draw_below(&rng, (uint64_t)offsets);
            mismatches += o != w;
            if (o >= 0 && o < offsets) n_seen += !seen[o], seen[o] = 1;
        }
    CHECK(mismatches == 0, "%d window offsets differ from the draws of stream 'windows'",
          mismatches);
    CHECK(n_seen == offsets, "%d of the %lld valid offsets drawn in 3000 windows", n_seen,
          (long long)offsets);
    free(seen);
    /* 4 evaluations of one batch; the final one reuses the value of step 1000 */
    int64_t rows[MAX_VAL_WINDOWS + B];
    CHECK(val_rows(SIZE, rows) == B, "test's own rule: %d rows", val_rows(SIZE, rows));
    CHECK(lg->n_forward == 4, "%d forward calls, want 4", lg->n_forward);
    for (int k = 0; k < lg->n_forward; k++)
        for (int row = 0; row < B; row++)
            CHECK(lg->forward[k][row] == rows[row], "validation row %d at %lld, want %lld", row,
                  lg->forward[k][row], (long long)rows[row]);

    /* one epoch = floor(270 / (3 * 8)) = 11 steps by default, 22 with --epochs 2; the
     * summary on stderr names the files, their bytes and the steps */
    const char *a2[] = {"--data", spec, NULL};
    r = trainer("lm", all, "-", a2);
    CHECK(r.status == 0 && count_steps(r.out) == 11, "default: status %d, %d steps: %s", r.status,
          count_steps(r.out), r.err);
    char note[16384];
    snprintf(note, sizeof note, "a.txt (100 bytes), %s/b.txt (200 bytes): 300 bytes, 270 for "
             "training, 30 for validation (3 windows); batch 3 x 8, 11 steps/epoch, 11 steps", dir);
    CHECK(contains(r.err, note), "stderr lacks \"%s\": %s", note, r.err);
    tu_output_free(&r);
    const char *a3[] = {"--data", spec, "--epochs", "2", "--quiet", NULL};
    r = trainer("lm", all, "-", a3);
    CHECK(r.status == 0 && count_steps(r.out) == 22, "--epochs 2: status %d, %d steps", r.status,
          count_steps(r.out));
    tu_output_free(&r);

    /* the files in the other order make another corpus: windows the fake does not know */
    char swapped[16384];
    snprintf(swapped, sizeof swapped, "text:%s/b.txt,%s/a.txt", dir, dir);
    const char *a4[] = {"--data", swapped, "--steps", "100", "--quiet", NULL};
    r = trainer("lm", all, "-", a4);
    CHECK(r.status == 1 && contains(r.err, "is not a window of the training part"),
          "files swapped: status %d: %s", r.status, r.err);
    tu_output_free(&r);
    free(lg);
    free(c);
    return fails;
}

/* Validation windows of corpora of other sizes: 30 windows in 10 batches; 2 windows
 * cycled through a batch of 3; and the smallest corpus, 2 (T+1) bytes. */
static int test_validation(void) {
    int fails = 0;
    const int64_t corpus_sizes[] = {3000, 200, 2 * (T + 1)};
    const int want_rows[] = {30, B, B};
    for (int i = 0; i < 3; i++) {
        int64_t size = corpus_sizes[i];
        unsigned char *c = make_corpus(size, 2 + (uint64_t)i);
        const char *names[] = {"one.txt"};
        char spec[16384], all[4096], log[4096];
        write_corpus(c, size, 1, names, &size, spec, sizeof spec);
        tu_path(all, sizeof all, dir, "all.txt");
        tu_path(log, sizeof log, dir, "log.txt");
        const char *args[] = {"--data", spec, "--steps", "5", "--quiet", NULL};
        tu_output r = trainer("lm", all, log, args);
        CHECK(r.status == 0, "corpus of %lld: status %d: %s", (long long)size, r.status, r.err);
        double want = expected_val_loss(c, size), got = final_val_loss(r.out);
        CHECK(fabs(got - want) <= 1e-6 * want, "corpus of %lld: val loss %.9g, want %.9g",
              (long long)size, got, want);
        int64_t rows[MAX_VAL_WINDOWS + B];
        int n = val_rows(size, rows);
        CHECK(n == want_rows[i], "test's own rule: %d rows for %lld bytes", n, (long long)size);
        lm_log *lg = malloc(sizeof *lg);
        read_log(log, lg);
        CHECK(lg->n_forward == n / B, "corpus of %lld: %d forward calls, want %d", (long long)size,
              lg->n_forward, n / B);
        for (int k = 0; k < lg->n_forward && k < n / B; k++)
            for (int row = 0; row < B; row++)
                CHECK(lg->forward[k][row] == rows[k * B + row],
                      "corpus of %lld: validation batch %d row %d at %lld, want %lld",
                      (long long)size, k, row, lg->forward[k][row], (long long)rows[k * B + row]);
        if (size == 2 * (T + 1)) /* one valid offset: 0 */
            for (int s = 0; s < lg->n_train; s++)
                CHECK(lg->train[s][0] == 0 && lg->train[s][1] == 0 && lg->train[s][2] == 0,
                      "smallest corpus: a window not at offset 0");
        free(lg);
        tu_output_free(&r);
        free(c);
    }
    return fails;
}

/* Greedy sampling reproduces the chain of likeliest bytes; with temperature and top-k the
 * sample is the documented draw, every byte one of those with probability > 0. */
static int test_sampling(void) {
    int fails = 0;
    enum { N = 400 };
    unsigned char want[N + 64];
    /* longer than T: the window slides from the start */
    const char *long_prompt = "abcdefghijklmnopqrstuvwxyz";
    struct {
        const char *prompt; /* NULL: the default, "\n" */
        const char *temperature, *top_k, *seed;
        int n;
    } cases[] = {
        {"ab", "0", NULL, "1", 40},   {"ab", "0", "7", "2", 40},   {"ab", NULL, "1", "3", 40},
        {long_prompt, "0", NULL, "1", 30}, {NULL, "0", NULL, "1", 20},
        {"q", NULL, NULL, "3", N},    {"q", NULL, NULL, "4", N},   {"q", "0.5", "2", "4", N},
        {"q", "2", "0", "5", N},      {"q", "1", "2", "7", N},     {"xyz", "1", "300", "6", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char n[32];
        snprintf(n, sizeof n, "%d", cases[i].n);
        const char *args[16] = {"--steps", "0", "--sample", n, "--seed", cases[i].seed, "--quiet"};
        int k = 7;
        if (cases[i].prompt) args[k++] = "--prompt", args[k++] = cases[i].prompt;
        if (cases[i].temperature) args[k++] = "--temperature", args[k++] = cases[i].temperature;
        if (cases[i].top_k) args[k++] = "--top-k", args[k++] = cases[i].top_k;
        tu_output r = trainer("lm", "-", "-", args);
        CHECK(r.status == 0, "case %zu: status %d: %s", i, r.status, r.err);
        CHECK(strncmp(r.out, "trained 0 steps in ", 19) == 0, "case %zu: stdout starts %.40s", i,
              r.out);
        float temperature = cases[i].temperature ? strtof(cases[i].temperature, NULL) : 1.0f;
        int top_k = cases[i].top_k ? atoi(cases[i].top_k) : 40;
        uint64_t seed = strtoull(cases[i].seed, NULL, 10);
        size_t want_len = expected_sample(cases[i].prompt ? cases[i].prompt : "\n", cases[i].n,
                                          temperature, top_k, seed, want);
        size_t got_len = 0;
        const unsigned char *got = sample_of(&r, &got_len);
        CHECK(got && got_len == want_len && memcmp(got, want, want_len) == 0,
              "case %zu: the sample differs from the expected %zu bytes (got %zu)", i, want_len,
              got_len);
        /* independently of the draw: each byte may only follow as one of the three, and
         * the third only when top-k keeps it */
        size_t plen = cases[i].prompt ? strlen(cases[i].prompt) : 1;
        int bad = 0, second = 0, third = 0;
        for (size_t j = plen; got && j + 1 < got_len; j++) {
            int prev = got[j - 1], next = got[j];
            bad += next != lm_likeliest(prev) && next != lm_second(prev) && next != lm_third(prev);
            second += next == lm_second(prev);
            third += next == lm_third(prev);
        }
        CHECK(bad == 0, "case %zu: %d bytes of probability 0 sampled", i, bad);
        if (cases[i].n == N && temperature == 1.0f) {
            /* probabilities e^1 / (e^3 + e^1 + 1) = 0.114 and 1 / (e^3 + e^1 + 1) = 0.042:
             * about 46 and 17 of 400 */
            CHECK(second > 15 && second < 90, "case %zu: the second byte %d times in %d", i,
                  second, N);
            if (top_k != 2)
                CHECK(third > 2 && third < 45, "case %zu: the third byte %d times in %d", i,
                      third, N);
        }
        if (temperature == 0.0f || top_k == 1)
            CHECK(second + third == 0, "case %zu: greedy sampling took another byte", i);
        if (top_k == 2) CHECK(third == 0, "case %zu: top-k 2 sampled the third byte", i);
        tu_output_free(&r);
    }
    return fails;
}

/* --init then sampling with no corpus; --steps 0 with a corpus still reports the val loss. */
static int test_init(void) {
    int fails = 0;
    char params[4096];
    tu_path(params, sizeof params, dir, "params.safetensors");
    const char *a1[] = {"--steps", "0", "--sample", "0", "--seed", "42", "--save", params,
                        "--quiet", NULL};
    tu_output r = trainer("lm", "-", "-", a1);
    CHECK(r.status == 0 && tu_exists(params), "save: status %d: %s", r.status, r.err);
    tu_output_free(&r);
    const char *a2[] = {"--init", params, "--steps", "0", "--sample", "3", "--temperature", "0",
                        "--prompt", "x", NULL};
    r = trainer("lm", "-", "-", a2);
    unsigned char want[16];
    size_t want_len = expected_sample("x", 3, 0.0f, 40, 0, want), got_len = 0;
    const unsigned char *got = sample_of(&r, &got_len);
    CHECK(r.status == 0 && got && got_len == want_len && memcmp(got, want, want_len) == 0,
          "--init and sample: status %d: %s", r.status, r.err);
    CHECK(contains(r.err, "no data (sampling only), 0 steps; then a sample of 3 bytes"),
          "summary: %s", r.err);
    tu_output_free(&r);

    unsigned char *c = make_corpus(100, 9);
    const char *names[] = {"c.txt"};
    int64_t size = 100;
    char spec[16384], all[4096];
    write_corpus(c, size, 1, names, &size, spec, sizeof spec);
    tu_path(all, sizeof all, dir, "all.txt");
    const char *a3[] = {"--data", spec, "--steps", "0", "--quiet", NULL};
    r = trainer("lm", all, "-", a3);
    CHECK(r.status == 0 && count_steps(r.out) == 0 &&
              fabs(final_val_loss(r.out) - expected_val_loss(c, size)) < 1e-4,
          "--steps 0 with a corpus: status %d\n%s%s", r.status, r.out, r.err);
    tu_output_free(&r);
    free(c);
    return fails;
}

/* Models the text mode cannot use, bad files and bad options: the documented messages
 * and exit statuses, nothing on stdout. */
static int test_errors(void) {
    int fails = 0;
    unsigned char *c = make_corpus(100, 3);
    const char *names[] = {"ok.txt"};
    int64_t size = 100;
    char spec[16384], ok[4096];
    write_corpus(c, size, 1, names, &size, spec, sizeof spec);
    tu_path(ok, sizeof ok, dir, "ok.txt");
    free(c);
    char empty[4096], short_file[4096], missing[4096], subdir[4096];
    tu_write(tu_path(empty, sizeof empty, dir, "empty.txt"), "", 0);
    /* one byte short of two windows */
    tu_write(tu_path(short_file, sizeof short_file, dir, "short.txt"), "abcdefghijklmnopq",
             2 * (T + 1) - 1);
    tu_path(missing, sizeof missing, dir, "missing.txt");
    mkdir(tu_path(subdir, sizeof subdir, dir, "subdir"), 0755);
    char s_empty[16384], s_short[16384], s_missing[16384], s_dir[16384], s_two[16384];
    snprintf(s_empty, sizeof s_empty, "text:%s,%s", ok, empty);
    snprintf(s_short, sizeof s_short, "text:%s", short_file);
    snprintf(s_missing, sizeof s_missing, "text:%s", missing);
    snprintf(s_dir, sizeof s_dir, "text:%s", subdir);
    snprintf(s_two, sizeof s_two, "text:%s,%s", ok, ok);
    const char *lm_needs = "needs a byte-level language model: inputs tokens: i32[B, T] and "
                           "targets: i32[B, T], and an output logits: f32[B, T, V] with V >= 256";
    struct {
        const char *variant;
        const char *args[10];
        int status;
        const char *phrase, *phrase2;
    } cases[] = {
        /* models: exit 2, naming what the model has */
        {"vocab200", {"--data", spec}, 2, lm_needs, "outputs logits: f32[3, 8, 200] (logits has V = 200, fewer than the 256 byte values)"},
        {"f32tokens", {"--data", spec}, 2, "has inputs tokens: f32[3, 8], targets: i32[3, 8]", "(tokens is not i32[B, T])"},
        {"targets9", {"--data", spec}, 2, "targets: i32[3, 9]", "(targets is not i32 of the shape of tokens)"},
        {"softmax", {"--data", spec}, 2, "model 'softmax_small' has inputs x: f32[8, 4], y: i32[8] and outputs probs: f32[8, 3], logits: f32[8, 3]", "(the inputs must be exactly tokens and targets)"},
        {"softmax", {"--sample", "5", "--steps", "0"}, 2, "--sample needs a byte-level language model", "x: f32[8, 4]"},
        {"vocab200", {"--sample", "5", "--steps", "0"}, 2, "--sample needs", "V = 200"},
        {"lm", {NULL}, 2, "model 'lm' (inputs tokens: i32[3, 8], targets: i32[3, 8]) needs data: pass --data text:FILE[,FILE...]", NULL},
        {"lm", {"--sample", "5"}, 2, "needs data: pass --data text:", NULL},
        /* files: exit 1, naming the file */
        {"lm", {"--data", s_missing}, 1, missing, ": cannot open: No such file or directory"},
        {"lm", {"--data", s_empty}, 1, empty, ": the file is empty"},
        {"lm", {"--data", s_dir}, 1, subdir, ": cannot read: Is a directory"},
        {"lm", {"--data", s_short}, 1, short_file, ": a corpus of 17 bytes is too short for windows of T+1 = 9 bytes"},
        /* options: exit 2 with the usage */
        {"lm", {"--data", "text:"}, 2, "bad value 'text:' for --data: expected text:FILE[,FILE...]", "usage:"},
        {"lm", {"--data", "text:a,,b"}, 2, "bad value 'text:a,,b' for --data", "usage:"},
        {"lm", {"--data", "text:a,"}, 2, "bad value 'text:a,' for --data", "usage:"},
        {"lm", {"--data", "words"}, 2, "unknown data set 'words' for --data (known: fashion-mnist, text:FILE[,FILE...])", "usage:"},
        {"lm", {"--data", s_two, "--data-dir", dir}, 2, "--data-dir is the directory of fashion-mnist", "usage:"},
        {"lm", {"--batch-file", ok, "--data", s_two}, 2, "--batch-file cannot be combined with --data", "usage:"},
        {"lm", {"--eval-every", "5", "--steps", "0", "--sample", "1"}, 2, "--eval-every needs --data text:", "usage:"},
        {"lm", {"--sample", "-1"}, 2, "bad value '-1' for --sample: expected a non-negative integer", "usage:"},
        {"lm", {"--top-k", "-3", "--sample", "1"}, 2, "bad value '-3' for --top-k", "usage:"},
        {"lm", {"--temperature", "-1", "--sample", "1"}, 2, "bad value '-1' for --temperature: expected a non-negative number", "usage:"},
        {"lm", {"--temperature", "nan", "--sample", "1"}, 2, "bad value 'nan' for --temperature", "usage:"},
        {"lm", {"--temperature", " -5", "--sample", "1"}, 2, "bad value ' -5' for --temperature", "usage:"},
        {"lm", {"--temperature", "1e300", "--sample", "1"}, 2, "bad value '1e300' for --temperature", "usage:"},
        {"lm", {"--prompt", "", "--sample", "1"}, 2, "bad value '' for --prompt: expected a non-empty value", "usage:"},
        {"lm", {"--prompt", "hi", "--data", s_two}, 2, "--prompt only applies with --sample N", "usage:"},
        {"lm", {"--temperature", "0", "--data", s_two}, 2, "--temperature only applies with --sample N", "usage:"},
        {"lm", {"--top-k", "5", "--data", s_two}, 2, "--top-k only applies with --sample N", "usage:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_output r = trainer(cases[i].variant, "-", "-", cases[i].args);
        CHECK(r.status == cases[i].status, "case %zu (%s): status %d, want %d: %s", i,
              cases[i].phrase, r.status, cases[i].status, r.err);
        CHECK(contains(r.err, cases[i].phrase) &&
                  (!cases[i].phrase2 || contains(r.err, cases[i].phrase2)),
              "case %zu: stderr lacks \"%s\" / \"%s\":\n%s", i, cases[i].phrase,
              cases[i].phrase2 ? cases[i].phrase2 : "", r.err);
        CHECK(r.out[0] == '\0', "case %zu: an error wrote to stdout: %s", i, r.out);
        tu_output_free(&r);
    }

    const char *help[] = {"--help", NULL};
    tu_output r = trainer("lm", "-", "-", help);
    static const char *const opts[] = {"--data text:FILE[,FILE...]", "--eval-every N",
                                       "--sample N", "--prompt TEXT", "--temperature X",
                                       "--top-k K", "val loss", "sample:"};
    CHECK(r.status == 0, "--help: status %d", r.status);
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        CHECK(contains(r.out, opts[i]), "--help does not mention %s", opts[i]);
    tu_output_free(&r);
    return fails;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/bytelm_train\n", argv[0]);
        return 2;
    }
    exe = argv[1];
    if (tu_mkdtemp(dir, sizeof dir) != 0) return 1;
    int fails = test_training() + test_validation() + test_sampling() + test_init() + test_errors();
    tu_rmdir(dir);
    if (fails) fprintf(stderr, "test_textlm: %d failures\n", fails);
    return fails != 0;
}
