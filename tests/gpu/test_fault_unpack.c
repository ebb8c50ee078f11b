/* test_fault_unpack.c: dmrt_gpu_fault_unpack (runtime/cuda/gpu.cu), the host side of the
 * fault record that dmrt_gpu_step_end and dmrt_gpu_fault_take read back, on the CPU: no
 * device is needed. The oracle packs as gpu_record_fault (gpu_internal.h) documents it:
 * position holds ~(position << 32 | (uint32_t)value), and a lower position packs larger
 * (atomicMax keeps the first bad index). */
#include <stdint.h>
#include <stdio.h>

#include "dmrt_cuda.h"

static dmrt_fault packed(int32_t site, int32_t value, int64_t position) {
    const uint64_t key = ((uint64_t)position << 32) | (uint32_t)value;
    dmrt_fault f = {site, 0, (int64_t)~key};
    return f;
}

int main(void) {
    const struct { int32_t value; int64_t position; } cases[] = {
        {70, 53}, {-1, 2}, {12, 11}, {0, 0}, {INT32_MAX, 0x7ffffffe}, {INT32_MIN, 1},
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dmrt_fault f = packed(3, cases[i].value, cases[i].position);
        dmrt_gpu_fault_unpack(&f);
        if (f.site != 3 || f.value != cases[i].value || f.position != cases[i].position) {
            fprintf(stderr, "FAIL: value %d position %lld unpacked as site %d value %d position %lld\n",
                    cases[i].value, (long long)cases[i].position, f.site, f.value, (long long)f.position);
            failures++;
        }
    }
    /* the lower position wins the device's atomicMax */
    dmrt_fault lo = packed(1, 5, 7), hi = packed(1, 5, 8);
    if (!((uint64_t)lo.position > (uint64_t)hi.position)) {
        fprintf(stderr, "FAIL: position 7 must pack above position 8\n");
        failures++;
    }
    /* no fault: left as it is */
    dmrt_fault none = {0, 0, 0};
    dmrt_gpu_fault_unpack(&none);
    if (none.site || none.value || none.position) {
        fprintf(stderr, "FAIL: site 0 changed\n");
        failures++;
    }
    dmrt_gpu_fault_unpack(NULL);
    printf("%s\n", failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
