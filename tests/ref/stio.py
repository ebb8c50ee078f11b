"""stio.py: a minimal safetensors reader/writer on numpy (F32, I32, and I8 and U8 for
quantized weights).

Format: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype": "F32"|"I32", "shape": [...], "data_offsets": [begin, end]}} padded with
spaces to a multiple of 8, then the raw little-endian data (offsets relative to the
data area). Used by the PyTorch reference tests and the benchmark; Debian has no
`safetensors` Python package.
"""
import json
import struct

import numpy as np

_DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4"), "I8": np.dtype("i1"), "U8": np.dtype("u1")}


def _st_dtype(arr):
    for name, dt in _DTYPES.items():
        if arr.dtype == dt or arr.dtype == dt.newbyteorder("="):
            return name, dt
    raise TypeError("stio: unsupported dtype %s (only float32, int32, int8 and uint8)" % arr.dtype)


def save(tensors, path, metadata=None, sort=True):
    """Writes {name: numpy array} (float32, int32, int8 or uint8) to path. metadata (a dict of
    strings, as Hugging Face's {"format": "pt"}) goes first in the header as
    "__metadata__"; sort=False keeps the tensors in the order given."""
    header, blobs, offset = ({"__metadata__": metadata} if metadata is not None else {}), [], 0
    for name in (sorted(tensors) if sort else tensors):
        arr = np.asarray(tensors[name])
        st, dt = _st_dtype(arr)
        data = np.ascontiguousarray(arr, dtype=dt).tobytes()
        header[name] = {"dtype": st, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    """Reads a safetensors file into {name: numpy array}."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError("%s: too short for a safetensors header" % path)
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise ValueError("%s: header length %d beyond the file" % (path, n))
    header = json.loads(buf[8:8 + n].decode())
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError("%s: tensor '%s': unsupported dtype %s" % (path, name, info["dtype"]))
        dt = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * dt.itemsize or base + end > len(buf):
            raise ValueError("%s: tensor '%s': bad data_offsets %s for shape %s"
                             % (path, name, info["data_offsets"], list(shape)))
        out[name] = np.frombuffer(buf, dtype=dt, count=count, offset=base + begin).reshape(shape).copy()
    return out


def load_metadata(path):
    """The "__metadata__" of a safetensors file's header (a dict of strings; {} without one)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode())
    return header.get("__metadata__", {})
