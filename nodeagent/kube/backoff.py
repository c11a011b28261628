"""Waits between the rounds of a loop that retries (a watch, the publisher), with jitter.

tenacity's random exponential wait ("full jitter": uniform between 0 and the exponential
bound), so a thousand agents that lose the API server together do not come back to it in
lockstep. The loops are not single function calls, so tenacity's decorator does not fit;
its wait strategy does.
"""

from __future__ import annotations

from tenacity import RetryCallState, wait_random_exponential


class Backoff:
    def __init__(self, first: float = 0.5, cap: float = 30.0) -> None:
        self._wait = wait_random_exponential(multiplier=first, max=cap)
        self.attempts = 0

    def next(self) -> float:
        """Seconds to wait before the next attempt: random in [0, min(cap, first x 2^n)]."""
        self.attempts += 1
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = self.attempts
        return float(self._wait(state))

    def reset(self) -> None:
        """It worked: the next failure starts from the first wait again."""
        self.attempts = 0
