#!/usr/bin/python3
"""The dmc command lines of README.md and docs/*.md run.

usage: run_doc_examples.py DMC SOURCE_ROOT [--list]

Every line of a fenced code block whose command is `dmc` or `build/driver/dmc` (also
after `&&`, with `\\` continuations joined) is an example a reader may paste, so each is
run, in the order of the pages, in one scratch directory where `examples/` is the
repository's and `input.txt` a small text corpus. Training is bounded: a `dmc run`
trains 2 steps (its --steps and --epochs replaced by --steps 2; none with --evaluate,
--predict or --save-quantized, which train nothing) and samples at most 20
bytes; `dmc calibrate` runs --quick. A command fails the test when it exits non-zero.

Not run, each for the reason printed:
  - synopses with placeholders (FILE, N, <hidden>, [--tf32], ..., a model.dm that the
    repository does not have): they show a form, not a command;
  - dmc run --target cuda without a GPU (nvidia-smi finds none), and --backend mpi
    without mpirun.
The host program of docs/runtime.md is built and run by the test libs-pkgconfig.
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

DMC_WORDS = ('dmc', 'build/driver/dmc')
BOUNDED_STEPS = '2'
MAX_SAMPLE = 20
TIMEOUT = 240  # seconds a command may take (below the test's limit in meson.build)


def fenced_lines(path):
    """(line number, text) of the lines inside ``` blocks, continuations joined."""
    inside, pending, start = False, '', 0
    for number, line in enumerate(open(path), 1):
        if line.lstrip().startswith('```'):
            inside, pending = not inside, ''
            continue
        if not inside:
            continue
        text = line.rstrip('\n')
        if not pending:
            start = number
        if text.rstrip().endswith('\\'):
            pending += text.rstrip()[:-1] + ' '
            continue
        yield start, pending + text
        pending = ''


def dmc_commands(source_root):
    """(page:line, argv after dmc) of every dmc command line of the pages."""
    pages = [os.path.join(source_root, 'README.md')] + sorted(glob.glob(os.path.join(source_root, 'docs', '*.md')))
    for page in pages:
        for number, text in fenced_lines(page):
            for part in text.split('&&'):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:
                    continue  # prose in a code block, not a command
                if words and words[0] in DMC_WORDS:
                    yield '%s:%d' % (os.path.relpath(page, source_root), number), words[1:]


def why_not_run(args, source_root, has_gpu, has_mpirun):
    for w in args:
        if re.search(r'<|\.\.\.|^\[|^(FILE|N)$', w):
            return 'a synopsis (placeholder %s)' % w
        if w.endswith('.dm') and not os.path.exists(os.path.join(source_root, w)):
            return 'a synopsis (%s is no file of the repository)' % w
    run = args[:1] == ['run']
    if run and 'cuda' in args and '--target' in args and not has_gpu:
        return 'dmc run --target cuda needs a GPU'
    if '--backend' in args and 'mpi' in args and not has_mpirun:
        return '--backend mpi needs mpirun'
    return None


def bounded(args):
    """args with training bounded: 2 steps, at most MAX_SAMPLE sampled bytes, --quick."""
    if args[:1] == ['calibrate']:
        return args + ['--quick']
    if args[:1] != ['run']:
        return args
    out, i = [], 0
    while i < len(args):
        w = args[i]
        name = w.split('=', 1)[0]
        value = w.split('=', 1)[1] if '=' in w else (args[i + 1] if i + 1 < len(args) else '')
        step = 1 if '=' in w else 2
        if name in ('--steps', '--epochs'):
            i += step
            continue
        if name == '--sample':
            out += ['--sample', str(min(int(value), MAX_SAMPLE))]
            i += step
            continue
        out.append(w)
        i += 1
    # --evaluate, --predict and --save-quantized train nothing, and refuse --steps
    trains_nothing = any(o in out for o in ('--evaluate', '--predict', '--save-quantized'))
    return out if trains_nothing else out + ['--steps', BOUNDED_STEPS]


def scratch_dir(source_root):
    d = tempfile.mkdtemp(prefix='dmc-doc-examples-')
    os.symlink(os.path.join(source_root, 'examples'), os.path.join(d, 'examples'))
    with open(os.path.join(d, 'input.txt'), 'w') as f:
        text = open(os.path.join(source_root, 'README.md')).read()
        f.write(text * (1 + 20000 // len(text)))  # a corpus of some 20 kB
    return d


def main(argv):
    if len(argv) < 3:
        sys.stderr.write('usage: run_doc_examples.py DMC SOURCE_ROOT [--list]\n')
        return 2
    dmc, source_root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    list_only = '--list' in argv[3:]
    has_gpu = shutil.which('nvidia-smi') is not None and subprocess.run(
        ['nvidia-smi', '-L'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    has_mpirun = shutil.which('mpirun') is not None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
    # the commands as a user types them: dmc's own -O3, whatever .ci/run lowered for the rest
    env.pop('DMC_CFLAGS', None)
    cwd = scratch_dir(source_root)
    seen, failures, ran, skipped = set(), [], 0, 0
    try:
        for where, args in dmc_commands(source_root):
            reason = why_not_run(args, source_root, has_gpu, has_mpirun)
            if reason:
                print('%-22s skipped: %s: dmc %s' % (where, reason, ' '.join(args)))
                skipped += 1
                continue
            args = bounded(args)
            if tuple(args) in seen:
                continue
            seen.add(tuple(args))
            command = 'dmc ' + ' '.join(shlex.quote(a) for a in args)
            if list_only:
                print('%-22s %s' % (where, command))
                continue
            start = time.monotonic()
            # (a command compiles its program at -O3 and trains: on 2 cores shared with the
            # suite's other tests one took over 120 s; a hang still ends here, reported)
            try:
                r = subprocess.run([dmc] + args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   universal_newlines=True, errors="replace", timeout=TIMEOUT)  # samples are bytes
            except subprocess.TimeoutExpired as e:
                out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode("utf-8", "replace")
                r = subprocess.CompletedProcess(e.cmd, -1, "timed out after %d s\n%s" % (TIMEOUT, out))
            ran += 1
            print('%-22s %s %5.1f s  %s' % (where, 'ok  ' if r.returncode == 0 else 'FAIL',
                                          time.monotonic() - start, command))
            if r.returncode != 0:
                failures.append('%s: %s: exit %d\n%s' % (where, command, r.returncode, r.stdout[-3000:]))
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    for f in failures:
        print('FAIL: ' + f)
    print('%d commands run, %d skipped, %d failed' % (ran, skipped, len(failures)))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
