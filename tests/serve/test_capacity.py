"""How many sequences of 512 tokens the paged cache runs at once, against a static cache of the
same memory (one slot of ``max_seq_len`` tokens per sequence): 4x at a 2048-token context, 16x
at 8192, with nothing preempted."""
import pytest
import torch

from opforge.models.testing import tiny_decoder
from opforge.serve import Engine, SamplingParams


@pytest.mark.parametrize("context, factor", [(2048, 4), (8192, 16)])
def test_512_token_sequences_in_the_memory_of_two_static_slots(context, factor):
    model = tiny_decoder(max_seq_len=context)
    slots, block = 2, 16
    blocks = slots * context // block             # the bytes of a static cache of two slots
    engine = Engine(model, max_num_seqs=64, block_size=block, kv_blocks=blocks, enable_prefix_caching=False,
                    max_num_batched_tokens=512 * 2 * factor)
    gen = torch.Generator().manual_seed(0)
    n = 2 * slots * factor
    for i in range(n):
        prompt = torch.randint(3, model.config.vocab_size, (500,), generator=gen).tolist()
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=12, ignore_eos=True))   # 512 tokens
    most = 0
    while engine.has_unfinished():
        engine.step()
        most = max(most, engine.stats().running)
    assert most == slots * factor
    assert engine.scheduler.preemptions == 0
