"""From messages and text to token ids: chat templates (:mod:`.chat`), chat rendering to ids
(:mod:`.chat_tokens`) and the bundle tokenizers (:mod:`.tokenizer`, :mod:`.hf_tokenizer`,
:mod:`.sp_tokenizer`)."""
