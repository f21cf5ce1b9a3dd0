"""A fix as a mixin over the class an object was built as: `mixed_over(fix, base)`.

`adapters.engine_patched` fixes LMCache's objects from outside, by swapping an object's class for a subclass that
carries the fix. Deriving that subclass from the class the object was built as, looked up when it is fixed, keeps
whatever an `--engine-patch` did to that class (a method patched, or a class put in place of LMCache's: a user's
fork) in force under the fix. The subclass is `base`'s direct subclass, with the fix's methods copied in (its mixins'
too, flattened: they must share no name), each one's zero-argument `super()` meaning the new class: a class made
with the mixin among its bases could not always take an object's `__class__` (a base whose `__dict__` comes from an
ABC has another layout). A class is made each time, so what was taken out of a fix since (an unfix) is out of every
object fixed afterwards.
"""
from __future__ import annotations

import types
from typing import Any

__all__ = ["mixed_over"]

#: Attributes of a mixin that are not its own behaviour.
_NOT_COPIED = ("__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__slots__")


def mixed_over(fix: type, base: type) -> type:
    """`base` with the methods of `fix` (and of its mixin bases) over it, as its direct subclass (`base` itself when
    it is such a class of `fix` already); the class records its fix as `_shardcheck_fix`."""
    if getattr(base, "_shardcheck_fix", None) is fix:
        return base
    cls = type(f"{fix.__name__.lstrip('_')}{base.__name__}", (base,),
               {"__module__": fix.__module__, "__doc__": fix.__doc__, "_shardcheck_fix": fix})
    for mixin in reversed(fix.__mro__[:-1]):
        for name, value in vars(mixin).items():
            if name not in _NOT_COPIED:
                setattr(cls, name, _super_of(value, cls))
    return cls


def _super_of(value: Any, cls: type) -> Any:
    """`value`, a mixin's attribute, for `cls`: a function whose zero-argument `super()` names the mixin is copied
    with `cls` in its place (its `__class__` cell)."""
    if not isinstance(value, types.FunctionType) or "__class__" not in value.__code__.co_freevars:
        return value
    cells = tuple(types.CellType(cls) if name == "__class__" else cell
                  for name, cell in zip(value.__code__.co_freevars, value.__closure__ or ()))
    fn = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, cells)
    fn.__kwdefaults__, fn.__qualname__, fn.__doc__ = value.__kwdefaults__, value.__qualname__, value.__doc__
    return fn
