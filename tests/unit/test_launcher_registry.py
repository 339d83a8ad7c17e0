"""The launcher registry: the only place a launcher is named, and what plug-ins add to it."""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import jaxsys_kernel
from jaxsys_kernel.cluster import config as config_module
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import (
    ENTRY_POINT_GROUP,
    Launcher,
    UnknownLauncherError,
    launcher_class,
    launcher_names,
    make_launcher,
    registry,
)

PACKAGE = Path(jaxsys_kernel.__file__).parent
REPO = PACKAGE.parent
# Where launchers may be named: their own package.
ALLOWED = PACKAGE / "cluster" / "launchers"


def _patterns(names, class_names) -> list[re.Pattern]:
    n = "|".join(map(re.escape, names))
    c = "|".join(map(re.escape, class_names))
    q = "[\"'`]"
    return [
        # A branch on a name: == "slurm", in ("local", ...), case 'mpi'
        re.compile(rf"(==|!=|\bin\b|\bcase\b)\s*[(\[{{]?\s*{q}({n}){q}"),
        re.compile(rf"{q}({n}){q}\s*(==|!=|\bin\b)"),
        # Names listed together: ("local", "ssh"), 'mpi' | 'slurm'
        re.compile(rf"{q}({n}){q}\s*[,|]\s*{q}({n}){q}"),
        # A concrete launcher class: isinstance(x, SlurmLauncher), instanceof MpiLauncher
        re.compile(rf"\b({c})\b"),
        # A launcher chosen by name: launcher: str = "local", .get(LAUNCHER, "local")
        re.compile(rf"(?i)launcher\w*\W.*{q}({n}){q}"),
        # A name kept anywhere, to be used as a launcher's later: kind = "slurm"
        re.compile(rf"^\s*[\w.]+\s*(:[^=]+)?=\s*{q}({n}){q}\s*(#.*)?$"),
        # A launcher taken from another class's attribute: launcher=SlurmAllocation.kind
        re.compile(rf"\blauncher\s*=\s*(?!(?:{c})\b)[A-Z]\w*\.\w+"),
        # Messages and prose that list or name launchers: "local, ssh or mpi",
        # "the ssh launcher needs ..."
        re.compile(rf"(?i)\b({n})(, | or | and |/)(the )?({n})\b"),
        re.compile(rf"(?i)(?<![\"'])[\"'](?![\"'])[^\"'`#]*\b({n})\b[\w ,]* launchers?\b"),
    ]


def launcher_name_uses(text: str, names, class_names) -> list[int]:
    """Line numbers of ``text`` that name a launcher as a branch, literal or message."""
    patterns = _patterns(names, class_names)
    return [
        i for i, line in enumerate(text.splitlines(), 1) if any(p.search(line) for p in patterns)
    ]


def _sources():
    yield from sorted(PACKAGE.rglob("*.py"))
    yield from sorted((REPO / "labextension" / "src").glob("*.ts*"))


def _registered():
    classes = registry.launcher_classes()
    return list(classes), [cls.__name__ for cls in classes.values()]


def test_no_launcher_is_named_outside_the_launchers():
    names, class_names = _registered()
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in _sources()
        if ALLOWED not in path.parents
        for n in launcher_name_uses(path.read_text(), names, class_names)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "line",
    [
        'if cfg.launcher in ("local", "ssh"):',
        "if kind == 'slurm':",
        "    return isinstance(x, SlurmLauncher)",
        'choices=("local", "ssh", "mpi", "slurm"),',
        'launcher: str = "local"',
        'os.environ.get(contract.LAUNCHER, "local")',
        'raise ValueError("the ssh launcher needs host names")',
        '    "restarting one process needs the local or the ssh launcher"',
        "  if (launcher === 'mpi') {",
        "type Kind = 'local' | 'ssh';",
        '    launcher : {"local", "ssh"}',
        '    kind = "slurm"',
        "NAME: str = 'mpi'  # the scheduler",
        "        launcher=SlurmAllocation.kind,",
    ],
)
def test_the_scanner_finds_a_planted_launcher_name(line):
    names, class_names = _registered()
    text = f"x = 1\n{line}\ny = 2\n"
    assert launcher_name_uses(text, names, class_names) == [2]


@pytest.mark.parametrize(
    "line",
    [
        "%%local cells run in the kernel",
        "def local_stacks(files):",
        "launcher = make_launcher(config)",
        'cmd = ["ssh", "-p", port]',
        "loopback = host == '127.0.0.1'",
        "        launcher=able[0],",
        "    kind = 'slurm-job'",
        'prefix = "local"  + name',
    ],
)
def test_the_scanner_leaves_other_words_alone(line):
    names, class_names = _registered()
    assert launcher_name_uses(line, names, class_names) == []


# -- the registry --------------------------------------------------------------------------


def test_the_built_in_launchers_are_declared_in_the_entry_point_group():
    from importlib.metadata import entry_points

    declared = {ep.name: ep.load() for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert {cls.name: cls for cls in registry.BUILTIN}.items() <= declared.items()
    assert launcher_names()[: len(registry.BUILTIN)] == tuple(c.name for c in registry.BUILTIN)


class _PbsLauncher(Launcher):
    name = "pbs"


def _plugin(monkeypatch, *eps):
    monkeypatch.setattr(registry, "_entry_points", lambda: list(eps))
    registry.launcher_classes.cache_clear()


@pytest.fixture
def clean_registry():
    yield
    registry.launcher_classes.cache_clear()


def test_an_entry_point_adds_a_launcher_everywhere(monkeypatch, clean_registry):
    ep = EntryPoint("pbs", f"{__name__}:_PbsLauncher", ENTRY_POINT_GROUP)
    _plugin(monkeypatch, ep)
    assert "pbs" in launcher_names()
    assert launcher_class("pbs") is _PbsLauncher
    assert type(make_launcher(ClusterConfig(hosts=2, launcher="pbs"))) is _PbsLauncher

    from jaxsys_kernel import cli

    args = cli.build_parser().parse_args(["cluster", "start", "--launcher", "pbs"])
    assert args.launcher == "pbs"


def test_a_broken_or_clashing_entry_point_is_skipped_with_a_warning(
    monkeypatch, clean_registry, caplog
):
    _plugin(
        monkeypatch,
        EntryPoint("gone", "no_such_module_anywhere:Launcher", ENTRY_POINT_GROUP),
        EntryPoint("notone", "os:path", ENTRY_POINT_GROUP),
        EntryPoint(registry.DEFAULT, f"{__name__}:_PbsLauncher", ENTRY_POINT_GROUP),
    )
    assert launcher_names() == tuple(c.name for c in registry.BUILTIN)
    text = caplog.text
    assert "'gone'" in text and "could not be loaded" in text
    assert "'notone'" in text and "not a jaxsys Launcher" in text
    assert "is ignored: the name belongs to" in text


def test_an_unknown_launcher_lists_the_known_ones():
    with pytest.raises(UnknownLauncherError, match="choose one of " + ", ".join(launcher_names())):
        ClusterConfig(hosts=2, launcher="nosuch")
    with pytest.raises(ValueError, match="entry points"):
        launcher_class("nosuch")
    assert config_module.DEFAULT == registry.DEFAULT
