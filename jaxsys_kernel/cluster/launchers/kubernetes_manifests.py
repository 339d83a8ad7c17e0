"""A Kubernetes world's manifests: one Indexed Job (or JobSet) of N pods, process i = pod i.

The manifests are made here, without touching any cluster, so that they can be read,
checked and applied by hand (``kubectl apply -f``). A world is:

- a **Secret** holding the world's credentials (certificates, keys, connection file),
  mounted read-only into every pod, so that nothing secret is ever part of a pod spec;
- for ``kind="job"``, a **headless Service** and an **Indexed Job** of ``N`` completions run
  all at once (``parallelism = completions = N``) with ``backoffLimit: 0``: the pods'
  hostnames are ``<world>-<i>.<world>``, which is what JAX's own Kubernetes detection reads
  (process count = the Job's ``parallelism``, process id = ``JOB_COMPLETION_INDEX``,
  coordinator = ``<world>-0.<world>``);
- for ``kind="jobset"``, one **JobSet** whose replicated Job ``engines`` runs ``replicas``
  Jobs of ``N / replicas`` pods. JAX's detection would give every child Job the ids
  ``0..N/replicas-1`` again (and its own coordinator), so for more than one replica every pod
  is told its id, ``job_index * parallelism + JOB_COMPLETION_INDEX``, and the one
  coordinator, the first pod of the first Job.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ... import contract
from ...errors import ConfigError

try:
    import yaml
except ImportError:  # JSON is YAML too: templates then must be JSON, output is JSON
    yaml = None

OPTIONS = {
    "image": "the container image the processes run in (it must hold jaxsys and JAX)",
    "namespace": "the namespace the world is made in (default: 'default')",
    "kind": "'job' (an Indexed Job and a headless Service, the default) or 'jobset'",
    "replicas": "for kind='jobset': how many Jobs share the processes (default 1)",
    "pod_template": "a YAML or JSON file with a pod template (metadata, spec) to start from",
    "service_account": "the pods' service account (JAX's detection needs get/list on pods,"
    " services and batch/jobs)",
    "resources": "the container's resources, e.g. {'limits': {'nvidia.com/gpu': 8}}",
    "queue": "a Kueue LocalQueue name; the world is then admitted as one gang",
    "coordinator_port": "the port process 0 serves the coordination service on (default 55527)",
    "python": "the image's Python, which runs the engines and a job's program (default 'python3')",
    "ttl_after_finished": "seconds after which the cluster deletes a world whose engines"
    " have ended, e.g. after the kernel died (default 60)",
    "kubeconfig": "the kubeconfig file naming the cluster (default: $KUBECONFIG, ~/.kube/config,"
    " or the cluster of the pod the kernel runs in)",
    "job_id": "a kept world (namespace/name) to start the engines in, as %jaxsys attach gives",
}
KINDS = ("job", "jobset")
#: JAX's coordinator port on Kubernetes when ``JAX_COORDINATOR_PORT`` is not set.
COORDINATOR_PORT = 55527
#: Where the world's Secret is mounted in every pod.
CREDENTIALS_DIR = "/var/run/jaxsys"
#: The label every object of a world carries, its value the world's name.
WORLD_LABEL = "jaxsys.dev/world"
#: The child Job's index within a JobSet's replicated Job (set by the JobSet controller).
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
CONTAINER = "engine"
REPLICATED_JOB = "engines"
# A DNS-1123 label: what a Service's name must be (it is also the pods' subdomain).
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A pod's hostname is "<job>-<index>"; keep room for the index and a JobSet's suffixes.
MAX_NAME = 40


def world_name(cluster_id: str, incarnation: int = 0) -> str:
    """A world's object name: ``jaxsys-<cluster id>-<incarnation>``, made DNS-safe.

    Examples
    --------
    >>> world_name("1701-ab_C", 2)
    'jaxsys-1701-ab-c-2'
    """
    stem = re.sub(r"[^a-z0-9-]+", "-", cluster_id.lower()).strip("-")
    stem = stem[: MAX_NAME - len(f"jaxsys--{incarnation}")].strip("-")
    return f"jaxsys-{stem}-{incarnation}" if stem else f"jaxsys-{incarnation}"


def secret_name(world: str) -> str:
    """The name of a world's Secret."""
    return f"{world}-credentials"


def split_job_id(job_id: str) -> tuple[str, str]:
    """``"ml/jaxsys-ab-1"`` -> ``("ml", "jaxsys-ab-1")``: how ``%jaxsys attach`` names a
    world. The namespace is always given: it tells a world from a Slurm job's id or the
    key of kept hosts.

    Raises
    ------
    ConfigError
        When ``job_id`` is not ``NAMESPACE/NAME``, each a DNS label.
    """
    ns, _, name = job_id.partition("/")
    if not (_LABEL.match(ns) and _LABEL.match(name)) or max(len(ns), len(name)) > 63:
        raise ConfigError(
            "JOB must name a Kubernetes world as NAMESPACE/NAME (DNS labels), e.g. "
            f"default/jaxsys-1a2b-1, not {job_id!r}"
        )
    return ns, name


def _check_name(name: str) -> None:
    if len(name) > MAX_NAME or not _LABEL.match(name):
        raise ConfigError(
            f"Kubernetes world name {name!r} is not a DNS label of at most {MAX_NAME} "
            "characters (lower-case letters, digits and '-'); choose another name"
        )


def load_pod_template(path: str | Path) -> dict[str, Any]:
    """Read a pod template file (YAML or JSON): a ``PodTemplateSpec`` (``metadata``,
    ``spec``), or a whole ``Pod``/``PodTemplate`` whose template is taken.

    Raises
    ------
    ConfigError
        When the file is missing, unreadable or holds no pod spec.
    """
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"pod_template {path}: {e.strerror or e}; give a readable file") from e
    try:
        doc = yaml.safe_load(text) if yaml is not None else json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes one clear message
        raise ConfigError(f"pod_template {path} is not YAML or JSON: {e}") from e
    if isinstance(doc, dict) and doc.get("kind") == "PodTemplate":
        doc = doc.get("template")
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
        raise ConfigError(
            f"pod_template {path} holds no pod spec; it needs a 'spec' with 'containers'"
        )
    return {"metadata": doc.get("metadata") or {}, "spec": doc["spec"]}


def credentials_secret(
    name: str, namespace: str, files: Mapping[str, bytes], labels: Mapping[str, str]
) -> dict[str, Any]:
    """The Secret holding a world's credential files (file name -> bytes)."""
    for key in files:
        if not re.match(r"^[-._a-zA-Z0-9]+$", key):
            raise ConfigError(f"credential file name {key!r} cannot be a Secret key")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name(name), "namespace": namespace, "labels": dict(labels)},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(files.items())},
    }


def headless_service(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The Service that gives every pod of the world the DNS name ``<hostname>.<name>``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "clusterIP": "None",
            # Pods resolve each other before they are ready: process 0 is reached while
            # the others still start.
            "publishNotReadyAddresses": True,
            "selector": {WORLD_LABEL: name},
        },
    }


def _container(
    template: dict[str, Any], image: str | None, command: Sequence[str], env: Mapping[str, str]
) -> dict[str, Any]:
    containers = template["spec"].setdefault("containers", [])
    found = [c for c in containers if c.get("name") == CONTAINER] or containers[:1]
    if not found:
        containers.append({"name": CONTAINER})
        found = containers
    ctr = found[0]
    ctr.setdefault("name", CONTAINER)
    if image:
        ctr["image"] = image
    if not ctr.get("image"):
        raise ConfigError(
            "the kubernetes launcher needs an image: set launcher_options={'image': ...} "
            "or give a pod_template whose container has one"
        )
    ctr["command"] = list(command)
    ctr.pop("args", None)
    given = [e for e in ctr.get("env", []) if e.get("name") not in env]
    ctr["env"] = given + [{"name": k, "value": str(v)} for k, v in env.items()]
    mounts = [m for m in ctr.get("volumeMounts", []) if m.get("name") != "jaxsys-credentials"]
    ctr["volumeMounts"] = [
        *mounts,
        {"name": "jaxsys-credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
    ]
    return ctr


def pod_template(
    name: str,
    *,
    image: str | None,
    command: Sequence[str],
    env: Mapping[str, str],
    labels: Mapping[str, str],
    template: Mapping[str, Any] | None = None,
    service_account: str | None = None,
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The pod template of a world's processes, from the user's template if one is given."""
    tpl = copy.deepcopy(dict(template or {"metadata": {}, "spec": {}}))
    tpl.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    spec = tpl.setdefault("spec", {})
    ctr = _container(tpl, image, command, env)
    if resources:
        ctr["resources"] = copy.deepcopy(dict(resources))
    # A process that exits ends its pod; the cluster, not Kubernetes, decides on restarts.
    spec["restartPolicy"] = "Never"
    if service_account:
        spec["serviceAccountName"] = service_account
    volumes = [v for v in spec.get("volumes", []) if v.get("name") != "jaxsys-credentials"]
    spec["volumes"] = [
        *volumes,
        {
            "name": "jaxsys-credentials",
            "secret": {"secretName": secret_name(name), "defaultMode": 0o400},
        },
    ]
    return tpl


def _job_spec(nprocs: int, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "completionMode": "Indexed",
        "completions": nprocs,
        "parallelism": nprocs,
        # One failed process fails the world: JAX cannot take a replacement in.
        "backoffLimit": 0,
        "template": template,
    }


def _labels(name: str, queue: str | None) -> dict[str, str]:
    labels = {WORLD_LABEL: name, "app.kubernetes.io/managed-by": "jaxsys"}
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = queue
    return labels


def indexed_job(
    name: str, nprocs: int, namespace: str, template: dict[str, Any], queue: str | None = None
) -> list[dict[str, Any]]:
    """The headless Service and the Indexed Job of a world of ``nprocs`` processes."""
    _check_name(name)
    labels = _labels(name, queue)
    tpl = copy.deepcopy(template)
    tpl["spec"]["subdomain"] = name
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": _job_spec(nprocs, tpl),
    }
    if queue:
        # Kueue unsuspends the Job when the whole world fits.
        job["spec"]["suspend"] = True
    return [headless_service(name, namespace, _labels(name, None)), job]


def process_id_command(command: Sequence[str], per_job: int) -> list[str]:
    """``command`` run with ``JAXSYS_PROCESS_ID = job_index * per_job + JOB_COMPLETION_INDEX``.

    The job index comes from the pod's label through the downward API (``JAXSYS_JOB_INDEX``).
    """
    script = (
        f"export JAXSYS_PROCESS_ID=$((JAXSYS_JOB_INDEX * {int(per_job)} + JOB_COMPLETION_INDEX)) "
        '&& exec "$@"'
    )
    return ["/bin/sh", "-c", script, "jaxsys-process", *command]


def jobset(
    name: str,
    nprocs: int,
    namespace: str,
    template: dict[str, Any],
    replicas: int = 1,
    queue: str | None = None,
    coordinator_port: int = COORDINATOR_PORT,
) -> list[dict[str, Any]]:
    """The JobSet of a world: ``replicas`` Jobs of ``nprocs / replicas`` indexed pods."""
    _check_name(name)
    if replicas < 1 or nprocs % replicas:
        raise ConfigError(
            f"replicas={replicas} does not divide {nprocs} processes; choose a divisor of {nprocs}"
        )
    per_job = nprocs // replicas
    tpl = copy.deepcopy(template)
    if replicas > 1:
        ctr = next(c for c in tpl["spec"]["containers"] if c["name"] == CONTAINER)
        ctr["command"] = process_id_command(ctr["command"], per_job)
        coordinator = f"{name}-{REPLICATED_JOB}-0-0.{name}:{coordinator_port}"
        ctr["env"] = [
            *ctr["env"],
            {
                "name": "JAXSYS_JOB_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}},
            },
            {"name": "JAX_COORDINATOR_ADDRESS", "value": coordinator},
        ]
    labels = _labels(name, queue)
    spec: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "failurePolicy": {"maxRestarts": 0},
        "replicatedJobs": [
            {
                "name": REPLICATED_JOB,
                "replicas": replicas,
                "template": {
                    "metadata": {"labels": {WORLD_LABEL: name}},
                    "spec": _job_spec(per_job, tpl),
                },
            }
        ],
    }
    if queue:
        spec["suspend"] = True
    return [
        {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": spec,
        }
    ]


def world_manifests(
    name: str,
    nprocs: int,
    command: Sequence[str],
    options: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    credentials: Mapping[str, bytes] | None = None,
) -> list[dict[str, Any]]:
    """Every object of a world, in the order they are created (the Secret first).

    Parameters
    ----------
    name
        The world's name (:func:`world_name`), a DNS label.
    nprocs
        The number of processes, one per pod.
    command
        What every pod runs.
    options
        The launcher's options (:data:`OPTIONS`).
    env
        Environment of every process (nothing secret: that goes in ``credentials``).
    credentials
        Files for the world's Secret, mounted at :data:`CREDENTIALS_DIR`.

    Examples
    --------
    >>> [m["kind"] for m in world_manifests("w", 2, ["python", "p.py"], {"image": "i"})]
    ['Secret', 'Service', 'Job']
    """
    kind = options.get("kind", "job")
    if kind not in KINDS:
        raise ConfigError(f"launcher_options kind={kind!r}; choose one of {', '.join(KINDS)}")
    if nprocs < 1:
        raise ConfigError(f"a Kubernetes world needs at least one process, not {nprocs}")
    namespace = options.get("namespace") or "default"
    port = int(options.get("coordinator_port") or COORDINATOR_PORT)
    given = load_pod_template(options["pod_template"]) if options.get("pod_template") else None
    queue = options.get("queue")
    all_env = {contract.NUM_PROCESSES: str(nprocs), **(env or {})}
    if port != COORDINATOR_PORT:
        all_env["JAX_COORDINATOR_PORT"] = str(port)
    tpl = pod_template(
        name,
        image=options.get("image"),
        command=command,
        env=all_env,
        labels={WORLD_LABEL: name},
        template=given,
        service_account=options.get("service_account"),
        resources=options.get("resources"),
    )
    secret = credentials_secret(name, namespace, credentials or {}, _labels(name, None))
    if kind == "job":
        if int(options.get("replicas", 1)) != 1:
            raise ConfigError("replicas apply to kind='jobset'; an Indexed Job has one")
        return [secret, *indexed_job(name, nprocs, namespace, tpl, queue)]
    replicas = int(options.get("replicas", 1))
    return [secret, *jobset(name, nprocs, namespace, tpl, replicas, queue, port)]


def dump(manifests: Sequence[Mapping[str, Any]]) -> str:
    """The manifests as one multi-document YAML text (JSON documents if PyYAML is absent)."""
    if yaml is None:
        return "\n---\n".join(json.dumps(m, indent=2) for m in manifests) + "\n"
    return yaml.safe_dump_all(list(manifests), sort_keys=False)
