"""A small decoder-only transformer language model, sharded over processes and devices.

The mesh has two axes. ``data`` runs across processes: each process feeds its own slice of
the batch, and every weight matrix is also cut along ``data`` (FSDP style: a process keeps
only its part of the weights and the optimizer state; XLA gathers them for the matmuls).
``model`` runs across the devices of one process: attention heads and the MLP's hidden
units are split there (tensor parallelism).

The training data is generated, not downloaded: record ``i`` is a run of tokens counting up
from a start with a stride, both drawn from a generator seeded with ``i``. A model that has
learned to predict the next token has learned the stride from the context.

Everything here is plain JAX; :mod:`.train` adds the optimizer, the input pipeline and the
checkpoints.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class Config:
    """The model's size and the data it sees. The defaults train a few steps a second on
    eight CPU devices."""

    vocab: int = 64
    seq_len: int = 32
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    d_ff: int = 256
    batch: int = 16  # global: split over the processes
    records: int = 4096  # the data set's length
    seed: int = 0


def make_mesh() -> Mesh:
    """A ``("data", "model")`` mesh: one row per process, its local devices across ``model``."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    grid = np.array(devices).reshape(jax.process_count(), jax.local_device_count())
    return Mesh(grid, ("data", "model"))


def _layer_specs() -> dict[str, P]:
    # Matrices into the wide dimension are split (data, model); matrices back out of it are
    # split (model, data), so each matmul pair needs only one reduction over "model".
    return {
        "ln1": P(),
        "wq": P("data", "model"),
        "wk": P("data", "model"),
        "wv": P("data", "model"),
        "wo": P("model", "data"),
        "ln2": P(),
        "w1": P("data", "model"),
        "w2": P("model", "data"),
    }


def param_specs(cfg: Config) -> dict:
    """The partition spec of every parameter, a tree shaped like :func:`init_params`'s."""
    return {
        "embed": P("data", "model"),
        "pos": P(None, "model"),
        "layers": [_layer_specs() for _ in range(cfg.layers)],
        "ln_f": P(),
    }


def init_params(cfg: Config, key: jax.Array) -> dict:
    """Fresh parameters (call it under ``jax.jit`` with out_shardings to build them sharded)."""
    d, f = cfg.d_model, cfg.d_ff
    keys = iter(jax.random.split(key, 2 + 6 * cfg.layers))

    def dense(shape: tuple[int, int]) -> jax.Array:
        return jax.random.normal(next(keys), shape, jnp.float32) / np.sqrt(shape[0])

    layers = []
    for _ in range(cfg.layers):
        layers.append(
            {
                "ln1": jnp.ones((d,)),
                "wq": dense((d, d)),
                "wk": dense((d, d)),
                "wv": dense((d, d)),
                "wo": dense((d, d)),
                "ln2": jnp.ones((d,)),
                "w1": dense((d, f)),
                "w2": dense((f, d)),
            }
        )
    return {
        "embed": dense((cfg.vocab, d)),
        "pos": dense((cfg.seq_len, d)) * 0.1,
        "layers": layers,
        "ln_f": jnp.ones((d,)),
    }


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x = x - x.mean(-1, keepdims=True)
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale


def _attention(cfg: Config, p: dict, x: jax.Array) -> jax.Array:
    b, t, d = x.shape
    h = cfg.heads

    def split(w: jax.Array) -> jax.Array:
        return (x @ w).reshape(b, t, h, d // h)

    q, k, v = split(p["wq"]), split(p["wk"]), split(p["wv"])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // h)
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
    return out @ p["wo"]


def forward(cfg: Config, params: dict, tokens: jax.Array) -> jax.Array:
    """Next-token logits, shape ``(batch, time, vocab)``."""
    x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]
    for p in params["layers"]:
        x = x + _attention(cfg, p, _norm(x, p["ln1"]))
        x = x + jax.nn.gelu(_norm(x, p["ln2"]) @ p["w1"]) @ p["w2"]
    # The output projection reuses the embedding (tied weights).
    return _norm(x, params["ln_f"]) @ params["embed"].T


def loss_fn(cfg: Config, params: dict, batch: jax.Array) -> jax.Array:
    """Mean cross-entropy of predicting ``batch[:, 1:]`` from ``batch[:, :-1]``."""
    logits = forward(cfg, params, batch[:, :-1])
    logp = jax.nn.log_softmax(logits)
    target = jnp.take_along_axis(logp, batch[:, 1:, None], axis=-1)
    return -target.mean()


def shardings(mesh: Mesh, specs) -> object:
    """The tree of ``NamedSharding`` for a tree of partition specs."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)


def _is_spec(x) -> bool:
    return isinstance(x, P)


def count_params(cfg: Config) -> int:
    """How many numbers the model has (the same for every mesh)."""
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    return sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))


class CountingSource:
    """Record ``i``: ``seq_len + 1`` tokens counting from a start with a stride, mod vocab.

    A random-access source in Grain's sense (``__len__`` and ``__getitem__``); each record is
    made from its own index, so any process can produce any record, identically.
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def __len__(self) -> int:
        return self.cfg.records

    def __getitem__(self, i: int) -> np.ndarray:
        rng = np.random.default_rng([self.cfg.seed, int(i)])
        start, stride = rng.integers(0, self.cfg.vocab), rng.integers(1, 8)
        t = np.arange(self.cfg.seq_len + 1)
        return ((start + stride * t) % self.cfg.vocab).astype(np.int32)
