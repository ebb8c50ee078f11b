"""generated.py: what the codegen tests (test_*.py beside it) share: the source dmc
generates for a model, and checks printed one a line, counted, and summed up at the end."""
import os
import subprocess
import sys
import tempfile


def generate(dmc, model, args, out, ext=".c", outline=False):
    """The generated source (.c, or .cu for --target cuda) of `model` compiled with args.
    Every op's loops are written in place (DMC_OUTLINE_LOOPS=off), where the shape checks
    read them, unless outline: then as dmc writes them by default, each distinct op's loops
    a function called by every op whose loops are the same (codegen/outline_loops.c)."""
    env = dict(os.environ)
    if not outline:
        env["DMC_OUTLINE_LOOPS"] = "off"
    subprocess.run([dmc, model, "-o", out] + args, check=True, env=env)
    with open(os.path.join(out, os.path.splitext(os.path.basename(model))[0] + ext)) as f:
        return f.read()


class Checks:
    def __init__(self):
        self.failures = []
        self.count = 0

    def __call__(self, ok, what):
        self.count += 1
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            self.failures.append(what)

    def finish(self):
        """Prints the summary line; the exit status (0: every check passed)."""
        print("%d checks, %d failed" % (self.count, len(self.failures)))
        return 1 if self.failures else 0


def run(argv, doc, prefix, body):
    """The test: body(check, dmc, root, tmp) with DMC and SOURCE_ROOT from the command line
    and a fresh temporary directory; its exit status (2: usage, printing doc)."""
    if len(argv) != 3:
        print(doc, file=sys.stderr)
        return 2
    check = Checks()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        body(check, argv[1], argv[2], tmp)
    return check.finish()
