"""The front-end module of each view: its own file with the shared helpers inlined.

Every view's JavaScript is a file of its own under ``static/`` (``mesh.js``, ``sharding.js``,
``cache.js``, ``live.js``) that imports what it needs from ``static/shared.js`` with one
``import { ... } from "./shared.js";`` line. anywidget hands a widget's ``_esm`` to the browser
as one module loaded from a blob or data URL, which has no base URL to resolve that relative
import against; JupyterLab, Notebook 7 and nbconvert pages differ in what else they could
serve. So :func:`view_module` replaces the import line by the shared file's text and the
widget gets one self-contained module. There is no build step and nothing to keep in sync: the
files in ``static/`` are the source, and each stays a valid module on its own.

The standalone views (``artifact.js``, ``dataplan.js``) are loaded as their files are, also
by pages that import the file itself, so they cannot import ``shared.js`` either. What they
share with it (the DOM builder ``h``, the process colours) is a copy of ``shared.js``'s own
declarations between two marker lines, written by :func:`write_copies`; a test fails when a
copy differs from its source.
"""

from __future__ import annotations

import functools
import pathlib
import re

STATIC = pathlib.Path(__file__).parent / "static"

#: The one import line a view module has; the names it imports must be exported by shared.js.
IMPORT = re.compile(r'^import \{([^}]*)\} from "\./shared\.js";\n', re.MULTILINE)
_EXPORTED = re.compile(r"^export (?:function|const) (\w+)", re.MULTILINE)


def shared_exports() -> set[str]:
    """The names ``static/shared.js`` exports."""
    return set(_EXPORTED.findall((STATIC / "shared.js").read_text()))


@functools.cache
def view_module(name: str) -> str:
    """The ES module of view ``name`` (``static/<name>.js``) with ``shared.js`` inlined.

    Parameters
    ----------
    name : str
        The file's stem, e.g. ``"mesh"``.

    Returns
    -------
    str
        One self-contained ES module, as anywidget's ``_esm`` takes it.

    Raises
    ------
    ValueError
        If the file does not have exactly one import of ``./shared.js``, or imports a name
        that ``shared.js`` does not export.
    """
    text = (STATIC / f"{name}.js").read_text()
    found = IMPORT.findall(text)
    if len(found) != 1:
        raise ValueError(
            f"static/{name}.js must import from ./shared.js on exactly one line "
            f'(import {{ a, b }} from "./shared.js";), found {len(found)}'
        )
    wanted = {n.strip() for n in found[0].split(",") if n.strip()}
    missing = wanted - shared_exports()
    if missing:
        raise ValueError(f"static/{name}.js imports {sorted(missing)}, which shared.js lacks")
    shared = (STATIC / "shared.js").read_text()
    return IMPORT.sub(lambda _m: f"// ---- shared.js, inlined\n{shared}// ---- {name}.js\n", text)


# -- the standalone views' copies of shared.js's declarations ---------------------------------

#: The marked region of a standalone module: the names it copies, then their declarations.
COPY = re.compile(
    r"^// ---- from shared\.js: ([\w, ]+)\n.*?^// ---- end of shared\.js\n",
    re.MULTILINE | re.DOTALL,
)
_COPY_NOTE = "(written by jaxsys_kernel.widgets.esm.write_copies(): edit shared.js, not here)"


def shared_declaration(name: str) -> str:
    """The text of ``shared.js``'s top-level declaration ``name``, with its comment above.

    Raises
    ------
    ValueError
        If ``shared.js`` exports no ``name``.
    """
    lines = (STATIC / "shared.js").read_text().splitlines(keepends=True)
    starts = [
        i for i, line in enumerate(lines) if re.match(rf"export (?:function|const) {name}\b", line)
    ]
    if len(starts) != 1:
        raise ValueError(f"shared.js exports no {name!r}")
    first = last = starts[0]
    while first > 0 and lines[first - 1].startswith(("//", "/**", " *")):
        first -= 1
    # A declaration ends at the first line back at column 0 that closes it.
    while last + 1 < len(lines) and not _closes(lines[last], last == starts[0]):
        last += 1
    return "".join(lines[first : last + 1])


def _closes(line: str, first: bool) -> bool:
    if first:
        return line.rstrip().endswith(";")
    return not line[0].isspace() and line.rstrip() in ("}", "];", "};")


def copied_block(names: list[str]) -> str:
    """The marked region holding ``shared.js``'s declarations of ``names``."""
    body = "\n".join(shared_declaration(n) for n in names)
    return (
        f"// ---- from shared.js: {', '.join(names)}\n// {_COPY_NOTE}\n{body}"
        "// ---- end of shared.js\n"
    )


def copies() -> dict[str, list[str]]:
    """Each standalone module in ``static/`` that copies from ``shared.js``: the names."""
    out = {}
    for path in sorted(STATIC.glob("*.js")):
        found = COPY.search(path.read_text())
        if found:
            out[path.name] = [n.strip() for n in found.group(1).split(",")]
    return out


def write_copies() -> list[str]:
    """Rewrite every marked region from ``shared.js``; the files that changed."""
    changed = []
    for name, names in copies().items():
        path = STATIC / name
        text = path.read_text()
        new = COPY.sub(lambda _m, names=names: copied_block(names), text, count=1)
        if new != text:
            path.write_text(new)
            changed.append(name)
    return changed
