"""One-line explanations of why an op produced Inf or NaN, from its input summaries."""

from __future__ import annotations

import re

from nanscope.format.health import Health

# Op families by normalised name: "aten.log.default" -> "log", "RealDiv" -> "realdiv".
_FAMILIES: dict[str, tuple[str, ...]] = {
    "log": ("log", "log2", "log10", "xlogy"),
    "log1p": ("log1p",),
    "sqrt": ("sqrt",),
    "rsqrt": ("rsqrt",),
    "div": ("div", "realdiv", "truediv", "true_divide", "floordiv", "reciprocal", "divnonan", "xdivy"),
    "exp": ("exp", "exp2", "expm1", "sinh", "cosh"),
    "pow": ("pow", "square", "float_power"),
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "batchmatmulv2",
               "batchmatmulv3", "einsum", "_scaled_dot_product_flash_attention",
               "scaled_dot_product_attention", "conv2d", "convolution", "conv2dbackpropinput"),
    "mul": ("mul", "multiply"),
    "add": ("add", "addv2", "sub", "subtract", "sum", "mean", "cumsum", "addn", "biasadd"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax", "logsoftmax"),
    "fill": ("masked_fill", "fill", "full", "full_like", "new_full", "index_fill", "index_put",
             "masked_scatter", "scatter", "fill_diagonal", "where", "select", "selectv2"),
}  # fmt: skip
_BY_NAME = {name: family for family, names in _FAMILIES.items() for name in names}


def _short(op_type: str) -> str:
    """``aten.masked_fill.Scalar`` -> ``masked_fill``; other names unchanged."""
    return op_type.split(".")[1] if op_type.startswith("aten.") else op_type


def op_family(op_type: str) -> str:
    """``aten.log.default`` -> ``log``; ``RealDiv`` -> ``div``; unknown ops -> their short name."""
    name = op_type
    if name.startswith("aten."):
        name = name.split(".")[1]
    name = re.sub(r"_$", "", name.lower())  # in-place variants: add_ -> add
    return _BY_NAME.get(name, name)


def _n(value: int | None) -> int:
    return value or 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _is_sub(op_type: str) -> bool:
    name = op_type.split(".")[1] if op_type.startswith("aten.") else op_type
    return name.lower().rstrip("_") in ("sub", "subtract", "rsub")


def _cancelling_infinities(op_type: str, fam: str, inputs: list[Health | None]) -> bool:
    """Whether the inputs hold infinities that cancel into NaN under this op."""
    if fam != "add":
        return False
    a = inputs[0] if inputs else None
    b = inputs[1] if len(inputs) > 1 else None
    if a is not None and _n(a.pos_inf) and _n(a.neg_inf):
        return True  # within one tensor (sum, mean, cumsum)
    if a is None or b is None:
        return False
    if _is_sub(op_type):  # +inf - +inf, -inf - -inf
        return bool((_n(a.pos_inf) and _n(b.pos_inf)) or (_n(a.neg_inf) and _n(b.neg_inf)))
    return bool((_n(a.pos_inf) and _n(b.neg_inf)) or (_n(a.neg_inf) and _n(b.pos_inf)))


def born_from_output(op_type: str, output: Health) -> bool:
    """Whether the output alone proves the op made the value (log gives -inf only for 0)."""
    return op_family(op_type) == "log" and bool(_n(output.neg_inf)) and not _n(output.nan)


def explain(
    op_type: str, output: Health, inputs: list[Health | None], external: bool = False
) -> str:
    """Why ``op_type`` turned ``inputs`` into a non-finite ``output``, in one line.

    ``inputs`` are positional (``None`` where an input's values are unknown).
    """
    fam = op_family(op_type)
    made = _made(output)
    inputs = [c if c is not None and c.known else None for c in inputs]
    known = [c for c in inputs if c is not None]
    bad_inputs = [c for c in known if c.nonfinite]
    if bad_inputs:
        infs = _sum(bad_inputs)
        has_inf = bool(_n(infs.neg_inf) or _n(infs.pos_inf))
        if fam == "mul" and _n(output.nan) and has_inf and any(_n(c.zero) for c in known):
            return "0 * inf: an infinite input was multiplied by a zero, giving NaN"
        if _n(output.nan) and _cancelling_infinities(op_type, fam, inputs):
            return "inf - inf: infinities cancelled, giving NaN"
        if fam == "div" and _n(output.nan) and len(bad_inputs) == len(known) == 2:
            return "inf/inf: both the numerator and the divisor were infinite, giving NaN"
        if fam == "softmax" and _n(output.nan) and _n(infs.neg_inf):
            return "softmax of a row that is entirely -inf (a fully masked row?) gives NaN"
        if external:
            return (
                f"{_made(infs)} was already in an input that no recorded op produced "
                "(the input data, a parameter, or a tensor made before recording started)"
            )
        return f"{_made(infs)} came in through an input (produced earlier)"
    first = inputs[0] if inputs else None
    second = inputs[1] if len(inputs) > 1 else None
    if fam == "div":
        divisor = first if "reciprocal" in op_type.lower() else second
        if divisor is not None and _n(divisor.zero):
            zeros = _plural(_n(divisor.zero), "zero")
            # An unknown numerator (an in-place op's) over a zero: NaN means 0/0.
            if _n(output.nan) and (first is None or _n(first.zero)) and divisor is not first:
                return f"0/0: zeros divided by zeros ({zeros} in the divisor)"
            return f"x/0: the divisor had {zeros}"
    if fam == "fill":
        return f"{_short(op_type)} wrote {made} given as a value (an intentional mask?)"
    if first is None:
        return _without_inputs(fam, output, made)
    if fam == "log":
        if _n(first.zero) and _n(output.neg_inf):
            return f"log of zero: the input had {_plural(_n(first.zero), 'zero')}"
        if _n(first.neg) and _n(output.nan):
            return f"log of a negative number: the input had {_plural(_n(first.neg), 'negative value')}"
        if first.zero is None and _n(output.neg_inf):
            return "log of zero (the input's zeros are not counted in this mode)"
    if fam == "log1p" and _n(first.neg):
        return "log1p of a value <= -1 (the input had negative values)"
    if fam == "sqrt" and _n(first.neg) and _n(output.nan):
        return (
            f"sqrt of a negative number: the input had {_plural(_n(first.neg), 'negative value')}"
        )
    if fam == "rsqrt":
        if _n(first.zero):
            return f"rsqrt of zero: the input had {_plural(_n(first.zero), 'zero')}"
        if _n(first.neg):
            return "rsqrt of a negative number"
    if fam == "softmax" and _n(output.nan):
        return "softmax of a row that is entirely -inf (a fully masked row?) gives NaN"
    if (
        fam in ("exp", "pow", "matmul", "mul", "add")
        and (_n(output.pos_inf) or _n(output.neg_inf))
        and not _n(output.nan)
    ):
        dtype = output.dtype or "float"
        return (
            f"overflow in {fam}: the inputs were finite but the result exceeds the largest "
            f"{dtype} ({_overflow_limit(output.dtype)})"
        )
    return f"{fam} produced {made} from finite inputs"


def _without_inputs(fam: str, output: Health, made: str) -> str:
    """What the output alone proves when the inputs' values were not recorded."""
    unknown = "the input's values were not recorded"
    if fam == "log" and _n(output.neg_inf) and not _n(output.nan):
        return f"log of zero: log gives -inf only for an input of 0 ({unknown})"
    if fam in ("log", "sqrt") and _n(output.nan):
        return f"{fam} of a negative number (or of NaN) gives NaN ({unknown})"
    if fam == "div" and (_n(output.pos_inf) or _n(output.neg_inf)):
        return f"division by zero, most likely ({unknown})"
    if output.known:
        return f"{fam} produced {made}; the inputs' values were not recorded"
    return f"{fam} produced Inf or NaN; this dump's mode records no counts"


def _overflow_limit(dtype: str) -> str:
    return {
        "float16": "65504",
        "bfloat16": "3.4e38",
        "float32": "3.4e38",
        "float64": "1.8e308",
    }.get(dtype, "its range")


def _sum(items: list[Health]) -> Health:
    return Health(
        neg_inf=sum(_n(c.neg_inf) for c in items),
        pos_inf=sum(_n(c.pos_inf) for c in items),
        nan=sum(_n(c.nan) for c in items),
    )


def _made(c: Health) -> str:
    parts = []
    if _n(c.neg_inf):
        parts.append("-inf")
    if _n(c.pos_inf):
        parts.append("+inf")
    if _n(c.nan):
        parts.append("NaN")
    return " and ".join(parts) if parts else "Inf or NaN"
