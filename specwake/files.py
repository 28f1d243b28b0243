"""Writing a file so that no reader ever sees half of it: a temporary file in the same folder, then a rename.

Used for result files, JUnit XML and specwake's caches.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` (parents created) through a temporary sibling renamed over it; OSError propagates.

    The file gets the permissions any new file gets (0666 under the umask, 0644 usually), as the server logs do:
    not mkstemp's 0600, which would hide results from the CI user that uploads them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_cache(path: Path, text: str) -> None:
    """write_atomic for a cache entry: a cache that cannot be written only costs time, so OSError is ignored."""
    try:
        write_atomic(path, text)
    except OSError:
        pass


def what_it_is(path: Path) -> str | None:
    """None for a regular file (or a symlink to one); else what stands there instead, for an error line: reading a
    FIFO or a device would block or never end, so no path a user names is read before this says None."""
    if path.is_file():
        return None
    if not path.exists():
        return "not found"
    if path.is_dir():
        return "a folder, not a file"
    return "not a regular file (a FIFO, socket or device)"
