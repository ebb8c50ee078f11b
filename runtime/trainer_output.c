/* trainer_output.c: what the trainer shows besides its step lines: the progress bar, the
 * start-up summary, --memory's report and --sample's text (trainer_output.h). */
#include "trainer_output.h"

#include <string.h>
#include <sys/resource.h>

/* The stream for sampling, beside the data's (trainer_data.h): each has its own, so that
 * sampling after N steps does not depend on how many windows were drawn. */
#define TR_SAMPLE_STREAM UINT64_C(0x73616d706c65)    /* "sample" */
/* ---- sampling ------------------------------------------------------------------------------- */

/* Generates o->sample bytes after the prompt; writes "sample:\n", the prompt, the bytes
 * and "\n" to stdout. Only the descriptor is used: the context (the last min(length, T)
 * bytes) sits in row 0 of tokens, every other row and the targets are zeros, and the
 * next byte is drawn from the logits of row 0 at the context's last position, over the
 * byte ids 0..255 only. One forward of the whole batch per byte: simple, not fast. */
int dmrt_trainer_sample_text(FILE *outs, const dmrt_model *m, void *ctx, void **in, const tr_lm *lm, const tr_opts *o,
                             char *err, size_t errlen) {
    const char *prompt = o->prompt ? o->prompt : "\n";
    float temperature = o->temperature >= 0.0 ? (float)o->temperature : 1.0f;
    int top_k = o->top_k < 0                 ? 40
                : o->top_k > TR_BYTE_TOKENS ? TR_BYTE_TOKENS
                                             : (int)o->top_k;
    int64_t T = lm->len;
    memset(in[lm->tokens], 0, dmrt_trainer_desc_bytes(&m->inputs[lm->tokens]));
    memset(in[lm->targets], 0, dmrt_trainer_desc_bytes(&m->inputs[lm->targets]));
    int32_t *context = in[lm->tokens]; /* row 0 */
    int64_t len = 0;                   /* bytes of context in row 0 */
    size_t prompt_len = strlen(prompt);
    for (size_t i = prompt_len > (size_t)T ? prompt_len - (size_t)T : 0; i < prompt_len; i++)
        context[len++] = (unsigned char)prompt[i];
    dmrt_rng rng;
    dmrt_rng_init(&rng, o->seed, TR_SAMPLE_STREAM);

    fputs("sample:\n", outs);
    fwrite(prompt, 1, prompt_len, outs);
    fflush(outs);
    for (int64_t i = 1; i <= o->sample; i++) {
        float loss = 0.0f;
        if (m->forward(ctx, (const void *const *)in, &loss) != 0)
            return dmrt_errorf(err, errlen, "sampling byte %lld: %s", (long long)i,
                               dmrt_trainer_ctx_error(m, ctx));
        const float *logits = m->output(ctx, lm->logits);
        if (!logits)
            return dmrt_errorf(err, errlen, "sampling: model output %d (logits) is NULL",
                               lm->logits);
        int next = 0;
        int rc = dmrt_sample_logits(logits + (len - 1) * lm->vocab, TR_BYTE_TOKENS, temperature,
                                    top_k, &rng, &next);
        if (rc == DMRT_ERR_NOMEM) return dmrt_errorf(err, errlen, "out of memory");
        if (rc != DMRT_OK)
            return dmrt_errorf(err, errlen,
                               "sampling byte %lld: the logits of bytes 0..255 at position %lld "
                               "hold NaN or +inf, or are all -inf",
                               (long long)i, (long long)(len - 1));
        if (len == T) { /* full: slide the window by one byte */
            memmove(context, context + 1, (size_t)(T - 1) * sizeof *context);
            len--;
        }
        context[len++] = next;
        fputc(next, outs);
        fflush(outs); /* show the text as it comes */
    }
    fputc('\n', outs);
    return 0;
}

/* ---- progress bar ---------------------------------------------------------------------------- */

void dmrt_trainer_bar_clear(tr_bar *b) {
    if (b->shown) fputs("\r\033[K", stderr);
    b->shown = 0;
}

void dmrt_trainer_bar_draw(tr_bar *b, int64_t i, int64_t n, int64_t epoch, float loss, int force) {
    enum { W = 30 };
    if (!b->on) return;
    double now = dmrt_now();
    if (!force && b->shown && now - b->last < 0.1) return;
    char bar[W + 1];
    int fill = n > 0 ? (int)(i * W / n) : W;
    for (int k = 0; k < W; k++) bar[k] = k < fill ? '#' : '.';
    bar[W] = '\0';
    fprintf(stderr, "\r[%s] %lld/%lld epoch %lld loss %.4g\033[K", bar, (long long)i,
            (long long)n, (long long)epoch, (double)loss);
    fflush(stderr);
    b->shown = 1;
    b->last = now;
}

/* End of an epoch: keep the finished bar on its own line when the step lines go
 * elsewhere, else clear it. */
void dmrt_trainer_bar_end(tr_bar *b) {
    if (!b->shown) return;
    if (b->stdout_tty) dmrt_trainer_bar_clear(b);
    else fputs("\n", stderr);
    b->shown = 0;
}

/* The one-line summary of model and data on stderr at the start. */
void dmrt_trainer_print_summary(FILE *errs, const dmrt_model *m, const tr_opts *o, const tr_data *d, const char *prog,
                                int64_t total, int threads) {
    int64_t np = 0;
    for (int i = 0; i < m->n_params; i++) np += m->params[i].numel;
    fprintf(errs, "%s: model '%s', %lld parameters; ", prog, m->name, (long long)np);
    if (d->mnist) {
        fprintf(errs,
                "fashion-mnist (%lld train, %lld test), batch %lld, %lld steps/epoch, %lld steps",
                (long long)d->train_x.n, (long long)d->test_x.n, (long long)d->batch,
                (long long)d->steps_per_epoch, (long long)total);
    } else if (d->text) {
        fputs("text ", errs);
        for (int i = 0; i < d->n_text_paths; i++)
            fprintf(errs, "%s%s (%lld bytes)", i ? ", " : "", d->text_paths[i],
                    (long long)d->corpus.file_sizes[i]);
        fprintf(errs,
                ": %lld bytes, %lld for training, %lld for validation (%lld windows); batch "
                "%lld x %lld, %lld steps/epoch, %lld steps",
                (long long)d->corpus.size, (long long)d->train_bytes, (long long)d->val_bytes,
                (long long)d->val_windows, (long long)d->lm.batch, (long long)d->lm.len,
                (long long)d->steps_per_epoch, (long long)total);
    } else if (o->batch_file) {
        fprintf(errs, "%s (%lld steps), %lld steps", o->batch_file,
                (long long)d->steps_per_epoch, (long long)total);
    } else {
        fputs("no data (sampling only), 0 steps", errs);
    }
    if (o->sample >= 0) fprintf(errs, "; then a sample of %lld bytes", (long long)o->sample);
    fprintf(errs, "; %d thread%s per rank", threads, threads == 1 ? "" : "s");
    if (m->product_dtype && strcmp(m->product_dtype, "bf16") == 0)
        fprintf(errs, "; bf16 products: %s", dmrt_gemm_bf16_path());
    fputc('\n', errs);
}

/* --memory: one line per rank on stderr (written whole, so that threads do not mix them),
 * and the process's peak resident set from the lead rank. */
void dmrt_trainer_report_memory(const dmrt_model *m, void *ctx, dmrt_rank *rank, int lead) {
    char line[160];
    if (m->memory_peak)
        snprintf(line, sizeof line, "memory rank %d: model peak %zu bytes\n", rank ? dmrt_rank_id(rank) : 0,
                 m->memory_peak(ctx));
    else
        snprintf(line, sizeof line, "memory rank %d: model peak unknown\n", rank ? dmrt_rank_id(rank) : 0);
    fputs(line, stderr);
    struct rusage ru;
    if (lead && getrusage(RUSAGE_SELF, &ru) == 0)
        fprintf(stderr, "memory: process peak RSS %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    fflush(stderr);
}
