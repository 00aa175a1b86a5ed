"""``make demo``: the agent's command line on the sample models and real images.

Runs ``edge-agent`` the way a user would: detects the device profile, lists
the models, classifies a few held-out digits (saved as 64x64 PNG files, as a
user would draw them) with every variant of ``digits-light`` and
``digits-heavy``, and runs the BlazeFace face detector on scikit-image's
``astronaut.png`` and ``coffee.png``. Prints each command, the answer and the
latency, then a summary table.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_agent.bench.report import render_table  # noqa: E402
from edge_agent.package import ModelRepository  # noqa: E402


def edge_agent(*args: str) -> str:
    command = [sys.executable, "-m", "edge_agent", *args]
    print("$ edge-agent " + " ".join(shlex.quote(a) for a in args), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        raise SystemExit(f"edge-agent {' '.join(args)} failed")
    return result.stdout


def write_digit(repository: ModelRepository, folder: Path, index: int) -> tuple[Path, int]:
    import cv2

    inputs, labels = repository.get("digits-light").evaluation()
    image = (inputs[index].reshape(8, 8).astype(np.float32) * 255.0 / 16.0).astype(np.uint8)
    path = folder / f"digit-{index}.png"
    cv2.imwrite(str(path), cv2.resize(image, (64, 64), interpolation=cv2.INTER_NEAREST))
    return path, int(labels[index])


def face_score(result: dict[str, Any]) -> float:
    logits = np.asarray(result["outputs"]["classificators"]["data"], dtype=np.float64)
    return float((1.0 / (1.0 + np.exp(-np.clip(logits, -100, 100)))).max())


def main() -> int:
    repository = ModelRepository(ROOT / "models")
    detected = json.loads(edge_agent("profile", "detect"))
    print(f"  -> profile {detected['profile']} ({detected['reason']})\n")
    print(edge_agent("models", "list"))

    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        digits = [write_digit(repository, Path(tmp), i) for i in (0, 7, 42)]
        for model in ("digits-light", "digits-heavy"):
            for variant in repository.get(model).variants:
                for path, label in digits:
                    out = json.loads(
                        edge_agent(
                            "infer", "--model", model, "--variant", variant.id, "--input", str(path)
                        )
                    )
                    top = out["top_k"][0][0]
                    print(
                        f"  -> {variant.id}: digit {label} classified as {top['label']} "
                        f"({top['score']:.3f}) in {out['latency_ms']:.3f} ms"
                    )
                    rows.append(
                        [
                            model,
                            variant.id,
                            path.name,
                            label,
                            top["label"],
                            top["score"],
                            out["latency_ms"],
                        ]
                    )
        print()

    from skimage import data

    images = Path(data.__file__).parent
    for name in ("astronaut.png", "coffee.png"):
        out = json.loads(
            edge_agent(
                "infer",
                "--model",
                "face-detection-short-range",
                "--input",
                str(images / name),
                "--full",
            )
        )
        score = face_score(out)
        print(f"  -> {name}: highest face score {score:.2f} in {out['latency_ms']:.3f} ms")
        rows.append(
            [
                "face-detection-short-range",
                out["variant"],
                name,
                None,
                None,
                round(score, 3),
                out["latency_ms"],
            ]
        )

    print("\nsummary")
    print(
        render_table(["model", "variant", "input", "truth", "answer", "score", "latency ms"], rows)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
