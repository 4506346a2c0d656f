"""Frozen, validated settings objects that do not import pydantic to validate well-typed input.

:class:`FrozenModel` is the base of :class:`~eliza_backends.config.StreamConfig` and of the
plugins' options models. A subclass declares its fields as pydantic's ``BaseModel`` does
(``name: type = Field(default, ge=..., description=...)``) and may override :meth:`check`
(the cross-field rules, a pydantic ``model_validator(mode="after")``) and :meth:`normalize`
(a ``mode="before"`` rewrite of the raw input). Validation has two paths with one outcome:

- the fast path (no pydantic import: pydantic and its plugin scan are most of what opening a
  stream used to import) accepts input that is already of the declared types and within the
  bounds: ``int`` (not ``bool``), ``float`` (or ``int``, made a float), ``bool``, ``str``,
  ``Literal``, ``X | None`` and other unions, ``tuple[X, ...]``, ``frozenset[X]``,
  ``Mapping[K, V]`` (copied into a ``dict``) and ``Any``;
- anything else (a field it does not know, a value of another type that pydantic would coerce
  or refuse, a bound or a :meth:`check` that fails) goes to the reference: a pydantic model
  built once, on first need, from the same declarations. Its coercions are taken and its
  errors raised as :class:`~eliza_backends.errors.InvalidArgumentError` with
  :func:`~eliza_backends.errors.describe_validation_error`'s one line per problem, so messages
  and coercions are pydantic's, exactly as when these classes were pydantic models.

The fast path never refuses and never coerces differently from the reference: it accepts only
what the reference returns unchanged (tests/test_frozen_model.py checks the two agree).
Instances are immutable (assigning raises ``InvalidArgumentError``, a ``ValueError``),
compare and hash by value (hashing fails, as pydantic's does, on a ``dict`` value), copy and
serialize with the standard library's defaults (no custom reduction), and offer pydantic's
``model_fields`` (name -> :class:`FieldSpec`: ``annotation``, ``default``, ``description``,
``is_required()``), ``model_validate`` and ``model_dump``.
Thread-safe: the reference model and the evaluated annotations are built under a lock.
"""

from __future__ import annotations

import math
import threading
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from .errors import InvalidArgumentError, describe_validation_error

M = TypeVar("M", bound="FrozenModel")
#: A fast check: the value to store, or :data:`_DOUBT` where the reference must decide.
Check = Callable[[Any], Any]
_DOUBT: Any = object()
_MISSING: Any = object()
_LOCK = threading.RLock()


class FieldSpec:
    """One declared field: its default (or ``default_factory``), bounds and description, and
    its evaluated ``annotation`` (the class's annotations are evaluated on first need: its
    first validation or a read of ``annotation``). What ``Field()`` returns (typed ``Any`` so
    that ``x: int = Field(...)`` type-checks, as pydantic's does)."""

    __slots__ = ("_annotation", "default", "default_factory", "description", "ge", "gt", "le",
                 "lt", "owner")

    def __init__(self, default: Any = _MISSING, *, default_factory: Callable[[], Any] | None
                 = None, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, lt: float | None = None,
                 description: str | None = None) -> None:
        self.default = None if default is _MISSING and default_factory is not None else default
        self.default_factory = default_factory
        self.ge, self.gt, self.le, self.lt = ge, gt, le, lt
        self.description = description
        self._annotation: Any = _MISSING
        self.owner: type[FrozenModel] | None = None

    @property
    def annotation(self) -> Any:
        """The field's type (None for a spec no class declared)."""
        if self._annotation is _MISSING and self.owner is not None:
            self.owner._fast_checks()
        return None if self._annotation is _MISSING else self._annotation

    def is_required(self) -> bool:
        """True when the field has neither a default nor a default factory."""
        return self.default is _MISSING and self.default_factory is None

    def make_default(self) -> Any:
        """The value of an omitted field."""
        return self.default_factory() if self.default_factory is not None else self.default

    def in_bounds(self, value: Any) -> bool:
        """Whether ``value`` meets every bound (written so that NaN meets none)."""
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le)
                and (self.lt is None or value < self.lt))

    def pydantic_field(self) -> Any:
        """The same declaration as a pydantic ``Field`` (for the reference model)."""
        from pydantic import Field as PydanticField

        bounds = {k: getattr(self, k) for k in ("ge", "gt", "le", "lt")
                  if getattr(self, k) is not None}
        if self.default_factory is not None:
            return PydanticField(default_factory=self.default_factory,
                                 description=self.description, **bounds)
        default = ... if self.is_required() else self.default
        return PydanticField(default, description=self.description, **bounds)


def Field(default: Any = _MISSING, *, default_factory: Callable[[], Any] | None = None,
          ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None, description: str | None = None) -> Any:
    """Declare a field of a :class:`FrozenModel` (pydantic's ``Field`` keywords, a subset)."""
    return FieldSpec(default, default_factory=default_factory, ge=ge, gt=gt, le=le, lt=lt,
                     description=description)


def _union_check(arms: tuple[Check, ...]) -> Check:
    def check(value: Any) -> Any:
        for arm in arms:  # the fast checks take exact types: at most one arm accepts
            out = arm(value)
            if out is not _DOUBT:
                return out
        return _DOUBT
    return check


def _has_doubt(values: Any) -> bool:
    return any(v is _DOUBT for v in values)


def _container_check(origin: Any, args: tuple[Any, ...]) -> Check | None:
    """Checks of ``tuple[X, ...]``, ``frozenset[X]`` and ``Mapping[K, V]``; None for others."""
    import collections.abc as abc

    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = fast_check(args[0])
        return lambda v: (tuple(out) if type(v) in (tuple, list)
                          and not _has_doubt(out := [item(x) for x in v]) else _DOUBT)
    if origin is frozenset and len(args) == 1:
        member = fast_check(args[0])
        return lambda v: (frozenset(out) if type(v) in (frozenset, set, list, tuple)
                          and not _has_doubt(out := [member(x) for x in v]) else _DOUBT)
    if origin in (abc.Mapping, dict) and len(args) == 2:
        key, val = fast_check(args[0]), fast_check(args[1])

        def mapping(v: Any) -> Any:
            if not isinstance(v, abc.Mapping):
                return _DOUBT
            out = {key(k): val(x) for k, x in v.items()}
            return _DOUBT if _has_doubt(out) or _has_doubt(out.values()) else out
        return mapping
    return None


def fast_check(annotation: Any, spec: FieldSpec | None = None) -> Check:
    """The fast check of ``annotation`` (with ``spec``'s bounds on a number): the value the
    reference would store for an input it accepts unchanged, else ``_DOUBT``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return lambda v: v
    if annotation is type(None):
        return lambda v: None if v is None else _DOUBT
    if origin is typing.Literal:
        return lambda v: v if any(type(v) is type(a) and v == a for a in args) else _DOUBT
    if origin in (typing.Union, types.UnionType):
        return _union_check(tuple(fast_check(arm, spec) for arm in args))
    if origin is not None:
        return _container_check(origin, args) or (lambda v: _DOUBT)
    if annotation in (int, float):
        return _number_check(annotation, spec)
    if annotation in (bool, str):
        return lambda v: v if type(v) is annotation else _DOUBT
    return lambda v: _DOUBT


def _number_check(kind: type[int] | type[float], spec: FieldSpec | None) -> Check:
    """An ``int`` (not a ``bool``), or a finite ``float`` or ``int`` for ``float`` (stored as
    a float), within ``spec``'s bounds."""
    def in_bounds(value: Any) -> bool:
        return spec is None or spec.in_bounds(value)

    if kind is int:
        return lambda v: v if type(v) is int and in_bounds(v) else _DOUBT
    return lambda v: (float(v) if type(v) in (float, int) and math.isfinite(v) and in_bounds(v)
                      else _DOUBT)


class FrozenModel:
    """Base of a frozen settings class (see the module docstring): ``Sub(**fields)``,
    ``Sub.model_validate(mapping)``, ``sub.model_dump()``, ``Sub.model_fields``."""

    model_fields: ClassVar[dict[str, FieldSpec]] = {}
    #: How to make a changed copy, for the error an assignment raises ({cls}, {name}).
    changed_copy: ClassVar[str] = "{cls}.model_validate({{**old.model_dump(), '{name}': new}})"
    _checks: ClassVar[dict[str, Check] | None] = None
    _reference: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        import inspect  # already imported by dataclasses, which the open path uses

        fields = dict(cls.model_fields)  # a subclass of a model keeps its parent's fields
        for name, annotation in inspect.get_annotations(cls).items():
            value = cls.__dict__.get(name, _MISSING)
            if isinstance(value, FieldSpec):
                fields[name] = value
                delattr(cls, name)  # instances store the value; no class-level default
            elif not name.startswith("_") and "ClassVar" not in str(annotation):
                fields[name] = FieldSpec(value)
            else:
                continue
            fields[name].owner = cls
        cls.model_fields = fields
        cls._checks = None
        cls._reference = None

    def __init__(self, **data: Any) -> None:
        """Validate ``data``; problems raise :class:`InvalidArgumentError`, one line each."""
        values = self._validated(data, type(self).__name__)
        object.__setattr__(self, "__dict__", values)

    # ---------------------------------------------------------------- hooks for subclasses

    @classmethod
    def normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Rewrite the raw input before validation (pydantic's ``mode="before"``); the
        default returns it as it is."""
        return data

    def check(self) -> None:
        """Cross-field rules, run on the validated values: raise ``ValueError`` with the
        message to report. The default has none."""

    # ---------------------------------------------------------------- the public API

    @classmethod
    def model_validate(cls: type[M], data: Mapping[str, Any], *, what: str | None = None
                       ) -> M:
        """An instance from a mapping; errors name ``what`` (default: the class name)."""
        self = cls.__new__(cls)
        object.__setattr__(self, "__dict__", cls._validated(dict(data), what or cls.__name__))
        return self

    def model_dump(self) -> dict[str, Any]:
        """The fields' values by name (a new dict; the values themselves are not copied)."""
        return dict(self.__dict__)

    def __setattr__(self, name: str, value: Any) -> None:
        raise InvalidArgumentError(
            f"{type(self).__name__} is frozen: make a changed copy, "
            + self.changed_copy.format(cls=type(self).__name__, name=name))

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.__dict__.values())))

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({body})"

    # ---------------------------------------------------------------- validation

    @classmethod
    def _validated(cls, data: dict[str, Any], what: str) -> dict[str, Any]:
        """The fields' values from ``data``: the fast path, else the reference's."""
        data = cls.normalize(data)
        values = cls._fast_values(data)
        if values is not None:
            probe = cls.__new__(cls)
            object.__setattr__(probe, "__dict__", values)
            try:
                probe.check()
            except ValueError:
                values = None  # the reference reports it, worded as pydantic words it
        return values if values is not None else cls._reference_values(data, what)

    @classmethod
    def _fast_values(cls, data: dict[str, Any]) -> dict[str, Any] | None:
        """Every field's value by its fast check (defaults for the missing), or None when a
        key is not a field or a check is in doubt."""
        checks = cls._fast_checks()
        if not data.keys() <= checks.keys():
            return None
        values: dict[str, Any] = {}
        for name, spec in cls.model_fields.items():
            raw = data.get(name, _MISSING)
            out = spec.make_default() if raw is _MISSING else checks[name](raw)
            if out is _DOUBT:
                return None
            values[name] = out
        return values

    @classmethod
    def _fast_checks(cls) -> dict[str, Check]:
        """Each field's fast check (the annotations evaluated once per class)."""
        checks = cls._checks
        if checks is None:
            with _LOCK:
                hints = typing.get_type_hints(cls)
                for name, spec in cls.model_fields.items():
                    spec._annotation = hints[name]
                checks = {name: fast_check(spec.annotation, spec)
                          for name, spec in cls.model_fields.items()}
                cls._checks = checks
        return checks

    @classmethod
    def _reference_values(cls, data: dict[str, Any], what: str) -> dict[str, Any]:
        """The reference pydantic model's values for ``data``, or its errors raised."""
        from pydantic import ValidationError

        try:
            model = cls._reference_model().model_validate(data)
        except ValidationError as exc:
            raise InvalidArgumentError(describe_validation_error(exc, what)) from None
        return {name: getattr(model, name) for name in cls.model_fields}

    @classmethod
    def _reference_model(cls) -> Any:
        """The pydantic model of the same declarations (built on first need)."""
        if cls._reference is None:
            cls._fast_checks()
            with _LOCK:
                if cls._reference is None:
                    cls._reference = _build_reference(cls)
        return cls._reference


def _build_reference(cls: type[FrozenModel]) -> Any:
    from pydantic import ConfigDict, create_model, model_validator

    def check(model: Any) -> Any:
        probe = cls.__new__(cls)
        object.__setattr__(probe, "__dict__",
                           {name: getattr(model, name) for name in cls.model_fields})
        probe.check()
        return model

    fields: dict[str, Any] = {name: (spec.annotation, spec.pydantic_field())
                              for name, spec in cls.model_fields.items()}
    validators: dict[str, Any] = {"check": model_validator(mode="after")(check)}
    return create_model(cls.__name__, __config__=ConfigDict(frozen=True, extra="forbid"),
                        __validators__=validators, **fields)


__all__ = ["Field", "FieldSpec", "FrozenModel", "fast_check"]
