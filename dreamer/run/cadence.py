"""Small counters that drive the train loop's cadence (no modulo arithmetic in the loop)."""

from __future__ import annotations


class Every:
    """Fires once each time a counter passes a multiple of ``period``."""

    def __init__(self, period: int, last: int = 0):
        self.period = period
        self.last = last  # counter value when it last fired

    def __call__(self, counter: int) -> bool:
        if counter // self.period > self.last // self.period:
            self.last = counter
            return True
        return False

    def state_dict(self) -> dict:
        return {"last": self.last}

    def load_state_dict(self, state: dict) -> None:
        self.last = state["last"]


class Ratio:
    """Turns collected steps into owed updates at a fixed ratio, carrying fractions.

    ``Ratio(0.25).owed(10)`` -> 2, then ``owed(2)`` -> 1 (the 0.5 carried over).
    """

    def __init__(self, updates_per_step: float):
        self.updates_per_step = updates_per_step
        self.credit = 0.0

    def owed(self, new_steps: int) -> int:
        self.credit += new_steps * self.updates_per_step
        whole = int(self.credit + 1e-9)  # 3 * (1/3) must pay out 1, not 0
        self.credit -= whole
        return whole

    def refund(self, unpaid: int) -> None:
        """Owed updates not made (the run stopped mid-batch) stay owed, for a resume."""
        self.credit += unpaid

    def state_dict(self) -> dict:
        return {"credit": self.credit}

    def load_state_dict(self, state: dict) -> None:
        self.credit = state["credit"]
