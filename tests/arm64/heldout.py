"""Each sample variant's predictions on its held-out split, as JSON on stdout.

Run by tests/arm64/test_emulated.py twice on the same rows: by the emulated aarch64
interpreter and by this machine's. It imports the installed package only (it is run
from a folder outside the checkout), opens each variant with the Raspberry Pi 5
profile's runtime options, and takes every k-th row where ``limits`` (the first
argument, JSON: ``{"digits-heavy/onnx-fp32": 40}``) caps a slow variant's rows."""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
import sys
import time

import numpy as np

from edge_agent.profiles import ProfileStore
from edge_core.paths import default_model_dir, default_profiles_dir
from edge_core.repository import ModelRepository
from edge_core.runtime import open_variant

MODELS = ("digits-light", "digits-heavy")
LIBRARIES = ("numpy", "onnxruntime", "ai-edge-litert")


def main() -> None:
    limits = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    options = ProfileStore(default_profiles_dir()).get("raspberry-pi-5").runtime
    repository = ModelRepository(default_model_dir())
    variants = {}
    for name in MODELS:
        package = repository.get(name)
        inputs, labels = package.evaluation()
        feed, output = package.inputs[0].name, package.outputs[0].name
        for variant in package.variants:
            limit = limits.get(f"{name}/{variant.id}", len(labels))
            rows = np.arange(0, len(labels), math.ceil(len(labels) / limit))
            session = open_variant(package, variant, options)
            batched = all(spec.shape and spec.shape[0] < 0 for spec in session.inputs)
            step = 64 if batched else 1
            start = time.monotonic()
            scores = np.concatenate([
                session.run({feed: inputs[rows[i : i + step]]})[output]
                for i in range(0, len(rows), step)
            ])  # fmt: skip
            variants[f"{name}/{variant.id}"] = {
                "rows": rows.tolist(),
                "of": len(labels),
                "correct": int(np.sum(np.argmax(scores, axis=-1) == labels[rows])),
                "predictions": np.argmax(scores, axis=-1).tolist(),
                "scores": np.round(scores.astype(np.float64), 6).tolist(),
                "backend": session.backend,
                "device": session.device,
                "seconds": round(time.monotonic() - start, 2),
            }
            session.close()
    versions = {lib: importlib.metadata.version(lib) for lib in LIBRARIES}
    print(json.dumps({"machine": platform.machine(), "versions": versions, "variants": variants}))


if __name__ == "__main__":
    main()
