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
   1 when its losses and its weight update equal the reference's within RESUME_RTOL.

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

from .common import BenchContext, Budget, OutOfTime, free_memory_bytes, measurement

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
# On the CPU in fp32 both runs execute the same kernels and agree exactly. On a GPU the backward
# of flash attention accumulates with atomics, so two correct runs differ at fp32 rounding level,
# a little more once bf16 rounding has carried it through a few steps (expected ~1e-4); batch
# averaging shrinks a wrong RNG or data position's effect on the update with the batch (to ~5e-2
# estimated for the default GPU model). These GPU tolerances sit between the two; run with
# `--tamper seed` on a GPU to see the margin (update_rel_diff) on that machine.
RESUME_RTOL = {"cpu": {"loss": 1e-6, "update": 1e-6}, "cuda": {"loss": 2e-3, "update": 5e-3}}
UPDATE_SKETCH_SEED = 7
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


def _batch_that_fits(cfg: Config, free_bytes: int) -> int:
    """Halve the batch until the estimate fits 60% of free memory. Per sequence: activations kept
    for backward ~34 x d_model bytes per token per layer (Korthikanti et al., 16-bit, flash
    attention), logits ~10 bytes per vocabulary entry per token; weights + AdamW ~16 B/param."""
    per_sequence = cfg.seq_len * (34 * cfg.d_model * cfg.layers + 10 * cfg.vocab)
    fixed = 16 * (12 * cfg.layers * cfg.d_model ** 2 + (cfg.vocab + cfg.seq_len) * cfg.d_model)
    batch = cfg.batch
    while batch > 1 and fixed + batch * per_sequence > 0.6 * free_bytes:
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
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02, generator=generator)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

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
        self.scaler = torch.amp.GradScaler("cuda") if cfg.dtype == "float16" else None
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
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


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
    results = [
        measurement("workload.tokens_per_s", tokens_per_s, "tokens/s", ctx.subject,
                    tokens_per_step=cfg.tokens_per_step, seconds=round(seconds, 6),
                    parameters=sum(p.numel() for p in trainer.model.parameters()), matmul_parameters=n_matmul,
                    model_flops_per_token=per_token, model_tflops=round(model_tflops, 4), flops_formula=FLOPS_FORMULA,
                    loss_first=round(run.losses[0], 4), loss_last=round(run.losses[-1], 4),
                    how="tokens of the timed steps / their summed time (first step start to last step end)", **common),
        measurement("workload.step_time_ms", statistics.median(ms), "ms", ctx.subject,
                    p10=round(_percentile(ms, 0.1), 3), p90=round(_percentile(ms, 0.9), 3),
                    min=round(min(ms), 3), max=round(max(ms), 3), **common),
    ]
    peak = _peak_tflops(ctx.params.get("peak_tflops"), cfg.dtype)
    if peak:
        results.append(measurement("workload.mfu", 100.0 * model_tflops / peak, "%", ctx.subject,
                                   model_tflops=round(model_tflops, 4), peak_tflops=peak,
                                   flops_formula=FLOPS_FORMULA, **common))
    return results


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
    rows = [[i, round(loss, 5), round(run.boundaries[i + 1], 4)] for i, loss in enumerate(run.losses)]
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
            write = write_checkpoint(blob, directory, written)
        except OSError as err:
            return _write_failed(ctx, where, err)
        write_m = measurement("workload.checkpoint_write", write["bytes"] / write["seconds"] / 1e6, "MB/s", ctx.subject,
                              ok=True, bytes=write["bytes"], seconds=round(write["seconds"], 4),
                              serialize_s=round(serialize_s, 4), cache_dropped=write["cache_dropped"],
                              file=write["file"], kept=bool(ctx.params.get("keep_checkpoint")),
                              how="write + fsync of the serialized checkpoint to a new file, then rename", **where)
        step = trainer.step
        reference = trainer.continue_training(trainer.cfg.resume_steps)  # the uninterrupted run
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
        child = resume_in_fresh_process(write["file"], write["crc32"], ctx.device, trainer.cfg.resume_steps,
                                        remaining - 1.0, tamper="seed" if ctx.params.get("_tamper") == "seed" else None)
        return [write_m, *_after_resume(ctx, where, trainer.cfg, step, reference, child)]
    finally:
        if not ctx.params.get("keep_checkpoint"):
            for path in written:
                with contextlib.suppress(OSError):
                    os.remove(path)


def serialize(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def write_checkpoint(blob: bytes, directory: str, written: list[str]) -> dict[str, Any]:
    """Write to a temporary name, fsync, rename: what a careful training script does, so a crash
    mid-write never leaves a truncated checkpoint under the final name. Raises OSError."""
    final = os.path.join(directory, f"gpuvet-workload-{os.getpid()}-{secrets.token_hex(4)}.pt")
    temporary = final + ".tmp"
    written += [temporary, final]
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
    plain = {
        errno.ENOENT: "does not exist (or vanished)",
        errno.ENOTDIR: "is not a directory",
        errno.EACCES: "is not writable (permission denied)",
        errno.EPERM: "is not writable (operation not permitted)",
        errno.EROFS: "is on a read-only file system",
        errno.ENOSPC: "is full (no space left on the device)",
        errno.EDQUOT: "is over its disk quota",
        errno.EIO: "had an I/O error",
    }.get(err.errno, "could not be used")
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
                  reference: tuple[list[float], list[float]], child: dict[str, Any]) -> list[dict]:
    """checkpoint_read and resume_ok from what the fresh process reported."""
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
    if not child.get("ok"):
        return [read, measurement("workload.resume_ok", 0.0, "bool", ctx.subject, stage=stage,
                                  reason=f"the checkpoint could not be restored: {child['error']}", from_step=step)]
    return [read, compare_runs(ctx, cfg, step, reference, (child["losses"], child["update_sketch"]))]


def compare_runs(ctx: BenchContext, cfg: Config, step: int, reference: tuple[list[float], list[float]],
                 resumed: tuple[list[float], list[float]]) -> dict:
    """resume_ok: 1 when the resumed run's losses and weight update match the uninterrupted run's."""
    rtol = RESUME_RTOL["cuda" if ctx.is_cuda else "cpu"]
    (ref_losses, ref_update), (losses, update) = reference, resumed
    diffs = [abs(a - b) for a, b in zip(ref_losses, losses)]
    loss_rel = max((d / max(abs(a), 1e-12) for d, a in zip(diffs, ref_losses)), default=0.0)
    update_rel = _relative_distance(update, ref_update)
    problems = []
    if len(losses) != len(ref_losses) or loss_rel > rtol["loss"]:
        problems.append(f"losses differ by up to {loss_rel:.2e} (relative; tolerance {rtol['loss']:g})")
    if len(update) != len(ref_update) or update_rel > rtol["update"]:
        problems.append(f"the weight update differs by {update_rel:.2e} (relative; tolerance {rtol['update']:g})")
    details = {"from_step": step, "steps": len(ref_losses), "losses_uninterrupted": ref_losses,
               "losses_resumed": losses, "max_abs_diff": max(diffs, default=0.0), "max_rel_diff": loss_rel,
               "update_rel_diff": update_rel, "rtol": rtol, "dtype": cfg.dtype,
               "how": "a fresh process restored the checkpoint and trained the next steps; its losses and weight "
                      "update (random projections per tensor) vs this process continuing without interruption"}
    if problems:
        details["reason"] = "training did not continue from the same state: " + "; ".join(problems)
    return measurement("workload.resume_ok", 0.0 if problems else 1.0, "bool", ctx.subject, **details)


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
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        trainer = Trainer.restore(state, args.device)
    except Exception as err:  # a checkpoint that does not load is the finding, not a crash
        return {**report, "ok": False, "stage": "restore", "error": f"{type(err).__name__}: {err}"}
    report["restore_s"] = round(time.perf_counter() - t1, 4)
    if args.tamper == "seed":  # test-only: the resumed run's dropout draws from another seed
        trainer.seed_rng(trainer.cfg.seed + 1)
    losses, update = trainer.continue_training(args.steps)
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
