"""The oracle itself behind the Backend protocol, so every harness path runs on a CPU."""

from __future__ import annotations

from typing import Any

__all__ = ["EmulatedBackend"]


class EmulatedBackend:
    """Pure-PyTorch emulation; usable everywhere. GEMM and linear arrive with the recipes."""

    name = "emulated"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, recipe: Any) -> tuple[bool, str]:
        return True, ""
