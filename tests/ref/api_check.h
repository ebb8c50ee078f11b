/* api_check.h: CHECK for the C API probes (predict_api.c, quant_api.c): a failed condition
 * prints the probe's name (PROBE, defined before this header), the place and the message on
 * stderr, and exits 1. */
#ifndef API_CHECK_H
#define API_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s: %s:%d: ", PROBE, __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#endif
