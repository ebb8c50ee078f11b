/* bytelm.h: what the fake byte-level language model (bytelm.c) and its test
 * (test_textlm.c) agree on: the shapes, the next-byte rules of the logits, and the
 * corpus split as docs/trainer.md defines it. */
#ifndef BYTELM_H
#define BYTELM_H

#include <stdint.h>

enum { LM_BATCH = 3, LM_LEN = 8, LM_VOCAB = 260 };

/* After byte c: the byte with logit 3, the one with logit 1 and the one with logit 0;
 * every other byte has logit -1e30. The three always differ: 7c + 3 = c + 128 or
 * c + 64 would need 6c to be odd. */
static inline int lm_likeliest(int c) { return (c * 7 + 3) & 255; }
static inline int lm_second(int c) { return (c + 128) & 255; }
static inline int lm_third(int c) { return (c + 64) & 255; }

/* Bytes held out for validation: the last 10% (rounded down), at least one window. */
static inline int64_t lm_val_bytes(int64_t corpus_size) {
    return corpus_size / 10 > LM_LEN + 1 ? corpus_size / 10 : LM_LEN + 1;
}

#endif
