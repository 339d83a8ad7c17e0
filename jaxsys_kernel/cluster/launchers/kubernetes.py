"""The Kubernetes launcher: one world = one Indexed Job (or JobSet) of N pods, process i = pod i.

The manifests are made in :mod:`.kubernetes_manifests` (re-exported here), a notebook's
worlds on a cluster by :mod:`.kubernetes_world`, a batch job's by :mod:`.kubernetes_job`;
a world kept for ``%jaxsys attach`` is the allocation of :mod:`.kubernetes_kept`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import ClusterError, ConfigError
from ..options import Flag
from . import kubernetes_api
from .base import Launcher, listen_addresses
from .kubernetes_generation import (
    generation_files,
    in_cluster_address,
    pod_env,
    standby_entry,
    standby_shared,
)
from .kubernetes_kept import KeptWorld, forget_saved_world
from .kubernetes_kept import job_allocation as world_allocation
from .kubernetes_manifests import (  # noqa: F401 - the launcher's public names
    COORDINATOR_PORT,
    CREDENTIALS_DIR,
    JOB_INDEX_LABEL,
    KINDS,
    OPTIONS,
    WORLD_LABEL,
    credentials_secret,
    dump,
    headless_service,
    indexed_job,
    jobset,
    load_pod_template,
    pod_template,
    process_id_command,
    world_manifests,
    world_name,
)
from .kubernetes_world import PodWorlds
from .remote import remote_engine_args


class KubernetesLauncher(Launcher):
    """One world = one Indexed Job (or JobSet) of pods; process i is pod i.

    ``launcher_options`` take the keys of :data:`OPTIONS`. :meth:`manifests` gives the
    objects of a world, to apply with ``kubectl apply -f``. A notebook's cluster keeps its
    controller in the kernel; the pods must reach it: at the kernel's pod IP when the
    kernel runs in the cluster (``POD_IP`` from the downward API), else at
    ``controller_ip``. A world restart ends the engines in the living pods and starts
    the next world's there; a world with a pod gone is deleted and made anew (a new Job).

    ``%jaxsys stop --keep-allocation`` keeps the world's pods (their engines end) for the
    lease's TTL; ``%jaxsys attach`` (``job_id``: ``namespace/name``) starts this kernel's
    engines in them, and a plain stop then deletes the world.
    """

    name = "kubernetes"
    options = OPTIONS
    flags = (
        Flag("--image", "Kubernetes: the pods' container image", {"metavar": "IMAGE"}, "image"),
        Flag("--namespace", "Kubernetes: the world's namespace", {"metavar": "NS"}, "namespace"),
        Flag(
            "--pod-template",
            "Kubernetes: a YAML or JSON pod template file to start from",
            {"metavar": "FILE"},
            "pod_template",
        ),
        Flag(
            "--kubeconfig",
            "Kubernetes: the kubeconfig naming the cluster",
            {"metavar": "FILE"},
            "kubeconfig",
        ),
        Flag(
            "--ttl-after-finished",
            "Kubernetes: seconds before the cluster deletes a world whose engines ended",
            {"type": int, "metavar": "S"},
            "ttl_after_finished",
        ),
    )
    # An Indexed Job numbers its pods; a JobSet of several Jobs gets JAXSYS_PROCESS_ID
    # from the manifests' wrapper, which jaxsys reads first.
    rank_variables = ("JOB_COMPLETION_INDEX",)
    size_variables = ()
    allocation_kind = KeptWorld
    # Each pod boots its standby engine beside the world's (engine/pod_standby.py); a pod
    # cannot start one rank's engine alone, so a restart takes all of them or none.
    standby_whole_world = True
    standby_by_default = True

    @classmethod
    def check_options(cls, options) -> None:
        super().check_options(options)
        kind = options.get("kind", "job")
        if kind not in KINDS:
            raise ValueError(f"launcher_options kind={kind!r}; choose one of {', '.join(KINDS)}")

    def make_allocation(self) -> None:
        # The world is made (or attached to) when the engines launch.
        return None

    @classmethod
    def job_allocation(cls, job_id, ntasks=1, options=None) -> KeptWorld:
        return world_allocation(job_id, options)

    @classmethod
    def attached_stop_note(cls, job_id: str) -> str | None:
        return None  # a plain stop deletes the world it attached to

    def keep_allocation(self) -> KeptWorld | None:
        """Keep the running world past the teardown: its engines end and its pods wait
        the lease's TTL for ``%jaxsys attach``. Returns it, or None when none runs."""
        if self.worlds is None or self.worlds.name is None:
            return None
        self._kept = True
        return self.allocation

    @classmethod
    def batch_job(cls, program, nprocs, out_dir, options):
        # The runner makes the world when it runs (its name is new each time), waits for
        # its pods, writes their logs as p<i>.out and deletes it.
        own = {k: v for k, v in options.items() if k in OPTIONS}
        world_manifests("check", nprocs, ["python"], own)  # bad options fail now, not later
        runner = "jaxsys_kernel.cluster.launchers.kubernetes_job"
        return {}, [sys.executable, "-m", runner, str(nprocs), json.dumps(own), str(program)]

    def manifests(
        self,
        command: Sequence[str],
        *,
        incarnation: int = 0,
        env: Mapping[str, str] | None = None,
        credentials: Mapping[str, bytes] | None = None,
    ) -> list[dict[str, Any]]:
        """The objects of this cluster's world number ``incarnation``."""
        cluster_id = self.ipp.cluster_id if self.ipp is not None else "world"
        return world_manifests(
            world_name(cluster_id, incarnation),
            self.config.nprocs,
            command,
            self.config.launcher_options,
            env=env,
            credentials=credentials,
        )

    def __init__(self, config):
        super().__init__(config)
        self.worlds = None  # kubernetes_world.PodWorlds, made at the first launch
        # Set by keep_allocation: the teardown then keeps the world instead of deleting it.
        self._kept = False
        # The world given by job_id is attached to once; a world restart makes a new one.
        self._attach_to = config.launcher_options.get("job_id")
        # Set by kill_engines (a world restart): the next launch runs in the same pods,
        # or, when they cannot serve it, why the world is made anew.
        self._in_place = False
        self._remade: str | None = None
        # Set when a deletion saw the world's pods gone (see nannies_gone).
        self._pods_gone = False

    def make_ipp_cluster(self, profile, secure):
        # Refused before a controller starts, so that nothing is left to stop.
        world_manifests("check", self.config.nprocs, ["python"], self.config.launcher_options)
        try:
            # Deferred: an extra, needed only once a world starts.
            import kubernetes  # noqa: F401
        except ImportError:
            raise ConfigError(
                "the kubernetes launcher needs the kubernetes package here: "
                "pip install 'jaxsys[kubernetes]'"
            ) from None
        return super().make_ipp_cluster(profile, secure)

    def _controller_kwargs(self) -> dict[str, Any]:
        # Pods reach the kernel at its own pod's IP when it runs in the cluster; from
        # outside, at the address the user gives (controller_ip), which they must route.
        ip = self.config.controller_ip or in_cluster_address() or "*"
        return {"controller_ip": ip, "engine_launcher_class": "local"}

    def telemetry_addresses(self) -> tuple[str, str]:
        return listen_addresses(False, self.config.controller_ip or in_cluster_address())

    async def launch(self, ctx, report) -> None:
        """Make this incarnation's world (its pods run the engines) and wait until every
        pod runs, reporting why the others wait (``Unschedulable``, image pulls)."""
        await asyncio.to_thread(self._launch, ctx, report)

    def _launch(self, ctx, report) -> None:
        if self.worlds is None:
            self.worlds = PodWorlds(self.config.launcher_options, self.config.nprocs)
        timeout = float(self.config.register_timeout)
        files = generation_files(
            self.ipp.cluster_id, self.one_job_env(ctx), ctx.pki, ctx.profile, timeout
        )
        if not self._into_living_pods(files, report):
            if self._remade:
                report(self._remade, 0, self.config.nprocs)
                self._remade = None
            said_owner = self.worlds.owner_note is not None
            self.worlds.make(self.ipp.cluster_id, ctx.incarnation, files, self.nanny_args())
            if not said_owner and self.worlds.owner_note:
                report(f"Kubernetes worlds: {self.worlds.owner_note}", 0, self.config.nprocs)
        w = self.worlds
        self.engine_sets = {}  # the world's engines: no standby engine serves a rank
        self.allocation = KeptWorld(
            f"{w.namespace}/{w.name}", self.config.launcher_options.get("kubeconfig"), w.top_kind
        )
        w.wait_running(report, timeout)

    async def launch_rank(self, rank, set_id, ctx, *, engine_id=None) -> None:
        """Note a standby engine for ``rank``: an entry for the world's Secret, which the
        pod's runner starts (engine/pod_standby.py) once :meth:`standby_launched` has
        written every entry of the refill at once. Only standby engines: a pod does not
        start one rank's engine of a world alone."""
        if engine_id is None:
            await super().launch_rank(rank, set_id, ctx)
        await asyncio.to_thread(self._note_standby, rank, set_id, ctx, engine_id)

    async def standby_launched(self) -> None:
        # One write of the Secret and one annotation per pod for the whole refill.
        await asyncio.to_thread(self._write_standby)

    def _note_standby(self, rank: int, set_id: str, ctx, engine_id: int) -> None:
        w = self.worlds
        if w is None or w.name is None:
            raise ClusterError("no Kubernetes world runs to keep a standby engine in")
        cluster_id = self.ipp.cluster_id
        if not w.standby_files:  # the same for every pod and refill of this world
            timeout = float(self.config.register_timeout)
            files = generation_files(cluster_id, {}, ctx.pki, ctx.profile, timeout)
            w.standby_files = standby_shared(files)
        env = pod_env(self.engine_env(rank, ctx), ctx.pki, ctx.profile)
        token = f"{cluster_id}-{set_id}"
        args = [f"--IPEngine.id={engine_id}"]
        w.standby[rank] = (set_id, standby_entry(rank, token, env, args))

    def _write_standby(self) -> None:
        w = self.worlds
        if w is None or w.name is None:
            raise ClusterError("no Kubernetes world runs to keep a standby engine in")
        note = w.write_standby()
        if note:
            print(f"jaxsys: Kubernetes world {w.name}: {note}", file=sys.stderr)

    def standby_gone(self, set_id: str, rank: int) -> bool:
        w = self.worlds
        if w is None or w.name is None or w.standby.get(rank, (None,))[0] != set_id:
            return True
        pod = w.pod_of(rank)
        return pod is None or pod.status.phase in ("Failed", "Succeeded")

    def _into_living_pods(self, files, report) -> bool:
        """Run generation ``files`` in pods that run already: those of the world to
        attach to, or, after a world restart, this world's own. False when there are none."""
        n = self.config.nprocs
        if self._attach_to:
            job_id, self._attach_to = self._attach_to, None
            note, how = self.worlds.attach(job_id, files), f"new engines in its {n} pods"
        elif self._in_place:
            self._in_place = False
            note, how = self.worlds.renew(files), f"a new world in its {n} living pods"
        else:
            return False
        report(f"Kubernetes world {self.worlds.name}: {how}", 0, n)
        if note:
            report(f"Kubernetes world {self.worlds.name}: {note}", 0, n)
        return True

    def _engine_fields(self, rank, ctx) -> dict[str, Any]:
        # A pod's engine is not the child of anything of the kernel's: it goes when the
        # controller stops answering its heartbeats (nanny_args), or with its pod.
        return {**super()._engine_fields(rank, ctx), "no_pdeathsig": True}

    def nanny_args(self) -> list[str]:
        return remote_engine_args()

    def kill_engines(self, engine_sets, processes=()) -> None:
        """For a world restart: end the engines (with their process groups) in their
        living pods, which then wait for the next launch's generation. When a pod is gone
        (the fault took it), the world is deleted instead, and the next launch makes it
        anew and says why."""
        w = self.worlds
        if w is None or w.name is None:
            return
        name = w.name
        # Standby engines that took over serve the world that ends now: the pods end them.
        w.drop_standby(set(self.engine_sets.values()))
        why = w.end_engines()
        self._in_place = why is None
        self._pods_gone = False
        if why is not None:
            self._remade = f"Kubernetes world {name}: {why}; its pods are made anew"
            self._end_world()
        elif w.nudge_note:
            print(f"jaxsys: Kubernetes world {name}: {w.nudge_note}", file=sys.stderr)

    def nannies_gone(self) -> bool:
        # The pods of a world deleted for a restart were seen gone, nannies included.
        return self._pods_gone

    def kill_remote(self, engine_sets, processes=()) -> None:
        """Delete the world: its Job (its pods with it, what cells started included),
        Service and Secret; the next world is made anew. A kept world is kept instead."""
        self._end_world()

    def release(self) -> None:
        super().release()
        self._end_world()

    def _end_world(self) -> None:
        self._in_place = False  # no pods are left to restart in
        self._pods_gone = False
        if self.worlds is None or self.worlds.name is None:
            return
        if self._kept:
            self.worlds.keep()
            return
        job_id = f"{self.worlds.namespace}/{self.worlds.name}"
        self._pods_gone = self.worlds.delete()
        # An attach saved it for the next one: it is gone now.
        forget_saved_world(job_id)

    def process_gone(self, p) -> bool:
        if self.worlds is None or not self.worlds.name:
            return False
        pod = self.worlds.pod_of(p.rank)
        return pod is None or pod.status.phase in ("Failed", "Succeeded")

    def death_reason(self, p) -> str:
        pod = self.worlds.pod_of(p.rank, refresh=False) if self.worlds else None
        if pod is None:
            return "its pod is gone"
        return f"its pod {pod.metadata.name} ended: {kubernetes_api.why_ended(pod)}"
