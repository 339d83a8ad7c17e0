"""The persistent compilation cache directory as jaxsys reads it: entries and their records.

JAX writes one file per entry, ``<key>-cache`` (plus ``<key>-atime`` when eviction is on),
where the key starts with the module's name (``jit_step-3f2a...``). An entry holds the
compressed executable behind a 4-byte compile time in *whole seconds*, and nothing about
the jaxlib that made it. So when process 0 writes an entry, jaxsys adds a record of its own
under :data:`~jaxsys_kernel.contract.CACHE_META_DIR` (``<key>.json``): the compile time in
float seconds, the jaxlib and jax versions and when it was written. JAX only reads files
ending in ``-cache``, so the records never disturb it.

Nothing here imports JAX; every function takes the directory.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path

from .. import contract

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def module_of(key: str) -> str:
    """The module name a cache key starts with (``jit_step-3f2a...`` -> ``jit_step``)."""
    return key.rsplit("-", 1)[0]


def meta_dir(cache_dir: str | os.PathLike) -> Path:
    """Where jaxsys keeps its records of the entries of ``cache_dir``."""
    return Path(cache_dir) / contract.CACHE_META_DIR


def write_record(cache_dir: str | os.PathLike, key: str, record: dict) -> None:
    """Save the record of the entry ``key`` (atomically: readers never see half of it)."""
    folder = meta_dir(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, folder / f"{key}.json")


def read_record(cache_dir: str | os.PathLike, key: str) -> dict | None:
    """The record of the entry ``key``, or None when jaxsys did not write the entry."""
    try:
        return json.loads((meta_dir(cache_dir) / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def records_for(cache_dir: str | os.PathLike, module: str) -> list[dict]:
    """Records of the entries of one module (any key), oldest first."""
    out = []
    try:
        names = [p for p in meta_dir(cache_dir).glob(f"{module}-*.json")]
    except OSError:
        return out
    for path in names:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if module_of(path.stem) == module:
            out.append({**record, "key": path.stem})
    return sorted(out, key=lambda r: r.get("written", 0))


def sibling_versions(cache_dir: str | os.PathLike) -> list[Path]:
    """Directories of other jaxlib versions beside a per-version one (``.../jaxlib-X``).

    jaxsys's default directory is one per jaxlib version, so after an upgrade the entries
    of the old version sit next door; they explain why the new one starts cold.
    """
    here = Path(cache_dir)
    if not here.name.startswith("jaxlib-"):
        return []
    try:
        return sorted(p for p in here.parent.glob("jaxlib-*") if p.is_dir() and p != here)
    except OSError:
        return []


def stored_seconds(path: str | os.PathLike) -> int | None:
    """The whole-second compile time JAX stored in front of an entry (None if unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    try:
        if head.startswith(_ZSTD_MAGIC):
            # Deferred: zstandard is optional (JAX compresses with it when it is installed).
            import zstandard

            raw = zstandard.ZstdDecompressor().decompressobj().decompress(head)[:4]
        else:
            raw = zlib.decompressobj().decompress(head, 4)
    except Exception:  # noqa: BLE001 - an entry jaxsys cannot read is shown without it
        return None
    return int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None


def entries(cache_dir: str | os.PathLike | None, now: float | None = None) -> list[dict]:
    """Every entry of the cache directory, newest first.

    Returns
    -------
    list of dict
        ``key, module, bytes, age`` (seconds since written), ``jaxlib`` (None when jaxsys
        did not write it), ``compile_secs`` (float, from jaxsys's record) and
        ``stored_secs`` (the whole seconds JAX keeps in the entry).
    """
    if not cache_dir:
        return []
    now = time.time() if now is None else now
    out = []
    try:
        files = list(Path(cache_dir).glob(f"*{CACHE_SUFFIX}"))
    except OSError:
        return out
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue  # cleared meanwhile
        key = path.name.removesuffix(CACHE_SUFFIX)
        record = read_record(cache_dir, key) or {}
        out.append(
            {
                "key": key,
                "module": module_of(key),
                "bytes": st.st_size,
                "age": max(0.0, now - st.st_mtime),
                "jaxlib": record.get("jaxlib"),
                "compile_secs": record.get("compile_secs"),
                "stored_secs": stored_seconds(path),
            }
        )
    return sorted(out, key=lambda e: e["age"])


def clear(cache_dir: str | os.PathLike | None) -> tuple[int, int]:
    """Remove every entry and every jaxsys record; returns (entries removed, bytes freed).

    Other processes may clear the same directory at the same time: a file already gone
    is not an error.
    """
    if not cache_dir or not Path(cache_dir).is_dir():
        return 0, 0
    removed = freed = 0
    folder = Path(cache_dir)
    for pattern in (f"*{CACHE_SUFFIX}", f"*{ATIME_SUFFIX}"):
        for path in folder.glob(pattern):
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            if pattern.endswith(CACHE_SUFFIX):
                removed += 1
            freed += size
    for path in meta_dir(folder).glob("*.json"):
        path.unlink(missing_ok=True)
    return removed, freed
