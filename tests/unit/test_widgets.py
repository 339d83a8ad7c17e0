"""The notebook views: traits, dispatch, one comm message per update, valid front-end JS."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import traitlets

from jaxsys_kernel.engine.summaries import (
    FakeNamedSharding,
    fake_devices,
    fake_mesh,
    mesh_info,
    sharding_info,
)
from jaxsys_kernel.telemetry.schema import CacheStats, Liveness
from jaxsys_kernel.widgets import (
    CacheView,
    Dashboard,
    LiveDevicesView,
    MeshView,
    ShardingView,
    esm,
    view_for,
)
from jaxsys_kernel.widgets import views as views_module

from ..fakes import FakeComm

STATIC = pathlib.Path(views_module.__file__).parent / "static"


def attach(widget):
    comm = FakeComm()
    widget.comm = comm
    return comm


@pytest.fixture
def mesh():
    return mesh_info(fake_mesh(fake_devices(8, 4), (4, 2), ("x", "y")))


@pytest.fixture
def sharding():
    m = fake_mesh(fake_devices(8, 4), (4, 2), ("x", "y"))
    return sharding_info((FakeNamedSharding(m, ("x", None)), (8, 6)), dtype="float32")


def test_mesh_view_state(mesh):
    view = MeshView(mesh)
    state = view.get_state()
    assert state["info"] == mesh and state["_view_kind"] == "mesh"
    assert json.loads(json.dumps(state["info"])) == mesh


def test_sharding_view_state(sharding):
    view = ShardingView(sharding, dims=(1, 0), selected_process=1)
    state = view.get_state()
    assert state["info"] == sharding and state["_view_kind"] == "sharding"
    assert state["dims"] == [1, 0] and state["selected_process"] == 1
    assert ShardingView().get_state()["selected_process"] is None


VIEW_FILES = ((MeshView, "mesh"), (ShardingView, "sharding"), (CacheView, "cache"),
              (LiveDevicesView, "live"))  # fmt: skip


def test_each_view_ships_its_own_module_with_the_shared_one_inlined():
    css = (STATIC / "views.css").read_text()
    shared = (STATIC / "shared.js").read_text()
    assert css.strip() and "export function mount(" in shared
    for cls, name in VIEW_FILES:
        own = (STATIC / f"{name}.js").read_text()
        esm = cls().get_state()["_esm"]
        assert cls().get_state()["_css"] == css
        # The view's own code follows the shared module, whose import line it replaces.
        assert esm.index(shared) < esm.index(own.split('from "./shared.js";\n', 1)[1])
        assert '} from "./shared.js";' not in esm and esm.count("export default") == 1
    assert not (STATIC / "views.js").exists()


def test_a_view_module_must_import_shared_names_on_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(esm, "STATIC", tmp_path)
    (tmp_path / "shared.js").write_text("export function h() {}\n")
    (tmp_path / "a.js").write_text('import { h } from "./shared.js";\nexport default {};\n')
    (tmp_path / "b.js").write_text('import { nope } from "./shared.js";\nexport default {};\n')
    (tmp_path / "c.js").write_text("export default {};\n")
    esm.view_module.cache_clear()
    try:
        assert esm.view_module("a").startswith("// ---- shared.js, inlined\nexport function h")
        with pytest.raises(ValueError, match=r"imports \['nope'\], which shared.js lacks"):
            esm.view_module("b")
        with pytest.raises(ValueError, match="exactly one line"):
            esm.view_module("c")
    finally:
        esm.view_module.cache_clear()


def test_front_end_reads_the_python_trait_names():
    for cls, kind in VIEW_FILES:
        js = (STATIC / f"{kind}.js").read_text()
        synced = {
            name
            for name in cls.class_trait_names(sync=True)
            if not name.startswith("_") and name not in ("layout", "tabbable", "tooltip")
        }
        m = re.search(rf'const VIEW = \{{ kind: "{kind}", draw: \w+, traits: \[([^\]]*)\]', js)
        assert m, kind
        assert set(re.findall(r'"(\w+)"', m.group(1))) == synced, kind
        assert cls().get_state()["_view_kind"] == kind


def test_cache_view_from_records():
    stats = [CacheStats(rank=0, requests=4, hits=3, entries=2, bytes=2048, last_functions=["f"])]
    view = CacheView(stats)
    (row,) = view.get_state()["stats"]
    assert row["misses"] == 1 and row["hit_rate"] == 0.75 and row["last_functions"] == ["f"]
    view.update([{"rank": 1, "requests": 0, "hits": 0}])
    assert view.stats == [{"rank": 1, "requests": 0, "hits": 0}]
    with pytest.raises(TypeError, match="schema record"):
        CacheView([42])


def test_live_view_log_and_records():
    view = LiveDevicesView([Liveness(rank=0, state="alive", heartbeat_age=0.2, devices=[0, 1])])
    state = view.get_state()
    assert state["liveness"][0]["state"] == "alive" and state["event_log"] == []
    view.update(append=["p0 started"])
    view.update(append=["p1 died"])
    assert view.event_log == ["p0 started", "p1 died"]
    view.update(log=[f"line {i}" for i in range(views_module.MAX_LOG + 10)], append=["last"])
    assert len(view.event_log) == views_module.MAX_LOG and view.event_log[-1] == "last"
    assert view.log is not None  # the widget's logger is untouched


def test_update_is_one_message(sharding):
    view = ShardingView()
    comm = attach(view)
    view.update(sharding, dims=(1, 0), selected_process=1)
    assert len(comm.sent) == 1
    msg = comm.sent[0]
    assert msg["method"] == "update"
    assert set(msg["state"]) == {"info", "dims", "selected_process"}
    view.update(selected_process=None)
    assert len(comm.sent) == 2 and comm.sent[1]["state"] == {"selected_process": None}
    # Without hold_sync every trait would be its own message.
    view.info, view.dims = {}, [0, 1]
    assert len(comm.sent) == 4


@pytest.mark.parametrize(
    "make,call",
    [
        (lambda: MeshView(), lambda v, m, s: v.update(m)),
        (lambda: CacheView(), lambda v, m, s: v.update([{"rank": 0}, {"rank": 1}])),
        (lambda: LiveDevicesView(), lambda v, m, s: v.update([{"rank": 0}], append=["x"])),
    ],
)
def test_other_updates_are_one_message(make, call, mesh, sharding):
    view = make()
    comm = attach(view)
    call(view, mesh, sharding)
    assert len(comm.sent) == 1


def test_front_end_sets_selected_process(sharding):
    view = ShardingView(sharding)
    attach(view)
    # What the JS sends after model.set("selected_process", 1); model.save_changes().
    msg = {"method": "update", "state": {"selected_process": 1}, "buffer_paths": []}
    view._handle_msg({"content": {"data": msg}, "buffers": []})
    assert view.selected_process == 1
    view._handle_msg({"content": {"data": {**msg, "state": {"dims": [1, 0]}}}, "buffers": []})
    assert view.dims == [1, 0]


def test_validation(mesh, sharding):
    with pytest.raises(traitlets.TraitError, match="'mesh' summary"):
        MeshView(sharding)
    with pytest.raises(traitlets.TraitError, match="'sharding' summary"):
        ShardingView(mesh)
    with pytest.raises(traitlets.TraitError, match="two different dims"):
        ShardingView(sharding, dims=(1, 1))


def test_view_for(mesh, sharding):
    assert isinstance(view_for(mesh), MeshView)
    s = view_for(sharding, dims=(1, 0))
    assert isinstance(s, ShardingView) and s.dims == [1, 0]
    with pytest.raises(ValueError, match="no view for a summary of kind 'cache'"):
        view_for({"kind": "cache"})
    with pytest.raises(ValueError, match="no view"):
        view_for({})


def test_dashboard(mesh, sharding):
    cache = [CacheStats(rank=0, requests=1, hits=1)]
    live = [Liveness(rank=0, state="alive", devices=[0])]
    dash = Dashboard(mesh=mesh, sharding=sharding, cache=cache, live=live, log=["hello"])
    assert dash.children == (dash.mesh, dash.sharding, dash.cache, dash.live)
    assert dash.mesh.info == mesh and dash.sharding.info == sharding
    assert dash.cache.stats[0]["hit_rate"] == 1.0 and dash.live.event_log == ["hello"]
    dash.update(live=[Liveness(rank=0, state="dead")], append=["p0 died"])
    assert dash.live.liveness[0]["state"] == "dead"
    assert dash.live.event_log == ["hello", "p0 died"]
    # Existing views are placed as they are; missing parts are empty views.
    mv = MeshView(mesh)
    other = Dashboard(mesh=mv)
    assert other.mesh is mv and other.sharding.info == {} and other.cache.stats == []


def test_large_sharding_view_state_is_json():
    m = fake_mesh(fake_devices(4096, 4), (64, 64), ("x", "y"))
    info = sharding_info((FakeNamedSharding(m, ("x", "y")), (1024, 1024)), max_blocks=1024)
    view = ShardingView(info)
    assert view.get_state()["info"]["aggregated"]
    json.dumps(view.get_state()["info"])


def test_the_caches_platform_note_is_not_painted_as_a_warning():
    # On CPU only process 0 is served: a fact of the platform, said in the muted text colour.
    css = (STATIC / "views.css").read_text()
    rule = css.split(".jxs-note.jxs-cache-why", 1)[1].split("}", 1)[0]
    assert "--jp-warn-color" not in rule and "--jp-ui-font-color2" in rule
