/* run_options.h: the command line of `dmc run` beyond the compiler's options: its usage,
 * and the trainer's options, checked against the trainer's own table
 * (runtime/trainer_options.h) before anything is compiled. */
#ifndef DMC_RUN_OPTIONS_H
#define DMC_RUN_OPTIONS_H

#include <stdio.h>

/* dmc run's usage: its own options, then every option of the trainer. */
void dm_run_usage(FILE *fp);

/* argv[*i] is an argument of `dmc run` that dmc does not take itself: it must be a
 * trainer option. Appends it to args[*n_args] (with its value, when that is the next
 * argument, advancing *i past it). Returns 0, or -1 after a message on stderr that says
 * what is wrong: "unknown option '--step' (did you mean --steps?)". -h and --help print
 * dmc run's usage, which lists the trainer's options, and exit 0. */
int dm_run_trainer_arg(int argc, char **argv, int *i, char **args, int *n_args);

#endif
