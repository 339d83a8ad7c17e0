"""A Kubernetes world kept for ``%jaxsys attach``, checked without a cluster: how a world is
named, what the API's answers mean for an attach, what keep and a plain stop do to the
world, what an attach refuses and says, what a generation holds, and how a pod waits for
the next one. The whole path runs against the test cluster in
tests/live/test_kubernetes_kept.py."""

from __future__ import annotations

import json
import types

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.cluster.allocation import JobState, load_saved, save_allocation, saved_file
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import kubernetes_api, make_launcher
from jaxsys_kernel.cluster.launchers.kubernetes import KubernetesLauncher
from jaxsys_kernel.cluster.launchers.kubernetes_kept import KeptWorld
from jaxsys_kernel.cluster.launchers.kubernetes_world import (
    KEPT_LABEL,
    PodWorlds,
    generation_files,
)
from jaxsys_kernel.cluster.profile import controller_file
from jaxsys_kernel.cluster.records import ClusterStartError
from jaxsys_kernel.engine import pod
from jaxsys_kernel.errors import ConfigError
from jaxsys_kernel.magics import actions

from ..fakes import StartSession

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def state(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSYS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("JAXSYS_LEASE_TTL", "30")
    return tmp_path / "state"


def _pod(name: str, phase: str = "Running", index: int = 0):
    labels = {kubernetes_api.INDEX_LABEL: str(index)}
    meta = types.SimpleNamespace(name=name, namespace="default", labels=labels, annotations={})
    return types.SimpleNamespace(metadata=meta, status=types.SimpleNamespace(phase=phase))


def _secret(kept: bool = True, owner_kind: str = "Job") -> dict:
    labels = {"jaxsys.dev/world": "w-1", **({KEPT_LABEL: "true"} if kept else {})}
    owner = {"apiVersion": "batch/v1", "kind": owner_kind, "name": "w-1", "uid": "u"}
    meta = {"name": "w-1-credentials", "namespace": "default", "labels": labels}
    return {"metadata": {**meta, "ownerReferences": [owner], "resourceVersion": "7"}}


@pytest.fixture
def cluster_api(monkeypatch):
    """The API calls of a world, answered from what the test sets."""
    seen = types.SimpleNamespace(secret=_secret(), pods=[_pod("w-1-0-a"), _pod("w-1-1-b", index=1)])
    seen.written, seen.annotated, seen.conflict = [], [], False
    # The kernel's own pod (None: the kernel runs outside the cluster), and the owners set.
    seen.owner, seen.owned = None, []

    def replace(api, secret):
        if isinstance(seen.conflict, Exception):
            raise seen.conflict  # the API failed
        seen.written.append(json.loads(json.dumps(secret)))
        return not seen.conflict

    monkeypatch.setattr(kubernetes_api, "api_client", lambda kubeconfig=None: object())
    monkeypatch.setattr(kubernetes_api, "read_secret", lambda api, ns, name: seen.secret)
    monkeypatch.setattr(kubernetes_api, "pods", lambda api, ns, world: seen.pods)
    monkeypatch.setattr(kubernetes_api, "replace_secret", replace)
    monkeypatch.setattr(
        kubernetes_api, "annotate", lambda api, p, k, v: seen.annotated.append((p.metadata.name, v))
    )

    def own_pod_owner(api, namespace):
        if seen.owner is None:
            return None, ""
        return seen.owner, f"owned by the kernel's pod {seen.owner['name']}: deleting it ..."

    def set_owner(api, top, owner):
        if isinstance(seen.owner_error, Exception):
            raise seen.owner_error
        seen.owned.append((top["kind"], top["metadata"]["name"], owner and owner["name"]))

    seen.owner_error = None
    monkeypatch.setattr(kubernetes_api, "own_pod_owner", own_pod_owner)
    monkeypatch.setattr(kubernetes_api, "set_owner", set_owner)
    return seen


# -- naming a world ----------------------------------------------------------------------


def test_a_world_is_named_by_its_namespace_and_name():
    alloc = KubernetesLauncher.job_allocation("ml/jaxsys-1a-1", options={"kubeconfig": "/k"})
    assert (alloc.job_id, alloc.namespace, alloc.world, alloc.kubeconfig) == (
        "ml/jaxsys-1a-1",
        "ml",
        "jaxsys-1a-1",
        "/k",
    )
    assert alloc.describe_job() == "Kubernetes world jaxsys-1a-1 in namespace ml"
    # Without a namespace it could be a Slurm job's id or kept hosts' key: refused.
    for bad in ("jaxsys-1a-1", "12", "ml/Big_World", "/w", "ml/"):
        with pytest.raises(ConfigError, match="JOB must name a Kubernetes world as NAMESPACE"):
            KubernetesLauncher.job_allocation(bad)


def test_a_kept_world_is_saved_and_found_again_with_its_kubeconfig(state):
    save_allocation(KeptWorld("ml/w-1", "/k", "JobSet"), {"hosts": 2, "launcher": "kubernetes"})
    alloc, options = load_saved()
    assert isinstance(alloc, KeptWorld)
    assert (alloc.job_id, alloc.kubeconfig, alloc.top_kind) == ("ml/w-1", "/k", "JobSet")
    assert options == {"hosts": 2, "launcher": "kubernetes"}


# -- what the API says -------------------------------------------------------------------


def test_a_world_runs_while_its_secret_and_running_pods_are_there(cluster_api):
    status = KeptWorld("default/w-1").poll()
    assert (status.state, status.reason, status.hosts) == (
        JobState.RUNNING,
        "kept",
        ["w-1-0-a", "w-1-1-b"],
    )
    cluster_api.secret = _secret(kept=False)
    assert KeptWorld("default/w-1").poll().describe() == "running on w-1-0-a,w-1-1-b"
    cluster_api.pods[1].status.phase = "Succeeded"
    status = KeptWorld("default/w-1").poll()
    assert status.state.terminal and status.reason == "pod w-1-1-b ended"
    cluster_api.secret = None
    assert "no kernel attached within their wait" in KeptWorld("default/w-1").poll().reason


# -- keep and stop -----------------------------------------------------------------------


class _Worlds:
    """The launcher's worlds: what keep and delete were asked."""

    def __init__(self):
        self.name, self.namespace, self.calls = "w-1", "default", []

    def keep(self):
        self.calls.append("keep")
        self.name = None

    def delete(self):
        self.calls.append("delete")
        self.name = None


def _k8s_cluster():
    config = ClusterConfig(hosts=2, launcher="kubernetes", launcher_options={"image": "i"})
    launcher = make_launcher(config)
    launcher.worlds = _Worlds()
    launcher.allocation = KeptWorld("default/w-1")
    return types.SimpleNamespace(config=config, world=types.SimpleNamespace(launcher=launcher))


class _Session(StartSession):
    def stop(self):
        self.cluster.world.launcher.release()  # what the teardown does
        return 0.5


def test_stop_keep_allocation_keeps_the_world_and_says_how_to_attach(capsys):
    cluster = _k8s_cluster()
    actions.dispatch(_Session(cluster), "stop --keep-allocation --name big")
    out = capsys.readouterr().out
    assert "Kubernetes world w-1 in namespace default is kept" in out
    assert "its 2 pods wait 30 s for %jaxsys attach --name big" in out
    assert "kubectl delete job w-1 -n default gives it back" in out
    assert cluster.world.launcher.worlds.calls == ["keep"]
    alloc, options = load_saved("big")
    assert alloc.job_id == "default/w-1" and options["launcher"] == "kubernetes"


def test_a_plain_stop_deletes_the_world_and_forgets_it(state, capsys):
    cluster = _k8s_cluster()
    save_allocation(KeptWorld("default/w-1"), {"hosts": 2})
    save_allocation(KeptWorld("default/other-1"), {"hosts": 2}, "other")
    actions.dispatch(_Session(cluster), "stop")
    assert cluster.world.launcher.worlds.calls == ["delete"]
    assert not saved_file().exists() and load_saved("other") is not None
    # The stop note of an attached cluster says nothing of a job left running.
    assert "keeps running" not in capsys.readouterr().out


# -- attach ------------------------------------------------------------------------------


def test_attach_with_no_job_id_starts_the_kept_world_with_its_options(cluster_api):
    options = {"hosts": 2, "devices_per_host": 1, "launcher": "kubernetes"}
    options["launcher_options"] = {"image": "i", "kubeconfig": "/k"}
    save_allocation(KeptWorld("default/w-1", "/k"), options)
    session = StartSession(cluster=None)
    actions.dispatch(session, "attach")
    assert session.kwargs["launcher"] == "kubernetes"
    assert session.kwargs["launcher_options"] == {
        "image": "i",
        "kubeconfig": "/k",
        "job_id": "default/w-1",
    }
    assert session.kwargs["hosts"] == 2
    assert load_saved()[0].kubeconfig == "/k"  # kept for the next attach


def test_attach_by_job_id_picks_the_launcher_the_id_names(cluster_api):
    session = StartSession(cluster=None)
    actions.dispatch(session, "attach default/w-1")
    assert session.kwargs["launcher"] == "kubernetes"
    assert session.kwargs["hosts"] == 2  # one process per pod
    with pytest.raises(UsageError, match="Slurm job id.*; JOB must name a Kubernetes world"):
        actions.dispatch(StartSession(cluster=None), "attach w-1")


def test_attach_to_a_world_that_lapsed_says_so_and_forgets_it(cluster_api):
    cluster_api.secret = None
    save_allocation(KeptWorld("default/w-1"), {"hosts": 2, "launcher": "kubernetes"})
    with pytest.raises(UsageError, match=r"saved Kubernetes world w-1 .* is gone .*%jaxsys start"):
        actions.dispatch(StartSession(cluster=None), "attach")
    assert load_saved() is None
    with pytest.raises(UsageError, match="Kubernetes world w-1 in namespace default is gone"):
        actions.dispatch(StartSession(cluster=None), "attach default/w-1")


# -- the world's side of an attach -------------------------------------------------------


def _worlds(nprocs: int = 2) -> PodWorlds:
    worlds = PodWorlds({"image": "i"}, nprocs)
    worlds._api = object()
    return worlds


FILES = {pod.GENERATION: b"c1-abc", pod.ENGINE_FILE: b"{}"}


def test_an_attach_writes_the_kernels_generation_and_annotates_the_pods(cluster_api):
    worlds = _worlds()
    assert worlds.attach("default/w-1", FILES) is None
    [written] = cluster_api.written
    assert KEPT_LABEL not in written["metadata"]["labels"]
    assert written["metadata"]["resourceVersion"] == "7"  # refused if another wrote first
    assert set(written["data"]) == {pod.GENERATION, pod.ENGINE_FILE}
    assert cluster_api.annotated == [("w-1-0-a", "c1-abc"), ("w-1-1-b", "c1-abc")]
    assert worlds.name == "w-1" and worlds.top_kind == "Job"
    assert [m["kind"] for m in worlds.manifests] == ["Secret", "Service", "Job"]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"secret": None}, "no Kubernetes world w-1 in namespace default"),
        ({"secret": _secret(kept=False)}, "w-1 is not kept: a kernel runs a cluster on it"),
        ({"conflict": True}, "another kernel took the Kubernetes world w-1 first"),
        ({"pods": [_pod("w-1-0-a")]}, "has 1 pods, not 2: attach with --hosts 1"),
        ({"pods": [_pod("w-1-0-a"), _pod("b", "Failed")]}, r"1 running pods \(b not running\)"),
    ],
)
def test_an_attach_refuses_what_it_cannot_run_on_saying_why(cluster_api, change, said):
    vars(cluster_api).update(change)
    with pytest.raises(ClusterStartError, match=said):
        _worlds().attach("default/w-1", FILES)


def test_a_keep_writes_a_generation_without_an_engine_labelled_kept(cluster_api):
    worlds = _worlds()
    worlds.name = "w-1"
    worlds.keep()
    [written] = cluster_api.written
    assert written["metadata"]["labels"][KEPT_LABEL] == "true"
    assert set(written["data"]) == {pod.GENERATION, pod.WAIT_FILE}
    assert [n for n, _ in cluster_api.annotated] == ["w-1-0-a", "w-1-1-b"]
    assert worlds.name is None


NOTEBOOK_POD = {"apiVersion": "v1", "kind": "Pod", "name": "nb-1", "uid": "nb-uid"}


def test_an_attaching_kernel_in_a_pod_owns_the_world_and_a_keep_lets_it_go(cluster_api):
    cluster_api.owner = NOTEBOOK_POD
    worlds = _worlds()
    note = worlds.attach("default/w-1", FILES)
    # Deleting the attaching kernel's pod deletes the world from now on, and it says so.
    assert cluster_api.owned == [("Job", "w-1", "nb-1")]
    assert note.startswith("owned by the kernel's pod nb-1"), note
    # Kept again, the world outlives that pod: nobody owns it; its pods' wait ends it.
    worlds.keep()
    assert cluster_api.owned[-1] == ("Job", "w-1", None)


def test_a_world_made_by_a_kernel_outside_the_cluster_has_no_owner_to_change(cluster_api):
    worlds = _worlds()
    assert worlds.attach("default/w-1", FILES) is None
    worlds.keep()
    assert cluster_api.owned == []


def test_an_owner_that_cannot_be_changed_is_said(cluster_api, capsys):
    from kubernetes.client.rest import ApiException

    cluster_api.owner = NOTEBOOK_POD
    cluster_api.owner_error = ApiException(status=403, reason="Forbidden")
    worlds = _worlds()
    note = worlds.attach("default/w-1", FILES)
    assert note == "not owned by the kernel's pod nb-1 (Forbidden)", note
    worlds.keep()
    err = capsys.readouterr().err
    assert "w-1 is still owned by the kernel's pod (Forbidden)" in err, err
    assert "deleting that pod deletes the world" in err


def test_a_generation_holds_the_engines_files_and_environment(tmp_path):
    engine = controller_file(tmp_path, "c1", "engine")
    engine.parent.mkdir(parents=True)
    engine.write_text('{"key": "k"}')
    (tmp_path / pod.ENGINE_CONFIG).write_text("c = get_config()\n")
    env = {"JAX_PLATFORMS": "cpu", "JAXSYS_STACK_FILE": f"{tmp_path}/log/stacks-0.txt"}
    files = generation_files("c1", env, None, tmp_path, 1.0)
    assert json.loads(files[pod.ENV_FILE]) == {"JAX_PLATFORMS": "cpu"}
    assert files[pod.GENERATION].startswith(b"c1-") and files[pod.WAIT_FILE] == b"30"
    assert files[pod.ENGINE_FILE] == b'{"key": "k"}'
    assert files[pod.GENERATION] != generation_files("c1", env, None, tmp_path, 1)[pod.GENERATION]


# -- the pod's side ----------------------------------------------------------------------


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_pod_waits_for_a_new_generation_with_an_engine_and_ends_after_its_wait(tmp_path):
    clock = _Clock()
    (tmp_path / pod.GENERATION).write_text("g1")
    (tmp_path / pod.ENGINE_FILE).write_text("{}")
    assert pod.next_engine(tmp_path, None, 5.0, clock, clock.sleep) == "g1"
    # The same generation again is the one whose engine ended: none comes within 5 s.
    assert pod.next_engine(tmp_path, "g1", 5.0, clock, clock.sleep) is None
    assert 5.0 <= clock.now < 5.5
    # A keep (no engine file) starts a wait of its own, as long as it says.
    (tmp_path / pod.ENGINE_FILE).unlink()
    (tmp_path / pod.GENERATION).write_text("kept-1")
    (tmp_path / pod.WAIT_FILE).write_text("2")
    clock.now = 0.0
    assert pod.next_engine(tmp_path, "g1", 5.0, clock, clock.sleep) is None
    assert 2.0 <= clock.now < 2.5
    (tmp_path / pod.WAIT_FILE).write_text("not a number")
    assert pod.wait_s(tmp_path, 5.0) == 5.0
