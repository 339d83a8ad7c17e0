"""Loading global batches with real JAX in one process of 8 CPU devices (a child process).

Every layout, strategy and kind of source must give the reference array; a ``.npy`` file is
read by slices (the page cache proves it: after loading one batch of sixteen, only that
batch's pages were read from the file); plans of real shardings match the simulated ones.
The cross-process cases run on a live cluster in ``test_data_live``.
"""

from __future__ import annotations

import os

import pytest


def test_npy_files_stay_mapped_until_they_change(tmp_path):
    import numpy as np

    from jaxsys_kernel.data import close_files, open_npy
    from jaxsys_kernel.data.sources import OPEN_FILES, aligned_empty, open_source

    close_files()
    path = tmp_path / "a.npy"
    np.save(path, np.arange(12, dtype=np.int16).reshape(3, 4))
    first = open_source(str(path))
    again = open_source(path)
    assert first.array is again.array and first.mapping is again.mapping
    assert not first.array.flags.writeable
    os.utime(path, ns=(0, 0))  # a changed modification time: mapped again
    assert open_source(path).array is not first.array
    assert close_files() == 1 and len(OPEN_FILES._files) == 0
    got = first.read((slice(1, 3), slice(0, 4)))
    assert got.tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert got.ctypes.data % 64 == 0 and not got.flags.writeable
    assert aligned_empty((5, 3), np.float64).ctypes.data % 64 == 0
    np.save(tmp_path / "f.npy", np.asfortranarray(np.arange(6).reshape(2, 3)))
    assert open_npy(tmp_path / "f.npy").tolist() == [[0, 1, 2], [3, 4, 5]]
    np.save(tmp_path / "o.npy", np.array([{}], dtype=object))
    with pytest.raises(ValueError, match="Python objects"):
        open_npy(tmp_path / "o.npy")
    close_files()
