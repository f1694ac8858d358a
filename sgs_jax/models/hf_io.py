"""Hugging Face checkpoint import (`load_hf`) and export (`save_hf`).

Hugging Face stores one tensor per layer (`model.layers.{i}.self_attn.q_proj.weight`); we
stack each over layers ([layers, ...], see `sgs_jax.models.llama`). Loading memory-maps
Loading opens every safetensors file lazily (`safetensors.safe_open(..., framework="numpy")`)
and builds each stacked parameter with `jax.make_array_from_callback`: a device's shard is
read straight from the files with `get_slice` (the box of each per-layer HF tensor that the
shard covers, then the view into our layout), so neither the host nor any device ever holds
more than its share of the model. Saving writes `config.json` and sharded safetensors
(`safetensors.numpy.save_file`) that `transformers` loads, gathering one layer's tensor at a
time and holding one file's tensors on the host at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from sgs_jax.models.build import abstract_model
from sgs_jax.models.config import ModelConfig
from sgs_jax.models.llama import Llama
from sgs_jax.parallel.rules import path_names, state_shardings

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
# HF module inside a layer -> our (module path, parameter)
_LAYER_PARAMS = {
    "input_layernorm": ("attn_norm", "scale"),
    "post_attention_layernorm": ("mlp_norm", "scale"),
    "self_attn.q_proj": ("attn", "q_proj", "kernel"),
    "self_attn.k_proj": ("attn", "k_proj", "kernel"),
    "self_attn.v_proj": ("attn", "v_proj", "kernel"),
    "self_attn.o_proj": ("attn", "o_proj", "kernel"),
    "mlp.gate_proj": ("mlp", "gate_proj", "kernel"),
    "mlp.up_proj": ("mlp", "up_proj", "kernel"),
    "mlp.down_proj": ("mlp", "down_proj", "kernel"),
}
_TOP_PARAMS = {
    "model.embed_tokens.weight": ("embed", "embedding"),
    "model.norm.weight": ("final_norm", "scale"),
    "lm_head.weight": ("lm_head", "kernel"),
}
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")  # buffers some older checkpoints saved


class CheckpointError(ValueError):
    """A checkpoint directory is missing files, has unexpected tensors or wrong shapes."""


def hf_name_to_path(name: str) -> tuple[tuple[str, ...], int | None] | None:
    """(our parameter path, layer index or None) for a Hugging Face tensor name; None for
    ignored buffers. Per-layer tensors map to one layer of a stacked parameter."""
    if _IGNORED.search(name):
        return None
    if name in _TOP_PARAMS:
        return _TOP_PARAMS[name], None
    match = _LAYER.match(name)
    if match and match.group(2) in _LAYER_PARAMS:
        return ("layers", *_LAYER_PARAMS[match.group(2)]), int(match.group(1))
    raise CheckpointError(f"unexpected tensor {name!r} in a Llama checkpoint")


def path_to_hf_name(path: tuple[str, ...], layer: int | None = None) -> str:
    """Inverse of `hf_name_to_path` (layer: the index into a stacked parameter)."""
    for name, ours in _TOP_PARAMS.items():
        if path == ours:
            return name
    inverse = {v: k for k, v in _LAYER_PARAMS.items()}
    return f"model.layers.{layer}.{inverse[tuple(path[1:])]}.weight"


def _is_stacked(path: tuple[str, ...]) -> bool:
    return path[0] == "layers"


def _bounds(index: slice, size: int) -> tuple[int, int]:
    start, stop, step = index.indices(size)
    if step != 1:
        raise ValueError(f"shard index {index} is strided")
    return start, stop


def read_our_slice(path: tuple[str, ...], source, index: tuple[slice, ...], shape: tuple[int, ...],
                   config: ModelConfig) -> np.ndarray:
    """`index` (one slice per axis) of a (per-layer) parameter of our `shape`, from its HF
    tensor in torch Linear layout [out, in] (the inverse of `to_hf_layout`), reading only the
    box of the HF tensor that the index covers. `source` is a safetensors slice
    (`safe_open(...).get_slice(name)`) or an array. A head axis merged with head_dim in HF
    ([heads * head_dim, ...]) is read for whole heads, then cut to the head_dim slice.
    Returns an array of the index's shape (a view of the box read)."""
    module = path[-2]
    if module in ("q_proj", "k_proj", "v_proj", "o_proj"):
        head_axis, dim_axis, embed_axis = (1, 2, 0) if module != "o_proj" else (0, 1, 2)
        (h0, h1), (e0, e1) = _bounds(index[head_axis], shape[head_axis]), _bounds(index[embed_axis], shape[embed_axis])
        d = config.head_dim
        rows = slice(h0 * d, h1 * d)  # HF's merged (head, head_dim) axis
        box = source[rows, e0:e1] if module != "o_proj" else source[e0:e1, rows]
        if module != "o_proj":
            ours = np.asarray(box).T.reshape(e1 - e0, h1 - h0, d)
            return ours[:, :, index[dim_axis]]
        return np.asarray(box).T.reshape(h1 - h0, d, e1 - e0)[:, index[dim_axis], :]
    if module in ("gate_proj", "up_proj", "down_proj", "lm_head"):
        (a0, a1), (b0, b1) = _bounds(index[0], shape[0]), _bounds(index[1], shape[1])
        return np.asarray(source[b0:b1, a0:a1]).T
    bounds = [_bounds(i, n) for i, n in zip(index, shape)]
    return np.asarray(source[tuple(slice(a, b) for a, b in bounds)])


def to_hf_layout(path: tuple[str, ...], array: np.ndarray) -> np.ndarray:
    """Inverse of `to_our_layout` (one layer's slice for stacked parameters)."""
    module = path[-2]
    if module in ("q_proj", "k_proj", "v_proj"):
        return array.reshape(array.shape[0], -1).T
    if module == "o_proj":
        return array.reshape(-1, array.shape[-1]).T
    if module in ("gate_proj", "up_proj", "down_proj", "lm_head"):
        return array.T
    return array


def hf_shape(path: tuple[str, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """HF shape of our (per-layer) parameter of `shape` (no array is built)."""
    module = path[-2]
    if module in ("q_proj", "k_proj", "v_proj"):
        return (shape[1] * shape[2], shape[0])
    if module == "o_proj":
        return (shape[2], shape[0] * shape[1])
    if module in ("gate_proj", "up_proj", "down_proj", "lm_head"):
        return tuple(reversed(shape))
    return tuple(shape)


def _resolve_checkpoint_dir(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    if os.path.isdir(path):
        return path
    if re.fullmatch(r"[\w.-]+/[\w.-]+", path) and not os.path.exists(path):
        from huggingface_hub import snapshot_download  # only for hub ids

        return snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
    raise CheckpointError(f"checkpoint directory {path!r} does not exist")


def checkpoint_files(directory: str) -> list[str]:
    """The safetensors files of a checkpoint directory (sharded index or single file)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(directory, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        found = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
        if not found:
            raise CheckpointError(
                f"no safetensors weights in {directory}; convert .bin checkpoints with "
                "transformers' save_pretrained(safe_serialization=True) first"
            )
        files = found
    paths = [os.path.join(directory, f) for f in files]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise CheckpointError(f"checkpoint index names missing files: {missing}")
    return paths


def load_hf(
    path: str | os.PathLike,
    dtype: Any = jnp.float32,
    mesh: Mesh | None = None,
    rules=None,
    param_dtype: Any = None,
    remat_policy: str = "none",
    attention: str = "auto",
    layer_loop: str = "auto",
) -> Llama:
    """Load a Hugging Face Llama checkpoint directory (or hub id where reachable).

    dtype: compute dtype; param_dtype: stored dtype (default: same as dtype);
    remat_policy, attention, layer_loop: the run-time settings of `ModelConfig`.
    With `mesh`, parameters land directly in their shards by the logical-axis rules.
    Returns a `Llama` whose `model(input_ids [B, T] int32)` gives logits [B, T, vocab].
    """
    directory = _resolve_checkpoint_dir(path)
    dtype_name = jnp.dtype(dtype).name
    param_name = jnp.dtype(param_dtype or dtype).name
    config = ModelConfig.from_hf_file(
        directory, dtype=dtype_name, param_dtype=param_name, remat_policy=remat_policy, attention=attention,
        layer_loop=layer_loop,
    )
    graphdef, abstract_state = abstract_model(config)
    if mesh is None:
        device = jax.local_devices()[0]
        mesh = Mesh(np.asarray([device]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    shardings = state_shardings(abstract_state, mesh, rules)

    flat_abstract = {path_names(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)}
    flat_shardings = {path_names(p): s for p, s in jax.tree_util.tree_leaves_with_path(shardings)}
    loaded: dict[tuple[str, ...], jax.Array] = {}
    with contextlib.ExitStack() as files:
        sources = _checkpoint_sources(directory, config, flat_abstract, files)
        for ours, target in flat_abstract.items():

            def shard(index, ours=ours, target=target):
                if not _is_stacked(ours):
                    return np.asarray(read_our_slice(ours, sources[ours, None], index, target.shape, config), target.dtype)
                layers = range(config.num_layers)[index[0]]
                out = np.empty((len(layers), *(len(range(n)[i]) for i, n in zip(index[1:], target.shape[1:]))), target.dtype)
                for j, layer in enumerate(layers):  # one read of this shard's box per layer
                    out[j] = read_our_slice(ours, sources[ours, layer], index[1:], target.shape[1:], config)
                return out

            loaded[ours] = jax.make_array_from_callback(target.shape, flat_shardings[ours], shard)
    state = jax.tree_util.tree_map_with_path(lambda p, _: loaded[path_names(p)], abstract_state)
    return nnx.merge(graphdef, state)


def _checkpoint_sources(directory: str, config: ModelConfig, flat_abstract, files: contextlib.ExitStack) -> dict[tuple, Any]:
    """{(our path, layer or None): lazy safetensors slice of the HF tensor}, checked against
    the config: every parameter (every layer of stacked ones) present, nothing unknown,
    shapes right. The files stay open until `files` closes."""
    sources: dict[tuple, Any] = {}
    for file in checkpoint_files(directory):
        try:
            handle = files.enter_context(safe_open(file, framework="numpy"))
        except SafetensorError as err:
            raise CheckpointError(f"{file}: not a readable safetensors file, truncated or corrupted ({err})") from None
        for name in handle.keys():
            mapped = hf_name_to_path(name)
            if mapped is None or (mapped[0] == ("lm_head", "kernel") and config.tie_word_embeddings):
                continue
            ours, layer = mapped
            if ours not in flat_abstract or (layer is not None and layer >= config.num_layers):
                raise CheckpointError(f"tensor {name} does not fit the config (no parameter {'/'.join(ours)} layer {layer})")
            hf_slice = handle.get_slice(name)
            shape = flat_abstract[ours].shape[1:] if layer is not None else flat_abstract[ours].shape
            if tuple(hf_slice.get_shape()) != hf_shape(ours, shape):
                raise CheckpointError(f"tensor {name}: shape {tuple(hf_slice.get_shape())} does not match the config "
                                      f"(expected {shape} in our layout)")
            sources[ours, layer] = hf_slice
    wanted = [
        (ours, layer)
        for ours in flat_abstract
        for layer in (range(config.num_layers) if _is_stacked(ours) else [None])
    ]
    missing = [path_to_hf_name(*key) for key in wanted if key not in sources]
    if missing:
        raise CheckpointError(f"checkpoint {directory} lacks parameters: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    return sources


def save_hf(model: Llama, path: str | os.PathLike, max_shard_bytes: int = 4 << 30, tokenizer=None) -> None:
    """Write `model` as a Hugging Face checkpoint (config.json + safetensors, sharded with an
    index when larger than `max_shard_bytes`) that `AutoModelForCausalLM.from_pretrained`
    loads. Parameters are gathered one (per-layer) tensor at a time; on multi-host runs every process
    must call this, and process 0 writes. `tokenizer` (a transformers tokenizer) is saved
    alongside when given."""
    path = os.fspath(path)
    is_writer = jax.process_index() == 0
    if is_writer:
        os.makedirs(path, exist_ok=True)
    config = model.config
    state = nnx.state(model, nnx.Param)
    params = {path_names(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(state)}
    by_name: dict[str, tuple[tuple[str, ...], int | None]] = {}
    specs = []  # (HF name, HF shape, dtype): embeddings, then layer by layer, then the rest
    entries = [(ours, None) for ours in params if ours[0] == "embed"]
    entries += [(ours, i) for i in range(config.num_layers) for ours in params if _is_stacked(ours)]
    entries += [(ours, None) for ours in params if ours[0] != "embed" and not _is_stacked(ours)]
    for ours, layer in entries:
        leaf = params[ours]
        shape = leaf.shape[1:] if layer is not None else leaf.shape
        name = path_to_hf_name(ours, layer)
        by_name[name] = (ours, layer)
        specs.append((name, hf_shape(ours, shape), np.dtype(leaf.dtype)))

    shards: list[list] = [[]]
    size = 0
    for spec in specs:
        nbytes = int(np.prod(spec[1])) * spec[2].itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes

    def fetch(name: str) -> np.ndarray:
        ours, layer = by_name[name]
        array = params[ours] if layer is None else params[ours][layer]
        return to_hf_layout(ours, _gather(array))

    weight_map = {}
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))
    ]
    for file_name, shard_specs in zip(names, shards):
        if is_writer:
            _write_safetensors(os.path.join(path, file_name), {name: fetch(name) for name, _, _ in shard_specs})
        else:  # other hosts still take part in the gathers
            for name, _, _ in shard_specs:
                fetch(name)
        weight_map.update({name: file_name for name, _, _ in shard_specs})
    if not is_writer:
        return
    if len(shards) > 1:
        total = sum(int(np.prod(s[1])) * s[2].itemsize for s in specs)
        with open(os.path.join(path, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config.to_hf_dict(), f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def _write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """One safetensors file, written under a temporary name first: never a half-written file
    under the final name."""
    tmp = path + ".tmp"
    save_file({name: np.ascontiguousarray(t) for name, t in tensors.items()}, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)


def _gather(array: jax.Array) -> np.ndarray:
    """The full value of a (possibly sharded, possibly multi-host) array on this host."""
    if jax.process_count() > 1 and not array.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(jax.device_get(array))

