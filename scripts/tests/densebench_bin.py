"""The densebench binary the script tests run end to end: `DENSEBENCH_BIN`, else
target/release/densebench, else target/debug/densebench (the one `cargo test` builds)."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def binary() -> str | None:
    """The first of those that can be run; None when there is none (the tests say `skipped`)."""
    for path in (os.environ.get("DENSEBENCH_BIN"),
                 os.path.join(ROOT, "target", "release", "densebench"),
                 os.path.join(ROOT, "target", "debug", "densebench")):
        if path and os.access(path, os.X_OK):
            return path
    return None
