"""The dashboard's straggler view: its summary, its front-end module, its static forms."""

from __future__ import annotations

import base64
import json
import re

import pytest

from jaxsys_kernel.cells.stragglers import Stragglers
from jaxsys_kernel.cells.stragglers_summary import BINS, summarize
from jaxsys_kernel.widgets.esm import STATIC
from jaxsys_kernel.widgets.stragglers import (
    StragglersDashboard,
    StragglersView,
    stragglers_text,
)

from .test_stragglers import feed, run

pytestmark = pytest.mark.unit


def test_the_summary_names_the_late_process_and_lists_its_steps():
    info = summarize(feed(Stragglers(range(4)), run(4, 12, slow=2, where="input")))
    assert info["kind"] == "stragglers" and info["processes"] == 4
    assert info["named"] == {"rank": 2, "category": "input"}
    assert info["steps_total"] == 12 and len(info["steps"]) == 10
    assert all(s["last"] == 2 and s["named"] and s["late"] > 0.19 for s in info["steps"])
    # Every process listed (four is under the summary's limit), the late one waited least.
    assert [r["rank"] for r in info["rows"]][0] == 2 and len(info["rows"]) == 4
    assert info["histogram"] is None
    json.dumps(info)  # a synced trait: plain JSON


def test_at_a_thousand_processes_the_summary_stays_small():
    info = summarize(feed(Stragglers(range(1024)), run(1024, 3, slow=700, where="host")))
    assert len(info["rows"]) == 10 and info["rows"][0]["rank"] == 700
    assert len(info["histogram"]["counts"]) == BINS
    assert sum(info["histogram"]["counts"]) == 1024
    assert len(json.dumps(info)) < 8000


def test_refused_records_are_bounded_in_the_summary():
    view = Stragglers(range(30))
    for r in range(30):
        view.add(r, {"kind": "step", "step": "x" * 500})
    info = summarize(view)
    assert len(info["refused"]) == 10 and info["more_refused"] == 20
    assert all(len(why) <= 200 for why in info["refused"].values())
    assert info["steps_total"] == 0 and info["rows"] == [] and info["named"] is None
    assert "20 more processes' records were refused" in stragglers_text(info)


def test_the_view_ships_its_module_and_reads_the_python_trait_names():
    view = StragglersView()
    state = view.get_state()
    assert (
        state["_view_kind"] == "stragglers" and state["_css"] == (STATIC / "views.css").read_text()
    )
    js = (STATIC / "stragglers.js").read_text()
    assert (
        '} from "./shared.js";' not in state["_esm"] and "export function mount(" in state["_esm"]
    )
    m = re.search(r'const VIEW = \{ kind: "stragglers", draw: \w+, traits: \[([^\]]*)\]', js)
    synced = {
        n
        for n in StragglersView.class_trait_names(sync=True)
        if not n.startswith("_") and n not in ("layout", "tabbable", "tooltip")
    }
    assert m and set(re.findall(r'"(\w+)"', m.group(1))) == synced


def test_the_view_refuses_another_kind():
    with pytest.raises(Exception, match="StragglersView shows a 'stragglers' summary"):
        StragglersView({"kind": "mesh"})


def test_static_forms_say_who_and_draw_one_bar_per_process():
    info = summarize(feed(Stragglers(range(3)), run(3, 6, slow=1, where="host")))
    view = StragglersView(info)
    view.update(recording=True, note="as of 12:00:00")
    bundle = view.static()
    text = bundle["text/plain"]
    assert text.splitlines()[0].startswith("Stragglers: p1 held the others up, in host")
    assert "step 5: p1 arrived last, late by" in text and "as of 12:00:00" in text
    assert sum(1 for line in text.splitlines() if re.match(r"p\d: input", line)) == 3
    png = base64.b64decode(bundle["image/png"])
    assert png.startswith(b"\x89PNG") and "text/html" not in bundle


def test_an_empty_view_says_how_to_start_recording():
    text = stragglers_text({}, recording=False)
    assert "no step spanning processes recorded yet" in text and "%jaxsys where on" in text


def test_the_dashboard_places_the_view_below_and_keeps_it_in_its_picture():
    info = summarize(feed(Stragglers(range(2)), run(2, 5, slow=1, where="compute")))
    dash = StragglersDashboard(stragglers=info)
    assert dash.children[-1] is dash.stragglers and len(dash.children) == 5
    assert dash.stragglers.layout.grid_area == "stragglers"
    assert '"stragglers stragglers"' in dash.layout.grid_template_areas
    data, _ = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "p1 held the others up, in compute" in data["text/plain"]
    assert "process" in data["text/plain"]  # the four views' tables are still there
    assert base64.b64decode(data["image/png"]).startswith(b"\x89PNG")
    # An existing view is placed as it is.
    view = StragglersView(info)
    assert StragglersDashboard(stragglers=view).stragglers is view


def test_the_view_is_updated_only_after_cells_that_ran_on_every_process():
    from jaxsys_kernel.magics.stragglers_feed import ran_everywhere

    assert ran_everywhere("%%multihost --timeout 60\nstep(x)", spmd=False)
    assert ran_everywhere("\n# a step\nstep(x)", spmd=True)
    assert not ran_everywhere("%%multihost --procs 0\nstep(x)", spmd=False)
    assert not ran_everywhere("print(1)", spmd=False)
    assert not ran_everywhere("%jaxsys where", spmd=True)
    assert not ran_everywhere("%%local\nprint(1)", spmd=True)
