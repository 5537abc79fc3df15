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
    """Refuse an output path that cannot be written: a folder, a device, pipe or socket, or a file in a
    missing folder or one where a file cannot be created (read-only, or a file system such as /proc).

    A symbolic link is followed: its target is what `write_atomic` replaces. ``option`` (e.g. ``--trace``)
    names the field in the error. Nothing is left behind.
    """
    path = Path(path)
    label = str(path)
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise TrainsimError("is a folder; give a file name", file=label, field=option)
    if target.exists() and not target.is_file():
        raise TrainsimError("is not a regular file (a device, pipe or socket); give a file name",
                            file=label, field=option)
    folder = target.parent
    if not folder.is_dir():
        shown = path.parent if str(path.parent) else Path(".")
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise TrainsimError(f"folder {str(shown)!r} {what}", file=label, field=option)
    why = cannot_create_in(folder)
    if why:
        raise TrainsimError(f"folder {str(folder)!r} is not writable ({why})", file=label, field=option)
    if target.exists() and not os.access(target, os.W_OK):
        raise TrainsimError("file is not writable", file=label, field=option)
    return path


def check_output_folder(path: str | os.PathLike, option: str | None = None) -> Path:
    """Refuse an output folder that cannot be written: a file there, or a missing folder whose nearest
    existing parent is not a folder where one can be created. Nothing is left behind."""
    path = Path(path)
    label = str(path)
    if path.exists() and not path.is_dir():
        raise TrainsimError("is a file; give a folder", file=label, field=option)
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise TrainsimError(f"{str(existing)!r} is not a folder", file=label, field=option)
    why = cannot_create_in(existing)
    if why:
        raise TrainsimError(f"folder {str(existing)!r} is not writable ({why})", file=label, field=option)
    return path


def cannot_create_in(folder: Path) -> str | None:
    """Why a file cannot be created in ``folder``, or None. It tries, rather than asking `os.access`,
    which says yes to root in a read-only folder and knows nothing of read-only file systems."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".trainsim-probe.")
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(probe)
    return None


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write a file so that it is either complete or absent: a temporary file beside it, then a rename.
    A symbolic link is followed, so the link stays and its target gets the data; a device, pipe or socket
    is refused. ``data`` as text is written as UTF-8. Returns the path."""
    import tempfile

    label = str(path)
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise TrainsimError("is not a regular file (a device, pipe or socket); give a file name", file=label)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise TrainsimError(f"cannot write here ({exc.strerror})", file=label) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise TrainsimError(f"cannot write the file ({exc.strerror or exc})", file=label) from None
    except BaseException:
        _remove(tmp)
        raise
    return Path(label)


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
