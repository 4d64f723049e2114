"""opforge.models on a GPU: correctness of the decoder, then its speed against transformers.

    PYTHONPATH=src python3 benchmarks/tools/gpu_check_models.py            # H100: under ~150 s
    PYTHONPATH=src python3 benchmarks/tools/gpu_check_models.py --cpu-smoke   # the script's logic, tiny, on CPU

A Llama-3.2-1B-shaped model (random weights, bf16, llama3 rope scaling, tied embeddings) is
written as safetensors to a temporary directory and loaded through ``opforge.models.load``.

Checks (PASS/FAIL): CUDA-graph generation == eager generation (batch 1 and a batch of 2 prompts
of different lengths); prefill + decode logits == full forward; float32 greedy tokens and
logits vs transformers' float32; bf16 logits error vs transformers' float32 no worse than
transformers' own bf16 (ratio <= 1.1); int8 logits vs bf16 (reported), int4 perplexity on a
fixed random-token stream (reported); a traced decode step uses only opforge ops.

Timings: decode tokens/s at batch 1, context 512 (graphs on and off; int8/int4 when present),
prefill tokens/s at 1x2048, first token (prefill + capture) for 512 tokens, against
transformers (default sdpa attention, no compile) with its dynamic and static cache, and
transformers + opforge.patch (static cache kept eager). Decode is also shown as % of the weight-bandwidth limit
(weight bytes / measured copy bandwidth). JSON goes to $OUT/models.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import torch

START = time.perf_counter()
RESULTS: dict[str, Any] = {"checks": [], "timings": []}

def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS["checks"].append({"name": name, "pass": bool(ok), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)


def guarded(name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # one failing case must not end the run
        check(name, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        traceback.print_exc(limit=3)
        return None


BUDGET_S = 135.0       # optional parts are skipped past this, so the whole run stays under ~150 s


def within_budget(part: str, need_s: float = 0.0) -> bool:
    """False (and says so) when ``part`` would start too late for the run's time budget."""
    elapsed = time.perf_counter() - START
    if elapsed + need_s <= BUDGET_S:
        return True
    print(f"SKIP  {part}: {elapsed:.0f} s elapsed, budget {BUDGET_S:.0f} s", flush=True)
    RESULTS.setdefault("skipped", []).append(part)
    return False


def timing(name: str, tokens_per_s: float, **extra: Any) -> None:
    RESULTS["timings"].append({"name": name, "tokens_per_s": tokens_per_s, **extra})
    print(f"TIME  {name}: {tokens_per_s:.1f} tokens/s {extra if extra else ''}", flush=True)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _tps(prefix: str) -> Any:
    for t in RESULTS["timings"]:
        if t["name"].startswith(prefix):
            return t["tokens_per_s"]
    return None


def targets(limit: float) -> list[dict]:
    """The targets as PASS/MISS (or N/A when a number is missing), stored in RESULTS."""
    out: list[dict] = []

    def target(name: str, ok: Any, detail: str) -> None:
        verdict = "N/A" if ok is None else ("PASS" if ok else "MISS")
        out.append({"name": name, "verdict": verdict, "detail": detail})

    bf16 = _tps("opforge bf16 decode b1")
    target("bf16 decode b1 >= 70% of the weight-bandwidth limit", None if bf16 is None else bf16 >= 0.7 * limit,
           f"{bf16 or 0:.0f} tokens/s = {100 * (bf16 or 0) / limit:.0f}% of {limit:.0f}")
    for q, want in (("int4", 1.8), ("int8", 1.4), ("int4+head", 1.8), ("int8+head", 1.4)):
        tq = _tps(f"opforge {q} decode b1")
        ok = None if tq is None or not bf16 else tq >= want * bf16
        target(f"{q} decode b1 >= {want}x opforge bf16", ok, f"{tq or 0:.0f} tokens/s = {(tq or 0) / (bf16 or 1):.2f}x")
    pre, hf_pre = _tps("opforge bf16 prefill"), _tps("transformers bf16 prefill")
    target("prefill >= 1.2x transformers eager", None if pre is None or hf_pre is None else pre >= 1.2 * hf_pre,
           f"{pre or 0:.0f} vs {hf_pre or 0:.0f} tokens/s = {(pre or 0) / (hf_pre or 1):.2f}x")
    ft = RESULTS.get("first_token_s")
    first = None if ft is None else ft["prefill"] + ft["capture"]
    target("first token (512-token prompt, incl. graph capture) < 2 s", None if first is None else first < 2.0,
           f"{first or 0:.3f} s")
    pp = _tps("transformers+opforge.patch bf16 prefill")
    target("patch prefill >= 1.2x transformers eager", None if pp is None or hf_pre is None else pp >= 1.2 * hf_pre,
           f"{(pp or 0) / (hf_pre or 1):.2f}x")
    ratios = []
    for t in RESULTS["timings"]:
        if t["name"].startswith("transformers+opforge.patch"):
            base = _tps(t["name"].replace("transformers+opforge.patch", "transformers", 1))
            if base:
                ratios.append((t["name"].split("patch ", 1)[1], t["tokens_per_s"] / base))
    worst = min((r for _, r in ratios), default=None)
    target("patch no slower than transformers anywhere (>= 0.98x, noise)", None if worst is None else worst >= 0.98,
           ", ".join(f"{n} {r:.2f}x" for n, r in ratios))
    RESULTS["targets"] = out
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU: checks the script only")
    parser.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    args = parser.parse_args()
    import opforge
    from opforge.bench.suites.model import median_seconds as median_time, sync, transformers_decode_tokens_per_s
    from opforge.models import load
    from opforge.serve import generate, last_stats
    from opforge.models.testing import LLAMA_1B, TINY_LLAMA, write_random_checkpoint
    from opforge.runtime.device import measure_copy_bandwidth

    smoke = args.cpu_smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = dict(TINY_LLAMA, vocab_size=256, max_position_embeddings=4096,
                  rope_scaling=LLAMA_1B["rope_scaling"] | {"original_max_position_embeddings": 64},
                  tie_word_embeddings=True) if smoke else LLAMA_1B
    prompt_len, new_tokens, prefill_len = (24, 8, 64) if smoke else (512, 128, 2048)
    max_seq = prefill_len + 8
    RESULTS.update(device=str(torch.cuda.get_device_name() if not smoke else "cpu"), smoke=smoke,
                   torch=torch.__version__)
    bandwidth = measure_copy_bandwidth(device, nbytes=(1 << 22) if smoke else (1 << 30), repeats=10)
    RESULTS["copy_bandwidth_gbs"] = bandwidth
    t0 = time.perf_counter()
    path = write_random_checkpoint(config, tempfile.mkdtemp(prefix="opforge-models-check-"), device, torch.bfloat16)
    print(f"checkpoint written in {time.perf_counter() - t0:.1f} s: {path}", flush=True)

    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, config["vocab_size"], (1, prompt_len), generator=gen)
    long_prompt = torch.randint(0, config["vocab_size"], (1, prefill_len), generator=gen)

    model = load(path, device=device, dtype=torch.bfloat16, max_seq_len=max_seq, max_batch=2)
    weight_bytes = model.weight_bytes()
    limit = bandwidth * 1e9 / weight_bytes
    RESULTS.update(weight_bytes=weight_bytes, decode_limit_tokens_per_s=limit)
    print(f"weights {weight_bytes / 1e9:.2f} GB, copy {bandwidth:.0f} GB/s -> limit {limit:.0f} tokens/s", flush=True)

    def step_trace() -> None:
        model.prefill(prompt[:, :8], torch.tensor([8]))
        with opforge.trace() as t:
            model.decode_step(prompt[:, 8].to(device), model.cache_seqlens[:1])
        kernels = sorted({(e.op, e.backend, e.variant) for e in t})
        RESULTS["decode_step_kernels"] = [" ".join(k) for k in kernels]
        print("decode step kernels:", ", ".join(RESULTS["decode_step_kernels"]), flush=True)
        wanted = {"linear", "add_rms_norm", "rms_norm", "swiglu", "rotary_kv_cache_append", "decode_attention"}
        ops = {k[0] for k in kernels}
        check("decode step: every op is opforge's (trace)", ops == wanted, f"ops {sorted(ops)}")
    guarded("trace", step_trace)

    # ---- correctness ---------------------------------------------------------------------------
    def graphs_vs_eager() -> None:
        a = generate(model, prompt, 32, graphs=True)
        b = generate(model, prompt, 32, graphs=False)
        check("decode: CUDA graph generation == eager (batch 1, 32 tokens)", a == b)
        prompts = [prompt[0, :prompt_len // 2].tolist(), prompt[0].tolist()]
        a = generate(model, prompts, 24, graphs=True)
        b = generate(model, prompts, 24, graphs=False)
        check("decode: CUDA graph generation == eager (2 prompts of different lengths)", a == b)
        singles = [generate(model, p, 24)[0] for p in prompts]
        check("batched prompts == single runs (bf16, greedy)", a == singles,
              "" if a == singles else "bf16 batched matmuls may round differently; compare logits")
    guarded("graphs vs eager", graphs_vs_eager)

    def prefill_decode_vs_forward() -> None:
        ids = long_prompt[:, :64]
        full = model.forward(ids)[0].float()
        steps = [model.prefill(ids[:, :48], torch.tensor([48]))[0]]
        seqlens = model.cache_seqlens[:1]
        for t in range(48, 64):
            steps.append(model.decode_step(ids[:, t].to(device), seqlens)[0])
            seqlens.add_(1)
        err = rel(torch.stack(steps), full[47:64])
        check("prefill + decode logits == full forward (bf16)", err < 2e-2, f"rel err {err:.2e}")
    guarded("prefill+decode", prefill_decode_vs_forward)

    hf_ok = True
    try:
        import transformers
    except ImportError:
        hf_ok = False
        print("transformers not importable: peer checks and timings skipped", flush=True)

    def vs_transformers() -> None:
        ids = prompt[:, :128].to(device)
        hf32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        hf32.generation_config.eos_token_id = None
        with torch.no_grad():
            ref = hf32(ids).logits.float()
            hf_tokens = hf32.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                                      pad_token_id=0)[0, ids.shape[1]:].tolist()
        ours32 = load(path, device=device, dtype=torch.float32, max_seq_len=256)
        err32 = rel(ours32.forward(ids).float(), ref)
        check("float32 logits vs transformers float32 (<= 1e-4)", err32 <= 1e-4, f"rel err {err32:.2e}")
        toks = generate(ours32, ids, 32)[0]
        same = sum(a == b for a, b in zip(toks, hf_tokens))
        check("float32 greedy 32 tokens == transformers'", toks == hf_tokens, f"{same}/32 equal")
        del ours32, hf32
        hf16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
        with torch.no_grad():
            hf_err = rel(hf16(ids).logits.float(), ref)
        ours_err = rel(model.forward(ids).float(), ref)
        check("bf16 logits error vs transformers fp32 <= 1.1x transformers' own bf16", ours_err <= 1.1 * hf_err,
              f"ours {ours_err:.3e}, transformers bf16 {hf_err:.3e}, ratio {ours_err / hf_err:.2f}")
        RESULTS["bf16_logits_err"] = {"opforge": ours_err, "transformers": hf_err}
    if hf_ok and within_budget("float32/bf16 vs transformers", 25):
        guarded("vs transformers", vs_transformers)

    quantized: dict[str, Any] = {}

    def quantized_checks() -> None:
        ids = prompt[:, :128]
        ref = model.forward(ids).float()
        stream = torch.randint(0, config["vocab_size"], (1, 256 if not smoke else 32), generator=gen)

        def perplexity(m) -> float:
            logp = torch.log_softmax(m.forward(stream)[0, :-1].float(), -1)
            return math.exp(-float(logp.gather(-1, stream[0, 1:, None].to(device)).mean()))
        RESULTS["bf16_perplexity_random_stream"] = perplexity(model)
        print(f"bf16 perplexity on the random stream: {RESULTS['bf16_perplexity_random_stream']:.4g}", flush=True)
        for q, quantize_head in (("int8", False), ("int4", False), ("int8", True), ("int4", True)):
            qm = load(path, device=device, dtype=torch.bfloat16, quantize=q, max_seq_len=max_seq,
                      group_size=32 if smoke else 128, quantize_head=quantize_head)
            q = q + "+head" if quantize_head else q
            err = rel(qm.forward(ids).float(), ref)
            ppl = perplexity(qm)
            quantized[q] = qm
            head = qm.lm_head.numel() * qm.lm_head.element_size() if isinstance(qm.lm_head, torch.Tensor) else 0
            RESULTS[f"{q}_weight_bytes"] = qm.weight_bytes()
            RESULTS[f"{q}_dense_lm_head_bytes"] = head
            print(f"{q}: weights read per decode step {qm.weight_bytes() / 1e9:.3f} GB, of which the dense "
                  f"lm_head {head / 1e9:.3f} GB (bf16: {weight_bytes / 1e9:.3f} GB)", flush=True)
            RESULTS[f"{q}_logits_rel_err_vs_bf16"] = err
            RESULTS[f"{q}_perplexity_random_stream"] = ppl
            check(f"{q}: runs; logits rel err vs bf16 {err:.3e}, perplexity on random tokens {ppl:.4g} "
                  f"(bf16: {RESULTS['bf16_perplexity_random_stream']:.4g}; reported)",
                  math.isfinite(err) and err < (0.05 if q.startswith("int8") else 0.5))
    guarded("quantized", quantized_checks)

    # ---- timings ---------------------------------------------------------------------------------
    def ours_decode(m, label: str, graphs: bool) -> None:
        generate(m, prompt, 4, graphs=graphs)            # warm: compile, capture
        runs = []
        for _ in range(3):
            generate(m, prompt, new_tokens, graphs=graphs)
            runs.append(last_stats(m).decode_tokens_per_s)
        tps = sorted(runs)[1]
        own_limit = bandwidth * 1e9 / m.weight_bytes()
        timing(f"opforge {label} decode b1 ctx{prompt_len} graphs={'on' if graphs else 'off'}", tps,
               pct_of_limit=100 * tps / own_limit)
    guarded("decode bf16 graphs", lambda: ours_decode(model, "bf16", True))
    guarded("decode bf16 eager", lambda: ours_decode(model, "bf16", False))
    for q, qm in quantized.items():
        guarded(f"decode {q}", lambda qm=qm, q=q: ours_decode(qm, q, True))
    quantized.clear()

    def ours_prefill() -> None:
        lengths = torch.tensor([prefill_len])
        s = median_time(lambda: model.prefill(long_prompt, lengths), device)
        timing(f"opforge bf16 prefill 1x{prefill_len}", prefill_len / s)

    guarded("prefill", ours_prefill)

    def first_token() -> None:
        sync(device)
        t0 = time.perf_counter()
        generate(model, prompt, 2, graphs=True)
        s = last_stats(model)
        RESULTS["first_token_s"] = {"prefill": s.prefill_s, "capture": s.capture_s,
                                    "total_wall": time.perf_counter() - t0}
        print(f"TIME  first token, {prompt_len}-token prompt: prefill {s.prefill_s * 1e3:.0f} ms + "
              f"capture {s.capture_s * 1e3:.0f} ms", flush=True)
    guarded("first token", first_token)
    if device.type == "cuda":
        RESULTS["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model

    def hf_peers() -> None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
        hf.generation_config.eos_token_id = None
        hf.generation_config.disable_compile = True    # eager: generate would compile a static-cache forward on CUDA
        ids = prompt.to(device)
        n = 16 if smoke else 64

        def decode_tps(**kw: Any) -> float:
            return transformers_decode_tokens_per_s(hf, ids, n, device, warmup_tokens=4, **kw)

        def prefill_tps() -> float:
            x = long_prompt.to(device)
            with torch.no_grad():
                return prefill_len / median_time(lambda: hf(x, use_cache=False), device)
        for label in ("transformers", "transformers+opforge.patch"):
            if label.endswith("patch"):
                report = opforge.patch(hf)
                RESULTS["patch_report"] = str(report)
            for cache in ("dynamic", "static"):
                kw = {"cache_implementation": "static"} if cache == "static" else {}
                tps = guarded(f"{label} {cache}", lambda kw=kw: decode_tps(**kw))
                if tps is not None:
                    timing(f"{label} bf16 decode b1 ctx{prompt_len} {cache} cache", tps, pct_of_limit=100 * tps / limit)
            tps = guarded(f"{label} prefill", prefill_tps)
            if tps is not None:
                timing(f"{label} bf16 prefill 1x{prefill_len}", tps)
    if hf_ok and within_budget("transformers peers", 15):
        guarded("transformers peers", hf_peers)

    # ---- summary -----------------------------------------------------------------------------------
    RESULTS["wall_s"] = time.perf_counter() - START
    print("\n==== opforge.models summary ====")
    print(f"device {RESULTS['device']}, copy {bandwidth:.0f} GB/s, weights {weight_bytes / 1e9:.2f} GB, "
          f"decode limit {limit:.0f} tokens/s")
    for c in RESULTS["checks"]:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['name']}  {c['detail']}")
    width = max((len(t["name"]) for t in RESULTS["timings"]), default=10)
    for t in RESULTS["timings"]:
        pct = f"{t['pct_of_limit']:5.1f}% of limit" if "pct_of_limit" in t else ""
        print(f"{t['name']:<{width}}  {t['tokens_per_s']:9.1f} tokens/s  {pct}")
    print("---- targets ----")
    for tgt in targets(limit):
        print(f"{tgt['verdict']:<4}  {tgt['name']}: {tgt['detail']}")
    print(f"wall {RESULTS['wall_s']:.0f} s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "models.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    return 0 if all(c["pass"] for c in RESULTS["checks"]) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:            # e.g. the checkpoint or the load failed: report, keep the JSON
        traceback.print_exc()
        check("gpu_check_models.py ran to the end", False, f"{type(exc).__name__}: {exc}"[:300])
        out = os.environ.get("OUT", "./gpu-out")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "models.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
        sys.exit(1)
