"""``POST /slots/{id}?action=save|restore|erase``: a slot's conversation kept on disk, as
llama-server's ``--slot-save-path`` endpoints.

* ``save`` writes slot ``id``'s sequence state (``Session.save_slot``: an atomic, fingerprinted
  slot file) to ``{"filename": NAME}`` in the server's slot folder; ``restore`` makes the slot
  hold the state of such a file (checked in full first: another model's, a truncated or a
  corrupted file is refused, 400, and the slot is left as it was or empty); ``erase`` empties
  the slot. They answer as llama-server does: ``id_slot``, ``filename``, ``n_saved`` /
  ``n_restored`` tokens, ``n_written`` / ``n_read`` bytes, ``timings``; ``n_erased``.
* ``NAME`` is a plain file name inside the folder: no directory part, no ``..``, no leading
  dot, no NUL (anything else is 400 before any file is touched); without a folder (``serve``
  without ``--slot-save-path``) save and restore are 400.
* A slot serving a request is 409 (retry when it is idle). The action runs on the slot's own
  thread, under a lease, like a request.

With restored state in a slot, a request that continues the saved conversation prefills only
its new tokens (after a server restart too).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import ElizaError, InvalidArgumentError, SessionBusyError, SlotError
from ..stream import Stream
from .api_errors import ApiError, api_error
from .pool import SessionPool

#: What a slot file's name may be: letters, digits, ``._-``, not starting with a dot.
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
ACTIONS = ("save", "restore", "erase")


class SlotFiles:
    """The ``/slots`` route over ``pool``; ``folder`` holds the slot files (None: save and
    restore are refused)."""

    def __init__(self, pool: SessionPool, folder: str | os.PathLike[str] | None) -> None:
        self.pool = pool
        self.folder = Path(folder).resolve() if folder is not None else None

    def path(self, filename: object) -> Path:
        """The file ``filename`` names in the folder (:class:`ApiError` 400 otherwise)."""
        if self.folder is None:
            raise ApiError(400, "this server keeps no slot files: start it with "
                           "--slot-save-path DIR", code="slot_save_path_unset")
        if not isinstance(filename, str) or not _NAME.fullmatch(filename) or \
                ".." in filename:
            raise ApiError(400, f"filename {filename!r} is not a plain file name (letters, "
                           "digits, '.', '_', '-'; no directory part, no leading dot)",
                           param="filename", code="invalid_filename")
        path = self.folder / filename
        if path.parent != self.folder:  # (the pattern already excludes it)
            raise ApiError(400, f"filename {filename!r} is outside the slot folder",
                           param="filename", code="invalid_filename")
        return path

    async def action(self, request: Request) -> Response:
        """The route: parse, lease the slot, run the action on its thread, answer."""
        try:
            index = int(request.path_params["id"])
            action = request.query_params.get("action", "")
            if action not in ACTIONS:
                raise ApiError(400, f"action {action!r}: use ?action=save, restore or erase",
                               param="action")
            path = None
            if action != "erase":
                body = await request.json() if await request.body() else {}
                path = self.path(body.get("filename") if isinstance(body, dict) else None)
            try:
                lease = self.pool.lease_slot(index)
            except SessionBusyError as exc:
                raise ApiError(409, exc.message, code="slot_busy") from None
            except InvalidArgumentError as exc:
                raise ApiError(400, exc.message, param="id", code="invalid_slot") from None
            result: dict[str, Any] = {}
            try:
                result = await lease.call(lambda stream: _run(stream, action, path))
            finally:
                await lease.release(result.pop("_text", lease.slot.text))
            return JSONResponse({"id_slot": index, **result})
        except SlotError as exc:
            return ApiError(400, exc.message, code="invalid_slot_file").response()
        except (ApiError, ElizaError, ValueError) as exc:
            error = ApiError(400, f"the body is not JSON: {exc}") if isinstance(
                exc, ValueError) else api_error(exc)
            return error.response()


def _run(stream: Stream, action: str, path: Path | None) -> dict[str, Any]:
    """One action on the slot's stream (its thread); ``_text`` is the routing hint of what the
    slot holds after it."""
    session = stream.session
    t0 = time.perf_counter()
    if action == "erase":
        n = session.n_past
        session.reset()
        return {"n_erased": n, "_text": ""}
    assert path is not None
    if action == "save":
        session.save_slot(path)
        return {"filename": path.name, "n_saved": session.n_past,
                "n_written": path.stat().st_size,
                "timings": {"save_ms": round((time.perf_counter() - t0) * 1000, 3)}}
    session.restore_slot(path)
    return {"filename": path.name, "n_restored": session.n_past,
            "n_read": path.stat().st_size,
            "timings": {"restore_ms": round((time.perf_counter() - t0) * 1000, 3)},
            "_text": session.detokenize(session.history)}


__all__ = ["ACTIONS", "SlotFiles"]
