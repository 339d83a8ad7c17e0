"""The example language model's pieces, in this process: its data, shapes and specs.

The multi-process runs (restart, preemption, bitwise equality) are in
``tests/live/test_train_live.py``.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxsys_kernel.examples import lm

SMALL = lm.Config(seq_len=8, records=64)


def test_records_are_made_from_their_index_alone():
    src = lm.CountingSource(SMALL)
    assert len(src) == 64
    a, b = src[5], lm.CountingSource(SMALL)[5]
    assert a.dtype == np.int32 and a.shape == (9,)
    assert np.array_equal(a, b) and not np.array_equal(src[5], src[6])
    # Each record counts with one stride: the next token follows from the last two.
    stride = (a[1] - a[0]) % SMALL.vocab
    assert np.array_equal((a[1:] - a[:-1]) % SMALL.vocab, np.full(8, stride))


def test_every_parameter_has_a_spec_that_fits_its_shape():
    cfg = lm.Config()
    shapes = jax.eval_shape(lambda: lm.init_params(cfg, jax.random.key(0)))
    specs = lm.param_specs(cfg)
    assert jax.tree.structure(shapes) == jax.tree.structure(
        specs, is_leaf=lambda x: isinstance(x, P)
    )
    # The default model splits on 4 processes x 2 devices: every split dimension divides.
    sizes = {"data": 4, "model": 2, None: 1}
    for shape, spec in zip(
        jax.tree.leaves(shapes),
        jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)),
        strict=True,
    ):
        for dim, axis in zip(shape.shape, tuple(spec) + (None,) * len(shape.shape), strict=False):
            assert dim % sizes[axis] == 0, (shape, spec)
    assert lm.count_params(cfg) == 104768
