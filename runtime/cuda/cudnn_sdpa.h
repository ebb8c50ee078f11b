/* cudnn_sdpa.h: fused attention in 16 bits through cuDNN's backend (graph) API, plain C.
 * The forward and backward are cuDNN operation graphs of matrix products, pointwise ops and
 * row reductions that cuDNN's flash-attention engines run as one kernel each (no T x T
 * scores in memory):
 *
 *   forward:  s = q @ k^T * scale [causal: keys after the query set to -inf];
 *             stats = max(s) + log(sum(exp(s - max))) per row (f32, natural log: the
 *             runtime's lse); out = (exp(s - max) / sum) @ v
 *   backward: d = rowsum(dout * out) (f32, in the workspace); p = exp(s - stats);
 *             dv = p^T @ dout; ds = p * (dout @ v^T - d) * scale;
 *             dk = ds^T @ q; dq = ds @ k, accumulated in f32 in the workspace
 *
 * Every head is a (positions, width) matrix, the heads one after the other: tensors
 * [heads, 1, positions, width] with strides [positions * width, positions * width, width, 1]
 * (k, and in the backward v, given to cuDNN as their transposes' strided views).
 * q, k, v, out, dout, dq, dk and dv are bf16 or fp16; stats f32.
 *
 * The backward comes in two forms of the same arithmetic (dmrt_sdpa_form), because cuDNN's
 * engines take a graph by its pattern, and the pattern NVIDIA's cudnn-frontend builds has
 * changed between its releases; dmrt_sdpa_plan_make tries them in turn.
 *
 * dmrt_sdpa_graph_build makes and finalizes every tensor and operation descriptor, which
 * cuDNN allows without a device (tests/gpu/test_cudnn_sdpa_graph.c checks that);
 * dmrt_sdpa_plan_make needs a cuDNN handle (a device): the operation graph, the engine the
 * heuristics rank first that finalizes, and its execution plan. */
#ifndef DMRT_CUDNN_SDPA_H
#define DMRT_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The unique ids of the graph's tensors that the caller gives pointers for. */
enum {
    DMRT_SDPA_Q = 1,
    DMRT_SDPA_K,
    DMRT_SDPA_V,
    DMRT_SDPA_OUT,
    DMRT_SDPA_STATS,
    DMRT_SDPA_DOUT,
    DMRT_SDPA_DQ,
    DMRT_SDPA_DK,
    DMRT_SDPA_DV,
    DMRT_SDPA_ROWSUM,  /* backward: rowsum(dout * out), f32, in the workspace */
    DMRT_SDPA_DQ_F32,  /* backward: dq accumulated in f32, in the workspace, zeroed first */
    DMRT_SDPA_UIDS     /* one past the last */
};

typedef struct dmrt_sdpa_shape {
    int64_t heads, positions, width;
    int half;          /* 1: fp16 operands; 0: bf16 */
    float scale;       /* of the scores */
    int causal;
    int backward;
} dmrt_sdpa_shape;

/* The forms of the backward graph, in the order dmrt_sdpa_plan_make tries them. */
typedef enum dmrt_sdpa_form {
    /* cudnn-frontend's on cuDNN before 9.21 (from 9.21 it makes the mask one
     * DIAGONAL_BAND_MASK operation): the causal mask after the statistics are subtracted,
     * k (for ds @ k) reshaped as f32, one scale tensor for the scores and ds */
    DMRT_SDPA_STATS_FIRST,
    /* dmc's first graph (the mask where the forward has it, as earlier frontends did): the
     * mask before the subtraction, k reshaped in the 16-bit type, a scale tensor each */
    DMRT_SDPA_MASK_FIRST,
    DMRT_SDPA_FORMS
} dmrt_sdpa_form;
const char *dmrt_sdpa_form_name(dmrt_sdpa_form form);

/* the causal backward makes 73 descriptors and 3 scalars (DMRT_SDPA_MASK_FIRST 74 and 4),
 * the causal forward 48 and 2; a plan up to 17 more */
#define DMRT_SDPA_MAX_DESCRIPTORS 128
#define DMRT_SDPA_MAX_SCALARS 8

typedef struct dmrt_sdpa_graph {
    dmrt_sdpa_shape shape;
    cudnnBackendDescriptor_t owned[DMRT_SDPA_MAX_DESCRIPTORS]; /* (n_owned) destroyed together */
    int n_owned;
    cudnnBackendDescriptor_t ops[DMRT_SDPA_MAX_DESCRIPTORS];   /* (n_ops) the operations, in order */
    const char *op_names[DMRT_SDPA_MAX_DESCRIPTORS];           /* (n_ops) each operation's name */
    int n_ops;
    dmrt_sdpa_form form;             /* of the backward; the forward has one */
    int64_t scalar_uid[DMRT_SDPA_MAX_SCALARS];  /* (n_scalars) the by-value constants */
    float scalar_value[DMRT_SDPA_MAX_SCALARS];
    int n_scalars;
    int64_t next_virtual;            /* the next unique id of an intermediate tensor */
    char error[640];                 /* why a build or plan failed (each form's reason) */
} dmrt_sdpa_graph;

/* Makes and finalizes the graph's tensors and operations (no device needed), the backward
 * in `form`. 0 or -1 with g->error set; free it either way with dmrt_sdpa_graph_free. */
int dmrt_sdpa_graph_build(dmrt_sdpa_graph *g, const dmrt_sdpa_shape *s, dmrt_sdpa_form form);
void dmrt_sdpa_graph_free(dmrt_sdpa_graph *g);

/* Workspace bytes the graph itself needs besides the engine's (the backward's rowsum and f32
 * dq), and where they lie in the workspace. */
int64_t dmrt_sdpa_own_workspace_bytes(const dmrt_sdpa_shape *s);

/* The operation graph of a built graph's operations (owned by it), on handle h when h is not
 * NULL (cuDNN finalizes one without a handle too); NULL with g->error set. */
cudnnBackendDescriptor_t dmrt_sdpa_op_graph(dmrt_sdpa_graph *g, cudnnHandle_t h);

typedef struct dmrt_sdpa_plan {
    dmrt_sdpa_graph graph;
    cudnnBackendDescriptor_t op_graph, heuristics, plan;
    int64_t engine_workspace;        /* bytes cuDNN's engine reports it needs */
} dmrt_sdpa_plan;

/* The graph, its operation graph and an execution plan on handle h: the backward's first
 * form cuDNN makes a plan for (p->graph.form says which). 0, or -1 with p->graph.error set
 * (no engine for the shape: "no cuDNN engine ...", each form's reason; or a shape or cuDNN
 * version cudnn-frontend refuses, before any graph: a head width not a multiple of 8 up to
 * 256, a backward of 1 position, the backward on cuDNN 9.10.0 and 9.10.1). */
int dmrt_sdpa_plan_make(dmrt_sdpa_plan *p, cudnnHandle_t h, const dmrt_sdpa_shape *s);
/* Runs the plan: data[uid] for every uid the direction uses; workspace of
 * dmrt_sdpa_own_workspace_bytes + engine_workspace bytes, its first part zeroed by the caller. */
int dmrt_sdpa_plan_run(dmrt_sdpa_plan *p, cudnnHandle_t h, void *const data[DMRT_SDPA_UIDS], void *workspace);
void dmrt_sdpa_plan_free(dmrt_sdpa_plan *p);

#ifdef __cplusplus
}
#endif

#endif
