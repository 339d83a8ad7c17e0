"""``%jaxsys start --explain`` and ``--no-recoverability``: the plain-JAX call each process
made, rendered from what it reported; fate-sharing on a real cluster without recoverability."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from IPython.testing import globalipapp

from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.magics.explain import explain
from jaxsys_kernel.magics.magics import JaxSysMagics

from ..fakes import StartSession


def record(rank: int, recoverable: bool, mtls: bool) -> ProcessInfo:
    settings = [
        {
            "option": "jax_enable_recoverability",
            "value": recoverable,
            "env": "JAX_ENABLE_RECOVERABILITY",
            "env_value": "1" if recoverable else None,
        },
        {
            "option": "jax_mtls_cert_file",
            "value": f"/pki/process-{rank}.pem" if mtls else None,
            "env": "JAX_MTLS_CERT_FILE",
            "env_value": f"/pki/process-{rank}.pem" if mtls else None,
        },
    ]
    call = {
        "coordinator_address": "10.0.0.1:1234",
        "num_processes": 2,
        "process_id": rank,
        "initialization_timeout": 60,
        "heartbeat_timeout_seconds": 5,
    }
    return ProcessInfo(
        rank=rank, pid=100 + rank, host=f"h{rank}", init_call=call, init_settings=settings
    )


def test_explain_renders_each_process_call_and_options():
    text = explain([record(0, True, True), record(1, True, True)], "mTLS (test)")
    blocks = text.split("\n\n")
    assert blocks[0] == "# security: mTLS (test)"
    assert blocks[1].startswith("# process 0 (pid 100 on h0)\nimport jax\n")
    assert "process_id=1," in blocks[2] and "process_id=0," not in blocks[2]
    assert "jax.config.update('jax_mtls_cert_file', '/pki/process-1.pem')" in blocks[2]
    assert "set by $JAX_MTLS_CERT_FILE\n" in blocks[2] + "\n"
    assert "set by $JAX_ENABLE_RECOVERABILITY=1;" in blocks[1]
    assert "survivors keep running" in blocks[1]
    # The rendered call is valid Python that names every argument once.
    code = blocks[1].split("import jax\n", 1)[1].split("jax.distributed.initialize", 1)[1]
    args = eval("dict" + code)  # noqa: S307 - our own rendering, checked for syntax
    assert args["coordinator_address"] == "10.0.0.1:1234" and args["process_id"] == 0


def test_explain_without_mtls_or_recoverability():
    text = explain([record(0, False, False)])
    assert "jax_mtls_cert_file" not in text  # unset options stay at JAX's default: no line
    assert "JAX's default; fate-sharing" in text


def test_explain_shows_the_transfer_socket_jaxsys_set():
    p = record(0, True, False)
    p.init_settings.append(
        {
            "option": "jax_cross_host_transfer_socket_address",
            "value": "127.0.0.1:40123",
            "set_by": "set by jaxsys (--transfer-ports)",
        }
    )
    text = explain([p])
    line = "jax.config.update('jax_cross_host_transfer_socket_address', '127.0.0.1:40123')"
    assert f"{line}  # set by jaxsys (--transfer-ports)" in text
    # Options come before the call, as they must: JAX reads this one when its backend starts.
    assert text.index(line) < text.index("jax.distributed.initialize(")


def test_explain_names_a_process_that_did_not_report():
    text = explain([ProcessInfo(rank=3, pid=9, host="x")])
    assert "process 3" in text and "has not reported" in text


@pytest.fixture(scope="module")
def shell():
    return globalipapp.start_ipython() or globalipapp.get_ipython()  # None once started


def test_start_options_reach_the_session(shell, capsys):
    fake = StartSession(
        SimpleNamespace(processes=[record(0, False, True)], security="mTLS (fake)", nprocs=1)
    )
    shell.register_magics(JaxSysMagics(shell, fake))
    shell.run_line_magic("jaxsys", "start --hosts 1")
    assert "recoverable" not in fake.kwargs and capsys.readouterr().out == ""
    shell.run_line_magic("jaxsys", "start --hosts 1 --no-recoverability --explain")
    assert fake.kwargs["recoverable"] is False
    out = capsys.readouterr().out
    # The start prints the security line; the explanation does not repeat it.
    assert "security" not in out and "process_id=0," in out
