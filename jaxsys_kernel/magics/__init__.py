"""The jaxsys magics and the session state they drive."""

from __future__ import annotations

import IPython

from . import hints
from .parameters import Parameters
from .session import MultihostSession, make_spmd_transformer


def register_magics(shell) -> MultihostSession:
    """Register the jaxsys magics and the SPMD transformer on ``shell``.

    Calling it again on the same shell returns the existing session.

    Parameters
    ----------
    shell : IPython.core.interactiveshell.InteractiveShell

    Returns
    -------
    MultihostSession
        The session behind the magics.
    """
    # Deferred: the magics need a shell; importing the package alone must stay cheap.
    from .magics import JaxSysMagics, action_help_transformer

    existing = getattr(shell, "_jaxsys_session", None)
    if existing is not None:
        return existing
    session = MultihostSession(shell)
    shell.register_magics(JaxSysMagics(shell, session))
    shell.input_transformers_cleanup.insert(0, make_spmd_transformer(session))
    shell.input_transformers_cleanup.insert(1, action_help_transformer)
    # `%multihost` (one %) then code would run the code here: refused, asking for `%%`.
    shell.input_transformers_cleanup.insert(0, hints.single_percent_transformer)
    shell.events.register("post_run_cell", hints.KernelJaxHint(session).after_cell)
    shell.events.register("post_run_cell", session.report_refusals)
    shell.events.register("post_run_cell", session.report_rotation)
    # A papermill parameters cell runs in the kernel: its values go on to the processes.
    parameters = Parameters(session)
    shell.events.register("pre_run_cell", parameters.before_cell)
    shell.events.register("post_run_cell", parameters.after_cell)
    shell._jaxsys_session = session
    return session


def current_session(shell=None) -> MultihostSession:
    """The session behind the jaxsys magics of ``shell`` (the running IPython shell).

    Raises
    ------
    RuntimeError
        Outside IPython, or when the jaxsys magics are not loaded in it.
    """
    if shell is None:
        shell = IPython.get_ipython()
    session = getattr(shell, "_jaxsys_session", None)
    if session is None:
        raise RuntimeError(
            "no jaxsys session here: use the jaxsys kernel, or %load_ext jaxsys_kernel in IPython"
        )
    return session
