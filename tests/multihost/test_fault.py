"""test_fault.py DMC SRCROOT: one host lost in the middle of training, across hosts made of
network namespaces (run by with_hosts.sh, which exports DMC_NETNS_HOSTS and DMC_TEST_MPIRUN).

examples/mlp.dm trains on data=2 x tensor=2 x pipeline=2 (8 ranks dealt round-robin over the
hosts: the last of 3 runs ranks 2 and 5) with
$DMRT_COMM_TIMEOUT = DEADLINE s, for far more steps than it will live; once STEP lines have
come out, the last host fails, three ways, each a fresh run:
  - ranks: its trainer processes are killed (SIGKILL). Open MPI's daemon on that host sees
    them die and mpirun ends the job: the output names a killed rank, its PID and the host
    (`mpirun noticed that process rank 1 with PID ... on node 10.211.X.12 exited on signal 9
    (Killed)`);
  - host: everything in its namespace is killed, Open MPI's daemon too. mpirun loses the
    daemon and ends the job, naming the host (`ORTE has lost communication with a remote
    daemon ... Remote daemon: [[J,0],2] on node 10.211.X.12`); it cannot name ranks;
  - stop: its trainer processes are stopped (SIGSTOP: a host that hangs, its sockets open).
    Nothing in Open MPI notices; the dmc runtime's deadline does: the others' collectives
    time out (`timed out after DEADLINE s: not every rank arrived (MPI cannot tell which)`),
    then their agreement at the end of the run (another DEADLINE), and they call MPI_Abort.
    Over MPI the runtime cannot tell which rank did not arrive in a collective, and a
    pipeline receive names the rank it waited for, which may be waiting itself: this output
    names the waiting ranks and what they waited in, not the lost ones.
Each run must exit non-zero within its bound (kill to exit: DEADLINE + MARGIN s for the
kills, 2 DEADLINE + MARGIN for the stop), say what is described above, and leave no process
of the run on any host. Prints how long each took. Exit 77 (a meson skip) outside with_hosts.sh.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402

DEADLINE = 3
MARGIN = 10
STEP = 3
SIZES = "B=16,D=48,H=64,K=10"


def netns_pids(ns):
    r = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, universal_newlines=True)
    return [int(p) for p in r.stdout.split()]


def world_rank(pid):
    """The MPI world rank of a process (from its environment), or None (not a rank)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"OMPI_COMM_WORLD_RANK="):
                    return int(var.split(b"=", 1)[1])
    except OSError:
        pass
    return None


def run_case(dmc, root, tmp, hosts, mode):
    addr, ns = hosts[-1]
    out_path = os.path.join(tmp, "out-%s.txt" % mode)
    cmd = [dmc, "run", os.path.join(root, "examples", "mlp.dm"), "--set", SIZES,
           "--batch-file", os.path.join(tmp, "batches.safetensors"), "--steps", "1000000",
           "--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "2", "--backend", "mpi", "--mpirun", os.environ["DMC_TEST_MPIRUN"]]
    env = dict(os.environ, DMRT_COMM_TIMEOUT=str(DEADLINE), TMPDIR=tmp)
    with open(out_path, "w") as out:
        p = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
    failures = []
    try:
        started = time.monotonic()
        while True:
            text = open(out_path).read()
            if re.search(r"^step %d " % STEP, text, re.M):
                break
            if p.poll() is not None or time.monotonic() - started > 120:
                return ["%s: no `step %d` line (exit %s):\n%s" % (mode, STEP, p.poll(), text)]
            time.sleep(0.05)
        pids = netns_pids(ns)
        ranks = {pid: world_rank(pid) for pid in pids}
        victims = [pid for pid in pids if mode == "host" or ranks[pid] is not None]
        lost = sorted(r for pid, r in ranks.items() if r is not None)
        if not lost:
            return ["%s: no rank runs on host %s (%s)" % (mode, addr, ns)]
        sig = signal.SIGSTOP if mode == "stop" else signal.SIGKILL
        killed = time.monotonic()
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        bound = (2 * DEADLINE if mode == "stop" else DEADLINE) + MARGIN
        try:
            status = p.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - killed
        text = open(out_path).read()
        tail = "\n".join(line for line in text.splitlines() if not line.startswith("step "))
        print("%-5s host %s (%s, ranks %s): exit %s %.1f s after the %s; bound %d s"
              % (mode, addr, ns, lost, status, took, sig.name, bound))
        if status is None:
            failures.append("%s: still running %d s after the %s:\n%s" % (mode, bound, sig.name, tail))
        elif status == 0:
            failures.append("%s: exit 0 after losing host %s:\n%s" % (mode, addr, tail))
        if mode == "ranks":
            m = re.search(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal 9", text)
            if not m or int(m.group(1)) not in lost or int(m.group(2)) not in victims or m.group(3) != addr:
                failures.append("%s: no line naming a killed rank (%s) on %s:\n%s" % (mode, lost, addr, tail))
            else:
                print("      named: %s" % m.group(0))
        elif mode == "host":
            m = re.search(r"Remote daemon: *\S+ on node (\S+)", text)
            if "lost communication with a remote daemon" not in text or not m or m.group(1) != addr:
                failures.append("%s: no line naming the lost host %s:\n%s" % (mode, addr, tail))
            else:
                print("      named: %s" % m.group(0))
        else:
            want = "timed out after %d s" % DEADLINE
            m = re.search(r"rank (\d+): [^\n]*%s[^\n]*" % want, text)
            if not m or int(m.group(1)) in lost:
                failures.append("%s: no rank that was not stopped says `%s`:\n%s" % (mode, want, tail))
            else:
                print("      said: %s" % m.group(0))
        # nothing of the run left on any host (mpirun ended it; the fixture would kill the rest)
        for _ in range(50):
            left = [(h, pid) for h, n in hosts for pid in netns_pids(n)]
            if not left:
                break
            time.sleep(0.1)
        if left:
            failures.append("%s: processes left on the hosts 5 s after the run: %s" % (mode, left))
    finally:
        if p.poll() is None:
            # dmc passes SIGTERM on to mpirun, which ends the job; with_hosts.sh kills what is left
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return failures


def main():
    dmc, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not os.environ.get("DMC_TEST_MPIRUN") or not os.environ.get("DMC_NETNS_HOSTS"):
        print("SKIP: run by tests/multihost/with_hosts.sh, which makes the hosts")
        return 77
    hosts = [tuple(pair.split("=", 1)) for pair in os.environ["DMC_NETNS_HOSTS"].split()]
    tmp = tempfile.mkdtemp(prefix="dmc-fault-")
    rng = np.random.default_rng(3)
    stio.save({"x": rng.standard_normal((10, 16, 48)).astype(np.float32),
               "y": rng.integers(0, 10, (10, 16)).astype(np.int32)}, os.path.join(tmp, "batches.safetensors"))
    failures = []
    for mode in ("ranks", "host", "stop"):
        failures += run_case(dmc, root, tmp, hosts, mode)
    for f in failures:
        print("FAIL %s" % f)
    subprocess.run(["rm", "-rf", tmp])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
