"""The kinds of model a fraud report holds, one row each, and what each kind takes part in: criterion 2
compares every *fused* model with HGB-rolling (:func:`~.evaluate.usefulness_criteria`), the stacker
blends the *stack inputs* (:mod:`.stacking`), and every *recipe* is held against the per-row floor
``token_lr``.

A report row's kind: the report's own rows by their name (:data:`REPORT_KINDS`); a further fine-tuned
fraud model (``--also``, the label-fraction seeds) by its config (:func:`fraud_model_kind`): it is
fused because its head reads tabular features, whatever it is called.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelKind:
    """A kind of model in the report.

    Attributes:
        name: what the kind is.
        fused: it joins the sequence encoder with tabular (rolling) features; criterion 2 compares it
            with ``hgb_rolling`` (the one pre-declared primary counted, the others shown).
        stack_input: the stacker blends its scores.
        recipe: a fine-tuned sequence model, compared with the per-row floor ``token_lr``.
    """

    name: str
    fused: bool = False
    stack_input: bool = False
    recipe: bool = False


BASELINE = ModelKind("baseline")  # a gradient-boosting baseline or the per-row floor
HGB_ROLLING = ModelKind("hgb_rolling", stack_input=True)
HGB_ROLLING_ENCODER = ModelKind("hgb_rolling_encoder", fused=True)  # HGB-rolling + the frozen encoder's state
SEQUENCE = ModelKind("sequence", stack_input=True, recipe=True)  # the report's fine-tuned fraud model
STACKED = ModelKind("stacked", fused=True)  # the blend of HGB-rolling and the sequence models
JOINT = ModelKind("joint", fused=True, stack_input=True, recipe=True)  # a fraud model whose head reads tabular features
FINE_TUNED = ModelKind("fine_tuned", recipe=True)  # any other further fraud model

# the report's own rows, by the name they have there (any other name without a given kind: BASELINE)
REPORT_KINDS = {kind.name: kind for kind in (HGB_ROLLING, HGB_ROLLING_ENCODER, SEQUENCE, STACKED)}


def fraud_model_kind(model) -> ModelKind:
    """The kind of a further fine-tuned fraud model: :data:`JOINT` when its config names tabular
    features (joint fusion, :mod:`slmlab.transactions.heads.joint`), else :data:`FINE_TUNED`."""
    return JOINT if getattr(model.config, "tabular_features", None) is not None else FINE_TUNED


def kind_of(name: str, kinds: dict[str, ModelKind] | None = None) -> ModelKind:
    """The kind of the report row ``name``: ``kinds[name]`` when given (the further models'), else the
    report's own row of that name, else :data:`BASELINE`."""
    if kinds and name in kinds:
        return kinds[name]
    return REPORT_KINDS.get(name, BASELINE)
