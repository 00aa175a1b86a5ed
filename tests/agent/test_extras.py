"""A device without an extra: what needs it says which extra to install, the rest works.

Each case runs in a fresh interpreter where a library is absent the way Python marks
one absent (``sys.modules[name] = None``: every import of it raises ImportError), so
nothing of this process is patched. tests/e2e/test_footprint.py installs a LiteRT-only
device for real."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edge_core.errors import MissingExtraError
from edge_core.status import status_of
from tests.support.paths import ROOT

WITHOUT_OPENCV = """
import json, sys, tempfile
from pathlib import Path
sys.modules["cv2"] = None  # not installed
sys.path.insert(0, {root!r})
import numpy as np
from edge_core.errors import MissingExtraError
out = {{}}

def attempt(name, call):
    try:
        call()
        out[name] = "ran"
    except MissingExtraError as exc:
        out[name] = str(exc)

from edge_core import imaging
from edge_agent.privacy.faces import Face
from edge_agent.privacy.redact import Redaction, hide
from edge_core.images import probe
noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
blob = imaging.encode(noise, "png")
picture = imaging.decode(blob, probe(blob))
hidden = hide(picture, [Face(16, 16, 48, 48, 0.9)], Redaction("blur"))
out["pictures"] = [bool((picture == noise).all()), bool((hidden != picture).any())]

from edge_agent.privacy.video import redact_video
attempt("video", lambda: redact_video(Path("clip.mp4"), Path(tempfile.mkdtemp()) / "o.mp4",
                                      None, None, Redaction()))
from edge_agent.streams import open_capture
attempt("stream", lambda: open_capture("/dev/video0"))
from edge_agent.decoders import _regions
attempt("text", lambda: _regions(np.zeros((32, 32), np.float32)))
print(json.dumps(out))
"""


def run(script: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_without_opencv_pictures_work_and_video_names_its_extra() -> None:
    out = run(WITHOUT_OPENCV.format(root=str(ROOT)))
    assert out.pop("pictures") == [True, True]  # decoded, written, blurred without it
    for what, message in out.items():
        assert isinstance(message, str)
        assert "needs OpenCV, which is not installed here" in message, what
        assert "pip install 'edge-inference[video]'" in message, what
    assert "redacting a video" in str(out["video"])
    assert "PP-OCR's text regions" in str(out["text"])


def test_without_pillow_a_picture_says_the_install_is_broken() -> None:
    script = f"""
import sys
sys.modules["PIL"] = None
sys.path.insert(0, {str(ROOT)!r})
from edge_core.pictures import decode_image
from edge_core.errors import MissingExtraError
try:
    decode_image(b"\\xff\\xd8\\xff\\xc0\\x00\\x11\\x08\\x00\\x10\\x00\\x10\\x03" + bytes(64))
except MissingExtraError as exc:
    print(exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reading pictures needs Pillow" in done.stdout
    assert "reinstall it" in done.stdout


def test_a_missing_extra_is_answered_501_not_an_internal_error() -> None:
    status = status_of(MissingExtraError("a stream needs OpenCV"))
    assert (status.http, status.grpc, status.kind) == (501, "UNIMPLEMENTED", "not_installed")
    assert status.message == "a stream needs OpenCV"


@pytest.mark.parametrize(("module", "extra"), [("onnx", "onnx"), ("litert", "litert")])
def test_a_missing_runtime_names_its_extra(module: str, extra: str) -> None:
    blocked = {"onnx": ["onnxruntime"], "litert": ["ai_edge_litert", "tflite_runtime"]}[module]
    script = f"""
import sys
for name in {blocked!r}:
    sys.modules[name] = None
sys.path.insert(0, {str(ROOT)!r})
from edge_core.errors import BackendUnavailableError
from edge_core.runtime import open_model
try:
    open_model({"onnx" if module == "onnx" else "tflite"!r}, b"")
except BackendUnavailableError as exc:
    print(exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"pip install 'edge-inference[{extra}]'" in done.stdout
