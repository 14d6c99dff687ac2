"""What every checker here prints: `PASS name` or `FAIL name: reason` (one
line), and `N passed, N failed` last, which smoke.sh adds up."""
from __future__ import annotations

import os
import threading


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, ok: bool, reason: str = "") -> bool:
        reason = " ".join(reason.split())  # one line
        if ok:
            self.passed += 1
            print(f"PASS {name}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {name}: {reason}", flush=True)
        return ok

    def skip(self, name: str, reason: str) -> None:
        print(f"SKIP {name}: {reason}", flush=True)

    def summary(self) -> str:
        return f"{self.passed} passed, {self.failed} failed"

    def start_watchdog(self, seconds: float) -> threading.Timer:
        """Last resort if something blocks outside the checker's own timeouts:
        after `seconds`, a failed check, the summary, and exit 1. Cancel the
        returned timer when done."""
        def fire() -> None:
            print(f"FAIL watchdog: still running {seconds:.0f}s after the start", flush=True)
            print(f"{self.passed} passed, {self.failed + 1} failed", flush=True)
            os._exit(1)

        timer = threading.Timer(seconds, fire)
        timer.daemon = True
        timer.start()
        return timer
