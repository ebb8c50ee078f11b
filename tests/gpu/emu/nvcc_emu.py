#!/usr/bin/env python3
"""nvcc_emu.py: stands in for nvcc where `dmc run --target cuda` compiles its generated .cu
(the driver runs $NVCC), so that the generated program runs on the CPU emulation of
libdmrt_cuda (cuda_emu.h; docs/gpu.md, "The CPU emulation of libdmrt_cuda"). Takes nvcc's
command line as the driver writes it (-c FILE.cu -o FILE.o, -I paths; nvcc's own options
ignored), rewrites the launches (rewrite_launches.py) and compiles the result with the
host's C++ compiler ($CXX, else c++), warnings as errors. The link then needs the
emulation's libraries first: DMC_CFLAGS="-Wl,--whole-archive LIBS -Wl,--no-whole-archive"."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rewrite_launches  # noqa: E402
CUDA_HOME = os.environ.get("DMC_CUDA_HOME", "/usr/local/cuda")
# nvcc options that take a value as the next word
WITH_VALUE = {"-gencode", "-Xcompiler", "-arch", "-code", "-MF", "-MT", "-MQ", "-ccbin", "--compiler-options", "-Werror"}


def main(argv):
    includes, source, output, i = [], None, None, 1
    while i < len(argv):
        a = argv[i]
        if a == "-o":
            output, i = argv[i + 1], i + 2
            continue
        if a.startswith("-I"):
            includes.append(a if len(a) > 2 else "-I" + argv[i + 1])
            i += 1 if len(a) > 2 else 2
            continue
        if a.endswith(".cu"):
            source = a
        i += 2 if a in WITH_VALUE else 1
    if not source or not output:
        sys.stderr.write("nvcc_emu: expected -c FILE.cu -o FILE.o, got %s\n" % " ".join(argv[1:]))
        return 2
    cpp = output + ".emu.cpp"
    rewrite_launches.main([None, source, cpp])
    cxx = os.environ.get("CXX", "c++").split()
    cmd = cxx + ["-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-include", "cuda_emu.h",
                 "-I" + HERE, "-I" + os.path.join(CUDA_HOME, "include")] + includes + ["-c", cpp, "-o", output]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
