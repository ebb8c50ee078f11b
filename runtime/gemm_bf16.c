/* gemm_bf16.c: products of bf16 matrices into fp32 (dmrt.h, "bf16 products"): oneDNN's
 * matmul where the CPU multiplies bf16 itself (AVX512-BF16), else the operands widened to
 * fp32 and dmrt_sgemm. Both compute the same thing: products of the bf16 values, summed in
 * fp32; only the order of the sums differs. */
#include "dmrt.h"
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef DMRT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

void dmrt_f32_to_bf16_array(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = dmrt_bf16_round(x[i]);
}

void dmrt_bf16_to_f32_array(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = dmrt_bf16_to_f32(x[i]);
}

enum { PATH_CONVERT, PATH_ONEDNN };
static const char *const path_names[] = {"convert + OpenBLAS sgemm", "oneDNN AVX512-BF16"};

/* ---- per-thread state ---------------------------------------------------------------------- */

#ifdef DMRT_HAVE_DNNL
/* One shape's primitive and the memory objects it runs on (their pointers are set per call). */
typedef struct {
    int trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    dnnl_primitive_t primitive; /* NULL: oneDNN refused the shape */
    dnnl_memory_t mem_a, mem_b, mem_c;
} onednn_entry;

/* Enough for a model's distinct products (a GPT block has a handful, forward and backward);
 * past it the oldest is replaced. */
#define ONEDNN_CACHE_SLOTS 64
#endif

/* Each thread keeps its own: oneDNN's streams and scratchpads are not meant to be shared by
 * threads running at once, and rank threads then take no lock per product. */
typedef struct {
#ifdef DMRT_HAVE_DNNL
    dnnl_stream_t stream;
    onednn_entry entries[ONEDNN_CACHE_SLOTS];
    int used, next_replaced;
#endif
    dmrt_float_buffer scratch; /* the convert path's fp32 operands */
} thread_state;

static pthread_key_t state_key;
static pthread_once_t state_key_once = PTHREAD_ONCE_INIT;

static void free_state(void *p) {
    thread_state *s = p;
    if (!s) return;
#ifdef DMRT_HAVE_DNNL
    for (int i = 0; i < s->used; i++) {
        onednn_entry *e = &s->entries[i];
        if (e->primitive) dnnl_primitive_destroy(e->primitive);
        if (e->mem_a) dnnl_memory_destroy(e->mem_a);
        if (e->mem_b) dnnl_memory_destroy(e->mem_b);
        if (e->mem_c) dnnl_memory_destroy(e->mem_c);
    }
    if (s->stream) dnnl_stream_destroy(s->stream);
#endif
    free(s->scratch.floats);
    free(s);
}

static void make_state_key(void) {
    if (pthread_key_create(&state_key, free_state) != 0) {
        fprintf(stderr, "dmrt_gemm_bf16: cannot create the per-thread key\n");
        abort();
    }
}

static thread_state *this_thread_state(void) {
    (void)pthread_once(&state_key_once, make_state_key);
    thread_state *s = pthread_getspecific(state_key);
    if (s) return s;
    s = calloc(1, sizeof *s);
    if (!s || pthread_setspecific(state_key, s) != 0) {
        fprintf(stderr, "dmrt_gemm_bf16: out of memory for the thread's state\n");
        abort();
    }
    return s;
}

void dmrt_gemm_bf16_release(void) {
    (void)pthread_once(&state_key_once, make_state_key);
    thread_state *s = pthread_getspecific(state_key);
    if (!s) return;
    (void)pthread_setspecific(state_key, NULL);
    free_state(s);
}

/* ---- which path ------------------------------------------------------------------------------ */

#ifdef DMRT_HAVE_DNNL
static dnnl_engine_t engine;
#endif
static int onednn_available;
static int chosen_path;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

#ifdef DMRT_HAVE_DNNL
static int cpu_has_avx512_bf16(void) { return DMRT_CPU_SUPPORTS("avx512bf16"); }
#endif

/* Apart from choose_path, so that asking whether oneDNN could run never ends the process. */
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static void detect_onednn(void) {
#ifdef DMRT_HAVE_DNNL
    /* valgrind's CPU hides AVX-512, which it cannot run: under it this is the convert path */
    onednn_available = cpu_has_avx512_bf16() && dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success;
#endif
}

static void choose_path(void) {
    (void)pthread_once(&detect_once, detect_onednn);
    const char *forced = getenv("DMRT_BF16_GEMM");
    if (!forced || !*forced) {
        chosen_path = onednn_available ? PATH_ONEDNN : PATH_CONVERT;
    } else if (strcmp(forced, "convert") == 0) {
        chosen_path = PATH_CONVERT;
    } else if (strcmp(forced, "onednn") == 0) {
        if (!onednn_available) {
#ifdef DMRT_HAVE_DNNL
            const char *why = cpu_has_avx512_bf16() ? "oneDNN could not create its CPU engine"
                                                    : "this CPU has no AVX512-BF16";
#else
            const char *why = "libdmrt was built without oneDNN (libdnnl-dev)";
#endif
            fprintf(stderr, "DMRT_BF16_GEMM=onednn: the oneDNN bf16 path is unavailable: %s\n", why);
            exit(1);
        }
        chosen_path = PATH_ONEDNN;
    } else {
        fprintf(stderr, "DMRT_BF16_GEMM=%s: expected onednn or convert\n", forced);
        exit(1);
    }
}

static int path(void) {
    (void)pthread_once(&choose_once, choose_path);
    return chosen_path;
}

const char *dmrt_gemm_bf16_path(void) { return path_names[path()]; }

int dmrt_gemm_bf16_onednn_available(void) {
    (void)pthread_once(&detect_once, detect_onednn);
    return onednn_available;
}

/* ---- the convert path ---------------------------------------------------------------------- */

/* threads == 0: dmrt_sgemm, else dmrt_sgemm_split over that many. The fp32 copies live in
 * the calling thread's buffer, grown to the largest product seen (a buffer per call would
 * map and fault in megabytes per product of a GPT layer). */
typedef void widen_fn(const uint16_t *x, float *y, int64_t n);

static void gemm_widened(widen_fn *widen, int threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
    if (k <= 0 || alpha == 0.0f) {
        /* the operands are not read: dmrt_sgemm only scales C */
        if (threads > 0)
            dmrt_sgemm_split(threads, trans_a, trans_b, m, n, k, alpha, NULL, lda, NULL, ldb, beta, c, ldc);
        else
            dmrt_sgemm(trans_a, trans_b, m, n, k, alpha, NULL, lda, NULL, ldb, beta, c, ldc);
        return;
    }
    int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    size_t need = (size_t)(a_rows * a_cols + b_rows * b_cols);
    thread_state *s = this_thread_state();
    float *a32 = dmrt_float_buffer_reserve(&s->scratch, need, "dmrt_gemm_bf16"), *b32 = a32 + a_rows * a_cols;
    /* the stored rows, each widened into a contiguous copy (row stride: its width) */
    int workers = threads > 1 ? threads : 1;
    (void)workers; /* unused without OpenMP */
    DMRT_PARALLEL_FOR(workers)
    for (int64_t r = 0; r < a_rows; r++) widen(a + r * lda, a32 + r * a_cols, a_cols);
    DMRT_PARALLEL_FOR(workers)
    for (int64_t r = 0; r < b_rows; r++) widen(b + r * ldb, b32 + r * b_cols, b_cols);
    if (threads > 0)
        dmrt_sgemm_split(threads, trans_a, trans_b, m, n, k, alpha, a32, a_cols, b32, b_cols, beta, c, ldc);
    else
        dmrt_sgemm(trans_a, trans_b, m, n, k, alpha, a32, a_cols, b32, b_cols, beta, c, ldc);
}

static void gemm_convert(int threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                         int64_t ldc) {
    gemm_widened(dmrt_bf16_to_f32_array, threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* ---- the oneDNN path ------------------------------------------------------------------------ */

#ifdef DMRT_HAVE_DNNL
/* oneDNN runs on the calling thread alone (DMRT_ONEDNN_ONE_THREAD_BEGIN, internal.h), and
 * dmrt_gemm_bf16_split shares a product over a rank's own threads. */
#define ONE_THREAD_BEGIN() DMRT_ONEDNN_ONE_THREAD_BEGIN()
#define ONE_THREAD_END() DMRT_ONEDNN_ONE_THREAD_END()

static int make_memory(dnnl_memory_t *mem, int64_t rows, int64_t cols, int trans, int64_t ld,
                       dnnl_data_type_t type) {
    dnnl_dims_t dims = {rows, cols};
    /* op(X) is rows x cols; X^T stored row-major is op(X) with its strides swapped */
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    dnnl_memory_desc_t md;
    if (dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides) != dnnl_success) return -1;
    return dnnl_memory_create(mem, &md, engine, DNNL_MEMORY_NONE) == dnnl_success ? 0 : -1;
}

/* Builds e's primitive for its shape; 0, or -1 when oneDNN refuses it (e then holds what
 * was made, freed with the entry). */
static int build_entry(onednn_entry *e) {
    if (make_memory(&e->mem_a, e->m, e->k, e->trans_a, e->lda, dnnl_bf16) != 0 ||
        make_memory(&e->mem_b, e->k, e->n, e->trans_b, e->ldb, dnnl_bf16) != 0 ||
        make_memory(&e->mem_c, e->m, e->n, 0, e->ldc, dnnl_f32) != 0)
        return -1;
    const dnnl_memory_desc_t *md_a, *md_b, *md_c;
    if (dnnl_memory_get_memory_desc(e->mem_a, &md_a) != dnnl_success ||
        dnnl_memory_get_memory_desc(e->mem_b, &md_b) != dnnl_success ||
        dnnl_memory_get_memory_desc(e->mem_c, &md_c) != dnnl_success)
        return -1;
    dnnl_matmul_desc_t desc;
    if (dnnl_matmul_desc_init(&desc, md_a, md_b, NULL, md_c) != dnnl_success) return -1;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_primitive_attr_create(&attr) == dnnl_success;
    /* alpha scales the product; beta * C is added by a sum post-op, which reads C only
     * when there is one (beta == 0: C may hold NaN, as in BLAS) */
    if (ok && e->alpha != 1.0f) ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &e->alpha) == dnnl_success;
    if (ok && e->beta != 0.0f) {
        ok = dnnl_post_ops_create(&post_ops) == dnnl_success &&
             dnnl_post_ops_append_sum(post_ops, e->beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, post_ops) == dnnl_success;
    }
    ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL) == dnnl_success;
    ok = ok && dnnl_primitive_create(&e->primitive, pd) == dnnl_success;
    if (!ok) e->primitive = NULL;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok ? 0 : -1;
}

static onednn_entry *find_entry(thread_state *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, int64_t lda, int64_t ldb, float beta, int64_t ldc) {
    for (int i = 0; i < s->used; i++) {
        onednn_entry *e = &s->entries[i];
        if (e->trans_a == trans_a && e->trans_b == trans_b && e->m == m && e->n == n && e->k == k &&
            e->lda == lda && e->ldb == ldb && e->ldc == ldc && e->alpha == alpha && e->beta == beta)
            return e;
    }
    onednn_entry *e;
    if (s->used < ONEDNN_CACHE_SLOTS) {
        e = &s->entries[s->used++];
    } else {
        e = &s->entries[s->next_replaced];
        s->next_replaced = (s->next_replaced + 1) % ONEDNN_CACHE_SLOTS;
        if (e->primitive) dnnl_primitive_destroy(e->primitive);
        if (e->mem_a) dnnl_memory_destroy(e->mem_a);
        if (e->mem_b) dnnl_memory_destroy(e->mem_b);
        if (e->mem_c) dnnl_memory_destroy(e->mem_c);
    }
    *e = (onednn_entry){trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, NULL, NULL, NULL, NULL};
    (void)build_entry(e);
    return e;
}

/* One product on the calling thread: 0, or -1 when oneDNN refused the shape (C untouched). */
static int gemm_onednn(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                       int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    thread_state *s = this_thread_state();
    ONE_THREAD_BEGIN();
    int ok = s->stream || dnnl_stream_create(&s->stream, engine, dnnl_stream_default_flags) == dnnl_success;
    onednn_entry *e = ok ? find_entry(s, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc) : NULL;
    ok = e && e->primitive;
    if (ok) {
        /* oneDNN takes the handles as void *; it writes only the destination */
        ok = dnnl_memory_set_data_handle(e->mem_a, (void *)(uintptr_t)a) == dnnl_success &&
             dnnl_memory_set_data_handle(e->mem_b, (void *)(uintptr_t)b) == dnnl_success &&
             dnnl_memory_set_data_handle(e->mem_c, c) == dnnl_success;
    }
    if (ok) {
        dnnl_exec_arg_t args[] = {
            {DNNL_ARG_SRC, e->mem_a}, {DNNL_ARG_WEIGHTS, e->mem_b}, {DNNL_ARG_DST, e->mem_c}};
        ok = dnnl_primitive_execute(e->primitive, s->stream, 3, args) == dnnl_success &&
             dnnl_stream_wait(s->stream) == dnnl_success;
        if (!ok) {
            /* C may be half written: no quiet fallback could repair it */
            fprintf(stderr, "dmrt_gemm_bf16: oneDNN's matmul failed on %lld x %lld x %lld\n", (long long)m,
                    (long long)n, (long long)k);
            abort();
        }
    }
    ONE_THREAD_END();
    return ok ? 0 : -1;
}

/* One product on the calling thread by oneDNN, or, for a shape it refuses, by the convert
 * path, unless DMRT_BF16_GEMM=onednn asked for oneDNN alone (the tests that force it must
 * not pass on the other path). */
static void gemm_onednn_or_convert(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                   const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                                   float *c, int64_t ldc) {
    if (gemm_onednn(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == 0) return;
    const char *forced = getenv("DMRT_BF16_GEMM");
    if (forced && strcmp(forced, "onednn") == 0) {
        fprintf(stderr, "DMRT_BF16_GEMM=onednn: oneDNN refused the bf16 matmul %lld x %lld x %lld\n", (long long)m,
                (long long)n, (long long)k);
        exit(1);
    }
    gemm_convert(0, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

/* ---- the products ---------------------------------------------------------------------------- */

void dmrt_gemm_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                    int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
#ifdef DMRT_HAVE_DNNL
    if (path() == PATH_ONEDNN && k > 0 && alpha != 0.0f) {
        double t0 = dmrt_blas_time_on() ? dmrt_now() : 0;
        gemm_onednn_or_convert(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        if (dmrt_blas_time_on()) dmrt_blas_count_product(m, n, k, t0);
        return;
    }
#endif
    gemm_convert(0, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#ifdef DMRT_HAVE_DNNL
/* The oneDNN product in `panels` panels on the threads, with or without a bias, as
 * dmrt_sgemm_split cuts them (blas.c's sgemm_panels); timed whole, by the calling thread. */
static void onednn_panels(int panels, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, const float *bias,
                          float *c, int64_t ldc) {
    double t0 = dmrt_blas_time_on() ? dmrt_now() : 0;
    DMRT_PARALLEL_FOR(panels)
    for (int p = 0; p < panels; p++) {
        dmrt_panel q = dmrt_sgemm_panel(p, panels, trans_a, trans_b, m, n, lda, ldb, ldc);
        if (bias) dmrt_fill_bias_rows(q.m, q.n, bias + q.c % ldc, c + q.c, ldc);
        gemm_onednn_or_convert(trans_a, trans_b, q.m, q.n, k, alpha, a + q.a, lda, b + q.b, ldb, beta, c + q.c, ldc);
    }
    if (dmrt_blas_time_on()) dmrt_blas_count_product(m, n, k, t0);
}
#endif

void dmrt_gemm_bf16_split(int threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                          int64_t ldc) {
    if (m <= 0 || n <= 0) return;
#ifdef DMRT_HAVE_DNNL
    int panels = dmrt_sgemm_panels(threads, m, n, k);
    if (path() == PATH_ONEDNN && k > 0 && alpha != 0.0f && panels > 1) {
        onednn_panels(panels, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, NULL, c, ldc);
        return;
    }
    if (path() == PATH_ONEDNN && k > 0 && alpha != 0.0f) {
        dmrt_gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#endif
    gemm_convert(threads > 1 ? threads : 1, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void dmrt_gemm_bf16_bias_split(int threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                               const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, const float *bias,
                               float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
#ifdef DMRT_HAVE_DNNL
    int panels = dmrt_sgemm_panels(threads, m, n, k);
    if (path() == PATH_ONEDNN && k > 0 && panels > 1) {
        onednn_panels(panels, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, bias, c, ldc);
        return;
    }
#endif
    dmrt_fill_bias_rows(m, n, bias, c, ldc);
    dmrt_gemm_bf16_split(threads, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
}

/* ---- fp16 products --------------------------------------------------------------------------- */

void dmrt_f32_to_f16_array(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = dmrt_f16_round(x[i]);
}

void dmrt_f16_to_f32_array(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = dmrt_f16_to_f32(x[i]);
}

/* Widened for sgemm: this CPU kind has no fp16 arithmetic (AVX512-FP16 is Sapphire Rapids'),
 * and the products of the widened values are the fp16 products exactly. */
void dmrt_gemm_f16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                   int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    gemm_widened(dmrt_f16_to_f32_array, 0, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void dmrt_gemm_f16_split(int threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                         int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    gemm_widened(dmrt_f16_to_f32_array, threads > 0 ? threads : 1, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                 beta, c, ldc);
}
