"""SPMD mode: which cells go to every process, and the input transformer that sends them."""

from __future__ import annotations

import re

# Cells that start with one of these run in the kernel even in SPMD mode.
LOCAL_PREFIXES = ("%%local", "%jaxsys", "%multihost", "%%multihost", "%pull", "%load_ext")


def is_local_cell(code: str) -> bool:
    """Whether a cell stays in the kernel when SPMD mode is on."""
    for line in code.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped.startswith(LOCAL_PREFIXES)
    return True


_HELP = re.compile(r"^\s*(\?{1,2})?([A-Za-z_][\w.]*)(\?{1,2})?\s*$")


def make_spmd_transformer(session):
    """An IPython input transformer that sends cells to every process in SPMD mode.

    Parameters
    ----------
    session : jaxsys_kernel.magics.session.MultihostSession
        Its ``spmd`` attribute says whether SPMD mode is on, at each cell.
    """

    def transform(lines: list[str]) -> list[str]:
        if not session.spmd:
            return lines
        code = "".join(lines)
        help_request = _HELP.match(code)
        if help_request and (help_request.group(1) or help_request.group(3)):
            # Help goes through the pager, which engines do not return: ask process 0.
            marks = help_request.group(1) or help_request.group(3)
            detail = len(marks) - 1
            return [f"%jaxsys inspect {help_request.group(2)} --detail {detail}\n"]
        if is_local_cell(code):
            first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
            if first is not None and lines[first].strip().startswith("%%local"):
                return lines[first + 1 :]
            return lines
        return ["%%multihost\n", *lines]

    # IPython runs transformers flagged this way before its own magic handling.
    transform.has_side_effects = False
    return transform
