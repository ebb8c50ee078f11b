/* memory.c: the static memory plan of one rank (sizes are the rank's shards). requires: the final graph; leaves the
 * graph untouched and fills a dm_memory_plan.
 *
 * Persistent values (params, grads, optimizer state) are laid out in declaration order,
 * so that each region is one contiguous block (a later ZeRO pass shards it by ranges).
 * Temporaries share one arena, planned three ways and the smallest kept (place_buffers):
 * in definition order, each value in a range freed by dead values (else at the top),
 * the first that holds it or the smallest; and largest first, each at the lowest offset
 * clear of the placed values live with it (greedy by size, as offline planners of
 * inference arenas do). On gpt.dm greedy by size wins on most meshes tried, 1-21% below
 * first fit, often reaching the most bytes live at once; the others stay as a floor.
 * Offsets are rounded to 16 elements (64 bytes) for vector loads; with ZeRO, parameters
 * and gradients to a multiple of every mesh axis's size too, so that a run of them splits
 * into equal shares (passes/zero.c). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define ALIGN_ELEMS 16

static int64_t round_up(int64_t n) { return (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS; }

static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }

/* A parameter's or gradient's allocation: with ZeRO, a multiple of 16 and of every
 * axis's size (their least common multiple: 16 for meshes of powers of two up to 16). */
int64_t dm_persistent_elems(const ir_graph *g, int64_t numel) {
    int64_t align = ALIGN_ELEMS;
    for (int a = 0; g->zero && a < g->n_axes; a++) align = align / gcd(align, g->axes[a].size) * g->axes[a].size;
    return (numel + align - 1) / align * align;
}

/* Free ranges of the arena below its top, sorted by offset and never adjacent. Real
 * models keep few of them, so a sorted array is enough. */
typedef struct gap_list {
    int64_t *offset, *size;   /* (n) */
    int n;
    int64_t top;              /* everything at or above is free */
} gap_list;

static void remove_gap(gap_list *f, int k) {
    memmove(f->offset + k, f->offset + k + 1, (size_t)(f->n - k - 1) * sizeof(int64_t));
    memmove(f->size + k, f->size + k + 1, (size_t)(f->n - k - 1) * sizeof(int64_t));
    f->n--;
}

/* The gap a buffer of size goes in: the lowest that holds it, or (best_fit) the smallest;
 * -1 when none does. */
static int pick_gap(const gap_list *f, int64_t size, int best_fit) {
    int pick = -1;
    for (int k = 0; k < f->n; k++) {
        if (f->size[k] < size || (pick >= 0 && f->size[k] >= f->size[pick])) continue;
        pick = k;
        if (!best_fit) break;
    }
    return pick;
}

static int64_t take(gap_list *f, int64_t size, int best_fit) {
    int k = pick_gap(f, size, best_fit);
    if (k < 0) {
        int64_t at = f->top;
        f->top += size;
        return at;
    }
    int64_t at = f->offset[k];
    f->offset[k] += size;
    f->size[k] -= size;
    if (f->size[k] == 0) remove_gap(f, k);
    return at;
}

static void give_back(gap_list *f, int64_t at, int64_t size) {
    int k = 0;
    while (k < f->n && f->offset[k] < at) k++;
    /* merge with the gap before and the one after */
    if (k > 0 && f->offset[k - 1] + f->size[k - 1] == at) {
        k--;
        at = f->offset[k];
        size += f->size[k];
        remove_gap(f, k);
    }
    if (k < f->n && at + size == f->offset[k]) {
        size += f->size[k];
        remove_gap(f, k);
    }
    if (at + size == f->top) {
        f->top = at;
        return;
    }
    memmove(f->offset + k + 1, f->offset + k, (size_t)(f->n - k) * sizeof(int64_t));
    memmove(f->size + k + 1, f->size + k, (size_t)(f->n - k) * sizeof(int64_t));
    f->offset[k] = at;
    f->size[k] = size;
    f->n++;
}

typedef struct death {
    int dies, item;
} death;

static int by_death(const void *a, const void *b) {
    const death *x = a, *y = b;
    return x->dies != y->dies ? (x->dies > y->dies) - (x->dies < y->dies) : x->item - y->item;
}

/* Places n buffers in one arena, item i of size[i] live from position def[i] (defs
 * nondecreasing) to dies[i] >= def[i] (its last reader): a buffer is free again for
 * the items defined after its death. Fills offset (n); returns the arena's size. */
static int64_t place_once(int n, const int64_t *size, const int *def, const death *order, int best_fit, int64_t *offset) {
    gap_list free_list = {.offset = malloc(((size_t)n + 1) * sizeof(int64_t)), .size = malloc(((size_t)n + 1) * sizeof(int64_t))};
    if (!free_list.offset || !free_list.size) abort();
    int64_t arena = 0;
    for (int it = 0, freed = 0; it < n; it++) {
        for (; freed < n && order[freed].dies < def[it]; freed++)
            give_back(&free_list, offset[order[freed].item], size[order[freed].item]);
        offset[it] = take(&free_list, size[it], best_fit);
        if (offset[it] + size[it] > arena) arena = offset[it] + size[it];
    }
    free(free_list.offset);
    free(free_list.size);
    return arena;
}

typedef struct sized {
    int64_t size;
    int item;
} sized;

static int by_size(const void *a, const void *b) {
    const sized *x = a, *y = b;
    return x->size != y->size ? (x->size < y->size) - (x->size > y->size) : x->item - y->item;
}

/* A buffer greedy by size has placed: what the scan for the next one reads, together, so
 * that the scan (quadratic, the planner's hottest loop) walks one array in order. */
typedef struct placed_buffer {
    int64_t offset, end;
    int def, dies;
} placed_buffer;

/* Greedy by size, as offline planners of inference arenas do: the largest buffer first,
 * each at the lowest offset clear of every buffer already placed that is live with it. */
static int64_t place_by_size(int n, const int64_t *size, const int *def, const int *dies, int64_t *offset) {
    sized *order = malloc(((size_t)n + 1) * sizeof *order);
    placed_buffer *placed = malloc(((size_t)n + 1) * sizeof *placed); /* by offset */
    if (!order || !placed) abort();
    for (int i = 0; i < n; i++) order[i] = (sized){size[i], i};
    qsort(order, (size_t)n, sizeof *order, by_size);
    int64_t arena = 0;
    for (int q = 0; q < n; q++) {
        int it = order[q].item, born = def[it], gone = dies[it];
        int64_t at = 0, need = size[it];
        for (int k = 0; k < q; k++) {
            const placed_buffer *p = &placed[k];
            if (p->offset >= at + need) break; /* the rest lie above: at fits */
            if (p->def <= gone && born <= p->dies && p->end > at) at = p->end;
        }
        offset[it] = at;
        /* after the last placed at or below `at`, as the scan above orders ties */
        int k = q;
        while (k > 0 && placed[k - 1].offset > at) k--;
        memmove(placed + k + 1, placed + k, (size_t)(q - k) * sizeof *placed);
        placed[k] = (placed_buffer){at, at + need, born, gone};
        if (at + need > arena) arena = at + need;
    }
    free(order);
    free(placed);
    return arena;
}

/* Greedy by size compares every buffer with those placed before it: quadratic, so
 * graphs with more buffers than this skip it (gpt.dm has about 1,800 values at 12 layers,
 * 7,000 at 48: 0.2 s of planning). */
#define PLACE_BY_SIZE_MAX_ITEMS 20000

/* The candidate placement replaces the kept one when its arena is strictly smaller. */
static void keep_smaller(int n, int64_t *offset, int64_t *arena, const int64_t *candidate, int64_t candidate_arena) {
    if (candidate_arena >= *arena) return;
    memcpy(offset, candidate, (size_t)n * sizeof(int64_t));
    *arena = candidate_arena;
}

/* Three policies (first fit and best fit in definition order, greedy by size); the
 * smallest arena wins, the earlier policy on a tie. */
static int64_t place_buffers(int n, const int64_t *size, const int *def, const int *dies, int64_t *offset) {
    death *order = malloc(((size_t)n + 1) * sizeof *order);
    int64_t *other = malloc(((size_t)n + 1) * sizeof(int64_t));
    if (!order || !other) abort();
    for (int i = 0; i < n; i++) order[i] = (death){dies[i], i};
    qsort(order, (size_t)n, sizeof *order, by_death);
    int64_t arena = place_once(n, size, def, order, 0, offset);
    keep_smaller(n, offset, &arena, other, place_once(n, size, def, order, 1, other));
    if (n <= PLACE_BY_SIZE_MAX_ITEMS) keep_smaller(n, offset, &arena, other, place_by_size(n, size, def, dies, other));
    free(order);
    free(other);
    return arena;
}

int dm_micro_grad(const ir_graph *g, int p) {
    const ir_value *v = g->values[g->grads[p]];
    return v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE ? v->operands[0] : v->id;
}

int dm_micro_grad_is_temporary(const ir_graph *g, int p) { return g->values[dm_micro_grad(g, p)]->role == ROLE_TEMP; }

int *dm_summed_partials(const ir_graph *g) {
    int *param_of = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!param_of) abort();
    for (int i = 0; i < g->n_values; i++) param_of[i] = -1;
    if (!ir_is_scheduled(g) || g->microbatches <= 1 || g->loss < 0 || !g->grads) return param_of;
    for (int p = 0; p < g->n_params; p++)
        if (dm_micro_grad_is_temporary(g, p)) param_of[dm_micro_grad(g, p)] = p;
    return param_of;
}

/* Whether value reader's read of its operand k extends that buffer's life: not a read
 * after the micro-batches of a partial gradient, which reads the step's sum instead. */
static int read_keeps_alive(const int *summed, const ir_value *reader, int k) {
    return reader->phase != PHASE_UPDATE || summed[reader->operands[k]] < 0;
}

/* (n_values) the reads of each value: its readers' operands, and the loss and outputs
 * twice (read after the step), so that 1 means one op reads it and nothing else does. */
static int *count_readers(const ir_graph *g) {
    int *readers = calloc((size_t)g->n_values + 1, sizeof(int));
    if (!readers) abort();
    for (int i = 0; i < g->n_values; i++)
        for (int k = 0; k < g->values[i]->n_operands; k++) readers[g->values[i]->operands[k]]++;
    for (int i = 0; i < g->n_outputs; i++) readers[g->outputs[i]] += 2;
    if (g->loss >= 0) readers[g->loss] += 2;
    return readers;
}

/* (n_values) an add of a bias to a product that nothing else reads, for each such product
 * (else -1): x @ w + b, the bias (N) along the last dim of the product (.., N), split alike,
 * no sum pending, on one stage, the sum read on no other. The product then runs where the
 * add was (the bias may be made after it: gpt.dm's slices of a fused bias), its C filled
 * with the bias and accumulated into (beta 1): one pass over C fewer. */
static int *bias_adds(const ir_graph *g, const int *readers) {
    int n = g->n_values;
    int *bias_add_of = malloc(((size_t)n + 1) * sizeof(int));
    char *read_elsewhere = calloc((size_t)n + 1, 1); /* read on another stage than its own */
    if (!bias_add_of || !read_elsewhere) abort();
    for (int i = 0; i < n; i++) {
        bias_add_of[i] = -1;
        for (int k = 0; k < g->values[i]->n_operands; k++) {
            int o = g->values[i]->operands[k];
            if (g->values[o]->stage != g->values[i]->stage) read_elsewhere[o] = 1;
        }
    }
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        if (v->op != OP_ADD || v->role != ROLE_TEMP || read_elsewhere[i] || v->operands[0] == v->operands[1]) continue;
        const ir_value *m = g->values[v->operands[0]], *b = g->values[v->operands[1]];
        const ir_type *mt = &m->type, *bt = &b->type;
        int last = mt->rank - 1;
        if (m->op != OP_MATMUL || m->role != ROLE_TEMP || readers[m->id] != 1 || m->batch_dims || m->stage != v->stage ||
            mt->partial || v->type.partial || bt->partial || mt->dtype != DT_F32 || bt->dtype != DT_F32 || last < 0)
            continue;
        int same = v->type.rank == mt->rank && bt->rank == 1 && bt->shape[0] == mt->shape[last] &&
                   bt->split[0] == mt->split[last];
        for (int d = 0; same && d < mt->rank; d++) same = v->type.shape[d] == mt->shape[d] && v->type.split[d] == mt->split[d];
        if (same) bias_add_of[m->id] = i;
    }
    free(read_elsewhere);
    return bias_add_of;
}

/* Whether value o owns the buffer it is in, alone or with the product its bias's add runs
 * or the sums accumulated into it (sum_adds): no reshape or view of another value's. */
static int owns_its_buffer(const int *bias_add_of, const int *sum_add_of, const ir_value *o) {
    if (o->op == OP_ADD)
        for (int k = 0; k < 2; k++)
            if (bias_add_of[o->operands[k]] == o->id || sum_add_of[o->operands[k]] == o->id) return 1;
    return o->op != OP_RESHAPE && o->op != OP_PARAM_VIEW && ir_op_info_of(o->op)->cls != OPC_VIEW && o->op != OP_PAD;
}

/* (n_values) an add of a product to a value `sum` made before the product that nothing
 * else reads, for each such product (else -1): a gradient summed over its paths, as
 * d_ln_1 = x_q @ Wq^T + x_k @ Wk^T + x_v @ Wv^T in gpt.dm's backward. The product then runs
 * where the add is and accumulates into sum's buffer (beta 1), which the add takes over:
 * no pass over the three tensors, and one buffer fewer. The same sum, rounded the same
 * where the product's k is one block of the BLAS (it adds the finished dot products to
 * C); the same types, split alike, nothing pending, one stage and phase. */
static int *sum_adds(const ir_graph *g, const int *readers, const int *bias_add_of) {
    int n = g->n_values;
    int *sum_add_of = malloc(((size_t)n + 1) * sizeof(int));
    if (!sum_add_of) abort();
    for (int i = 0; i < n; i++) sum_add_of[i] = -1;
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        if (v->op != OP_ADD || v->role != ROLE_TEMP || v->operands[0] == v->operands[1] || v->type.partial ||
            v->type.dtype != DT_F32 || bias_add_of[v->operands[0]] == i)
            continue;
        for (int side = 0; side < 2; side++) {
            const ir_value *m = g->values[v->operands[side]], *sum = g->values[v->operands[1 - side]];
            if (m->op != OP_MATMUL || m->role != ROLE_TEMP || readers[m->id] != 1 || m->batch_dims ||
                bias_add_of[m->id] >= 0 || sum->role != ROLE_TEMP || readers[sum->id] != 1 || sum->id > m->id ||
                m->stage != v->stage || sum->stage != v->stage || m->phase != v->phase || sum->phase != v->phase ||
                !owns_its_buffer(bias_add_of, sum_add_of, sum))
                continue;
            int same = 1;
            for (int t = 0; t < 2 && same; t++) {
                const ir_type *a = t ? &sum->type : &m->type;
                same = !a->partial && a->dtype == DT_F32 && a->rank == v->type.rank;
                for (int d = 0; same && d < a->rank; d++)
                    same = a->shape[d] == v->type.shape[d] && a->split[d] == v->type.split[d];
            }
            if (!same) continue;
            sum_add_of[m->id] = i;
            break;
        }
    }
    return sum_add_of;
}

/* The product an add runs (a bias's: bias_adds; a sum's: sum_adds), or -1. */
int dm_product_run_by(const dm_memory_plan *plan, const ir_value *v) {
    if (v->op != OP_ADD) return -1;
    if (plan->bias_add_of[v->operands[0]] == v->id) return v->operands[0];
    for (int k = 0; k < 2; k++)
        if (plan->sum_add_of[v->operands[k]] == v->id) return v->operands[k];
    return -1;
}

int dm_sum_added_to(const dm_memory_plan *plan, const ir_value *add) {
    int product = dm_product_run_by(plan, add);
    if (product < 0 || plan->sum_add_of[product] != add->id) return -1;
    return add->operands[0] == product ? add->operands[1] : add->operands[0];
}

/* The sum whose buffer value i takes over: i a sum's add (sum_adds) or the product it
 * runs; else -1. */
static int sum_buffer_taken(const ir_graph *g, const dm_memory_plan *plan, int i) {
    int add = plan->sum_add_of[i] >= 0 ? plan->sum_add_of[i] : i;
    return dm_sum_added_to(plan, g->values[add]);
}

const ir_value *dm_cast_producer(const ir_graph *g, const ir_value *cast) {
    if (!g->casts_with_producer || cast->op != OP_CAST || cast->operands[0] != cast->id - 1) return NULL;
    const ir_value *made = g->values[cast->operands[0]];
    while (made->op != OP_PARAM_VIEW && ir_op_info_of(made->op)->cls == OPC_RESHAPE && made->operands[0] == made->id - 1)
        made = g->values[made->operands[0]];
    return made;
}

/* The op whose operands v reads too, or NULL: the product a bias's add runs (bias_adds);
 * and a cast's producer (dm_cast_producer), whose operands must not die before the cast's
 * buffer is written by the producer's kernel. */
static const ir_value *operands_also_read(const dm_memory_plan *plan, const ir_graph *g, const ir_value *v) {
    int product = dm_product_run_by(plan, v);
    if (product >= 0) return g->values[product];
    return dm_cast_producer(g, v);
}

/* Which buffer each value is in (plan->storage_of) and where in it (plan->within): a
 * temporary reshape or view shares its operand's buffer; a reshape with a buffer of its
 * own (a parameter's gradient) is a copy; a bias's add shares its product's; the pads,
 * adds and pieces of a window assembly share its sum's (within: the piece's window, set
 * by dm_plan_window_assemblies). */
static void share_buffers(const ir_graph *g, dm_memory_plan *plan) {
    int n = g->n_values;
    int *readers = count_readers(g);
    plan->bias_add_of = bias_adds(g, readers);
    plan->sum_add_of = sum_adds(g, readers, plan->bias_add_of);
    dm_plan_window_assemblies(g, readers, plan);
    free(readers);
    /* a window assembly's values keep their own ways of sharing buffers (the add's operands
     * are the product and the sum) */
    for (int i = 0; i < n; i++) {
        const ir_value *add = plan->sum_add_of[i] >= 0 ? g->values[plan->sum_add_of[i]] : NULL;
        if (add && (plan->assembled_in[add->id] >= 0 || plan->assembled_in[add->operands[0]] >= 0 ||
                    plan->assembled_in[add->operands[1]] >= 0))
            plan->sum_add_of[i] = -1;
    }
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        int shares = ir_in_operand_buffer(v) || (v->op == OP_ADD && plan->bias_add_of[v->operands[0]] == i);
        int assembled = plan->assembled_in[i], sum = sum_buffer_taken(g, plan, i);
        if (assembled >= 0 && assembled != i) {
            plan->storage_of[i] = assembled;
        } else if (sum >= 0) {
            plan->storage_of[i] = plan->storage_of[sum];
            plan->within[i] = plan->within[sum];
        } else {
            plan->storage_of[i] = shares ? plan->storage_of[v->operands[0]] : i;
            if (shares)
                plan->within[i] =
                    plan->within[v->operands[0]] + (v->op == OP_PARAM_VIEW ? v->offset : ir_view_offset(g, v));
        }
    }
}

/* Liveness of each buffer (last_use[root], n values): the last read of it or of any value
 * sharing it, n for an output or the loss; read_in_step[root]: a step reads it (a value
 * made at create that a step reads lives through every step). */
static void buffer_lifetimes(const ir_graph *g, const dm_memory_plan *plan, int *last_use, char *read_in_step) {
    int n = g->n_values;
    for (int i = 0; i < n; i++) last_use[i] = i;
    int *summed = dm_summed_partials(g);
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands; k++) {
            int s = plan->storage_of[v->operands[k]];
            if (last_use[s] < i && read_keeps_alive(summed, v, k)) last_use[s] = i;
            if (!plan->at_create[i]) read_in_step[s] = 1;
        }
        /* a bias's add runs its product, and a folded cast its operand's op: that op's
         * operands are read there */
        const ir_value *product = operands_also_read(plan, g, v);
        for (int k = 0; product && k < product->n_operands; k++) {
            int s = plan->storage_of[product->operands[k]];
            if (last_use[s] < i) last_use[s] = i;
            if (!plan->at_create[i]) read_in_step[s] = 1;
        }
    }
    free(summed);
    for (int i = 0; i < g->n_outputs; i++) last_use[plan->storage_of[g->outputs[i]]] = n;
    if (g->loss >= 0) last_use[plan->storage_of[g->loss]] = n;
    for (int i = 0; i < n; i++)
        if (plan->storage_of[i] != i && last_use[i] > last_use[plan->storage_of[i]])
            last_use[plan->storage_of[i]] = last_use[i];
}

/* Each value's region by its role; the persistent regions' offsets (parameters,
 * gradients, optimizer state); a buffer's sharers in its region. */
static void assign_regions(const ir_graph *g, dm_memory_plan *plan) {
    int n = g->n_values;
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        switch (v->role) {
        case ROLE_CONST: plan->region[i] = REGION_NONE; continue;
        case ROLE_INPUT: plan->region[i] = REGION_INPUT; continue;
        case ROLE_PARAM:
            plan->region[i] = REGION_PARAMS;
            plan->offset[i] = plan->param_elems;
            plan->param_elems += dm_persistent_elems(g, ir_local_numel(g, &v->type));
            continue;
        case ROLE_GRAD:
            plan->region[i] = REGION_GRADS;
            plan->offset[i] = plan->grad_elems;
            plan->grad_elems += dm_persistent_elems(g, ir_local_numel(g, &v->type));
            continue;
        case ROLE_STATE:
            plan->region[i] = REGION_STATE;
            plan->offset[i] = plan->state_elems;
            /* the parameter servers hold the optimizer state: a worker has none */
            if (!g->param_servers.servers) plan->state_elems += round_up(ir_local_numel(g, &v->type));
            continue;
        case ROLE_TEMP: break;
        }
        if (v->type.dtype == DT_VOID) {
            plan->region[i] = REGION_NONE;
            continue;
        }
        if (plan->storage_of[i] == i) plan->region[i] = REGION_ARENA;
    }
    for (int i = 0; i < n; i++)
        if (plan->storage_of[i] != i) plan->region[i] = plan->region[plan->storage_of[i]];
}

/* The arena's buffers, each from its definition to its last reader (the operands of an
 * op are still live at it, so its result never overlaps them), placed; then a buffer's
 * sharers where in it they start. */
static void place_arena(const ir_graph *g, dm_memory_plan *plan, const int *last_use, const char *read_in_step) {
    int n = g->n_values;
    int *item_id = calloc((size_t)n + 1, sizeof(int)), *def = calloc((size_t)n + 1, sizeof(int));
    int *dies = calloc((size_t)n + 1, sizeof(int));
    int64_t *size = calloc((size_t)n + 1, sizeof(int64_t)), *offset = calloc((size_t)n + 1, sizeof(int64_t));
    char *placed = calloc((size_t)n + 1, 1);
    if (!item_id || !def || !dies || !size || !offset || !placed) abort();
    int n_items = 0;
    /* a buffer is live from the first value written into it (a window assembly's first
     * piece comes before its sum). Positions: create's ops (the values made at create) at
     * their index, then the step's at n + index; a buffer made at create that a step reads
     * lives to the end (2 n), so no step value ever shares it. */
    for (int made_at_create = 1; made_at_create >= 0; made_at_create--)
        for (int i = 0; i < n; i++) {
            int root = plan->storage_of[i];
            if (plan->region[root] != REGION_ARENA || placed[root] || plan->at_create[root] != made_at_create) continue;
            placed[root] = 1;
            int at = made_at_create ? 0 : n;
            item_id[n_items] = root, def[n_items] = at + i;
            dies[n_items] = made_at_create && read_in_step[root] ? 2 * n : at + (last_use[root] < n ? last_use[root] : n);
            size[n_items] = round_up(ir_storage_elems(g, g->values[root]));
            plan->arena_unshared_elems += size[n_items];
            n_items++;
        }
    plan->arena_elems = place_buffers(n_items, size, def, dies, offset);
    for (int it = 0; it < n_items; it++) plan->offset[item_id[it]] = offset[it];
    for (int i = 0; i < n; i++)
        if (plan->storage_of[i] != i && plan->region[i] != REGION_NONE)
            plan->offset[i] = plan->offset[plan->storage_of[i]] + plan->within[i];
    free(placed);
    free(item_id);
    free(def);
    free(dies);
    free(size);
    free(offset);
}

int pass_memory(const ir_graph *g, dm_memory_plan *plan) {
    int n = g->n_values;
    memset(plan, 0, sizeof *plan);
    plan->region = calloc((size_t)n + 1, sizeof(dm_region));
    plan->offset = calloc((size_t)n + 1, sizeof(int64_t));
    plan->storage_of = calloc((size_t)n + 1, sizeof(int));
    plan->within = calloc((size_t)n + 1, sizeof(int64_t));
    int *last_use = calloc((size_t)n + 1, sizeof(int));
    char *read_in_step = calloc((size_t)n + 1, 1);
    if (!plan->region || !plan->offset || !plan->storage_of || !plan->within || !last_use || !read_in_step) abort();
    share_buffers(g, plan);
    dm_plan_at_create(g, plan);
    buffer_lifetimes(g, plan, last_use, read_in_step);
    assign_regions(g, plan);
    place_arena(g, plan, last_use, read_in_step);
    free(last_use);
    free(read_in_step);
    return 0;
}

void dm_memory_plan_free(dm_memory_plan *plan) {
    free(plan->stage);
    free(plan->rank);
    free(plan->copy_first);
    free(plan->copy_stage);
    free(plan->copy_offset);
    free(plan->sum_offset);
    free(plan->region);
    free(plan->offset);
    free(plan->storage_of);
    free(plan->within);
    free(plan->bias_add_of);
    free(plan->sum_add_of);
    free(plan->assembled_in);
    free(plan->row_stride);
    free(plan->at_create);
    memset(plan, 0, sizeof *plan);
}

/* ---- pipeline stages ------------------------------------------------------------------------
 *
 * Each stage's ranks hold their own regions. Parameters: those the stage's ops use, in
 * declaration order (a parameter tied across stages is held by each; its own stage, the
 * first, updates it). Gradients and optimizer state: those of the parameters it updates.
 * Arena: placed by liveness (place_buffers) over the stage's own sequence of definitions, phase by
 * phase: the values it receives in that phase (all at the phase function's start), then
 * its ops in program order. A value it computes is placed at its definition; one it
 * receives at its phase's start; either dies after its last reader on this stage. The
 * step's loss and outputs on their stage are read at the end of its forward function:
 * those live to the end of the phase. A micro-batch's partial gradient dies where it is
 * added to the step's sum (dm_summed_partials). */

typedef struct stage_item {
    int id;          /* the value (a storage root) */
    int def;         /* position of its definition on this stage (a receive: its own) */
    int dies;        /* position of its last reader on this stage (>= def) */
    int made_at_create; /* by create, before any step: a working buffer that is never a
                         * micro-batch's (one copy, or one in each copy of the whole arena) */
} stage_item;

/* Copies of values on stages other than their own, collected as triples, then sorted by
 * value into the plan's copy_first/copy_stage/copy_offset. */
typedef struct copy_list {
    int *id, *stage;
    int64_t *offset;
    int n, cap;
} copy_list;

static void add_copy(copy_list *c, int id, int stage, int64_t offset) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->id = realloc(c->id, (size_t)c->cap * sizeof(int));
        c->stage = realloc(c->stage, (size_t)c->cap * sizeof(int));
        c->offset = realloc(c->offset, (size_t)c->cap * sizeof(int64_t));
        if (!c->id || !c->stage || !c->offset) abort();
    }
    c->id[c->n] = id, c->stage[c->n] = stage, c->offset[c->n] = offset;
    c->n++;
}

/* Whether an item is one of the forward's values the backward reads: defined (or received)
 * by the end of the forward function, alive after it. */
static int is_kept(const stage_item *item, int forward_end) {
    return !item->made_at_create && item->def <= forward_end && item->dies > forward_end;
}

/* Places the items of one part of a stage's arena (kept: 1 the kept ones, 0 the others, -1
 * every item) by liveness; their offsets into offset[], the part's size returned. */
static int64_t place_items(const ir_graph *g, const stage_item *items, int n_items, int forward_end, int kept,
                           int64_t *offset) {
    int64_t *size = calloc((size_t)n_items + 1, sizeof(int64_t)), *at = calloc((size_t)n_items + 1, sizeof(int64_t));
    int *def = calloc((size_t)n_items + 1, sizeof(int)), *dies = calloc((size_t)n_items + 1, sizeof(int));
    int *which = calloc((size_t)n_items + 1, sizeof(int));
    if (!size || !at || !def || !dies || !which) abort();
    int n = 0;
    for (int it = 0; it < n_items; it++) {
        if (kept >= 0 && is_kept(&items[it], forward_end) != kept) continue;
        which[n] = it;
        size[n] = round_up(ir_storage_elems(g, g->values[items[it].id]));
        def[n] = items[it].def, dies[n] = items[it].dies;
        n++;
    }
    int64_t total = place_buffers(n, size, def, dies, at);
    for (int k = 0; k < n; k++) offset[which[k]] = at[k];
    free(size);
    free(at);
    free(def);
    free(dies);
    free(which);
    return total;
}

/* The arena of stage s: items (received values and the stage's own arena values) in
 * definition order, each freed after its last reader on this stage (place_buffers). */
static void plan_stage_arena(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe, int s,
                             const int *summed, copy_list *copies) {
    int n = g->n_values;
    stage_item *items = malloc(((size_t)n + 1) * sizeof *items);
    int *pos_of = malloc(((size_t)n + 1) * sizeof(int));   /* an op's position on this stage, or -1 */
    int *item_of = malloc(((size_t)n + 1) * sizeof(int));  /* a root's item on this stage, or -1 */
    if (!items || !pos_of || !item_of) abort();
    int n_items = 0, pos = 0, phase_end[3] = {-1, -1, -1};
    for (int i = 0; i < n; i++) pos_of[i] = item_of[i] = -1;
    const ir_phase phases[3] = {PHASE_FORWARD, PHASE_BACKWARD, PHASE_UPDATE};
    /* f = -1: the values made at create (passes/hoist_constants.c), before any step */
    int create_end = -1;
    for (int f = -1; f < 3; f++) {
        for (int i = 0; f >= 0 && i < n; i++) {
            const ir_value *v = g->values[i];
            int received = plan->region[i] == REGION_ARENA && plan->storage_of[i] == i && v->stage != s &&
                           v->phase == phases[f] && v->stage < 64 && (pipe->readers[i] >> s & 1);
            if (!received) continue;
            item_of[i] = n_items;
            items[n_items++] = (stage_item){.id = i, .def = pos, .dies = pos};
            pos++;
        }
        for (int i = 0; i < n; i++) {
            const ir_value *v = g->values[i];
            int made_at_create = dm_made_at_create(plan, i);
            if ((f < 0 ? !made_at_create : made_at_create || v->phase != phases[f]) || v->stage != s ||
                ir_op_info_of(v->op)->cls == OPC_SOURCE)
                continue;
            pos_of[i] = pos;
            /* a buffer is live from the first value written into it (a window
             * assembly's first piece comes before its sum) */
            int root = plan->storage_of[i];
            if (plan->region[i] == REGION_ARENA && item_of[root] < 0 && g->values[root]->stage == s &&
                (f < 0 || g->values[root]->phase == phases[f])) {
                item_of[root] = n_items;
                items[n_items++] = (stage_item){.id = root, .def = pos, .dies = pos, .made_at_create = made_at_create};
            }
            pos++;
        }
        if (f < 0) create_end = pos - 1;
        else phase_end[f] = pos - 1;
    }
    /* last readers on this stage; a micro-batch's partial gradient is added to the step's
     * sum where it is computed (the position of the value, a view's included) */
    for (int i = 0; i < n; i++) {
        if (pos_of[i] < 0) continue;
        const ir_value *v = g->values[i];
        int own = summed[i] >= 0 ? item_of[plan->storage_of[i]] : -1;
        if (own >= 0 && items[own].dies < pos_of[i]) items[own].dies = pos_of[i];
        for (int k = 0; k < v->n_operands; k++) {
            int it = item_of[plan->storage_of[v->operands[k]]];
            if (it >= 0 && items[it].dies < pos_of[i] && read_keeps_alive(summed, v, k)) items[it].dies = pos_of[i];
        }
        const ir_value *product = operands_also_read(plan, g, v);
        for (int k = 0; product && k < product->n_operands; k++) {
            int it = item_of[plan->storage_of[product->operands[k]]];
            if (it >= 0 && items[it].dies < pos_of[i]) items[it].dies = pos_of[i];
        }
    }
    /* made at create and read in a step: alive through every step */
    for (int it = 0; it < n_items; it++)
        if (items[it].made_at_create && items[it].dies > create_end) items[it].dies = pos;
    /* read at the end of the forward function: the loss and outputs */
    for (int q = -1; q < g->n_outputs; q++) {
        int id = q < 0 ? g->loss : g->outputs[q];
        int it = id >= 0 ? item_of[plan->storage_of[id]] : -1;
        if (it >= 0 && items[it].dies < phase_end[0]) items[it].dies = phase_end[0];
    }

    dm_stage_memory *sm = &plan->stage[s];
    int64_t *offset = calloc((size_t)n_items + 1, sizeof(int64_t));
    if (!offset) abort();
    for (int it = 0; it < n_items; it++) sm->arena_unshared_elems += round_up(ir_storage_elems(g, g->values[items[it].id]));
    sm->in_flight = pipe->stage && s < pipe->stages && pipe->stage[s].in_flight > 1 ? pipe->stage[s].in_flight : 1;
    sm->arena_elems = place_items(g, items, n_items, phase_end[0], -1, offset);
    sm->kept_elems = sm->in_flight > 1 ? sm->arena_elems : 0; /* the whole arena copied */
    if (sm->in_flight > 1) {
        /* or the working buffers first, then the forward's values the backward reads: kept
         * when smaller (a stage whose working buffers are small can hold less as one) */
        int64_t *split = calloc((size_t)n_items + 1, sizeof(int64_t));
        if (!split) abort();
        int64_t working = place_items(g, items, n_items, phase_end[0], 0, split);
        int64_t kept = place_items(g, items, n_items, phase_end[0], 1, split);
        if (working + kept * sm->in_flight < sm->arena_elems * sm->in_flight) {
            for (int it = 0; it < n_items; it++) offset[it] = split[it] + (is_kept(&items[it], phase_end[0]) ? working : 0);
            sm->arena_elems = working + kept;
            sm->kept_elems = kept;
        }
        free(split);
    }
    sm->held_elems = sm->arena_elems + (int64_t)(sm->in_flight - 1) * sm->kept_elems;
    for (int it = 0; it < n_items; it++) {
        int id = items[it].id;
        if (g->values[id]->stage == s) plan->offset[id] = offset[it];
        else add_copy(copies, id, s, offset[it]);
    }
    free(offset);
    free(items);
    free(pos_of);
    free(item_of);
}

/* The persistent regions of every stage: parameters (each holder's copy of a tied one),
 * gradients and state on their own stage, in declaration order. */
static void plan_stage_persistent(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe,
                                  copy_list *copies) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        int64_t size = round_up(ir_local_numel(g, &v->type));
        if (plan->region[i] == REGION_PARAMS || plan->region[i] == REGION_GRADS) size = dm_persistent_elems(g, ir_local_numel(g, &v->type));
        /* a value sharing a buffer is placed with it (below, in memory_plan_stages) */
        if (v->stage >= plan->stages || plan->storage_of[i] != i) continue;
        dm_stage_memory *own = &plan->stage[v->stage];
        switch (plan->region[i]) {
        case REGION_PARAMS: {
            plan->offset[i] = own->param_elems;
            own->param_elems += size;
            /* a copy on each other rank reading it, in the first of its stages that does */
            uint64_t others = v->stage < 64 ? pipe->readers[plan->storage_of[i]] & ~((uint64_t)1 << v->stage) : 0;
            uint64_t ranks_held = (uint64_t)1 << dm_rank_of_stage(pipe, v->stage);
            for (int s = 0; s < plan->stages && s < 64; s++)
                if ((others >> s & 1) && !(ranks_held >> dm_rank_of_stage(pipe, s) & 1)) {
                    ranks_held |= (uint64_t)1 << dm_rank_of_stage(pipe, s);
                    add_copy(copies, i, s, plan->stage[s].param_elems);
                    plan->stage[s].param_elems += size;
                }
            break;
        }
        case REGION_GRADS:
            plan->offset[i] = own->grad_elems;
            own->grad_elems += size;
            break;
        case REGION_STATE:
            plan->offset[i] = own->state_elems;
            own->state_elems += size;
            break;
        default: break;
        }
    }
}

_Static_assert(REGION_GRADS == REGION_PARAMS + 1 && REGION_STATE == REGION_PARAMS + 2 && REGION_ARENA == REGION_PARAMS + 3,
               "stack_chunks numbers the regions from params");

/* Interleaved, a rank holds its chunks' stages: each region of the rank is theirs one after
 * the other (chunk 0's first), and every offset, a copy's too, moves to where its stage's
 * part starts in its rank's region. Without chunks the parts start at 0. */
static void stack_chunks(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe, copy_list *copies) {
    int S = plan->stages;
    int64_t *base = calloc((size_t)S * 4 + 1, sizeof(int64_t)); /* per stage: params, grads, state, arena */
    if (!base) abort();
    for (int r = 0; r < pipe->ranks; r++) {
        int64_t at[4] = {0};
        for (int k = r; k < S; k += pipe->ranks) {
            dm_stage_memory *m = &plan->stage[k];
            const int64_t size[4] = {m->param_elems, m->grad_elems, m->state_elems, m->held_elems};
            for (int q = 0; q < 4; q++) base[4 * k + q] = at[q], at[q] += size[q];
            m->arena_base = base[4 * k + 3];
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        int k = g->values[i]->stage, q = plan->region[i] - REGION_PARAMS;
        if (plan->storage_of[i] == i && k >= 0 && k < S && q >= 0 && q < 4) plan->offset[i] += base[4 * k + q];
    }
    for (int c = 0; c < copies->n; c++) {
        int q = plan->region[copies->id[c]] - REGION_PARAMS;
        if (q >= 0 && q < 4) copies->offset[c] += base[4 * copies->stage[c] + q];
    }
    free(base);
}

/* What each rank holds: the sums of its stages' regions (without chunks, its stage's: no
 * table of its own, as ZeRO changes the stages' sizes later). */
static void sum_ranks(dm_memory_plan *plan, const dm_pipeline_plan *pipe) {
    plan->ranks = pipe->ranks;
    if (pipe->chunks <= 1) return;
    plan->rank = calloc((size_t)plan->ranks, sizeof *plan->rank);
    if (!plan->rank) abort();
    for (int k = 0; k < plan->stages; k++) {
        const dm_stage_memory *m = &plan->stage[k];
        dm_stage_memory *r = &plan->rank[dm_rank_of_stage(pipe, k)];
        r->param_elems += m->param_elems, r->grad_elems += m->grad_elems, r->state_elems += m->state_elems;
        r->grad_sum_elems += m->grad_sum_elems ? m->grad_sum_elems : m->grad_elems;
        r->arena_unshared_elems += m->arena_unshared_elems;
        /* the rank's arena is its stages' held regions, each its own; one micro-batch's is
         * their arenas' */
        r->arena_elems += m->arena_elems, r->held_elems += m->held_elems;
        if (m->in_flight > r->in_flight) r->in_flight = m->in_flight;
    }
}

void memory_plan_stages(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe) {
    if (pipe->stages <= 1 || !pipe->readers) return;
    int n = g->n_values;
    plan->stages = pipe->stages;
    plan->stage = calloc((size_t)plan->stages, sizeof *plan->stage);
    plan->copy_first = calloc((size_t)n + 2, sizeof(int));
    if (!plan->stage || !plan->copy_first) abort();
    copy_list copies = {0};
    plan_stage_persistent(plan, g, pipe, &copies);
    int *summed = dm_summed_partials(g);
    for (int s = 0; s < plan->stages; s++) plan_stage_arena(plan, g, pipe, s, summed, &copies);
    free(summed);
    if (pipe->chunks > 1) stack_chunks(plan, g, pipe, &copies);
    /* a sharing reshape is where its root is */
    for (int i = 0; i < n; i++)
        if (plan->storage_of[i] != i) plan->offset[i] = plan->offset[plan->storage_of[i]] + plan->within[i];
    /* the copies by value (counting sort; stages ascending within a value, as added) */
    for (int k = 0; k < copies.n; k++) plan->copy_first[copies.id[k] + 1]++;
    for (int i = 0; i < n; i++) plan->copy_first[i + 1] += plan->copy_first[i];
    plan->copy_stage = malloc(((size_t)copies.n + 1) * sizeof(int));
    plan->copy_offset = malloc(((size_t)copies.n + 1) * sizeof(int64_t));
    int *fill = malloc(((size_t)n + 1) * sizeof(int));
    if (!plan->copy_stage || !plan->copy_offset || !fill) abort();
    memcpy(fill, plan->copy_first, (size_t)n * sizeof(int));
    for (int k = 0; k < copies.n; k++) {
        int at = fill[copies.id[k]]++;
        plan->copy_stage[at] = copies.stage[k];
        plan->copy_offset[at] = copies.offset[k];
    }
    free(fill);
    free(copies.id);
    free(copies.stage);
    free(copies.offset);
    /* what the largest rank holds */
    sum_ranks(plan, pipe);
    plan->param_elems = plan->grad_elems = plan->state_elems = plan->arena_elems = plan->arena_unshared_elems = 0;
    for (int s = 0; s < plan->ranks; s++) {
        const dm_stage_memory *m = dm_rank_memory(plan, s);
        if (m->param_elems > plan->param_elems) plan->param_elems = m->param_elems;
        if (m->grad_elems > plan->grad_elems) plan->grad_elems = m->grad_elems;
        if (m->state_elems > plan->state_elems) plan->state_elems = m->state_elems;
        if (m->arena_elems > plan->arena_elems) plan->arena_elems = m->arena_elems;
        if (m->arena_unshared_elems > plan->arena_unshared_elems) plan->arena_unshared_elems = m->arena_unshared_elems;
    }
}

const dm_stage_memory *dm_rank_memory(const dm_memory_plan *plan, int rank) {
    return plan->rank ? &plan->rank[rank] : &plan->stage[rank];
}

/* The rank (pipeline coordinate) of stage k. */
static int rank_of(const dm_memory_plan *plan, int k) { return plan->ranks > 1 ? k % plan->ranks : 0; }

/* Operand k of update op v (parameter, gradient, the state tensors, a pruning mask last)
 * when it is its gradient or a state tensor, or -1. */
static int update_operand(const ir_graph *g, const ir_value *v, int k) {
    if (ir_op_info_of(v->op)->cls != OPC_UPDATE) return -1;
    int mask = g->values[v->operands[v->n_operands - 1]]->prune_mask;
    return k >= 1 && k < v->n_operands - mask ? v->operands[k] : -1;
}

/* The buffers of `region` anew: operand `first` of every update in the updates' order,
 * then operand first + 1 of every one, ... up to operand `last`; each of the region's
 * `elems` elements as before (sizes by `padded`), the values sharing a buffer moved with
 * it. Where a buffer of the region is no update's, the plan stays. */
static void relayout_by_update(dm_memory_plan *plan, const ir_graph *g, dm_region region, int first, int last, int64_t elems,
                               int64_t (*padded)(const ir_graph *g, int64_t numel)) {
    int n = g->n_values, buffers = 0, placed = 0;
    int64_t *at = malloc(((size_t)n + 1) * sizeof(int64_t)), top = 0;
    if (!at) abort();
    for (int i = 0; i < n; i++) {
        at[i] = -1;
        buffers += plan->region[i] == region && plan->storage_of[i] == i;
    }
    for (int k = first; k <= last; k++)
        for (int i = 0; i < n; i++) {
            int b = update_operand(g, g->values[i], k);
            if (b < 0 || plan->region[b] != region || plan->storage_of[b] != b || at[b] >= 0) continue;
            at[b] = top;
            top += padded(g, ir_local_numel(g, &g->values[b]->type));
            placed++;
        }
    if (placed == buffers && top == elems)
        for (int i = 0; i < n; i++)
            if (at[plan->storage_of[i]] >= 0) plan->offset[i] = at[plan->storage_of[i]] + plan->within[i];
    free(at);
}

static int64_t state_padded(const ir_graph *g, int64_t numel) {
    (void)g;
    return round_up(numel);
}

void memory_update_layout(dm_memory_plan *plan, const ir_graph *g) {
    if (plan->stages > 1 || g->zero || g->param_servers.servers) return;
    /* several ranks reduce gradients in buckets of the backward pass's order: kept */
    for (int a = 0; a < g->n_axes; a++)
        if (g->axes[a].size > 1) return;
    relayout_by_update(plan, g, REGION_GRADS, 1, 1, plan->grad_elems, dm_persistent_elems);
    relayout_by_update(plan, g, REGION_STATE, 2, 5, plan->state_elems, state_padded);
}

int64_t dm_offset_on(const dm_memory_plan *plan, const ir_graph *g, int id, int stage) {
    int root = plan->storage_of[id];
    if (plan->stages <= 1 || stage < 0 || g->values[root]->stage == stage) return plan->offset[root] + plan->within[id];
    if (plan->region[root] == REGION_PARAMS) return dm_offset_on_rank(plan, g, id, rank_of(plan, stage));
    for (int k = plan->copy_first[root]; k < plan->copy_first[root + 1]; k++)
        if (plan->copy_stage[k] == stage) return plan->copy_offset[k] + plan->within[id];
    return -1;
}

int64_t dm_offset_on_rank(const dm_memory_plan *plan, const ir_graph *g, int id, int rank) {
    int root = plan->storage_of[id];
    if (plan->stages <= 1 || rank_of(plan, g->values[root]->stage) == rank) return plan->offset[root] + plan->within[id];
    for (int k = plan->copy_first[root]; k < plan->copy_first[root + 1]; k++)
        if (rank_of(plan, plan->copy_stage[k]) == rank) return plan->copy_offset[k] + plan->within[id];
    return -1;
}

/* ---- what a rank allocates ------------------------------------------------------------------ */

int64_t dm_grad_sum_offset(const dm_memory_plan *plan, int id) {
    return plan->sum_offset ? plan->sum_offset[id] : plan->offset[id];
}

int64_t dm_grad_sum_elems(const dm_memory_plan *plan, int rank) {
    if (plan->stages > 1 && rank >= 0 && rank < plan->ranks) {
        const dm_stage_memory *m = dm_rank_memory(plan, rank);
        return m->grad_sum_elems ? m->grad_sum_elems : m->grad_elems;
    }
    return plan->grad_sum_elems ? plan->grad_sum_elems : plan->grad_elems;
}

int64_t dm_scratch_elems(const ir_graph *g, const dm_scratch_rules *rules) {
    int64_t need = 0;
    for (int id = 0; id < g->n_values; id++) {
        const ir_value *v = g->values[id];
        int64_t n = 0;
        if (v->op == OP_ALLGATHER) {
            n = ir_local_numel(g, &v->type);
        } else if (v->op == OP_REDUCE_SCATTER) {
            n = ir_local_numel(g, &g->values[v->operands[0]]->type);
        } else if (v->op == OP_ALLTOALL) {
            n = 2 * ir_local_numel(g, &v->type);
        } else if (v->op == OP_XENT_STATS) {
            ir_type logits = ir_local_type(g, &g->values[v->operands[0]]->type);
            int64_t rows = ir_numel(&logits) / logits.shape[logits.rank - 1];
            int axis = ir_class_split_axis(g, v);
            n = rules->xent_floats(rows, axis == IR_REPLICATED ? 1 : g->axes[axis].size);
        } else if (v->op == OP_LAYERNORM_WGRAD) {
            ir_type x = ir_local_type(g, &g->values[v->operands[0]]->type);
            int64_t n_last = x.shape[x.rank - 1];
            n = rules->wgrad_floats(ir_numel(&x) / n_last, n_last);
        } else if (v->op == OP_EMBED_GRAD) {
            n = (rules->embed_grad_bytes(ir_local_numel(g, &g->values[v->operands[0]]->type)) + 3) / 4;
        } else if ((v->op == OP_ATTENTION || v->op == OP_ATTENTION_GRAD) && rules->attention_floats) {
            ir_type q = ir_local_type(g, &g->values[v->operands[0]]->type);
            ir_attention_layout a = ir_attention_layout_of(v, &q);
            n = rules->attention_floats(a.heads, a.positions, a.width, g->attention_16bit ? g->product_dtype : DT_F32);
        }
        if (n > need) need = n;
    }
    return need;
}

int dm_output_gathered(const ir_graph *g, const ir_value *v) {
    /* a split or pending output is itself what makes the program partitioned */
    if (v->type.dtype != DT_F32) return 0;
    if (ir_pipeline_axis(g) >= 0 || v->type.partial) return 1;
    for (int d = 0; d < v->type.rank; d++)
        if (v->type.split[d] != IR_REPLICATED) return 1;
    return 0;
}

/* dmrt_alloc's rounding: 64 bytes at least, in 64-byte steps */
static int64_t allocated(int64_t bytes) { return bytes <= 0 ? 64 : (bytes + 63) / 64 * 64; }

void dm_memory_peak_of(const dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe,
                       int64_t scratch_elems, int stage, dm_memory_peak *out) {
    memset(out, 0, sizeof *out);
    int staged = plan->stages > 1 && stage >= 0 && stage < plan->ranks;
    const dm_stage_memory *mine = staged ? dm_rank_memory(plan, stage) : NULL;
    int64_t params = staged ? mine->param_elems : plan->param_elems;
    int64_t grads = staged ? mine->grad_elems : plan->grad_elems;
    int64_t state = staged ? mine->state_elems : plan->state_elems;
    int scheduled = ir_is_scheduled(g), k = stage < 0 ? 0 : stage;
    int in_flight = scheduled && pipe && pipe->stage && k < pipe->stages ? pipe->stage[k].in_flight : 1;
    /* a stage keeps a copy of its kept values per micro-batch in flight, one of the rest */
    int64_t arena = staged ? mine->held_elems : plan->arena_elems * in_flight;
    int64_t M = scheduled ? g->microbatches : 1;
    out->params = allocated(4 * params);
    out->grads = allocated(4 * grads);
    out->optimizer_state = allocated(4 * state);
    out->activations = allocated(4 * arena);
    if (scheduled && g->loss >= 0 && g->grads && g->microbatches > 1)
        out->gradient_sums = allocated(4 * dm_grad_sum_elems(plan, staged ? stage : -1));
    if (scratch_elems > 0) out->scratch = allocated(4 * scratch_elems);
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = g->values[g->outputs[i]];
        if (scheduled) out->outputs += allocated(staged && rank_of(plan, v->stage) != stage ? 0 : 4 * M * ir_local_numel(g, &v->type));
        if (dm_output_gathered(g, v)) out->gathered_outputs += allocated(4 * M * ir_numel(&v->type));
    }
    if (dm_runs_2bw(g) && staged) {
        /* a buffer on every rank for each input some stage keeps (empty on the others) */
        out->weight_version = out->params * (dm_weight_versions(g, stage) - 1);
        uint64_t any = 0, mine_kept = dm_2bw_kept_inputs(g, plan, stage);
        for (int s = 0; s < plan->ranks; s++) any |= dm_2bw_kept_inputs(g, plan, s);
        for (int n = 0; n < g->n_inputs && n < 64; n++)
            if (any >> n & 1)
                out->previous_inputs +=
                    allocated(mine_kept >> n & 1 ? 4 * ir_numel(&g->values[g->inputs[n]]->type) * g->microbatches : 0);
    }
    out->total = out->params + out->grads + out->optimizer_state + out->activations + out->gradient_sums + out->scratch +
                 out->outputs + out->weight_version + out->previous_inputs;
}
