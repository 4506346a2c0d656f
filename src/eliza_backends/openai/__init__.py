"""The OpenAI-shaped API over streams, split as vLLM splits its ``entrypoints/openai``: one
generation core (:mod:`.generation`) that every front-end drives; one module per API front-end
turning its request into the core's job (:mod:`.chat` for ``/v1/chat/completions``,
:mod:`.completions` for ``/v1/completions``, :mod:`.responses` for OpenAI's ``/v1/responses``,
:mod:`.anthropic_messages` for Anthropic's ``/v1/messages``: the last two as the equivalent
chat request); the request/response models (:mod:`.types`, :mod:`.responses_types`,
:mod:`.anthropic_types`); the answer shapes, one :class:`~.formatting.Formatter` per API
(:mod:`.formatting`, :mod:`.responses_events`, :mod:`.anthropic_events`) and the stored
responses (:mod:`.response_store`); tool calls (:mod:`.tools`; Gemma 4's own syntax:
:mod:`.gemma4_calls`, :mod:`.gemma4_reader`, :mod:`.gemma4_values`, :mod:`.gemma4_grammar`); and the
in-process API, ``completion`` / ``chat_completion`` (:mod:`.local`), ``responses`` /
``messages`` (:mod:`.local_fronts`). The HTTP server (:mod:`eliza_backends.server`) and Ray
(:mod:`eliza_backends.ray`) are built on it; the keys they share with it (which session fits a
request, the model's id) are :mod:`eliza_backends.serving`'s.

Every import in this package is absolute or relative to ``eliza_backends``, so it never
shadows the ``openai`` client package."""
