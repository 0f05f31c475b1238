"""Probabilities as log-odds and back: the one ``logit`` and the one ``sigmoid`` of the turn's end.

The fusion (``fusion.py``) adds its evidence as log-odds, the text rule (``text_rule.py``) shifts
them, and the wait (``fusion.wait_s``) is the silence that brings them to a threshold's. Each caller
says how far from 0 and 1 its probabilities are kept (``floor``): a probability read from 20
candidates is no finer than 1e-4, one from a model's softmax may be far finer.
"""

from __future__ import annotations

import math


def logit(p: float, floor: float = 1e-12) -> float:
    """log(p / (1 - p)), ``p`` kept ``floor`` away from 0 and 1."""
    p = min(max(p, floor), 1 - floor)
    return math.log(p / (1 - p))


def sigmoid(z: float) -> float:
    """1 / (1 + e^-z), the inverse of ``logit`` (``z`` kept within ±50: no overflow)."""
    return 1 / (1 + math.exp(-max(-50.0, min(50.0, z))))
