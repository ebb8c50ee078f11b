/* calibrate_internal.h: what calibrate.c (dmc calibrate's program: the cores, the
 * description, main) and calibrate_links.c (the links and their alpha-beta fits) share. */
#ifndef DMC_CALIBRATE_INTERNAL_H
#define DMC_CALIBRATE_INTERNAL_H

#include <jansson.h>
#include <stdint.h>

#include "dmrt_comm.h"

typedef struct config {
    const char *out;    /* -o FILE, or NULL: standard output */
    int ranks;          /* ranks of the link measurements; 0: not given (2, or mpirun's) */
    int quick;
    double target;      /* seconds one timed run lasts at least */
    int runs;           /* timed runs per measurement; the best is kept */
} config;

#define LINK_SIZES 8    /* 1 KiB .. 16 MiB, powers of 4 */

typedef struct link_table {
    int n;
    double bytes[LINK_SIZES];
    double seconds[LINK_SIZES];
} link_table;

typedef struct link_run {
    const config *cfg;
    int ranks;              /* the world size the links were measured with */
    int me;                 /* world rank of this process (MPI) */
    int measured;           /* rank 0 filled the tables */
    link_table allreduce;   /* one allreduce of S bytes over every rank */
    link_table sendrecv;    /* one message of S bytes: half a ping-pong round trip */
} link_run;

enum { LINK_ALLREDUCE, LINK_SENDRECV };

typedef struct alpha_beta {
    double latency, bandwidth;      /* alpha, 1 / beta */
    double max_relative_error;      /* of the fit on its own table */
} alpha_beta;

/* The links' run on every rank (dmrt_threads_run / dmrt_mpi_run's main, arg a link_run):
 * allreduce and ping-pong from 1 KiB to 16 MiB, the best of cfg->runs passes; world rank 0
 * fills the tables. */
int calibrate_links_main(dmrt_rank *r, void *arg);

/* A table's alpha-beta fit (0; -1 when the times do not grow with the bytes), the cost
 * model's message and byte counts for it, and a fit's largest relative error on a table. */
int calibrate_fit_alpha_beta(const double *messages, const double *sent, const double *t, int n, alpha_beta *fit);
void calibrate_link_terms(const link_table *t, int kind, int ranks, double *messages, double *sent);
double calibrate_link_error(const alpha_beta *f, const link_table *t, int kind, int ranks);

/* The description's "links" parts: a table's rows, and a fit with its error on the other table. */
json_t *calibrate_link_json(const link_table *t);
json_t *calibrate_fit_json(const alpha_beta *f, double error_on_other);

#endif
