"""The telemetry decoder and receiver fuzzed with arbitrary bytes, JSON and near-events: each
is accepted or refused with a reason, and the hub never raises. Pure logic, but a search of
half a minute: it runs with the live tests; the rest of the hub's hostile cases are in
``unit/test_hostile_hub``."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxsys_kernel.telemetry import schema
from jaxsys_kernel.telemetry.hub import TelemetryHub

# -- the decoder, fuzzed ----------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
field_values = (
    st.sampled_from(
        [0, 1, -1, 2**70, 1e999, -1e999, float("nan"), True, None, "", "x" * 10, [], {}, [1.5]]
    )
    | json_values
)
events = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, 2, "1", None]),
        "kind": st.sampled_from([*schema.KINDS, "other", 3]),
        "rank": field_values,
    },
    optional={
        k: field_values
        for k in ("inc", "t", "busy", "devices", "entries", "bytes", "name", "duration")
        + ("fun_name", "text", "peer", "error")
    },
)


def _dumps(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@settings(max_examples=400, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), json_values.map(_dumps), events.map(_dumps)))
def test_the_decoder_accepts_or_refuses_with_a_reason(raw):
    try:
        ev = schema.decode(raw)
    except schema.Malformed as e:
        assert e.reason in {
            "too large",
            "not JSON",
            "not an object",
            "other version",
            "unknown kind",
            "bad field",
        }
        return
    # What is accepted has exactly the types the hub relies on.
    assert ev["kind"] in schema.KINDS and type(ev["rank"]) is int and ev["rank"] >= 0
    assert type(ev["inc"]) is int and isinstance(ev["t"], float)


@settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), json_values.map(_dumps), events.map(_dumps)))
def test_the_hub_takes_any_message_without_raising(raw):
    hub = _offline_hub()
    before = hub.received + sum(hub.health().dropped.values())
    hub._take(raw)
    assert hub.received + sum(hub.health().dropped.values()) == before + 1
    hub.liveness()
    hub.cache_stats()
    hub.refusals()


_OFFLINE: list[TelemetryHub] = []


def _offline_hub() -> TelemetryHub:
    """One hub for all examples: its thread never sees these messages (they go to _take)."""
    if not _OFFLINE:
        _OFFLINE.append(TelemetryHub(2, curve=False, interval=0.5))
    return _OFFLINE[0]


def teardown_module(module):
    for h in _OFFLINE:
        h.close()

