"""Sphinx configuration of the course site: executed notebooks rendered by myst-nb.

The notebooks arrive already executed by the jaxsys kernel (``build.py`` runs them, or the
test suite hands over the copies its notebook test made), so myst-nb never executes anything
here: the site shows exactly the outputs those runs produced.
"""

project = "jaxsys: multi-controller JAX, taught on a simulated cluster"
author = "jaxsys"
extensions = ["myst_nb"]
master_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "jaxsys course"
html_theme_options = {"page_width": "1200px", "body_max_width": "none"}

# Never execute: the outputs are the ones the jaxsys kernel produced.
nb_execution_mode = "off"
# A saved view carries its live widget beside the static picture and text; a static site has
# no kernel to drive the widget, so the picture (HTML with SVG, or PNG) is what it shows.
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/vnd.jupyter.widget-state+json", None),
]
# Cells tagged raises-exception show their error, as they did in the run.
nb_output_stderr = "show"
# Links from a notebook to the repository's docs/ point outside the site.
suppress_warnings = ["mystnb.unknown_mime_type", "myst.xref_missing"]
