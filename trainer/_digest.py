"""The digest of a checkpoint directory: what samplers check before they load it."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["checkpoint_digest"]


def checkpoint_digest(directory: str | Path) -> str:
    """sha256 (hex) over the ``*.safetensors`` files of a directory, by sorted name.

    Each file contributes its name and then its bytes, so renaming a shard
    changes the digest too.
    """
    sha = hashlib.sha256()
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    for path in files:
        sha.update(path.name.encode())
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                sha.update(chunk)
    return sha.hexdigest()
