"""The OpenAI-shaped API over streams: the request/response models (:mod:`.types`),
``completion`` / ``chat_completion`` (:mod:`.completions`) and tool calls (:mod:`.tools`).
The HTTP server (:mod:`eliza_backends.server`) and Ray Serve (:mod:`eliza_backends.ray`) are
built on it.

Every import in this package is absolute or relative to ``eliza_backends``, so it never
shadows the ``openai`` client package."""
