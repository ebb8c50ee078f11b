#!/usr/bin/python3
"""dmc run's command line: its --help lists every trainer option, and trainer options are
checked before anything is compiled (runtime/trainer_options.h is the one list); --name and
-o (dmc's options of every command) are taken before and after FILE.dm; --march and
$DMC_CFLAGS reach the C compiler (a stand-in compiler records its arguments).

usage: test_run_options.py DMC SOURCE_ROOT
"""
import os
import re
import shutil
import subprocess
import stat
import sys
import tempfile
import time


def dmc_run(dmc, *args):
    start = time.monotonic()
    r = subprocess.run([dmc, 'run'] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    return r.returncode, r.stdout, r.stderr, time.monotonic() - start


def compiler_args(dmc, mlp, tmp, args, env_flags=None):
    """The arguments dmc run gives the C compiler: a stand-in that writes them, one a line,
    and fails (so nothing runs)."""
    record = os.path.join(tmp, 'cc-args')
    if os.path.exists(record):
        os.remove(record)
    cc = os.path.join(tmp, 'record-cc')
    with open(cc, 'w') as f:
        f.write('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > %s\nexit 1\n' % record)
    os.chmod(cc, stat.S_IRWXU)
    env = dict(os.environ)
    env.pop('DMC_CFLAGS', None)
    if env_flags is not None:
        env['DMC_CFLAGS'] = env_flags
    r = subprocess.run([dmc, 'run', mlp, '--set', 'B=4,H=8', '--cc', cc] + args + ['--steps', '1'],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env)
    got = open(record).read().split('\n')[:-1] if os.path.exists(record) else None
    return r.returncode, got, r.stderr


def check_compiler_flags(dmc, mlp, check):
    with tempfile.TemporaryDirectory(prefix='dmc-march-') as tmp:
        rc, got, err = compiler_args(dmc, mlp, tmp, [])
        check(rc == 1 and got and '-march=native' in got and 'building the generated code failed' in err,
              'dmc run: the compiler got %r (want -march=native), exit %d, %r' % (got, rc, err))
        rc, got, _ = compiler_args(dmc, mlp, tmp, ['--march', 'x86-64-v2'])
        check(got and '-march=x86-64-v2' in got and '-march=native' not in got,
              'dmc run --march x86-64-v2: the compiler got %r' % got)
        rc, got, _ = compiler_args(dmc, mlp, tmp, ['--march=x86-64'], env_flags='-DDMC_TEST_FLAG=1 -march=znver3')
        check(got and got.index('-march=x86-64') < got.index('-march=znver3') and '-DDMC_TEST_FLAG=1' in got,
              'dmc run --march=x86-64 with DMC_CFLAGS: the compiler got %r (want DMC_CFLAGS after --march)' % got)
        many = ' '.join('-DDMC_FLAG_%d=1' % i for i in range(60))
        rc, got, _ = compiler_args(dmc, mlp, tmp, [], env_flags=many)
        check(got and all('-DDMC_FLAG_%d=1' % i in got for i in range(60)) and got[-2:][0] == '-o',
              'dmc run with 60 words of DMC_CFLAGS: the compiler got %d arguments, not every flag (%r)'
              % (len(got or []), (got or [])[-4:]))
        for bad in ('', 'x86 64', '$(reboot)'):
            rc, got, err = compiler_args(dmc, mlp, tmp, ['--march', bad])
            check(rc == 2 and got is None and '--march takes an instruction set' in err,
                  'dmc run --march %r: exit %d, compiler ran: %s, %r' % (bad, rc, got is not None, err))


def main(argv):
    dmc, root = argv[1], argv[2]
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    table = open(os.path.join(root, 'runtime', 'trainer_options.h')).read()
    options = re.findall(r'X\("(--[a-z-]+)"', table)
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    for args in (['--help'], [mlp, '--help'], [mlp, '--', '--help']):
        rc, out, err, _ = dmc_run(dmc, *args)
        check(rc == 0 and out.startswith('usage: dmc run'), 'dmc run %s: exit %d, %r' % (' '.join(args), rc, out[:80]))
        missing = [o for o in options if o not in out]
        check(not missing, 'dmc run %s does not list %s' % (' '.join(args), missing))
    check(len(options) >= 15, 'trainer_options.h lists only %d options' % len(options))

    # rejected before compiling: exit 2, the message, and no time for a C build
    for args, message in [
            (['--step', '3'], "unknown option '--step' (did you mean --steps?)"),
            (['--tempreature', '1'], "unknown option '--tempreature' (did you mean --temperature?)"),
            (['--mseh', 'data=2'], "unknown option '--mseh' (did you mean --mesh?)"),
            (['--frobnicate'], "unknown option '--frobnicate'; dmc run --help"),
            (['--steps'], 'trainer option --steps needs a value (--steps N)'),
            (['--quiet=1'], "trainer option --quiet takes no value, got '--quiet=1'"),
            (['stray'], "unexpected argument 'stray'"),
            (['--', '--mesh', 'data=2'], "--mesh is dmc's option, not the trainer's: give it before '--'"),
            (['--', '--sed', '1'], "unknown option '--sed' (did you mean --seed?)")]:
        rc, out, err, seconds = dmc_run(dmc, mlp, *args)
        check(rc == 2 and message in err and seconds < 1.5,
              'dmc run mlp.dm %s: exit %d in %.1f s, stderr %r (want exit 2, %r)'
              % (' '.join(args), rc, seconds, err, message))
    rc, out, err, _ = dmc_run(dmc, '--steps', '3')
    check(rc == 2 and 'no input file' in err, 'dmc run --steps 3: exit %d, %r' % (rc, err))

    # after '--' the trainer gets the arguments: here a data directory that does not exist
    rc, out, err, _ = dmc_run(dmc, mlp, '--set', 'B=4,H=8', '--', '--steps', '1', '--data-dir', '/nonexistent-dmc')
    check(rc == 1 and '/nonexistent-dmc' in err, "dmc run mlp.dm -- --data-dir: exit %d, %r" % (rc, err))

    # dmc --help's options of every command, after FILE.dm as before it: --name and -o
    # (dmc run once took them only before the file)
    tmp = tempfile.mkdtemp(prefix='dmc-run-after-')
    for where in ('before', 'after'):
        out_dir = os.path.join(tmp, where)
        mine = ['--name', 'renamed', '-o', out_dir]
        args = mine + [mlp, '--set', 'B=4,H=8', '--steps', '1'] if where == 'before' else \
            [mlp] + mine + ['--set', 'B=4,H=8', '--steps', '1']
        rc, out, err, _ = dmc_run(dmc, *args)
        made = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
        check(rc == 0 and 'renamed.c' in made and 'renamed.h' in made,
              'dmc run with --name and -o %s the file: exit %d, %s made %s; %s'
              % (where, rc, out_dir, made, err.strip()[-200:]))
    shutil.rmtree(tmp, ignore_errors=True)

    check_compiler_flags(dmc, mlp, check)

    # --mpirun's every word reaches the launcher (a launch across machines has many: hosts,
    # --mca settings; dmc once kept 32 and ran `... --mca -np 2`), then -np N and the program
    if shutil.which('mpicc'):
        tmp = tempfile.mkdtemp(prefix='dmc-mpirun-')
        launcher, seen = os.path.join(tmp, 'launcher'), os.path.join(tmp, 'argv')
        with open(launcher, 'w') as f:
            f.write('#!/bin/sh\nprintf \'%%s\\n\' "$@" > %s\n' % seen)
        os.chmod(launcher, 0o755)
        words = ['--mca', 'name%d' % 0, 'x' * 1500] + ['--mca name%d value%d' % (i, i) for i in range(1, 40)]
        rc, out, err, _ = dmc_run(dmc, mlp, '--set', 'B=4,H=8', '--mesh', 'data=2', '--backend', 'mpi',
                                  '--mpirun', ' '.join([launcher] + words), '--steps', '1')
        got = open(seen).read().splitlines() if os.path.exists(seen) else []
        want = ' '.join(words).split()
        check(rc == 0 and got[:len(want)] == want and got[len(want):len(want) + 2] == ['-np', '2']
              and len(got) > len(want) + 2 and os.path.basename(got[len(want) + 2]) == 'mlp',
              'dmc run --mpirun with %d words: exit %d, %s; the launcher got %d words: %s'
              % (len(want) + 1, rc, err.strip(), len(got), got[len(want) - 2:]))
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print('no mpicc: the --mpirun check is skipped')

    for f in failures:
        print('FAIL: ' + f)
    print('%d trainer options; %d failures' % (len(options), len(failures)))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
