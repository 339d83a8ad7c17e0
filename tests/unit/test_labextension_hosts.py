"""The extension loads in hosts without a status bar (Voilà, Notebook 7 pages without one):
the plugin takes the status bar as optional, and the build does not require the host to
share ``@jupyterlab/statusbar`` (a host that lacks it would refuse the whole extension with
"Shared module @jupyterlab/statusbar doesn't exist in shared scope default")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

EXT = Path(__file__).parents[2] / "labextension"
STATUSBAR = "@jupyterlab/statusbar"


def plugin_tokens(source: str, key: str) -> list[str]:
    """The tokens listed under ``key`` (``requires`` or ``optional``) of the plugin."""
    found = re.search(rf"^\s*{key}:\s*\[([^\]]*)\]", source, re.MULTILINE)
    assert found, f"the plugin in index.ts lists no {key}"
    return [t.strip() for t in found.group(1).split(",") if t.strip()]


def test_the_plugin_takes_the_status_bar_as_optional():
    source = (EXT / "src" / "index.ts").read_text()
    assert "IStatusBar" in plugin_tokens(source, "optional")
    assert "IStatusBar" not in plugin_tokens(source, "requires")
    # Without it the status item goes to the notebook's toolbar instead.
    assert "if (statusBar)" in source and "addToToolbars(" in source


def test_the_build_carries_its_own_status_bar_module_for_hosts_without_one():
    package = json.loads((EXT / "package.json").read_text())
    shared = package["jupyterlab"].get("sharedPackages", {}).get(STATUSBAR)
    # Bundled: a host that shares none falls back to the extension's copy; a singleton:
    # JupyterLab's own copy wins where there is one, so its IStatusBar token is the one used.
    assert shared == {"bundled": True, "singleton": True}, shared


def test_the_prebuilt_extension_has_a_fallback_for_the_status_bar():
    entries = sorted((EXT / "prebuilt" / "static").glob("remoteEntry.*.js"))
    if not entries:
        pytest.skip("no prebuilt extension here (make install builds it)")
    built = json.loads((EXT / "prebuilt" / "package.json").read_text())
    if built["jupyterlab"].get("sharedPackages") != json.loads((EXT / "package.json").read_text())[
        "jupyterlab"
    ].get("sharedPackages"):
        pytest.skip("the prebuilt extension is older than package.json (make install)")
    text = entries[-1].read_text()
    found = re.search(r'shareKey:"@jupyterlab/statusbar",import:"([^"]*)"', text)
    assert found, "the prebuilt extension consumes @jupyterlab/statusbar without a fallback"
    assert found.group(1) == STATUSBAR
