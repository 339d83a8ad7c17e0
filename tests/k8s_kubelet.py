"""A hermetic Kubernetes for tests: the API of :mod:`tests.k8s_api`, the Job and JobSet
controllers' part jaxsys relies on, and a "process kubelet" that runs each Pod as a process.

Each pod is a process in its own mount, UTS and PID namespaces (``unshare``), on loopback with an
address of its own (``127.0.0.<n>``, the pod IP), where it finds what a container finds:

- its hostname (``<job>-<index>``) and ``HOSTNAME``;
- an ``/etc/hosts`` that plays cluster DNS: every pod with a hostname and a subdomain that
  names an existing Service resolves as ``<hostname>.<subdomain>`` (and the long form);
- the service account's ``token``, ``ca.crt`` and ``namespace`` under
  ``/var/run/secrets/kubernetes.io/serviceaccount`` (``/run`` is a tmpfs of its own);
- its Secret volumes mounted read-only, projected as a kubelet does (each key a link into
  ``..data``, which is swapped whole), and projected again when the pod is updated (an
  annotation changed), as a kubelet's sync of the pod does; the periodic sync (a minute)
  is not modelled;
- its environment: the container's ``env`` (``fieldRef`` resolved),
  ``KUBERNETES_SERVICE_HOST``/``PORT`` and ``JOB_COMPLETION_INDEX``.

The container's image is ignored: the pod runs this machine's files. What only a real
cluster does (scheduling, images, the kubelet's restarts, CNI, Kueue) is not modelled.

Needs root (or ``CAP_SYS_ADMIN``) and ``unshare``; :func:`unavailable` says why not.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from tests.k8s_api import ApiServer
from tests.k8s_rbac import ENGINE_ROLE, KERNEL_ROLE, documented_roles

SA_DIR = "/run/secrets/kubernetes.io/serviceaccount"
# First on the PYTHONPATH of the pods and of what a test runs against the cluster: the
# test-only kubernetes-validate is not importable there, as in a user's image (see there).
IMAGE_PATH = str(Path(__file__).parent / "k8s_image")
_POLL_S = 0.05
_KILL_WAIT_S = 5.0
_FIRST_IP, _LAST_IP = 10, 250


@functools.cache
def unavailable() -> str | None:
    """Why pods cannot run here, or None when they can (asked once per run)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare and mount (util-linux) are needed for pods"
    if os.geteuid() != 0:
        return "pods need root (mount and UTS namespaces)"
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        timeout=10,
        check=False,
    )
    if probe.returncode:
        return f"unshare fails here: {probe.stderr.decode().strip()}"
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return "the kubernetes Python package is not installed (pip install kubernetes)"
    return None


def _resolve_env(pod: dict[str, Any], ctr: dict[str, Any]) -> dict[str, str]:
    env = {}
    for e in ctr.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
            continue
        path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            env[e["name"]] = pod["metadata"].get(m.group(1), {}).get(m.group(2), "")
        elif path in ("metadata.name", "metadata.namespace"):
            env[e["name"]] = pod["metadata"][path.split(".")[1]]
        elif path == "status.podIP":
            env[e["name"]] = pod["status"]["podIP"]
    return env


def _container_status(pod: dict[str, Any], terminated: dict[str, Any]) -> dict[str, Any]:
    ctr = pod["spec"]["containers"][0]
    return {
        "name": ctr["name"],
        "image": ctr.get("image", ""),
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }


def _project(folder: Path, files: dict[str, bytes], mode: int) -> None:
    """Project ``files`` into ``folder`` as a kubelet's atomic writer does: into a new
    ``..<time>`` directory, which the link ``..data`` then names (a rename: readers see
    the old set or the new one), each key a link ``key -> ..data/key``."""
    new = folder / f"..{time.time_ns()}"
    new.mkdir()
    for key, value in files.items():
        (new / key).write_bytes(value)
        (new / key).chmod(mode)
    tmp = folder / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(new.name)
    os.replace(tmp, folder / "..data")
    for entry in folder.iterdir():
        if entry.name.startswith(".."):
            if entry.is_dir() and not entry.is_symlink() and entry != new:
                shutil.rmtree(entry)
        elif entry.name not in files:
            entry.unlink()
    for key in files:
        if not (folder / key).is_symlink():
            (folder / key).symlink_to(f"..data/{key}")


class Pod:
    """One running pod: its directory and its process."""

    def __init__(self, obj: dict[str, Any], directory: Path):
        self.obj, self.dir = obj, directory
        self.name = obj["metadata"]["name"]
        self.proc: subprocess.Popen | None = None
        self.log = directory / "log"

    def read_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(_KILL_WAIT_S)


class TestCluster:
    """The API server, the controllers and the kubelet, until :meth:`stop`.

    Parameters
    ----------
    directory
        Where pods' files go; made (and removed) here when None.
    """

    __test__ = False

    def __init__(self, directory: Path | None = None):
        self._made = directory is None
        self.dir = Path(directory or tempfile.mkdtemp(prefix="jaxsys-k8s-"))
        self.api = ApiServer(self.dir).start()
        # The kernel and the pods have the rights docs/clusters.md gives them, no more.
        roles = documented_roles()
        self.api.default_token = self.api.grant(roles[KERNEL_ROLE])
        self.token = self.api.grant(roles[ENGINE_ROLE])
        self.pods: dict[str, Pod] = {}
        self._next_ip = _FIRST_IP
        self._stop = threading.Event()
        # When each finished Job with a TTL was first seen finished (namespace, name).
        self._finished: dict[tuple[str, str], float] = {}
        self.api.subscribers.append(self._on_change)
        self._thread = threading.Thread(target=self._kubelet, name="k8s-kubelet", daemon=True)
        self._thread.start()

    # -- the controllers -------------------------------------------------------------------

    def _on_change(self, verb: str, obj: dict[str, Any]) -> None:
        kind = obj["kind"]
        if verb == "create" and kind == "JobSet":
            self._jobset(obj)
        elif verb == "create" and kind == "Job" and not obj["spec"].get("suspend"):
            self._job(obj)
        elif verb == "delete" and kind == "Pod":
            pod = self.pods.pop(obj["metadata"]["name"], None)
            if pod is not None:
                pod.kill()
        elif verb == "update" and kind == "Pod":
            pod = self.pods.get(obj["metadata"]["name"])
            if pod is not None:
                self._project_secrets(obj, pod.dir)

    @staticmethod
    def _owner(obj: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _jobset(self, js: dict[str, Any]) -> None:
        name, ns = js["metadata"]["name"], js["metadata"]["namespace"]
        dns = js["spec"].get("network", {}).get("enableDNSHostnames", True)
        if dns:
            svc = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": [self._owner(js)]},
                "spec": {"clusterIP": "None", "selector": {"jobset.sigs.k8s.io/jobset-name": name}},
            }
            self.api.create(svc)
        for rj in js["spec"]["replicatedJobs"]:
            for i in range(rj.get("replicas", 1)):
                labels = {
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                    "jobset.sigs.k8s.io/job-index": str(i),
                }
                tpl = rj["template"]
                spec = dict(tpl["spec"])
                pod_tpl = {**spec["template"], "spec": dict(spec["template"]["spec"])}
                pod_tpl["metadata"] = {
                    **pod_tpl.get("metadata", {}),
                    "labels": {**pod_tpl.get("metadata", {}).get("labels", {}), **labels},
                }
                if dns:
                    pod_tpl["spec"]["subdomain"] = name
                spec["template"] = pod_tpl
                meta = {
                    "name": f"{name}-{rj['name']}-{i}",
                    "namespace": ns,
                    "labels": {**tpl.get("metadata", {}).get("labels", {}), **labels},
                    "ownerReferences": [self._owner(js)],
                }
                job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}
                self.api.create(job)

    def _job(self, job: dict[str, Any]) -> None:
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        tpl = job["spec"]["template"]
        for i in range(job["spec"].get("completions", 1)):
            labels = {
                **tpl.get("metadata", {}).get("labels", {}),
                "job-name": name,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": job["metadata"]["uid"],
                "batch.kubernetes.io/job-completion-index": str(i),
            }
            spec = {**tpl["spec"], "hostname": f"{name}-{i}"}
            if self._next_ip > _LAST_IP:
                raise RuntimeError("the test cluster ran out of pod addresses")
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{i}-{secrets.token_hex(3)}",
                    "namespace": ns,
                    "labels": labels,
                    "annotations": {"batch.kubernetes.io/job-completion-index": str(i)},
                    "ownerReferences": [self._owner(job)],
                },
                "spec": spec,
                "status": {"phase": "Pending", "podIP": f"127.0.0.{self._next_ip}"},
            }
            self._next_ip += 1
            self.api.create(pod)

    # -- the kubelet -----------------------------------------------------------------------

    def _hosts(self, own: dict[str, Any]) -> str:
        ns = own["metadata"]["namespace"]
        host = own["spec"].get("hostname", own["metadata"]["name"])
        # What the kubelet writes (the pod's own names), then what cluster DNS would answer.
        lines = ["127.0.0.1\tlocalhost", f"{own['status']['podIP']}\t{host}"]
        services = {s["metadata"]["name"] for s in self.api.list("Service", ns)}
        for p in self.api.list("Pod", ns):
            spec, ip = p["spec"], p["status"]["podIP"]
            host, sub = spec.get("hostname", p["metadata"]["name"]), spec.get("subdomain")
            if sub in services:
                lines.append(f"{ip}\t{host}.{sub}.{ns}.svc.cluster.local {host}.{sub}")
        return "\n".join(lines) + "\n"

    def _files(self, obj: dict[str, Any], d: Path) -> list[tuple[Path, str]]:
        """Write the pod's service account and Secret volumes; the mounts they need."""
        ns = obj["metadata"]["namespace"]
        sa = d / "serviceaccount"
        sa.mkdir(parents=True)
        (sa / "token").write_text(self.token)
        (sa / "namespace").write_text(ns)
        shutil.copy(self.api.ca, sa / "ca.crt")
        mounts = [(sa, SA_DIR)]
        volumes = {v["name"]: v for v in obj["spec"].get("volumes", [])}
        ctr = obj["spec"]["containers"][0]
        for m in ctr.get("volumeMounts", []):
            secret = volumes[m["name"]].get("secret")
            target = re.sub(r"^/var/run/", "/run/", m["mountPath"])
            if secret is None or not target.startswith("/run/"):
                raise RuntimeError(f"the test kubelet mounts Secret volumes under /run, not {m}")
            (d / "volumes" / m["name"]).mkdir(parents=True)
            mounts.append((d / "volumes" / m["name"], target))
        self._project_secrets(obj, d)
        return mounts

    def _project_secrets(self, obj: dict[str, Any], d: Path) -> None:
        """Write the pod's Secret volumes as they are now, each swapped in whole."""
        ns = obj["metadata"]["namespace"]
        for v in obj["spec"].get("volumes", []):
            secret = v.get("secret")
            if secret is None or not (d / "volumes" / v["name"]).is_dir():
                continue
            data = self.api.get("Secret", ns, secret["secretName"]) or {"data": {}}
            files = {k: base64.b64decode(x) for k, x in data.get("data", {}).items()}
            _project(d / "volumes" / v["name"], files, secret.get("defaultMode", 0o644))

    def _start(self, obj: dict[str, Any]) -> None:
        name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
        d = self.dir / "pods" / name
        d.mkdir(parents=True)
        pod = self.pods[name] = Pod(obj, d)
        (d / "hosts").write_text(self._hosts(obj))
        mounts = self._files(obj, d)
        steps = [
            "set -e",
            "mount --make-rprivate /",
            f"mount --bind {shlex.quote(str(d / 'hosts'))} /etc/hosts",
            "mount -t tmpfs tmpfs /run",
        ]
        for src, target in mounts:
            steps += [f"mkdir -p {target}", f"mount --bind -o ro {shlex.quote(str(src))} {target}"]
        host = obj["spec"].get("hostname", name)
        steps += [f"hostname {shlex.quote(host)}", 'exec "$@"']
        ctr = obj["spec"]["containers"][0]
        tmp = d / "tmp"
        tmp.mkdir()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": IMAGE_PATH,
            "HOME": str(d),
            # A container's /tmp is its own: a pod's temporary files go with the pod.
            "TMPDIR": str(tmp),
            "LANG": "C.UTF-8",
            "HOSTNAME": host,
            "KUBERNETES_SERVICE_HOST": self.api.host,
            "KUBERNETES_SERVICE_PORT": str(self.api.port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api.port),
        }
        index = obj["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index")
        if index is not None:
            env["JOB_COMPLETION_INDEX"] = index
        env.update(_resolve_env(obj, ctr))
        # A PID namespace of its own: when the pod's first process ends, everything it
        # started ends with it, as in a container.
        cmd = [
            *("unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--"),
            *("/bin/sh", "-c", "\n".join(steps), "pod"),
        ]
        with open(pod.log, "wb") as log:
            pod.proc = subprocess.Popen(
                [*cmd, *ctr["command"], *ctr.get("args", [])],
                env=env,
                cwd=ctr.get("workingDir") or d,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.api.logs[name] = pod.read_log
        self.api.update_status("Pod", ns, name, phase="Running")

    def _exited(self, pod: Pod, code: int) -> None:
        ns = pod.obj["metadata"]["namespace"]
        phase = "Succeeded" if code == 0 else "Failed"
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        self.api.update_status(
            "Pod",
            ns,
            pod.name,
            phase=phase,
            containerStatuses=[_container_status(pod.obj, term)],
        )
        job_name = pod.obj["metadata"]["labels"].get("job-name")
        job = job_name and self.api.get("Job", ns, job_name)
        if not job:
            return
        pods = self.api.list("Pod", ns, f"job-name={job_name}")
        failed = sum(p["status"]["phase"] == "Failed" for p in pods)
        done = sum(p["status"]["phase"] == "Succeeded" for p in pods)
        self.api.update_status("Job", ns, job_name, failed=failed, succeeded=done)
        if failed > job["spec"].get("backoffLimit", 6):
            # The Job failed: its running pods are ended, as the Job controller does.
            cond = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
            self.api.update_status("Job", ns, job_name, conditions=cond)
            for p in pods:
                other = self.pods.get(p["metadata"]["name"])
                if other is not None:
                    other.kill()
        elif done == job["spec"].get("completions", 1):
            cond = [{"type": "Complete", "status": "True"}]
            self.api.update_status("Job", ns, job_name, conditions=cond)

    def _kubelet(self) -> None:
        while not self._stop.wait(_POLL_S):
            with self.api.lock:
                for obj in self.api.list("Pod"):
                    name = obj["metadata"]["name"]
                    if name not in self.pods and obj["status"]["phase"] == "Pending":
                        if not self._secrets_exist(obj):
                            continue  # a kubelet retries the mount until the Secret exists
                        try:
                            self._start(obj)
                        except (OSError, RuntimeError, KeyError) as e:
                            # As a kubelet does: the pod fails, saying why; others go on.
                            ns = obj["metadata"]["namespace"]
                            why = f"the test kubelet cannot start it: {e!r}"
                            self.api.update_status("Pod", ns, name, phase="Failed", message=why)
                for pod in list(self.pods.values()):
                    phase = (self.api.get("Pod", *self._key(pod)) or {}).get("status", {})
                    if pod.proc is not None and phase.get("phase") == "Running":
                        code = pod.proc.poll()
                        if code is not None:
                            self._exited(pod, code)
                self._delete_expired_jobs()

    def _secrets_exist(self, pod: dict[str, Any]) -> bool:
        ns = pod["metadata"]["namespace"]
        names = [v["secret"]["secretName"] for v in pod["spec"].get("volumes", []) if "secret" in v]
        return all(self.api.get("Secret", ns, n) is not None for n in names)

    def _delete_expired_jobs(self) -> None:
        """The TTL-after-finished controller: a finished Job with ``ttlSecondsAfterFinished``
        is deleted that long after it finished (what it owns with it)."""
        now = time.monotonic()
        for job in self.api.list("Job"):
            ttl = job["spec"].get("ttlSecondsAfterFinished")
            conditions = job.get("status", {}).get("conditions", [])
            if ttl is None or not any(c["type"] in ("Complete", "Failed") for c in conditions):
                continue
            key = (job["metadata"]["namespace"], job["metadata"]["name"])
            finished = self._finished.setdefault(key, now)
            if now - finished >= ttl:
                self._finished.pop(key)
                self.api.delete("Job", *key)

    @staticmethod
    def _key(pod: Pod) -> tuple[str, str]:
        return pod.obj["metadata"]["namespace"], pod.name

    # -- for tests -------------------------------------------------------------------------

    def processes(self) -> Iterator[subprocess.Popen]:
        """The pods' processes that still run."""
        for pod in list(self.pods.values()):
            if pod.proc is not None and pod.proc.poll() is None:
                yield pod.proc

    def stop(self) -> None:
        """Stop every pod, the kubelet and the API server; remove what was made."""
        self._stop.set()
        self._thread.join(_KILL_WAIT_S)
        for pod in list(self.pods.values()):
            pod.kill()
        self.api.stop()
        if self._made:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running(own_python: bool = True) -> Iterator[TestCluster]:
    """A test cluster for one test, skipped (saying why) where pods cannot run; on the way
    out it checks that no pod process and none of its files are left.

    With ``own_python`` the pods' ``python3`` is this interpreter, as an image's would be
    its own.
    """
    import pytest  # Deferred: only tests use this; bench scripts use TestCluster alone

    why = unavailable()
    if why:
        pytest.skip(why)
    # Kernels and jobs the test starts import the kubernetes client as a user's would.
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [IMAGE_PATH, os.environ.get("PYTHONPATH")]))}
    if own_python:
        env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    with mock.patch.dict(os.environ, env):
        cluster = TestCluster()
        try:
            yield cluster
        finally:
            cluster.stop()
    assert not list(cluster.processes())
    assert not cluster.dir.exists()
