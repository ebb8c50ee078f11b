"""test_param_servers.py: parameter servers (--param-servers, --ps-staleness) on mlp.dm.

Oracles:
  - synchronous servers against allreduce data parallelism on the same mesh: the same
    bytes in the saved weights (the servers sum in worker order, as the allreduce does),
    on threads and on MPI, with shards that do not divide the parameters evenly; and
    against PyTorch's synchronous training (test_mlp's reference) to 1e-5;
  - asynchronous servers with staleness 0 and plain SGD: each worker's push applied on its
    own, p - lr g0 - lr g1 instead of p - lr (g0 + g1), which is the synchronous rule up to
    rounding: PyTorch's weights to 1e-5, on threads and MPI;
  - asynchronous servers with a bound K on 4 workers: every server applies each of the
    4 x steps pushes as an update and answers no pull with a worker more than K steps
    ahead (its report), and the loss stays finite;
  - --explain=json's traffic against the formulas: a worker pushes and pulls every
    parameter (4 bytes each), a server moves workers x its shard (ceil(params / servers))
    each way, the replaced allreduce sends 2 (W - 1) / W of the gradients (ring);
  - --precision fp16 with a loss scale that overflows at first (skipped steps): the
    synchronous servers' saved weights are the allreduce's on data=2, byte for byte, and
    both print the same skipped steps and scales (a skipped step pushes nothing);
    The same on Fashion-MNIST (mlp.dm's B and H), whose step 6 overflows on one worker
    only (every worker
    checks its own gradients: a check of worker 0's alone let worker 1's infinities reach
    the servers);
  - fp16 with asynchronous servers (each worker its own scaler; a skipped step goes to the
    servers as a push without gradients): staleness 0 and plain SGD against the
    synchronous servers' run where the workers skip the same steps (the same printed
    steps, scales and skips; the weights to 1e-4, an update per push, rounded on), the servers'
    counts (pushes = updates + skipped, skipped = the workers' skips), and 4 workers
    with a bound of 1 finish with finite losses within the bound;
  - a parameter the loss does not read (no gradient, no update op) under AdamW with weight
    decay: the synchronous servers' saved weights are the allreduce's on data=2, byte for
    byte, with that parameter at its initial value (the servers hold only the parameters
    the program updates: they decayed it on every update), and asynchronous servers
    (staleness 1) leave it at its initial value too; --explain=json counts only the
    updated parameters' traffic;
  - checkpoints (the servers' parameters, optimizer state and update count, read back at
    a snapshot every worker asks for after the same step): the synchronous servers'
    checkpoints hold the allreduce's tensors byte for byte (AdamW, and fp16 with its loss
    scaler); resuming one ends on the uninterrupted run's weights byte for byte, on the
    same servers, on 3 servers, and on allreduce data parallelism (and the reverse);
    asynchronous servers' checkpoints count every push as an update ("dmc.ps_updates"),
    a resumed run counts on from it, and with staleness 0 and plain SGD a run resumed from
    step 5 ends on PyTorch's weights (a push missing from the snapshot would show);
  - --predict with --init of saved weights: the outputs of allreduce data parallelism's
    program, byte for byte (the workers predict; the servers start and stop);
  - what is refused: a mesh with another axis, --ps-staleness alone, --trace.

usage: test_param_servers.py DMC SOURCE_ROOT
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmcrun  # noqa: E402
import test_mlp  # noqa: E402
from dmcrun import Failure  # noqa: E402

STEPS = test_mlp.STEPS
WEIGHT_ATOL = 1e-5
# fp16, staleness 0 against synchronous servers: the per-push updates' rounding differs, and
# the next step's activations stored in 16 bits (11 significant bits) widen it
FP16_WEIGHT_ATOL = 1e-4
PLAIN_SGD_LINE = "optimizer sgd(lr = 0.05)"
SERVER_RE = re.compile(r"^server (\d+) \(world rank (\d+)\): (\d+) updates of its shard from (\d+) pushes, "
                       r"(synchronous|asynchronous \(bound (\d+)\): workers at most (\d+) steps apart)", re.M)
SKIPPED_RE = re.compile(r"^server \d+ .*?(?:, (\d+) of the pushes skipped \(fp16, no gradients\))?, [\d.]+ s waiting", re.M)
STEP_RE = re.compile(r"^step \d+ loss (\S+) .*?scale (\d+)( skipped 1)?", re.M)


def run(dmc, dm_file, tmp, args, timeout=240, mlp=True):
    """dmc run's output (stdout and stderr); fails with it when the run fails. mlp: the
    model is mlp.dm (its B and H set to the test's)."""
    args = (["--set", "B=%d,H=%d" % (test_mlp.B, test_mlp.H)] if mlp else []) + dmcrun.target_args() + args
    r = subprocess.run([dmc, "run", dm_file] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=timeout)
    if r.returncode != 0:
        raise Failure("dmc run %s %s failed (%d):\n%s" % (dm_file, " ".join(args), r.returncode, r.stdout))
    return r.stdout


def servers_of(out, servers):
    found = [m.groups() for m in SERVER_RE.finditer(out)]
    if len(found) != servers:
        raise Failure("expected %d server reports, got %d:\n%s" % (servers, len(found), out))
    return found


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def check_synchronous(dmc, src, tmp, common):
    for label, mesh, servers, backend in [("data2-servers2", "data=2", 2, []), ("data4-servers3", "data=4", 3, []),
                                          ("data2-servers2-mpi", "data=2", 2, ["--backend", "mpi"])]:
        ar = os.path.join(tmp, label + "-allreduce.safetensors")
        ps = os.path.join(tmp, label + "-ps.safetensors")
        steps = ["--steps", str(STEPS)]
        run(dmc, src, tmp, common + backend + ["--mesh", mesh] + steps + ["--save", ar])
        out = run(dmc, src, tmp, common + backend + ["--mesh", mesh, "--param-servers", str(servers)] + steps +
                  ["--save", ps])
        for server, _, updates, pushes, mode, _, _ in servers_of(out, servers):
            workers = int(mesh.split("=")[1])
            if mode != "synchronous" or int(updates) != STEPS or int(pushes) != workers * STEPS:
                raise Failure("%s: server %s reports %s updates from %s pushes (%s); expected %d from %d, synchronous"
                              % (label, server, updates, pushes, mode, STEPS, workers * STEPS))
        if read_bytes(ar) != read_bytes(ps):
            raise Failure("%s: the synchronous servers' weights are not the allreduce's, byte for byte" % label)
        print("%-20s synchronous servers: the allreduce's weights, byte for byte" % label)
    return os.path.join(tmp, "data2-servers2-ps.safetensors")


# A parameter the loss does not read (spare, declared between the used ones, and spare_bias,
# last): the optimizer has no update for them, and a large weight decay would show any.
UNUSED_DM = """dim B = 8
dim D = 6
dim H = 5
dim K = 3
mesh(data = 1)
input x : f32[B@data, D]
input y : i32[B@data]
param w1 : f32[D, H] = xavier
param spare : f32[H, K] = xavier
param b1 : f32[H] = zeros
param w2 : f32[H, K] = xavier
param spare_bias : f32[K] = zeros
h = relu(x @ w1 + b1)
logits = h @ w2
loss = cross_entropy(logits, y)
output logits
minimize loss
optimizer adamw(lr = 1e-2, weight_decay = 0.5)
"""
UNUSED_SHAPES = {"w1": (6, 5), "spare": (5, 3), "b1": (5,), "w2": (5, 3), "spare_bias": (3,)}
UNUSED_STEPS = 4


def check_unused_parameter(dmc, tmp, np, stio):
    """The servers update only the parameters the program updates: one the loss does not
    read keeps its initial value, undecayed, as allreduce data parallelism keeps it."""
    path = os.path.join(tmp, "unused.dm")
    with open(path, "w") as f:
        f.write(UNUSED_DM)
    rng = np.random.default_rng(4321)
    init = {n: (rng.random(shape) - 0.5).astype(np.float32) for n, shape in UNUSED_SHAPES.items()}
    init_path, batch_path = os.path.join(tmp, "unused-init.safetensors"), os.path.join(tmp, "unused-batches.safetensors")
    stio.save(init, init_path)
    stio.save({"x": rng.random((UNUSED_STEPS, 8, 6)).astype(np.float32),
               "y": rng.integers(0, 3, size=(UNUSED_STEPS, 8)).astype(np.int32)}, batch_path)
    common = ["--init", init_path, "--batch-file", batch_path, "--steps", str(UNUSED_STEPS)]
    saved = {}
    for name, mesh in [("allreduce", []), ("sync", ["--param-servers", "2"]),
                       ("async1", ["--param-servers", "2", "--ps-staleness", "1"])]:
        saved[name] = os.path.join(tmp, "unused-%s.safetensors" % name)
        run(dmc, path, tmp, ["--mesh", "data=2"] + mesh + common + ["--save", saved[name]], mlp=False)
    weights = {name: stio.load(p) for name, p in saved.items()}
    for name in ("spare", "spare_bias"):
        for run_name, w in weights.items():
            if not np.array_equal(w[name], init[name]):
                raise Failure("unused parameter %s: the %s run changed it (max |change| %g): a parameter without a "
                              "gradient gets no update, no weight decay" % (name, run_name,
                                                                            np.abs(w[name] - init[name]).max()))
    if any(np.array_equal(weights["sync"][n], init[n]) for n in ("w1", "b1", "w2")):
        raise Failure("unused parameter: the synchronous servers left a trained parameter at its initial value")
    if read_bytes(saved["allreduce"]) != read_bytes(saved["sync"]):
        diff = {n: float(np.abs(weights["allreduce"][n] - weights["sync"][n]).max()) for n in UNUSED_SHAPES}
        raise Failure("unused parameter: the synchronous servers' weights are not the allreduce's, byte for byte: "
                      "max |difference| %s" % diff)
    # --explain=json: the traffic of the updated parameters alone (what goes to the servers)
    import json
    args = [dmc, "--explain=json", "--mesh", "data=2", "--param-servers", "2", path]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    if r.returncode != 0:
        raise Failure("%s failed:\n%s%s" % (" ".join(args), r.stdout, r.stderr))
    ps = json.loads(r.stdout)["param_servers"]
    updated = sum(int(np.prod(UNUSED_SHAPES[n])) for n in ("w1", "b1", "w2"))
    want = {"worker_sends_bytes": 4 * updated, "worker_receives_bytes": 4 * updated,
            "server_param_bytes": 4 * -(-updated // 2), "server_sends_bytes": 2 * 4 * -(-updated // 2)}
    if any(ps.get(k) != v for k, v in want.items()):
        raise Failure("unused parameter: --explain=json's traffic %s, expected %s (the updated parameters alone)"
                      % ({k: ps.get(k) for k in want}, want))
    print("a parameter the loss does not read: synchronous servers give the allreduce's weights byte for byte, "
          "neither they nor asynchronous ones (staleness 1) decay it, and --explain counts only the updated ones")


def check_explain(dmc, src):
    import json
    D, H, K = 784, test_mlp.H, 10
    params = D * H + H + H * H + H + H * K + K
    for workers, servers, staleness in [(2, 2, None), (4, 3, 2)]:
        args = [dmc, "--explain=json", "--set", "B=%d,H=%d" % (test_mlp.B, H), "--mesh", "data=%d" % workers,
                "--param-servers", str(servers)] + (["--ps-staleness", str(staleness)] if staleness is not None else [])
        r = subprocess.run(args + [src], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                           timeout=60)
        if r.returncode != 0:
            raise Failure("%s failed:\n%s" % (" ".join(args), r.stdout))
        plan = json.loads(r.stdout)
        ps = plan["param_servers"]
        replaced = [c for c in plan["collectives"] if c.get("replaced_by_param_servers")]
        kept = [c for c in plan["collectives"] if not c.get("replaced_by_param_servers")]
        if len(replaced) != 6 or any(c["op"] != "allreduce" or c["phase"] != "update" for c in replaced):
            raise Failure("--explain=json: expected the 6 update allreduces marked replaced_by_param_servers, got %s"
                          % replaced)
        if plan["communication"]["sent_bytes_per_rank"] != sum(c["sent_bytes_per_rank"] for c in kept):
            raise Failure("--explain=json: communication counts the allreduces the servers replace: %s"
                          % plan["communication"])
        shard = -(-params // servers)
        want = {"servers": servers, "workers": workers, "first_server_rank": workers, "synchronous": staleness is None,
                "staleness": -1 if staleness is None else staleness, "worker_sends_bytes": 4 * params,
                "worker_receives_bytes": 4 * params, "server_sends_bytes": 4 * shard * workers,
                "server_receives_bytes": 4 * shard * workers, "server_param_bytes": 4 * shard,
                "server_state_bytes": 2 * 4 * shard, "server_buffer_bytes": 2 * 4 * shard,  # the sum, a message
                "replaced_allreduces": 6,
                "allreduce_sent_bytes": round(4 * params * 2 * (workers - 1) / workers)}
        for key, value in want.items():
            if ps.get(key) != value and not (isinstance(value, int) and abs(ps.get(key, -1e18) - value) <= 1):
                raise Failure("--explain=json, %d workers, %d servers: %s is %s, expected %s" % (workers, servers, key,
                                                                                              ps.get(key), value))
    print("--explain=json: the servers' and workers' traffic match the formulas; the allreduces they replace are "
          "marked and not counted")


def fp16_run(dmc, src_path, tmp, args, name, stio):
    """(the printed steps (loss, scale, skipped), the saved weights, the output)"""
    path = os.path.join(tmp, "fp16-%s.safetensors" % name)
    out = run(dmc, src_path, tmp, args + ["--save", path])
    return STEP_RE.findall(out), stio.load(path), out


def check_fp16(dmc, src_path, tmp, common, np, stio):
    """fp16's loss scaler with synchronous servers: the allreduce's run, skipped steps and all,
    on the test's batches and on Fashion-MNIST's."""
    scaler = ["--precision", "fp16", "--loss-scale", "2097152", "--loss-scale-interval", "2", "--steps", str(STEPS)]
    cases = [("the test's batches", common), ("Fashion-MNIST", ["--set", "B=128,H=1024"])]
    if os.environ.get("DMC_TEST_QUICK") == "1":
        # the sanitized pass (its unoptimised code takes a minute over the larger MLP); the
        # plain pass runs it
        print("fp16 with synchronous servers on Fashion-MNIST: skipped (DMC_TEST_QUICK=1)")
        cases = cases[:1]
    for data, data_args in cases:
        runs = {}
        for name, mesh in (("allreduce", []), ("servers", ["--param-servers", "2"])):
            runs[name] = fp16_run(dmc, src_path, tmp, data_args + ["--mesh", "data=2"] + mesh + scaler, name, stio)
        (steps, weights, _), (ps_steps, ps_weights, _) = runs["allreduce"], runs["servers"]
        skipped = sum(1 for s in steps if s[2])
        if len(steps) != STEPS or not 0 < skipped < STEPS:
            raise Failure("fp16, %s: expected %d steps, some skipped and some not, got %s" % (data, STEPS, steps))
        if ps_steps != steps:
            raise Failure("fp16, %s: the servers' steps (loss, scale, skipped) %s differ from the allreduce's %s"
                          % (data, ps_steps, steps))
        for name in weights:
            if not np.array_equal(weights[name], ps_weights[name]):
                raise Failure("fp16, %s: the servers' %s differs from the allreduce's" % (data, name))
        print("fp16 with synchronous servers, %s: the allreduce's losses, scales, %d skipped steps and weights, byte "
              "for byte" % (data, skipped))


def check_fp16_asynchronous(dmc, src_path, sgd_path, tmp, common, np, stio):
    """fp16 with asynchronous servers: each worker's scaler, skipped steps pushed without
    gradients."""
    scaler = ["--precision", "fp16", "--loss-scale", "2097152", "--loss-scale-interval", "2", "--steps", str(STEPS)]
    sync_steps, sync_weights, _ = fp16_run(dmc, sgd_path, tmp, common + ["--mesh", "data=2", "--param-servers", "2"]
                                           + scaler, "sgd-sync", stio)
    steps, weights, out = fp16_run(dmc, sgd_path, tmp, common + ["--mesh", "data=2", "--param-servers", "2",
                                                                 "--ps-staleness", "0"] + scaler, "sgd-async0", stio)
    skipped = sum(1 for s in steps if s[2])
    # the scales and skips exactly; the losses to rounding (an update per push)
    same = len(steps) == len(sync_steps) and all(
        s[1:] == t[1:] and abs(float(s[0]) - float(t[0])) <= 1e-3 * abs(float(t[0])) for s, t in zip(steps, sync_steps))
    if not 0 < skipped < STEPS or not same:
        raise Failure("fp16, asynchronous staleness 0: steps %s, expected the synchronous servers' %s with some "
                      "skipped" % (steps, sync_steps))
    for server, _, updates, pushes, _, _, _ in servers_of(out, 2):
        counted = [m.group(1) for m in SKIPPED_RE.finditer(out)]
        if counted != [str(2 * skipped)] * 2 or int(pushes) != 2 * STEPS or int(updates) != 2 * (STEPS - skipped):
            raise Failure("fp16, staleness 0: server %s: %s updates, %s pushes, skipped %s; expected %d, %d, %d"
                          % (server, updates, pushes, counted, 2 * (STEPS - skipped), 2 * STEPS, 2 * skipped))
    test_mlp.check_tensors(np, "fp16, asynchronous servers, staleness 0, SGD", weights,
                           {n: w.astype(np.float64) for n, w in sync_weights.items()}, FP16_WEIGHT_ATOL, 0.0)
    out = run(dmc, src_path, tmp, common + ["--mesh", "data=4", "--param-servers", "3", "--ps-staleness", "1"]
              + scaler[:-1] + [str(3 * STEPS)])
    losses = [float(m[0]) for m in STEP_RE.findall(out)]
    if len(losses) != 3 * STEPS or not all(np.isfinite(losses)):
        raise Failure("fp16, staleness 1: expected %d finite losses, got %s" % (3 * STEPS, losses))
    for (server, _, updates, pushes, _, bound, lead), m in zip(servers_of(out, 3), SKIPPED_RE.finditer(out)):
        gone = int(m.group(1) or 0)
        if bound != "1" or int(lead) > 1 or int(pushes) != 4 * 3 * STEPS or int(updates) + gone != int(pushes) or not gone:
            raise Failure("fp16, staleness 1: server %s: %s updates, %s pushes, %d skipped, lead %s" % (server, updates,
                                                                                                  pushes, gone, lead))
    print("fp16 with asynchronous servers: staleness 0 as the synchronous servers' SGD when the workers skip the same "
          "%d steps (to %g); skipped pushes counted, not applied; bound 1 held on 4 workers" % (skipped, FP16_WEIGHT_ATOL))


def checkpoint_tensors(stio, directory, step):
    """(the tensors, the metadata) of directory's checkpoint of step"""
    path = os.path.join(directory, "step-%08d.safetensors" % step)
    return stio.load(path), stio.load_metadata(path)


def same_tensors(np, label, got, want):
    if sorted(got) != sorted(want):
        raise Failure("%s: tensors %s, expected %s" % (label, sorted(got), sorted(want)))
    for name in want:
        if not np.array_equal(got[name], want[name]):
            raise Failure("%s: %s differs (max |difference| %g)" % (label, name, np.abs(got[name] - want[name]).max()))


def check_checkpoints(dmc, src, sgd_path, tmp, common, sync_weights, np, stio, sgd_final):
    """Checkpoints of the servers' state: synchronous = allreduce, byte for byte; resumed runs
    end where the uninterrupted ones do; asynchronous servers' update counts."""
    half = STEPS // 2
    steps = ["--steps", str(STEPS), "--checkpoint-every", str(half)]
    dirs = {}
    for name, mesh in (("allreduce", []), ("servers", ["--param-servers", "2"])):
        dirs[name] = os.path.join(tmp, "ckpt-" + name)
        run(dmc, src, tmp, common + ["--mesh", "data=2"] + mesh + steps + ["--checkpoint", dirs[name]])
    for step in (half, STEPS):
        (ar, ar_meta), (ps, ps_meta) = (checkpoint_tensors(stio, dirs[n], step) for n in ("allreduce", "servers"))
        if not any(n.endswith(".exp_avg_sq") for n in ps):
            raise Failure("servers' checkpoint of step %d: no optimizer state in %s" % (step, sorted(ps)))
        same_tensors(np, "the servers' checkpoint of step %d against the allreduce's" % step, ps, ar)
        if ps_meta.get("dmc.ps_updates") != str(step) or ps_meta.get("dmc.step") != str(step):
            raise Failure("servers' checkpoint of step %d: dmc.step %s, dmc.ps_updates %s" % (
                step, ps_meta.get("dmc.step"), ps_meta.get("dmc.ps_updates")))
    want = stio.load(sync_weights)
    at = common.index("--init")
    batches = common[:at] + common[at + 2:]  # a resumed run takes its parameters from the checkpoint
    resumed_from = lambda name: ["--resume", os.path.join(dirs[name], "step-%08d.safetensors" % half)]
    for label, mesh, source in (("servers from servers", ["--param-servers", "2"], "servers"),
                                ("3 servers from 2", ["--param-servers", "3"], "servers"),
                                ("servers from allreduce", ["--param-servers", "2"], "allreduce"),
                                ("allreduce from servers", [], "servers")):
        path = os.path.join(tmp, "resumed-%s.safetensors" % label.replace(" ", "-"))
        run(dmc, src, tmp, batches + ["--mesh", "data=2"] + mesh + ["--steps", str(STEPS)] + resumed_from(source) +
            ["--save", path])
        same_tensors(np, "resumed at step %d, %s, against the uninterrupted run" % (half, label), stio.load(path), want)
    print("synchronous servers' checkpoints: the allreduce's tensors byte for byte (parameters, AdamW's state); "
          "resumed on 2 or 3 servers or on the allreduce (and the reverse): the uninterrupted weights, byte for byte")

    # fp16: the loss scaler's state beside the servers'
    scaler = ["--precision", "fp16", "--loss-scale", "2097152", "--loss-scale-interval", "2"]
    fp16_final = os.path.join(tmp, "fp16-allreduce-final.safetensors")
    for name, mesh in (("allreduce", []), ("servers", ["--param-servers", "2"])):
        dirs[name] = os.path.join(tmp, "ckpt-fp16-" + name)
        run(dmc, src, tmp, common + scaler + ["--mesh", "data=2"] + mesh + steps + ["--checkpoint", dirs[name]] +
            (["--save", fp16_final] if name == "allreduce" else []))
    (ar, ar_meta), (ps, ps_meta) = (checkpoint_tensors(stio, dirs[n], half) for n in ("allreduce", "servers"))
    same_tensors(np, "fp16: the servers' checkpoint against the allreduce's", ps, ar)
    scale_keys = [k for k in ar_meta if k.startswith("dmc.loss_scale")]
    skipped = int(ar_meta.get("dmc.loss_scale_skipped", "0"))
    if len(scale_keys) != 4 or any(ps_meta.get(k) != ar_meta[k] for k in scale_keys) or \
            ps_meta.get("dmc.ps_updates") != str(half - skipped) or not skipped:
        raise Failure("fp16: the servers' checkpoint's metadata %s, the allreduce's %s (expected updates: step %d less "
                      "%d skipped)" % (ps_meta, ar_meta, half, skipped))
    # the allreduce's file (no dmc.ps_updates): the servers count on from its step less the skipped
    path = os.path.join(tmp, "fp16-servers-from-allreduce.safetensors")
    run(dmc, src, tmp, batches + scaler + ["--mesh", "data=2", "--param-servers", "2", "--steps", str(STEPS), "--save", path,
                                           "--resume", os.path.join(dirs["allreduce"], "step-%08d.safetensors" % half)])
    same_tensors(np, "fp16: servers resumed from the allreduce's checkpoint (%d skipped) against the allreduce run" % skipped,
                 stio.load(path), stio.load(fp16_final))

    # asynchronous: every push an update, counted on by a resumed run
    async_dir = os.path.join(tmp, "ckpt-async")
    run(dmc, src, tmp, common + ["--mesh", "data=4", "--param-servers", "3", "--ps-staleness", "1", "--steps", "6",
                                 "--checkpoint-every", "2", "--checkpoint", async_dir])
    for step in (2, 4, 6):
        tensors, meta = checkpoint_tensors(stio, async_dir, step)
        if meta.get("dmc.ps_updates") != str(4 * step) or not all(np.isfinite(t).all() for t in tensors.values()):
            raise Failure("asynchronous checkpoint of step %d: dmc.ps_updates %s, expected %d (4 workers' pushes)"
                          % (step, meta.get("dmc.ps_updates"), 4 * step))
    resumed_dir = os.path.join(tmp, "ckpt-async-resumed")
    out = run(dmc, src, tmp, batches + ["--mesh", "data=4", "--param-servers", "3", "--ps-staleness", "1", "--steps", "6",
                                        "--resume", os.path.join(async_dir, "step-%08d.safetensors" % 2),
                                       "--checkpoint", resumed_dir])
    _, meta = checkpoint_tensors(stio, resumed_dir, 6)
    if meta.get("dmc.ps_updates") != "24" or any(int(u) != 16 for _, _, u, _, _, _, _ in servers_of(out, 3)):
        raise Failure("asynchronous servers resumed at step 2: dmc.ps_updates %s (expected 24), reports:\n%s"
                      % (meta.get("dmc.ps_updates"), out))
    # staleness 0, plain SGD: a snapshot holds every push (one missing would be lr x a gradient off)
    sgd_dir = os.path.join(tmp, "ckpt-async0")
    async0 = ["--mesh", "data=2", "--param-servers", "2", "--ps-staleness", "0"]
    run(dmc, sgd_path, tmp, common + async0 + ["--steps", str(half), "--checkpoint", sgd_dir])
    path = os.path.join(tmp, "async0-resumed.safetensors")
    run(dmc, sgd_path, tmp, batches + async0 + ["--steps", str(STEPS), "--save", path,
                                               "--resume", os.path.join(sgd_dir, "step-%08d.safetensors" % half)])
    test_mlp.check_tensors(np, "asynchronous servers, staleness 0, SGD, resumed at step %d" % half, stio.load(path),
                           sgd_final, WEIGHT_ATOL, 0.0)
    print("fp16: the servers' checkpoint is the allreduce's, loss scaler included; asynchronous servers' checkpoints "
          "count every push, a resumed run counts on (24 after 6 steps of 4 workers), and staleness 0 resumed at "
          "step %d ends on PyTorch's SGD weights to %g" % (half, WEIGHT_ATOL))


def check_predict(dmc, src, tmp, weights, np, stio):
    """--predict on servers: the workers' forward of --init's weights, the allreduce program's
    outputs byte for byte."""
    rows = os.path.join(tmp, "predict-rows.safetensors")
    stio.save({"x": np.random.default_rng(9).random((21, 784)).astype(np.float32)}, rows)
    outs = {}
    for name, mesh in (("allreduce", []), ("servers", ["--param-servers", "2"]),
                       ("async", ["--param-servers", "2", "--ps-staleness", "1"])):
        outs[name] = os.path.join(tmp, "predict-%s.safetensors" % name)
        run(dmc, src, tmp, ["--mesh", "data=2"] + mesh + ["--predict", "--init", weights, "--batch-file", rows, "--out",
                                                          outs[name]])
    want = stio.load(outs["allreduce"])
    for name in ("servers", "async"):
        got = stio.load(outs[name])
        if sorted(got) != sorted(want) or any(not np.array_equal(got[k], want[k]) for k in want):
            raise Failure("--predict with %s servers: outputs differ from the allreduce program's" % name)
    print("--predict on synchronous and asynchronous servers: the allreduce program's outputs, byte for byte")


def run_checks(dmc, root, np, torch):
    import stio
    dmcrun.require_target()  # the GPU suite's run (DMC_TEST_TARGET=cuda) needs a GPU
    src_path, src, norm = test_mlp.example(root, "test_param_servers.py")
    with tempfile.TemporaryDirectory(prefix="dmc-ref-ps-") as tmp:
        init, xs, ys, common = test_mlp.write_data(np, torch, tmp)
        check_unused_parameter(dmc, tmp, np, stio)
        check_explain(dmc, src_path)
        sync_weights = check_synchronous(dmc, src_path, tmp, common)
        # the synchronous servers against PyTorch (AdamW, as mlp.dm)
        def adamw(params):
            return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-4)
        _, _, final = test_mlp.torch_run(torch, init, xs, ys, adamw, STEPS, torch.float64, norm)
        test_mlp.check_tensors(np, "synchronous servers vs PyTorch", stio.load(sync_weights), final, WEIGHT_ATOL, 0.0)
        print("synchronous servers: PyTorch's AdamW weights to %g" % WEIGHT_ATOL)

        # asynchronous, staleness 0, plain SGD: the synchronous rule up to rounding
        sgd_path = test_mlp.with_optimizer(src, PLAIN_SGD_LINE, os.path.join(tmp, "sgd"))
        _, _, final = test_mlp.torch_run(torch, init, xs, ys, lambda ps: torch.optim.SGD(ps, lr=0.05), STEPS,
                                         torch.float64, norm)
        for backend in ([], ["--backend", "mpi"]):
            out_path = os.path.join(tmp, "async0%s.safetensors" % ("-mpi" if backend else ""))
            out = run(dmc, sgd_path, tmp, common + backend + ["--mesh", "data=2", "--param-servers", "2",
                                                              "--ps-staleness", "0", "--steps", str(STEPS),
                                                              "--save", out_path])
            for server, _, updates, pushes, mode, bound, lead in servers_of(out, 2):
                if bound != "0" or lead != "0" or int(updates) != 2 * STEPS or int(pushes) != 2 * STEPS:
                    raise Failure("staleness 0: server %s reports %s (%s updates, %s pushes)" % (server, mode,
                                                                                               updates, pushes))
            test_mlp.check_tensors(np, "asynchronous servers, staleness 0, SGD%s" % (" (MPI)" if backend else ""),
                                   stio.load(out_path), final, WEIGHT_ATOL, 0.0)
        print("asynchronous servers, staleness 0: PyTorch's SGD weights to %g (an update per push)" % WEIGHT_ATOL)
        check_checkpoints(dmc, src_path, sgd_path, tmp, common, sync_weights, np, stio, final)
        check_predict(dmc, src_path, tmp, sync_weights, np, stio)

        # asynchronous, bound 1, 4 workers: the bound holds in every server's report
        out = run(dmc, src_path, tmp, common + ["--mesh", "data=4", "--param-servers", "3", "--ps-staleness", "1",
                                                "--steps", str(3 * STEPS)])
        losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", out, re.M)]
        if len(losses) != 3 * STEPS or not all(np.isfinite(losses)):
            raise Failure("staleness 1: expected %d finite losses, got %s" % (3 * STEPS, losses))
        for server, _, updates, pushes, mode, bound, lead in servers_of(out, 3):
            if bound != "1" or int(lead) > 1 or int(updates) != 4 * 3 * STEPS or int(pushes) != 4 * 3 * STEPS:
                raise Failure("staleness 1: server %s reports %s (%s updates, %s pushes)" % (server, mode, updates,
                                                                                           pushes))
        print("asynchronous servers, bound 1: every push an update, workers at most 1 step apart")

        check_fp16(dmc, src_path, tmp, common, np, stio)
        check_fp16_asynchronous(dmc, src_path, sgd_path, tmp, common, np, stio)
        for args, want in [(["--mesh", "data=2,tensor=2", "--param-servers", "1"],
                            "the mesh's axis tensor has size 2: parameter servers serve a mesh of the data axis alone"),
                           (["--mesh", "data=2", "--ps-staleness", "1"], "--ps-staleness bounds the parameter servers'"),
                           (["--mesh", "data=2", "--param-servers", "1", "--steps", "1", "--trace", "t.json"],
                            "--trace (a pipeline's timeline) is not built for parameter servers"),
                           # the file would hold worker 0's part of the gradient, not the step's
                           (["--mesh", "data=2", "--param-servers", "1", "--steps", "1", "--dump-grads", "g.st"],
                            "--dump-grads (the servers sum the workers' gradients) is not built for parameter servers")]:
            args = ["--set", "B=%d,H=%d" % (test_mlp.B, test_mlp.H)] + common + args
            r = subprocess.run([dmc, "run", src_path] + args, cwd=tmp, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
            if r.returncode == 0 or want not in r.stdout:
                raise Failure("dmc run %s: expected a failure saying '%s', got (%d):\n%s" % (" ".join(args), want,
                                                                                            r.returncode, r.stdout))
        print("refused: another mesh axis, --ps-staleness alone, --trace, --dump-grads")
        # --threads reaches the servers' update loops (they took $DMC_THREADS or the cores
        # shared by the ranks: 1 of 2 cores over 3 ranks)
        env = {k: v for k, v in os.environ.items() if k != "DMC_THREADS"}
        args = ["--set", "B=%d,H=%d" % (test_mlp.B, test_mlp.H)] + dmcrun.target_args() + common + [
            "--mesh", "data=2", "--param-servers", "1", "--steps", "1", "--threads", "2"]
        r = subprocess.run([dmc, "run", src_path] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, timeout=240, env=env)
        if r.returncode != 0 or not re.search(r"^server 0 .* waiting for them, on 2 threads$", r.stdout, re.M):
            raise Failure("--threads 2: the server's line does not say 2 threads (%d):\n%s" % (r.returncode, r.stdout))
        print("--threads 2 reaches the servers")
    return "parameter servers: synchronous = allreduce (threads, MPI) = PyTorch; asynchronous within its bound"


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
