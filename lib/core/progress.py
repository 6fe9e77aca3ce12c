"""Progress lines for long loops: how far, for how long, and how long still to go.

A line reads `<label>: <done>/<total> <unit> (<p>%) elapsed 1m02s eta 3m10s` followed by what the
caller adds. They are whole lines, not a carriage-return bar, since DVC keeps a stage's output as a
log. A loop calls `tick(done)` as often as it likes; a line comes out once `every_s` seconds have
passed since the start or the last line (30 by default: at most 120 lines an hour, however fast the
loop), and a loop that printed any closes with a line at its total: a loop shorter than every_s says
nothing, its caller's summary line is enough. Training loops, which already print every `log_every`
steps, call `update(done)` and print `line(detail)` on that trigger instead.

The ETA is the work left at the mean rate since this process started on the loop (`start`): a
whole-run mean, not a recent window, so evaluation and checkpoint pauses count as they will again,
and a resumed run does not count the work it found done as work done fast. Where units differ in
length (finetune's runs: a frozen probe takes seconds, ulmfit minutes) the caller passes its own
`estimate`, such as RunTimes'. With a wall-clock limit (a stage's safety stop), the first time the
run's projected end passes the limit it says, once, how far the run will get.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Callable, Hashable

from lib.core.errors import stop_if_interrupted


def duration(seconds: float) -> str:
    """45s, 3m10s, 2h05m: two units at most, so a line's width barely changes over a run."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def say(line: str) -> None:
    print(line, flush=True)


class Progress:
    """The progress of one loop over `total` units (None when the total is not known beforehand:
    then no percentage or ETA). `limit_s` is a wall-clock limit that stops the run, and `limit_key`
    the setting it comes from (pretrain.budget_minutes). `estimate`, when given, returns the seconds
    left (None: unknown) in place of the mean rate's figure."""

    def __init__(self, label: str, total: int | None, unit: str, clock: Callable[[], float] = time.monotonic,
                 every_s: float = 30.0, limit_s: float | None = None, limit_key: str = "",
                 out: Callable[[str], None] = say, estimate: Callable[[], float | None] | None = None):
        self.label, self.total, self.unit, self.clock, self.every_s = label, total, unit, clock, every_s
        self.limit_s, self.limit_key, self.out, self.estimate = limit_s, limit_key, out, estimate
        self.done = 0
        self.warned = False
        self.start()

    def start(self, done: int = 0, elapsed_s: float = 0.0) -> None:
        """(Re)start the clock with `done` units already done in `elapsed_s` seconds by an earlier part."""
        self.done, self.done_at_start, self.elapsed_before = done, done, elapsed_s
        self.started = self.clock()
        self.last_line: float | None = None

    def elapsed_s(self) -> float:
        return self.elapsed_before + self.clock() - self.started

    def rate(self) -> float | None:
        """Units per second since start(), None before the first unit."""
        seconds, units = self.clock() - self.started, self.done - self.done_at_start
        return units / seconds if units > 0 and seconds > 0 else None

    def eta_s(self) -> float | None:
        if self.estimate is not None:
            return self.estimate()
        rate = self.rate()
        return None if rate is None or self.total is None else max(0, self.total - self.done) / rate

    def status(self) -> str:
        """`done/total unit (p%) elapsed 1m02s eta 3m10s`, `eta ?` while there is no estimate."""
        if self.total is None:
            return f"{self.done:,} {self.unit} elapsed {duration(self.elapsed_s())}"
        eta = self.eta_s()
        share = self.done / self.total if self.total else 1.0
        return (f"{self.done:,}/{self.total:,} {self.unit} ({share:.1%}) elapsed {duration(self.elapsed_s())} "
                f"eta {'?' if eta is None else duration(eta)}")

    def update(self, done: int) -> None:
        """Record `done` and warn, once, when the run will not finish within the limit at this speed. After
        Ctrl-C, raise KeyboardInterrupt: a loop does not go on where a library swallowed the first one."""
        stop_if_interrupted()
        self.done = done
        eta = self.eta_s()
        if self.warned or self.limit_s is None or eta is None or self.elapsed_s() + eta <= self.limit_s:
            return
        self.warned = True
        share_left = max(0.0, self.limit_s - self.elapsed_s()) / eta  # of the work left, what the limit leaves time for
        reached = self.done + (self.total - self.done) * min(1.0, share_left)
        self.out(f"warning: {self.label}: at this speed the {self.limit_s / 60:g}-minute time limit ({self.limit_key}) "
                 f"will end the run at ~{reached / self.total:.0%} of its {self.total:,} {self.unit}")

    def tick(self, done: int, detail: str = "") -> None:
        """update(done), and print a line when one is due: every every_s, and at the total after any other."""
        self.update(done)
        now = self.clock()
        finished = self.total is not None and done >= self.total
        if now - (self.started if self.last_line is None else self.last_line) >= self.every_s or (
                finished and self.last_line is not None):
            self.last_line = now
            self.out(self.line(detail))

    def line(self, detail: str = "") -> str:
        return f"{self.label}: {self.status()}{detail}"


class RunTimes:
    """Seconds of finished runs by kind (finetune: task × variant), for the time the runs still to do
    will take: each at the mean of its kind's runs so far. A kind not run yet has no honest figure:
    `left` counts such runs apart instead of guessing them from another kind."""

    def __init__(self):
        self.seconds: dict[Hashable, list[float]] = defaultdict(list)

    def add(self, kind: Hashable, seconds: float) -> None:
        self.seconds[kind].append(seconds)

    def left(self, kinds: list[Hashable]) -> tuple[float, int]:
        """(seconds of the runs of `kinds` whose kind has been timed, how many are of untimed kinds)."""
        timed = [statistics.fmean(self.seconds[k]) for k in kinds if self.seconds.get(k)]
        return sum(timed), len(kinds) - len(timed)

    def eta_s(self, kinds: list[Hashable]) -> float | None:
        seconds, untimed = self.left(kinds)
        return None if untimed else seconds
