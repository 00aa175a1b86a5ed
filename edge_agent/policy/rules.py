"""The offload policy file: the rules an operator reads and changes.

A TOML file, validated at load (a wrong field names the file, the field and
what was expected). :class:`PolicyRules` names every field of the file in its
``Attributes:`` (a model's, :class:`ModelRule`); ``tools/config_reference.py``
makes the operators' reference (docs/reference/policy.md) from them and from
what :func:`parse_policy` reads. The built-in policy, ``default.toml`` beside
this module, is the example to start from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_core.errors import ConfigError
from edge_core.fields import Fields, Read, load_document

__all__ = [
    "LABELS",
    "LEAVE_MODES",
    "PLACEMENTS",
    "REDACTION_MODES",
    "ModelRule",
    "PolicyError",
    "PolicyRules",
    "load_policy",
]

LABELS = ("public", "personal", "sensitive")  # from least to most sensitive
LEAVE_MODES = ("free", "redact", "local")  # from least to most restrictive
PLACEMENTS = ("device", "cloud", "either")
REDACTION_MODES = ("pixelate", "blur", "fill")
PICTURE_FORMATS = ("jpeg", "webp", "png", "tensor")  # tensor: pictures leave as tensors


class PolicyError(ConfigError):
    """The policy file is malformed or holds a wrong value."""


@dataclass(frozen=True)
class ModelRule:
    """One model's rule (``MODEL``: its name); a model without one follows
    ``[defaults]``.

    Attributes:
        placement (default: ``[defaults]`` placement): where it may run.
        escalate_to: the cloud model a low-confidence answer goes to (with
            ``escalate_below``).
        escalate_below: the top probability below which a local answer goes to
            ``escalate_to``.
    """

    placement: str = "either"
    escalate_to: str | None = None
    escalate_below: float | None = None


@dataclass(frozen=True)
class PolicyRules:
    """The policy (``Attributes:`` name the fields of its file, by table).

    Attributes:
        version: the file format's version.
        sensitivity: what may leave the device, per label, and the labels a
            request gets.
        sensitivity.public: what may leave of a public request: ``free`` (as
            is), ``redact`` (only a redacted copy) or ``local`` (never).
        sensitivity.personal: of a personal one (no label may leave more freely
            than a less sensitive one).
        sensitivity.sensitive: of a sensitive one.
        sensitivity.default: the label of a request that has none.
        sensitivity.faces: the label a face found in a request gives it (the
            stricter label wins).
        sensitivity.pii: the label text PII (e-mail, phone, ID numbers) gives it.
        defaults: the rule of a model without a table of its own.
        defaults.placement: where such a model may run.
        defaults.prefer (default: the device profile's ``[offload]`` prefer):
            where a request goes when both could answer in time.
        device: when the device's state sends work to the cloud.
        device.offload_when_throttled (default: the device profile's
            ``[offload]``): a device throttling for heat sends what may leave.
        device.max_cpu_load: so does a device above this CPU load (per CPU).
        device.local_when_critical: above the critical temperature, local work
            goes on (false: none).
        deadline: the latency estimates against a request's deadline.
        deadline.margin_ms: an estimate must fit the deadline with this to spare.
        redaction: how a redacted copy hides each face (its whole head).
        redaction.mode: ``pixelate`` (3 blocks across a face), ``blur`` or
            ``fill`` (black).
        redaction.mask_scale: the hidden area's side, in face-box sides.
        pictures: how an offloaded picture leaves (a model with image preprocessing,
            to a gateway that takes pictures encoded).
        pictures.format: ``jpeg``, ``webp``, ``png`` (lossless) or ``tensor`` (the
            input tensor itself, some 20-70 times the bytes).
        pictures.quality: the JPEG's or WebP's quality, 1-100.
    """

    leave: dict[str, str] = field(
        default_factory=lambda: {"public": "free", "personal": "redact", "sensitive": "local"}
    )
    default_label: str = "public"
    finding_labels: dict[str, str] = field(
        default_factory=lambda: {"faces": "personal", "pii": "sensitive"}
    )
    default_placement: str = "either"
    prefer: str = "local"
    models: dict[str, ModelRule] = field(default_factory=dict)
    offload_when_throttled: bool = True
    max_cpu_load: float = 0.9
    local_when_critical: bool = False
    deadline_margin_ms: float = 2.0
    redaction_mode: str = "pixelate"
    mask_scale: float = 1.6
    picture_format: str = "jpeg"
    picture_quality: int = 90
    source: Path | None = None

    def rule(self, model: str) -> ModelRule:
        return self.models.get(model, ModelRule(placement=self.default_placement))

    def effective_label(self, label: str | None, findings: set[str]) -> str:
        """The stricter of the request's label and what its findings imply."""
        labels = [label or self.default_label]
        labels += [self.finding_labels[f] for f in findings if f in self.finding_labels]
        return max(labels, key=LABELS.index)

    def leave_mode(self, label: str) -> str:
        return self.leave[label]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sensitivity": {**self.leave, "default": self.default_label, **self.finding_labels},
            "defaults": {"placement": self.default_placement, "prefer": self.prefer},
            "models": {
                name: {k: v for k, v in vars(rule).items() if v is not None}
                for name, rule in self.models.items()
            },
            "device": {
                "offload_when_throttled": self.offload_when_throttled,
                "max_cpu_load": self.max_cpu_load,
                "local_when_critical": self.local_when_critical,
            },
            "deadline": {"margin_ms": self.deadline_margin_ms},
            "redaction": {"mode": self.redaction_mode, "mask_scale": self.mask_scale},
            "pictures": {"format": self.picture_format, "quality": self.picture_quality},
        }


def parse_policy(
    data: dict[str, Any],
    path: Path | None = None,
    *,
    device: Any = None,
    reads: list[Read] | None = None,
) -> PolicyRules:
    """Rules from a parsed document; each field asked for is noted in ``reads``
    when given (the reference page's source).

    Raises:
        PolicyError: a field is missing or wrong.
    """
    fields = Fields(data, path=path, error=PolicyError, reads=reads)
    defaults = PolicyRules()
    sensitivity = _sensitivity(fields.table("sensitivity", None), defaults)
    default_fields = fields.table("defaults", None)
    default_placement = default_fields.string("placement", "either", choices=PLACEMENTS)
    prefer = default_fields.string(
        "prefer", getattr(device, "prefer", "local"), choices=["local", "cloud"]
    )
    default_fields.done()
    models = _model_rules(fields.table("models", None), default_placement)
    on_device = _device_rules(fields.table("device", None), device)
    deadline = fields.table("deadline", None)
    margin = deadline.number("margin_ms", 2.0, minimum=0.0)
    deadline.done()
    redaction = fields.table("redaction", None)
    mode = redaction.string("mode", defaults.redaction_mode, choices=REDACTION_MODES)
    mask_scale = redaction.number("mask_scale", defaults.mask_scale, minimum=1.0, maximum=4.0)
    redaction.done()
    pictures = fields.table("pictures", None)
    picture_format = pictures.string("format", defaults.picture_format, choices=PICTURE_FORMATS)
    picture_quality = pictures.integer("quality", defaults.picture_quality, minimum=1, maximum=100)
    pictures.done()
    fields.integer("version", 1, minimum=1)
    fields.done()
    return PolicyRules(
        **sensitivity,
        default_placement=default_placement,
        prefer=prefer,
        models=models,
        **on_device,
        deadline_margin_ms=margin,
        redaction_mode=mode,
        mask_scale=mask_scale,
        picture_format=picture_format,
        picture_quality=picture_quality,
        source=path,
    )


def _sensitivity(sens: Fields, defaults: PolicyRules) -> dict[str, Any]:
    """``[sensitivity]``: how far each label may leave, the default label and the
    labels findings give; a more sensitive label never leaves more freely than a
    less sensitive one (the order of :data:`LABELS` is the order of sensitivity)."""
    leave = {
        label: sens.string(label, defaults.leave[label], choices=LEAVE_MODES) for label in LABELS
    }
    default_label = sens.string("default", defaults.default_label, choices=LABELS)
    findings = {
        kind: sens.string(kind, defaults.finding_labels[kind], choices=LABELS)
        for kind in ("faces", "pii")
    }
    sens.done()
    if [LEAVE_MODES.index(leave[label]) for label in LABELS] != sorted(
        LEAVE_MODES.index(leave[label]) for label in LABELS
    ):
        raise sens.fail(
            None,
            "a more sensitive label may not leave the device more freely than a less sensitive one",
        )
    return {"leave": leave, "default_label": default_label, "finding_labels": findings}


def _model_rules(model_fields: Fields, default_placement: str) -> dict[str, ModelRule]:
    """``[models.NAME]``: where each model runs and whom it escalates to (both or
    neither of ``escalate_to`` and ``escalate_below``; never itself)."""
    models: dict[str, ModelRule] = {}
    for name in model_fields.names():
        entry = model_fields.table(name)
        rule = ModelRule(
            placement=entry.string("placement", default_placement, choices=PLACEMENTS),
            escalate_to=entry.string("escalate_to", None),
            escalate_below=entry.number("escalate_below", None, minimum=0.0, maximum=1.0),
        )
        if (rule.escalate_to is None) != (rule.escalate_below is None):
            raise entry.fail("escalate_to", "escalate_to and escalate_below go together")
        if rule.escalate_to == name:
            raise entry.fail("escalate_to", "a model cannot escalate to itself")
        entry.done()
        models[name] = rule
    model_fields.done()
    return models


def _device_rules(device_fields: Fields, device: Any) -> dict[str, Any]:
    """``[device]``: what the device's state does to a decision; the profile's
    preference where the file is silent."""
    rules = {
        "offload_when_throttled": device_fields.boolean(
            "offload_when_throttled", getattr(device, "offload_when_throttled", True)
        ),
        "max_cpu_load": device_fields.number("max_cpu_load", 0.9, minimum=0.0),
        "local_when_critical": device_fields.boolean("local_when_critical", False),
    }
    device_fields.done()
    return rules


def load_policy(path: Path, *, device: Any = None, reads: list[Read] | None = None) -> PolicyRules:
    """Load and validate a policy file. ``device``: the device profile's offload
    preferences (:class:`~edge_agent.profiles.schema.OffloadPreferences`), the
    defaults of ``prefer`` and ``offload_when_throttled`` where the file is silent;
    ``reads``: as :func:`parse_policy`.

    Raises:
        PolicyError: the file is missing or malformed, or a field is wrong.
    """
    return parse_policy(load_document(path, PolicyError), path, device=device, reads=reads)
