#!/usr/bin/python3
"""dmc run's build cache (driver/build_cache.c, docs/trainer.md "Build cache"): the compiler
is a stand-in that counts its runs and calls cc, so the oracle is how many times it ran.
- a second identical run compiles nothing, its log line says hit, and it prints the same
  losses as the first;
- DMC_BUILD_CACHE=off compiles and keeps nothing;
- another program (--set), other flags ($DMC_CFLAGS), another compiler (a second stand-in),
  a runtime header whose bytes changed and a runtime library whose time of change moved
  (DMC_RUNTIME_DIR, a copy of the runtime) each build again; the same again after each hits;
- an entry cut to nothing is built again; DMC_BUILD_CACHE_MB=1 keeps the newest program
  alone; a cache that cannot be written gives a note and the run goes on; two runs at
  once into an empty cache both train and leave one program.

usage: test_build_cache.py DMC SOURCE_ROOT CC  (CC: the compiler dmc was built with, which
the stand-ins call: a sanitized dmc links sanitizer runtimes only its compiler has)
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

failures, passes = [], []


def check(ok, what):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    (passes if ok else failures).append(what)


def stand_in(tmp, name):
    """A compiler that appends a line to tmp/NAME.log, then runs cc with its arguments."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write('#!/bin/sh\necho "$$" >> "%s.log"\nexec "${REAL_CC:-cc}" "$@"\n' % path)
    os.chmod(path, 0o755)
    return path


def runs_of(cc):
    return len(open(cc + ".log").read().split()) if os.path.exists(cc + ".log") else 0


class Runner:
    def __init__(self, dmc, mlp, tmp):
        self.dmc, self.mlp, self.tmp = dmc, mlp, tmp
        self.log = os.path.join(tmp, "uses.log")

    def run(self, cache, cc, extra=(), env_extra=None, background=False):
        env = dict(os.environ, DMC_BUILD_CACHE=cache, DMC_BUILD_CACHE_LOG=self.log, TMPDIR=self.tmp)
        env.pop("DMC_BUILD_CACHE_MB", None)
        env.update(env_extra or {})
        cmd = [self.dmc, "run", self.mlp, "--set", "B=4,H=8", "--cc", cc, "--steps", "2"] + list(extra)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env)
        return p if background else self.finish(p, cmd)

    @staticmethod
    def finish(p, cmd=None):
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            print(out, err)
        # a step's loss, not its time
        return p.returncode, [" ".join(ln.split()[:4]) for ln in out.splitlines() if ln.startswith("step ")], err

    def last_use(self):
        return open(self.log).read().splitlines()[-1].split()


def entries(cache):
    return sorted(n for n in os.listdir(cache) if len(n) == 64) if os.path.isdir(cache) else []


def runtime_copy(dmc, root, tmp):
    """DMC_RUNTIME_DIR's layout: libdmrt's headers and libraries in one directory."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(dmc)))
    copy = os.path.join(tmp, "runtime")
    os.mkdir(copy)
    for pattern in [os.path.join(root, "runtime", "dmrt*.h"), os.path.join(root, "runtime", "*", "dmrt*.h"),
                    os.path.join(build, "runtime", "libdmrt*.a"), os.path.join(build, "runtime", "*", "libdmrt*.a")]:
        for path in glob.glob(pattern):
            shutil.copy(path, copy)
    return copy


def main():
    dmc, root = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.environ["REAL_CC"] = sys.argv[3]
    mlp = os.path.join(root, "examples", "mlp.dm")
    with tempfile.TemporaryDirectory(prefix="dmc-build-cache-") as tmp:
        r = Runner(dmc, mlp, tmp)
        cache = os.path.join(tmp, "cache")
        cc = stand_in(tmp, "cc-one")

        rc, first, _ = r.run(cache, cc)
        check(rc == 0 and len(first) == 2 and runs_of(cc) == 1 and len(entries(cache)) == 1,
              "first run: built once (%d), trained (exit %d, %d step lines), one program kept (%d)"
              % (runs_of(cc), rc, len(first), len(entries(cache))))
        check(r.last_use()[0] == "miss", "first run logged as a miss: %r" % r.last_use())
        rc, again, _ = r.run(cache, cc)
        check(rc == 0 and runs_of(cc) == 1 and again == first,
              "second identical run: nothing compiled (%d builds), the same step lines (%r vs %r)"
              % (runs_of(cc), again, first))
        check(r.last_use()[0] == "hit", "second run logged as a hit: %r" % r.last_use())
        key = r.last_use()[1]

        rc, _, _ = r.run("off", cc)
        check(rc == 0 and runs_of(cc) == 2 and len(entries(cache)) == 1,
              "DMC_BUILD_CACHE=off: compiled (%d builds), nothing kept (%d programs)" % (runs_of(cc), len(entries(cache))))

        for label, extra, env_extra in [("--set H=16", ["--set", "H=16"], None),
                                        ("DMC_CFLAGS", [], {"DMC_CFLAGS": "-DDMC_TEST_BUILD_CACHE=1"})]:
            before = runs_of(cc)
            r.run(cache, cc, extra, env_extra)
            r.run(cache, cc, extra, env_extra)
            check(runs_of(cc) == before + 1, "%s: built again, once for two runs (%d builds)" % (label, runs_of(cc) - before))

        other = stand_in(tmp, "cc-two")
        r.run(cache, other)
        r.run(cache, other)
        check(runs_of(other) == 1, "another compiler: built by it, once for two runs (%d)" % runs_of(other))

        runtime = runtime_copy(dmc, root, tmp)
        env_runtime = {"DMC_RUNTIME_DIR": runtime}
        before = runs_of(cc)
        rc, with_copy, _ = r.run(cache, cc, env_extra=env_runtime)
        check(rc == 0 and with_copy == first, "DMC_RUNTIME_DIR, a copy of the runtime: trains as before (exit %d)" % rc)
        with open(os.path.join(runtime, "dmrt_half.h"), "a") as f:
            f.write("/* a change of bytes */\n")
        r.run(cache, cc, env_extra=env_runtime)
        r.run(cache, cc, env_extra=env_runtime)
        check(runs_of(cc) == before + 2, "a runtime header's bytes changed: built again, then reused (%d builds for 3 runs)"
              % (runs_of(cc) - before))
        library = os.path.join(runtime, "libdmrt.a")
        st = os.stat(library)
        os.utime(library, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
        before = runs_of(cc)
        r.run(cache, cc, env_extra=env_runtime)
        r.run(cache, cc, env_extra=env_runtime)
        check(runs_of(cc) == before + 1, "libdmrt.a's time of change moved: built again, then reused (%d builds for 2 runs)"
              % (runs_of(cc) - before))

        open(os.path.join(cache, key), "w").close()
        before = runs_of(cc)
        rc, cut, _ = r.run(cache, cc)
        check(rc == 0 and runs_of(cc) == before + 1 and cut == first and os.path.getsize(os.path.join(cache, key)) > 0,
              "an entry cut to nothing: built again and kept whole (exit %d)" % rc)

        small = os.path.join(tmp, "small")
        r.run(small, cc, env_extra={"DMC_BUILD_CACHE_MB": "1"})
        r.run(small, cc, ["--set", "H=16"], env_extra={"DMC_BUILD_CACHE_MB": "1"})
        newest = r.last_use()[1]
        check(entries(small) == [newest], "DMC_BUILD_CACHE_MB=1: the newest program alone is kept (%r)" % entries(small))

        blocked = os.path.join(tmp, "a-file")
        open(blocked, "w").close()
        rc, lines, err = r.run(os.path.join(blocked, "cache"), cc)
        check(rc == 0 and lines == first and "dmc: note: the build cache" in err and "cannot be written" in err,
              "a cache that cannot be written: a note, and the run trains (exit %d, %r)" % (rc, err.strip()))

        together = os.path.join(tmp, "together")
        procs = [r.run(together, cc, background=True) for _ in range(2)]
        results = [Runner.finish(p) for p in procs]
        check(all(rc == 0 and lines == first for rc, lines, _ in results) and len(entries(together)) == 1
              and not [n for n in os.listdir(together) if n.startswith(".")],
              "two runs at once into an empty cache: both train, one program, no temporary file left (%r)"
              % os.listdir(together))
    print("%d passed, %d failed" % (len(passes), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
