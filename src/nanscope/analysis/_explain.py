"""One-line explanations of why an op produced Inf or NaN, from its input summaries.

Each explanation cites its evidence: which input had the zeros (or the negative
values, or the infinities), and the limit of the dtype that a result exceeded.
docs/ROOT_CAUSE_EXPLANATIONS.md lists the cases and their wording.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nanscope.format.collectives import is_distributed
from nanscope.format.health import Health, total

# Op families by normalised name: "aten.log.default" -> "log", "RealDiv" -> "realdiv".
_FAMILIES: dict[str, tuple[str, ...]] = {
    "log": ("log", "log2", "log10", "xlogy"),
    "log1p": ("log1p",),
    "sqrt": ("sqrt",),
    "rsqrt": ("rsqrt",),
    "div": ("div", "realdiv", "truediv", "true_divide", "floordiv", "floor_divide", "reciprocal",
            "inv", "xdivy", "truncatediv"),
    # x / y, but 0 where y is 0 (TensorFlow's DivNoNan, MulNoNan's twin): no x/0.
    "divnonan": ("divnonan",),
    # The gradient of sqrt, dy * 0.5 / y: infinite where sqrt's output y is 0.
    "sqrt_grad": ("sqrtgrad",),
    "addcdiv": ("addcdiv",),
    "addcmul": ("addcmul",),
    "exp": ("exp", "exp2", "expm1", "sinh", "cosh"),
    "pow": ("pow", "float_power", "integer_pow"),
    # x * x (Adam's second moment squares each gradient): overflow, never 0 to a power < 0.
    "square": ("square", "squareddifference"),
    "norm": ("norm", "linalg_vector_norm", "linalg_norm", "frobenius_norm", "euclideannorm"),
    "layer_norm": ("native_layer_norm", "layer_norm"),
    "layer_norm_backward": ("native_layer_norm_backward", "layer_norm_backward"),
    "cast": ("_to_copy", "to", "copy", "cast", "convert_element_type"),
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "batchmatmulv2",
               "batchmatmulv3", "einsum", "_scaled_dot_product_flash_attention",
               "scaled_dot_product_attention", "conv2d", "convolution", "conv2dbackpropinput",
               "dot_general", "conv_general_dilated", "conv2dbackpropfilter", "conv3d",
               "conv3dbackpropinputv2", "conv3dbackpropfilterv2", "depthwiseconv2dnative",
               "depthwiseconv2dnativebackpropinput", "depthwiseconv2dnativebackpropfilter"),
    "mul": ("mul", "multiply", "mulnonan", "rsqrtgrad", "reciprocalgrad", "tanhgrad",
            "sigmoidgrad"),
    "add": ("add", "addv2", "sub", "subtract", "sum", "mean", "cumsum", "addn", "biasadd",
            "add_any", "reduce_sum", "biasaddgrad", "biasaddv1", "accumulatenv2"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax", "logsoftmax"),
    "fill": ("masked_fill", "fill", "full", "full_like", "new_full", "index_fill", "index_put",
             "masked_scatter", "scatter", "fill_diagonal", "where", "select", "selectv2",
             "scalar_tensor", "select_n"),
}  # fmt: skip
_BY_NAME = {name: family for family, names in _FAMILIES.items() for name in names}
_REDUCTIONS = frozenset({"sum", "mean", "cumsum", "nansum", "addn", "reduce_sum", "biasaddgrad"})
# Ops whose logarithm is of their input 1: xlogy(x, y) = x * log(y).
_LOG_OF_INPUT_1 = frozenset({"xlogy"})

# Each dtype's largest finite value and smallest positive (subnormal) value, as printed.
_LARGEST = {"float16": "65504", "bfloat16": "3.39e38", "float32": "3.4e38", "float64": "1.8e308"}
_SMALLEST = {
    "float16": "5.96e-8",
    "bfloat16": "9.2e-41",
    "float32": "1.4e-45",
    "float64": "4.9e-324",
}
# sqrt(largest): a 2-norm's sum of squares overflows for a norm above it.
_SQRT_LARGEST = {"float16": "256", "bfloat16": "1.8e19", "float32": "1.8e19", "float64": "1.3e154"}
# exp(x) and expm1(x) overflow for x above ln(largest); exp2(x) above log2(largest).
_EXP_ABOVE = {"float16": "11.1", "bfloat16": "88.7", "float32": "88.7", "float64": "709.8"}
_EXP2_ABOVE = {"float16": "16", "bfloat16": "128", "float32": "128", "float64": "1024"}
_HALF = ("float16", "bfloat16")
# How a fill's explanation guesses at a mask; a harmful lineage's says otherwise (the report
# replaces it with HARMFUL_MASK: no sentence may call harm intended).
MASK_GUESS = "(an intentional mask?)"
HARMFUL_MASK = "(a mask? nothing absorbed its values: they are harmful, see the lineages)"


def short_name(op_type: str) -> str:
    """``aten.masked_fill.Scalar`` -> ``masked_fill``; other names unchanged."""
    return op_type.split(".")[1] if op_type.startswith("aten.") else op_type


def _overload(op_type: str) -> str:
    """``aten.div.Tensor`` -> ``Tensor``; ``""`` for names without one."""
    parts = op_type.split(".")
    return parts[2] if op_type.startswith("aten.") and len(parts) > 2 else ""


def _base(op_type: str) -> str:
    """``aten._foreach_exp_.default`` -> ``exp``; ``Expm1`` -> ``expm1``."""
    name = op_type.split(".")[1] if op_type.startswith("aten.") else op_type
    name = re.sub(r"_$", "", name.lower())  # in-place variants: add_ -> add
    return re.sub(r"^_foreach_", "", name)  # list variants: _foreach_norm -> norm


def _is_tf_op(op_type: str) -> bool:
    """TensorFlow op types are CamelCase names (``RealDiv``, ``AddV2``); aten ops are dotted
    (``aten.div.Tensor``) and JAX primitives lower case (``dot_general``)."""
    return "." not in op_type and op_type[:1].isupper()


def op_family(op_type: str) -> str:
    """``aten.log.default`` -> ``log``; ``RealDiv`` -> ``div``; unknown ops -> their short name.

    In-place and ``_foreach_`` variants belong to their op's family:
    ``aten._foreach_addcdiv_.ScalarList`` -> ``addcdiv``.
    """
    name = _base(op_type)
    return _BY_NAME.get(name, name)


def _n(value: int | None) -> int:
    return value or 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _is_sub(op_type: str) -> bool:
    name = short_name(op_type)
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


@dataclass(frozen=True, slots=True)
class _Op:
    """One op's event as the explanations see it."""

    op_type: str
    fam: str
    name: str  # the op's short name for aten ops (addcdiv_, _foreach_norm), else its family
    output: Health
    inputs: list[Health | None]  # as recorded, None where unknown
    args: list[Health | None]  # operands: a _foreach op's lists each summed into one
    lists: int  # how many tensor lists a _foreach op takes (0: not a _foreach op)

    def arg(self, k: int) -> Health | None:
        return self.args[k] if 0 <= k < len(self.args) else None

    @property
    def dtype(self) -> str:
        return self.output.dtype

    @property
    def inf(self) -> bool:
        return bool(_n(self.output.pos_inf) or _n(self.output.neg_inf))

    @property
    def nan(self) -> bool:
        return bool(_n(self.output.nan))

    def label(self, k: int, role: str) -> str:
        """``the divisor (input 2)``; for a _foreach op's list, ``the divisors (list 2)``."""
        if self.lists and k < self.lists:
            return f"the {role}s (list {k})"
        if self.lists:
            return f"the {role} (the scalar argument)"
        return f"the {role} (input {k})"

    def finite(self) -> str:
        """What is known of the inputs (none is Inf or NaN where this is asked)."""
        if any(c is None for c in self.inputs):
            return "the recorded inputs were finite"
        return "the input was finite" if len(self.inputs) == 1 else "the inputs were finite"


def explain(
    op_type: str, output: Health, inputs: Sequence[Health | None], external: bool = False
) -> str:
    """Why ``op_type`` turned ``inputs`` into a non-finite ``output``, in one line.

    ``inputs`` are positional (``None`` where an input's values are unknown), as
    recorded: the tensors (a list argument's tensors one by one), then the Python
    numbers. The dtypes are the summaries' own (``Health.dtype``, where recorded).
    """
    fam = op_family(op_type)
    made = _made(output)
    if op_type in ("Placeholder", "Const") and not inputs:
        # A graph's argument (a jitted JAX function's): nothing in the graph made it.
        what = "argument" if op_type == "Placeholder" else "captured constant"
        return (
            f"{made} was already in this {what} when the function was called "
            "(the input data, a parameter or an optimizer state)"
        )
    counted = [c if c is not None and c.known else None for c in inputs]
    bad_inputs = [c for c in counted if c is not None and c.nonfinite]
    if fam == "fill" and all(c.size == 1 for c in bad_inputs):
        # The Inf/NaN is the value given (masked_fill(mask, -inf), scalar_tensor(-inf)).
        return f"{short_name(op_type)} wrote {made} given as a value {MASK_GUESS}"
    if bad_inputs:
        return _carried(op_type, fam, output, counted, bad_inputs, external)
    if is_distributed(op_type) and counted and all(counted):
        # A collective's inputs are what this rank put in: the rest came from its peers.
        return (
            f"{short_name(op_type)} returned {made} though this rank put in finite values: "
            "another rank sent them (or the reduction overflowed); see the ranks"
        )
    op = _op(op_type, fam, output, counted)
    handler = _HANDLERS.get(fam)
    if handler is not None:
        text = handler(op)
        if text:
            return text
    first = op.arg(1) if _base(op_type) in _LOG_OF_INPUT_1 else op.arg(0)
    if first is None:
        return _without_inputs(op, made)
    if fam == "log":
        the_input = "the input"
        if _base(op_type) in _LOG_OF_INPUT_1:
            the_input = f"y (input 1) of {op.name}(x, y) = x * log(y)"
        if _n(first.zero) and _n(output.neg_inf):
            return f"log of zero: {the_input} had {_plural(_n(first.zero), 'zero')}"
        if _n(first.neg) and _n(output.nan):
            return f"log of a negative number: {the_input} had {_plural(_n(first.neg), 'negative value')}"
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
        return "softmax of a row that is entirely -inf gives NaN: a sequence with no unmasked position (a fully masked row)"
    shown = op.name if _is_tf_op(op_type) else fam
    if fam in ("exp", "pow", "matmul", "mul", "add") and op.inf and not op.nan:
        return f"overflow in {shown}: {op.finite()}, but the result exceeds {_largest(op.dtype)}"
    if op.nan and (fam == "matmul" or _base(op_type) in _REDUCTIONS):
        return (
            f"overflow in {shown}: {op.finite()}, but products or partial sums exceeded "
            f"{_largest(op.dtype)}, and +inf and -inf cancelled into NaN"
        )
    return f"{shown} produced {made} from finite inputs"


def _carried(
    op_type: str,
    fam: str,
    output: Health,
    inputs: list[Health | None],
    bad_inputs: list[Health],
    external: bool,
) -> str:
    """Why an op with an Inf or NaN among its inputs made Inf or NaN."""
    known = [c for c in inputs if c is not None]
    infs = _sum(bad_inputs)
    has_inf = bool(_n(infs.neg_inf) or _n(infs.pos_inf))
    if fam == "mul" and _n(output.nan) and has_inf and any(_n(c.zero) for c in known):
        return "0 * inf: an infinite input was multiplied by a zero, giving NaN"
    if _n(output.nan) and _cancelling_infinities(op_type, fam, inputs):
        return "inf - inf: infinities cancelled, giving NaN"
    if fam == "div" and _n(output.nan) and len(bad_inputs) == len(known) == 2:
        return "inf/inf: both the numerator and the divisor were infinite, giving NaN"
    if fam == "softmax" and _n(output.nan) and _n(infs.pos_inf) and not _n(infs.neg_inf):
        return "softmax of a row holding +inf gives NaN: subtracting the row's max makes inf - inf"
    if fam == "softmax" and _n(output.nan) and _n(infs.neg_inf):
        return "softmax of a row that is entirely -inf gives NaN: a sequence with no unmasked position (a fully masked row)"
    if external:
        return (
            f"{_made(infs)} was already in an input that no recorded op produced "
            "(the input data, a parameter, or a tensor made before recording started)"
        )
    return f"{_made(infs)} came in through an input (produced earlier)"


def explain_dropped(output: Health) -> str:
    """Why the earliest kept event of a lineage whose birth a circular buffer dropped holds
    Inf/NaN: its input's producer is among the dropped events (not outside the program)."""
    return (
        f"{_made(output)} came in through an input made by events the circular buffer dropped "
        "(the birth is among them)"
    )


def _op(op_type: str, fam: str, output: Health, inputs: list[Health | None]) -> _Op:
    """The op's operands: a ``_foreach_`` op's tensor lists each summed into one health."""
    short = short_name(op_type)
    # The name explanations cite: aten's own (addcdiv_), TensorFlow's op type (RealDiv,
    # Square), else the family (a JAX primitive's).
    name = short if op_type.startswith("aten.") or _is_tf_op(op_type) else fam
    if not short.startswith("_foreach_"):
        return _Op(op_type, fam, name, output, inputs, list(inputs), 0)
    overload = _overload(op_type)
    lists = 3 if fam in ("addcdiv", "addcmul") else 2 if overload == "List" else 1
    n = len(inputs) // lists
    if lists == 1 and overload in ("Scalar", "Tensor") and len(inputs) > 1:
        n = len(inputs) - 1  # the list, then one scalar (a Python number or a tensor)
    groups = [_combined(inputs[k * n : (k + 1) * n]) for k in range(lists)]
    return _Op(op_type, fam, name, output, inputs, groups + inputs[lists * n :], lists)


def _combined(group: list[Health | None]) -> Health | None:
    """One list argument's tensors together (``None`` if any is unknown)."""
    if not group or any(c is None for c in group):
        return None
    together = total([c for c in group if c is not None])
    return together if together.known else None


# -- the cases, by family --------------------------------------------------------------------


def _div(op: _Op) -> str | None:
    """div, true_divide, reciprocal: the divisor is input 1 (reciprocal's: input 0)."""
    if "reciprocal" in op.op_type.lower():
        num_k, div_k = -1, 0
    else:
        num_k, div_k = 0, 1
    divisor = op.arg(div_k)
    if divisor is None:
        return None
    if _n(divisor.zero):
        numerator = op.arg(num_k) if num_k >= 0 else None
        return _division(op, num_k, numerator, div_k, divisor, _eps_note(op.dtype, divisor))
    if divisor.zero == 0 and op.inf and not op.nan and op.arg(0) is not None:
        return (
            f"overflow in {op.name}: {op.finite()} and {op.label(div_k, 'divisor')} had no "
            f"zeros, but the quotient exceeds {_largest(op.dtype)}: a divisor near 0?"
        )
    return None


def _addcdiv(op: _Op) -> str | None:
    """addcdiv_(self, tensor1, tensor2, value): self + value * tensor1 / tensor2."""
    divisor = op.arg(2)
    note = _eps_note(op.dtype, divisor, adamw=True)
    if divisor is None:
        if op.arg(1) is None:
            return (
                f"division by zero in {op.name}, most likely: a zero in "
                f"{op.label(2, 'divisor')}; the inputs' values were not recorded{note}"
            )
        return None
    if _n(divisor.zero):
        return _division(op, 1, op.arg(1), 2, divisor, note)
    if divisor.zero == 0 and op.inf and not op.nan:
        return (
            f"overflow in {op.name}: {op.finite()} and {op.label(2, 'divisor')} had no zeros, "
            f"but value * tensor1 / tensor2 exceeds {_largest(op.dtype)}: a divisor near 0?"
        )
    return None


def _division(
    op: _Op, num_k: int, numerator: Health | None, div_k: int, divisor: Health, note: str
) -> str:
    """x/0 (+-inf) and 0/0 (NaN), citing the zeros of the divisor and of the numerator."""
    zeros = _plural(_n(divisor.zero), "zero")
    where = op.label(div_k, "divisor")
    # 0/0 needs a zero numerator: counted, or unknown (an in-place op's, overwritten).
    zero_over_zero = op.nan and num_k >= 0 and (numerator is None or bool(_n(numerator.zero)))
    if not zero_over_zero:
        return f"x/0 in {op.name}: {where} had {zeros}{note}"
    numerators = ""
    if numerator is not None:
        numerators = f", {op.label(num_k, 'numerator')} {_plural(_n(numerator.zero), 'zero')}"
    if op.inf:
        return (
            f"x/0 and 0/0 in {op.name}: {where} had {zeros}{numerators}; a nonzero over 0 "
            f"gives {_signed_inf(op.output)}, 0/0 gives NaN{note}"
        )
    return f"0/0 in {op.name}: zeros divided by zeros; {where} had {zeros}{numerators}{note}"


def _eps_note(dtype: str, divisor: Health | None, adamw: bool = False) -> str:
    """In float16 and bfloat16, a small eps added to a divisor can itself be 0."""
    if dtype not in _HALF and divisor is not None:
        dtype = divisor.dtype
    if dtype not in _HALF:
        return ""
    example = ", e.g. AdamW's eps=1e-8" if adamw and dtype == "float16" else ""
    return (
        f"; in {dtype} an eps below {_SMALLEST[dtype]} (the smallest {dtype}) rounds to 0{example}"
    )


def _addcmul(op: _Op) -> str | None:
    """addcmul_(self, tensor1, tensor2, value): self + value * tensor1 * tensor2."""
    if op.nan or not op.inf or op.arg(1) is None or op.arg(2) is None:
        return None
    return (
        f"overflow in {op.name}: {op.finite()}, but self + value * tensor1 * tensor2 exceeds "
        f"{_largest(op.dtype)}"
    )


def _exp(op: _Op) -> str | None:
    if op.nan or not op.inf or op.arg(0) is None:
        return None
    base = _base(op.op_type)
    above = {"exp": _EXP_ABOVE, "expm1": _EXP_ABOVE, "exp2": _EXP2_ABOVE}.get(base, {})
    where = f" for x above {above[op.dtype]}" if op.dtype in above else ""
    return (
        f"overflow in {op.name}: {op.finite()}, but {base}(x) exceeds {_largest(op.dtype)}{where}"
    )


def _pow(op: _Op) -> str | None:
    """pow(base, exponent); ``pow.Scalar`` (a number to tensor powers) records them swapped."""
    base_k, exp_k = (1, 0) if _overload(op.op_type) == "Scalar" else (0, 1)
    base, exponent = op.arg(base_k), op.arg(exp_k)
    if base is None:
        return None
    if op.inf and _n(base.zero) and (exponent is None or _n(exponent.neg)):
        power = "a negative exponent gives inf"
        if exponent is not None:
            power = f"{op.label(exp_k, 'exponent')} " + (
                "is negative"
                if exponent.size == 1
                else f"had {_plural(_n(exponent.neg), 'negative value')}"
            )
        zeros = _plural(_n(base.zero), "zero")
        return (
            f"0 to a negative power in {op.name}: {op.label(base_k, 'base')} had {zeros}, {power}"
        )
    if op.nan and _n(base.neg):
        negatives = _plural(_n(base.neg), "negative value")
        return (
            f"a negative number to a fractional power in {op.name} gives NaN: "
            f"{op.label(base_k, 'base')} had {negatives}"
        )
    return None  # overflow: the shared wording ("overflow in pow")


def _square(op: _Op) -> str | None:
    """square(x) = x * x, squared_difference(x, y) = (x - y)**2: only overflow makes Inf."""
    if op.nan or not op.inf or op.arg(0) is None:
        return None
    what = "(x - y)²" if "difference" in op.op_type.lower() else "x²"
    above = ""
    if op.dtype in _SQRT_LARGEST:
        above = (
            f", as it does for |{'x - y' if what != 'x²' else 'x'}| above {_SQRT_LARGEST[op.dtype]}"
        )
    return f"overflow in {op.name}: {op.finite()}, but {what} exceeds {_largest(op.dtype)}{above}"


def _div_no_nan(op: _Op) -> str | None:
    """DivNoNan(x, y): x / y, and 0 where y is 0: a zero divisor makes no Inf here."""
    if op.nan or not op.inf or op.arg(1) is None:
        return None
    return (
        f"overflow in {op.name}: {op.finite()} ({op.name} gives 0 where the divisor is 0), "
        f"but a quotient exceeds {_largest(op.dtype)}: a divisor near 0?"
    )


def _sqrt_grad(op: _Op) -> str | None:
    """SqrtGrad(y, dy) = dy * 0.5 / y, y being sqrt's output: the gradient of sqrt at 0."""
    y = op.arg(0)
    if y is None or not _n(y.zero):
        return None
    zeros = _plural(_n(y.zero), "zero")
    dy = op.arg(1)
    if op.nan and (dy is None or _n(dy.zero)):
        return (
            f"0/0 in {op.name}: the gradient of sqrt is dy * 0.5 / sqrt(x), and sqrt's output "
            f"(input 0) had {zeros} where the incoming gradient (input 1) was 0 too"
        )
    return (
        f"x/0 in {op.name}: the gradient of sqrt is dy * 0.5 / sqrt(x), infinite at x = 0: "
        f"sqrt's output (input 0) had {zeros}"
    )


def _norm(op: _Op) -> str | None:
    """linalg_vector_norm, norm, _foreach_norm: the 2-norm's sum of squares overflows."""
    if op.nan or not op.inf or op.arg(0) is None:
        return None
    if op.dtype == "float16":  # accumulated in float32: the norm itself overflows float16
        return f"overflow in {op.name}: {op.finite()}, but the norm exceeds {_largest(op.dtype)}"
    above = ""
    if op.dtype in _SQRT_LARGEST:
        above = f", as it does for a norm above {_SQRT_LARGEST[op.dtype]}"
    return (
        f"overflow in {op.name}: {op.finite()}, but the norm's sum of squares exceeds "
        f"{_largest(op.dtype)}{above}"
    )


def _layer_norm(op: _Op) -> str | None:
    """native_layer_norm(input, weight, bias, eps): outputs the result, the mean and rstd."""
    x = op.arg(0)
    # The eps, a Python number, is recorded last, after the tensors.
    eps = op.args[-1] if len(op.args) > 1 else None
    eps_zero = eps is not None and eps.size == 1 and _n(eps.zero) == 1
    zero_variance = (
        "a row whose values are all equal has variance 0, so rstd = 1/sqrt(var + eps) = inf "
        "and (x - mean) * rstd = 0 * inf = NaN"
    )
    if eps_zero and (op.nan or op.inf):
        k = len(op.args) - 1
        return f"{op.name} with eps=0 (input {k}): {zero_variance}{_all_zeros(x)}"
    if op.nan and _n(op.output.pos_inf) and x is not None:
        return f"zero variance in {op.name} with eps=0, most likely: {zero_variance}{_all_zeros(x)}"
    if x is None:
        return None
    if op.nan:
        acc = op.dtype and ("float64" if op.dtype == "float64" else "float32")
        return (
            f"overflow in {op.name}: {op.finite()}, but a row's mean or variance exceeds "
            f"{_largest(acc)}, which makes NaN"
        )
    return (
        f"overflow in {op.name}: {op.finite()}, but the normalised values times the weight, "
        f"plus the bias, exceed {_largest(op.dtype)}"
    )


def _all_zeros(x: Health | None) -> str:
    if x is not None and x.size and _n(x.zero) == x.size:
        return f" (the input's {_plural(x.size, 'value')} were all 0)"
    return ""


def _layer_norm_backward(op: _Op) -> str | None:
    """native_layer_norm_backward(grad_out, input, mean, rstd, weight, bias)."""
    if not (op.inf or op.nan) or op.arg(0) is None:
        return None
    cancelled = ", and +inf and -inf cancelled into NaN" if op.nan else ""
    return (
        f"overflow in {op.name}: {op.finite()}, but a gradient exceeds {_largest(op.dtype)}: "
        "grad_input is grad_out scaled by rstd (input 3), large for a row of near-equal values; "
        f"grad_weight and grad_bias sum over every row{cancelled}"
    )


def _cast(op: _Op) -> str | None:
    """_to_copy, copy_, Cast: a finite value beyond the target dtype's range becomes inf."""
    if op.nan or not op.inf:
        return None
    k, source = next(((k, c) for k, c in enumerate(op.args) if c is not None), (-1, None))
    if source is None:
        return None
    to, source_dtype = op.dtype, source.dtype
    if to and to == source_dtype:
        return None  # a copy within one dtype cannot overflow
    was = f"input {k} was {source_dtype}, finite" if source_dtype else f"input {k} was finite"
    if to not in _LARGEST:
        return (
            f"a cast to a narrower type overflowed: finite values became {_made(op.output)} ({was})"
        )
    return f"a cast to {to} overflowed: {_beyond(op.output, _LARGEST[to])} ({was})"


def _beyond(output: Health, limit: str) -> str:
    if not _n(output.neg_inf):
        return f"values above {limit} became inf"
    if not _n(output.pos_inf):
        return f"values below -{limit} became -inf"
    return f"values beyond ±{limit} became ±inf"


_HANDLERS: dict[str, Callable[[_Op], str | None]] = {
    "div": _div,
    "addcdiv": _addcdiv,
    "addcmul": _addcmul,
    "exp": _exp,
    "pow": _pow,
    "square": _square,
    "divnonan": _div_no_nan,
    "sqrt_grad": _sqrt_grad,
    "norm": _norm,
    "layer_norm": _layer_norm,
    "layer_norm_backward": _layer_norm_backward,
    "cast": _cast,
}


def _without_inputs(op: _Op, made: str) -> str:
    """What the output alone proves when the inputs' values were not recorded."""
    fam, output = op.fam, op.output
    unknown = "the input's values were not recorded"
    if fam == "log" and _n(output.neg_inf) and not _n(output.nan):
        return f"log of zero: log gives -inf only for an input of 0 ({unknown})"
    if fam in ("log", "sqrt") and _n(output.nan):
        return f"{fam} of a negative number (or of NaN) gives NaN ({unknown})"
    if fam == "div" and op.inf:
        return f"division by zero, most likely ({unknown})"
    if fam == "cast" and op.inf and not op.nan and op.dtype in _LARGEST:
        return (
            f"a cast to {op.dtype} overflowing, most likely "
            f"({_beyond(output, _LARGEST[op.dtype])}; {unknown})"
        )
    if output.known:
        return f"{fam} produced {made}; the inputs' values were not recorded"
    return f"{fam} produced Inf or NaN; this dump's mode records no counts"


def _largest(dtype: str) -> str:
    """``the largest float16 (65504)``."""
    if dtype in _LARGEST:
        return f"the largest {dtype} ({_LARGEST[dtype]})"
    return f"the largest {dtype}" if dtype else "its dtype's largest value"


def _signed_inf(c: Health) -> str:
    return "±inf" if _n(c.neg_inf) and _n(c.pos_inf) else "-inf" if _n(c.neg_inf) else "+inf"


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
