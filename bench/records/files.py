"""Run records: one JSON file per run, written atomically (temp file + rename)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import secrets
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.records.schema import record_problem
from bench.tools.errors import CannotWrite
from bench.tools.lifetime import still_running
from bench.tools.terminal import printable


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(strategy: str, world_size: int, device_type: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{strategy}-{world_size}{device_type}-{secrets.token_hex(3)}"


def runs_dir(output: str | Path) -> Path:
    return Path(output) / "runs"


def write_atomic(path: Path, record: dict[str, Any]) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    write_text_atomic(path, json.dumps(record, indent=2, sort_keys=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write text so that a reader sees the old file or the new one, never half of one (a
    full disk leaves the old file, not an empty one)."""
    with atomic_file(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # (a pipe or a terminal cannot)
            os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """The one way bench writes a file: a temporary file beside PATH, yielded to be filled
    (``fig.savefig(tmp)``, ``write_text``), then renamed over PATH and the folder fsynced. A
    reader, a second writer or a ``kill -9`` meanwhile sees the old file or the new one,
    never half of one; a failure leaves the old file and no temporary one, and is one
    ``CannotWrite`` line naming the file, why (read-only, full, quota) and the fix.

    A PATH that is a link is written where it leads: the rename replaced the link itself
    with a file, and the file it named kept its old text. A PATH that is no regular file (a
    terminal, a pipe, a device: ``--out /dev/stdout``) is yielded itself, to be written
    into: the rename replaced the node, and for root that was /dev/stdout or /dev/null
    turned into a file for every process of the machine."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # (through links: /dev/stdout is one)
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        try:
            yield path
        except OSError as exc:
            raise CannotWrite.of(exc, path) from None
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Hidden, and not ending in the file's own suffix: a reader globbing `*.json` (which
        # in pathlib matches hidden names too) must never take a half-written record.
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp",
                                    dir=path.parent)
        tmp = Path(name)
        # mkstemp makes the file 0600; a record is an ordinary file, readable as the umask
        # allows (a group sharing --output across nodes must read it).
        os.fchmod(fd, _FILE_MODE & ~_umask())
        os.close(fd)
        yield tmp
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise CannotWrite.of(exc, path) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    _fsync_folder(path.parent)  # the rename itself survives a crash right after


def remove_dead_temporaries(folder: Path) -> None:
    """Remove the temporary files of writers that died mid-write (``kill -9``) under
    ``folder``: atomic_file names each with its writer's pid (a live one is left alone: it
    may be a second report of the same folder, still drawing)."""
    for tmp in folder.rglob(".*.tmp") if folder.is_dir() else []:
        pid = tmp.name.split(".")[-3]  # .NAME.PID.RANDOM.tmp
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        if not still_running(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


_FILE_MODE = 0o666


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a folder
    finally:
        os.close(fd)


# Room kept aside while a run lasts, so that a disk that fills meanwhile can still take the
# record's closing (a record is kilobytes).
RESERVE_BYTES = 2**20


def reserve_space(runs: Path, run_id: str) -> Path | None:
    """A hidden file of RESERVE_BYTES beside the run's record, made as the run starts and
    removed (``release_space``) just before the record is closed: a disk that filled during
    the run (the record then could not be written, and stayed ``running``) has that room
    again. None where even the reserve does not fit (the run goes on without one)."""
    path = runs / f".{run_id}.reserve"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except (OSError, AttributeError):  # no room, or no fallocate on this system
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    return path


def release_space(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


MAX_RECORD_BYTES = 64 * 2**20  # a record is kilobytes; anything far larger is not one


# In a record's JSON text, a backslash (every C0 control character is written escaped, as
# are quotes, backslashes and, by json.dump, any non-ASCII character) or a character JSON
# leaves as it is (DEL, C1, the bidirectional marks): a text without one holds nothing
# to write out, and its record needs no walk (bench's own records hold none).
_MAYBE_CONTROL = re.compile("[\\\\\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def read_record(path: Path, for_display: bool = False) -> Any:
    """The JSON in a regular file of sane size (a FIFO would block, a huge file is not a
    record); ValueError for anything else, including absurdly nested JSON. ``for_display``:
    its text made printable (printable_record), for the commands that show what records
    say."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("not a regular file")
    if info.st_size > MAX_RECORD_BYTES:
        raise ValueError(f"{info.st_size} bytes, more than a record ever holds")
    with open(path) as fh:
        text = fh.read()
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return printable_record(data) if for_display and _MAYBE_CONTROL.search(text) else data


def printable_record(value: Any, key: str = "") -> Any:
    """A record (any JSON) read for display: its strings and keys with their control
    characters written out (terminal.printable), newlines kept in a failed rank's
    traceback alone. A record is data someone else may have written: its text must print
    as text, not move the cursor or hide a line."""
    if isinstance(value, str):
        return printable(value, keep="\n" if key == "error_traceback" else "")
    if isinstance(value, list):
        return [printable_record(v, key) for v in value]
    if isinstance(value, dict):
        return {printable(k) if isinstance(k, str) else k: printable_record(v, k)
                for k, v in value.items()}
    return value


def records_by_tag(output: str | Path) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """The readable records of ``output``/runs that carry a ``tag``, by tag, each with its
    path (a sweep's combination and its repeats are ``sweep:KEY:rN`` tags); unreadable
    files are left out, as a sweep resuming over them must."""
    found: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    folder = runs_dir(output)
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = read_record(path)
            if isinstance(record, dict) and record.get("tag"):
                found.setdefault(record["tag"], []).append((path, record))
    return found


def load_records(results: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """All records under ``results/runs`` (or ``results`` itself), oldest first, and one
    warning per file that is not a readable record, and per record whose run id another
    file already holds (a copy: counting it would count one run twice)."""
    root = Path(results)
    folder = runs_dir(root) if runs_dir(root).is_dir() else root
    records, warnings = [], []
    seen: dict[str, Path] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):  # a writer's temporary file, a reserve: not a record
            continue
        shown = printable(str(path))
        try:
            record = read_record(path, for_display=True)
        except (OSError, ValueError) as exc:
            warnings.append(f"skipped {shown}: not a readable JSON record "
                            f"({printable(str(exc))})")
            continue
        problem = record_problem(record)
        if problem:
            warnings.append(f"skipped {shown}: not a parallel-bench run record ({problem})")
            continue
        first = seen.setdefault(record["run_id"], path)
        if first != path:
            warnings.append(f"skipped {shown}: run {record['run_id']} is already "
                            f"{printable(first.name)}'s (one run, counted once)")
            continue
        records.append(record)
    records.sort(key=lambda r: r.get("started_at") or "")  # null: not recorded
    return records, warnings


def load_record_file(path: str | Path) -> dict[str, Any]:
    """One record file given by name (``bench compare A B``, ``bench project FILE``): a
    ValueError saying why it is not a usable run record."""
    record = read_record(Path(path), for_display=True)
    problem = record_problem(record)
    if problem:
        raise ValueError(f"not a parallel-bench run record: {problem}")
    return record


def load_source(source: str | Path, command: str) -> list[dict[str, Any]]:
    """The records of a results folder (the files it skips said on stderr as ``bench
    COMMAND: ...``) or of one record file; a path that is neither, or a folder without a
    record, is one line naming it."""
    from bench.tools.errors import ConfigError
    from bench.tools.folders import looked_up

    path = Path(source)
    looked_up(path, "", source)
    if path.is_file():
        try:
            return [load_record_file(path)]
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{source} is not a usable run record ({exc})") from None
    if not path.is_dir():
        raise ConfigError(f"{source} is neither a results folder nor a record file; name "
                          "a `bench run --output` folder or a record")
    records, warnings = load_records(path)
    for line in warnings:
        print(f"bench {command}: {line}", file=sys.stderr)
    if not records:
        raise ConfigError(f"{source} holds no run records; point it at a `bench run --output` "
                          "folder or a record file")
    return records
