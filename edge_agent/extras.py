"""The optional parts of an install, and the one error when a feature's is missing.

A device installs what its profile and configuration use (``pyproject.toml`` says why
each is there; docs/install.md has the table):

- the base: NumPy, Pillow (every picture: decoding, resizing, redaction), prometheus-client;
- ``litert``: LiteRT, for ``.tflite`` variants; ``onnx``: ONNX Runtime, for ``.onnx`` ones;
- ``video``: OpenCV (headless), for videos (``edge-agent redact`` on a clip), streams
  (``[[streams]]``: cameras, RTSP, files) and PP-OCR's text regions;
- ``device``: all of them with ``offload``, ``ota``, ``mqtt`` and ``service``.

Each library is imported where it is first used, through :func:`require`: a device
without it runs everything else, and the feature that needs it fails with a
:class:`~edge_core.errors.MissingExtraError` naming the extra to install, not a
``ModuleNotFoundError`` of a module the operator never heard of.
"""

from __future__ import annotations

from types import ModuleType

from edge_core.extras import require

__all__ = ["opencv", "require"]


def opencv(purpose: str) -> ModuleType:
    """OpenCV, which only video, streams and PP-OCR's text regions need.

    Raises:
        MissingExtraError: it is not installed (the ``video`` extra).
    """
    return require("cv2", "OpenCV", "video", purpose)
