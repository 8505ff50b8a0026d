"""File helpers every stage shares (standard library only, so the torch-free runtime may use them).

- ``sha256_file``: the hex sha256 of a file, read in 1 MiB blocks (shards, manifests, ONNX files).
- ``write_text_atomic`` / ``write_json_atomic``: text / JSON written to a temp file next to the target, then renamed into place, so a
  reader never sees half a file and an interrupted write leaves the old file (or none) behind.
- ``read_json``: a JSON file, or the caller's error naming the file and what to do when it is missing
  or not JSON.
- ``stable_hash64``: the first 8 bytes of a text's sha256 as an integer, equal across processes and runs
  (root seeds, the prompt split, the collect partition).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stable_hash64(text: str, byteorder: str = "little") -> int:
    """``int.from_bytes(sha256(text)[:8], byteorder)``: a seeded hash that every process agrees on."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], byteorder)


def read_json(path: str | Path, error: type[Exception], missing: str):
    """The parsed JSON at ``path``; raises ``error("<path> not found: <missing>")`` when there is no
    file and ``error("<path>: not valid JSON (...)")`` when it does not parse."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path} not found: {missing}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e})") from None


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` (parents created) via a temp file next to it and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(path: str | Path, obj, sort_keys: bool = True) -> Path:
    """Write ``obj`` as indented JSON to ``path`` (parents created) via a temp file and a rename;
    ``sort_keys=False`` keeps the dicts' own key order. Values JSON cannot encode are written as str."""
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=sort_keys, default=str) + "\n")
