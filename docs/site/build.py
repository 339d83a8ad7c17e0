"""Build the course site: every notebook, executed by the jaxsys kernel, rendered by Sphinx.

``make docs`` runs ``python docs/site/build.py --execute``: each notebook in ``notebooks/`` is
executed with the jaxsys kernel (as ``jaxsys run`` does) into ``build/site/executed``, then
Sphinx with myst-nb renders those copies to ``build/site/html`` without executing anything
again. ``--from DIR`` skips the execution and renders executed copies found in ``DIR`` (the
test suite passes the copies its notebook test already made).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
HERE = Path(__file__).resolve().parent
# Pages around the notebooks, shown after them: what goes wrong, and the plain JAX calls.
GUIDES = [ROOT / "docs" / "troubleshooting.md", ROOT / "docs" / "cheatsheet.md"]
# Read first: the quickstart, meshes, and how processes drift apart; then the rest in order.
FIRST = ("00", "01", "09")


def notebook_paths() -> list[Path]:
    """The course's notebooks, in reading order."""
    found = sorted(NOTEBOOKS.glob("*.ipynb"))
    first = [p for n in FIRST for p in found if p.name.split("-")[0] == n]
    return first + [p for p in found if p not in first]


def execute_all(out_dir: Path) -> list[Path]:
    """Execute every notebook with the jaxsys kernel; the executed copies' paths."""
    from jaxsys_kernel.cli import run_notebook

    out_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for i, path in enumerate(notebook_paths(), 1):
        print(f"[{i}/{len(notebook_paths())}] executing {path.name}", flush=True)
        run_notebook(path, output=str(out_dir / path.name), timeout=300)
        done.append(out_dir / path.name)
    return done


def _title(path: Path) -> str:
    first = json.loads(path.read_text())["cells"][0]["source"]
    text = "".join(first) if isinstance(first, list) else first
    return text.splitlines()[0].lstrip("# ").strip()


def index_page(executed: list[Path]) -> str:
    """The site's front page: what the course is and its pages in order."""
    lines = [
        "# jaxsys: multi-controller JAX, one notebook at a time",
        "",
        "Each page is a notebook of the course, executed by the jaxsys kernel on a simulated",
        "cluster of CPU processes; every output below is the one that run produced, and each",
        "view (meshes, shardings, plans, artifact cards) appears as its static picture.",
        "",
        "```{toctree}",
        ":maxdepth: 1",
        "",
        *[p.stem for p in executed],
        "```",
        "",
        "```{toctree}",
        ":maxdepth: 1",
        ":caption: Around the notebooks",
        "",
        *[g.stem for g in GUIDES],
        "```",
        "",
    ]
    return "\n".join(lines)


def build_site(executed: list[Path], out: Path) -> Path:
    """Render executed notebooks to HTML under ``out/html``; the index page's path.

    Raises
    ------
    FileNotFoundError
        When an executed copy is missing: run with ``--execute`` first.
    RuntimeError
        When Sphinx fails; its own message says why.
    """
    from sphinx.cmd.build import build_main

    missing = [p for p in executed if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"no executed copy of {', '.join(p.name for p in missing)}; "
            "run `python docs/site/build.py --execute` (or `make docs`) to execute them"
        )
    src = out / "source"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    shutil.copy(HERE / "conf.py", src / "conf.py")
    for p in executed:
        shutil.copy(p, src / p.name)
    for g in GUIDES:
        shutil.copy(g, src / g.name)
    (src / "index.md").write_text(index_page(executed))
    html = out / "html"
    status = build_main(["-b", "html", "-q", "-E", str(src), str(html)])
    if status:
        raise RuntimeError(f"sphinx-build failed with status {status}; see the messages above")
    return html / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--execute", action="store_true", help="execute every notebook first")
    how.add_argument("--from", dest="from_dir", type=Path, help="executed copies to render")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="output folder")
    args = parser.parse_args(argv)
    if args.execute:
        executed = execute_all(args.out / "executed")
    else:
        executed = [args.from_dir / p.name for p in notebook_paths()]
    index = build_site(executed, args.out)
    print(f"course site: {index}  (open it in a browser, or `python -m http.server -d {index.parent}`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
