/* test_schedule.c: pipeline schedules (passes/schedule.c) against the dependency rules and
 * the formulas they must meet, for every P in 1..8, M in 1..16, both schedules, and
 * backward costs of 1x and 2x the forward:
 *   - every stage runs F and B of every micro-batch exactly once, never two at a time;
 *   - F(s, m) starts after F(s-1, m) ends; B(s, m) after B(s+1, m), and on the last stage
 *     after F(s, m); no action waits when its stage is free and its input is there;
 *   - the bubble is (P - 1) / (M + P - 1) for both schedules;
 *   - activations in flight: M on every stage for GPipe, min(P - s, M) for 1F1B;
 *   - GPipe's forward of micro-batch m on stage s is at slot s + m;
 *   - the grid of P=4, M=8 GPipe (unit costs) is as drawn in the GPipe paper;
 *   - unequal stages (pipe_schedule_build_staged): GPipe's step is the flow shop's,
 *     sum(f) + (M - 1) max(f) + sum(b) + (M - 1) max(b), for random per-stage costs; a
 *     1F1B case timed by hand, and again with the last stage sending its gradient before
 *     its backward ends (its weight gradients after the send); equal costs give the uniform
 *     schedule action for action;
 *   - interleaved 1F1B, for P in 2..8, v in 2..4 chunks and M in P..4P (multiples of P),
 *     unit and 2x backward costs: each stage's order is the one written out below (its own
 *     code: micro-batches in groups of P through the chunks, backwards from the last
 *     chunk, (v - 1) P + 2 (P - s - 1) warm-up forwards), every virtual stage (chunk c of
 *     stage s is j = c P + s) runs F and B of every micro-batch once, F(j, m) after
 *     F(j-1, m), B(j, m) after B(j+1, m) (on the last after F(j, m)) with no needless wait
 *     (so the simulation found no deadlock), the activations in flight are those counted
 *     on the orders, and the bubble is (P - 1) / (v M + P - 1): (1/v)(P - 1)/M of the
 *     ideal step; the grid of P=2, v=2, M=2 as timed by hand; M not a multiple of P, or
 *     one chunk, refused;
 *   - 2bw (PipeDream-2BW) for P in 2..8, M in P..16, backward costing 1x and 2x: the
 *     stream's order (check_2bw), a step's M (f + b) + (P - 1) f, the drain's (P - 1) b,
 *     in-flight counts, M < P refused.
 * Prints FAIL lines; exits 1 on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

static int failures;

#define EXPECT(cond, ...)                                       \
    do {                                                        \
        if (!(cond)) {                                          \
            failures++;                                         \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);         \
            printf(__VA_ARGS__);                                \
            printf("\n");                                       \
        }                                                       \
    } while (0)

static void check(pipe_kind kind, int P, int M, double f, double b) {
    pipe_schedule s;
    const char *name = pipe_kind_name(kind);
    if (pipe_schedule_build(&s, kind, P, M, f, b) != 0) {
        EXPECT(0, "%s P=%d M=%d: build failed", name, P, M);
        return;
    }
    for (int st = 0; st < P; st++) {
        int seen_f[64] = {0}, seen_b[64] = {0};
        double last_end = 0.0;
        for (int i = 0; i < 2 * M; i++) {
            const pipe_action *a = pipe_action_at(&s, st, i);
            EXPECT(a->micro >= 0 && a->micro < M, "%s P=%d M=%d stage %d: micro %d", name, P, M, st, a->micro);
            if (a->micro < 0 || a->micro >= M) continue;
            (a->kind == 'F' ? seen_f : seen_b)[a->micro]++;
            EXPECT(a->start >= last_end - 1e-9, "%s P=%d M=%d stage %d: action %d overlaps the previous", name, P, M, st, i);
            EXPECT(fabs(a->end - a->start - (a->kind == 'F' ? f : b)) < 1e-9, "%s: wrong duration", name);
            /* its input: found by searching the neighbour stage */
            double input = 0.0;
            int from = a->kind == 'F' ? st - 1 : (st == P - 1 ? st : st + 1);
            char want = a->kind == 'F' || st == P - 1 ? 'F' : 'B';
            if (from >= 0 && !(a->kind == 'F' && st == 0)) {
                input = -1.0;
                for (int j = 0; j < 2 * M; j++) {
                    const pipe_action *d = pipe_action_at(&s, from, j);
                    if (d->kind == want && d->micro == a->micro) input = d->end;
                }
            }
            EXPECT(a->start >= input - 1e-9, "%s P=%d M=%d: %c%d on stage %d starts at %g before its input (%g)", name, P,
                   M, a->kind, a->micro, st, a->start, input);
            double earliest = input > last_end ? input : last_end;
            EXPECT(fabs(a->start - earliest) < 1e-9, "%s P=%d M=%d: %c%d on stage %d waits needlessly", name, P, M,
                   a->kind, a->micro, st);
            last_end = a->end;
        }
        for (int m = 0; m < M; m++)
            EXPECT(seen_f[m] == 1 && seen_b[m] == 1, "%s P=%d M=%d stage %d: micro %d run F%d B%d times", name, P, M, st,
                   m, seen_f[m], seen_b[m]);
        int want_flight = kind == PIPE_GPIPE ? M : (P - st < M ? P - st : M);
        EXPECT(pipe_in_flight(&s, st) == want_flight, "%s P=%d M=%d stage %d: %d in flight, expected %d", name, P, M,
               st, pipe_in_flight(&s, st), want_flight);
    }
    EXPECT(fabs(pipe_bubble(&s) - pipe_bubble_formula(P, M)) < 1e-9, "%s P=%d M=%d b=%g: bubble %g, formula %g", name,
           P, M, b, pipe_bubble(&s), pipe_bubble_formula(P, M));
    if (kind == PIPE_GPIPE)
        for (int st = 0; st < P; st++)
            for (int i = 0; i < M; i++)
                EXPECT(fabs(pipe_action_at(&s, st, i)->start - (st + i) * f) < 1e-9, "gpipe: F%d on stage %d", i, st);
    pipe_schedule_free(&s);
}

/* The grid pipe_schedule_print draws, into buf. */
static void grid_of(const pipe_schedule *s, char *buf, size_t size) {
    FILE *mem = fmemopen(buf, size, "w");
    pipe_schedule_print(s, mem);
    fclose(mem);
}

static void check_grid(void) {
    pipe_schedule s;
    if (pipe_schedule_build(&s, PIPE_GPIPE, 4, 8, 1, 1) != 0) {
        EXPECT(0, "build failed");
        return;
    }
    char buf[4096] = "";
    grid_of(&s, buf, sizeof buf);
    const char *want =
        "  stage 0   F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  .  .  B0 B1 B2 B3 B4 B5 B6 B7\n"
        "  stage 1   .  F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  B0 B1 B2 B3 B4 B5 B6 B7 .\n"
        "  stage 2   .  .  F0 F1 F2 F3 F4 F5 F6 F7 .  .  B0 B1 B2 B3 B4 B5 B6 B7 .  .\n"
        "  stage 3   .  .  .  F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7 .  .  .\n";
    EXPECT(strcmp(buf, want) == 0, "grid:\n%s\nexpected:\n%s", buf, want);
    pipe_schedule_free(&s);
}

static double lcg(unsigned *state) {
    *state = *state * 1103515245u + 12345u;
    return 0.25 + (double)(*state >> 8 & 0xffff) / 65536.0 * 4.0;
}

/* A 2-stage, 2-micro-batch schedule timed by hand (built: its builder's status): each
 * stage's actions start at starts[stage], the step ends at `step`, and the bubble is the
 * idle share of it (the work: 2 x (1 + 2) + 2 x (3 + 6) = 24). */
static void check_timed_2x2(int built, pipe_schedule *s, const double starts[2][4], double step, const char *what) {
    if (built != 0) {
        EXPECT(0, "%s: build failed", what);
        return;
    }
    for (int st = 0; st < 2; st++)
        for (int i = 0; i < 4; i++)
            EXPECT(fabs(pipe_action_at(s, st, i)->start - starts[st][i]) < 1e-9, "%s: stage %d action %d at %g", what, st,
                   i, pipe_action_at(s, st, i)->start);
    EXPECT(fabs(s->makespan - step) < 1e-9 && fabs(pipe_bubble(s) - (1 - 24.0 / (2 * step))) < 1e-9,
           "%s: step %g bubble %g", what, s->makespan, pipe_bubble(s));
    pipe_schedule_free(s);
}

static void check_staged(void) {
    unsigned state = 7;
    double f[8], b[8];
    for (int P = 1; P <= 8; P++)
        for (int M = 1; M <= 12; M++) {
            double sum_f = 0, sum_b = 0, max_f = 0, max_b = 0;
            for (int st = 0; st < P; st++) {
                f[st] = lcg(&state), b[st] = lcg(&state);
                sum_f += f[st], sum_b += b[st];
                max_f = f[st] > max_f ? f[st] : max_f, max_b = b[st] > max_b ? b[st] : max_b;
            }
            pipe_schedule s;
            if (pipe_schedule_build_staged(&s, PIPE_GPIPE, P, M, f, b) != 0) {
                EXPECT(0, "staged P=%d M=%d: build failed", P, M);
                continue;
            }
            double want = sum_f + (M - 1) * max_f + sum_b + (M - 1) * max_b;
            EXPECT(fabs(s.makespan - want) < 1e-9 * want, "staged gpipe P=%d M=%d: step %.9g, flow shop %.9g", P, M,
                   s.makespan, want);
            double work = M * (sum_f + sum_b);
            EXPECT(fabs(pipe_bubble(&s) - (1 - work / (P * want))) < 1e-9, "staged gpipe P=%d M=%d: bubble", P, M);
            pipe_schedule_free(&s);
        }
    /* 1F1B, P=2, M=2, stage 0 (f 1, b 2), stage 1 (f 3, b 6), by hand: stage 0 F0 [0,1] F1
     * [1,2] B0 [10,12] B1 [19,21]; stage 1 F0 [1,4] B0 [4,10] F1 [10,13] B1 [13,19] */
    pipe_schedule s;
    const double f2[2] = {1, 3}, b2[2] = {2, 6};
    const double by_hand[2][4] = {{0, 1, 10, 19}, {1, 4, 10, 13}};
    check_timed_2x2(pipe_schedule_build_staged(&s, PIPE_1F1B, 2, 2, f2, b2), &s, by_hand, 21, "staged 1f1b");
    /* the same with stage 1 sending its gradient 2 into its backward (pipe_schedule_build_sends):
     * stage 1 F0 [1,4] B0 [4,10] (sent at 6) F1 [10,13] B1 [13,19] (sent at 15); stage 0
     * F0 [0,1] F1 [1,2] B0 [6,8] B1 [15,17]; the step ends with stage 1's B1 at 19 */
    const double send2[2] = {2, 2};
    const double sent_early[2][4] = {{0, 1, 6, 15}, {1, 4, 10, 13}};
    check_timed_2x2(pipe_schedule_build_sends(&s, PIPE_1F1B, 2, 1, 2, f2, b2, send2), &s, sent_early, 19,
                    "early send 1f1b");
    const double late[2] = {2, 7}, none[2] = {2, 0};
    EXPECT(pipe_schedule_build_sends(&s, PIPE_1F1B, 2, 1, 2, f2, b2, late) == -1, "a send after its backward accepted");
    EXPECT(pipe_schedule_build_sends(&s, PIPE_1F1B, 2, 1, 2, f2, b2, none) == -1, "a send at 0 accepted");
    /* equal stages: the uniform schedule */
    const double f4[4] = {1, 1, 1, 1}, b4[4] = {2, 2, 2, 2};
    pipe_schedule u, t;
    if (pipe_schedule_build(&u, PIPE_1F1B, 4, 6, 1, 2) == 0 && pipe_schedule_build_staged(&t, PIPE_1F1B, 4, 6, f4, b4) == 0) {
        for (int st = 0; st < 4; st++)
            for (int i = 0; i < 12; i++)
                EXPECT(pipe_action_at(&u, st, i)->start == pipe_action_at(&t, st, i)->start &&
                           pipe_action_at(&u, st, i)->kind == pipe_action_at(&t, st, i)->kind,
                       "staged equal costs: stage %d action %d differs", st, i);
        pipe_schedule_free(&u);
        pipe_schedule_free(&t);
    } else {
        EXPECT(0, "equal costs: build failed");
    }
    const double bad[2] = {1, 0};
    EXPECT(pipe_schedule_build_staged(&s, PIPE_GPIPE, 2, 2, f2, bad) == -1, "a zero cost accepted");
}

/* Stage st's k-th forward (or backward) under the interleaved schedule, written from its
 * definition: groups of P micro-batches go through chunks 0, 1, ..., v - 1 (backwards
 * v - 1, ..., 0), then the next group. */
static void interleaved_kth(int P, int v, int k, int backward, int *chunk, int *micro) {
    int group = k / P;
    *chunk = backward ? v - 1 - group % v : group % v;
    *micro = (group / v) * P + k % P;
}

/* The action of virtual stage j, micro-batch m, kind kind: its end, or -1 when none. */
static double end_of(const pipe_schedule *s, int j, int m, char kind) {
    int st = j % s->stages, c = j / s->stages;
    for (int i = 0; i < pipe_actions(s); i++) {
        const pipe_action *a = pipe_action_at(s, st, i);
        if (a->kind == kind && a->micro == m && a->chunk == c) return a->end;
    }
    return -1;
}

static void check_interleaved(int P, int v, int M, double f, double b) {
    pipe_schedule s;
    if (pipe_schedule_build_chunked(&s, PIPE_INTERLEAVED, P, v, M, f, b) != 0) {
        EXPECT(0, "interleaved P=%d v=%d M=%d: build failed", P, v, M);
        return;
    }
    int V = P * v, total = v * M;
    for (int st = 0; st < P; st++) {
        int warm = (v - 1) * P + 2 * (P - st - 1), nf = 0, nb = 0, now[8] = {0}, most[8] = {0};
        if (warm > total) warm = total;
        double last_end = 0;
        for (int i = 0; i < 2 * total; i++) {
            const pipe_action *a = pipe_action_at(&s, st, i);
            int forward = i < warm || (nf < total && (i - warm) % 2 == 0) || nb == total, chunk, micro;
            interleaved_kth(P, v, forward ? nf++ : nb++, !forward, &chunk, &micro);
            EXPECT(a->kind == (forward ? 'F' : 'B') && a->chunk == chunk && a->micro == micro,
                   "interleaved P=%d v=%d M=%d stage %d action %d: %c%d chunk %d, expected %c%d chunk %d", P, v, M, st, i,
                   a->kind, a->micro, a->chunk, forward ? 'F' : 'B', micro, chunk);
            int j = a->chunk * P + st;
            double input = 0;
            if (a->kind == 'F' && j > 0) input = end_of(&s, j - 1, a->micro, 'F');
            if (a->kind == 'B') input = j == V - 1 ? end_of(&s, j, a->micro, 'F') : end_of(&s, j + 1, a->micro, 'B');
            EXPECT(input >= 0 && a->start >= input - 1e-9, "interleaved P=%d v=%d M=%d: %c%d on virtual stage %d before its input",
                   P, v, M, a->kind, a->micro, j);
            double earliest = input > last_end ? input : last_end;
            EXPECT(fabs(a->start - earliest) < 1e-9, "interleaved P=%d v=%d M=%d: %c%d on virtual stage %d waits needlessly", P,
                   v, M, a->kind, a->micro, j);
            EXPECT(fabs(a->end - a->start - (a->kind == 'F' ? f : b)) < 1e-9, "interleaved: wrong duration");
            last_end = a->end;
            now[a->chunk] += a->kind == 'F' ? 1 : -1;
            if (now[a->chunk] > most[a->chunk]) most[a->chunk] = now[a->chunk];
        }
        for (int c = 0; c < v; c++)
            EXPECT(pipe_in_flight(&s, c * P + st) == most[c], "interleaved P=%d v=%d M=%d virtual stage %d: %d in flight, counted %d",
                   P, v, M, c * P + st, pipe_in_flight(&s, c * P + st), most[c]);
    }
    /* every action once: the orders above hold 2 v M actions, each (chunk, micro) pair once per kind */
    for (int j = 0; j < V; j++)
        for (int m = 0; m < M; m++)
            EXPECT(end_of(&s, j, m, 'F') >= 0 && end_of(&s, j, m, 'B') >= 0, "interleaved: F or B of %d on %d missing", m, j);
    double want = (double)(P - 1) / (v * M + P - 1);
    EXPECT(fabs(pipe_bubble(&s) - want) < 1e-9 && fabs(pipe_bubble_formula_chunked(P, v, M) - want) < 1e-12,
           "interleaved P=%d v=%d M=%d b=%g: bubble %g, formula %g", P, v, M, b, pipe_bubble(&s), want);
    pipe_schedule_free(&s);
}

/* P=2, v=2, M=2, forward and backward 1: virtual stages 0 and 2 on stage 0, 1 and 3 on
 * stage 1. Stage 0 warms up with all 4 forwards, stage 1 with 2; by hand: stage 1's F0b
 * waits for stage 0's (end 3), its B0b follows it, F1b waits for stage 0's F1b (end 5);
 * stage 0's B0b waits for stage 1's (end 5), B1b for stage 1's (7); stage 1's B0a for
 * stage 0's B0b (6) and its own B1b (7); stage 0's B0a for stage 1's (8). */
static void check_interleaved_grid(void) {
    pipe_schedule s;
    if (pipe_schedule_build_chunked(&s, PIPE_INTERLEAVED, 2, 2, 2, 1, 1) != 0) {
        EXPECT(0, "interleaved grid: build failed");
        return;
    }
    char buf[1024] = "";
    grid_of(&s, buf, sizeof buf);
    const char *want = "  rank 0    F0a F1a F0b F1b .   B0b .   B1b B0a B1a\n"
                       "  rank 1    .   F0a F1a F0b B0b F1b B1b B0a B1a .\n";
    EXPECT(strcmp(buf, want) == 0, "interleaved grid:\n%s\nexpected:\n%s", buf, want);
    EXPECT(fabs(s.makespan - 10) < 1e-9 && fabs(pipe_bubble(&s) - 0.2) < 1e-9, "interleaved grid: step %g", s.makespan);
    pipe_schedule_free(&s);
    EXPECT(pipe_schedule_build_chunked(&s, PIPE_INTERLEAVED, 4, 2, 6, 1, 2) == -1, "M=6 on 4 stages accepted");
    EXPECT(pipe_schedule_build_chunked(&s, PIPE_INTERLEAVED, 2, 1, 4, 1, 2) == -1, "one chunk accepted as interleaved");
    EXPECT(pipe_interleaved_problem(4, 2, 6) && pipe_interleaved_problem(2, 1, 2) && !pipe_interleaved_problem(2, 3, 4),
           "pipe_interleaved_problem");
    EXPECT(pipe_chunks_for(PIPE_INTERLEAVED, 1, 3) == 1 && pipe_chunks_for(PIPE_1F1B, 4, 3) == 1 &&
               pipe_chunks_for(PIPE_INTERLEAVED, 4, 3) == 3,
           "pipe_chunks_for");
}

/* 2BW: the stream of PIPE_2BW_BATCHES batches of M micro-batches (numbered across them) on
 * P stages. Each stage's order is 1F1B over the whole stream (its own code here): P - s - 1
 * warm-up forwards, then a forward and a backward, then the backwards left; so step t runs
 * F(t M + m), each followed by B(t M + m - (P - s - 1)) when there is one. F(s, i) starts
 * after F(s-1, i), B(s, i) after B(s+1, i) (on the last after F(s, i)), no action waits
 * needlessly within a step; every step starts on every stage once the one before has ended
 * on all (its collectives): a step takes M (f + b) + (P - 1) f (no backward waited for, as
 * 1F1B's flush does), the first as well, and the drain after the last (P - 1) b; activations
 * in flight P - s. Returns the schedules checked. */
/* 2BW's stream (and PipeDream's, the same actions: it differs in the weights each action
 * runs on and when updates happen, not in the order or the dependencies). */
static int check_2bw(pipe_kind kind, int P, int M, double f, double b) {
    pipe_schedule s;
    if (pipe_schedule_build(&s, kind, P, M, f, b) != 0) {
        EXPECT(0, "%s P=%d M=%d: build failed", pipe_kind_name(kind), P, M);
        return 0;
    }
    int N = s.batches * M, n = pipe_actions(&s);
    EXPECT(s.batches == PIPE_2BW_BATCHES && n == 2 * N, "2bw P=%d M=%d: %d batches, %d actions", P, M, s.batches, n);
    double *f_end = calloc((size_t)P * (size_t)N, sizeof(double)), *b_end = calloc((size_t)P * (size_t)N, sizeof(double));
    if (!f_end || !b_end) abort();
    for (int st = 0; st < P; st++) {
        int w = P - st - 1, k = 0;
        for (int i = 0; i < n && k < n; i++) {
            const pipe_action *a = pipe_action_at(&s, st, i);
            /* the order: warm-up, then alternating, then the drain */
            int fwd = i < w || (i < w + 2 * (N - w) && (i - w) % 2 == 0);
            int micro = i < w ? i : i < w + 2 * (N - w) ? (fwd ? w + (i - w) / 2 : (i - w) / 2) : N - (n - i);
            EXPECT(a->kind == (fwd ? 'F' : 'B') && a->micro == micro, "2bw P=%d M=%d stage %d action %d: %c%d, expected %c%d",
                   P, M, st, i, a->kind, a->micro, fwd ? 'F' : 'B', micro);
            (fwd ? f_end : b_end)[(size_t)st * N + a->micro] = a->end;
            k++;
        }
    }
    for (int st = 0; st < P; st++)
        for (int i = 0; i < n; i++) {
            const pipe_action *a = pipe_action_at(&s, st, i);
            double ready = a->kind == 'F' ? (st ? f_end[(size_t)(st - 1) * N + a->micro] : 0)
                                          : (st == P - 1 ? f_end[(size_t)st * N + a->micro] : b_end[(size_t)(st + 1) * N + a->micro]);
            double free_at = i ? pipe_action_at(&s, st, i - 1)->end : 0;
            int step = 0; /* the step action i is in: steps begin before F(k M) */
            while (step + 1 < s.batches && i >= 2 * (step + 1) * M - (P - st - 1)) step++;
            if (step && s.step_ends[step - 1] > free_at) free_at = s.step_ends[step - 1];
            EXPECT(fabs(a->start - (ready > free_at ? ready : free_at)) < 1e-9, "2bw P=%d M=%d stage %d action %d starts at %g",
                   P, M, st, i, a->start);
        }
    /* each step starts on every stage together (its collectives): the last stage waits P - 1
     * forwards for the first; no backward is waited for */
    double step = M * (f + b) + (P - 1) * f;
    EXPECT(fabs(s.step - step) < 1e-9, "2bw P=%d M=%d: steady step %g, expected %g", P, M, s.step, step);
    EXPECT(fabs(pipe_bubble(&s) - (P - 1) * f / step) < 1e-9, "2bw P=%d M=%d: bubble %g", P, M, pipe_bubble(&s));
    if (b == 2 * f)
        EXPECT(fabs(pipe_bubble(&s) - pipe_bubble_formula_2bw(P, M)) < 1e-9, "2bw P=%d M=%d: formula", P, M);
    /* the first step is as long as a steady one; the drain after the last, P - 1 backwards */
    EXPECT(fabs(s.step_ends[0] - step) < 1e-9, "2bw P=%d M=%d: first step %g", P, M, s.step_ends[0]);
    EXPECT(fabs(pipe_2bw_warmup(&s) - (P - 1) * b) < 1e-9, "2bw P=%d M=%d: drain %g", P, M, pipe_2bw_warmup(&s));
    for (int st = 0; st < P; st++)
        EXPECT(pipe_in_flight(&s, st) == P - st, "2bw P=%d M=%d stage %d: %d in flight", P, M, st, pipe_in_flight(&s, st));
    free(f_end);
    free(b_end);
    pipe_schedule_free(&s);
    /* fewer micro-batches than stages: a step would owe two batches' backwards */
    EXPECT(pipe_2bw_problem(kind, P, M) == NULL && pipe_2bw_problem(kind, P, P - 1) != NULL, "2bw P=%d: M >= P", P);
    EXPECT(pipe_schedule_build(&s, kind, P, P - 1, f, b) == -1, "2bw P=%d M=%d built", P, P - 1);
    return 1;
}

int main(void) {
    int two_bw = 0;
    for (int P = 2; P <= 8; P++)
        for (int M = P; M <= 16; M++)
            for (int k = 0; k < 2; k++) {
                pipe_kind kind = k ? PIPE_PIPEDREAM : PIPE_2BW;
                two_bw += check_2bw(kind, P, M, 1.0, 1.0) + check_2bw(kind, P, M, 1.0, 2.0);
            }
    int interleaved = 0;
    for (int P = 2; P <= 8; P++)
        for (int v = 2; v <= 4; v++)
            for (int M = P; M <= 4 * P; M += P, interleaved += 2) {
                check_interleaved(P, v, M, 1.0, 1.0);
                check_interleaved(P, v, M, 1.0, 2.0);
            }
    check_interleaved_grid();
    for (int P = 1; P <= 8; P++)
        for (int M = 1; M <= 16; M++)
            for (int k = 0; k < 2; k++) {
                check(k ? PIPE_1F1B : PIPE_GPIPE, P, M, 1.0, 1.0);
                check(k ? PIPE_1F1B : PIPE_GPIPE, P, M, 1.0, 2.0);
            }
    check_grid();
    check_staged();
    pipe_schedule s;
    EXPECT(pipe_schedule_build(&s, PIPE_GPIPE, 0, 4, 1, 1) == -1, "0 stages accepted");
    EXPECT(pipe_kind_by_name("1f1b") == PIPE_1F1B && pipe_kind_by_name("gpipe") == PIPE_GPIPE &&
               pipe_kind_by_name("interleaved") == PIPE_INTERLEAVED && pipe_kind_by_name("2bw") == PIPE_2BW &&
               pipe_kind_by_name("pipedream_2bw") == PIPE_2BW && pipe_kind_by_name("pipedream") == PIPE_PIPEDREAM &&
               pipe_kind_by_name("zb") == -1,
           "names");
    if (failures) printf("schedule: FAILED\n");
    else printf("schedule: 256 schedules, the grid and 96 + 2 unequal-stage schedules; %d interleaved and its grid; %d "
                "2bw and pipedream streams checked\n", interleaved, two_bw);
    return failures ? 1 : 0;
}
