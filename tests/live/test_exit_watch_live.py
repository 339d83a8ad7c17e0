"""The pidfd look at whether a local engine has ended: exited, zombie or reaped, and never
a later process that took its pid."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from jaxsys_kernel.cluster import exit_watch
from jaxsys_kernel.cluster.exit_watch import ExitWatch

from ..sleepers import sleeping_children
from ..unit.free_pid import free_pid

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux's")


@pytest.fixture
def child():
    with sleeping_children() as (proc,):
        yield proc


def _started(pid: int) -> float:
    return psutil.Process(pid).create_time()


def test_a_running_process_then_its_zombie_then_its_reaped_pid(child):
    watch = ExitWatch(limit=4)
    started = _started(child.pid)
    assert not watch.ended(child.pid, started)
    child.kill()
    # Not reaped yet: a zombie has ended.
    deadline = time.monotonic() + 10
    while not watch.ended(child.pid, started) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.ended(child.pid, started)
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    child.wait()
    assert watch.ended(child.pid, started)
    watch.close()


def test_a_pid_that_names_another_process_now_has_ended(child):
    watch = ExitWatch(limit=4)
    # The process the cluster started at another time: the pid was taken again since.
    assert watch.ended(child.pid, _started(child.pid) - 100.0)
    assert watch.held() == 0
    # The one that started then is watched.
    assert not watch.ended(child.pid, _started(child.pid))
    assert watch.held() == 1
    watch.close()


def test_a_pid_no_process_holds_has_ended():
    assert ExitWatch(limit=4).ended(free_pid())


def test_beyond_its_limit_the_oldest_pidfd_is_closed_and_answers_stay_right():
    with sleeping_children(4) as procs:
        watch = ExitWatch(limit=2)
        keys = [(p.pid, _started(p.pid)) for p in procs]
        assert [watch.ended(*k) for k in keys] == [False] * 4
        assert watch.held() == 2
        procs[0].kill()
        procs[0].wait()
        assert watch.ended(*keys[0])  # opened again: gone
        assert not watch.ended(*keys[3])
        assert watch.held() <= 2
        watch.close()
        assert watch.held() == 0


def test_closing_closes_the_descriptors(child):
    before = set(os.listdir("/proc/self/fd"))
    watch = ExitWatch(limit=4)
    watch.ended(child.pid, _started(child.pid))
    assert len(set(os.listdir("/proc/self/fd")) - before) == 1
    watch.close()
    assert set(os.listdir("/proc/self/fd")) - before == set()


def test_without_pidfds_the_look_reads_proc(child, monkeypatch):
    def refused(pid, flags=0):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(exit_watch.os, "pidfd_open", refused)
    watch = ExitWatch(limit=4)
    assert not watch.ended(child.pid, _started(child.pid))
    child.kill()
    child.wait()
    assert watch.ended(child.pid, None)
    assert watch.held() == 0


def test_one_look_names_the_ended_among_many_even_past_the_limit():
    with sleeping_children(5) as procs:
        keys = [(p.pid, _started(p.pid)) for p in procs]
        watch = ExitWatch(limit=3)
        assert watch.ended_among(keys) == set()
        assert watch.held() == 3  # the two past the limit were read from /proc
        for i in (1, 4):
            procs[i].kill()
            procs[i].wait()
        assert watch.ended_among(keys) == {keys[1], keys[4]}
        assert watch.held() <= 3
        watch.close()


def test_the_local_launcher_asks_about_its_processes_in_one_look():
    from jaxsys_kernel.cluster.config import ClusterConfig
    from jaxsys_kernel.cluster.launchers import make_launcher
    from jaxsys_kernel.cluster.records import ProcessInfo

    with sleeping_children(3) as procs:
        launcher = make_launcher(ClusterConfig(hosts=3))
        infos = [
            ProcessInfo(r, engine_id=r, pid=p.pid, started=_started(p.pid))
            for r, p in enumerate(procs)
        ]
        infos.append(ProcessInfo(3, engine_id=3))  # no pid known: not gone
        assert launcher.processes_gone(infos) == []
        procs[2].kill()
        procs[2].wait()
        assert [p.rank for p in launcher.processes_gone(infos)] == [2]
        assert launcher.process_gone(infos[2]) and not launcher.process_gone(infos[0])
        launcher.release()
        assert launcher.exits.held() == 0


def test_a_start_time_that_cannot_be_read_does_not_make_a_death(child, monkeypatch):
    # psutil refused (another user's /proc, a sandbox): the pidfd is taken as naming ours.
    monkeypatch.setattr(exit_watch, "_started", lambda pid: None)
    watch = ExitWatch(limit=4)
    assert not watch.ended(child.pid, 12345.0)
    child.kill()
    child.wait()
    assert watch.ended(child.pid, 12345.0)
    watch.close()
