/* explain_channels.c: --compact in --explain: which weights lost output channels, from how
 * many to how many, and why the others kept theirs (passes/compact_channels.c). */
#include <stdio.h>

#include "explain.h"

void explain_compaction_text(const dm_compaction *c, FILE *out) {
    if (!c || !c->n_layers) return;
    fprintf(out, "compacted from %s (--compact): parameters %lld -> %lld (%.1f%%)\n", c->path,
            (long long)c->params_before, (long long)c->params_after,
            c->params_before ? 100.0 * (double)c->params_after / (double)c->params_before : 0.0);
    for (int k = 0; k < c->n_layers; k++) {
        const dm_layer_compaction *l = &c->layers[k];
        if (l->heads && l->why_not && !l->before)
            fprintf(out, "  %-24s heads not recognised: %s\n", l->weight, l->why_not);
        else if (l->heads && l->why_not)
            fprintf(out, "  %-24s %lld heads kept: %s\n", l->weight, (long long)l->before, l->why_not);
        else if (l->heads)
            fprintf(out, "  %-24s %lld -> %lld %s (q, k, v's columns and biases, and %s's rows)\n", l->weight,
                    (long long)l->before, (long long)l->after, l->why, l->next_weight);
        else if (l->why_not)
            fprintf(out, "  %-24s %lld channels kept: %s\n", l->weight, (long long)l->before, l->why_not);
        else
            fprintf(out, "  %-24s %lld -> %lld output channels (its bias and %s's rows with it%s)\n", l->weight,
                    (long long)l->before, (long long)l->after, l->next_weight,
                    l->folded ? "; the removed channels' constants folded into the next bias" : "");
    }
    fprintf(out, "\n");
}
