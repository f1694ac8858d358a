"""`sgs-generate`: sample completions for a JSONL file of prompts from a checkpoint.

    sgs-generate --checkpoint DIR --prompts IN.jsonl --out OUT.jsonl \
        --num-samples 8 --temperature 1.0 --top-p 1.0 --max-new-tokens 1024

Input lines: {"prompt": "..."} (encoded with the tokenizer's BOS) or {"messages": [...]}
(chat template with the generation prompt). Output: exactly one line per input line, in
input order, each with its 1-based input `line` number: {"line", "samples": [{"token_ids",
"text", "logprobs", "finish_reason"}, ...]}, or {"line", "error": reason} for a line that
cannot be used (blank, not UTF-8, bad JSON, empty prompt, prompt longer than the cap).
Results are written as they finish (a killed run keeps a clean prefix); --out is opened
before any work. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

from sgs_jax.cli.jsonl_lines import OrderedWriter, open_output, read_lines
from sgs_jax.models.hf_io import CheckpointError, load_hf
from sgs_jax.models.tokenizer import TokenizerError, load_tokenizer
from sgs_jax.parallel.host_memory import configure_host_malloc
from sgs_jax.parallel.mesh import make_mesh
from sgs_jax.sampling.params import SamplingParams
from sgs_jax.sampling.sampler import Sampler
from sgs_jax.sampling.text import generate_records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sgs-generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="Hugging Face Llama checkpoint directory")
    parser.add_argument("--prompts", required=True, help='JSONL of {"prompt": str} or {"messages": [...]}')
    parser.add_argument("--out", required=True, help="JSONL of samples, in input order")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the checkpoint)")
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--max-total-len", type=int, default=8192, help="cap on prompt + generated tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-token-ids", type=int, nargs="*", help="default: the checkpoint's EOS ids")
    parser.add_argument("--max-batch", type=int, default=64, help="decode slots (rows in flight)")
    parser.add_argument("--chunk-steps", type=int, default=16, help="decode steps per jitted chunk")
    parser.add_argument("--kv-pool-tokens", type=int, default=None,
                        help="KV pool capacity in tokens, shared by all slots (default: every slot's worst case)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute and parameter dtype")
    parser.add_argument("--mesh", default=None, metavar="DATA,FSDP,TENSOR", help="device mesh, e.g. 1,-1,1 (default: one device)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    return parser.parse_args(argv)


def check_checkpoint_dir(path: str) -> None:
    """Raise CheckpointError, saying plainly what is wrong, unless `path` is a local
    checkpoint directory with a config.json."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint directory {path!r} does not exist")
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} is a file, not a checkpoint directory")
    if not os.listdir(path):
        raise CheckpointError(f"checkpoint directory {path!r} is empty")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise CheckpointError(f"checkpoint directory {path!r} has no config.json (not a Hugging Face checkpoint)")


def _progress_printer(stream: TextIO):
    start = time.monotonic()

    def report(done: int, total: int) -> None:
        rate = done / max(time.monotonic() - start, 1e-9)
        stream.write(f"\r[sgs-generate] {done}/{total} samples finished, {rate:.1f}/s")
        stream.flush()

    return report


def run(args: argparse.Namespace, progress: TextIO | None) -> int:
    """Check inputs, load, generate, writing each result as it finishes; returns the
    number of output lines (one per input line)."""
    check_checkpoint_dir(args.checkpoint)
    lines = read_lines(args.prompts)
    with open_output(args.out, args.prompts) as out:
        tokenizer = load_tokenizer(args.tokenizer or args.checkpoint)
        mesh = make_mesh(*(int(x) for x in args.mesh.split(","))) if args.mesh else None
        model = load_hf(args.checkpoint, dtype=args.dtype, mesh=mesh)
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            max_total_len=args.max_total_len,
            num_samples=args.num_samples,
            seed=args.seed,
            stop_token_ids=None if args.stop_token_ids is None else tuple(args.stop_token_ids),
        )
        records = [ValueError(line.error) if line.error else line.value for line in lines]
        writer = OrderedWriter(out, len(lines))
        sampler = Sampler(model.config, mesh=mesh, max_batch=args.max_batch, chunk_steps=args.chunk_steps,
                          kv_pool_tokens=args.kv_pool_tokens, page_size=args.page_size)
        results = generate_records(
            sampler, model, tokenizer, records, params, _progress_printer(progress) if progress else None,
            on_record=lambda i, result: writer.put(i, {"line": lines[i].number, **result}),
        )
    if progress is not None:
        stats = sampler.last_stats
        summary = (f"{stats.generated_tokens} tokens, {stats.tokens_per_s:.1f} tokens/s, decode padding waste {stats.decode_waste:.1%}, "
                   f"attention page padding {stats.attention_padding:.1%}") if stats else "nothing generated"
        progress.write(f"\n[sgs-generate] {summary}\n")
    errors = sum("error" in r for r in results)
    if errors:
        print(f"sgs-generate: {errors} of {len(results)} lines had errors (see their \"error\" field)", file=sys.stderr)
    return len(results)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        configure_host_malloc(may_restart=argv is None)  # before JAX starts its CPU client
        run(args, None if args.no_progress else sys.stderr)
    except (TokenizerError, CheckpointError, OSError, ValueError) as err:
        print(f"sgs-generate: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
