/* check.h: tiny helpers for the runtime unit tests. A test function declares
 * `int fails = 0;`, uses CHECK, and returns fails. */
#ifndef DMRT_TEST_CHECK_H
#define DMRT_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            fails++;                                                                  \
        }                                                                             \
    } while (0)

/* Message `err` must name `path` and contain `phrase`. */
#define CHECK_MSG(err, path, phrase)                                                      \
    CHECK(strstr((err), (path)) != NULL && strstr((err), (phrase)) != NULL,               \
          "message \"%s\" should name \"%s\" and contain \"%s\"", (err), (path), (phrase))

#endif
