"""Per-rank memory of a training run, estimated before launch: the rule behind the plan's check.

With P parameters and W shards (the job's world size under `parallel=fsdp`, 1 under `ddp`),
each rank needs:

    state       = P x B / W
    gathered    = c x (G + 2 x U)                          (parallel=fsdp only)
    activations = b x s x (e x (L x (8d + 2f) + 2d + V) + 4V + m x (2L + 1) x d)
                  with model.activation_checkpointing: L x d + (8d + 2f) in place of L x (8d + 2f)

    GPU         = state + gathered + activations + 0.5 GiB     (cpu_offload: without state)
    host        = max(4 x P, state if cpu_offload) + 0.5 GiB   (per rank)
    CPU ranks   : host = max(4 x P, state + gathered + activations) + 0.5 GiB

- B, bytes a parameter keeps for training: 4 (fp32 weights) + 4 (fp32 gradients) + the
  optimizer's (AdamW 8: two fp32 moments; SGD with momentum 4; plain SGD 0), so 16 with AdamW.
  The weights and gradients stay fp32 under every `precision`. `fsdp`'s policy
  (clorch.nn.parallel.fsdp.mixed_precision_policy) keeps the sharded weights fp32, all-gathers
  them in bf16/fp16 and reduce-scatters gradients in fp32: 16. `ddp` runs bf16/fp16 as autocast
  over fp32 weights, and autocast keeps its low-precision copy of each weight from forward until
  backward has used it: 2 more bytes (18 with AdamW); gradient buckets that travel in another
  dtype (`ddp.reduce_dtype=bf16`) add that copy: 2 more.
- c, bytes of a gathered parameter: 2 under bf16 and fp16 (fsdp all-gathers in the compute
  dtype), 4 under fp32. U: the largest unit's parameters (one unit gathered while the next is
  prefetched, or its unsharded gradients); G: the parameters that stay gathered through the
  step, the root unit's (every one with `parallel.reshard_after_forward=false`).
- Activations (the built-in GPT): b = batch_size, s = seq_len, L = n_layer, d = d_model,
  f = mlp_ratio x d, V = vocab_size; e = 2 bytes an element under bf16/fp16, 4 under fp32;
  m = 1 byte a dropout mask element when dropout > 0. Per block and token a block keeps 8d + 2f
  elements (LayerNorm inputs 2d, the QKV input d, q, k, v 3d, the attention output d, the MLP
  input d, its GELU input and output 2f: the count of Korthikanti et al. 2022, with the
  attention scores of scaled_dot_product_attention not kept); the logits add V elements and
  their fp32 log-softmax 4V bytes; with `loss=chunked_cross_entropy` they are made only for a
  chunk of c tokens at a time, c x V x (2e + 4) bytes, and each token keeps instead its hidden
  state's gradient, 4d bytes. With checkpointing only each block's input is kept, plus
  one block's activations while it is recomputed. The MLP: b x e x (in + 2 x hidden x (depth - 1)
  + out). A model of your own: activations are not estimated (0).
- 4 x P on the host: the seeded start is drawn whole, in fp32, on each rank's host before it
  moves to the device (and, under fsdp, is cut to the rank's shard).
- 0.5 GiB on the host: a rank's own memory (a CPU rank of clorch-train with a tiny model peaks
  at 0.70 GiB of RSS, of which about 0.23 GiB are shared libraries, counted once a host);
  0.5 GiB on a GPU: CUDA's context.

The figures are a floor, not a promise: the allocator's fragmentation, torch.compile's
workspaces and temporary buffers come on top. Measured on 2 CPU ranks (gloo, a 101M-parameter
GPT, bf16, AdamW), the peak RSS of a rank (shared libraries included) against the estimate:
ddp 2.44-2.49 GiB against 2.22; fsdp 2.00-2.16 GiB against 1.32 (glibc's allocator keeps much
of what the full build, the gathered units and the collectives' buffers freed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from clorch.config import registry

from clorch.precision import get_precision

WEIGHT_BYTES = 4  # fp32 weights, under every precision
GRADIENT_BYTES = 4  # fp32 gradients (ddp: the parameters' dtype; fsdp: reduce-scattered in fp32)
BUILD_BYTES = 4  # each rank draws the seeded start whole, in fp32, on its host
PROCESS_BYTES = 2**29  # 0.5 GiB: a rank's own host memory (a CPU rank of clorch-train: ~0.45 GiB)
CUDA_CONTEXT_BYTES = 2**29  # 0.5 GiB: CUDA's context on each GPU


def element_bytes(precision: str) -> int:
    """Bytes of an activation (or a gathered parameter) under a clorch precision name."""
    return 4 if get_precision(precision).name == "fp32" else 2


def bytes_per_parameter(
    optimizer: str,
    *,
    states: int | None = None,
    momentum: float = 0.0,
    precision: str = "fp32",
    sharded: bool = False,
    ddp_reduce_dtype: str | None = None,
) -> int:
    """B: the bytes a parameter keeps for training (weights, gradients, optimizer state, and
    under ddp the copies autocast and the gradient buckets make).

    Args:
        optimizer: an `optim` option's name ("adamw", "sgd"); its `states()` gives the
            optimizer's parameter-sized fp32 buffers (SGD keeps one only when momentum > 0).
        states: those buffers, when given (then `optimizer` is not looked up).
        momentum: for an option with a momentum field (sgd).
        precision: a clorch precision name; under ddp (`sharded=False`) bf16/fp16 autocast keeps
            a copy of each weight in that dtype from forward to backward.
        sharded: parallel=fsdp (its bf16 copies are the gathered units, counted apart).
        ddp_reduce_dtype: under ddp, the dtype gradient buckets travel in (None: the
            gradients' own); another dtype than fp32 adds its copy of every gradient.

    Raises:
        ValueError: an unknown optimizer, precision or reduce dtype name.
    """
    if states is None:
        states = _optimizer_states(optimizer, momentum)
    total = WEIGHT_BYTES + GRADIENT_BYTES + 4 * states
    if not sharded and get_precision(precision).name != "fp32":
        total += element_bytes(precision)  # autocast's cached copy of each weight
    if not sharded and ddp_reduce_dtype is not None and get_precision(ddp_reduce_dtype).name != "fp32":
        total += element_bytes(ddp_reduce_dtype)
    return total


def _optimizer_states(optimizer: str, momentum: float) -> int:
    """The `optim` option's `states()`, with `momentum` where the option has one."""
    options = registry.options("optim")
    if optimizer not in options:
        raise ValueError(f"optimizer must be one of {sorted(options)}, got {optimizer!r}")
    option = options[optimizer]
    if hasattr(option, "momentum"):
        option = dataclasses.replace(option, momentum=momentum)
    return option.states()


def gpt_activation_bytes(
    batch_size: int,
    seq_len: int,
    *,
    n_layer: int,
    d_model: int,
    mlp_ratio: float,
    vocab_size: int,
    precision: str,
    checkpointing: bool = False,
    dropout: float = 0.0,
    loss_chunk: int | None = None,
) -> int:
    """The built-in GPT's activations kept for backward, per rank (the module docstring's formula);
    `loss_chunk`: the fused loss's tokens per chunk (None: the whole logits tensor)."""
    e, d, f, L, V = element_bytes(precision), d_model, int(mlp_ratio * d_model), n_layer, vocab_size
    block = 8 * d + 2 * f
    blocks = L * d + block if checkpointing else L * block
    masks = (2 * L + 1) * d if dropout > 0 else 0
    tokens = batch_size * seq_len
    if loss_chunk is None:
        return tokens * (e * (blocks + 2 * d + V) + 4 * V + masks)
    return tokens * (e * (blocks + 2 * d) + 4 * d + masks) + min(loss_chunk, tokens) * V * (2 * e + 4)


def mlp_activation_bytes(
    batch_size: int, *, in_features: int, hidden_features: int, out_features: int, depth: int, precision: str
) -> int:
    """The built-in MLP's activations kept for backward, per rank."""
    elements = in_features + 2 * hidden_features * (depth - 1) + out_features
    return batch_size * element_bytes(precision) * elements


@dataclass(frozen=True)
class RankMemory:
    """One rank's estimated memory, in bytes (see the module docstring for each term)."""

    params: int  # P
    bytes_per_param: int  # B
    shards: int  # W: 1 under ddp
    state: int  # P x B / W
    gathered: int  # fsdp's gathered units
    activations: int
    offloaded: bool  # the state is kept in host memory (parallel.cpu_offload)
    cpu_ranks: bool  # the ranks run on the CPU: everything is host memory

    @property
    def device(self) -> int:
        """Bytes on the rank's GPU (for CPU ranks: the same training figures, in host memory)."""
        runtime = 0 if self.cpu_ranks else CUDA_CONTEXT_BYTES
        return (0 if self.offloaded else self.state) + self.gathered + self.activations + runtime

    @property
    def host(self) -> int:
        """Bytes of the host's memory this rank needs at its peak."""
        build = BUILD_BYTES * self.params
        if self.cpu_ranks:
            return max(build, self.device + (self.state if self.offloaded else 0)) + PROCESS_BYTES
        return max(build, self.state if self.offloaded else 0) + PROCESS_BYTES

    def describe(self) -> str:
        """The figures and how they were made, for an error message."""
        where = "" if self.shards == 1 else f" / {self.shards} shards"
        host = " on the host" if self.offloaded and not self.cpu_ranks else ""
        parts = [f"{self.params:,} params x {self.bytes_per_param} B{where} = {human_bytes(self.state)}{host}"]
        if self.gathered:
            parts.append(f"gathered units {human_bytes(self.gathered)}")
        parts.append(
            f"activations {human_bytes(self.activations)}" if self.activations else "activations not estimated"
        )
        if self.cpu_ranks:
            parts.append(f"{human_bytes(PROCESS_BYTES)} for the rank's process")
        else:
            parts.append(
                f"{human_bytes(CUDA_CONTEXT_BYTES)} for CUDA's context ({human_bytes(PROCESS_BYTES)} on the host)"
            )
        return " + ".join(parts)


def rank_memory(
    params: int,
    bytes_per_param: int,
    *,
    shards: int = 1,
    activations: int = 0,
    gathered: int = 0,
    cpu_offload: bool = False,
    cpu_ranks: bool = False,
) -> RankMemory:
    """One rank's memory: `params` parameters of `bytes_per_param` bytes over `shards` shards.

    The state is divided by `shards`, rounded up (fully_shard pads a dimension that the
    world size does not divide).

    Raises:
        ValueError: a negative figure or shards < 1.
    """
    for name, value in (("params", params), ("bytes_per_param", bytes_per_param), ("activations", activations)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards!r}")
    state = -(-params * bytes_per_param // shards)
    return RankMemory(params, bytes_per_param, shards, state, gathered, activations, cpu_offload, cpu_ranks)


def gathered_bytes(total: int, root: int, largest_unit: int, precision: str, reshard_after_forward: bool) -> int:
    """fsdp's gathered parameters at the step's peak: c x (G + 2 x U) (module docstring)."""
    kept = root if reshard_after_forward else total
    return element_bytes(precision) * (kept + 2 * largest_unit)


def human_bytes(nbytes: float) -> str:
    """`nbytes` in the largest binary unit that keeps it >= 1, for messages: "12.3 GiB", "450 KiB"."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def unit_sizes(model: object, shard: object, min_params: int) -> tuple[int, int]:
    """(root parameters, largest unit's parameters) of `model` under parallel.shard / min_params:
    the units fully_shard would make (clorch.nn.parallel.fsdp.sharded_modules).

    Raises:
        ValueError, TypeError: what `sharded_modules` raises for these arguments.
    """
    # lazy: clorch.nn.parallel.fsdp imports torch, kept out of clorch-train's start
    from clorch.nn.parallel.fsdp import sharded_modules

    units = sharded_modules(model, shard, min_params)
    inside = {id(p): p.numel() for unit in units for p in unit.parameters()}
    total = sum(p.numel() for p in model.parameters())
    largest = max((sum(p.numel() for p in unit.parameters()) for unit in units), default=0)
    return total - sum(inside.values()), largest


def activation_bytes(cfg: object, model: object) -> int:
    """Activations of `cfg`'s built-in model (`model`, built on the meta device) per rank; 0 for
    a model of your own."""
    precision, batch = cfg.precision.runs_as or cfg.precision.name, cfg.batch_size
    if cfg.model.name == "gpt":
        arch = model.config  # clorch.models.gpt.GPTConfig: the sizes the data filled in
        return gpt_activation_bytes(
            batch,
            arch.seq_len,
            n_layer=arch.n_layer,
            d_model=arch.d_model,
            mlp_ratio=arch.mlp_ratio,
            vocab_size=arch.vocab_size,
            precision=precision,
            checkpointing=cfg.model.activation_checkpointing,
            dropout=arch.dropout,
            loss_chunk=getattr(cfg.loss, "chunk_size", None),  # loss=chunked_cross_entropy's
        )
    if cfg.model.name == "mlp":
        linears = [m for m in model.modules() if type(m).__name__ == "Linear"]
        return mlp_activation_bytes(
            batch,
            in_features=linears[0].in_features,
            hidden_features=cfg.model.hidden_features,
            out_features=linears[-1].out_features,
            depth=len(linears),
            precision=precision,
        )
    return 0


def config_memory(
    cfg: object, model: object, shards: int, *, sharded: bool, cpu_offload: bool, cpu_ranks: bool
) -> RankMemory:
    """One rank's memory for `cfg`'s model (built on the meta device), under parallel=ddp
    (`sharded=False`) or fsdp over `shards` ranks, whatever `cfg.parallel` says (the plan
    also asks what the other choice would need).

    Raises:
        ValueError, TypeError: `sharded` with a parallel.shard that names no class of the model.
    """
    optim = cfg.optim
    params = sum(p.numel() for p in model.parameters())
    per_param = bytes_per_parameter(
        optim.name,
        states=optim.states(),
        precision=cfg.precision.runs_as or cfg.precision.name,
        sharded=sharded,
        ddp_reduce_dtype=cfg.ddp.reduce_dtype,
    )
    activations = activation_bytes(cfg, model)
    if not sharded:
        return rank_memory(params, per_param, activations=activations, cpu_ranks=cpu_ranks)
    parallel = cfg.parallel
    shard = getattr(parallel, "shard", "auto")
    min_params = getattr(parallel, "min_params", None) or _auto_min_params()
    root, largest = unit_sizes(model, shard, min_params)
    reshard = getattr(parallel, "reshard_after_forward", True)
    gathered_in = (
        "fp32" if getattr(parallel, "param_dtype", "auto") == "fp32" else (cfg.precision.runs_as or cfg.precision.name)
    )
    gathered = gathered_bytes(params, root, largest, gathered_in, reshard)
    return rank_memory(
        params,
        per_param,
        shards=shards,
        activations=activations,
        gathered=gathered,
        cpu_offload=cpu_offload,
        cpu_ranks=cpu_ranks,
    )


def _auto_min_params() -> int:
    # lazy: clorch.nn.parallel.fsdp imports torch, kept out of clorch-train's start
    from clorch.nn.parallel.fsdp import AUTO_MIN_PARAMS

    return AUTO_MIN_PARAMS
