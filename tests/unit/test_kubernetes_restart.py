"""A world restart on Kubernetes in the living pods, checked without a cluster: which pods
can serve the next world, what ending the engines and starting the next world write, how
the launcher falls back to new pods (and says so), and what a pod's runner says meanwhile.
The whole path runs against the test cluster in tests/live/test_kubernetes_restart.py."""

from __future__ import annotations

import datetime
import types

import pytest

from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import make_launcher
from jaxsys_kernel.cluster.launchers.kubernetes_world import KEPT_LABEL, not_reusable
from jaxsys_kernel.cluster.records import ClusterStartError
from jaxsys_kernel.engine import pod

# The kept world's fakes of the API (cluster_api, state: fixtures used by name).
from .test_kubernetes_kept import FILES, _Clock, _pod, _worlds, cluster_api, state  # noqa: F401

pytestmark = pytest.mark.unit


def _pods(*phases: str) -> list:
    pods = [_pod(f"w-1-{i}", phase, index=i) for i, phase in enumerate(phases)]
    for p in pods:  # what why_ended reads
        p.status.message, p.status.container_statuses = None, None
    return pods


def test_every_processs_pod_running_can_serve_the_next_world():
    assert not_reusable(_pods("Running", "Running"), 2, 2) is None


@pytest.mark.parametrize(
    ("pods", "said"),
    [
        (_pods("Running"), "the pod of process 1 is gone"),
        (_pods("Running", "Failed"), "pod w-1-1 (process 1) ended: Failed"),
        (_pods("Succeeded", "Running"), "pod w-1-0 (process 0) ended: Succeeded"),
        (_pods("Running", "Pending"), "pod w-1-1 (process 1) is Pending"),
    ],
)
def test_a_world_with_a_pod_gone_or_not_running_cannot(pods, said):
    assert not_reusable(pods, 2, 2) == said


def test_a_pod_being_deleted_cannot():
    pods = _pods("Running", "Running")
    pods[0].metadata.deletion_timestamp = datetime.datetime(2026, 1, 1)
    assert not_reusable(pods, 2, 2) == "pod w-1-0 (process 0) is being deleted"


def test_ending_the_engines_writes_a_restart_generation_and_nudges_the_pods(cluster_api):  # noqa: F811
    worlds = _worlds()
    worlds.name = "w-1"
    cluster_api.secret["metadata"]["labels"].pop(KEPT_LABEL)
    assert worlds.end_engines() is None
    [written] = cluster_api.written
    # No engine file: each runner ends its engine and waits for the next generation.
    assert set(written["data"]) == {pod.GENERATION, pod.WAIT_FILE}
    assert KEPT_LABEL not in written["metadata"]["labels"]
    gens = {gen for _, gen in cluster_api.annotated}
    assert [n for n, _ in cluster_api.annotated] == ["w-1-0-a", "w-1-1-b"]
    assert len(gens) == 1 and gens.pop().startswith(pod.RESTART_PREFIX)
    assert worlds.nudge_note is None
    # The next world's generation goes into the same Secret, and the pods are told.
    assert worlds.renew(FILES) is None
    assert set(cluster_api.written[-1]["data"]) == set(FILES)
    assert cluster_api.annotated[-2:] == [("w-1-0-a", "c1-abc"), ("w-1-1-b", "c1-abc")]
    assert worlds.name == "w-1"


def test_a_world_whose_secret_went_or_changed_is_not_restarted_in_place(cluster_api):  # noqa: F811
    worlds = _worlds()
    worlds.name = "w-1"
    cluster_api.conflict = True
    assert worlds.end_engines() == "its Secret was changed by someone else"
    with pytest.raises(ClusterStartError, match="deleted or changed during the restart"):
        worlds.renew(FILES)
    cluster_api.secret = None
    assert worlds.end_engines() == "its Secret w-1-credentials is gone"
    cluster_api.pods = cluster_api.pods[:1]
    assert worlds.end_engines() == "the pod of process 1 is gone"
    assert cluster_api.annotated == []


def test_an_api_that_fails_while_the_engines_end_makes_the_world_anew(cluster_api):  # noqa: F811
    from kubernetes.client.rest import ApiException

    worlds = _worlds()
    worlds.name = "w-1"
    cluster_api.secret["metadata"]["labels"].pop(KEPT_LABEL)
    cluster_api.conflict = ApiException(status=503, reason="Service Unavailable")
    # Whether the pods saw the end is unknown: the launcher deletes the world and makes it
    # anew, saying why (test_a_restart_with_a_pod_gone_deletes_the_world_and_says_why_...).
    assert worlds.end_engines() == "the Kubernetes API failed (Service Unavailable)"
    assert cluster_api.annotated == []


class _Worlds:
    """The launcher's worlds: what a restart asked of them."""

    def __init__(self, why: str | None):
        self.name, self.namespace, self.top_kind = "w-1", "default", "Job"
        self.why, self.calls, self.nudge_note, self.owner_note = why, [], None, "none"

    def drop_standby(self, set_ids):
        self.dropped = set_ids

    def end_engines(self):
        self.calls.append("end_engines")
        return self.why

    def renew(self, files):
        self.calls.append("renew")

    def make(self, cluster_id, incarnation, files, args=()):
        self.calls.append("make")
        self.name = "w-2"

    def delete(self):
        self.calls.append("delete")
        self.name = None

    def wait_running(self, report, timeout):
        pass


def _restart(why: str | None) -> tuple[_Worlds, list[str]]:
    """A world restart as the teardown and the launch do it, with the launcher's worlds
    faked; returns them and what was reported."""
    launcher = make_launcher(
        ClusterConfig(hosts=2, launcher="kubernetes", launcher_options={"image": "i"})
    )
    launcher.worlds = worlds = _Worlds(why)
    launcher.ipp = types.SimpleNamespace(cluster_id="c1")
    launcher.kill_engines([])
    said: list[str] = []
    if not launcher._into_living_pods(FILES, lambda text, done, total: said.append(text)):
        said.append(launcher._remade)  # what the launch reports before making the world
    return worlds, said


def test_a_restart_runs_the_next_world_in_the_living_pods():
    worlds, said = _restart(None)
    assert worlds.calls == ["end_engines", "renew"]
    assert said == ["Kubernetes world w-1: a new world in its 2 living pods"]


def test_a_restart_with_a_pod_gone_deletes_the_world_and_says_why_it_is_made_anew():
    worlds, said = _restart("the pod of process 1 is gone")
    assert worlds.calls == ["end_engines", "delete"]
    assert said == ["Kubernetes world w-1: the pod of process 1 is gone; its pods are made anew"]


def test_a_pods_runner_says_a_restart_generation_is_awaited(tmp_path, capsys):
    clock = _Clock()
    (tmp_path / pod.GENERATION).write_text(f"{pod.RESTART_PREFIX}1")
    (tmp_path / pod.WAIT_FILE).write_text("2")
    assert pod.next_engine(tmp_path, "g1", 5.0, clock, clock.sleep) is None
    err = capsys.readouterr().err
    assert f"world restart ({pod.RESTART_PREFIX}1): waiting 2 s for the next engine" in err


def _swap_in(creds, name: str, files: dict[str, str]) -> None:
    """What a kubelet does first when a Secret changes: write the new set into a folder of
    its own and point ``..data`` at it; the names of new keys come after."""
    new = creds / name
    new.mkdir()
    for key, text in files.items():
        (new / key).write_text(text)
    tmp = creds / "..data_tmp"
    tmp.symlink_to(name)
    tmp.replace(creds / pod.DATA_LINK)


def test_a_pods_runner_waits_for_the_names_of_a_new_sets_keys(tmp_path):
    # A kept world: its set has a generation and a wait, and no engine.
    _swap_in(tmp_path, "..1", {pod.GENERATION: "kept-1", pod.WAIT_FILE: "30"})
    for key in (pod.GENERATION, pod.WAIT_FILE):
        (tmp_path / key).symlink_to(f"{pod.DATA_LINK}/{key}")
    # The next kernel's generation is swapped in; the engine file's name is not made yet.
    _swap_in(tmp_path, "..2", {pod.GENERATION: "g2", pod.WAIT_FILE: "30", pod.ENGINE_FILE: "{}"})
    clock, looks = _Clock(), []

    def sleep(s: float) -> None:
        looks.append(clock.now)
        clock.sleep(s)
        if len(looks) == 3:  # the kubelet makes the new name a moment later
            (tmp_path / pod.ENGINE_FILE).symlink_to(f"{pod.DATA_LINK}/{pod.ENGINE_FILE}")

    # Read as "kept again, without an engine", the generation would be skipped for good and
    # the pod would wait 30 s, then end, with no engine for the kernel.
    assert pod.next_engine(tmp_path, "kept-1", 45.0, clock, sleep) == "g2"
    assert len(looks) == 3


def _entries(*ranks: int) -> dict:
    return {
        r: (f"standby-p{r}-e{1000 + r}", {f"standby-{r}.json": b"{}", "standby-engine.json": b"{}"})
        for r in ranks
    }


def test_standby_entries_go_into_the_secret_in_one_write_and_stay_until_taken(cluster_api):  # noqa: F811
    worlds = _worlds()
    worlds.name = "w-1"
    cluster_api.secret["metadata"]["labels"].pop(KEPT_LABEL)
    cluster_api.secret["data"] = {pod.GENERATION: "YzEtYWJj"}  # c1-abc
    worlds.standby = _entries(0, 1)
    assert worlds.write_standby() is None
    [written] = cluster_api.written
    assert set(written["data"]) == {
        pod.GENERATION,
        "standby-0.json",
        "standby-1.json",
        "standby-engine.json",
    }
    # One annotation per pod, new each time, so that each kubelet projects the Secret again.
    assert [n for n, _ in cluster_api.annotated] == ["w-1-0-a", "w-1-1-b"]
    assert {v for _, v in cluster_api.annotated} == {cluster_api.annotated[0][1]}
    assert cluster_api.annotated[0][1].startswith("c1-abc+standby-")
    # A restart keeps the standby entries (the pods' standby engines take over)...
    assert worlds.end_engines() is None
    assert {"standby-0.json", "standby-1.json"} <= set(cluster_api.written[-1]["data"])
    # ...but not those of engines that took over before: those now serve the world that ends.
    worlds.drop_standby({"standby-p0-e1000"})
    assert worlds.end_engines() is None
    assert "standby-0.json" not in cluster_api.written[-1]["data"]
    assert "standby-1.json" in cluster_api.written[-1]["data"]
    # A kept world runs no engine: every standby entry goes.
    worlds.keep()
    assert set(cluster_api.written[-1]["data"]) == {pod.GENERATION, pod.WAIT_FILE}
    assert worlds.standby == {}
