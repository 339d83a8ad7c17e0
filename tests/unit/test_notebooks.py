"""Every notebook in notebooks/ runs end to end, headless, with the jaxsys kernel."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


# Lines every start-up prints on stderr: progress, not warnings.
INFO = re.compile(r"^jaxsys: \d+ processes x \d+ devices ready in ")

# The jaxsys warnings each notebook is allowed to show, because its text explains them:
# (a fragment of the warning, a fragment its markdown must contain).
EXPLAINED = {
    "01-meshes-and-shardings.ipynb": [("these processes are out of step", "same-program guard")],
    "00-quickstart.ipynb": [("these processes are out of step", "same-program guard")],
    "04-security.ipynb": [
        ("jaxsys: the coordination service refused", "turns every refused handshake into a report")
    ],
    "03-fault-tolerance.ipynb": [
        ("these processes are out of step", "same-program guard"),
        ("jaxsys: interrupting", "sent the three an interrupt"),
    ],
    "03b-deaths-recoverability-cannot-absorb.ipynb": [
        ("jaxsys: restarting the JAX world", "replaces the whole world"),
    ],
    "09-divergence-and-timelines.ipynb": [
        ("the result is not what either computed", "the result is not what either computed"),
        ("these processes will wait for each other", "that they wait for each other"),
    ],
    "10-train-through-failures.ipynb": [
        ("jaxsys: interrupting", "the hang doctor reports that and interrupts"),
        ("jaxsys: --retries:", "restarts the world and sends the cell again"),
        ("jaxsys: the cell ended ok on retry", "restarts the world and sends the cell again"),
    ],
}


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


def test_notebooks_are_stored_without_outputs():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "jaxsys"
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, path.name


# Prose a reader meets in one notebook: about 1,500 words at most; longer topics split. The
# recap that closes every notebook has a cap of its own and is not counted in the 1,500.
MAX_PROSE_WORDS = 1500
MAX_RECAP_WORDS = 100
RECAP = "## Recap\n\n"
# Exercises before the recap are counted apart too, each followed by the cell that checks it.
MAX_EXERCISE_WORDS = 150
EXERCISES = "## Exercises\n\n"
_FENCED = re.compile(r"```.*?```", re.S)
_WORD = re.compile(r"[A-Za-z0-9_'’\-.%/`]+")


def _words(text: str) -> int:
    return len(_WORD.findall(_FENCED.sub("", text)))


def prose_words(nb) -> int:
    """Words in a notebook's markdown cells, fenced code blocks and the recap left out."""
    return _words(
        "\n".join(
            c.source
            for c in nb.cells
            if c.cell_type == "markdown" and not c.source.startswith((RECAP, EXERCISES))
        )
    )


def test_exercises_are_short_and_checked_by_a_cell():
    """An exercise block is followed by code cells, one per exercise with an assert that says
    what is wrong."""
    for path in NOTEBOOKS:
        cells = nbformat.read(path, as_version=4).cells
        for i, c in enumerate(cells):
            if c.cell_type != "markdown" or not c.source.startswith(EXERCISES):
                continue
            assert _words(c.source) <= MAX_EXERCISE_WORDS, f"{path.name}: {_words(c.source)}"
            numbered = re.findall(r"^\d+\. ", c.source, re.M)
            checks = []
            for d in cells[i + 1 :]:
                if d.cell_type != "code":
                    break
                checks.append(d)
            checked = [d for d in checks if re.search(r"^\s*assert [^\n]+,\s*\(?\s*f?\"", d.source, re.M)]
            assert numbered and len(checked) >= len(numbered), (
                f"{path.name}: an exercise without a cell that checks it with a messaged assert"
            )


def test_every_notebook_ends_with_a_short_recap():
    for path in NOTEBOOKS:
        last = nbformat.read(path, as_version=4).cells[-1]
        assert last.cell_type == "markdown" and last.source.startswith(RECAP), path.name
        assert _words(last.source) <= MAX_RECAP_WORDS, (
            f"{path.name}: recap of {_words(last.source)}"
        )


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


_CITE = re.compile(r"`(\d\d[a-z]?):([A-Za-z0-9_-]+)`")
# An API a concept names: `jax.transfer_guard`, `live_devices`, `sync_global_devices()`.
_API = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)(?:\(\))?`")
STATUSES = ("covered", "partly", "n/a")


def coverage_problems(
    text: str, sources: dict[str, dict[str, str]], code: set[tuple[str, str]] | None = None
) -> list[str]:
    """What makes docs/coverage.md claim more than its cited cells show.

    ``sources`` maps a notebook's number (``05b``) to its cells' sources by id. A row must
    have a known status; an n/a row must say why; a partly row must say what is missing;
    every cited cell must exist. A covered or partly row must cite a cell and its concept
    must name at least one API in backticks, each of which must appear in one of the cited
    cells: the whole dotted name, or at least its last two parts (``multihost_utils.x`` for
    ``jax.experimental.multihost_utils.x``), so that a cell using another ``x`` does not count.
    When ``code`` (the ``(notebook, cell id)`` pairs of code cells) is given, a covered row
    must cite at least one of them: prose alone covers nothing.
    """
    problems = []
    for concept, status, where in _coverage_rows(text):
        if status not in STATUSES:
            problems.append(f"{concept}: status {status!r}")
        if status == "n/a" and len(where) <= 20:
            problems.append(f"{concept}: n/a without a reason")
        if status == "partly" and "missing" not in where:
            problems.append(f"{concept}: partly without saying what is missing")
        if status != "n/a" and "`" not in where:
            problems.append(f"{concept}: cites nothing")
        cited = _CITE.findall(where)
        absent = [f"{nb}:{cid}" for nb, cid in cited if cid not in sources.get(nb, {})]
        problems += [f"{concept}: no cell {a}" for a in absent]
        shown = "\n".join(sources.get(nb, {}).get(cid, "") for nb, cid in cited)
        if status == "n/a":
            continue
        if not cited:
            problems.append(f"{concept}: {status} without a notebook cell")
        elif status == "covered" and code is not None and not set(cited) & code:
            problems.append(f"{concept}: covered, but cites no code cell")
        apis = _API.findall(concept)
        if not apis:
            problems.append(f"{concept}: names no API in backticks")
        for api in apis:
            if not _api_shown(api, shown):
                problems.append(f"{concept}: {api} appears in none of {where[:80]}")
    return problems


def _api_shown(api: str, shown: str) -> bool:
    """Whether ``api``, or at least its last two dotted parts, occurs in ``shown``."""
    return api in shown or ".".join(api.split(".")[-2:]) in shown


def coverage_counts(text: str) -> dict[str, dict[str, int]]:
    """Per page heading of docs/coverage.md: how many rows have each status."""
    counts = {}
    for heading, body in re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        rows = _coverage_rows(body)
        if rows:
            counts[heading] = {s: sum(st == s for _, st, _ in rows) for s in STATUSES}
    return counts


def test_coverage_table_cites_cells_that_show_what_each_row_claims():
    """docs/coverage.md maps each concept of JAX's pages to the cells that teach it."""
    text = (Path(__file__).parents[2] / "docs" / "coverage.md").read_text()
    sources = {
        p.name.split("-")[0]: {c.get("id"): c.source for c in nbformat.read(p, as_version=4).cells}
        for p in NOTEBOOKS
    }
    code = {
        (p.name.split("-")[0], c.get("id"))
        for p in NOTEBOOKS
        for c in nbformat.read(p, as_version=4).cells
        if c.cell_type == "code"
    }
    assert len(_CITE.findall(text)) > 50, "the table cites notebook cells as `NN:cell-id`"
    assert coverage_problems(text, sources, code) == []
    counts = coverage_counts(text)
    for page, c in counts.items():
        print(f"{page}: {sum(c.values())} concepts, " + ", ".join(f"{v} {k}" for k, v in c.items()))
        # The summary at the top is the same count, written out for readers.
        want = f"| {sum(c.values())} | {c['covered']} | {c['partly']} | {c['n/a']} |"
        summary = [ln for ln in text.splitlines() if ln.lower().startswith(f"| {page.lower()} |")]
        assert summary and summary[0].endswith(want), (page, summary, want)


CONCEPTS = Path(__file__).parents[2] / "docs" / "concepts.json"
# What may keep a concept out of a notebook on one CPU-only machine: hardware or the network
# it lacks, never a choice of jaxsys's.
_NA_REASON = re.compile(r"GPU|TPU|NCCL|Kubernetes|network|other hosts|Cloud|jaxlib install", re.I)


def _sections(text: str) -> dict[str, list[list[str]]]:
    """docs/coverage.md's rows by page heading."""
    found = re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return {heading: rows for heading, body in found if (rows := _coverage_rows(body))}


def concept_list_problems(text: str, concepts: dict) -> list[str]:
    """Where docs/coverage.md departs from the fixed concept list of docs/concepts.json.

    Every concept of every page has exactly one row, with the list's own text, in the
    list's order, and no row stands for something the list lacks, so a row can be neither
    reworded to fit a cell nor left out. An n/a row must give a hardware or network reason.
    """
    problems = []
    sections = _sections(text)
    listed = {page["page"] for page in concepts["pages"]}
    problems += [
        f"section {h!r} is no page of the concept list" for h in sections if h not in listed
    ]
    for page in concepts["pages"]:
        name, wanted = page["page"], page["concepts"]
        rows = sections.get(name, [])
        have = [concept for concept, _, _ in rows]
        for concept in wanted:
            if have.count(concept) != 1:
                problems.append(f"{name}: {have.count(concept)} rows for {concept[:70]!r}")
        problems += [
            f"{name}: row {c[:70]!r} is not in the concept list" for c in have if c not in wanted
        ]
        if not problems and have != wanted:
            problems.append(f"{name}: rows are not in the concept list's order")
        for concept, status, where in rows:
            if status == "n/a" and (not _NA_REASON.search(where) or "jaxsys" in where.lower()):
                problems.append(
                    f"{name}: {concept[:70]!r} is n/a without a hardware or network reason"
                )
    return problems


def test_coverage_has_one_graded_row_per_concept_of_the_pages():
    text = (Path(__file__).parents[2] / "docs" / "coverage.md").read_text()
    concepts = json.loads(CONCEPTS.read_text())
    assert len(concepts["pages"]) == 9, "one list per page of JAX 501"
    assert concept_list_problems(text, concepts) == []


def test_concept_list_check_catches_missing_reworded_and_excused_rows():
    concepts = {
        "pages": [
            {"page": "Transfer guard", "concepts": ["the `jax.transfer_guard` levels", "GPUs"]}
        ]
    }
    good = "## Transfer guard\n\n| the `jax.transfer_guard` levels | covered | `07:tg-plain` |\n"
    good += "| GPUs | n/a | needs GPUs, which this machine lacks |\n"
    assert concept_list_problems(good, concepts) == []
    missing = good.split("| GPUs")[0]
    assert "0 rows for 'GPUs'" in concept_list_problems(missing, concepts)[0]
    reworded = good.replace("levels |", "levels, as jaxsys sets them |")
    assert any("not in the concept list" in p for p in concept_list_problems(reworded, concepts))
    excused = good.replace(
        "needs GPUs, which this machine lacks", "jaxsys does not start such a world"
    )
    assert "without a hardware or network reason" in concept_list_problems(excused, concepts)[0]
    swapped = "## Transfer guard\n\n" + "".join(reversed(good.splitlines(keepends=True)[2:]))
    assert "order" in concept_list_problems(swapped, concepts)[0]


def test_coverage_check_catches_overclaiming_rows():
    sources = {"07": {"tg-plain": "with jax.transfer_guard('disallow'): ..."}}
    good = "| the `jax.transfer_guard` manager | covered | `07:tg-plain` |"
    assert coverage_problems(good, sources) == []
    wrong_api = "| `jax.thread_guard` | covered | `07:tg-plain` |"
    assert "thread_guard appears in none" in coverage_problems(wrong_api, sources)[0]
    assert "no cell 07:tg-99" in coverage_problems("| x | covered | `07:tg-99` |", sources)[0]
    # The whole dotted name, or its last two parts: another module's transfer_guard is not it.
    other = "| `jax.experimental.fake.transfer_guard` | covered | `07:tg-plain` |"
    assert "appears in none" in coverage_problems(other, sources)[0]
    sources["08"] = {"mh-10": "mu = multihost_utils\nmultihost_utils.sync_global_devices('x')"}
    tail = "| `jax.experimental.multihost_utils.sync_global_devices` | covered | `08:mh-10` |"
    assert coverage_problems(tail, sources) == []
    # A covered row must name an API and cite a cell that shows it.
    assert "names no API" in coverage_problems("| it works | covered | `07:tg-plain` |", sources)[0]
    uncited = "| `jax.transfer_guard` | covered | the README's `jax.transfer_guard` |"
    assert "without a notebook cell" in coverage_problems(uncited, sources)[0]
    vague = "| `jax.transfer_guard` | partly | `07:tg-plain` |"
    assert "what is missing" in coverage_problems(vague, sources)[0]
    done = "| `jax.transfer_guard` | done | `07:tg-plain` |"
    assert "status 'done'" in coverage_problems(done, sources)[0]
    prose = coverage_problems(good, sources, code={("07", "tg-other")})
    assert "cites no code cell" in prose[0]
    # n/a rows need a reason, not an API.
    assert coverage_problems("| GPUs | n/a | needs GPUs, which this machine lacks |", sources) == []


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


def test_notebooks_hold_the_language_info_the_kernel_reports():
    # JupyterLab copies the kernel's language_info into an open notebook and marks it
    # modified when that changes anything, so autosave would rewrite the tracked files.
    # The kernel class's own attribute is what its kernel_info reply sends (the live
    # test asks a running kernel).
    from jaxsys_kernel.kernel.kernel import JaxSysKernel

    reported = JaxSysKernel.language_info
    for path in NOTEBOOKS:
        stored = nbformat.read(path, as_version=4).metadata.get("language_info")
        assert stored == reported, f"{path.name}: {stored} is not the kernel's {reported}"


def test_troubleshooting_page_reproduces_each_problem_in_a_cell_that_exists():
    text = (Path(__file__).parents[2] / "docs" / "troubleshooting.md").read_text()
    sources = {
        p.name.split("-")[0]: {c.get("id") for c in nbformat.read(p, as_version=4).cells}
        for p in NOTEBOOKS
    }
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) >= 9, "one section per common problem"
    for section in sections:
        title = section.splitlines()[0]
        for part in ("**Symptom**", "**Cause**", "**Fix**", "**Reproduce**"):
            assert part in section, f"{title}: no {part}"
        cited = _CITE.findall(section.split("**Reproduce**")[1])
        assert cited or re.search(r"`\d\d`", section), f"{title}: reproduced nowhere"
        missing = [f"{nb}:{cid}" for nb, cid in cited if cid not in sources.get(nb, set())]
        assert not missing, f"{title}: no cell {missing}"
