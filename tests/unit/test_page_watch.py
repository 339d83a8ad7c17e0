"""The page watch of a kernel started by Voilà: when it ends the kernel, and its address."""

from __future__ import annotations

from jaxsys_kernel.kernel import page


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_address_is_built_only_for_a_kernel_that_voila_started():
    env = {"SERVER_SOFTWARE": "voila/0.5.13", "VOILA_APP_PORT": "8866", "VOILA_BASE_URL": "/x/"}
    url = page.voila_kernel_url(env, "/tmp/voila_1/kernel-ab-12.json")
    assert url == "http://127.0.0.1:8866/x/api/kernels/ab-12"
    assert (
        page.voila_kernel_url({**env, "SERVER_SOFTWARE": "TornadoServer"}, "kernel-a.json") is None
    )
    assert page.voila_kernel_url(env, "/tmp/tmpx.json") is None
    assert page.voila_kernel_url({**env, "VOILA_APP_PORT": ""}, "kernel-a.json") is None


def test_the_kernel_ends_once_its_page_has_been_gone_long_enough():
    clock = Clock()
    watch = page.PageWatch("http://127.0.0.1:1/api/kernels/a", lambda: None, clock=clock)
    # The page loads: connected, then an answer that could not be read changes nothing.
    assert not watch.step(1, "t1")
    assert not watch.step(None)
    clock.now = 100.0
    assert not watch.step(0, "t1")  # closed: the idle time starts now
    clock.now += page.IDLE_S - 1
    assert not watch.step(0, "t1")
    clock.now += 0.5
    assert not watch.step(1, "t1")  # reloaded: the page is back
    clock.now += page.IDLE_S + 1
    assert not watch.step(0, "t1")
    clock.now += page.IDLE_S
    assert watch.step(0, "t1")


def test_traffic_keeps_the_kernel_and_a_page_never_seen_is_given_up_on():
    clock = Clock()
    watch = page.PageWatch("http://127.0.0.1:1/api/kernels/a", lambda: None, clock=clock)
    # The notebook runs while the page waits for it: traffic, no page yet.
    for t in range(0, int(3 * page.NEVER_S), 10):
        clock.now = float(t)
        assert not watch.step(0, f"busy {t}")
    # Then nothing: no page ever came (or it came and went between two questions).
    quiet = clock.now
    clock.now = quiet + page.NEVER_S - 1
    assert not watch.step(0, f"busy {t}")
    clock.now = quiet + page.NEVER_S
    assert watch.step(0, f"busy {t}")


def test_the_idle_time_comes_from_the_environment_and_a_bad_value_is_named(capfd):
    assert page.idle_seconds({page.IDLE_VARIABLE: "5"}) == 5.0
    assert page.idle_seconds({page.IDLE_VARIABLE: ""}) == page.IDLE_S
    for bad in ("soon", "0", "-3", "nan", "inf"):
        assert page.idle_seconds({page.IDLE_VARIABLE: bad}) == page.IDLE_S
        assert f"{page.IDLE_VARIABLE}='{bad}' is not a positive number" in capfd.readouterr().err
    clock = Clock()
    watch = page.PageWatch("http://127.0.0.1:1/api/kernels/a", lambda: None, clock, idle_s=5.0)
    assert not watch.step(1, "t1")
    clock.now = 100.0
    assert not watch.step(0, "t1")
    clock.now += 4.9
    assert not watch.step(0, "t1")
    clock.now += 0.1
    assert watch.step(0, "t1")
