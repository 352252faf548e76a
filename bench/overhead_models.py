"""The models bench/overhead_torch.py trains: each builder returns one training step.

The MLP is written once in PyTorch and once in TensorFlow (same sizes, data and
initial weights); the Transformer in PyTorch, eager and under ``torch.compile``.
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


def torch_model(torch: Any, cfg: dict[str, Any]) -> Step:
    """The step of ``cfg["model"]``: ``"mlp"``, or the Transformer at ``cfg["batch"]``."""
    if cfg["model"] == "mlp":
        return torch_mlp(torch)
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
        torch, cfg["batch"], seq=cfg["seq"], d_model=d, layers=cfg["layers"], ff=4 * d,
        dropout=0.0, compiled=True,
    )  # fmt: skip


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
