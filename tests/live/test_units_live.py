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


def test_a_controller_whose_owner_died_before_it_started_leaves_at_once(tmp_path):
    import subprocess
    import sys

    from jaxsys_kernel.cluster.profile import make_profile

    profile = make_profile(tmp_path)
    config = profile / "ipcontroller_config.py"
    # What the controller does with its config file: run it, then go on (here: say so and
    # leave without the reap on exit, which waits for a living owner).
    code = (
        f"import os\nget_config = lambda: None\nexec(open({str(config)!r}).read())\n"
        "print('went on', flush=True)\nos._exit(0)\n"
    )
    # Launched by its owner (this process), which lives: it goes on.
    own = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (own.returncode, own.stdout) == (0, "went on\n"), own.stderr
    # Its parent is another process, as once its owner died and it was reparented: it leaves
    # at once, and removes the profile that holds the cluster's keys.
    shell = f'{sys.executable} -c "$0"; exit $?'
    other = subprocess.run(["sh", "-c", shell, code], capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and "went on" not in other.stdout, other.stdout + other.stderr
    assert not profile.exists()
