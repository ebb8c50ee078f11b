/* comm_cases.h: checks of dmrt_comm that both backends' tests run, each from inside a
 * rank. The oracle is a serial computation in plain C: every rank can generate every
 * other rank's input (case_value), so it computes the expected result itself and
 * compares bit for bit. Each function returns the number of failed checks, having
 * printed each one ("FAIL file:line: rank R: ..."). */
#ifndef COMM_CASES_H
#define COMM_CASES_H

#include <stdint.h>

#include "dmrt_comm.h"

#if defined(__GNUC__) || defined(__clang__)
#define CASE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CASE_PRINTF(f, a)
#endif

/* Prints "FAIL file:line: rank R: <message>" and returns 1. */
int case_fail(const dmrt_rank *r, const char *file, int line, const char *fmt, ...)
    CASE_PRINTF(4, 5);
#define CASE_EXPECT(r, cond, ...) \
    ((cond) ? 0 : case_fail((r), __FILE__, __LINE__, __VA_ARGS__))

/* Monotonic seconds; sleeping s seconds; whether msg contains needle. */
double case_now(void);
void case_sleep(double s);
int case_has(const char *msg, const char *needle);

/* Input value i of world rank `rank` under `seed`: signs and magnitudes from 2^-12 to
 * 2^12 mixed, so that a sum in another order rounds differently. */
float case_value(uint32_t seed, int rank, int64_t i);
/* Fills p[0..n) with case_value(seed, rank, 0..n). */
void case_fill(float *p, int64_t n, uint32_t seed, int rank);

/* 1 when a and b hold the same n floats bit for bit; else prints the first difference
 * (naming `what`) and returns 0. */
int case_same(const dmrt_rank *r, const char *what, const float *got, const float *want,
              int64_t n);

/* Every collective on c, with n floats (per rank), against the serial result:
 * allreduce, allgather (also in place), reduce-scatter, alltoall, broadcast from the
 * first and last rank, barrier. */
int case_collectives(dmrt_comm *c, uint32_t seed, int64_t n);

/* case_collectives for a list of sizes that covers 0, 1, non-multiples of the rank count
 * and of 16, both sides of the threads backend's staging limit, and a large buffer. */
int case_collectives_all_sizes(dmrt_comm *c, uint32_t seed);

/* Builds the mesh and checks coordinates (row-major), every axis comm (size, rank =
 * coordinate, name, members = the ranks that differ only on that axis), then runs
 * collectives on each axis, whose results show which ranks were grouped. */
int case_mesh(dmrt_rank *r, int n_axes, const char *const *names, const int64_t *sizes);

/* Point to point on c: a ring where every rank sends to both neighbours before receiving
 * (both sides of each pair send first), several messages in order, sizes 0 to 1 M
 * floats, and a message to itself. */
int case_p2p(dmrt_comm *c, uint32_t seed);

/* `iters` collectives back to back, mixing ops and sizes (small and large paths), each
 * checked: catches ordering and generation bugs. */
int case_back_to_back(dmrt_comm *c, int iters);

/* dmrt_allreduce_start / dmrt_comm_wait on c: several allreduces of small and large
 * sizes started back to back, a blocking allreduce on c between them, the results after
 * the wait against the serial sums, three rounds. */
int case_started(dmrt_comm *c, uint32_t seed);

/* compress_cases.c: dmrt_half_from_float and _to_float against the nearest of every
 * value of each format (decoded with ldexp), ties to even; 0 failures or their count. */
int case_half_formats(void);
/* The compressed reductions on c against serial computations of their rules: the 16-bit
 * allreduce (bit for bit), top-k (bit for bit, result and residual, over three calls,
 * with ties; k = count equal to the allreduce); PowerSGD's properties (the same result
 * and Q on every rank, exact vectors, nothing lost to the residuals, the exact sum at
 * rank = rows, a zero Q drawn again). */
int case_compressed(dmrt_comm *c, uint32_t seed);

/* Ranks outside the mesh (dmrt_mesh_init_outside), on a world of n >= 2: a mesh data=n-1
 * and the last rank outside it (on no axis; the others' data comm of n-1 members sums as
 * the serial sum), a mesh whose sizes and outside ranks do not add up refused with the
 * counts, and dmrt_probe_tagged: 0 before a message is sent (the sender waits for the
 * prober's go), 1 once it is there, then the recv takes it. */
int case_outside(dmrt_rank *r);

#endif
