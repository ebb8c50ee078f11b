/* compact_channels.c: --compact PRUNED (docs/compression.md, "Compacting"): the output
 * channels that `--prune RATIO:rows` zeroed removed from the program, so that the smaller
 * model multiplies no zeros.
 *
 * A weight W read by a product x @ W (stored [IN, OUT], not transposed) loses its output
 * channel j when its column j is all zero and the channel's value reaches nothing but the
 * next product's left operand: the product, then at most one bias add (a bias parameter
 * [OUT]), then elementwise activations (relu, gelu, tanh, sigmoid, silu, neg, identity),
 * then h @ W2, each read by the next one alone. Channel j then holds the constant
 * c_j = act(bias_j) (act(0) without a bias) in every row, so dropping it and W2's row j is
 * exact once c_j * W2[j, :] is added to the bias that W2's product adds (its only
 * reader must be such a bias add when some c_j is not 0). The bias and W2's row lose the
 * channel with W. Anything else (a channel reaching a residual add, a norm, a reshape, the
 * loss or an output, a weight read twice or transposed, a split over a mesh axis of
 * several ranks) keeps the weight whole, and the report says why.
 *
 * requires: lower (the forward graph, before autodiff: a weight's only readers are its
 * products). Leaves the parameters (their types and c->weights, the file's values
 * compacted) and every value typed again (pass_shapes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* The chain from a product to the next product's left operand (see above). */
typedef struct channel_chain {
    int weight, bias, next_weight, fold_bias; /* value ids; bias, fold_bias -1 when none */
    ir_op acts[8];
    int n_acts;
} channel_chain;

/* "[784, 64]" */
static void format_shape(const int64_t *shape, int rank, char *buf, size_t size) {
    int n = snprintf(buf, size, "[");
    for (int k = 0; k < rank && n > 0 && (size_t)n < size; k++)
        n += snprintf(buf + n, size - (size_t)n, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (n > 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, "]");
}

/* The file's tensor of each parameter (index as in g->params), copied: the working values. */
static int load_weights(const ir_graph *g, dm_compaction *c, dm_diag *d) {
    c->weights = calloc((size_t)g->n_params, sizeof *c->weights);
    if (!c->weights) abort();
    c->n_weights = g->n_params;
    int errors = 0;
    for (int i = 0; i < g->n_params; i++) {
        const ir_value *p = g->values[g->params[i]];
        const dm_file_tensor *f = NULL;
        for (int k = 0; k < c->n_file && !f; k++)
            if (strcmp(c->file[k].name, p->name) == 0) f = &c->file[k];
        int rank = p->stored_rank ? p->stored_rank : p->type.rank;
        const int64_t *shape = p->stored_rank ? p->stored_shape : p->type.shape;
        int same = f && f->rank == rank;
        for (int k = 0; same && k < rank; k++) same = f->shape[k] == shape[k];
        if (!f || !f->f32 || !same) {
            char want[256], found[256] = "";
            format_shape(shape, rank, want, sizeof want);
            if (f) format_shape(f->shape, f->rank, found, sizeof found);
            dm_error(d, p->loc, "--compact %s: tensor '%s' %s%s, the program's is f32%s (a file of another model, or "
                     "of other --set sizes?)", c->path, p->name, !f ? "is missing" : !f->f32 ? "is not F32" :
                     "has shape ", f && f->f32 ? found : "", want);
            errors++;
            continue;
        }
        dm_weight *w = &c->weights[i];
        w->name = p->name;
        w->rank = rank;
        memcpy(w->shape, shape, sizeof w->shape);
        int64_t n = ir_numel(&p->type);
        w->data = malloc((size_t)(n ? n : 1) * sizeof *w->data);
        if (!w->data) abort();
        memcpy(w->data, f->data, (size_t)n * sizeof *w->data);
        /* a NaN or inf would be folded into biases and written (weights that are not
         * finite are never loaded) */
        for (int64_t k = 0; k < n; k++)
            if (!isfinite(w->data[k])) {
                dm_error(d, p->loc, "--compact %s: tensor '%s' holds a non-finite value: %g at element %lld",
                         c->path, p->name, (double)w->data[k], (long long)k);
                errors++;
                break;
            }
    }
    return errors;
}

static dm_weight *weight_of(const ir_graph *g, dm_compaction *c, int value) {
    return &c->weights[g->values[value]->param_index];
}

/* users[v]: the ops reading v, plus one for being an output or the loss; user[v]: the last. */
static void count_users(const ir_graph *g, int *users, int *user) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands; k++) users[v->operands[k]]++, user[v->operands[k]] = i;
    }
    for (int k = 0; k < g->n_outputs; k++) users[g->outputs[k]]++, user[g->outputs[k]] = -1;
    if (g->loss >= 0) users[g->loss]++, user[g->loss] = -1;
}

static int is_output(const ir_graph *g, int id) {
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k] == id) return 1;
    return id == g->loss;
}

/* A parameter of the given rank that only one op reads, stored as its type. */
static int plain_param(const ir_graph *g, const int *users, int id, int rank) {
    const ir_value *p = g->values[id];
    return p->op == OP_PARAM && p->type.rank == rank && !p->stored_rank && users[id] == 1;
}

/* A product x @ W whose W is a weight of its own; the weight's id or -1. */
static int product_weight(const ir_graph *g, const int *users, const ir_value *m) {
    if (m->op != OP_MATMUL || m->trans_a || m->trans_b || m->batch_dims) return -1;
    return plain_param(g, users, m->operands[1], 2) ? m->operands[1] : -1;
}

static int foldable_act(ir_op op) {
    return op == OP_RELU || op == OP_GELU || op == OP_TANH || op == OP_SIGMOID || op == OP_SILU || op == OP_NEG ||
           op == OP_IDENTITY;
}

/* act(x) as the generated code computes it (ir/ops.def's expressions, in float). */
static float apply_act(ir_op op, float x) {
    switch (op) {
    case OP_RELU: return x < 0.0f ? 0.0f : x;
    case OP_TANH: return tanhf(x);
    case OP_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case OP_SILU: return x / (1.0f + expf(-x));
    case OP_NEG: return -x;
    case OP_GELU: return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    default: return x;
    }
}

/* The bias a product's result is completed by (its only reader adds a 1-dim parameter), or -1. */
static int bias_after(const ir_graph *g, const int *users, const int *user, int id) {
    if (users[id] != 1 || user[id] < 0) return -1;
    const ir_value *u = g->values[user[id]];
    if (u->op != OP_ADD) return -1;
    int other = u->operands[0] == id ? u->operands[1] : u->operands[0];
    return plain_param(g, users, other, 1) && g->values[other]->type.shape[0] == g->values[id]->type.shape[
        g->values[id]->type.rank - 1] ? other : -1;
}

/* The mesh axis of more than one rank that splits dim of value id, or NULL. */
static const char *split_axis(const ir_graph *g, int id, int dim) {
    int axis = g->values[id]->type.split[dim];
    return axis != IR_REPLICATED && g->axes[axis].size > 1 ? g->axes[axis].name : NULL;
}

/* Follows product m's channels to the next product (filling ch): NULL, or why not. */
static const char *follow_chain(const ir_graph *g, const int *users, const int *user, const ir_value *m,
                                channel_chain *ch, char *why, size_t size) {
    memset(ch, 0, sizeof *ch);
    ch->weight = product_weight(g, users, m);
    ch->bias = ch->fold_bias = -1;
    if (ch->weight < 0) {
        const ir_value *w = g->values[m->operands[1]];
        return users[w->id] > 1 ? "read by more than one op" : m->trans_a || m->trans_b ? "read transposed"
               : m->batch_dims ? "read by a batch of products" : "not a matrix stored as its type";
    }
    if (split_axis(g, ch->weight, 1)) {
        snprintf(why, size, "its channels are split over the mesh axis %s", split_axis(g, ch->weight, 1));
        return why;
    }
    int cur = m->id;
    ch->bias = bias_after(g, users, user, cur);
    if (ch->bias >= 0) cur = user[cur];
    for (;;) {
        if (is_output(g, cur)) return "its channels reach the model's output or loss";
        if (users[cur] != 1) {
            snprintf(why, size, "its channels are read by %d ops (%s)", users[cur],
                     g->values[cur]->name ? g->values[cur]->name : "a value");
            return why;
        }
        const ir_value *u = g->values[user[cur]];
        if (foldable_act(u->op) && ch->n_acts < 8) {
            ch->acts[ch->n_acts++] = u->op;
            cur = u->id;
            continue;
        }
        if (u->operands[0] == cur && product_weight(g, users, u) >= 0) {
            ch->next_weight = u->operands[1];
            if (split_axis(g, ch->next_weight, 0)) {
                snprintf(why, size, "%s's rows are split over the mesh axis %s", g->values[ch->next_weight]->name,
                         split_axis(g, ch->next_weight, 0));
                return why;
            }
            ch->fold_bias = bias_after(g, users, user, u->id);
            return NULL;
        }
        snprintf(why, size, "its channels flow into %s%s%s, not into a product's input only",
                 ir_op_info_of(u->op)->name, u->name ? " " : "", u->name ? u->name : "");
        return why;
    }
}

/* Channel j's constant value once its weight column is zero: act(bias_j), act(0) without. */
static float channel_constant(const dm_compaction *c, const ir_graph *g, const channel_chain *ch, int64_t j) {
    float x = ch->bias >= 0 ? c->weights[g->values[ch->bias]->param_index].data[j] : 0.0f;
    for (int k = 0; k < ch->n_acts; k++) x = apply_act(ch->acts[k], x);
    return x;
}

/* Keeps the columns (dim 1 of a 2-dim w) or elements (1-dim) or rows (dim 0) marked in keep. */
static void gather(dm_weight *w, int dim, const char *keep, int64_t kept) {
    int64_t rows = w->shape[0], cols = w->rank == 2 ? w->shape[1] : 1;
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            if (keep[dim == 0 ? r : k]) w->data[n++] = w->data[r * cols + k];
    w->shape[dim] = kept;
}

static void shrink_type(ir_value *p, int dim, int64_t kept) {
    p->type.shape[dim] = kept;
    p->type.dim_name[dim] = NULL; /* no longer the named dim's size */
}

/* Removes the zero channels of ch's weight (keep[j] 0), folding their constants into
 * fold_bias, from the weight, its bias and the next weight's rows. */
static void remove_channels(ir_graph *g, dm_compaction *c, const channel_chain *ch, const char *keep,
                            const float *constant, int64_t kept) {
    dm_weight *w = weight_of(g, c, ch->weight), *next = weight_of(g, c, ch->next_weight);
    int64_t channels = w->shape[1], out = next->shape[1];
    if (ch->fold_bias >= 0) {
        float *b2 = weight_of(g, c, ch->fold_bias)->data;
        for (int64_t k = 0; k < out; k++) {
            double sum = b2[k];
            for (int64_t j = 0; j < channels; j++)
                if (!keep[j] && constant[j] != 0.0f) sum += (double)constant[j] * next->data[j * out + k];
            b2[k] = (float)sum;
        }
    }
    gather(w, 1, keep, kept);
    shrink_type(g->values[ch->weight], 1, kept);
    if (ch->bias >= 0) {
        gather(weight_of(g, c, ch->bias), 0, keep, kept);
        shrink_type(g->values[ch->bias], 0, kept);
    }
    gather(next, 0, keep, kept);
    shrink_type(g->values[ch->next_weight], 0, kept);
}

/* One product's weight: its zero channels removed where ch allows it (the report's line). */
static void compact_one(ir_graph *g, dm_compaction *c, const channel_chain *ch, dm_layer_compaction *line) {
    dm_weight *w = weight_of(g, c, ch->weight);
    int64_t rows = w->shape[0], channels = w->shape[1], kept = 0;
    char *keep = malloc((size_t)channels);
    float *constant = malloc((size_t)channels * sizeof *constant);
    if (!keep || !constant) abort();
    for (int64_t j = 0; j < channels; j++) {
        keep[j] = 0;
        for (int64_t r = 0; r < rows && !keep[j]; r++) keep[j] = w->data[r * channels + j] != 0.0f;
        constant[j] = channel_constant(c, g, ch, j);
        kept += keep[j];
    }
    if (kept == 0 && channels > 0) keep[0] = 1, kept = 1; /* a layer keeps one channel */
    int needs_fold = 0;
    for (int64_t j = 0; j < channels; j++) needs_fold |= !keep[j] && constant[j] != 0.0f;
    line->before = channels;
    line->after = channels;
    if (kept == channels) {
        line->why_not = "no output channel is all zero";
    } else if (needs_fold && ch->fold_bias < 0) {
        line->why_not = "a removed channel's constant act(bias) is not 0, and no bias follows the next product to "
                        "take it";
    } else {
        remove_channels(g, c, ch, keep, constant, kept);
        line->after = kept;
        line->next_weight = g->values[ch->next_weight]->name;
        line->folded = needs_fold;
    }
    free(keep);
    free(constant);
}

/* The parameter a product's operand is, or is a slice, reshape or transpose of; else -1. */
static int layout_source(const ir_graph *g, int id) {
    const ir_value *v = g->values[id];
    while (v->op == OP_RESHAPE || v->op == OP_TRANSPOSE || v->op == OP_SLICE || v->op == OP_PARAM_VIEW)
        v = g->values[v->operands[0]];
    return v->op == OP_PARAM ? v->id : -1;
}

static int64_t count_params(const dm_compaction *c) {
    int64_t n = 0;
    for (int i = 0; i < c->n_weights; i++) {
        int64_t e = 1;
        for (int k = 0; k < c->weights[i].rank; k++) e *= c->weights[i].shape[k];
        n += e;
    }
    return n;
}

int pass_compact_channels(ir_graph *g, dm_compaction *c, dm_diag *d) {
    if (load_weights(g, c, d)) return 1;
    c->params_before = count_params(c);
    int *users = calloc((size_t)g->n_values, sizeof *users), *user = calloc((size_t)g->n_values, sizeof *user);
    c->layers = calloc((size_t)g->n_values, sizeof *c->layers);
    if (!users || !user || !c->layers) abort();
    count_users(g, users, user);
    char *listed = calloc((size_t)g->n_values, 1);
    if (!listed) abort();
    compact_heads(g, c, listed);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *m = g->values[i];
        int w = m->op == OP_MATMUL ? layout_source(g, m->operands[1]) : -1;
        if (w < 0 || listed[w]) continue;
        listed[w] = 1;
        dm_layer_compaction *line = &c->layers[c->n_layers++];
        line->weight = g->values[w]->name;
        line->weight_id = w;
        /* the product's output channels: the weight's last dim, its rows where it is read
         * transposed (x @ transpose(w): llama.dm's projections) */
        const ir_type *wt = &g->values[w]->type;
        line->before = line->after = wt->shape[wt->rank - (m->trans_b && w == m->operands[1] ? 2 : 1)];
        channel_chain ch;
        line->why_not = w != m->operands[1] ? "read through a slice, reshape or transpose (its channels are another "
                                              "layout's)" : follow_chain(g, users, user, m, &ch, line->why, sizeof line->why);
        if (!line->why_not) compact_one(g, c, &ch, line);
    }
    free(listed);
    free(users);
    free(user);
    c->params_after = count_params(c);
    int compacted = 0;
    for (int k = 0; k < c->n_layers; k++) compacted += !c->layers[k].why_not;
    if (!compacted) {
        dm_loc at = c->n_layers ? g->values[c->layers[0].weight_id]->loc : g->loss_loc;
        dm_error(d, at, "--compact %s: no weight has output channels to remove (no product's weight has an all-zero "
                 "column whose channel only feeds the next product): is it a file saved by a run with --prune "
                 "RATIO:rows?", c->path);
        for (int k = 0; k < c->n_layers; k++)
            dm_note(d, g->values[c->layers[k].weight_id]->loc, "%s stays: %s", c->layers[k].weight,
                    c->layers[k].why_not);
        return 1;
    }
    return pass_shapes(g, d);
}

void dm_compaction_free(dm_compaction *c) {
    for (int i = 0; i < c->n_weights; i++) free(c->weights[i].data);
    free(c->weights);
    free(c->layers);
    c->weights = NULL;
    c->layers = NULL;
    c->n_weights = c->n_layers = 0;
}
