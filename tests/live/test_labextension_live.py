"""The labextension's packaging (one version, installed prebuilt) and the jaxsys comm's logic
without a kernel: command parsing, the state it pushes, and following the telemetry hub."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
EXT = ROOT / "labextension"
PACKAGE = json.loads((EXT / "package.json").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_wheel_installs_the_prebuilt_extension_under_its_name():
    shared = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    out_dir = f"labextension/{PACKAGE['jupyterlab']['outputDir']}"
    assert shared[out_dir] == f"share/jupyter/labextensions/{PACKAGE['name']}"
    install = json.loads((EXT / "install.json").read_text())
    assert install["packageName"] == PYPROJECT["project"]["name"]
    assert install["packageManager"] == "python"
    hook = PYPROJECT["tool"]["hatch"]["build"]["hooks"]["jupyter-builder"]
    assert all(t.startswith(out_dir) for t in hook["ensured-targets"])
    # The built output is never committed; the lockfile is.
    tracked = subprocess.run(
        ["git", "ls-files", "labextension"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert "labextension/yarn.lock" in tracked
    assert not [t for t in tracked if t.split("/")[1] in ("prebuilt", "lib", "node_modules")]


def test_labextension_list_shows_it_enabled_ok_and_prebuilt():
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    line = f"{PACKAGE['name']} v{PACKAGE['version']} enabled OK (python, {PYPROJECT['project']['name']})"
    assert line in text, text
    installed = Path(sys.prefix) / "share/jupyter/labextensions" / PACKAGE["name"]
    built = json.loads((installed / "package.json").read_text())
    assert built["version"] == PACKAGE["version"]
    assert built["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")

