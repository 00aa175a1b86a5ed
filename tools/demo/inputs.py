"""The demo's inputs, chosen at run time from the held-out digits and scikit-image's photos."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_core.package import ModelPackage
from edge_core.repository import ModelRepository

from .common import Array, DemoError, Describe


@dataclass(frozen=True)
class Inputs:
    """Chosen at run time: held-out digits and a photo that scikit-image ships."""

    sure: Array
    sure_truth: int
    unsure: Array
    unsure_truth: int
    unsure_light: str  # what the light model says of the unsure digit
    photo: Array
    photo_name: str
    photo_file: Path


def choose_inputs(repository: ModelRepository) -> Inputs:
    """The held-out digit the light model is surest of, and one it is unsure of
    (well below the policy's 0.9; one it gets wrong and the heavy model gets
    right when there is one), by their INT8 ONNX variants."""
    from skimage import data

    from edge_core.pictures import decode_image, image_to_tensor
    from edge_core.runtime import RuntimeOptions, open_best

    light, heavy = repository.get("digits-light"), repository.get("digits-heavy")
    x, truth = light.evaluation()
    x = x.astype(np.float32)

    def probabilities(package: ModelPackage, batch: Array) -> Array:
        _, session = open_best(
            package, RuntimeOptions(threads=1, warmup=0), precisions=("int8", "fp32"),
            formats=("onnx",),
        )  # fmt: skip
        try:
            return np.asarray(session.run({"pixels": batch})["probabilities"])
        finally:
            session.close()

    p = probabilities(light, x)
    confidence = p.max(axis=1)
    sure = int(np.argmax(confidence))
    candidates = [int(i) for i in np.argsort(confidence)[:20] if confidence[i] < 0.7]
    if not candidates:
        raise DemoError("no held-out digit leaves the light model unsure")
    heavy_says = probabilities(heavy, x[candidates]).argmax(axis=1)
    fixed = [
        i
        for i, h in zip(candidates, heavy_says, strict=True)
        if p[i].argmax() != truth[i] and h == truth[i]
    ]
    unsure = (fixed or candidates)[0]
    photo = Path(data.__file__).parent / "astronaut.png"
    ppocr = repository.get("ppocr-det")
    if ppocr.preprocessing is None:
        raise DemoError("ppocr-det's manifest has no preprocessing")
    return Inputs(
        sure=x[sure : sure + 1],
        sure_truth=int(truth[sure]),
        unsure=x[unsure : unsure + 1],
        unsure_truth=int(truth[unsure]),
        unsure_light=f"{int(p[unsure].argmax())} ({confidence[unsure]:.2f})",
        photo=image_to_tensor(decode_image(photo.read_bytes()), ppocr.preprocessing),
        photo_name=photo.name,
        photo_file=photo,
    )


def digit(truth: int) -> Describe:
    def describe(outputs: dict[str, Array]) -> str:
        p = outputs["probabilities"][0]
        return f"{int(p.argmax())} ({p.max():.2f}), truth {truth}"

    return describe


def text_map(outputs: dict[str, Array]) -> str:
    shape = next(iter(outputs.values())).shape
    return "text map " + "x".join(str(n) for n in shape[2:])
