"""Pure-Python readers for the LiteRT artifacts, run before any runtime sees a file.

``.litertlm`` (LiteRT-LM container, format 1.x)::

    b"LITERTLM"            8-byte magic
    u32 major, minor, patch
    (pad to 24)
    u64 header_end         end of the header flatbuffer
    [32, header_end)       LiteRTLMMetaData flatbuffer: system metadata, section table
    sections               each [begin, end) in the file, 16 KiB aligned: TFLiteModel,
                           HF_Tokenizer_Zlib (u64 size + zlib tokenizer.json), SP_Tokenizer,
                           LlmMetadataProto (start/stop tokens, max tokens, chat template), ...

The header flatbuffer and the LlmMetadata protobuf are decoded here with bounds checks (no
flatbuffers/protobuf dependency, no generated code); anything malformed is a
:class:`~eliza_backends.BundleError`. ``.tflite`` files are checked for their flatbuffer
structure (every table, offset and index the runtimes read, :mod:`.tflite_check`) before a
runtime loads them. Both flatbuffers are read with :mod:`.flatbuffer`.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from eliza_backends import BundleError
from eliza_backends.backend import HFTokenizer, SPTokenizer, Tokenizer

from .flatbuffer import Flatbuffer, FlatbufferError
from .tflite_check import check_tflite_buffer

MAGIC = b"LITERTLM"
HEADER_BEGIN = 32
_MAX_HEADER = 64 << 20
_MAX_TOKENIZER = 256 << 20

#: AnySectionDataType values of the LiteRT-LM header schema.
SECTION_TYPES = {
    0: "NONE", 1: "GenericBinaryData", 2: "Deprecated", 3: "TFLiteModel", 4: "SP_Tokenizer",
    5: "LlmMetadataProto", 6: "HF_Tokenizer_Zlib", 7: "TFLiteWeights",
    8: "EmbeddingMetadataProto", 9: "ExecutorMetadataProto", 10: "TtsMetadataProto",
    11: "AsrMetadataProto",
}
_VDATA_STRING = 9


@dataclass(frozen=True)
class Section:
    """One section of a ``.litertlm``: its type, byte range and string items."""

    index: int
    data_type: str
    begin: int
    end: int
    items: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Bytes in the section."""
        return self.end - self.begin


@dataclass(frozen=True)
class LlmMetadata:
    """The fields of LiteRT-LM's ``LlmMetadata`` proto this backend uses."""

    start_token_ids: tuple[int, ...] = ()
    start_token_str: str | None = None
    stop_token_ids: tuple[tuple[int, ...], ...] = ()
    stop_token_strs: tuple[str, ...] = ()
    max_num_tokens: int | None = None
    jinja_prompt_template: str | None = None
    #: ``llm_model_type``'s case (``gemma4``, ``generic_model``, ...); None when absent
    model_type: str | None = None
    #: the vision patchify settings of a model type in :data:`PATCHIFY_FIELDS`: (patch
    #: width, patch height, max_num_patches); None when the container does not set all three
    vision_patchify: tuple[int, int, int] | None = None


#: LiteRT-LM's ``LlmModelType`` oneof: field number -> case name (litert-lm 0.18)
MODEL_TYPES = {1: "generic_model", 2: "gemma3n", 3: "function_gemma", 4: "gemma3", 5: "qwen3",
               7: "qwen2p5", 8: "gemma4", 9: "fast_vlm", 11: "lfm2", 12: "minicpm5",
               13: "minicpmv4"}
#: per ``llm_model_type`` case, the field numbers of its vision patchify settings: patch
#: width, patch height, max_num_patches (what LiteRT-LM's image preprocessor resizes to;
#: litert-torch 0.10 writes them for Gemma 4)
PATCHIFY_FIELDS = {"gemma4": (15, 16, 17)}


@dataclass(frozen=True)
class Container:
    """A parsed ``.litertlm``: version and sections (nothing but the header is read)."""

    path: Path
    version: tuple[int, int, int]
    size: int
    sections: tuple[Section, ...]

    def find(self, data_type: str, **items: str) -> Section | None:
        """The first section of ``data_type`` whose items match ``items``."""
        for s in self.sections:
            if s.data_type == data_type and all(s.items.get(k) == v for k, v in items.items()):
                return s
        return None

    def read(self, section: Section) -> bytes:
        """The bytes of one section."""
        with open(self.path, "rb") as f:
            f.seek(section.begin)
            data = f.read(section.size)
        if len(data) != section.size:
            raise _bad(self.path, f"section {section.index} is truncated")
        return data

    def tflite_section(self) -> Section:
        """The prefill/decode TFLite model's section (the first TFLiteModel one otherwise)."""
        sec = self.find("TFLiteModel", model_type="tf_lite_prefill_decode") or \
            self.find("TFLiteModel")
        if sec is None:
            raise _bad(self.path, "it holds no TFLiteModel section")
        return sec

    def tflite_model(self) -> bytes:
        """A copy of the prefill/decode TFLite model (checked like a ``.tflite`` file); the
        runtimes map it instead (:mod:`eliza_litert.model_files`)."""
        sec = self.tflite_section()
        data = self.read(sec)
        check_tflite_bytes(data, f"{self.path} (section {sec.index})")
        return data

    def check_tflite_section(self) -> None:
        """Validate the prefill/decode TFLite section in place (memory-mapped, not copied)."""
        sec = self.tflite_section()
        with open(self.path, "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)[sec.begin:sec.end]
            try:
                check_tflite_buffer(view, f"{self.path} (section {sec.index})")
            finally:
                view.release()

    def hf_tokenizer_json(self) -> str | None:
        """The HF ``tokenizer.json`` text, if the container has one."""
        sec = self.find("HF_Tokenizer_Zlib")
        if sec is None:
            return None
        data = self.read(sec)
        if len(data) < 8:
            raise _bad(self.path, "the tokenizer section is too short")
        (size,) = struct.unpack_from("<Q", data)
        if size > _MAX_TOKENIZER:
            raise _bad(self.path, f"the tokenizer claims {size} bytes")
        try:
            raw = zlib.decompressobj().decompress(data[8:], size + 1)
        except zlib.error as exc:
            raise _bad(self.path, f"the tokenizer section does not inflate ({exc})") from None
        if len(raw) != size:
            raise _bad(self.path, f"the tokenizer inflates to {len(raw)} bytes, not {size}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(self.path, "the tokenizer section is not UTF-8") from None

    def sp_tokenizer_model(self) -> bytes | None:
        """The serialized SentencePiece model of an SP_Tokenizer section, if there is one."""
        sec = self.find("SP_Tokenizer")
        if sec is None:
            return None
        if sec.size > _MAX_TOKENIZER:
            raise _bad(self.path, f"the SentencePiece section claims {sec.size} bytes")
        return self.read(sec)

    def llm_metadata(self) -> LlmMetadata:
        """The LlmMetadata proto (defaults when the container has none)."""
        sec = self.find("LlmMetadataProto")
        if sec is None:
            return LlmMetadata()
        return parse_llm_metadata(self.read(sec), self.path)


def _bad(path: Path | str, what: str) -> BundleError:
    return BundleError(f"{path} is not a valid LiteRT-LM (.litertlm) file: {what}. The file may "
                       "be truncated or corrupted; fetch or export it again")


def read_container(path: str | os.PathLike[str]) -> Container:
    """Parse and bounds-check the header of a ``.litertlm``; :class:`BundleError` if bad."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(HEADER_BEGIN)
            if len(head) < HEADER_BEGIN or head[:8] != MAGIC:
                raise _bad(p, "bad magic (expected b'LITERTLM')")
            major, minor, patch = struct.unpack_from("<III", head, 8)
            (header_end,) = struct.unpack_from("<Q", head, 24)
            if major != 1:
                raise _bad(p, f"unsupported format version {major}.{minor}.{patch} (reads 1.x)")
            if not HEADER_BEGIN + 8 <= header_end <= min(size, HEADER_BEGIN + _MAX_HEADER):
                raise _bad(p, f"header end {header_end} is outside the file ({size} bytes)")
            buf = f.read(header_end - HEADER_BEGIN)
    except OSError as exc:
        raise BundleError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        sections = _sections(Flatbuffer(buf, "header flatbuffer"), p, header_end, size)
    except FlatbufferError as exc:
        raise _bad(p, f"its header: {exc}") from None
    if not sections:
        raise _bad(p, "the header lists no sections")
    return Container(p, (major, minor, patch), size, tuple(sections))


def _sections(fb: Flatbuffer, p: Path, header_end: int, size: int) -> list[Section]:
    """The section table of a container's header flatbuffer (``LiteRTLMMetaData``)."""
    section_meta = fb.sub(fb.root(), 1)
    if section_meta is None:
        raise _bad(p, "the header has no section table")
    sections = []
    for i, obj in enumerate(fb.tables(section_meta, 0)):
        items: dict[str, str] = {}
        for kv in fb.tables(obj, 0):
            key = fb.string(kv, 0)
            if key is None or fb.scalar(kv, 1, "<B") != _VDATA_STRING:
                continue
            value = fb.sub(kv, 2)
            text = fb.string(value, 0) if value is not None else None
            if text is not None:
                items[key.decode("utf-8", "replace")] = text.decode("utf-8", "replace")
        begin, end = fb.scalar(obj, 1, "<Q"), fb.scalar(obj, 2, "<Q")
        dtype = SECTION_TYPES.get(fb.scalar(obj, 3, "<B"), "unknown")
        if not header_end <= begin <= end <= size:
            raise _bad(p, f"section {i} ({dtype}) spans bytes {begin}..{end} of a {size}-byte "
                       "file (truncated?)")
        sections.append(Section(i, dtype, begin, end, items))
    return sections


# ------------------------------------------------------------------------------ protobuf


def _varint(buf: bytes, pos: int, path: Path) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _bad(path, "the LlmMetadata proto is truncated")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _fields(buf: bytes, path: Path) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one protobuf message, in order."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, path)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, path)
            out.append((num, wire, value))
        elif wire == 2:
            n, pos = _varint(buf, pos, path)
            if pos + n > len(buf):
                raise _bad(path, "the LlmMetadata proto is truncated")
            out.append((num, wire, buf[pos:pos + n]))
            pos += n
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise _bad(path, f"the LlmMetadata proto has wire type {wire}")
    if pos != len(buf):
        raise _bad(path, "the LlmMetadata proto is truncated")
    return out


def _token_union(buf: bytes, path: Path) -> tuple[tuple[int, ...], str | None]:
    ids: list[int] = []
    text: str | None = None
    for num, _wire, value in _fields(buf, path):
        if num == 1 and isinstance(value, bytes):  # TokenIds
            for n2, w2, v2 in _fields(value, path):
                if n2 != 1:
                    continue
                if w2 == 0 and isinstance(v2, int):
                    ids.append(v2)
                elif isinstance(v2, bytes):  # packed
                    p = 0
                    while p < len(v2):
                        v, p = _varint(v2, p, path)
                        ids.append(v)
        elif num == 2 and isinstance(value, bytes):
            text = value.decode("utf-8", "replace")
    return tuple(ids), text


def parse_llm_metadata(data: bytes, path: Path | str = "LlmMetadata") -> LlmMetadata:
    """Decode the LlmMetadata fields this backend uses (start/stop tokens, limits, template)."""
    p = Path(path)
    start_ids: tuple[int, ...] = ()
    start_str: str | None = None
    stop_ids: list[tuple[int, ...]] = []
    stop_strs: list[str] = []
    max_tokens: int | None = None
    template: str | None = None
    model_type: str | None = None
    patchify: tuple[int, int, int] | None = None
    for num, _wire, value in _fields(data, p):
        if num == 1 and isinstance(value, bytes):
            start_ids, start_str = _token_union(value, p)
        elif num == 2 and isinstance(value, bytes):
            ids, text = _token_union(value, p)
            if ids:
                stop_ids.append(ids)
            if text is not None:
                stop_strs.append(text)
        elif num == 5 and isinstance(value, int):
            max_tokens = value
        elif num == 7 and isinstance(value, bytes):
            template = value.decode("utf-8", "replace")
        elif num == 6 and isinstance(value, bytes):
            cases = _fields(value, p)
            model_type = MODEL_TYPES.get(cases[0][0], f"type {cases[0][0]}") if cases else None
            fields = PATCHIFY_FIELDS.get(model_type or "")
            if fields is not None and isinstance(cases[0][2], bytes):
                patchify = _patchify(cases[0][2], fields, p)
    return LlmMetadata(start_ids, start_str, tuple(stop_ids), tuple(stop_strs), max_tokens,
                       template, model_type, patchify)


def _patchify(buf: bytes, fields: tuple[int, int, int],
              path: Path) -> tuple[int, int, int] | None:
    got = {n: v for n, _w, v in _fields(buf, path) if n in fields}
    values = [got.get(n) for n in fields]
    if all(isinstance(v, int) and v > 0 for v in values):
        return values[0], values[1], values[2]  # type: ignore[return-value]
    return None


# ------------------------------------------------------------------------------ .tflite


def check_tflite_bytes(data: bytes, name: str) -> None:
    """Refuse bytes that are not a structurally valid TFLite model (see :mod:`.tflite_check`)."""
    check_tflite_buffer(data, name)


def check_tflite(path: str | os.PathLike[str]) -> int:
    """Validate a ``.tflite`` file's flatbuffer (memory-mapped: the weights are not read);
    returns its size."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 16:
                raise BundleError(f"{p} is not a valid TFLite model: {size} bytes is too short "
                                  "for a flatbuffer. The file may be truncated; export it again")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                check_tflite_buffer(mapped, str(p))
    except OSError as exc:
        raise BundleError(f"cannot read {p}: {exc.strerror or exc}") from None
    return size


def container_tokenizer(container: Container) -> Tokenizer | None:
    """The container's tokenizer: its HF ``tokenizer.json`` section, else its SentencePiece
    section; None when it has neither."""
    spec = container.hf_tokenizer_json()
    if spec is not None:
        return HFTokenizer(spec)
    sp = container.sp_tokenizer_model()
    if sp is not None:
        return SPTokenizer(sp)
    return None


__all__ = [
    "Container",
    "LlmMetadata",
    "Section",
    "check_tflite",
    "check_tflite_bytes",
    "container_tokenizer",
    "parse_llm_metadata",
    "read_container",
]
