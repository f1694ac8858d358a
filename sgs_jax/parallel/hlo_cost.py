"""Per-execution cost of a compiled XLA program, read from its optimised HLO text.

XLA's own `cost_analysis()` visits every computation once, so a `while` loop's body (a
`lax.scan` over layers, the chunked log-prob `lax.map`, the windowed-einsum loops the TPU
compiler makes of FSDP matmuls, a decode chunk) counts as one iteration. Here the HLO is
walked from the entry computation with each loop body weighted by its trip count:

  flops        2 * (output elements) * (contracted elements) of every dot and convolution
  hbm_bytes    operands + results of every top-level op (a fusion is one op; a slice or a
               gather of a big operand counts what it takes; in-place updates count the
               update), excluding
               buffers the compiler placed in on-chip memory (layout `S(n)`, n > 0)
  collectives  result bytes and ring-algorithm link traffic per kind (all-gather,
               reduce-scatter, all-reduce, all-to-all, collective-permute)
  host_bytes   bytes moved between the device and host memory (layout `S(5)`: what the
               `offload` remat policy puts there): the slice a dynamic-slice reads from a
               host buffer, the update a dynamic-update-slice writes into one, and the
               host-side arrays of any other op (a copy to or from the host)
  kernels      Pallas kernels (custom calls) count the FLOPs and bytes they declare in
               their cost estimate; splash attention (which declares none) counts FLOPs
               from its shapes and block map (`_splash_flops`); other kernels without an
               estimate are counted in `unestimated_kernels`, their operands and results
               in `unestimated_kernel_bytes` (all of it: what the kernel reads is data)

Trip counts come from `known_trip_count` when XLA states it, else from the loop condition
`counter < constant` (with the counter's start and step read from the loop's operands and
body). A condition that also tests data (a decode chunk stopping when every row is done)
gives an upper bound, flagged `bounded`. Loops whose count cannot be read are counted once
and listed in `unknown_loops`. Pure text processing: no jax import.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable

COLLECTIVE_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
}
_SHAPE = re.compile(r"\b(" + "|".join(sorted(_DTYPE_BYTES, key=len, reverse=True)) + r")\[([0-9,]*)\](\{[^}]*\})?")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([^\s=]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%([^\s(]+)\s*\(")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9_-]*)\(")
_NO_TRAFFIC = {
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call", "conditional", "after-all",
    "partition-id", "replica-id", "opt-barrier", "async-start", "async-update", "async-done", "iota",
}


@dataclasses.dataclass
class Instruction:
    name: str
    type_text: str
    opcode: str
    operands: list[str]
    args: str  # the raw text between the opcode's parentheses (a constant's literal)
    attrs: str
    is_root: bool


@dataclasses.dataclass
class Computation:
    name: str
    instructions: dict[str, Instruction]
    root: str | None

    def type_of(self, name: str) -> str:
        ins = self.instructions.get(name)
        return ins.type_text if ins else ""


def _matching_paren(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return len(text) - 1


def _parse_instruction(line: str) -> Instruction | None:
    m = _INSTR.match(line)
    if not m:
        return None
    root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
    if rest.startswith("("):
        end = _matching_paren(rest, 0)
        type_text, rest = rest[: end + 1], rest[end + 1 :]
    else:
        type_text, _, rest = rest.partition(" ")
    op = _OPCODE.match(rest)
    if not op:
        return None
    open_at = rest.index("(", op.start(1))
    close_at = _matching_paren(rest, open_at)
    operands = re.findall(r"%([^\s,()]+)", rest[open_at:close_at])
    return Instruction(name, type_text, op.group(1), operands, rest[open_at + 1 : close_at], rest[close_at + 1 :], root)


def parse_hlo(text: str) -> tuple[dict[str, Computation], str]:
    """Computations of an HLO module's text, and the entry computation's name."""
    comps: dict[str, Computation] = {}
    entry = ""
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and line.rstrip().endswith("{"):
                current = Computation(m.group(2), {}, None)
                if m.group(1):
                    entry = current.name
            continue
        if line.strip() == "}":
            comps[current.name] = current
            current = None
            continue
        ins = _parse_instruction(line)
        if ins is not None:
            current.instructions[ins.name] = ins
            if ins.is_root:
                current.root = ins.name
    return comps, entry


def shapes(type_text: str) -> list[tuple[str, tuple[int, ...], int]]:
    """(dtype, dims, memory space) of every array in a type (tuples flattened)."""
    out = []
    for dtype, dims, layout in _SHAPE.findall(type_text):
        space = re.search(r"S\((\d+)\)", layout or "")
        out.append((dtype, tuple(int(d) for d in dims.split(",") if d), int(space.group(1)) if space else 0))
    return out


def type_bytes(type_text: str, hbm_only: bool = False) -> float:
    """Bytes of every array in `type_text` (only those in HBM, memory space 0, if asked)."""
    return sum(_DTYPE_BYTES[d] * math.prod(dims) for d, dims, space in shapes(type_text) if not (hbm_only and space))


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%([^\s,]+)", attrs)
    return m.group(1) if m else None


def _int_list(attrs: str, key: str) -> list[int]:
    m = re.search(rf"\b{key}=\{{([0-9,]*)\}}", attrs)
    return [int(x) for x in m.group(1).split(",") if x] if m else []


# ---- trip counts ---------------------------------------------------------------------------

_PASS_THROUGH = ("copy", "convert", "bitcast")


def _resolve(comps, comp: Computation, name: str, outer=None) -> tuple[str, int] | None:
    """("const", value) or ("index", k: get-tuple-element k of the loop state) for a scalar
    in a loop condition or body, through copies, converts and fused parameters. `outer` is
    (caller computation, fusion instruction, its outer) when `comp` is a fused computation."""
    ins = comp.instructions.get(name)
    if ins is None:
        return None
    if ins.opcode == "constant":
        m = re.fullmatch(r"\s*(-?\d+)\s*", ins.args)
        return ("const", int(m.group(1))) if m else None
    if ins.opcode in _PASS_THROUGH and ins.operands:
        return _resolve(comps, comp, ins.operands[0], outer)
    if ins.opcode == "parameter" and outer is not None:
        caller, fusion, caller_outer = outer
        index = int(ins.args) if ins.args.strip().isdigit() else -1
        if 0 <= index < len(fusion.operands):
            return _resolve(comps, caller, fusion.operands[index], caller_outer)
        return None
    if ins.opcode == "get-tuple-element" and ins.operands:
        src = comp.instructions.get(ins.operands[0])
        m = re.search(r"index=(\d+)", ins.attrs)
        if src is not None and src.opcode == "parameter" and outer is None and m:
            return ("index", int(m.group(1)))
    return None


def _bounds(comps, comp: Computation, name: str, outer=None) -> list[tuple[int, str, int]]:
    """(state index, direction, limit) of every `counter <op> constant` test that must hold
    for the condition value `name` to be true (through `and` and fusions)."""
    ins = comp.instructions.get(name)
    if ins is None:
        return []
    if ins.opcode == "and":
        return [b for op in ins.operands for b in _bounds(comps, comp, op, outer)]
    if ins.opcode == "fusion":
        called = comps.get(_attr(ins.attrs, "calls") or "")
        return _bounds(comps, called, called.root, (comp, ins, outer)) if called and called.root else []
    if ins.opcode != "compare" or len(ins.operands) != 2:
        return []
    direction = re.search(r"direction=(\w+)", ins.attrs)
    direction = direction.group(1) if direction else ""
    a, b = (_resolve(comps, comp, op, outer) for op in ins.operands)
    if a and b and a[0] == "const" and b[0] == "index":
        a, b = b, a
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    if a and b and a[0] == "index" and b[0] == "const":
        return [(a[1], direction, b[1])]
    return []


def _loop_start_and_step(caller: Computation, loop: Instruction, body: Computation, k: int, comps) -> tuple[int | None, int | None]:
    start = None
    init = caller.instructions.get(loop.operands[0]) if loop.operands else None
    if init is not None and init.opcode == "tuple" and k < len(init.operands):
        value = _resolve(comps, caller, init.operands[k])
        start = value[1] if value and value[0] == "const" else None
    step = None
    root = body.instructions.get(body.root or "")
    if root is not None and root.opcode == "tuple" and k < len(root.operands):
        upd = body.instructions.get(root.operands[k])
        if upd is not None and upd.opcode == "add" and len(upd.operands) == 2:
            x, y = (_resolve(comps, body, op) for op in upd.operands)
            if x == ("index", k) and y and y[0] == "const":
                step = y[1]
            elif y == ("index", k) and x and x[0] == "const":
                step = x[1]
    return start, step


@dataclasses.dataclass(frozen=True)
class Loop:
    """One while loop: its body, iterations per execution and how that was known."""

    body: str
    trips: int
    how: str  # "known_trip_count" | "counter" | "bounded" (an upper bound) | "unknown"


def trip_count(comps: dict[str, Computation], caller: Computation, loop: Instruction) -> Loop:
    body_name = _attr(loop.attrs, "body") or ""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attrs)
    if known:
        return Loop(body_name, int(known.group(1)), "known_trip_count")
    cond = comps.get(_attr(loop.attrs, "condition") or "")
    body = comps.get(body_name)
    if cond is None or body is None or cond.root is None:
        return Loop(body_name, 1, "unknown")
    counts = []
    root_ins = cond.instructions[cond.root]
    for k, direction, limit in _bounds(comps, cond, cond.root):
        start, step = _loop_start_and_step(caller, loop, body, k, comps)
        start = 0 if start is None else start
        step = 1 if step is None else step
        if step > 0 and direction in ("LT", "LE"):
            counts.append(max(0, math.ceil((limit - start + (direction == "LE")) / step)))
        elif step < 0 and direction in ("GT", "GE"):
            counts.append(max(0, math.ceil((start - limit + (direction == "GE")) / -step)))
    if not counts:
        return Loop(body_name, 1, "unknown")
    exact = root_ins.opcode == "compare" and len(counts) == 1
    return Loop(body_name, min(counts), "counter" if exact else "bounded")


# ---- costs ---------------------------------------------------------------------------------

def dot_flops(comp: Computation, ins: Instruction) -> float:
    """2 x output elements x contracted elements of a dot or convolution."""
    out = shapes(ins.type_text)
    if not out or not ins.operands:
        return 0.0
    out_elems = math.prod(out[0][1])
    if ins.opcode == "dot":
        lhs = shapes(comp.type_of(ins.operands[0]))
        if not lhs:
            return 0.0
        contracted = math.prod(lhs[0][1][i] for i in _int_list(ins.attrs, "lhs_contracting_dims"))
        return 2.0 * out_elems * contracted
    if ins.opcode == "convolution" and len(ins.operands) > 1:
        return _convolution_flops(comp, ins, out[0][1])
    return 0.0


def _window_pairs(in_size: int, out_size: int, size: int, stride: int, pad_lo: int, lhs_dilate: int, rhs_dilate: int) -> int:
    """(output position, kernel position) pairs of one spatial dimension that read a real
    input element (not padding or a dilation hole)."""
    dilated = (in_size - 1) * lhs_dilate + 1
    pairs = 0
    for k in range(size):
        offset = k * rhs_dilate - pad_lo  # input position = o * stride + offset
        if lhs_dilate == 1:
            first = max(0, -(offset // stride))  # ceil(-offset / stride)
            last = min(out_size - 1, (dilated - 1 - offset) // stride)
            pairs += max(0, last - first + 1)
        else:
            pairs += sum(1 for o in range(out_size) if 0 <= o * stride + offset < dilated and (o * stride + offset) % lhs_dilate == 0)
    return pairs


def _convolution_flops(comp: Computation, ins: Instruction, out_dims: tuple[int, ...]) -> float:
    """2 x multiply-adds that touch real inputs. XLA's TPU backend writes batched matmuls
    as convolutions whose window runs over a padded batch dimension, so padding and
    dilation must be excluded, not multiplied out."""
    lhs, rhs = shapes(comp.type_of(ins.operands[0])), shapes(comp.type_of(ins.operands[1]))
    labels = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", ins.attrs)
    if not lhs or not rhs or not labels:
        return 0.0
    lhs_l, rhs_l, out_l = labels.groups()
    lhs_dims, rhs_dims = lhs[0][1], rhs[0][1]
    window = re.search(r"window=\{([^}]*)\}", ins.attrs)
    fields = dict(re.findall(r"(\w+)=([0-9x_-]+)", window.group(1))) if window else {}

    def per_dim(key: str, default: int, count: int) -> list[str]:
        return fields[key].split("x") if key in fields else [str(default)] * count

    spatial = sorted(int(c) for c in out_l if c.isdigit())
    sizes = [int(x) for x in per_dim("size", 1, len(spatial))]
    strides = [int(x) for x in per_dim("stride", 1, len(spatial))]
    pads = [tuple(int(v) for v in x.split("_")) for x in per_dim("pad", 0, len(spatial))] if "pad" in fields else [(0, 0)] * len(spatial)
    lhs_dil = [int(x) for x in per_dim("lhs_dilate", 1, len(spatial))]
    rhs_dil = [int(x) for x in per_dim("rhs_dilate", 1, len(spatial))]
    pairs = 1
    for i, d in enumerate(spatial):
        pairs *= _window_pairs(lhs_dims[lhs_l.index(str(d))], out_dims[out_l.index(str(d))], sizes[i], strides[i], pads[i][0], lhs_dil[i], rhs_dil[i])
    return 2.0 * out_dims[out_l.index("b")] * out_dims[out_l.index("f")] * rhs_dims[rhs_l.index("i")] * pairs


def _group_size(attrs: str, num_devices: int) -> int:
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if mesh:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'([^']+)'", mesh.group(2)) if a in sizes) or 1
    iota = re.search(r"replica_groups=\[([0-9,]+)\]<=", attrs)
    if iota:
        return int(iota.group(1).split(",")[-1])
    listed = re.search(r"replica_groups=\{\{([0-9,]*)\}", attrs)
    if listed:
        return len([x for x in listed.group(1).split(",") if x])
    return num_devices


def _link_traffic(kind: str, result_bytes: float, n: int) -> float:
    """Bytes a device sends over its links for one collective (ring algorithms)."""
    if n <= 1:
        return 0.0
    if kind == "all-gather" or kind == "all-to-all":
        return result_bytes * (n - 1) / n
    if kind == "reduce-scatter":
        return result_bytes * (n - 1)
    if kind == "all-reduce":
        return 2.0 * result_bytes * (n - 1) / n
    return result_bytes  # collective-permute: one send


def _collective_kind(opcode: str) -> str | None:
    base = opcode[: -len("-done")] if opcode.endswith("-done") else opcode
    return base if base in COLLECTIVE_KINDS else None


# Ops that update operand 0 in place: only the update (operand k) is read and written.
_IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}


def _operand_traffic(comps, comp: Computation, ins: Instruction) -> float:
    """HBM bytes a top-level op reads and writes (see the module docstring)."""
    if ins.opcode == "dynamic-slice" or ins.opcode == "slice":
        return 2 * type_bytes(ins.type_text, True)
    if ins.opcode == "gather" and len(ins.operands) > 1:  # the rows taken, twice, and the indices
        return 2 * type_bytes(ins.type_text, True) + type_bytes(comp.type_of(ins.operands[1]), True)
    if ins.opcode in _IN_PLACE and len(ins.operands) > _IN_PLACE[ins.opcode]:
        return 2 * type_bytes(comp.type_of(ins.operands[_IN_PLACE[ins.opcode]]), True)
    if ins.opcode == "fusion":
        fused = comps.get(_attr(ins.attrs, "calls") or "")
        if fused is not None:
            return _fusion_traffic(comps, fused, ins, comp)
    total = type_bytes(ins.type_text, True) if not ins.opcode.endswith("-start") else 0.0
    return total + sum(type_bytes(comp.type_of(op), True) for op in ins.operands)


HOST_MEMORY_SPACE = 5  # XLA's memory space of host (pinned) memory on TPU and GPU


def _host_array_bytes(type_text: str) -> float:
    return sum(_DTYPE_BYTES[d] * math.prod(dims) for d, dims, space in shapes(type_text) if space == HOST_MEMORY_SPACE)


def _host_traffic(comp: Computation, ins: Instruction) -> float:
    """Bytes a top-level op moves between the device and host memory (0 for most ops)."""
    if ins.opcode == "custom-call" and 'custom_call_target="AllocateBuffer"' in ins.attrs:
        return 0.0  # reserves the host buffer, moves nothing
    operand_types = [comp.type_of(op) for op in ins.operands]
    if not (_host_array_bytes(ins.type_text) or any(map(_host_array_bytes, operand_types))):
        return 0.0
    base = ins.opcode.removesuffix("-start")
    if base == "dynamic-update-slice" and len(operand_types) > 1:  # the update goes to the host
        return type_bytes(operand_types[1])
    if base == "dynamic-slice":  # the slice comes from the host: the result ([0] of the
        # async form's (operands, result, context) tuple is the operands)
        arrays = shapes(ins.type_text)
        taken = arrays[len(ins.operands)] if ins.opcode.endswith("-start") else arrays[0]
        return _DTYPE_BYTES[taken[0]] * math.prod(taken[1])
    if ins.opcode.endswith("-start"):  # (destination, source, context): the host-side one of the pair
        return _host_array_bytes(ins.type_text)
    return _host_array_bytes(ins.type_text) + sum(map(_host_array_bytes, operand_types))


def _users(comp: Computation) -> dict[str, list[Instruction]]:
    users: dict[str, list[Instruction]] = {}
    for x in comp.instructions.values():
        for op in x.operands:
            users.setdefault(op, []).append(x)
    return users


def _params(comp: Computation) -> dict[str, int]:
    return {p.name: int(p.args) for p in comp.instructions.values() if p.opcode == "parameter" and p.args.strip().isdigit()}


def _taken_bytes(comps, comp: Computation, name: str, depth: int = 0) -> float | None:
    """Bytes of `name` (a parameter of fused computation `comp`) its users take when every
    use is a slice, a dynamic slice or a gather of it, or a nested fusion whose parameter is
    used so (a scanned layer's weight sliced inside an inner fusion); None when some use
    reads it whole."""
    uses = _users(comp).get(name, [])
    if not uses or depth > 4:
        return None
    total = 0.0
    for u in uses:
        if u.opcode in ("dynamic-slice", "slice") or (u.opcode == "gather" and u.operands[:1] == [name]):
            total += type_bytes(u.type_text, True)
            continue
        inner = comps.get(_attr(u.attrs, "calls") or "") if u.opcode == "fusion" else None
        if inner is None:
            return None
        slots = {i for i, op in enumerate(u.operands) if op == name}
        taken = [_taken_bytes(comps, inner, p, depth + 1) for p, i in _params(inner).items() if i in slots]
        if not taken or any(t is None for t in taken):
            return None
        total += sum(taken)
    return total


def _fusion_traffic(comps, fused: Computation, ins: Instruction, caller: Computation) -> float:
    params = _params(fused)
    users = _users(fused)
    root = fused.instructions.get(fused.root or "")
    in_place = root is not None and root.opcode in _IN_PLACE and len(root.operands) > _IN_PLACE[root.opcode]
    total = 0.0
    for pname, index in params.items():
        if index < 0 or index >= len(ins.operands):
            continue
        full = type_bytes(caller.type_of(ins.operands[index]), True)
        uses = users.get(pname, [])
        taken = _taken_bytes(comps, fused, pname)
        if taken is not None:
            total += min(full, taken)
        elif in_place and uses == [root] and root.operands and root.operands[0] == pname:
            continue  # the buffer updated in place is not read
        else:
            total += full
    if in_place:
        total += type_bytes(fused.type_of(root.operands[_IN_PLACE[root.opcode]]), True)
    else:
        total += type_bytes(ins.type_text, True)
    return total


@dataclasses.dataclass
class HloCost:
    """Per-execution figures of one program on one device (see the module docstring)."""

    flops: float = 0.0
    hbm_bytes: float = 0.0
    collective_bytes: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(COLLECTIVE_KINDS, 0.0))
    collective_counts: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(COLLECTIVE_KINDS, 0.0))
    link_bytes: float = 0.0
    loops: list[Loop] = dataclasses.field(default_factory=list)
    largest_collectives: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)  # (bytes, kind, op name)
    custom_calls: dict[str, float] = dataclasses.field(default_factory=dict)  # target -> executions
    unestimated_kernels: float = 0.0  # Pallas kernel executions without a cost estimate (FLOPs not counted)
    unestimated_kernel_bytes: float = 0.0  # their operand + result bytes (in hbm_bytes: an upper bound of their traffic)
    modelled_kernels: float = 0.0  # splash-attention kernel executions whose FLOPs come from their shapes
    host_bytes: float = 0.0  # device <-> host memory traffic, both directions (see the module docstring)

    @property
    def unknown_loops(self) -> list[Loop]:
        return [loop for loop in self.loops if loop.how == "unknown"]

    def to_json(self) -> dict:
        return {
            "flops": self.flops,
            "hbm_bytes": self.hbm_bytes,
            "collective_bytes": dict(self.collective_bytes),
            "collective_counts": dict(self.collective_counts),
            "link_bytes": self.link_bytes,
            "loops": [dataclasses.asdict(loop) for loop in self.loops],
            "custom_calls": dict(self.custom_calls),
            "unestimated_kernels": self.unestimated_kernels,
            "unestimated_kernel_bytes": self.unestimated_kernel_bytes,
            "modelled_kernels": self.modelled_kernels,
            "host_bytes": self.host_bytes,
        }


def analyze_hlo(text: str, num_devices: int, keep_largest: int = 8) -> HloCost:
    """Walk the entry computation of `text` (optimised HLO of one SPMD program, the
    per-device view) and return its trip-count-weighted costs."""
    comps, entry = parse_hlo(text)
    cost = HloCost()
    if entry not in comps:
        raise ValueError("no ENTRY computation in the HLO text")
    largest: list[tuple[float, str, str]] = []

    def visit(comp: Computation, weight: float, fused: bool, seen: tuple[str, ...]) -> None:
        if comp.name in seen:  # recursion guard; HLO has no recursion
            return
        seen = seen + (comp.name,)
        for ins in comp.instructions.values():
            op = ins.opcode
            if op in ("dot", "convolution"):
                cost.flops += weight * dot_flops(comp, ins)
            kind = _collective_kind(op)
            is_async_start = op.endswith("-start")
            if kind and not is_async_start:
                size = type_bytes(ins.type_text)
                n = _group_size(ins.attrs if not op.endswith("-done") else _start_attrs(comp, ins), num_devices)
                cost.collective_bytes[kind] += weight * size
                cost.collective_counts[kind] += weight
                cost.link_bytes += weight * _link_traffic(kind, size, n)
                largest.append((size, kind, ins.name))
            estimate, modelled = None, None
            if op == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', ins.attrs)
                name = target.group(1) if target else "?"
                cost.custom_calls[name] = cost.custom_calls.get(name, 0) + weight
                estimate = _kernel_estimate(ins.attrs)
                if estimate is None and name == "tpu_custom_call":
                    modelled = _splash_flops(comp, ins)
                    if modelled is not None:
                        cost.flops += weight * modelled
                        cost.modelled_kernels += weight
                    else:
                        cost.unestimated_kernels += weight
                elif estimate is not None:
                    cost.flops += weight * estimate[0]
            if not fused and op not in _NO_TRAFFIC and not op.endswith("-done"):
                traffic = estimate[1] if estimate is not None else _operand_traffic(comps, comp, ins)
                cost.hbm_bytes += weight * traffic
                if op == "custom-call" and estimate is None and name == "tpu_custom_call" and not modelled:
                    cost.unestimated_kernel_bytes += weight * traffic
                cost.host_bytes += weight * _host_traffic(comp, ins)
            if op == "while":
                loop = trip_count(comps, comp, ins)
                cost.loops.append(loop)
                body = comps.get(loop.body)
                if body is not None:
                    visit(body, weight * loop.trips, fused, seen)
            elif op == "fusion":
                called = comps.get(_attr(ins.attrs, "calls") or "")
                if called is not None:
                    visit(called, weight, True, seen)
            elif op in ("call", "async-start"):
                called = comps.get(_attr(ins.attrs, "to_apply") or _attr(ins.attrs, "calls") or "")
                if called is not None:
                    visit(called, weight, fused, seen)
            elif op == "conditional":
                for branch in _branches(ins.attrs):
                    if branch in comps:  # every branch counted: an upper bound
                        visit(comps[branch], weight, fused, seen)

    def _start_attrs(comp: Computation, done: Instruction) -> str:
        start = comp.instructions.get(done.operands[0]) if done.operands else None
        return start.attrs if start is not None else done.attrs

    visit(comps[entry], 1.0, False, ())
    cost.largest_collectives = sorted(largest, reverse=True)[:keep_largest]
    return cost


def _kernel_estimate(attrs: str) -> tuple[float, float] | None:
    """(flops, bytes accessed) a Pallas kernel declares (`pl.CostEstimate`), if any."""
    text = attrs.replace('\\"', '"')
    flops = re.search(r'"cost_estimate"\s*:\s*\{[^}]*"flops"\s*:\s*"?(\d+)', text)
    if not flops:
        return None
    accessed = re.search(r'"cost_estimate"\s*:\s*\{[^}]*"bytes_accessed"\s*:\s*"?(\d+)', text)
    return float(flops.group(1)), float(accessed.group(1)) if accessed else 0.0


# Matmuls of T x S x D per (batch, head) in each splash-attention kernel: the forward makes
# S = QK^T and O = PV; the dkv kernel recomputes S, then dP = dO V^T, dV = P^T dO and
# dK = dS^T Q, and in its fused form (with a dq-partials output) dQ = dS K as well; the dq
# kernel recomputes S, dP and makes dQ.
_SPLASH_MATMULS = {"splash_mha_fwd": 2, "splash_mha_dkv": 4, "splash_mha_dq": 3}


def _splash_flops(comp: Computation, ins: Instruction) -> float | None:
    """FLOPs of a Pallas splash-attention call (it declares no cost estimate), from its
    shapes: 2 T S D per matmul per (batch, head), times the fraction of (query block, key
    block) pairs it computes."""
    kind = next((k for k in _SPLASH_MATMULS if ins.name.startswith(k)), None)
    if kind is None:
        return None
    arrays = [(op, shapes(comp.type_of(op))) for op in ins.operands]
    floats = [sh[0][1] for _, sh in arrays if sh and sh[0][0] in ("bf16", "f32", "f16") and len(sh[0][1]) >= 3]
    if len(floats) < 2:
        return None
    q, k = floats[0], floats[1]
    batch_heads, t, d = math.prod(q[:-2]), q[-2], q[-1]
    matmuls = _SPLASH_MATMULS[kind]
    if kind == "splash_mha_dkv" and any(len(dims) == len(q) + 1 for _, dims, _ in shapes(ins.type_text)):
        matmuls += 1  # fused backward: dq partials too
    # The block maps are int8 [1, nq, nk] operands. Large ones are elided from the text, so
    # a square map is taken as causal (nq (nq + 1) / 2 of nq^2 blocks run: the mask the
    # project builds); other maps as full.
    maps = [sh[0][1] for _, sh in arrays if sh and sh[0][0] == "s8" and len(sh[0][1]) == 3]
    density = (maps[0][1] + 1) / (2 * maps[0][1]) if maps and maps[0][1] == maps[0][2] else 1.0
    return 2.0 * matmuls * batch_heads * t * k[-2] * d * density


def _branches(attrs: str) -> Iterable[str]:
    m = re.search(r"branch_computations=\{([^}]*)\}", attrs)
    if m:
        return re.findall(r"%([^\s,]+)", m.group(1))
    return [x for x in (_attr(attrs, "true_computation"), _attr(attrs, "false_computation")) if x]

