"""When a run has diverged (docs/REFERENCE.md; README "Diverged"): the error that stops it,
how many steps without an update the trainer accepts in a row, and the report of which
tensors went non-finite. The trainer (sigma_moe/framework/trainer.py) applies them."""
from __future__ import annotations

import torch


class TrainingDiverged(RuntimeError):
    pass


# nan_policy=skip gives up after this many skipped steps in a row: a bad batch is skipped,
# weights that give non-finite losses on every batch would be "trained" to the end on none
MAX_SKIPPED_IN_ROW = 10
# trainer.precision=fp16 gives up after this many GradScaler-skipped (overflow) steps in a row
MAX_OVERFLOWS_IN_ROW = 32


def nonfinite_report(model: torch.nn.Module) -> str:
    """Which weights and gradients hold NaN/inf, for the divergence message."""
    params = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    grads = [n for n, p in model.named_parameters()
             if p.grad is not None and not torch.isfinite(p.grad).all()]
    parts = []
    if params:
        parts.append(f"non-finite weights in {', '.join(params[:4])}")
    if grads:
        parts.append(f"non-finite gradients in {len(grads)} tensors (first: "
                     f"{', '.join(grads[:3])})")
    return "; " + "; ".join(parts) if parts else ""
