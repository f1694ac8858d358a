"""A fake Lean REPL for tests: speaks the real leanprover-community/repl protocol.

Protocol (as the real REPL): commands are JSON objects separated by blank lines on
stdin; each reply is a JSON object (pretty-printed over several lines when long) and a
blank line. `{"cmd": text}` without `env` may import and makes a fresh environment;
`{"cmd": text, "env": N}` runs in environment N; every command creates the next env
number. Replies hold `env`, optional `messages` (`severity`, `pos`, `endPos`, `data`) and
`sorries` (empty lists omitted); failures are `{"message": ...}`.

Its "Lean" is tiny but realistic in shape:
- `theorem NAME ...` / `lemma NAME ...` declares NAME; `#print axioms NAME` reports
  "'NAME' depends on axioms: [...]" or "'NAME' does not depend on any axioms".
- In a proof: `sorry` -> a `sorries` entry, the "declaration uses 'sorry'" warning
  (backtick quotes with --sorry-backtick) and axiom sorryAx; `native_decide` ->
  Lean.ofReduceBool; an identifier starting with `bogus` -> "unknown identifier" error;
  a proof of only `skip` -> "unsolved goals"; `trace "s"` -> an info message s;
  in the statement (before `:= by`), an identifier starting with `bogus` -> "unknown
  identifier" and unbalanced parentheses -> a parse error (ill-formed statements);
  `exact?` -> a "Try this" info; `simp`/`norm_num`/`linarith`/`nlinarith`/`positivity`
  -> the three standard axioms; `rfl`/`decide`/`omega` alone -> no axioms.
- A header command with an identifier starting with `bogus` fails to elaborate.

Fault injection, by comment in the checked text: `-- fake:sleep=SECONDS`, `-- fake:hang`
(a child process is started first, to test process-group kills), `-- fake:crash`,
`-- fake:leak` (allocates until the address-space limit kills it), `-- fake:garbage`,
`-- fake:repl_message` (a `{"message": ...}` failure). Flags: --delay (seconds per proof
command), --import-delay, --crash-on-nth N (crash on this process's N-th proof
command), --log FILE (JSON lines: start/import/proof events with pid and start time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from verify_test_support import start_ticks  # the script's own folder is on sys.path

STANDARD_AXIOMS = ["propext", "Classical.choice", "Quot.sound"]
_DECL_RE = re.compile(r"(?:theorem|lemma)\s+(\S+)")
_AXIOMS_CMD_RE = re.compile(r"#print\s+axioms\s+(\S+)")
_FAKE_RE = re.compile(r"--\s*fake:(\w+)(?:=([\d.]+))?")


class FakeControl(Exception):
    """A fault the process (or test server) must act out: hang, crash, leak, garbage."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


def _pos(text: str, index: int) -> dict:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1)
    return {"line": line, "column": column}


def _message(text: str, start: int, end: int, severity: str, data: str) -> dict:
    return {"severity": severity, "pos": _pos(text, start), "endPos": _pos(text, end), "data": data}


class FakeLean:
    """The fake elaborator: environments, declarations and their axioms."""

    def __init__(self, sorry_backtick: bool = False, delay_s: float = 0.0):
        self.envs: list[dict[str, list[str]]] = []  # env id -> {theorem: axioms}
        self.sorry_backtick = sorry_backtick
        self.delay_s = delay_s

    def run(self, command: dict) -> dict:
        """Reply to one command dict (raises FakeControl for process-level faults)."""
        text = command.get("cmd")
        if not isinstance(text, str):
            return {"message": "Could not parse as a valid JSON command"}
        env = command.get("env")
        if env is not None and not (isinstance(env, int) and 0 <= env < len(self.envs)):
            return {"message": f"Unknown environment {env}."}
        for kind, value in _FAKE_RE.findall(text):
            if kind == "sleep":
                time.sleep(float(value))
            elif kind == "repl_message":
                return {"message": "Lean error:\nmaximum recursion depth has been reached"}
            else:
                raise FakeControl(kind)
        decls = dict(self.envs[env]) if env is not None else {}
        messages: list[dict] = []
        sorries: list[dict] = []
        if env is not None and re.search(r"^\s*import\s", text, re.M):
            messages.append(_message(text, 0, 6, "error", "invalid 'import' command, it must be used in the beginning of the file"))
        bogus = re.search(r"(?<![\w.])bogus\w*", text)
        decl = _DECL_RE.search(text)
        if decl is None:  # a header or a plain command
            if bogus:
                messages.append(_message(text, bogus.start(), bogus.end(), "error", f"unknown namespace '{bogus.group(0)}'"))
            for m in _AXIOMS_CMD_RE.finditer(text):
                messages.append(self._print_axioms(text, m, decls))
        else:
            if self.delay_s:
                time.sleep(self.delay_s)
            name = decl.group(1)
            proof_start = text.find(":= by", decl.end())
            proof_start = decl.end() if proof_start < 0 else proof_start + len(":= by")
            proof = text[proof_start:]
            signature = text[decl.end() : proof_start]
            bad_name = re.search(r"(?<![\w.])bogus\w*", signature)
            if bad_name:
                i = decl.end() + bad_name.start()
                messages.append(_message(text, i, i + len(bad_name.group(0)), "error", f"unknown identifier '{bad_name.group(0)}'"))
            if signature.count("(") != signature.count(")"):
                messages.append(_message(text, decl.start(), proof_start, "error", "unexpected token ':='; expected ')'"))
            axioms: set[str] = set()
            if re.search(r"\b(simp|norm_num|linarith|nlinarith|positivity|field_simp|ring_nf)\b", proof):
                axioms.update(STANDARD_AXIOMS)
            for m in re.finditer(r"\btrace\s+\"([^\"]*)\"", proof):
                i = proof_start + m.start()
                messages.append(_message(text, i, i + len(m.group(0)), "info", m.group(1)))
            for m in re.finditer(r"\bexact\?", proof):
                i = proof_start + m.start()
                messages.append(_message(text, i, i + 6, "info", "Try this: exact le_refl _"))
            body_code = re.sub(r"--[^\n]*", "", proof).strip()
            if bogus and bogus.start() >= proof_start:
                messages.append(_message(text, bogus.start(), bogus.end(), "error", f"unknown identifier '{bogus.group(0)}'"))
                axioms.add("sorryAx")
            elif body_code in ("", "skip"):
                messages.append(_message(text, decl.start(), proof_start, "error", "unsolved goals\n⊢ False"))
                axioms.add("sorryAx")
            for m in re.finditer(r"(?<![\w.])sorry(?![\w'])", proof):
                i = proof_start + m.start()
                sorries.append({"pos": _pos(text, i), "endPos": _pos(text, i + 5), "goal": "⊢ False"})
                axioms.add("sorryAx")
            if sorries:
                quote = "`sorry`" if self.sorry_backtick else "'sorry'"
                messages.append(_message(text, decl.start(), decl.end(), "warning", f"declaration uses {quote}"))
            if re.search(r"\bnative_decide\b", proof):
                axioms.add("Lean.ofReduceBool")
            decls[name] = sorted(axioms)
            for m in _AXIOMS_CMD_RE.finditer(text, proof_start):
                messages.append(self._print_axioms(text, m, decls))
        self.envs.append(decls)
        reply: dict = {"env": len(self.envs) - 1}
        if sorries:
            reply["sorries"] = sorries
        if messages:
            reply["messages"] = messages
        return reply

    @staticmethod
    def _print_axioms(text: str, match: re.Match, decls: dict) -> dict:
        name = match.group(1)
        if name not in decls:
            return _message(text, match.start(), match.end(), "error", f"unknown constant '{name}'")
        axioms = decls[name]
        data = f"'{name}' depends on axioms: [{', '.join(axioms)}]" if axioms else f"'{name}' does not depend on any axioms"
        return _message(text, match.start(), match.end(), "info", data)


def _render(reply: dict) -> str:
    """Like the real REPL: short replies on one line, long ones pretty-printed."""
    flat = json.dumps(reply, ensure_ascii=False)
    return flat if len(flat) <= 80 else json.dumps(reply, ensure_ascii=False, indent=1)


def _read_commands(stream):
    block: list[str] = []
    for line in stream:
        if line.strip():
            block.append(line)
        elif block:
            yield "".join(block)
            block = []
    if block:
        yield "".join(block)


def _act_out(kind: str) -> None:
    if kind == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        _log({"event": "child", "child_pid": child.pid, "child_started": start_ticks(child.pid)})
        time.sleep(600)
    elif kind == "crash":
        sys.stderr.write("INTERNAL PANIC: unreachable code has been reached\n")
        sys.stderr.flush()
        os._exit(134)
    elif kind == "leak":
        hoard = []
        while True:  # MemoryError under RLIMIT_AS ends the process (like Lean's OOM abort)
            hoard.append(bytearray(64 << 20))
    elif kind == "garbage":
        sys.stdout.write("uncaught exception: <garbage> {not json\n\n")
        sys.stdout.flush()


_LOG_PATH: str | None = None


def _log(record: dict) -> None:
    if _LOG_PATH:
        with open(_LOG_PATH, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(record, pid=os.getpid(), started=start_ticks(os.getpid()))) + "\n")


def main(argv=None) -> None:
    global _LOG_PATH
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--import-delay", type=float, default=0.0)
    parser.add_argument("--crash-on-nth", type=int, default=0)
    parser.add_argument("--sorry-backtick", action="store_true")
    parser.add_argument("--log", default=None)
    args = parser.parse_args(argv)
    _LOG_PATH = args.log
    _log({"event": "start"})
    lean = FakeLean(sorry_backtick=args.sorry_backtick, delay_s=args.delay)
    proofs = 0
    for raw in _read_commands(sys.stdin):
        try:
            command = json.loads(raw)
        except json.JSONDecodeError:
            reply = {"message": "Could not parse JSON"}
        else:
            text = command.get("cmd", "") if isinstance(command, dict) else ""
            if isinstance(text, str) and "env" not in command and re.search(r"^\s*import\s", text, re.M):
                if args.import_delay:
                    time.sleep(args.import_delay)
                _log({"event": "import", "header": text})
            elif isinstance(text, str) and _DECL_RE.search(text):
                proofs += 1
                _log({"event": "proof", "cmd": text})
                if args.crash_on_nth and proofs == args.crash_on_nth:
                    _act_out("crash")
            try:
                reply = lean.run(command) if isinstance(command, dict) else {"message": "not an object"}
            except FakeControl as control:
                _act_out(control.kind)
                continue
        sys.stdout.write(_render(reply) + "\n\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
