/* trainer_output.h: what the trainer shows besides its step lines (trainer_output.c): the
 * progress bar on stderr, the start-up summary, --memory's lines, and --sample's text.
 * Not installed. */
#ifndef DMRT_TRAINER_OUTPUT_H
#define DMRT_TRAINER_OUTPUT_H

#include "trainer_data.h"
#include "trainer_run.h"

#include <stdio.h>

typedef struct tr_bar {
    int on;         /* stderr is a TTY and not --quiet */
    int stdout_tty; /* step lines land on the same screen: clear, print, redraw */
    int shown;
    double last;
} tr_bar;

/* Clears the bar from its line. */
void dmrt_trainer_bar_clear(tr_bar *b);
/* Redraws the bar at step i of n (at most every 0.1 s unless force). */
void dmrt_trainer_bar_draw(tr_bar *b, int64_t i, int64_t n, int64_t epoch, float loss, int force);
/* End of an epoch: keeps the finished bar on its own line when the step lines go
 * elsewhere, else clears it. */
void dmrt_trainer_bar_end(tr_bar *b);

/* The one-line summary of model and data on stderr at the start. */
void dmrt_trainer_print_summary(FILE *errs, const dmrt_model *m, const tr_opts *o, const tr_data *d, const char *prog,
                                int64_t total, int threads);
/* --memory: one line per rank on stderr, and the process's peak resident set from the lead. */
void dmrt_trainer_report_memory(const dmrt_model *m, void *ctx, dmrt_rank *rank, int lead);
/* --sample: "sample:\n", the prompt and o->sample bytes generated after it, and "\n", on outs.
 * 0, or -1 with a message. */
int dmrt_trainer_sample_text(FILE *outs, const dmrt_model *m, void *ctx, void **in, const tr_lm *lm, const tr_opts *o,
                             char *err, size_t errlen);

#endif
