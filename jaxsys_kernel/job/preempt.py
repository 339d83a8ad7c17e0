"""What a job's processes do with SIGTERM: a preemption notice, the JAX way, or the end.

``jax.distributed.initialize`` makes SIGTERM a preemption notice: the process that gets it
tells JAX's coordination service, and every process's
``multihost_utils.reached_preemption_sync_point(step)`` then returns True at the same step,
where a program saves its checkpoint and returns (Orbax's ``CheckpointManager`` honours the
same point). Schedulers send it before they stop a job (Slurm's ``--signal=TERM@N``, a
preemption, ``scancel --signal=TERM``). With ``jaxsys job --preemption jax`` (the default)
the program keeps that, and bounds it: once a notice is in the coordination service, every
process has ``--preemption-grace`` seconds to reach the sync point, save and end, after
which it ends itself (exit code 143, as SIGTERM's default action would give), so that no
process waits on in a collective for one already gone, nor for a launcher's SIGKILL.

With ``--preemption kill`` the program puts SIGTERM back to its default once JAX is
initialised: SIGTERM to a process ends it at once, and a resubmitted job resumes from its
last periodic checkpoint instead.

``jaxsys job``'s own ends (``--timeout``, Ctrl-C, a failed process) do not rely on SIGTERM
either way: its runners kill the processes with SIGKILL, and the command's session gets
SIGKILL after :data:`~jaxsys_kernel.job.owner.END_WAIT_S`.
"""

from __future__ import annotations

#: The ways a job's processes can take SIGTERM, the first the default.
MODES = ("jax", "kill")
#: Seconds a process has, after a preemption notice, before it ends itself.
DEFAULT_GRACE_S = 60.0
# The key JAX's preemption sync manager writes into the coordination service's store when
# a process gets a notice (jaxlib 0.12's preemption_sync_manager.cc).
NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"

# Python in the program, after the coordination service's client (CLIENT) is known.
WATCH = """
import threading  # noqa: E402

PREEMPTION_ENDED = threading.Event()


def _watch_preemption():
    # Until the program ends: wait for a notice, then give the process its grace.
    while not PREEMPTION_ENDED.is_set():
        try:
            CLIENT.blocking_key_value_get({key!r}, WATCH_MS)
            break
        except Exception as e:  # not there yet; anything else: the service is gone
            if "DEADLINE_EXCEEDED" not in str(e):
                return
    else:
        return
    if not PREEMPTION_ENDED.wait(PREEMPTION_GRACE_S):
        print(
            f"jaxsys job: process {{RANK}} not ended {{PREEMPTION_GRACE_S:g}} s after a "
            "preemption notice: it ends now",
            flush=True,
        )
        os._exit(128 + signal.SIGTERM)


PREEMPTION_WATCH = threading.Thread(target=_watch_preemption, daemon=True)
if PREEMPTION == "jax" and CLIENT is not None:
    PREEMPTION_WATCH.start()
"""
# Python at the program's end: the watch stops before JAX shuts down (its wait is on the
# coordination service's client). Each of its waits lasts WATCH_MS; the join is bounded all
# the same, so that a client call that overstays cannot hold the program's end.
UNWATCH = """
PREEMPTION_ENDED.set()
if PREEMPTION_WATCH.is_alive():
    PREEMPTION_WATCH.join(timeout=10 * WATCH_MS / 1000)
"""


def watch_code() -> str:
    """The program's code that bounds the time after a preemption notice."""
    return WATCH.format(key=NOTICE_KEY)
