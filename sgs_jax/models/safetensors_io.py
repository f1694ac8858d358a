"""Minimal streaming reader and writer of the safetensors format.

Our own few lines instead of `safetensors.numpy` because that cannot hold bfloat16 in
NumPy, and because we want zero-copy memory maps (read) and one-tensor-at-a-time output
(write) so a 7B checkpoint never needs two full host copies.

Format: 8-byte little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the
raw little-endian tensor bytes (offsets relative to the end of the header).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Callable, Iterator, Sequence

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsError(ValueError):
    """A safetensors file is truncated, corrupted or uses an unsupported dtype."""


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
    """(tensor entries without __metadata__, byte offset where data starts)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: file too short to be safetensors")
        (size,) = struct.unpack("<Q", raw)
        file_size = os.fstat(f.fileno()).st_size
        if size > file_size - 8:
            raise SafetensorsError(f"{path}: header length {size} exceeds file size {file_size}")
        try:
            header = json.loads(f.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SafetensorsError(f"{path}: corrupted header ({err})") from None
    header.pop("__metadata__", None)
    data_start = 8 + size
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if entry["dtype"] not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")
        expected = int(np.prod(entry["shape"], dtype=np.int64)) * _DTYPES[entry["dtype"]].itemsize
        if end - begin != expected or data_start + end > file_size:
            raise SafetensorsError(f"{path}: tensor {name} is truncated or its offsets are inconsistent")
    return header, data_start


def iter_tensors(path: str | os.PathLike) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, read-only memory-mapped array) for every tensor of one file."""
    header, data_start = read_header(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = _DTYPES[entry["dtype"]]
        flat = mapped[data_start + begin : data_start + end].view(dtype)
        yield name, flat.reshape(entry["shape"])


def write_file(
    path: str | os.PathLike,
    specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
    fetch: Callable[[str], np.ndarray],
    metadata: dict[str, str] | None = None,
) -> None:
    """Write tensors named in `specs` (name, shape, dtype), fetching each one only when it
    is written, so at most one tensor is held on the host at a time."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, shape, dtype in specs:
        dtype = np.dtype(dtype)
        if dtype not in _NAMES:
            raise SafetensorsError(f"cannot write dtype {dtype} for {name}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # data starts 8-byte aligned
    tmp = os.fspath(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name, shape, dtype in specs:
            array = np.ascontiguousarray(fetch(name), dtype=np.dtype(dtype))
            if tuple(array.shape) != tuple(shape):
                raise SafetensorsError(f"{name}: expected shape {tuple(shape)}, got {array.shape}")
            f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    os.replace(tmp, path)  # never leave a half-written file under the final name
