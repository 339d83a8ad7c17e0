"""Exported computations: the card's facts, save/load, calls checked against constraints.

JAX runs in a child process with four CPU devices (this test process never imports JAX); the
card, its text and HTML forms and the dimension arithmetic are checked here directly.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxsys_kernel.widgets import ArtifactView, view_for
from jaxsys_kernel.widgets.artifact import html_card, text_card

CHILD = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax import export
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jaxsys_kernel
    from jaxsys_kernel.engine.display import summarize
    from jaxsys_kernel.export import ExportCallError

    out = {}
    b, = export.symbolic_shape("b", constraints=("b <= 16",))
    mesh = jax.make_mesh((4,), ("x",))
    rows = NamedSharding(mesh, P("x", None))

    def predict(x, w):
        return jnp.tanh(x @ w)

    exp = export.export(jax.jit(predict))(
        jax.ShapeDtypeStruct((4 * b, 4), jnp.float32, sharding=rows),
        jax.ShapeDtypeStruct((4, 3), jnp.float32),
    )
    out["fresh"] = summarize(exp)
    path = os.path.join(sys.argv[1], "predict.jaxexport")
    out["written"] = jaxsys_kernel.save_exported(exp, path)
    out["file_bytes"] = os.path.getsize(path)
    f = jaxsys_kernel.load_exported(path)
    out["loaded"] = summarize(f)
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    out["calls"] = {}
    for n in (4, 8, 12):
        x = jax.device_put(np.linspace(-1, 1, n * 4, dtype=np.float32).reshape(n, 4), rows)
        got = np.asarray(f(x, w))
        want = np.tanh(np.asarray(x) @ w)
        out["calls"][n] = [list(got.shape), bool(np.allclose(got, want, atol=1e-6))]

    def error(call):
        try:
            call()
        except ExportCallError as e:
            return str(e)
        except Exception as e:
            return f"OTHER {type(e).__name__}: {e}"
        return None

    ones = lambda *s: np.ones(s, np.float32)
    out["too_big"] = error(lambda: f(jax.device_put(ones(68, 4), rows), w))
    out["not_multiple"] = error(lambda: f(ones(6, 4), w))
    out["wrong_static"] = error(lambda: f(jax.device_put(ones(8, 5), rows), w))
    two = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    out["two_devices"] = error(lambda: f(jax.device_put(ones(8, 4), NamedSharding(two, P("x"))), w))
    out["numpy_on_one"] = error(lambda: f(ones(8, 4), w))
    # A loaded export's own error from JAX (had the check let it through), translated.
    try:
        f.exported.call(jax.device_put(ones(68, 4), rows), w)
    except ValueError as e:
        out["raw_jax"] = [str(e).splitlines()[0], str(jaxsys_kernel.export._translate(exp, e))]

    # Exported for accelerators this machine does not have, from CPU.
    far = export.export(jax.jit(jnp.sin), platforms=("cuda", "tpu"))(
        jax.ShapeDtypeStruct(export.symbolic_shape("n, 3"), jnp.float32))
    out["far"] = summarize(far)
    out["far_call"] = error(lambda: jaxsys_kernel.export.LoadedExport(far)(ones(2, 3)))
    out["window"] = [export.minimum_supported_calling_convention_version,
                     export.maximum_supported_calling_convention_version]
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path_factory.mktemp("exports"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the card (no JAX) ---------------------------------------------------------------------


def test_card_forms_carry_the_same_facts(child):
    info = child["loaded"]
    text = text_card(info)
    page = html_card(info)
    for fact in (
        "Exported predict",
        "f32[4*b, 4]",
        "f32[4, 3]",
        "f32[4*b, 3]",
        "P('x', None)",
        "b >= 1, b <= 16",
        "4 (mesh x=4)",
        "calling convention 10",
        "accepts 9 to 10",
        f"{info['serialized_bytes']:,} bytes",
    ):
        assert fact in text, fact
        assert html.escape(fact) in page, fact
    view = view_for(info)
    assert isinstance(view, ArtifactView)
    data, _ = view._repr_mimebundle_()
    assert data["text/plain"] == text and data["text/html"] == page
    assert "application/vnd.jupyter.widget-view+json" in data


# -- what the engines compute (JAX in a child) ----------------------------------------------------


def test_card_facts_of_a_fresh_and_a_loaded_export(child):
    for key in ("fresh", "loaded"):
        info = child[key]
        assert info["kind"] == "export" and info["fun_name"] == "predict"
        assert [i["type"] for i in info["inputs"]] == ["f32[4*b, 4]", "f32[4, 3]"]
        assert [i["name"] for i in info["inputs"]] == ["args[0]", "args[1]"]
        assert info["inputs"][0]["sharding"] == "P('x', None)"
        assert [o["type"] for o in info["outputs"]] == ["f32[4*b, 3]"]
        assert info["symbols"] == ["b"]
        # The explicit constraint survives serialization (read back from the module).
        assert info["constraints"] == ["b >= 1", "b <= 16"], key
        assert info["nr_devices"] == 4 and info["mesh"] == "x=4"
        assert info["platforms"] == ["cpu"] and info["runs_here"] and info["loads_here"]
        assert info["accepted"] == child["window"]
        assert info["accepted"][0] <= info["calling_convention"] <= info["accepted"][1]
    assert child["loaded"]["serialized_bytes"] == child["file_bytes"] == child["written"]
    assert child["loaded"]["path"].endswith("predict.jaxexport")


def test_a_loaded_export_runs_for_several_batch_sizes(child):
    assert child["calls"] == {"4": [[4, 3], True], "8": [[8, 3], True], "12": [[12, 3], True]}


def test_a_broken_constraint_names_symbol_constraint_and_value(child):
    assert child["too_big"] == (
        "predict: b = 17 (from args[0].shape[0] = 68) breaks the constraint b <= 16"
    )
    # JAX's own error for a loaded export says only "Error refining shapes"; the constraint
    # is in its cause, and jaxsys brings it up when its own check did not catch the call.
    raw, translated = child["raw_jax"]
    assert raw.startswith("Error refining shapes")
    assert translated.startswith(
        "predict: Input shapes do not match the symbolic shape constraint b <= 16"
    )
    assert "4*b for a whole b" in child["not_multiple"]
    assert child["wrong_static"].startswith(
        "predict: args[0].shape[1] = 5, but it was exported as 4"
    )


def test_a_wrong_device_count_is_named(child):
    assert child["two_devices"].startswith(
        "predict was exported for 4 devices (mesh x=4); args[0] is on 2 devices"
    )
    assert "the call used 1 device(s)" in child["numpy_on_one"]


def test_cross_platform_export_from_cpu(child):
    far = child["far"]
    assert far["platforms"] == ["cuda", "tpu"]
    assert far["loads_here"] and not far["runs_here"]
    assert far["why_not"] == "exported for cuda, tpu; this process is cpu"
    assert far["inputs"][0]["type"] == "f32[n, 3]"
    assert "exported for platforms" in child["far_call"]

