"""The callback every stage reports progress through: (items done, items in all)."""
from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[int, int], None]
