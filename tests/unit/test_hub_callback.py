"""The hub's batchspawner callback: a starting server's port is taken, once; every other key
(a command the hub would run, a prefix, an address) is refused and nothing is set."""

from __future__ import annotations

import pytest

pytest.importorskip("jupyterhub")
pytest.importorskip("batchspawner")

from tornado import web  # noqa: E402

from jaxsys_kernel.hub.callback import ROUTE, PortOnlyCallbackHandler, check_report  # noqa: E402


class _Spawner:
    def __init__(self, pending="spawn", port=0):
        self.pending = pending
        self.port = port


def _refused(data, spawner) -> tuple[int, str]:
    with pytest.raises(web.HTTPError) as e:
        check_report(data, spawner)
    return e.value.status_code, e.value.log_message


def test_a_starting_servers_port_is_taken():
    assert check_report({"port": 8888}, _Spawner()) == 8888


@pytest.mark.parametrize(
    "data",
    [
        {"batch_query_cmd": "id > /tmp/x; squeue"},
        {"port": 8888, "exec_prefix": "true;"},
        {"port": 8888, "ip": "10.0.0.1"},
        {"batch_cancel_cmd": "x", "cmd": ["sh"]},
    ],
)
def test_any_other_key_is_refused_and_named(data):
    status, message = _refused(data, _Spawner())
    assert status == 400
    assert all(repr(k) in message for k in data if k != "port"), message


@pytest.mark.parametrize("port", [0, 65536, -1, "8888", 8888.0, True, None, [8888]])
def test_a_port_that_is_no_port_is_refused(port):
    assert _refused({"port": port}, _Spawner()) == (
        400,
        "'port' must be an integer from 1 to 65535",
    )


def test_a_second_report_or_one_outside_a_start_is_refused():
    assert _refused({"port": 9000}, _Spawner(port=8888))[0] == 409
    assert _refused({"port": 9000}, _Spawner(pending=None))[0] == 409


def test_a_token_of_no_server_and_a_body_of_no_object_are_refused():
    assert _refused({"port": 8888}, None)[0] == 403
    assert _refused(["port", 8888], _Spawner())[0] == 400


def test_many_refused_keys_are_named_briefly():
    data = {f"k{i}" * 100: 1 for i in range(50)}
    status, message = _refused(data, _Spawner())
    assert status == 400 and len(message) < 400


def test_install_replaces_batchspawners_route():
    from jupyterhub.apihandlers import default_handlers

    from jaxsys_kernel.hub.callback import install

    install()
    install()
    routes = [h for h in default_handlers if h[0] == ROUTE]
    assert routes == [(ROUTE, PortOnlyCallbackHandler)]


def test_the_shipped_configuration_takes_the_sites_variables():
    from traitlets.config import Config

    from jaxsys_kernel.hub.config import configure

    c = Config()
    env = {"JAXSYS_HUB_USER_ENV": "/opt/lab", "JAXSYS_HUB_CPUS": "8", "SLURM_CONF": "/s.conf",
           "JAXSYS_HUB_SBATCH_OPTIONS": "--exclusive"}  # fmt: skip
    configure(c, env)
    s = c.SlurmSpawner
    assert c.JupyterHub.spawner_class == "batchspawner.SlurmSpawner"
    assert s.cmd == ["/opt/lab/bin/jupyterhub-singleuser"]
    assert s.batchspawner_singleuser_cmd == "/opt/lab/bin/batchspawner-singleuser"
    assert (s.req_nprocs, s.req_options) == ("8", "--exclusive")
    assert s.exec_prefix == "sudo -E -u {username}"
    assert s.environment == {"SLURM_CONF": "/s.conf"}
