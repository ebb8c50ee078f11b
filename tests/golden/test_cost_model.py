#!/usr/bin/env python3
"""test_cost_model.py DMC: hardware files and the predicted step of `dmc --explain`.

  - every preset (`--hardware list`) loads and names itself in --explain=json's predicted;
  - bad hardware files fail with exit status 2 and a message naming the file and the
    field at fault: not JSON, a missing field, a misspelt one, a negative or zero number,
    an efficiency above 1, a wrong type; a missing file lists the presets;
  - the update of mlp.dm on data=4 is its gradient allreduce priced by the formula on a
    machine where compute and memory are free: one bucket of 2 (n - 1) ring steps, each
    paying the link's latency, and 2 (n - 1) / n x 4 bytes x every parameter at the link's
    bandwidth; on the link within a node when the 4 ranks fit on one, else between nodes;
  - the step is the timed schedule plus the update; the pipeline's bubble is the
    simulated one; tokens per second is samples per second times T for gpt.dm;
  - --precision bf16 times products at the bf16 peak (a faster step than fp32 on an
    A100), and compiles to bf16 products (dmrt_gemm_bf16) on the C target; fp16 on a
    hardware file without an fp16 peak is timed at the bf16 one (the same step); where only
    memory costs, their forward and backward take half the fp32 time (2-byte activations);
  - efficiency.matmul_by_size: mlp.dm's serial forward and backward, on a machine where
    only products cost, is the sum of its products' flops at the curve's efficiency for
    each (interpolated in log flops), computed here from the model's shapes;
    lone_rank: a rank alone on its node runs products on its threads (not so on data=2);
  - device.cache_bytes and cache_bandwidth: mlp.dm's AdamW update on a machine where only
    memory costs is 28 bytes a parameter at the memory's bandwidth, and with a cache holding
    all or a quarter of those bytes, that share at the cache's bandwidth;
  - efficiency.overlap: with one micro-batch the backward pass hides the update's
    reductions but the bucket completed last, min(reductions - last bucket, backward),
    scaled by the overlap; with micro-batches it hides nothing;
  - v @ w of a vector: 2 D D flops and its outer-product gradient 2 D D (model flops 4 D D);
  - ZeRO 3: the step adds each gather's alpha-beta time per micro-batch, and its update
    reduce-scatters (half the allreduce's ring) and all-gathers nothing;
  - gradient accumulation: per micro-batch 12 bytes a parameter (the sum), per step 8 (the
    mean), at the memory's bandwidth; under bf16 the sum is free (Megatron-LM fuses it);
  - --param-servers: --explain's time section says the servers are not priced.
Prints one line per check; exits 1 on any failure.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "examples/mlp.dm")
GPT = os.path.join(ROOT, "examples/gpt.dm")
TINY_GPT = ["--set", "V=64,T=16,C=32,NH=4,L=2,B=8"]

FREE = {"name": "free compute", "device": {"peak_flops": {"fp32": 1e30, "tf32": 1e30, "bf16": 1e30},
                                          "memory_bytes": 1e12, "memory_bandwidth": 1e30},
        "devices_per_node": 4, "intra_node": {"bandwidth": 1e9, "latency": 1e-3},
        "inter_node": {"bandwidth": 1e8, "latency": 1e-2}, "efficiency": {"matmul": 1, "memory": 1, "link": 1}}


def explain(dmc, args):
    r = subprocess.run([dmc, "--explain=json"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def curve_at(curve, flops):
    import math
    if flops <= curve[0][0]:
        return curve[0][1]
    for (f0, e0), (f1, e1) in zip(curve, curve[1:]):
        if flops < f1:
            return e0 + math.log(flops / f0) / math.log(f1 / f0) * (e1 - e0)
    return curve[-1][1]


def mlp_products(batch=128, d=784, h=1024, k=10):
    """mlp.dm's matrix products of one step, as flops each: forward, then per layer the
    weight's gradient and (but for the first) the input's."""
    layers = [(d, h), (h, h), (h, k)]
    forward = [2 * batch * i * o for i, o in layers]
    return forward + forward + forward[1:]


def check_products(dmc, write, check):
    peak = 1e10
    curve = [[1e6, 0.25], [1e8, 0.5], [1e9, 1.0]]
    hw = json.loads(json.dumps(FREE))
    hw["device"]["peak_flops"] = {"fp32": peak, "tf32": peak, "bf16": peak}
    hw["device"]["vector_flops"] = 1e30
    hw["efficiency"]["matmul_by_size"] = curve
    rc, plan, err = explain(dmc, ["--hardware", write("curve.json", hw), MLP])
    want = sum(f / (peak * curve_at(curve, f)) for f in mlp_products())
    got = plan["predicted"]["schedule_seconds"] if rc == 0 else float("nan")
    check(close(got, want, 1e-6), "mlp products at the curve's efficiencies: %.9g s, formula %.9g s" % (got, want))
    hw["devices_per_node"] = 2
    hw["intra_node"] = {"bandwidth": 1e30, "latency": 0}  # the loss's mean over data=2: free
    hw["lone_rank"] = {"threads": 2, "matmul_by_size": [[1, 0.75]]}
    path = write("lone.json", hw)
    rc, plan, err = explain(dmc, ["--hardware", path, MLP])
    want_lone = sum(f / (peak * 2 * 0.75) for f in mlp_products())
    got = plan["predicted"]["schedule_seconds"] if rc == 0 else float("nan")
    check(close(got, want_lone, 1e-6), "lone rank: products on 2 threads at 0.75: %.9g s, formula %.9g s" % (got, want_lone))
    rc, plan, err = explain(dmc, ["--hardware", path, "--mesh", "data=2", MLP])
    want_data = sum(f / 2 / (peak * curve_at(curve, f / 2)) for f in mlp_products())
    got = plan["predicted"]["schedule_seconds"] if rc == 0 else float("nan")
    check(close(got, want_data, 1e-6), "data=2: each rank's half-batch products on its own device: %.9g s, formula %.9g s"
          % (got, want_data))


def check_overlap(dmc, write, check):
    hw = json.loads(json.dumps(FREE))
    peak = 1e10
    hw["device"]["peak_flops"] = {"fp32": peak, "tf32": peak, "bf16": peak}
    hw["device"]["vector_flops"] = 1e30
    plans = {}
    for overlap in (0, 0.5):
        hw["efficiency"]["overlap"] = overlap
        path = write("overlap%s.json" % overlap, hw)
        for micro in ("1", "2"):
            rc, plan, err = explain(dmc, ["--hardware", path, "--mesh", "data=4", "--bucket-mb", "1", "--microbatches", micro, MLP])
            plans[overlap, micro] = plan if rc == 0 else None
    if None in plans.values():
        check(False, "explain with overlap")
        return
    exposed = plans[0, "1"]["predicted"]["update_seconds"]
    reduced = 4 * sum(p["elements"] for p in plans[0, "1"]["params"])
    last = exposed * min(1.0, 1024 * 1024 / reduced)
    backward = plans[0, "1"]["pipeline"]["stage"][0]["backward_seconds"] if plans[0, "1"].get("pipeline") else None
    if backward is None:
        backward = sum(f / 4 / peak for f in mlp_products()[3:])
    want = exposed - 0.5 * min(exposed - last, backward)
    got = plans[0.5, "1"]["predicted"]["update_seconds"]
    check(close(got, want, 1e-6) and got < exposed,
          "overlap 0.5, one micro-batch: update %.9g s, formula %.9g s (%.9g s without overlap)" % (got, want, exposed))
    check(close(plans[0.5, "2"]["predicted"]["update_seconds"], plans[0, "2"]["predicted"]["update_seconds"]),
          "overlap with micro-batches: nothing hidden")


def check_cache(dmc, write, check):
    """mlp.dm's AdamW update where only memory costs: 28 bytes a parameter (its parameter,
    gradient and two moments read, all but the gradient written back), at the memory's
    bandwidth without a cache; with one, the share of those bytes the cache holds (its bytes
    over theirs, at most 1) at the cache's bandwidth and the rest at the memory's."""
    hw = json.loads(json.dumps(FREE))
    hw["device"].update(memory_bandwidth=1e9, vector_flops=1e30)
    hw["intra_node"] = hw["inter_node"] = {"bandwidth": 1e30, "latency": 0}
    rc, plan, err = explain(dmc, ["--hardware", write("memory.json", hw), MLP])
    if rc:
        check(False, "explain on a memory-only machine: %s" % err)
        return
    params = sum(p["elements"] for p in plan["params"])
    working = 28.0 * params
    got = plan["predicted"]["update_seconds"]
    check(close(got, working / 1e9), "AdamW update without a cache: %.9g s, 28 B x %d / bandwidth %.9g s" % (got, params, working / 1e9))
    for share in (1.0, 0.25):
        hw["device"].update(cache_bytes=share * working * (2 if share == 1 else 1), cache_bandwidth=4e9)
        rc, plan, err = explain(dmc, ["--hardware", write("cache%s.json" % share, hw), MLP])
        want = (1 - share) * working / 1e9 + share * working / 4e9
        got = plan["predicted"]["update_seconds"] if rc == 0 else None
        check(got is not None and close(got, want), "AdamW update, %.0f%% of it in cache: %s s, formula %.9g s" %
              (100 * share, got, want))


VECTOR_MATMUL = """dim D = 48
input v : f32[D]
param w : f32[D, D] = xavier
loss = sum(v @ w)
minimize loss
optimizer sgd(lr = 0.1)
"""


def check_vector_matmul(dmc, write, check):
    """v @ w of a vector v [D]: the product sums over D, 2 D D flops; its weight gradient
    v^T dy is an outer product (one row summed), 2 D D more. The model flops are 4 D D, and
    on a machine where only products cost (at 1e10 flop/s) the schedule their time (the
    summed dim used to be read at shape[-1]: garbage, and UBSan's error)."""
    d = 48
    hw = json.loads(json.dumps(FREE))
    hw["device"]["peak_flops"] = {"fp32": 1e10, "tf32": 1e10, "bf16": 1e10}
    hw["device"]["vector_flops"] = 1e30
    rc, plan, err = explain(dmc, ["--hardware", write("vm.json", hw), write("vm.dm", VECTOR_MATMUL)])
    got = plan["predicted"]["model_flops_per_device"] if rc == 0 else float("nan")
    check(close(got, 2 * d * d + 2 * d * d), "v @ w, D=%d: model flops %s, formula 2 D D forward + 2 D D gradient = %d"
          % (d, got, 4 * d * d))
    got = plan["predicted"]["schedule_seconds"] if rc == 0 else float("nan")
    check(close(got, 4 * d * d / 1e10), "v @ w: products' time %s s, formula 4 D D / 1e10 = %.9g s" % (got, 4 * d * d / 1e10))


def check_zero3(dmc, write, check):
    """ZeRO 3 on mlp.dm over data=4 (--bucket-mb 1), compute and memory free, overlap 0: the
    step is ZeRO 0's schedule plus each forward and backward gather (--explain=json's
    zero.collectives, once per micro-batch) at n - 1 link latencies and its sent bytes over
    the bandwidth, and an update that reduce-scatters each bucket (n - 1 steps a bucket,
    (n - 1)/n x 4 bytes x its elements) and all-gathers nothing."""
    hw = json.loads(json.dumps(FREE))
    path = write("zero3.json", hw)
    n, lat, bw = 4, hw["intra_node"]["latency"], hw["intra_node"]["bandwidth"]
    for micro in (1, 2):
        base = ["--hardware", path, "--mesh", "data=4", "--bucket-mb", "1", "--microbatches", str(micro), MLP]
        rc0, plan0, err0 = explain(dmc, base + ["--zero", "0"])
        rc3, plan3, err3 = explain(dmc, base + ["--zero", "3"])
        if rc0 or rc3:
            check(False, "zero 3 explain: %s %s" % (err0, err3))
            return
        gathers = [c for c in plan3["zero"]["collectives"] if c["phase"] != "update"]
        gather_s = micro * sum((n - 1) * lat + c["sent_bytes_per_rank"] / bw for c in gathers)
        reduced = 4.0 * sum(p["elements"] for p in plan3["params"])
        buckets = -(-reduced // (1024 * 1024))
        update = buckets * (n - 1) * lat + (n - 1) / n * reduced / bw
        p0, p3 = plan0["predicted"], plan3["predicted"]
        check(len(gathers) > 0 and close(p3["schedule_seconds"], p0["schedule_seconds"] + gather_s),
              "zero 3, M=%d: forward and backward %.9g s, ZeRO 0's %.9g s + %d gathers x M = %.9g s" %
              (micro, p3["schedule_seconds"], p0["schedule_seconds"], len(gathers), p0["schedule_seconds"] + gather_s))
        check(close(p3["update_seconds"], update) and p3["update_seconds"] < p0["update_seconds"],
              "zero 3, M=%d: update %.9g s, reduce-scatters only %.9g s (ZeRO 0's allreduces %.9g s)" %
              (micro, p3["update_seconds"], update, p0["update_seconds"]))


def check_accumulation(dmc, write, check):
    """Gradient accumulation where only memory costs (1e9 B/s): mlp.dm with 4 micro-batches of
    32 takes 4 x one micro-batch of 32's forward and backward plus, per micro-batch, its
    biases' gradients added into the step's sum (12 bytes x P_b, P_b the bias elements: a
    weight's gradient is a product, x^T dy, that makes the sum itself, beta 1), and an update
    of the same plus the mean of the sums (8 bytes x P, every parameter). Under bf16 the
    bias sums are free too, as in Megatron-LM's fused accumulation; the mean stays."""
    hw = json.loads(json.dumps(FREE))
    hw["device"].update(memory_bandwidth=1e9, vector_flops=1e30)
    hw["intra_node"] = hw["inter_node"] = {"bandwidth": 1e30, "latency": 0}
    path = write("accumulate.json", hw)
    for precision, sum_bytes in (("fp32", 12), ("bf16", 0)):
        rc1, one, err1 = explain(dmc, ["--hardware", path, "--precision", precision, "--set", "B=32", MLP])
        rc4, four, err4 = explain(dmc, ["--hardware", path, "--precision", precision, "--set", "B=128",
                                        "--microbatches", "4", MLP])
        if rc1 or rc4:
            check(False, "accumulation explain: %s %s" % (err1, err4))
            return
        params = sum(p["elements"] for p in one["params"])
        biases = sum(p["elements"] for p in one["params"] if p["type"].count(",") == 0)
        if not 0 < biases < params:
            check(False, "accumulation: mlp.dm's biases %d of %d parameter elements" % (biases, params))
            return
        want_s = 4 * one["predicted"]["schedule_seconds"] + 4 * sum_bytes * biases / 1e9
        want_u = one["predicted"]["update_seconds"] + 8 * params / 1e9
        got_s, got_u = four["predicted"]["schedule_seconds"], four["predicted"]["update_seconds"]
        check(close(got_s, want_s) and close(got_u, want_u),
              "%s, 4 micro-batches: forward and backward %.9g s, formula 4 x %.9g + 4 x %d B x %d bias elements / 1e9 = %.9g s; "
              "update %.9g s, formula + 8 B x P / 1e9 = %.9g s" % (precision, got_s, one["predicted"]["schedule_seconds"],
                                                                   sum_bytes, biases, want_s, got_u, want_u))


def check_param_servers_caveat(dmc, check):
    """--param-servers: the time section says the servers are not priced (once), the JSON too."""
    r = subprocess.run([dmc, "--explain", "--mesh", "data=2", "--param-servers", "2", MLP], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    plain = subprocess.run([dmc, "--explain", "--mesh", "data=2", MLP], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
    section = r.stdout.split("predicted step", 1)[-1].split("\n\n", 1)[0]
    rc, plan, err = explain(dmc, ["--mesh", "data=2", "--param-servers", "2", MLP])
    check(r.returncode == 0 and section.count("not priced: the 2 parameter servers") == 1 and
          "not priced" not in plain.stdout and plan["predicted"].get("param_servers_priced") is False,
          "parameter servers: a caveat in the predicted step's section and the JSON")


def main(argv):
    dmc = argv[1]
    fails, checks = [], 0

    def check(ok, what):
        nonlocal checks
        checks += 1
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            fails.append(what)

    names = [l for l in subprocess.run([dmc, "--hardware", "list"], stdout=subprocess.PIPE,
                                       universal_newlines=True).stdout.splitlines() if l and not l.startswith(" ")]
    check(set(names) >= {"nominal", "cpu-2core", "a100-80gb-sxm", "h100-80gb-sxm"}, "presets listed: %s" % names)
    for name in names:
        rc, plan, err = explain(dmc, ["--hardware", name, MLP])
        check(rc == 0 and plan["predicted"]["hardware"] == name and plan["predicted"]["step_seconds"] > 0,
              "preset %s loads and times a step" % name)

    with tempfile.TemporaryDirectory(prefix="dmc-cost-") as tmp:
        def write(name, value):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(value if isinstance(value, str) else json.dumps(value))
            return path

        def broken(change):
            hw = json.loads(json.dumps(FREE))
            change(hw)
            return hw

        bad = [
            ("not JSON", "{\"name\": ", "not JSON"),
            ("missing", broken(lambda h: h["device"].pop("memory_bandwidth")), "missing field 'device.memory_bandwidth'"),
            ("misspelt", broken(lambda h: h["intra_node"].update(latncy=1)), "unknown field 'intra_node.latncy'"),
            ("negative", broken(lambda h: h["device"]["peak_flops"].update(bf16=-1)),
             "field 'device.peak_flops.bf16' must be a number above 0"),
            ("zero bandwidth", broken(lambda h: h["inter_node"].update(bandwidth=0)),
             "field 'inter_node.bandwidth' must be a number above 0"),
            ("efficiency", broken(lambda h: h["efficiency"].update(link=1.5)), "field 'efficiency.link' must be a number in (0, 1]"),
            ("type", broken(lambda h: h.update(devices_per_node="8")), "field 'devices_per_node' must be an integer"),
            ("curve order", broken(lambda h: h["efficiency"].update(matmul_by_size=[[1e6, 0.5], [1e5, 0.6]])),
             "field 'efficiency.matmul_by_size[1]': flops must ascend"),
            ("curve value", broken(lambda h: h["efficiency"].update(matmul_by_size=[[1e6, 1.5]])),
             "field 'efficiency.matmul_by_size[0]' must be [flops above 0, efficiency in (0, 1]]"),
            ("overlap", broken(lambda h: h["efficiency"].update(overlap=2)), "field 'efficiency.overlap' must be a number in"),
            ("lone rank", broken(lambda h: h.update(lone_rank={"threads": 2})), "missing field 'lone_rank.matmul_by_size'"),
            ("overhead", broken(lambda h: h.update(kernel_overhead=-1)), "field 'kernel_overhead' must be a number in"),
            ("cache alone", broken(lambda h: h["device"].update(cache_bytes=1e6)),
             "field 'device.cache_bytes' is given without 'device.cache_bandwidth'"),
            ("cache bandwidth", broken(lambda h: h["device"].update(cache_bytes=1e6, cache_bandwidth=0)),
             "field 'device.cache_bandwidth' must be a number above 0"),
        ]
        for what, content, message in bad:
            path = write(what.replace(" ", "_") + ".json", content)
            r = subprocess.run([dmc, "--explain", "--hardware", path, MLP], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True)
            check(r.returncode == 2 and path in r.stderr and message in r.stderr,
                  "bad file (%s): exit %d, %s" % (what, r.returncode, r.stderr.strip()))
        r = subprocess.run([dmc, "--explain", "--hardware", os.path.join(tmp, "none.json"), MLP], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
        check(r.returncode == 2 and "a100-80gb-sxm" in r.stderr, "missing file names the presets: %s" % r.stderr.strip())

        # the gradient allreduce of mlp.dm over data=4, priced by formula
        for per_node, link in ((4, "intra_node"), (2, "inter_node")):
            hw = json.loads(json.dumps(FREE))
            hw["devices_per_node"] = per_node
            path = write("free%d.json" % per_node, hw)
            rc, plan, err = explain(dmc, ["--hardware", path, "--mesh", "data=4", MLP])
            if rc:
                check(False, "explain on %s: %s" % (path, err))
                continue
            params = sum(p["elements"] for p in plan["params"])
            n = 4
            buckets = -(-4 * params // (25 * 1024 * 1024))
            want = buckets * 2 * (n - 1) * hw[link]["latency"] + 2 * (n - 1) / n * 4 * params / hw[link]["bandwidth"]
            got = plan["predicted"]["update_seconds"]
            check(close(got, want, 1e-6), "mlp data=4 update over the %s link: %.9g s, formula %.9g s" % (link, got, want))

        check_products(dmc, write, check)
        check_overlap(dmc, write, check)
        check_cache(dmc, write, check)
        check_vector_matmul(dmc, write, check)
        check_zero3(dmc, write, check)
        check_accumulation(dmc, write, check)
    check_param_servers_caveat(dmc, check)

    rc, plan, err = explain(dmc, ["--mesh", "pipeline=2", "--microbatches", "4", MLP])
    p = plan["predicted"]
    check(close(p["step_seconds"], p["schedule_seconds"] + p["update_seconds"]) and
          close(p["bubble"], plan["pipeline"]["bubble_simulated"]) and
          close(p["schedule_seconds"], plan["pipeline"]["step_seconds_simulated"]),
          "pipeline: step = schedule + update, the simulated bubble")
    rc, plan, err = explain(dmc, TINY_GPT + [GPT])
    p = plan["predicted"]
    check(close(p["tokens_per_second"], p["samples_per_second"] * 16), "gpt: tokens/s = samples/s x T")
    times = {}
    for precision in ("fp32", "bf16", "fp16"):
        rc, plan, err = explain(dmc, ["--hardware", "a100-80gb-sxm", "--precision", precision, "--set", "B=8", GPT])
        times[precision] = plan["predicted"]["step_seconds"] if rc == 0 else None
    check(times["fp32"] and times["bf16"] and times["bf16"] < times["fp32"] / 2,
          "A100: bf16 step %s s, fp32 %s s" % (times["bf16"], times["fp32"]))
    check(times["fp16"] == times["bf16"], "A100 (no fp16 peak in the preset): fp16 step %s s, bf16 %s s"
          % (times["fp16"], times["bf16"]))
    with tempfile.TemporaryDirectory(prefix="dmc-bf16-") as out:
        r = subprocess.run([dmc, "--precision", "bf16", MLP, "-o", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        source = open(os.path.join(out, "mlp.c")).read() if r.returncode == 0 else ""
    check(r.returncode == 0 and "dmrt_gemm_bf16" in source, "bf16 compiles to bf16 products: %s" % r.stderr.strip())
    memory_only = json.loads(json.dumps(FREE))
    memory_only["device"]["memory_bandwidth"] = 1e9
    with tempfile.TemporaryDirectory(prefix="dmc-cost-") as tmp:
        path = os.path.join(tmp, "memory.json")
        with open(path, "w") as f:
            json.dump(memory_only, f)
        sched = {}
        for precision in ("fp32", "bf16"):
            rc, plan, err = explain(dmc, ["--hardware", path, "--precision", precision, MLP])
            sched[precision] = plan["predicted"]["schedule_seconds"] if rc == 0 else None
        check(sched["fp32"] and sched["bf16"] and close(sched["bf16"], sched["fp32"] / 2),
              "memory-bound mlp: bf16 forward and backward %s s, half of fp32's %s s" % (sched["bf16"], sched["fp32"]))
    print("%d passed, %d failed" % (checks - len(fails), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
