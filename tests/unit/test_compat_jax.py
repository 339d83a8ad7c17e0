"""The divergence check's one private reach into JAX, in ``_compat``: the version it accepts,
the records and the frame it reads, and that the installed JAX still has them."""

from __future__ import annotations

import inspect
import logging
from types import SimpleNamespace

import pytest

from jaxsys_kernel import _compat


def frame(name, back=None, f_locals=None, filename="/x.py"):
    code = SimpleNamespace(co_filename=filename, co_name=name)
    return SimpleNamespace(f_code=code, f_lineno=1, f_back=back, f_locals=f_locals or {})


@pytest.mark.parametrize("version", ["0.12.0", "0.12.0.1", "0.12.3rc1"])
def test_the_release_it_was_written_for_is_accepted(version):
    assert _compat.jax_dispatch_unsupported(version) is None


@pytest.mark.parametrize("version", ["0.11.9", "0.13.0", "1.0.0"])
def test_another_release_turns_the_check_off_and_says_so(version):
    why = _compat.jax_dispatch_unsupported(version)
    assert why == (
        "the divergence check reads jax._src.pjit of JAX 0.12.x; "
        f"this process runs JAX {version}, so it is off"
    )


def test_only_jaxs_dispatch_records_are_taken():
    def record(msg):
        return logging.LogRecord(
            _compat.JAX_DISPATCH_LOGGER, logging.WARNING, "x", 1, msg, (), None
        )

    assert _compat.is_jax_dispatch_record(record("\nDISTRIBUTED_DEBUG_BEGIN\nf\n"))
    assert not _compat.is_jax_dispatch_record(record("compiling f"))
    assert not _compat.is_jax_dispatch_record(record(RuntimeError("not a string")))


def test_the_call_is_read_from_jaxs_frame_above_the_logger():
    sharding = object()
    pjit = frame(
        "_pjit_call_impl_python",
        f_locals={
            "name": "step",
            "args": [1, 2],
            "in_shardings": (sharding,),
            "out_shardings": (),
            "fingerprint": b"\x01",
        },
    )
    logger = frame("warning", back=frame("log", back=pjit))
    call = _compat.jax_dispatch_call(logger)
    assert call["frame"] is pjit
    assert call["name"] == "step" and call["args"] == (1, 2) and call["fingerprint"] == b"\x01"
    assert call["in_shardings"] == (sharding,) and call["out_shardings"] == ()
    assert _compat.jax_dispatch_call(frame("elsewhere", back=frame("main"))) is None


def test_the_installed_jax_still_logs_from_the_frame_read():
    # An upgrade of JAX that moves any of these fails here, not silently in a cell.
    import jax
    from jax._src import pjit, util

    assert _compat.jax_dispatch_unsupported(jax.__version__) is None
    impl = getattr(pjit, _compat._JAX_DISPATCH_FRAME)
    params = inspect.signature(impl).parameters
    assert {"name", "in_shardings", "out_shardings"} <= set(params)
    assert "args" in params or any(p.kind is p.VAR_POSITIONAL for p in params.values())
    source = inspect.getsource(impl)
    assert "fingerprint" in source and "distributed_debug" in source
    assert util.logger.name == _compat.JAX_DISPATCH_LOGGER
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    util.logger.addHandler(handler)
    jax.config.update("jax_distributed_debug", True)
    try:
        util.distributed_debug_log(("Running pjit'd function", "f"))
    finally:
        jax.config.update("jax_distributed_debug", False)
        util.logger.removeHandler(handler)
    assert [_compat.is_jax_dispatch_record(r) for r in records] == [True]
