/* trace_files.c: the trainer's --trace. Every rank's pipeline actions (dmrt_comm.h's
 * timeline) gathered on world rank 0 and written as a Chrome trace (JSON, loadable in
 * Perfetto and chrome://tracing) and an SVG picture of the last training step; the
 * measured bubble beside the formula. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dmrt.h"
#include "dmrt_comm.h"
#include "internal.h"

/* A rank's place on the pipeline axis of the model's mesh (0 without one). */
static int stage_of(const dmrt_model *m, int rank, int *stages) {
    int64_t stride = 1;
    *stages = 1;
    for (int a = m->n_mesh_axes - 1; a >= 0; a--) {
        if (strcmp(m->mesh_axis_names[a], "pipeline") == 0) {
            *stages = (int)m->mesh_axis_sizes[a];
            return (int)((rank / stride) % m->mesh_axis_sizes[a]);
        }
        stride *= m->mesh_axis_sizes[a];
    }
    return 0;
}

/* Model chunks per pipeline rank: 1 but for the interleaved schedule. */
static int chunks_of(const dmrt_model *m) { return m->pipeline_chunks > 1 ? m->pipeline_chunks : 1; }

/* A schedule that does not flush (2bw, pipedream): the model has a drain (parameter
 * servers' drain is another thing, and they have no trace). */
static int flushless(const dmrt_model *m) { return m->drain != NULL && !m->param_servers; }

/* The bubble of equal stages: interleaved, a rank idles P - 1 chunk-times where 1F1B idles
 * P - 1 stage-times; without a flush, P - 1 forward-times of a step's 3M
 * (docs/parallelism.md, "PipeDream-2BW"). Its name as the lines print it. */
static double bubble_formula(const dmrt_model *m, int stages, int64_t micros, const char **name) {
    *name = flushless(m) ? "(P-1)/(3M+P-1)" : chunks_of(m) > 1 ? "(P-1)/(vM+P-1)" : "(P-1)/(M+P-1)";
    if (flushless(m)) return (double)(stages - 1) / (3.0 * (double)micros + stages - 1);
    return (double)(stages - 1) / ((double)chunks_of(m) * (double)micros + stages - 1);
}

/* An action's name: its kind and micro-batch ("F3"), and with model chunks the chunk's
 * letter ("F3b": chunk 1), as dmc --explain draws the schedule. */
static void action_name(const dmrt_model *m, const dmrt_trace_event *e, char *buf, size_t size) {
    if (chunks_of(m) > 1) snprintf(buf, size, "%c%lld%c", e->kind, (long long)e->micro, 'a' + e->chunk % 26);
    else snprintf(buf, size, "%c%lld", e->kind, (long long)e->micro);
}

/* The training actions of one step on one rank: a run of events of that step, up to
 * its last backward (evaluation's forwards come after, with no backward). */
typedef struct step_span {
    int64_t step;
    double start, end, busy;
    int ranks;
} step_span;

/* Per training step (the trainer numbers them 1, 2, ...): the span from the first action
 * to the last on any rank, and the busy time of every rank summed; spans[k] is step k
 * (ranks 0 when step k left no training actions). Returns the largest step, or -1 when
 * out of memory. */
static int64_t training_steps(const dmrt_trace_event *all, const int64_t *counts, int ranks, step_span **out) {
    int64_t total = 0, last_step = 0;
    for (int r = 0; r < ranks; r++) total += counts[r];
    for (int64_t i = 0; i < total; i++)
        if (all[i].step > last_step) last_step = all[i].step;
    step_span *s = calloc((size_t)last_step + 1, sizeof *s);
    if (!s) return -1;
    const dmrt_trace_event *e = all;
    for (int r = 0; r < ranks; e += counts[r], r++) {
        for (int64_t i = 0; i < counts[r];) {
            int64_t j = i, last_b = -1;
            while (j < counts[r] && e[j].step == e[i].step) {
                if (e[j].kind == 'B') last_b = j;
                j++;
            }
            step_span *k = e[i].step > 0 ? &s[e[i].step] : NULL;
            if (k && last_b >= 0) {
                if (!k->ranks || e[i].start < k->start) k->start = e[i].start;
                if (!k->ranks || e[last_b].end > k->end) k->end = e[last_b].end;
                for (int64_t q = i; q <= last_b; q++) k->busy += e[q].end - e[q].start;
                k->step = e[i].step;
                k->ranks++;
            }
            i = j;
        }
    }
    *out = s;
    return last_step;
}

static int write_json(const dmrt_model *m, const dmrt_trace_event *all, const int64_t *counts, int ranks, double t0,
                      FILE *f) {
    int stages;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    const dmrt_trace_event *e = all;
    int first = 1;
    for (int r = 0; r < ranks; e += counts[r], r++) {
        fprintf(f, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"rank %d "
                   "(stage %d)\"}}",
                first ? "" : ",\n", r, r, stage_of(m, r, &stages));
        first = 0;
        for (int64_t i = 0; i < counts[r]; i++) {
            char name[48], chunk[32] = "";
            action_name(m, &e[i], name, sizeof name);
            if (chunks_of(m) > 1) snprintf(chunk, sizeof chunk, ", \"chunk\": %d", e[i].chunk);
            fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, "
                       "\"dur\": %.3f, \"args\": {\"step\": %lld, \"micro\": %lld%s}}",
                    name, e[i].kind == 'F' ? "forward" : "backward", r, 1e6 * (e[i].start - t0),
                    1e6 * (e[i].end - e[i].start), (long long)e[i].step, (long long)e[i].micro, chunk);
        }
    }
    fprintf(f, "\n]}\n");
    return 0;
}

static void write_svg(const dmrt_model *m, const dmrt_trace_event *all, const int64_t *counts, int ranks,
                      const step_span *span, double bubble, double formula, const char *formula_name, FILE *f) {
    const double width = 1000, left = 130, row = 28, top = 40;
    double scale = span->end > span->start ? width / (span->end - span->start) : 0;
    int stages;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"monospace\" "
               "font-size=\"11\">\n",
            left + width + 20, top + row * ranks + 30);
    fprintf(f, "<text x=\"10\" y=\"20\" font-size=\"13\">%s: step %lld, %.3f ms; measured bubble %.1f%%, %s = "
               "%.1f%%</text>\n",
            m->name, (long long)span->step, 1e3 * (span->end - span->start), 100 * bubble, formula_name, 100 * formula);
    const dmrt_trace_event *e = all;
    for (int r = 0; r < ranks; e += counts[r], r++) {
        double y = top + row * r;
        fprintf(f, "<text x=\"10\" y=\"%.0f\">rank %d (stage %d)</text>\n", y + 17, r, stage_of(m, r, &stages));
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#eeeeee\"/>\n", left, y + 2, width, row - 4);
        for (int64_t i = 0; i < counts[r]; i++) {
            if (e[i].step != span->step || e[i].start < span->start || e[i].end > span->end) continue;
            double x = left + (e[i].start - span->start) * scale, w = (e[i].end - e[i].start) * scale;
            char name[48];
            action_name(m, &e[i], name, sizeof name);
            fprintf(f, "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" stroke=\"white\" "
                       "stroke-width=\"0.5\"><title>%s: %.3f ms</title></rect>\n",
                    x, y + 2, w > 0.5 ? w : 0.5, row - 4, e[i].kind == 'F' ? "#4e79a7" : "#59a14f", name,
                    1e3 * (e[i].end - e[i].start));
            if (w > 22) fprintf(f, "<text x=\"%.2f\" y=\"%.0f\" fill=\"white\">%s</text>\n", x + 3, y + 17, name);
        }
    }
    fprintf(f, "</svg>\n");
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void dmrt_trace_step_time(const dmrt_model *m, const double *seconds, int64_t n, FILE *out) {
    if (n < 2) return;
    double *sorted = malloc((size_t)(n - 1) * sizeof *sorted);
    if (!sorted) return;
    memcpy(sorted, seconds + 1, (size_t)(n - 1) * sizeof *sorted);
    qsort(sorted, (size_t)(n - 1), sizeof *sorted, compare_doubles);
    int64_t k = n - 1;
    double median = k % 2 ? sorted[k / 2] : 0.5 * (sorted[k / 2 - 1] + sorted[k / 2]);
    free(sorted);
    fprintf(out, "step time %.3f ms measured (median of %lld steps, the first left out)", 1e3 * median, (long long)k);
    if (m->predicted_step_seconds > 0)
        fprintf(out, ", predicted %.3f ms on %s (%+.0f%%)", 1e3 * m->predicted_step_seconds, m->predicted_on,
                100 * (m->predicted_step_seconds / median - 1));
    fprintf(out, "\n");
}

/* Each stage's forward and backward of one micro-batch, measured (the mean over its
 * ranks, micro-batches and the steps the bubble is measured on) beside the prediction.
 * With model chunks, each of a rank's chunks is a stage of its own: chunk c of the ranks
 * at pipeline coordinate s is stage c P + s. */
static void stage_times(const dmrt_model *m, const dmrt_trace_event *all, const int64_t *counts, int ranks,
                        const step_span *spans, int64_t first, int64_t last, FILE *out) {
    int P, chunks = chunks_of(m);
    stage_of(m, 0, &P);
    int stages = P * chunks;
    double *sum = calloc((size_t)stages * 2, sizeof *sum), *n = calloc((size_t)stages * 2, sizeof *n);
    if (!sum || !n) goto done;
    const dmrt_trace_event *e = all;
    for (int r = 0; r < ranks; e += counts[r], r++) {
        int coord = stage_of(m, r, &P);
        for (int64_t i = 0; i < counts[r]; i++) {
            int64_t k = e[i].step;
            if (k < first || k > last || spans[k].ranks != ranks || e[i].chunk >= chunks) continue;
            int b = e[i].kind == 'B', s = e[i].chunk * P + coord;
            sum[2 * s + b] += e[i].end - e[i].start;
            n[2 * s + b] += 1;
        }
    }
    for (int s = 0; s < stages; s++) {
        if (!n[2 * s] || !n[2 * s + 1]) continue;
        double fwd = sum[2 * s] / n[2 * s], bwd = sum[2 * s + 1] / n[2 * s + 1];
        fprintf(out, "stage %d", s);
        if (chunks > 1) fprintf(out, " (rank %d's chunk %c)", s % P, 'a' + s / P % 26);
        fprintf(out, ": forward %.3f ms, backward %.3f ms per micro-batch measured", 1e3 * fwd, 1e3 * bwd);
        if (m->n_predicted_stages == stages)
            fprintf(out, ", predicted %.3f ms and %.3f ms", 1e3 * m->predicted_forward_seconds[s],
                    1e3 * m->predicted_backward_seconds[s]);
        fprintf(out, "\n");
    }
done:
    free(sum);
    free(n);
}

void dmrt_trace_picture_path(const char *path, char *out, size_t size) {
    size_t n = strlen(path);
    if (n > 5 && strcmp(path + n - 5, ".json") == 0) snprintf(out, size, "%.*s.svg", (int)(n - 5), path);
    else snprintf(out, size, "%s.svg", path);
}

/* dmrt_atomic_target, its reason after "cannot write PATH: " as the other messages here. */
static const char *atomic_target(const char *path, char *buf, size_t len, char *err, size_t errlen) {
    char why[256];
    const char *to = dmrt_atomic_target(path, buf, len, why, sizeof why);
    if (!to) dmrt_errorf(err, errlen, "cannot write %s: %s", path, why);
    return to;
}

static FILE *open_tmp(const char *path, char *tmp, size_t size, char *err, size_t errlen) {
    FILE *f = dmrt_temporary_beside(path, tmp, size);
    if (!f) dmrt_errorf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    return f;
}

/* The file's bytes on the disk before the rename, so that a crash leaves the old file or
 * the whole new one. */
static int close_tmp(FILE *f, const char *tmp, const char *path, char *err, size_t errlen) {
    int failed = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0, e = errno;
    if (fclose(f) != 0 && !failed) failed = 1, e = errno;
    if (!failed && rename(tmp, path) != 0) failed = 1, e = errno;
    if (failed) {
        dmrt_errorf(err, errlen, "cannot write %s: %s", path, strerror(e ? e : EIO));
        remove(tmp);
        return -1;
    }
    return 0;
}

int dmrt_trace_write(const dmrt_model *m, dmrt_rank *rank, const char *path, FILE *out, char *err, size_t errlen) {
    int ranks = dmrt_rank_count(rank);
    int64_t *counts = calloc((size_t)ranks, sizeof *counts);
    dmrt_trace_event *all = NULL;
    if (!counts) return dmrt_errorf(err, errlen, "out of memory");
    if (dmrt_trace_gather(rank, &all, counts) != 0) {
        free(counts);
        return dmrt_errorf(err, errlen, "gathering the trace: %s", dmrt_rank_error(rank));
    }
    if (dmrt_rank_id(rank) != 0) {
        free(counts);
        return 0;
    }
    int status = -1;
    step_span *spans = NULL;
    int64_t total = 0, micros = 0;
    double t0 = 0;
    for (int r = 0; r < ranks; r++) total += counts[r];
    for (int64_t i = 0; i < total; i++) {
        if (i == 0 || all[i].start < t0) t0 = all[i].start;
        if (all[i].micro + 1 > micros) micros = all[i].micro + 1;
    }
    int64_t last_step = training_steps(all, counts, ranks, &spans);
    if (last_step < 0) {
        dmrt_errorf(err, errlen, "out of memory");
        goto done;
    }
    /* the bubble of every training step but the first (it warms caches and allocators) */
    double bubble = 0;
    int64_t measured = 0, pictured = 0;
    for (int64_t k = 1; k <= last_step; k++) {
        if (spans[k].ranks != ranks || spans[k].end <= spans[k].start) continue;
        pictured = k;
        if (k == 1 && last_step > 1) continue;
        bubble += 1 - spans[k].busy / (ranks * (spans[k].end - spans[k].start));
        measured++;
    }
    if (measured) bubble /= (double)measured;
    int stages, chunks = chunks_of(m);
    stage_of(m, 0, &stages);
    const char *formula_name;
    double formula = bubble_formula(m, stages, micros, &formula_name);
    char tmp[4200], svg[4096], target[4096];
    const char *to = atomic_target(path, target, sizeof target, err, errlen); /* through a link */
    FILE *f = to ? open_tmp(to, tmp, sizeof tmp, err, errlen) : NULL;
    if (!f) goto done;
    write_json(m, all, counts, ranks, t0, f);
    if (close_tmp(f, tmp, to, err, errlen)) goto done;
    dmrt_trace_picture_path(path, svg, sizeof svg);
    if (pictured) {
        if (!(to = atomic_target(svg, target, sizeof target, err, errlen))) goto done;
        if (!(f = open_tmp(to, tmp, sizeof tmp, err, errlen))) goto done;
        write_svg(m, all, counts, ranks, &spans[pictured], bubble, formula, formula_name, f);
        if (close_tmp(f, tmp, to, err, errlen)) goto done;
    }
    if (measured) {
        fprintf(out, "pipeline bubble %.4f measured over %lld steps, formula %s %.4f (P=%d, ", bubble, (long long)measured,
                formula_name, formula, stages);
        if (chunks > 1) fprintf(out, "v=%d, ", chunks);
        fprintf(out, "M=%lld%s)", (long long)micros, flushless(m) ? "; no flush" : "");
        if (m->predicted_bubble > 0)
            fprintf(out, ", predicted %.4f on %s (dmc --explain: the schedule simulated with each stage's predicted times)",
                    m->predicted_bubble, m->predicted_on);
        fprintf(out, "\n");
        stage_times(m, all, counts, ranks, spans, last_step > 1 ? 2 : 1, last_step, out);
    }
    fprintf(out, "trace: %s (%lld actions; Perfetto, chrome://tracing)%s%s\n", path, (long long)total,
            pictured ? ", picture of the last step: " : "", pictured ? svg : "");
    status = 0;
done:
    free(spans);
    free(all);
    free(counts);
    return status;
}
