"""The files of deploy/ that cannot run here (no container runtime, no cluster) are
checked as far as tools from PyPI and Debian take them: the Kubernetes manifests
against the API's schemas (kubernetes-validate, strict), the Compose file against the
Compose specification (check-jsonschema), the Containerfiles by hadolint, HAProxy's
file by haproxy -c, and every gateway configuration in them by the gateway's own
loader. (deploy/haproxy.cfg and deploy/mosquitto.conf also run, in test_replicas.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cloud_gateway.config import load_config
from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name) or (str(BIN / name) if (BIN / name).exists() else None)
    if found is None:
        pytest.fail(f"{name} is missing (the dev extra installs it)")
    return found


@pytest.mark.slow
def test_the_kubernetes_manifests_match_the_api() -> None:
    import kubernetes_validate

    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(document, "1.30.0", strict=True)
    kinds = {
        d["kind"]
        for p in (DEPLOY / "kubernetes").glob("*.yaml")
        for d in yaml.safe_load_all(p.read_text())
    }
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PersistentVolumeClaim",
            "Secret", "ConfigMap"} <= kinds  # fmt: skip


def test_the_deployment_probes_the_gateways_health_and_hides_the_database_url(
    tmp_path: Path,
) -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "gateway.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "gateway-state"
    # the configuration it mounts is one the gateway loads
    config = next(d for d in documents if d["kind"] == "ConfigMap")["data"]["gateway.toml"]
    (tmp_path / "gateway.toml").write_text(config)
    assert load_config(tmp_path / "gateway.toml").ota_repository == Path("/srv/ota")
    assert load_config(DEPLOY / "gateway.toml").mqtt is not None


def test_the_compose_file_matches_the_compose_specification() -> None:
    done = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
         str(DEPLOY / "compose.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "mosquitto", "haproxy", "gateway-a", "gateway-b"} <= set(services)
    for service in services.values():  # the files it mounts from deploy/ are there
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and "broker/" not in source:
                assert (DEPLOY / source).exists(), source


@pytest.mark.parametrize("name", ["Containerfile.gateway", "Containerfile.agent"])
def test_the_containerfiles_lint_clean_and_copy_what_exists(name: str) -> None:
    path = DEPLOY / name
    done = subprocess.run([tool("hadolint"), "--failure-threshold", "warning", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for source in re.findall(r"^COPY (?!--from)(\S+)", path.read_text(), re.MULTILINE):
        assert (ROOT / source).exists(), source


@pytest.mark.haproxy
def test_haproxys_file_is_valid() -> None:
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(binary):
        pytest.fail("haproxy is missing (make test installs it)")
    environment = {**os.environ, "LISTEN_HTTP": "127.0.0.1:1", "LISTEN_GRPC": "127.0.0.1:2",
                   "GATEWAY_A": "127.0.0.1", "GATEWAY_B": "127.0.0.1", "HTTP_PORT_A": "3",
                   "HTTP_PORT_B": "4", "GRPC_PORT_A": "5", "GRPC_PORT_B": "6"}  # fmt: skip
    done = subprocess.run([binary, "-c", "-f", str(DEPLOY / "haproxy.cfg")], env=environment,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
