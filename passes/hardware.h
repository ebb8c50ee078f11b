/* hardware.h: what the cost model (passes/cost.c) knows of the machines a plan runs on:
 * per device peak flop/s by precision, memory and its bandwidth, devices per node, the
 * links within and between nodes, and how much of each peak real kernels reach. Read
 * from a JSON file (docs/cost.md gives the format) or one of the presets compiled in
 * (`dmc --hardware list`). */
#ifndef DM_HARDWARE_H
#define DM_HARDWARE_H

#include <stddef.h>

typedef enum dm_precision { DM_FP32, DM_TF32, DM_BF16, DM_PRECISIONS } dm_precision;

/* One kind of link, per device and per direction. */
typedef struct dm_link {
    double bandwidth;       /* bytes/s */
    double latency;         /* seconds per message (the alpha of alpha-beta) */
} dm_link;

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
} dm_hardware;

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
