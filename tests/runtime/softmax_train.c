/* softmax_train: `softmax_train small|mnist [trainer options]` runs dmrt_trainer_main on
 * one of the hand-written models of softmax.c (what `dmc run` does for generated code). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "softmax.h"

int main(int argc, char **argv) {
    const dmrt_model *m = NULL;
    if (argc >= 2 && strcmp(argv[1], "small") == 0) m = &softmax_small_model;
    if (argc >= 2 && strcmp(argv[1], "mnist") == 0) m = &softmax_mnist_model;
    if (!m) {
        fprintf(stderr, "usage: %s small|mnist [trainer options]\n", argv[0]);
        return 2;
    }
    /* Drop the model name; keep argv[0] as the program name. */
    char **args = calloc((size_t)argc, sizeof *args);
    if (!args) return 1;
    args[0] = argv[0];
    for (int i = 2; i < argc; i++) args[i - 1] = argv[i];
    int rc = dmrt_trainer_main(m, argc - 1, args);
    free(args);
    return rc;
}
