"""The exit guard: nothing leaves the device that the privacy rules keep on it.

Enforced where bytes leave, whatever the policy decided: the offload client
asks the guard before anything reaches the transport; the guard searches every
outgoing request again (one marked redacted with the inspector's stronger
checker, the others with its detector) and refuses (and counts) a request whose
data may not leave as it is:

- its effective label (the caller's label, raised by what the detectors find)
  keeps it on the device;
- it must be redacted and was not, or faces or personal text are still found,
  or an image file in it still carries metadata (EXIF, XMP, comments);
- it holds a picture the device cannot search (no face detector installed, a
  layout it cannot read, an image file it cannot decode) while the rules say
  faces may not leave freely.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from edge_agent.policy.rules import PolicyRules
from edge_agent.privacy import PrivacyInspector
from edge_core.errors import PrivacyRefusal
from edge_core.package import ImagePreprocessing
from edge_core.protocol.types import InferRequest

__all__ = ["ExitGuard"]


class ExitGuard:
    def __init__(
        self,
        inspector: PrivacyInspector,
        rules: PolicyRules,
        *,
        preprocessing: Callable[[str], ImagePreprocessing | None] = lambda model: None,
    ) -> None:
        self.inspector = inspector
        self.rules = rules
        self._preprocessing = preprocessing
        self._lock = threading.Lock()
        self.refusals: Counter[str] = Counter()

    def _refuse(self, reason: str, message: str) -> PrivacyRefusal:
        with self._lock:
            self.refusals[reason] += 1
        return PrivacyRefusal(message)

    def check(
        self,
        request: InferRequest,
        *,
        label: str | None,
        redacted: bool,
        preprocessing: ImagePreprocessing | None = None,
    ) -> None:
        """Raise :class:`PrivacyRefusal` when ``request`` may not leave the device.
        ``preprocessing``: how the model's pictures are laid out, where the caller holds
        its package (an update's), else the guard's own lookup."""
        pre = preprocessing or self._preprocessing(request.model_name)
        # what was redacted must pass the stronger eye, not the detector that chose the boxes
        findings = self.inspector.inspect(request.inputs, pre, strict=redacted)
        effective = self.rules.effective_label(label, set(findings.kinds))
        mode = self.rules.leave_mode(effective)
        if mode == "local":
            raise self._refuse(
                "sensitive",
                f"refused to send a '{effective}' request to the cloud ({findings.to_dict()})",
            )
        if mode == "redact":
            if not redacted:
                raise self._refuse(
                    "not_redacted", f"refused to send a '{effective}' request that was not redacted"
                )
            left = sorted(findings.kinds) + (["image metadata"] if findings.metadata else [])
            if left:
                raise self._refuse(
                    "still_identifiable",
                    "refused: the redacted request still shows " + ", ".join(left),
                )
        faces_matter = self.rules.leave_mode(self.rules.finding_labels["faces"]) != "free"
        if faces_matter and findings.unsearchable:
            raise self._refuse(
                "unsearchable",
                f"refused: {', '.join(findings.unsearchable)} may hold a picture that cannot be "
                "searched for faces here",
            )
