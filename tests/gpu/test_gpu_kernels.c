/* test_gpu_kernels.c: libdmrt_cuda against plain C references that mirror the C target's
 * kernels (codegen/dialect_c.c), on random inputs:
 *
 *   memory, copies, faults, argument errors
 *   sgemm: every transpose pair, padded strides, batched, k = 0
 *   gemm_epilogue: the bias added and the bias's gradient summed by the product's call,
 *     through cuBLASLt and through the runtime's own kernels (gpu_kernels_epilogue.c)
 *   softmax (+ fused causal mask and scale), softmax_grad, causal_mask
 *   layernorm (also with its residual add: add_layernorm), layernorm_grad (also accumulated),
 *   layernorm_wgrad (deterministic: two runs, same bits; also with the bias's gradient)
 *   cross-entropy and its gradient, whole and vocabulary-parallel on 2 thread ranks,
 *     with a bad target recorded as a fault; the gradient written over its logits
 *   embedding and its gradient (the gradient bit for bit the C target's sums, twice)
 *   SGD and AdamW (bit for bit: the same float operations in the same order)
 *   the staged collectives on 2 thread ranks sharing device 0, against exact sums
 *   nccl-1rank: NCCL at one rank (asked for): a one-rank NCCL communicator on a mesh axis
 *     of size 1, every collective on it (and on the world) through NCCL, exact
 *
 * Tolerances are stated at each comparison. Prints FAIL lines and exits 1 on any
 * failure; without a CUDA device prints SKIP and exits 77 (meson: skipped). The helpers and
 * references are in gpu_kernels_refs.c, the thread ranks' part in gpu_kernels_ranks.c. */
#include <math.h>
#include <string.h>

#include "gpu_kernels_test.h"

/* ---- memory, copies, argument errors -------------------------------------------------------- */

static void test_memory(dmrt_gpu *g) {
    CHECK(dmrt_gpu_device_name(g)[0] != 0, "empty device name");
    printf("device: %s\n", dmrt_gpu_device_name(g));
    void *p = (void *)&p;
    GPU_OK(g, dmrt_gpu_alloc(g, &p, 0));
    CHECK(p == NULL, "alloc of 0 bytes gave %p", p);
    const int64_t n = 1 << 18;
    float *d = device_floats(g, n);
    CHECK(dmrt_gpu_peak_bytes(g) >= (size_t)n * sizeof(float), "peak %zu after a %zu-byte alloc",
          dmrt_gpu_peak_bytes(g), (size_t)n * sizeof(float));
    float *h = host_floats(n);
    fill(h, n, 1, -1, 1);
    from_device(g, h, d, (size_t)n * sizeof(float));
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) nonzero += h[i] != 0.0f;
    CHECK(nonzero == 0, "dmrt_gpu_alloc: %lld nonzero floats", (long long)nonzero);
    /* host -> device -> device -> host round trip, and zero */
    float *h2 = host_floats(n);
    fill(h, n, 2, -1, 1);
    float *d2 = device_floats(g, n);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_copy(g, d2, d, (size_t)n * sizeof(float), DMRT_DEVICE_TO_DEVICE));
    from_device(g, h2, d2, (size_t)n * sizeof(float));
    compare_bits("copies", h2, h, n);
    GPU_OK(g, dmrt_gpu_zero(g, d2, 16 * sizeof(float)));
    from_device(g, h2, d2, 32 * sizeof(float));
    CHECK(h2[0] == 0.0f && h2[15] == 0.0f && h2[16] == h[16], "dmrt_gpu_zero");
    GPU_OK(g, dmrt_gpu_sync(g));

    int rc = dmrt_gpu_copy(g, d, h, 4, (dmrt_copy_kind)9);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(g), "kind"), "bad copy kind: %d, \"%s\"",
          rc, dmrt_gpu_error(g));
    rc = dmrt_gpu_sgemm(g, 0, 0, (int64_t)1 << 33, 4, 4, d, 4, d, 4, 0.0f, d2, 4, 1, 0, 0, 0);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(g), "32-bit"), "huge sgemm: %d, \"%s\"",
          rc, dmrt_gpu_error(g));
    rc = dmrt_gpu_softmax(g, d, d2, 4, 8, 2, 1.0f, 4);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(g), "causal"),
          "causal softmax with inner 2: %d, \"%s\"", rc, dmrt_gpu_error(g));
    rc = dmrt_gpu_allreduce_sum(g, NULL, d, 4, "x");
    CHECK(rc == DMRT_ERR_COMM && strstr(dmrt_gpu_error(g), "NULL"), "NULL comm: %d, \"%s\"", rc,
          dmrt_gpu_error(g));
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    CHECK(f.site == 0, "a fault (site %d) before any kernel ran", f.site);
    dmrt_gpu_free(g, d);
    dmrt_gpu_free(g, d2);
    free(h);
    free(h2);
}

/* ---- sgemm ------------------------------------------------------------------------------------ */

static void sgemm_case(dmrt_gpu *g, int ta, int tb, int64_t batch, float beta) {
    const int64_t m = 37, n = 53, k = 29, pad = 3;
    const int64_t arows = ta ? k : m, lda = (ta ? m : k) + pad;
    const int64_t brows = tb ? n : k, ldb = (tb ? k : n) + pad;
    const int64_t ldc = n + pad;
    const int64_t sa = arows * lda + 5, sb = brows * ldb + 6, sc = m * ldc + 7;
    float *a = host_floats(batch * sa), *b = host_floats(batch * sb);
    float *c = host_floats(batch * sc), *want = host_floats(batch * sc);
    fill(a, batch * sa, 10 + (uint64_t)(ta * 2 + tb), -1, 1);
    fill(b, batch * sb, 20 + (uint64_t)(ta * 2 + tb), -1, 1);
    fill(c, batch * sc, 30, -1, 1);
    memcpy(want, c, (size_t)(batch * sc) * sizeof(float));
    for (int64_t i = 0; i < batch; i++)
        dmrt_sgemm_ref(ta, tb, m, n, k, 1.0f, a + i * sa, lda, b + i * sb, ldb, beta,
                       want + i * sc, ldc);
    float *da = to_device(g, a, (size_t)(batch * sa) * sizeof(float));
    float *db = to_device(g, b, (size_t)(batch * sb) * sizeof(float));
    float *dc = to_device(g, c, (size_t)(batch * sc) * sizeof(float));
    GPU_OK(g, dmrt_gpu_sgemm(g, ta, tb, m, n, k, da, lda, db, ldb, beta, dc, ldc, batch, sa, sb, sc));
    from_device(g, c, dc, (size_t)(batch * sc) * sizeof(float));
    char what[96];
    snprintf(what, sizeof what, "sgemm ta=%d tb=%d batch=%lld beta=%g", ta, tb, (long long)batch,
             (double)beta);
    /* strict fp32 products of 29 terms in [-1, 1]; padding and gaps must stay as they were */
    compare(what, c, want, batch * sc, 1e-5, 2e-5, 0);
    dmrt_gpu_free(g, da);
    dmrt_gpu_free(g, db);
    dmrt_gpu_free(g, dc);
    free(a);
    free(b);
    free(c);
    free(want);
}

static void test_sgemm(dmrt_gpu *g) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            sgemm_case(g, ta, tb, 1, 0.0f);
            sgemm_case(g, ta, tb, 3, 1.0f);
        }
    sgemm_case(g, 1, 0, 4, 0.0f);
    /* k = 0 with beta 0 clears C */
    float h[6] = {1, 2, 3, 4, 5, 6};
    float *dc = to_device(g, h, sizeof h);
    GPU_OK(g, dmrt_gpu_sgemm(g, 0, 0, 2, 3, 0, NULL, 1, NULL, 3, 0.0f, dc, 3, 1, 0, 0, 0));
    from_device(g, h, dc, sizeof h);
    CHECK(h[0] == 0 && h[5] == 0, "sgemm k=0 beta=0 left C[0] = %g", (double)h[0]);
    dmrt_gpu_free(g, dc);
}

/* ---- softmax and the mask ----------------------------------------------------------------------- */

typedef struct softmax_case {
    int64_t outer, n, inner;
    float scale;
    int64_t causal_queries;
} softmax_case;

static void test_softmax(dmrt_gpu *g) {
    static const softmax_case cases[] = {
        {7, 50304, 1, 1.0f, 0},       /* a vocabulary-sized row */
        {5, 9, 4, 1.0f, 0},           /* along a middle dim */
        {33, 1000, 1, 0.5f, 0},
        {2 * 3 * 64, 64, 1, 0.125f, 64},  /* causal attention, 2 x 3 heads x 64 queries */
        {2 * 48, 80, 1, 0.125f, 48},  /* more keys than queries */
        {1024, 1024, 1, 0.03125f, 1024},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const softmax_case *k = &cases[ci];
        const int64_t total = k->outer * k->n * k->inner;
        float *x = host_floats(total), *dy = host_floats(total);
        float *want = host_floats(total), *want_dx = host_floats(total), *got = host_floats(total);
        fill(x, total, 100 + ci, -4, 4);
        fill(dy, total, 200 + ci, -1, 1);
        ref_softmax(x, want, k->outer, k->n, k->inner, k->scale, k->causal_queries);
        ref_softmax_grad(want, dy, want_dx, k->outer, k->n, k->inner, k->scale, k->causal_queries);
        float *dx = to_device(g, x, (size_t)total * sizeof(float));
        float *ddy = to_device(g, dy, (size_t)total * sizeof(float));
        float *dy_in = to_device(g, want, (size_t)total * sizeof(float));
        float *dout = device_floats(g, total);
        char what[128];
        snprintf(what, sizeof what, "softmax (%lld, %lld, %lld) scale %g causal %lld",
                 (long long)k->outer, (long long)k->n, (long long)k->inner, (double)k->scale,
                 (long long)k->causal_queries);
        GPU_OK(g, dmrt_gpu_softmax(g, dx, dout, k->outer, k->n, k->inner, k->scale,
                                   k->causal_queries));
        from_device(g, got, dout, (size_t)total * sizeof(float));
        /* float sums in another order (the C target's 8 running lanes over 50304 classes
         * drift by a few 1e-6), CUDA's expf within 2 ulp; hidden keys exactly 0 */
        compare(what, got, want, total, 1e-4, 1e-7, 1);
        /* the gradient from the reference y, so that only the kernel is measured */
        GPU_OK(g, dmrt_gpu_softmax_grad(g, dy_in, ddy, dout, k->outer, k->n, k->inner, k->scale,
                                        k->causal_queries));
        from_device(g, got, dout, (size_t)total * sizeof(float));
        snprintf(what, sizeof what, "softmax_grad (%lld, %lld, %lld) scale %g causal %lld",
                 (long long)k->outer, (long long)k->n, (long long)k->inner, (double)k->scale,
                 (long long)k->causal_queries);
        compare(what, got, want_dx, total, 1e-4, 1e-6, 1);
        dmrt_gpu_free(g, dx);
        dmrt_gpu_free(g, ddy);
        dmrt_gpu_free(g, dy_in);
        dmrt_gpu_free(g, dout);
        free(x);
        free(dy);
        free(want);
        free(want_dx);
        free(got);
    }

    const int64_t outer = 3, nq = 5, nk = 8, total = outer * nq * nk;
    float *x = host_floats(total), *want = host_floats(total), *got = host_floats(total);
    fill(x, total, 300, -1, 1);
    ref_causal_mask(x, want, outer, nq, nk, -INFINITY);
    float *dx = to_device(g, x, (size_t)total * sizeof(float)), *dout = device_floats(g, total);
    GPU_OK(g, dmrt_gpu_causal_mask(g, dx, dout, outer, nq, nk, -INFINITY));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    compare_bits("causal_mask (3, 5 queries, 8 keys)", got, want, total);
    dmrt_gpu_free(g, dx);
    dmrt_gpu_free(g, dout);
    free(x);
    free(want);
    free(got);
}

/* ---- layernorm -------------------------------------------------------------------------------- */

/* The 16-bit copy the layernorm kernels store with their result (out16): layernorm,
 * add_layernorm (of x + dy) and the accumulated gradient each store the bits dmrt_half.h
 * rounds their result to (want: the f32 results computed without the copy). */
static void copy16_case(dmrt_gpu *g, const char *what_prefix, int64_t rows, int64_t n, const float *want, int bf16,
                        const float *dsum, const float *dw, const float *db, const float *dx, const float *ddy, float eps) {
    const int64_t total = rows * n;
    uint16_t *got = xmalloc((size_t)total * sizeof(uint16_t)), *expect = xmalloc((size_t)total * sizeof(uint16_t));
    uint16_t *d16 = to_device(g, got, (size_t)total * sizeof(uint16_t));
    float *dout = device_floats(g, total), *dmade = device_floats(g, total);
    for (int64_t i = 0; i < total; i++) expect[i] = bf16 ? dmrt_bf16_round(want[i]) : dmrt_f16_round(want[i]);
    for (int form = 0; form < 2; form++) {
        if (form == 0) GPU_OK(g, dmrt_gpu_layernorm(g, dsum, dw, db, dout, d16, bf16, rows, n, eps));
        else GPU_OK(g, dmrt_gpu_add_layernorm(g, dx, ddy, dmade, dw, db, dout, d16, bf16, rows, n, eps));
        from_device(g, got, d16, (size_t)total * sizeof(uint16_t));
        int64_t bad = 0;
        for (int64_t i = 0; i < total; i++) bad += got[i] != expect[i];
        if (bad) fail("%s (%lld, %lld) %s copy (%s): %lld of %lld elements differ", what_prefix, (long long)rows,
                      (long long)n, bf16 ? "bf16" : "f16", form ? "with the add" : "alone", (long long)bad, (long long)total);
    }
    dmrt_gpu_free(g, d16);
    dmrt_gpu_free(g, dout);
    dmrt_gpu_free(g, dmade);
    free(got);
    free(expect);
}

static void layernorm_case(dmrt_gpu *g, int64_t rows, int64_t n, uint64_t seed) {
    const float eps = 1e-5f;
    const int64_t total = rows * n;
    float *x = host_floats(total), *dy = host_floats(total), *w = host_floats(n),
          *b = host_floats(n);
    float *want = host_floats(total), *got = host_floats(total);
    fill(x, total, seed, -2, 2);
    for (int64_t i = 0; i < total; i++) x[i] += (float)(i / n % 7);  /* rows with a mean */
    fill(dy, total, seed + 1, -1, 1);
    fill(w, n, seed + 2, 0.5f, 1.5f);
    fill(b, n, seed + 3, -0.5f, 0.5f);
    float *dx = to_device(g, x, (size_t)total * sizeof(float));
    float *ddy = to_device(g, dy, (size_t)total * sizeof(float));
    float *dw = to_device(g, w, (size_t)n * sizeof(float));
    float *db = to_device(g, b, (size_t)n * sizeof(float));
    float *dout = device_floats(g, total);
    char what[96];

    ref_layernorm(x, w, b, want, rows, n, eps);
    GPU_OK(g, dmrt_gpu_layernorm(g, dx, dw, db, dout, NULL, 0, rows, n, eps));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "layernorm (%lld, %lld)", (long long)rows, (long long)n);
    compare(what, got, want, total, 1e-5, 1e-5, 0);

    /* with a residual add made in the same kernel (x + dy here): the sum stored as the
     * host's float sum, the result as dmrt_gpu_layernorm's of that sum, to the bit */
    {
        float *sum = host_floats(total), *sum_got = host_floats(total), *plain = host_floats(total);
        for (int64_t i = 0; i < total; i++) sum[i] = x[i] + dy[i];
        float *dsum = device_floats(g, total), *dplain = device_floats(g, total);
        float *dsum_in = to_device(g, sum, (size_t)total * sizeof(float));
        GPU_OK(g, dmrt_gpu_layernorm(g, dsum_in, dw, db, dplain, NULL, 0, rows, n, eps));
        GPU_OK(g, dmrt_gpu_add_layernorm(g, dx, ddy, dsum, dw, db, dout, NULL, 0, rows, n, eps));
        from_device(g, sum_got, dsum, (size_t)total * sizeof(float));
        from_device(g, got, dout, (size_t)total * sizeof(float));
        from_device(g, plain, dplain, (size_t)total * sizeof(float));
        snprintf(what, sizeof what, "add_layernorm (%lld, %lld) sum", (long long)rows, (long long)n);
        compare_bits(what, sum_got, sum, total);
        snprintf(what, sizeof what, "add_layernorm (%lld, %lld) result", (long long)rows, (long long)n);
        compare_bits(what, got, plain, total);
        copy16_case(g, "add_layernorm", rows, n, plain, 1, dsum_in, dw, db, dx, ddy, eps);
        copy16_case(g, "add_layernorm", rows, n, plain, 0, dsum_in, dw, db, dx, ddy, eps);
        dmrt_gpu_free(g, dsum);
        dmrt_gpu_free(g, dplain);
        dmrt_gpu_free(g, dsum_in);
        free(sum);
        free(sum_got);
        free(plain);
    }

    ref_layernorm_grad(x, w, dy, want, rows, n, eps);
    GPU_OK(g, dmrt_gpu_layernorm_grad(g, dx, dw, ddy, dout, 0, NULL, 0, rows, n, eps));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "layernorm_grad (%lld, %lld)", (long long)rows, (long long)n);
    compare(what, got, want, total, 1e-4, 1e-5, 0);

    /* accumulated into a residual's gradient (x here): each element the float sum of the
     * residual's and the gradient just read back, to the bit */
    {
        float *sum_got = host_floats(total), *sum_want = host_floats(total);
        for (int64_t i = 0; i < total; i++) sum_want[i] = x[i] + got[i];
        float *dsum = to_device(g, x, (size_t)total * sizeof(float));
        GPU_OK(g, dmrt_gpu_layernorm_grad(g, dx, dw, ddy, dsum, 1, NULL, 0, rows, n, eps));
        from_device(g, sum_got, dsum, (size_t)total * sizeof(float));
        snprintf(what, sizeof what, "layernorm_grad (%lld, %lld) accumulated", (long long)rows, (long long)n);
        compare_bits(what, sum_got, sum_want, total);
        /* and its f16 copy, of the accumulated sum */
        uint16_t *half = xmalloc((size_t)total * sizeof(uint16_t));
        uint16_t *dhalf = to_device(g, half, (size_t)total * sizeof(uint16_t));
        float *dsum2 = to_device(g, x, (size_t)total * sizeof(float));
        GPU_OK(g, dmrt_gpu_layernorm_grad(g, dx, dw, ddy, dsum2, 1, dhalf, 0, rows, n, eps));
        from_device(g, half, dhalf, (size_t)total * sizeof(uint16_t));
        int64_t bad = 0;
        for (int64_t i = 0; i < total; i++) bad += half[i] != dmrt_f16_round(sum_want[i]);
        if (bad) fail("layernorm_grad (%lld, %lld) accumulated f16 copy: %lld of %lld elements differ", (long long)rows,
                      (long long)n, (long long)bad, (long long)total);
        dmrt_gpu_free(g, dhalf);
        dmrt_gpu_free(g, dsum2);
        free(half);
        dmrt_gpu_free(g, dsum);
        free(sum_got);
        free(sum_want);
    }

    /* sums over rows in another grouping: relative to the size of the sum */
    float *got2 = host_floats(n);
    float *dscratch = device_floats(g, dmrt_cuda_layernorm_wgrad_scratch_floats(rows, n));
    ref_layernorm_wgrad(x, dy, want, rows, n, eps);
    GPU_OK(g, dmrt_gpu_layernorm_wgrad(g, dx, ddy, dout, NULL, rows, n, eps, dscratch));
    from_device(g, got, dout, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "layernorm_wgrad (%lld, %lld)", (long long)rows, (long long)n);
    compare(what, got, want, n, 1e-4, 1e-5 * sqrt((double)rows), 0);
    GPU_OK(g, dmrt_gpu_zero(g, dout, (size_t)n * sizeof(float)));
    GPU_OK(g, dmrt_gpu_layernorm_wgrad(g, dx, ddy, dout, NULL, rows, n, eps, dscratch));
    from_device(g, got2, dout, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "layernorm_wgrad (%lld, %lld) run twice", (long long)rows,
             (long long)n);
    compare_bits(what, got2, got, n);

    /* with the bias's gradient in the same passes: the weight's unchanged to the bit, the
     * bias's the plain sum over rows of dy (in double here) */
    float *dbias = device_floats(g, n), *bias_got = host_floats(n), *bias_want = host_floats(n);
    for (int64_t j = 0; j < n; j++) {
        double sum = 0.0;
        for (int64_t r = 0; r < rows; r++) sum += dy[r * n + j];
        bias_want[j] = (float)sum;
    }
    GPU_OK(g, dmrt_gpu_zero(g, dout, (size_t)n * sizeof(float)));
    GPU_OK(g, dmrt_gpu_layernorm_wgrad(g, dx, ddy, dout, dbias, rows, n, eps, dscratch));
    from_device(g, got2, dout, (size_t)n * sizeof(float));
    from_device(g, bias_got, dbias, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "layernorm_wgrad (%lld, %lld) with the bias's", (long long)rows,
             (long long)n);
    compare_bits(what, got2, got, n);
    snprintf(what, sizeof what, "layernorm_wgrad (%lld, %lld) the bias's gradient", (long long)rows,
             (long long)n);
    compare(what, bias_got, bias_want, n, 1e-4, 1e-5 * sqrt((double)rows), 0);
    dmrt_gpu_free(g, dbias);
    free(bias_got);
    free(bias_want);

    dmrt_gpu_free(g, dscratch);
    dmrt_gpu_free(g, dx);
    dmrt_gpu_free(g, ddy);
    dmrt_gpu_free(g, dw);
    dmrt_gpu_free(g, db);
    dmrt_gpu_free(g, dout);
    free(x);
    free(dy);
    free(w);
    free(b);
    free(want);
    free(got);
    free(got2);
}

static void test_layernorm(dmrt_gpu *g) {
    layernorm_case(g, 64, 768, 400);
    layernorm_case(g, 8, 5000, 410);
    layernorm_case(g, 300, 64, 420);    /* wgrad over 2 chunks of rows */
    layernorm_case(g, 3000, 32, 430);   /* wgrad over 12 chunks */
    layernorm_case(g, 5, 3, 440);
}

/* ---- cross-entropy ---------------------------------------------------------------------------- */

static void xent_case(dmrt_gpu *g, int64_t rows, int64_t classes, int64_t mean_rows, int bad) {
    const int64_t total = rows * classes;
    float *logits = host_floats(total), *want = host_floats(total), *got = host_floats(total);
    int32_t *targets = xmalloc((size_t)rows * sizeof(int32_t));
    fill(logits, total, 500 + (uint64_t)classes, -6, 6);
    fill_ids(targets, rows, 510 + (uint64_t)classes, (int32_t)classes);
    if (bad) {
        targets[3] = -1;
        targets[7] = (int32_t)classes;
    }
    float *dl = to_device(g, logits, (size_t)total * sizeof(float));
    int32_t *dt = to_device(g, targets, (size_t)rows * sizeof(int32_t));
    float *dout = device_floats(g, total), *dstats = device_floats(g, rows * 3);
    float *dloss = device_floats(g, 1);
    float *stats = host_floats(rows * 3), *want_stats = host_floats(rows * 3);
    char what[128];

    GPU_OK(g, dmrt_gpu_xent_stats(g, dl, dt, dstats, rows, classes, 5, 0));
    from_device(g, stats, dstats, (size_t)rows * 3 * sizeof(float));
    ref_xent_stats(logits, targets, want_stats, rows, classes);
    snprintf(what, sizeof what, "xent_stats (%lld, %lld)%s", (long long)rows, (long long)classes,
             bad ? " with 2 bad targets" : "");
    /* maxima and target logits exact; double sums in another order, rounded to float */
    compare(what, stats, want_stats, rows * 3, 1e-6, 0, 0);
    const float want_loss = ref_xent(logits, targets, rows, classes, mean_rows);
    float loss = 0, loss2 = 0;
    GPU_OK(g, dmrt_gpu_cross_entropy(g, dstats, dloss, rows, mean_rows));
    from_device(g, &loss, dloss, sizeof loss);
    snprintf(what, sizeof what, "cross_entropy (%lld, %lld) / %lld%s", (long long)rows,
             (long long)classes, (long long)mean_rows, bad ? " with 2 bad targets" : "");
    /* double sums in another order, each row's rounded to float: the float loss agrees to
     * its last bits */
    compare(what, &loss, &want_loss, 1, 2e-6, 1e-7, 0);
    GPU_OK(g, dmrt_gpu_cross_entropy(g, dstats, dloss, rows, mean_rows));
    from_device(g, &loss2, dloss, sizeof loss2);
    CHECK(memcmp(&loss, &loss2, sizeof loss) == 0, "%s: run twice gave %.9g then %.9g", what,
          (double)loss, (double)loss2);
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    if (bad)
        CHECK(f.site == 5 && (f.position == 3 || f.position == 7) &&
                  f.value == targets[f.position],
              "%s: fault site %d value %d position %lld", what, f.site, f.value,
              (long long)f.position);
    else
        CHECK(f.site == 0, "%s: unexpected fault site %d position %lld", what, f.site,
              (long long)f.position);
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    CHECK(f.site == 0, "%s: the fault was not cleared by the first take", what);

    /* dloss given as a value, then as a device scalar */
    ref_xent_grad(logits, targets, 1.5f, want, rows, classes, mean_rows);
    GPU_OK(g, dmrt_gpu_cross_entropy_grad(g, dl, dt, dstats, NULL, 1.5f, dout, rows, classes, 0,
                                          classes, mean_rows));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "cross_entropy_grad (%lld, %lld)%s", (long long)rows,
             (long long)classes, bad ? " with 2 bad targets" : "");
    /* probabilities agree to a float ulp; at the target, p * scale - scale cancels */
    compare(what, got, want, total, 1e-6, 1e-8, 0);
    const float two = 2.0f;
    GPU_OK(g, dmrt_gpu_copy(g, dloss, &two, sizeof two, DMRT_HOST_TO_DEVICE));
    ref_xent_grad(logits, targets, 2.0f, want, rows, classes, mean_rows);
    GPU_OK(g, dmrt_gpu_cross_entropy_grad(g, dl, dt, dstats, dloss, 0.0f, dout, rows, classes, 0,
                                          classes, mean_rows));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "cross_entropy_grad (%lld, %lld), dloss on the device",
             (long long)rows, (long long)classes);
    compare(what, got, want, total, 1e-6, 1e-8, 0);

    /* written in 16 bits only: each value the f32 gradient's (got, just read back) rounded */
    uint16_t *half = xmalloc((size_t)total * sizeof(uint16_t));
    uint16_t *dhalf = to_device(g, half, (size_t)total * sizeof(uint16_t));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        GPU_OK(g, dmrt_gpu_cross_entropy_grad_half(g, bf16, dl, dt, dstats, dloss, 0.0f, dhalf, rows,
                                                   classes, 0, classes, mean_rows));
        from_device(g, half, dhalf, (size_t)total * sizeof(uint16_t));
        int64_t differ = 0;
        for (int64_t i = 0; i < total; i++)
            differ += half[i] != (bf16 ? dmrt_bf16_round(got[i]) : dmrt_f16_round(got[i]));
        CHECK(differ == 0, "cross_entropy_grad_half (%lld, %lld) %s: %lld of %lld values are not the f32 "
              "gradient rounded", (long long)rows, (long long)classes, bf16 ? "bf16" : "f16",
              (long long)differ, (long long)total);
    }
    dmrt_gpu_free(g, dhalf);
    free(half);

    /* written over the logits (pass_memory's xent_grad_over_logits): the same bits */
    float *over = host_floats(total);
    GPU_OK(g, dmrt_gpu_cross_entropy_grad(g, dl, dt, dstats, dloss, 0.0f, dl, rows, classes, 0, classes, mean_rows));
    from_device(g, over, dl, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "cross_entropy_grad (%lld, %lld) over its logits", (long long)rows, (long long)classes);
    compare_bits(what, over, got, total);
    free(over);

    dmrt_gpu_free(g, dl);
    dmrt_gpu_free(g, dt);
    dmrt_gpu_free(g, dout);
    dmrt_gpu_free(g, dstats);
    dmrt_gpu_free(g, dloss);
    free(logits);
    free(want);
    free(got);
    free(stats);
    free(want_stats);
    free(targets);
}

static void test_xent(dmrt_gpu *g) {
    xent_case(g, 16, 50304, 16, 0);
    xent_case(g, 16, 50304, 32, 1);
    xent_case(g, 37, 10, 74, 0);
    xent_case(g, 300, 1000, 300, 1);
}

/* ---- embedding ---------------------------------------------------------------------------------- */

static void embed_case(dmrt_gpu *g, int64_t rows, int64_t cols, int64_t vocab, int64_t n,
                       int64_t first_row, int bad) {
    const int64_t total = rows * cols;
    float *table = host_floats(n * cols), *dy = host_floats(total);
    float *want = host_floats(total > n * cols ? total : n * cols);
    float *got = host_floats(total > n * cols ? total : n * cols), *got2 = host_floats(n * cols);
    int32_t *ids = xmalloc((size_t)rows * sizeof(int32_t));
    fill(table, n * cols, 600, -1, 1);
    fill(dy, total, 610, -1, 1);
    fill_ids(ids, rows, 620 + (uint64_t)rows, (int32_t)vocab);
    if (bad) {
        ids[1] = (int32_t)vocab;
        ids[4] = -3;
    }
    float *dtable = to_device(g, table, (size_t)(n * cols) * sizeof(float));
    float *ddy = to_device(g, dy, (size_t)total * sizeof(float));
    int32_t *dids = to_device(g, ids, (size_t)rows * sizeof(int32_t));
    float *dout = device_floats(g, total > n * cols ? total : n * cols);
    char what[128];

    ref_embed(table, ids, want, rows, n, cols, vocab, first_row);
    GPU_OK(g, dmrt_gpu_embed(g, dtable, dids, dout, rows, n, cols, vocab, first_row, 3, 0));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "embed %lld ids of %lld, rows [%lld, %lld), %lld cols%s",
             (long long)rows, (long long)vocab, (long long)first_row, (long long)(first_row + n),
             (long long)cols, bad ? ", 2 bad ids" : "");
    compare_bits(what, got, want, total);
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    if (bad)
        CHECK(f.site == 3 && (f.position == 1 || f.position == 4) && f.value == ids[f.position],
              "%s: fault site %d value %d position %lld", what, f.site, f.value,
              (long long)f.position);
    else
        CHECK(f.site == 0, "%s: unexpected fault site %d", what, f.site);

    /* the scratch one float past an allocation's start: the kernel aligns it itself */
    const size_t scratch_bytes = dmrt_gpu_embed_grad_scratch(rows);
    void *scratch = NULL;
    GPU_OK(g, dmrt_gpu_alloc(g, &scratch, scratch_bytes + 4));
    ref_embed_grad(ids, dy, want, rows, n, cols, first_row);
    GPU_OK(g, dmrt_gpu_embed_grad(g, dids, ddy, dout, rows, n, cols, first_row, 0,
                                  (char *)scratch + 4));
    from_device(g, got, dout, (size_t)(n * cols) * sizeof(float));
    snprintf(what, sizeof what, "embed_grad %lld positions into rows [%lld, %lld), %lld cols",
             (long long)rows, (long long)first_row, (long long)(first_row + n), (long long)cols);
    compare_bits(what, got, want, n * cols);
    GPU_OK(g, dmrt_gpu_embed_grad(g, dids, ddy, dout, rows, n, cols, first_row, 0,
                                  (char *)scratch + 4));
    from_device(g, got2, dout, (size_t)(n * cols) * sizeof(float));
    snprintf(what, sizeof what, "embed_grad %lld positions run twice", (long long)rows);
    compare_bits(what, got2, got, n * cols);
    /* accumulate (a micro-batches' sum made in place): each row's sum added to what out
     * holds, here the first run's result */
    for (int64_t i = 0; i < n * cols; i++) want[i] = got[i] + want[i];
    GPU_OK(g, dmrt_gpu_embed_grad(g, dids, ddy, dout, rows, n, cols, first_row, 1,
                                  (char *)scratch + 4));
    from_device(g, got2, dout, (size_t)(n * cols) * sizeof(float));
    snprintf(what, sizeof what, "embed_grad %lld positions added to the first run's", (long long)rows);
    compare_bits(what, got2, want, n * cols);

    dmrt_gpu_free(g, scratch);
    dmrt_gpu_free(g, dtable);
    dmrt_gpu_free(g, ddy);
    dmrt_gpu_free(g, dids);
    dmrt_gpu_free(g, dout);
    free(table);
    free(dy);
    free(want);
    free(got);
    free(got2);
    free(ids);
}

static void test_embed(dmrt_gpu *g) {
    embed_case(g, 500, 33, 100, 100, 0, 1);      /* whole table, bad ids */
    embed_case(g, 500, 33, 100, 30, 40, 0);      /* a rank's window of rows */
    embed_case(g, 4096, 65, 50, 50, 0, 0);       /* long runs of equal ids */
    embed_case(g, 4096, 65, 50, 20, 10, 1);      /* window + ids outside the vocabulary */
    embed_case(g, 3, 5, 1, 1, 0, 0);             /* a one-row table: 1-bit keys */
    embed_case(g, 20000, 96, 50304, 50304, 0, 0);  /* a GPT-2 vocabulary */
}

/* ---- optimizers ------------------------------------------------------------------------------- */

static void sgd_case(dmrt_gpu *g, float wd, float momentum, float damp, int nesterov) {
    const int64_t n = 10007;
    const float lr = 0.05f;
    float *p = host_floats(n), *grad = host_floats(n), *buf = host_floats(n);
    float *got = host_floats(n);
    fill(p, n, 700, -1, 1);
    float *dp = to_device(g, p, (size_t)n * sizeof(float));
    float *dbuf = momentum != 0.0f ? device_floats(g, n) : NULL;
    float *dg = device_floats(g, n);
    char what[128];
    for (int64_t step = 1; step <= 3; step++) {
        fill(grad, n, 710 + (uint64_t)step, -1, 1);
        GPU_OK(g, dmrt_gpu_copy(g, dg, grad, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        ref_sgd(p, grad, dbuf ? buf : NULL, n, lr, wd, momentum, damp, nesterov, step);
        GPU_OK(g, dmrt_gpu_sgd(g, dp, dg, dbuf, n, lr, wd, momentum, damp, nesterov, step));
    }
    from_device(g, got, dp, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "sgd wd %g momentum %g (1 - dampening) %g nesterov %d, 3 steps",
             (double)wd, (double)momentum, (double)damp, nesterov);
    compare_bits(what, got, p, n);
    if (dbuf) {
        from_device(g, got, dbuf, (size_t)n * sizeof(float));
        compare_bits("  its momentum buffer", got, buf, n);
    }
    dmrt_gpu_free(g, dp);
    dmrt_gpu_free(g, dbuf);
    dmrt_gpu_free(g, dg);
    free(p);
    free(grad);
    free(buf);
    free(got);
}

static void test_adamw(dmrt_gpu *g) {
    const int64_t n = 10007;
    const double lr = 1e-3, wd = 0.1, b1 = 0.9, b2 = 0.999;
    const float eps = 1e-8f;
    float *p = host_floats(n), *grad = host_floats(n), *m = host_floats(n), *v = host_floats(n);
    float *got = host_floats(n);
    fill(p, n, 800, -1, 1);
    float *dp = to_device(g, p, (size_t)n * sizeof(float));
    float *dg = device_floats(g, n), *dm = device_floats(g, n), *dv = device_floats(g, n);
    for (int step = 1; step <= 3; step++) {
        fill(grad, n, 810 + (uint64_t)step, -1, 1);
        GPU_OK(g, dmrt_gpu_copy(g, dg, grad, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        /* the caller's scalars, in double as the C target computes them */
        const float decay = (float)(1.0 - lr * wd);
        const float step_size = (float)(lr / (1.0 - pow(b1, (double)step)));
        const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)step));
        ref_adamw(p, grad, m, v, n, (float)b1, (float)(1.0 - b1), (float)b2, (float)(1.0 - b2),
                  eps, decay, step_size, bc2_sqrt);
        GPU_OK(g, dmrt_gpu_adamw(g, dp, dg, dm, dv, n, (float)b1, (float)(1.0 - b1), (float)b2,
                                 (float)(1.0 - b2), eps, decay, step_size, bc2_sqrt));
    }
    from_device(g, got, dp, (size_t)n * sizeof(float));
    compare_bits("adamw, 3 steps: parameters", got, p, n);
    from_device(g, got, dm, (size_t)n * sizeof(float));
    compare_bits("adamw, 3 steps: first moments", got, m, n);
    from_device(g, got, dv, (size_t)n * sizeof(float));
    compare_bits("adamw, 3 steps: second moments", got, v, n);
    dmrt_gpu_free(g, dp);
    dmrt_gpu_free(g, dg);
    dmrt_gpu_free(g, dm);
    dmrt_gpu_free(g, dv);
    free(p);
    free(grad);
    free(m);
    free(v);
    free(got);
}

static void test_optim(dmrt_gpu *g) {
    sgd_case(g, 0.0f, 0.0f, 1.0f, 0);
    sgd_case(g, 0.01f, 0.9f, 1.0f, 0);
    sgd_case(g, 0.01f, 0.9f, 0.75f, 0);
    sgd_case(g, 0.0f, 0.9f, 1.0f, 1);
    test_adamw(g);
}

int main(void) {
    char err[512];
    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_AUTO, NULL};
    dmrt_gpu *g = dmrt_gpu_create(NULL, &opt, err, sizeof err);
    if (!g) {
        const char *prefix = "no CUDA device: ";
        if (strncmp(err, prefix, strlen(prefix)) == 0) {
            printf("SKIP: no CUDA device (%s)\n", err + strlen(prefix));
            return 77;
        }
        printf("FAIL: dmrt_gpu_create: %s\n", err);
        return 1;
    }
    test_memory(g);
    test_sgemm(g);
    test_gemm_epilogue(g);
    test_softmax(g);
    test_layernorm(g);
    test_xent(g);
    test_embed(g);
    test_optim(g);
    dmrt_gpu_destroy(g);
    test_ranks();
    test_nccl_one_rank();
    int n = atomic_load(&test_failures);
    printf("%s: %d failed checks\n", n ? "FAILED" : "passed", n);
    return n ? 1 : 0;
}
