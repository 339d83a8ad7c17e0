"""Every notebook in notebooks/ runs end to end, headless, with the jaxsys kernel."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from jaxsys_kernel.cli import run_notebook

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

# Lines a notebook's outputs must contain: proof that it shows what its prose says.
EXPECTED = {
    "01-meshes-and-shardings.ipynb": [
        "assembled correctly: True",
        "[496.0, 496.0, 496.0, 496.0, 496.0]",
        "same devices in the same places as `mesh`: True",
        # a matmul picks a layout neither input had; replicate before reading
        "product: P('data',)",
        # the sharding view's text form, for readers without widgets
        "P('data',) over shape (8, 8): 4 blocks of shape (2, 8), x2 replicated, processes p0-3",
        "[p0-3] matches NumPy: True",
        # a mesh over half the devices: processes 0 and 1 hold nothing
        "[p0-1] my shards: []",
        "[p0-3] equals the original: True",
    ],
    "00-quickstart.ipynb": [
        "[p0-3] local devices: 2, devices in the world: 8",
        "[p0-3] sum: 48.0 mean: 1.5",
        "as expected: True",
        "JAX imported in the kernel: False",
        "[p3] 30",
        # errors grouped by process: p1 and p3 raised, the others printed
        "[p0] 1 / scale = 1.0",
        # the same computation as one process with all 8 devices
        "processes: 1 | devices: 8 | sum: 48.0 mean: 1.5",
        # initialize after a device call is refused
        "RuntimeError: jax.distributed.initialize() must be called before any JAX calls",
        # --explain: the call each process made
        "    process_id=1,",
    ],
    "02-data-loading.ipynb": [
        "[p0-3] values match the file: True",
        # pure data parallelism: a quarter each, the batch read once in all
        "[p0-3] share of the bytes read: [0.25, 0.25, 0.25, 0.25] | read 1.00 x the batch",
        "[p0-3] p3: read 512.0 KiB (524288 bytes) in 1 slice, 1 batch",
        "[p0-3] largest value, found across all processes: 524287.0",
        # one pipeline per device reads replicated rows twice
        "[p0-3] p0: read 1.0 MiB (1048576 bytes) in 2 slices, 1 batch",
        "[p0-3] layout after the reshard: P(None, 'batch')",
        "  p0       d0-1        1      512   512.0 KiB  25.0%  -",
        "[p3] examples in my rows of batch 1: [19, 23, 27, 31]",
        "[p0,2] my rows of the Grain batch start with examples [0, 8]",
        "[p0-3] processes that must read the same rows: [(0, 2), (1, 3)]",
        # the plan views (their text form): partners named, half the batch each
        "  p0       d0-1        1      1     1.0 MiB  50.0%  p1",
        "  p3       d6144-6145  1      1     1.0 MiB  50.0%  p1",
        "[p2-3] sum of the 'replicated' batch: 160.0",
    ],
    "03-fault-tolerance.ipynb": [
        # Without process prefixes: survivors may see the failure a collation window apart.
        "ProcessFailureError: lost devices [6144]",
        # the set handed out on entry still holds the process that died after the last barrier
        "live_devices hands out: [0, 2048, 4096, 6144]",
        "process 0 hosts JAX's coordination service",
        "checkpoint restored: step 10",
        "jaxsys hang doctor: p2 failed",
        "checkpoint restored: step 14",
        # fate-sharing without recoverability: process 0 goes down with process 1
        "process 0 is dead",
        # a death inside a step: every survivor runs the except branch
        "[p0-2] step 19 abandoned: lost devices [6144]",
    ],
    "05-export-and-shape-polymorphism.ipynb": [
        "f32[4*b, 16]",
        "b >= 1, b <= 256",
        "no (exported for cuda, tpu; this process is cpu)",
        "[p0-1] in: float32[4*b,16] -> out: float32[8*b,16]",
        "this jaxlib accepts 9 to 10",
        "p0 batch 1000: (1000, 2), my rows match NumPy: True",
        "p1 batch 1000: (1000, 2), my rows match NumPy: True",
    ],
    "06-compilation-cache.ipynb": [
        "jit_train_step",
        "p1: not served by the cache: on CPU",
        "p0: served. 2 request(s): 2 hit(s), 0 shared, 0 compiled here",
        "jit_train_step is cached under another key",
        "below the 30 s minimum",
        "jaxsys: removed",
        # the dashboard part: a training loop that recompiles
        "learned w: [ 2.  -1.   0.5  3. ]",
    ],
    "07-transfer-guard.ipynb": [
        # a refusal per process, naming its own device
        "host-to-device transfer of shape (8), dtype float32, from host memory to device cpu:0",
        "to device cpu:2048 disallowed on process 1",
        # a sharded read is gathered through the first device, which JAX names
        "device-to-host transfer of shape (8), dtype float32, from device cpu:0 to host memory",
        "[p0-1] read back under disallow: 28.0 | as NumPy: [0.0, 1.0, 2.0]",
        "guard_lib.cc:154] host-to-device transfer: aval=ShapedArray(float32[8])",
        "[p0-1] transfer guard h2d=log d2h=log d2d=log; logged transfers: 6 h2d, 0 d2h, 0 d2d",
        "[p0-1] device-to-host still allowed: 56.0",
    ],
    "08-threads-pipelines-and-multihost-utils.ipynb": [
        "[p1] stage-one output has local data here: False",
        "[p1] matches NumPy: True",
        "on process 1 in thread 'stage-2-worker'",
        "[p0-1] sums computed on the cell's thread: [0.0, 4.0, 8.0]",
        "[p1] proposed: 1001 | agreed: 1000",
        "stacked (3,) -> (2, 3) [[0, 0, 0], [1, 1, 1]] | tiled scalar -> (2,)",
        "[p0] with 1 process: stacked (3,) -> (1, 3) | tiled scalar -> ()",
        "each process's id",
        "[p0-1] back to my rows: True",
        "jaxsys: barrier 'checkpoint-written' passed by p0-1",
        "[p0] waiting at barrier 'held-back': arrived p0; missing p1",
        "barrier 'held-back' timed out after 2 s: p1 never arrived (arrived: p0)",
        "jaxsys: barrier 'after-the-wait' passed by p0-1",
        "in the thread started inside the trace: UnexpectedTracerError",
        # --explain: the transfer socket as the plain-JAX line each process ran
        "jax.config.update('jax_cross_host_transfer_socket_address', '127.0.0.1:",
    ],
    "04-security.ipynb": [
        "did it join? False",
        "connection(s) from 127.0.0.1: it hung up during the handshake",
        "from 127.0.0.1: it presented no certificate",
        "[p0-1] sum over both processes: 3.0",
        "[p0-1] peer URI prefix: spiffe://jaxsys.local/mylab/",
        "connection with process 1's new certificate: accepted",
        # any mTLS setting makes an incomplete set-up an error; the prefix needs its '/'
        "certificate only:        JaxRuntimeError: INVALID_ARGUMENT: mTLS configuration is missing",
        "prefix without its '/':  JaxRuntimeError: INVALID_ARGUMENT: mTLS peer_uri_prefix must end",
        "no mTLS, check required: aborted (signal 6)",
        # the cluster's own CA, but a URI outside the prefix: refused, and reported as such
        "the outsider:   refused (it hung up)",
        "process 1:      accepted",
        "for an identity outside this cluster",
        # an open coordinator: one unauthenticated process claiming id 1 ends the real one
        "process 0 ready, process 1 dead",
    ],
}


# Lines every start-up prints on stderr: progress, not warnings.
INFO = re.compile(r"^jaxsys: \d+ processes x \d+ devices ready in ")

# The jaxsys warnings each notebook is allowed to show, because its text explains them:
# (a fragment of the warning, a fragment its markdown must contain).
EXPLAINED = {
    "00-quickstart.ipynb": [("these processes are out of step", "same-program guard")],
    "04-security.ipynb": [
        ("jaxsys: the coordination service refused", "turns every refused handshake into a report")
    ],
    "03-fault-tolerance.ipynb": [
        ("these processes are out of step", "same-program guard"),
        ("jaxsys: interrupting", "sent the three an interrupt"),
    ],
}


# Pictures a saved notebook must show without widgets: the views' static SVG renderings.
STATIC_PICTURES = {"01-meshes-and-shardings.ipynb": 8, "06-compilation-cache.ipynb": 2}


def _svg_outputs(nb) -> int:
    return sum(
        "<svg" in o.get("data", {}).get("text/html", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )


def _markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def clean_run_problems(nb, explained: list[tuple[str, str]]) -> list[str]:
    """What keeps an executed notebook from being a clean run.

    An error output in a cell not tagged ``raises-exception``; a ``jaxsys:`` line on stderr
    that is neither start-up progress nor a warning listed in ``explained`` whose
    explanation the notebook's markdown contains.
    """
    problems = []
    text = _markdown(nb)
    allowed = [w for w, why in explained if why in text]
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        raises = "raises-exception" in c.metadata.get("tags", [])
        for o in c.get("outputs", []):
            if o.output_type == "error" and not raises:
                problems.append(f"cell {c.get('id')}: {o.ename}: {o.evalue[:200]}")
            if o.output_type == "stream" and o.name == "stderr":
                for line in o.text.splitlines():
                    line = line.strip()
                    if not line.startswith("jaxsys:") or INFO.match(line):
                        continue
                    if not any(w in line for w in allowed):
                        problems.append(f"cell {c.get('id')}: unexplained warning {line[:200]!r}")
    return problems


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _output_text(nb) -> str:
    """Every output's text, error tracebacks included (without their colours)."""
    return "\n".join(
        o.get("text", "")
        or o.get("data", {}).get("text/plain", "")
        or _ANSI.sub("", "\n".join(o.get("traceback", [])))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tag, tmp_path):
    out = tmp_path / path.name
    run_notebook(path, output=str(out), timeout=300)
    nb = nbformat.read(out, as_version=4)
    text = _output_text(nb)
    for line in EXPECTED.get(path.name, []):
        assert line in text, f"{path.name}: missing {line!r}"
    assert "[Gloo]" not in text
    assert _svg_outputs(nb) >= STATIC_PICTURES.get(path.name, 0), (
        f"{path.name}: static views missing"
    )
    problems = clean_run_problems(nb, EXPLAINED.get(path.name, []))
    assert not problems, f"{path.name} is not a clean run:\n" + "\n".join(problems)


def test_notebooks_are_stored_without_outputs():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "jaxsys"
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, path.name


# Prose a reader meets in one notebook: about 1,500 words at most; longer topics split.
MAX_PROSE_WORDS = 1500
_FENCED = re.compile(r"```.*?```", re.S)
_WORD = re.compile(r"[A-Za-z0-9_'’\-.%/`]+")


def prose_words(nb) -> int:
    """Words in a notebook's markdown cells, fenced code blocks left out."""
    return len(_WORD.findall(_FENCED.sub("", _markdown(nb))))


def test_every_notebook_opens_with_what_it_teaches_and_stays_short():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        words = prose_words(nb)
        assert words <= MAX_PROSE_WORDS, f"{path.name}: {words} words of prose"
        first = nb.cells[0]
        assert first.cell_type == "markdown" and first.source.startswith("# "), path.name
        # What the reader will be able to do comes first, before any how.
        opening = first.source.split("\n\n")[1]
        assert opening.startswith("After this notebook you"), f"{path.name}: {opening[:80]!r}"


# A private name: `obj._x` or `jax._src` (os._exit, the way to die at once, is public).
_PRIVATE = re.compile(r"(?<!\bos)\._[A-Za-z]")


def test_notebooks_use_only_public_names():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                for line in c.source.splitlines():
                    assert not _PRIVATE.search(line), f"{path.name} {c.get('id')}: {line}"


def _coverage_rows(text: str) -> list[list[str]]:
    """The concept rows of docs/coverage.md: [concept, status, where]."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[1] not in ("status", "---"):
            rows.append(cells)
    return rows


def test_coverage_table_cites_cells_that_exist_and_leaves_nothing_partly_done():
    """docs/coverage.md maps each concept of JAX's pages to the cells that teach it."""
    text = (Path(__file__).parent.parent / "docs" / "coverage.md").read_text()
    ids = {
        p.name[:2]: {c.get("id") for c in nbformat.read(p, as_version=4).cells} for p in NOTEBOOKS
    }
    cited = re.findall(r"`(\d\d):([A-Za-z0-9_-]+)`", text)
    assert len(cited) > 50, "the table cites notebook cells as `NN:cell-id`"
    assert [c for c in cited if c[1] not in ids.get(c[0], set())] == []
    rows = _coverage_rows(text)
    assert len(rows) == 22 + 21 + 11 + 9, len(rows)
    assert {status for _, status, _ in rows} <= {"covered", "n/a"}
    # Each n/a says why; each covered concept names a cell or a document.
    for concept, status, where in rows:
        assert (status == "n/a" and len(where) > 20) or "`" in where, concept
    # The summary at the top counts the rows below it, page by page.
    for heading, body in re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        sec = _coverage_rows(body)
        if not sec:
            continue
        covered = sum(st == "covered" for _, st, _ in sec)
        want = f"| {len(sec)} | {covered} | 0 | 0 | {len(sec) - covered} |"
        summary = [ln for ln in text.splitlines() if ln.lower().startswith(f"| {heading.lower()}")]
        assert summary and summary[0].endswith(want), (heading, summary, want)


def test_prose_count_leaves_out_code():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Two words\n```python\nx = 1 + 2\n```"),
        nbformat.v4.new_code_cell("a b c d"),
    ]
    assert prose_words(nb) == 2


def _executed(cells: list[tuple[str, str, list]]):
    """A notebook as if executed: (cell type, source, outputs) triples, the first tagged."""
    nb = nbformat.v4.new_notebook()
    for kind, source, outputs in cells:
        if kind == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source)
            cell.outputs = [nbformat.from_dict(o) for o in outputs]
            nb.cells.append(cell)
    return nb


WARN = {
    "output_type": "stream",
    "name": "stderr",
    "text": "jaxsys: these processes are out of step: p0\n",
}
READY = {
    "output_type": "stream",
    "name": "stderr",
    "text": "jaxsys: 2 processes x 1 devices ready in 3.1 s\n",
}
ERROR = {"output_type": "error", "ename": "ZeroDivisionError", "evalue": "boom", "traceback": []}


def test_clean_run_check_flags_unexplained_warnings_and_untagged_errors():
    explained = EXPLAINED["00-quickstart.ipynb"]
    quiet = _executed([("code", "%jaxsys start", [READY])])
    assert clean_run_problems(quiet, explained) == []
    # The warning is allowed only when the markdown explains it.
    warned = [("code", "x", [WARN])]
    assert clean_run_problems(_executed(warned), explained)
    told = _executed([("markdown", "jaxsys's same-program guard says ...", []), *warned])
    assert clean_run_problems(told, explained) == []
    assert clean_run_problems(told, []), "a warning no notebook lists is never allowed"
    failing = _executed([("code", "1/0", [ERROR])])
    assert "ZeroDivisionError" in clean_run_problems(failing, [])[0]
    failing.cells[0].metadata["tags"] = ["raises-exception"]
    assert clean_run_problems(failing, []) == []
