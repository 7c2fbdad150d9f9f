"""A clock the test moves by hand, for code that takes ``clock=`` (no sleeps)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
