"""The client's reading of reply stamps: the fast reader gives what ipyparallel's own does."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta, timezone

from dateutil.parser import parse as dateutil_parse
from hypothesis import given
from hypothesis import strategies as st
from ipyparallel import util

from jaxsys_kernel import _compat

_compat.fast_reply_dates()

ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=1)), timezone(timedelta(hours=-5, minutes=-30))]
)


@given(
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=ZONES)
)
def test_a_stamp_with_a_zone_reads_as_dateutil_reads_it(when):
    # As jupyter_client writes them: UTC as Z, any other zone as an offset.
    text = when.isoformat().replace("+00:00", "Z")
    got = util._parse_date(text)
    assert got == dateutil_parse(text)
    assert got.utcoffset() == when.utcoffset()


def test_a_zoned_stamp_never_reaches_dateutil(monkeypatch):
    def refuse(text):
        raise AssertionError(f"dateutil was asked for {text!r}")

    monkeypatch.setattr(util, "dateutil_parse", refuse)
    assert util._parse_date("2026-12-06T18:00:00.123456Z") == datetime(
        2026, 12, 6, 18, 0, 0, 123456, tzinfo=UTC
    )


def test_what_is_not_a_zoned_stamp_goes_to_ipyparallels_own_reader():
    assert util._parse_date(None) is None
    assert util._parse_date("not a date") == "not a date"
    assert util._parse_date("2026-12-06T18:00:00.12Zulu") == "2026-12-06T18:00:00.12Zulu"
    with warnings.catch_warnings():
        # A stamp without a zone: ipyparallel's reader says so and reads it as local time.
        warnings.simplefilter("ignore", DeprecationWarning)
        naive = util._parse_date("2026-12-06T18:00:00.123456")
    assert naive.tzinfo is not None


def test_installing_twice_keeps_one_fast_reader():
    first = util._parse_date
    _compat.fast_reply_dates()
    assert util._parse_date is first
