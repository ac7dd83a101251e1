"""Writing what a command produces to the file the user named (``--out``): the one place meshplan
writes files.

* :func:`out_path` checks the name before any work: a name the file system can hold, in an
  existing directory, not a directory, never a symbolic link (dangling or not), and not an
  existing file unless the command was told to replace it (``--force``).
* :func:`write_file` writes atomically: into a temporary file in the same directory, then moved
  into place. Without ``replace`` the move is a hard link, which fails if the name appeared
  meanwhile (a file or a link made while meshplan computed is never overwritten); with
  ``replace`` it is :func:`os.replace`, which swaps the name itself and never follows a link.

Every failure is one :class:`~meshplan.errors.InputError` on ``out`` naming the file as the user
wrote it.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable, Optional

from meshplan.errors import InputError

#: Bytes a name (one path component) and a whole path may hold where the system does not say.
NAME_MAX, PATH_MAX = 255, 4096
#: Errors of :func:`os.link` meaning "this file system has no hard links": fall back to O_EXCL.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


def _name_limits(parent: Path) -> tuple[int, int]:
    """(longest name, longest path) in bytes the file system under ``parent`` (else the working
    directory's) accepts."""
    for where in (parent, Path(".")):
        try:
            return os.pathconf(where, "PC_NAME_MAX"), os.pathconf(where, "PC_PATH_MAX")
        except (OSError, ValueError, AttributeError):
            continue
    return NAME_MAX, PATH_MAX


def _check_name(out: str, path: Path) -> None:
    """One ``out`` error for a name no file system call should even see: empty, a NUL byte, a
    component or a whole path longer than the file system holds."""
    if not out.strip():
        raise InputError("out", "must name a file (got an empty value)")
    if "\0" in out:
        raise InputError("out", "must not contain a NUL character")
    name_max, path_max = _name_limits(path.parent)
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > name_max:
        raise InputError("out", f"a name in '{out[:60]}…' is {longest:,} bytes; the file system holds at most {name_max:,}")
    if len(os.fsencode(str(path.absolute()))) > path_max:
        raise InputError("out", f"the path '{out[:60]}…' is longer than the {path_max:,} bytes the file system holds")


def out_path(out: str, suffixes: Optional[tuple[str, ...]] = None, force: Optional[bool] = None) -> Path:
    """The file ``--out`` names, checked before any work (see the module's rules); ``suffixes``
    (e.g. ``(".svg", ".png")``) are the endings the command writes; ``force`` is the command's
    ``--force`` (True: an existing regular file may be replaced), None where it has none."""
    path = Path(out).expanduser()
    _check_name(out, path)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise InputError("out", f"must be a {' or '.join(suffixes)} file (got '{out}')")
    try:
        if path.is_symlink():
            raise InputError("out", f"'{out}' is a symbolic link; meshplan does not write through links: remove it or name its target")
        if path.is_dir():
            raise InputError("out", f"'{out}' is a directory; give a file name" + (f" ending in {' or '.join(suffixes)}" if suffixes else ""))
        if not path.parent.is_dir():
            raise InputError("out", f"directory '{path.parent}' does not exist")
        if os.path.lexists(path) and not force:
            more = "choose another name" if force is None else "pass --force to overwrite it"
            raise InputError("out", f"'{out}' already exists; meshplan does not overwrite files: {more}")
    except OSError as err:
        raise InputError("out", f"cannot use '{out}': {err.strerror or err}") from None
    return path


def _temp_file(parent: Path) -> tuple[int, Path]:
    """A new, empty file with a short random name in ``parent`` (the mode the umask gives)."""
    for _ in range(16):
        tmp = parent / f".meshplan-{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(parent))


def _publish(tmp: Path, path: Path, replace: bool, shown: str) -> None:
    """Give the finished temporary file ``tmp`` the name ``path`` in one step."""
    if replace:
        if path.is_symlink():
            raise InputError("out", f"'{shown}' became a symbolic link while meshplan worked; not written through")
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise InputError("out", f"'{shown}' appeared while meshplan worked; meshplan does not overwrite files: choose another name") from None
    except OSError as err:
        if err.errno not in _NO_LINKS:
            raise
        try:  # no hard links here: claim the name exclusively, then move the file onto the claim
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666))
        except FileExistsError:
            raise InputError("out", f"'{shown}' appeared while meshplan worked; meshplan does not overwrite files: choose another name") from None
        os.replace(tmp, path)


def write_file(path: Path, write: Callable[[BinaryIO], None], shown: object = None, replace: bool = False) -> None:
    """Call ``write`` on a temporary file next to ``path``, then move it to ``path`` atomically
    (never overwriting unless ``replace``); an ``out`` error naming the file (as ``shown``,
    default the path) when the file system refuses. Nothing is left behind on failure."""
    name = str(path if shown is None else shown)
    tmp: Optional[Path] = None
    try:
        fd, tmp = _temp_file(path.parent)
        with os.fdopen(fd, "wb") as f:
            write(f)
        _publish(tmp, path, replace, name)
    except OSError as err:
        raise InputError("out", f"cannot write '{name}': {err.strerror or err}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # moved into place (replace) or never made


def write_text(path: Path, text: str, shown: object = None, replace: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` as :func:`write_file` does."""
    data = text.encode("utf-8")
    write_file(path, lambda f: f.write(data), shown, replace)
