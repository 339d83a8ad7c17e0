"""Complete programs that run inside the JAX processes, shared by the notebooks and bench/.

:mod:`.lm` is a small decoder-only language model sharded over a ``("data", "model")`` mesh;
:mod:`.train` trains it with optax, a Grain pipeline per process and Orbax checkpoints, and
stops cleanly at JAX's preemption sync point. Both import JAX: only engines import them.
"""
