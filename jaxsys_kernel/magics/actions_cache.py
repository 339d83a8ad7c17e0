"""``%jaxsys cache``: the cluster's persistent compilation cache, told truthfully.

Where the cache is, what is in it (size, the jaxlib that made each entry, age), what each
process got from it (requests, hits, compiles shared or made here, seconds spent and saved,
why it missed), and the two thresholds that decide what JAX writes. The numbers come from
every process's telemetry (:class:`jaxsys_kernel.telemetry.schema.CacheStats`); the
listing, the clearing and the thresholds go to the engines (:mod:`jaxsys_kernel.engine.cache`).
"""

from __future__ import annotations

import argparse
import time
import weakref
from types import SimpleNamespace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .._ranges import format_procs
from ..engine.registry import engine_module
from .actions_args import count, rank

# Seconds a process may take to answer before the action gives up on it (it may be busy
# with an earlier cell, and the kernel must not wait for it forever).
ANSWER_TIMEOUT = 10.0

engine_cache = engine_module("cache")

# The live cache view of each session, replaced by the next one (one subscription each).
_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {text!r}")
    return value


def _bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of bytes, got {text!r}"
        ) from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"expected -1 (no minimum) or more bytes, got {text!r}")
    return value


def size_text(n: float) -> str:
    """Bytes for people: ``812 B``, ``23.1 KiB``, ``4.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def age_text(seconds: float) -> str:
    """An age for people: ``42 s``, ``3 min``, ``5 h``, ``2 d``."""
    for limit, unit, div in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / div:.0f} {unit}"
    return f"{seconds / 86400:.0f} d"


def saved_text(stats: Any) -> str:
    """Seconds saved, never negative; a lower bound when jaxsys has no record of an entry."""
    exact = float(stats.time_saved)
    if not stats.unmeasured_hits:
        return f"{exact:.2f} s"
    floor = exact + float(stats.time_saved_at_least)
    return f">= {floor:.2f} s ({stats.unmeasured_hits} hit(s) on entries jaxsys has no record of)"


def format_entries(listing: dict, now_jaxlib: str | None = None) -> str:
    """The entries of a cache directory as an aligned table (newest first)."""
    entries = listing.get("entries", [])
    total = sum(e["bytes"] for e in entries)
    lines = [f"entries: {len(entries)}, {size_text(total)}"]
    if not entries:
        return lines[0]
    rows = [["module", "size", "made by jaxlib", "compile", "age"]]
    for e in entries:
        if e.get("compile_secs") is not None:
            compile_ = f"{e['compile_secs']:.2f} s"
        elif e.get("stored_secs"):
            compile_ = f">= {e['stored_secs']} s"
        else:
            compile_ = "< 1 s" if e.get("stored_secs") == 0 else "?"
        made = e.get("jaxlib") or "unknown (not written by jaxsys)"
        if now_jaxlib and e.get("jaxlib") and e["jaxlib"] != now_jaxlib:
            made += f" (this is {now_jaxlib}: never hit)"
        rows.append([e["module"], size_text(e["bytes"]), made, compile_, age_text(e["age"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def format_thresholds(stats: list) -> str:
    """JAX's write thresholds as every process reports them."""
    groups: dict[tuple, list[int]] = {}
    for s in stats:
        groups.setdefault((s.min_compile_secs, s.min_entry_bytes), []).append(s.rank)
    parts = []
    for (secs, size), ranks in groups.items():
        if secs is None:
            parts.append(f"[{format_procs(ranks)}] not reported yet")
            continue
        sized = "any size" if size is None or size <= 0 else f"at least {size} bytes"
        parts.append(
            f"[{format_procs(ranks)}] an entry is written when its compile took at least "
            f"{secs:g} s and it has {sized}"
        )
    return "thresholds: " + "; ".join(parts)


def format_process(s: Any) -> str:
    """One process's truth: served or why not, requests, hits, compiles, seconds."""
    served = "served" if s.served else (s.why_not or "not reported yet")
    return (
        f"p{s.rank}: {served}. {s.requests} request(s): {s.hits} hit(s), {s.shared} shared, "
        f"{s.compiles} compiled here ({s.compile_time:.2f} s); saved {saved_text(s)}, "
        f"reading {s.retrieval_time:.2f} s; {s.written} written"
    )


def ask(cluster, ranks: list[int], fn, *args) -> dict[int, Any]:
    """Run ``fn`` on the processes ``ranks``; a process that does not answer is named."""
    return cluster.call(ranks, fn, *args, timeout=ANSWER_TIMEOUT).values()


def _live_view(session, hub):
    """A CacheView that follows the hub; it replaces this session's previous one."""
    # Deferred: the widgets take most of a second to import; only the live view needs them.
    from ..widgets import CacheView

    previous = _views.pop(session, None)
    if previous is not None:
        previous()
    view = CacheView(hub.cache_stats())
    _views[session] = hub.subscribe(lambda h: view.update(h.cache_stats()), max_rate=4.0)
    return view


def _live_thresholds(cluster, stats: list) -> list:
    """The thresholds as each process holds them now: a cell may have changed them with
    ``jax.config.update`` since the process last reported its set-up."""
    # Setting nothing makes each process report its set-up again (the live view's rows
    # follow) and answer it.
    live = ask(cluster, [s.rank for s in stats], engine_cache.set_thresholds)
    now = {rank: answer or {} for rank, answer in live.items()}
    return [
        SimpleNamespace(
            rank=s.rank,
            min_compile_secs=now.get(s.rank, {}).get("min_compile_secs", s.min_compile_secs),
            min_entry_bytes=now.get(s.rank, {}).get("min_entry_bytes", s.min_entry_bytes),
        )
        for s in stats
    ]


def _stats(cluster) -> list:
    hub = cluster.telemetry
    return [] if hub is None else hub.cache_stats()


@magic_arguments("jaxsys cache")
@argument(
    "what",
    nargs="?",
    metavar="WHAT",
    choices=("show", "clear", "misses"),
    default="show",
    help="show the cache (default), clear it, or list why requests missed",
)
@argument(
    "--min-compile-secs",
    type=_seconds,
    default=None,
    metavar="S",
    help="write only entries whose compile took at least S seconds (JAX's default: 1)",
)
@argument(
    "--min-entry-bytes",
    type=_bytes,
    default=None,
    metavar="B",
    help="write only entries of at least B bytes (-1: no minimum)",
)
@argument(
    "--procs",
    "--proc",
    dest="proc",
    default=None,
    metavar="P",
    help="with misses: only this process (--proc is the older name)",
)
@argument("--limit", type=count, default=10, metavar="N", help="with misses: newest N per process")
def cache(session, args: argparse.Namespace) -> Any:
    """Show the persistent compilation cache: where, what, and what each process got.

    Every cluster has one cache directory (``%jaxsys start --cache-dir``; by default one
    per user and jaxlib version). Shown: its entries with their size, the jaxlib that made
    them and their age; JAX's two write thresholds; and per process the requests, hits,
    compiles shared by another process or made here, seconds spent and saved (the saved
    time is the original compile time of each entry reused, never negative) and, for a
    process the cache cannot serve, why. ``clear`` empties the directory; ``misses``
    lists why requests missed (JAX's ``jax_explain_cache_misses``, captured per process).
    ``--min-compile-secs``/``--min-entry-bytes`` set JAX's thresholds on every process,
    now and after restarts.

    Examples
    --------
    ::

        %jaxsys cache
        %jaxsys cache --min-compile-secs 0 --min-entry-bytes -1
        %jaxsys cache misses --procs 1
        %jaxsys cache clear
    """
    cluster = session.require_cluster()
    if args.what == "clear":
        return _clear(cluster, engine_cache)
    if args.what == "misses":
        return _misses(cluster, engine_cache, args.proc, args.limit)
    if args.min_compile_secs is not None or args.min_entry_bytes is not None:
        _set_thresholds(cluster, engine_cache, args.min_compile_secs, args.min_entry_bytes)
    listing = ask(cluster, [0], engine_cache.list_entries)[0]
    where = listing["dir"] or "none (this cluster runs without a persistent cache)"
    print(f"cache: {where}")
    if listing["dir"]:
        print(format_entries(listing, listing.get("jaxlib")))
    stats = _stats(cluster)
    if stats:
        print(format_thresholds(_live_thresholds(cluster, stats)))
        for s in stats:
            print(format_process(s))
    if cluster.telemetry is None:
        return None
    return _live_view(session, cluster.telemetry)


def _clear(cluster, engine_cache) -> None:
    answers = ask(cluster, cluster.ranks, engine_cache.clear_entries)
    by_dir: dict[str, list[int]] = {}
    for r, a in answers.items():
        by_dir.setdefault(a["dir"], []).append(r)
    removed = sum(a["removed"] for a in answers.values())
    freed = sum(a["bytes"] for a in answers.values())
    dirs = "; ".join(f"{d or 'no cache'} ({format_procs(rs)})" for d, rs in by_dir.items())
    print(f"jaxsys: removed {removed} entries ({size_text(freed)}) from {dirs}")
    print(
        "processes keep what they already compiled in memory; a restart (%jaxsys restart) "
        "starts them cold"
    )


def _set_thresholds(cluster, engine_cache, secs: float | None, size: int | None) -> None:
    ask(cluster, cluster.ranks, engine_cache.set_thresholds, secs, size)
    # Processes started later (restarts) read JAX's own variables at start-up.
    if secs is not None:
        cluster.env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = f"{secs:g}"
    if size is not None:
        cluster.env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = str(size)
    hub = cluster.telemetry
    if hub is not None:
        # The processes report their new thresholds as telemetry: wait for it to arrive.
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while time.monotonic() < deadline:
            stats = hub.cache_stats()
            if all(
                (secs is None or s.min_compile_secs == secs)
                and (size is None or s.min_entry_bytes == size)
                for s in stats
            ):
                break
            time.sleep(0.05)


def _misses(cluster, engine_cache, proc: str | None, limit: int) -> None:
    ranks = cluster.ranks if proc is None else [rank(proc)]
    for r in ranks:
        if not 0 <= r < cluster.nprocs:
            raise UsageError(
                f"there is no process {r}; this cluster's processes are "
                f"{format_procs(cluster.ranks)}"
            )
    answers = ask(cluster, ranks, engine_cache.describe, limit)
    for r, a in answers.items():
        misses = a.get("misses", [])
        if not misses:
            print(f"[p{r}] no misses recorded")
        for m in misses:
            stamp = time.strftime("%H:%M:%S", time.localtime(m["t"]))
            print(f"[p{r}] {stamp} {m['cache']} {m['fun']}: {m['reason']}")
