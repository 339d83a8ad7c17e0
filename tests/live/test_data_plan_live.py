"""Data-loading plans on simulated devices: reads, bytes, replicas, merging and drawing.

No JAX here: the shardings are :class:`FakeNamedSharding` over :func:`fake_devices`, whose
layouts ``test_summaries`` checks against JAX itself (and ``test_data_load`` checks plans of
real shardings against these).
"""

from __future__ import annotations

import subprocess
import sys


def test_kernel_side_plans_never_import_jax():
    code = (
        "import sys\n"
        "from jaxsys_kernel.data import plan\n"
        "from jaxsys_kernel.widgets import DataPlanView\n"
        "from jaxsys_kernel.engine.simulate import FakeNamedSharding, fake_devices, fake_mesh\n"
        "m = fake_mesh(fake_devices(4, 2), (4,), ('b',))\n"
        "DataPlanView(plan((8, 2), FakeNamedSharding(m, ('b',))).summary())\n"
        "bad = [m for m in ('jax', 'grain', 'jaxsys_kernel.data.load') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

