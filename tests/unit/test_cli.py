"""The jaxsys command line: install-kernel, run, cluster start|status|stop, lab."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_wheel_kernelspec_matches_generated_one():
    from jaxsys_kernel.kernel.spec import kernel_spec

    shipped = json.loads((ROOT / "share/jupyter/kernels/jaxsys/kernel.json").read_text())
    generated = kernel_spec(python="python")
    assert shipped == generated
