"""The demo's first part: the sample models, each committed variant on a sample input.

What ``edge-agent infer --model M --variant V --input FILE`` does, in this
process rather than one process per variant: the same reader of images (the
manifest's preprocessing), the same runtime layer. The digits are two
held-out digits saved as 64x64 pictures, white on black as the data set draws
them: one the light model is sure of and one it is not, so the variants'
answers can differ. BlazeFace, when ``tools/fetch_models.py`` has fetched it,
looks at a photo with a face.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edge_agent.cli.infer_cmd import read_input
from edge_core.package import ModelPackage
from edge_core.report import render_table
from edge_core.repository import ModelRepository
from edge_core.runtime import RuntimeOptions, open_variant

from .common import Array
from .inputs import Inputs

DIGIT_MODELS = ("digits-light", "digits-heavy")
FACES = "face-detection-short-range"  # BlazeFace
FACE_SCORE = 0.65  # BlazeFace's threshold as a chosen detector (edge_agent.privacy.faces.spec_for)
TIMED_RUNS = 20
OPTIONS = RuntimeOptions(threads=1, warmup=3)


def save_digit(pixels: Array, path: Path) -> Path:
    """A held-out digit (64 values, 0..16) as a user would save it: 64x64, white on black."""
    import cv2

    image = (pixels.reshape(8, 8) * (255.0 / 16.0)).astype(np.uint8)
    cv2.imwrite(str(path), cv2.resize(image, (64, 64), interpolation=cv2.INTER_NEAREST))
    return path


def classified(package: ModelPackage, outputs: dict[str, Array]) -> str:
    scores = outputs[package.outputs[0].name][0]
    best = int(scores.argmax())
    label = package.labels[best] if best < len(package.labels) else str(best)
    return f"{label} ({scores[best]:.2f})"


def face_found(outputs: dict[str, Array]) -> str:
    logits = np.clip(outputs["classificators"].astype(np.float64), -100.0, 100.0)
    best = float((1.0 / (1.0 + np.exp(-logits))).max())
    return f"face ({best:.2f})" if best >= FACE_SCORE else f"no face (best {best:.2f})"


def median_ms(run: Callable[[dict[str, Array]], object], inputs: dict[str, Array]) -> float:
    times = []
    for _ in range(TIMED_RUNS):
        started = time.perf_counter()
        run(inputs)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def show_variants(repository: ModelRepository, inputs: Inputs, work: Path) -> None:
    """Print a table: model, variant, backend, input, the answer and its latency."""
    photo = inputs.photo_file
    sure = save_digit(inputs.sure, work / f"digit-{inputs.sure_truth}.png")
    unsure = save_digit(inputs.unsure, work / f"digit-{inputs.unsure_truth}.png")
    print("== the sample models: each committed variant, as `edge-agent infer --variant` runs it")
    print(
        f"  inputs: {sure.name} (truth {inputs.sure_truth}) and {unsure.name} "
        f"(truth {inputs.unsure_truth}), held-out digits as 64x64 pictures"
        + (f"; {photo.name} for BlazeFace" if repository.versions(FACES) else "")
    )
    models = [name for name in (*DIGIT_MODELS, FACES) if repository.versions(name)]
    rows = []
    for name in models:
        package = repository.get(name)
        files = [sure, unsure] if name != FACES else [photo]
        tensors = [(path.name, read_input(package, path)) for path in files]
        for variant in package.variants:
            session = open_variant(package, variant, OPTIONS)
            try:
                for file, tensor in tensors:
                    outputs = session.run(tensor)
                    said = face_found(outputs) if name == FACES else classified(package, outputs)
                    latency = median_ms(session.run, tensor)
                    rows.append([name, variant.id, session.backend, file, said, f"{latency:7.3f}"])
            finally:
                session.close()
    print(render_table(["model", "variant", "backend", "input", "answer", "ms"], rows))
    print(f"  batch 1, one thread, latency: the median of {TIMED_RUNS} runs after warm-up")
    print()
