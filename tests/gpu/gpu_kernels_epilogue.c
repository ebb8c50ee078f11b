/* gpu_kernels_epilogue.c: dmrt_gpu_gemm_epilogue (runtime/cuda/gemm_epilogue.cu) against
 * plain C: the product (dmrt_sgemm_ref on the operands as the device reads them) plus the
 * bias on every row, or the product and the sums of op(B)'s rows in double; fp32, bf16 and
 * fp16 operands, every transpose pair, padded strides, beta 0 and 1, empty products. Run
 * twice: cuBLASLt's epilogues where it offers them (DMRT_CUBLASLT unset; a bias gradient
 * of a transposed op(B) always takes the runtime's kernels, with its stderr line), and the
 * runtime's own kernels (DMRT_CUBLASLT=off); then gpt.dm's shapes under =require, whose refusals are
 * printed (a NOTE, not a failure: the runtime's kernels make the same values) so that a GPU
 * session says which path its steps take. */
#include <math.h>
#include <string.h>

#include "gpu_kernels_test.h"

/* n values rounded to the operand type (bits into bits16 for bf16 and fp16) and widened back
 * into values: what the device multiplies. */
static void as_operands(int operands, float *values, uint16_t *bits16, int64_t n) {
    if (operands == DMRT_GPU_OPERANDS_BF16) {
        dmrt_f32_to_bf16_array(values, bits16, n);
        dmrt_bf16_to_f32_array(bits16, values, n);
    } else if (operands == DMRT_GPU_OPERANDS_F16) {
        dmrt_f32_to_f16_array(values, bits16, n);
        dmrt_f16_to_f32_array(bits16, values, n);
    }
}

typedef struct epilogue_case {
    int operands, ta, tb;
    int64_t m, n, k;
    float beta;
    int bias_grad; /* 0: bias */
} epilogue_case;

static void epilogue_case_run(dmrt_gpu *g, const char *mode, const epilogue_case *e) {
    const int64_t m = e->m, n = e->n, k = e->k, pad = 3;
    const int64_t arows = e->ta ? k : m, lda = (e->ta ? m : k) + pad;
    const int64_t brows = e->tb ? n : k, ldb = (e->tb ? k : n) + pad, ldc = n + pad;
    const int64_t na = arows * lda + 1, nb = brows * ldb + 1, nc = m * ldc + 1;
    float *a = host_floats(na), *b = host_floats(nb), *c = host_floats(nc), *want = host_floats(nc);
    float *vec = host_floats(n), *want_vec = host_floats(n);
    uint16_t *a16 = xmalloc((size_t)na * 2), *b16 = xmalloc((size_t)nb * 2);
    const uint64_t seed = (uint64_t)(e->operands * 64 + e->ta * 16 + e->tb * 4 + e->bias_grad * 2) + (e->beta != 0.0f);
    fill(a, na, 100 + seed, -1, 1);
    fill(b, nb, 200 + seed, -1, 1);
    fill(c, nc, 300 + seed, -1, 1);
    fill(vec, n, 400 + seed, -1, 1);
    as_operands(e->operands, a, a16, na);
    as_operands(e->operands, b, b16, nb);
    memcpy(want, c, (size_t)nc * sizeof(float));
    if (k > 0) dmrt_sgemm_ref(e->ta, e->tb, m, n, k, 1.0f, a, lda, b, ldb, e->beta, want, ldc);
    else
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) want[i * ldc + j] *= e->beta;
    if (!e->bias_grad)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) want[i * ldc + j] += vec[j];
    for (int64_t j = 0; j < n; j++) {
        double sum = 0;
        for (int64_t r = 0; r < k; r++) sum += b[e->tb ? j * ldb + r : r * ldb + j];
        want_vec[j] = e->bias_grad ? (float)sum : vec[j];
    }
    int wide = e->operands == DMRT_GPU_OPERANDS_F32;
    void *da = wide ? to_device(g, a, (size_t)na * 4) : to_device(g, a16, (size_t)na * 2);
    void *db = wide ? to_device(g, b, (size_t)nb * 4) : to_device(g, b16, (size_t)nb * 2);
    float *dc = to_device(g, c, (size_t)nc * sizeof(float));
    float *dvec = to_device(g, vec, (size_t)n * sizeof(float));
    GPU_OK(g, dmrt_gpu_gemm_epilogue(g, e->operands, e->ta, e->tb, m, n, k, da, lda, db, ldb, e->beta, dc, ldc,
                                     e->bias_grad ? NULL : dvec, e->bias_grad ? dvec : NULL));
    from_device(g, c, dc, (size_t)nc * sizeof(float));
    from_device(g, vec, dvec, (size_t)n * sizeof(float));
    char what[160];
    static const char *types[] = {"fp32", "bf16", "fp16"};
    snprintf(what, sizeof what, "gemm_epilogue (%s) %s ta=%d tb=%d m=%lld n=%lld k=%lld beta=%g %s", mode,
             types[e->operands], e->ta, e->tb, (long long)m, (long long)n, (long long)k, (double)e->beta,
             e->bias_grad ? "bias_grad" : "bias");
    /* strict fp32 sums (no TF32: the gpu is made without it) of k products of operands in
     * [-1, 1]; the padding between rows must stay as it was */
    compare(what, c, want, nc, 1e-5, 2e-6 * (double)(k + 8), 0);
    char what_vec[200];
    snprintf(what_vec, sizeof what_vec, "%s: %s", what, e->bias_grad ? "the sums of op(B)'s rows" : "the bias untouched");
    compare(what_vec, vec, want_vec, n, 1e-5, 2e-6 * (double)(k + 8), 0);
    dmrt_gpu_free(g, da);
    dmrt_gpu_free(g, db);
    dmrt_gpu_free(g, dc);
    dmrt_gpu_free(g, dvec);
    free(a), free(b), free(c), free(want), free(vec), free(want_vec), free(a16), free(b16);
}

static void epilogue_cases(dmrt_gpu *g, const char *mode) {
    for (int operands = 0; operands < 3; operands++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                epilogue_case bias = {operands, ta, tb, 37, 53, 29, 0.0f, 0};
                epilogue_case grad = {operands, ta, tb, 37, 53, 203, 0.0f, 1};
                epilogue_case_run(g, mode, &bias);
                epilogue_case_run(g, mode, &grad);
                grad.beta = 1.0f;
                epilogue_case_run(g, mode, &grad);
            }
    /* empty products: C = bias (k 0); the sums of op(B) with no rows of C (m 0), and of none (k 0) */
    epilogue_case empty[] = {{0, 0, 0, 5, 7, 0, 0.0f, 0}, {0, 1, 0, 0, 7, 9, 0.0f, 1}, {0, 1, 0, 5, 7, 0, 0.0f, 1}};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) epilogue_case_run(g, mode, &empty[i]);
}

/* gpt.dm's shapes at B=8, T=64 (512 rows), C=768: which path they take under require. */
static void gpt_shapes_path(dmrt_gpu *g) {
    const int64_t rows = 512, c = 768;
    const int64_t shapes[][3] = {{rows, c, c}, {rows, 4 * c, c}, {rows, c, 4 * c}};
    for (int operands = 0; operands < 2; operands++)
        for (size_t s = 0; s < 3; s++)
            for (int bias_grad = 0; bias_grad < 2; bias_grad++) {
                /* forward y = x w + b: (rows, in) (in, out); backward dw = x^T dy over the rows */
                int64_t in = shapes[s][2], out = shapes[s][1];
                int64_t m = bias_grad ? in : rows, n = out, k = bias_grad ? rows : in;
                size_t elem = operands ? 2 : 4;
                void *a = NULL, *b = NULL;
                GPU_OK(g, dmrt_gpu_alloc(g, &a, (size_t)(rows * in) * elem));
                GPU_OK(g, dmrt_gpu_alloc(g, &b, (size_t)(k * n) * elem));
                float *dc = device_floats(g, m * n), *vec = device_floats(g, n);
                int rc = dmrt_gpu_gemm_epilogue(g, operands, bias_grad, 0, m, n, k, a, bias_grad ? in : k, b, n, 0.0f, dc, n,
                                                bias_grad ? NULL : vec, bias_grad ? vec : NULL);
                printf("%s cuBLASLt %s, %s (%lld, %lld) x (%lld, %lld)%s\n", rc == DMRT_OK ? "NOTE: took" : "NOTE: refused",
                       bias_grad ? "BGRADA" : "BIAS", operands ? "bf16" : "fp32", (long long)m, (long long)k, (long long)k,
                       (long long)n, rc == DMRT_OK ? "" : dmrt_gpu_error(g));
                dmrt_gpu_free(g, a);
                dmrt_gpu_free(g, b);
                dmrt_gpu_free(g, dc);
                dmrt_gpu_free(g, vec);
            }
}

static dmrt_gpu *gpu_with_mode(const char *mode) {
    char err[512];
    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_AUTO, NULL};
    setenv("DMRT_CUBLASLT", mode, 1);
    dmrt_gpu *g = dmrt_gpu_create(NULL, &opt, err, sizeof err);
    if (!g) {
        printf("FAIL dmrt_gpu_create (DMRT_CUBLASLT=%s): %s\n", mode, err);
        exit(1);
    }
    return g;
}

void test_gemm_epilogue(dmrt_gpu *g) {
    epilogue_cases(g, "cuBLASLt where it takes the shape");
    float *d = device_floats(g, 16);
    int rc = dmrt_gpu_gemm_epilogue(g, DMRT_GPU_OPERANDS_F32, 0, 0, 2, 2, 2, d, 2, d, 2, 1.0f, d + 8, 2, d, NULL);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(g), "beta"), "gemm_epilogue: a bias with beta 1: %d, \"%s\"", rc,
          dmrt_gpu_error(g));
    rc = dmrt_gpu_gemm_epilogue(g, DMRT_GPU_OPERANDS_F32, 0, 0, 2, 2, 2, d, 2, d, 2, 0.0f, d + 8, 2, d, d + 4);
    CHECK(rc == DMRT_ERR_ARG, "gemm_epilogue: a bias and a bias gradient at once: %d", rc);
    rc = dmrt_gpu_gemm_epilogue(g, 7, 0, 0, 2, 2, 2, d, 2, d, 2, 0.0f, d + 8, 2, d, NULL);
    CHECK(rc == DMRT_ERR_ARG, "gemm_epilogue: operand type 7: %d", rc);
    dmrt_gpu_free(g, d);

    dmrt_gpu *off = gpu_with_mode("off");
    epilogue_cases(off, "the runtime's kernels");
    dmrt_gpu_destroy(off);

    dmrt_gpu *bad = gpu_with_mode("sometimes");
    d = device_floats(bad, 16);
    rc = dmrt_gpu_gemm_epilogue(bad, DMRT_GPU_OPERANDS_F32, 0, 0, 2, 2, 2, d, 2, d, 2, 0.0f, d + 8, 2, d, NULL);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(bad), "DMRT_CUBLASLT=sometimes"),
          "gemm_epilogue: DMRT_CUBLASLT=sometimes refused by name: %d, \"%s\"", rc, dmrt_gpu_error(bad));
    dmrt_gpu_destroy(bad);

    dmrt_gpu *require = gpu_with_mode("require");
    gpt_shapes_path(require);
    dmrt_gpu_destroy(require);
    unsetenv("DMRT_CUBLASLT");
}
