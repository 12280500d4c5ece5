"""A decoder-only transformer (GPT-2 layout) built for fused attention kernels.

Pre-LayerNorm blocks, learned position embeddings, a fused QKV projection and causal
attention through `F.scaled_dot_product_attention(..., is_causal=True)`. q, k and v are
handed over as `(B, n_head, T, head_dim)` views with a contiguous last dimension, which is
what the flash, memory-efficient and cuDNN kernels accept, so on a GPU under bf16
autocast one of them runs instead of the math fallback. The forward pass has no Python
loop over the sequence and no host synchronization.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

_POSITIVE_INTS = ("vocab_size", "seq_len", "n_layer", "n_head", "d_model")


@dataclass
class GPTConfig:
    """Sizes of a GPT; checked when constructed.

    GPT-2 small is `GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12,
    d_model=768)` (about 124M parameters; 50304 pads GPT-2's 50257 to a multiple of 64).
    """

    vocab_size: int = 256  # number of token ids; 256 covers every byte
    seq_len: int = 128  # longest sequence (tokens) the position table holds
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads; must divide d_model
    d_model: int = 128  # width of the residual stream
    mlp_ratio: float = 4  # MLP hidden width = mlp_ratio * d_model
    dropout: float = 0.0  # dropout probability on attention weights and residual branches
    tie_weights: bool = True  # share the token embedding with the output projection
    bias: bool = False  # biases in Linear and LayerNorm layers

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_head != 0:
            raise ValueError(f"GPTConfig.d_model must be divisible by n_head ({self.n_head}), got {self.d_model}")
        ratio = self.mlp_ratio
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, (int, float))
            or ratio <= 0
            or int(ratio * self.d_model) < 1
        ):
            raise ValueError(f"GPTConfig.mlp_ratio must be a number > 0 giving a hidden width >= 1, got {ratio!r}")
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be a number in [0, 1), got {dropout!r}")
        for name in ("tie_weights", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig.{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names `GPTConfig(...)` accepts."""
        return tuple(f.name for f in fields(cls))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.dropout = float(config.dropout)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.proj.is_residual_projection = True
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, width = x.shape
        # (B, T, 3, H, D) -> (3, B, H, T, D): views whose last dim stays contiguous.
        qkv = self.qkv(x).view(batch, steps, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, steps, width)
        return self.resid_dropout(self.proj(y))


class FeedForward(nn.Module):
    """The block's MLP: Linear -> GELU -> Linear."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = int(config.mlp_ratio * config.d_model)
        self.fc = nn.Linear(config.d_model, hidden, bias=config.bias)
        self.proj = nn.Linear(hidden, config.d_model, bias=config.bias)
        self.proj.is_residual_projection = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer language model.

    Args:
        config: the sizes; a `GPTConfig` (build one from keywords with
            `clorch.models.build_model("gpt", **fields)`).

    Raises:
        TypeError: `config` is not a GPTConfig.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT(config) needs a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    def shard_units(self) -> list[nn.Module]:
        """The modules that each get their own fully_shard under `parallel=fsdp` (one all-gather and
        one reduce-scatter per block), and that `model.activation_checkpointing` recomputes."""
        return list(self.blocks)

    def init_module(self, module: nn.Module) -> None:
        """Draw `module`'s own parameters as this model's `__init__` does: how a model built on the
        meta device gets its first values, module by module (`clorch.nn.parallel.fsdp.materialize`)."""
        self._init_weights(module)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2: N(0, 0.02) everywhere; projections that write into the residual stream are
        # scaled by 1/sqrt(2 * n_layer) because each block adds two of them to it.
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "is_residual_projection", False):
                std /= math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits for the next token at every position.

        Args:
            idx: token ids, a LongTensor of shape `(B, T)` with `T <= config.seq_len`.

        Returns:
            Logits of shape `(B, T, vocab_size)`.

        Raises:
            ValueError: `idx` is not 2-D or is longer than `config.seq_len`.
        """
        return self.lm_head(self.forward_hidden(idx))

    def forward_hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final layer norm's output, `(B, T, d_model)`: what `lm_head` reads.

        With `output_weight` this is the protocol of `clorch.nn.fused_loss` (`loss=chunked_cross_entropy`
        computes the loss from it without making the logits). Raises what `forward` raises.
        """
        if idx.dim() != 2:
            raise ValueError(f"GPT input idx must be (batch, time), got shape {tuple(idx.shape)}")
        steps = idx.size(1)
        if steps > self.config.seq_len:
            raise ValueError(f"GPT input length must be <= seq_len ({self.config.seq_len}), got {steps}")
        pos = torch.arange(steps, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    @property
    def output_weight(self) -> torch.Tensor:
        """The output matrix, `(vocab_size, d_model)` (the token embedding when tied)."""
        return self.lm_head.weight

    def num_parameters(self, exclude_position_embeddings: bool = False) -> int:
        """Number of distinct parameters (a tied embedding counts once).

        Args:
            exclude_position_embeddings: leave out the position table, as GPT-2's
                reported sizes and FLOP estimates often do.
        """
        total = sum(p.numel() for p in self.parameters())
        if exclude_position_embeddings:
            total -= self.pos_emb.weight.numel()
        return total

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token (forward + backward), the PaLM estimate 6N + 12·L·d·T.

        Used for MFU: N excludes the position table; the second term is attention's
        score and value matmuls (the causal mask is not subtracted, by convention).
        """
        steps = self.config.seq_len if seq_len is None else seq_len
        n = self.num_parameters(exclude_position_embeddings=True)
        return 6 * n + 12 * self.config.n_layer * self.config.d_model * steps
