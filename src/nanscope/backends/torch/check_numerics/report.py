"""How check_numerics' errors read: the user's frame and source line, the tensors
described, and the text of :class:`~nanscope.NonFiniteError`."""

from __future__ import annotations

from types import CodeType, FrameType

import torch
from torch.utils._python_dispatch import _disable_current_modes

from nanscope._paths import is_library_file, is_nanscope_file
from nanscope.backends.torch.check_numerics.records import Lineage, OpContext, Wrote
from nanscope.backends.torch.summaries import FLOAT_DTYPES, tensor_counts
from nanscope.errors import Birth, Frame, NonFiniteError

# -- the user's frame and source line ---------------------------------------------------------

_USER_CODE: dict[CodeType, bool] = {}


def is_user_code(code: CodeType) -> bool:
    """Whether code is the user's own (not a library's, not nanscope's); remembered."""
    known = _USER_CODE
    user = known.get(code)
    if user is None:
        if len(known) > 1 << 16:
            known.clear()
        path = code.co_filename
        user = known[code] = not is_library_file(path) and not is_nanscope_file(path)
    return user


def user_frame(frame: FrameType | None) -> Frame | None:
    """The innermost frame of the user's own code (not a library, not nanscope)."""
    f = frame
    while f is not None:
        code = f.f_code
        if is_user_code(code):
            return (code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return None


def source_line(frame: Frame | None) -> str:
    """The line of source a frame is at, stripped (empty if it cannot be read)."""
    if frame is None:
        return ""
    try:
        with open(frame[0], encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh, 1):
                if i == frame[1]:
                    return line.strip()
    except OSError:
        pass
    return ""


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu() if t.device.type != "cpu" else t


def describe_tensor(t: torch.Tensor) -> str:
    """``float32[4x8] on cpu: 2 NaN; 10 negative, 0 zero, 20 positive``."""
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    head = f"{str(t.dtype).replace('torch.', '')}[{shape}] on {t.device}"
    if t.dtype not in FLOAT_DTYPES:
        return head
    ni, pi, nn, neg, zero, pos = tensor_counts(_host(t))
    nonfinite = _counted(ni, pi, nn)
    finite = f"{neg} negative, {zero} zero, {pos} positive"
    return f"{head}: {nonfinite + '; ' if nonfinite else ''}{finite}"


def nonfinite_counts(t: torch.Tensor) -> tuple[int, int, int]:
    """``(-inf, +inf, NaN)`` counts of a tensor's elements."""
    ni, pi, nn, _, _, _ = tensor_counts(_host(t))
    return ni, pi, nn


def _kinds(ni: int, pi: int, nn: int) -> list[str]:
    return [k for n, k in ((ni, "-inf"), (pi, "+inf"), (nn, "NaN")) if n]


def _counted(ni: int, pi: int, nn: int) -> str:
    """``2 -inf, 1 NaN``."""
    return ", ".join(f"{n} {k}" for n, k in ((ni, "-inf"), (pi, "+inf"), (nn, "NaN")) if n)


# -- the error -------------------------------------------------------------------------------

_WHY = {
    "loss": "backward() was called on it: the loss is not finite",
    "parameter": "it wrote them into a parameter",
    "optimizer state": "it wrote them into the optimizer's state",
    "unchecked scaled gradient": (
        "in a backward scaled by GradScaler, whose inf check found no Inf/NaN that iteration"
    ),
    "unread at the end": "no op read them before checking ended",
}


def non_finite_error(
    op: str,
    index: int,
    t: torch.Tensor | None,
    inputs: list[str],
    ctx: OpContext,
    reason: str,
    lineages: tuple[Lineage, ...],
    wrote: Wrote,
    late: int,
    call: Frame | None = None,
) -> NonFiniteError:
    """The error about ``op``'s output ``index`` (``t`` if still held), for ``reason``.

    ``op`` is empty for Inf/NaN that no checked op wrote; ``late`` counts the ops run
    since (on a device); ``call`` is where ``backward()`` was called.
    """
    module_path, phase, step, source, forward = ctx.where
    if t is not None:
        host = _host(t)
        ni, pi, nn = nonfinite_counts(host)
        size = int(t.numel())
        output = f"  output {index}: {describe_tensor(host)}"
    else:
        ni, pi, nn, size = wrote.counts or (0, 0, 0, 0)
        output = f"  output {index} ({wrote.dtype}) as written: {_counted(ni, pi, nn) or 'Inf/NaN'}"
    where = f"{phase.name.lower()} pass, step {step}" + (
        f", module {module_path}" if module_path else ""
    )
    kinds = " and ".join(_kinds(ni, pi, nn)) or "Inf/NaN"
    if op:
        lines = [f"{op} produced {kinds} in output {index} ({where})"]
    else:
        lines = [f"a tensor that no checked op wrote holds {kinds} ({where})"]
    why = _WHY.get(reason)
    if why:
        lines.append(f"  {why}")
    if call is not None and reason == "loss":
        lines.append(f"  backward() called at {call[0]}:{call[1]} in {call[2]}")
    if op:
        lines.append(output)
        lines += inputs
    lines += _at(source, forward)
    if late:
        lines.append(f"  (found on the device {late} ops later)")
    birth = lineages[0]
    if birth.birth is not wrote or (birth.entered and op):
        lines += _born(birth)
    for other in lineages[1:3]:
        born = _born(other, inputs=False)
        lines += [f"  also carrying {born[0].strip()}", *born[1:]]
    forward_op, forward_source = forward if forward is not None else ("", None)
    return NonFiniteError(
        "\n".join(lines),
        op_type=op,
        module_path=module_path,
        phase=phase.name.lower(),
        step=step,
        counts={"neg_inf": ni, "pos_inf": pi, "nan": nn, "size": size},
        source=source,
        forward_op=forward_op,
        forward_source=forward_source,
        reason=reason,
        birth=_birth_of(birth),
    )


def describe_inputs(wrote: Wrote) -> list[str]:
    """One line per input of the op that wrote Inf/NaN, as the inputs are now."""
    lines = []
    for i, (ref, version) in enumerate(wrote.inputs):
        x = ref()
        if x is None:
            lines.append(f"  input {i}: no longer held")
            continue
        with _disable_current_modes():
            text = describe_tensor(x)
        changed = " (written since)" if x._version != version else ""
        lines.append(f"  input {i}: {text}{changed}")
    if wrote.more_inputs:
        lines.append(f"  ({wrote.more_inputs} more inputs)")
    return lines


def _at(source: Frame | None, forward: tuple[str, Frame | None] | None) -> list[str]:
    lines = []
    if source is not None:
        lines.append(f"  at {source[0]}:{source[1]} in {source[2]}")
        code = source_line(source)
        if code:
            lines.append(f"      {code}")
    forward_op, forward_source = forward if forward is not None else ("", None)
    if forward_op:
        created = (
            f", created at {forward_source[0]}:{forward_source[1]} in {forward_source[2]}"
            if forward_source
            else ""
        )
        lines.append(f"  backward of {forward_op}{created}")
        code = source_line(forward_source)
        if code:
            lines.append(f"      {code}")
    return lines


def _born(lineage: Lineage, inputs: bool = True) -> list[str]:
    """``born at <op> (<module>) <file>:<line> in step N, <phase> pass: <counts>``."""
    b = lineage.birth
    module_path, phase, step, source, forward = b.ctx.where
    ni, pi, nn, size = b.counts or (0, 0, 0, 0)
    what = f"{_counted(ni, pi, nn)} of {size} {b.dtype}".strip()
    head = f"  born at {b.op or 'a tensor no checked op wrote'}"
    if module_path:
        head += f" ({module_path})"
    if source is not None:
        head += f" {source[0]}:{source[1]}"
    head += f" in step {step}, {phase.name.lower()} pass: {what}"
    lines = [head]
    code = source_line(source)
    if code:
        lines.append(f"      {code}")
    if forward is not None and forward[0]:
        fs = forward[1]
        lines.append(
            f"    backward of {forward[0]}" + (f", created at {fs[0]}:{fs[1]}" if fs else "")
        )
    if lineage.entered and b.op:
        lines.append("    (its inputs already held Inf/NaN that no checked op had made)")
    if inputs:
        lines += ["  " + line for line in describe_inputs(b)]
    return lines


def _birth_of(lineage: Lineage) -> Birth:
    b = lineage.birth
    module_path, phase, step, source, forward = b.ctx.where
    ni, pi, nn, size = b.counts or (0, 0, 0, 0)
    return Birth(
        op_type=b.op,
        module_path=module_path,
        phase=phase.name.lower(),
        step=step,
        counts={"neg_inf": ni, "pos_inf": pi, "nan": nn, "size": size},
        source=source,
        forward_op=forward[0] if forward is not None else "",
        forward_source=forward[1] if forward is not None else None,
        entered=lineage.entered,
    )
