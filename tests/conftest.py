import pytest
import torch


@pytest.fixture(scope='session', autouse=True)
def one_thread():
    """The test models are tiny: one thread is faster, and immune to a second thread being descheduled on a
    busy machine (which made each op wait ~10 ms). Subprocesses (torchrun, CLI runs) keep their own default."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
