/* cost.c: flops, bytes and messages of one op on one rank, and their time on a machine
 * described by a hardware file (passes/hardware.h; the default is the "nominal" preset,
 * the single roofline these rules used before). An op takes the longer of its flops and
 * its bytes, each at its peak times an efficiency, plus its messages: each step of a ring
 * pays the link's latency, and the bytes sent its bandwidth (alpha-beta). */
#include <math.h>

#include "hardware.h"
#include "passes.h"

/* Element operations per element of the result (or of the operand, for reductions). */
static double ops_per_element(const ir_value *v) {
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_SOFTMAX: return 5;
    case OPC_NORM: return 8;
    case OPC_LOSS:
    case OPC_LOSS_GRAD: return 6;
    case OPC_UNARY_GRAD: return 4;
    case OPC_UNARY:
        /* a transcendental function (silu's exp too, sin, cos) costs about as much as ten
         * multiply-adds; sqrt and rsqrt count as one */
        return v->op == OP_TANH || v->op == OP_SIGMOID || v->op == OP_EXP || v->op == OP_LOG || v->op == OP_GELU ||
               v->op == OP_SILU || v->op == OP_SIN || v->op == OP_COS ? 10 : 1;
    default: return 1;
    }
}

/* Fused attention over one rank's heads: per visible (query, key) pair, the products of
 * the forward (q.k, then p v: 4 D) or of the backward (the scores again, dp, dv, dq, dk:
 * 10 D), and the softmax's few operations; a causal mask halves the pairs (the blocks of
 * hidden keys are skipped). Costed as products, one call per head. */
static void attention_cost(const ir_graph *g, const ir_value *v, dm_op_cost *c) {
    ir_type q = ir_local_type(g, &g->values[v->operands[0]]->type);
    ir_attention_layout a = ir_attention_layout_of(v, &q);
    double t = (double)a.positions, width = (double)a.width, heads = (double)a.heads;
    double pairs = heads * (v->causal ? t * (t + 1) / 2 : t * t);
    c->flops = pairs * (v->op == OP_ATTENTION ? 4 * width + 5 : 10 * width + 8);
    c->matmul = 1;
    c->calls = heads;
}

/* An optimizer's update of one parameter, per element of it: AdamW's decay, two moments,
 * square root, divisions and step (about ten element operations: the generated loop takes
 * what ten axpy operations take on this project's machine); SGD's step with its weight
 * decay, and two more for a momentum buffer. Every operand but the gradient is written back
 * in place. */
static void update_cost(const ir_graph *g, const ir_value *v, dm_op_cost *c) {
    double n = (double)ir_local_numel(g, &g->values[v->operands[0]]->type);
    c->flops = n * (v->op == OP_ADAMW_UPDATE ? 10 : 3 + 2 * (v->n_operands - 2));
    c->bytes += 4.0 * n * (v->n_operands - 1);
}

/* A split cross-entropy's exchanges count as a collective over its classes' axis. */
static int communicates(const ir_graph *g, const ir_value *v) {
    if (ir_op_info_of(v->op)->cls == OPC_COLLECTIVE) return v->op != OP_SHARD_SLICE && v->op != OP_AS_PENDING;
    return v->op == OP_XENT_STATS && ir_class_split_axis(g, v) != IR_REPLICATED;
}

static int comm_axis(const ir_graph *g, const ir_value *v) {
    return v->op == OP_XENT_STATS ? ir_class_split_axis(g, v) : v->mesh_axis;
}

double cost_collective_sent(const ir_graph *g, const ir_value *c, double *messages) {
    *messages = 0;
    if (!communicates(g, c)) return 0;
    double n = (double)g->axes[comm_axis(g, c)].size;
    if (n <= 1) return 0;
    if (c->op == OP_XENT_STATS) {
        /* per local row: its maximum all-gathered, then two floats allreduced */
        const ir_type *logits = &g->values[c->operands[0]]->type;
        double rows = (double)ir_local_numel(g, logits) / (double)(logits->shape[logits->rank - 1] / (int64_t)n);
        *messages = (n - 1) + 2 * (n - 1);
        return 4 * rows * (n - 1) + 4 * 2 * rows * 2 * (n - 1) / n;
    }
    if (dm_compressed_allreduce(g, c)) return dm_compress_sent(g, c, messages);
    double operand = 4.0 * (double)ir_local_numel(g, &g->values[c->operands[0]]->type);
    switch (c->op) {
    case OP_ALLREDUCE: *messages = 2 * (n - 1); return operand * 2 * (n - 1) / n;
    case OP_ALLGATHER: *messages = n - 1; return operand * (n - 1);
    case OP_ZERO_GATHER: *messages = n - 1; return 4.0 * (double)ir_numel(&c->type) * (n - 1) / n;
    default: *messages = n - 1; return operand * (n - 1) / n;
    }
}

dm_op_cost cost_of_op(const ir_graph *g, const ir_value *v) {
    dm_op_cost c = {0};
    const ir_op_info *info = ir_op_info_of(v->op);
    if (info->cls == OPC_SOURCE) return c;
    if (v->op == OP_SLICE && dm_slice_reads_in_place(g, v)) return c; /* nothing copied (passes/slice_views.c) */
    double out = v->type.dtype == DT_VOID ? 0 : (double)ir_storage_elems(g, v);
    double in = 0;
    for (int k = 0; k < v->n_operands; k++) {
        const ir_value *x = g->values[v->operands[k]];
        if (x->role != ROLE_CONST) in += (double)ir_local_numel(g, &x->type);
    }
    c.bytes = 4.0 * (in + out);
    c.calls = info->cls == OPC_RESHAPE || info->cls == OPC_VIEW ? 0 : 1;
    c.fp32_master = v->phase == PHASE_UPDATE;
    switch (info->cls) {
    case OPC_MATMUL: {
        const ir_value *a = g->values[v->operands[0]];
        int r = a->type.rank;
        ir_type a_local = ir_local_type(g, &a->type);
        /* the summed length (ir/shapes.c's rules): a's last dim; batched with trans_a, its
         * second last; unbatched a^T b (a weight's gradient x^T dy), every row of a, all but
         * its last dim: [B, T, C] gives B T, [N, C] N, and a vector [C] one row (the outer
         * product of v @ w's gradient, where r - 2 would index shape[-1]) */
        double k = !v->trans_a         ? (double)a_local.shape[r - 1]
                   : v->batch_dims > 0 ? (double)a_local.shape[r - 2]
                                       : (double)ir_numel(&a_local) / (double)a_local.shape[r - 1];
        c.flops = 2.0 * out * k;
        c.matmul = 1;
        /* operands of rank 3 and more on both sides: a product per matrix (codegen loops over them) */
        const ir_value *b = g->values[v->operands[1]];
        ir_type local = ir_local_type(g, &v->type);
        double matrix = local.rank >= 2 ? (double)local.shape[local.rank - 2] * (double)local.shape[local.rank - 1] : 0;
        if (a->type.rank > 2 && b->type.rank > 2 && matrix > 0) c.calls = out / matrix;
        break;
    }
    case OPC_REDUCE:
    case OPC_LOSS: c.flops = ops_per_element(v) * in; break;
    case OPC_UPDATE: update_cost(g, v, &c); break;
    case OPC_ATTENTION: attention_cost(g, v, &c); break;
    case OPC_VIEW: c.bytes = 0; break; /* read in place */
    case OPC_RESHAPE:
    case OPC_TRANSPOSE:
    case OPC_SLICE:
    case OPC_GATHER:
    case OPC_COLLECTIVE: c.flops = 0; break;
    default: c.flops = ops_per_element(v) * out; break;
    }
    if (communicates(g, v)) {
        c.axis = comm_axis(g, v);
        c.sent = cost_collective_sent(g, v, &c.messages);
        /* a collective's own bytes are sent, not computed on; compressing them is computed */
        if (info->cls == OPC_COLLECTIVE) c.bytes = 0;
        if (dm_compressed_allreduce(g, v)) c.flops = dm_compress_flops(g, v);
    }
    return c;
}

/* Mesh axis a's size in the layout the model costs (dm_cost_model.axis_sizes). */
static int64_t axis_size(const ir_graph *g, const dm_cost_model *m, int a) {
    return m && m->axis_sizes ? m->axis_sizes[a] : g->axes[a].size;
}

const dm_link *cost_axis_link(const ir_graph *g, const dm_cost_model *m, int axis) {
    const dm_hardware *hw = cost_hardware(m);
    int64_t span = 1;
    for (int a = g->n_axes - 1; a >= axis && a >= 0; a--) span *= axis_size(g, m, a);
    return span <= hw->devices_per_node ? &hw->intra_node : &hw->inter_node;
}

const dm_hardware *cost_hardware(const dm_cost_model *m) {
    return m && m->hardware ? m->hardware : dm_hardware_default();
}

/* Ranks on one node: the plan's, up to a node's devices. */
static double ranks_per_node(const ir_graph *g, const dm_cost_model *m, const dm_hardware *hw) {
    double ranks = 1;
    for (int a = 0; a < g->n_axes; a++) ranks *= (double)axis_size(g, m, a);
    return ranks < hw->devices_per_node ? ranks : hw->devices_per_node;
}

/* The threads a rank's loops and products run on: on a CPU (a hardware with lone_rank
 * figures, whose devices are cores) libdmrt gives each rank cores / ranks of its node
 * (dmrt_threads_per_rank); elsewhere 1. */
static double rank_threads(const ir_graph *g, const dm_cost_model *m, const dm_hardware *hw) {
    if (hw->lone_rank_threads <= 1) return 1;
    double threads = floor((double)hw->devices_per_node / ranks_per_node(g, m, hw));
    return threads > 1 ? threads : 1;
}

/* flop/s of one product of call_flops: the precision's peak at the efficiency for its
 * size (where the hardware has a curve), on every core of a CPU when its rank is alone
 * (measured so: lone_rank), on its share of them otherwise (split in as many products). */
static double matmul_rate(const ir_graph *g, const dm_cost_model *m, const dm_hardware *hw, double call_flops) {
    double peak = hw->peak_flops[m ? m->precision : DM_FP32];
    if (hw->lone_rank_threads > 1 && ranks_per_node(g, m, hw) <= 1)
        return peak * hw->lone_rank_threads * dm_size_curve_at(&hw->lone_rank_matmul, call_flops);
    double threads = rank_threads(g, m, hw);
    return threads * peak *
           (hw->matmul_by_size.n ? dm_size_curve_at(&hw->matmul_by_size, call_flops / threads) : hw->matmul_efficiency);
}

double cost_seconds(const ir_graph *g, const dm_cost_model *m, dm_op_cost c) {
    const dm_hardware *hw = cost_hardware(m);
    double calls = c.calls > 0 ? c.calls : 1;
    /* a CPU rank's loops run on its cores (the memory figures are per core, too) */
    double threads = c.matmul ? 1 : rank_threads(g, m, hw);
    double rate = c.matmul ? matmul_rate(g, m, hw, c.flops / calls)
                           : threads * (hw->vector_flops > 0 ? hw->vector_flops : hw->peak_flops[DM_FP32]);
    /* 16-bit training keeps activations and their gradients in 2-byte elements, as
     * Megatron-LM does (the runs this model is checked against); dmc's own generated code
     * keeps only the products' operands in 2 bytes (passes/precision.c), so its 16-bit runs
     * are costed as Megatron-LM's would be */
    if (m && (m->precision == DM_BF16 || m->precision == DM_FP16) && !c.fp32_master) c.bytes /= 2, c.sent /= 2;
    double bandwidth = c.in_cache && hw->cache_bandwidth > 0 ? hw->cache_bandwidth : hw->memory_bandwidth;
    double compute = c.flops / rate, memory = c.bytes / (threads * bandwidth * hw->memory_efficiency);
    double t = compute > memory ? compute : memory;
    /* a product's curve includes its calls' overheads; other kernels pay theirs */
    if (!c.matmul) t += c.calls * hw->kernel_overhead;
    if (c.sent > 0 || c.messages > 0) {
        const dm_link *link = cost_axis_link(g, m, c.axis);
        t += c.messages * link->latency + c.sent / (link->bandwidth * hw->link_efficiency);
    }
    return t;
}

double cost_cached_share(const ir_graph *g, const dm_cost_model *m, double bytes) {
    const dm_hardware *hw = cost_hardware(m);
    if (hw->cache_bandwidth <= 0 || hw->cache_bytes <= 0) return 0;
    double cache = hw->cache_bytes * rank_threads(g, m, hw);
    return bytes <= cache ? 1 : cache / bytes;
}

double cost_link_seconds(const ir_graph *g, const dm_cost_model *m, int axis, double bytes) {
    if (axis < 0 || bytes <= 0) return 0;
    const dm_hardware *hw = cost_hardware(m);
    const dm_link *link = cost_axis_link(g, m, axis);
    return link->latency + bytes / (link->bandwidth * hw->link_efficiency);
}
