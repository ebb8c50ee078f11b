"""run_tests_from_json.py TESTS.json NAME...: runs the named tests of `meson introspect
--tests` output (command, environment, working directory, timeout) without meson, JOBS
at a time (default 4), and prints one line per test (OK, SKIP, FAIL, TIMEOUT) with the
end of a failing test's output. For a GPU machine that runs a build carried from another
(tests/tools/gpu_machine_setup.sh); run it from the build directory, as meson does. Logs
go to $OUT/logs (default /tmp/out/logs).
Exit status 1 when a test failed."""
import concurrent.futures
import json
import os
import subprocess
import sys
import time


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    tests = {t["name"]: t for t in json.load(open(argv[1]))}
    unknown = [n for n in argv[2:] if n not in tests]
    if unknown:
        sys.exit("run_tests_from_json: no such tests: %s" % ", ".join(unknown))
    logs = os.path.join(os.environ.get("OUT", "/tmp/out"), "logs")
    os.makedirs(logs, exist_ok=True)
    deadline = time.time() + float(os.environ.get("BUDGET", "3600"))

    def run(name):
        t = tests[name]
        left = deadline - time.time()
        if left < 20:
            return name, "NOT RUN", 0.0
        env = dict(os.environ)
        env.update(t["env"])
        start = time.time()
        with open(os.path.join(logs, name + ".log"), "w") as log:
            try:
                r = subprocess.run(t["cmd"], cwd=t.get("workdir") or os.getcwd(), env=env, stdout=log,
                                   stderr=subprocess.STDOUT, timeout=min(t["timeout"], left))
                status = {0: "OK", 77: "SKIP"}.get(r.returncode, "FAIL rc=%d" % r.returncode)
            except subprocess.TimeoutExpired:
                status = "TIMEOUT"
        return name, status, time.time() - start

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(int(os.environ.get("JOBS", "4"))) as pool:
        for name, status, seconds in pool.map(run, argv[2:]):
            print("%-24s %-10s %6.1fs" % (name, status, seconds), flush=True)
            if status not in ("OK", "SKIP", "NOT RUN"):
                failed += 1
                lines = open(os.path.join(logs, name + ".log")).read().splitlines()
                print("   | " + "\n   | ".join(lines[-25:]), flush=True)
    print("%d passed, %d failed" % (len(argv) - 2 - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
