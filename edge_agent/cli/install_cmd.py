"""``edge-agent models install FOLDER``: a model package into the device's ``model_dir``.

The third way a model reaches a device, beside the ones its package ships (the
samples, the face detectors) and those an update brings over the air: a package
folder (``<name>/<version>/`` as ``models build`` writes it, or one copied from a
model repository) installed by hand. It is checked as an update is before it is
trusted: the manifest read, every file it names held to the package's folder,
every variant against its SHA-256, the golden inputs run on this device's profile
(the smoke test); then copied into ``model_dir/<name>/<version>/`` under a temporary
name and renamed into place, so that the agent never sees half a package. Run as
root, it first becomes the owner of ``model_dir`` (:mod:`.account`).

``model_dir`` must be a folder of the operator's own (``model_dir`` in the agent's
configuration): the agent's package folder, where ``model_dir`` points by default on
an installed device, belongs to pip. A running service serves what was installed
after its next reload (``systemctl reload edge-agent``: SIGHUP).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.cli.account import run_as_state_owner
from edge_agent.cli.common import PROG, CliError, agent_settings, print_json
from edge_core.errors import PackageError
from edge_core.manifest import load_package
from edge_core.package import MANIFEST, ModelPackage, is_file_name
from edge_core.paths import PACKAGE_MODELS

__all__ = ["register"]


def register(models: Any) -> None:
    install = models.add_parser(
        "install", help="check a model package folder and install it into model_dir"
    )
    install.add_argument("folder", type=Path, help="the package's folder (<name>/<version>/)")
    install.add_argument("--config", type=Path, help="agent configuration (model_dir, profile)")
    install.add_argument(
        "--model-dir", dest="into", type=Path, help="install here instead of model_dir"
    )
    install.add_argument("--profile", help="device profile of the smoke test (default: detected)")
    install.add_argument("--force", action="store_true", help="replace the installed version")
    install.set_defaults(run=_install)


def _files(package: ModelPackage) -> list[str]:
    """The files the package is made of: its manifest and every file it names."""
    names = [MANIFEST, *(variant.file for variant in package.variants)]
    names += [n for n in (package.golden_file, package.evaluation_file) if n is not None]
    if (package.root / "LICENSE").is_file():
        names.append("LICENSE")
    return [name for name in dict.fromkeys(names) if is_file_name(name)]


def _install(args: argparse.Namespace) -> int:
    from edge_agent.ota.smoke import smoke_test

    config, profile = agent_settings(args)
    target_root = Path(args.into or config.model_dir)
    if target_root.resolve() == PACKAGE_MODELS.resolve():
        raise CliError(
            f"model_dir is the agent's package folder ({target_root}), which pip owns: set "
            "model_dir in the agent's configuration to a folder of yours (for example "
            "/var/lib/edge-agent/models) or pass --model-dir; the shipped models stay"
        )
    if not (args.folder / MANIFEST).is_file():
        raise CliError(f"{args.folder} holds no {MANIFEST}: give the folder of one version")
    try:
        package = load_package(args.folder.resolve())
        for variant in package.variants:
            package.read_variant(variant)  # its SHA-256 and length, as the manifest says
    except PackageError as exc:
        raise CliError(f"not installed: {exc}") from None
    smoke = smoke_test(package, profile)  # SmokeTestError: an EdgeError, one line
    run_as_state_owner(target_root, f"{PROG} models install")  # before anything is written
    target_root.mkdir(parents=True, exist_ok=True)
    target = target_root / package.name / str(package.version)
    if target.exists() and not args.force:
        raise CliError(f"{target} exists already (--force replaces it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".installing-{package.version}-", dir=target.parent))
    try:
        for name in _files(package):
            shutil.copyfile(package.root / name, staging / name)  # regular files, no links
        _check_copy(staging, package)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print_json(
        {
            "installed": package.qualified_name,
            "into": str(target),
            "variants": [variant.id for variant in package.variants],
            "smoke_test": smoke,
            "note": "a running service serves it after `systemctl reload edge-agent`",
        }
    )
    return 0


def _check_copy(folder: Path, expected: ModelPackage) -> None:
    """Check the copy in ``folder`` before it is renamed into place.

    Raises:
        CliError: the copy is not the package that was checked.
    """
    copy = replace(expected, root=folder)
    try:
        for variant in copy.variants:
            copy.read_variant(variant)
    except PackageError as exc:
        raise CliError(f"the copy of {expected.qualified_name} is not whole: {exc}") from None
