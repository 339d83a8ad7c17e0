"""The fakes follow the real classes: a renamed method or a changed signature breaks them."""

from __future__ import annotations

import pytest

from jaxsys_kernel.magics.session import MultihostSession
from jaxsys_kernel.telemetry.hub import TelemetryHub

from ..fakes import AnySession, Fake, FakeComm, FakeHub, FakeSession, NotFaked


def test_a_method_the_session_does_not_have_is_refused():
    with pytest.raises(AttributeError, match="MultihostSession has no method 'stop_everything'"):
        FakeSession().stop_everything()
    with pytest.raises(AttributeError, match="MultihostSession has no method 'stop_everything'"):
        AnySession().stop_everything()


def test_a_call_the_real_method_would_refuse_is_refused():
    with pytest.raises(TypeError, match=r"MultihostSession.stop\(self\).*too many positional"):
        FakeSession().stop(True)
    with pytest.raises(TypeError, match="MultihostSession.pull.*unexpected keyword.*rank"):
        FakeSession().pull("x", rank=1)
    with pytest.raises(TypeError, match="kill_message.*missing a required argument: 'took'"):
        FakeSession().kill_message(1, "KILL")  # defined by the fake, bound to the real one


def test_answered_calls_are_recorded_and_other_real_methods_are_not_answered():
    session = FakeSession()
    assert session.restart_process(1) == 0.5
    assert session.calls == [("restart_process", (1,), {})]
    assert session.thread_guard is MultihostSession.thread_guard  # a class-level default
    with pytest.raises(AttributeError, match="FakeSession gives no answer for 'control'"):
        session.control(None, "interrupt", None)
    with pytest.raises(NotFaked, match="control"):
        AnySession().control(None, "interrupt", None)


def test_methods_are_found_along_the_real_classs_bases():
    class Base:
        def inherited(self, x):
            return x

    class Real(Base):
        pass

    class FakeReal(Fake, real=Real):
        answers = {"inherited": 3}

    assert FakeReal().inherited(1) == 3


def test_a_fake_of_a_method_the_real_class_lacks_cannot_be_declared():
    with pytest.raises(AttributeError, match="TelemetryHub has no method 'heartbeat_of'"):

        class StaleHub(Fake, real=TelemetryHub):
            def heartbeat_of(self, rank):
                return 0.0

    with pytest.raises(AttributeError, match="MultihostSession has no method 'status'"):

        class StaleSession(Fake, real=MultihostSession):
            answers = {"status": []}


def test_the_hub_and_comm_fakes_are_bound_to_their_real_signatures():
    hub = FakeHub({1: "stuck"})
    assert [lv.state for lv in hub.liveness({0: "ready", 1: "ready"})] == ["alive", "stuck"]
    with pytest.raises(TypeError, match="TelemetryHub.liveness.*unexpected keyword"):
        hub.liveness(cluster_states={0: "ready"})
    comm = FakeComm()
    comm.send(data={"x": 1}, buffers=[])
    assert comm.sent == [{"x": 1}]
    with pytest.raises(TypeError, match="BaseComm.send"):
        comm.send({"x": 1}, flush=True)
