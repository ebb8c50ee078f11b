/* thread_floats.c: growable f32 buffers kept between calls, for products that widen narrow
 * operands to f32 (gemm_bf16.c's operands, gemm_quant.c's weights): a buffer per call would
 * fault in megabytes on every product. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

float *dmrt_float_buffer_reserve(dmrt_float_buffer *b, size_t count, const char *who) {
    if (b->count >= count) return b->floats;
    free(b->floats);
    b->floats = malloc(count * sizeof(float));
    b->count = b->floats ? count : 0;
    if (!b->floats) {
        fprintf(stderr, "%s: out of memory for %zu floats\n", who, count);
        abort();
    }
    return b->floats;
}

static pthread_key_t buffer_key;
static pthread_once_t buffer_once = PTHREAD_ONCE_INIT;

static void free_buffer(void *p) {
    dmrt_float_buffer *b = p;
    if (b) free(b->floats);
    free(b);
}

static void make_buffer_key(void) {
    if (pthread_key_create(&buffer_key, free_buffer) != 0) abort();
}

float *dmrt_thread_floats(size_t count, const char *who) {
    (void)pthread_once(&buffer_once, make_buffer_key);
    dmrt_float_buffer *b = pthread_getspecific(buffer_key);
    if (!b && (!(b = calloc(1, sizeof *b)) || pthread_setspecific(buffer_key, b) != 0)) abort();
    return dmrt_float_buffer_reserve(b, count, who);
}
