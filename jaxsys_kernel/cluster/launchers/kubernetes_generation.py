"""What a Kubernetes world's pods run, and the files of a *generation* in its Secret.

A generation is what one kernel's engines need in the pods (:mod:`jaxsys_kernel.engine.pod`
runs them): the controller's engine connection file, the engines' ipyparallel config and
environment, every process's certificate and key, and how long pods wait once their engines
end. A standby engine kept in each living pod is an entry of its own beside the generation
(:func:`standby_entry`), with what every standby engine starts with
(:func:`standby_shared`).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...engine.pod import ENGINE_CONFIG, ENGINE_FILE, ENV_FILE, GENERATION, WAIT_FILE
from ...engine.pod_standby import CONFIG_COPY, ENGINE_COPY, entry_name
from ..lease import ttl_s
from ..profile import controller_file
from ..records import ClusterStartError
from .kubernetes_manifests import CREDENTIALS_DIR


def pod_command(python: str, args: Sequence[str] = (), wait: float | None = None) -> list[str]:
    """What each pod runs: the engines of one generation after another (``args`` are
    theirs), each waited for ``wait`` seconds (default: the lease's TTL)."""
    wait = ttl_s() if wait is None else wait
    return [
        *(python, "-m", "jaxsys_kernel.engine.pod"),
        *(f"--credentials={CREDENTIALS_DIR}", f"--wait={wait:g}", "--"),
        *args,
    ]


def credential_files(pki) -> dict[str, Path]:
    """Every certificate and key of a world's processes, and the CA's certificate, by the
    file name they get in the Secret."""
    files: dict[str, Path] = {}
    for i in range(pki.nprocs):
        creds = pki.credentials(i)
        for path in (creds.cert_file, creds.key_file, creds.ca_file):
            files[Path(path).name] = Path(path)
    return files


def pod_env(env: Mapping[str, str], pki, profile: Path | None) -> dict[str, str]:
    """The engines' environment as the pods see it: certificate paths point into the
    mounted Secret, and nothing names a file of the kernel's profile."""
    dirs = set()
    if pki is not None:
        dirs = {str(pki.cert_dir), str(Path(pki.ca_file).parent)}
    out = {}
    for k, v in env.items():
        parent = str(Path(v).parent) if v.startswith("/") else None
        if parent in dirs:
            out[k] = f"{CREDENTIALS_DIR}/{Path(v).name}"
        elif profile is not None and v.startswith(f"{profile}/"):
            continue  # a file of the kernel's machine: the engine makes its own
        else:
            out[k] = v
    return out


def generation_files(
    cluster_id: str, env: Mapping[str, str], pki, profile: Path, timeout: float
) -> dict[str, bytes]:
    """This kernel's generation, as files of a world's Secret: the controller's engine
    file (once the controller has written it), the engines' config and environment
    (:func:`pod_env`), every certificate and key, and the wait after the engines end."""
    files = {ENGINE_FILE: engine_file(profile, cluster_id, timeout).encode()}
    files[ENGINE_CONFIG] = (profile / ENGINE_CONFIG).read_bytes()
    if pki is not None:
        files.update({k: p.read_bytes() for k, p in credential_files(pki).items()})
    files[ENV_FILE] = json.dumps(pod_env(env, pki, profile), sort_keys=True).encode()
    files[GENERATION] = f"{cluster_id}-{secrets.token_hex(6)}".encode()
    return {**files, **wait_file()}


def wait_file() -> dict[str, bytes]:
    """How long pods wait for a kernel once their engines end: the lease's TTL."""
    return {WAIT_FILE: f"{ttl_s():g}".encode()}


def standby_entry(
    rank: int, token: str, env: Mapping[str, str], args: Sequence[str]
) -> dict[str, bytes]:
    """The Secret's entry for the standby engine ``token`` of the pod of process ``rank``:
    its environment and arguments."""
    entry = {"token": token, "env": dict(env), "args": list(args)}
    return {entry_name(rank): json.dumps(entry, sort_keys=True).encode()}


def standby_shared(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """What every pod's standby engine starts with, from a generation ``files``
    (:func:`generation_files`): copies of the engine file and config (so that it can start
    under a generation without an engine), and the certificates its environment names."""
    own = (GENERATION, WAIT_FILE, ENV_FILE, ENGINE_FILE, ENGINE_CONFIG)
    return {
        **{k: v for k, v in files.items() if k not in own},
        ENGINE_COPY: files[ENGINE_FILE],
        CONFIG_COPY: files[ENGINE_CONFIG],
    }


def engine_file(profile: Path, cluster_id: str, timeout: float) -> str:
    """The controller's engine connection file, once the controller has filled it in."""
    src = controller_file(profile, cluster_id, "engine")
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = src.read_text()
            json.loads(text)
            return text
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"the controller did not write {src} within {timeout:g} s"
                ) from None
            time.sleep(0.02)


def in_cluster_address() -> str | None:
    """This pod's IP when the kernel runs in a Kubernetes pod (engines reach it there)."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    return os.environ.get("POD_IP") or None
