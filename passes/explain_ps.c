/* explain_ps.c: the parameter servers of --param-servers in --explain: what each worker and
 * each server sends and receives per step, beside what the allreduce plan they replace
 * sends (runtime/comm/dmrt_ps.h has the protocol). */
#include <stdio.h>

#include "explain.h"

/* The traffic of one step, in floats. */
typedef struct ps_traffic {
    int workers, servers, states;
    double params;          /* the parameters the program updates (those with an update op: the
                             * servers hold no other), laid end to end; every one replicated: a
                             * data mesh */
    double shard;           /* the largest server's share of them */
    double allreduce_sent;  /* what a worker's gradient allreduces would send (ring) */
    int allreduces;
} ps_traffic;

static ps_traffic traffic(const ir_graph *g) {
    ps_traffic t = {0};
    t.servers = g->param_servers.servers;
    t.workers = (int)ir_mesh_ranks(g);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (ir_op_info_of(v->op)->cls != OPC_UPDATE) continue;
        t.params += (double)ir_numel(&g->values[v->operands[0]]->type); /* one update per parameter */
        if (!t.states) t.states = v->n_operands - 2;
    }
    t.shard = (double)(((long long)t.params + t.servers - 1) / t.servers);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (!explain_replaced_by_param_servers(g, i)) continue;
        t.allreduce_sent += explain_collective_sent_bytes(g, v) / 4.0; /* (in floats) */
        t.allreduces++;
    }
    return t;
}

void explain_ps_text(const ir_graph *g, FILE *out) {
    if (!g->param_servers.servers) return;
    ps_traffic t = traffic(g);
    char params[32], shard[32], state[32], ring[32], pushed[32];
    explain_mib(t.params, params, sizeof params);
    explain_mib(t.shard, shard, sizeof shard);
    explain_mib(t.shard * t.states, state, sizeof state);
    explain_mib(t.allreduce_sent, ring, sizeof ring);
    explain_mib(t.params * 2, pushed, sizeof pushed);
    fprintf(out, "parameter servers (--param-servers %d): world ranks %d..%d, after the mesh's %d workers; ", t.servers,
            t.workers, t.workers + t.servers - 1, t.workers);
    if (g->param_servers.staleness < 0)
        fprintf(out, "synchronous:\n  each server sums the workers' pushes of a step in worker order and updates once: the "
                     "allreduce's result\n");
    else
        fprintf(out, "asynchronous:\n  each push is an update of its own (%d per step), and no worker runs more than %d "
                     "step%s ahead of the slowest\n", t.workers, g->param_servers.staleness,
                g->param_servers.staleness == 1 ? "" : "s");
    fprintf(out, "  they replace the update's %d gradient allreduce%s over data (not counted in the collectives above; "
                 "--explain=full lists them tagged, --explain=json marks them replaced_by_param_servers) and the "
                 "optimizer's update on the workers\n",
            t.allreduces, t.allreduces == 1 ? "" : "s");
    fprintf(out, "  per worker and step: pushes %s of gradients, pulls %s of parameters (%s in all); the allreduce "
                 "plan sends %s and receives as much\n", params, params, pushed, ring);
    char in[32];
    explain_mib(t.shard * t.workers, in, sizeof in);
    fprintf(out, "  per server and step: receives %d x %s of gradients and sends %d x %s of parameters (%s each way)\n",
            t.workers, shard, t.workers, shard, in);
    /* runtime/comm/param_server.c: beside the shard and its state, the pushes' sum and a
     * message buffer, a shard each (outside the workers' memory plan) */
    char buffers[32], all[32];
    explain_mib(t.shard * 2, buffers, sizeof buffers);
    explain_mib(t.shard * (3 + t.states), all, sizeof all);
    fprintf(out, "  a server holds %s of parameters, %s of optimizer state and %s of buffers (the pushes' sum, a message): "
                 "%s; a worker, no optimizer state (and a shard's buffer while it exchanges one)\n\n",
            shard, state, buffers, all);
}

void explain_ps_json(const ir_graph *g, FILE *out) {
    if (!g->param_servers.servers) return;
    ps_traffic t = traffic(g);
    fprintf(out, ", \"param_servers\": {\"servers\": %d, \"workers\": %d, \"first_server_rank\": %d, \"synchronous\": %s, "
                 "\"staleness\": %d, \"worker_sends_bytes\": %.0f, \"worker_receives_bytes\": %.0f, "
                 "\"server_sends_bytes\": %.0f, \"server_receives_bytes\": %.0f, \"server_param_bytes\": %.0f, "
                 "\"server_state_bytes\": %.0f, \"server_buffer_bytes\": %.0f, \"replaced_allreduces\": %d, "
                 "\"allreduce_sent_bytes\": %.0f}",
            t.servers, t.workers, t.workers, g->param_servers.staleness < 0 ? "true" : "false", g->param_servers.staleness,
            4 * t.params, 4 * t.params, 4 * t.shard * t.workers, 4 * t.shard * t.workers, 4 * t.shard,
            4 * t.shard * t.states, 4 * t.shard * 2, t.allreduces, 4 * t.allreduce_sent);
}
