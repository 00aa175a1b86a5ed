"""The plaintext of a published model: its package, as one tar archive.

The archive holds the manifest (renamed to the published name and version,
with the one variant published), the variant's file and the golden data for
the device's smoke test. It is encrypted right after (:mod:`.publish`) and
never leaves the publisher in the clear.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from edge_core.errors import PackageError
from edge_core.fields import is_decimal
from edge_core.manifest import load_package
from edge_core.package import MANIFEST

__all__ = ["package_archive"]


def package_archive(
    model_file: Path, name: str, version: int, folder: Path
) -> tuple[Path, dict[str, Any]]:
    """A tar of the package around ``model_file``, renamed to ``name`` ``version``."""
    root = model_file.resolve().parent
    if not (root / MANIFEST).is_file():
        raise PackageError(f"{model_file} is not in a model package (no {MANIFEST} beside it)")
    package = load_package(root) if is_decimal(root.name) else _load_anywhere(root)
    variants = [v for v in package.variants if v.file == model_file.name]
    if not variants:
        raise PackageError(f"{model_file.name} is not a variant of {package.qualified_name}")
    package.read_variant(variants[0])  # checks the file against the manifest's hash
    manifest = package.to_dict()
    manifest.update(name=name, version=version, variants=[variants[0].to_dict()])
    archive = folder / "payload.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:

        def add(member: str, data: bytes | None = None, path: Path | None = None) -> None:
            info = tarfile.TarInfo(member)
            info.mode = 0o600
            if path is not None:
                info.size = path.stat().st_size
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                assert data is not None
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add(MANIFEST, data=json.dumps(manifest, indent=2).encode())
        add(variants[0].file, path=package.path_of(variants[0]))
        golden = package.file_path(package.golden_file) if package.golden_file else None
        if golden is not None and golden.is_file():
            add(golden.name, path=golden)
    return archive, {
        "id": variants[0].id,
        "format": variants[0].format,
        "precision": variants[0].precision,
    }


def _load_anywhere(root: Path) -> Any:
    """Load a package whose folder is not named by its version."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = json.loads((root / MANIFEST).read_text())
        link = Path(tmp) / str(manifest.get("version", 1))
        link.symlink_to(root, target_is_directory=True)
        package = load_package(link)
    from dataclasses import replace

    return replace(package, root=root)
