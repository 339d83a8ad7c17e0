"""The Kubernetes launcher's manifests: made without a cluster, checked field by field and,
where the schema package is installed, against the Kubernetes and JobSet schemas."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import launcher_class
from jaxsys_kernel.cluster.launchers.kubernetes import (
    CREDENTIALS_DIR,
    WORLD_LABEL,
    KubernetesLauncher,
    dump,
    load_pod_template,
    world_manifests,
    world_name,
)
from jaxsys_kernel.errors import ConfigError

pytestmark = pytest.mark.unit

CMD = ["python", "-m", "prog"]


def by_kind(manifests):
    return {m["kind"]: m for m in manifests}


def container(pod_template):
    [ctr] = pod_template["spec"]["containers"]
    return ctr


def test_registered_under_its_name_with_its_options():
    assert launcher_class("kubernetes") is KubernetesLauncher
    cfg = ClusterConfig(hosts=2, launcher="kubernetes", launcher_options={"image": "img"})
    assert cfg.launcher_options == {"image": "img"}
    with pytest.raises((ConfigError, ValueError), match="imagee.*the kubernetes launcher"):
        ClusterConfig(hosts=2, launcher="kubernetes", launcher_options={"imagee": "x"})


def test_indexed_job_world_has_n_pods_headless_dns_and_no_retries():
    ms = world_manifests("w1", 4, CMD, {"image": "img:1", "namespace": "ml"})
    assert [m["kind"] for m in ms] == ["Secret", "Service", "Job"]
    svc, job = by_kind(ms)["Service"], by_kind(ms)["Job"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {WORLD_LABEL: "w1"}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    assert spec["backoffLimit"] == 0
    pod = spec["template"]
    # The pods' subdomain is the Service: JAX's coordinator is "<job>-0.<subdomain>".
    assert pod["spec"]["subdomain"] == svc["metadata"]["name"] == job["metadata"]["name"]
    assert pod["metadata"]["labels"][WORLD_LABEL] == "w1"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container(pod)["image"] == "img:1"
    assert container(pod)["command"] == CMD
    assert {m["metadata"]["namespace"] for m in ms} == {"ml"}


def test_credentials_go_in_the_secret_never_in_the_spec():
    key = b"-----BEGIN PRIVATE KEY-----\nsecret-bytes\n"
    ms = world_manifests("w", 2, CMD, {"image": "i"}, credentials={"engine-0.key": key})
    secret = by_kind(ms)["Secret"]
    assert base64.b64decode(secret["data"]["engine-0.key"]) == key
    spec_text = json.dumps([m for m in ms if m["kind"] != "Secret"])
    assert "secret-bytes" not in spec_text
    assert base64.b64encode(key).decode() not in spec_text
    pod = by_kind(ms)["Job"]["spec"]["template"]
    [vol] = pod["spec"]["volumes"]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    [mount] = container(pod)["volumeMounts"]
    assert (mount["mountPath"], mount["readOnly"]) == (CREDENTIALS_DIR, True)


def test_bad_credential_name_is_refused():
    with pytest.raises(ConfigError, match="cannot be a Secret key"):
        world_manifests("w", 2, CMD, {"image": "i"}, credentials={"../x": b""})


def test_missing_image_says_how_to_give_one():
    with pytest.raises(ConfigError, match="needs an image.*pod_template"):
        world_manifests("w", 2, CMD, {})


def test_pod_template_file_gives_image_and_keeps_users_fields(tmp_path):
    tpl = tmp_path / "pod.yaml"
    tpl.write_text(
        "metadata:\n  labels: {team: ml}\n"
        "spec:\n  nodeSelector: {pool: gpu}\n"
        "  containers:\n  - name: engine\n    image: from-template:2\n"
        "    env: [{name: USER_VAR, value: '1'}]\n"
    )
    ms = world_manifests("w", 2, CMD, {"pod_template": str(tpl)}, env={"A": "b"})
    pod = by_kind(ms)["Job"]["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["metadata"]["labels"] == {"team": "ml", WORLD_LABEL: "w"}
    ctr = container(pod)
    assert ctr["image"] == "from-template:2"
    env = {e["name"]: e["value"] for e in ctr["env"]}
    assert env == {"USER_VAR": "1", "JAXSYS_NUM_PROCESSES": "2", "A": "b"}
    # The option wins over the template's image.
    ms = world_manifests("w", 2, CMD, {"pod_template": str(tpl), "image": "opt:3"})
    assert container(by_kind(ms)["Job"]["spec"]["template"])["image"] == "opt:3"


def test_pod_template_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_pod_template(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\nmetadata: {}\n")
    with pytest.raises(ConfigError, match="holds no pod spec"):
        load_pod_template(bad)


def test_one_replica_jobset_leaves_ids_to_jax_detection():
    js = by_kind(world_manifests("w", 4, CMD, {"image": "i", "kind": "jobset"}))["JobSet"]
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    [rj] = js["spec"]["replicatedJobs"]
    assert rj["replicas"] == 1
    job = rj["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["backoffLimit"]) == (4, 4, 0)
    assert container(job["template"])["command"] == CMD


def test_multi_replica_jobset_gives_unique_ids_and_one_coordinator():
    opts = {"image": "i", "kind": "jobset", "replicas": 2, "coordinator_port": 1234}
    js = by_kind(world_manifests("w", 4, CMD, opts))["JobSet"]
    [rj] = js["spec"]["replicatedJobs"]
    assert rj["replicas"] == 2
    job = rj["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 2
    ctr = container(job["template"])
    env = {e["name"]: e for e in ctr["env"]}
    assert env["JAX_COORDINATOR_ADDRESS"]["value"] == "w-engines-0-0.w:1234"
    assert env["JAXSYS_NUM_PROCESSES"]["value"] == "4"
    field = env["JAXSYS_JOB_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == "metadata.labels['jobset.sigs.k8s.io/job-index']"
    assert ctr["command"][-3:] == CMD


def test_bad_options_are_refused_with_what_to_do():
    with pytest.raises(ConfigError, match="does not divide 4"):
        world_manifests("w", 4, CMD, {"image": "i", "kind": "jobset", "replicas": 3})
    with pytest.raises(ConfigError, match="choose one of job, jobset"):
        world_manifests("w", 4, CMD, {"image": "i", "kind": "deployment"})
    with pytest.raises(ConfigError, match="replicas apply to kind='jobset'"):
        world_manifests("w", 4, CMD, {"image": "i", "replicas": 2})
    with pytest.raises(ConfigError, match="not a DNS label"):
        world_manifests("Bad_Name", 2, CMD, {"image": "i"})


def test_queue_suspends_the_world_for_kueue():
    job = by_kind(world_manifests("w", 2, CMD, {"image": "i", "queue": "team-a"}))["Job"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True


def test_world_names_are_dns_labels():
    import re

    for cid, inc in [("1701-ab_C", 0), ("X" * 80, 12), ("___", 3)]:
        name = world_name(cid, inc)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40


def test_dump_round_trips():
    yaml = pytest.importorskip("yaml")
    ms = world_manifests("w", 2, CMD, {"image": "i", "coordinator_port": 999})
    assert list(yaml.safe_load_all(dump(ms))) == ms
    env = container(by_kind(ms)["Job"]["spec"]["template"])["env"]
    assert {"name": "JAX_COORDINATOR_PORT", "value": "999"} in env


# -- the schemas, offline -------------------------------------------------------------------

JOBSET_SCHEMA = Path(__file__).parent.parent / "data" / "jobset-v1alpha2.schema.json"
K8S_VERSION = "1.32"

WORLDS = [
    ("job", {"image": "i"}),
    ("job", {"image": "i", "queue": "q", "service_account": "jax", "coordinator_port": 7}),
    ("job", {"image": "i", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 2}}}),
    ("jobset", {"image": "i", "kind": "jobset"}),
    ("jobset", {"image": "i", "kind": "jobset", "replicas": 2, "queue": "q"}),
]


def validate_k8s(manifest):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    kv.validate(manifest, K8S_VERSION, strict=True)


def validate_jobset(js):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(js, json.loads(JOBSET_SCHEMA.read_text()))
    for rj in js["spec"]["replicatedJobs"]:
        # The JobSet schema leaves its Jobs' spec to batch/v1's.
        validate_k8s(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "x"},
                **{"spec": rj["template"]["spec"]},
            }
        )


@pytest.mark.parametrize(
    "kind,options", WORLDS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(WORLDS)]
)
def test_manifests_pass_the_kubernetes_and_jobset_schemas(kind, options):
    ms = world_manifests("w", 4, CMD, options, env={"A": "1"}, credentials={"k": b"v"})
    for m in ms:
        if m["kind"] == "JobSet":
            validate_jobset(m)
        else:
            validate_k8s(m)


def test_schemas_catch_a_wrong_manifest():
    ms = by_kind(world_manifests("w", 4, CMD, {"image": "i"}))
    ms["Job"]["spec"]["parallelism"] = "four"
    with pytest.raises(Exception, match="is not of type"):
        validate_k8s(ms["Job"])
    js = by_kind(world_manifests("w", 4, CMD, {"image": "i", "kind": "jobset"}))["JobSet"]
    js["spec"]["replicatedJobs"][0]["replica"] = 2
    with pytest.raises(Exception, match="'replica' was unexpected"):
        validate_jobset(js)


def test_a_notebook_cluster_without_an_image_is_refused_before_anything_starts(tmp_path):
    from jaxsys_kernel.cluster.launchers import make_launcher

    cfg = ClusterConfig(hosts=2, launcher="kubernetes")
    launcher = make_launcher(cfg)
    with pytest.raises(ConfigError, match="needs an image"):
        launcher.make_ipp_cluster(tmp_path, True)
    assert list(tmp_path.iterdir()) == []
    assert launcher.ipp is None


def test_a_batch_job_checks_its_options_when_written(tmp_path):
    files, command = KubernetesLauncher.batch_job(
        Path("program.py"), 2, Path("."), {"image": "i", "sbatch_args": []}
    )
    assert files == {}
    assert command[1:3] == ["-m", "jaxsys_kernel.cluster.launchers.kubernetes_job"]
    assert command[3:] == ["2", json.dumps({"image": "i"}), "program.py"]
    with pytest.raises(ConfigError, match="needs an image"):
        KubernetesLauncher.batch_job(Path("program.py"), 2, Path("."), {})
