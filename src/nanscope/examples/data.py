"""Digit images for the examples: built-in synthetic digits, or a local MNIST file.

MNIST cannot be downloaded here, so the examples draw their own 28x28 digits:
seven-segment-style glyphs with random placement, size, stroke width and
noise. A small MLP learns them to high accuracy, so the examples really show
a model that trains (with ``--fix``) or collapses (without). Pass
``--data mnist.npz`` (the Keras file: ``x_train, y_train, x_test, y_test``)
to use real MNIST.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Segments a..g of a seven-segment display, as (row0, col0, row1, col1) in a 0..1 box.
_SEGMENTS = {
    "a": (0.0, 0.0, 0.0, 1.0), "b": (0.0, 1.0, 0.5, 1.0), "c": (0.5, 1.0, 1.0, 1.0),
    "d": (1.0, 0.0, 1.0, 1.0), "e": (0.5, 0.0, 1.0, 0.0), "f": (0.0, 0.0, 0.5, 0.0),
    "g": (0.5, 0.0, 0.5, 1.0),
}  # fmt: skip
_DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def _draw(digit: int, rng: np.random.Generator) -> np.ndarray:
    img = np.zeros((28, 28), dtype=np.float32)
    # Centred and size-normalised, like MNIST, with some jitter.
    height = rng.uniform(16, 19)
    width = height * rng.uniform(0.5, 0.62)
    top = (28 - height) / 2 + rng.uniform(-1.5, 1.5)
    left = (28 - width) / 2 + rng.uniform(-1.5, 1.5)
    stroke = rng.uniform(1.2, 2.2)
    rows, cols = np.mgrid[0:28, 0:28].astype(np.float32)
    for seg in _DIGITS[digit]:
        r0, c0, r1, c1 = _SEGMENTS[seg]
        y0, x0 = top + r0 * height, left + c0 * width
        y1, x1 = top + r1 * height, left + c1 * width
        # Distance from every pixel to the segment.
        dy, dx = y1 - y0, x1 - x0
        t = np.clip(((rows - y0) * dy + (cols - x0) * dx) / max(dy * dy + dx * dx, 1e-6), 0, 1)
        dist = np.hypot(rows - (y0 + t * dy), cols - (x0 + t * dx))
        img = np.maximum(img, np.clip(stroke - dist + 0.5, 0, 1))
    img += rng.normal(0, 0.05, img.shape).astype(np.float32)
    return np.clip(img, 0, 1) * 255


def synthetic_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 images (n, 28, 28) and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = np.stack([_draw(int(d), rng) for d in labels]).astype(np.uint8)
    return images, labels.astype(np.int64)


def load(
    path: str | None, train_size: int = 6000, test_size: int = 1000, seed: int = 42
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``x_train, y_train, x_test, y_test``: images flattened to 784 floats in [0, 1]."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{path}: no such file (expected Keras' mnist.npz)")
        with np.load(p) as f:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(f.files)
            if missing:
                raise ValueError(
                    f"{path}: not an MNIST .npz (missing {', '.join(sorted(missing))})"
                )
            xtr, ytr, xte, yte = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    else:
        xtr, ytr = synthetic_digits(train_size, seed)
        xte, yte = synthetic_digits(test_size, seed + 1)

    def flat(x: np.ndarray) -> np.ndarray:
        return x.reshape(len(x), -1).astype(np.float32) / 255.0

    return flat(xtr), ytr.astype(np.int64), flat(xte), yte.astype(np.int64)
