"""Training sequences -> fixed-shape micro-batches, bucketed by length.

A training sequence is prompt + completion; the model reads `input = seq[:-1]` and is
scored on `target = seq[1:]`, with the loss mask on the targets that are completion
tokens (prompt tokens and padding never count). Micro-batches take sequences sorted by
length, `micro_batch_size` rows each, padded on the right to the smallest length bucket
that holds their longest row, so padding stays small and only a few shapes compile.
A short last micro-batch is filled with empty rows (all-zero mask, weight 0).

Packed (`pack_micro_batches`, `TrainConfig.pack_length`): a row holds several sequences
side by side, told apart by segment ids, so the matmuls run on real tokens instead of
padding: sequences are spread over as few micro-batches as fit, their rows balanced, and
each micro-batch is padded to the bucket of its fullest row.

The per-sequence normaliser (`scale`) is computed once over the whole optimiser batch
(`sgs_jax.rl.objectives.sequence_scale`) and carried by each row, so the micro-batch
losses sum exactly to the loss of the whole batch (method.md §4 step 9).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from typing import Sequence

import jax
import numpy as np

from sgs_jax.rl.objectives import sequence_scale
from sgs_jax.sgs.types import TrainingSample, token_array


@dataclasses.dataclass(frozen=True, eq=False)
class SequenceExample:
    """One training sequence (token arrays read-only; compares by identity).

    prompt_ids [P] int32: tokens the model is conditioned on (never trained on), P >= 1.
    completion_ids [L] int32: generated tokens (trained on), L >= 1.
    weight: per-sequence weight, or advantage for CISPO.
    old_logprobs [L] float32: the sampler's log-probability (nats) of each completion
        token; CISPO only.
    group: the problem the sequence belongs to (CISPO's per-group normalisation).
    Sequences given as lists or tuples become arrays; a rollout's arrays are used as they
    are (views of the sampler's columnar output, no copy).
    """

    prompt_ids: np.ndarray | Sequence[int]
    completion_ids: np.ndarray | Sequence[int]
    weight: float = 1.0
    old_logprobs: np.ndarray | Sequence[float] | None = None
    group: int = 0

    def __post_init__(self):
        object.__setattr__(self, "prompt_ids", token_array(self.prompt_ids))
        object.__setattr__(self, "completion_ids", token_array(self.completion_ids))
        if self.old_logprobs is not None:
            object.__setattr__(self, "old_logprobs", token_array(self.old_logprobs, np.float32))
        if not len(self.prompt_ids):
            raise ValueError("a training sequence needs at least one prompt token (e.g. BOS)")
        if not len(self.completion_ids):
            raise ValueError("a training sequence needs at least one completion token")
        if self.old_logprobs is not None and len(self.old_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"old_logprobs has {len(self.old_logprobs)} entries for {len(self.completion_ids)} completion tokens"
            )
        if not np.isfinite(self.weight):
            raise ValueError(f"weight must be finite, got {self.weight}")

    @property
    def num_inputs(self) -> int:
        """Model input length: prompt + completion - 1 (the last token is only a target)."""
        return len(self.prompt_ids) + len(self.completion_ids) - 1

    @classmethod
    def from_training_sample(cls, prompt_ids: Sequence[int], sample: TrainingSample) -> "SequenceExample":
        """A rollout turned training sample, with the prompt ids it was sampled from."""
        rollout = sample.rollout
        return cls(prompt_ids, rollout.token_ids, float(sample.weight), rollout.logprobs, sample.group)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """Fixed-shape arrays of B rows padded to T tokens (NumPy on the host, jax on device).

    input_ids, targets: [B, T] int32; attention_mask: [B, T] bool (real input tokens);
    loss_mask: [B, T] float32 (1 where the target is a completion token);
    old_logprobs: [B, T] float32 (0 where not given); weights, scale: [B] float32, one
    per row's sequence. Packed rows: segment_ids [B, T] int32 (the row's sequences
    numbered 1, 2, ..., 0 = padding), and weights, scale [B, T], each token carrying its
    sequence's value; unpacked rows: segment_ids None.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray
    old_logprobs: np.ndarray
    weights: np.ndarray
    scale: np.ndarray
    segment_ids: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)


def length_buckets(max_len: int, min_len: int = 64, per_octave: int = 2) -> tuple[int, ...]:
    """Bucket lengths from min_len up to and including max_len, `per_octave` shapes per
    doubling, evenly spaced within it: with 2 (min_len, 1.5 min_len, 2 min_len, 3 min_len,
    ...) padding is at most 1/3 of a row, with 4 (min_len x 1, 1.25, 1.5, 1.75, 2, ...)
    at most 1/5."""
    if min_len <= 0 or max_len <= 0 or per_octave <= 0:
        raise ValueError(f"bucket lengths must be positive, got min_len={min_len}, max_len={max_len}, per_octave={per_octave}")
    buckets, size = [], min_len
    while size < max_len:
        buckets += [size * (per_octave + i) // per_octave for i in range(per_octave)]
        size *= 2
    return tuple(sorted({b for b in buckets if b < max_len} | {max_len}))


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= length; ValueError when the sequence is longer than every bucket."""
    for bucket in sorted(buckets):
        if bucket >= length:
            return bucket
    raise ValueError(f"sequence of {length} input tokens exceeds the largest bucket {max(buckets)} (max_seq_len)")


def batch_scale(
    examples: Sequence[SequenceExample], normalization: str = "batch_tokens", num_groups: int | None = None
) -> np.ndarray:
    """[N] float32 per-sequence normaliser over the whole optimiser batch (see objectives).

    num_groups: for "group_tokens", the group count to divide by (`group_batches` passes
    the constant groups per batch); None counts the groups present."""
    lengths = np.asarray([len(e.completion_ids) for e in examples])
    mask = np.arange(max(lengths.max(initial=0), 1))[None, :] < lengths[:, None]
    group_ids = np.asarray([e.group for e in examples]) if normalization == "group_tokens" else None
    return np.asarray(sequence_scale(mask, normalization, group_ids, np.float32, num_groups), np.float32)


def group_batches(
    examples: Sequence[SequenceExample], batch_size: int, seed: int
) -> tuple[list[list[SequenceExample]], int]:
    """CISPO optimiser batches (method.md §5): whole groups, shuffled, cut on group
    boundaries, so a batch of 64 holds exactly 8 groups of 8 (the last may hold fewer).

    Groups are the examples sharing `group`, in first-appearance order, each kept in its
    input order; all must have the same size G, and `batch_size` must be a multiple of it.
    Returns (batches, groups per batch = batch_size // G). Deterministic in `seed`.
    """
    groups: dict[int, list[SequenceExample]] = {}
    for e in examples:
        groups.setdefault(e.group, []).append(e)
    sizes = sorted({len(g) for g in groups.values()})
    if len(sizes) > 1:
        raise ValueError(f"CISPO groups must all have the same size, got sizes {sizes}")
    size = sizes[0] if sizes else 1
    if batch_size % size:
        raise ValueError(f"batch_size {batch_size} is not a multiple of the CISPO group size {size} (proofs per problem)")
    per_batch = batch_size // size
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    batches = [[e for g in order[s : s + per_batch] for e in g] for s in range(0, len(order), per_batch)]
    return batches, per_batch


def _fill_row(batch: dict[str, np.ndarray], row: int, example: SequenceExample, scale: float, start: int = 0) -> None:
    """Writes `example` into `row` of `batch` at token `start` (0 unless packed)."""
    seq = np.concatenate([example.prompt_ids, example.completion_ids])
    n, p = example.num_inputs, len(example.prompt_ids)
    tokens = slice(start, start + n)
    batch["input_ids"][row, tokens] = seq[:-1]
    batch["attention_mask"][row, tokens] = True
    batch["targets"][row, tokens] = seq[1:]
    batch["loss_mask"][row, start + p - 1 : start + n] = 1.0  # target index p-1 is the first completion token
    if example.old_logprobs is not None:
        batch["old_logprobs"][row, start + p - 1 : start + n] = example.old_logprobs
    per_token = batch["weights"].ndim == 2
    batch["weights"][row, tokens if per_token else ...] = example.weight
    batch["scale"][row, tokens if per_token else ...] = scale


def _empty_arrays(rows: int, length: int, pad_id: int, packed: bool) -> dict[str, np.ndarray]:
    shape = (rows, length)
    arrays = {
        "input_ids": np.full(shape, pad_id, np.int32),
        "attention_mask": np.zeros(shape, bool),
        "targets": np.full(shape, pad_id, np.int32),
        "loss_mask": np.zeros(shape, np.float32),
        "old_logprobs": np.zeros(shape, np.float32),
        "weights": np.zeros(shape if packed else rows, np.float32),
        "scale": np.zeros(shape if packed else rows, np.float32),
    }
    if packed:
        arrays["segment_ids"] = np.zeros(shape, np.int32)
    return arrays


def _longest_first(examples: Sequence[SequenceExample], scale: np.ndarray, rows: int, name: str) -> list[int]:
    """The examples' indices, longest first, after checking the row count and scale."""
    if rows <= 0:
        raise ValueError(f"{name} must be positive, got {rows}")
    if len(scale) != len(examples):
        raise ValueError(f"{len(scale)} scale entries for {len(examples)} examples")
    return sorted(range(len(examples)), key=lambda i: -examples[i].num_inputs)


def make_micro_batches(
    examples: Sequence[SequenceExample],
    scale: np.ndarray,
    micro_batch_size: int,
    buckets: Sequence[int],
    pad_id: int = 0,
) -> list[MicroBatch]:
    """Micro-batches of `micro_batch_size` rows, longest sequences first.

    examples: one optimiser batch; scale: [len(examples)] from `batch_scale`.
    Raises ValueError when a sequence is longer than the largest bucket.
    """
    order = _longest_first(examples, scale, micro_batch_size, "micro_batch_size")
    batches = []
    for start in range(0, len(order), micro_batch_size):
        rows = order[start : start + micro_batch_size]
        length = bucket_for(examples[rows[0]].num_inputs, buckets)
        arrays = _empty_arrays(micro_batch_size, length, pad_id, packed=False)
        for row, index in enumerate(rows):
            _fill_row(arrays, row, examples[index], float(scale[index]))
        batches.append(MicroBatch(**arrays))
    return batches


def pack_micro_batches(
    examples: Sequence[SequenceExample],
    scale: np.ndarray,
    rows: int,
    buckets: Sequence[int],
    pad_id: int = 0,
) -> list[MicroBatch]:
    """Packed micro-batches of `rows` rows, each row holding whole sequences side by side
    (segment ids 1, 2, ...) in at most max(buckets) tokens.

    Two layouts are made and the one with fewer token slots (padding included) is kept:
    balanced (the sequences, longest first, each go to the least-filled row of the fewest
    micro-batches that hold them all, so all rows end up about equally full: best for a
    batch of a few micro-batches) and filled (first fit, longest first, into rows of the
    full length, so only the last micro-batch is short: best for many). Each micro-batch
    is padded to the bucket of its fullest row. Deterministic.
    examples: one optimiser batch; scale: [len(examples)] from `batch_scale`.
    Raises ValueError when a sequence is longer than the largest bucket.
    """
    order = _longest_first(examples, scale, rows, "rows")
    if not order:
        return []
    lengths = [e.num_inputs for e in examples]
    bucket_for(lengths[order[0]], buckets)  # raises for a sequence longer than every bucket
    capacity = max(buckets)

    def with_micro_lengths(members):
        return members, [bucket_for(max(sum(lengths[i] for i in m) for m in members[f : f + rows]), buckets)
                         for f in range(0, len(members), rows)]

    layouts = [with_micro_lengths(_balanced_rows(order, lengths, rows, capacity)),
               with_micro_lengths(_filled_rows(order, lengths, rows, capacity))]
    members, micro_lengths = min(layouts, key=lambda layout: sum(layout[1]))
    batches = []
    for first, length in zip(range(0, len(members), rows), micro_lengths):
        group = members[first : first + rows]
        arrays = _empty_arrays(rows, length, pad_id, packed=True)
        for row, sequences in enumerate(group):
            start = 0
            for segment, i in enumerate(sequences, start=1):
                _fill_row(arrays, row, examples[i], float(scale[i]), start)
                arrays["segment_ids"][row, start : start + lengths[i]] = segment
                start += lengths[i]
        batches.append(MicroBatch(**arrays))
    return batches


def _balanced_rows(order: list[int], lengths: list[int], rows: int, capacity: int) -> list[list[int]]:
    """Sequences (indices, longest first) over the fewest micro-batches of `rows` rows that
    hold them when each goes to the least-filled row; row r belongs to micro-batch r // rows."""
    micro = max(1, -(-sum(lengths) // (rows * capacity)))
    while True:
        members: list[list[int]] = [[] for _ in range(micro * rows)]
        loads = [(0, r) for r in range(micro * rows)]  # a heap of (tokens, row)
        for i in order:
            load, r = heapq.heappop(loads)
            if load + lengths[i] > capacity:
                break
            members[r].append(i)
            heapq.heappush(loads, (load + lengths[i], r))
        else:
            return members
        micro += 1  # some sequence fits no row


def _filled_rows(order: list[int], lengths: list[int], rows: int, capacity: int) -> list[list[int]]:
    """Sequences (indices, longest first) by first fit into rows of `capacity` tokens, rows
    in the order they were opened (the fullest first), padded with empty rows to a
    multiple of `rows`."""
    members: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        r = next((r for r, load in enumerate(loads) if load + lengths[i] <= capacity), len(loads))
        if r == len(loads):
            members.append([])
            loads.append(0)
        members[r].append(i)
        loads[r] += lengths[i]
    return members + [[] for _ in range(-len(members) % rows)]


def padding_fraction(batches: Sequence[MicroBatch]) -> float:
    """Fraction of input slots in `batches` that are padding (0 when there are none)."""
    total = sum(b.attention_mask.size for b in batches)
    real = sum(int(np.sum(b.attention_mask)) for b in batches)
    return 1.0 - real / total if total else 0.0
