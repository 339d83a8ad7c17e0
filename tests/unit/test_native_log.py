"""Turning gRPC's handshake records into refusals, and leaving every other line alone."""

from __future__ import annotations

import os
import threading
import time

from jaxsys_kernel.cluster.audit import explain_refusal, format_refusals, refusal_notice
from jaxsys_kernel.engine.native_log import NativeLogWatch, handshake_refusal, strip_scheme
from jaxsys_kernel.telemetry.schema import Refusal

# Shaped like gRPC 1.8x's handshaker trace; addresses and pointers are made up.
SERVER_ARGS = (
    b" shutdown=false index=2, args={endpoint=0x1, args={grpc.internal.endpoint_local_address="
    b"ipv4:127.0.0.1:4000, grpc.internal.endpoint_peer_address=ipv4:10.1.2.3:5555, "
    b"grpc.internal.security_connector=0x2, grpc.internal.server_credentials=0x3}, exit_early=0}\n"
)
CLIENT_ARGS = (
    b" shutdown=false index=2, args={endpoint=0x1, args={grpc.default_authority=127.0.0.1:4000, "
    b"grpc.internal.endpoint_peer_address=ipv4:127.0.0.1:4000}, exit_early=0}\n"
)


def _record(error: bytes, args: bytes = SERVER_ARGS) -> list[bytes]:
    return [
        b"I1130 12:00:00.000001    42 handshaker.cc:155] CallNextHandshakerLocked: error="
        + error
        + b"\n",
        b"=== Source Location Trace: ===\n",
        b"external/grpc+/src/core/util/status_helper.cc:74\n",
        args,
        b"I1130 12:00:00.000002    42 channel_trace.h:396] handshake manager 0x9: Failed with error: "
        + error
        + b"\n",
    ]


def _feed(watch: NativeLogWatch, lines: list[bytes]) -> bytes:
    return b"".join(watch.feed_line(line) for line in lines)


def test_a_refused_handshake_is_reported_once_and_swallowed():
    seen = []
    watch = NativeLogWatch(seen.append)
    passed = _feed(watch, _record(b"UNAVAILABLE: Handshake read failed (Socket closed)"))
    assert passed == b"" and watch.dropped == 5
    assert seen == [
        {"peer": "10.1.2.3:5555", "error": "UNAVAILABLE: Handshake read failed (Socket closed)"}
    ]


def test_this_process_s_own_client_handshakes_and_successes_are_not_refusals():
    seen = []
    watch = NativeLogWatch(seen.append)
    _feed(watch, _record(b"UNAVAILABLE: connection refused", CLIENT_ARGS))
    _feed(watch, _record(b"OK", SERVER_ARGS))
    assert seen == []


def test_warnings_errors_and_other_lines_pass_unchanged():
    watch = NativeLogWatch(lambda r: None)
    lines = [
        b"W1130 12:00:00.000001    42 log.cc:102] Log level INFO is not suitable for production.\n",
        b"I1130 12:00:00.000001    42 service.cc:98] Jax service listening on 127.0.0.1:4000\n",
        b"[Gloo] Rank 0 is connected to 1 peer ranks.\n",
        b"E1130 12:00:00.000003    42 client.cc:80] Polling for error failed\n",
        b" an indented line that follows an error record\n",
    ]
    assert _feed(watch, lines) == b"".join(lines[2:])


def test_info_records_pass_when_the_user_chose_the_verbosity():
    seen = []
    watch = NativeLogWatch(seen.append, drop_info=False)
    lines = _record(
        b"UNKNOWN: ... WRONG_VERSION_NUMBER: Invalid certificate verification context: OK"
    )
    assert _feed(watch, lines) == b"".join(lines)
    assert len(seen) == 1 and "WRONG_VERSION_NUMBER" in seen[0]["error"]


def test_the_watch_reads_fd_2_and_passes_the_rest_on(tmp_path):
    # A real pipe in front of a real fd 2, as in process 0; fd 2 is restored afterwards.
    seen = []
    got = threading.Event()
    sink = os.open(tmp_path / "downstream", os.O_WRONLY | os.O_CREAT)
    saved = os.dup(2)
    os.dup2(sink, 2)
    try:
        watch = NativeLogWatch(lambda r: (seen.append(r), got.set())).install()
        os.write(2, b"".join(_record(b"UNKNOWN: CERTIFICATE_VERIFY_FAILED")) + b"plain line\n")
        assert got.wait(5)
        deadline = time.monotonic() + 5
        while b"plain line" not in (tmp_path / "downstream").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(sink)
    assert seen[0]["peer"] == "10.1.2.3:5555"
    assert (tmp_path / "downstream").read_bytes() == b"plain line\n"
    assert watch.refused == 1


def test_handshake_refusal_needs_the_peer():
    text = "I1130 handshaker.cc:155] CallNextHandshakerLocked: error=UNKNOWN: x\n shutdown=false, grpc.internal.server_credentials=0x1\n"
    assert handshake_refusal(text) is None


def test_addresses_lose_their_scheme():
    assert strip_scheme("ipv4:10.0.0.2:5000") == "10.0.0.2:5000"
    assert strip_scheme("ipv6:%5B::1%5D:5000") == "[::1]:5000"


def test_each_tls_error_is_explained():
    prefix_error = (
        "UNKNOWN: Custom verification check failed with error: UNAUTHENTICATED: TLS peer "
        'verification failed: no URI SAN with required prefix "spiffe://jaxsys.local/c/"; '
        "peer URI SANs: [spiffe://jaxsys.local/other/process/1]"
    )
    reason, identity = explain_refusal(prefix_error)
    assert "outside this cluster" in reason
    assert identity == "spiffe://jaxsys.local/other/process/1"
    cases = {
        "SSL_ERROR_SSL: PEER_DID_NOT_RETURN_A_CERTIFICATE": "presented no certificate",
        "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate": "not signed by the cluster's CA",
        "WRONG_VERSION_NUMBER": "does not speak TLS",
        "Handshake read failed (Socket closed)": "hung up during the handshake",
        "something new": "the TLS handshake failed: something new",
    }
    for error, fragment in cases.items():
        assert fragment in explain_refusal(error)[0], error


def test_notices_say_only_what_is_new():
    r = Refusal(host="10.1.2.3", reason="it presented no certificate", error="e", attempts=2)
    told: dict = {}
    (line,) = refusal_notice(told, [r])
    assert "refused 2 connection(s) from 10.1.2.3: it presented no certificate" in line
    assert refusal_notice(told, [r]) == []
    r.attempts = 5
    assert "refused 3 connection(s)" in refusal_notice(told, [r])[0]


def test_refusal_table():
    assert format_refusals([]) == "refused connections: none so far"
    assert "not reported on this cluster" in format_refusals([], reporting=False)
    r = Refusal(
        host="10.1.2.3",
        reason="why",
        identity="spiffe://x/y",
        error="e",
        attempts=3,
        first=0.0,
        last=1.0,
    )
    text = format_refusals([r])
    assert text.splitlines()[0].startswith("refused connections to the JAX coordination service: 3")
    assert "10.1.2.3" in text and "why; it claimed spiffe://x/y" in text


def test_a_failing_filter_gives_fd_2_back(tmp_path):
    # If the filter ever breaks, writers to fd 2 (gRPC, inside the coordinator) must not block.
    sink = os.open(tmp_path / "downstream", os.O_WRONLY | os.O_CREAT)
    saved = os.dup(2)
    os.dup2(sink, 2)
    try:
        watch = NativeLogWatch(lambda r: None)
        watch.feed_line = None  # calling it raises TypeError inside the reader thread
        watch.install()
        os.write(2, b"first\n")
        watch._thread.join(5)
        assert not watch._thread.is_alive()
        os.write(2, b"second\n")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(sink)
    assert (tmp_path / "downstream").read_bytes() == b"second\n"


def test_a_chosen_verbosity_that_hides_the_trace_turns_reporting_off():
    from jaxsys_kernel import Cluster

    assert Cluster(hosts=2).reports_refusals
    assert Cluster(hosts=2, env={"GRPC_VERBOSITY": "debug"}).reports_refusals
    assert not Cluster(hosts=2, env={"GRPC_VERBOSITY": "ERROR"}).reports_refusals
    assert not Cluster(hosts=2, process_env={0: {"GRPC_VERBOSITY": "NONE"}}).reports_refusals
    assert not Cluster(hosts=2, secure=False).reports_refusals
    assert not Cluster(hosts=2, telemetry=False).reports_refusals
