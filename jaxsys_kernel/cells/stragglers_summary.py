"""The straggler analysis as a small plain dict, for the dashboard's straggler view.

The view draws what ``%jaxsys where`` prints (:mod:`.stragglers_view`), from a summary
whose size does not grow with the world: the latest :data:`~.stragglers_view.STEPS`
steps (who arrived last, by how much, in what), the mean breakdown per step of the
:data:`~.stragglers_view.TOP` processes that waited least (those the others waited for),
and above that many processes a histogram of every process's mean wait.
"""

from __future__ import annotations

from .stragglers import PARTS, Stragglers
from .stragglers_view import STEPS, TOP

# Bins of the histogram of mean waits shown above TOP processes.
BINS = 8
# Refusal reasons kept in the summary (the rest are counted), each cut to this many characters.
MAX_REFUSED = 10
REASON_CHARS = 200


def _histogram(waits: list[float], bins: int = BINS) -> dict:
    lo, hi = min(waits), max(waits)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for w in waits:
        counts[min(bins - 1, int((w - lo) / width))] += 1
    return {"lo": lo, "width": width, "counts": counts}


def summarize(view: Stragglers, steps: int = STEPS, top: int = TOP) -> dict:
    """The analysis as a ``kind == "stragglers"`` dict, bounded whatever the world's size.

    Parameters
    ----------
    view : Stragglers
        The analysed records of the last cell.
    steps : int
        Latest steps listed.
    top : int
        Processes listed with their breakdown before the histogram.

    Returns
    -------
    dict
        ``processes`` (how many), ``steps_total``, ``named`` (``{"rank", "category"}`` of
        the process named in most of the last steps, or None), ``steps`` (the latest, each
        ``step, last, late, category, named``; ``late`` in seconds), ``rows`` (per listed
        process, its rank and mean seconds per step in each of ``parts``), ``parts``,
        ``histogram`` (above ``top`` processes: ``lo``, ``width`` in seconds and ``counts``
        of mean waits; else None), ``refused`` (``{rank: reason}``) and ``more_refused``.
    """
    means = view.breakdown()
    order = sorted(means, key=lambda r: (means[r]["wait"], r))
    named = view.named()
    refused = sorted(view.refused.items())
    return {
        "kind": "stragglers",
        "processes": len(view.ranks),
        "steps_total": len(view.findings),
        "named": {"rank": named[0], "category": named[1]} if named else None,
        "steps": [
            {
                "step": f.step,
                "last": f.last,
                "late": f.late,
                "category": f.category,
                "named": f.named,
            }
            for f in view.findings[-steps:]
        ],
        "parts": list(PARTS),
        "rows": [{"rank": r, **means[r]} for r in order[:top]] if view.findings else [],
        "histogram": (
            _histogram([means[r]["wait"] for r in order])
            if view.findings and len(order) > top
            else None
        ),
        "refused": {str(r): why[:REASON_CHARS] for r, why in refused[:MAX_REFUSED]},
        "more_refused": max(0, len(refused) - MAX_REFUSED),
    }


__all__ = ["BINS", "summarize"]
