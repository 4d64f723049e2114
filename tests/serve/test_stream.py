"""Request streams: outputs handed from the engine's thread to asyncio consumers, one loop call per
burst, and a consumer that fell behind catching up in one list."""
import asyncio
import threading

import pytest

from opforge.serve.stream import LoopWaker, RequestOutput, RequestStream, merge_outputs

pytestmark = pytest.mark.cpu_only     # host-side hand-off only


def _out(rid: str, i: int, last: bool = False) -> RequestOutput:
    return RequestOutput(rid, [10 + i], f"<{i}>", last, "length" if last else None, 4, i + 1, 0.5)


def test_a_burst_of_outputs_for_many_waiting_streams_wakes_the_loop_once():
    streams = [RequestStream(f"r{i}") for i in range(16)]

    async def main():
        waker = LoopWaker.of(asyncio.get_running_loop())

        async def consume(s):
            return [[o.new_text for o in outs] async for outs in s.updates()]
        tasks = [asyncio.create_task(consume(s)) for s in streams]
        await asyncio.sleep(0.01)                      # every consumer now waits on its future
        before = waker.calls
        filler = threading.Thread(target=lambda: [s.put(_out(s.request_id, 0)) for s in streams])
        filler.start()
        filler.join()                                  # the loop is blocked meanwhile: one burst
        await asyncio.sleep(0.01)
        calls = waker.calls - before
        filler = threading.Thread(target=lambda: [s.put(_out(s.request_id, 1, last=True)) for s in streams])
        filler.start()
        filler.join()
        return calls, waker.calls - before, await asyncio.gather(*tasks)

    first, total, got = asyncio.run(main())
    assert first == 1 and total == 2
    assert got == [[["<0>"], ["<1>"]]] * 16


def test_a_consumer_that_fell_behind_gets_every_queued_output_in_one_list():
    s = RequestStream("r1")
    outs = [_out("r1", i, last=(i == 4)) for i in range(5)]
    for o in outs[:3]:
        s.put(o)

    async def main():
        got = []
        async for batch in s.updates():
            got.append(batch)
            if len(got) == 1:
                for o in outs[3:]:
                    s.put(o)
        return got
    got = asyncio.run(main())
    assert got == [outs[:3], outs[3:]]
    merged = merge_outputs(outs)
    assert merged.new_token_ids == [10, 11, 12, 13, 14] and merged.new_text == "<0><1><2><3><4>"
    assert (merged.finished, merged.finish_reason, merged.completion_tokens, merged.prompt_tokens) == \
        (True, "length", 5, 4)
    assert merge_outputs(outs[:1]) is outs[0]


def test_outputs_put_from_another_thread_reach_an_async_and_a_blocking_consumer_in_order():
    a, b = RequestStream("a"), RequestStream("b")

    def fill():
        for i in range(200):
            a.put(_out("a", i, last=(i == 199)))
            b.put(_out("b", i, last=(i == 199)))

    async def consume():
        threading.Thread(target=fill).start()
        return [o.new_token_ids[0] async for o in a]
    got_a = asyncio.run(consume())
    got_b = [o.new_token_ids[0] for o in b]
    assert got_a == got_b == [10 + i for i in range(200)]
