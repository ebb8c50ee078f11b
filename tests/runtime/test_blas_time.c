/* test_blas_time: the DMRT_BLAS_TIME counters of dmrt_sgemm. Off, nothing is counted; on,
 * every product is counted once with 2 m n k flops (the formula, summed here), its time lies
 * within the wall time around the calls, and each thread counts only its own products. */
#include <pthread.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"

enum { M = 48, N = 40, K = 56 };
static float a[M * K], b[K * N], c[M * N];

/* products of (m, n, k) = (M, N, K), (N, M, K) transposed both ways, and (M, N, 1) */
static double three_products(void) {
    dmrt_sgemm(0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    dmrt_sgemm(1, 1, N, M, K, 1.0f, b, N, a, K, 0.0f, c, M);
    dmrt_sgemm(0, 0, M, N, 1, 1.0f, a, K, b, N, 0.0f, c, N);
    return 2.0 * M * N * K * 2 + 2.0 * M * N;
}

static void *other_thread(void *arg) {
    dmrt_blas_time *seen = arg;
    seen[0] = dmrt_blas_time_so_far();
    three_products();
    seen[1] = dmrt_blas_time_so_far();
    return NULL;
}

/* run with DMRT_BLAS_TIME unset or "0" */
static int test_off(void) {
    int fails = 0;
    CHECK(dmrt_blas_time_on() == 0, "on with DMRT_BLAS_TIME=%s", getenv("DMRT_BLAS_TIME"));
    three_products();
    dmrt_blas_time t = dmrt_blas_time_so_far();
    CHECK(t.calls == 0 && t.flops == 0.0 && t.seconds == 0.0, "counted while off: %lld calls", (long long)t.calls);
    /* read once: setting it now changes nothing */
    setenv("DMRT_BLAS_TIME", "1", 1);
    three_products();
    CHECK(dmrt_blas_time_on() == 0 && dmrt_blas_time_so_far().calls == 0, "turned on after the first product");
    return fails;
}

/* run with DMRT_BLAS_TIME=1 */
static int test_on(void) {
    int fails = 0;
    CHECK(dmrt_blas_time_on() == 1, "off with DMRT_BLAS_TIME=%s", getenv("DMRT_BLAS_TIME"));
    dmrt_blas_time t0 = dmrt_blas_time_so_far();
    CHECK(t0.calls == 0 && t0.flops == 0.0 && t0.seconds == 0.0, "counts before any product");
    double w0 = dmrt_now(), flops = 0.0;
    for (int r = 0; r < 20; r++) flops += three_products();
    /* empty products return before BLAS: not counted */
    dmrt_sgemm(0, 0, 0, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    double wall = dmrt_now() - w0;
    dmrt_blas_time t1 = dmrt_blas_time_so_far();
    CHECK(t1.calls == 60, "%lld calls, want 60", (long long)t1.calls);
    CHECK(t1.flops == flops, "%.17g flops, want %.17g", t1.flops, flops);
    CHECK(t1.seconds > 0.0 && t1.seconds <= wall, "%.9f s counted in %.9f s of wall time", t1.seconds, wall);

    dmrt_blas_time seen[2];
    pthread_t th;
    CHECK(pthread_create(&th, NULL, other_thread, seen) == 0, "pthread_create");
    pthread_join(th, NULL);
    CHECK(seen[0].calls == 0 && seen[0].flops == 0.0, "a new thread starts at %lld calls", (long long)seen[0].calls);
    CHECK(seen[1].calls == 3 && seen[1].flops == flops / 20, "the thread counted %lld calls, %.17g flops",
          (long long)seen[1].calls, seen[1].flops);
    dmrt_blas_time t2 = dmrt_blas_time_so_far();
    CHECK(t2.calls == t1.calls && t2.flops == t1.flops && t2.seconds == t1.seconds,
          "another thread's products counted here");
    return fails;
}

int main(int argc, char **argv) {
    for (int i = 0; i < M * K; i++) a[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < K * N; i++) b[i] = (float)(i % 5) - 2.0f;
    if (argc != 2 || (strcmp(argv[1], "on") != 0 && strcmp(argv[1], "off") != 0)) {
        fprintf(stderr, "usage: DMRT_BLAS_TIME=1 %s on | %s off\n", argv[0], argv[0]);
        return 2;
    }
    int fails = strcmp(argv[1], "on") == 0 ? test_on() : test_off();
    if (fails) fprintf(stderr, "test_blas_time %s: %d failures\n", argv[1], fails);
    return fails != 0;
}
