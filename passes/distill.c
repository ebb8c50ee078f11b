/* distill.c: knowledge distillation's loss (Hinton et al. 2015), built from existing ops.
 *
 * The student's loss cross_entropy(logits, targets) becomes
 *     alpha * CE + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(logits / T))
 * where teacher is a new input, teacher_logits, shaped like logits and split like its rows (the trainer
 * fills it with the teacher's forward of the same batch, runtime/distill.c). KL is summed
 * over the classes (the last dim) and averaged over rows, as the cross-entropy is: PyTorch's
 * KLDivLoss(reduction='sum') of log-probabilities divided by the rows. Being an input,
 * the teacher's side gets no gradient. The teacher's logarithms are of p + 1e-30, so that a
 * probability that underflows to 0 gives 0 * log(1e-30) = 0 and not 0 * -inf; for p above
 * 1e-23 the difference is below float rounding. The student's are a log-softmax,
 * z - logsumexp(z) with z = logits / T, as torch's log_softmax: exact in value and gradient
 * where its probability underflows (log(q + 1e-30) would be log(1e-30) there, with no
 * gradient). The IR has no max reduction, so each row is shifted by m = sum(softmax(z) * z),
 * which lies in [max - log C, max]: exp(z - m) is at most C and its row sum at least 1. The
 * shift cancels in value and gradient (its gradient is 1 - sum(softmax), zero to rounding). */
#include <math.h>

#include "passes.h"

#define LOG_FLOOR 1e-30

/* The logits of g's loss when it is cross_entropy(logits, targets), else -1. */
int distill_loss_logits(const ir_graph *g) {
    if (g->loss < 0) return -1;
    const ir_value *loss = g->values[g->loss];
    if (loss->op != OP_CROSS_ENTROPY) return -1;
    const ir_value *stats = g->values[loss->operands[0]];
    return stats->op == OP_XENT_STATS ? stats->operands[0] : -1;
}

typedef struct builder {
    ir_graph *g;
    dm_diag *d;
    dm_loc loc;
    int failed;
} builder;

static int typed(builder *b, ir_value *v, const char *name) {
    if (name) v->name = ir_intern(b->g, name);
    if (shapes_infer(b->g, v, b->d)) b->failed = 1;
    return v->id;
}

static int op2(builder *b, ir_op op, int x, int y, const char *name) {
    return typed(b, ir_add(b->g, op, (int[]){x, y}, 2, b->loc), name);
}

static int op1(builder *b, ir_op op, int x, const char *name) {
    return typed(b, ir_add(b->g, op, &x, 1, b->loc), name);
}

static int constant(builder *b, double value) {
    ir_value *v = ir_add(b->g, OP_CONST, NULL, 0, b->loc);
    v->scalar = value;
    v->role = ROLE_CONST;
    return typed(b, v, NULL);
}

/* softmax(x / T) along the last dim. */
static int softmax_t(builder *b, int x, double temperature, const char *name) {
    ir_value *v = ir_add(b->g, OP_SOFTMAX, &x, 1, b->loc);
    v->axis = b->g->values[x]->type.rank - 1;
    v->scalar = 1.0 / temperature;
    return typed(b, v, name);
}

static int reduce(builder *b, ir_op op, int x, uint32_t axes, const char *name) {
    ir_value *v = ir_add(b->g, op, &x, 1, b->loc);
    v->axes = axes;
    return typed(b, v, name);
}

/* x (the rows of `like`, its last dim reduced away) copied along like's last dim. */
static int along_rows(builder *b, int x, int like) {
    ir_value *v = ir_add(b->g, OP_BROADCAST, &x, 1, b->loc);
    v->type = b->g->values[like]->type;
    v->axes = 1u << (v->type.rank - 1);
    return typed(b, v, NULL);
}

/* log_softmax(logits / T) along the last dim: d - log(sum(exp(d))), d = z - m, z = logits / T,
 * m = sum(softmax(z) * z) (see the head of the file). */
static int log_softmax_t(builder *b, int logits, double temperature, const char *name) {
    uint32_t last = 1u << (b->g->values[logits]->type.rank - 1);
    int z = op2(b, OP_DIV, logits, constant(b, temperature), "student_scaled");
    int q = softmax_t(b, logits, temperature, "student_probs");
    int m = reduce(b, OP_SUM, op2(b, OP_MUL, q, z, NULL), last, "student_shift");
    int d = op2(b, OP_SUB, z, along_rows(b, m, z), "student_shifted");
    int lse = op1(b, OP_LOG, reduce(b, OP_SUM, op1(b, OP_EXP, d, NULL), last, NULL), "student_shifted_lse");
    return op2(b, OP_SUB, d, along_rows(b, lse, d), name);
}

int pass_distill(ir_graph *g, double temperature, double alpha, dm_diag *d) {
    int logits = distill_loss_logits(g);
    if (logits < 0) {
        dm_error(d, g->loss_loc, "distillation (--teacher) needs the student's loss to be cross_entropy(logits, targets)");
        return 1;
    }
    builder b = {.g = g, .d = d, .loc = g->loss_loc};
    int ce = g->loss;
    ir_type t = g->values[logits]->type;
    if (t.rank < 2) {
        dm_error(d, g->loss_loc, "distillation (--teacher) needs logits with rows and classes ([..., C]), got rank %d", t.rank);
        return 1;
    }
    t.partial = 0;
    /* split like logits by rows (the batch), whole along the rest: generated code splits an
     * input on its leading dim only, and where the student's logits are split over tensor
     * (by classes) the sharding pass takes each rank's block of the teacher's */
    for (int k = 1; k < t.rank; k++) t.split[k] = IR_REPLICATED;
    ir_value *in = ir_add(g, OP_INPUT, NULL, 0, b.loc);
    in->type = t;
    in->annotated = 1;
    in->role = ROLE_INPUT;
    in->name = ir_intern(g, "teacher_logits");
    ir_append_id(g, &g->inputs, &g->n_inputs, in->id);
    int teacher = in->id, floor = constant(&b, LOG_FLOOR);
    int p = softmax_t(&b, teacher, temperature, "teacher_probs");
    int log_p = op1(&b, OP_LOG, op2(&b, OP_ADD, p, floor, NULL), "teacher_log_probs");
    int log_q = log_softmax_t(&b, logits, temperature, "student_log_probs");
    int terms = op2(&b, OP_MUL, p, op2(&b, OP_SUB, log_p, log_q, NULL), "kl_terms");
    int rows = reduce(&b, OP_SUM, terms, 1u << (t.rank - 1), "kl_rows");
    int kl = reduce(&b, OP_MEAN, rows, (1u << (t.rank - 1)) - 1, "kl");
    int hard = op2(&b, OP_MUL, constant(&b, alpha), ce, NULL);
    int soft = op2(&b, OP_MUL, constant(&b, (1.0 - alpha) * temperature * temperature), kl, NULL);
    int loss = op2(&b, OP_ADD, hard, soft, "distill_loss");
    if (b.failed) return 1;
    g->loss = loss;
    return 0;
}
