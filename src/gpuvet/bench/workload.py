"""B10 reference workload: a small GPT trained for real, then saved, restored and resumed.

The seed's advice before trusting a platform with a big job: run a small one end to end (train,
save a checkpoint, restore it, resume) on the storage the big job will use. This module does
that with a GPT-style decoder-only transformer (torch.nn only) on synthetic tokens:

1. train `steps` steps (the first `warmup_steps` untimed) -> workload.tokens_per_s,
   workload.step_time_ms and, given the GPU's dense peak, workload.mfu;
2. save a checkpoint (model, optimizer, step, RNG states, data position) to the path the user
   names, with fsync -> workload.checkpoint_write;
3. continue `resume_steps` steps in this process: the uninterrupted reference;
4. in a FRESH process, read the checkpoint back with the page cache dropped
   (-> workload.checkpoint_read), restore it and train the same steps -> workload.resume_ok:
   1 when its losses and its weight update equal the reference's within the tolerance;
5. restore the same bytes once more in this process and take the same steps again: how far two
   correct restored runs drift apart on this device (its run-to-run noise), which sets the
   tolerance between RESUME_RTOL (the floor) and RESUME_RTOL_MAX, and tells a state the checkpoint
   does not hold (both restored runs drift) from a fresh process that went wrong (only it drifts).

A path that is not writable, full or vanishing is a failure of that step, with the reason in
the measurement's details; the throughput figures come out regardless. The checkpoint files
are always removed (unless params["keep_checkpoint"]).

Run as a module this file is the fresh process of step 4 (`--resume CKPT`), or, without
`--resume`, the whole workload for a quick look: `python -m gpuvet.bench.workload --device cpu`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import gc
import io
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..samples import quantile
from .common import BenchContext, Budget, OutOfTime, free_memory_bytes, measurement
from .leftovers import owned_prefix, register, remove, sweep_stale

CHECKPOINT_FORMAT = "gpuvet-workload/1"

# Sizes per device. cuda: GPT-2-small-shaped (12 x 768, ~92M parameters with an 8192-token
# vocabulary), big enough for its GEMMs to fill a datacenter GPU; 150 steps take seconds on an
# H100-class GPU and the checkpoint (weights + AdamW moments) is ~1.1 GB: a real write.
# cpu: a toy that trains in a few seconds on two cores.
SIZES: dict[str, dict[str, Any]] = {
    "cuda": dict(d_model=768, layers=12, heads=12, seq_len=1024, batch=16, vocab=8192,
                 steps=150, warmup_steps=10, resume_steps=4, lr=1e-3),
    "cpu": dict(d_model=128, layers=2, heads=4, seq_len=64, batch=8, vocab=512,
                steps=30, warmup_steps=5, resume_steps=3, lr=3e-3),
}
# How close the resumed run must stay to the uninterrupted one (relative), for the losses and
# for the weight update of the resumed steps (seen through random projections: weights_sketch).
# The losses alone are a weak witness: they average over the batch. On the default CPU model a
# lost dropout RNG state moved them by 2e-3 only, fresh AdamW moments by 1e-3, while the update
# moved by 0.26 and 1.5 (a data position one batch off: 0.39; the step count lost: 3.6).
# On the CPU in fp32 both runs execute the same kernels, yet not always in the same order: a fresh
# process may split a reduction over other threads (one correctly resumed CPU run differed by 8.9e-6
# in the update, its losses identical), so the CPU floor sits at fp32 rounding carried over a few
# steps (1e-4 of the update, 1e-5 of the losses), still 2,600x and 200x under what a wrong state
# did (0.26 update, 2e-3 losses). On a GPU the backward
# of flash (and memory-efficient) attention accumulates dQ with atomics unless torch runs in
# deterministic mode (which the shared worker cannot turn on: it makes every cuBLAS call without
# CUBLAS_WORKSPACE_CONFIG an error), so two correct runs differ at fp32 rounding level; bf16 rounding
# of the gradients then flips a few elements by one bf16 ulp (2**-8), and Adam and the next steps'
# forward carry that on: estimated ~1e-4 to 1e-3 of the update after 4 steps, not measured on a
# GPU yet. A wrong RNG or data position moves the update by ~5e-2 or more (estimated for the default
# GPU model; 0.26 and 0.39 measured on the CPU one), lost optimizer state or step count by ~1.
# So the tolerance is measured rather than guessed: the same checkpoint restored in this process
# and run again gives the device's own run-to-run noise; the fresh process must agree within
# NOISE_FACTOR times that, never less than RESUME_RTOL and never more than RESUME_RTOL_MAX (kept
# below what a wrong state does). A restored run in this process that drifts more than
# RESUME_RTOL_MAX fails on its own. Run with `--tamper seed` on a GPU to see the margin.
RESUME_RTOL = {"cpu": {"loss": 1e-5, "update": 1e-4}, "cuda": {"loss": 2e-3, "update": 5e-3}}
RESUME_RTOL_MAX = {"cpu": {"loss": 1e-4, "update": 1e-2}, "cuda": {"loss": 1e-2, "update": 2e-2}}
NOISE_FACTOR = 5.0  # an L2 distance over ~1e8 weights concentrates: two restored runs drift alike
UPDATE_SKETCH_SEED = 7
CHECKPOINT_PREFIX = "gpuvet-workload-"  # + pid@host-: see leftovers
TRAIN_SHARE = 0.55  # of the budget; the rest is for the checkpoint and the fresh process
WORD_LEN = 8  # tokens per synthetic word
FLOPS_FORMULA = ("6 x N + 12 x layers x seq_len x d_model per token (PaLM appendix B): N counts the parameters "
                 "in matmuls (all but the position embedding; the tied token embedding once, as the output head); "
                 "the second term is attention's QK^T and AV, forward + backward, counted in full although causal")


@dataclass
class Config:
    d_model: int
    layers: int
    heads: int
    seq_len: int
    batch: int
    vocab: int
    steps: int
    warmup_steps: int
    resume_steps: int
    lr: float
    dropout: float = 0.1  # residual dropout: draws from the RNG, so the resume check covers RNG state
    seed: int = 1234
    dtype: str = "float32"  # compute dtype: bfloat16 / float16 under autocast on a GPU

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len

    @property
    def total_steps(self) -> int:
        return self.steps + self.resume_steps


def config_for(ctx: BenchContext) -> tuple[Config, bool]:
    """The run's sizes: the device's defaults with ctx.params overrides; and whether the model's
    shape is the default one (throughput judgement only knows what to expect of that one)."""
    kind = "cuda" if ctx.is_cuda else "cpu"
    values = dict(SIZES[kind])
    shape_keys = ("d_model", "layers", "heads", "seq_len", "batch", "vocab")
    overridden = {k for k in values if k in ctx.params}
    for key in values:
        if key in ctx.params:
            values[key] = type(values[key])(ctx.params[key])
    for key in ("dropout", "seed"):
        if key in ctx.params:
            values[key] = type(getattr(Config, key))(ctx.params[key])
    values["dtype"] = _compute_dtype(ctx.device)
    cfg = Config(**values)
    cfg.warmup_steps = min(cfg.warmup_steps, max(1, cfg.steps // 4))
    if ctx.is_cuda and "batch" not in ctx.params:
        cfg.batch = _batch_that_fits(cfg, free_memory_bytes(ctx.device))
    if cfg.d_model % cfg.heads:
        raise ValueError(f"d_model {cfg.d_model} is not a multiple of heads {cfg.heads}")
    return cfg, not (overridden & set(shape_keys))


def _compute_dtype(device: str) -> str:
    if not device.startswith("cuda"):
        return "float32"
    major, _minor = torch.cuda.get_device_capability(device)
    return "bfloat16" if major >= 8 else "float16"  # bf16 tensor cores arrived with Ampere


def memory_estimate(cfg: Config, batch: int) -> int:
    """Bytes one training step needs on the GPU. Per token and layer, activations kept for
    backward: 34 x d_model bytes (Korthikanti et al., 16-bit, flash attention) grows to ~40 under
    autocast, whose residual stream and layernorm inputs stay fp32; per token the logits: bf16, their
    fp32 copy, log-softmax and its gradient, ~16 bytes per vocabulary entry; weights, gradients and
    AdamW moments 16 bytes per parameter."""
    per_sequence = cfg.seq_len * (40 * cfg.d_model * cfg.layers + 16 * cfg.vocab)
    fixed = 16 * (12 * cfg.layers * cfg.d_model ** 2 + (cfg.vocab + cfg.seq_len) * cfg.d_model)
    return fixed + batch * per_sequence


def _batch_that_fits(cfg: Config, free_bytes: int) -> int:
    """Halve the batch until the estimate fits 60% of free memory (the rest: the allocator's
    fragmentation, cuBLAS workspaces, and the fresh process's context while this one holds its own)."""
    batch = cfg.batch
    while batch > 1 and memory_estimate(cfg, batch) > 0.6 * free_bytes:
        batch //= 2
    return batch


# -- the model -------------------------------------------------------------------------------

class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP, each on a residual."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(attended.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x)))))


class TinyGPT(nn.Module):
    """Decoder-only transformer with learned positions and an output head tied to the embedding."""

    def __init__(self, cfg: Config, generator: torch.Generator):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.positions = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_out = nn.LayerNorm(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self._init_weights(generator)

    def _init_weights(self, generator: torch.Generator) -> None:
        # GPT-2's N(0, 0.02), from an explicit generator: the same weights on every run and
        # device, without touching the global RNG (other benchmarks may run in other threads).
        # Tensor.normal_ takes a generator in every torch 2.x; nn.init.normal_ raises TypeError on
        # one before about 2.2 (pytorch/pytorch#98200, karpathy/llm.c#791).
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(0.0, 0.02, generator=generator)
                if isinstance(module, nn.Linear):
                    module.bias.zero_()

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = inputs.shape[1]
        x = self.drop(self.tokens(inputs) + self.positions(torch.arange(t, device=inputs.device)))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_out(x), self.tokens.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def matmul_params(model: TinyGPT) -> int:
    """Parameters that take part in matmuls: all but the position embedding (a lookup)."""
    return sum(p.numel() for p in model.parameters()) - model.positions.weight.numel()


def flops_per_token(cfg: Config, n_matmul: int) -> int:
    """Training FLOPs per token: see FLOPS_FORMULA."""
    return 6 * n_matmul + 12 * cfg.layers * cfg.seq_len * cfg.d_model


# -- the data --------------------------------------------------------------------------------

class WordStream:
    """Synthetic text with structure to learn: each sequence is a run of "words", fixed strings of
    WORD_LEN tokens drawn at random from a lexicon. A word's first token names it, so the rest of
    the word is predictable and the loss falls from ln(vocab) towards ln(words) / WORD_LEN.
    Batch i is a pure function of (seed, i): a resumed run needs only the position."""

    def __init__(self, cfg: Config, device: str):
        g = torch.Generator().manual_seed(cfg.seed)
        words = max(2, cfg.vocab // 4)
        lexicon = torch.randint(cfg.vocab, (words, WORD_LEN), generator=g)
        lexicon[:, 0] = torch.randperm(cfg.vocab, generator=g)[:words]
        self.lexicon = lexicon.to(device)
        self.cfg, self.device = cfg, device
        self.words_per_sequence = math.ceil((cfg.seq_len + 1) / WORD_LEN)

    def batch(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Drawn on the device itself: no host copy, no synchronisation in the training loop.
        g = torch.Generator(device=self.device).manual_seed(self.cfg.seed * 1_000_003 + position)
        ids = torch.randint(len(self.lexicon), (self.cfg.batch, self.words_per_sequence), generator=g, device=self.device)
        tokens = self.lexicon[ids].view(self.cfg.batch, -1)[:, : self.cfg.seq_len + 1]
        return tokens[:, :-1], tokens[:, 1:]


# -- training --------------------------------------------------------------------------------

class Trainer:
    """Model, optimizer, data and position: everything a checkpoint must hold to resume."""

    def __init__(self, cfg: Config, device: str):
        self.cfg, self.device = cfg, device
        self.model = TinyGPT(cfg, torch.Generator().manual_seed(cfg.seed)).to(device)
        cuda = device.startswith("cuda")
        # fused AdamW on a GPU: one kernel per step instead of several per parameter tensor.
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                           weight_decay=0.1, fused=True if cuda else None)
        # fp16 (GPUs before Ampere) needs loss scaling; bf16 and fp32 do not.
        self.scaler = _grad_scaler() if cfg.dtype == "float16" else None
        self.data = WordStream(cfg, device)
        self.step = 0
        self.position = 0  # next batch of the data stream
        self.seed_rng(cfg.seed)

    def seed_rng(self, seed: int) -> None:
        """Seed the generator dropout draws from on this device, and only that one."""
        if self.device.startswith("cuda"):
            with torch.cuda.device(self.device):
                torch.cuda.manual_seed(seed)
        else:
            torch.default_generator.manual_seed(seed)

    def autocast(self):
        if not self.device.startswith("cuda"):
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=getattr(torch, self.cfg.dtype))

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 10% over the run, so the step count matters."""
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
        return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

    def train_step(self) -> torch.Tensor:
        """One optimizer step; the loss stays on the device (no synchronisation here)."""
        inputs, targets = self.data.batch(self.position)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        with self.autocast():
            loss = self.model(inputs, targets)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.position += 1
        return loss.detach()

    def train(self, steps: int) -> list[float]:
        losses = [self.train_step() for _ in range(steps)]
        return torch.stack(losses).float().tolist() if losses else []

    # -- checkpoints --

    def checkpoint(self) -> dict[str, Any]:
        rng = {"cpu": torch.get_rng_state()}
        if self.device.startswith("cuda"):
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "format": CHECKPOINT_FORMAT,
            "config": dataclasses.asdict(self.cfg),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "step": self.step,
            "data_position": self.position,
            "rng": rng,
        }

    @classmethod
    def restore(cls, state: dict[str, Any], device: str) -> Trainer:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not a {CHECKPOINT_FORMAT} checkpoint: format {state.get('format')!r}")
        trainer = cls(Config(**state["config"]), device)
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        if trainer.scaler is not None and state.get("scaler"):
            trainer.scaler.load_state_dict(state["scaler"])
        trainer.step, trainer.position = int(state["step"]), int(state["data_position"])
        # RNG last: building the trainer above drew from it.
        torch.set_rng_state(state["rng"]["cpu"])
        if device.startswith("cuda") and "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"], device)
        return trainer

    def weights_sketch(self) -> list[float]:
        """One random projection per parameter tensor (fixed vectors, float64 sums). The difference
        of two sketches is the same projection of the update between them: two runs that took the
        same steps have the same sketch difference; a different gradient or optimizer state shows."""
        g = torch.Generator(device=self.device).manual_seed(UPDATE_SKETCH_SEED)
        sketch = []
        with torch.no_grad():
            for p in self.model.parameters():
                direction = torch.randn(p.numel(), generator=g, device=self.device)
                sketch.append(float(p.detach().flatten().double() @ direction.double()))
        return sketch

    def continue_training(self, steps: int) -> tuple[list[float], list[float]]:
        """The resumed steps, both ways: their losses and the sketch of their weight update."""
        before = self.weights_sketch()
        losses = self.train(steps)
        return losses, [b - a for a, b in zip(before, self.weights_sketch())]

    def release(self) -> None:
        """Give the memory back before the fresh process needs its own copy."""
        del self.model, self.optimizer, self.data
        gc.collect()  # anything a cycle still holds goes before the cache is emptied
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _grad_scaler() -> Any:
    """torch.amp.GradScaler("cuda") from torch 2.3 on; torch.cuda.amp.GradScaler before."""
    scaler = getattr(torch.amp, "GradScaler", None)
    return scaler("cuda") if scaler is not None else torch.cuda.amp.GradScaler()


def load_checkpoint(blob: bytes) -> dict[str, Any]:
    """The state a checkpoint holds, on the CPU: tensors and plain values only (weights_only),
    as torch >= 2.6 loads by default; Trainer.restore moves it to the device."""
    return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)


def device_identity(device: str) -> dict[str, Any]:
    """Which device this process computes on: for a GPU its name and UUID, so that the fresh
    process can be shown to have opened the same GPU as the training one."""
    if not device.startswith("cuda"):
        return {"device": device}
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)  # absent in older torch
    return {"device": device, "name": props.name, "uuid": str(uuid) if uuid else None,
            "capability": f"{props.major}.{props.minor}"}


def same_device(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool | None:
    """Whether two processes computed on the same GPU: by UUID; without one, by model and compute
    capability (a GPU of the same model runs the same kernels). None where nothing tells."""
    if not a or not b:
        return None
    if a.get("uuid") and b.get("uuid"):
        return a["uuid"] == b["uuid"]
    if "name" in a and "name" in b:
        return (a["name"], a.get("capability")) == (b["name"], b.get("capability"))
    return None


class StepClock:
    """Step boundaries: CUDA events on a GPU (the CPU keeps queueing work), perf_counter on the CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Each boundary's time since the first (waits for the GPU)."""
        if not self.marks:
            return []
        if self.cuda:
            self.marks[-1].synchronize()
            return [self.marks[0].elapsed_time(m) / 1000.0 for m in self.marks]
        return [m - self.marks[0] for m in self.marks]


# -- the benchmark ---------------------------------------------------------------------------

@dataclass
class TrainingRun:
    losses: list[float]
    boundaries: list[float]  # seconds since the first step began, one per step boundary
    warmup_steps: int
    started: float  # wall clock (time.time()) when the first step began
    stopped_early: str | None = None

    @property
    def step_times(self) -> list[float]:
        return [b - a for a, b in zip(self.boundaries, self.boundaries[1:])]

    @property
    def timed_step_times(self) -> list[float]:
        return self.step_times[self.warmup_steps:]


def train_timed(trainer: Trainer, budget: Budget, progress) -> TrainingRun:
    """`cfg.steps` steps, or as many as the budget allows; warm-up steps are not timed."""
    cfg, clock = trainer.cfg, StepClock(trainer.device)
    losses: list[torch.Tensor] = []
    stopped = None
    progress("workload: training")
    started = time.time()
    clock.mark()
    for i in range(cfg.steps):
        losses.append(trainer.train_step())
        clock.mark()
        if budget.expired() and i + 1 < cfg.steps:
            stopped = f"the time budget ran out after {i + 1} of {cfg.steps} steps"
            break
    boundaries = clock.seconds()
    warmup = min(cfg.warmup_steps, len(losses) - 2)
    if warmup < 0:
        raise OutOfTime(f"only {len(losses)} training step(s) fit in the time budget")
    return TrainingRun(torch.stack(losses).float().tolist(), boundaries, warmup, started, stopped)


def throughput_measurements(ctx: BenchContext, trainer: Trainer, run: TrainingRun, default_dims: bool) -> list[dict]:
    cfg = trainer.cfg
    times = run.timed_step_times
    seconds = sum(times)
    tokens_per_s = cfg.tokens_per_step * len(times) / seconds
    n_matmul = matmul_params(trainer.model)
    per_token = flops_per_token(cfg, n_matmul)
    model_tflops = per_token * tokens_per_s / 1e12
    shape = {k: getattr(cfg, k) for k in ("d_model", "layers", "heads", "seq_len", "batch", "vocab")}
    common = {"dtype": cfg.dtype, "shape": shape, "default_shape": default_dims, "timed_steps": len(times),
              "warmup_steps": run.warmup_steps}
    if run.stopped_early:
        common["stopped_early"] = run.stopped_early
    ms = [1000.0 * t for t in times]
    nonfinite = sum(1 for loss in run.losses if not math.isfinite(loss))
    if nonfinite:  # a healthy device trains this model without NaN or inf (clipped, bf16 or scaled fp16)
        common["nonfinite_losses"] = nonfinite
    results = [
        measurement("workload.tokens_per_s", tokens_per_s, "tokens/s", ctx.subject,
                    tokens_per_step=cfg.tokens_per_step, seconds=round(seconds, 6),
                    parameters=sum(p.numel() for p in trainer.model.parameters()), matmul_parameters=n_matmul,
                    model_flops_per_token=per_token, model_tflops=round(model_tflops, 4), flops_formula=FLOPS_FORMULA,
                    loss_first=_rounded(run.losses[0], 4), loss_last=_rounded(run.losses[-1], 4),
                    how="tokens of the timed steps / their summed time (first step start to last step end)", **common),
        measurement("workload.step_time_ms", statistics.median(ms), "ms", ctx.subject,
                    p10=round(quantile(ms, 0.1), 3), p90=round(quantile(ms, 0.9), 3),
                    min=round(min(ms), 3), max=round(max(ms), 3), **common),
    ]
    peak = _peak_tflops(ctx.params.get("peak_tflops"), cfg.dtype)
    if peak:
        results.append(measurement("workload.mfu", 100.0 * model_tflops / peak, "%", ctx.subject,
                                   model_tflops=round(model_tflops, 4), peak_tflops=peak,
                                   flops_formula=FLOPS_FORMULA, **common))
    return results


def _rounded(value: float, digits: int) -> float | None:
    """A loss for the record: None for NaN or inf (not every JSON reader takes them)."""
    return round(value, digits) if math.isfinite(value) else None


def _peak_tflops(given: Any, dtype: str) -> float | None:
    """The dense peak for the compute dtype: a number, or a {"bf16": .., "fp16": ..} mapping."""
    if isinstance(given, dict):
        given = given.get({"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype])
    try:
        peak = float(given)
    except (TypeError, ValueError):
        return None
    return peak if peak > 0 else None


def loss_series(ctx: BenchContext, run: TrainingRun) -> dict[str, Any]:
    """The loss after each step; t: seconds since the first step began (at the step's end)."""
    rows = [[i, _rounded(loss, 5), round(run.boundaries[i + 1], 4)] for i, loss in enumerate(run.losses)]
    return {"name": "workload.loss", "subject": ctx.subject, "interval_s": None, "start": run.started,
            "columns": ["step", "loss", "t"], "rows": rows}


def on_device(device: str):
    """Make `device` current: CUDA events, streams and seeds act on the current device."""
    return torch.cuda.device(device) if device.startswith("cuda") else contextlib.nullcontext()


def run(ctx: BenchContext) -> list[dict]:
    with on_device(ctx.device):
        cfg, default_dims = config_for(ctx)
        trainer = Trainer(cfg, ctx.device)
        training = train_timed(trainer, ctx.budget.share(TRAIN_SHARE), ctx.progress)
        results = throughput_measurements(ctx, trainer, training, default_dims)
        ctx.series.append(loss_series(ctx, training))
        return results + checkpoint_trial(ctx, trainer)


# -- save, restore in a fresh process, resume --------------------------------------------------

def checkpoint_trial(ctx: BenchContext, trainer: Trainer) -> list[dict]:
    directory = os.path.abspath(str(ctx.params.get("path") or os.getcwd()))
    where = {"path": directory, "path_given": bool(ctx.params.get("path"))}
    written: list[str] = []
    try:
        ctx.progress("workload: checkpoint write")
        t0 = time.perf_counter()
        blob = serialize(trainer.checkpoint())
        serialize_s = time.perf_counter() - t0
        try:
            write = write_checkpoint(blob, directory, written, keep=bool(ctx.params.get("keep_checkpoint")))
        except OSError as err:
            return _write_failed(ctx, where, err)
        write_m = measurement("workload.checkpoint_write", write["bytes"] / write["seconds"] / 1e6, "MB/s", ctx.subject,
                              ok=True, bytes=write["bytes"], seconds=round(write["seconds"], 4),
                              serialize_s=round(serialize_s, 4), cache_dropped=write["cache_dropped"],
                              file=write["file"], kept=bool(ctx.params.get("keep_checkpoint")),
                              how="write + fsync of the serialized checkpoint to a new file, then rename", **where)
        step, steps, device = trainer.step, trainer.cfg.resume_steps, trainer.device
        t1 = time.perf_counter()
        reference = trainer.continue_training(steps)  # the uninterrupted run
        reference_s = time.perf_counter() - t1
        trainer.release()
        _tamper(ctx.params.get("_tamper"), write["file"])
        remaining = ctx.budget.remaining()
        mode = ctx.params.get("exclusive_mode")
        if mode:  # this process holds the GPU's one context: a second process would be refused
            why = (f"not tried: the GPU is in {mode} compute mode, so a fresh process cannot open it while the "
                   "training process holds it; `sudo nvidia-smi -c DEFAULT` (or ask the provider) to test resume here")
            return [write_m, _not_read(ctx, where, why), _resume_unknown(ctx, why)]
        if remaining < 2.0:
            why = "not tried: the time budget ran out before the fresh process could start"
            return [write_m, _not_read(ctx, where, why), _resume_unknown(ctx, why)]
        ctx.progress("workload: resume in a fresh process")
        child = resume_in_fresh_process(write["file"], write["crc32"], device, steps, remaining - 1.0,
                                        tamper="seed" if ctx.params.get("_tamper") == "seed" else None)
        replay = None
        if child.get("ok"):  # the same bytes restored here: the device's own run-to-run noise
            # its cost: deserialising (about what serialising took), building the model, the steps
            needed = 2.0 * (serialize_s + reference_s) + 1.0
            if ctx.budget.remaining() > needed:
                ctx.progress("workload: resume in this process (run-to-run noise)")
                replay = replay_in_process(blob, device, steps)
            else:
                replay = {"ok": False, "error": f"not run: {ctx.budget.remaining():.1f} s of the budget left, "
                                                f"~{needed:.0f} s needed"}
        return [write_m, *_after_resume(ctx, where, trainer.cfg, step, reference, child, replay,
                                        device_identity(device))]
    finally:
        if not ctx.params.get("keep_checkpoint"):
            for path in written:
                remove(path)


def replay_in_process(blob: bytes, device: str, steps: int) -> dict[str, Any]:
    """Restore the checkpoint's bytes in this process and take the resumed steps again. Never raises:
    a failure (out of memory, say) leaves the tolerance unmeasured, with the reason."""
    t0 = time.perf_counter()
    try:
        trainer = Trainer.restore(load_checkpoint(blob), device)
        try:
            losses, update = trainer.continue_training(steps)
        finally:
            trainer.release()
    except Exception as err:
        if device.startswith("cuda"):
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return {"ok": True, "losses": losses, "update_sketch": update, "seconds": round(time.perf_counter() - t0, 3)}


def serialize(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def write_checkpoint(blob: bytes, directory: str, written: list[str], keep: bool = False) -> dict[str, Any]:
    """Write to a temporary name, fsync, rename: what a careful training script does, so a crash
    mid-write never leaves a truncated checkpoint under the final name. Raises OSError."""
    sweep_stale(CHECKPOINT_PREFIX, directory)  # a killed run's checkpoint (about 1 GB)
    # A kept checkpoint gets a name no later run sweeps; the others the name of this process.
    owner = f"{CHECKPOINT_PREFIX}kept-" if keep else owned_prefix(CHECKPOINT_PREFIX)
    final = os.path.join(directory, f"{owner}{secrets.token_hex(4)}.pt")
    temporary = final + ".tmp"
    written += [temporary, final]
    for path in written if not keep else ():
        register(path)  # removed by the worker's SIGTERM handler if the run is stopped
    t0 = time.perf_counter()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view[: 64 << 20]):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, final)
    _fsync_directory(directory)
    seconds = time.perf_counter() - t0
    return {"file": final, "bytes": len(blob), "seconds": seconds, "crc32": zlib.crc32(blob),
            "cache_dropped": _drop_from_page_cache(final)}


def _fsync_directory(directory: str) -> None:
    with contextlib.suppress(OSError):  # some file systems refuse to open or fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _drop_from_page_cache(path: str) -> bool:
    """Ask the kernel to forget the file's cached pages, so the read that follows comes from the
    storage, not from memory. Clean pages only: hence after the fsync."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def describe_os_error(err: OSError, directory: str) -> str:
    """What went wrong, in the words a user needs to pick another path."""
    words: dict[int | None, str] = {  # err.errno is None for an OSError raised without one
        errno.ENOENT: "does not exist (or vanished)",
        errno.ENOTDIR: "is not a directory",
        errno.EACCES: "is not writable (permission denied)",
        errno.EPERM: "is not writable (operation not permitted)",
        errno.EROFS: "is on a read-only file system",
        errno.ENOSPC: "is full (no space left on the device)",
        errno.EDQUOT: "is over its disk quota",
        errno.EIO: "had an I/O error",
    }
    plain = words.get(err.errno, "could not be used")
    return f"{directory} {plain}: {type(err).__name__}: [Errno {err.errno}] {err.strerror}"


def _write_failed(ctx: BenchContext, where: dict, err: OSError) -> list[dict]:
    reason = describe_os_error(err, where["path"])
    why = "not tried: the checkpoint could not be written"
    return [measurement("workload.checkpoint_write", None, "MB/s", ctx.subject, ok=False, stage="write",
                        reason=reason, errno=errno.errorcode.get(err.errno or 0, str(err.errno)), **where),
            _not_read(ctx, where, why), _resume_unknown(ctx, why)]


def _not_read(ctx: BenchContext, where: dict, reason: str, **details: Any) -> dict:
    return measurement("workload.checkpoint_read", None, "MB/s", ctx.subject, ok=False, reason=reason, **where, **details)


def _resume_unknown(ctx: BenchContext, reason: str, **details: Any) -> dict:
    return measurement("workload.resume_ok", None, "bool", ctx.subject, reason=reason, **details)


def _tamper(how: str | None, path: str) -> None:
    """Test-only faults between the write and the fresh process: "corrupt" flips bytes in the
    file, "vanish" deletes it. ("seed" is applied in the fresh process.)"""
    if how == "corrupt":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            chunk = f.read(64)
            f.seek(-len(chunk), os.SEEK_CUR)
            f.write(bytes(b ^ 0xFF for b in chunk))
    elif how == "vanish":
        os.remove(path)


def resume_in_fresh_process(path: str, crc32: int, device: str, steps: int, timeout_s: float,
                            tamper: str | None = None) -> dict[str, Any]:
    """Run `python -m gpuvet.bench.workload --resume` and return what it reports."""
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "gpuvet.bench.workload", "--resume", path, "--device", device,
               "--steps", str(steps), "--crc32", str(crc32), "--threads", str(torch.get_num_threads())]
    if tamper:
        command += ["--tamper", tamper]
    t0 = time.perf_counter()
    try:
        # stdin: not ours to share (in the benchmark worker it carries the job protocol).
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=max(1.0, timeout_s), env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "stage": "timeout", "error": f"the fresh process did not finish in {timeout_s:.0f} s"}
    report = _last_json_line(done.stdout)
    if report is None:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"ok": False, "stage": "process", "error": f"the fresh process exited {done.returncode} without a report: {tail}"}
    report["process_s"] = round(time.perf_counter() - t0, 3)
    return report


def _last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                return json.loads(line)
    return None


def _after_resume(ctx: BenchContext, where: dict, cfg: Config, step: int,
                  reference: tuple[list[float], list[float]], child: dict[str, Any],
                  replay: dict[str, Any] | None = None, identity: dict[str, Any] | None = None) -> list[dict]:
    """checkpoint_read and resume_ok from what the fresh process reported (and the replay here)."""
    stage = child.get("stage")
    if stage in ("read", "timeout", "process") and not child.get("ok"):
        # Nothing was read back: the read failed (FAIL of the checkpoint step) or the process did
        # not get that far; either way the resume could not be tried.
        read_reason = (f"the fresh process could not read the checkpoint: {child['error']}" if stage == "read"
                       else f"not measured: {child['error']}")
        return [_not_read(ctx, where, read_reason, stage=stage),
                _resume_unknown(ctx, f"not verified: {child['error']}", stage=stage)]
    read = measurement("workload.checkpoint_read", child["bytes"] / child["read_s"] / 1e6, "MB/s", ctx.subject,
                       ok=True, bytes=child["bytes"], seconds=child["read_s"], checksum_match=child.get("crc_match"),
                       restore_s=child.get("restore_s"), fresh_process_s=child.get("process_s"),
                       fresh_process_pid=child.get("pid"),
                       how="read into memory by a fresh process, after the writer dropped the file from the page cache",
                       **where)
    if stage == "train" and not child.get("ok"):
        return [read, _resume_unknown(ctx, f"not verified: the fresh process restored the checkpoint but could not "
                                           f"train: {child['error']}", stage=stage, from_step=step)]
    if not child.get("ok"):
        return [read, measurement("workload.resume_ok", 0.0, "bool", ctx.subject, stage=stage,
                                  reason=f"the checkpoint could not be restored: {child['error']}", from_step=step)]
    if same_device(identity, child.get("device_identity")) is False:
        why = (f"not verified: the fresh process computed on {_device_words(child['device_identity'])}, not on the "
               f"training GPU {_device_words(identity)}; it inherits CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, "
               "so something changed them between the two")
        return [read, _resume_unknown(ctx, why, stage="device", from_step=step, trained_on=identity,
                                      resumed_on=child["device_identity"])]
    return [read, compare_runs(ctx, cfg, step, reference, (child["losses"], child["update_sketch"]), replay)]


def _device_words(identity: dict[str, Any] | None) -> str:
    identity = identity or {}
    return f"{identity.get('device', '?')} ({identity.get('name', '?')}, {identity.get('uuid') or 'no UUID'})"


def run_difference(reference: tuple[list[float], list[float]], other: tuple[list[float], list[float]]) -> dict[str, Any]:
    """How far a restored run is from the uninterrupted one: the largest relative difference of
    their losses and the relative distance of their weight updates. NaN or inf anywhere, or runs of
    different lengths, are not comparable: reported as such, never as a small difference."""
    (ref_losses, ref_update), (losses, update) = reference, other
    values = [*ref_losses, *ref_update, *losses, *update]
    finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)
    same_length = len(losses) == len(ref_losses) and len(update) == len(ref_update)
    if not (finite and same_length):
        return {"loss": math.inf, "update": math.inf, "finite": finite, "same_length": same_length,
                "max_abs_diff": None}
    diffs = [abs(a - b) for a, b in zip(ref_losses, losses)]
    return {"loss": max((d / max(abs(a), 1e-12) for d, a in zip(diffs, ref_losses)), default=0.0),
            "update": _relative_distance(update, ref_update), "finite": True, "same_length": True,
            "max_abs_diff": max(diffs, default=0.0)}


def resume_tolerance(kind: str, noise: dict[str, Any] | None) -> dict[str, float]:
    """The tolerance for the fresh process: NOISE_FACTOR x the noise two restored runs showed on
    this device, within [RESUME_RTOL, RESUME_RTOL_MAX]; RESUME_RTOL where no noise was measured."""
    floor, ceiling = RESUME_RTOL[kind], RESUME_RTOL_MAX[kind]
    if not noise or not (noise.get("finite") and noise.get("same_length")):
        return dict(floor)
    return {k: min(ceiling[k], max(floor[k], NOISE_FACTOR * noise[k])) for k in floor}


def _problems(diff: dict[str, Any], rtol: dict[str, float]) -> list[str]:
    if not diff["finite"]:
        return ["losses or weights are not finite (NaN or inf)"]
    if not diff["same_length"]:
        return ["it took a different number of steps or has other parameters"]
    found = []
    if diff["loss"] > rtol["loss"]:
        found.append(f"losses differ by up to {diff['loss']:.2e} (relative; tolerance {rtol['loss']:g})")
    if diff["update"] > rtol["update"]:
        found.append(f"the weight update differs by {diff['update']:.2e} (relative; tolerance {rtol['update']:g})")
    return found


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def compare_runs(ctx: BenchContext, cfg: Config, step: int, reference: tuple[list[float], list[float]],
                 resumed: tuple[list[float], list[float]], replay: dict[str, Any] | None = None) -> dict:
    """resume_ok: 1 when the fresh process's losses and weight update match the uninterrupted run's
    within the tolerance, and the same checkpoint restored in this process (`replay`, where it ran)
    stays within RESUME_RTOL_MAX of it too."""
    kind = "cuda" if ctx.is_cuda else "cpu"
    ref_losses = reference[0]
    if not all(math.isfinite(v) for v in [*reference[0], *reference[1]]):
        return _resume_unknown(ctx, "not verified: the uninterrupted run's losses or weights are not finite "
                                    "(NaN or inf; see workload.throughput)", from_step=step, stage="reference")
    diff = run_difference(reference, resumed)
    noise = run_difference(reference, (replay["losses"], replay["update_sketch"])) if replay and replay.get("ok") else None
    rtol = resume_tolerance(kind, noise)
    problems = _problems(diff, rtol)
    replay_problems = _problems(noise, RESUME_RTOL_MAX[kind]) if noise else []
    details: dict[str, Any] = {
        "from_step": step, "steps": len(ref_losses), "losses_uninterrupted": ref_losses,
        "losses_resumed": [_json_number(v) for v in resumed[0]], "max_abs_diff": diff["max_abs_diff"],
        "max_rel_diff": _json_number(diff["loss"]), "update_rel_diff": _json_number(diff["update"]),
        "rtol": rtol, "rtol_floor": RESUME_RTOL[kind], "rtol_max": RESUME_RTOL_MAX[kind],
        "noise_factor": NOISE_FACTOR, "dtype": cfg.dtype,
        "how": "a fresh process restored the checkpoint and trained the next steps; its losses and weight "
               "update (random projections per tensor) vs this process continuing without interruption"}
    if noise and replay:  # noise: measured from the replay
        details["noise"] = {"loss": _json_number(noise["loss"]), "update": _json_number(noise["update"]),
                            "losses": [_json_number(v) for v in replay["losses"]], "seconds": replay.get("seconds"),
                            "how": "the same checkpoint restored in this process and the same steps taken again"}
    else:
        details["noise_not_measured"] = (replay or {}).get("error", "the fresh process did not report")
    reasons = []
    if problems:
        reasons.append(("in the fresh process: " if noise and not replay_problems else "") + "; ".join(problems))
    if replay_problems:
        reasons.append("restored in this process from the same bytes it drifted too: " + "; ".join(replay_problems)
                       + ": the checkpoint does not hold the whole training state, or this GPU does not repeat "
                         "its own computations")
    if reasons:
        details["reason"] = "training did not continue from the same state: " + "; ".join(reasons)
        details["failed_in"] = [where for where, bad in (("fresh process", problems), ("this process", replay_problems))
                                if bad]
    return measurement("workload.resume_ok", 0.0 if reasons else 1.0, "bool", ctx.subject, **details)


def _relative_distance(values: list[float], reference: list[float]) -> float:
    norm = math.sqrt(sum(r * r for r in reference))
    return math.sqrt(sum((v - r) ** 2 for v, r in zip(values, reference))) / max(norm, 1e-30)


# -- the fresh process -----------------------------------------------------------------------

def resume_main(args: argparse.Namespace) -> dict[str, Any]:
    """Read the checkpoint, check it is what was written, restore it, train `steps` steps."""
    t0 = time.perf_counter()
    try:
        with open(args.resume, "rb", buffering=0) as f:
            blob = f.read()
    except OSError as err:
        return {"ok": False, "stage": "read", "error": describe_os_error(err, os.path.dirname(args.resume))}
    read_s = time.perf_counter() - t0
    report: dict[str, Any] = {"bytes": len(blob), "read_s": round(read_s, 6), "pid": os.getpid()}
    if args.crc32 is not None:
        report["crc_match"] = zlib.crc32(blob) == args.crc32
        if not report["crc_match"]:
            return {**report, "ok": False, "stage": "verify",
                    "error": "the checkpoint read back differs from what was written (CRC32 mismatch): the storage corrupted it"}
    t1 = time.perf_counter()
    try:
        trainer = Trainer.restore(load_checkpoint(blob), args.device)
    except Exception as err:  # a checkpoint that does not load is the finding, not a crash
        return {**report, "ok": False, "stage": "restore", "error": f"{type(err).__name__}: {err}"}
    report["restore_s"] = round(time.perf_counter() - t1, 4)
    report["device_identity"] = device_identity(args.device)
    if args.tamper == "seed":  # test-only: the resumed run's dropout draws from another seed
        trainer.seed_rng(trainer.cfg.seed + 1)
    try:
        losses, update = trainer.continue_training(args.steps)
    except Exception as err:  # out of memory, a CUDA error: the read figures still count
        return {**report, "ok": False, "stage": "train", "error": f"{type(err).__name__}: {err}"}
    return {**report, "ok": True, "step": trainer.step, "losses": losses, "update_sketch": update}


def _resume_on_device(args: argparse.Namespace) -> dict[str, Any]:
    with on_device(args.device):
        return resume_main(args)


def _standalone(args: argparse.Namespace) -> dict[str, Any]:
    """The whole workload in this process, for a quick look from a shell."""
    params: dict[str, Any] = {k: v for k, v in (("steps", args.steps), ("path", args.path), ("_tamper", args.tamper))
                              if v is not None}
    if args.peak_tflops:
        params["peak_tflops"] = args.peak_tflops
    ctx = BenchContext(device=args.device, subject=args.device.replace("cuda:", "gpu"), budget=Budget(args.budget_s),
                       params=params, progress=lambda m: print(m, file=sys.stderr))
    return {"measurements": run(ctx), "series": ctx.series}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpuvet.bench.workload", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--resume", metavar="CKPT", help="restore CKPT and train --steps steps (the fresh process)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--crc32", type=int, help="CRC32 the checkpoint must have")
    parser.add_argument("--threads", type=int, help="torch threads (the same as the writer's: same CPU kernels)")
    parser.add_argument("--tamper", choices=("seed", "corrupt", "vanish"), help=argparse.SUPPRESS)  # test-only faults
    parser.add_argument("--path", help="checkpoint directory (standalone run)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense peak for MFU (standalone run)")
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.resume:
        args.steps = args.steps or 1
        report = _resume_on_device(args)
    else:
        report = _standalone(args)
    print(json.dumps(report, default=str), flush=True)


if __name__ == "__main__":
    main()
