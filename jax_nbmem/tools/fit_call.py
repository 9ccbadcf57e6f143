"""The call ``%jaxmem fit`` is given as text (``train_step(state, batch)``), made into values.

The function and each argument are evaluated in the user's namespace. With ``shapes``, nothing
new is allocated for the arguments: an argument that is a name (``batch``, ``cfg.params``,
``data[0]``) or a literal is read as it is, any other expression (``jnp.ones((4096, 4096))``)
is evaluated abstractly with ``jax.eval_shape``, and every array among them is replaced by a
``jax.ShapeDtypeStruct`` (keeping its sharding). Python scalars and other values stay as they
are, since a function may take them as static arguments.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from typing import Any

from jax_nbmem.text import printable
from jax_nbmem.tools.fit import FitError, attempt

__all__ = ["Call", "evaluate_call"]

_EXAMPLE = "e.g. %jaxmem fit train_step(state, batch)"


class Call:
    """A call read from text: the function, the arguments, and the live values they came from.

    ``arguments`` are what the call is compiled with (stand-ins under ``shapes``);
    ``originals`` the values as the namespace holds them, so that arrays already on a device
    are known to be there.
    """

    def __init__(self, text: str, fn: Any, args: list, kwargs: dict, originals: tuple) -> None:
        self.text = text
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.originals = originals


def evaluate_call(text: str, namespace: Mapping[str, Any], *, shapes: bool = False) -> Call:
    """Evaluate ``f(a, b, k=c)`` in *namespace*; raise :class:`FitError` saying what is wrong."""
    source = text.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise FitError(f"cannot read {printable(source)!s}: {exc.msg}; {_EXAMPLE}") from None
    call = tree.body
    if not isinstance(call, ast.Call):
        raise FitError(f"{printable(source)} is not a call; {_EXAMPLE}")
    globals_ = namespace if isinstance(namespace, dict) else dict(namespace)
    fn = _value(call.func, globals_, source)
    args: list = []
    originals: list = []
    for node in call.args:
        if isinstance(node, ast.Starred):
            values = list(_value(node.value, globals_, source))
            originals.extend(values)
            args.extend(_stand_ins(v) if shapes else v for v in values)
        else:
            value, original = _argument(node, globals_, source, shapes)
            args.append(value)
            originals.append(original)
    kwargs: dict = {}
    for keyword in call.keywords:
        if keyword.arg is None:  # **mapping
            mapping = dict(_value(keyword.value, globals_, source))
            originals.extend(mapping.values())
            kwargs.update({k: _stand_ins(v) if shapes else v for k, v in mapping.items()})
        else:
            value, original = _argument(keyword.value, globals_, source, shapes)
            kwargs[keyword.arg] = value
            originals.append(original)
    return Call(source, fn, args, kwargs, tuple(originals))


def _argument(node: ast.expr, namespace: dict, source: str, shapes: bool) -> tuple[Any, Any]:
    if not shapes or _reads_only(node):
        value = _value(node, namespace, source)
        return (_stand_ins(value) if shapes else value), value
    jax = sys.modules.get("jax")
    if jax is None:
        raise FitError("--shapes needs JAX imported (it evaluates arguments with jax.eval_shape)")
    code = _compiled(node, source)
    shaped = attempt(
        lambda: jax.eval_shape(lambda: eval(code, namespace)),  # noqa: S307 - the user's text
        lambda exc: (
            f"--shapes: cannot evaluate {ast.unparse(node)} abstractly "
            f"({type(exc).__name__}: {printable(str(exc).splitlines()[0] if str(exc) else '')}); "
            "give it a name in a cell first, and pass the name"
        ),
    )
    return shaped, None


def _reads_only(node: ast.expr) -> bool:
    """A name, an attribute or item of one, or a literal: reading it allocates nothing."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript) and not _literal(node.slice):
            return False
        node = node.value
    return isinstance(node, ast.Name) or _literal(node)


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _value(node: ast.expr, namespace: dict, source: str) -> Any:
    code = _compiled(node, source)
    return attempt(
        lambda: eval(code, namespace),  # noqa: S307 - the user's own text
        lambda exc: f"cannot evaluate {ast.unparse(node)}: {type(exc).__name__}: {printable(exc)}",
    )


def _compiled(node: ast.expr, source: str) -> Any:
    return compile(ast.Expression(node), f"<%jaxmem fit {source[:40]}>", "eval")


def _stand_ins(value: Any) -> Any:
    """*value* with every array (JAX's or NumPy's) replaced by a ShapeDtypeStruct."""
    jax = sys.modules.get("jax")
    if jax is None:
        return value

    def stand_in(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        if type(leaf).__module__ == "numpy" and hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        return leaf

    return jax.tree_util.tree_map(stand_in, value)
