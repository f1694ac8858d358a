"""Ahead-of-time compilation for a device you do not have: topologies, chips, reports.

`topology("v5p:2x2x2")` gives compile-only TPU devices from libtpu (no TPU needed, the
`tpu` extra of setup.py); `topology("cpu:8")` gives 8 simulated CPU devices (set
`--xla_force_host_platform_device_count` before jax starts); `h100:8` / `h200:8` compile
with XLA:CPU on 8 simulated devices as a stand-in (this machine has no CUDA compiler) and
take the GPU's figures for the roofline. `report(compiled, ...)` turns one compiled program
into per-device memory, trip-count-weighted FLOPs / HBM bytes / collective bytes
(`hlo_cost`), a roofline time and whether it fits in HBM.

The roofline is max(compute, HBM, ICI, host) with each term at its peak rate: a lower bound
on the step time that assumes perfect overlap. ICI traffic is the ring-algorithm bytes a
device sends, over the chip's whole bidirectional ICI bandwidth (all links busy). Host
traffic (what `offload` remat keeps in host memory, out and back) is both directions
summed over one direction's PCIe bandwidth: an upper bound of its time.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Sequence

import jax

from sgs_jax.parallel.hlo_cost import COLLECTIVE_KINDS, HloCost, analyze_hlo

GIB = float(1 << 30)


@dataclasses.dataclass(frozen=True)
class Chip:
    """Per-chip peak figures (dense bf16 FLOP/s, bytes, bytes/s) and where they come from.

    usable_hbm: what the compiler may use per device (libtpu 0.0.42 states it in its
    out-of-memory message; for GPUs 95% of HBM, which needs XLA_PYTHON_CLIENT_MEM_FRACTION=0.95:
    JAX preallocates 75% by default).
    devices_per_chip: JAX devices per chip in the deviceless topology (v4: one per
    TensorCore), so per-device figures are the chip's divided by it.
    """

    name: str
    peak_flops: float
    hbm_bytes: float
    usable_hbm: float
    hbm_bandwidth: float
    ici_bandwidth: float
    host_bandwidth: float  # host <-> device (PCIe), one direction
    source: str
    devices_per_chip: int = 1

    @property
    def device_flops(self) -> float:
        return self.peak_flops / self.devices_per_chip

    @property
    def device_hbm_bandwidth(self) -> float:
        return self.hbm_bandwidth / self.devices_per_chip

    @property
    def device_ici_bandwidth(self) -> float:
        return self.ici_bandwidth / self.devices_per_chip

    @property
    def device_host_bandwidth(self) -> float:
        return self.host_bandwidth / self.devices_per_chip


# TPU host links: the low end of the 16-32 GB/s PCIe range per chip that
# jax-ml.github.io/scaling-book gives (it uses 1.5e10 B/s for v6e), for every generation.
_TPU_PCIE = 15e9


CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 32 * GIB, 15.25 * GIB, 1200e9, 540e9, _TPU_PCIE,
               "cloud.google.com/tpu/docs/v4 (275 TFLOP/s, 32 GiB, 1200 GB/s); ICI: 6 links x 2 x 45 GB/s "
               "(jax-ml.github.io/scaling-book); libtpu presents 2 devices (TensorCores) per chip", devices_per_chip=2),
    "v5e": Chip("TPU v5e", 197e12, 16 * GIB, 15.75 * GIB, 819e9, 400e9, _TPU_PCIE,
                "cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, 400 GB/s bidirectional ICI)"),
    "v5p": Chip("TPU v5p", 459e12, 95 * GIB, 95.74 * GIB, 2765e9, 1200e9, _TPU_PCIE,
                "cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GB/s, 1200 GB/s bidirectional ICI)"),
    "v6e": Chip("TPU v6e", 918e12, 32 * GIB, 31.25 * GIB, 1638e9, 800e9, _TPU_PCIE,
                "cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 32 GB at 1638 GB/s, 800 GB/s bidirectional ICI)"),
    "h100": Chip("NVIDIA H100 SXM", 989e12, 80e9, 76e9, 3.35e12, 900e9, 64e9,
                 "nvidia.com/en-us/data-center/h100 (989 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s; PCIe Gen5 x16, 128 GB/s both ways)"),
    "h200": Chip("NVIDIA H200 SXM", 989e12, 141e9, 134e9, 4.8e12, 900e9, 64e9,
                 "nvidia.com/en-us/data-center/h200 (989 TFLOP/s dense bf16, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s; PCIe Gen5 x16, 128 GB/s both ways)"),
}
_TPU_KINDS = ("v4", "v5e", "v5p", "v6e")
_CPU_STANDINS = ("cpu", "h100", "h200")


@dataclasses.dataclass(frozen=True)
class Topology:
    """Devices to compile for and the chip whose figures the roofline uses.

    name: as given ("v5p:2x2x2"); platform: "tpu" (compile-only libtpu devices) or "cpu"
    (simulated host devices: memory and FLOPs are XLA:CPU's); num_slices > 1 for multi-slice.
    """

    name: str
    platform: str
    chip: Chip
    devices: tuple
    num_slices: int = 1

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def budget_bytes(self) -> float:
        """HBM a program may use per device."""
        return self.chip.usable_hbm


def parse_topology(name: str) -> tuple[str, str, int]:
    """'KIND:SHAPE' -> (kind, shape, device count); KIND in v4 v5e v5p v6e cpu h100 h200."""
    kind, sep, shape = name.partition(":")
    kind = kind.lower()
    if not sep or kind not in _TPU_KINDS + _CPU_STANDINS:
        raise ValueError(f"topology {name!r}: expected KIND:SHAPE with KIND one of {_TPU_KINDS + _CPU_STANDINS}, e.g. v5p:2x2x2 or cpu:8")
    try:
        dims = [int(x) for x in shape.lower().split("x")]
    except ValueError:
        raise ValueError(f"topology {name!r}: shape must be like 2x2x2 (TPU chips) or 8 (devices)") from None
    if not dims or min(dims) < 1:
        raise ValueError(f"topology {name!r}: every dimension must be positive")
    count = math.prod(dims) * (CHIPS[kind].devices_per_chip if kind in _TPU_KINDS else 1)
    return kind, shape, count


def topology(name: str, num_slices: int = 1, chip: str | None = None) -> Topology:
    """Compile-only devices for `name` (see the module docstring); `chip` overrides the
    roofline figures (e.g. a cpu:8 plan read as H200s)."""
    kind, shape, count = parse_topology(name)
    if num_slices < 1:
        raise ValueError(f"num_slices must be >= 1, got {num_slices}")
    figures = CHIPS[chip or ("h200" if kind == "cpu" else kind)]
    if kind in _TPU_KINDS:
        # Compile-only: no TPU is opened, so another process's libtpu lock does not matter,
        # and there is no metadata server to ask.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
        from jax.experimental import topologies

        kwargs = {"num_slices": num_slices} if num_slices > 1 else {}
        try:
            devices = topologies.get_topology_desc(topology_name=f"{kind}:{shape}", platform="tpu", **kwargs).devices
        except (ImportError, RuntimeError) as err:
            raise RuntimeError(f"cannot make TPU topology {name!r} (is libtpu installed? pip install -e '.[tpu]'): {err}") from err
        return Topology(name, "tpu", figures, tuple(devices), num_slices)
    if num_slices > 1:
        raise ValueError("multi-slice plans need a TPU topology")
    cpus = jax.devices("cpu")
    if len(cpus) < count:
        raise RuntimeError(
            f"topology {name!r} needs {count} CPU devices, jax has {len(cpus)}: start python with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count} (sgs-plan sets it itself)"
        )
    return Topology(name, "cpu", figures, tuple(cpus[:count]))


@dataclasses.dataclass(frozen=True)
class ProgramReport:
    """One compiled program's per-device figures (bytes, FLOPs, seconds).

    flops / hbm_bytes / collective_bytes: per execution with loop bodies times their trip
    counts (`hlo_cost`); xla_flops / xla_bytes: XLA's cost model, loop bodies once.
    per: what one execution is ("micro-batch of 8 x 8192 tokens", "16 decode steps").
    compile_s / compile_cpu_s: wall-clock and CPU seconds (all threads of this process) of
    the compile; on a shared host the CPU figure is the steadier one.
    tokens: tokens the execution processes (all devices together); 0 where not meaningful.
    useful_flops: model FLOPs of the work per device (6 N tokens for training, 2 N tokens
    for inference), for MFU; 0 where not meaningful.
    """

    name: str
    topology: str
    chip: str
    platform: str
    num_devices: int
    mesh: dict[str, int]
    per: str
    compile_s: float
    compile_cpu_s: float
    argument_bytes: float
    output_bytes: float
    alias_bytes: float
    temp_bytes: float
    code_bytes: float
    peak_bytes: float
    budget_bytes: float
    flops: float
    hbm_bytes: float
    collective_bytes: dict[str, float]
    link_bytes: float
    xla_flops: float
    xla_bytes: float
    compute_s: float
    memory_s: float
    ici_s: float
    tokens: float
    useful_flops: float
    loops: tuple[tuple[int, str, int], ...]  # (trip count, how it was found, how many loops)
    custom_calls: dict[str, int]
    notes: tuple[str, ...] = ()
    unestimated_kernel_bytes: float = 0.0  # of hbm_bytes: operands + results of kernels without a cost estimate
    host_bytes: float = 0.0  # device <-> host memory traffic, both directions (`offload` remat)
    host_s: float = 0.0  # host_bytes over one direction's host-link bandwidth

    @property
    def roofline_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.ici_s, self.host_s)

    @property
    def bound(self) -> str:
        terms = {"compute": self.compute_s, "HBM": self.memory_s, "ICI": self.ici_s, "host": self.host_s}
        return max(terms, key=terms.get)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes

    @property
    def mfu(self) -> float:
        """Roofline-implied model FLOPs utilisation: useful FLOPs / (peak x roofline time)."""
        return self.useful_flops / (self.roofline_s * self._peak) if self.useful_flops and self.roofline_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of the whole topology at the roofline time."""
        return self.tokens / self.roofline_s if self.tokens and self.roofline_s else 0.0

    @property
    def _peak(self) -> float:
        return CHIPS[self.chip].device_flops

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(roofline_s=self.roofline_s, bound=self.bound, fits=self.fits, mfu=self.mfu, tokens_per_s=self.tokens_per_s)
        out["loops"] = [dict(trips=t, how=h, count=n) for t, h, n in self.loops]
        return out


def _chip_key(chip: Chip) -> str:
    return next(k for k, v in CHIPS.items() if v == chip)


def report(
    name: str,
    compiled,
    topo: Topology,
    mesh_shape: dict[str, int],
    per: str,
    compile_s: float,
    compile_cpu_s: float = 0.0,
    tokens: float = 0.0,
    useful_flops: float = 0.0,
    notes: Sequence[str] = (),
) -> ProgramReport:
    """Figures of `compiled` (a `jax.stages.Compiled` for `topo`'s devices)."""
    mem = compiled.memory_analysis()
    cost: HloCost = analyze_hlo(compiled.as_text(), topo.num_devices)
    xla = compiled.cost_analysis() or {}
    if isinstance(xla, (list, tuple)):  # older jax: one dict per partition
        xla = xla[0] if xla else {}
    args, out, alias, temp = (float(getattr(mem, f, 0)) for f in
                              ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes"))
    # XLA's heap-simulated peak can come out below arguments + temporaries; take the larger.
    peak = max(float(getattr(mem, "peak_memory_in_bytes", 0) or 0), args + out - alias + temp)
    chip = topo.chip
    loops: dict[tuple[int, str], int] = {}
    for loop in cost.loops:
        loops[(loop.trips, loop.how)] = loops.get((loop.trips, loop.how), 0) + 1
    extra = list(notes)
    if cost.unknown_loops:
        extra.append(f"{len(cost.unknown_loops)} loop(s) of unknown trip count counted once")
    if cost.modelled_kernels:
        extra.append(f"{cost.modelled_kernels:.0f} splash-attention kernel execution(s): FLOPs from their shapes and causal block map")
    if cost.unestimated_kernels:
        extra.append(f"{cost.unestimated_kernels:.0f} Pallas kernel execution(s) declare no cost estimate: their FLOPs are not counted")
    if topo.platform == "cpu":
        extra.append(f"compiled by XLA:CPU as a stand-in; roofline with {chip.name} figures")
    return ProgramReport(
        name=name, topology=topo.name, chip=_chip_key(chip), platform=topo.platform, num_devices=topo.num_devices,
        mesh=dict(mesh_shape), per=per, compile_s=compile_s, compile_cpu_s=compile_cpu_s,
        argument_bytes=args, output_bytes=out, alias_bytes=alias, temp_bytes=temp,
        code_bytes=float(getattr(mem, "generated_code_size_in_bytes", 0)), peak_bytes=peak, budget_bytes=topo.budget_bytes,
        flops=cost.flops, hbm_bytes=cost.hbm_bytes, collective_bytes=dict(cost.collective_bytes), link_bytes=cost.link_bytes,
        xla_flops=float(xla.get("flops", 0.0)), xla_bytes=float(xla.get("bytes accessed", 0.0)),
        compute_s=cost.flops / chip.device_flops, memory_s=cost.hbm_bytes / chip.device_hbm_bandwidth,
        ici_s=cost.link_bytes / chip.device_ici_bandwidth, tokens=tokens, useful_flops=useful_flops,
        loops=tuple((t, h, n) for (t, h), n in sorted(loops.items())), custom_calls=dict(cost.custom_calls),
        notes=tuple(extra), unestimated_kernel_bytes=cost.unestimated_kernel_bytes,
        host_bytes=cost.host_bytes, host_s=cost.host_bytes / chip.device_host_bandwidth,
    )


def compile_timed(lower: Callable[[], Any]) -> tuple[Any, float, float]:
    """(compiled, wall seconds, CPU seconds) of `lower().compile()`."""
    start, cpu = time.perf_counter(), time.process_time()
    compiled = lower().compile()
    return compiled, time.perf_counter() - start, time.process_time() - cpu


def _gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def format_report(r: ProgramReport) -> str:
    """A few readable lines per program."""
    mesh = " ".join(f"{k}={v}" for k, v in r.mesh.items())
    coll = ", ".join(f"{k} {_gib(r.collective_bytes[k])}" for k in COLLECTIVE_KINDS if r.collective_bytes.get(k))
    loops = ", ".join(f"{n}x{t} ({h})" for t, h, n in r.loops) or "none"
    lines = [
        f"== {r.name}  [{r.topology}: {r.num_devices} x {CHIPS[r.chip].name}, mesh {mesh}]  per execution: {r.per}",
        f"   memory/device GiB: arguments {_gib(r.argument_bytes)}  outputs {_gib(r.output_bytes)}  (aliased {_gib(r.alias_bytes)})"
        f"  temporaries {_gib(r.temp_bytes)}  code {_gib(r.code_bytes)}  peak {_gib(r.peak_bytes)}"
        f"  of {_gib(r.budget_bytes)}: {'fits' if r.fits else 'DOES NOT FIT'}",
        f"   per device: {r.flops / 1e12:.2f} TFLOP, HBM {_gib(r.hbm_bytes)} GiB, collectives GiB: {coll or 'none'}"
        f" (link traffic {_gib(r.link_bytes)})",
        f"   roofline {r.roofline_s * 1e3:.1f} ms ({r.bound}-bound: compute {r.compute_s * 1e3:.1f}, HBM {r.memory_s * 1e3:.1f},"
        f" ICI {r.ici_s * 1e3:.1f}" + (f", host {r.host_s * 1e3:.1f} for {_gib(r.host_bytes)} GiB" if r.host_bytes else "")
        + " ms)" + (f"  MFU {r.mfu:.1%}" if r.useful_flops else "")
        + (f"  {r.tokens_per_s:,.0f} tokens/s" if r.tokens else "") + f"  compiled in {r.compile_s:.1f} s ({r.compile_cpu_s:.0f} CPU s)",
        f"   loops (count x trips): {loops}; XLA's own count (loop bodies once): {r.xla_flops / 1e12:.2f} TFLOP, {_gib(r.xla_bytes)} GiB",
    ]
    lines += [f"   note: {n}" for n in r.notes]
    return "\n".join(lines)
