"""JaxSysKernel: an IPython kernel that drives a cluster of JAX processes."""

from __future__ import annotations

import concurrent.futures
import threading

from ipykernel.ipkernel import IPythonKernel

from .. import _compat, contract
from .._version import __version__
from ..cluster.launchers import kubernetes_api
from ..magics import register_magics
from .comm import ClusterComms
from .page import watch_page

# Messages that control views, not the kernel: served on subshells, beside a running cell.
_COMM_MESSAGES = ("comm_msg", "comm_close")


def _beside_a_cell(parent) -> bool:
    """Whether ``parent`` is a comm message served off the main shell's thread."""
    msg_type = (parent or {}).get("header", {}).get("msg_type")
    return msg_type in _COMM_MESSAGES and threading.current_thread() is not threading.main_thread()


class JaxSysKernel(IPythonKernel):
    """IPython kernel with the jaxsys magics loaded and a cluster it owns.

    The kernel process never imports JAX: it is a driver, and the engines own the devices.
    On shutdown or restart it kills every engine and the controller at once, because
    jupyter_client only waits 2.5 s before killing the kernel itself.
    """

    implementation = "jaxsys"
    implementation_version = __version__
    # JupyterLab picks a notebook's editor language by this name first, then by the mime
    # type: with the jaxsys extension, jaxsys notebooks get its IPython language (magic
    # lines kept out of the Python parse) and other notebooks keep JupyterLab's; without
    # the extension, jaxsys notebooks fall back to JupyterLab's IPython.
    language_info = {
        **IPythonKernel.language_info,
        "codemirror_mode": {
            "name": contract.EDITOR_LANGUAGE,
            "mime": "text/x-ipython",
            "version": 3,
        },
    }
    banner = f"jaxsys {__version__}: multi-controller JAX from one notebook (%jaxsys? for help)"

    def __init__(self, **kwargs):
        # jaxsys uses internals of specific ipyparallel and ipykernel releases: refuse
        # others here, with the versions to install, rather than fail inside a cell.
        _compat.check_versions()
        super().__init__(**kwargs)
        self.jaxsys = register_magics(self.shell)
        self.jaxsys.control_subshell = self.control_subshell
        self._control_subshell: str | None = None
        # The JupyterLab extension's status bar and sidebar talk to the kernel over this.
        self.jaxsys_comms = ClusterComms(self.jaxsys, self.control_subshell)
        self.jaxsys_comms.register(self)
        # Under Voilà, the page's cluster ends soon after the page does (page.py says why).
        self.page_watch = watch_page(self)
        kubernetes_api.warm_up()

    def control_subshell(self) -> str | None:
        """The id of a subshell that serves widget controls while a cell blocks the shell.

        Created on first use (on the shell-channel thread, as ipykernel requires); None
        when this ipykernel has no subshells.
        """
        if self._control_subshell is not None:
            return self._control_subshell
        if not _compat.supports_subshells(self):
            return None
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def create() -> None:
            try:
                fut.set_result(_compat.create_subshell(self))
            except Exception as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

        self.shell_channel_thread.io_loop.add_callback(create)
        self._control_subshell = fut.result(timeout=10)
        return self._control_subshell

    def _publish_status(self, status, channel, parent=None):
        """Announce busy/idle, except for comm messages served beside a running cell.

        ipykernel announces both around every message, also around one a subshell serves
        while a cell runs on the main shell. JupyterLab takes any status message for the
        kernel's execution state, so a sidebar click during a cell would show the kernel
        "Idle" until the cell ends. Only the main shell's requests say what the kernel does.
        """
        if _beside_a_cell(parent or self.get_parent(channel)):
            return
        super()._publish_status(status, channel, parent)

    async def do_shutdown(self, restart):
        """Kill the cluster, then shut down as IPython does."""
        self.jaxsys_comms.close()
        self.jaxsys.shutdown()
        return super().do_shutdown(restart)

    async def do_complete(self, code, cursor_pos):
        """Complete from process 0's namespace for cells that run on the engines."""
        if cursor_pos is None:
            cursor_pos = len(code)
        reply = self.jaxsys.remote_complete(code, cursor_pos)
        if reply is not None:
            return reply
        return super().do_complete(code, cursor_pos)

    async def do_inspect(self, code, cursor_pos, detail_level=0, omit_sections=()):
        """Inspect in process 0's namespace for cells that run on the engines."""
        if cursor_pos is None:
            cursor_pos = len(code)
        reply = self.jaxsys.remote_inspect(code, cursor_pos, detail_level)
        if reply is not None:
            return reply
        return super().do_inspect(code, cursor_pos, detail_level, omit_sections)
