"""Where the bundled device profiles and sample models are.

From a checkout (an editable install) they are the repository's
``device_profiles/`` and ``models/``; from a wheel, the copies packaged
under ``edge_agent/_data/``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PACKAGE_MODELS", "default_model_dir", "default_profiles_dir"]

_PACKAGE = Path(__file__).resolve().parent
PACKAGE_MODELS = _PACKAGE / "_data/models"  # the models an installed wheel ships


def _first_existing(*candidates: Path) -> Path:
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return candidates[0]


def default_profiles_dir() -> Path:
    return _first_existing(_PACKAGE.parent / "device_profiles", _PACKAGE / "_data/device_profiles")


def default_model_dir() -> Path:
    return _first_existing(_PACKAGE.parent / "models", PACKAGE_MODELS)
