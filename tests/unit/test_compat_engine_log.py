"""An engine's logger makes no record of a message that every handler would drop."""

from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace

from jaxsys_kernel import _compat


class Kept(logging.Handler):
    def __init__(self, level):
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def engine_log(*levels):
    # As traitlets leaves an application's logger: DEBUG, with handlers at the level asked.
    log = logging.getLogger(f"IPEngine.test.{uuid.uuid4().hex}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    handlers = [Kept(level) for level in levels]
    for h in handlers:
        log.addHandler(h)
    return log, handlers


def test_a_debug_line_is_not_made_into_a_record_and_a_warning_still_goes_out():
    log, (handler,) = engine_log(logging.WARNING)
    made = []
    log.makeRecord = lambda *a, **k: made.append(a) or logging.Logger.makeRecord(log, *a, **k)
    assert _compat.quiet_engine_log(SimpleNamespace(log=log))
    log.debug("each request says this")
    assert made == []
    log.warning("this one matters")
    assert [r.getMessage() for r in handler.records] == ["this one matters"]


def test_the_most_verbose_handler_still_gets_what_it_asked_for():
    log, (quiet, verbose) = engine_log(logging.WARNING, logging.INFO)
    assert _compat.quiet_engine_log(SimpleNamespace(log=log))
    assert log.level == logging.INFO
    log.info("kept")
    assert [r.getMessage() for r in verbose.records] == ["kept"] and quiet.records == []


def test_a_kernel_without_a_logger_or_handlers_is_left_as_it_is():
    assert not _compat.quiet_engine_log(None)
    log, _ = engine_log()
    assert not _compat.quiet_engine_log(SimpleNamespace(log=log))
    assert log.level == logging.DEBUG
