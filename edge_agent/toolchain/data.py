"""Calibration and evaluation data for a build, and ``.npz`` files that are the same
bytes every time.

Data comes as a folder of images, preprocessed as the package's
preprocessing says (:func:`edge_agent.preprocess.image_to_tensor`; the files
in name order), or as an ``.npz`` file: ``inputs`` (and ``labels``), the
layout of a package's ``heldout.npz``; or one array per input name
(``input:NAME`` or ``NAME``). Each item is one batch row: images of different
sizes (a model with dynamic height and width) stay separate items.

NumPy's own ``savez`` stamps each member with the time it was written, so two
builds of the same model would differ; :func:`write_npz` stamps none.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_core.errors import EdgeError
from edge_core.package import ImagePreprocessing
from edge_core.tensors import TensorSpec

__all__ = ["DataError", "Dataset", "load_dataset", "stack_items", "write_npz"]

Array = np.ndarray[Any, Any]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}


class DataError(EdgeError):
    """Calibration or evaluation data that cannot be read or does not fit the model."""


@dataclass(frozen=True)
class Dataset:
    """Items of one row each (input name -> array with a batch dimension of 1), and
    their labels when known."""

    items: tuple[dict[str, Array], ...]
    labels: Array | None = None
    source: str = ""

    def head(self, count: int | None) -> Dataset:
        if count is None or count >= len(self.items):
            return self
        labels = self.labels[:count] if self.labels is not None else None
        return Dataset(self.items[:count], labels, f"the first {count} of {self.source}")


def _images(folder: Path, pre: ImagePreprocessing | None, inputs: Sequence[TensorSpec]) -> Dataset:
    from edge_core.pictures import decode_image, image_to_tensor

    if pre is None:
        raise DataError(
            f"{folder} holds images, but the model has no preprocessing: give --preprocessing"
        )
    if len(inputs) != 1:
        raise DataError(f"images feed one input; the model has {len(inputs)}")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataError(f"no images in {folder} (expected {', '.join(sorted(IMAGE_SUFFIXES))})")
    items = []
    for path in files:
        try:
            tensor = image_to_tensor(decode_image(path.read_bytes()), pre)
        except EdgeError as exc:
            raise DataError(f"{path}: {exc}") from exc
        items.append({pre.input: tensor.astype(inputs[0].dtype)})
    return Dataset(tuple(items), None, f"{len(files)} images in {folder}")


def _arrays(path: Path, inputs: Sequence[TensorSpec]) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    labels = arrays.pop("labels", None)
    columns: dict[str, Array] = {}
    for spec in inputs:
        for key in (spec.name, f"input:{spec.name}", "inputs"):
            if key in arrays and (key != "inputs" or len(inputs) == 1):
                columns[spec.name] = arrays[key]
                break
        else:
            raise DataError(
                f"{path} has no array for input {spec.name!r} (keys: {', '.join(arrays)}; "
                f"expected {spec.name!r}, 'input:{spec.name}' or 'inputs')"
            )
    counts = {len(a) for a in columns.values()}
    if len(counts) != 1 or (labels is not None and len(labels) not in counts):
        raise DataError(f"{path}: the arrays (and labels) have different lengths")
    items = tuple(
        {name: np.ascontiguousarray(a[i : i + 1].astype(spec.dtype)) for (name, a), spec in
         zip(columns.items(), inputs, strict=True)}
        for i in range(counts.pop())
    )  # fmt: skip
    return Dataset(items, labels, f"{len(items)} items of {path}")


def load_dataset(
    path: Path, inputs: Sequence[TensorSpec], pre: ImagePreprocessing | None
) -> Dataset:
    """The items in ``path`` (a folder of images, or an ``.npz`` file).

    Raises:
        DataError: nothing readable there, or arrays that do not fit ``inputs``.
    """
    if path.is_dir():
        return _images(path, pre, inputs)
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    return _arrays(path, inputs)


def stack_items(
    items: Sequence[Mapping[str, Array]], limit: int
) -> tuple[list[int], dict[str, Array]]:
    """Up to ``limit`` items of the first item's shapes as one batch (the rows a
    ``golden.npz`` holds: a batch of one shape), and which items they are."""
    first = items[0]
    chosen = [
        i for i, item in enumerate(items) if all(item[k].shape == first[k].shape for k in first)
    ][:limit]
    return chosen, {name: np.concatenate([items[i][name] for i in chosen]) for name in first}


def write_npz(path: Path, arrays: Mapping[str, Array]) -> None:
    """Write ``arrays`` as a compressed ``.npz`` with no timestamps (the same arrays
    give the same bytes)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())
