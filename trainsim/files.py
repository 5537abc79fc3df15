"""The file-system boundary: input files read as text, output paths checked; a failure is one TrainsimError.

Every reader of a user-named file goes through :func:`read_text`, so a folder, a missing file, a symbolic
link loop or a binary file is one line naming it. Every command that writes files calls :func:`check_output`
(or :func:`check_output_folder`) for each of them before it does any work, so a bad output path never leaves
a run with one output written and another not, and an output that is, links to or holds one of the
command's inputs is refused: a run never overwrites what it reads.

The inputs an output is compared with are those the command names (`trainsim.inputs`) and, while a command
runs under :func:`watching_inputs`, every file :func:`read_text` has read so far.

A symbolic link given as an output is written through: its target gets the data and the link stays
(`write_atomic`, and the trace and report writers, which resolve the link first).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from trainsim.errors import TrainsimError

#: path -> what it is, of each input file read while a command runs under `watching_inputs`; None outside
_read: dict[str, str] | None = None


@contextlib.contextmanager
def watching_inputs() -> Iterator[None]:
    """While inside, `read_text` notes every file it reads, so that `check_output` refuses it as an output
    too (the CLI runs each command inside one)."""
    global _read
    previous, _read = _read, {}
    try:
        yield
    finally:
        _read = previous


def inputs_read() -> list[tuple[str, str]]:
    """(what, path) of the files read so far under `watching_inputs` (none outside it)."""
    return [(what, path) for path, what in (_read or {}).items()]


def read_text(path: str | os.PathLike, label: str | None = None, what: str = "file", *,
              note: bool = True) -> str:
    """The UTF-8 text of ``path``; ``label`` names it in errors, ``what`` says what kind of file it is.
    ``note``: count it among the command's inputs (`watching_inputs`); a command's own output that it reads
    back (a sweep's results file) is not one."""
    path = Path(path)
    label = label or str(path)
    if path.is_dir():
        raise TrainsimError(f"is a folder, not a {what}", file=label)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TrainsimError("file not found", file=label) from None
    except OSError as exc:  # a symbolic link loop (ELOOP), no permission, an I/O error
        raise TrainsimError(f"cannot read file: {exc.strerror or exc}", file=label) from None
    if note and _read is not None:
        _read.setdefault(str(path), f"the {what} this command reads")  # once, though read per sweep point
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrainsimError(f"not a text {what}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
                            "UTF-8", file=label) from None


def check_output(path: str | os.PathLike, option: str | None = None,
                 inputs: Iterable[tuple[str, str | os.PathLike]] = ()) -> Path:
    """Refuse an output path that cannot be written: a folder, a device, pipe or socket, a file in a
    missing folder or one where a file cannot be created (read-only, or a file system such as /proc), or
    one of the command's inputs (`check_not_input`: ``inputs``, as (what, path), and the files read so far).

    A symbolic link is followed: its target is what `write_atomic` replaces. ``option`` (e.g. ``--trace``)
    names the field in the error. Nothing is left behind.
    """
    path = Path(path)
    label = str(path)
    check_not_input(path, option, inputs)
    _not_a_link_loop(path, option)
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise TrainsimError("is a folder; give a file name", file=label, field=option)
    if target.exists() and not target.is_file():
        raise TrainsimError("is not a regular file (a device, pipe or socket); give a file name",
                            file=label, field=option)
    folder = target.parent
    if not folder.is_dir():
        shown = path.parent if str(path.parent) else Path(".")
        if os.path.islink(path):  # the folder the link leads to
            shown = Path(os.path.dirname(os.path.join(os.path.dirname(path), os.readlink(path))) or ".")
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise TrainsimError(f"folder {str(shown)!r} {what}", file=label, field=option)
    why = cannot_create_in(folder)
    if why:
        raise TrainsimError(f"folder {str(folder)!r} is not writable ({why})", file=label, field=option)
    if target.exists() and not os.access(target, os.W_OK):
        raise TrainsimError("file is not writable", file=label, field=option)
    return path


def check_output_folder(path: str | os.PathLike, option: str | None = None,
                        inputs: Iterable[tuple[str, str | os.PathLike]] = (), *, whole: bool = False) -> Path:
    """Refuse an output folder that cannot be written: a file there, a missing folder whose nearest
    existing parent is not a folder where one can be created, or one of the command's input folders
    (`check_not_input`; replaced ``whole``, also a folder that holds an input). Nothing is left behind."""
    path = Path(path)
    label = str(path)
    check_not_input(path, option, inputs, folder=True, whole=whole)
    _not_a_link_loop(path, option)
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


def check_not_input(path: str | os.PathLike, option: str | None,
                    inputs: Iterable[tuple[str, str | os.PathLike]] = (), *, folder: bool = False,
                    whole: bool = False) -> None:
    """Refuse an output that would overwrite an input of the command: ``inputs`` ((what, path) pairs, what
    a noun such as ``the SCENARIO file this command reads``: the files and folders it names) and the files
    `read_text` has read so far (`watching_inputs`).

    Paths compare as the files they are (symbolic links resolved, hard links by inode). A file output is
    refused when it is an input file, or an existing file inside an input folder (one the command may read
    from it); a ``folder`` output when it is an input folder, or, replaced ``whole`` (a trace folder), when
    it holds an input.
    """
    label = str(path)
    out = _real(path)
    out_stat = _stat(out)
    verb = "links to" if os.path.islink(path) else "is"
    for what, given in [*inputs, *inputs_read()]:
        if given is None or not str(given).strip():
            continue
        source = _real(given)
        source_stat = _stat(source)
        if source_stat is None:
            continue  # not a file (a preset's name, or a file the command will report missing)
        same = source == out or (out_stat is not None and os.path.samestat(out_stat, source_stat))
        is_folder = os.path.isdir(source)
        if folder:
            holds = whole and not same and _inside(source, out)
            clash = same or holds
            why = f"holds {what} ({given})" if holds else f"{verb} {what}"
        else:
            inside = not same and is_folder and out_stat is not None and _inside(out, source)
            clash = same or inside
            why = f"{verb} a file in {what} ({given})" if inside else f"{verb} {what}"
        if clash:
            raise TrainsimError(f"{why}; an output must not overwrite an input: give another name",
                                file=label, field=option)


def _not_a_link_loop(path: str | os.PathLike, option: str | None) -> None:
    """A symbolic link that leads back to itself names no file to write through: refused, not replaced."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TrainsimError("is a symbolic link loop; give a file name", file=str(path),
                                field=option) from None


def _real(path: str | os.PathLike) -> str:
    """The absolute path with every symbolic link resolved (a link loop stays as it is)."""
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _inside(path: str, folder: str) -> bool:
    """Whether real path ``path`` is below real path ``folder``."""
    return path.startswith(folder.rstrip(os.sep) + os.sep)


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
    _not_a_link_loop(path, None)
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
