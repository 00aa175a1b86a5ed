"""The agent: runtime, policy, privacy, offload and fallback, tied together.

``agent.infer(model, inputs, label=..., deadline_ms=...)`` does, per request
(:class:`~edge_agent.agent.core.Agent`, each step a method of its own):

0. accept it: the model name (the one naming rule), the label, the version
   asked for, the inputs as arrays (an empty batch is refused before
   anything runs), the deadline;
1. gather the facts (:mod:`.facts`: can the device run the model and does it
   fit; latency estimates, and the requests already running on the local
   model; the time left; heat and load; link and breaker state) and ask the
   pure policy (:func:`edge_agent.policy.decide`) where to run;
2. when the answer would leave the device, inspect the inputs first (faces in
   pictures, personal data in text) and ask again with the findings (findings
   only ever make a request stricter, so a request that stays here needs no
   inspection);
3. run it: locally (:mod:`.models`; a model that escalates asks the policy
   again with the local answer's confidence); or offload (a redacted copy
   when the label says so), through the exit guard; a deadline that passed
   before the work could start is a ``DeadlineExceeded``;
4. when the cloud fails (timeout, unreachable, breaker open), fall back in
   tiers (:mod:`.fallback`): a local model, marked ``degraded``; a cached
   answer for the same input, marked ``cached``; else a clear error. Never
   past the deadline: an offload gets the time left minus what the local
   fallback needs;
5. count it (:mod:`.stats`) and answer (:mod:`.result`).

A result's latency is the request's own time; loading and warming up a model
on its first use is reported apart (``load_ms``).

Models come from a :class:`ModelSource` (:mod:`.sources`): the models installed
over the air (decrypted into memory) before the bundled ones.
:meth:`Agent.reload` swaps a model in without failing the requests running on
the old one.
"""

from edge_agent.agent.core import DEFAULT_POLICY, Agent
from edge_agent.agent.fallback import ResultCache
from edge_agent.agent.models import LocalModel, LocalModels
from edge_agent.agent.result import AgentResult
from edge_agent.agent.sources import LayeredSource, ModelSource, OtaSource
from edge_agent.agent.stats import AgentStats

__all__ = [
    "DEFAULT_POLICY",
    "Agent",
    "AgentResult",
    "AgentStats",
    "LayeredSource",
    "LocalModel",
    "LocalModels",
    "ModelSource",
    "OtaSource",
    "ResultCache",
]
