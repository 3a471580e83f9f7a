"""Speech tests run their tensors on one CPU thread: they are small (narrow codecs, tiny
backbones), where a second intra-op thread only adds synchronisation, and on a loaded
machine a spinning second thread makes each small op tens of times slower."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
