"""The generation machinery a session runs on, independent of any runtime: the speculative
loop and its draft policy, the sampler, the KV cursor, UTF-8 text assembly and slot files.

Plugins reach these through the plugin kit (:mod:`eliza_backends.backend`)."""
