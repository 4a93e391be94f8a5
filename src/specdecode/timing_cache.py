"""Small JSON records of timings made once per machine (layouts, verification costs, the fastest engine).

A record lives in <cache root>/<kind>/<hash of its key>.json and holds its key, so a hash collision or a
hand-edited file reads as absent. Writes are atomic; a cache that cannot be read or written costs only
the timing next time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path

from specdecode.models.loading import cache_root

__all__ = ["cpu_name", "timing_root", "timing_file", "read_timing", "write_timing"]

logger = logging.getLogger(__name__)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or what platform knows of it."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def timing_root() -> Path:
    """The directory the kinds of records live under: the cache root (tests point it elsewhere)."""
    return cache_root()


def timing_file(kind: str, key: dict) -> Path:
    """Where the record of `key` is kept: <timing root>/<kind>/<16 hex digits>.json."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return timing_root() / kind / f"{digest}.json"


def read_timing(path: Path, key: dict) -> dict | None:
    """The record at path if it was written for `key`; None when absent, unreadable or for another key."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:  # unreadable: time again (and overwrite it)
        logger.warning("ignoring the cache file %s: %s", path, error)
        return None
    return record if record.get("key") == key else None


def write_timing(path: Path, key: dict, record: dict) -> None:
    """Write {"key": key, **record} atomically (temp file, then rename); a failure is only logged."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".timing-", suffix=".json")
        with os.fdopen(handle, "w") as file:
            json.dump({"key": key, **record}, file, indent=1)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except OSError as error:
        logger.warning("cannot cache a timing in %s: %s", path, error)
