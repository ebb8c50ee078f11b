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
    A100), and is refused when compiling (code generation is fp32).
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
    for precision in ("fp32", "bf16"):
        rc, plan, err = explain(dmc, ["--hardware", "a100-80gb-sxm", "--precision", precision, "--set", "B=8", GPT])
        times[precision] = plan["predicted"]["step_seconds"] if rc == 0 else None
    check(times["fp32"] and times["bf16"] and times["bf16"] < times["fp32"] / 2,
          "A100: bf16 step %s s, fp32 %s s" % (times["bf16"], times["fp32"]))
    r = subprocess.run([dmc, "--precision", "bf16", MLP, "-o", os.path.join(tempfile.gettempdir(), "dmc-bf16-out")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    check(r.returncode == 2 and "planning" in r.stderr, "bf16 refused for code generation: %s" % r.stderr.strip())
    print("%d passed, %d failed" % (checks - len(fails), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
