"""The straggler view as text: per step who arrived last, and where each process's time went.

At many processes it summarises, as the other views do: the :data:`TOP` processes that
waited least (those the others waited for) with their breakdown bars, and a histogram of
every process's mean lateness.
"""

from __future__ import annotations

from .stragglers import PARTS, Stragglers

# Steps listed (the latest); older ones are counted.
STEPS = 10
# Processes listed with their bars before the view summarises.
TOP = 10
# Width of a breakdown bar in characters.
BAR = 40
_MARKS = {"input": "i", "host": "h", "compile": "c", "compute": "#", "wait": "."}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _bar(parts: dict[str, float], total: float) -> str:
    if total <= 0:
        return ""
    cells = [_MARKS[p] * round(BAR * parts[p] / total) for p in PARTS]
    return "".join(cells)[:BAR].ljust(BAR)


def step_lines(view: Stragglers, steps: int = STEPS) -> list[str]:
    """One line per recent step: who arrived last, how late, doing what."""
    shown = view.findings[-steps:]
    lines = []
    if len(view.findings) > len(shown):
        lines.append(f"({len(view.findings) - len(shown)} earlier steps not listed)")
    for f in shown:
        verdict = f"late by {_ms(f.late)} in {f.category}" if f.named else "within the noise"
        lines.append(f"step {f.step}: p{f.last} arrived last, {verdict}")
    return lines


def _histogram(values: dict[int, float], bins: int = 8) -> list[str]:
    lo, hi = min(values.values()), max(values.values())
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for v in values.values():
        counts[min(bins - 1, int((v - lo) / width))] += 1
    most = max(counts)
    return [
        f"  {_ms(lo + i * width):>10} .. {_ms(lo + (i + 1) * width):>10}  "
        f"{'*' * max(1 if c else 0, round(30 * c / most)):<30} {c}"
        for i, c in enumerate(counts)
    ]


def process_lines(view: Stragglers, top: int = TOP) -> list[str]:
    """Per process (the ``top`` that waited least at many processes), its breakdown bar."""
    means = view.breakdown()
    order = sorted(means, key=lambda r: (means[r]["wait"], r))
    shown = order[:top] if len(order) > top else order
    total = max((sum(means[r].values()) for r in shown), default=0.0)
    legend = "  ".join(f"{m}={p}" for p, m in _MARKS.items())
    lines = [f"mean per step ({legend}):"]
    for r in shown:
        m = means[r]
        text = ", ".join(f"{p} {_ms(m[p])}" for p in PARTS)
        lines.append(f"  p{r:<5} |{_bar(m, total)}| {text}")
    if len(order) > len(shown):
        lines.append(f"  ({len(order) - len(shown)} more processes; waited inside collectives:)")
        lines.extend(_histogram({r: means[r]["wait"] for r in order}))
    return lines


def render(view: Stragglers, steps: int = STEPS, top: int = TOP) -> str:
    """The whole text view: the verdict, the recent steps, the per-process breakdown."""
    refused = [f"p{r}'s records were refused: {why}" for r, why in sorted(view.refused.items())]
    if not view.findings:
        head = "jaxsys: no step spanning processes was recorded in the last cell"
        return "\n".join([head, *refused])
    named = view.named()
    head = (
        f"p{named[0]} held the others up, in {named[1]}"
        if named
        else "no process held the others up beyond the noise"
    )
    lines = [f"jaxsys: {head} ({len(view.findings)} steps)"]
    lines += step_lines(view, steps) + process_lines(view, top) + refused
    return "\n".join(lines)


__all__ = ["process_lines", "render", "step_lines"]
