"""Test set-up: with no GPU, Triton kernels run in Triton's CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit kernel is created, so before opforge's op
families are imported. Every opforge output is NaN-poisoned before its kernel runs.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from opforge.runtime import alloc  # noqa: E402

from opforge.testing import DEVICE  # noqa: E402

settings.register_profile("opforge", deadline=None, max_examples=20, derandomize=False)
settings.load_profile("opforge")


@pytest.fixture(autouse=True)
def _poison_outputs():
    with alloc.poisoned_outputs():
        yield


@pytest.fixture
def device() -> str:
    return DEVICE
