from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_core.errors import ModelNotFoundError, PackageError
from edge_core.manifest import load_package
from edge_core.repository import ModelRepository


def copy_package(repository: ModelRepository, tmp_path: Path, name: str = "digits-light") -> Path:
    target = tmp_path / "repo" / name / "1"
    shutil.copytree(repository.root / name / "1", target)
    return target


def edit_manifest(root: Path, change) -> None:  # type: ignore[no-untyped-def]
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_committed_packages_load(repository: ModelRepository) -> None:
    light = repository.get("digits-light")
    heavy = repository.get("digits-heavy")
    assert {v.id for v in light.variants} == {
        "onnx-fp32",
        "onnx-fp16",
        "onnx-int8",
        "tflite-fp32",
        "tflite-int8",
    }
    assert {v.id for v in heavy.variants} == {"onnx-fp32", "onnx-int8"}
    for package in (light, heavy):
        assert package.inputs[0].shape == (-1, 64)
        assert package.labels == tuple("0123456789")
        inputs, labels = package.evaluation()
        assert inputs.shape == (360, 64) and labels.shape == (360,)
        golden = package.golden()
        assert set(golden.inputs) == {"pixels"} and set(golden.outputs) == {"probabilities"}


def test_accuracy_is_recorded_and_meets_the_bar(repository: ModelRepository) -> None:
    for name in ("digits-light", "digits-heavy"):
        package = repository.get(name)
        fp32 = package.variant("onnx-fp32").accuracy
        assert fp32 is not None and fp32 >= 0.95
        for variant in package.variants:
            assert variant.accuracy is not None
            if variant.precision == "int8":
                assert fp32 - variant.accuracy <= 0.01


def test_heavy_is_more_accurate_than_light(repository: ModelRepository) -> None:
    light = repository.get("digits-light").variant("onnx-fp32").accuracy
    heavy = repository.get("digits-heavy").variant("onnx-fp32").accuracy
    assert heavy is not None and light is not None and heavy > light


def test_newest_version_is_served_unless_asked(repository: ModelRepository, tmp_path: Path) -> None:
    root = copy_package(repository, tmp_path)
    v2 = root.parent / "2"
    shutil.copytree(root, v2)
    edit_manifest(v2, lambda d: d.update(version=2))
    repo = ModelRepository(tmp_path / "repo")
    assert repo.versions("digits-light") == [1, 2]
    assert repo.get("digits-light").version == 2
    assert repo.get("digits-light", 1).version == 1
    with pytest.raises(ModelNotFoundError, match="has no version 3; available versions: 1, 2"):
        repo.get("digits-light", 3)
    with pytest.raises(
        ModelNotFoundError, match=r"unknown model 'nope'.*available models: digits-light"
    ):
        repo.get("nope")


def test_version_must_match_folder(repository: ModelRepository, tmp_path: Path) -> None:
    root = copy_package(repository, tmp_path)
    edit_manifest(root, lambda d: d.update(version=4))
    with pytest.raises(
        PackageError, match=r"manifest.json: version: is 4 but the package lives in folder '1'"
    ):
        load_package(root)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("name"), r"manifest.json: name: missing \(required\)"),
        (
            lambda d: d.update(version="one"),
            r"manifest.json: version: expected an integer >= 1, got 'one'",
        ),
        (
            lambda d: d["inputs"][0].update(datatype="FLOAT"),
            r"inputs\[0\].datatype: expected one of 'BOOL'",
        ),
        (
            lambda d: d["variants"][0].update(format="pt"),
            r"variants\[0\].format: expected one of 'onnx', 'tflite', got 'pt'",
        ),
        (
            lambda d: d["variants"][0].update(sha256="xyz"),
            r"variants\[0\].sha256: expected 64 lowercase hex digits",
        ),
        (
            lambda d: d["variants"][0].update(file="../evil.onnx"),
            r"variants\[0\].file: expected a file name inside the package",
        ),
        (
            lambda d: d["variants"][0].update(file=".."),
            r"variants\[0\].file: expected a file name inside the package",
        ),
        # every path a manifest holds, under the one rule (issue 29, item 10)
        (
            lambda d: d.update(golden={"file": "../private.npz"}),
            r"golden.file: expected a file name inside the package",
        ),
        (
            lambda d: d.update(evaluation={"file": "/etc/private.npz"}),
            r"evaluation.file: expected a file name inside the package",
        ),
        (
            lambda d: d.update(evaluation={"file": "..\\private.npz"}),
            r"evaluation.file: expected a file name inside the package",
        ),
        (lambda d: d.update(colour="red"), r"colour: unknown field"),
        (
            lambda d: d["preprocessing"].update(layout="CHW"),
            r"preprocessing.layout: expected one of 'NHWC', 'NCHW', 'NF'",
        ),
        (lambda d: d.update(variants=[]), r"variants: expected at least one variant"),
    ],
)
def test_manifest_errors_name_file_field_and_expectation(
    repository: ModelRepository,
    tmp_path: Path,
    change,
    message: str,  # type: ignore[no-untyped-def]
) -> None:
    root = copy_package(repository, tmp_path)
    edit_manifest(root, change)
    with pytest.raises(PackageError, match=message):
        load_package(root)


def test_a_package_reads_no_file_outside_itself(
    repository: ModelRepository, tmp_path: Path
) -> None:
    """A package made in code (a builder's, an update's) holds the manifest's rule too:
    its readers refuse a path out of the folder, whoever set it."""
    from dataclasses import replace

    (tmp_path / "private.npz").write_bytes(b"secret")
    package = load_package(copy_package(repository, tmp_path))
    for name in ("../private.npz", str(tmp_path / "private.npz"), ".."):
        escaped = replace(package, golden_file=name, evaluation_file=name)
        with pytest.raises(PackageError, match="is not a file name inside the package"):
            escaped.golden()
        with pytest.raises(PackageError, match="is not a file name inside the package"):
            escaped.evaluation()


def test_malformed_manifest_json(tmp_path: Path) -> None:
    root = tmp_path / "m" / "1"
    root.mkdir(parents=True)
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(PackageError, match=r"manifest.json: invalid JSON at line 1"):
        load_package(root)


def test_corrupt_variant_file_is_refused(repository: ModelRepository, tmp_path: Path) -> None:
    root = copy_package(repository, tmp_path)
    package = load_package(root)
    variant = package.variant("onnx-fp32")
    data = bytearray((root / variant.file).read_bytes())
    data[100] ^= 0xFF
    (root / variant.file).write_bytes(bytes(data))
    with pytest.raises(PackageError, match="does not match the manifest's size and SHA-256"):
        package.read_variant(variant)
    (root / variant.file).unlink()
    with pytest.raises(PackageError, match=r"cannot read .*model.fp32.onnx: No such file"):
        package.read_variant(variant)


def test_unknown_variant(repository: ModelRepository) -> None:
    with pytest.raises(ModelNotFoundError, match="has no variant 'onnx-int4'; it has onnx-fp32"):
        repository.get("digits-light").variant("onnx-int4")


def test_manifest_round_trips(repository: ModelRepository, tmp_path: Path) -> None:
    root = copy_package(repository, tmp_path)
    package = load_package(root)
    package.write_manifest()
    again = load_package(root)
    assert again == package
    assert np.array_equal(again.evaluation()[1], package.evaluation()[1])
