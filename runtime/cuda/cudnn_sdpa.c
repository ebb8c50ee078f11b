/* cudnn_sdpa.c: the attention graphs of cudnn_sdpa.h through cuDNN's backend API. */
#include "cudnn_sdpa.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Records why the graph failed (the first reason only) and returns -1. */
static int sdpa_fail(dmrt_sdpa_graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sdpa_fail(dmrt_sdpa_graph *g, const char *fmt, ...) {
    if (!g->error[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->error, sizeof g->error, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A new descriptor the graph owns, or NULL with the error set. */
static cudnnBackendDescriptor_t make(dmrt_sdpa_graph *g, cudnnBackendDescriptorType_t type, const char *what) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->n_owned >= DMRT_SDPA_MAX_DESCRIPTORS) {
        sdpa_fail(g, "%s: too many descriptors", what);
        return NULL;
    }
    cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        sdpa_fail(g, "%s: cudnnBackendCreateDescriptor: %s", what, cudnnGetErrorString(st));
        return NULL;
    }
    return g->owned[g->n_owned++] = d;
}

/* Sets one attribute; a failure is remembered (and ends the build at the next finalize). */
static void set(dmrt_sdpa_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what) {
    if (!d || g->error[0]) return;
    cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) sdpa_fail(g, "%s: attribute %d: %s", what, (int)name, cudnnGetErrorString(st));
}

static int finalize(dmrt_sdpa_graph *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->error[0]) return -1;
    cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) return sdpa_fail(g, "%s: cudnnBackendFinalize: %s", what, cudnnGetErrorString(st));
    return 0;
}

/* A tensor of 4 dims; uid 0: a virtual one (an intermediate) with the next virtual id. */
static cudnnBackendDescriptor_t tensor(dmrt_sdpa_graph *g, const char *what, int64_t uid, cudnnDataType_t type,
                                       const int64_t dims[4], const int64_t strides[4]) {
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    bool is_virtual = uid == 0;
    int64_t id = is_virtual ? g->next_virtual++ : uid, alignment = 16;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, what);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, what);
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, what);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
    set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
    return finalize(g, t, what) ? NULL : t;
}

/* A float constant passed by value (the scale, -inf, 1). */
static cudnnBackendDescriptor_t scalar(dmrt_sdpa_graph *g, const char *what, float value) {
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    const int64_t ones[4] = {1, 1, 1, 1};
    int64_t id = g->next_virtual++, alignment = 16;
    cudnnDataType_t type = CUDNN_DATA_FLOAT;
    bool by_value = true;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, ones, what);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, ones, what);
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, what);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
    set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
    if (finalize(g, t, what)) return NULL;
    if (g->n_scalars >= DMRT_SDPA_MAX_SCALARS) {
        sdpa_fail(g, "%s: too many constants", what);
        return NULL;
    }
    /* a by-value tensor's value is given with the data pointers when the plan runs */
    g->scalar_uid[g->n_scalars] = id;
    g->scalar_value[g->n_scalars++] = value;
    return t;
}

static void add_op(dmrt_sdpa_graph *g, cudnnBackendDescriptor_t op, const char *what) {
    if (!op || finalize(g, op, what)) return;
    g->op_names[g->n_ops] = what;
    g->ops[g->n_ops++] = op;
}

/* An operation of `type` whose attributes names[i] are the descriptors descs[i] (NULL ones
 * left unset), finalized and appended to the graph's operations. */
static void operation(dmrt_sdpa_graph *g, const char *what, cudnnBackendDescriptorType_t type, int n,
                      const cudnnBackendAttributeName_t *names, const cudnnBackendDescriptor_t *descs) {
    cudnnBackendDescriptor_t op = make(g, type, what);
    for (int i = 0; i < n; i++)
        if (descs[i]) set(g, op, names[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &descs[i], what);
    add_op(g, op, what);
}

/* y = mode(x[, b[, t]]) elementwise (broadcasting b over size-1 dims); axis for GEN_INDEX. */
static void pointwise(dmrt_sdpa_graph *g, const char *what, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                      int64_t axis) {
    cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    cudnnDataType_t prec = mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    if (!pw || finalize(g, pw, what)) return;
    const cudnnBackendAttributeName_t names[] = {
        CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
        CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        CUDNN_ATTR_OPERATION_POINTWISE_YDESC};
    const cudnnBackendDescriptor_t descs[] = {pw, x, b, t, y};
    operation(g, what, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 5, names, descs);
}

/* c = a @ b, batched over the first two dims, accumulated in f32. */
static void matmul(dmrt_sdpa_graph *g, const char *what, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    if (!mm || finalize(g, mm, what)) return;
    const cudnnBackendAttributeName_t names[] = {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                                 CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC};
    const cudnnBackendDescriptor_t descs[] = {a, b, c, mm};
    operation(g, what, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 4, names, descs);
}

/* y = the max or sum of x along its last dim (y's last dim is 1). */
static void reduce(dmrt_sdpa_graph *g, const char *what, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, what);
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    if (!r || finalize(g, r, what)) return;
    const cudnnBackendAttributeName_t names[] = {CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                                 CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                                 CUDNN_ATTR_OPERATION_REDUCTION_DESC};
    const cudnnBackendDescriptor_t descs[] = {x, y, r};
    operation(g, what, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 3, names, descs);
}

/* y = x seen with other dims and strides (a transpose of the last two). */
static void reshape(dmrt_sdpa_graph *g, const char *what, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnBackendAttributeName_t names[] = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                                 CUDNN_ATTR_OPERATION_RESHAPE_YDESC};
    const cudnnBackendDescriptor_t descs[] = {x, y};
    operation(g, what, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 2, names, descs);
}

/* The shapes every graph uses: heads x (rows, cols) matrices, row-major or transposed. */
typedef struct sdpa_dims {
    int64_t h, t, d;
    cudnnDataType_t io;
} sdpa_dims;

static cudnnBackendDescriptor_t matrix(dmrt_sdpa_graph *g, const sdpa_dims *s, const char *what, int64_t uid,
                                       cudnnDataType_t type, int64_t rows, int64_t cols, int transposed) {
    const int64_t dims[4] = {s->h, 1, rows, cols};
    const int64_t row_major[4] = {rows * cols, rows * cols, cols, 1},
                  col_major[4] = {rows * cols, rows * cols, 1, rows};
    return tensor(g, what, uid, type, dims, transposed ? col_major : row_major);
}

/* The value a causal mask gives the keys after the query: -inf, or the lowest float on
 * cuDNN before 9.10, whose engines prefer it (cudnn-frontend makes the same choice). */
static float masked_value(void) { return cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY; }

/* x with the keys after each query set to masked_value(): row >= column selects x. */
static cudnnBackendDescriptor_t causal_mask(dmrt_sdpa_graph *g, const sdpa_dims *s, cudnnBackendDescriptor_t x) {
    cudnnBackendDescriptor_t row = matrix(g, s, "row index", 0, CUDNN_DATA_INT32, s->t, s->t, 0);
    cudnnBackendDescriptor_t col = matrix(g, s, "column index", 0, CUDNN_DATA_INT32, s->t, s->t, 0);
    cudnnBackendDescriptor_t seen = matrix(g, s, "causal mask", 0, CUDNN_DATA_BOOLEAN, s->t, s->t, 0);
    cudnnBackendDescriptor_t masked = matrix(g, s, "masked", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    pointwise(g, "row index", CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, row, 2);
    pointwise(g, "column index", CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, col, 3);
    pointwise(g, "row >= column", CUDNN_POINTWISE_CMP_GE, row, col, NULL, seen, 0);
    pointwise(g, "causal select", CUDNN_POINTWISE_BINARY_SELECT, x, scalar(g, "masked value", masked_value()), seen,
              masked, 0);
    return masked;
}

/* q @ k^T * scale (f32), causal-masked when `mask` is set and the shape is causal. */
static cudnnBackendDescriptor_t scores(dmrt_sdpa_graph *g, const sdpa_dims *s, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale, int mask) {
    cudnnBackendDescriptor_t raw = matrix(g, s, "scores", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    matmul(g, "q @ k^T", q, kt, raw);
    cudnnBackendDescriptor_t scaled = matrix(g, s, "scaled scores", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    pointwise(g, "scale", CUDNN_POINTWISE_MUL, raw, scale, NULL, scaled, 0);
    return mask && g->shape.causal ? causal_mask(g, s, scaled) : scaled;
}

static void build_forward(dmrt_sdpa_graph *g, const sdpa_dims *s) {
    cudnnBackendDescriptor_t q = matrix(g, s, "q", DMRT_SDPA_Q, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t kt = matrix(g, s, "k^T", DMRT_SDPA_K, s->io, s->d, s->t, 1);
    cudnnBackendDescriptor_t v = matrix(g, s, "v", DMRT_SDPA_V, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t out = matrix(g, s, "out", DMRT_SDPA_OUT, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t stats = matrix(g, s, "stats", DMRT_SDPA_STATS, CUDNN_DATA_FLOAT, s->t, 1, 0);
    cudnnBackendDescriptor_t masked = scores(g, s, q, kt, scalar(g, "scale", g->shape.scale), 1);
    cudnnBackendDescriptor_t max = matrix(g, s, "row max", 0, CUDNN_DATA_FLOAT, s->t, 1, 0);
    cudnnBackendDescriptor_t shifted = matrix(g, s, "scores - max", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t e = matrix(g, s, "exp", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t sum = matrix(g, s, "row sum", 0, CUDNN_DATA_FLOAT, s->t, 1, 0);
    cudnnBackendDescriptor_t log_sum = matrix(g, s, "log sum", 0, CUDNN_DATA_FLOAT, s->t, 1, 0);
    cudnnBackendDescriptor_t p = matrix(g, s, "probabilities", 0, s->io, s->t, s->t, 0);
    reduce(g, "row max", CUDNN_REDUCE_TENSOR_MAX, masked, max);
    pointwise(g, "scores - max", CUDNN_POINTWISE_SUB, masked, max, NULL, shifted, 0);
    pointwise(g, "exp", CUDNN_POINTWISE_EXP, shifted, NULL, NULL, e, 0);
    reduce(g, "row sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
    pointwise(g, "log sum", CUDNN_POINTWISE_LOG, sum, NULL, NULL, log_sum, 0);
    pointwise(g, "stats", CUDNN_POINTWISE_ADD, max, log_sum, NULL, stats, 0);
    pointwise(g, "probabilities", CUDNN_POINTWISE_DIV, e, sum, NULL, p, 0);
    matmul(g, "p @ v", p, v, out);
}

/* dv = p^T @ dout with p = exp(scores - stats), which it returns (f32). The causal mask
 * comes before the statistics are subtracted in DMRT_SDPA_MASK_FIRST, after in
 * DMRT_SDPA_STATS_FIRST. */
static cudnnBackendDescriptor_t backward_dv(dmrt_sdpa_graph *g, const sdpa_dims *s, cudnnBackendDescriptor_t q,
                                            cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t dout,
                                            cudnnBackendDescriptor_t scale) {
    int mask_first = g->form == DMRT_SDPA_MASK_FIRST;
    cudnnBackendDescriptor_t stats = matrix(g, s, "stats", DMRT_SDPA_STATS, CUDNN_DATA_FLOAT, s->t, 1, 0);
    cudnnBackendDescriptor_t dv = matrix(g, s, "dv", DMRT_SDPA_DV, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t scaled = scores(g, s, q, kt, scale, mask_first);
    cudnnBackendDescriptor_t shifted = matrix(g, s, "scores - stats", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t p = matrix(g, s, "probabilities", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t pt = matrix(g, s, "p^T", 0, s->io, s->t, s->t, 1);
    pointwise(g, "scores - stats", CUDNN_POINTWISE_SUB, scaled, stats, NULL, shifted, 0);
    if (!mask_first && g->shape.causal) shifted = causal_mask(g, s, shifted);
    pointwise(g, "probabilities", CUDNN_POINTWISE_EXP, shifted, NULL, NULL, p, 0);
    reshape(g, "p^T", p, pt);
    matmul(g, "p^T @ dout", pt, dout, dv);
    return p;
}

static void build_backward(dmrt_sdpa_graph *g, const sdpa_dims *s) {
    cudnnBackendDescriptor_t q = matrix(g, s, "q", DMRT_SDPA_Q, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t kt = matrix(g, s, "k^T", DMRT_SDPA_K, s->io, s->d, s->t, 1);
    cudnnBackendDescriptor_t vt = matrix(g, s, "v^T", DMRT_SDPA_V, s->io, s->d, s->t, 1);
    cudnnBackendDescriptor_t out = matrix(g, s, "out", DMRT_SDPA_OUT, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t dout = matrix(g, s, "dout", DMRT_SDPA_DOUT, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t dq = matrix(g, s, "dq", DMRT_SDPA_DQ, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t dk = matrix(g, s, "dk", DMRT_SDPA_DK, s->io, s->t, s->d, 0);
    cudnnBackendDescriptor_t dq_f32 = matrix(g, s, "dq in f32", DMRT_SDPA_DQ_F32, CUDNN_DATA_FLOAT, s->t, s->d, 0);
    cudnnBackendDescriptor_t rowsum =
        matrix(g, s, "rowsum(dout * out)", DMRT_SDPA_ROWSUM, CUDNN_DATA_FLOAT, s->t, 1, 0);
    /* d = rowsum(dout * out), kept in the workspace */
    cudnnBackendDescriptor_t prod = matrix(g, s, "dout * out", 0, CUDNN_DATA_FLOAT, s->t, s->d, 0);
    cudnnBackendDescriptor_t sum = matrix(g, s, "row sum", 0, CUDNN_DATA_FLOAT, s->t, 1, 0);
    pointwise(g, "dout * out", CUDNN_POINTWISE_MUL, dout, out, NULL, prod, 0);
    reduce(g, "rowsum(dout * out)", CUDNN_REDUCE_TENSOR_ADD, prod, sum);
    pointwise(g, "rowsum(dout * out)", CUDNN_POINTWISE_MUL, sum, scalar(g, "one", 1.0f), NULL, rowsum, 0);
    /* one scale tensor for the scores and ds (DMRT_SDPA_STATS_FIRST), or one each */
    cudnnBackendDescriptor_t scale = scalar(g, "scale", g->shape.scale);
    cudnnBackendDescriptor_t p = backward_dv(g, s, q, kt, dout, scale);
    /* ds = p * (dout @ v^T - d) * scale */
    cudnnBackendDescriptor_t dp = matrix(g, s, "dout @ v^T", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t centred = matrix(g, s, "dp - d", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t ds = matrix(g, s, "p * (dp - d)", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t ds_scaled = matrix(g, s, "ds", 0, CUDNN_DATA_FLOAT, s->t, s->t, 0);
    cudnnBackendDescriptor_t dst = matrix(g, s, "ds^T", 0, s->io, s->t, s->t, 1);
    matmul(g, "dout @ v^T", dout, vt, dp);
    pointwise(g, "dp - d", CUDNN_POINTWISE_SUB, dp, rowsum, NULL, centred, 0);
    pointwise(g, "p * (dp - d)", CUDNN_POINTWISE_MUL, centred, p, NULL, ds, 0);
    if (g->form == DMRT_SDPA_MASK_FIRST) scale = scalar(g, "scale of ds", g->shape.scale);
    pointwise(g, "ds", CUDNN_POINTWISE_MUL, ds, scale, NULL, ds_scaled, 0);
    reshape(g, "ds^T", ds_scaled, dst);
    matmul(g, "ds^T @ q", dst, q, dk);
    /* dq = ds @ k: k is the k^T tensor seen transposed back, declared f32 (as ds is) in
     * DMRT_SDPA_STATS_FIRST, in the 16-bit type in DMRT_SDPA_MASK_FIRST */
    cudnnDataType_t k_type = g->form == DMRT_SDPA_MASK_FIRST ? s->io : CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t k = matrix(g, s, "k", 0, k_type, s->t, s->d, 0);
    reshape(g, "k", kt, k);
    matmul(g, "ds @ k", ds_scaled, k, dq_f32);
    pointwise(g, "dq", CUDNN_POINTWISE_IDENTITY, dq_f32, NULL, NULL, dq, 0);
}

int dmrt_sdpa_graph_build(dmrt_sdpa_graph *g, const dmrt_sdpa_shape *s, dmrt_sdpa_form form) {
    memset(g, 0, sizeof *g);
    g->shape = *s;
    g->form = form;
    g->next_virtual = 1000;
    if (s->heads <= 0 || s->positions <= 0 || s->width <= 0)
        return sdpa_fail(g, "bad shape: %lld heads of (%lld, %lld)", (long long)s->heads, (long long)s->positions,
                         (long long)s->width);
    sdpa_dims d = {
        .h = s->heads, .t = s->positions, .d = s->width, .io = s->half ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16};
    if (s->backward)
        build_backward(g, &d);
    else
        build_forward(g, &d);
    return g->error[0] ? -1 : 0;
}

void dmrt_sdpa_graph_free(dmrt_sdpa_graph *g) {
    for (int i = g->n_owned - 1; i >= 0; i--) (void)cudnnBackendDestroyDescriptor(g->owned[i]);
    g->n_owned = g->n_ops = 0;
}

int64_t dmrt_sdpa_own_workspace_bytes(const dmrt_sdpa_shape *s) {
    if (!s->backward) return 0;
    int64_t rows = s->heads * s->positions;
    return (rows * 4 + 255) / 256 * 256 + (rows * s->width * 4 + 255) / 256 * 256;
}

cudnnBackendDescriptor_t dmrt_sdpa_op_graph(dmrt_sdpa_graph *g, cudnnHandle_t h) {
    cudnnBackendDescriptor_t og = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops, "operation graph");
    if (h) set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "operation graph");
    return finalize(g, og, "operation graph") ? NULL : og;
}

/* The first engine configuration the heuristics offer whose plan finalizes. */
static int make_plan(dmrt_sdpa_plan *p, cudnnHandle_t h) {
    dmrt_sdpa_graph *g = &p->graph;
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    p->heuristics = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    set(g, p->heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p->op_graph,
        "heuristics");
    set(g, p->heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    if (finalize(g, p->heuristics, "heuristics")) return -1;
    enum { MAX_CONFIGS = 8 };
    cudnnBackendDescriptor_t configs[MAX_CONFIGS];
    int64_t n = 0;
    for (int i = 0; i < MAX_CONFIGS; i++)
        if (!(configs[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration"))) return -1;
    cudnnStatus_t st = cudnnBackendGetAttribute(p->heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CONFIGS, &n, configs);
    if (st != CUDNN_STATUS_SUCCESS) return sdpa_fail(g, "heuristics' results: %s", cudnnGetErrorString(st));
    /* n counts every result the heuristics have; at most MAX_CONFIGS were written */
    if (n > MAX_CONFIGS) n = MAX_CONFIGS;
    for (int64_t i = 0; i < n; i++) {
        cudnnBackendDescriptor_t plan = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        if (!plan) return -1;
        st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          1, &configs[i]);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(plan);
        int64_t count = 0;
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                                          &p->engine_workspace);
        if (st != CUDNN_STATUS_SUCCESS) continue;
        p->plan = plan;
        return 0;
    }
    /* cuDNN's own words for the last refusal: a GPU session should not need a second run
     * to learn why */
    char reason[256] = "";
    cudnnGetLastErrorString(reason, sizeof reason);
    return sdpa_fail(g, "no cuDNN engine runs this attention: none of %lld configurations planned (last: %s%s%s)",
                     (long long)n, n ? cudnnGetErrorString(st) : "none offered", reason[0] ? ": " : "", reason);
}

static int plan_form(dmrt_sdpa_plan *p, cudnnHandle_t h, const dmrt_sdpa_shape *s, dmrt_sdpa_form form) {
    memset(p, 0, sizeof *p);
    if (dmrt_sdpa_graph_build(&p->graph, s, form)) return -1;
    p->op_graph = dmrt_sdpa_op_graph(&p->graph, h);
    return p->op_graph ? make_plan(p, h) : -1;
}

/* Shapes and versions cuDNN's flash attention is known not to run right, which
 * cudnn-frontend refuses before it builds a graph (its SDPA nodes' checks): 0, or -1 with
 * the reason in g->error. */
static int refuse_known_unsupported(dmrt_sdpa_graph *g, const dmrt_sdpa_shape *s) {
    size_t version = cudnnGetVersion();
    if (s->width > 256 || s->width % 8 != 0)
        return sdpa_fail(g, "cuDNN's flash attention takes head widths that are multiples of 8 up to 256, not %lld",
                         (long long)s->width);
    if (s->backward && s->positions == 1)
        return sdpa_fail(g, "cuDNN's flash attention backward does not take 1 position");
    /* forward and backward: cudnn-frontend refuses both there */
    if (version == 91000 || version == 91001)
        return sdpa_fail(g, "cuDNN %zu's 16-bit flash attention has known bugs (9.10.2 mends them)", version);
    return 0;
}

/* The backward tries each form in turn (their arithmetic is the same): cuDNN's engines
 * recognise a flash-attention graph by its pattern, which has changed between releases
 * (docs/gpu.md, "Fused attention"). The forward has one form. */
int dmrt_sdpa_plan_make(dmrt_sdpa_plan *p, cudnnHandle_t h, const dmrt_sdpa_shape *s) {
    char refused[DMRT_SDPA_FORMS][sizeof p->graph.error];
    int forms = s->backward ? DMRT_SDPA_FORMS : 1;
    memset(p, 0, sizeof *p);
    p->graph.shape = *s;
    if (refuse_known_unsupported(&p->graph, s)) return -1;
    for (int form = 0; form < forms; form++) {
        if (plan_form(p, h, s, (dmrt_sdpa_form)form) == 0) return 0;
        snprintf(refused[form], sizeof refused[form], "%s", p->graph.error);
        if (form + 1 < forms) dmrt_sdpa_graph_free(&p->graph);
    }
    if (forms > 1)
        snprintf(p->graph.error, sizeof p->graph.error, "%s: %.170s; %s: %.170s", dmrt_sdpa_form_name(0), refused[0],
                 dmrt_sdpa_form_name(1), refused[1]);
    return -1;
}

const char *dmrt_sdpa_form_name(dmrt_sdpa_form form) {
    return form == DMRT_SDPA_STATS_FIRST ? "mask after the statistics" : "mask before the statistics";
}

int dmrt_sdpa_plan_run(dmrt_sdpa_plan *p, cudnnHandle_t h, void *const data[DMRT_SDPA_UIDS], void *workspace) {
    dmrt_sdpa_graph *g = &p->graph;
    int64_t uids[DMRT_SDPA_UIDS + DMRT_SDPA_MAX_SCALARS];
    void *pointers[DMRT_SDPA_UIDS + DMRT_SDPA_MAX_SCALARS];
    int n = 0;
    for (int uid = 1; uid < DMRT_SDPA_UIDS; uid++)
        if (data[uid]) uids[n] = uid, pointers[n++] = data[uid];
    for (int i = 0; i < g->n_scalars; i++) uids[n] = g->scalar_uid[i], pointers[n++] = &g->scalar_value[i];
    char *engine_space = (char *)workspace + dmrt_sdpa_own_workspace_bytes(&g->shape);
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &engine_space);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(h, p->plan, pack);
    if (pack) (void)cudnnBackendDestroyDescriptor(pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(g->error, sizeof g->error, "cudnnBackendExecute: %s", cudnnGetErrorString(st));
        return -1;
    }
    return 0;
}

void dmrt_sdpa_plan_free(dmrt_sdpa_plan *p) { dmrt_sdpa_graph_free(&p->graph); }
