"""``%jaxsys start --explain``: what each process did to join the JAX world, as plain JAX.

Every process reports the exact keyword arguments it passed to
``jax.distributed.initialize`` and the values of the JAX options that shape that call
(recoverability, the mTLS files and peer prefix, the credential check), each with the
environment variable that set it. This module turns those reports into the program a
user would write to do the same without jaxsys.
"""

from __future__ import annotations

from collections.abc import Iterable

# What each explained option means for the program, in one line.
OPTION_NOTES = {
    "jax_enable_recoverability": {
        True: "survivors keep running when a process dies",
        False: "fate-sharing: when one process dies the others are stopped too",
    },
    "jax_distributed_verify_secure_credentials": {
        True: "abort if no mTLS option is set, rather than connect in plaintext",
        False: "with no mTLS option set, the coordination service runs in plaintext",
    },
}


def _option_line(row: dict) -> str:
    value = row.get("value")
    line = f"jax.config.update({row['option']!r}, {value!r})"
    env_value = row.get("env_value")
    if row.get("set_by"):
        source = row["set_by"]
    elif env_value is None:
        source = "JAX's default"
    elif len(env_value) <= 8:
        source = f"set by ${row['env']}={env_value}"
    else:  # a path or a prefix: the value is on the left already
        source = f"set by ${row['env']}"
    note = OPTION_NOTES.get(row["option"], {}).get(bool(value))
    return f"{line}  # {source}" + (f"; {note}" if note else "")


def explain_process(info) -> list[str]:
    """The plain-JAX lines for one process.

    Parameters
    ----------
    info : ProcessInfo
        A process record with ``init_call`` and ``init_settings`` filled in.

    Returns
    -------
    list of str
        A comment naming the process, its option settings and the ``initialize`` call.
    """
    head = f"# process {info.rank} (pid {info.pid} on {info.host or '?'})"
    if not info.init_call:
        return [head, "# this process has not reported its initialize() call"]
    lines = [head, "import jax"]
    # Unset options (None) stay at JAX's defaults and need no line.
    lines += [_option_line(r) for r in info.init_settings if r.get("value") is not None]
    lines.append("jax.distributed.initialize(")
    lines += [f"    {k}={v!r}," for k, v in info.init_call.items()]
    lines.append(")")
    return lines


def explain(processes: Iterable, security: str = "") -> str:
    """Render every process's ``initialize`` call and options as plain JAX.

    Parameters
    ----------
    processes : iterable of ProcessInfo
        The cluster's process records, in rank order.
    security : str
        The cluster's one-line security description, printed first.

    Returns
    -------
    str
        One block per process, separated by blank lines.

    Examples
    --------
    >>> from jaxsys_kernel.cluster.records import ProcessInfo
    >>> p = ProcessInfo(rank=0, pid=7, host="h",
    ...                 init_call={"coordinator_address": "h:1", "num_processes": 1,
    ...                            "process_id": 0})
    >>> print(explain([p]))
    # process 0 (pid 7 on h)
    import jax
    jax.distributed.initialize(
        coordinator_address='h:1',
        num_processes=1,
        process_id=0,
    )
    """
    blocks = ["\n".join(explain_process(p)) for p in processes]
    head = [f"# security: {security}"] if security else []
    return "\n\n".join(["\n".join(head)] + blocks if head else blocks)
