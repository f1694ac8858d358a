"""The Sampler's decode chunk compiled for given weight shapes and layouts, and the weight
all-gathers in its optimised HLO (the layout tests; `python -m tests.parallel.decode_hlo`
prints the counts for both layouts)."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp

from sgs_jax.parallel.rules import INFERENCE_RULES, state_shardings

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) (all-gather(?:-start)?)\(")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")
_WHILE_BODY = re.compile(r"body=%([\w.\-]+)")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%([\w.\-]+)")


def weights_in_layout(abstract, mesh, rules, dtype):
    """Shape structs of the model's parameters in `dtype`, laid out on `mesh` by `rules`."""
    shardings = state_shardings(abstract, mesh, rules)
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype), sharding=s), abstract, shardings)


def compiled_decode(sampler, weights, slots: int, cache_len: int):
    """The decode chunk `Sampler.generate` runs (chunk_steps steps, every slot holding
    `cache_len` tokens of KV pages: a pool of slots x cache_len), compiled for `weights`
    (shape structs with shardings) without running anything."""
    pages = -(-cache_len // sampler.page_size)
    return sampler.lower_decode(weights, slots, slots * pages, pages, work_size=slots * pages // sampler.shards).compile()


def parameter_shapes(abstract, mesh=None) -> set[tuple[int, ...]]:
    """Shapes a gathered weight can have: every parameter's full shape and, with `mesh`,
    its per-device shape in the inference layout (whole but for the tensor split); for
    layer-stacked ones also one layer's slice of each."""
    shardings = state_shardings(abstract, mesh, INFERENCE_RULES) if mesh is not None else None
    shapes = set()
    for i, leaf in enumerate(jax.tree_util.tree_leaves(abstract)):
        candidates = [tuple(leaf.shape)]
        if shardings is not None:
            candidates.append(tuple(jax.tree_util.tree_leaves(shardings)[i].shard_shape(leaf.shape)))
        for shape in candidates:
            shapes.add(shape)
            if len(shape) > 1:
                shapes.add(shape[1:])
    return shapes


def _loop_computations(hlo: str) -> set[str]:
    """Names of while-loop bodies and everything they call, transitively."""
    calls: dict[str, set[str]] = {}
    current = None
    bodies = set()
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            calls[current] = set()
            continue
        if current is not None:
            calls[current].update(_CALLS.findall(line))
            bodies.update(_WHILE_BODY.findall(line))
    inside, todo = set(), list(bodies)
    while todo:
        name = todo.pop()
        if name not in inside:
            inside.add(name)
            todo.extend(calls.get(name, ()))
    return inside


def weight_all_gathers(hlo: str, abstract, mesh=None) -> list[dict]:
    """The all-gathers in optimised HLO text whose result has a weight's shape
    (`parameter_shapes`): {name, dtype, shape, bytes (result), in_loop (inside a while
    body)}. Test dimensions are chosen so that no activation shares such a shape."""
    shapes = parameter_shapes(abstract, mesh)
    loops = _loop_computations(hlo)
    found, current = [], None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        arrays = _ARRAY.findall(match.group(2))
        dtype, dims = arrays[-1]  # an async start's tuple ends with the gathered result
        shape = tuple(int(d) for d in dims.split(",") if d)
        if shape in shapes:
            size = jnp.dtype({"bf16": "bfloat16", "f32": "float32", "f16": "float16"}.get(dtype, dtype)).itemsize
            found.append(dict(name=match.group(1), dtype=dtype, shape=shape, bytes=math.prod(shape) * size,
                              in_loop=current in loops))
    return found


def main() -> None:
    """Print the weight all-gathers of the decode chunk on 8 simulated CPU devices (fsdp=8)
    in both layouts: python -m tests.parallel.decode_hlo"""
    import os

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    from sgs_jax.models import tiny
    from sgs_jax.models.build import abstract_model
    from sgs_jax.parallel import LAYOUTS, make_mesh
    from sgs_jax.sampling import Sampler

    config = layout_test_config(tiny)
    mesh = make_mesh(1, 8, 1)
    sampler = Sampler(config, mesh=mesh, max_batch=16, chunk_steps=4)
    _, abstract = abstract_model(config)
    for layout, dtype in (("training", "float32"), ("inference", "bfloat16")):
        hlo = compiled_decode(sampler, weights_in_layout(abstract, mesh, LAYOUTS[layout], dtype), 16, 64).as_text()
        gathers = weight_all_gathers(hlo, abstract, mesh)
        loop = sum(g["in_loop"] for g in gathers)
        print(f"{layout} layout ({dtype}): {len(gathers)} weight all-gathers in the decode chunk: {loop} inside its "
              f"loops (run every step, per layer inside the layer scan), {len(gathers) - loop} hoisted before the loop")


def layout_test_config(tiny):
    """A small model whose parameter shapes no activation of a 16-slot decode shares."""
    return tiny(num_heads=8, num_kv_heads=4, head_dim=8, hidden_size=96, vocab_size=160, intermediate_size=224, num_layers=2)


if __name__ == "__main__":
    main()
