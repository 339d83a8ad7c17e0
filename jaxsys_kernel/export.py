"""Exported computations that outlive the process: save, load anywhere, call with checks.

``save_exported`` and ``load_exported`` are thin layers over ``Exported.serialize`` and
``jax.export.deserialize``: the file holds exactly the serialized bytes, so plain JAX reads it
too. What they add is for clusters and for people: every process can save the same file at
once (atomic replace), a loaded export remembers where it came from, and a call that breaks a
shape constraint or the device count fails with a message that names the symbol, the
constraint and the value, before JAX's own shape refinement buries them.

These functions run where JAX runs: inside ``%%multihost`` cells, or any JAX process. They
are importable as ``jaxsys_kernel.save_exported`` (lazily; the kernel itself never imports JAX).
"""

from __future__ import annotations

import ast
import operator
import os
import re
from pathlib import Path
from typing import Any

import jax

from .engine.export_info import aval_text, constraints_of, leaf_names, mesh_of, symbols_of
from .errors import EngineError

__all__ = ["ExportCallError", "LoadedExport", "check_call", "load_exported", "save_exported"]


class ExportCallError(EngineError, ValueError):
    """A call of an exported computation with shapes or devices it was not exported for."""


# -- dimension expressions ------------------------------------------------------------------

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CALLS = {
    "mod": operator.mod,
    "floordiv": operator.floordiv,
    "max": max,
    "min": min,
    "non_negative": lambda x: max(x, 0),
}
_COMPARE = {">=": operator.ge, "<=": operator.le, "==": operator.eq}


def evaluate_dim(text: str, env: dict[str, int]) -> int:
    """Value of a dimension expression as JAX prints it (``4*b + 1``, ``mod(b, 3)``).

    Raises
    ------
    KeyError
        If it uses a variable ``env`` has no value for.
    ValueError
        If it is not a dimension expression.
    """

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn = _CALLS.get(node.func.id)
            if fn is not None:
                return fn(*(ev(a) for a in node.args))
        raise ValueError(f"not a dimension expression: {text!r}")

    try:
        tree = ast.parse(text.replace("^", "**"), mode="eval")
    except SyntaxError:
        raise ValueError(f"not a dimension expression: {text!r}") from None
    return ev(tree.body)


def _variables(text: str) -> set[str]:
    return {w for w in re.findall(r"[A-Za-z_]\w*", text) if w not in _CALLS}


def _solve_linear(text: str, var: str, value: int) -> int | None:
    """``var`` such that ``text`` equals ``value``, when ``text`` is ``k*var + c``."""
    c = evaluate_dim(text, {var: 0})
    k = evaluate_dim(text, {var: 1}) - c
    if k == 0 or evaluate_dim(text, {var: 2}) != 2 * k + c:
        return None
    q, r = divmod(value - c, k)
    return q if r == 0 else None


def check_constraint(constraint: str, env: dict[str, int]) -> bool | None:
    """Whether ``a >= b``-style ``constraint`` holds for ``env`` (None: cannot tell)."""
    for op, fn in _COMPARE.items():
        if op in constraint:
            lhs, rhs = constraint.split(op, 1)
            try:
                return fn(evaluate_dim(lhs.strip(), env), evaluate_dim(rhs.strip(), env))
            except (KeyError, ValueError, ZeroDivisionError):
                return None
    return None


# -- checking a call ------------------------------------------------------------------------


def _flat_args(exp, args: tuple, kwargs: dict) -> list:
    __tracebackhide__ = True

    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    if tree != exp.in_tree:
        raise ExportCallError(
            f"{exp.fun_name} was exported for arguments structured as {exp.in_tree}, "
            f"called with {tree}"
        )
    return leaves


def _bind_dims(exp, names: list[str], leaves: list) -> tuple[dict, dict, list]:
    """Values of the dimension variables, where they came from, and dims left to check."""
    __tracebackhide__ = True
    env: dict[str, int] = {}
    source: dict[str, str] = {}
    later: list[tuple[str, str, int]] = []
    for name, aval, x in zip(names, exp.in_avals, leaves, strict=True):
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != len(aval.shape):
            raise ExportCallError(
                f"{exp.fun_name}: {name} has shape {shape}, but it was exported with "
                f"{len(aval.shape)} dimensions ({_shape_text(aval)})"
            )
        for i, (dim, value) in enumerate(zip(aval.shape, shape, strict=True)):
            where = f"{name}.shape[{i}]"
            text = str(dim)
            if isinstance(dim, int):
                if int(value) != dim:
                    raise ExportCallError(
                        f"{exp.fun_name}: {where} = {value}, but it was exported as {dim} "
                        f"({name}: {_shape_text(aval)})"
                    )
                continue
            free = _variables(text)
            if len(free) == 1:
                var = next(iter(free))
                solved = _solve_linear(text, var, int(value))
                if solved is None and text != var:
                    raise ExportCallError(
                        f"{exp.fun_name}: {where} = {value} is not of the form {text} for a "
                        f"whole {var} ({name}: {_shape_text(aval)})"
                    )
                if solved is not None:
                    if var in env and env[var] != solved:
                        raise ExportCallError(
                            f"{exp.fun_name}: {where} = {value} makes {var} = {solved}, but "
                            f"{source[var]} already made {var} = {env[var]}"
                        )
                    env.setdefault(var, solved)
                    source.setdefault(var, f"{where} = {value}")
                    continue
            later.append((where, text, int(value)))
    return env, source, later


def _shape_text(aval) -> str:

    return aval_text(aval)


def _check_devices(exp, names: list[str], leaves: list) -> None:
    __tracebackhide__ = True
    want = int(exp.nr_devices)
    for name, x in zip(names, leaves, strict=True):
        sharding = getattr(x, "sharding", None)
        try:
            have = len(sharding.device_set) if sharding is not None else None
        except Exception:  # noqa: BLE001 - a tracer may have no concrete sharding
            have = None
        if have is not None and have != want and (want > 1 or have > 1):
            raise ExportCallError(device_message(exp, f"{name} is on {have} devices"))


def device_message(exp, what: str) -> str:
    """Why a call does not fit the device count the computation was exported for."""
    mesh = mesh_of(exp)
    over = f" (mesh {mesh})" if mesh else ""
    return (
        f"{exp.fun_name} was exported for {exp.nr_devices} devices{over}; {what}. Call it with "
        f"arguments placed on exactly {exp.nr_devices} devices (e.g. arrays sharded over a "
        f"mesh of that size)"
    )


def check_call(
    exp, args: tuple = (), kwargs: dict | None = None, *, constraints: list[str] | None = None
) -> dict[str, int]:
    """Check a call against an export's shapes, constraints and device count.

    Parameters
    ----------
    exp : jax.export.Exported
        The exported computation.
    args, kwargs
        The call's arguments (anything with ``shape``; arrays also with ``sharding``).
    constraints : list of str, optional
        The export's constraints, when already known (reading them may parse the module).

    Returns
    -------
    dict
        The value of every dimension variable the arguments determine.

    Raises
    ------
    ExportCallError
        Naming the argument, the symbol, the constraint and the value that breaks it.
    """
    __tracebackhide__ = True
    leaves = _flat_args(exp, args, kwargs or {})
    names = leaf_names(exp.in_tree, len(exp.in_avals), "args")
    env, source, later = _bind_dims(exp, names, leaves)
    for var in symbols_of(exp.in_avals):
        if var in env and env[var] < 1:
            raise ExportCallError(
                f"{exp.fun_name}: {var} = {env[var]} (from {source[var]}) breaks the "
                f"constraint {var} >= 1"
            )
    for where, text, value in later:
        try:
            expected = evaluate_dim(text, env)
        except (KeyError, ValueError, ZeroDivisionError):
            continue  # JAX's own refinement decides
        if expected != value:
            bound = ", ".join(f"{k} = {v}" for k, v in env.items())
            raise ExportCallError(
                f"{exp.fun_name}: {where} = {value}, but {text} = {expected} with {bound}"
            )
    if constraints is None:
        constraints = constraints_of(exp, symbols_of(exp.in_avals))
    for constraint in constraints:
        if check_constraint(constraint, env) is False:
            used = sorted(_variables(constraint) & set(env))
            values = ", ".join(f"{v} = {env[v]} (from {source[v]})" for v in used)
            raise ExportCallError(f"{exp.fun_name}: {values} breaks the constraint {constraint}")
    _check_devices(exp, names, leaves)
    return env


# -- the loaded artifact --------------------------------------------------------------------


class LoadedExport:
    """An exported computation with the checks of :func:`check_call` on every call.

    Everything else reads through to the ``jax.export.Exported`` (``in_avals``,
    ``platforms``, ``mlir_module()``...); ``exported`` is the plain object.

    Parameters
    ----------
    exported : jax.export.Exported
        The computation.
    path : str, optional
        The file it came from.
    serialized_bytes : int, optional
        Its serialized size.
    """

    def __init__(self, exported, path: str | None = None, serialized_bytes: int | None = None):
        self.exported = exported
        self.path = path
        self.serialized_bytes = serialized_bytes
        self._constraints: list[str] | None = None

    def call(self, *args, **kwargs):
        """Call the computation (inside ``jax.jit`` too), after checking the arguments."""
        __tracebackhide__ = True  # the user's call is the news, not jaxsys's own frames
        exp = self.exported
        if self._constraints is None:
            self._constraints = constraints_of(exp, symbols_of(exp.in_avals))
        check_call(exp, args, kwargs, constraints=self._constraints)
        try:
            return exp.call(*args, **kwargs)
        except ValueError as e:
            raise _translate(exp, e) from e

    __call__ = call

    def __getattr__(self, name: str) -> Any:
        if name in ("exported", "_constraints"):  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.exported, name)

    def __repr__(self) -> str:
        where = f" from {self.path}" if self.path else ""
        return f"<LoadedExport {self.exported.fun_name}{where}>"


def _translate(exp, error: ValueError) -> Exception:
    """JAX's error, with the message its shape refinement keeps in the cause."""
    text = str(error)
    if "Length of device assignment" in text:
        found = re.search(r"device assignment (\d+)", text)
        return ExportCallError(
            device_message(exp, f"the call used {found.group(1) if found else 'other'} device(s)")
        )
    cause = str(error.__cause__ or "")
    found = re.search(r"error: (.+?)(?:\s+Please see|\n|$)", cause)
    if "refining shapes" in text and found:
        return ExportCallError(f"{exp.fun_name}: {found.group(1).strip()}")
    return error


def save_exported(exp, path: str | os.PathLike, *, vjp_order: int = 0) -> int:
    """Write an exported computation to ``path`` (its serialized bytes, nothing else).

    Every process of a cluster may call it with the same path at once: each writes a file
    of its own and moves it into place, so readers never see half a file.

    Parameters
    ----------
    exp : jax.export.Exported or LoadedExport
        What to save.
    path : str or path-like
        The file to write; its directory must exist.
    vjp_order : int
        Orders of reverse-mode derivatives to save with it (see ``Exported.serialize``).

    Returns
    -------
    int
        The number of bytes written.

    Examples
    --------
    ::

        %%multihost
        exp = jax.export.export(jax.jit(f))(jax.ShapeDtypeStruct((b, 4), jnp.float32))
        jaxsys_kernel.save_exported(exp, "/shared/f.jaxexport")
    """
    exp = getattr(exp, "exported", exp)
    if not hasattr(exp, "serialize"):
        raise TypeError(
            f"save_exported takes a jax.export.Exported, got {type(exp).__name__}; make one "
            "with jax.export.export(jax.jit(f))(*arg_specs)"
        )
    data = exp.serialize(vjp_order=vjp_order)
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot save to {target}: {target.parent} is not a directory")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, target)
    return len(data)


def load_exported(path: str | os.PathLike) -> LoadedExport:
    """Read an exported computation saved by :func:`save_exported` (or ``serialize``).

    Parameters
    ----------
    path : str or path-like
        The file.

    Returns
    -------
    LoadedExport
        Call it like the original (``.call(...)`` or ``(...)``); ``.exported`` is the
        ``jax.export.Exported``.

    Raises
    ------
    FileNotFoundError
        If there is no such file.
    ValueError
        If the file is not a serialized export.

    Examples
    --------
    ::

        %%multihost
        f = jaxsys_kernel.load_exported("/shared/f.jaxexport")
        for n in (4, 8, 12):
            print(f(jnp.ones((n, 4))).shape)
    """
    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(f"no exported computation at {target}")
    data = target.read_bytes()
    try:
        exp = jax.export.deserialize(bytearray(data))
    except Exception as e:  # noqa: BLE001 - flatbuffers fails in many ways on foreign bytes
        raise ValueError(
            f"{target} is not a serialized jax.export.Exported ({type(e).__name__}: {e}); "
            "write it with jaxsys_kernel.save_exported or Exported.serialize()"
        ) from None
    return LoadedExport(exp, path=str(target), serialized_bytes=len(data))
