"""A word-level language model with a ReLU RNN, after pytorch/examples' word_language_model
(``--model RNN_RELU``), on a synthetic corpus, trained with SGD and gradient clipping.

    python rnn_lm.py --lr 0.5      # trains
    python rnn_lm.py               # --lr 3000: diverges

With a huge learning rate the weights grow, and so does the hidden state carried from batch
to batch (truncated BPTT). First the total gradient norm computed by
``clip_grad_norm_`` overflows to inf (a dead end: the clip coefficient becomes 0); later
the forward matmul of the recurrence overflows, and the NaN that kills training is born.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(
        self, rnn_type: str, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.5
    ) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        nonlinearity = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}[rnn_type]
        self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid
        self.nlayers = nlayers
        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(
        self, input: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> torch.Tensor:
        weight = next(self.parameters())
        return weight.new_zeros((self.nlayers, bsz, self.nhid))


def make_corpus(length: int, ntoken: int, seed: int) -> torch.Tensor:
    """A random Markov chain over ``ntoken`` words: each word has 3 likely successors."""
    gen = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, ntoken, (ntoken, 3), generator=gen)
    words = [0]
    choices = torch.randint(0, 3, (length,), generator=gen)
    for c in choices.tolist():
        words.append(int(successors[words[-1], c]))
    return torch.tensor(words)


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i : i + seq_len]
    target = source[i + 1 : i + 1 + seq_len].view(-1)
    return data, target


def repackage_hidden(h: torch.Tensor) -> torch.Tensor:
    """Wraps hidden states in new Tensors, to detach them from their history."""
    return h.detach()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5, help="batches to train on")
    parser.add_argument("--lr", type=float, default=3000.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--bptt", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--emsize", type=int, default=32)
    parser.add_argument("--nhid", type=int, default=32)
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ntokens = 50
    corpus = make_corpus(2000, ntokens, args.seed)
    train_data = batchify(corpus, args.batch_size)

    model = RNNModel("RNN_RELU", ntokens, args.emsize, args.nhid, args.nlayers, args.dropout)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    model.train()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        if batch == args.steps:
            break
        data, targets = get_batch(train_data, i, args.bptt)
        optimizer.zero_grad(set_to_none=True)
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs.
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        print(f"batch {batch} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
