/* gemm_bf16.c: GPT-2-sized products, fp32 through dmrt_sgemm_split against bf16 through
 * dmrt_gemm_bf16_split, on each bf16 path (docs/runtime.md, "bf16 products").
 *
 * usage: gemm_bf16 [-r REPS] [-t THREADS]
 *   The shapes are GPT-2 small's (B T = 1024 rows, d = 768, 4 d = 3072) as a layer's
 *   forward and backward call them: C = op(A) op(B), beta 0. Each product runs once to warm
 *   up, then REPS times (default 10); the best is kept (other work on the machine only
 *   ever makes a run slower). THREADS: default dmrt_threads_per_rank(1) (DMC_THREADS,
 *   else the cores).
 * The path is chosen once per process (DMRT_BF16_GEMM), so each path is measured in a
 * child of its own, with the fp32 product measured again beside it. A line per shape:
 *   path  ta tb m n k  sgemm_ms  bf16_ms  sgemm/bf16  bf16_gflops */
#include "dmrt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const struct {
    int ta, tb;
    int64_t m, n, k;
    const char *what;
} shapes[] = {
    {0, 0, 1024, 3072, 768, "MLP up, forward: x W1"},
    {0, 0, 1024, 768, 3072, "MLP down, forward: h W2"},
    {0, 0, 1024, 768, 768, "attention projection, forward"},
    {0, 1, 1024, 768, 3072, "MLP up, backward dx: dh W1^T"},
    {1, 0, 768, 3072, 1024, "MLP up, backward dW1: x^T dh"},
};

static void *allocated(size_t bytes) {
    void *p = dmrt_alloc(bytes);
    if (!p) {
        fprintf(stderr, "gemm_bf16: out of memory\n");
        exit(1);
    }
    return p;
}

/* Small values from a linear congruential sequence: their size does not change the time. */
static void fill(float *x, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) * 0x1p-24f - 0.5f;
    }
}

static double best_ms(int reps, int bf16, int threads, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      const float *a, const uint16_t *a16, const float *b, const uint16_t *b16, float *c) {
    /* row strides of A (m x k, or k x m transposed) and B (k x n, or n x k transposed) */
    int64_t lda = ta ? m : k, ldb = tb ? k : n;
    double best = 1e30;
    for (int r = -1; r < reps; r++) {
        double t0 = dmrt_now();
        if (bf16)
            dmrt_gemm_bf16_split(threads, ta, tb, m, n, k, 1.0f, a16, lda, b16, ldb, 0.0f, c, n);
        else
            dmrt_sgemm_split(threads, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
        double ms = (dmrt_now() - t0) * 1e3;
        if (r >= 0 && ms < best) best = ms;
    }
    return best;
}

static int measure(const char *path, int reps, int threads) {
    if (strcmp(path, "onednn") == 0 && !dmrt_gemm_bf16_onednn_available()) {
        printf("%-26s unavailable here (no oneDNN in this build, or no AVX512-BF16)\n", "oneDNN AVX512-BF16");
        return 0;
    }
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t m = shapes[s].m, n = shapes[s].n, k = shapes[s].k;
        float *a = allocated((size_t)(m * k) * sizeof(float)), *b = allocated((size_t)(k * n) * sizeof(float));
        uint16_t *a16 = allocated((size_t)(m * k) * sizeof(uint16_t));
        uint16_t *b16 = allocated((size_t)(k * n) * sizeof(uint16_t));
        float *c = allocated((size_t)(m * n) * sizeof(float));
        fill(a, m * k, 1u + (unsigned)s);
        fill(b, k * n, 100u + (unsigned)s);
        dmrt_f32_to_bf16_array(a, a16, m * k);
        dmrt_f32_to_bf16_array(b, b16, k * n);
        int ta = shapes[s].ta, tb = shapes[s].tb;
        double f32 = best_ms(reps, 0, threads, ta, tb, m, n, k, a, a16, b, b16, c);
        double b16ms = best_ms(reps, 1, threads, ta, tb, m, n, k, a, a16, b, b16, c);
        printf("%-26s %d %d %5lld %5lld %5lld  %8.2f  %8.2f  %5.2fx  %6.1f   %s\n", dmrt_gemm_bf16_path(), ta, tb,
               (long long)m, (long long)n, (long long)k, f32, b16ms, f32 / b16ms,
               2.0 * (double)m * (double)n * (double)k / (b16ms * 1e6), shapes[s].what);
        dmrt_free(a), dmrt_free(b), dmrt_free(a16), dmrt_free(b16), dmrt_free(c);
    }
    return 0;
}

int main(int argc, char **argv) {
    int reps = 10, threads = dmrt_threads_per_rank(1);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: gemm_bf16 [-r REPS] [-t THREADS]\n");
            return 2;
        }
    }
    if (reps < 1 || threads < 1) {
        fprintf(stderr, "gemm_bf16: REPS and THREADS must be at least 1\n");
        return 2;
    }
    printf("threads %d, best of %d; times in ms; gflops of the bf16 product\n", threads, reps);
    printf("%-26s ta tb     m     n     k  sgemm_ms   bf16_ms  sgemm/bf16  gflops\n", "path");
    fflush(stdout);
    static const char *const paths[] = {"onednn", "convert"};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        pid_t child = fork();
        if (child < 0) {
            perror("gemm_bf16: fork");
            return 1;
        }
        if (child == 0) {
            /* read at the child's first bf16 product: the parent has made none */
            setenv("DMRT_BF16_GEMM", paths[p], 1);
            int status = measure(paths[p], reps, threads);
            fflush(stdout);
            _exit(status);
        }
        int status;
        if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "gemm_bf16: the %s run failed\n", paths[p]);
            return 1;
        }
    }
    return 0;
}
