#!/usr/bin/python3
"""Every symbol a runtime library exports starts with dmrt_.

usage: check_symbols.py NM LIBRARY.a...

The libraries are static: whatever an object file defines globally lands in the program
that links it, next to the host's own symbols. A helper named comm_now would make any host
with its own comm_now fail to link (issue 15), so internal helpers are either static or
carry the dmrt_ prefix. Symbols are read with `nm -g --defined-only` and demangled (-C).

One allowance, for libdmrt_cuda only: weak and unique definitions (nm types W, V, u) that
the CUDA toolkit's own headers instantiate in our objects (CUB's radix sort, libcu++'s
cuda::, Thrust, NVTX). Their names are the toolkit's, not ours to choose, and they have
vague linkage: the linker keeps one copy of each and a host's strong definition wins
over them, so they cannot make a host fail to link. Strong definitions get no allowance.
"""
import re
import subprocess
import sys

VAGUE_TYPES = {'W', 'V', 'u'}
CUDA_TOOLKIT_NAME = re.compile(
    r'^(?:(?:guard variable|typeinfo|typeinfo name|vtable) for )?'  # C++ runtime data
    r'(?:\S+ )?(?:cub|thrust|cuda|nvtx3)::'                          # (return type) ns::
    r'|^nvtx\w+_v3(?:::\w+)?$|^InitializeInjectionNvtx2_fnptr$'    # NVTX's C headers
    r'|^DW\.ref\.__gxx_personality_v0$')                              # C++ unwinding


def exported(nm, library):
    """(object, type, demangled name) of every global symbol defined in library."""
    out = subprocess.run([nm, '-g', '--defined-only', '-C', library], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    obj = '?'
    for line in out.splitlines():
        if line.endswith(':'):
            obj = line[:-1]
            continue
        parts = line.split(None, 2)
        if len(parts) == 3:
            yield obj, parts[1], parts[2]


def problems(nm, library):
    cuda = 'dmrt_cuda' in library
    for obj, kind, name in exported(nm, library):
        if name.startswith('dmrt_'):
            continue
        if cuda and kind in VAGUE_TYPES and CUDA_TOOLKIT_NAME.search(name):
            continue
        yield '%s(%s): exports %s (nm type %s): give it the dmrt_ prefix or make it static' % (
            library, obj, name, kind)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write('usage: check_symbols.py NM LIBRARY.a...\n')
        return 2
    nm, libraries = argv[1], argv[2:]
    bad = [p for lib in libraries for p in problems(nm, lib)]
    for p in bad:
        print(p)
    counts = ', '.join('%s %d' % (lib.rsplit('/', 1)[-1], sum(1 for _ in exported(nm, lib)))
                       for lib in libraries)
    print('%d libraries (%s exported symbols), %d without the dmrt_ prefix'
          % (len(libraries), counts, len(bad)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
