"""Writing a file so that no reader ever sees half of it: a temporary file in the same folder, then a rename.

Used for result files, JUnit XML and specwake's caches.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` (parents created) through a temporary sibling renamed over it; OSError propagates."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_cache(path: Path, text: str) -> None:
    """write_atomic for a cache entry: a cache that cannot be written only costs time, so OSError is ignored."""
    try:
        write_atomic(path, text)
    except OSError:
        pass
