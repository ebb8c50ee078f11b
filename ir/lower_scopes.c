/* lower_scopes.c: the lowering's names and types: scopes (a hash of bindings each, names
 * defined once, suggestions for a misspelt one) and the evaluation of a written type into
 * an IR type (dims, splits over mesh axes, the element limit). lower.c's walk over the
 * program and its layers uses them, as do the other lower_*.c files (lower_internal.h). */
#include "lower_internal.h"

#include <stdlib.h>
#include <string.h>

#include "suggest.h"

/* ---- scopes ---------------------------------------------------------------------------- */

binding *lower_scope_find_local(scope *s, const char *name) {
    if (!s->n_slots) return NULL;
    for (unsigned i = ir_hash_string(name) & (unsigned)(s->n_slots - 1);; i = (i + 1) & (unsigned)(s->n_slots - 1)) {
        int k = s->slots[i];
        if (k < 0) return NULL;
        if (strcmp(s->items[k].name, name) == 0) return &s->items[k];
    }
}

static void slot_insert(scope *s, int k) {
    unsigned mask = (unsigned)(s->n_slots - 1), i = ir_hash_string(s->items[k].name) & mask;
    while (s->slots[i] >= 0) i = (i + 1) & mask;
    s->slots[i] = k;
}

/* Indexes the newest binding, keeping the index at most half full (rebuilt twice as
 * large when it would not be), so lookups stay short however many names. */
static void scope_index(scope *s) {
    if (s->n * 2 < s->n_slots) {
        slot_insert(s, s->n - 1);
        return;
    }
    free(s->slots);
    s->n_slots = s->n_slots ? s->n_slots * 2 : 32;
    s->slots = malloc((size_t)s->n_slots * sizeof(int));
    if (!s->slots) abort();
    for (int i = 0; i < s->n_slots; i++) s->slots[i] = -1;
    for (int k = 0; k < s->n; k++) slot_insert(s, k);
}

binding *lower_scope_find(scope *s, const char *name) {
    for (; s; s = s->parent) {
        binding *b = lower_scope_find_local(s, name);
        if (b) return b;
    }
    return NULL;
}

const char *lower_binding_kind_name(binding_kind k) {
    static const char *const names[] = {"dimension", "value", "layer", "block"};
    return names[k];
}

void lower_report_redefinition(lowerer *L, const char *name, dm_loc loc, const binding *old) {
    dm_error(L->d, loc, "redefinition of '%s'", name);
    dm_note(L->d, old->loc, "previous definition of '%s' (a %s) is here", name, lower_binding_kind_name(old->kind));
}

/* A dotted name (fc1.weight) is a path into layers, which only a layer's block defines. */
void lower_report_dotted(lowerer *L, const char *name, dm_loc loc) {
    dm_error(L->d, loc, "'%s' is a path into a layer: only the layer's block defines what it names (a definition takes a "
                        "name without '.')", name);
}

/* Adds a binding for a name s does not hold yet. */
binding *lower_scope_add(lowerer *L, scope *s, const char *name, binding_kind kind, dm_loc loc) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        binding *grown = realloc(s->items, (size_t)s->cap * sizeof *grown);
        if (!grown) abort();
        s->items = grown;
    }
    binding *b = &s->items[s->n++];
    memset(b, 0, sizeof *b);
    b->name = ir_intern(L->g, name);
    b->kind = kind;
    b->loc = loc;
    scope_index(s);
    return b;
}

/* Adds a binding; a name already bound in the same scope is a redefinition. */
void lower_bind_value(lowerer *L, binding *b, int v) {
    b->value = v;
    if (v > L->newest_bound) L->newest_bound = v;
}

binding *lower_bind(lowerer *L, scope *s, const char *name, binding_kind kind, dm_loc loc) {
    binding *old = lower_scope_find_local(s, name);
    if (old) {
        lower_report_redefinition(L, name, loc, old);
        return NULL;
    }
    return lower_scope_add(L, s, name, kind, loc);
}

/* Up to max names bound in s and the scopes around it, of the kinds in the mask (a bit
 * per binding_kind), for "did you mean". */
int lower_visible_names(const scope *s, unsigned kinds, const char **out, int max) {
    int n = 0;
    for (; s; s = s->parent)
        for (int k = 0; k < s->n && n < max; k++)
            if (kinds >> s->items[k].kind & 1) out[n++] = s->items[k].name;
    return n;
}

/* "; did you mean 'NAME'?" for a name unknown in s, or "" when none is near. Nothing is
 * searched once errors are no longer printed (hostile input with thousands of them). */
void lower_near_name(lowerer *L, scope *s, const char *name, unsigned kinds, char *buf, size_t size) {
    enum { MAX_CANDIDATES = 4096 };
    buf[0] = 0;
    if (L->d->n_errors >= L->d->max_errors) return;
    const char **names = malloc(MAX_CANDIDATES * sizeof *names);
    if (!names) abort();
    int n = lower_visible_names(s, kinds, names, MAX_CANDIDATES);
    dm_format_suggestion(buf, size, dm_nearest_name(name, names, n), "", NULL, 0);
    free(names);
}

void lower_scope_free(scope *s) {
    free(s->items);
    free(s->slots);
}

/* ---- types ----------------------------------------------------------------------------- */

int lower_axis_index(const ir_graph *g, const char *name) {
    for (int i = 0; i < g->n_axes; i++)
        if (strcmp(g->axes[i].name, name) == 0) return i;
    return -1;
}

/* The name a type prints for a dim written as e: a global dimension's own name, a
 * block parameter's name at the call site (D, not IN), or NULL for arithmetic. */
const char *lower_dim_name_of(scope *s, const dm_expr *e) {
    if (e->kind != EXPR_NAME) return NULL;
    binding *b = lower_scope_find(s, e->name);
    return b && b->kind == B_DIM ? b->display : NULL;
}

/* A tensor over the element limit: its name, its dims with their values (the sizes --set
 * made), and, in a block, the layer whose declaration gave them. */
static void report_too_large(lowerer *L, const dm_type *t, const char *what, const ir_type *shape) {
    char sizes[512];
    ir_format_sizes(shape, sizes, sizeof sizes);
    double numel = 1;
    for (int i = 0; i < shape->rank; i++) numel *= (double)shape->shape[i];
    dm_error(L->d, t->loc, "tensor '%s' is too large: %s has %.3g elements (at most 2^40)", what, sizes, numel);
    if (L->layer_path) dm_note(L->d, L->layer_loc, "in layer '%s', declared here", L->layer_path);
}

/* The type written as t, for the tensor named what (for messages). A split that does not
 * divide its dim is reported and left out, so that the name is still defined and later
 * uses of it do not cascade into more errors. */
int lower_eval_type(lowerer *L, scope *s, const dm_type *t, const char *what, ir_type *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < IR_MAX_RANK; i++) out->split[i] = IR_REPLICATED;
    if (strcmp(t->dtype, "f32") == 0) out->dtype = DT_F32;
    else if (strcmp(t->dtype, "i32") == 0) out->dtype = DT_I32;
    else {
        dm_error(L->d, t->dtype_loc, "unknown dtype '%s' (expected f32 or i32)", t->dtype);
        return -1;
    }
    if (t->rank > IR_MAX_RANK) {
        dm_error(L->d, t->loc, "rank %d exceeds the maximum of %d", t->rank, IR_MAX_RANK);
        return -1;
    }
    out->rank = t->rank;
    int errors = 0, too_large = 0;
    int64_t numel = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t size;
        if (lower_eval_dim(L, s, t->dims[i], &size)) { errors++; continue; }
        if (size <= 0) {
            dm_error(L->d, t->dims[i]->loc, "dimension must be positive, got %lld", (long long)size);
            errors++;
            continue;
        }
        if (mul_checked(numel, size, &numel) || numel > MAX_NUMEL) too_large = 1;
        out->shape[i] = size;
        const char *dn = lower_dim_name_of(s, t->dims[i]);
        out->dim_name[i] = dn ? ir_intern(L->g, dn) : NULL;
        if (too_large) continue;
        if (t->axes[i]) {
            int a = lower_axis_index(L->g, t->axes[i]);
            if (a < 0) {
                dm_error(L->d, t->axis_locs[i], "unknown mesh axis '%s'", t->axes[i]);
                if (L->g->n_axes == 0) dm_note(L->d, t->axis_locs[i], "declare the mesh first: mesh(%s = 2)", t->axes[i]);
                errors++;
                continue;
            }
            if (a == L->g->pipe_axis) {
                dm_error(L->d, t->axis_locs[i], "the pipeline axis splits the model into stages, not dims");
                dm_note(L->d, t->axis_locs[i], "dmc chooses the stages (dmc --explain shows them); drop '@%s'", t->axes[i]);
                errors++;
                continue;
            }
            if (size % L->g->axes[a].size != 0) {
                int64_t parts = L->g->axes[a].size, padded = (size + parts - 1) / parts * parts;
                dm_error(L->d, t->axis_locs[i], "'%s' cannot be split evenly: dim %d has size %lld, mesh axis '%s' has size %lld",
                         what, i, (long long)size, t->axes[i], (long long)parts);
                dm_note(L->d, t->axis_locs[i], "dims are not padded: make it a multiple of %lld (%lld), or drop '@%s'",
                        (long long)parts, (long long)padded, t->axes[i]);
                continue;
            }
            for (int k = 0; k < i; k++)
                if (out->split[k] == a) {
                    dm_error(L->d, t->axis_locs[i], "mesh axis '%s' already splits dim %d", t->axes[i], k);
                    errors++;
                }
            out->split[i] = (int8_t)a;
        }
    }
    if (too_large && !errors) report_too_large(L, t, what, out);
    return errors || too_large ? -1 : 0;
}
