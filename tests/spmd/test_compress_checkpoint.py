"""test_compress_checkpoint.py DMC SRCROOT: checkpoints of programs compiled with --compress
topk and powersgd hold their error-feedback state, against test_compress.py's reference
(torch and numpy) of each rule.

examples/mlp.dm (B=16, D=48, H=64, K=10, AdamW) trains 6 steps on data=2 from weights and
batches made here, writing a checkpoint every 3 steps. Checked, for topk:0.05 and powersgd:2:
  - the step-3 checkpoint's "<param>.error_feedback" ([data ranks, ...parameter]) is the
    reference's residual of each rank after 3 steps, and "<param>.powersgd_q" ([1, cols, rank]
    on data=2) its Q (absolute 1e-6, relative to the tensor's largest element);
  - 3 steps resumed from it give the uninterrupted run's weights bit for bit, on data=2 and
    (from their own checkpoints) on data=2,tensor=2, data=2,pipeline=2 and the latter
    interleaved (2 chunks); without the state (as before) they would not;
  - resumed on data=4, the file's residuals load as docs/trainer.md says: each of the 4 ranks
    starts from the 2 ranks' sum over 4 (the trainer says so in a note), and the final weights
    are the reference's that does the same (absolute 1e-5);
  - a checkpoint of the uncompressed program resumed with topk:0.05 starts the error feedback
    from zeros (a note; the reference likewise), and one of topk:0.05 resumed without
    --compress is refused, as it would drop the residuals.
The GPU suite runs it on the CUDA target (DMC_TEST_TARGET=cuda, host-staged ranks). Exit 77
(a meson skip) without torch, or on the CUDA target without a GPU.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
import stio  # noqa: E402
from dmcrun import Failure, import_reference  # noqa: E402
from test_compress import B, D, H, K, PARAMS, SEED, STEPS, Reference, partial_gradients, write_data  # noqa: E402
from test_mlp import model_signature  # noqa: E402

MODES = ["topk:0.05", "powersgd:2"]
STATE_ATOL, WEIGHT_ATOL = 1e-6, 1e-5


class Runner:
    def __init__(self, dmc, dm_file, tmp, files):
        self.dmc, self.dm_file, self.tmp, self.files = dmc, dm_file, tmp, files

    def run(self, tag, extra, want_rc=0):
        """`dmc run` for STEPS steps; (stderr, the saved weights or None)."""
        weights = os.path.join(self.tmp, "w-%s.safetensors" % tag)
        cmd = [self.dmc, "run", self.dm_file, "--set", "B=%d,D=%d,H=%d,K=%d" % (B, D, H, K)] + dmcrun.target_args() + extra[0] + [
            "--", "--steps", str(STEPS), "--seed", str(SEED), "--save", weights] + self.files + extra[1]
        if "--resume" in extra[1]:  # (its parameters are the checkpoint's)
            at = cmd.index("--init")
            del cmd[at:at + 2]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300,
                           cwd=self.tmp, env=dict(os.environ, TMPDIR=self.tmp))
        if r.returncode != want_rc:
            raise Failure("`%s` exited %d (expected %d):\n%s" % (" ".join(cmd), r.returncode, want_rc, r.stderr[-3000:]))
        return r.stderr, (stio.load(weights) if want_rc == 0 else None)

    def checkpointed(self, tag, compile_args):
        """Trains with a checkpoint every 3 steps; (the step-3 file, the final weights)."""
        ckpt = os.path.join(self.tmp, "ck-" + tag)
        _, weights = self.run(tag, (compile_args, ["--checkpoint", ckpt, "--checkpoint-every", "3"]))
        return os.path.join(ckpt, "step-00000003.safetensors"), weights

    def resumed(self, tag, compile_args, step3):
        """Resumes from a copy of the step-3 file (alone in its directory) to step 6."""
        ckpt = os.path.join(self.tmp, "re-" + tag)
        os.makedirs(ckpt)
        shutil.copy(step3, ckpt)
        return self.run("re-" + tag, (compile_args, ["--resume", ckpt]))


def reference(np, torch, mode, init, xs, ys, norm, ranks_after=2, residual_at_3=None, first_mode=None):
    """The reference's (final weights, its residuals and Q after 3 steps): 2 ranks for 3
    steps, then ranks_after; residual_at_3: what the residuals become then ("redistribute":
    the 2 ranks' sum over ranks_after, each); first_mode: the rule of the first 3 steps,
    mode's starting afresh (residuals of zeros) after them."""
    ref = Reference(np, torch, first_mode or mode)
    leaves = {n: torch.tensor(v.copy()) for n, v in init.items()}
    opt = torch.optim.AdamW([leaves[n] for n, _ in PARAMS], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)
    at3 = None
    for s in range(STEPS):
        ranks = 2 if s < 3 else ranks_after
        if s == 3:
            at3 = ({k: v.copy() for k, v in ref.residual.items()}, {k: v.copy() for k, v in ref.q.items()})
            if first_mode:
                ref = Reference(np, torch, mode)
            if residual_at_3 is not None:
                moved = {}
                for name, _ in PARAMS:
                    rows = [ref.residual[(r, name)] for r in range(2) if (r, name) in ref.residual]
                    if not rows:
                        continue
                    total = rows[0] + rows[1]
                    share = total / np.float32(ranks_after)
                    for r in range(ranks_after):
                        moved[(r, name)] = share.astype(np.float32).copy()
                ref.residual = moved
        _, partials = partial_gradients(torch, {n: t.numpy().copy() for n, t in leaves.items()}, xs[s], ys[s], norm,
                                        ranks)
        reduced = ref.reduce(partials, s + 1)
        for n, t in leaves.items():
            t.grad = torch.from_numpy(np.ascontiguousarray(reduced[n], dtype=np.float32))
        opt.step()
    return {n: t.numpy() for n, t in leaves.items()}, at3


def worst(np, a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0


def check_state(np, mode, step3, at3):
    """The step-3 checkpoint's compression state against the reference's."""
    f = stio.load(step3)
    residual, q = at3
    checked = 0
    for name, shape in PARAMS:
        got = f["%s.error_feedback" % name]
        if got.shape != (2,) + tuple(shape):
            raise Failure("%s: %s.error_feedback has shape %s, expected %s" % (mode, name, got.shape, (2,) + tuple(shape)))
        for r in range(2):
            want = residual.get((r, name))
            if want is None:  # powersgd's exact vectors keep a residual of zeros
                want = np.zeros(shape, np.float32)
            scale = max(1.0, float(np.max(np.abs(want))))
            err = worst(np, got[r].reshape(-1), want.reshape(-1)) / scale
            if err > STATE_ATOL:
                raise Failure("%s: rank %d's residual of %s differs from the reference's by %.3g" % (mode, r, name, err))
            checked += 1
        key = "%s.powersgd_q" % name
        if name in q:
            if key not in f:
                raise Failure("%s: the checkpoint has no %s" % (mode, key))
            err = worst(np, f[key].reshape(-1), q[name].reshape(-1)) / max(1.0, float(np.max(np.abs(q[name]))))
            if err > STATE_ATOL:
                raise Failure("%s: %s differs from the reference's Q by %.3g" % (mode, key, err))
            checked += 1
        elif key in f:
            raise Failure("%s: the checkpoint has %s, which the reference does not compress" % (mode, key))
    nonzero = sum(int(np.count_nonzero(f["%s.error_feedback" % n])) for n, _ in PARAMS)
    if nonzero == 0:
        raise Failure("%s: every residual of the step-3 checkpoint is zero: the check would not see a lost one" % mode)
    print("%-11s step-3 checkpoint: %d residual rows and factors are the reference's (%d nonzero elements)"
          % (mode, checked, nonzero))


def same_bits(np, what, a, b):
    for name, _ in PARAMS:
        if not np.array_equal(a[name], b[name]):
            raise Failure("%s: %s differs by %.3g" % (what, name, float(np.max(np.abs(a[name] - b[name])))))
    print("%-55s bit for bit the uninterrupted run's" % what)


def close(np, what, got, want):
    err = max(worst(np, got[n], want[n]) for n, _ in PARAMS)
    if err > WEIGHT_ATOL:
        raise Failure("%s: final weights differ from the reference's by %.3g" % (what, err))
    print("%-55s the reference's weights within %.1e (bound %.0e)" % (what, err, WEIGHT_ATOL))


def expect(what, text, stderr):
    if text not in stderr:
        raise Failure("%s: the output lacks '%s':\n%s" % (what, text, stderr[-2000:]))


def across_programs(np, torch, R, init, xs, ys, norm):
    """An uncompressed checkpoint resumed with topk, and the other way."""
    step3, _ = R.checkpointed("plain", ["--mesh", "data=2"])
    err, got = R.resumed("plain-topk", ["--mesh", "data=2", "--compress", "topk:0.05"], step3)
    expect("an uncompressed checkpoint resumed with topk:0.05", "holds no error feedback for 6 gradients", err)
    # topk:1 sends everything: the uncompressed sum (0 + x0 + x1)
    want = reference(np, torch, "topk:0.05", init, xs, ys, norm, first_mode="topk:1")[0]
    close(np, "uncompressed checkpoint resumed with topk:0.05", got, want)
    step3, _ = R.checkpointed("topk-only", ["--mesh", "data=2", "--compress", "topk:0.05"])
    ckpt = os.path.join(R.tmp, "re-topk-plain")
    os.makedirs(ckpt)
    shutil.copy(step3, ckpt)
    err, _ = R.run("re-topk-plain", (["--mesh", "data=2"], ["--resume", ckpt]), want_rc=1)
    expect("a topk:0.05 checkpoint resumed without --compress",
           "tensor 'fc1.weight.error_feedback' is not one this program reads", err)
    print("%-55s refused: it would drop the residuals" % "a topk:0.05 checkpoint resumed uncompressed")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    dmc, root = sys.argv[1:3]
    dmcrun.require_target()
    mods = import_reference()
    if mods is None:
        return 77
    np, torch = mods
    torch.set_num_threads(1)
    dm_file = os.path.join(os.path.abspath(root), "examples", "mlp.dm")
    with open(dm_file) as f:
        norm = model_signature(f.read())
    tmp = tempfile.mkdtemp(prefix="dmc-compress-ckpt-")
    failures = []
    try:
        init, xs, ys, files = write_data(np, torch, tmp)
        R = Runner(dmc, dm_file, tmp, files)
        for mode in MODES:
            tag = mode.replace(":", "_")

            def on_data2():
                compiled = ["--mesh", "data=2", "--compress", mode]
                step3, straight = R.checkpointed(tag, compiled)
                want, at3 = reference(np, torch, mode, init, xs, ys, norm)
                close(np, "%s data=2, 6 steps straight" % mode, straight, want)
                check_state(np, mode, step3, at3)
                same_bits(np, "%s data=2, 3 steps + resumed 3" % mode, R.resumed(tag, compiled, step3)[1], straight)
                # another data-axis size: the residuals' sum spread over 4 ranks
                err, got = R.resumed(tag + "-4", ["--mesh", "data=4", "--compress", mode], step3)
                expect(mode, "written by 2 data ranks and this run has 4: each rank starts from their sum over 4", err)
                close(np, "%s data=2 checkpoint resumed on data=4" % mode, got,
                      reference(np, torch, mode, init, xs, ys, norm, 4, "redistribute")[0])

            def on_other_meshes():
                for k, mesh in enumerate((["data=2,tensor=2"], ["data=2,pipeline=2"],
                                          ["data=2,pipeline=2", "--microbatches", "2", "--schedule", "interleaved",
                                           "--chunks", "2"])):
                    compiled = ["--mesh"] + mesh + ["--compress", mode]
                    step3, straight = R.checkpointed("%s-%d" % (tag, k), compiled)
                    label = mesh[0] + (" interleaved" if "interleaved" in mesh else "")
                    same_bits(np, "%s %s, 3 steps + resumed 3" % (mode, label), R.resumed("%s-%d" % (tag, k), compiled, step3)[1],
                              straight)

            for label, check in ((mode + " data=2", on_data2), (mode + " other meshes", on_other_meshes)):
                try:
                    check()
                except Failure as e:
                    print("FAIL %s: %s" % (label, e))
                    failures.append(label)

        try:
            across_programs(np, torch, R, init, xs, ys, norm)
        except Failure as e:
            print("FAIL across programs: %s" % e)
            failures.append("across programs")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
