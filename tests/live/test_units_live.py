"""Pure logic: process ranges, line collation, SPMD cell routing. No processes started."""

from __future__ import annotations


def test_stale_profiles_are_removed(tmp_path):
    import subprocess
    import sys

    from jaxsys_kernel.cluster.profile import make_profile, remove_stale_profiles

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f"jaxsys-profile-{dead.stdout.strip()}-abc"
    stale.mkdir()
    mine = make_profile(tmp_path)
    assert not stale.exists()
    assert mine.exists() and (mine / "ipengine_config.py").exists()
    assert oct(mine.stat().st_mode & 0o777) == "0o700"
    assert remove_stale_profiles(tmp_path) == []

