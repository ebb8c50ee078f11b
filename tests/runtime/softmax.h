/* softmax.h: a softmax regression written by hand against the dmrt_model interface,
 * standing in for generated code in the runtime tests.
 *
 * inputs x: f32[B, D], y: i32[B]; params fc.weight: f32[C, D], fc.bias: f32[C];
 * outputs probs, logits: f32[B, C]. train_step: mean cross-entropy, SGD lr 0.1. */
#ifndef SOFTMAX_H
#define SOFTMAX_H

#include "dmrt.h"

extern const dmrt_model softmax_small_model; /* B 8,   D 4,   C 3 */
extern const dmrt_model softmax_mnist_model; /* B 100, D 784, C 10 */

#endif
