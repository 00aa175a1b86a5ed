"""A LiteRT-only device, installed for real: the wheel with the ``litert`` extra alone in a
fresh virtual environment (tools/footprint.py's, no checkout on its path), started as
systemd starts it on the raspberry-pi-5 profile. It serves pictures and the privacy path
with CenterFace on LiteRT, with neither OpenCV nor ONNX Runtime installed, and a video
says which extra it needs. Then the footprint tool's own arithmetic."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from skimage import data

from edge_agent.profiles import ProfileStore
from edge_core.processes import free_port
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS, PROFILES, ROOT
from tests.support.services import need
from tools import footprint

pytestmark = pytest.mark.registry


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, as `make wheel` builds it."""
    return footprint.build_wheel(tmp_path_factory.mktemp("wheel") / "dist")


@pytest.fixture(scope="module")
def litert_device(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[Path]:
    need("registry")
    tmp = tmp_path_factory.mktemp("litert-device")
    footprint.make_venv(tmp / "venv", wheel, "litert")
    yield tmp / "venv"
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_the_wheel_holds_the_three_packages_and_no_benchmark(wheel: Path) -> None:
    """The project's benchmarks live in benchmarks/, outside the wheel; what an operator
    measures with (a model's latency, load on a running gateway) stays in the product."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert tops == {"edge_core", "edge_agent", "cloud_gateway"}
    modules = [name for name in names if name.endswith(".py")]
    assert [m for m in modules if "bench" in m or "/peers/" in m] == []
    assert {"edge_agent/latency.py", "cloud_gateway/loadgen.py", "edge_core/report.py"} <= set(
        modules
    )


def file_of(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def held_out_digits(count: int) -> tuple[list[bytes], list[int]]:
    """The first held-out digits of the sample model, each a 64x64 PNG as a user sends."""
    inputs, labels = ModelRepository(MODELS).get("digits-light").evaluation()
    files = []
    for row in inputs[:count]:
        picture = np.clip(row.reshape(8, 8) * (255 / 16), 0, 255).astype(np.uint8)
        files.append(file_of(Image.fromarray(np.kron(picture, np.ones((8, 8), np.uint8))), "PNG"))
    return files, [int(label) for label in labels[:count]]


@pytest.mark.slow
def test_a_litert_only_device_serves_pictures_and_privacy_without_opencv_or_onnx(
    litert_device: Path, tmp_path: Path
) -> None:
    import tritonclient.http as thttp

    python = litert_device / "bin" / "python"
    absent = subprocess.run(
        [str(python), "-c", "import importlib.util as u; "
         "print([m for m in ('cv2', 'onnxruntime', 'ai_edge_litert', 'PIL') if u.find_spec(m)])"],
        capture_output=True, text=True, check=True, cwd="/", env=footprint.CLEAN,
    )  # fmt: skip
    assert absent.stdout.strip() == "['ai_edge_litert', 'PIL']"
    models = tmp_path / "models"
    shutil.copytree(MODELS / "digits-light", models / "digits-light")
    port = free_port()
    config = footprint.agent_config(tmp_path, "raspberry-pi-5", models, port)
    with footprint.started(python, config, tmp_path) as pid:
        client = thttp.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
        try:
            photo = thttp.InferInput("image", [1], "BYTES")
            photo.set_data_from_numpy(np.array([file_of(Image.fromarray(data.astronaut()),
                                                         "JPEG")], dtype=object))  # fmt: skip
            redacted = client.infer("redact", [photo])
            assert redacted.as_numpy("faces").tolist() == [1]  # CenterFace, on LiteRT
            files, labels = held_out_digits(20)
            digits = thttp.InferInput("pixels", [len(files)], "BYTES")
            digits.set_data_from_numpy(np.array(files, dtype=object))
            answer = client.infer("digits-light", [digits]).as_numpy("probabilities")
            assert answer is not None and answer.shape == (20, 10)
            assert sum(map(int.__eq__, answer.argmax(axis=1).tolist(), labels)) >= 18
        finally:
            client.close()
        assert footprint.loaded_variants(port) == {"digits-light": "tflite-int8"}
        assert footprint.loaded_libraries(pid) == ["LiteRT", "Pillow"]
    clip = tmp_path / "clip.avi"
    clip.write_bytes(b"RIFF\x00\x00\x00\x00AVI LIST")
    video = subprocess.run(
        [str(litert_device / "bin" / "edge-agent"), "redact", str(clip), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd="/", env=footprint.CLEAN,
    )  # fmt: skip
    assert video.returncode != 0 and "not redacted" in video.stderr
    (said,) = json.loads(video.stdout)
    assert "redacting a video needs OpenCV" in said["error"]
    assert "pip install 'edge-inference[video]'" in said["error"]


def test_disk_usage_counts_blocks_by_distribution_and_hard_links_once(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "tiny").mkdir(parents=True)
    (site / "tiny" / "__init__.py").write_bytes(b"x" * 10_000)
    os.link(site / "tiny" / "__init__.py", site / "tiny" / "again.py")
    (site / "tiny-1.0.dist-info").mkdir()
    (site / "tiny-1.0.dist-info" / "RECORD").write_text(
        "tiny/__init__.py,,\ntiny/again.py,,\ntiny-1.0.dist-info/RECORD,,\n"
    )
    (site / "stray.pth").write_text("x")
    total, by_name = footprint.disk_usage(site)
    block = os.stat(site / "stray.pth").st_blocks * 512
    assert set(by_name) == {"tiny", "other"} and by_name["other"] == block
    assert by_name["tiny"] >= 10_000 and total == by_name["tiny"] + block


def test_the_install_guide_names_the_extra_of_each_profiles_preferred_format() -> None:
    """docs/install.md's table of extras lists every bundled profile once, under the
    runtime of the format it prefers."""
    page = (ROOT / "docs" / "install.md").read_text()
    listed = {}
    for extra, names in re.findall(r"<!-- profiles:(\w+) -->(.*?) \|", page):
        for name in re.findall(r"`([\w-]+)`", names):
            assert name not in listed, f"{name} listed twice"
            listed[name] = extra
    runtime = {"tflite": "litert", "onnx": "onnx"}
    assert listed == {p.id: runtime[p.formats[0]] for p in ProfileStore(PROFILES)}
