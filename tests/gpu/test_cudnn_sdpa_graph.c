/* test_cudnn_sdpa_graph.c: the cuDNN attention graphs of runtime/cuda/cudnn_sdpa.c, checked
 * as far as cuDNN checks them without a device. Every tensor and operation descriptor of
 * the forward and backward, bf16 and fp16, causal or not, is finalized (cuDNN validates an
 * operation's shapes and types at finalize: a matrix product whose inner dims disagree and
 * a reduction to a larger tensor are shown rejected below, so a pass here means something);
 * their operation graph is finalized without a handle, and offers one engine. The backward's
 * two forms are each built and told apart by what distinguishes them. Shapes cudnn-frontend
 * refuses (head widths not multiples of 8 up to 256, a backward of 1 position) are refused
 * before any graph. With a device
 * (cudnnCreate succeeds) it also makes the execution plans: cuDNN's heuristics pick an
 * engine that finalizes, and its workspace and the backward form that planned are reported. Without one it says what it could
 * not check. */
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cudnn_sdpa.h"

static int failures;

#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond)) {                                  \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
            failures++;                                 \
        }                                               \
    } while (0)

/* The operations each graph has: the forward's 10 (2 products, the scale, max, sub, exp,
 * sum, log, add, div), the backward's 18, and 4 more in each for the causal mask. */
static int expected_ops(const dmrt_sdpa_shape *s) { return (s->backward ? 18 : 10) + (s->causal ? 4 : 0); }

/* The uid a finalized tensor descriptor reports. */
static int64_t uid_of(cudnnBackendDescriptor_t t) {
    int64_t uid = -1, n = 0;
    if (cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &uid)) return -1;
    return uid;
}

/* The first product reads q: the graph is wired to the caller's uids. */
static void check_first_product(dmrt_sdpa_graph *g) {
    for (int i = 0; i < g->n_ops; i++) {
        cudnnBackendDescriptor_t a = NULL;
        int64_t n = 0;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &a)) return;
        cudnnStatus_t st = cudnnBackendGetAttribute(g->ops[i], CUDNN_ATTR_OPERATION_MATMUL_ADESC,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &a);
        int64_t uid = st == CUDNN_STATUS_SUCCESS ? uid_of(a) : -1;
        cudnnBackendDestroyDescriptor(a);
        if (st != CUDNN_STATUS_SUCCESS) continue; /* not a product */
        if (!g->shape.backward)
            CHECK(uid == DMRT_SDPA_Q, "forward's first product reads uid %lld, not q", (long long)uid);
        return;
    }
    CHECK(0, "no matrix product in the graph");
}

/* The position of the operation named `name` in the graph, -1 if none. */
static int op_index(const dmrt_sdpa_graph *g, const char *name) {
    for (int i = 0; i < g->n_ops; i++)
        if (!strcmp(g->op_names[i], name)) return i;
    return -1;
}

/* The data type of the output tensor (YDESC) of the reshape named `name`; -1 if none. */
static int reshape_output_type(const dmrt_sdpa_graph *g, const char *name) {
    int i = op_index(g, name);
    cudnnBackendDescriptor_t y = NULL;
    cudnnDataType_t type = (cudnnDataType_t)-1;
    int64_t n = 0;
    if (i < 0 || cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &y)) return -1;
    if (cudnnBackendGetAttribute(g->ops[i], CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                 &y) == CUDNN_STATUS_SUCCESS)
        cudnnBackendGetAttribute(y, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &n, &type);
    cudnnBackendDestroyDescriptor(y);
    return (int)type;
}

/* What tells the backward's forms apart (cudnn_sdpa.h): where the causal mask is, the type
 * k is reshaped to, and how many scale tensors there are. */
static void check_form(const dmrt_sdpa_graph *g, const char *what) {
    const dmrt_sdpa_shape *s = &g->shape;
    int mask_first = g->form == DMRT_SDPA_MASK_FIRST;
    if (s->causal) {
        int mask = op_index(g, "causal select"), stats = op_index(g, "scores - stats");
        CHECK(mask >= 0 && stats >= 0 && (mask < stats) == mask_first, "%s %s: the mask is operation %d, the "
              "subtraction of the statistics %d", what, dmrt_sdpa_form_name(g->form), mask, stats);
    }
    int expected = mask_first ? (s->half ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16) : CUDNN_DATA_FLOAT;
    CHECK(reshape_output_type(g, "k") == expected, "%s %s: k reshaped to type %d, expected %d", what,
          dmrt_sdpa_form_name(g->form), reshape_output_type(g, "k"), expected);
    /* the constant 1 of the row sums, the scale (twice when mask first), the masked value */
    int scalars = 1 + (mask_first ? 2 : 1) + (s->causal ? 1 : 0);
    CHECK(g->n_scalars == scalars, "%s %s: %d constants, expected %d", what, dmrt_sdpa_form_name(g->form),
          g->n_scalars, scalars);
}

static void check_graph(const dmrt_sdpa_shape *s, dmrt_sdpa_form form, cudnnHandle_t handle) {
    char what[64];
    snprintf(what, sizeof what, "%s %lldx(%lld,%lld)", s->backward ? "backward" : "forward", (long long)s->heads,
             (long long)s->positions, (long long)s->width);
    dmrt_sdpa_graph g;
    int rc = dmrt_sdpa_graph_build(&g, s, form);
    CHECK(rc == 0, "%s (%s, causal %d, %s): %s", what, s->half ? "fp16" : "bf16", s->causal,
          dmrt_sdpa_form_name(form), g.error);
    CHECK(g.n_ops == expected_ops(s), "%s: %d operations, expected %d", what, g.n_ops, expected_ops(s));
    if (rc == 0) {
        check_first_product(&g);
        if (s->backward) check_form(&g, what);
        cudnnBackendDescriptor_t og = dmrt_sdpa_op_graph(&g, NULL);
        CHECK(og != NULL, "%s: operation graph: %s", what, g.error);
        int64_t engines = 0, n = 0;
        if (og)
            CHECK(cudnnBackendGetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &n,
                                           &engines) == CUDNN_STATUS_SUCCESS &&
                      engines >= 1,
                  "%s: the operation graph offers %lld engines", what, (long long)engines);
    }
    dmrt_sdpa_graph_free(&g);
    if (!handle || form != 0) return;
    /* the plan: the first form cuDNN takes */
    dmrt_sdpa_plan p;
    rc = dmrt_sdpa_plan_make(&p, handle, s);
    CHECK(rc == 0, "%s plan: %s", what, p.graph.error);
    if (rc == 0)
        printf("%s %s causal %d: engine workspace %lld bytes%s%s\n", what, s->half ? "fp16" : "bf16", s->causal,
               (long long)p.engine_workspace, s->backward ? ", the " : "",
               s->backward ? dmrt_sdpa_form_name(p.graph.form) : "");
    dmrt_sdpa_plan_free(&p);
}

/* A finalized tensor of 2 (rows, cols) matrices, virtual when uid >= 100. */
static cudnnBackendDescriptor_t tensor(int64_t uid, int64_t rows, int64_t cols, cudnnDataType_t type) {
    cudnnBackendDescriptor_t t = NULL;
    int64_t dims[4] = {2, 1, rows, cols}, strides[4] = {rows * cols, rows * cols, cols, 1}, alignment = 16;
    bool is_virtual = uid >= 100;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    CHECK(cudnnBackendFinalize(t) == CUDNN_STATUS_SUCCESS, "a plain tensor did not finalize");
    return t;
}

/* A new descriptor of `type` (in *out) with attribute names[i] set to *values[i], each one
 * value of type kind; the status of its finalize. */
static cudnnStatus_t finalize_with(cudnnBackendDescriptorType_t type, int n, const cudnnBackendAttributeName_t *names,
                                   cudnnBackendAttributeType_t kind, const void *const *values,
                                   cudnnBackendDescriptor_t *out) {
    cudnnBackendCreateDescriptor(type, out);
    for (int i = 0; i < n; i++) cudnnBackendSetAttribute(*out, names[i], kind, 1, values[i]);
    return cudnnBackendFinalize(*out);
}

/* The checks can fail: wrong operations are rejected at finalize, as a wrong graph's would be. */
static void check_rejections(void) {
    cudnnBackendDescriptor_t a = tensor(1, 64, 32, CUDNN_DATA_BFLOAT16), b = tensor(2, 33, 64, CUDNN_DATA_BFLOAT16);
    cudnnBackendDescriptor_t c = tensor(100, 64, 64, CUDNN_DATA_FLOAT), row = tensor(101, 64, 1, CUDNN_DATA_FLOAT);
    cudnnBackendDescriptor_t mm = NULL, op = NULL, red = NULL, op2 = NULL;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnReduceTensorOp_t max = CUDNN_REDUCE_TENSOR_MAX;
    const cudnnBackendAttributeName_t mm_names[] = {CUDNN_ATTR_MATMUL_COMP_TYPE};
    const void *mm_values[] = {&f32};
    finalize_with(CUDNN_BACKEND_MATMUL_DESCRIPTOR, 1, mm_names, CUDNN_TYPE_DATA_TYPE, mm_values, &mm);
    const cudnnBackendAttributeName_t product[] = {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                                   CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC};
    const void *product_values[] = {&a, &b, &c, &mm};
    CHECK(finalize_with(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 4, product, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        product_values, &op) != CUDNN_STATUS_SUCCESS,
          "a (64, 32) @ (33, 64) product was accepted");
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &red);
    cudnnBackendSetAttribute(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &max);
    cudnnBackendSetAttribute(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    cudnnBackendFinalize(red);
    const cudnnBackendAttributeName_t reduction[] = {CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                                     CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                                     CUDNN_ATTR_OPERATION_REDUCTION_DESC};
    const void *reduction_values[] = {&row, &c, &red};
    CHECK(finalize_with(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 3, reduction, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        reduction_values, &op2) != CUDNN_STATUS_SUCCESS,
          "a reduction of (64, 1) to (64, 64) was accepted");
    cudnnBackendDescriptor_t all[] = {op2, red, op, mm, row, c, b, a};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cudnnBackendDestroyDescriptor(all[i]);
    /* shapes cudnn-frontend refuses are refused before any graph (no handle needed) */
    const dmrt_sdpa_shape refused[] = {
        {.heads = 2, .positions = 8, .width = 12, .scale = 1},
        {.heads = 2, .positions = 8, .width = 264, .scale = 1, .backward = 1},
        {.heads = 2, .positions = 1, .width = 16, .scale = 1, .backward = 1},
    };
    const char *why[] = {"multiples of 8 up to 256, not 12", "not 264", "does not take 1 position"};
    for (int i = 0; i < 3; i++) {
        dmrt_sdpa_plan p;
        int rc = dmrt_sdpa_plan_make(&p, NULL, &refused[i]);
        CHECK(rc != 0 && strstr(p.graph.error, why[i]) && p.graph.n_owned == 0, "refused shape %d: rc %d, '%s'", i,
              rc, p.graph.error);
        dmrt_sdpa_plan_free(&p);
    }
    /* and the builder's own refusal */
    dmrt_sdpa_graph g;
    dmrt_sdpa_shape bad = {.heads = 2, .positions = 8, .width = 0, .scale = 1};
    CHECK(dmrt_sdpa_graph_build(&g, &bad, DMRT_SDPA_STATS_FIRST) != 0 && strstr(g.error, "bad shape"),
          "width 0 built: '%s'", g.error);
    dmrt_sdpa_graph_free(&g);
}

int main(void) {
    printf("cuDNN %zu (built against %d)\n", cudnnGetVersion(), CUDNN_VERSION);
    cudnnHandle_t handle = NULL;
    cudnnStatus_t st = cudnnCreate(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        /* with a device, cuDNN that does not start is a failure, not a machine without a GPU
         * (the plans are this test's point there) */
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
        (void)cudaGetLastError();
        CHECK(devices == 0, "cudnnCreate: %s, with %d CUDA device(s) present", cudnnGetErrorString(st), devices);
        printf(
            "cudnnCreate: %s: no device, so the graphs' descriptors and operation graphs are checked but no "
            "engine or execution plan is made (that needs a GPU)\n",
            cudnnGetErrorString(st));
        handle = NULL;
    }
    check_rejections();
    /* gpt.dm's tiny attention (2 x 4 heads of (64, 16)), then gpu-attention16's shapes, so
     * that on a GPU one run says which shapes cuDNN makes a plan for (and their workspace) */
    static const int64_t shapes[][3] = {{8, 64, 16}, {16, 16, 8}, {6, 40, 64}, {4, 128, 64}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
        for (int backward = 0; backward < 2; backward++)
            for (int half = 0; half < 2; half++)
                for (int causal = 0; causal < 2; causal++) {
                    dmrt_sdpa_shape s = {.heads = shapes[k][0],
                                         .positions = shapes[k][1],
                                         .width = shapes[k][2],
                                         .half = half,
                                         .scale = 1.0f / sqrtf((float)shapes[k][2]),
                                         .causal = causal,
                                         .backward = backward};
                    for (int form = 0; form < (backward ? DMRT_SDPA_FORMS : 1); form++)
                        check_graph(&s, (dmrt_sdpa_form)form, handle);
                }
    if (handle) cudnnDestroy(handle);
    printf(failures ? "%d failures\n" : "all passed\n", failures);
    return failures ? 1 : 0;
}
