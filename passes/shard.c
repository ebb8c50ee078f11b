/* shard.c: sharding completion and resharding over the joint graph (forward, backward,
 * update). requires: the typed joint graph (after the optimizer pass) and the mesh;
 * leaves: every value's type carrying its sharding (split per dim, pending sums), a
 * collective op wherever a consumer needs its operand sharded otherwise than it was
 * produced, and one dm_reshard record per collective (for --explain). Rebuilds the
 * value list (new ids; params, inputs, outputs, loss and grads follow).
 *
 * Values are visited in execution order. Sources take the sharding written in the .dm
 * (unannotated ones are replicated; optimizer state follows its parameter). Every other
 * op applies its rule (ir.h, ir_shard_rule): from its operands' shardings it picks the
 * result's and says which sharding it needs of each operand; where an operand differs,
 * collectives are inserted before the op (one set per operand and target, shared by
 * every consumer). A value annotated in the .dm is resharded to its annotation right
 * after it is made. The loss and the outputs are made whole (no pending sum, no split); an update
 * needs its gradient and state sharded as its parameter, so a parameter's gradient that
 * comes out partial over `data` is allreduced there, and the gradient role moves to the
 * reduced value (any other resharding of a gradient is done where it is made).
 * With sequence parallelism (ir_graph.sequence_parallel) two rules change: a pending sum
 * over tensor completed at an elementwise op is reduce-scattered over rows
 * (split_sequence), and a tensor-parallel product gathers such rows (gather_sequence).
 *
 * Mesh axes of size 1 are dropped from every sharding first: a mesh of one is the
 * serial program. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define MAX_OPERANDS 6

typedef struct shard_state {
    ir_graph *g;
    dm_diag *d;
    dm_reshard_list *log;
    int *map;            /* (old values) new id standing for an old value */
    /* reshards made so far, per source value (new ids): a chain through next */
    /* (old values) whether every consumer of the value is an add or a sub, at least one:
     * a sum made there may stay pending (join_pending_sum) */
    unsigned char *feeds_sums_only;
    int visiting;        /* the old value being decided */
    int *uses;           /* (old values) how many ops read the value */
    int operand_uses[MAX_OPERANDS]; /* the visiting value's operands' uses */
    int *first_cache;    /* (cache_ids) index into cache, or -1 */
    int cache_ids;
    struct cached { int result, next; } *cache;
    int n_cache;
    int errors;
} shard_state;

static ir_value *V(shard_state *S, int id) { return S->g->values[id]; }

static int axis_size(const ir_graph *g, int axis) { return axis < 0 ? 1 : (int)g->axes[axis].size; }

int dm_sequence_axis(const ir_graph *g) {
    return g->sequence_parallel ? ir_role_axis(g, g->tensor_axis) : -1;
}

/* Keeps first_cache as long as the value list (new values have no reshards yet). */
static void cache_room(shard_state *S) {
    if (S->cache_ids >= S->g->n_values) return;
    int n = S->g->n_values * 2 + 16;
    S->first_cache = realloc(S->first_cache, (size_t)n * sizeof(int));
    if (!S->first_cache) abort();
    for (int i = S->cache_ids; i < n; i++) S->first_cache[i] = -1;
    S->cache_ids = n;
}

static void clear_sharding(ir_type *t) {
    for (int i = 0; i < IR_MAX_RANK; i++) t->split[i] = IR_REPLICATED;
    t->partial = 0;
}

static int same_sharding(const ir_type *a, const ir_type *b) {
    if (a->partial != b->partial || a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->split[i] != b->split[i]) return 0;
    return 1;
}

/* Mesh axes splitting some dim, as bits. */
static uint32_t split_axes(const ir_type *t) {
    uint32_t used = 0;
    for (int i = 0; i < t->rank; i++)
        if (t->split[i] != IR_REPLICATED) used |= 1u << t->split[i];
    return used;
}

/* Drops splits over size-1 axes and splits that do not divide their dim evenly (the
 * latter only where the user did not ask: annotations were checked when lowered). */
static void drop_trivial(const ir_graph *g, ir_type *t) {
    for (int i = 0; i < t->rank; i++)
        if (t->split[i] != IR_REPLICATED &&
            (axis_size(g, t->split[i]) == 1 || t->shape[i] % axis_size(g, t->split[i]) != 0))
            t->split[i] = IR_REPLICATED;
    for (int a = 0; a < g->n_axes; a++)
        if (axis_size(g, a) == 1) t->partial &= ~(1u << a);
}

/* ---- collectives ------------------------------------------------------------------------ */

static int add_collective(shard_state *S, ir_op op, int source, int mesh_axis, int dim, int dim2, const char *reason,
                          ir_phase phase) {
    ir_value *src = V(S, source);
    ir_value *c = ir_add(S->g, op, &source, 1, src->loc);
    c->phase = phase > src->phase ? phase : src->phase;
    c->mesh_axis = mesh_axis;
    c->axis = dim;
    c->axis2 = dim2;
    c->name = src->name ? ir_internf(S->g, "%s.%s", src->name, ir_op_info_of(op)->name) : NULL;
    S->errors += shapes_infer(S->g, c, S->d);
    dm_reshard r = {.value = c->id, .source_line = src->loc.line, .reason = reason};
    S->log->items = ir_grow(S->log->items, S->log->n, sizeof *S->log->items);
    S->log->items[S->log->n++] = r;
    cache_room(S);
    return c->id;
}

/* Collectives taking source (sharded as it is) to the sharding of want: pending sums
 * first (reduce-scatter where the target splits a dim the source does not, else
 * allreduce), then per dim: a split moving between dims over one axis is an all-to-all,
 * a split dropped is an all-gather, a split added is a local slice. */
static int convert(shard_state *S, int source, const ir_type *want, const char *reason, ir_phase phase) {
    int cur = source;
    const ir_graph *g = S->g;
    for (int a = 0; a < g->n_axes; a++) {
        uint32_t bit = 1u << a;
        const ir_type *t = &V(S, cur)->type;
        if (!(t->partial & bit) || (want->partial & bit)) continue;
        int dim = -1;
        for (int i = 0; i < t->rank; i++)
            if (want->split[i] == a && t->split[i] == IR_REPLICATED) dim = i;
        cur = dim >= 0 ? add_collective(S, OP_REDUCE_SCATTER, cur, a, dim, 0, reason, phase)
                       : add_collective(S, OP_ALLREDUCE, cur, a, 0, 0, reason, phase);
    }
    for (int i = 0; i < want->rank; i++) {
        const ir_type *t = &V(S, cur)->type;
        int have = t->split[i], need = want->split[i];
        if (have == need || have == IR_REPLICATED) continue;
        int to = -1;
        for (int j = 0; j < t->rank; j++)
            if (j != i && want->split[j] == have && t->split[j] == IR_REPLICATED) to = j;
        cur = to >= 0 ? add_collective(S, OP_ALLTOALL, cur, have, i, to, reason, phase)
                      : add_collective(S, OP_ALLGATHER, cur, have, i, 0, reason, phase);
    }
    for (int i = 0; i < want->rank; i++) {
        const ir_type *t = &V(S, cur)->type;
        if (t->split[i] == IR_REPLICATED && want->split[i] != IR_REPLICATED)
            cur = add_collective(S, OP_SHARD_SLICE, cur, want->split[i], i, 0, reason, phase);
    }
    for (int a = 0; a < g->n_axes; a++) {
        uint32_t bit = 1u << a;
        const ir_type *t = &V(S, cur)->type;
        if ((want->partial & bit) && !(t->partial & bit) && !(split_axes(t) & bit))
            cur = add_collective(S, OP_AS_PENDING, cur, a, 0, 0, reason, phase);
    }
    if (want->partial & ~V(S, cur)->type.partial) {
        dm_error(S->d, V(S, source)->loc, "internal: cannot make a pending sum appear by resharding");
        S->errors++;
    }
    return cur;
}

/* source resharded to want, reusing an earlier conversion of the same value. */
static int reshard(shard_state *S, int source, const ir_type *want, const char *reason, ir_phase phase) {
    if (same_sharding(&V(S, source)->type, want)) return source;
    for (int k = S->first_cache[source]; k >= 0; k = S->cache[k].next)
        if (same_sharding(&V(S, S->cache[k].result)->type, want)) return S->cache[k].result;
    int result = convert(S, source, want, reason, phase);
    S->cache = ir_grow(S->cache, S->n_cache, sizeof *S->cache);
    S->cache[S->n_cache] = (struct cached){result, S->first_cache[source]};
    S->first_cache[source] = S->n_cache++;
    return result;
}

/* ---- rules ------------------------------------------------------------------------------- */

/* A rule's decision: the result's sharding (in res) and the sharding wanted of each
 * operand (want[k], starting as the operand is), with a reason for any change. */
typedef struct decision {
    ir_type res;
    ir_type want[MAX_OPERANDS];
    const char *reason;
} decision;

static const ir_type *operand(shard_state *S, const ir_value *v, int k) { return &V(S, v->operands[k])->type; }

/* Whether an elementwise op is linear in operand k (the others held fixed). */
static int linear_in(const ir_value *v, int k) {
    switch (v->op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL: return 1;
    case OP_DIV:
    case OP_NEG:
    case OP_IDENTITY: return k == 0;
    case OP_UNARY_GRAD: return k == 2; /* f'(x, y) * dy */
    default: return 0;
    }
}

/* An add (sub) of sums pending over the same axes and of whole operands, whose result
 * feeds only more adds (a gradient accumulated from several uses: RMSNorm written from
 * ops gives a residual's gradient three pending terms and one whole): the whole operands
 * join the pending sum (as_pending: the rank at coordinate 0 holds them, the others
 * zeros), so that the chain is completed by one collective where it is read, not one per
 * pending term. Only in the backward pass, where gradients accumulate, and not in a forward
 * op's recomputed copy (it must make the forward's very bits): a forward chain
 * (a row-parallel product, its bias, the residual) holds one pending term, which joining
 * would only move past the bias. Returns the axes pending in the result, 0 where the sum
 * is completed here instead. */
static uint32_t join_pending_sum(shard_state *S, const ir_value *v, const decision *D) {
    uint32_t pending = 0;
    for (int k = 0; k < v->n_operands; k++) {
        uint32_t p = operand(S, v, k)->partial;
        if (!p) continue;
        if (pending && p != pending) return 0;
        pending = p;
    }
    if (!pending || (pending & split_axes(&D->res)) || !S->feeds_sums_only[S->visiting] || v->phase != PHASE_BACKWARD ||
        v->recomputed)
        return 0;
    for (int k = 0; k < v->n_operands; k++)
        if (!operand(S, v, k)->partial && (split_axes(&D->want[k]) & pending)) return 0;
    return pending;
}

/* Why an elementwise op changes its operands' pending sums (--explain shows it). */
static const char *completion_reason(const ir_value *v, uint32_t joined, int carriers, uint32_t keep) {
    if (joined) return "whole operands join the pending sum they are added to";
    if (v->op == OP_ADD || v->op == OP_SUB)
        return carriers < v->n_operands ? "a pending sum is completed before it is added to a whole operand"
                                        : "sums pending over different axes are completed before they are added";
    if (carriers > 1 && linear_in(v, 0)) return "a product of two pending sums needs them complete";
    if (keep) return "a pending sum is completed where its axis splits the result";
    return "a pending sum must be complete before a non-linear op";
}

/* Sequence parallelism (ir_graph.sequence_parallel): where an elementwise op completes a
 * pending sum over tensor and nothing splits its result over tensor yet, the sum is
 * reduce-scattered over the rows instead of allreduced: the result's last whole row dim
 * that tensor divides (T of [B, T, C]) splits, and so does each operand's (a whole one is
 * sliced locally). Elementwise ops, layernorms and residual adds then keep the split,
 * and the next tensor-parallel product gathers the rows (gather_sequence). */
static void split_sequence(shard_state *S, const ir_value *v, decision *D) {
    int axis = dm_sequence_axis(S->g), rank = v->type.rank;
    if (axis < 0 || (D->res.partial >> axis) & 1u || (split_axes(&D->res) >> axis) & 1u) return;
    int completed = 0;
    for (int k = 0; k < v->n_operands; k++) completed |= (int)((operand(S, v, k)->partial >> axis) & 1u);
    if (!completed) return;
    int row = -1;
    for (int i = rank - 2; i >= 0 && row < 0; i--)
        if (D->res.split[i] == IR_REPLICATED && v->type.shape[i] % axis_size(S->g, axis) == 0) row = i;
    if (row < 0) return;
    D->res.split[row] = (int8_t)axis;
    for (int k = 0; k < v->n_operands; k++) {
        ir_type *w = &D->want[k];
        int ti = row - (rank - w->rank);
        if (ti >= 0 && w->shape[ti] != 1) w->split[ti] = (int8_t)axis;
    }
    D->reason = "sequence parallelism: rows split over tensor between its products";
}

/* Elementwise ops with numpy broadcasting: each result dim takes the split of the
 * operands that have it (a size-1 dim never splits); where operands disagree the
 * larger operand's split wins (the smaller moves, the cheaper resharding), and an
 * operand that is whole is sliced locally, which costs nothing. */
static void rule_elementwise(shard_state *S, const ir_value *v, decision *D) {
    int n = v->n_operands;
    int rank = v->type.rank;
    for (int i = 0; i < rank; i++) {
        int best = IR_REPLICATED;
        int64_t best_size = -1;
        for (int k = 0; k < n; k++) {
            const ir_type *t = operand(S, v, k);
            int ti = i - (rank - t->rank);
            if (ti < 0 || t->split[ti] == IR_REPLICATED) continue;
            if (ir_numel(t) > best_size) best = t->split[ti], best_size = ir_numel(t);
        }
        /* an axis may split one dim only */
        for (int j = 0; j < i; j++)
            if (best != IR_REPLICATED && D->res.split[j] == best) best = IR_REPLICATED;
        D->res.split[i] = (int8_t)best;
        for (int k = 0; k < n; k++) {
            ir_type *w = &D->want[k];
            int ti = i - (rank - w->rank);
            if (ti < 0) continue;
            int target = w->shape[ti] == 1 ? IR_REPLICATED : best;
            if (w->split[ti] != target) {
                w->split[ti] = (int8_t)target;
                D->reason = "operands of an elementwise op sharded differently";
            }
        }
    }
    /* A pending sum survives an op linear in the one operand that carries it (add and
     * sub: every operand pending alike, since a whole operand would be summed once per
     * rank); any other pending sum is completed first. */
    uint32_t keep = 0;
    int carriers = 0, carrier = -1, alike = 1;
    for (int k = 0; k < n; k++) {
        uint32_t p = operand(S, v, k)->partial;
        if (p) carriers++, carrier = k, keep = p;
        if (p != operand(S, v, 0)->partial) alike = 0;
    }
    int sum = v->op == OP_ADD || v->op == OP_SUB, joined = 0;
    if (sum && !alike) keep = joined = join_pending_sum(S, v, D);
    else if (!sum && (carriers != 1 || !linear_in(v, carrier))) keep = 0;
    /* sequence parallelism: a pending sum read by other ops too is completed here, once,
     * and they reuse it (use_reduced_operands); kept pending through this op, it would be
     * reduce-scattered again where the other ops read it beside split rows (an RMSNorm's
     * output gradient: by the weight's gradient, and times the weight by the input's) */
    else if (!sum && dm_sequence_axis(S->g) >= 0 && carrier < MAX_OPERANDS && S->operand_uses[carrier] > 1 &&
             ((keep >> dm_sequence_axis(S->g)) & 1u))
        keep = 0;
    keep &= ~split_axes(&D->res);
    D->res.partial = keep;
    for (int k = 0; k < n; k++) {
        uint32_t allowed = keep && linear_in(v, k) && (joined || D->want[k].partial == keep) ? keep : 0;
        if (D->want[k].partial != allowed) {
            if (!D->reason) D->reason = completion_reason(v, joined, carriers, keep);
            D->want[k].partial = allowed;
        }
    }
    split_sequence(S, v, D);
}

/* reductions keep the split of kept dims; a reduced split dim becomes a pending sum */
static void rule_reduce(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *x = operand(S, v, 0);
    D->res.partial = x->partial;
    if (v->op == OP_BROADCAST) {
        for (int i = 0, k = 0; i < v->type.rank; i++)
            D->res.split[i] = (v->axes >> i) & 1u ? IR_REPLICATED : x->split[k++];
        return;
    }
    /* sum and mean drop the reduced dims; sum_to drops the leading ones and keeps
     * the others as size 1 */
    int lead = v->op == OP_SUM_TO ? x->rank - v->type.rank : 0;
    for (int i = 0, r = 0; i < x->rank; i++) {
        int reduced = (v->axes >> i) & 1u;
        if (reduced && x->split[i] != IR_REPLICATED) D->res.partial |= 1u << x->split[i];
        if (v->op == OP_SUM_TO && i >= lead) D->res.split[i - lead] = reduced ? IR_REPLICATED : x->split[i];
        else if (v->op != OP_SUM_TO && !reduced) D->res.split[r++] = x->split[i];
    }
}

/* Reshape: a split survives when its dim maps to a result dim whose leading factor it
 * is (merging [B@data, T] into [B*T@data], or splitting [C@tensor] into
 * [NH@tensor, HS]); any other split is gathered first. */
static void rule_reshape(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *x = operand(S, v, 0);
    const ir_type *y = &v->type;
    D->res.partial = x->partial;
    /* walk both shapes in groups of equal products */
    int i = 0, j = 0;
    while (i < x->rank && j < y->rank) {
        int i0 = i, j0 = j;
        int64_t px = x->shape[i++], py = y->shape[j++];
        while (px != py) {
            if (px < py) px *= x->shape[i++];
            else py *= y->shape[j++];
        }
        while (i < x->rank && x->shape[i] == 1) i++;
        /* the first non-1 dim of each side leads its group */
        int lead_x = i0, lead_y = j0;
        while (lead_x < i - 1 && x->shape[lead_x] == 1) lead_x++;
        while (lead_y < j - 1 && y->shape[lead_y] == 1) lead_y++;
        for (int a = i0; a < i; a++) {
            int axis = x->split[a];
            if (axis == IR_REPLICATED) continue;
            if (a == lead_x && y->shape[lead_y] % axis_size(S->g, axis) == 0 &&
                (x->shape[a] % axis_size(S->g, axis) == 0))
                D->res.split[lead_y] = (int8_t)axis;
            else {
                D->want[0].split[a] = IR_REPLICATED;
                D->reason = "reshape moves a split dim";
            }
        }
    }
}

static void rule_transpose(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *x = operand(S, v, 0);
    D->res.partial = x->partial;
    for (int i = 0; i < v->type.rank; i++) D->res.split[i] = x->split[v->perm[i]];
}

/* One contracting dim pair (a's dim ka, b's dim kb): split alike, the product is a
 * pending sum over that axis; split on one side only, the other side is sliced
 * locally (no communication). Returns the axis or IR_REPLICATED. */
static int contract(decision *D, const ir_type *a, int ka, const ir_type *b, int kb) {
    int sa = a->split[ka], sb = b->split[kb];
    int axis = sa != IR_REPLICATED ? sa : sb;
    D->want[0].split[ka] = (int8_t)axis;
    D->want[1].split[kb] = (int8_t)axis;
    return axis;
}

/* Sequence parallelism: rows of a (and with trans_a, of b) split over tensor where a
 * weight dim (a's last, b's others) is split over it too are gathered: the weight keeps
 * its tensor-parallel split and the activation moves (the all-gather before a
 * column-parallel product, and before a row-parallel one's backward). Without it the
 * rows keep their split and the weight is gathered (tests/spmd/forms.dm). */
static void gather_sequence(shard_state *S, const ir_value *v, decision *D) {
    int axis = dm_sequence_axis(S->g);
    if (axis < 0 || v->batch_dims > 0) return;
    ir_type *a = &D->want[0], *b = &D->want[1];
    int weight_uses = a->split[a->rank - 1] == axis;
    for (int i = v->trans_a ? b->rank - 1 : 0; i < b->rank; i++) weight_uses |= b->split[i] == axis;
    if (!weight_uses) return;
    for (int k = 0; k < (v->trans_a ? 2 : 1); k++)
        for (int i = 0; i + 1 < D->want[k].rank; i++)
            if (D->want[k].split[i] == axis) {
                D->want[k].split[i] = IR_REPLICATED;
                D->reason = "sequence parallelism: a tensor-parallel product gathers the sequence";
            }
}

static void rule_matmul(shard_state *S, const ir_value *v, decision *D) {
    gather_sequence(S, v, D);
    const ir_type a_wanted = D->want[0], b_wanted = D->want[1];
    const ir_type *a = &a_wanted, *b = &b_wanted;
    /* from[i]: the dims of a and of b that result dim i comes from (-1: neither) */
    int from[IR_MAX_RANK][2];
    int nb = v->batch_dims, r = 0;
    uint32_t partial = 0;
    for (int i = 0; i < nb; i++, r++) from[r][0] = from[r][1] = i;
    if (nb > 0) {
        int am = v->trans_a ? nb + 1 : nb, ak = v->trans_a ? nb : nb + 1;
        int bk = v->trans_b ? nb + 1 : nb, bn = v->trans_b ? nb : nb + 1;
        int k = contract(D, a, ak, b, bk);
        if (k != IR_REPLICATED) partial |= 1u << k;
        from[r][0] = am, from[r++][1] = -1;
        from[r][0] = -1, from[r++][1] = bn;
    } else if (v->trans_a) {
        /* a (rows..., K), b (rows..., N): the rows contract; only alike layouts keep splits */
        int alike = a->rank == b->rank;
        for (int i = 0; alike && i + 1 < a->rank; i++) alike = a->shape[i] == b->shape[i];
        for (int i = 0; i + 1 < a->rank; i++) {
            if (!alike) {
                D->want[0].split[i] = IR_REPLICATED;
                continue;
            }
            int k = contract(D, a, i, b, i);
            if (k != IR_REPLICATED) partial |= 1u << k;
        }
        for (int i = 0; !alike && i + 1 < b->rank; i++) D->want[1].split[i] = IR_REPLICATED;
        from[r][0] = a->rank - 1, from[r++][1] = -1;
        from[r][0] = -1, from[r++][1] = b->rank - 1;
    } else {
        int bk = v->trans_b ? 1 : 0;
        int k = contract(D, a, a->rank - 1, b, bk);
        if (k != IR_REPLICATED) partial |= 1u << k;
        for (int i = 0; i + 1 < a->rank; i++) from[r][0] = i, from[r++][1] = -1;
        from[r][0] = -1, from[r++][1] = 1 - bk;
    }
    /* each result dim takes its operands' split (a's first); an axis used twice (two
     * result dims, or a result dim and the contraction) keeps its first use; the
     * operands are then wanted exactly so */
    uint32_t seen = partial;
    for (int i = 0; i < r; i++) {
        int s = IR_REPLICATED;
        if (from[i][0] >= 0) s = a->split[from[i][0]];
        if (s == IR_REPLICATED && from[i][1] >= 0) s = b->split[from[i][1]];
        if (s != IR_REPLICATED && (seen & (1u << s))) s = IR_REPLICATED;
        if (s != IR_REPLICATED) seen |= 1u << s;
        D->res.split[i] = (int8_t)s;
        if (from[i][0] >= 0) D->want[0].split[from[i][0]] = (int8_t)s;
        if (from[i][1] >= 0) D->want[1].split[from[i][1]] = (int8_t)s;
    }
    /* linear in each operand: one operand's pending sum may pass through, on axes the
     * result does not otherwise use */
    if (a->partial && b->partial) D->want[1].partial = 0;
    for (int k = 0; k < 2; k++) D->want[k].partial &= ~(split_axes(&D->res) | partial);
    D->res.partial = partial | D->want[0].partial | D->want[1].partial;
    if (!same_sharding(&D->want[0], a) || !same_sharding(&D->want[1], b)) D->reason = "matmul operands sharded differently";
}

/* Ops along one dim (softmax, masks, layernorm, cross-entropy): that dim must be whole
 * and no sum pending; the others keep their split. Cross-entropy's classes may stay
 * split: its statistics are then made vocabulary-parallel (Megatron-LM), exchanging
 * per-row maxima and sums inside the op instead of gathering the logits
 * (ir_class_split_axis), and its gradient reads them with no exchange of its own. */
static void rule_rowwise(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *x = operand(S, v, 0);
    int whole_from = x->rank - 1, whole_to = x->rank - 1;
    if (ir_class_split_axis(S->g, v) != IR_REPLICATED) whole_from = whole_to = x->rank; /* none */
    if (v->op == OP_SOFTMAX || v->op == OP_SOFTMAX_GRAD) whole_from = whole_to = v->axis;
    if (v->op == OP_CAUSAL_MASK || v->causal) whole_from = x->rank - 2; /* query positions matter */
    for (int k = 0; k < v->n_operands; k++) {
        ir_type *w = &D->want[k];
        if (w->partial) D->reason = "a pending sum must be complete before a non-linear op";
        w->partial = 0;
    }
    /* x-shaped operands agree with x; vectors (layernorm weight, bias) are whole */
    for (int k = 0; k < v->n_operands; k++) {
        ir_type *w = &D->want[k];
        const ir_type *t = operand(S, v, k);
        for (int i = 0; i < w->rank; i++) {
            int target = IR_REPLICATED;
            if (t->rank == x->rank && !(i >= whole_from && i <= whole_to)) target = x->split[i];
            if ((v->op == OP_CROSS_ENTROPY_GRAD || v->op == OP_XENT_STATS) && k == 1) target = x->split[i];
            /* the statistics: rows as the logits', each row's three whole */
            if (v->op == OP_CROSS_ENTROPY_GRAD && k == 3) target = i + 1 < w->rank ? x->split[i] : IR_REPLICATED;
            if (w->split[i] != target) {
                w->split[i] = (int8_t)target;
                D->reason = "the dim an op works along must be whole";
            }
        }
    }
    if (v->op == OP_CROSS_ENTROPY || v->op == OP_LAYERNORM_WGRAD) {
        /* a mean (sum) over rows: split rows leave a pending sum */
        for (int i = 0; i + 1 < x->rank; i++)
            if (D->want[0].split[i] != IR_REPLICATED) D->res.partial |= 1u << D->want[0].split[i];
        return;
    }
    for (int i = 0; i < v->type.rank; i++) D->res.split[i] = D->want[0].split[i];
    if (v->op == OP_XENT_STATS) D->res.split[v->type.rank - 1] = IR_REPLICATED;
}

static void rule_slice(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *x = operand(S, v, 0);
    D->res.partial = x->partial;
    if (x->split[v->axis] != IR_REPLICATED) {
        D->want[0].split[v->axis] = IR_REPLICATED;
        D->reason = "a sliced dim must be whole";
    }
    for (int i = 0; i < v->type.rank; i++) D->res.split[i] = D->want[0].split[i];
}

/* embed_grad of a table whose rows are split over axis a (vocabulary parallel, Megatron's
 * VocabParallelEmbedding), ids and dy whole over a: each rank makes the gradient of its own
 * rows (the ids in its range), split as the table is, instead of every row's gradient
 * pending over a, which would be reduce-scattered to that split. A dy pending over a is
 * completed first where its allreduce sends less than that reduce-scatter would (dy's
 * elements twice against the gradient's once: llama.dm on tensor=2, 4 MiB against 31). */
static void embed_grad_rows(shard_state *S, const ir_value *v, decision *D) {
    const ir_value *forward = v->origin;
    if (!forward || forward->op != OP_EMBED) return;
    int a = V(S, S->map[forward->operands[0]])->type.split[0];
    const ir_type *ids = operand(S, v, 0), *dy = operand(S, v, 1);
    if (a == IR_REPLICATED || (ids->partial >> a & 1u)) return;
    for (int i = 0; i < ids->rank; i++)
        if (ids->split[i] == a) return;
    for (int i = 0; i < dy->rank; i++)
        if (dy->split[i] == a) return;
    uint32_t bit = 1u << a;
    if (dy->partial & bit) {
        if (2.0 * (double)ir_local_numel(S->g, dy) >= (double)ir_local_numel(S->g, &D->res)) return;
        D->want[1].partial &= ~bit;
        D->reason = "each rank makes its vocabulary rows' gradient from dy complete (sends less than reduce-scattering "
                    "every row's)";
    }
    D->res.partial &= ~bit;
    D->res.split[0] = a;
}

/* embed(table, ids): leading dims split like ids, the width like the table; a table
 * split over its rows (vocabulary) gives a pending sum (rows a rank lacks are zero).
 * embed_grad(ids, dy): rows spread over ranks leave a pending sum; a table split over
 * its rows gets its gradient made so (embed_grad_rows). */
static void rule_gather(shard_state *S, const ir_value *v, decision *D) {
    if (v->op == OP_EMBED) {
        const ir_type *table = operand(S, v, 0), *ids = operand(S, v, 1);
        for (int i = 0; i < ids->rank; i++) D->res.split[i] = ids->split[i];
        D->res.split[ids->rank] = table->split[1];
        if (table->split[0] != IR_REPLICATED) D->res.partial |= 1u << table->split[0];
        D->want[0].partial = 0;
        return;
    }
    const ir_type *ids = operand(S, v, 0);
    ir_type *dy = &D->want[1];
    for (int i = 0; i < ids->rank; i++) {
        dy->split[i] = ids->split[i];
        if (ids->split[i] != IR_REPLICATED) D->res.partial |= 1u << ids->split[i];
    }
    D->res.split[1] = dy->split[ids->rank];
    D->res.partial |= dy->partial;
    if (!same_sharding(dy, operand(S, v, 1))) D->reason = "embedding gradient rows sharded like the ids";
    embed_grad_rows(S, v, D);
}

/* Fused attention and its backward: the batch dims (all but the positions and the head's
 * width) split as q's, in every operand and the result; positions and width whole (a
 * query reads every key), no sum pending. The backward's stacked result leads with the
 * dim of its three parts, whole. */
static void rule_attention(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *q = operand(S, v, 0);
    int positions = ir_attention_layout_of(v, q).positions_dim;
    for (int k = 0; k < v->n_operands; k++) {
        ir_type *w = &D->want[k];
        for (int i = 0; i < w->rank; i++) {
            /* q's dims, and the row log-sum-exp's (q's without the width) */
            int target = i != positions && i < q->rank - 1 ? q->split[i] : IR_REPLICATED;
            if (w->split[i] != target) {
                w->split[i] = (int8_t)target;
                D->reason = "attention reads its operands split alike, positions whole";
            }
        }
        if (w->partial) {
            w->partial = 0;
            D->reason = "a pending sum must be complete before a non-linear op";
        }
    }
    int lead = v->op == OP_ATTENTION_GRAD;
    for (int i = 0; i < q->rank - 1; i++)
        if (i != positions) D->res.split[i + lead] = q->split[i];
}

/* A view keeps its operand's sharding on the dims it keeps (the operand's buffer, read in
 * place, is never resharded for it). */
static void rule_view(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *x = operand(S, v, 0);
    int skip = v->op == OP_STACKED_PART;
    for (int i = 0; i < v->type.rank; i++) D->res.split[i] = x->split[i + skip];
    D->res.partial = x->partial;
}

/* An update works in place on its parameter's shard: gradient and state alike, whole. */
static void rule_update(shard_state *S, const ir_value *v, decision *D) {
    const ir_type *param = operand(S, v, 0);
    for (int k = 1; k < v->n_operands; k++) {
        ir_type *w = &D->want[k];
        for (int i = 0; i < w->rank; i++) w->split[i] = param->split[i];
        w->partial = 0;
    }
    D->reason = "the update needs the gradient sharded as its parameter";
}

static void decide(shard_state *S, const ir_value *v, decision *D) {
    memset(D, 0, sizeof *D);
    D->res = v->type;
    clear_sharding(&D->res);
    for (int k = 0; k < v->n_operands && k < MAX_OPERANDS; k++) D->want[k] = *operand(S, v, k);
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_SOURCE: D->res = v->type; break;
    case OPC_UNARY:
    case OPC_UNARY_GRAD:
    case OPC_CAST:
    case OPC_BINARY: rule_elementwise(S, v, D); break;
    case OPC_REDUCE:
    case OPC_BROADCAST: rule_reduce(S, v, D); break;
    case OPC_RESHAPE: rule_reshape(S, v, D); break;
    case OPC_TRANSPOSE: rule_transpose(S, v, D); break;
    case OPC_MATMUL: rule_matmul(S, v, D); break;
    case OPC_LOSS:
    case OPC_LOSS_GRAD:
    case OPC_SOFTMAX:
    case OPC_MASK:
    case OPC_NORM: rule_rowwise(S, v, D); break;
    case OPC_SLICE: rule_slice(S, v, D); break;
    case OPC_GATHER: rule_gather(S, v, D); break;
    case OPC_UPDATE: rule_update(S, v, D); break;
    case OPC_COLLECTIVE: D->res = v->type; break;
    case OPC_ATTENTION: rule_attention(S, v, D); break;
    case OPC_VIEW: rule_view(S, v, D); break;
    }
    if (v->op == OP_CROSS_ENTROPY_GRAD) D->want[2].partial = 0;
    drop_trivial(S->g, &D->res);
}

/* ---- the pass ------------------------------------------------------------------------------ */

/* A gradient is resharded where it is made, in the backward pass, to its parameter's
 * sharding but for a sum pending over data: a layernorm's weight gradient under data and
 * sequence parallelism, pending over both axes, is allreduced over tensor there, and a
 * position table's, split over the sequence, all-gathered. Its update then needs at most
 * the data allreduce, the form gradient buckets, ZeRO and compression take, and with
 * micro-batches the value they sum is complete. Returns the value standing for the
 * gradient. */
static int complete_besides_data(shard_state *S, int id) {
    ir_value *v = V(S, id);
    if (v->role != ROLE_GRAD) return id;
    uint32_t data = S->g->data_axis >= 0 ? 1u << S->g->data_axis : 0;
    const ir_type *param = &V(S, S->map[S->g->params[v->param_index]])->type;
    ir_type want = v->type;
    for (int i = 0; i < want.rank; i++) want.split[i] = param->split[i];
    want.partial &= data;
    if (same_sharding(&want, &v->type)) return id;
    int done = reshard(S, id, &want, "a gradient sharded as its parameter where it is made", v->phase);
    ir_value *w = V(S, done);
    w->role = ROLE_GRAD;
    w->param_index = v->param_index;
    w->name = v->name;
    v->role = ROLE_TEMP;
    v->param_index = -1;
    v->name = ir_internf(S->g, "%s.unreduced", w->name);
    return done;
}

static int is_listed(const int *ids, int n, int id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* sums_only[i]: every consumer of old value i is an add or a sub (one at least), and the
 * value is nothing the caller reads (loss, output) nor annotated. */
static void mark_sums_only(const ir_graph *g, ir_value *const *old, int n_old, unsigned char *sums_only) {
    memset(sums_only, 0, (size_t)n_old);
    unsigned char *other = calloc((size_t)(n_old ? n_old : 1), 1);
    if (!other) abort();
    for (int i = 0; i < n_old; i++) {
        const ir_value *v = old[i];
        int sum = v->op == OP_ADD || v->op == OP_SUB;
        for (int k = 0; k < v->n_operands; k++) {
            if (sum) sums_only[v->operands[k]] = 1;
            else other[v->operands[k]] = 1;
        }
    }
    for (int i = 0; i < n_old; i++)
        if (other[i] || old[i]->annotated || i == g->loss || is_listed(g->outputs, g->n_outputs, i)) sums_only[i] = 0;
    free(other);
}

/* An operand already reduced for another consumer is used reduced: that sum is paid for,
 * and a pending one would need its own collective later. */
/* Whether r is t with its pending sums completed and nothing else moved: allreduced (the
 * same splits), or reduce-scattered (a dim t holds whole split over a pending axis, as
 * sequence parallelism does: an RMSNorm's output gradient, pending after the products,
 * is read by the weight's gradient and by the input's, and completing it once serves
 * both, where each kept pending would be reduce-scattered again). */
static int reduced_form_of(const ir_type *r, const ir_type *t) {
    if (r->partial || r->rank != t->rank) return 0;
    for (int i = 0; i < t->rank; i++) {
        if (r->split[i] == t->split[i]) continue;
        if (t->split[i] != IR_REPLICATED || r->split[i] == IR_REPLICATED || !((t->partial >> r->split[i]) & 1u)) return 0;
    }
    return 1;
}

static void use_reduced_operands(shard_state *S, ir_value *v) {
    for (int k = 0; k < v->n_operands; k++) {
        const ir_type *t = &V(S, v->operands[k])->type;
        if (!t->partial) continue;
        for (int c = S->first_cache[v->operands[k]]; c >= 0; c = S->cache[c].next) {
            if (reduced_form_of(&V(S, S->cache[c].result)->type, t)) {
                v->operands[k] = S->cache[c].result;
                break;
            }
        }
    }
}

/* Value i (v, its sharded result `result`) as the caller sees it; returns what the
 * program's own consumers read. */
static int keep_for_caller(shard_state *S, ir_value *v, int i, int result, int *output_of) {
    ir_graph *g = S->g;
    /* the loss is read by the caller every step, in the shape of the .dm: whole on
     * every rank (no pending sum). Outputs (f32) stay as computed: the caller asks for
     * them rarely (evaluation, sampling), and the generated accessor gathers them then
     * (a GPT's logits gathered every step were half of what a rank sent) */
    int listed = is_listed(g->outputs, g->n_outputs, i), shown = result;
    int on_demand = listed && i != g->loss && v->type.dtype == DT_F32;
    if (i == g->loss || (listed && !on_demand)) {
        ir_type whole = V(S, result)->type;
        clear_sharding(&whole);
        shown = reshard(S, result, &whole, "the caller reads it", v->phase);
        /* the program's own consumers keep the sharded value (the loss is a scalar:
         * its whole sum serves both) */
        if (listed && i != g->loss) {
            for (int k = 0; k < g->n_outputs; k++)
                if (g->outputs[k] == i) output_of[k] = shown;
        } else {
            result = shown;
        }
    }
    /* the name the user gave stays with what they see */
    if (shown != v->id && v->name) {
        V(S, shown)->name = v->name;
        v->name = ir_internf(g, "%s.local", v->name);
    }
    return result;
}

/* A gradient reduced for its update: the reduced value becomes the gradient (map: old ids
 * to new). */
static void adopt_reduced_grads(ir_graph *g, const int *map) {
    int *update_of = malloc((size_t)(g->n_params ? g->n_params : 1) * sizeof(int));
    if (!update_of) abort();
    for (int p = 0; p < g->n_params; p++) update_of[p] = -1;
    for (int i = 0; i < g->n_values; i++)
        if (ir_op_info_of(g->values[i]->op)->cls == OPC_UPDATE) update_of[g->values[i]->param_index] = i;
    for (int p = 0; g->grads && p < g->n_params; p++) {
        int gid = map[g->grads[p]];
        if (update_of[p] >= 0 && g->values[update_of[p]]->operands[1] != gid) {
            ir_value *was = g->values[gid], *now = g->values[g->values[update_of[p]]->operands[1]];
            now->role = ROLE_GRAD;
            now->param_index = p;
            now->name = was->name;
            was->role = ROLE_TEMP;
            was->param_index = -1;
            was->name = ir_internf(g, "%s.partial", now->name);
            gid = now->id;
        }
        g->grads[p] = gid;
    }
    free(update_of);
}

int pass_shard(ir_graph *g, dm_reshard_list *log, dm_diag *d) {
    int n_old = g->n_values;
    ir_value **old = g->values;
    int *output_of = malloc((size_t)(g->n_outputs ? g->n_outputs : 1) * sizeof(int)); /* (outputs) whole value, or -1 */
    if (!output_of) abort();
    for (int k = 0; k < g->n_outputs; k++) output_of[k] = -1;
    shard_state S = {.g = g, .d = d, .log = log};
    S.map = malloc((size_t)(n_old ? n_old : 1) * sizeof(int));
    S.feeds_sums_only = malloc((size_t)(n_old ? n_old : 1));
    if (!S.map || !S.feeds_sums_only) abort();
    mark_sums_only(g, old, n_old, S.feeds_sums_only);
    S.uses = calloc((size_t)(n_old ? n_old : 1), sizeof *S.uses);
    if (!S.uses) abort();
    for (int i = 0; i < n_old; i++)
        for (int k = 0; k < old[i]->n_operands; k++) S.uses[old[i]->operands[k]]++;
    g->values = NULL;
    g->n_values = g->cap_values = 0;

    for (int i = 0; i < n_old; i++) {
        ir_value *v = old[i];
        for (int k = 0; k < v->n_operands && k < MAX_OPERANDS; k++) S.operand_uses[k] = S.uses[v->operands[k]];
        for (int k = 0; k < v->n_operands; k++) v->operands[k] = S.map[v->operands[k]];
        if (v->op == OP_STATE && v->param_index >= 0) {
            const ir_type *pt = &g->values[S.map[g->params[v->param_index]]]->type;
            for (int k = 0; k < v->type.rank; k++) v->type.split[k] = pt->split[k];
        }
        if (ir_op_info_of(v->op)->cls == OPC_SOURCE) drop_trivial(g, &v->type);
        use_reduced_operands(&S, v);
        ir_type annotation = v->type;
        S.visiting = i;
        decision D;
        decide(&S, v, &D);
        for (int k = 0; k < v->n_operands && k < MAX_OPERANDS; k++) {
            drop_trivial(g, &D.want[k]);
            v->operands[k] = reshard(&S, v->operands[k], &D.want[k], D.reason ? D.reason : "operand sharding", v->phase);
        }
        v->type.partial = D.res.partial;
        for (int k = 0; k < v->type.rank; k++) v->type.split[k] = D.res.split[k];
        ir_append_value(g, v);
        cache_room(&S);
        if (v->op == OP_XENT_STATS && ir_class_split_axis(g, v) != IR_REPLICATED) {
            /* its exchanges are inside the op; --explain lists them with the others */
            dm_reshard r = {.value = v->id, .source_line = v->loc.line, .reason = "cross-entropy over a split vocabulary"};
            log->items = ir_grow(log->items, log->n, sizeof *log->items);
            log->items[log->n++] = r;
        }
        int result = v->id;
        /* a value whose sharding the user wrote is resharded to it */
        if (v->annotated && ir_op_info_of(v->op)->cls != OPC_SOURCE) {
            drop_trivial(g, &annotation);
            annotation.partial = 0;
            result = reshard(&S, result, &annotation, "annotated in the .dm", v->phase);
        }
        result = keep_for_caller(&S, v, i, result, output_of);
        S.map[i] = complete_besides_data(&S, result);
    }
    free(old);

    for (int p = 0; p < g->n_params; p++) g->params[p] = S.map[g->params[p]];
    for (int i = 0; i < g->n_inputs; i++) g->inputs[i] = S.map[g->inputs[i]];
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = output_of[i] >= 0 ? output_of[i] : S.map[g->outputs[i]];
    free(output_of);
    if (g->loss >= 0) g->loss = S.map[g->loss];
    adopt_reduced_grads(g, S.map);
    free(S.map);
    free(S.feeds_sums_only);
    free(S.uses);
    free(S.first_cache);
    free(S.cache);
    return S.errors;
}

void dm_reshard_list_free(dm_reshard_list *log) {
    free(log->items);
    log->items = NULL;
    log->n = 0;
}
