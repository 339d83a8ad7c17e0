"""A launcher from another package, through its entry point alone: the package that
docs/launchers.md shows in full is built into a wheel, pip-installed into a folder of its
own, and a fresh Python with that folder on its path starts a cluster with the launcher and
its own flag, which lands in every process's environment."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "launchers.md"

# Run in the fresh Python: parse a command line with ClusterConfig's flags (the plug-in's
# among them), start the cluster, read each process's tag, stop.
SCRIPT = """
import argparse, json, sys
from jaxsys_kernel import Cluster
from jaxsys_kernel.cluster.config import ClusterConfig

parser = argparse.ArgumentParser(prog="plug-in check")
ClusterConfig.add_arguments(parser)
given = ClusterConfig.given(parser.parse_args(sys.argv[1:]))
cluster = Cluster(progress=lambda e: None, **given)
cluster.start_sync()
try:
    view = cluster.view
    view.execute("import os, jax; tag = os.environ['JAXSYS_TAG']; n = jax.process_count()",
                 block=True)
    print(json.dumps({"tags": view.pull("tag", block=True), "counts": view.pull("n", block=True),
                      "launcher": type(cluster.world.launcher).__name__}))
finally:
    cluster.stop_sync()
"""


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out: Path) -> Path:
    """The documented package as a wheel: its module, and its metadata and entry points
    from its pyproject.toml (a wheel needs no build backend to be made or installed)."""
    module = next(b for b in _blocks("python") if "class TaggedLauncher" in b)
    project = tomllib.loads(next(b for b in _blocks("toml") if "[project]" in b))["project"]
    name, version = project["name"], project["version"]
    dist = f"{name.replace('-', '_')}-{version}"
    groups = project["entry-points"]
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in groups.items()
    )
    files = {
        "jaxsys_tagged.py": module,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: jaxsys-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist}.dist-info/entry_points.txt": entry_points,
    }
    wheel = out / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        record = []
        for path, text in files.items():
            data = text.encode()
            z.writestr(path, data)
            record.append(_record_line(path, data))
        record.append(f"{dist}.dist-info/RECORD,,")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def test_a_launcher_from_another_package_starts_a_cluster_with_its_own_flag(tag, tmp_path):
    wheel = build_wheel(tmp_path)
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(target), str(wheel)],
        check=True, timeout=120,
    )  # fmt: skip
    assert (target / "jaxsys_tagged.py").is_file()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO)])}
    env.pop("JAXSYS_OVERRIDES", None)
    argv = ["--launcher", "tagged", "--tag", "blue", "--hosts", "2", "--devices-per-host", "1"]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *argv, "--standby", "0"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"tags": ["blue", "blue"], "counts": [2, 2], "launcher": "TaggedLauncher"}


def test_without_the_package_the_launcher_and_its_flag_are_unknown(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "--launcher", "tagged", "--tag", "blue"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "invalid choice: 'tagged'" in done.stderr or "unrecognized arguments" in done.stderr
