"""Where the checkout's models and device profiles are."""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODELS", "PROFILES", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
PROFILES = ROOT / "device_profiles"
