/* trainer_guards.c: what stops the trainer cleanly (docs/trainer.md, "Stopping").
 *
 * - Files it will write are tried before the first step: an unwritable --save path
 *   must not cost a training run.
 * - A non-finite loss or gradient ends training at the step it appears in, naming the
 *   first tensor that holds one, before anything is saved over a good file.
 * - SIGINT and SIGTERM ask it to stop at the next step boundary; a second one of either
 *   ends it at once (the handler is installed for one delivery).
 * On a mesh every rank must stop at the same step, whatever it saw: the trainer's
 * ranks agree on both at each step boundary (dmrt_trainer_guard_agree), one allreduce of two
 * floats over the world. */
#include "trainer_guards.h"

#include "dmrt_comm.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;
/* Ranks inside their step loops: only there is a stop at the next step boundary; before it
 * (loading, a blocked open) and after it (sampling, the final evaluation) nothing would
 * look at the request, so a signal then takes its default action at once. */
static atomic_int stepping;

static void on_stop_signal(int sig) {
    if (atomic_load(&stepping) > 0) {
        stop_signal = sig;
        return;
    }
    signal(sig, SIG_DFL); /* both async-signal-safe */
    raise(sig);
}

void dmrt_trainer_guard_stepping(int entering) { atomic_fetch_add(&stepping, entering ? 1 : -1); }

void dmrt_trainer_guard_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART | SA_RESETHAND; /* a second signal takes its default action */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int dmrt_trainer_guard_stop_signal(void) { return stop_signal; }

int dmrt_trainer_guard_writable(const char *option, const char *path, char *err, size_t errlen) {
    /* a directory takes the temporary file beside it, and fails only at the rename */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return dmrt_errorf(err, errlen, "%s %s: cannot write there: it is a directory (give a file's path)", option, path);
    /* what the atomic writers do (a temporary file of its own beside PATH, then a rename
     * over PATH), tried: the name is this call's own, so ranks of one process may try the
     * same path at once */
    /* a link is written through (its target replaced); a device or FIFO is refused: the
     * rename would replace it */
    char target[4096], why[256];
    const char *to = dmrt_atomic_target(path, target, sizeof target, why, sizeof why);
    if (!to) return dmrt_errorf(err, errlen, "%s %s: cannot write there: %s", option, path, why);
    path = to;
    size_t len = strlen(path) + 32;
    char *tmp = malloc(len);
    if (!tmp) return dmrt_errorf(err, errlen, "out of memory");
    FILE *f = dmrt_temporary_beside(path, tmp, len);
    int saved = errno;
    if (f) {
        fclose(f);
        unlink(tmp);
    }
    free(tmp);
    if (!f) return dmrt_errorf(err, errlen, "%s %s: cannot write there: %s", option, path, strerror(saved));
    return 0;
}

/* The first f32 input of the batch holding a non-finite value: its index, or -1. */
static int non_finite_input(const dmrt_model *m, const void *const *inputs, int64_t *at) {
    for (int i = 0; i < m->n_inputs; i++)
        if (m->inputs[i].dtype == DMRT_F32 && (*at = dmrt_first_non_finite(inputs[i], m->inputs[i].numel)) >= 0) return i;
    return -1;
}

/* The first parameter whose gradient holds a non-finite value: its index, or -1 (-2 on a
 * failed gather, the message in err). A model whose gradients are not host memory of
 * this rank in whole (a mesh, the CUDA target) gathers each whole: every rank calls it. */
static int non_finite_gradient(const dmrt_model *m, void *ctx, char *err, size_t errlen) {
    float *whole = NULL;
    int found = -1;
    for (int i = 0; i < m->n_params && found == -1; i++) {
        const float *g;
        if (m->gather) {
            float *grown = realloc(whole, (size_t)m->params[i].numel * sizeof(float));
            if (!grown) {
                found = -2;
                dmrt_errorf(err, errlen, "out of memory");
                break;
            }
            whole = grown;
            if (m->gather(ctx, i, 1, whole) != DMRT_OK) {
                found = -2;
                dmrt_errorf(err, errlen, "gathering the gradient of '%s' failed: %s", m->params[i].name, m->error(ctx));
                break;
            }
            g = whole;
        } else {
            g = m->grad(ctx, i);
        }
        if (g && dmrt_first_non_finite(g, m->params[i].numel) >= 0) found = i;
    }
    free(whole);
    return found;
}

/* The ranks that take steps: with parameter servers the workers, the data axis (their mesh
 * has no other); else the world. */
static dmrt_comm *training_ranks(const dmrt_model *m, dmrt_rank *rank) {
    dmrt_comm *training = m->param_servers ? dmrt_mesh_axis(rank, dmrt_mesh_find_axis(rank, "data")) : NULL;
    return training ? training : dmrt_rank_world(rank);
}

int dmrt_trainer_guard_same_start(const dmrt_model *m, dmrt_rank *rank, const char *resume, int64_t step, char *err,
                                  size_t errlen) {
    if (!rank) return 0;
    dmrt_comm *training = training_ranks(m, rank);
    int n = dmrt_comm_size(training), me = dmrt_comm_rank(training);
    /* the step in two 24-bit halves: each exact in a float */
    float mine[2] = {(float)(step >> 24), (float)(step & 0xffffff)}, *all = malloc((size_t)n * 2 * sizeof(float));
    if (!all) return dmrt_errorf(err, errlen, "out of memory");
    if (dmrt_allgather(training, mine, all, 2, "the steps --resume continues from") != 0) {
        free(all);
        return dmrt_errorf(err, errlen, "agreeing on the step --resume continues from: %s", dmrt_rank_error(rank));
    }
    int other = -1;
    for (int k = 0; k < n && other < 0; k++)
        if (all[2 * k] != mine[0] || all[2 * k + 1] != mine[1]) other = k;
    int64_t theirs = other < 0 ? step : ((int64_t)all[2 * other] << 24) + (int64_t)all[2 * other + 1];
    free(all);
    if (other < 0) return 0;
    return dmrt_errorf(err, errlen,
                       "--resume %s: this rank (%d) continues from step %lld, rank %d from step %lld: every rank must "
                       "resume from the same checkpoint (on several hosts, give each the same file, or a DIR whose "
                       "newest checkpoint is the same step everywhere)",
                       resume, me, (long long)step, other, (long long)theirs);
}

int dmrt_trainer_guard_agree(const dmrt_model *m, dmrt_rank *rank, float loss, int *stop, int *non_finite, char *err,
                             size_t errlen) {
    float flags[2] = {(float)(stop_signal != 0), (float)!isfinite(loss)};
    dmrt_comm *training = rank ? training_ranks(m, rank) : NULL;
    if (rank && dmrt_allreduce_sum(training, flags, 2, "trainer stop and finiteness") != 0)
        return dmrt_errorf(err, errlen, "agreeing on whether to stop: %s", dmrt_rank_error(rank));
    *stop = flags[0] > 0;
    *non_finite = flags[1] > 0;
    return 0;
}

/* A float as a message shows it: nan without the sign %g gives some (-nan). */
static const char *float_text(float x, char *buf, size_t len) {
    if (isnan(x)) snprintf(buf, len, "nan");
    else snprintf(buf, len, "%g", (double)x);
    return buf;
}

int dmrt_trainer_guard_explain_non_finite(const dmrt_model *m, void *ctx, const void *const *inputs, int64_t step,
                                float loss, int loss_non_finite, char *err, size_t errlen) {
    int64_t at = -1;
    int in = non_finite_input(m, inputs, &at);
    const char *what = loss_non_finite ? "the loss is not finite" : "a gradient is not finite";
    char value[32];
    float_text(loss, value, sizeof value);
    if (in >= 0) {
        int64_t row_len = m->inputs[in].rank > 0 && m->inputs[in].shape[0] > 0
                              ? m->inputs[in].numel / m->inputs[in].shape[0] : 1;
        return dmrt_errorf(err, errlen, "step %lld: %s (%s): the batch's input '%s' holds a non-finite value (row %lld); "
                           "nothing was saved", (long long)step, what, value, m->inputs[in].name,
                           (long long)(at / row_len));
    }
    char why[512] = "";
    int p = non_finite_gradient(m, ctx, why, sizeof why);
    if (p == -2) return dmrt_errorf(err, errlen, "step %lld: %s (%s), and %s", (long long)step, what, value, why);
    if (p >= 0)
        return dmrt_errorf(err, errlen, "step %lld: %s (%s): the first parameter whose gradient holds a non-finite "
                           "value is '%s'; nothing was saved", (long long)step, what, value, m->params[p].name);
    return dmrt_errorf(err, errlen, "step %lld: %s (%s), with finite inputs and gradients; nothing was saved",
                       (long long)step, what, value);
}

int dmrt_trainer_guard_serial_gradients_finite(const dmrt_model *m, void *ctx) {
    if (m->gather) return 1; /* gathering every gradient every step: not worth its cost */
    char unused[8];
    return non_finite_gradient(m, ctx, unused, sizeof unused) < 0;
}
