#!/usr/bin/python3
"""A host program that embeds a generated model builds with `pkg-config dmrt`, from the
build tree and after `meson install`, and runs.

usage: test_pkgconfig.py DMC MESON SOURCE_ROOT BUILD_ROOT CC [CFLAG...]

The host program is the one docs/runtime.md shows (the ```c block after the line
`<!-- example: main.c -->`), so the documented example is what is tested:
  1. dmc examples/mlp.dm -o DIR, then cc main.c mlp.c $(pkg-config ...) with
     PKG_CONFIG_PATH=BUILD/meson-uninstalled (meson's uninstalled dmrt.pc); run it;
  2. meson install --destdir D --tags devel (libraries, headers, dmrt.pc only); the same
     build against D (pkg-config's prefix redefined to where D holds it, as for any
     relocated prefix), checking that no flag points into the build or source tree;
  3. the model with hidden layers of 10^6 units (4 TB of weights) under a 4 GiB
     address-space limit: mlp_create must return NULL and the program print its reason,
     "mlp: out of memory" (skipped in sanitized builds, whose shadow memory needs more).
CFLAGs (the sanitizer's, in a sanitized build) go to every compile.
"""
import glob
import os
import re
import resource
import subprocess
import sys
import tempfile


def run(argv, env=None, cwd=None, preexec=None):
    r = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, preexec_fn=preexec)
    return r.returncode, r.stdout, r.stderr


def must(argv, what, **kw):
    rc, out, err = run(argv, **kw)
    if rc != 0:
        raise SystemExit('FAIL: %s: exit %d\n$ %s\n%s%s' % (what, rc, ' '.join(argv), out, err))
    return out


def documented_main(source_root):
    path = os.path.join(source_root, 'docs', 'runtime.md')
    m = re.search(r'<!-- example: main\.c -->\n```c\n(.*?)\n```', open(path).read(), re.S)
    if not m:
        raise SystemExit('FAIL: %s: no ```c block after <!-- example: main.c -->' % path)
    return m.group(1) + '\n'


def pkg_flags(env, *extra):
    cflags = must(['pkg-config', '--cflags', 'dmrt'] + list(extra), 'pkg-config --cflags dmrt', env=env)
    libs = must(['pkg-config', '--static', '--libs', 'dmrt'] + list(extra), 'pkg-config --libs dmrt', env=env)
    return cflags.split(), libs.split()


def build_and_run(cc, cflags, dir_, flags, what):
    cflags_pc, libs = flags
    must([cc, '-std=c11', '-Wall', '-Wextra', '-Werror'] + cflags + ['-I', dir_, 'main.c', 'mlp.c'] + cflags_pc
         + libs + ['-o', 'train'], 'building the host program (%s)' % what, cwd=dir_)
    out = must(['./train'], 'running the host program (%s)' % what, cwd=dir_)
    m = re.match(r'loss (\S+) after 1 step, (\S+) after 20\n$', out)
    if not m or not float(m.group(2)) < float(m.group(1)):
        raise SystemExit('FAIL: %s: expected the loss to fall over 20 steps, got: %r' % (what, out))
    print('%s: built and ran: %s' % (what, out.strip()))


def installed_flags(meson, build_root, source_root, tmp):
    dest = os.path.join(tmp, 'dest')
    must([meson, 'install', '-C', build_root, '--no-rebuild', '--quiet', '--destdir', dest, '--tags', 'devel'],
         'meson install --destdir')
    pcs = glob.glob(os.path.join(dest, '**', 'pkgconfig', 'dmrt.pc'), recursive=True)
    if len(pcs) != 1:
        raise SystemExit('FAIL: meson install --destdir %s installed %d dmrt.pc' % (dest, len(pcs)))
    prefix = re.search(r'^prefix=(.*)$', open(pcs[0]).read(), re.M).group(1)
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]))
    flags = pkg_flags(env, '--define-variable=prefix=' + dest + prefix)
    for flag in flags[0] + flags[1]:
        if build_root in flag or source_root in flag:
            raise SystemExit('FAIL: the installed dmrt.pc points into the build or source tree: %s' % flag)
    return flags


def limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def create_failure(dmc, cc, cflags, source_root, dir_, flags):
    big = os.path.join(dir_, 'big')
    os.mkdir(big)
    must([dmc, os.path.join(source_root, 'examples', 'mlp.dm'), '--set', 'H=1000000', '-o', big],
         'dmc mlp.dm --set H=1000000')
    must([cc, '-std=c11'] + cflags + ['-I', big, os.path.join(dir_, 'main.c'), os.path.join(big, 'mlp.c')]
         + flags[0] + flags[1] + ['-o', os.path.join(big, 'train')], 'building the 4 TB model')
    rc, out, err = run([os.path.join(big, 'train')], preexec=limit_address_space)
    if rc != 1 or err.strip() != 'mlp_create: mlp: out of memory':
        raise SystemExit('FAIL: mlp_create of a 4 TB model: expected exit 1 and "mlp_create: mlp: out of '
                         'memory", got exit %d, stdout %r, stderr %r' % (rc, out, err))
    print('create failure: %s' % err.strip())


def main(argv):
    if len(argv) < 6:
        sys.stderr.write('usage: test_pkgconfig.py DMC MESON SOURCE_ROOT BUILD_ROOT CC [CFLAG...]\n')
        return 2
    dmc, meson, source_root, build_root, cc = argv[1:6]
    cflags = argv[6:]
    with tempfile.TemporaryDirectory(prefix='dmc-pkgconfig-') as tmp:
        dir_ = os.path.join(tmp, 'host')
        os.mkdir(dir_)
        with open(os.path.join(dir_, 'main.c'), 'w') as f:
            f.write(documented_main(source_root))
        must([dmc, os.path.join(source_root, 'examples', 'mlp.dm'), '-o', dir_], 'dmc examples/mlp.dm -o DIR')
        uninstalled_env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(build_root, 'meson-uninstalled'))
        uninstalled = pkg_flags(uninstalled_env)
        build_and_run(cc, cflags, dir_, uninstalled, 'build tree (meson-uninstalled)')
        build_and_run(cc, cflags, dir_, installed_flags(meson, build_root, source_root, tmp),
                      'meson install --destdir')
        if any(f.startswith('-fsanitize') for f in cflags):
            print('create failure: skipped (sanitized build)')
        else:
            create_failure(dmc, cc, cflags, source_root, dir_, uninstalled)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
