# gpu_machine_setup.sh: prepares a GPU machine without a build toolchain of its own (no
# flex, bison or meson's Debian packages) to run a build made on another machine:
#   . tests/tools/gpu_machine_setup.sh        (sourced, from the copied checkout's root)
# - the checkout is reached at /work/main, the absolute path the build was configured
#   with (a link when it lies elsewhere);
# - link names (libopenblas.so, libjansson.so, libz.so, libnccl.so) point at the
#   machine's .so.N files, for `dmc run` to link the generated code;
# - cuDNN 9 (which libdmrt_cuda links: the 16-bit attention), where the machine has it only
#   in a Python package (nvidia-cudnn-cu13: site-packages/nvidia/cudnn/lib), is linked into
#   /usr/local/cuda/lib64: every libcudnn*.so.9 (cuDNN opens its sub-libraries, engines
#   among them, at run time) and the link name libcudnn.so;
# - /usr/bin/python3, which the tests name, becomes the interpreter that has torch (a
#   bash script that runs the real binary under that interpreter's name, so that a venv
#   whose python3 links to /usr/bin/python3 finds its pyvenv.cfg and does not loop).
# The build it runs has no oneDNN (-Donednn=disabled: the machine has no libdnnl).
# Then run the GPU tests from the build's own test list:
#   meson introspect build-gpu --tests > build-gpu/tests.json      (on the build machine)
#   cd build-gpu && JOBS=4 python3 ../tests/tools/run_tests_from_json.py tests.json gpu-kernels ...
here=$(pwd)
mkdir -p /work
if [ "$here" != /work/main ]; then rm -rf /work/main; ln -sfn "$here" /work/main; fi
L=/usr/lib/x86_64-linux-gnu
for l in openblas jansson z; do
    if [ ! -e $L/lib$l.so ]; then
        f=$(ls $L/lib$l.so.* 2>/dev/null | head -1)
        [ -z "$f" ] && f=$(find / -xdev -name "lib$l.so.*" 2>/dev/null | head -1)
        echo "link lib$l.so -> $f"
        [ -n "$f" ] && ln -sf "$f" $L/lib$l.so
    fi
done
# NCCL and cuDNN in the Python packages of the interpreter that has torch, looked for there
# first (a search of the whole disk takes long on an image with the toolkit and Nsight)
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)
if [ ! -e /usr/local/cuda/lib64/libnccl.so ]; then
    f=$(ls "$site"/nvidia/nccl/lib/libnccl.so* 2>/dev/null | head -1)
    [ -z "$f" ] && f=$(find / -xdev -name 'libnccl.so*' 2>/dev/null | head -1)
    echo "nccl: $f"
    [ -n "$f" ] && ln -sf "$f" /usr/local/cuda/lib64/libnccl.so && ln -sf "$f" /usr/local/cuda/lib64/libnccl.so.2
fi
if [ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ]; then
    f=$(ls "$site"/nvidia/cudnn/lib/libcudnn.so.9 2>/dev/null | head -1)
    [ -z "$f" ] && f=$(find / -xdev -path '*nvidia/cudnn/lib/libcudnn.so.9' 2>/dev/null | head -1)
    echo "cudnn: $f"
    if [ -n "$f" ]; then
        for piece in "$(dirname "$f")"/libcudnn*.so.9; do ln -sf "$piece" /usr/local/cuda/lib64/; done
        ln -sf /usr/local/cuda/lib64/libcudnn.so.9 /usr/local/cuda/lib64/libcudnn.so
    fi
fi
ldconfig
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    torch_python=$(command -v python3)
    real_python=$(readlink -f "$torch_python")
    mv /usr/bin/python3 /usr/bin/python3.orig 2>/dev/null
    [ "$real_python" = /usr/bin/python3 ] && real_python=/usr/bin/python3.orig
    printf '#!/bin/bash\nexec -a %s %s "$@"\n' "$torch_python" "$real_python" > /usr/bin/python3
    chmod +x /usr/bin/python3
fi
/usr/bin/python3 -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
export PATH=/usr/local/cuda/bin:$PATH
