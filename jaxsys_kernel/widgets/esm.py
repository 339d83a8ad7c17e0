"""The front-end module of each view: its own file with the shared helpers inlined.

Every view's JavaScript is a file of its own under ``static/`` (``mesh.js``, ``sharding.js``,
``cache.js``, ``live.js``) that imports what it needs from ``static/shared.js`` with one
``import { ... } from "./shared.js";`` line. anywidget hands a widget's ``_esm`` to the browser
as one module loaded from a blob or data URL, which has no base URL to resolve that relative
import against; JupyterLab, Notebook 7 and nbconvert pages differ in what else they could
serve. So :func:`view_module` replaces the import line by the shared file's text and the
widget gets one self-contained module. There is no build step and nothing to keep in sync: the
files in ``static/`` are the source, and each stays a valid module on its own.
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
