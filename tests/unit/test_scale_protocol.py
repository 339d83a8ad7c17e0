"""The comm protocol is declared once: Python's declaration, the comm and protocol.ts agree."""

import re
import sys
from pathlib import Path

from jaxsys_kernel import protocol
from jaxsys_kernel.kernel import comm

TS = Path(__file__).resolve().parents[2] / "labextension" / "src" / "protocol.ts"


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


def ts_union(name: str) -> list[str]:
    """The string literals of ``export type <name> = 'a' | 'b' ...;`` in protocol.ts."""
    text = _strip_comments(TS.read_text())
    match = re.search(rf"export type {name}\s*=\s*([^;]+);", text)
    assert match, f"protocol.ts declares no type {name}"
    return re.findall(r"'([^']+)'", match.group(1))


def ts_process_states() -> list[str]:
    """The process states protocol.ts names: a ProcessState union, else IProcess.state's doc."""
    text = TS.read_text()
    if re.search(r"export type ProcessState\b", text):
        return ts_union("ProcessState")
    doc = re.search(r"/\*\*([^*]*)\*/\s*state: string;", text)
    assert doc, "protocol.ts documents no process states on IProcess.state"
    return re.findall(r"`([a-z-]+)`", doc.group(1))


def test_actions_agree_everywhere():
    assert ts_union("Action") == list(protocol.ACTIONS)
    assert set(comm.ACTIONS) == set(protocol.ACTIONS)
    assert set(comm.RANK_ACTIONS) == set(protocol.RANK_ACTIONS)


def test_process_states_agree():
    assert sorted(ts_process_states()) == sorted(s.value for s in protocol.ProcessState)


def test_schema_versions_agree():
    text = TS.read_text()
    ts_version = int(re.search(r"export const SCHEMA_VERSION = (\d+);", text).group(1))
    assert ts_version == protocol.SCHEMA_VERSION == comm.SCHEMA_VERSION


def test_version_mismatch_names_both_versions():
    assert protocol.version_mismatch(protocol.SCHEMA_VERSION) is None
    assert protocol.version_mismatch(None) is None
    message = protocol.version_mismatch(protocol.SCHEMA_VERSION + 1)
    assert f"version {protocol.SCHEMA_VERSION + 1}" in message
    assert f"version {protocol.SCHEMA_VERSION}:" in message and "reload" in message


def test_parser_sees_a_changed_union(tmp_path, monkeypatch):
    # The comparison can fail: an action missing from the TypeScript side is noticed.
    changed = TS.read_text().replace("  | 'stacks'\n", "")
    fake = tmp_path / "protocol.ts"
    fake.write_text(changed)
    monkeypatch.setattr(sys.modules[__name__], "TS", fake)
    assert "stacks" not in ts_union("Action")


class _Comm:
    def __init__(self):
        self.sent, self.closed, self.handlers = [], False, {}

    def send(self, data):
        self.sent.append(data)

    def close(self):
        self.closed = True

    def on_msg(self, fn):
        self.handlers["msg"] = fn

    def on_close(self, fn):
        self.handlers["close"] = fn


def test_a_front_end_of_another_version_is_told_and_closed():
    from types import SimpleNamespace

    comms = comm.ClusterComms(SimpleNamespace(cluster=None))
    other = _Comm()
    comms.on_open(other, {"content": {"data": {"v": protocol.SCHEMA_VERSION + 1}}})
    (msg,) = other.sent
    assert msg["type"] == "state" and other.closed and comms.comms == []
    assert f"version {protocol.SCHEMA_VERSION + 1}" in msg["state"]["error"]
    same = _Comm()
    comms.on_open(same, {"content": {"data": {"v": protocol.SCHEMA_VERSION}}})
    assert not same.closed and comms.comms == [same]
    assert "error" not in same.sent[-1]["state"]


def ts_fields(interface: str) -> list[str]:
    """The field names of ``export interface <name> { ... }`` in protocol.ts."""
    text = _strip_comments(TS.read_text())
    match = re.search(rf"export interface {interface}\s*\{{(.*?)\n\}}", text, flags=re.S)
    assert match, f"protocol.ts declares no interface {interface}"
    return re.findall(r"^\s*(\w+)\??:", match.group(1), flags=re.M)


def test_message_types_agree():
    assert ts_union("KernelMessage") == list(protocol.KERNEL_MESSAGES)
    assert ts_union("FrontEndMessage") == list(protocol.FRONT_END_MESSAGES)


def test_summary_group_and_delta_fields_agree():
    from jaxsys_kernel.telemetry import aggregate

    assert ts_fields("ISummary") == list(protocol.SUMMARY_FIELDS)
    assert ts_fields("IGroup") == list(protocol.GROUP_FIELDS)
    assert ts_fields("IRowDelta") == list(protocol.DELTA_FIELDS)
    # What the kernel builds has exactly the declared fields.
    rows = [
        {"rank": r, "host": "h", "state": "alive", "busy": False, "heartbeat_age": 0.1}
        for r in range(100)
    ]
    summary = aggregate.summarize(rows)
    assert list(summary) == list(protocol.SUMMARY_FIELDS)
    assert list(summary["groups"][0]) == list(protocol.GROUP_FIELDS)
    assert list(aggregate.RowFeed().update(rows)) == list(protocol.DELTA_FIELDS)
    assert "summary" in ts_fields("ICluster") and "group" in ts_fields("ICluster")


def test_field_parser_sees_a_missing_field(tmp_path, monkeypatch):
    changed = TS.read_text().replace("  gone: number[];\n", "")
    fake = tmp_path / "protocol.ts"
    fake.write_text(changed)
    monkeypatch.setattr(sys.modules[__name__], "TS", fake)
    assert "gone" not in ts_fields("IRowDelta")
