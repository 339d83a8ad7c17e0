"""A local or ssh cluster's hosts kept for ``%jaxsys attach``: ``stop --keep-allocation``
saves them under a key with a lease; an attach holds the lease exclusively while its
cluster runs, a plain stop gives it back, and a lapsed lease is said and forgotten."""

from __future__ import annotations

import json
import time
import types

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.cluster import allocation_hosts as kept
from jaxsys_kernel.cluster.allocation import load_saved, save_allocation, saved_file
from jaxsys_kernel.cluster.allocation_hosts import KeptHosts, forget_lapsed, lease_file
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import make_launcher
from jaxsys_kernel.cluster.lease import RUN, LeaseHeldError, process_start
from jaxsys_kernel.magics import actions

from ..fakes import StartSession

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def state(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSYS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("JAXSYS_LEASE_TTL", "3")
    yield tmp_path / "state"
    # Leases this process took stop renewing (their threads end with their release).
    for key in list(kept._HELD):
        kept._HELD.pop(key).release()


def _cluster(**options):
    config = ClusterConfig(hosts=2, launcher="local", **options)
    launcher = make_launcher(config)
    return types.SimpleNamespace(config=config, world=types.SimpleNamespace(launcher=launcher))


class _Session(StartSession):
    """start() makes a cluster of the options given; stop() tears it down."""

    def start(self, **kwargs):
        super().start(**kwargs)
        self.cluster = _cluster(devices_per_host=kwargs.get("devices_per_host", 1))

    def stop(self):
        self.cluster.world.launcher.release()  # what the teardown does
        return 0.5


def _lease(key: str) -> dict:
    return json.loads(lease_file(key).read_text().splitlines()[1])


def _keep(session) -> str:
    actions.dispatch(session, "stop --keep-allocation")
    alloc, options = load_saved()
    assert isinstance(alloc, KeptHosts) and options["launcher"] == "local"
    return alloc.job_id


def test_a_local_cluster_keeps_its_hosts_on_a_lease(capsys):
    key = _keep(_Session(_cluster(devices_per_host=1)))
    out = capsys.readouterr().out
    assert f"this machine (kept as {key}), are kept with its options" in out, out
    assert "its processes stop" in out and "%jaxsys attach starts a cluster of 2" in out
    held = _lease(key)
    assert (held["mode"], held["pid"]) == ("kept", kept.os.getpid())
    assert KeptHosts.from_dict(load_saved()[0].to_dict()).job_id == key


def test_attach_takes_the_kept_hosts_and_a_plain_stop_gives_them_back():
    key = _keep(_Session(_cluster(devices_per_host=1)))
    session = _Session(cluster=None)
    actions.dispatch(session, "attach --devices-per-host 2")
    assert session.kwargs["launcher"] == "local" and session.kwargs["hosts"] == 2
    assert "launcher_options" not in session.kwargs  # a key is no job id
    assert session.cluster.world.launcher.allocation.job_id == key
    assert _lease(key)["mode"] == RUN
    session.stop()
    assert load_saved() is None and not lease_file(key).exists()


def test_a_failed_start_keeps_the_hosts_for_another_try():
    key = _keep(_Session(_cluster(devices_per_host=1)))

    class Failing(_Session):
        def start(self, **kwargs):
            raise UsageError("a cluster of 2 processes is already running")

    with pytest.raises(UsageError, match="already running"):
        actions.dispatch(Failing(cluster=None), "attach")
    assert _lease(key)["mode"] == "kept" and load_saved()[0].job_id == key


def _held_by_another(key: str, mode: str = RUN, gone: bool = False) -> int:
    """A lease of ``key`` held by another live process (this one's parent), or by a
    process that is ``gone`` (the parent's pid with another start time); its pid."""
    pid = kept.os.getppid()
    state = {
        "expires": time.time() + 30,
        "pid": pid,
        "start": process_start(pid) + (1 if gone else 0),
        "host": kept.socket.gethostname(),
        "ttl": 30.0,
        "mode": mode,
    }
    lease_file(key).parent.mkdir(parents=True, exist_ok=True)
    lease_file(key).write_text(f"{int(state['expires'])}\n{json.dumps(state)}\n")
    return pid


def test_hosts_in_use_by_another_live_kernel_are_refused_by_name():
    key = "local-0123456789ab"
    save_allocation(KeptHosts(job_id=key), {"hosts": 2, "launcher": "local"})
    pid = _held_by_another(key)
    with pytest.raises(UsageError, match=rf"in use by process {pid} on .*%jaxsys stop"):
        actions.dispatch(_Session(cluster=None), "attach")
    with pytest.raises(LeaseHeldError):
        KeptHosts(job_id=key).attach()
    # Its holder gone (a pid now naming another process), the hosts are free before the
    # lease's end.
    _held_by_another(key, gone=True)
    actions.dispatch(_Session(cluster=None), "attach")
    assert _lease(key)["pid"] == kept.os.getpid()


def test_kept_hosts_are_free_for_any_kernel_while_only_kept():
    key = "local-0123456789ab"
    _held_by_another(key, mode="kept")
    KeptHosts(job_id=key).attach()
    assert _lease(key)["pid"] == kept.os.getpid()


def test_a_lapsed_lease_is_said_and_forgotten(monkeypatch):
    key = _keep(_Session(_cluster(devices_per_host=1)))
    kept._HELD.pop(key).release()  # as if the keeping kernel had died...
    held = json.loads(saved_file().read_text())
    lease = {"expires": time.time() - 1, "pid": 1, "start": None, "host": "h", "ttl": 3.0}
    lease_file(key).write_text(f"{int(lease['expires'])}\n{json.dumps(lease)}\n")  # ...and lapsed
    with pytest.raises(UsageError, match=r"is gone \(its lease lapsed at .*--launcher local"):
        actions.dispatch(_Session(cluster=None), "attach")
    assert load_saved() is None
    assert not lease_file(key).exists()  # its lease went with it
    save_allocation(KeptHosts.from_dict(held["allocation"]), held["options"])
    assert forget_lapsed() == [key] and load_saved() is None


def test_local_hosts_kept_on_another_machine_are_refused():
    key = "local-0123456789ab"
    with pytest.raises(LeaseHeldError, match="are the machine elsewhere: attach in a kernel"):
        KeptHosts(job_id=key, machine="elsewhere").attach()
    # Named hosts are the same from any machine.
    KeptHosts(["node1"], job_id=key, machine="elsewhere").attach()


@pytest.mark.parametrize("key", ["12", "../x", "local-xyz", None])
def test_a_saved_grant_with_a_bad_key_is_refused(key):
    with pytest.raises(ValueError, match="is not the key of kept hosts"):
        KeptHosts.from_dict({"kind": "kept-hosts", "job_id": key})


def test_attach_with_a_job_id_still_means_a_slurm_job():
    with pytest.raises(UsageError, match="JOB must be a Slurm job id"):
        actions.dispatch(_Session(cluster=None), "attach local-0123456789ab")
