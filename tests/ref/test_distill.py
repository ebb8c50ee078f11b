"""test_distill.py DMC SRCROOT: dmc run --teacher (knowledge distillation) against PyTorch.

A linear student and a one-hidden-layer teacher, weights from files (--init,
--teacher-init), one step on a batch file:
  - the step's loss and every student gradient (--dump-grads) equal torch's autograd of
    alpha * cross_entropy + (1 - alpha) * T^2 * KLDivLoss(reduction='sum')(log_softmax(s / T),
    softmax(t / T)) / rows, for two (T, alpha); and where the student's probabilities
    underflow (its logits' gaps 100 to 400 at T = 1, and T = 0.01), where the student's
    log-probabilities must be a log-softmax (log(softmax + 1e-30) loses value and gradient);
  - the same student on --mesh data=2 (threads) gives the serial run's loss and gradients
    to float rounding; and a two-layer student whose hidden units and classes are split
    over tensor (its logits [B, K@tensor]) on micro-batches, data=2 with micro-batches,
    tensor=2, pipeline=2 and data=2 x tensor=2 x pipeline=2 gives its serial run's (the
    teacher replicated on tensor and pipeline ranks, run once per micro-batch); a teacher
    written for another batch (B = 64) is compiled for the student's rows on every mesh,
    serial and tensor=2 as data=2, each as the serial run with a teacher of the student's B;
  - 1 step, a checkpoint and 1 resumed step give the weights of 2 steps, bit for bit;
  - bad input fails before training with a message naming what is wrong, and writes no
    --save file: a teacher with other classes, a missing --teacher-init, alpha outside
    [0, 1], a temperature <= 0, a teacher whose loss is not a cross-entropy, teacher
    weights of another shape, a student with parameter servers (also at --check), -o with
    --teacher.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stio  # noqa: E402
from dmcrun import Failure, reference_main, run_dmc_steps  # noqa: E402

B, D, H, K = 16, 12, 8, 5

STUDENT = """dim B = %d
dim D = %d
dim K = %d
mesh(data = 1)
input x : f32[B@data, D]
input y : i32[B@data]
param w : f32[D, K] = xavier
param b : f32[K] = zeros
logits = x @ w + b
loss = cross_entropy(logits, y)
output logits
minimize loss
optimizer sgd(lr = 0.1)
""" % (B, D, K)

TEACHER = """dim B = %d
dim D = %d
dim H = %d
dim K = %d
input x : f32[B, D]
input y : i32[B]
param w1 : f32[D, H] = xavier
param w2 : f32[H, K] = xavier
logits = relu(x @ w1) @ w2
loss = %s
output logits
minimize loss
optimizer sgd(lr = 0.1)
"""


# a two-layer student split over tensor: its hidden units, and its classes (so its logits
# and the teacher's, as the student reads them, by columns)
MESH_STUDENT = """dim B = %d
dim D = %d
dim H = %d
dim K = 6
mesh(data = 1, tensor = 1, pipeline = 1)
input x : f32[B@data, D]
input y : i32[B@data]
param w1 : f32[D, H@tensor] = xavier
param b1 : f32[H@tensor] = zeros
param w2 : f32[H, K@tensor] = xavier
param b2 : f32[K@tensor] = zeros
h = relu(x @ w1 + b1)
logits = h @ w2 + b2
loss = cross_entropy(logits, y)
output logits
minimize loss
optimizer sgd(lr = 0.1)
""" % (B, D, H)
MESHES = [["--microbatches", "4"], ["--mesh", "data=2", "--microbatches", "2"], ["--mesh", "tensor=2"],
          ["--mesh", "pipeline=2", "--microbatches", "2"], ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "2"]]


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def reference(torch, x, y, sw, tw, temperature, alpha):
    """torch's loss and the student's gradients."""
    w = torch.tensor(sw["w"], requires_grad=True)
    b = torch.tensor(sw["b"], requires_grad=True)
    xt, yt = torch.tensor(x), torch.tensor(y).long()
    with torch.no_grad():
        t = torch.relu(xt @ torch.tensor(tw["w1"])) @ torch.tensor(tw["w2"])
    s = xt @ w + b
    ce = torch.nn.functional.cross_entropy(s, yt)
    kl = torch.nn.KLDivLoss(reduction="sum")(torch.log_softmax(s / temperature, dim=-1),
                                             torch.softmax(t / temperature, dim=-1)) / s.shape[0]
    loss = alpha * ce + (1 - alpha) * temperature ** 2 * kl
    loss.backward()
    return loss.item(), {"w": w.grad.numpy(), "b": b.grad.numpy()}


def distill_step(dmc, tmp, files, temperature, alpha, extra, tag):
    grads = os.path.join(tmp, "g-%s.safetensors" % tag)
    steps = run_dmc_steps(dmc, files["student"], tmp,
                          extra + ["--teacher", files["teacher"], "--teacher-init", files["tw"], "--init", files["sw"],
                                   "--batch-file", files["batch"], "--steps", "1", "--dump-grads", grads,
                                   "--distill-temperature", str(temperature), "--distill-alpha", str(alpha)],
                          timeout=300)
    return steps[0]["loss"], stio.load(grads)


def compare(np, what, loss, grads, want_loss, want_grads, tol):
    worst = max(float(np.max(np.abs(grads[n] - want_grads[n]))) for n in want_grads)
    print("%s: loss %.7f (want %.7f), largest gradient difference %.2e" % (what, loss, want_loss, worst))
    if abs(loss - want_loss) > tol * max(1.0, abs(want_loss)):
        raise Failure("%s: loss %.7f, want %.7f" % (what, loss, want_loss))
    if worst > tol:
        raise Failure("%s: gradients differ by %.2e (tolerance %.0e)" % (what, worst, tol))


def check_underflow(dmc, tmp, files, np, torch, x, y, sw, tw):
    """Where the student's softmax underflows, the loss and gradients are torch's
    (KLDivLoss of log_softmax(s / T)): the student's weights x64 (logit gaps 100 to 400) at
    T = 1, and as given at T = 0.01 (gaps over T of 160 to 620)."""
    big = {n: (v * 64).astype(np.float32) for n, v in sw.items()}
    s = x @ sw["w"] + sw["b"]
    gaps = s.max(axis=1) - s.min(axis=1)
    if not (64 * gaps.min() > 69 and gaps.min() / 0.01 > 69):  # e^-69 < 1e-30: underflow past the floor
        raise Failure("check_underflow: the student's logit gaps %s are too small to test it" % gaps)
    big_files = dict(files, sw=os.path.join(tmp, "sw_big.safetensors"))
    stio.save(big, big_files["sw"])
    for what, f, weights, temperature, alpha in (("weights x64", big_files, big, 1.0, 0.5),
                                                 ("weights as given", files, sw, 0.01, 0.5)):
        want_loss, want_grads = reference(torch, x, y, weights, tw, temperature, alpha)
        loss, grads = distill_step(dmc, tmp, f, temperature, alpha, [], "underflow")
        compare(np, "underflow: %s, T=%g alpha=%g against torch" % (what, temperature, alpha), loss, grads,
                want_loss, want_grads, 1e-5)


def check_meshes(dmc, tmp, files, np, rng):
    """MESH_STUDENT distilled on MESHES: the serial run's loss and gradients."""
    tw6 = {"w1": rng.standard_normal((D, H)).astype(np.float32), "w2": rng.standard_normal((H, 6)).astype(np.float32)}
    sw6 = {"w1": (rng.standard_normal((D, H)) * 0.5).astype(np.float32), "b1": np.zeros(H, np.float32),
           "w2": (rng.standard_normal((H, 6)) * 0.5).astype(np.float32),
           "b2": (rng.standard_normal(6) * 0.1).astype(np.float32)}
    y6 = rng.integers(0, 6, B).astype(np.int32)
    mesh_files = dict(files, student=write(os.path.join(tmp, "mesh_student.dm"), MESH_STUDENT),
                      teacher=write(os.path.join(tmp, "teacher_k6.dm"), TEACHER % (B, D, H, 6, "cross_entropy(logits, y)")),
                      tw=os.path.join(tmp, "tw6.safetensors"), sw=os.path.join(tmp, "sw6.safetensors"),
                      batch=os.path.join(tmp, "batch6.safetensors"))
    stio.save(tw6, mesh_files["tw"])
    stio.save(sw6, mesh_files["sw"])
    stio.save({"x": stio.load(files["batch"])["x"], "y": y6[None]}, mesh_files["batch"])
    loss, grads = distill_step(dmc, tmp, mesh_files, 3.0, 0.3, [], "mesh-serial")
    for extra in MESHES:
        tag = "-".join(a.lstrip("-").replace("=", "").replace(",", "") for a in extra)
        got_loss, got_grads = distill_step(dmc, tmp, mesh_files, 3.0, 0.3, extra, tag)
        compare(np, "two-layer student %s against serial" % " ".join(extra), got_loss, got_grads, loss, grads, 1e-6)
    # a teacher written for B = 64: its batch dim is set to the student's rows (B / (M N))
    # on every mesh, not only where the student is data-parallel or of micro-batches
    b64_files = dict(mesh_files, teacher=write(os.path.join(tmp, "teacher_k6_b64.dm"),
                                                TEACHER % (64, D, H, 6, "cross_entropy(logits, y)")))
    for extra in ([], ["--mesh", "tensor=2"], ["--mesh", "data=2"]):
        tag = "b64-" + "-".join(a.lstrip("-").replace("=", "") for a in extra)
        got_loss, got_grads = distill_step(dmc, tmp, b64_files, 3.0, 0.3, extra, tag)
        compare(np, "two-layer student %s, a teacher of B = 64, against serial" % (" ".join(extra) or "serial"),
                got_loss, got_grads, loss, grads, 1e-6)


def check_resume(dmc, tmp, files, np):
    """2 distilled steps equal 1 step, a checkpoint, and 1 resumed step, bit for bit."""
    common = ["--teacher", files["teacher"], "--teacher-init", files["tw"], "--batch-file", files["batch2"]]
    init = ["--init", files["sw"]]
    whole, resumed = os.path.join(tmp, "whole.safetensors"), os.path.join(tmp, "resumed.safetensors")
    run_dmc_steps(dmc, files["student"], tmp, common + init + ["--steps", "2", "--save", whole], timeout=300)
    ck = os.path.join(tmp, "ck")
    run_dmc_steps(dmc, files["student"], tmp, common + init + ["--steps", "1", "--checkpoint", ck], timeout=300)
    run_dmc_steps(dmc, files["student"], tmp, common + ["--steps", "2", "--resume", ck, "--save", resumed],
                  timeout=300, first_step=2)
    a, b = stio.load(whole), stio.load(resumed)
    for name in a:
        if not np.array_equal(a[name], b[name]):
            raise Failure("a resumed distilled run's %s differs from the uninterrupted run's" % name)
    print("resumed: 1 + 1 steps as 2, bit for bit")


def refused(dmc, tmp, args, expect, run=True):
    """`dmc run ARGS` (or `dmc ARGS`) fails saying expect, and writes no --save file."""
    saved = os.path.join(tmp, "refused.safetensors")
    cmd = [dmc, "run"] + args + ["--quiet", "--steps", "1", "--save", saved] if run else [dmc] + args
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=300, env=dict(os.environ, TMPDIR=tmp))
    if r.returncode == 0 or expect not in r.stderr:
        raise Failure("`%s` exited %d; want a failure saying %r, got:\n%s" % (" ".join(cmd), r.returncode, expect,
                                                                             r.stderr))
    if os.path.exists(saved):
        raise Failure("`%s` failed but wrote %s" % (" ".join(cmd), saved))
    print("refused: %s" % r.stderr.strip().splitlines()[-1])


def check_refusals(dmc, root, tmp, files):
    student, teacher, tw = files["student"], files["teacher"], files["tw"]
    other = write(os.path.join(tmp, "teacher6.dm"),
                  (TEACHER % (B, D, H, K + 1, "cross_entropy(logits, y)")))
    not_ce = write(os.path.join(tmp, "teacher_mse.dm"), TEACHER % (B, D, H, K, "mean(logits * logits)"))
    wide = write(os.path.join(tmp, "teacher_wide.dm"), TEACHER % (B, D, H + 1, K, "cross_entropy(logits, y)"))
    batch = ["--batch-file", files["batch"]]
    refused(dmc, tmp, [student, "--teacher", other, "--teacher-init", tw] + batch, "the teacher's logits are f32[16, 6]")
    refused(dmc, tmp, [student, "--teacher", teacher] + batch, "--teacher needs --teacher-init")
    refused(dmc, tmp, [student, "--teacher", teacher, "--teacher-init", tw, "--distill-alpha", "1.5"] + batch,
            "--distill-alpha must be in [0, 1]")
    refused(dmc, tmp, [student, "--teacher", teacher, "--teacher-init", tw, "--distill-temperature", "0"] + batch,
            "--distill-temperature must be a number > 0")
    refused(dmc, tmp, [student, "--teacher", not_ce, "--teacher-init", tw] + batch, "is not cross_entropy")
    refused(dmc, tmp, [student, "--teacher", wide, "--teacher-init", tw] + batch, "--teacher-init")
    refused(dmc, tmp, [student, "--distill-alpha", "0.3"] + batch, "--distill-alpha needs --teacher")
    mlp = os.path.join(root, "examples", "mlp.dm")
    refused(dmc, tmp, [mlp, "--mesh", "data=2", "--param-servers", "1", "--teacher", teacher, "--teacher-init", tw],
            "uses parameter servers, which distillation does not support")
    refused(dmc, tmp, ["--check", mlp, "--mesh", "data=2", "--param-servers", "1", "--teacher", teacher,
                       "--teacher-init", tw], "uses parameter servers, which distillation does not support", run=False)
    refused(dmc, tmp, ["-o", os.path.join(tmp, "out"), student, "--teacher", teacher, "--teacher-init", tw],
            "--teacher is for dmc run", run=False)
    if os.path.exists(os.path.join(tmp, "out")):
        raise Failure("dmc -o --teacher failed but wrote its directory")


def body(dmc, root, np, torch):
    with tempfile.TemporaryDirectory(prefix="dmc-distill-") as tmp:
        rng = np.random.default_rng(7)
        x = rng.standard_normal((B, D)).astype(np.float32)
        y = rng.integers(0, K, B).astype(np.int32)
        sw = {"w": (rng.standard_normal((D, K)) * 0.5).astype(np.float32),
              "b": (rng.standard_normal(K) * 0.1).astype(np.float32)}
        tw = {"w1": rng.standard_normal((D, H)).astype(np.float32),
              "w2": rng.standard_normal((H, K)).astype(np.float32)}
        files = {"student": write(os.path.join(tmp, "student.dm"), STUDENT),
                 "teacher": write(os.path.join(tmp, "teacher.dm"), TEACHER % (B, D, H, K, "cross_entropy(logits, y)")),
                 "sw": os.path.join(tmp, "sw.safetensors"), "tw": os.path.join(tmp, "tw.safetensors"),
                 "batch": os.path.join(tmp, "batch.safetensors")}
        stio.save(sw, files["sw"])
        stio.save(tw, files["tw"])
        stio.save({"x": x[None], "y": y[None]}, files["batch"])
        files["batch2"] = os.path.join(tmp, "batch2.safetensors")
        stio.save({"x": np.stack([x, -x]), "y": np.stack([y, y[::-1]])}, files["batch2"])
        for temperature, alpha in ((4.0, 0.5), (2.0, 0.1)):
            want_loss, want_grads = reference(torch, x, y, sw, tw, temperature, alpha)
            loss, grads = distill_step(dmc, tmp, files, temperature, alpha, [], "serial")
            compare(np, "T=%g alpha=%g against torch" % (temperature, alpha), loss, grads, want_loss, want_grads, 1e-5)
            loss2, grads2 = distill_step(dmc, tmp, files, temperature, alpha, ["--mesh", "data=2"], "data2")
            compare(np, "T=%g alpha=%g data=2 against serial" % (temperature, alpha), loss2, grads2, loss, grads, 1e-6)
        check_underflow(dmc, tmp, files, np, torch, x, y, sw, tw)
        check_meshes(dmc, tmp, files, np, rng)
        check_resume(dmc, tmp, files, np)
        check_refusals(dmc, root, tmp, files)
    return ("distillation loss and gradients as torch's KLDivLoss (also where the student's softmax underflows), "
            "data=2 and %d more meshes as serial, a teacher of another batch on serial, tensor=2 and data=2, resumed "
            "as whole, bad input refused" % len(MESHES))


if __name__ == "__main__":
    sys.exit(reference_main(sys.argv, body))
