"""``python -m jupyterlab.browser_check`` with its browser step on Debian's chromium.

JupyterLab's check starts the app in a browser and fails on any error an extension logs
while activating. Its own browser step installs playwright from npm and downloads a
browser; this runs the same steps (load the page, wait for the app to finish starting,
read the errors it collected) with Python playwright and ``/usr/bin/chromium``, then
launches the check exactly as ``python -m jupyterlab.browser_check`` does. The exit status
is the check's verdict.
"""

from __future__ import annotations

import json
import os
import sys

from jupyterlab import browser_check

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-sync",
    "--disable-background-networking",
    "--disable-component-update",
]


async def run_browser(url: str) -> None:
    """What jupyterlab's browser-test.js does, in Python playwright."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = await browser.new_page()
            await page.goto(url)
            await page.wait_for_selector("#main", timeout=100_000)
            marker = await page.wait_for_selector("#browserTest", state="attached", timeout=100_000)
            await page.wait_for_selector(".completed", state="attached", timeout=100_000)
            errors = json.loads(await marker.text_content() or "[]")
            out = os.environ.get("JLAB_BROWSER_CHECK_OUTPUT")
            if out:
                os.makedirs(out, exist_ok=True)
                await page.screenshot(path=os.path.join(out, "browser-check.png"))
        finally:
            await browser.close()
    for error in errors:
        print(f"browser check: an extension logged an error: {error}", file=sys.stderr)
    if errors:
        raise RuntimeError(f"{len(errors)} errors while JupyterLab started")
    print("browser check: JupyterLab started without errors")


class BrowserApp(browser_check.BrowserApp):
    """JupyterLab's check app, found by the server as an extension of this module."""

    name = __name__


def _jupyter_server_extension_points():
    return [{"module": __name__, "app": BrowserApp}]


if __name__ == "__main__":
    # The check app calls the browser step through its module's global.
    browser_check.run_browser = run_browser
    BrowserApp.launch_instance()
