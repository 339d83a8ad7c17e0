"""The one check every view makes of the summary it is given: that it is of its kind."""

from __future__ import annotations

import traitlets


def check_kind(info: dict, kind: str, view: str, *, missing_ok: bool = True) -> dict:
    """Return ``info`` if it is a ``kind`` summary (or empty), else refuse it.

    Parameters
    ----------
    info : dict
        The summary given to the view.
    kind : str
        The ``kind`` the view draws, e.g. ``"mesh"``.
    view : str
        The view's class name, for the message.
    missing_ok : bool
        Whether a summary without a ``kind`` is taken as one of this kind.

    Raises
    ------
    traitlets.TraitError
        Naming the view, the kind it shows and the kind it was given.
    """
    given = info.get("kind", kind if missing_ok else None) if info else kind
    if given != kind:
        article = "an" if kind[:1] in "aeiou" else "a"
        raise traitlets.TraitError(
            f"{view} shows {article} {kind!r} summary, got kind={info.get('kind')!r}"
        )
    return info
