"""The allowed values of each numeric config key, declared on the schema's fields.

A numeric field of a config class carries its domain in its metadata::

    capacity: int = within(100_000, POSITIVE)

and :func:`violations` checks every numeric field of a built config against its
domain (:func:`dreamer.config.validate.validate` raises the first, one line naming
the key and its range). A subclass that only changes a field's default keeps its
base's domain (looked up along the class's MRO).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

DOMAIN = "domain"  # the metadata key of a field's Range


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (None: unbounded on that side), each end
    included unless marked open; finite always (nan and inf are never allowed).
    ``what`` names the kind of value in the error ("an EMA rate"); ``null`` says
    what null means for an Optional key ("no limit")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    what: str | None = None
    null: str | None = None

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """``> 0``, ``>= 0``, ``in [0, 1)``, ..."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"

    def violation(self, key: str, value: Any) -> str:
        rule = f"must be {self.describe()}" + (f" (or null for {self.null})" if self.null else "")
        return f"{key}={value} is {self.what}: it {rule}" if self.what else f"{key}={value} {rule}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
PROBABILITY = Range(0.0, 1.0)
FRACTION = Range(0.0, 1.0, high_open=True)  # [0, 1): a share that must leave something
EMA_RATE = Range(0, 1, low_open=True, what="an EMA rate")
# Seeds: derived seeds (seed + 10**6 + env index for evaluation, + 100_000 per rank for
# collectors) must stay below 2**32, where numpy and dm_control take them.
SEED = Range(0, 2**31 - 1)


def within(default: Any = dataclasses.MISSING, domain: Range | None = None) -> Any:
    """A dataclass field with ``default`` whose values must lie in ``domain``."""
    if domain is None:
        raise TypeError("within() needs the field's domain")
    return dataclasses.field(default=default, metadata={DOMAIN: domain})


def domain_of(cls: type, name: str) -> Range | None:
    """The Range declared for field ``name`` on ``cls`` or the nearest base that declares one."""
    for klass in cls.__mro__:
        spec = getattr(klass, "__dataclass_fields__", {}).get(name)
        if spec is not None and DOMAIN in spec.metadata:
            return spec.metadata[DOMAIN]
    return None


def is_numeric(tp: Any) -> bool:
    """int, float, or an Optional of one (bool is not a number here)."""
    if typing.get_origin(tp) is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(args) == 1 and is_numeric(args[0])
    return tp in (int, float)


@functools.lru_cache(maxsize=None)
def numeric_fields(cls: type) -> tuple[str, ...]:
    """The names of ``cls``'s numeric fields (not of its nested sections)."""
    hints = typing.get_type_hints(cls)
    return tuple(f.name for f in dataclasses.fields(cls) if is_numeric(hints[f.name]))


def violations(cfg: Any, prefix: str = "") -> Iterator[str]:
    """One line per numeric value of ``cfg`` (and its nested sections, by their runtime
    class) outside its field's domain (no numeric key is a Python keyword: keys are field names)."""
    numeric = numeric_fields(type(cfg))
    for spec in dataclasses.fields(cfg):
        value = getattr(cfg, spec.name)
        key = prefix + spec.name
        if dataclasses.is_dataclass(value):
            yield from violations(value, key + ".")
        elif spec.name in numeric and value is not None:
            domain: Optional[Range] = domain_of(type(cfg), spec.name)
            if domain is not None and value not in domain:
                yield domain.violation(key, value)
