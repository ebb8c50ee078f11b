"""rewrite_launches.py IN.cu OUT.cpp: a CUDA source as C++ for the CPU emulation
(cuda_emu.h, docs/gpu.md "The CPU emulation of libdmrt_cuda").

Each launch `kernel<<<grid, block, shared, stream>>>(args);` becomes
`dmemu_launch(DMEMU_NEEDS_BLOCK, "kernel", grid, block, shared, stream, [&]() { kernel(args); });`:
the emulator calls the lambda once for every thread of the grid. DMEMU_NEEDS_BLOCK is 1
where the kernel's body declares __shared__ memory (the block reductions: __syncthreads and
warp shuffles, which need the block's threads run side by side, one fiber each) and 0 for
the rest, which run thread after thread; a kernel that synchronizes without being marked
stops the run with a message, so a wrong mark cannot give a wrong result. Nothing else of
the file changes, so line numbers stay those of the .cu (a #line directive names it)."""
import re
import sys


def matching(text, at, open_char, close_char):
    """Index just past the bracket closing the one at text[at]."""
    depth = 0
    for i in range(at, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    raise SystemExit("rewrite_launches: unbalanced %s from offset %d" % (open_char, at))


def kernels_with_shared_memory(text):
    """Names of the __global__ functions whose bodies declare __shared__ memory."""
    names = set()
    for m in re.finditer(r"__global__[^;{(]*?\b(\w+)\s*\(", text):
        body_at = text.index("{", matching(text, m.end() - 1, "(", ")"))
        if "__shared__" in text[body_at:matching(text, body_at, "{", "}")]:
            names.add(m.group(1))
    return names


def rewrite(text, path):
    blocking = kernels_with_shared_memory(text)
    out, pos = [], 0
    callee = re.compile(r"([A-Za-z_]\w*)(\s*<[^<>;()]*>)?\s*<<<")
    for m in callee.finditer(text):
        if m.start() < pos:
            continue
        config_end = text.index(">>>", m.end())
        config = text[m.end():config_end]
        args_at = text.index("(", config_end)
        args_end = matching(text, args_at, "(", ")")
        name = m.group(1)
        out.append(text[pos:m.start()])
        # newlines of the launch kept, so that the lines after it keep their numbers
        out.append('dmemu_launch(%d, "%s", %s, [&]() { %s%s%s; })' % (
            1 if name in blocking else 0, name, config, name, m.group(2) or "", text[args_at:args_end]))
        pos = args_end
    out.append(text[pos:])
    return '#line 1 "%s"\n' % path + "".join(out)


def main(argv):
    with open(argv[1]) as f:
        text = f.read()
    with open(argv[2], "w") as f:
        f.write(rewrite(text, argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
