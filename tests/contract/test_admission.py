"""Every key of a recipe's [container] has a judgement in the admission of a git source's commits
(reconciler/load/admission.py, ``JUDGED``): a key added to the model (a ``privileged``, ``cap_add`` or ``devices``)
fails here until the host file can bound it, so nothing a commit may ask of root's engine goes unjudged."""

from __future__ import annotations

from reconciler.load.admission import JUDGED
from reconciler.model.recipe import ContainerSpec
from reconciler.model.source import SourceAllow


def test_every_container_key_is_judged_by_a_rule_of_source_allow() -> None:
    assert set(JUDGED) == set(ContainerSpec.model_fields), "judge the new key in reconciler/load/admission.py"
    rules = {rule.removeprefix("source.allow.") for rule in JUDGED.values() if rule}
    assert rules <= set(SourceAllow.model_fields), rules - set(SourceAllow.model_fields)
