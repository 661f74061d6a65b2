"""Where the sim tests find their data: tiny golden traces here, the real trace beside the repo."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
TRACE = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
