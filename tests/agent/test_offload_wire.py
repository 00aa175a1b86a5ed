"""The form a request leaves in: pictures encoded from the input tensor (and made the
same tensor again by the gateway's shared code), the quality stepping down within the
manifest's bounds, other tensors packed; each only where the gateway takes it."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest
from skimage import data

from edge_agent.offload.wire import (
    QUALITY_STEP,
    WireForm,
    encode_pictures,
    packed_form,
    wire_bytes,
    wire_form,
)
from edge_core.package import ModelPackage
from edge_core.pictures import image_to_tensor, pictures_to_tensor
from edge_core.protocol import packed
from edge_core.protocol.types import InferRequest
from edge_core.repository import ModelRepository

BOTH = frozenset({"edge_pictures", "edge_compression"})


@pytest.fixture(scope="module")
def ppocr(fetched: ModelRepository) -> ModelPackage:
    return fetched.get("ppocr-det")


def frame(package: ModelPackage) -> InferRequest:
    """A 640x480 photograph as PP-OCR's detector's input tensor (1x3x480x640 FP32)."""
    pre = package.preprocessing
    assert pre is not None
    bgr = cv2.resize(cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR), (640, 480))
    tensor = image_to_tensor(bgr, pre)
    return InferRequest(inputs={"x": tensor}, datatypes={"x": "FP32"}, model_name=package.name)


def quality_of(form: WireForm, request: InferRequest, package: ModelPackage) -> int:
    """The JPEG quality a form's picture was encoded at (encoding is deterministic)."""
    pre = package.preprocessing
    assert pre is not None
    sent = form.request.inputs["x"][0]
    for quality in range(100, 0, -1):
        if encode_pictures(request, pre, "jpeg", quality).inputs["x"][0] == sent:
            return quality
    raise AssertionError("not a JPEG of this picture at any quality")


def test_a_picture_leaves_as_a_jpeg_that_the_gateway_makes_the_same_tensor_again(
    ppocr: ModelPackage,
) -> None:
    request = frame(ppocr)
    tensor = request.inputs["x"]
    assert tensor.shape == (1, 3, 480, 640) and tensor.nbytes == 3_686_400
    form = wire_form(request, ppocr, BOTH, picture_format="jpeg", quality=90)
    assert form.raw_bytes == tensor.nbytes and quality_of(form, request, ppocr) == 90
    files = form.request.inputs["x"]
    assert form.request.datatypes == {"x": "BYTES"} and files.shape == (1,)
    assert files[0][:2] == b"\xff\xd8"  # a JPEG
    assert wire_bytes(form.request) <= tensor.nbytes / 20
    pre = ppocr.preprocessing
    assert pre is not None
    again, sizes = pictures_to_tensor(list(files), pre, ppocr.name, max_pixels=10**7)
    assert sizes == [(480, 640)] and again.shape == tensor.shape  # nothing resized
    # the tensor's values span [-1, 1]; a JPEG at quality 90 moves them by little
    assert np.abs(again - tensor).mean() < 0.02


def test_a_model_that_needs_every_pixel_gets_a_png_and_the_exact_tensor(
    ppocr: ModelPackage,
) -> None:
    pre = ppocr.preprocessing
    assert pre is not None
    lossless = replace(ppocr, preprocessing=replace(pre, lossless=True))
    form = wire_form(frame(ppocr), lossless, BOTH, picture_format="jpeg", quality=90)
    files = form.request.inputs["x"]
    assert files[0][:4] == b"\x89PNG"
    again, _ = pictures_to_tensor(list(files), pre, ppocr.name, max_pixels=10**7)
    assert np.allclose(again, frame(ppocr).inputs["x"], atol=1e-6)


def test_the_quality_steps_down_to_meet_a_deadline_never_below_the_manifests_floor(
    ppocr: ModelPackage,
) -> None:
    pre = ppocr.preprocessing
    assert pre is not None
    asked: list[int] = []

    def fits(nbytes: int) -> bool:  # a link too slow for anything
        asked.append(nbytes)
        return False

    request = frame(ppocr)
    floor = replace(ppocr, preprocessing=replace(pre, min_quality=50))
    form = wire_form(request, floor, BOTH, picture_format="jpeg", quality=90, fits=fits)
    assert quality_of(form, request, ppocr) == 50
    assert len(asked) == 3 and QUALITY_STEP == 15  # 90, 75, 60; at the floor it leaves as is
    assert asked == sorted(asked, reverse=True)  # each step is smaller
    # enough for quality 75: it stops there
    form = wire_form(
        request, floor, BOTH, picture_format="jpeg", quality=90, fits=lambda n: n < asked[0]
    )
    assert quality_of(form, request, ppocr) == 75
    # no floor in the manifest: the policy's quality is the only one
    none = replace(ppocr, preprocessing=replace(pre, min_quality=None))
    form = wire_form(request, none, BOTH, picture_format="jpeg", quality=90, fits=fits)
    assert quality_of(form, request, ppocr) == 90
    # a floor above the policy's quality: never below it
    high = replace(ppocr, preprocessing=replace(pre, min_quality=80))
    form = wire_form(request, high, BOTH, picture_format="jpeg", quality=50, fits=fits)
    assert quality_of(form, request, ppocr) == 80
    # PNG: nothing to step down
    asked.clear()
    form = wire_form(request, floor, BOTH, picture_format="png", quality=90, fits=fits)
    assert form.request.inputs["x"][0][:4] == b"\x89PNG" and asked == []


def test_pictures_leave_as_tensors_where_a_picture_cannot_stand_for_them(
    ppocr: ModelPackage, repository: ModelRepository
) -> None:
    request = frame(ppocr)
    for package, extensions, fmt in (
        (ppocr, frozenset({"edge_compression"}), "jpeg"),  # the gateway does not take them
        (ppocr, BOTH, "tensor"),  # the policy says so
        (None, BOTH, "jpeg"),  # a model the device does not hold: no manifest to go by
    ):
        form = wire_form(request, package, extensions, picture_format=fmt, quality=90)
        assert form.request is request
    pre = ppocr.preprocessing
    assert pre is not None
    cropped = replace(ppocr, preprocessing=replace(pre, fit="box"))  # would be cropped again
    assert wire_form(request, cropped, BOTH, picture_format="jpeg", quality=90).request is request
    digits = repository.get("digits-light")  # 8x8 grey, flattened: its tensor is smaller
    flat = InferRequest(
        inputs={"pixels": np.zeros((1, 64), np.float32)}, datatypes={"pixels": "FP32"}
    )
    assert wire_form(flat, digits, BOTH, picture_format="jpeg", quality=90).request is flat


def test_other_tensors_are_packed_where_the_gateway_unpacks_and_the_answer_asked_packed() -> None:
    scores = np.zeros((1, 1, 480, 640), np.float32)
    request = InferRequest(inputs={"map": scores}, datatypes={"map": "FP32"}, model_name="m")
    assert packed_form(request, frozenset({"edge_pictures"})) is request
    out = packed_form(request, BOTH)
    assert out.parameters[packed.ASK] is True and packed.PARAMETER in out.parameters
    assert out.datatypes == {"map": "BYTES"} and wire_bytes(out) < 10_000
    small = InferRequest(inputs={"x": np.zeros((1, 4), np.float32)}, datatypes={"x": "FP32"})
    out = packed_form(small, BOTH)
    assert out.parameters == {packed.ASK: True} and out.inputs["x"] is small.inputs["x"]
