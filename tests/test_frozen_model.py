"""``FrozenModel`` (issue 42): the fast path (no pydantic) and the pydantic reference built from
the same declarations agree on every field of ``StreamConfig`` and of the in-tree plugins'
options models, over values at and around every bound and of every type a caller may pass;
errors keep pydantic's wording; instances are frozen, comparable, picklable; a plugin's own
pydantic options model still works."""

from __future__ import annotations

import copy
import math
import pickle
from types import MappingProxyType
from typing import Any, Literal

import pytest
from eliza_litert.options import LiteRTOptions
from eliza_llamacpp.options import LlamaCppOptions
from eliza_mlx.options import MLXOptions

from eliza_backends import InvalidArgumentError, StreamConfig
from eliza_backends.frozen_model import Field, FieldSpec, FrozenModel

MODELS: list[type[FrozenModel]] = [StreamConfig, LlamaCppOptions, LiteRTOptions, MLXOptions]
#: Values of every kind a caller may hand a field (the bounds' neighbours are added per field).
PROBES: list[Any] = [
    None, True, False, 0, 1, -1, 7, 2.5, 1.0, -0.5, math.nan, math.inf, "", "x", "5", "auto",
    "none", "image", "f16", "q8_0", "on", "interpreter", (), ("a",), ["a", "b"], [""], [1],
    ("a", 2), frozenset({"image"}), {"image", "audio"}, ["image"], ["video"], {}, {"a": 1},
    {"llama.cpp": {"n_gpu_layers": 1}}, {"x": 1}, {1: 2}, MappingProxyType({"type": "x"}),
    {"type": "json_object"}, 1 << 40, b"x",
]


def _bound_probes(spec: FieldSpec) -> list[Any]:
    out: list[Any] = []
    for bound in (spec.ge, spec.gt, spec.le, spec.lt):
        if bound is not None:
            out += [bound - 1, bound, bound + 1, float(bound), bound - 1e-9, bound + 1e-9]
    return out


def _outcome(run: Any) -> tuple[str, Any]:
    try:
        made = run()
    except InvalidArgumentError as exc:
        return "error", exc.message
    return "ok", {k: (type(v), v) for k, v in made.model_dump().items()}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_fast_path_and_reference_agree_on_every_field(model: type[FrozenModel]) -> None:
    """Every value alone in its field: the fast path either hands it to the reference (whose
    outcome is then the outcome) or stores exactly what the reference stores."""
    reference = model._reference_model()
    for name, spec in model.model_fields.items():
        for value in [*PROBES, *_bound_probes(spec)]:
            data = {name: value}
            if model is StreamConfig and name == "batch_size":
                data["context_size"] = 1 << 20  # the batch may not exceed the context
            fast = _outcome(lambda: model.model_validate(data))  # noqa: B023
            try:
                want = reference.model_validate(model.normalize(dict(data)))
            except Exception:
                assert fast[0] == "error", (model.__name__, name, value, fast)
                continue
            assert fast == ("ok", {k: (type(getattr(want, k)), getattr(want, k))
                                   for k in model.model_fields}), (model.__name__, name, value)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_default_passes_the_fast_path(model: type[FrozenModel]) -> None:
    """A default config (and a copy of any valid one) never needs pydantic."""
    from eliza_backends.frozen_model import _DOUBT

    checks = model._fast_checks()
    for name, spec in model.model_fields.items():
        assert checks[name](spec.make_default()) is not _DOUBT, (model.__name__, name)


def test_well_typed_input_never_builds_the_reference() -> None:
    class Fresh(FrozenModel):
        size: int = Field(4, ge=1, description="A size.")
        names: tuple[str, ...] = Field((), description="Names.")

    assert Fresh(size=8, names=["a"]).names == ("a",)
    assert Fresh._reference is None
    with pytest.raises(InvalidArgumentError, match="greater than or equal to 1"):
        Fresh(size=0)
    assert Fresh._reference is not None
    assert Fresh(size="9").size == 9  # pydantic's coercion, through the reference


@pytest.mark.parametrize(("data", "message"), [
    ({"context_size": 0, "nonsense": 1},
     "invalid StreamConfig: context_size: Input should be greater than or equal to 16; "
     "nonsense: unknown field (check the spelling; see the field list in the docs)"),
    ({"batch_size": 4096, "context_size": 1024},
     "invalid StreamConfig: StreamConfig: batch_size (4096) cannot exceed context_size (1024)"),
    ({"max_tokens": "many"}, "invalid StreamConfig: max_tokens: Input should be a valid "
     "integer, unable to parse string as an integer"),
    ({"drafter": "magic"}, "invalid StreamConfig: drafter: Input should be 'none', 'ngram', "
     "'model' or 'mtp'"),
])
def test_errors_keep_pydantic_wording(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        StreamConfig(**data)
    assert info.value.message == message


def test_options_errors_name_the_backend() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        LlamaCppOptions.model_validate({"kv_cache_type": "q8_0", "flash_attention": "off"},
                                       what="options for llama.cpp")
    assert info.value.message.startswith("invalid options for llama.cpp: options for llama.cpp:"
                                         " kv_cache_type 'q8_0' needs flash_attention")


def test_instances_are_frozen_values() -> None:
    cfg = StreamConfig(stop="END", options={"llama.cpp": MappingProxyType({"n_ubatch": 8})})
    assert cfg.stop == ("END",) and cfg.options == {"llama.cpp": {"n_ubatch": 8}}
    with pytest.raises(ValueError, match=r"frozen.*StreamConfig\.build\(config, seed=\.\.\.\)"):
        cfg.seed = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="frozen"):
        del cfg.seed
    assert pickle.loads(pickle.dumps(cfg)) == cfg == copy.deepcopy(cfg)
    assert cfg != StreamConfig.build(cfg, seed=1)
    assert StreamConfig.build(cfg).model_dump() == cfg.model_dump()
    assert hash(LlamaCppOptions()) == hash(LlamaCppOptions())
    with pytest.raises(TypeError, match="unhashable"):  # as the pydantic model: a dict field
        hash(cfg)
    assert repr(MLXOptions()) == "MLXOptions(engine='auto', artifact=None, compute_units='all')"


def test_annotations_read_before_any_validation() -> None:
    """What docs/hooks/options_tables.py reads from a plugin's options model."""
    class Fresh(FrozenModel):
        mode: Literal["a", "b"] = Field("a", description="A mode.")

    assert Fresh._checks is None
    assert Fresh.model_fields["mode"].annotation == Literal["a", "b"]
    assert Fresh.model_fields["mode"].description == "A mode."


def test_model_fields_describe_the_declarations() -> None:
    fields = StreamConfig.model_fields
    assert fields["context_size"].default == 2048 and fields["context_size"].ge == 16
    assert fields["options"].make_default() == {} and not fields["options"].is_required()
    StreamConfig()  # the annotations are evaluated on first validation
    assert fields["stop"].annotation == tuple[str, ...]
    assert "greedy" in (fields["temperature"].description or "")


def test_a_plugins_pydantic_options_model_still_validates() -> None:
    from pydantic import BaseModel, ConfigDict
    from pydantic import Field as PydanticField

    from eliza_backends.backend import Factory

    class EchoOptions(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        delay: float = PydanticField(0.0, ge=0.0)

    class Echo(Factory):
        name = "echo-test"
        options_model = EchoOptions

        def available(self) -> Any:
            raise AssertionError

        def open(self, context: Any, config: StreamConfig) -> Any:
            raise AssertionError

    echo = Echo()
    assert echo.parse_options(StreamConfig(options={"echo-test": {"delay": 0.5}})).delay == 0.5
    with pytest.raises(InvalidArgumentError, match="invalid options for echo-test: delay"):
        echo.parse_options(StreamConfig(options={"echo-test": {"delay": -1}}))
