"""`sgs-verify`: check a JSONL file of proofs with any verification backend.

    sgs-verify --backend lean --input proofs.jsonl --out verdicts.jsonl \
        --lean-project-dir third_party/lean --workers 15 --timeout 200

Input lines: {"header", "statement", "proof"}. Output: exactly one line per input line,
in input order, each with its 1-based input `line` number: {"line", "verified", "status",
"reason", "messages", "time_s"}; a blank, non-UTF-8 or malformed line is `rejected` with
the reason. A progress line and a summary table (counts over every output line, times
over the items a backend checked, this tool's wall clock) go to stderr. Backend options:
the named flags below (passed only when given), plus any `--option key=value` (value
parsed as JSON when it parses, else a string). The remote backend also reads its API key
from the environment variable LEAN_SERVER_API_KEY (not visible in `ps`, unlike --api-key).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from typing import Any, TextIO

from sgs_jax.cli.jsonl_lines import InputLine, OrderedWriter, open_output, read_lines
from sgs_jax.verify.cache import CachingVerifier, ResultCache
from sgs_jax.verify.interface import (
    Status,
    Verifier,
    VerifierUnavailable,
    VerifyRequest,
    VerifyResult,
    available_backends,
    make_backend,
)
from sgs_jax.verify.stats import format_summary, summarize

# CLI flag -> backend keyword option (only passed when the flag is given).
NAMED_OPTIONS = {
    "repl_cmd": "repl_cmd",
    "lean_project_dir": "lean_project_dir",
    "timeout": "timeout_s",
    "workers": "workers",
    "memory_limit_gib": "memory_limit_gib",
    "url": "url",
    "api_key": "api_key",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sgs-verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="lean", help="lean | remote | prop | ... (registered backends)")
    parser.add_argument("--input", required=True, help="JSONL of {header, statement, proof}")
    parser.add_argument("--out", required=True, help="JSONL of verdicts, in input order")
    parser.add_argument("--repl-cmd", help="REPL-compatible executable (lean; default 'lake exe repl')")
    parser.add_argument("--lean-project-dir", help="Lean project with Mathlib the REPL runs in (lean)")
    parser.add_argument("--timeout", type=float, help="wall-clock seconds per proof")
    parser.add_argument("--workers", type=int, help="REPL processes (lean; default CPU cores - 1)")
    parser.add_argument("--memory-limit-gib", type=float, help="address-space limit per REPL (lean)")
    parser.add_argument("--url", help="server base URL (remote)")
    parser.add_argument("--api-key", help="server API key (remote; prefer the LEAN_SERVER_API_KEY environment variable)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="any other backend option")
    parser.add_argument("--cache", help="JSONL result cache (reused and extended across runs)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    return parser.parse_args(argv)


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword options for `make_backend` from the named flags and `--option` pairs."""
    options = {key: getattr(args, flag) for flag, key in NAMED_OPTIONS.items() if getattr(args, flag) is not None}
    options.update(parse_option_pairs(args.option))
    return options


def parse_option_pairs(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings -> {KEY: value}; a value is JSON when it parses, else a string."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option needs KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def request_of(line: InputLine) -> VerifyRequest | str:
    """The request of one input line, or the reason it cannot be checked."""
    if line.error:
        return f"invalid input: {line.error}"[:200]
    row = line.value
    if not isinstance(row, dict):
        return f"invalid input: line {line.number} is not a JSON object"
    missing = [k for k in ("header", "statement", "proof") if k not in row]
    if missing:
        return f"invalid input: line {line.number} lacks {', '.join(missing)}"
    fields = [row[k] for k in ("header", "statement", "proof")]
    if not all(isinstance(f, str) for f in fields):
        return f"invalid input: line {line.number}: header, statement and proof must be strings"
    return VerifyRequest(*fields)


def verify_file(verifier: Verifier, input_path: str, out: TextIO, progress: TextIO | None = None) -> dict[str, Any]:
    """Check every line of `input_path` and write one verdict per line, in input order, to
    `out`. Returns the summary (`verify.stats.summarize`, plus "invalid_lines") over every
    written line; times are those of the items a backend checked (time_s > 0)."""
    lines = read_lines(input_path)
    start = time.monotonic()
    items = [request_of(line) for line in lines]
    futures = [verifier.submit(item) if isinstance(item, VerifyRequest) else item for item in items]
    writer = OrderedWriter(out, len(lines))
    counts: collections.Counter[str] = collections.Counter()
    times: list[float] = []
    for position, (line, future) in enumerate(zip(lines, futures)):
        result = VerifyResult.failure(Status.REJECTED, future) if isinstance(future, str) else future.result()
        counts[result.status.value] += 1
        if result.time_s > 0:
            times.append(result.time_s)
        writer.put(position, {"line": line.number, **result.to_json()})
        if progress is not None:
            done = position + 1
            rate = done / max(time.monotonic() - start, 1e-9)
            progress.write(f"\r[sgs-verify] {done}/{len(lines)} checked, {counts['verified']} verified, {rate:.1f}/s")
            progress.flush()
    if progress is not None:
        progress.write("\n")
    backend = verifier.stats()
    summary = summarize(counts, times, time.monotonic() - start, backend.get("events"))
    summary["invalid_lines"] = sum(isinstance(item, str) for item in items)
    if "cache" in backend:
        summary["cache"] = backend["cache"]
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options: dict[str, Any] = {}
    try:
        out = open_output(args.out, args.input)
    except OSError as err:
        print(f"sgs-verify: cannot write --out: {err}", file=sys.stderr)
        return 2
    with out:
        try:
            options = backend_options(args)
            verifier: Verifier = make_backend(args.backend, **options)
        except (ValueError, TypeError) as err:  # unknown backend, option it does not take, bad value
            print(f"sgs-verify: cannot build backend {args.backend!r} with options {sorted(options)}: {err}", file=sys.stderr)
            print(f"sgs-verify: available backends: {', '.join(available_backends())}", file=sys.stderr)
            return 2
        if args.cache:
            verifier = CachingVerifier(verifier, ResultCache(args.cache))
        try:
            with verifier:
                summary = verify_file(verifier, args.input, out, None if args.no_progress else sys.stderr)
        except VerifierUnavailable as err:
            print(f"\nsgs-verify: {err}", file=sys.stderr)
            return 2
        except OSError as err:
            print(f"sgs-verify: {err}", file=sys.stderr)
            return 2
    print(format_summary(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
