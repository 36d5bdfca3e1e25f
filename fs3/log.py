"""Logging setup shared by every fs3 process.

Lines are ``time level logger service=... message key=value ...``: one logger per module
(``logging.getLogger(__name__)``), context as key=value pairs passed with :func:`kv`, so logs stay
greppable without a structured-logging dependency.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from fs3.config import LogConfig

_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s service=%(service)s %(message)s"


class _ServiceFilter(logging.Filter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        return True


class Repeats:
    """Which warnings to say now: each key (what, about whom) once per ``every_s``, the repeats in
    between left out; at most ``keep`` keys remembered (all forgotten when full: then a repeat is
    said once more). For warnings a failure repeats as often as a client retries."""

    __slots__ = ("every_s", "keep", "_next")

    def __init__(self, every_s: float = 60.0, keep: int = 1024) -> None:
        self.every_s = every_s
        self.keep = keep
        self._next: dict[object, float] = {}  # key -> when it may be said again (monotonic)

    def due(self, key: object) -> bool:
        """Whether to say ``key``'s warning now (if so, not again for ``every_s``)."""
        now = time.monotonic()
        if self._next.get(key, 0.0) > now:
            return False
        if len(self._next) >= self.keep:
            self._next.clear()
        self._next[key] = now + self.every_s
        return True


def kv(**fields: Any) -> str:
    """Render context as ``key=value`` pairs (values with spaces are quoted)."""
    parts = []
    for k, v in fields.items():
        s = str(v)
        if not s or any(c.isspace() for c in s) or '"' in s:
            s = '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
        parts.append(f"{k}={s}")
    return " ".join(parts)


def setup_logging(cfg: LogConfig, service: str) -> None:
    """Route the root logger to ``cfg.file`` (or standard error) at ``cfg.level``, tagged with
    ``service``. Safe to call more than once; the last call wins."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    handler: logging.Handler
    # (a message holding text that is not UTF-8, a name's undecodable bytes, is written with
    # backslash escapes, as standard error writes it: strict encoding lost the record)
    handler = (
        logging.FileHandler(cfg.file, encoding="utf-8", errors="backslashreplace")
        if cfg.file
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%Y-%m-%dT%H:%M:%S"))
    handler.addFilter(_ServiceFilter(service))
    root.addHandler(handler)
    root.setLevel(cfg.level.upper())
