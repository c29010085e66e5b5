"""The loss `mhar-toy eval` reports, computed by the PyTorch model: the mean cross-entropy over
the non-overlapping windows of T + 1 bytes (stride T) of the validation tail, B windows a pass."""

from typing import Tuple

import torch

from .data import Corpus, sequential_batch, window_count
from .model import MharModel


def evaluate(model: MharModel, data_path: str, val_fraction: float = 0.1, batch: int = 16,
             max_windows: int = 0, device=None) -> Tuple[float, int]:
    """(mean loss in nats per byte, windows) over the held-out tail, as `mhar-toy eval`."""
    T = model.cfg.T
    data = Corpus(data_path, val_fraction, T).val
    windows = window_count(data, T)
    if max_windows > 0:
        windows = min(windows, max_windows)
    total = 0.0
    with torch.no_grad():
        for w in range(0, windows, batch):
            B = min(batch, windows - w)
            tok, tgt = sequential_batch(data, w, B, T)
            loss = model(torch.from_numpy(tok).to(device), torch.from_numpy(tgt).to(device))
            total += B * float(loss)
    return total / windows, windows
