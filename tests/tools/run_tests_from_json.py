"""run_tests_from_json.py TESTS.json NAME...: runs the named tests of `meson introspect
--tests` output (command, environment, working directory, timeout) without meson, JOBS
at a time (default 4), and prints one line per test with the end of a failing test's
output:
  OK, SKIP (exit 77), FAIL rc=N, FAIL (cannot run: ...), TIMEOUT (its own timeout),
  CUT (stopped at the end of BUDGET, before its own timeout: not a verdict),
  NOT RUN (BUDGET spent before it started).
For a GPU machine that runs a build carried from another (tests/tools/gpu_machine_setup.sh);
run it from the build directory, as meson does. Logs go to $LOGS (default $OUT/logs,
$OUT by default /tmp/out). Each test's line is printed as it ends (not in the order
given), so that a run stopped from outside has printed every verdict it reached. A test's whole process group is killed when it is stopped, so that its
programs do not run on beside the next tests. Its Python output is unbuffered, so that the
log of a stopped test holds what it printed.
The last line counts each outcome; exit status 1 when a test failed or timed out, or when
none passed; with SKIP_FAILS=1 a skip counts as a failure (on a machine where every test
must run: a GPU test skips only where there is no GPU)."""
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time


def run_one(t, log, left):
    """(status, seconds) of test t, its output into the open file log, at most `left` s."""
    env = dict(os.environ)
    env.update(t["env"])
    env["PYTHONUNBUFFERED"] = "1"
    start = time.time()
    limit = min(t["timeout"], left)
    try:
        p = subprocess.Popen(t["cmd"], cwd=t.get("workdir") or os.getcwd(), env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        return "FAIL (cannot run: %s)" % e, time.time() - start
    try:
        rc = p.wait(timeout=limit)
        status = {0: "OK", 77: "SKIP"}.get(rc, "FAIL rc=%d" % rc)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        status = "TIMEOUT" if limit >= t["timeout"] else "CUT"
    return status, time.time() - start


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    tests = {t["name"]: t for t in json.load(open(argv[1]))}
    unknown = [n for n in argv[2:] if n not in tests]
    if unknown:
        sys.exit("run_tests_from_json: no such tests: %s" % ", ".join(unknown))
    logs = os.environ.get("LOGS") or os.path.join(os.environ.get("OUT", "/tmp/out"), "logs")
    os.makedirs(logs, exist_ok=True)
    deadline = time.time() + float(os.environ.get("BUDGET", "3600"))
    skip_fails = os.environ.get("SKIP_FAILS") == "1"

    def run(name):
        left = deadline - time.time()
        if left < 20:
            return name, "NOT RUN", 0.0
        with open(os.path.join(logs, name + ".log"), "w") as log:
            status, seconds = run_one(tests[name], log, left)
        return name, status, seconds

    # each outcome's word in the last line, in its order
    outcomes = [("OK", "passed"), ("FAIL", "failed"), ("TIMEOUT", "timed out"), ("SKIP", "skipped"),
                ("CUT", "cut by the budget"), ("NOT", "not run")]
    failing = {"FAIL", "TIMEOUT"} | ({"SKIP"} if skip_fails else set())
    counts = {}
    with concurrent.futures.ThreadPoolExecutor(int(os.environ.get("JOBS", "4"))) as pool:
        futures = [pool.submit(run, name) for name in argv[2:]]
        for done in concurrent.futures.as_completed(futures):
            name, status, seconds = done.result()
            print("%-24s %-10s %6.1fs" % (name, status, seconds), flush=True)
            kind = status.split()[0]
            counts[kind] = counts.get(kind, 0) + 1
            if kind in failing or kind == "CUT":
                with open(os.path.join(logs, name + ".log"), errors="replace") as f:
                    lines = f.read().splitlines()
                print("   | " + "\n   | ".join(lines[-25:]), flush=True)
    print(", ".join("%d %s" % (counts.get(k, 0), word) for k, word in outcomes)
          + (" (skips counted as failures: SKIP_FAILS=1)" if skip_fails and counts.get("SKIP") else ""))
    return 1 if any(counts.get(k) for k in failing) or not counts.get("OK") else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv))
