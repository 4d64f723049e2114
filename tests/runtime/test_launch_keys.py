"""Launch keys of host tensor descriptors: what Triton specializes on, whatever the release."""
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from opforge.runtime.triton.launch import descriptor_spec


def test_descriptor_key_is_dtype_block_and_padding():
    t = torch.zeros(4, 8, 64)
    a = descriptor_spec(TensorDescriptor(t, [4, 8, 64], [512, 64, 1], [1, 2, 64]))
    b = descriptor_spec(TensorDescriptor(t[:2], [2, 8, 64], [512, 64, 1], [1, 2, 64]))   # another shape: same key
    assert a == b == ("desc", torch.float32, (1, 2, 64), "zero", False)
    assert descriptor_spec(TensorDescriptor(t, [4, 8, 64], [512, 64, 1], [1, 4, 64])) != a
    assert descriptor_spec(TensorDescriptor(t.half(), [4, 8, 64], [512, 64, 1], [1, 2, 64])) != a


def test_descriptor_key_of_a_release_without_the_optional_fields():
    class Older:   # a host descriptor with no padding or float32-rounding field (Triton 3.6)
        base = torch.zeros(4, 64)
        block_shape = [2, 64]

    assert descriptor_spec(Older()) == ("desc", torch.float32, (2, 64), "zero", False)
