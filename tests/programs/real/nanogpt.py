"""A nanoGPT-style character model (hand-written causal self-attention with a registered
``tril`` buffer and ``masked_fill(-inf)``, LayerNorm, MLP, weight tying) trained with AdamW
on a synthetic text.

    python nanogpt.py --lr 1e-3     # trains; the attention mask's -inf is benign
    python nanogpt.py               # --lr 1e10: diverges
    python nanogpt.py --compile     # the model under torch.compile (its graphs recorded)
    python nanogpt.py --checkpoint non-reentrant   # activation checkpointing of each block
                                                   # (torch.utils.checkpoint, use_reentrant=False)
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 48
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    # "reentrant" or "non-reentrant": each block under torch.utils.checkpoint.checkpoint
    checkpoint: str | None = None

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            if self.checkpoint and self.training:
                reentrant = self.checkpoint == "reentrant"
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)
            else:
                x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        return logits, loss


def make_text(length: int, vocab: int, seed: int) -> torch.Tensor:
    """Synthetic 'text': words of 2-6 random characters separated by a space (id 0)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while len(out) < length:
        n = int(torch.randint(2, 7, (1,), generator=gen))
        out += [*torch.randint(1, vocab, (n,), generator=gen).tolist(), 0]
    return torch.tensor(out[:length])


def get_batch(data: torch.Tensor, batch_size: int, block_size: int, gen: torch.Generator):
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=gen)
    x = torch.stack([data[i : i + block_size] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix.tolist()])
    return x, y


# A late divergence, and nanscope's sentinel (the module docstring's lines are kept as they
# were: documents cite this file's line numbers):
#
#     python nanogpt.py --lr 1e-3 --steps 300 --diverge-at 280   # trains, then a learning-rate
#                         # spike (--spike-lr, default 1e10) at step 280: diverges a step later
#     python nanogpt.py ... --spike-lr inf     # the optimizer step itself writes Inf/NaN
#     python nanogpt.py ... --sentinel LOGDIR  # each step through nanscope's sentinel
#                         # (--on-nan stop|skip, --snapshot-state)
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e10)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--compile", action="store_true", help="train torch.compile(model)")
    parser.add_argument("--checkpoint", choices=["reentrant", "non-reentrant"], default=None)
    parser.add_argument(
        "--diverge-at", type=int, default=None, metavar="STEP",
        help="from this step on the learning rate is --spike-lr (a schedule gone wrong)",
    )  # fmt: skip
    parser.add_argument("--spike-lr", type=float, default=1e10)
    parser.add_argument("--sentinel", metavar="LOGDIR", help="check each step with a Sentinel")
    parser.add_argument("--on-nan", choices=["stop", "skip"], default="stop")
    parser.add_argument("--snapshot-state", action="store_true")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    config = GPTConfig(block_size=args.block_size)
    data = make_text(4000, config.vocab_size, args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    model = GPT(config)
    model.checkpoint = args.checkpoint
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay
    )
    model.train()
    step = torch.compile(model) if args.compile else model

    def train_step(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        _, loss = step(X, Y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = train_step
    sentinel = None
    if args.sentinel:
        from nanscope.sentinel import Sentinel

        sentinel = Sentinel(
            args.sentinel, model=model, optimizer=optimizer, on_nan=args.on_nan,
            snapshot_state=args.snapshot_state,
        )  # fmt: skip

        def run(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
            return sentinel.step(train_step, X, Y)

    try:
        for it in range(args.steps):
            if args.diverge_at is not None and it == args.diverge_at:
                for group in optimizer.param_groups:
                    group["lr"] = args.spike_lr
            X, Y = get_batch(data, args.batch_size, config.block_size, gen)
            loss = run(X, Y)
            print(f"iter {it}: loss {loss.item():.4f}", flush=True)
    finally:
        if sentinel is not None:
            sentinel.close()


if __name__ == "__main__":
    main()
