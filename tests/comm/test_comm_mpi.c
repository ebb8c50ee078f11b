/* test_comm_mpi.c: the MPI backend of dmrt_comm, run under mpirun -np 2 or 4.
 *
 *   mpirun -np N test_comm_mpi collectives   every collective, p2p, meshes, back to back,
 *                                            against the serial computation, bit for bit
 *   mpirun -np N test_comm_mpi abort         rank 1 aborts; the others fail fast with its
 *                                            message and dmrt_mpi_run returns it everywhere
 *   mpirun -np N test_comm_mpi timeout       the last rank is late by more than the 1 s
 *                                            deadline; the others time out naming the call
 *   mpirun -np N test_comm_mpi returns       rank 1 returns 7 without a message
 *   mpirun -np N test_comm_mpi compress      the compressed gradient reductions against
 *                                            their rules computed serially
 *
 * Every process checks its own results and exits 1 on a failure, so mpirun's status is
 * the test's. */
#include "comm_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct test_state {
    const char *mode;
    int rank, size;
    int failures;
} test_state;

#define EXPECT(t, r, cond, ...) ((t)->failures += CASE_EXPECT(r, cond, __VA_ARGS__))
#define EXPECT_HAS(t, r, msg, needle) \
    EXPECT(t, r, case_has((msg), (needle)), "message lacks \"%s\": %s", (needle), (msg))

static int run_collectives(dmrt_rank *r, test_state *t) {
    dmrt_comm *w = dmrt_rank_world(r);
    EXPECT(t, r, strcmp(dmrt_rank_backend(r), "mpi") == 0, "backend %s", dmrt_rank_backend(r));
    t->failures += case_collectives_all_sizes(w, 1);
    t->failures += case_p2p(w, 500);
    t->failures += case_back_to_back(w, 1000);
    t->failures += case_started(w, 40);
    /* A recv of the wrong size names both counts, and the pair stays in order. */
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (t->rank == 0) {
        EXPECT(t, r, dmrt_send(w, 1, buf, 5, "send") == 0, "%s", dmrt_rank_error(r));
        EXPECT(t, r, dmrt_send(w, 1, buf + 5, 2, "send") == 0, "%s", dmrt_rank_error(r));
    } else if (t->rank == 1) {
        EXPECT(t, r, dmrt_recv(w, 0, buf, 4, "recv of h (t.dm:9)") == DMRT_ERR_COMM, "mismatch");
        EXPECT_HAS(t, r, dmrt_rank_error(r), "recv of h (t.dm:9) on axis world: rank 0 sent 5 "
                   "floats, this recv expects 4");
        EXPECT(t, r, dmrt_recv(w, 0, buf, 2, "recv") == 0 && buf[0] == 6 && buf[1] == 7,
               "the next message: %s", dmrt_rank_error(r));
    }
    char err[512];
    const int64_t too_many[] = {3, 2};
    const char *names[] = {"data", "tensor", "pipe"};
    int rc = dmrt_mesh_init(r, 2, names, too_many, err, sizeof err);
    EXPECT(t, r, rc == DMRT_ERR_COMM, "mesh of 6 accepted");
    char want[128];
    snprintf(want, sizeof want, "mesh data=3 x tensor=2 needs 6 ranks, the run has %d", t->size);
    EXPECT_HAS(t, r, err, want);
    if (t->size == 4) {
        const int64_t square[] = {2, 2};
        t->failures += case_mesh(r, 2, names, square);
        const int64_t line[] = {1, 4, 1};
        t->failures += case_mesh(r, 3, names, line);
        t->failures += case_back_to_back(dmrt_mesh_axis(r, 1), 300);
    } else if (t->size == 2) {
        const int64_t pair[] = {2, 1};
        t->failures += case_mesh(r, 2, names, pair);
    }
    t->failures += case_outside(r);
    return t->failures ? 1 : 0;
}

static int run_abort(dmrt_rank *r, test_state *t) {
    dmrt_comm *w = dmrt_rank_world(r);
    dmrt_rank_set_timeout(r, 60);
    dmrt_rank_set_step(r, 7);
    float buf[1000];
    case_fill(buf, 1000, 3, t->rank);
    for (int i = 0; i < 5; i++)
        if (dmrt_allreduce_sum(w, buf, 1000, "warm-up") != 0)
            return EXPECT(t, r, 0, "%s", dmrt_rank_error(r)), 1;
    if (t->rank == 1) {
        case_sleep(0.3);
        dmrt_rank_abort(r, "loss is NaN at step 7");
        EXPECT(t, r, dmrt_barrier(w, NULL) == DMRT_ERR_COMM, "barrier after abort");
        return 42;
    }
    double t0 = case_now();
    int rc = dmrt_allreduce_sum(w, buf, 1000, "allreduce of fc2.weight.grad");
    double took = case_now() - t0;
    EXPECT(t, r, rc == DMRT_ERR_COMM, "allreduce without rank 1 returned %d", rc);
    EXPECT_HAS(t, r, dmrt_rank_error(r), "allreduce of fc2.weight.grad on axis world at step 7: rank 1 failed: loss is NaN at step 7");
    EXPECT(t, r, took < 1.5, "noticed after %.2f s", took);
    printf("rank %d noticed rank 1's abort after %.3f s\n", t->rank, took - 0.3 > 0 ? took - 0.3 : 0);
    t0 = case_now();
    EXPECT(t, r, dmrt_barrier(w, "next barrier") == DMRT_ERR_COMM, "barrier after the abort");
    EXPECT_HAS(t, r, dmrt_rank_error(r), "next barrier on axis world at step 7: rank 1 failed: loss is NaN");
    EXPECT(t, r, case_now() - t0 < 0.1, "later call took %.2f s", case_now() - t0);
    return rc;
}

static int run_timeout(dmrt_rank *r, test_state *t) {
    dmrt_rank_set_timeout(r, 1.0);
    dmrt_rank_set_step(r, 5);
    float g[100];
    case_fill(g, 100, 9, t->rank);
    if (t->rank == t->size - 1) case_sleep(2.5);  /* late by more than the deadline */
    double t0 = case_now();
    int rc = dmrt_allreduce_sum(dmrt_rank_world(r), g, 100, "allreduce of fc1.weight.grad (mlp.dm:21)");
    double took = case_now() - t0;
    EXPECT(t, r, rc == DMRT_ERR_COMM, "allreduce returned %d", rc);
    if (t->rank == t->size - 1) {
        /* By now the others have given up and said so: it fails at once. */
        EXPECT_HAS(t, r, dmrt_rank_error(r), "failed: allreduce of fc1.weight.grad (mlp.dm:21) on axis world at step 5: timed out after 1 s");
        EXPECT(t, r, took < 0.5, "the late rank took %.2f s to fail", took);
    } else {
        EXPECT_HAS(t, r, dmrt_rank_error(r), "allreduce of fc1.weight.grad (mlp.dm:21) on axis world at step 5: ");
        EXPECT_HAS(t, r, dmrt_rank_error(r), "timed out after 1 s");
        EXPECT(t, r, took > 0.9 && took < 2.0, "timed out after %.2f s", took);
    }
    return rc;
}

static int run_returns(dmrt_rank *r, test_state *t) {
    if (t->rank == 1) return 7;
    dmrt_rank_set_timeout(r, 30);
    double t0 = case_now();
    int rc = dmrt_barrier(dmrt_rank_world(r), "barrier of the epoch");
    EXPECT(t, r, rc == DMRT_ERR_COMM, "barrier returned %d", rc);
    EXPECT_HAS(t, r, dmrt_rank_error(r), "barrier of the epoch on axis world: rank 1 failed: its main function returned 7");
    EXPECT(t, r, case_now() - t0 < 1.5, "noticed after %.2f s", case_now() - t0);
    return rc;
}

static int rank_main(dmrt_rank *r, void *arg) {
    test_state *t = arg;
    t->rank = dmrt_rank_id(r);
    t->size = dmrt_rank_count(r);
    if (strcmp(t->mode, "collectives") == 0) return run_collectives(r, t);
    if (strcmp(t->mode, "abort") == 0) return run_abort(r, t);
    if (strcmp(t->mode, "compress") == 0) return (t->failures += case_compressed(dmrt_rank_world(r), 900)) ? 1 : 0;
    if (strcmp(t->mode, "timeout") == 0) return run_timeout(r, t);
    return run_returns(r, t);
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "collectives") && strcmp(argv[1], "abort") &&
                      strcmp(argv[1], "timeout") && strcmp(argv[1], "returns") && strcmp(argv[1], "compress"))) {
        fprintf(stderr, "usage: mpirun -np N %s collectives|abort|timeout|returns|compress\n", argv[0]);
        return 2;
    }
    test_state t = {argv[1], -1, 0, 0};
    char err[2048];
    double t0 = case_now();
    int rc = dmrt_mpi_run(&argc, &argv, rank_main, &t, err, sizeof err);
    double took = case_now() - t0;
    const char *mode = t.mode;
    if (strcmp(mode, "collectives") == 0 || strcmp(mode, "compress") == 0) {
        EXPECT(&t, NULL, rc == 0, "dmrt_mpi_run returned %d: %s", rc, err);
    } else if (strcmp(mode, "abort") == 0) {
        EXPECT(&t, NULL, rc == 42, "dmrt_mpi_run returned %d: %s", rc, err);
        EXPECT_HAS(&t, NULL, err, "rank 1 failed: loss is NaN at step 7 (status 42); also failed: rank");
        EXPECT(&t, NULL, took < 5.0, "the run took %.2f s", took);
    } else if (strcmp(mode, "timeout") == 0) {
        EXPECT(&t, NULL, rc == DMRT_ERR_COMM, "dmrt_mpi_run returned %d: %s", rc, err);
        EXPECT_HAS(&t, NULL, err, "failed: allreduce of fc1.weight.grad (mlp.dm:21) on axis world at step 5: timed out after 1 s");
        /* the ranks' own timings are checked inside; this bound only catches a teardown that
         * hangs, with room for MPI's start-up of 4 processes on a loaded 2-core machine */
        EXPECT(&t, NULL, took < 12.0, "the run took %.2f s", took);
    } else {
        EXPECT(&t, NULL, rc == 7, "dmrt_mpi_run returned %d: %s", rc, err);
        EXPECT_HAS(&t, NULL, err, "rank 1 failed: its main function returned 7 (status 7)");
    }
    printf("rank %d: %s: status %d%s%s (%.2f s)%s\n", t.rank, mode, rc, err[0] ? ": " : "", err,
           took, t.failures ? " FAILED" : "");
    return t.failures ? 1 : 0;
}
