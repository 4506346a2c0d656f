"""The conformance kit: test classes that check a backend against the whole contract.

A plugin author subclasses :class:`BackendConformance` in their test suite and provides two
fixtures, ``factory`` (a Factory instance) and ``bundle_dir`` (a bundle it can serve)::

    import pytest
    from eliza_backends.testing import BackendConformance
    from my_backend_plugin import MyFactory

    class TestMyBackend(BackendConformance):
        @pytest.fixture
        def factory(self):
            return MyFactory()

        @pytest.fixture
        def bundle_dir(self):
            return Path("tests/data/my-bundle")

Optional overrides: ``base_config`` (a dict of StreamConfig fields), ``prompt_text``.
Checks that depend on an optional feature are skipped with the reason when
``session.capabilities`` says the feature is absent, never silently.

:class:`BackendConformance` is the aggregate of one mixin per area (as fsspec's abstract tests
and pandas' extension tests), each in a module of its own, so that one area reads alone:

* ``fixtures``: :class:`KitFixtures`, the fixtures every check uses;
* ``factory``: :class:`FactoryChecks`, the factory describes itself, honest capabilities;
* ``generation``: :class:`GenerationChecks`, prefill, steps, budget, stop strings, a full
  context;
* ``rewind``: :class:`RewindChecks`, ``reset`` and ``reset_keep``;
* ``cancel``: :class:`CancelChecks`, ``cancel()`` from another thread, one consumer;
* ``slots``: :class:`SlotChecks`, slot round trips, bad slot files;
* ``inputs``: :class:`InputChecks`, bad ids, call order, overflow, tokenization;
* ``speculative``: :class:`SpeculativeChecks`, drafters keep greedy output;
* ``sampling``: :class:`SamplingChecks`, seeded sampling;
* ``chat``: :class:`ChatChecks`, chat ids, no forged control tokens;
* ``logits``: :class:`LogitsChecks`, constraints and logprobs, or their refusal;
* ``media``: :class:`MediaChecks`, media kinds declared honestly, refused in the core or part
  of the sequence.

The helpers the checks share (:func:`run_to_end`, :func:`generated_tokens`,
:func:`long_prompt`) are in ``testing.helpers``. Import everything from
``eliza_backends.testing`` itself: the modules are its layout, not its API. While developing a
backend, subclass only the mixins you are working on (each brings the fixtures through
:class:`KitFixtures`); in the plugin's suite subclass the aggregate, so a check added to the
kit is never missed. The kit uses only the public API of sessions and factories.

This package is registered as a pytest plugin (``pytest11`` entry point); importing it outside
pytest is not supported.
"""

from __future__ import annotations

from .cancel import CancelChecks
from .chat import ChatChecks
from .factory import FactoryChecks
from .fixtures import KitFixtures
from .generation import GenerationChecks
from .helpers import generated_tokens, long_prompt, run_to_end
from .inputs import InputChecks
from .logits import LogitsChecks
from .media import MediaChecks
from .rewind import RewindChecks
from .sampling import SamplingChecks
from .slots import SlotChecks
from .speculative import SpeculativeChecks


class BackendConformance(FactoryChecks, GenerationChecks, RewindChecks, CancelChecks,
                         SlotChecks, InputChecks, SpeculativeChecks, SamplingChecks, ChatChecks,
                         LogitsChecks, MediaChecks):
    """Every contract check for one backend. Subclass and provide ``factory`` and
    ``bundle_dir`` fixtures (see :class:`KitFixtures`)."""


__all__ = ["BackendConformance", "CancelChecks", "ChatChecks", "FactoryChecks",
           "GenerationChecks", "InputChecks", "KitFixtures", "LogitsChecks", "MediaChecks",
           "RewindChecks",
           "SamplingChecks",
           "SlotChecks", "SpeculativeChecks", "generated_tokens", "long_prompt", "run_to_end"]
