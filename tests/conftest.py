import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# One thread: tiny test tensors gain nothing from more, and on a small shared machine OpenMP threads
# that wait on each other stall (a 2-thread op measured 25 ms vs 3 us with one thread under load).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
