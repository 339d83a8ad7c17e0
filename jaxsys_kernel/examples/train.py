"""Train :mod:`.lm` with optax, a Grain pipeline per process and Orbax checkpoints.

Every process runs :func:`train` at the same time (one JAX program over all processes).

* The optimizer state is sharded exactly like the parameters it belongs to
  (``optax.tree_map_params``), so it too is split over ``data`` and ``model``.
* Each process reads only its own records: the Grain data set is sliced by process before it
  is shuffled and batched, and the per-process batches are put together into one global
  ``jax.Array`` split over ``data``.
* Orbax's ``CheckpointManager`` saves every ``every`` steps in the background: each process
  writes the shards of the sharded arrays it holds, and its own Grain iterator position.
  :func:`train` restores the latest checkpoint on its own, so a restarted program resumes.
  By default the next step waits until the write is complete (``wait_for_saves``): a fault
  then costs at most ``every`` steps. Letting the write overlap the steps after it makes
  them faster, but a fault during the write loses that checkpoint too (up to
  ``2 * every - 1`` steps redone).
* Preemption: on SIGTERM to any one process, JAX's coordination service picks a step that
  every process has not yet reached; ``reached_preemption_sync_point`` returns True there on
  all of them at once, they save that step together and return. The sync point counts the
  steps of one run per JAX world: a second run in the same world may be told to stop at a
  step it never reaches, so restart the world between runs that must stop on preemption.

Nothing depends on the wall clock or on the process that happens to be fastest: a run that
stops after a checkpoint and resumes ends with the same bits as one that never stopped.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable

import grain
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import lm


@functools.cache
def optimizer() -> optax.GradientTransformation:
    """AdamW with a warm-up; the schedule depends on the step only, never on the run's length
    (a run asked for 20 steps and one asked for 40 take the same first 20 steps)."""
    schedule = optax.linear_schedule(0.0, 3e-3, transition_steps=10)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def state_shardings(cfg: lm.Config, mesh, tx) -> dict:
    """Where each array of the training state lives: the optimizer's copies of the parameters
    (Adam's two moments) where the parameters live, its counters replicated."""
    params = lm.shardings(mesh, lm.param_specs(cfg))
    abstract = jax.eval_shape(lambda: tx.init(lm.init_params(cfg, jax.random.key(0))))
    replicated = NamedSharding(mesh, P())
    opt = optax.tree_map_params(
        tx, lambda _, s: s, abstract, params, transform_non_params=lambda _: replicated
    )
    return {"params": params, "opt": opt}


def _fresh(cfg: lm.Config) -> dict:
    params = lm.init_params(cfg, jax.random.key(cfg.seed))
    return {"params": params, "opt": optimizer().init(params)}


@functools.cache
def _init_fn(cfg: lm.Config, mesh) -> Callable:
    return jax.jit(lambda: _fresh(cfg), out_shardings=state_shardings(cfg, mesh, optimizer()))


def init_state(cfg: lm.Config, mesh) -> dict:
    """The step-0 state, made directly in its shards (no process ever holds all of it)."""
    return _init_fn(cfg, mesh)()


def abstract_state(cfg: lm.Config, mesh) -> dict:
    """The state's shapes, dtypes and shardings, without computing it: what a restore fills."""
    shapes = jax.eval_shape(lambda: _fresh(cfg))
    where = state_shardings(cfg, mesh, optimizer())
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, where
    )


@functools.cache
def make_step(cfg: lm.Config, mesh) -> Callable:
    """One compiled training step: ``(state, batch) -> (state, loss)``.

    Cached per model and mesh, so that a second :func:`train` in the same processes reuses
    the compiled program (compiling takes longer than many steps of this model).
    """
    tx = optimizer()
    shardings = state_shardings(cfg, mesh, tx)
    batch_sharding = NamedSharding(mesh, P("data"))

    def step(state, batch):
        loss, grads = jax.value_and_grad(lambda p: lm.loss_fn(cfg, p, batch))(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    return jax.jit(
        step,
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, NamedSharding(mesh, P())),
        donate_argnums=0,
    )


def data_iterator(cfg: lm.Config) -> grain.DatasetIterator:
    """This process's batches: its own records (every ``process_count``-th one), shuffled
    with a fixed seed, repeated, batched. Its position is what the checkpoint keeps."""
    n, me = jax.process_count(), jax.process_index()
    if cfg.batch % n:
        raise ValueError(f"the global batch ({cfg.batch}) must divide among {n} processes")
    ds = grain.MapDataset.source(lm.CountingSource(cfg))[me::n]
    ds = ds.shuffle(seed=cfg.seed).repeat().batch(cfg.batch // n, drop_remainder=True)
    return iter(ds.to_iter_dataset())


def global_batch(cfg: lm.Config, mesh, local: np.ndarray) -> jax.Array:
    """The processes' batches side by side as one array split over ``data``."""
    sharding = NamedSharding(mesh, P("data"))
    return jax.make_array_from_process_local_data(sharding, local, (cfg.batch, cfg.seq_len + 1))


def fingerprint(state) -> str:
    """A SHA-256 of every array of ``state``, gathered whole: the same on every process, and
    equal between two runs only if every bit is."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(state):
        whole = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        h.update(str((whole.shape, whole.dtype)).encode())
        h.update(whole.tobytes())
    return h.hexdigest()


def checkpoint_manager(ckpt_dir: str, every: int) -> ocp.CheckpointManager:
    """Saves every ``every`` steps, asynchronously, keeping the last three."""
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=every, max_to_keep=3, enable_async_checkpointing=True
    )
    return ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=options)


def _save_args(state, it) -> ocp.args.Composite:
    return ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(it)
    )


def restore(mgr: ocp.CheckpointManager, target: dict, it) -> tuple[dict | None, int]:
    """The latest checkpoint's state and step, or ``(None, 0)`` when there is none.

    ``target`` (from :func:`abstract_state`) says where each array goes: each process reads
    only its own shards. The Grain iterator ``it`` is moved to the saved position in place.
    """
    latest = mgr.latest_step()
    if latest is None:
        return None, 0
    got = mgr.restore(
        latest,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=grain.checkpoint.CheckpointRestore(it)
        ),
    )
    return got["state"], latest


def train(
    steps: int,
    ckpt_dir: str,
    *,
    every: int = 5,
    cfg: lm.Config | None = None,
    log_every: int = 1,
    after_step: Callable[[int], None] | None = None,
    wait_for_saves: bool = True,
) -> dict:
    """Train up to ``steps`` steps, resuming from the latest checkpoint in ``ckpt_dir``.

    Parameters
    ----------
    steps
        The step to reach (counted from the very first run, not from the resume).
    ckpt_dir
        A directory every process can write (created if missing).
    every
        Save a checkpoint every this many steps; the last step is always saved.
    cfg
        The model and data (``lm.Config()`` by default).
    log_every
        Print ``step N loss L`` every this many steps and ``restored step N`` (0: never).
    after_step, wait_for_saves
        Called with the step number after each step (a test slows training down with it);
        whether each checkpoint is written before the next step (a fault then redoes at
        most ``every`` steps) rather than while training goes on.

    Returns
    -------
    dict
        ``step`` reached, ``start`` (resumed from), ``preempted`` (stopped at the sync
        point), the last ``loss``, the state's ``fingerprint``, ``seconds`` of training.

    Examples
    --------
    >>> from jaxsys_kernel.examples import train  # in a %%multihost cell
    >>> r = train.train(20, "/tmp/lm-ckpt", every=5)  # doctest: +SKIP
    """
    cfg = cfg or lm.Config()
    mesh = lm.make_mesh()
    it = data_iterator(cfg)
    mgr = checkpoint_manager(ckpt_dir, every)
    state, start = _resume(cfg, mesh, mgr, it, log_every)
    t0 = time.perf_counter()
    saved = mgr.wait_until_finished if wait_for_saves else None
    state, step, loss, preempted = _loop(cfg, mesh, mgr, it, state, start, steps, log_every,
                                         after_step, saved)  # fmt: skip
    if not preempted and mgr.latest_step() != step:
        mgr.save(step, args=_save_args(state, it), force=True)
    mgr.wait_until_finished()
    mgr.close()
    seconds = time.perf_counter() - t0
    return {"step": step, "start": start, "preempted": preempted, "loss": loss,
            "fingerprint": fingerprint(state), "seconds": seconds}  # fmt: skip


def _resume(cfg, mesh, mgr, it, log_every) -> tuple[dict, int]:
    """The latest checkpoint's state and step (said when ``log_every``), or step 0's."""
    state, start = restore(mgr, abstract_state(cfg, mesh), it)
    if state is None:
        return init_state(cfg, mesh), 0
    if log_every:
        print(f"restored step {start}", flush=True)
    return state, start


def _loop(cfg, mesh, mgr, it, state, step, steps, log_every, after_step, saved=None):
    """Steps until ``steps`` or the preemption sync point: ``(state, step, loss, preempted)``;
    ``saved()`` waits for a checkpoint being written (None: the steps go on meanwhile)."""
    step_fn = make_step(cfg, mesh)
    loss = None
    while step < steps:
        state, loss = step_fn(state, global_batch(cfg, mesh, next(it)))
        step += 1
        if log_every and step % log_every == 0:
            print(f"step {step} loss {float(loss):.4f}", flush=True)
        if multihost_utils.reached_preemption_sync_point(step):
            # Every process is here at the same step: save it, then stop.
            mgr.save(step, args=_save_args(state, it), force=True)
            print(f"preempted: saved step {step}", flush=True)
            return state, step, float(loss), True
        if mgr.save(step, args=_save_args(state, it)) and saved is not None:
            saved()  # only every `every` steps does save() write anything
        if after_step is not None:
            after_step(step)
    return state, step, float("nan") if loss is None else float(loss), False
