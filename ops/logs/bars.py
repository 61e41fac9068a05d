"""A tqdm bar that draws nothing and leaves one log line (`ops.logs.configure` routes
transformers' bars here). Imported only where transformers, and so tqdm, is installed."""

from __future__ import annotations

import io
from typing import Any

import structlog
import tqdm.std

__all__ = ["LoggedBar"]

log = structlog.get_logger(__name__)


class _Nowhere(io.TextIOBase):
    """Where a bar that draws nothing draws."""

    def write(self, text: str) -> int:
        return len(text)


class LoggedBar(tqdm.std.tqdm):
    """A tqdm bar that draws nothing: at its end, its final count is one line of the log
    file (``progress bar``: desc, n, total, seconds), not on the console."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["file"] = _Nowhere()
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        if not self.disable:  # a closed bar is disabled: one line per bar
            log.info(
                "progress bar",
                desc=self.desc,
                n=self.n,
                total=self.total,
                seconds=round(self.format_dict["elapsed"], 3),
                console=False,
            )
        super().close()
