"""Average precision (area under the precision-recall curve), over the whole epoch."""

from __future__ import annotations

import torch

from ember.train.metric.auroc import AurocMetric


def average_precision(
    scores: torch.Tensor,
    positive: torch.Tensor,
    valid: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Macro average precision of the columns of `scores` [N, K] against `positive`
    [N, K], on the device, as scikit-learn's `average_precision_score`:
    AP = sum over thresholds of (R_n - R_{n-1}) P_n, one threshold per distinct score.

    Every positive sample contributes the precision at its score's threshold (all
    samples scoring at least as high), divided by the column's number of positives.
    Rows where `valid` [N] is False are left out; columns without a positive are
    skipped; the result is NaN when no column has one.
    """
    s, pos = scores.t(), positive.t()  # [K, N]
    counted = torch.ones_like(pos) if valid is None else valid.expand_as(pos)
    if valid is not None:
        s = s.masked_fill(~valid, float("-inf"))  # left-out rows rank last and count nothing
        pos = pos & valid
    # Descending order: sort the negated scores ascending.
    ordered, order = (-s).sort(dim=-1)
    ordered = ordered.contiguous()
    pos_sorted = pos.gather(-1, order).to(dtype)
    counted_sorted = counted.gather(-1, order).to(dtype)
    true_pos = pos_sorted.cumsum(dim=-1)
    seen = counted_sorted.cumsum(dim=-1)
    # The last position of each tie group: the threshold a tied sample belongs to.
    last = torch.searchsorted(ordered, ordered, right=True) - 1
    precision = true_pos.gather(-1, last) / seen.gather(-1, last).clamp(min=1.0)
    n_pos = pos_sorted.sum(dim=-1)
    per_column = (pos_sorted * precision).sum(dim=-1) / n_pos.clamp(min=1.0)
    defined = n_pos > 0
    return torch.where(defined, per_column, 0.0).sum() / defined.sum().to(dtype)


class AucPrMetric(AurocMetric):
    """Average precision (the area under the precision-recall curve, step-wise as in
    scikit-learn's `average_precision_score`) of the whole epoch, unitless in [0, 1].

    It reads what `AurocMetric` reads, the same way: binary scores [N] / [N, 1] (or
    two-class logits [N, 2]) against 0/1 targets, one-vs-rest macro over classes for
    scores [N, C >= 3] against class indices, label-wise macro for multi-label
    outputs, with `from_logits` as there. Classes (or labels) without a positive
    sample are left out of the macro mean. The iteration value is the average
    precision of the batch; the epoch value is computed at epoch end from every score
    of the epoch, kept on the device (merged across processes).
    """

    name = "AUC-PR"
    _area = staticmethod(average_precision)
    _who = "AucPrMetric ('AUC-PR')"
