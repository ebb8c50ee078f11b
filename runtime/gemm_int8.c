/* gemm_int8.c: the products of a --quantize int8 program (dmrt.h, "int8 products",
 * docs/compression.md): the left operand quantized per tensor with its calibrated scale,
 * the weight per output column, their int8 products summed in int32 by oneDNN's s8 x s8 ->
 * s32 matmul (AVX512-VNNI) or by plain C, and the sums scaled back to f32. Integer sums
 * are exact, so both paths give the same bits. While a calibration runs, the products
 * record |x| and multiply in f32 instead. */
#include "dmrt.h"
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DMRT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#define QX_MAX 127

/* The loops below are worth vectors that the baseline build's -O2 cost model leaves scalar
 * (widening int8, divisions, a branch on beta): omp simd asks for them. */
#ifdef _OPENMP
#define SIMD_LOOP DMRT_PRAGMA_(omp simd)
#else
#define SIMD_LOOP
#endif

/* 1.5 * 2^23: v + ROUNDER - ROUNDER is v rounded to an integer, ties to even (the default
 * rounding mode), for |v| <= 2^22, and keeps a larger v's sign and size, so the clamp after
 * it gives clamp(round(v)); unlike nearbyintf, which the runtime's baseline x86-64 calls in
 * libm, it vectorises. The comparisons are the quiet ones: ordered ones may trap on NaN,
 * which keeps them branches and the loop scalar. */
#define ROUNDER 12582912.0f

void dmrt_quantize_activations(const float *x, int64_t n, float scale, int8_t *q) {
    SIMD_LOOP
    for (int64_t i = 0; i < n; i++) {
        float v = (x[i] / scale + ROUNDER) - ROUNDER;
        v = isgreater(v, (float)QX_MAX) ? (float)QX_MAX : v;
        v = isless(v, (float)-QX_MAX) ? (float)-QX_MAX : v;
        v = isunordered(v, v) ? 0.0f : v; /* NaN: 0, not a conversion C leaves undefined */
        q[i] = (int8_t)(int)v;
    }
}

/* ---- per-thread state: oneDNN's stream and primitives, the operands' buffers ---------------- */

#ifdef DMRT_HAVE_DNNL
typedef struct {
    int64_t m, n, k;
    dnnl_primitive_t primitive; /* NULL: oneDNN refused the shape */
    dnnl_memory_t mem_a, mem_b, mem_c;
} s8_entry;
#define S8_CACHE_SLOTS 32
#endif

typedef struct {
#ifdef DMRT_HAVE_DNNL
    dnnl_stream_t stream;
    s8_entry entries[S8_CACHE_SLOTS];
    int used, next_replaced;
#endif
    int8_t *qa;
    int32_t *acc;
    size_t qa_bytes, acc_count;
} i8_state;

static pthread_key_t state_key;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;

#ifdef DMRT_HAVE_DNNL
static void drop_entry(s8_entry *e) {
    if (e->primitive) dnnl_primitive_destroy(e->primitive);
    if (e->mem_a) dnnl_memory_destroy(e->mem_a);
    if (e->mem_b) dnnl_memory_destroy(e->mem_b);
    if (e->mem_c) dnnl_memory_destroy(e->mem_c);
}
#endif

static void free_state(void *p) {
    i8_state *s = p;
    if (!s) return;
#ifdef DMRT_HAVE_DNNL
    for (int i = 0; i < s->used; i++) drop_entry(&s->entries[i]);
    if (s->stream) dnnl_stream_destroy(s->stream);
#endif
    free(s->qa);
    free(s->acc);
    free(s);
}

static void make_state_key(void) {
    if (pthread_key_create(&state_key, free_state) != 0) abort();
}

static void out_of_memory(const char *what) {
    fprintf(stderr, "dmrt_gemm_i8: out of memory for %s\n", what);
    abort();
}

static i8_state *this_thread_state(size_t qa_bytes, size_t acc_count) {
    (void)pthread_once(&state_once, make_state_key);
    i8_state *s = pthread_getspecific(state_key);
    if (!s && (!(s = calloc(1, sizeof *s)) || pthread_setspecific(state_key, s) != 0)) out_of_memory("its state");
    if (s->qa_bytes < qa_bytes) {
        free(s->qa);
        if (!(s->qa = malloc(qa_bytes))) out_of_memory("the quantized activations");
        s->qa_bytes = qa_bytes;
    }
    if (s->acc_count < acc_count) {
        free(s->acc);
        if (!(s->acc = malloc(acc_count * sizeof(int32_t)))) out_of_memory("the int32 accumulations");
        s->acc_count = acc_count;
    }
    return s;
}

/* ---- which path ---------------------------------------------------------------------------- */

enum { PATH_C, PATH_ONEDNN };
static const char *const path_names[] = {"plain C", "oneDNN s8 x s8 -> s32 (AVX512-VNNI)"};
#ifdef DMRT_HAVE_DNNL
static dnnl_engine_t engine;
#endif
static int onednn_available, chosen_path, forced_onednn;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

/* Without VNNI oneDNN multiplies int8 with vpmaddubsw, whose pairwise int16 sums saturate
 * (and it may halve the weights to avoid that): not the exact sums this path promises. */
#ifdef DMRT_HAVE_DNNL
static int cpu_has_vnni(void) { return DMRT_CPU_SUPPORTS("avx512vnni"); }
#endif

/* Apart from choose_path, so that asking whether oneDNN could run never ends the process. */
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static void detect_onednn(void) {
#ifdef DMRT_HAVE_DNNL
    /* oneDNN's own choice too: DNNL_MAX_CPU_ISA may hold it below VNNI */
    onednn_available = cpu_has_vnni() &&
                       (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni &&
                       dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success;
#endif
}

int dmrt_gemm_i8_onednn_available(void) {
    (void)pthread_once(&detect_once, detect_onednn);
    return onednn_available;
}

static void choose_path(void) {
    const char *forced = getenv("DMRT_INT8_GEMM");
    chosen_path = dmrt_gemm_i8_onednn_available() ? PATH_ONEDNN : PATH_C;
    if (!forced || !*forced) return;
    if (strcmp(forced, "c") == 0) {
        chosen_path = PATH_C;
    } else if (strcmp(forced, "onednn") == 0 && onednn_available) {
        chosen_path = PATH_ONEDNN;
        forced_onednn = 1;
    } else if (strcmp(forced, "onednn") == 0) {
        fprintf(stderr, "DMRT_INT8_GEMM=onednn: unavailable (%s)\n",
#ifdef DMRT_HAVE_DNNL
                cpu_has_vnni() ? "oneDNN runs below AVX512-VNNI or has no CPU engine" : "this CPU has no AVX512-VNNI"
#else
                "libdmrt was built without oneDNN (libdnnl-dev)"
#endif
        );
        exit(1);
    } else {
        fprintf(stderr, "DMRT_INT8_GEMM=%s: expected onednn or c\n", forced);
        exit(1);
    }
}

const char *dmrt_gemm_i8_path(void) {
    (void)pthread_once(&choose_once, choose_path);
    return path_names[chosen_path];
}

/* ---- the int32 accumulations --------------------------------------------------------------- */

/* row[j] += sum over r < rows of x[r] * w[r * n + j], rows 1 to 4: up to four rows of the
 * weight per pass over the output row (a quarter of the loads and stores of acc); restrict
 * parameters, so that the baseline build's -O2 vectorises it without an alias check. */
static void add_rows(int64_t n, int rows, const int8_t *x, const int8_t *restrict w, int32_t *restrict row) {
    int32_t x0 = x[0], x1 = rows > 1 ? x[1] : 0, x2 = rows > 2 ? x[2] : 0, x3 = rows > 3 ? x[3] : 0;
    if (rows == 4) {
        SIMD_LOOP
        for (int64_t j = 0; j < n; j++) row[j] += x0 * w[j] + x1 * w[n + j] + x2 * w[2 * n + j] + x3 * w[3 * n + j];
    } else {
        for (int r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) row[j] += (r == 0 ? x0 : r == 1 ? x1 : x2) * w[r * n + j];
    }
}

static void s8s8s32_c(int64_t m, int64_t n, int64_t k, const int8_t *qa, const int8_t *qw, int32_t *acc) {
    for (int64_t i = 0; i < m; i++) {
        memset(acc + i * n, 0, (size_t)n * sizeof *acc);
        for (int64_t p = 0; p < k; p += 4)
            add_rows(n, k - p < 4 ? (int)(k - p) : 4, qa + i * k + p, qw + p * n, acc + i * n);
    }
}

#ifdef DMRT_HAVE_DNNL
/* oneDNN runs on the calling thread alone (internal.h): dmrt_gemm_i8_split spreads a
 * product over the rank's threads itself. */
#define ONE_THREAD_BEGIN() DMRT_ONEDNN_ONE_THREAD_BEGIN()
#define ONE_THREAD_END() DMRT_ONEDNN_ONE_THREAD_END()

static int make_memory(dnnl_memory_t *mem, int64_t rows, int64_t cols, dnnl_data_type_t type) {
    dnnl_dims_t dims = {rows, cols}, strides = {cols, 1};
    dnnl_memory_desc_t md;
    if (dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides) != dnnl_success) return -1;
    return dnnl_memory_create(mem, &md, engine, DNNL_MEMORY_NONE) == dnnl_success ? 0 : -1;
}

static void build_entry(s8_entry *e) {
    const dnnl_memory_desc_t *md_a, *md_b, *md_c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    int ok = make_memory(&e->mem_a, e->m, e->k, dnnl_s8) == 0 && make_memory(&e->mem_b, e->k, e->n, dnnl_s8) == 0 &&
             make_memory(&e->mem_c, e->m, e->n, dnnl_s32) == 0 &&
             dnnl_memory_get_memory_desc(e->mem_a, &md_a) == dnnl_success &&
             dnnl_memory_get_memory_desc(e->mem_b, &md_b) == dnnl_success &&
             dnnl_memory_get_memory_desc(e->mem_c, &md_c) == dnnl_success &&
             dnnl_matmul_desc_init(&desc, md_a, md_b, NULL, md_c) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) == dnnl_success &&
             dnnl_primitive_create(&e->primitive, pd) == dnnl_success;
    if (!ok) e->primitive = NULL;
    if (pd) dnnl_primitive_desc_destroy(pd);
}

static s8_entry *find_entry(i8_state *s, int64_t m, int64_t n, int64_t k) {
    for (int i = 0; i < s->used; i++)
        if (s->entries[i].m == m && s->entries[i].n == n && s->entries[i].k == k) return &s->entries[i];
    s8_entry *e;
    if (s->used < S8_CACHE_SLOTS) {
        e = &s->entries[s->used++];
    } else {
        e = &s->entries[s->next_replaced];
        s->next_replaced = (s->next_replaced + 1) % S8_CACHE_SLOTS;
        drop_entry(e);
    }
    *e = (s8_entry){m, n, k, NULL, NULL, NULL, NULL};
    build_entry(e);
    return e;
}

/* 0, or -1 when oneDNN refused the shape (acc untouched). */
static int s8s8s32_onednn(i8_state *s, int64_t m, int64_t n, int64_t k, const int8_t *qa, const int8_t *qw,
                          int32_t *acc) {
    ONE_THREAD_BEGIN();
    int ok = s->stream || dnnl_stream_create(&s->stream, engine, dnnl_stream_default_flags) == dnnl_success;
    s8_entry *e = ok ? find_entry(s, m, n, k) : NULL;
    ok = e && e->primitive && dnnl_memory_set_data_handle(e->mem_a, (void *)(uintptr_t)qa) == dnnl_success &&
         dnnl_memory_set_data_handle(e->mem_b, (void *)(uintptr_t)qw) == dnnl_success &&
         dnnl_memory_set_data_handle(e->mem_c, acc) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e->mem_a}, {DNNL_ARG_WEIGHTS, e->mem_b}, {DNNL_ARG_DST, e->mem_c}};
        if (dnnl_primitive_execute(e->primitive, s->stream, 3, args) != dnnl_success ||
            dnnl_stream_wait(s->stream) != dnnl_success) {
            fprintf(stderr, "dmrt_gemm_i8: oneDNN's matmul failed on %lld x %lld x %lld\n", (long long)m, (long long)n,
                    (long long)k);
            abort();
        }
    }
    ONE_THREAD_END();
    return ok ? 0 : -1;
}
#endif

static int s8s8s32_on(i8_state *s, int64_t m, int64_t n, int64_t k, const int8_t *qa, const int8_t *qw, int32_t *acc) {
    (void)pthread_once(&choose_once, choose_path);
#ifdef DMRT_HAVE_DNNL
    if (chosen_path == PATH_ONEDNN && s8s8s32_onednn(s, m, n, k, qa, qw, acc) == 0) return 1;
    if (forced_onednn) { /* the tests that force oneDNN must not pass on plain C */
        fprintf(stderr, "DMRT_INT8_GEMM=onednn: oneDNN refused the int8 matmul %lld x %lld x %lld\n", (long long)m,
                (long long)n, (long long)k);
        exit(1);
    }
#else
    (void)s;
#endif
    s8s8s32_c(m, n, k, qa, qw, acc);
    return 0;
}

int dmrt_gemm_s8s8s32(int64_t m, int64_t n, int64_t k, const int8_t *qa, const int8_t *qw, int32_t *acc) {
    return s8s8s32_on(this_thread_state(0, 0), m, n, k, qa, qw, acc);
}

/* ---- the product ----------------------------------------------------------------------------- */

/* Rows [r0, r1) of C: quantize, multiply qw (k x n, contiguous: the weight's columns the
 * product reads), scale back with those columns' scales. */
static void product_rows(const dmrt_qweight *q, const int8_t *qw, const float *scale, int64_t n, int64_t r0, int64_t r1,
                         const float *a, int64_t lda, float beta, float *c, int64_t ldc) {
    int64_t m = r1 - r0, k = q->rows;
    i8_state *s = this_thread_state((size_t)(m * k), (size_t)(m * n));
    for (int64_t i = 0; i < m; i++) dmrt_quantize_activations(a + (r0 + i) * lda, k, q->input_scale, s->qa + i * k);
    s8s8s32_on(s, m, n, k, s->qa, qw, s->acc);
    for (int64_t i = 0; i < m; i++) {
        float *row = c + (r0 + i) * ldc;
        const int32_t *acc = s->acc + i * n;
        if (beta == 0.0f) {
            SIMD_LOOP
            for (int64_t j = 0; j < n; j++) row[j] = (float)acc[j] * (q->input_scale * scale[j]);
        } else {
            SIMD_LOOP
            for (int64_t j = 0; j < n; j++) row[j] += (float)acc[j] * (q->input_scale * scale[j]);
        }
    }
}

void dmrt_gemm_i8_window_split(int threads, const dmrt_qweight *q, const float *w_f32, int64_t col0, int64_t cols,
                               int64_t m, const float *a, int64_t lda, float beta, float *c, int64_t ldc) {
    if (col0 < 0 || cols <= 0 || col0 + cols > q->cols || (q->transposed && cols != q->cols)) {
        fprintf(stderr, "dmrt_gemm_i8: columns %lld to %lld of a weight of %lld%s\n", (long long)col0,
                (long long)(col0 + cols), (long long)q->cols, q->transposed ? ", read transposed (no window)" : "");
        abort();
    }
    if (m <= 0) return;
    if (q->calib) {
        dmrt_act_stats_record(q->calib, m, a, lda, q->rows);
        /* w_f32 is the parameter: [k, n] (a window: at its first column), or [n, k] read transposed */
        const int tb = q->transposed;
        const int64_t ldb = tb ? q->rows : q->cols;
        if (threads > 1)
            dmrt_sgemm_split(threads, 0, tb, m, cols, q->rows, 1.0f, a, lda, w_f32, ldb, beta, c, ldc);
        else
            dmrt_sgemm(0, tb, m, cols, q->rows, 1.0f, a, lda, w_f32, ldb, beta, c, ldc);
        return;
    }
    if (!(q->input_scale > 0.0f) || q->bits != 8 || (beta != 0.0f && beta != 1.0f)) {
        fprintf(stderr, "dmrt_gemm_i8: %s\n", q->bits != 8 ? "the weight is not int8"
                                              : q->input_scale > 0.0f ? "beta must be 0 or 1"
                                                                      : "the product's input scale was never calibrated");
        abort();
    }
    /* a window's columns copied together (the calling thread's buffer, read by every panel) */
    const int8_t *qw = (const int8_t *)q->data;
    if (cols != q->cols) {
        int8_t *window = (int8_t *)dmrt_thread_floats((size_t)((q->rows * cols + 3) / 4), "dmrt_gemm_i8");
        for (int64_t r = 0; r < q->rows; r++) memcpy(window + r * cols, qw + r * q->cols + col0, (size_t)cols);
        qw = window;
    }
    int panels = threads > 1 ? (int)(m < threads ? m : threads) : 1;
    DMRT_PARALLEL_FOR(panels)
    for (int p = 0; p < panels; p++)
        product_rows(q, qw, q->scale + col0, cols, m * p / panels, m * (p + 1) / panels, a, lda, beta, c, ldc);
}

void dmrt_gemm_i8_split(int threads, const dmrt_qweight *q, const float *w_f32, int64_t m, const float *a,
                        int64_t lda, float beta, float *c, int64_t ldc) {
    dmrt_gemm_i8_window_split(threads, q, w_f32, 0, q->cols, m, a, lda, beta, c, ldc);
}
