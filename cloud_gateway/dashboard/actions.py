"""The operator's actions on rollouts, from the dashboard's pages or its API: start one,
raise its percent, pause, resume, abort. Each is checked, done in one conditional
statement of :class:`~cloud_gateway.ota.rollouts.RolloutStore`, recorded with who did
it (the admin signed in, or the admin token's device), and announced to the group's
devices (through the MQTT bridge, when there is one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cloud_gateway.auth import DEVICE_ID
from cloud_gateway.fleet.store import FleetStore
from cloud_gateway.fleet.views import FleetViews, published_versions
from cloud_gateway.ota.rollouts import Rollout, RolloutStore
from edge_core.errors import BadRequest, NotFound
from edge_core.names import MAX_VERSION, MODEL_NAME_RULE, is_model_name
from edge_core.numbers import integer, number

__all__ = ["ACTIONS", "Action", "Operations", "parse_action"]

ACTIONS = ("start", "raise", "pause", "resume", "abort")
_STATES = {"pause": "paused", "resume": "active", "abort": "aborted"}


@dataclass(frozen=True)
class Action:
    action: str
    name: str
    version: int
    group: str
    percent: float | None = None
    failure_threshold: float = 0.2

    @property
    def target(self) -> str:
        return f"{self.name} v{self.version} for {self.group}"


def parse_action(fields: dict[str, Any]) -> Action:
    """An action from a form's or a JSON body's fields (strings or numbers; a string
    is ASCII digits, checked before it is read: :mod:`edge_core.numbers`).

    Raises:
        BadRequest: an unknown action, a malformed name, version, group, percent or
            threshold.
    """
    action = fields.get("action")
    if action not in ACTIONS:
        raise BadRequest(f"action must be one of {', '.join(ACTIONS)}")
    name = fields.get("name")
    if not isinstance(name, str) or not is_model_name(name):
        raise BadRequest(f"name must be a model name ({MODEL_NAME_RULE})")
    version = integer(fields.get("version"), "version", 1, MAX_VERSION, text=True)
    group = fields.get("group")
    if not isinstance(group, str) or not DEVICE_ID.match(group):
        raise BadRequest("group must be 1-64 letters, digits, '-' or '_'")
    percent = None
    if action in ("start", "raise"):
        percent = number(fields.get("percent"), "percent", 0, 100, text=True)
        if percent == 0:
            raise BadRequest("percent must be above 0 and at most 100")
    threshold = 0.2
    if action == "start" and fields.get("failure_threshold") not in (None, ""):
        threshold = number(fields.get("failure_threshold"), "failure_threshold", 0, 100, text=True)
        if threshold > 1:  # given as a percent
            threshold /= 100
        if threshold == 0:
            raise BadRequest("failure_threshold must be above 0 and at most 1 (or 100%)")
    return Action(action, name, version, group, percent, threshold)


class Operations:
    def __init__(
        self,
        rollouts: RolloutStore,
        fleet: FleetStore,
        views: FleetViews,
        *,
        announce: Callable[[Rollout], None] = lambda rollout: None,
    ) -> None:
        self.rollouts = rollouts
        self.fleet = fleet
        self.views = views
        self.announce = announce

    def describe(self, action: Action) -> str:
        """What the action will do, in a sentence, for its confirmation.

        Raises:
            NotFound: no such rollout (for all but ``start``), or a version that is not
                published for the group (``start``).
        """
        if action.action == "start":
            self._published(action)
            count = self.views.slice_size(action.name, action.group, action.percent or 0)
            return (
                f"Start the rollout of {action.target} at {action.percent:g}%: "
                f"{count} device(s) of the group are in that slice. It pauses itself when "
                f"{action.failure_threshold:.0%} of the reporting devices fail."
            )
        current = self.views.rollout(action.name, action.version, action.group)
        if action.action == "raise":
            count = self.views.slice_size(action.name, action.group, action.percent or 0)
            return (
                f"Raise the rollout of {action.target} from {current['percent']:g}% to "
                f"{action.percent:g}%: {count - current['slice']} more device(s) (the "
                f"{current['slice']} already in stay in). Its state stays {current['state']}."
            )
        effect = {
            "pause": "devices that have not installed it do not start",
            "resume": "devices in its slice install it at their next check",
            "abort": "devices are told; those that installed it go back once the version "
            "is withdrawn in the signed metadata (cloud-gateway models withdraw)",
        }[action.action]
        return (
            f"{action.action.capitalize()} the rollout of {action.target} "
            f"({current['state']}, {current['percent']:g}%, {current['stats']['installed']} "
            f"of {current['slice']} installed): {effect}."
        )

    def _published(self, action: Action) -> None:
        ota = self.views.ota_repository
        if ota is None:
            return  # no repository here to check against (the command line's case)
        for version in published_versions(ota):
            if (version["name"], version["version"]) == (action.name, action.version):
                if version["withdrawn"]:
                    raise BadRequest(f"{action.name} v{action.version} is withdrawn")
                if action.group not in version["groups"]:
                    raise BadRequest(
                        f"{action.name} v{action.version} is not published for group "
                        f"{action.group} (it is for {', '.join(version['groups'])})"
                    )
                return
        raise NotFound(f"{action.name} v{action.version} is not published")

    def perform(self, action: Action, actor: str) -> Rollout:
        """Do it, record it, announce it.

        Raises:
            BadRequest: the action does not apply (a percent not above the current one).
            NotFound: no such rollout, or no such published version.
        """
        try:
            if action.action == "start":
                self._published(action)
                rollout = self.rollouts.start(
                    action.name, action.version, action.group, action.percent or 0.0,
                    failure_threshold=action.failure_threshold,
                )  # fmt: skip
                detail = f"at {rollout.percent:g}%, pauses at {rollout.failure_threshold:.0%}"
            elif action.action == "raise":
                before = self.views.rollout(action.name, action.version, action.group)
                rollout = self.rollouts.raise_percent(
                    action.name, action.version, action.group, action.percent or 0.0
                )
                detail = f"from {before['percent']:g}% to {rollout.percent:g}%"
            else:
                state = _STATES[action.action]
                changed = self.rollouts.set_state(
                    action.name, action.version, action.group, state,
                    f"{state} by {actor} on the dashboard",
                )  # fmt: skip
                rollout = changed[0]
                detail = f"now {rollout.state}"
        except KeyError as exc:
            raise NotFound(str(exc.args[0])) from None
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self.fleet.record_action(actor, action.action, action.target, detail)
        self.announce(rollout)
        return rollout
