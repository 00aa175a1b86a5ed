"""The agent's rooms, each with its own state and lock (issue 12 §2): the models on
the device (:class:`LocalModels`), the counters (:class:`AgentStats`). Threaded
tests that the old code failed: a fit computed while models load, counts lost
under threads, and a cache that remembered every unknown name."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from edge_agent.agent import AgentStats, LocalModels
from edge_agent.assemble import resolve_profile as service_profile
from edge_agent.cli.common import agent_settings
from edge_agent.config import load_agent_config
from edge_agent.policy import Action, Decision
from edge_agent.profiles import ProfileStore
from edge_core.errors import ModelNotFoundError
from edge_core.package import ModelPackage
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS, PROFILES
from tests.support.roots import X86_CPUINFO, make_root

LIGHT = ModelRepository(MODELS).get("digits-light")


class Copies:
    """A source of many models, each a copy of digits-light under another name."""

    def __init__(self) -> None:
        self.lookups = 0

    def get(self, name: str) -> ModelPackage:
        self.lookups += 1
        if not name.startswith("copy-"):
            raise ModelNotFoundError(f"unknown model {name!r}")
        return replace(LIGHT, name=name)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Threads switch every microsecond: a race that needs bad luck needs little."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.slow
def test_the_fit_is_computed_safely_while_models_load(fast_switching: None) -> None:
    profile = replace(ProfileStore(PROFILES).get("generic-x86_64"), memory_budget_mb=100_000)
    models = LocalModels(profile, Copies())
    variant = LIGHT.variants[0]
    errors: list[BaseException] = []
    done = threading.Event()

    def load(start: int) -> None:
        try:
            for index in range(start, 120, 3):
                models.get(f"copy-{index}")
        except BaseException as exc:
            errors.append(exc)

    def fit() -> None:
        try:
            while not done.is_set():
                assert models.fits(variant, "copy-x")
        except BaseException as exc:
            errors.append(exc)

    checker = threading.Thread(target=fit)
    checker.start()
    loaders = [threading.Thread(target=load, args=(start,)) for start in range(3)]
    for thread in loaders:
        thread.start()
    for thread in loaders:
        thread.join()
    done.set()
    checker.join()
    assert not errors, errors  # the old one: "dictionary changed size during iteration"
    assert len(models.loaded()) == 120
    models.close()


def test_counts_are_not_lost_under_threads(fast_switching: None) -> None:
    stats = AgentStats()
    decision = Decision(Action.LOCAL_DEGRADED, "offline", "", "m", "public")

    def answer() -> None:
        for _ in range(2000):
            stats.decided(decision)
            stats.answered("device", 1.0, degraded=True, cached=False)
            stats.answered("cache", 1.0, degraded=True, cached=True)

    threads = [threading.Thread(target=answer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snapshot = stats.snapshot()
    assert snapshot["degraded"] == snapshot["cached_answers"] == 16_000
    assert snapshot["decisions"][("LOCAL_DEGRADED", "offline")] == 16_000
    assert snapshot["latency"]["device"]["count"] == 16_000


def test_unknown_names_are_remembered_in_a_bounded_lru_and_bad_ones_never_looked_up() -> None:
    source = Copies()
    models = LocalModels(ProfileStore(PROFILES).get("generic-x86_64"), source, misses_kept=64)
    for index in range(20_000):
        assert models.package(f"unknown-{index}") is None
    assert len(models._misses) == 64  # the old cache kept all 20,000
    lookups = source.lookups
    assert models.package("unknown-19999") is None and source.lookups == lookups  # remembered
    for bad in ("..", "a/b", "x" * 129, "-rf", ""):
        assert models.package(bad) is None
    assert source.lookups == lookups  # never reached the source (or the disk)


def test_the_command_line_and_the_service_resolve_the_same_profile(tmp_path: Path) -> None:
    """`edge-agent infer` and `edge-agent run` from the same arguments: the same profile,
    also from a profiles folder of the operator's (which the service once ignored)."""
    mine = tmp_path / "profiles"
    mine.mkdir()
    text = (
        (PROFILES / "generic-x86_64.toml")
        .read_text()
        .replace('id = "generic-x86_64"', 'id = "my-box"')
    )
    (mine / "my-box.toml").write_text(text)
    root = make_root(tmp_path / "root", cpuinfo=X86_CPUINFO)
    config = tmp_path / "agent.toml"
    for profile_line in ('profile = "my-box"\n', ""):
        config.write_text(f'{profile_line}root = "{root}"\nprofiles_dir = "{mine}"\n')
        args = argparse.Namespace(config=config, model_dir=None, profile=None, profiles_dir=None)
        from_cli = agent_settings(args)[1]
        from_service = service_profile(load_agent_config(config))
        assert from_cli.id == from_service.id == "my-box"


def test_an_untimed_model_is_expected_to_take_its_predicted_latency() -> None:
    """Before its first run the policy weighs a model's roofline prediction (its cost in
    the manifest on the profile's figures), not a fixed guess: a model predicted too slow
    for the deadline goes to the cloud on its first request."""
    import time

    from edge_agent.agent import DEFAULT_POLICY
    from edge_agent.agent.facts import FactSheet
    from edge_agent.policy import decide, load_policy
    from edge_agent.policy.reasons import Reason
    from edge_agent.privacy import Findings
    from edge_agent.profiles.cost import predict_ms
    from edge_agent.profiles.state import DeviceState
    from edge_core.package import Cost

    profile = ProfileStore(PROFILES).get("generic-x86_64")
    assert profile.cost is not None
    heavy = Cost(flops={"fp32": 4 * 10**10}, memory_bytes=10**8, nodes=300)  # ~0.6 s here
    package = replace(LIGHT, variants=tuple(replace(v, cost=heavy) for v in LIGHT.variants))

    class One:
        def get(self, name: str) -> ModelPackage:
            return package

    models = LocalModels(profile, One())
    facts = FactSheet(models, None, rules=lambda: load_policy(DEFAULT_POLICY), online=lambda: True)
    deadline = time.monotonic() + 0.2
    untimed = facts.of("digits-light", None, Findings(), deadline, DeviceState())
    assert untimed.local_ms == pytest.approx(predict_ms(heavy, profile.cost))
    assert untimed.local_ms > 200
    cloud = replace(untimed, remote_ms=20.0, gateway=True)  # a gateway answering in 20 ms
    decision = decide(cloud, load_policy(DEFAULT_POLICY))
    assert decision.action == Action.OFFLOAD and decision.reason == Reason.DEADLINE_LOCAL_TOO_SLOW
    # a manifest without cost figures (or a profile without compute figures): no prior
    assert LocalModels(profile, Copies()).prior_ms(LIGHT.variants[0]) is None
    models.get("digits-light")  # loaded and timed once: the measurement takes over
    timed = facts.of("digits-light", None, Findings(), deadline, DeviceState())
    assert timed.local_ms is not None and timed.local_ms < 50
