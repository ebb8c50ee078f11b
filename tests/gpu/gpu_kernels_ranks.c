/* gpu_kernels_ranks.c: the gpu-kernels test on thread ranks: the staged collectives and
 * the vocabulary-parallel cross-entropy on 2 ranks sharing device 0, and NCCL at one rank. */
#include <math.h>
#include <string.h>

#include "dmrt_comm.h"
#include "gpu_kernels_test.h"

/* ---- two thread ranks, staged ------------------------------------------------------------------- */

/* Rank r's i-th input value of a collective: multiples of 1/64, so no sum rounds. */
static float gen(int rank, int64_t i, int salt) {
    return (float)((i * 37 + rank * 101 + salt * 7) % 1000) / 64.0f - 7.0f;
}

/* What every rank of the split cross-entropy needs: whole logits and the answers. */
typedef struct split_data {
    int64_t rows, classes;   /* classes per rank; 2 ranks */
    float *logits;           /* (rows, 2 * classes) */
    int32_t *targets;        /* (rows) */
    float want_loss;
    float *want_grad;        /* (rows, 2 * classes) */
} split_data;

static int rank_fails(dmrt_rank *r, int fails, const char *what) {
    if (fails) printf("FAIL: rank %d: %d failed checks in %s\n", dmrt_rank_id(r), fails, what);
    return fails;
}

static int staged_collectives(dmrt_gpu *g, dmrt_rank *r) {
    dmrt_comm *w = dmrt_rank_world(r);
    const int me = dmrt_rank_id(r);
    const int before = atomic_load(&test_failures);
    const int64_t n = 1000, total = 2 * n;
    float *h = host_floats(2 * total), *got = host_floats(2 * total), *want = host_floats(2 * total);
    float *d = device_floats(g, 2 * total), *d2 = device_floats(g, 2 * total);
    char what[96];

    for (int started = 0; started < 2; started++) {
        for (int64_t i = 0; i < n; i++) h[i] = gen(me, i, 1);
        for (int64_t i = 0; i < n; i++) want[i] = gen(0, i, 1) + gen(1, i, 1);
        GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        if (started) {
            GPU_OK(g, dmrt_gpu_allreduce_start(g, w, d, n, "started allreduce"));
            GPU_OK(g, dmrt_gpu_comm_wait(g, w));
        } else {
            GPU_OK(g, dmrt_gpu_allreduce_sum(g, w, d, n, "allreduce"));
        }
        from_device(g, got, d, (size_t)n * sizeof(float));
        snprintf(what, sizeof what, "rank %d: staged %sallreduce", me, started ? "started " : "");
        compare_bits(what, got, want, n);
    }
    GPU_OK(g, dmrt_gpu_allreduce_sum(g, w, d, 0, "empty allreduce"));

    /* allgather, out of place and in place */
    for (int in_place = 0; in_place < 2; in_place++) {
        for (int64_t i = 0; i < n; i++) h[i] = gen(me, i, 2);
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < n; i++) want[k * n + i] = gen(k, i, 2);
        float *send = in_place ? d2 + me * n : d;
        GPU_OK(g, dmrt_gpu_copy(g, send, h, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        GPU_OK(g, dmrt_gpu_allgather(g, w, send, d2, n, "allgather"));
        from_device(g, got, d2, (size_t)total * sizeof(float));
        snprintf(what, sizeof what, "rank %d: staged allgather%s", me, in_place ? " in place" : "");
        compare_bits(what, got, want, total);
    }

    for (int64_t i = 0; i < total; i++) h[i] = gen(me, i, 3);
    for (int64_t i = 0; i < n; i++) want[i] = gen(0, me * n + i, 3) + gen(1, me * n + i, 3);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)total * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_reduce_scatter_sum(g, w, d, d2, n, "reduce-scatter"));
    from_device(g, got, d2, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "rank %d: staged reduce-scatter", me);
    compare_bits(what, got, want, n);

    /* block k of rank me's recv = block me of rank k's send */
    for (int64_t i = 0; i < total; i++) h[i] = gen(me, i, 4);
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < n; i++) want[k * n + i] = gen(k, me * n + i, 4);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)total * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_alltoall(g, w, d, d2, n, "all-to-all"));
    from_device(g, got, d2, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "rank %d: staged all-to-all", me);
    compare_bits(what, got, want, total);

    /* both send first (dmrt_send is buffered), different sizes each way */
    const int peer = 1 - me;
    const int64_t out_n = me == 0 ? 500 : 300, in_n = me == 0 ? 300 : 500;
    for (int64_t i = 0; i < out_n; i++) h[i] = gen(me, i, 5);
    for (int64_t i = 0; i < in_n; i++) want[i] = gen(peer, i, 5);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)out_n * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_send(g, w, peer, d, out_n, "send"));
    GPU_OK(g, dmrt_gpu_recv(g, w, peer, d2, in_n, "recv"));
    from_device(g, got, d2, (size_t)in_n * sizeof(float));
    snprintf(what, sizeof what, "rank %d: staged send/recv", me);
    compare_bits(what, got, want, in_n);

    dmrt_gpu_free(g, d);
    dmrt_gpu_free(g, d2);
    free(h);
    free(got);
    free(want);
    return atomic_load(&test_failures) - before;
}

/* Rank me holds classes [me * classes, (me + 1) * classes) of every row. */
static int split_xent(dmrt_gpu *g, dmrt_rank *r, const split_data *s) {
    dmrt_comm *w = dmrt_rank_world(r);
    const int me = dmrt_rank_id(r);
    const int before = atomic_load(&test_failures);
    const int64_t rows = s->rows, classes = s->classes, all = 2 * classes;
    float *mine = host_floats(rows * classes), *want = host_floats(rows * classes);
    float *got = host_floats(rows * classes);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < classes; c++) {
            mine[i * classes + c] = s->logits[i * all + me * classes + c];
            want[i * classes + c] = s->want_grad[i * all + me * classes + c];
        }
    float *dl = to_device(g, mine, (size_t)(rows * classes) * sizeof(float));
    int32_t *dt = to_device(g, s->targets, (size_t)rows * sizeof(int32_t));
    float *dout = device_floats(g, rows * classes), *dloss = device_floats(g, 1);
    float *dstats = device_floats(g, rows * 3);
    float *scratch = device_floats(g, dmrt_gpu_xent_scratch(rows, 2));
    char what[96];

    float loss = 0;
    GPU_OK(g, dmrt_gpu_xent_stats_split(g, w, me, 2, dl, dt, dstats, rows, classes, scratch, 9, 0,
                                        "logits (test)"));
    GPU_OK(g, dmrt_gpu_cross_entropy(g, dstats, dloss, rows, rows));
    from_device(g, &loss, dloss, sizeof loss);
    snprintf(what, sizeof what, "rank %d: split cross_entropy (%lld, 2 x %lld)", me,
             (long long)rows, (long long)classes);
    /* the C target's split sums: float per rank, added over ranks, vs one double sum */
    compare(what, &loss, &s->want_loss, 1, 1e-5, 1e-6, 0);
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    CHECK(f.site == 9 && f.position == 5 && f.value == (int32_t)all,
          "%s: fault site %d value %d position %lld", what, f.site, f.value, (long long)f.position);

    GPU_OK(g, dmrt_gpu_cross_entropy_grad(g, dl, dt, dstats, NULL, 1.0f, dout, rows, classes,
                                          me * classes, 2 * classes, rows));
    from_device(g, got, dout, (size_t)(rows * classes) * sizeof(float));
    snprintf(what, sizeof what, "rank %d: split cross_entropy_grad", me);
    compare(what, got, want, rows * classes, 1e-5, 1e-8, 0);

    dmrt_gpu_free(g, dl);
    dmrt_gpu_free(g, dt);
    dmrt_gpu_free(g, dout);
    dmrt_gpu_free(g, dloss);
    dmrt_gpu_free(g, dstats);
    dmrt_gpu_free(g, scratch);
    free(mine);
    free(want);
    free(got);
    return atomic_load(&test_failures) - before;
}

static int rank_main(dmrt_rank *r, void *arg) {
    const split_data *s = arg;
    char err[512];
    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_STAGED, NULL};
    dmrt_gpu *g = dmrt_gpu_create(r, &opt, err, sizeof err);
    if (!g) {
        fail("rank %d: dmrt_gpu_create: %s", dmrt_rank_id(r), err);
        dmrt_rank_abort(r, err);
        return 1;
    }
    int fails = rank_fails(r, staged_collectives(g, r), "the staged collectives");
    fails += rank_fails(r, split_xent(g, r, s), "the split cross-entropy");
    dmrt_gpu_destroy(g);
    return fails ? 1 : 0;
}

void test_ranks(void) {
    split_data s = {.rows = 12, .classes = 500};
    const int64_t all = 2 * s.classes;
    s.logits = host_floats(s.rows * all);
    s.want_grad = host_floats(s.rows * all);
    s.targets = xmalloc((size_t)s.rows * sizeof(int32_t));
    fill(s.logits, s.rows * all, 900, -5, 5);
    fill_ids(s.targets, s.rows, 910, (int32_t)all);
    s.targets[5] = (int32_t)all;  /* outside every rank's classes */
    s.want_loss = ref_xent(s.logits, s.targets, s.rows, all, s.rows);
    ref_xent_grad(s.logits, s.targets, 1.0f, s.want_grad, s.rows, all, s.rows);

    /* both ranks on device 0, as on a one-GPU machine */
    setenv("DMRT_CUDA_DEVICE", "0", 1);
    char err[1024];
    int rc = dmrt_threads_run(2, rank_main, &s, err, sizeof err);
    CHECK(rc == 0, "2 thread ranks: %s", err);
    unsetenv("DMRT_CUDA_DEVICE");
    free(s.logits);
    free(s.want_grad);
    free(s.targets);
}

/* ---- nccl-1rank: NCCL at one rank --------------------------------------------------------------
 *
 * One thread rank on the mesh data=1 with NCCL asked for: the axis gets a one-rank NCCL
 * communicator (AUTO and staged give it none: its collectives are device copies), and
 * every collective on it, and on the world (whose one member is the axis's), runs through
 * NCCL. One rank's sum, gather, scatter and exchange are its own values: exact.
 *
 * A send and recv to oneself do not go through NCCL by design: ncclSend completes only
 * when its receive runs, and dmrt_gpu_send and dmrt_gpu_recv are separate calls that
 * cannot share one NCCL group, so the runtime stages them through dmrt_send (buffered).
 * They are checked for their values. */

/* The values every NCCL check of one comm expects, labelled with the comm's axis. */
static void nccl_check(dmrt_gpu *g, dmrt_comm *c, const char *op, const float *dev,
                       const float *want, float *got, int64_t n) {
    char what[96];
    from_device(g, got, dev, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "nccl-1rank: %s on %s", op, dmrt_comm_axis_name(c));
    compare_bits(what, got, want, n);
}

/* h = rank 0's values of salt, and their copy on the device at dev. */
static void upload_gen(dmrt_gpu *g, float *h, float *dev, int64_t n, int salt) {
    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, salt);
    GPU_OK(g, dmrt_gpu_copy(g, dev, h, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
}

static void nccl_one_rank_collectives(dmrt_gpu *g, dmrt_comm *c) {
    const int64_t n = 1000;
    float *h = host_floats(n), *got = host_floats(n);
    float *d = device_floats(g, n), *d2 = device_floats(g, n);
    const size_t bytes = (size_t)n * sizeof(float);
    const char *path = dmrt_gpu_comm_path(g, c);
    CHECK(strcmp(path, "nccl") == 0, "nccl-1rank: collectives on %s take the path \"%s\", not nccl",
          dmrt_comm_axis_name(c), path);

    upload_gen(g, h, d, n, 11);
    GPU_OK(g, dmrt_gpu_allreduce_sum(g, c, d, n, "allreduce (nccl-1rank)"));
    nccl_check(g, c, "allreduce", d, h, got, n);
    GPU_OK(g, dmrt_gpu_allreduce_sum(g, c, d, 0, "empty allreduce (nccl-1rank)"));

    /* started on the comm stream, then waited for */
    upload_gen(g, h, d, n, 12);
    GPU_OK(g, dmrt_gpu_allreduce_start(g, c, d, n, "started allreduce (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_comm_wait(g, c));
    nccl_check(g, c, "started allreduce + wait", d, h, got, n);

    /* started, then another call on c before the wait: it runs after the started one */
    upload_gen(g, h, d, n, 13);
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_allreduce_start(g, c, d, n, "started allreduce (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_allgather(g, c, d, d2, n, "allgather after a start (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_comm_wait(g, c));
    nccl_check(g, c, "started allreduce, allgather, wait", d2, h, got, n);

    /* allgather, out of place and in place (send == recv + rank * n) */
    upload_gen(g, h, d, n, 14);
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_allgather(g, c, d, d2, n, "allgather (nccl-1rank)"));
    nccl_check(g, c, "allgather", d2, h, got, n);
    upload_gen(g, h, d2, n, 15);
    GPU_OK(g, dmrt_gpu_allgather(g, c, d2, d2, n, "allgather in place (nccl-1rank)"));
    nccl_check(g, c, "allgather in place", d2, h, got, n);

    upload_gen(g, h, d, n, 16);
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_reduce_scatter_sum(g, c, d, d2, n, "reduce-scatter (nccl-1rank)"));
    nccl_check(g, c, "reduce-scatter", d2, h, got, n);

    /* a group of one ncclSend and one ncclRecv, both to this rank */
    upload_gen(g, h, d, n, 17);
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_alltoall(g, c, d, d2, n, "all-to-all (nccl-1rank)"));
    nccl_check(g, c, "all-to-all", d2, h, got, n);

    /* to oneself: staged (see above), buffered, so the send returns before the recv */
    upload_gen(g, h, d, n, 18);
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_send(g, c, 0, d, n, "send to self (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_recv(g, c, 0, d2, n, "recv from self (nccl-1rank)"));
    nccl_check(g, c, "send/recv to self (staged)", d2, h, got, n);

    dmrt_gpu_free(g, d);
    dmrt_gpu_free(g, d2);
    free(h);
    free(got);
}

static int nccl_one_rank_main(dmrt_rank *r, void *arg) {
    (void)arg;
    const int before = atomic_load(&test_failures);
    char err[512];
    const char *const names[1] = {"data"};
    const int64_t sizes[1] = {1};
    if (dmrt_mesh_init(r, 1, names, sizes, err, sizeof err) != 0) {
        fail("nccl-1rank: dmrt_mesh_init(data=1): %s", err);
        return 1;
    }
    dmrt_comm *data = dmrt_mesh_axis(r, 0), *w = dmrt_rank_world(r);

    /* unchanged without NCCL asked for: AUTO picks NCCL (one rank, one GPU at least) but
     * makes no communicator for an axis of one rank; staged neither */
    const dmrt_gpu_comm_mode modes[2] = {DMRT_GPU_COMM_AUTO, DMRT_GPU_COMM_STAGED};
    const char *const mode_names[2] = {"nccl", "staged"};
    for (int k = 0; k < 2; k++) {
        dmrt_gpu_options opt = {0, modes[k], NULL};
        dmrt_gpu *g = dmrt_gpu_create(r, &opt, err, sizeof err);
        if (!g) {
            fail("nccl-1rank: dmrt_gpu_create (%s): %s", mode_names[k], err);
            return 1;
        }
        const char *mode = dmrt_gpu_comm_mode_name(g);
        const char *pd = dmrt_gpu_comm_path(g, data), *pw = dmrt_gpu_comm_path(g, w);
        CHECK(strcmp(mode, mode_names[k]) == 0 && strcmp(pd, "local") == 0 &&
                  strcmp(pw, "local") == 0,
              "nccl-1rank: %s asked: mode %s (want %s), path on data %s, on world %s (want "
              "local)", k ? "staged" : "auto", mode, mode_names[k], pd, pw);
        dmrt_gpu_destroy(g);
    }

    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_NCCL, NULL};
    dmrt_gpu *g = dmrt_gpu_create(r, &opt, err, sizeof err);
    if (!g) {
        fail("nccl-1rank: dmrt_gpu_create (nccl): %s", err);
        return 1;
    }
    printf("nccl-1rank: %s, comm mode %s\n", dmrt_gpu_device_name(g), dmrt_gpu_comm_mode_name(g));
    CHECK(strcmp(dmrt_gpu_comm_mode_name(g), "nccl") == 0, "nccl-1rank: comm mode %s, want nccl",
          dmrt_gpu_comm_mode_name(g));
    nccl_one_rank_collectives(g, data);
    nccl_one_rank_collectives(g, w);
    GPU_OK(g, dmrt_gpu_sync(g));
    dmrt_gpu_destroy(g);
    return atomic_load(&test_failures) != before;
}

void test_nccl_one_rank(void) {
#ifdef DMRT_CUDA_EMULATED
    printf("SKIP nccl-1rank: NCCL is not emulated on the CPU (tests/gpu/emu)\n");
    return;
#endif
    /* the options must decide here: DMRT_GPU_COMM would override them */
    char saved[64] = "";
    const char *env = getenv("DMRT_GPU_COMM");
    const int had = env != NULL;
    if (had) snprintf(saved, sizeof saved, "%s", env);
    unsetenv("DMRT_GPU_COMM");
    char err[1024];
    int rc = dmrt_threads_run(1, nccl_one_rank_main, NULL, err, sizeof err);
    CHECK(rc == 0, "nccl-1rank: 1 thread rank: %s", err);
    if (had) setenv("DMRT_GPU_COMM", saved, 1);
}
