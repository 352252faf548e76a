"""The models bench/overhead_torch.py trains: each builder returns one training step.

The MLP is written once in PyTorch and once in TensorFlow (same sizes, data and
initial weights); the Transformer in PyTorch, eager and under ``torch.compile``;
the word-level language model (LSTM, or ReLU RNN) in PyTorch: many small ops.
Builders take the framework module (imported by the child), so that importing
this file imports neither framework.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Step = Callable[[], None]

MLP: dict[str, Any] = {"batch": 100, "n_in": 784, "hidden": 500, "classes": 10, "lr": 0.01}
TRANSFORMER: dict[str, Any] = {
    "batch": 64,
    "seq": 128,
    "d_model": 256,
    "nhead": 4,
    "ff": 1024,
    "layers": 4,
    "vocab": 1000,
    "lr": 0.01,
}
# The shape of pytorch/examples' word_language_model (its defaults: 2 layers of 200,
# embedding 200, batch 20, bptt 35, dropout 0.2, lr 20, clip 0.25), on ~10k tokens.
RNN_LM: dict[str, Any] = {
    "vocab": 10000,
    "emsize": 200,
    "hidden": 200,
    "layers": 2,
    "batch": 20,
    "bptt": 35,
    "dropout": 0.2,
    "lr": 20.0,
    "clip": 0.25,
    "batches": 8,  # distinct bptt windows the steps cycle through
}


def mlp_data() -> dict[str, Any]:
    """The MLP's data and initial weights, identical for PyTorch and TensorFlow."""
    import numpy as np

    rng = np.random.default_rng(0)
    b, n, h, c = MLP["batch"], MLP["n_in"], MLP["hidden"], MLP["classes"]
    x = rng.random((b, n), dtype=np.float32)  # like MNIST pixels in [0, 1)
    labels = np.eye(c, dtype=np.float32)[rng.integers(0, c, b)]
    w1 = (rng.standard_normal((n, h)) * np.sqrt(2.0 / n)).astype(np.float32)
    w2 = (rng.standard_normal((h, c)) * np.sqrt(1.0 / h)).astype(np.float32)
    return {
        "x": x,
        "labels": labels,
        "w1": w1,
        "b1": np.zeros(h, np.float32),
        "w2": w2,
        "b2": np.zeros(c, np.float32),
    }


def torch_mlp(torch: Any) -> Step:
    """The seed tutorial's 784-500-10 MLP with a hand-written cross-entropy, SGD."""
    nn = torch.nn
    d = mlp_data()

    class SeedMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(MLP["n_in"], MLP["hidden"])
            self.fc2 = nn.Linear(MLP["hidden"], MLP["classes"])

        def forward(self, x: Any) -> Any:
            return self.fc2(torch.relu(self.fc1(x)))

    model = SeedMLP()
    with torch.no_grad():
        # nn.Linear keeps (out, in); TensorFlow's matmul takes (in, out).
        model.fc1.weight.copy_(torch.from_numpy(d["w1"]).t())
        model.fc1.bias.copy_(torch.from_numpy(d["b1"]))
        model.fc2.weight.copy_(torch.from_numpy(d["w2"]).t())
        model.fc2.bias.copy_(torch.from_numpy(d["b2"]))
    x = torch.from_numpy(d["x"])
    labels = torch.from_numpy(d["labels"])
    opt = torch.optim.SGD(model.parameters(), lr=MLP["lr"])
    n = MLP["batch"]

    def step() -> None:
        opt.zero_grad()
        probs = torch.softmax(model(x), dim=1)
        # Clamped so that no Inf/NaN appears while timing.
        loss = -(labels * torch.log(probs.clamp_min(1e-6))).sum() / n
        loss.backward()
        opt.step()

    return step


def torch_transformer(
    torch: Any,
    batch: int,
    *,
    seq: int = TRANSFORMER["seq"],
    d_model: int = TRANSFORMER["d_model"],
    layers: int = TRANSFORMER["layers"],
    ff: int = TRANSFORMER["ff"],
    dropout: float = 0.1,
    compiled: bool = False,
) -> Step:
    """``nn.TransformerEncoder`` with an embedding and a linear head, cross-entropy, SGD.

    With ``compiled``, the steps call the model through ``torch.compile`` (its
    default inductor backend).
    """
    nn = torch.nn
    F = torch.nn.functional
    vocab = TRANSFORMER["vocab"]
    torch.manual_seed(0)

    class TinyTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model, TRANSFORMER["nhead"], ff, dropout=dropout, batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.encoder(self.embed(tokens)))

    model = TinyTransformer()
    forward = torch.compile(model) if compiled else model
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g)
    targets = torch.randint(0, vocab, (batch, seq), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=TRANSFORMER["lr"])

    def step() -> None:
        opt.zero_grad()
        logits = forward(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()

    return step


def torch_rnn_lm(torch: Any, cell: str = "LSTM", unfused: bool = False) -> Step:
    """A word-level language model: embedding, 2-layer RNN, linear decoder; SGD, clipping.

    ``cell`` is ``"LSTM"`` or ``"RNN_RELU"`` (``nn.RNN(nonlinearity="relu")``). On
    CPU, PyTorch runs ``nn.LSTM`` as one oneDNN kernel per layer (~100 ops a
    step); ``unfused`` turns oneDNN off in the step, so that the LSTM runs as
    its per-timestep ATen ops (~3,500 a step), as where no fused kernel applies.
    The ReLU RNN has no fused CPU kernel: ~1,400 ops a step. Like
    the example's training loop, each step trains on the next bptt window of a
    token stream (generated: Zipf-like word frequencies over the vocabulary) and
    detaches the hidden state carried over from the previous window.
    """
    nn = torch.nn
    F = torch.nn.functional
    c = RNN_LM
    torch.manual_seed(0)

    class RNNModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(c["dropout"])
            self.encoder = nn.Embedding(c["vocab"], c["emsize"])
            if cell == "LSTM":
                self.rnn: Any = nn.LSTM(c["emsize"], c["hidden"], c["layers"], dropout=c["dropout"])
            else:
                self.rnn = nn.RNN(
                    c["emsize"],
                    c["hidden"],
                    c["layers"],
                    nonlinearity="relu",
                    dropout=c["dropout"],
                )
            self.decoder = nn.Linear(c["hidden"], c["vocab"])

        def forward(self, tokens: Any, hidden: Any) -> tuple[Any, Any]:
            emb = self.drop(self.encoder(tokens))
            output, hidden = self.rnn(emb, hidden)
            decoded = self.decoder(self.drop(output)).view(-1, c["vocab"])
            return F.log_softmax(decoded, dim=1), hidden

        def init_hidden(self) -> Any:
            h = torch.zeros(c["layers"], c["batch"], c["hidden"])
            return (h, h.clone()) if cell == "LSTM" else h

    model = RNNModel()
    g = torch.Generator().manual_seed(1)
    n = c["bptt"] * c["batches"] + 1
    # Word frequencies fall like 1/rank, as in text.
    weights = 1.0 / torch.arange(1, c["vocab"] + 1, dtype=torch.float64)
    stream = torch.multinomial(weights, n * c["batch"], replacement=True, generator=g)
    data = stream.view(c["batch"], n).t().contiguous()  # [time, batch], the example's batchify
    opt = torch.optim.SGD(model.parameters(), lr=c["lr"])
    state: dict[str, Any] = {"hidden": model.init_hidden(), "i": 0}

    def detach(h: Any) -> Any:
        return h.detach() if isinstance(h, torch.Tensor) else tuple(detach(v) for v in h)

    def train() -> None:
        i = state["i"]
        state["i"] = (i + c["bptt"]) % (n - 1)
        tokens = data[i : i + c["bptt"]]
        targets = data[i + 1 : i + 1 + c["bptt"]].reshape(-1)
        # Starting each window from the last one's state, without backpropagating into it.
        hidden = detach(state["hidden"])
        opt.zero_grad()
        output, state["hidden"] = model(tokens, hidden)
        loss = F.nll_loss(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip"])
        opt.step()

    if not unfused:
        return train

    def step() -> None:
        with torch.backends.mkldnn.flags(enabled=False):
            train()

    return step


RNN_MODELS = ["lstm", "lstm_unfused", "rnn_relu"]


def torch_model(torch: Any, cfg: dict[str, Any]) -> Step:
    """The step of ``cfg["model"]``: ``"mlp"``, one of :data:`RNN_MODELS`, or the
    Transformer at ``cfg["batch"]``."""
    if cfg["model"] == "mlp":
        return torch_mlp(torch)
    if cfg["model"] == "lstm":
        return torch_rnn_lm(torch, "LSTM")
    if cfg["model"] == "lstm_unfused":
        return torch_rnn_lm(torch, "LSTM", unfused=True)
    if cfg["model"] == "rnn_relu":
        return torch_rnn_lm(torch, "RNN_RELU")
    return torch_transformer(torch, cfg["batch"])


# The compiled Transformer: the same model (dropout 0 here, so that compiled and instrumented
# steps do the same work), compiled with torch.compile's default inductor backend. Every switch
# of a nanscope session resets Dynamo (see nanscope.backends.torch.compiled), so each variant
# recompiles in its warm-up steps (inductor's on-disk FX graph cache makes repeats cheap);
# compile time is never in the timed steps.
def compiled_transformer(torch: Any, cfg: dict[str, Any]) -> Step:
    """The Transformer of ``cfg`` (layers, d_model, batch, seq) under ``torch.compile``."""
    d = cfg["d_model"]
    return torch_transformer(
        torch,
        cfg["batch"],
        seq=cfg["seq"],
        d_model=d,
        layers=cfg["layers"],
        ff=4 * d,
        dropout=0.0,
        compiled=True,
    )


def tf_mlp(tf: Any) -> Step:
    """The MLP in TensorFlow: eager ``GradientTape`` and a hand-written SGD update."""
    d = mlp_data()
    x = tf.constant(d["x"])
    labels = tf.constant(d["labels"])
    w1, b1 = tf.Variable(d["w1"]), tf.Variable(d["b1"])
    w2, b2 = tf.Variable(d["w2"]), tf.Variable(d["b2"])
    params = [w1, b1, w2, b2]
    lr = MLP["lr"]
    n = float(MLP["batch"])

    def step() -> None:
        with tf.GradientTape() as tape:
            hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
            probs = tf.nn.softmax(tf.matmul(hidden, w2) + b2)
            # Clamped like the PyTorch side.
            loss = -tf.reduce_sum(labels * tf.math.log(tf.maximum(probs, 1e-6))) / n
        grads = tape.gradient(loss, params)
        for p, g in zip(params, grads, strict=True):
            p.assign_sub(lr * g)

    return step
