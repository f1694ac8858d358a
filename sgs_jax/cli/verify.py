"""`sgs-verify`: check a JSONL file of proofs with any verification backend.

    sgs-verify --backend lean --input proofs.jsonl --out verdicts.jsonl \
        --lean-project-dir third_party/lean --workers 15 --timeout 200

Input lines: {"header", "statement", "proof"}. Output lines, in input order:
{"verified", "status", "reason", "messages", "time_s"}. A progress line and a summary
table go to stderr. Backend options: the named flags below (passed only when given),
plus any `--option key=value` (value parsed as JSON when it parses, else a string).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Iterator, TextIO

from sgs_jax.verify.cache import CachingVerifier, ResultCache
from sgs_jax.verify.interface import Status, Verifier, VerifyRequest, VerifyResult, available_backends, make_backend
from sgs_jax.verify.stats import format_summary

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
    parser.add_argument("--api-key", help="server API key (remote)")
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


def read_requests(stream: TextIO) -> Iterator[VerifyRequest | str]:
    """Requests from JSONL lines; a malformed line yields an error string instead."""
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            fields = [row[k] for k in ("header", "statement", "proof")]
            if not all(isinstance(f, str) for f in fields):
                raise TypeError("header, statement and proof must be strings")
            yield VerifyRequest(*fields)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            yield f"invalid input line {number}: {err!r}"[:200]


def verify_file(verifier: Verifier, input_path: str, out_path: str, progress: TextIO | None = None) -> int:
    """Check every line of `input_path`, write verdicts in input order; returns the count."""
    # Bad bytes survive as lone surrogates, so the rules reject that line, not the run.
    with open(input_path, encoding="utf-8", errors="surrogateescape") as f:
        items = list(read_requests(f))
    futures = [verifier.submit(item) if isinstance(item, VerifyRequest) else item for item in items]
    start, verified = time.monotonic(), 0
    with open(out_path, "w", encoding="utf-8") as out:
        for done, future in enumerate(futures, 1):
            if isinstance(future, str):
                result = VerifyResult.failure(Status.REJECTED, future)
            else:
                result = future.result()
            verified += result.verified
            out.write(json.dumps(result.to_json()) + "\n")
            if progress is not None:
                rate = done / max(time.monotonic() - start, 1e-9)
                progress.write(f"\r[sgs-verify] {done}/{len(futures)} checked, {verified} verified, {rate:.1f}/s")
                progress.flush()
    if progress is not None:
        progress.write("\n")
    return len(futures)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options: dict[str, Any] = {}
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
            verify_file(verifier, args.input, args.out, None if args.no_progress else sys.stderr)
            print(format_summary(verifier.stats()), file=sys.stderr)
    except OSError as err:
        print(f"sgs-verify: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
