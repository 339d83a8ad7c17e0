"""JaxSysKernel: an IPython kernel that drives a cluster of JAX processes."""

from __future__ import annotations

from ipykernel.ipkernel import IPythonKernel

from .._version import __version__
from ..magics import register_magics


class JaxSysKernel(IPythonKernel):
    """IPython kernel with the jaxsys magics loaded and a cluster it owns.

    The kernel process never imports JAX: it is a driver, and the engines own the devices.
    On shutdown or restart it kills every engine and the controller at once, because
    jupyter_client only waits 2.5 s before killing the kernel itself.
    """

    implementation = "jaxsys"
    implementation_version = __version__
    banner = f"jaxsys {__version__}: multi-controller JAX from one notebook (%jaxsys? for help)"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.jaxsys = register_magics(self.shell)

    async def do_shutdown(self, restart):
        """Kill the cluster, then shut down as IPython does."""
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
