"""Shared fixtures. Tests never download: tiny models are built from configs with random weights."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # for `mock_models`

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
