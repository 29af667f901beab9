"""A job's progress for a person watching a terminal: a tqdm bar over the epochs, with the rounds,
samples/s, test accuracy and an estimate of the time left; other lines print above it.

Only where the output is a terminal (`on_terminal`); pipes, log files and CI get plain lines from
the caller instead, one per event, which a bar's carriage returns would garble.
"""

from __future__ import annotations

from typing import Any, TextIO

from tqdm import tqdm


def on_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a bar there; plain lines elsewhere)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class EpochBar:
    """The bar: advanced by `epoch` records, its accuracy by `eval` records."""

    def __init__(self, epochs: int, stream: TextIO, start: int = 0) -> None:
        self._stream = stream
        self._bar = tqdm(total=epochs, initial=start, file=stream, unit="epoch", desc="epoch", dynamic_ncols=True,
                         bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")
        self._postfix: dict[str, Any] = {}

    def update(self, record: dict[str, Any]) -> bool:
        """Show `record` on the bar; False for a record the bar does not show (print it as a line)."""
        event = record.get("event")
        if event == "epoch":
            self._postfix["rounds"] = record.get("step")
            if record.get("samples_per_s") is not None:
                self._postfix["samples/s"] = f"{record['samples_per_s']:.0f}"
            self._bar.update(max(0, int(record["epoch"]) - self._bar.n))
        elif event == "eval":
            self._postfix["acc"] = f"{record['accuracy']:.4f}"
        elif event == "resume":
            self._bar.update(max(0, int(record["epoch"]) - self._bar.n))
            return False
        else:
            return False
        self._bar.set_postfix(self._postfix, refresh=True)
        return True

    def write(self, line: str) -> None:
        """A line above the bar."""
        self._bar.write(line, file=self._stream)

    def close(self) -> None:
        self._bar.close()
