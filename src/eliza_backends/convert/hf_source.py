"""A source Hugging Face checkpoint folder with its model family: :class:`HFSource` reads the
folder (:class:`~.hf_folder.HFFolder`) and looks its ``model_type`` up in :mod:`.families`,
which turns ``config.json`` into :class:`~.facts.ModelFacts`."""

from __future__ import annotations

from . import families
from .facts import ModelFacts
from .hf_folder import HFFolder, folder_sha256


class HFSource(HFFolder):
    """A Hugging Face checkpoint folder of a family the converter maps (``family``; its
    ``architecture``). :class:`~..errors.BundleError` for a folder without ``config.json`` or
    safetensors weights, or of a ``model_type`` no family converts."""

    family: families.ModelFamily
    architecture: str

    def _identify(self) -> None:
        self.family = families.for_model_type(self.config.get("model_type"), self.path)
        self.architecture = self.family.architecture

    def facts(self) -> ModelFacts:
        """The model's :class:`ModelFacts` (end ids: the folder's own; llama.cpp's view of
        them is read later from the GGUF written from it)."""
        return self.family.model_facts(self)


__all__ = ["HFSource", "folder_sha256"]
