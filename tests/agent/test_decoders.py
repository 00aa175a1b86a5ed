"""Readable results: each model family's outputs decoded to boxes (the real models on
real photographs), mapped onto the picture they came from, and `edge-agent infer`
printing boxes, not tensors, unless asked."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from skimage import data

from edge_agent.decoders import decoder_for, detections
from edge_agent.results import describe_outputs, per_row
from edge_core.package import ModelPackage
from edge_core.pictures import image_to_tensor
from edge_core.repository import ModelRepository
from edge_core.runtime import RuntimeOptions, open_best
from edge_core.tensors import TensorSpec
from tests.support.paths import MODELS

FACE = (180, 60, 270, 178)  # the astronaut's face in the 512x512 photograph (x0, y0, x1, y1)
FACE_MODELS = ("face-detection-short-range", "face-detection-full-range",
               "face-detection-centerface")  # fmt: skip


def run(package: ModelPackage, bgr: np.ndarray) -> dict[str, np.ndarray]:
    _, session = open_best(package, RuntimeOptions(threads=1, warmup=0))
    pre = package.preprocessing
    assert pre is not None
    return session.run({pre.input: image_to_tensor(bgr, pre)})


def iou(a: Any, b: Any) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union


@pytest.mark.parametrize("model", FACE_MODELS)
def test_each_face_detector_finds_the_astronauts_face_in_the_pictures_pixels(
    fetched: ModelRepository, model: str
) -> None:
    package = fetched.get(model)
    photo = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    # stretched copies too; 1280 x 720 is not a multiple of 32 high (CenterFace's 704)
    for scale_x, scale_y in ((1.0, 1.0), (1.5, 0.75), (2.5, 720 / 512)):
        picture = cv2.resize(photo, (round(512 * scale_x), round(512 * scale_y)))
        found = detections(package, run(package, picture), picture.shape[:2])
        assert found is not None and found["coordinates"] == "image"
        (row,) = found["detections"]
        assert [d["label"] for d in row] == ["face"], row
        face = (FACE[0] * scale_x, FACE[1] * scale_y, FACE[2] * scale_x, FACE[3] * scale_y)
        assert iou(row[0]["box"], face) > 0.5 and row[0]["score"] > 0.8


@pytest.mark.parametrize("model", FACE_MODELS)
def test_a_photograph_without_a_face_gives_no_box(fetched: ModelRepository, model: str) -> None:
    package = fetched.get(model)
    coffee = cv2.cvtColor(data.coffee(), cv2.COLOR_RGB2BGR)
    found = detections(package, run(package, coffee))
    assert found is not None and found["detections"] == [[]]
    assert found["coordinates"] == "input"  # no picture size given: the input's pixels


def test_the_text_detector_boxes_each_line_of_a_page(fetched: ModelRepository) -> None:
    package = fetched.get("ppocr-det")
    page = cv2.cvtColor(data.page(), cv2.COLOR_GRAY2BGR)  # 191 x 384, five lines of text
    found = detections(package, run(package, page), page.shape[:2])
    assert found is not None
    (row,) = found["detections"]
    assert len(row) >= 5 and {d["label"] for d in row} == {"text"}
    for d in row:
        x0, y0, x1, y1 = d["box"]
        assert 0 <= x0 < x1 <= 384 and 0 <= y0 < y1 <= 191
    wide = [d for d in row if d["box"][2] - d["box"][0] > 250]
    assert len(wide) >= 3  # lines across the page, not letters


def test_text_regions_grow_back_as_db_shrinks_them() -> None:
    package = ModelRepository(MODELS).get("digits-light")  # any package: only its task counts
    text = replace(
        package, task="segmentation", outputs=(TensorSpec("map", "FP32", (-1, 1, -1, -1)),)
    )
    probability = np.zeros((1, 1, 100, 200), np.float32)
    probability[0, 0, 40:50, 20:120] = 0.9  # a line, 100 x 10
    probability[0, 0, 80:82, 150:152] = 0.9  # a speck: below the smallest area
    (row,) = detections(text, {"map": probability})["detections"]  # type: ignore[index]
    (line,) = row
    grow = 100 * 10 * 1.5 / (2 * 110)
    assert line["box"] == pytest.approx([20 - grow, 40 - grow, 120 + grow, 50 + grow], abs=0.1)
    assert line["score"] == pytest.approx(0.9)


def test_models_no_family_reads_have_no_decoder() -> None:
    light = ModelRepository(MODELS).get("digits-light")
    assert decoder_for(light) is None  # a classifier: its top labels are its reading
    described = describe_outputs(light, {"probabilities": np.eye(10, dtype=np.float32)[:2]})
    assert "outputs" not in described and len(per_row(described)) == 2
    assert per_row({"outputs": {}}) == []


def cli(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "edge_agent", *args], capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.slow
def test_infer_prints_boxes_and_the_tensors_only_when_asked(
    fetched: ModelRepository, tmp_path: Path
) -> None:
    picture = tmp_path / "astronaut.png"
    cv2.imwrite(str(picture), cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR))
    args = ("infer", "--model", "face-detection-short-range", "--input", str(picture),
            "--profile", "generic-x86_64", "--model-dir", str(fetched.root))  # fmt: skip
    answer = cli(*args)
    assert "outputs" not in answer and answer["coordinates"] == "image"
    (face,) = answer["detections"][0]
    assert iou(face["box"], FACE) > 0.5
    raw = cli(*args, "--raw")
    assert raw["detections"] == answer["detections"]
    assert raw["outputs"]["regressors"]["shape"] == [1, 896, 16]
    assert "summary" in raw["outputs"]["regressors"]  # large: summarised unless --full


def test_pictures_of_different_sizes_for_a_model_that_keeps_each_size_are_a_400(
    fetched: ModelRepository,
) -> None:
    from edge_agent.preprocess import encoded_pictures
    from edge_core.errors import InputError

    package = fetched.get("face-detection-centerface")  # sides kept, rounded to 32
    photo = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    files = [cv2.imencode(".png", p)[1].tobytes() for p in (photo, photo[:256, :320])]
    with pytest.raises(InputError, match="pictures of different sizes"):
        encoded_pictures(package, {"input.1": np.array(files, dtype=object)})
    inputs, sizes = encoded_pictures(package, {"input.1": np.array(files[:1], dtype=object)})
    assert inputs["input.1"].shape == (1, 3, 512, 512) and sizes == [(512, 512)]


def test_results_are_strict_json() -> None:
    from edge_agent.results import json_line

    assert json_line({"score": float("nan"), "box": [1.0, float("inf")]}) == (
        '{"score":null,"box":[1.0,null]}'
    )
