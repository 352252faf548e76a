"""A word-level Transformer language model, after pytorch/examples' word_language_model
(``--model Transformer``), on a synthetic corpus: train, evaluate, save, load, test.

    python word_lm_transformer.py --steps 4

As the example does, the model builds its causal mask once with
``torch.log(torch.tril(ones))`` (``-inf`` above the diagonal), keeps it in the module
attribute ``src_mask`` and hands it to every forward pass; the attention's softmax absorbs
the ``-inf`` every time. After training it saves the whole model with ``torch.save``, loads
it back (the mask comes back with it: ``torch.load`` writes the ``-inf`` again) and
evaluates the loaded model. A healthy run: every ``-inf`` is intended.
"""

from __future__ import annotations

import argparse
import io
import math

import torch
import torch.nn.functional as F
from torch import nn


class PositionalEncoding(nn.Module):
    """Sine and cosine positional encodings, added to the embeddings."""

    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pe[: x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Transformer):
    """Container module with an encoder, a recurrent or transformer module, and a decoder."""

    def __init__(
        self, ntoken: int, ninp: int, nhead: int, nhid: int, nlayers: int, dropout: float = 0.5
    ) -> None:
        super().__init__(
            d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers
        )
        self.model_type = "Transformer"
        self.src_mask: torch.Tensor | None = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def _generate_square_subsequent_mask(self, sz: int) -> torch.Tensor:
        return torch.log(torch.tril(torch.ones(sz, sz)))

    def init_weights(self) -> None:
        initrange = 0.1
        nn.init.uniform_(self.input_emb.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src: torch.Tensor, has_mask: bool = True) -> torch.Tensor:
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None

        src = self.input_emb(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.encoder(src, mask=self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


def make_corpus(length: int, ntoken: int, seed: int) -> torch.Tensor:
    """A random Markov chain over ``ntoken`` words: each word has 3 likely successors."""
    gen = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, ntoken, (ntoken, 3), generator=gen)
    words = [0]
    for c in torch.randint(0, 3, (length,), generator=gen).tolist():
        words.append(int(successors[words[-1], c]))
    return torch.tensor(words)


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def evaluate(model: nn.Module, data: torch.Tensor, ntokens: int, bptt: int) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            x, y = get_batch(data, i, bptt)
            output = model(x).view(-1, ntokens)
            total += len(x) * F.nll_loss(output, y).item()
    return total / (len(data) - 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5.0)
    parser.add_argument("--bptt", type=int, default=8)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    ntokens, bsz = 50, 4
    train = batchify(make_corpus(args.steps * args.bptt * bsz + 8, ntokens, 1), bsz)
    val = batchify(make_corpus(4 * args.bptt + 1, ntokens, 2), 2)
    model = TransformerModel(ntokens, 16, 2, 32, 2, dropout=0.2)
    criterion = nn.NLLLoss()
    model.train()
    for step, i in enumerate(range(0, args.steps * args.bptt, args.bptt)):
        x, y = get_batch(train, i, args.bptt)
        model.zero_grad()
        output = model(x).view(-1, ntokens)
        loss = criterion(output, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-args.lr)
        print(f"step {step} loss {loss.item():.4f}")
    print(f"valid nll {evaluate(model, val, ntokens, args.bptt):.4f}")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    model = torch.load(buffer, weights_only=False)
    print(f"test nll {evaluate(model, val, ntokens, args.bptt):.4f}")


if __name__ == "__main__":
    main()
