"""What every checker here prints: `PASS name` or `FAIL name: reason` (one
line), and `N passed, N failed` last, which smoke.sh adds up."""
from __future__ import annotations


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
