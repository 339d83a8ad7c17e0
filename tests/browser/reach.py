"""What of the jaxsys sidebar a person cannot reach: controls outside the panel's box and
headers cut short, read from the page's layout (bounding boxes, scroll widths)."""

from __future__ import annotations

#: What lies outside the sidebar's box, and which texts are cut, read in one go. Only what
#: the page draws counts (a hidden button has no box).
REACH = """() => {
  const side = document.getElementById('jaxsys-sidebar');
  const box = side.getBoundingClientRect();
  const drawn = (n) => n.getClientRects().length > 0;
  const name = (n) => n.getAttribute('aria-label') || n.textContent.trim() || n.className;
  const outside = [...side.querySelectorAll('button')].filter(drawn).filter((b) => {
    const r = b.getBoundingClientRect();
    return r.left < box.left - 0.5 || r.right > box.right + 0.5;
  }).map((b) => {
    const r = b.getBoundingClientRect();
    return `${name(b)} at x ${Math.round(r.left)}-${Math.round(r.right)} of a panel ending at ${Math.round(box.right)}`;
  });
  const cut = [...side.querySelectorAll('th')].filter(drawn)
    .filter((h) => h.scrollWidth > h.clientWidth)
    .map((h) => `header '${h.textContent}' (${h.scrollWidth} > ${h.clientWidth} px)`);
  const rows = side.querySelectorAll('tr.jaxsys-process').length;
  const scroll = side.querySelector('.jaxsys-table-scroll');
  return {outside, cut, rows, hiddenWidth: scroll.scrollWidth - scroll.clientWidth,
          width: Math.round(box.width)};
}"""


def reach(page) -> dict:
    """Controls outside the panel and headers cut, as :data:`REACH` reads them."""
    return page.evaluate(REACH)


def assert_in_reach(page, rows: int) -> dict:
    """Every control inside the panel and every header whole, with ``rows`` rows drawn."""
    v = reach(page)
    assert v["rows"] == rows, v
    assert v["outside"] == [], v
    assert v["cut"] == [], v
    # Nothing waits behind a sideways scroll either.
    assert v["hiddenWidth"] <= 0, v
    return v
