/* hardware.h: what the cost model (passes/cost.c) knows of the machines a plan runs on:
 * per device peak flop/s by precision, memory and its bandwidth, devices per node, the
 * links within and between nodes, and how much of each peak real kernels reach. Read
 * from a JSON file (docs/cost.md gives the format) or one of the presets compiled in
 * (`dmc --hardware list`). */
#ifndef DM_HARDWARE_H
#define DM_HARDWARE_H

#include <stddef.h>

/* fp16: a hardware file may leave its peak out (bf16's then); the others are required */
typedef enum dm_precision { DM_FP32, DM_TF32, DM_BF16, DM_FP16, DM_PRECISIONS } dm_precision;

/* One kind of link, per device and per direction. */
typedef struct dm_link {
    double bandwidth;       /* bytes/s */
    double latency;         /* seconds per message (the alpha of alpha-beta) */
} dm_link;

/* Efficiency by the size of one matrix product (its 2 m n k flops): points ascending in
 * flops, interpolated in log(flops) between them and held at the ends. n == 0: none. */
#define DM_SIZE_POINTS 32
typedef struct dm_size_curve {
    int n;
    double flops[DM_SIZE_POINTS], efficiency[DM_SIZE_POINTS];
} dm_size_curve;

typedef struct dm_hardware {
    char name[64];
    char source[256];                   /* the file, or "preset" */
    double peak_flops[DM_PRECISIONS];   /* per device, dense matrix products */
    double memory_bytes;                /* per device */
    double memory_bandwidth;            /* bytes/s per device */
    int devices_per_node;
    dm_link intra_node, inter_node;
    /* the share of each peak kernels reach: matrix products of the peak flops, other
     * kernels of the memory bandwidth, collectives of the link bandwidth; in (0, 1] */
    double matmul_efficiency, memory_efficiency, link_efficiency;
    /* the share of a gradient reduction started during the backward pass that its
     * computation hides, in [0, 1]: 1 where collectives run beside kernels (NCCL on a GPU),
     * 0 where the same cores do both (a CPU); 0 where not given */
    double overlap;
    /* optional refinements, measured by `dmc calibrate` (docs/calibrate.md): */
    dm_size_curve matmul_by_size;   /* replaces matmul_efficiency where it has points */
    double vector_flops;            /* element operations/s of the other kernels; 0: peak fp32 */
    double kernel_overhead;         /* seconds each kernel (or product call) costs beyond its work */
    /* the last-level cache: bytes of it per device (a CPU's shared cache over its cores) and
     * the bandwidth per device of the other kernels on data held there; 0: not given (every
     * byte at memory_bandwidth) */
    double cache_bytes, cache_bandwidth;
    /* CPUs, whose devices are cores: a rank alone on its node runs its products on
     * lone_rank_threads threads (libdmrt gives a rank cores / ranks threads) at
     * lone_rank_matmul's efficiency of that many devices' peak. 0: not so. */
    int lone_rank_threads;
    dm_size_curve lone_rank_matmul;
} dm_hardware;

/* The curve at one product's flops (c has points). */
double dm_size_curve_at(const dm_size_curve *c, double flops);

/* A preset by name, or else a JSON file by path. Returns 0, or -1 with a message in err
 * naming the file (or preset) and the field at fault. */
int dm_hardware_load(const char *name_or_path, dm_hardware *hw, char *err, size_t errlen);
/* The same from JSON text; source names it in messages. */
int dm_hardware_parse(const char *json, const char *source, dm_hardware *hw, char *err, size_t errlen);
/* The presets: names and their JSON text, n of them. */
int dm_hardware_presets(const char *const **names, const char *const **texts);
/* What plans are costed on without --hardware: "nominal", the single roofline of the
 * cost rules before hardware files (1e11 flop/s, 2e10 B/s, 1e10 B/s links). */
const dm_hardware *dm_hardware_default(void);
/* "fp32" "tf32" "bf16" to the precision; -1 for anything else. */
int dm_precision_by_name(const char *name);
const char *dm_precision_name(dm_precision p);

#endif
