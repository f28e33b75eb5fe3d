"""gpuvet's reference-workload throughput against a plain PyTorch training loop of the same model.

Target (issue 5): the tokens/s `gpuvet workload` reports is within 5% of what a plain loop,
written here without any of gpuvet's machinery, gets from the same model shape (same dimensions,
dropout, AdamW settings, gradient clipping, dtype, steps and warm-up), so the figure is the
machine's and not gpuvet's overhead. gpuvet's side is the real `workload.run` (checkpoint trial
included; its throughput covers the timed training steps only); the plain side is a model and a
loop written straight in this file. Rounds alternate the two and the medians are compared.

    .venv/bin/python benchmarks/workload_vs_plain.py [--device cpu|cuda:0] [--steps N] [--rounds R] [--threads T]

The CPU figures are only as steady as the machine: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from gpuvet.bench import workload  # noqa: E402
from gpuvet.bench.common import BenchContext, Budget  # noqa: E402

TARGET = 0.95


# -- the plain side: a GPT and a loop, as a user would write them --------------------------------

class PlainBlock(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.dropout(self.proj(y))
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int, layers: int, heads: int, dropout: float):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.Sequential(*[PlainBlock(d, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, idx, targets):
        x = self.dropout(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        logits = self.ln_f(self.blocks(x)) @ self.wte.weight.T
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def plain_tokens_per_s(cfg: workload.Config, device: str) -> tuple[float, int]:
    torch.manual_seed(0)
    model = PlainGPT(cfg.vocab, cfg.seq_len, cfg.d_model, cfg.layers, cfg.heads, cfg.dropout).to(device)
    cuda = device.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True if cuda else None)
    amp = torch.autocast("cuda", dtype=getattr(torch, cfg.dtype)) if cuda else torch.autocast("cpu", enabled=False)
    start = None
    for step in range(cfg.steps):
        if step == cfg.warmup_steps:
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = cfg.lr  # a schedule would set it here
        tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq_len + 1), device=device)
        with amp:
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    return (cfg.steps - cfg.warmup_steps) * cfg.batch * cfg.seq_len / elapsed, params


# -- gpuvet's side -------------------------------------------------------------------------------

def gpuvet_tokens_per_s(device: str, params: dict, directory: str) -> tuple[float, dict]:
    ctx = BenchContext(device=device, subject="cpu" if device == "cpu" else "gpu0", budget=Budget(600.0),
                       params={**params, "path": directory})
    by_name = {m["name"]: m for m in workload.run(ctx)}
    tps = by_name["workload.tokens_per_s"]
    assert by_name["workload.resume_ok"]["value"] == 1.0, by_name["workload.resume_ok"]["details"]
    return tps["value"], tps["details"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, help="training steps (default: the workload's for the device)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = {"steps": args.steps} if args.steps else {}
    cfg, _default = workload.config_for(BenchContext(args.device, "x", Budget(1), params=params))
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"model: d_model {cfg.d_model}, {cfg.layers} layers, {cfg.heads} heads, seq {cfg.seq_len}, batch {cfg.batch}, "
          f"vocab {cfg.vocab}, {cfg.dtype}; {cfg.steps} steps ({cfg.warmup_steps} warm-up)")
    ours, plain = [], []
    with tempfile.TemporaryDirectory() as directory:
        for r in range(args.rounds):
            order = ("gpuvet", "plain") if r % 2 == 0 else ("plain", "gpuvet")
            for side in order:
                if side == "gpuvet":
                    rate, details = gpuvet_tokens_per_s(args.device, params, directory)
                    ours.append(rate)
                    gpuvet_params = details["parameters"]
                else:
                    rate, plain_params = plain_tokens_per_s(cfg, args.device)
                    plain.append(rate)
                print(f"  round {r + 1} {side:6s} {rate:12,.0f} tokens/s")
    assert gpuvet_params == plain_params, (gpuvet_params, plain_params)  # the same model
    ratio = statistics.median(ours) / statistics.median(plain)
    print(f"gpuvet workload : {statistics.median(ours):12,.0f} tokens/s (median of {len(ours)})")
    print(f"plain loop      : {statistics.median(plain):12,.0f} tokens/s (median of {len(plain)})")
    print(f"ratio gpuvet / plain: {ratio:.3f} (target >= {TARGET}); {gpuvet_params:,} parameters both")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
