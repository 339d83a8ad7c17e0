"""The suite's test doubles, each checked against the real class it stands in for.

A fake is declared as ``class FakeHub(Fake, real=TelemetryHub)``. Every public method it
defines must exist on the real class, and every call is first bound to the real method's
signature: renaming a real method, or changing what it takes, fails the tests that use the
fake instead of letting them pass against a class that no longer exists. Methods the fake
does not define can be answered from its ``answers`` table (checked the same way) and are
recorded in ``calls``; any other name is refused.
"""

from __future__ import annotations

import functools
import inspect
import queue
from types import SimpleNamespace
from typing import Any, ClassVar

import ipyparallel
from comm.base_comm import BaseComm
from IPython.core.error import UsageError

from jaxsys_kernel.cluster import Cluster
from jaxsys_kernel.cluster.pki import ClusterPKI
from jaxsys_kernel.cluster.records import ProcessInfo
from jaxsys_kernel.contract import TELEMETRY
from jaxsys_kernel.magics.session import MultihostSession
from jaxsys_kernel.telemetry.hub import TelemetryHub
from jaxsys_kernel.telemetry.schema import CacheStats, Liveness


def real_method(real: type, name: str):
    """The plain function behind ``real.name`` (found along the MRO, mixins included).

    Raises
    ------
    AttributeError
        When the real class has no such method, naming the class.
    """
    member = inspect.getattr_static(real, name, None)
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if not inspect.isfunction(member):
        raise AttributeError(f"{real.__name__} has no method {name!r}; the fake cannot stand in")
    return member


def _bind(real: type, name: str, fake_self: Any, args: tuple, kwargs: dict) -> None:
    fn = real_method(real, name)
    sig = inspect.signature(fn)
    takes_self = not isinstance(inspect.getattr_static(real, name), staticmethod)
    try:
        sig.bind(*((fake_self,) if takes_self else ()), *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{real.__name__}.{name}{sig} cannot be called so: {e}") from None


class Fake:
    """Base of a test double for one real class; see the module's docstring.

    Attributes
    ----------
    real : type
        The class stood in for, given as ``class X(Fake, real=...)``.
    answers : dict
        What each unanswered real method returns when called (class level).
    calls : list of tuple
        ``(name, args, kwargs)`` for every call answered from ``answers``.
    """

    real: ClassVar[type]
    answers: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, real: type | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if real is not None:
            cls.real = real
        for name in cls.answers:
            real_method(cls.real, name)
        for name, member in list(vars(cls).items()):
            if name.startswith("_") or name in vars(Fake) or not inspect.isfunction(member):
                continue  # private helpers and the base's own hooks stand in for nothing
            real_method(cls.real, name)
            setattr(cls, name, _checked(cls, name, member))

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        real = type(self).real
        static = inspect.getattr_static(real, name, None)
        if static is not None and not callable(static) and not hasattr(static, "__get__"):
            return static  # a plain class-level default of the real class
        real_method(real, name)
        if name not in self.answers:
            return self.unanswered(name)

        def call(*args, **kwargs):
            _bind(real, name, self, args, kwargs)
            self.calls.append((name, args, kwargs))
            return self.answers[name]

        return call

    def unanswered(self, name: str):
        """A real method the fake neither defines nor answers: refused by default."""
        raise AttributeError(f"{type(self).__name__} gives no answer for {name!r}")


def _checked(cls: type, name: str, fn):
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        _bind(cls.real, name, self, args, kwargs)
        return fn(self, *args, **kwargs)

    return method


# -- the session --------------------------------------------------------------------------------


class FakeSession(Fake, real=MultihostSession):
    """Records what the magics ask of the session; answers like a 2-process cluster."""

    answers = {
        "stop": 0.25,
        "restart": 1.5,
        "restart_process": 0.5,
        "kill_process": 0.01,
        "status_rows": [],
        "rotation_line": None,
        "refusals": [],
        "rotate_certs": [0x1234567890ABCDEF, 0xFEDCBA0987654321],
        "remote_inspect": {"found": False},
        "show_dashboard": "the dashboard",
        "pull": 3,
        "start": None,
        "run_cell": None,
    }

    def __init__(self):
        super().__init__()
        self.spmd = False
        self.cluster = SimpleNamespace(
            nprocs=2,
            security="mTLS (test)",
            pki=None,
            state="ready",
            job=lambda: None,
            standby_status=lambda: {"size": 0, "ready": 0, "booting": 0, "taken": 0, "note": None},
        )

    def kill_message(self, rank, signal_name, took):
        return f"killed p{rank} with {signal_name}"


class NotFaked(Exception):
    """A line got through parsing to a session method the fake does not answer."""


class AnySession(FakeSession):
    """The fake session; a real method it does not answer means the line parsed."""

    def unanswered(self, name):
        raise NotFaked(name)


class NoClusterSession(Fake, real=MultihostSession):
    """A session with no cluster running."""

    def require_cluster(self):
        raise UsageError("no cluster is running; start one with %jaxsys start")


class StartSession(Fake, real=MultihostSession):
    """Keeps the options ``start`` was given; its cluster is the one given."""

    def __init__(self, cluster):
        super().__init__()
        self.kwargs = None
        self.cluster = cluster

    def start(self, **kwargs):
        self.kwargs = kwargs

    def require_cluster(self):
        return self.cluster


# -- telemetry, certificates, comms -------------------------------------------------------------


class FakeHub(Fake, real=TelemetryHub):
    """A telemetry hub: per-process states and stack dumps as given, subscribers kept.

    Parameters
    ----------
    states : dict, optional
        The hub's view of each ready process (``alive`` when not given).
    dumps : dict, optional
        Rank to ``(sequence number, text)`` of its last stack dump.
    address : str
        What engines are told to connect to.
    """

    def __init__(self, states=None, dumps=None, address="tcp://127.0.0.1:5555"):
        super().__init__()
        self.states = states or {}
        self.dumps = dumps or {}
        self.address = address
        self.subscribed: list = []

    def env(self):
        return {TELEMETRY: self.address}

    def liveness(self, states=None, now=None):
        return [
            Liveness(rank=r, state=self.states.get(r, "alive"), heartbeat_age=0.5, busy=r == 0)
            if states[r] == "ready"
            else Liveness(rank=r, state=states[r])
            for r in sorted(states)
        ]

    def cache_stats(self):
        return [CacheStats(rank=0, requests=4, hits=3), CacheStats(rank=1, requests=4, hits=1)]

    def subscribe(self, callback, max_rate=100.0):
        self.subscribed.append(callback)

        def unsubscribe():
            self.subscribed.remove(callback)

        return unsubscribe

    def stack_dump(self, rank):
        return self.dumps[rank]


class FakePKI(Fake, real=ClusterPKI):
    """Certificates at fixed paths."""

    def env(self, i):
        return {"JAX_MTLS_CERT_FILE": f"/certs/process-{i}.pem"}


class FakeComm(Fake, real=BaseComm):
    """A comm that records what would go to the front end and keeps its handlers."""

    kernel = object()  # ipywidgets only sends when the comm has a kernel
    comm_id = "recording"

    def __init__(self):
        super().__init__()
        self.sent: list = []
        self.handlers: dict = {}
        self.closed = False

    def send(self, data=None, metadata=None, buffers=None):
        self.sent.append(data)

    def on_msg(self, callback):
        self.handlers["msg"] = callback

    def on_close(self, callback):
        self.handlers["close"] = callback

    def close(self, data=None, metadata=None, buffers=None, deleting=False):
        self.closed = True


# -- clusters and ipyparallel -------------------------------------------------------------------


class FakeCluster(Fake, real=Cluster):
    """What the session's dashboard and post-cell report read from a cluster."""

    state = "ready"
    pki = None
    processes: ClassVar[list] = []

    def __init__(self, hub):
        super().__init__()
        self.telemetry = hub

    def refresh_states(self):
        pass

    def refusal_records(self):
        return self.telemetry.refusals()


class FakeClient(Fake, real=ipyparallel.Client):
    """An ipyparallel client that keeps the signals it was asked to send."""

    def __init__(self):
        super().__init__()
        self.sent: list = []

    def send_signal(self, sig, targets=None, block=None):
        self.sent.append((sig, targets))


class FakeIppCluster(Fake, real=ipyparallel.Cluster):
    """An ipyparallel cluster that keeps what its engines were started with."""

    def __init__(self):
        super().__init__()
        self.started: dict = {}

    async def start_engines(self, n=None, engine_set_id=None, **kwargs):
        self.started.update(kwargs, n=n, engine_set_id=engine_set_id)


class FakeProcesses(Fake, real=Cluster):
    """What a check of the processes reads of a cluster: its processes, after a refresh.

    Each argument is one process's ``(state, how it died)``.
    """

    def __init__(self, *processes):
        super().__init__()
        self.processes = [
            ProcessInfo(rank=r, state=s, died=d) for r, (s, d) in enumerate(processes)
        ]
        self.ranks = list(range(len(processes)))

    def refresh_states(self):
        pass


class FakeResult(Fake, real=ipyparallel.AsyncResult):
    """A result that is ready: its value, or the exception it raises."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def get(self, timeout=None, return_exceptions=None, return_when=None):
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


class FakeEngine(Fake, real=ipyparallel.DirectView):
    """One engine's view: every function applied answers at once and is recorded."""

    def __init__(self, answer, calls):
        super().__init__()
        self.answer, self.calls = answer, calls

    def apply_async(self, fn, *args, **kwargs):
        self.calls.append((fn, args))
        return FakeResult(self.answer)


class ScriptedQueue(Fake, real=queue.Queue):
    """An event queue handing out scripted items; when empty, time passes on ``clock``.

    ``KeyboardInterrupt`` in the script is raised, as a press of the stop button is.
    """

    def __init__(self, clock, items):
        super().__init__()
        self.clock = clock
        self.items = list(items)

    def get(self, block=True, timeout=None):
        if self.items:
            item = self.items.pop(0)
            if item is KeyboardInterrupt:
                raise KeyboardInterrupt
            return item
        self.clock.t += timeout
        raise queue.Empty
