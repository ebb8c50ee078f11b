#!/usr/bin/python3
"""dmc's options against each other, where a --check golden (tests/diag/args_*) cannot see
them: the model name of a long file name is terminated, --stop-after stops at each pass
--help names, one command at a time (-o beside --emit, --explain, --plan; dmc run beside
--explain), the last --quantize wins whole and --plan and --mesh auto refuse it, dmc run --compact refuses --resume, and
--grad-reduce and --compress exclude each other in either order (each given once), and a
--bucket-mb under a byte is the smallest bucket (it was the 25 MiB default), and
llama.dm's weights, read transposed, quantized. And what dmc writes is whole or not
written: a source that cannot be written (a file-size limit between the header's and the
source's sizes, or a folder in its place) leaves the previous header and source as they were
(a new header beside an old source before), a replaced pair keeps its permissions,
--explain/--emit/--plan into a full stdout fail, and dmc run -o DIR keeps a main.c it did
not write (and refuses a model named main, whose source is main.c).

usage: test_options.py DMC SOURCE_ROOT
"""
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile

BASE = """dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
"""


def dmc(exe, args, cwd=None):
    r = subprocess.run([exe] + args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, errors='replace', timeout=120)
    return r.returncode, r.stdout, r.stderr


def check_long_file_name(exe, tmp, check):
    """A file name of 254 characters, a digit first and no dot: the model name gets m_ and
    is cut to 255 characters (it once lost its terminating 0 and ran into the stack)."""
    name = '1' + 'a' * 253
    with open(os.path.join(tmp, name), 'w') as f:
        f.write(BASE)
    rc, out, err = dmc(exe, ['--emit=ir', name], cwd=tmp)
    first = out.split('\n', 1)[0]
    want = 'model m_1' + 'a' * 252
    check(rc == 0 and first == want, 'dmc --emit=ir %s...: exit %d, model line of %d characters %r (want %d: %r...); %s'
          % (name[:8], rc, len(first), first[-12:], len(want), want[:12], err.strip()))


def check_stop_after(exe, root, check):
    """Each pass --help lists stops the IR there: lower before the backward, autodiff before
    the update, optimizer before the collectives, shard before the casts of --precision."""
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    common = [mlp, '--precision', 'bf16', '--mesh', 'data=2,pipeline=2', '--microbatches', '2']
    want = {'lower': (0, 0, 0, 0), 'autodiff': (1, 0, 0, 0), 'optimizer': (1, 1, 0, 0), 'shard': (1, 1, 1, 0),
            None: (1, 1, 1, 1)}
    for stage, marks in want.items():
        rc, out, err = dmc(exe, ['--emit=ir'] + (['--stop-after=' + stage] if stage else []) + common)
        got = ('\nbackward:' in out, '\nupdate:' in out, '= allreduce' in out, '= cast' in out)
        check(rc == 0 and got == tuple(bool(m) for m in marks),
              '--emit=ir %s: exit %d, (backward, update, allreduce, cast) %s, want %s; %s'
              % ('--stop-after=' + stage if stage else '(every pass)', rc, got, marks, err.strip()))


def check_commands(exe, tmp, check):
    """Two commands, or -o beside one that writes no code: refused (exit 2), nothing written."""
    src = os.path.join(tmp, 'base.dm')
    with open(src, 'w') as f:
        f.write(BASE)
    out_dir = os.path.join(tmp, 'out')
    for args, message in [(['--check', '--explain'], 'two commands'), (['--emit=ir', '--explain=json'], 'two commands'),
                          (['--emit=ir', '-o', out_dir], 'which --emit=ir does not'),
                          (['--explain', '-o', out_dir], 'which --explain does not'),
                          (['--check', '-o', out_dir], 'which --check does not'),
                          (['--plan', '--devices', '2', '-o', out_dir], 'which --plan does not'),
                          (['run', '--explain'], 'dmc run and --explain are two commands')]:
        rc, out, err = dmc(exe, args + [src])
        check(rc == 2 and message in err and not out and not os.path.exists(out_dir),
              'dmc %s: exit %d, %r (want exit 2, %r, nothing written)' % (' '.join(args), rc, err.strip(), message))


def check_quantize_repeated(exe, root, check):
    """A second --quantize replaces the first whole: its activations and its :G."""
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    for args, line in [(['--quantize', 'int8', '--quantize', 'int8-weights'], '(--quantize int8-weights)'),
                       (['--quantize', 'int4-weights:32', '--quantize', 'int8-weights'], '(--quantize int8-weights)'),
                       (['--quantize', 'int4-weights:32', '--quantize', 'int4-weights'], '(--quantize int4-weights:64)'),
                       (['--quantize-group', '32', '--quantize', 'int4-weights'], '(--quantize int4-weights:32)')]:
        rc, out, err = dmc(exe, ['--explain', mlp] + args)
        check(rc == 0 and line in out, 'dmc --explain mlp.dm %s: exit %d, %s (want %r)'
              % (' '.join(args), rc, err.strip() or [l for l in out.splitlines() if 'quantize' in l][:1], line))


def check_quantize_embeddings_alone(exe, root, check):
    """--quantize-embeddings changes a --quantize program only: alone it is refused (exit 2)."""
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    rc, out, err = dmc(exe, ['--explain', mlp, '--quantize-embeddings'])
    want = '--quantize-embeddings applies to a --quantize program only'
    check(rc == 2 and want in err and not out, 'dmc --explain mlp.dm --quantize-embeddings: exit %d, %r' % (rc, err.strip()))


def check_quantize_plans(exe, root, check):
    """--plan and --mesh auto search meshes for training: a quantized program is one serial
    forward, so both refuse --quantize (exit 2) instead of planning a training step."""
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    for args, what in [(['--plan', '--devices', '2'], '--plan'), (['--mesh', 'auto', '--devices', '2', '--explain'],
                                                                     '--mesh auto')]:
        rc, out, err = dmc(exe, [mlp, '--quantize', 'int8-weights'] + args)
        want = '--quantize makes a serial program that predicts, and %s searches meshes' % what
        check(rc == 2 and want in err and not out, 'dmc mlp.dm --quantize int8-weights %s: exit %d, %r'
              % (' '.join(args), rc, err.strip()))


def check_quantize_transposed(exe, root, tmp, check):
    """llama.dm reads every weight x @ transpose(W): --quantize stores each narrow as the
    product's [in, out], its transpose (--check and -o alike; it was refused: no weight)."""
    llama = os.path.join(root, 'examples', 'llama.dm')
    out_dir = os.path.join(tmp, 'llama-quantized')
    base = [llama, '--set', 'V=256,T=16,C=32,NH=4,NKV=2,F=48,L=1,B=2', '--quantize', 'int8-weights']
    rc, out, err = dmc(exe, ['--check'] + base)
    check(rc == 0 and not err, 'dmc --check llama.dm --quantize int8-weights: exit %d, %r' % (rc, err.strip()))
    rc, out, err = dmc(exe, base + ['-o', out_dir])
    code = open(os.path.join(out_dir, 'llama.c')).read() if rc == 0 else ''
    check(rc == 0 and code.count('.transposed = 1;') == 8,
          'dmc -o llama.dm --quantize int8-weights: its 8 weights stored transposed: exit %d, %d, %r'
          % (rc, code.count('.transposed = 1;'), err.strip()))


def check_compact_company(exe, root, check):
    """dmc run --compact gives the compacted weights as --init: --resume beside it is
    refused by dmc, naming --compact (the trainer blamed an --init never given), and
    --save-compacted with --explain, which writes no file, is refused too."""
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    for resume in (['--resume', 'ck'], ['--resume=ck']):
        rc, out, err = dmc(exe, ['run', mlp, '--set', 'H=64', '--compact', 'rows.safetensors', '--'] + resume +
                           ['--steps', '5'])
        check(rc == 2 and '--resume cannot be given with --compact rows.safetensors' in err,
              'dmc run --compact ... -- %s: exit %d, %r' % (' '.join(resume), rc, err.strip()))
    rc, out, err = dmc(exe, ['--explain', mlp, '--compact', 'rows.safetensors', '--save-compacted', 'c.safetensors'])
    check(rc == 2 and '--save-compacted: --explain writes no files' in err and not out,
          'dmc --explain --compact --save-compacted: exit %d, %r' % (rc, err.strip()))


def check_reduce_once(exe, root, check):
    """--grad-reduce and --compress both choose how gradients are reduced: one of them,
    once, in either order (--grad-reduce fp32 before --compress topk was dropped silently)."""
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    both = '--grad-reduce and --compress both choose how gradients are reduced: give one'
    for args, want in [(['--compress', 'bf16', '--grad-reduce', 'fp32'], both),
                       (['--grad-reduce', 'fp32', '--compress', 'topk:0.1'], both),
                       (['--grad-reduce', 'bf16', '--compress', 'bf16'], both),
                       (['--compress', 'bf16', '--compress', 'topk:0.1'], '--compress given twice: give it once'),
                       (['--grad-reduce', 'fp32', '--grad-reduce', 'bf16'], '--grad-reduce given twice: give it once'),
                       (['--grad-reduce', 'fp32'], None), (['--compress', 'topk:0.1'], None)]:
        rc, out, err = dmc(exe, ['--check', mlp, '--mesh', 'data=2'] + args)
        check((rc == 2 and want in err) if want else (rc == 0 and not err),
              'dmc --check mlp.dm --mesh data=2 %s: exit %d, %r (want %r)' % (' '.join(args), rc, err.strip(), want))


def check_tiny_bucket(exe, root, tmp, check):
    """--bucket-mb under a byte and under a float: buckets of one float (the same code as
    --bucket-mb 1e-6, 1 byte), not the default's."""
    gpt = os.path.join(root, 'examples', 'gpt.dm')
    code = {}
    for size in ('1e-7', '1e-6', None):
        out = os.path.join(tmp, 'bucket-%s' % size)
        rc, _, err = dmc(exe, [gpt, '--set', 'V=64,T=16,C=32,NH=4,L=2,B=8', '--mesh', 'data=2', '-o', out] +
                         (['--bucket-mb', size] if size else []))
        code[size] = open(os.path.join(out, 'gpt.c')).read() if rc == 0 else err
    check(code['1e-7'] == code['1e-6'] and code['1e-7'] != code[None],
          'dmc --bucket-mb 1e-7: the code of --bucket-mb 1e-6 (one-float buckets), not the default\'s')


def check_whole_outputs(exe, root, tmp, check):
    """The pair dmc -o writes is replaced whole or not at all."""
    mlp = os.path.join(root, 'examples', 'mlp.dm')
    out = os.path.join(tmp, 'pair')
    rc, _, err = dmc(exe, [mlp, '-o', out])
    os.chmod(os.path.join(out, 'mlp.h'), 0o640)
    before = {f: open(os.path.join(out, f)).read() for f in ('mlp.h', 'mlp.c')}
    limit = len(before['mlp.h']) + 2048   # the header fits, the source (about 30 KB) does not
    check(rc == 0 and len(before['mlp.c']) > limit, 'dmc -o: the first pair written (%s)' % err.strip())

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    r = subprocess.run([exe, mlp, '--set', 'H=32,B=64', '-o', out], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=120, preexec_fn=limited)
    after = {f: open(os.path.join(out, f)).read() for f in ('mlp.h', 'mlp.c')}
    check(r.returncode == 1 and 'cannot write %s/mlp.c' % out in r.stderr and after == before and
          sorted(os.listdir(out)) == ['mlp.c', 'mlp.h'],
          'dmc -o, the source past a file-size limit: exit 1, the previous pair unchanged, no temporary left: '
          'exit %d, %s' % (r.returncode, r.stderr.strip()))
    rc, _, err = dmc(exe, [mlp, '--set', 'H=32', '-o', out])
    mode = stat.S_IMODE(os.stat(os.path.join(out, 'mlp.h')).st_mode)
    check(rc == 0 and '{784, 32}' in open(os.path.join(out, 'mlp.c')).read() and mode == 0o640,
          'dmc -o over a pair: replaced, the header keeps its mode 0640: exit %d, mode %o' % (rc, mode))
    folder = os.path.join(tmp, 'folder')
    os.makedirs(os.path.join(folder, 'mlp.c'))
    rc, _, err = dmc(exe, [mlp, '-o', folder])
    check(rc == 1 and 'mlp.c: not a regular file' in err and os.listdir(folder) == ['mlp.c'],
          'dmc -o where mlp.c is a folder: refused, no header written: exit %d, %s' % (rc, err.strip()))
    for command in (['--explain=json'], ['--emit=ir'], ['--plan', '--devices', '2']):
        with open('/dev/full', 'w') as full:
            r = subprocess.run([exe] + command + [mlp], stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=120)
        check(r.returncode == 1 and 'writing to standard output' in r.stderr,
              'dmc %s into a full stdout: exit 1: exit %d, %s' % (command[0], r.returncode, r.stderr.strip()))


def check_run_main(exe, root, tmp, check):
    """dmc run -o DIR writes DIR/main.c, the trainer's: never over the user's own."""
    host = os.path.join(tmp, 'host')
    os.makedirs(host)
    mine = 'int main(void) { return 0; }\n'
    with open(os.path.join(host, 'main.c'), 'w') as f:
        f.write(mine)
    rc, _, err = dmc(exe, ['run', os.path.join(root, 'examples', 'mlp.dm'), '-o', host, '--', '--steps', '1'])
    check(rc == 1 and 'main.c is not one dmc run wrote' in err and open(os.path.join(host, 'main.c')).read() == mine,
          'dmc run -o DIR over a main.c of its own: refused, the file unchanged: exit %d, %s' % (rc, err.strip()))
    named = os.path.join(tmp, 'named')
    rc, _, err = dmc(exe, ['run', os.path.join(root, 'examples', 'mlp.dm'), '--name', 'main', '-o', named, '--',
                           '--steps', '1'])
    check(rc == 1 and "cannot build a model named 'main'" in err,
          'dmc run --name main: refused: exit %d, %s' % (rc, err.strip()))


def main(argv):
    exe, root = os.path.abspath(argv[1]), argv[2]
    failures = []

    def check(cond, what):
        print(('ok    ' if cond else 'FAIL  ') + what.split(': exit')[0])
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix='dmc-options-') as tmp:
        check_long_file_name(exe, tmp, check)
        check_stop_after(exe, root, check)
        check_commands(exe, tmp, check)
        check_quantize_repeated(exe, root, check)
        check_quantize_plans(exe, root, check)
        check_quantize_embeddings_alone(exe, root, check)
        check_quantize_transposed(exe, root, tmp, check)
        check_compact_company(exe, root, check)
        check_reduce_once(exe, root, check)
        check_tiny_bucket(exe, root, tmp, check)
        check_whole_outputs(exe, root, tmp, check)
        check_run_main(exe, root, tmp, check)
    for f in failures:
        print('FAIL: ' + f)
    print('%d failures' % len(failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
