"""Compilation-cache accounting inside one JAX process: what each compile request became.

JAX reports a cache request, a hit and a compile duration as separate ``jax.monitoring``
events, and the rest only in its log: the key, whether an entry was written, why not. The
:class:`CacheWatch` follows one request at a time per thread through those events and
records (``jax._src.compiler`` and ``jax._src.compilation_cache``), and when the compile
duration closes it, sends one ``cache_compile`` event with the outcome:

- ``hit``: read from the persistent cache; *saved* is the original compile time of the
  entry (jaxsys's record of it, written when process 0 wrote the entry; JAX itself keeps
  only whole seconds, so without a record the saving is a lower bound);
- ``shared``: received from another process (``jax_share_binary_between_hosts``);
- ``compiled``: compiled here, with the reason it was not served and whether it was written.

Tracing-cache misses are explained by JAX when ``jax_explain_cache_misses`` is on; jaxsys
turns it on and captures the explanations per process instead of printing them
(``%jaxsys cache misses`` shows them). Why on CPU only process 0 is ever served: see
``docs/compilation-cache.md``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable

import jax
import jaxlib

from ..telemetry import schema
from . import cache_dir
from .state import STATE

# The loggers whose records carry the cache's decisions.
_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")
_TRACING_LOGGER = "jax._src.interpreters.partial_eval"
REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
SAVED = "/jax/compilation_cache/compile_time_saved_sec"
RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
#: Miss explanations kept per process.
MAX_MISSES = 200
#: Characters of one explanation sent as telemetry.
MAX_REASON = 600

NOT_SERVED_CPU = (
    "not served by the cache: on CPU, JAX keys entries by this process's own device "
    "topology and only process 0 writes entries, so this process compiles every program"
)

_watch_lock = threading.Lock()


def _jaxlib_version() -> str:
    return jaxlib.__version__


class CacheWatch:
    """Follows compile requests in one process and reports what each became.

    Parameters
    ----------
    rank : int
        This process's index.
    send : callable
        ``send(kind, **payload)``: where events go (the telemetry agent).
    """

    def __init__(self, rank: int, send: Callable[..., None]):
        self.rank = rank
        self.send = send
        self._local = threading.local()
        self.misses: deque[dict] = deque(maxlen=MAX_MISSES)
        self.outcomes: dict[str, int] = {"hit": 0, "shared": 0, "compiled": 0}
        # Whether jaxsys turned jax_explain_cache_misses on (then its warnings are ours).
        self.explaining = False
        self._levels: dict[str, int] = {}
        # Failures of the accounting itself (never raised into JAX): count and latest.
        self.errors = 0
        self.last_error = ""

    # -- set-up --------------------------------------------------------------------------

    def install(self) -> CacheWatch:
        """Register the listeners and log filters, turn on miss explanations, report config."""
        jax.monitoring.register_event_listener(self._on_event)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        for name in (*_LOGGERS, _TRACING_LOGGER):
            log = logging.getLogger(name)
            # What would have been shown before jaxsys lowered the level to read DEBUG.
            self._levels[name] = log.getEffectiveLevel()
            log.addFilter(self._filter)
            if name in _LOGGERS:
                log.setLevel(logging.DEBUG)
        if not jax.config.jax_explain_cache_misses:
            jax.config.update("jax_explain_cache_misses", True)
            self.explaining = True
        self.report_config()
        return self

    def config(self) -> dict:
        """The cache set-up of this process: directory, thresholds and whether it is served."""
        directory = jax.config.jax_compilation_cache_dir
        platform = jax.default_backend()
        served, why = True, ""
        if not directory:
            served, why = False, "no cache directory is set"
        elif platform == "cpu" and jax.process_count() > 1 and self.rank != 0:
            served, why = False, NOT_SERVED_CPU
        return {
            "dir": directory or "",
            "platform": platform,
            "min_compile_secs": float(jax.config.jax_persistent_cache_min_compile_time_secs),
            "min_entry_bytes": int(jax.config.jax_persistent_cache_min_entry_size_bytes),
            "served": served,
            "why_not": why,
            "jaxlib": _jaxlib_version(),
            "explain": bool(jax.config.jax_explain_cache_misses),
        }

    def report_config(self) -> dict:
        """Send this process's cache set-up to the kernel (and return it)."""
        cfg = self.config()
        self.send(schema.CACHE_CONFIG, **cfg)
        return cfg

    # -- following one request -------------------------------------------------------------

    def _pending(self) -> dict:
        p = getattr(self._local, "p", None)
        if p is None:
            p = self._local.p = {}
        return p

    def _on_event(self, event: str, **kwargs) -> None:
        if event == REQUEST:
            p = self._pending()
            p.clear()
            p["requested"] = True

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        # Listeners run inside JAX's compile path: a failure here must never fail a compile.
        try:
            if event == SAVED:
                self._pending()["jax_saved"] = duration
            elif event == RETRIEVAL:
                self._pending()["retrieval"] = duration
            elif event == BACKEND_COMPILE:
                self._finish(duration, str(kwargs.get("fun_name", "")))
        except Exception as e:  # noqa: BLE001 - the request is then not accounted for
            self._failed(e)
        finally:
            if event == BACKEND_COMPILE:
                self._pending().clear()

    def _filter(self, record: logging.LogRecord) -> bool:
        """Read a cache record; pass it on only if it would have been shown without jaxsys."""
        ours = False
        try:
            ours = self._read(record)
        except Exception as e:  # noqa: BLE001 - accounting must never break logging or compiling
            self._failed(e)
        if ours and self.explaining:
            return False  # shown on demand (%jaxsys cache misses), never in cell output
        return record.levelno >= self._levels.get(record.name, logging.WARNING)

    def _failed(self, error: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(error).__name__}: {error}"[:MAX_REASON]

    def _read(self, record: logging.LogRecord) -> bool:
        msg, args = str(record.msg), record.args or ()
        p = self._pending()
        if msg.startswith("TRACING CACHE MISS"):
            self._tracing_miss(record.getMessage())
            return True
        if msg.startswith("Persistent compilation cache hit for"):
            p.update(outcome="hit", module=args[0], key=args[1])
        elif msg.startswith("PERSISTENT COMPILATION CACHE MISS"):
            p.update(outcome="compiled", module=args[0], key=args[1])
        elif msg.startswith("Waiting for module"):
            p["outcome"] = "shared"
        elif "took at least" in msg:
            p["compile_secs"] = float(args[2])
        elif msg.startswith("Not writing persistent cache entry for"):
            p["compile_secs"] = float(args[2])
            p["not_written"] = f"its compile took {args[2]:.2f} s, below the {args[1]:g} s minimum"
        elif msg.startswith("Not writing persistent cache entry since process_id"):
            p["not_written"] = "only process 0 writes entries"
        elif msg.startswith("Not writing persistent cache entry with key") and len(args) >= 3:
            p["not_written"] = f"its {args[1]} bytes are below the {args[2]} byte minimum"
        elif msg.startswith("Not writing persistent cache entry with key"):
            p["not_written"] = "no cache directory is set"
        elif msg.startswith("Writing") and "persistent compilation cache" in msg:
            p["written"] = True
        else:
            return False
        return True

    def _tracing_miss(self, text: str) -> None:
        lines = text.splitlines()
        # A first trace is no miss worth explaining, unless JAX suspects a redefinition.
        if any("never seen function" in line for line in lines) and not any(
            "same line" in line for line in lines
        ):
            return
        where = lines[0].removeprefix("TRACING CACHE MISS at ").rstrip(":") if lines else ""
        reason = " ".join(line.strip() for line in lines[1:])[:MAX_REASON]
        self._note_miss("tracing", where, reason)

    def _note_miss(self, cache: str, fun: str, reason: str) -> None:
        # The event carries its own time; the local list keeps one for %jaxsys cache misses.
        self.send(schema.CACHE_MISS, cache=cache, fun=fun, reason=reason)
        self.misses.append({"t": time.time(), "cache": cache, "fun": fun, "reason": reason})

    def _finish(self, duration: float, fun_name: str) -> None:
        p = self._pending()
        outcome = p.get("outcome", "compiled")
        directory = jax.config.jax_compilation_cache_dir
        key = p.get("key", "")
        event = {
            "fun": fun_name,
            "module": p.get("module", ""),
            "key": key,
            "outcome": outcome,
            "requested": bool(p.get("requested")),
            "seconds": float(duration),
            "compile_secs": 0.0,
            "saved": 0.0,
            "saved_at_least": 0.0,
            "measured": True,
            "retrieval": float(p.get("retrieval", 0.0)),
            "written": bool(p.get("written")),
            "reason": "",
        }
        if outcome == "hit":
            self._saved(event, p, directory)
        elif outcome == "compiled":
            event["compile_secs"] = float(p.get("compile_secs", duration))
            if event["written"] and directory and key:
                self._record(directory, key, event)
            if event["requested"]:
                event["reason"] = self._miss_reason(p, directory)
                self._note_miss("persistent", fun_name or event["module"], event["reason"])
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.send(schema.CACHE_COMPILE, **event)

    def _saved(self, event: dict, p: dict, directory: str | None) -> None:
        record = cache_dir.read_record(directory, event["key"]) if directory else None
        if record and "compile_secs" in record:
            event["saved"] = float(record["compile_secs"])
        else:
            # JAX's saving is its stored whole seconds minus the read: add the read back.
            stored = float(p.get("jax_saved", 0.0)) + event["retrieval"]
            event["saved_at_least"] = float(round(stored))
            event["measured"] = False

    def _record(self, directory: str, key: str, event: dict) -> None:
        try:
            cache_dir.write_record(
                directory,
                key,
                {
                    "module": event["module"],
                    "fun": event["fun"],
                    "compile_secs": event["compile_secs"],
                    "jaxlib": _jaxlib_version(),
                    "jax": jax.__version__,
                    "written": time.time(),
                    "process": self.rank,
                },
            )
        except OSError:
            pass  # the entry stays usable; its saving is then shown as a lower bound

    def _miss_reason(self, p: dict, directory: str | None) -> str:
        cfg_served = self.config()
        if not cfg_served["served"]:
            why = cfg_served["why_not"]
        else:
            why = self._why_no_entry(p.get("module", ""), p.get("key", ""), directory)
        if p.get("written"):
            return f"{why}; written to the cache ({p.get('compile_secs', 0.0):.2f} s to compile)"
        if p.get("not_written") and cfg_served["served"]:
            return f"{why}; not written: {p['not_written']}"
        return why

    def _why_no_entry(self, module: str, key: str, directory: str | None) -> str:
        mine = _jaxlib_version()
        earlier = [r for r in cache_dir.records_for(directory, module) if r["key"] != key]
        elsewhere = [
            r
            for d in (cache_dir.sibling_versions(directory) if directory else [])
            for r in cache_dir.records_for(d, module)
        ]
        other = sorted(
            {r.get("jaxlib") for r in earlier + elsewhere if r.get("jaxlib") != mine} - {None}
        )
        if other:
            return (
                f"entries for {module} were made by jaxlib {', '.join(other)}; this process "
                f"runs jaxlib {mine}, and the jaxlib version is part of the key"
            )
        if earlier:
            return (
                f"{module} is cached under another key: its program, shapes, compile options "
                "or XLA flags changed since"
            )
        return f"no entry for {module} yet"

    # -- on demand -----------------------------------------------------------------------

    def recent_misses(self, limit: int = 50) -> list[dict]:
        """The newest miss explanations, oldest first."""
        return list(self.misses)[-limit:]


def install(agent) -> CacheWatch:
    """Start accounting in this process, reporting through ``agent`` (once per process)."""
    with _watch_lock:
        if STATE.cache_watch is None:
            STATE.cache_watch = CacheWatch(agent.rank, agent.send).install()
        return STATE.cache_watch


def current() -> CacheWatch | None:
    """This process's watch, once installed."""
    return STATE.cache_watch


# -- functions the kernel ships to the engines --------------------------------------------------


def describe(limit: int = 50) -> dict:
    """This process's cache set-up, outcome counts, newest miss explanations and how often
    the accounting itself failed (``errors``, ``last_error``)."""
    watch = STATE.cache_watch
    if watch is None:
        return {"config": None, "outcomes": {}, "misses": [], "errors": 0, "last_error": ""}
    return {
        "config": watch.config(),
        "outcomes": dict(watch.outcomes),
        "misses": watch.recent_misses(limit),
        "errors": watch.errors,
        "last_error": watch.last_error,
    }


def list_entries() -> dict:
    """This process's cache directory and its entries (see :func:`cache_dir.entries`)."""
    directory = jax.config.jax_compilation_cache_dir
    return {
        "dir": directory or "",
        "jaxlib": _jaxlib_version(),
        "entries": cache_dir.entries(directory),
    }


def clear_entries() -> dict:
    """Empty this process's cache directory; JAX's in-memory caches are left alone."""
    directory = jax.config.jax_compilation_cache_dir
    removed, freed = cache_dir.clear(directory)
    return {"dir": directory or "", "removed": removed, "bytes": freed}


def set_thresholds(
    min_compile_secs: float | None = None, min_entry_bytes: int | None = None
) -> dict:
    """Set JAX's two write thresholds in this process; returns the new set-up."""
    if min_compile_secs is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
    if min_entry_bytes is not None:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", int(min_entry_bytes))
    watch = STATE.cache_watch
    return watch.report_config() if watch is not None else {"pid": os.getpid()}
