"""Building the agent (and its updater) from the one configuration object.

Every library is imported here only when the configuration uses it: a
local-only device with one TFLite model loads neither the offload transports
nor python-tuf nor ONNX Runtime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent import profiles
from edge_agent.agent import DEFAULT_POLICY, Agent, LayeredSource, ModelSource, OtaSource
from edge_agent.config import AgentConfig
from edge_agent.policy.rules import PolicyRules
from edge_agent.privacy import PrivacyInspector
from edge_agent.profiles.schema import DeviceProfile
from edge_agent.profiles.state import DeviceState
from edge_core.errors import ConfigError, EdgeError, ModelNotFoundError
from edge_core.names import is_model_name
from edge_core.paths import default_model_dir
from edge_core.repository import ModelRepository

__all__ = [
    "bundled_version",
    "create_agent",
    "create_connection",
    "create_fleet_link",
    "create_inspector",
    "create_updater",
    "model_source",
    "privacy_source",
    "resolve_profile",
]

log = logging.getLogger(__name__)


def resolve_profile(config: AgentConfig) -> DeviceProfile:
    """The profile ``config`` names, else the one detected under its root."""
    return profiles.resolve_profile(
        config.profile, root=config.root, profiles_dir=config.profiles_dir
    )[0]


def _enrollment(config: AgentConfig) -> Any:
    if config.ota is None or config.ota.bundle is None:
        return None
    from edge_agent.ota import load_bundle

    return load_bundle(config.ota.bundle)


def _always() -> bool:
    return True


def _device_token(config: AgentConfig, enrollment: Any) -> str | None:
    token = config.gateway.token if config.gateway is not None else None
    return token or (enrollment.token if enrollment is not None else None)


def create_connection(config: AgentConfig) -> Any:
    """The device's MQTT connection (not yet started), or ``None`` without ``[mqtt]``.

    The username defaults to the device id, the password to the device's token.

    Raises:
        ConfigError: no password can be found, or the bundle names another device.
    """
    if config.mqtt is None:
        return None
    from edge_agent.mqtt import MqttConnection

    enrollment = _enrollment(config)
    device = config.device_id
    if enrollment is not None:
        if device not in (enrollment.device_id, AgentConfig.device_id):
            raise ConfigError(
                f"device_id {device!r} but the enrollment bundle is for {enrollment.device_id!r}",
                path=config.source,
            )
        device = enrollment.device_id
    settings = replace(
        config.mqtt,
        username=config.mqtt.username or device,
        password=config.mqtt.password or _device_token(config, enrollment),
    )
    if not settings.password:
        raise ConfigError(
            "[mqtt] needs a password: password_file, or the device's token "
            "([gateway] token_file or an [ota] bundle)",
            path=config.source,
        )
    return MqttConnection(settings, device_id=device)


def create_fleet_link(
    config: AgentConfig,
    connection: Any,
    *,
    agent: Callable[[], Agent] | None = None,
    updater: Any = None,
    streams: Callable[[], dict[str, Any]] = dict,
) -> Any:
    """Telemetry (per ``[telemetry]``) and rollout announcements over ``connection``;
    ``agent()`` is the agent whose state the periodic telemetry reports, ``streams()``
    the streams' counters (a ``streams`` report when there are any)."""
    from edge_agent.fleet import FleetLink
    from edge_agent.reports import agent_reports
    from edge_agent.telemetry import Telemetry, TelemetryQueue

    telemetry = None
    if config.telemetry is not None:
        queue = TelemetryQueue(
            config.state_dir / "telemetry.sqlite", max_messages=config.telemetry.max_messages
        )
        telemetry = Telemetry(
            connection,
            queue,
            periodic=(lambda: agent_reports(agent(), streams())) if agent is not None else dict,
            interval_s=config.telemetry.interval_s,
        )
    enrollment = _enrollment(config)
    group = enrollment.group if enrollment is not None else None
    return FleetLink(connection, telemetry=telemetry, updater=updater, group=group)


def create_inspector(
    config: AgentConfig, profile: DeviceProfile, source: ModelSource, rules: PolicyRules
) -> PrivacyInspector:
    """The privacy inspector: the face detector that ``[privacy]`` (or else the
    profile) names, the stronger checker, and the policy's redaction, their models
    from ``source`` (:func:`privacy_source`: an update's before the shipped ones),
    and opened again from it when an update changes them. Without the detector's
    model, pictures cannot be searched (the exit guard then refuses them): a warning
    says so.

    Raises:
        ConfigError: the settings make no valid detector.
    """
    from edge_agent.privacy import Redaction

    redaction = Redaction(rules.redaction_mode, rules.mask_scale)
    settings = config.privacy
    pixels = config.limits.max_image_pixels
    if not settings.face_detector:
        return PrivacyInspector(None, redaction=redaction, max_pixels=pixels)
    from edge_agent.privacy.faces import CHECK, open_detectors, spec_for

    preferred = profile.privacy
    try:
        spec = spec_for(
            settings.detector or preferred.detector,
            threshold=settings.threshold or preferred.threshold,
            scale=settings.scale or preferred.scale,
        )
        check = replace(CHECK, threshold=settings.check_threshold or CHECK.threshold)
    except ValueError as exc:
        raise ConfigError(str(exc), path=config.source, field="privacy") from None
    options = replace(profile.runtime, allow_spinning=False, warmup=1)

    def opener() -> tuple[Any, Any]:
        return open_detectors(source, spec, check, options, profile.formats)

    inspector = PrivacyInspector(None, redaction=redaction, max_pixels=pixels, opener=opener)
    try:
        inspector.detector, inspector.checker = opener()
    except EdgeError as exc:
        log.warning(
            "no face detector (%s): pictures cannot be searched for faces until an update "
            "brings one (the agent's package ships them: is it installed whole?)",
            exc,
        )
    return inspector


def privacy_source(config: AgentConfig) -> ModelSource:
    """Where the face detectors come from: as every model (:func:`model_source`), then
    the agent's own package, which ships them: a ``model_dir`` of the operator's own
    never leaves the privacy path without them."""
    source = model_source(config)
    shipped = default_model_dir()
    if Path(config.model_dir).resolve() == shipped.resolve():
        return source
    return LayeredSource([source, ModelRepository(shipped)])


def model_source(config: AgentConfig) -> ModelSource:
    """Where the agent's models come from: those installed over the air (when the
    device is enrolled for updates), before those of ``model_dir`` (the shipped ones,
    by default)."""
    bundled = ModelRepository(config.model_dir)
    enrollment = _enrollment(config)
    if enrollment is None or config.ota is None:
        return bundled
    from edge_agent.ota import OtaStore

    store = OtaStore(config.ota.state_dir / "ota")
    return LayeredSource([OtaSource(store, enrollment.group, enrollment.group_key), bundled])


def create_agent(
    config: AgentConfig,
    *,
    device_state: Callable[[], DeviceState] | None = None,
    profile: DeviceProfile | None = None,
    connection: Any = None,
) -> Agent:
    """An agent as ``config`` describes it: profile, models, policy, privacy, gateway.

    ``connection`` is the device's MQTT connection (:func:`create_connection`),
    needed when the gateway protocol is ``mqtt``.

    Raises:
        ConfigError, ProfileError, PolicyError: a configuration file is wrong.
    """
    from edge_agent.policy import load_policy

    profile = profile or resolve_profile(config)
    bundled = ModelRepository(config.model_dir)
    source = model_source(config)
    enrollment = _enrollment(config)
    rules = load_policy(config.policy or DEFAULT_POLICY, device=profile.offload)
    inspector = create_inspector(config, profile, privacy_source(config), rules)
    offload = None
    online: Callable[[], bool] = _always
    if config.gateway is not None:
        from edge_agent.offload import CircuitBreaker, ExitGuard, OffloadClient, make_transports

        gateway = config.gateway
        token = _device_token(config, enrollment)
        transport: Any
        if gateway.protocol == "mqtt":
            from edge_agent.offload.mqtt import MqttTransport

            if connection is None:
                raise ConfigError(
                    "offload over MQTT needs the device's MQTT connection", path=config.source
                )
            transport = MqttTransport.of(connection, token=token)
            online = connection.is_connected
        else:
            transport = make_transports(
                gateway.protocol, gateway.replicas, token=token, tls=gateway.tls
            )

        def preprocessing(model: str) -> Any:
            try:
                return bundled.get(model).preprocessing
            except ModelNotFoundError:
                return None

        offload = OffloadClient(
            transport,
            guard=ExitGuard(inspector, rules, preprocessing=preprocessing),
            breaker=CircuitBreaker(config.breaker.failures, config.breaker.cooldown_s),
            retries=gateway.retries,
        )
    return Agent(
        profile=profile,
        repository=source,
        rules=rules,
        offload=offload,
        inspector=inspector,
        cache_entries=config.cache_entries,
        deadline_ms=config.deadline_ms,
        device_state=device_state,
        online=online,
        root=config.root,
        max_rows=config.limits.max_request_rows,
        max_pixels=config.limits.max_image_pixels,
    )


def bundled_version(config: AgentConfig) -> Callable[[str], int | None]:
    """The version of a model the device serves without any update (its bundled one)."""
    bundled = ModelRepository(config.model_dir)

    def version(name: str) -> int | None:
        versions = bundled.versions(name) if is_model_name(name) else []
        return versions[-1] if versions else None

    return version


def create_updater(
    config: AgentConfig,
    profile: DeviceProfile,
    *,
    agent: Agent | None = None,
    on_progress: Callable[[str, int, int], None] = lambda name, done, total: None,
) -> Any:
    """The OTA updater of ``config`` (installs swap the model into ``agent``).

    Raises:
        ConfigError: the configuration has no ``[ota]`` section, or its bundle is wrong.
    """
    from edge_agent.ota import OtaStore, OtaUpdater

    enrollment = _enrollment(config)
    if config.ota is None or enrollment is None:
        raise ConfigError("no [ota] section in the configuration", path=config.source)
    try:
        return OtaUpdater(
            config.ota,
            enrollment,
            profile,
            store=OtaStore(config.ota.state_dir / "ota"),
            on_installed=(agent.reload if agent is not None else lambda name, package: None),
            on_progress=on_progress,
            bundled=bundled_version(config),
        )
    except ConfigError as exc:
        raise ConfigError(exc.reason, path=config.source) from None
