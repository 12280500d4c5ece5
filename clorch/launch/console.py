"""The console is not the run: stdout and stderr that a closed pipe cannot break.

`clorch-train ... | head -1` closes the pipe after one line, and with
`clorch-train ... 2>&1 | tee log` a Ctrl-C ends `tee` too (the terminal sends
SIGINT to the whole pipeline). Python then raises BrokenPipeError from the next
print, which would end the launching process in the middle of a job: the ranks
stopped, no summary.json, exit status 1. The launching process only shows the
run (its ranks write their own files), so a console that goes away must not
end it.

`protect()` (the first thing clorch-train does) replaces sys.stdout and
sys.stderr with `SafeStream`s. A write or flush that fails (a broken pipe, a
closed file, a terminal that hung up) marks the stream gone (a descriptor
closed before the start, `2>&-`, is gone from the start) and points its file
descriptor at /dev/null, so that everything written to it later goes nowhere
without an error: the interpreter's own flush at exit (which would turn the exit
status into 120), C code writing to the descriptor, and processes started
afterwards (torch's agent's ranks, which would otherwise die of SIGPIPE). The
run goes on with its files, writes its summary, and the command exits with its
outcome's code.

What clorch-train says on stderr about the run itself (its lines starting
`clorch-train: `: a failure, an interruption and its resume hint) also goes to
the run's log, Hydra's `clorch-train.log` in the run directory, so it is kept
when the console is gone. (A run that succeeds, with nothing logged, still
leaves no log file: its verdict is on stdout and in summary.json.)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

# Lines of the command's own that are also written to the run's log (see the module docstring).
LOGGED_PREFIX = "clorch-train: "
_LOGGER_NAME = "clorch-train"


class SafeStream:
    """A text stream whose write and flush never raise; other attributes are the wrapped stream's.

    After the first failed write or flush, the stream counts as gone (`gone`):
    later writes are dropped, and its descriptor (when it has one) now points at
    /dev/null. With a `log_level`, lines starting with `LOGGED_PREFIX` are also
    written to the run's log (Hydra's log file handlers on the root logger) at
    that level, console or not.
    """

    def __init__(self, stream: TextIO, log_level: int | None = None) -> None:
        self.wrapped = stream
        self.gone = False
        self._level = log_level
        self._line = ""  # the start of a line not finished yet (print writes its end separately)

    def write(self, text: str) -> int:
        if self._line and text.startswith(LOGGED_PREFIX):
            # A line cut short (Ctrl-C between a print's text and its newline) ends here, so
            # that the command's own line starts a line, on the console and in the run's log.
            text = "\n" + text
        if self._level is not None:
            self._log_lines(text)
        if not self.gone:
            try:
                self.wrapped.write(text)
            except (OSError, ValueError):  # ValueError: the file object was closed
                self._lose()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.gone:
            return
        try:
            self.wrapped.flush()
        except (OSError, ValueError):
            self._lose()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the wrapped stream's
        return getattr(self.wrapped, name)

    def _lose(self) -> None:
        """The console is gone: point the descriptor at /dev/null and drop what is buffered."""
        self.gone = True
        try:
            fd = self.wrapped.fileno()
        except (OSError, ValueError, AttributeError):
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            os.dup2(null, fd)
        except OSError:
            return
        finally:
            os.close(null)
        try:  # the bytes the failed write left in the buffer now go to /dev/null
            self.wrapped.flush()
        except (OSError, ValueError):
            pass

    def _log_lines(self, text: str) -> None:
        self._line += text
        if "\n" not in self._line:
            return
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if line.startswith(LOGGED_PREFIX):
                to_run_log(line[len(LOGGED_PREFIX) :], self._level)


def to_run_log(message: str, level: int = logging.INFO) -> None:
    """Write `message` to the run's log file only (the root logger's file handlers, which
    Hydra's job logging sets up for each run), not to the console; nothing without one."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler) and level >= h.level]
    if not handlers:
        return
    record = logging.LogRecord(_LOGGER_NAME, level, __file__, 0, message, None, None)
    for handler in handlers:
        handler.handle(record)  # a handler's own failure goes to its handleError, never here


def safe(stream: TextIO) -> SafeStream:
    """`stream` as a SafeStream (itself if it is one already)."""
    return stream if isinstance(stream, SafeStream) else SafeStream(stream)


def protect() -> None:
    """Make sys.stdout and sys.stderr SafeStreams (once; a second call changes nothing);
    stderr's `clorch-train: ` lines also go to the run's log.

    Call it before anything is printed and before any stream object is handed
    on (Hydra's console log handler, a progress bar keep the object they were given).
    """
    _fill_closed_descriptors()
    if not isinstance(sys.stdout, SafeStream):
        sys.stdout = SafeStream(sys.stdout) if sys.stdout is not None else _gone_stream(1)
    if not isinstance(sys.stderr, SafeStream):
        sys.stderr = (
            SafeStream(sys.stderr, logging.WARNING) if sys.stderr is not None else _gone_stream(2, logging.WARNING)
        )


def _fill_closed_descriptors() -> None:
    """Point each standard descriptor (0, 1, 2) that was closed at start at /dev/null.

    With `2>&-` the next file opened would get descriptor 2, and whatever writes to
    "stderr" (C code, a warning, a rank started from here) would write into it.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one or lower
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _gone_stream(fd: int, log_level: int | None = None) -> SafeStream:
    """A SafeStream for a console closed at start (Python set sys.stdout or sys.stderr to None):
    gone from the first write, its descriptor on /dev/null, its `clorch-train: ` lines still logged."""
    stream = SafeStream(open(fd, "w", closefd=False), log_level)
    stream.gone = True
    return stream
