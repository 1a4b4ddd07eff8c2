"""What is wrong with a record's bytes, raised before the file name is known.

Readers raise `RecordProblem`; the file-level code turns it into a `RecordError` that names
the file, so every message a user sees says which file is at fault.
"""

from __future__ import annotations

import os

from ember.errors import RecordError


class RecordProblem(Exception):
    """A record's content is malformed, corrupt or unsupported (internal; never escapes)."""


def record_error(
    path: str | os.PathLike[str], exc: BaseException, *, action: str = "read"
) -> RecordError:
    """Build the user-facing `RecordError` for `exc` raised while handling the file `path`:
    one line, whatever the text of `exc` holds."""
    error = _record_error(path, exc, action)
    text = str(error)
    if "\n" in text or "\r" in text:
        error = RecordError(" ".join(text.split()))
    return error


def _record_error(path: str | os.PathLike[str], exc: BaseException, action: str) -> RecordError:
    if isinstance(exc, RecordProblem):
        return RecordError(f"cannot {action} {os.fspath(path)}: {exc}")
    if isinstance(exc, RecordError):
        return exc
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        return RecordError(f"cannot {action} {os.fspath(path)}: {reason}")
    detail = str(exc) or "no details"
    if len(detail) > 300:
        detail = detail[:300] + "..."
    if action != "read":
        return RecordError(f"cannot {action} {os.fspath(path)}: {type(exc).__name__}: {detail}")
    return RecordError(
        f"cannot read {os.fspath(path)}: the file is corrupt or not an ember record "
        f"({type(exc).__name__}: {detail})"
    )
