"""One torch thread for tests that run model math: on the 2 shared cores of the CI box, OpenMP threads that
spin-wait for a busy core make tiny tensor ops ~100x slower. A conftest imports `one_torch_thread` to apply it."""
import pytest


@pytest.fixture(autouse=True)
def one_torch_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
