#!/usr/bin/env python3
"""test_calibrate.py DMC [--mpi]: `dmc calibrate --quick` (docs/calibrate.md).

For the threads backend (and MPI with --mpi):
  - the file is JSON with every field of a hardware description, every number positive
    and within a plausible range for a CPU, devices_per_node the online cores and
    memory_bytes the physical memory shared among them;
  - every figure is recomputed from the raw tables under "measured" by its formula: the
    peak is the best sgemm flop/s, each size curve point a shape's flop/s over the peak
    (1 x the peak for every-core-busy shapes, threads x the peak for the lone rank; shapes
    of equal flops averaged), the memory bandwidth a copy's read and written bytes over its
    time, vector flops 2 per element of the axpy, the kernel overhead the 16-float kernel,
    the cache bytes the last-level cache in sysfs over the cores and the cache bandwidth
    3 floats an element of the in-cache axpy (arrays filling half a core's share) over its
    time;
  - the alpha-beta fits are recomputed with numpy (least squares on relative errors, a
    ring allreduce's 2 (n - 1) messages and 2 (n - 1) / n S bytes, a message's 1 and S;
    alpha = 0 refits when negative) and match the file's within 1%; intra_node is the fit
    the rule chooses (the smaller worst relative error over both tables); inter_node is a
    copy of it; the fitted link predicts the largest message within a factor 4;
  - an independent measurement: numpy's float32 matmul (the same OpenBLAS, one thread,
    every core busy) and numpy's copy land within a factor of what calibrate wrote;
  - `dmc --explain --hardware FILE` accepts the file; fields this dmc's parser does not
    know yet (the calibrate-only ones: "measured", device.vector_flops,
    efficiency.matmul_by_size, kernel_overhead, lone_rank) are removed first, one at a time
    as the parser names them, and the removals are printed;
  - standard output without -o, no temporary file left, and usage errors exit 2.
Prints one line per check; exits 1 on any failure.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:         # the fits are recomputed with numpy: skipped without it
    print("numpy not found (Debian: python3-numpy): skipped")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "examples/mlp.dm")
# fields dmc calibrate writes that the hardware parser may not know yet
NEWER_FIELDS = {"measured": ("measured",), "device.vector_flops": ("device", "vector_flops"),
                "efficiency.matmul_by_size": ("efficiency", "matmul_by_size"),
                "kernel_overhead": ("kernel_overhead",), "lone_rank": ("lone_rank",)}

# the numpy side of the independent measurement, run in one process per core at once
NUMPY_PROBE = r"""
import json, sys, time
import numpy as np
n, copy_bytes = 512, 64 << 20
a = np.full((n, n), 0.01, np.float32); b = np.full((n, n), 0.02, np.float32); c = np.empty((n, n), np.float32)
src = np.ones(copy_bytes // 4, np.float32); dst = np.zeros_like(src)
sys.stdin.readline()     # start together
def best(f, reps, runs=5):
    f(); out = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(reps): f()
        out = min(out, (time.perf_counter() - t) / reps)
    return out
t_mm = best(lambda: np.matmul(a, b, out=c), 8)
t_copy = best(lambda: np.copyto(dst, src), 2)
print(json.dumps({"gemm_flops": 2.0 * n ** 3 / t_mm, "copy_bandwidth": 2.0 * copy_bytes / t_copy}))
"""


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def fit(messages, sent, seconds):
    """alpha-beta by least squares on relative errors, as runtime/calibrate_links.c fits."""
    m, s, t = (np.asarray(x, float) for x in (messages, sent, seconds))
    a = np.stack([m / t, s / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(s / t) / np.sum((s / t) ** 2))
    return float(alpha), float(beta)


def terms(table, kind, ranks):
    size = [row["bytes"] for row in table]
    if kind == "allreduce":
        return [2.0 * (ranks - 1)] * len(size), [2.0 * (ranks - 1) / ranks * b for b in size]
    return [1.0] * len(size), [float(b) for b in size]


def worst_error(alpha, beta, table, kind, ranks):
    m, s = terms(table, kind, ranks)
    return max(abs(alpha * mi + beta * si - row["seconds"]) / row["seconds"] for mi, si, row in zip(m, s, table))


def curve(rows, peak):
    """[[flops, efficiency]] from a gemm table: equal flops averaged, at most 1."""
    by = {}
    for r in rows:
        by.setdefault(r["flops"], []).append(r["flops"] / r["seconds"] / peak)
    return [[f, min(1.0, sum(e) / len(e))] for f, e in sorted(by.items())]


def numbers(v, path=""):
    if isinstance(v, bool):
        return
    if isinstance(v, (int, float)):
        yield path, v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from numbers(x, path + "." + k if path else k)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from numbers(x, "%s[%d]" % (path, i))


def explain_accepts(dmc, hw, tmp, check, what):
    """--explain with hw, removing the newer fields the parser names as unknown."""
    hw = json.loads(json.dumps(hw))
    removed = []
    for _ in range(len(NEWER_FIELDS) + 1):
        path = os.path.join(tmp, "explain.json")
        with open(path, "w") as f:
            json.dump(hw, f)
        r = subprocess.run([dmc, "--explain=json", "--hardware", path, MLP], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
        unknown = [name for name in NEWER_FIELDS if "unknown field '%s'" % name in r.stderr]
        if r.returncode == 0 or not unknown:
            break
        keys = NEWER_FIELDS[unknown[0]]
        parent = hw
        for k in keys[:-1]:
            parent = parent[k]
        del parent[keys[-1]]
        removed.append(unknown[0])
    if removed:
        print("note: this dmc's parser does not know %s yet: removed for --explain" % ", ".join(removed))
    plan = json.loads(r.stdout) if r.returncode == 0 else None
    check(plan is not None and plan["predicted"]["hardware"] == hw["name"] and plan["predicted"]["step_seconds"] > 0,
          "%s: dmc --explain --hardware accepts the file%s (%s)" % (
              what, " without " + ", ".join(removed) if removed else " as written",
              "step %.3g s" % plan["predicted"]["step_seconds"] if plan else r.stderr.strip()[-300:]))


def independent(cores):
    """numpy's own sgemm and copy rates, one single-threaded process per core at once."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", NUMPY_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              universal_newlines=True, env=env) for _ in range(cores)]
    time.sleep(0.5)     # every one has its arrays before they start
    outs = [p.communicate("go\n")[0] for p in procs]
    got = [json.loads(o) for o in outs if o.strip()]
    if len(got) != cores:
        return None
    return {k: float(np.median([g[k] for g in got])) for k in got[0]}


def last_level_cache():
    """The largest cache of cpu0 in sysfs, in bytes (0 when unknown), read as calibrate reads it."""
    best = 0
    for index in range(8):
        try:
            with open("/sys/devices/system/cpu/cpu0/cache/index%d/size" % index) as f:
                text = f.read().strip()
        except OSError:
            continue
        digits = text.rstrip("KM")
        if digits.isdigit():
            best = max(best, int(digits) << (10 if text.endswith("K") else 20 if text.endswith("M") else 0))
    return best


def check_file(dmc, hw, backend, tmp, check, timing):
    what = backend
    need = [("name",), ("notes",), ("device", "peak_flops", "fp32"), ("device", "peak_flops", "tf32"),
            ("device", "peak_flops", "bf16"), ("device", "memory_bytes"), ("device", "memory_bandwidth"),
            ("device", "vector_flops"), ("devices_per_node",), ("intra_node", "bandwidth"), ("intra_node", "latency"),
            ("inter_node", "bandwidth"), ("inter_node", "latency"), ("efficiency", "matmul"), ("efficiency", "memory"),
            ("efficiency", "link"), ("efficiency", "matmul_by_size"), ("kernel_overhead",), ("lone_rank", "threads"),
            ("lone_rank", "matmul_by_size"), ("measured", "gemm"), ("measured", "lone_rank_gemm"),
            ("measured", "copy"), ("measured", "vector"), ("measured", "kernel"), ("measured", "links")]
    missing = []
    for keys in need:
        v = hw
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if v is None:
            missing.append(".".join(keys))
    check(not missing, "%s: every field present%s" % (what, ": missing " + ", ".join(missing) if missing else ""))
    if missing:
        return
    # latencies may be 0 (a fit's alpha clamped there), and the other work; all else is above 0
    bad = [(p, x) for p, x in numbers(hw)
           if not (math.isfinite(x) and (x > 0 or (x == 0 and p.endswith(("latency", "busy_cores_before")))))]
    check(not bad, "%s: every number positive and finite%s" % (what, ": %s" % bad[:5] if bad else ""))
    m = hw["measured"]
    dev = hw["device"]
    cores = os.sysconf("SC_NPROCESSORS_ONLN")
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    T = hw["devices_per_node"]
    check(T == cores and hw["lone_rank"]["threads"] == cores and m["cores"] == cores,
          "%s: devices_per_node = lone_rank.threads = %d online cores" % (what, cores))
    check(rel(dev["memory_bytes"], memory / cores) < 0.01, "%s: memory_bytes %d = physical memory / cores (%d)"
          % (what, dev["memory_bytes"], memory // cores))

    # plausible for a CPU core (flop/s, B/s, s)
    plausible = [("device.peak_flops.fp32", dev["peak_flops"]["fp32"], 1e8, 1e13),
                 ("device.memory_bandwidth", dev["memory_bandwidth"], 1e8, 1e12),
                 ("device.vector_flops", dev["vector_flops"], 1e8, 1e12),
                 ("kernel_overhead", hw["kernel_overhead"], 1e-10, 1e-5),
                 ("intra_node.bandwidth", hw["intra_node"]["bandwidth"], 1e7, 1e12),
                 ("intra_node.latency", hw["intra_node"]["latency"], 0, 1e-3)]
    for name, x, lo, hi in plausible:
        check(lo <= x <= hi, "%s: %s = %.4g is in [%g, %g]" % (what, name, x, lo, hi))

    # compute figures from the raw tables
    gemm, lone = m["gemm"], m["lone_rank_gemm"]
    check(all(r["flops"] == 2 * r["m"] * r["n"] * r["k"] for r in gemm + lone) and len(gemm) >= 6
          and [(r["m"], r["n"], r["k"]) for r in gemm] == [(r["m"], r["n"], r["k"]) for r in lone],
          "%s: %d sgemm shapes, flops = 2 m n k, the same shapes for the lone rank" % (what, len(gemm)))
    peak = max(r["flops"] / r["seconds"] for r in gemm)
    check(all(rel(dev["peak_flops"][p], peak) < 1e-4 for p in ("fp32", "tf32", "bf16")),
          "%s: peak_flops = the best sgemm flop/s, %.4g (fp32 %.4g)" % (what, peak, dev["peak_flops"]["fp32"]))
    for name, rows, got, scale in (("efficiency.matmul_by_size", gemm, hw["efficiency"]["matmul_by_size"], 1),
                                   ("lone_rank.matmul_by_size", lone, hw["lone_rank"]["matmul_by_size"], T)):
        want = curve(rows, peak * scale)
        flops = [p[0] for p in got]
        check(flops == sorted(set(flops)), "%s: %s strictly ascending in flops" % (what, name))
        ok = len(got) == len(want) and all(g[0] == w[0] and rel(g[1], w[1]) < 0.01 and 0 < g[1] <= 1
                                           for g, w in zip(got, want))
        check(ok, "%s: %s = flop/s / (%s peak) per size, within 1%%" % (what, name, "%d x" % scale if scale > 1 else "the"))
    by_size = hw["efficiency"]["matmul_by_size"]
    check(rel(hw["efficiency"]["matmul"], by_size[-1][1]) < 1e-6,
          "%s: efficiency.matmul %.4g = the largest size's" % (what, hw["efficiency"]["matmul"]))
    check(hw["efficiency"]["memory"] == 1 and hw["efficiency"]["link"] == 1, "%s: memory and link efficiency 1" % what)
    copy = m["copy"]
    check(copy["bytes"] >= 32 << 20 and rel(dev["memory_bandwidth"], 2 * copy["bytes"] / copy["seconds"]) < 1e-4,
          "%s: memory_bandwidth = 2 x %d MiB / copy seconds" % (what, copy["bytes"] >> 20))
    vec = m["vector"]
    check(vec["elements"] == 65536 and rel(dev["vector_flops"], 2 * vec["elements"] / vec["seconds"]) < 1e-4,
          "%s: vector_flops = 2 x 65536 / axpy seconds" % what)
    llc = last_level_cache()
    if llc:
        cache = m.get("cache", {})
        elements = llc // T // 2 // 8
        check(cache.get("last_level_bytes") == llc and cache.get("elements") == elements and
              dev.get("cache_bytes") == llc // T and
              rel(dev.get("cache_bandwidth", 0), 12 * elements / cache.get("seconds", 1e30)) < 1e-4,
              "%s: cache_bytes = the %d KiB last-level cache (sysfs) / %d cores, cache_bandwidth = 3 x 4 B x %d "
              "/ in-cache axpy seconds" % (what, llc >> 10, T, elements))
    else:
        check("cache" not in m and "cache_bytes" not in dev, "%s: no last-level cache in sysfs, none written" % what)
    check(m["kernel"]["elements"] == 16 and rel(hw["kernel_overhead"], m["kernel"]["seconds"]) < 1e-4,
          "%s: kernel_overhead = the 16-float kernel's seconds (%.3g ns)" % (what, hw["kernel_overhead"] * 1e9))

    # links
    links = m["links"]
    ranks = links["ranks"]
    check(links["backend"] == backend and ranks == 2, "%s: links measured with the %s backend on %d ranks"
          % (what, links["backend"], ranks))
    sizes = [row["bytes"] for row in links["sendrecv"]]
    check(sizes == [row["bytes"] for row in links["allreduce"]] and len(sizes) >= 4 and sizes[0] == 1024
          and all(b == a * 16 for a, b in zip(sizes, sizes[1:])),
          "%s: allreduce and send/recv of %s bytes (--quick: powers of 16)" % (what, sizes))
    fits, errors = {}, {}
    for kind, other in (("allreduce", "sendrecv"), ("sendrecv", "allreduce")):
        alpha, beta = fit(*terms(links[kind], kind, ranks), [row["seconds"] for row in links[kind]])
        fits[kind] = (alpha, beta)
        written = links["fits"][kind]
        lat_ok = rel(written["latency"], alpha) < 0.01 or abs(written["latency"] - alpha) < 1e-9
        check(lat_ok and rel(written["bandwidth"], 1 / beta) < 0.01,
              "%s: %s fit recomputed: latency %.4g s (file %.4g), bandwidth %.4g B/s (file %.4g)"
              % (what, kind, alpha, written["latency"], 1 / beta, written["bandwidth"]))
        errors[kind] = max(worst_error(alpha, beta, links[kind], kind, ranks),
                           worst_error(alpha, beta, links[other], other, ranks))
    choice = "allreduce" if errors["allreduce"] < errors["sendrecv"] else "sendrecv"
    alpha, beta = fits[choice]
    check(links["intra_node"] == choice and rel(hw["intra_node"]["latency"] + 1e-30, alpha + 1e-30) < 0.01
          and rel(hw["intra_node"]["bandwidth"], 1 / beta) < 0.01,
          "%s: intra_node is the %s fit (worst relative error over both tables: allreduce fit %.3g, send/recv fit %.3g)"
          % (what, choice, errors["allreduce"], errors["sendrecv"]))
    check(hw["inter_node"] == hw["intra_node"], "%s: inter_node copies intra_node" % what)
    # its own table's largest message within a factor 4 (a 2 ms run on a loaded 2-core
    # machine can be 3 times slow; the 256 KiB one, a fraction of a millisecond, was once 5
    # times slow under ASan with MPI on a loaded machine: printed, not checked); how it prices
    # the other kind (one link prices both) is a modelling question, printed, not checked
    # (under ASan the two kinds' copies slow down unequally)
    for kind, factor in ((choice, 4.0), ("sendrecv" if choice == "allreduce" else "allreduce", None)):
        m_, s_ = terms(links[kind], kind, ranks)
        ratios = ["%.2f" % ((alpha * mi + beta * si) / row["seconds"])
                  for mi, si, row in zip(m_, s_, links[kind]) if row["bytes"] >= 256 << 10]
        print("note %s: the intra_node link prices %s of 256 KiB and more at %s of the measured" %
              (what, kind, ", ".join(ratios)))
        if factor is not None:
            timing(ratios and 1 / factor <= float(ratios[-1]) <= factor,
                  "%s: the intra_node link predicts %s's largest message (%d bytes) within a factor %g (predicted / "
                  "measured: %s)" % (what, kind, links[kind][-1]["bytes"], factor, ratios[-1] if ratios else "none"))

    # independent measurement
    probe = independent(cores)
    if probe is None:
        check(False, "%s: numpy's probe ran" % what)
    else:
        mine = next(r for r in gemm if (r["m"], r["n"], r["k"]) == (512, 512, 512))
        ratio = mine["flops"] / mine["seconds"] / probe["gemm_flops"]
        timing(1 / 2.5 <= ratio <= 2.5, "%s: sgemm 512^3 %.4g flop/s per core, numpy's matmul %.4g (ratio %.2f, within 2.5)"
              % (what, mine["flops"] / mine["seconds"], probe["gemm_flops"], ratio))
        ratio = dev["memory_bandwidth"] / probe["copy_bandwidth"]
        timing(1 / 3 <= ratio <= 3, "%s: memory bandwidth %.4g B/s per core, numpy's copy %.4g (ratio %.2f, within 3)"
              % (what, dev["memory_bandwidth"], probe["copy_bandwidth"], ratio))

    explain_accepts(dmc, hw, tmp, check, what)


ATTEMPTS = 3


def calibrate_and_check(dmc, backend, tmp, check, timing):
    """dmc calibrate --quick for a backend, then every check of its file; False when there
    is no file to check."""
    out = os.path.join(tmp, "calibrated-%s.json" % backend)
    t0 = time.time()
    r = subprocess.run([dmc, "calibrate", "--quick", "--backend", backend, "-o", out],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    seconds = time.time() - t0
    check(r.returncode == 0 and os.path.exists(out), "%s: dmc calibrate --quick -o FILE, %.1f s%s"
          % (backend, seconds, "" if r.returncode == 0 else ": " + r.stderr.strip()[-500:]))
    if r.returncode != 0:
        return False
    timing(seconds < 30, "%s: --quick takes under 30 s (%.1f s)" % (backend, seconds))
    try:
        with open(out) as f:
            hw = json.load(f)
    except ValueError as e:
        check(False, "%s: the file is JSON: %s" % (backend, e))
        return False
    check_file(dmc, hw, backend, tmp, check, timing)
    return True


def main(argv):
    dmc = argv[1]
    backends = ["threads"] + (["mpi"] if "--mpi" in argv[2:] else [])
    fails, checks = [], 0

    def check(ok, what):
        nonlocal checks
        checks += 1
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            fails.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            # The checks comparing two timings (calibrate's against numpy's, the fitted link
            # against the largest message) hold on a quiet machine; when other work starts or
            # stops between the two, one side is off by more than the factor. So calibrate
            # runs again, up to ATTEMPTS times, until its timing checks hold; every other
            # check is of the file's own arithmetic and must hold on the first run.
            for attempt in range(1, ATTEMPTS + 1):
                timings = []
                # a later attempt's exact checks count only if one fails
                exact = check if attempt == 1 else \
                    lambda ok, what, n=attempt: ok or check(ok, "%s (attempt %d of %d)" % (what, n, ATTEMPTS))
                if not calibrate_and_check(dmc, backend, tmp, exact, lambda ok, what: timings.append((ok, what))):
                    break
                off = [what for ok, what in timings if not ok]
                if not off or attempt == ATTEMPTS:
                    for ok, what in timings:
                        check(ok, what + ("" if attempt == 1 else " (attempt %d of %d)" % (attempt, ATTEMPTS)))
                    break
                print("note: attempt %d of %d, timings off (a busy machine?): %s; calibrating again"
                      % (attempt, ATTEMPTS, "; ".join(off)))

        r = subprocess.run([dmc, "calibrate", "--quick"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        try:
            printed = json.loads(r.stdout)
        except ValueError:
            printed = None
        check(r.returncode == 0 and printed is not None and "measured" in printed,
              "without -o: the description on standard output")
        left = [n for n in os.listdir(tmp) if ".tmp." in n]
        check(not left, "no temporary file left beside the output%s" % (": %s" % left if left else ""))
        for args, message in ((["--ranks", "1"], "--ranks"), (["--backend", "nccl"], "--backend"),
                              (["--frobnicate"], "unknown option")):
            r = subprocess.run([dmc, "calibrate"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True)
            check(r.returncode == 2 and message in r.stderr, "dmc calibrate %s: exit status 2 naming %s"
                  % (" ".join(args), message))

    print("%d checks, %d failed" % (checks, len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
