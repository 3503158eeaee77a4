"""Engine tests: small models, few capture sizes, one torch thread per worker."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_intra_op_thread():
    # The simulator issues many small ops; with pytest-xdist workers sharing two cores,
    # one intra-op thread per worker avoids OpenMP oversubscription (10x slower).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
