"""The file-system boundary: input files read as text, output paths checked; a failure is one TrainsimError.

Every reader of a user-named file goes through :func:`read_text`, so a folder, a missing file or a binary
file is one line naming it. Every command that writes files calls :func:`check_output` for each of them
before it does any work, so a bad output path never leaves a run with one output written and another not.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainsim.errors import TrainsimError


def read_text(path: str | os.PathLike, label: str | None = None, what: str = "file") -> str:
    """The UTF-8 text of ``path``; ``label`` names it in errors, ``what`` says what kind of file it is."""
    path = Path(path)
    label = label or str(path)
    if path.is_dir():
        raise TrainsimError(f"is a folder, not a {what}", file=label)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TrainsimError("file not found", file=label) from None
    except OSError as exc:
        raise TrainsimError(f"cannot read file: {exc.strerror or exc}", file=label) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrainsimError(f"not a text {what}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
                            "UTF-8", file=label) from None


def check_output(path: str | os.PathLike, option: str | None = None) -> Path:
    """Refuse an output path that cannot be written: a folder, or in a missing or read-only folder.

    ``option`` (e.g. ``--trace``) names the field in the error. Nothing is created.
    """
    path = Path(path)
    label = str(path)
    if path.is_dir():
        raise TrainsimError("is a folder; give a file name", file=label, field=option)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TrainsimError(f"folder {str(folder)!r} does not exist", file=label, field=option)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TrainsimError(f"folder {str(folder)!r} is not writable", file=label, field=option)
    if path.exists() and not os.access(path, os.W_OK):
        raise TrainsimError("file is not writable", file=label, field=option)
    return path


def check_output_folder(path: str | os.PathLike, option: str | None = None) -> Path:
    """Refuse an output folder that cannot be written: a file there, or a missing folder whose nearest
    existing parent is not a writable folder. Nothing is created."""
    path = Path(path)
    label = str(path)
    if path.exists() and not path.is_dir():
        raise TrainsimError("is a file; give a folder", file=label, field=option)
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise TrainsimError(f"{str(existing)!r} is not a folder", file=label, field=option)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TrainsimError(f"folder {str(existing)!r} is not writable", file=label, field=option)
    return path


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write a file so that it is either complete or absent: a temporary file beside it, then a rename.
    ``data`` as text is written as UTF-8. Returns the path."""
    import tempfile

    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise TrainsimError(f"cannot write here ({exc.strerror})", file=str(path)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
