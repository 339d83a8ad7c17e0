"""An engine's kernel without the busy and execute_input notices nobody reads."""

from __future__ import annotations

from jaxsys_kernel import _compat


class FakeKernel:
    def __init__(self):
        self.sent: list[tuple] = []

    def _publish_status(self, status, channel, parent=None):
        self.sent.append(("status", status, channel))

    def _publish_execute_input(self, code, parent, execution_count):
        self.sent.append(("execute_input", code))


def test_busy_on_the_shell_and_the_input_are_dropped_the_rest_goes():
    k = FakeKernel()
    assert _compat.quiet_engine_iopub(k)
    k._publish_status("busy", "shell")
    k._publish_execute_input("x = 1", {}, 1)
    k._publish_status("idle", "shell", parent={})
    k._publish_status("busy", "control")
    k._publish_status("idle", "control")
    assert k.sent == [
        ("status", "idle", "shell"),
        ("status", "busy", "control"),
        ("status", "idle", "control"),
    ]


def test_quieting_twice_wraps_once_and_no_kernel_is_refused():
    k = FakeKernel()
    _compat.quiet_engine_iopub(k)
    first = k._publish_status
    assert _compat.quiet_engine_iopub(k)
    assert k._publish_status is first
    assert not _compat.quiet_engine_iopub(None)
    assert not _compat.quiet_engine_iopub(object())
