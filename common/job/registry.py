"""Resolve a model or dataset name (a built-in, or a ``package.module:function`` path), and build from
the factory with errors that name it.

Importing a module runs its code, so a path is imported only from modules the caller allows: the
server imports what its operator names on its command line (any module), a worker only what it
allowed itself (``ps-worker --allow-import``), whatever its server names."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


ALLOW_IMPORT_FLAG = "--allow-import"


class ImportRefused(ValueError):
    """A factory path names a module outside the caller's allowed prefixes: nothing was imported."""


def import_allowed(module_name: str, allowed: Sequence[str] | None) -> bool:
    """Whether `module_name` is one of `allowed` or inside one (a package prefix: ``mypkg`` allows
    ``mypkg.models``, not ``mypkgs``); None allows every module."""
    if allowed is None:
        return True
    return any(module_name == prefix or module_name.startswith(prefix + ".") for prefix in allowed if prefix)


def resolve(name: str, builtins: Mapping[str, Callable[..., Any]], kind: str,
            allowed: Sequence[str] | None = None) -> Callable[..., Any]:
    """Return the factory for ``name``; raise ValueError naming the choices when unknown, and
    ImportRefused, before any import, for a path whose module `allowed` does not admit."""
    if name in builtins:
        return builtins[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if not import_allowed(module_name, allowed):
            raise ImportRefused(f"the job's {kind} {name!r} is code from module {module_name!r}, which this worker does "
                                f"not run unless allowed: {ALLOW_IMPORT_FLAG} {module_name.split('.')[0]}")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import {kind} module {module_name!r}: {exc}") from exc
        factory: object = getattr(module, attr, None)
        if not callable(factory):
            raise ValueError(f"{kind} {name!r}: {module_name} has no callable {attr!r}")
        return factory
    known = ", ".join(sorted(builtins))
    raise ValueError(f"unknown {kind} {name!r}; choose one of {known} or give a package.module:function path")


def check_options(kind: str, name: str, factory: Callable[..., Any], options: Mapping[str, Any], fixed: int) -> None:
    """A ValueError naming an option `factory` does not take (its first `fixed` parameters are the
    ones the service passes itself), with the options it does take; nothing for a factory that takes
    any keyword or whose signature cannot be read."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    takes = [p.name for p in parameters[fixed:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [key for key in options if key not in takes]
    if unknown:
        offered = ", ".join(takes) if takes else "none"
        raise ValueError(f"{kind} {name!r} has no option {unknown[0]!r} (its options: {offered})")


def built(kind: str, name: str, options: dict[str, Any], build: Callable[[], T]) -> T:
    """Call `build()` (a factory applied to `options`); any error it raises becomes one ValueError
    naming the factory and its options (a user's factory may raise anything)."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - a boundary: the factory is the user's code
        raise ValueError(f"{kind} {name!r} rejected its options {options}: {exc}") from exc
