/* calibrate_links.c: dmc calibrate's links (calibrate.c's opening comment says what it
 * measures and why): allreduce and send/recv ping-pong with the libdmrt_comm backend the
 * runs will use, timed on rank 0, and their alpha-beta fits as passes/cost.c prices them. */
#include "calibrate_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"

/* ---- links ----------------------------------------------------------------------------- */

/* One allreduce, or one ping-pong round trip between world ranks 0 and 1 (the others
 * idle until the next barrier). */
static int link_op(dmrt_comm *w, int kind, float *buf, int64_t n) {
    if (kind == LINK_ALLREDUCE) return dmrt_allreduce_sum(w, buf, n, "calibration allreduce");
    int me = dmrt_comm_rank(w);
    if (me == 0)
        return dmrt_send(w, 1, buf, n, "calibration ping") || dmrt_recv(w, 1, buf, n, "calibration pong")
                   ? DMRT_ERR_COMM : 0;
    if (me == 1)
        return dmrt_recv(w, 0, buf, n, "calibration ping") || dmrt_send(w, 0, buf, n, "calibration pong")
                   ? DMRT_ERR_COMM : 0;
    return 0;
}

/* Seconds of one op of n floats on rank 0 in one timed run of *reps ops, made after a
 * warm-up op. *reps == 0: probe for cfg->target first, and set it; rank 0 decides and
 * broadcasts what it measured, so that every rank makes the same calls. */
static int time_link(dmrt_rank *r, int kind, float *buf, int64_t n, const config *cfg, int64_t *reps_io,
                     double *seconds) {
    dmrt_comm *w = dmrt_rank_world(r);
    if (link_op(w, kind, buf, n)) return -1;
    int64_t reps = 1;
    float probe[1];
    for (; *reps_io == 0;) {
        if (dmrt_barrier(w, "calibration probe")) return -1;
        double t0 = dmrt_now();
        for (int64_t i = 0; i < reps; i++)
            if (link_op(w, kind, buf, n)) return -1;
        probe[0] = (float)(dmrt_now() - t0);
        if (dmrt_broadcast(w, 0, probe, 1, "calibration probe time")) return -1;
        if (probe[0] >= cfg->target / 8 || reps >= ((int64_t)1 << 30)) {
            double want = ceil((double)reps * cfg->target / (probe[0] > 0 ? probe[0] : 1e-9f));
            *reps_io = want < 1 ? 1 : (int64_t)want;
        } else {
            reps *= 4;
        }
    }
    reps = *reps_io;
    if (dmrt_barrier(w, "calibration run")) return -1;
    double t0 = dmrt_now();
    for (int64_t i = 0; i < reps; i++)
        if (link_op(w, kind, buf, n)) return -1;
    double t = (dmrt_now() - t0) / (double)reps;
    *seconds = kind == LINK_SENDRECV ? t / 2 : t;
    return 0;
}

int calibrate_links_main(dmrt_rank *r, void *arg) {
    link_run *lr = arg;
    const config *cfg = lr->cfg;
    int me = dmrt_rank_id(r), ranks = dmrt_rank_count(r);
#ifdef DMC_CALIBRATE_MPI
    lr->me = me;    /* one rank per process: this process's own copy */
#endif
    char msg[160];
    if (ranks < 2) {
        snprintf(msg, sizeof msg, "links need at least 2 ranks, the run has %d%s", ranks,
                 strcmp(dmrt_rank_backend(r), "mpi") == 0 ? " (start it with mpirun -np 2)" : "");
        dmrt_rank_abort(r, msg);
        return 1;
    }
    if (cfg->ranks && cfg->ranks != ranks) {
        snprintf(msg, sizeof msg, "--ranks %d, but mpirun started %d", cfg->ranks, ranks);
        dmrt_rank_abort(r, msg);
        return 1;
    }
    int sizes = 0;
    int64_t bytes[LINK_SIZES];
    for (int64_t b = 1024; b <= ((int64_t)16 << 20) && sizes < LINK_SIZES; b *= cfg->quick ? 16 : 4) bytes[sizes++] = b;
    float *buf = calloc((size_t)bytes[sizes - 1] / sizeof(float), sizeof(float));
    if (!buf) {
        dmrt_rank_abort(r, "out of memory for the message buffer");
        return 1;
    }
    /* zeros, so that thousands of allreduces never reach inf; written now, so that its
     * pages are mapped before the clock starts */
    memset(buf, 0, (size_t)bytes[sizes - 1]);
    link_table ar = {0}, sr = {0};
    int64_t ar_reps[LINK_SIZES] = {0}, sr_reps[LINK_SIZES] = {0};
    int status = 0;
    for (int i = 0; i < sizes; i++) {
        ar.bytes[i] = sr.bytes[i] = (double)bytes[i];
        ar.seconds[i] = sr.seconds[i] = INFINITY;
    }
    for (int pass = 0; pass < cfg->runs && status == 0; pass++)
        for (int i = 0; i < sizes && status == 0; i++) {
            int64_t n = bytes[i] / (int64_t)sizeof(float);
            double t_ar = INFINITY, t_sr = INFINITY;
            if (time_link(r, LINK_ALLREDUCE, buf, n, cfg, &ar_reps[i], &t_ar) ||
                time_link(r, LINK_SENDRECV, buf, n, cfg, &sr_reps[i], &t_sr))
                status = 1;
            ar.seconds[i] = fmin(ar.seconds[i], t_ar);
            sr.seconds[i] = fmin(sr.seconds[i], t_sr);
        }
    /* after a failed call the MPI backend may still write buf (docs/comm.md): it stays */
    if (status == 0) free(buf);
    if (status == 0 && me == 0) {
        ar.n = sr.n = sizes;
        lr->allreduce = ar;
        lr->sendrecv = sr;
        lr->ranks = ranks;
        lr->measured = 1;
    }
    return status;
}

/* ---- fits ------------------------------------------------------------------------------ */

/* t = alpha * messages + beta * bytes_sent by least squares on relative errors (every
 * row divided by its t: the microsecond messages count as much as the millisecond ones,
 * as a plan's small and large collectives both matter). A negative alpha (noise on a
 * machine whose latency is near 0) is refitted with alpha = 0. Returns -1 when the times
 * do not grow with the bytes (no bandwidth can describe them). */
int calibrate_fit_alpha_beta(const double *messages, const double *sent, const double *t, int n, alpha_beta *fit) {
    double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
    for (int i = 0; i < n; i++) {
        double u = messages[i] / t[i], v = sent[i] / t[i];
        suu += u * u, suv += u * v, svv += v * v, su += u, sv += v;
    }
    double det = suu * svv - suv * suv;
    double alpha = det != 0 ? (su * svv - sv * suv) / det : -1;
    double beta = det != 0 ? (suu * sv - suv * su) / det : 0;
    if (alpha < 0) {
        alpha = 0;
        beta = svv > 0 ? sv / svv : 0;
    }
    if (!(beta > 0)) return -1;
    fit->latency = alpha;
    fit->bandwidth = 1 / beta;
    fit->max_relative_error = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(alpha * messages[i] + beta * sent[i] - t[i]) / t[i];
        if (e > fit->max_relative_error) fit->max_relative_error = e;
    }
    return 0;
}

/* The cost model's terms for a table: a ring allreduce over n ranks of S bytes sends
 * 2 (n - 1) messages and 2 (n - 1) / n S bytes; a send is 1 message of S bytes. */
void calibrate_link_terms(const link_table *t, int kind, int ranks, double *messages, double *sent) {
    double n = ranks;
    for (int i = 0; i < t->n; i++) {
        messages[i] = kind == LINK_ALLREDUCE ? 2 * (n - 1) : 1;
        sent[i] = kind == LINK_ALLREDUCE ? 2 * (n - 1) / n * t->bytes[i] : t->bytes[i];
    }
}

/* The largest relative error of fit f's prediction of table t. */
double calibrate_link_error(const alpha_beta *f, const link_table *t, int kind, int ranks) {
    double messages[LINK_SIZES], sent[LINK_SIZES], worst = 0;
    calibrate_link_terms(t, kind, ranks, messages, sent);
    for (int i = 0; i < t->n; i++) {
        double e = fabs(f->latency * messages[i] + sent[i] / f->bandwidth - t->seconds[i]) / t->seconds[i];
        if (e > worst) worst = e;
    }
    return worst;
}

json_t *calibrate_link_json(const link_table *t) {
    json_t *a = json_array();
    for (int i = 0; i < t->n; i++)
        json_array_append_new(a, json_pack("{sI, sf}", "bytes", (json_int_t)t->bytes[i], "seconds", t->seconds[i]));
    return a;
}

json_t *calibrate_fit_json(const alpha_beta *f, double error_on_other) {
    return json_pack("{sf, sf, sf, sf}", "latency", f->latency, "bandwidth", f->bandwidth, "max_relative_error",
                     f->max_relative_error, "max_relative_error_on_the_other", error_on_other);
}
