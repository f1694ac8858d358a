"""Pure verdict rules and text checks for Lean proofs (method.md §4 step 8 and §7).

Everything here is a pure function of strings and REPL reply dicts, so every backend
(local REPL pool, remote server) applies exactly the same rules:

- `scan_comments` / `strip_comments`: remove `--` and nested `/- -/` comments, aware of
  string and character literals (a `--` inside `"..."` is not a comment).
- `precheck`: text checks done before Lean ever sees the proof: banned search tactics
  (`apply?`, `exact?`, `rw?`), smuggled top-level commands, unterminated comments.
- `contains_try`: the Solver-reward penalty detector (plain substring by default, as in
  the official code; token-aware as an option).
- `theorem_name`, `parse_axioms`, `axioms_from_messages`: the `#print axioms` check.
- `judge`: the final verdict from the REPL reply to the proof and the axioms found.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Sequence

from sgs_jax.verify.interface import Status

ALLOWED_AXIOMS = frozenset({"propext", "Classical.choice", "Quot.sound"})
BANNED_TACTICS = ("apply?", "exact?", "rw?")

# Keywords that start a new top-level command or declaration. None of them is a tactic,
# so inside a proof body they can only mean the proof escapes into the file.
COMMAND_KEYWORDS = (
    "theorem", "lemma", "def", "abbrev", "instance", "example", "structure", "class",
    "inductive", "opaque", "axiom", "mutual", "namespace", "section",
    "universe", "variable", "import", "export", "attribute", "initialize",
    "builtin_initialize", "macro", "macro_rules", "elab", "elab_rules", "syntax",
    "declare_syntax_cat", "notation", "infix", "infixl", "infixr", "prefix", "postfix",
    "run_cmd", "run_elab", "run_meta", "noncomputable", "private", "protected", "unsafe",
    "partial", "deriving", "omit", "include", "add_decl_doc", "library_note",
)
# `open X in tac` and `set_option o v in tac` are tactic combinators; without `in` they
# are commands. `debug.*` options (e.g. debug.skipKernelTC) can switch checks off.
_SCOPED_IN = re.compile(
    r"(?:open\s+[^\n]*?\s+in|set_option\s+(?P<opt>[\w.]+)\s+\S+\s+in)(?![\w'!?])"
)

_IDENT_CHAR = r"[\w'!?.]"  # Lean identifier characters (plus `.` for qualified names)


def _keyword_pattern(words: Iterable[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    return re.compile(rf"(?<!{_IDENT_CHAR})(?:{alternatives})(?![\w'!?])")


_COMMAND_RE = _keyword_pattern(COMMAND_KEYWORDS)
_SCOPED_RE = _keyword_pattern(("open", "set_option"))
_HASH_COMMAND_RE = re.compile(r"(?<![\w'!?.])#[A-Za-z_]\w*")  # #eval, #print, #exit, ...
_ATTRIBUTE_RE = re.compile(r"@\[")  # @[implemented_by ...], @[simp] on a declaration
_BANNED_RE = re.compile(r"(?<![\w'!?.])(?:apply|exact|rw)\?")
_TRY_TOKEN_RE = re.compile(r"(?<![\w'!?.])try(?![\w'!?])")
_THEOREM_RE = re.compile(
    r"(?:^|\n)[ \t]*(?:@\[[^\]]*\][ \t\n]*)?(?:(?:private|protected|nonrec)\s+)*"
    r"(?:theorem|lemma)\s+(«[^»]+»|[^\s:({\[⦃]+)"
)
_AXIOMS_RE = re.compile(
    r"^'(?P<name>.+)' (?:depends on axioms: \[(?P<axioms>[^\]]*)\]|does not depend on any axioms)\s*$",
    re.S,
)
_SORRY_WARNINGS = ("declaration uses 'sorry'", "declaration uses `sorry`")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Outcome of the rules for one proof: a status and a short reason ("" if verified)."""

    status: Status
    reason: str = ""

    @property
    def verified(self) -> bool:
        return self.status is Status.VERIFIED


# ----------------------------------------------------------------------------- comments


def _blank(segment: str) -> str:
    """Spaces in place of every character but newlines (same length, same lines)."""
    return re.sub(r"[^\n]", " ", segment)


def scan_comments(text: str, blank_strings: bool = False, keep_positions: bool = False) -> tuple[str, bool]:
    """Remove Lean comments from `text`.

    Line comments (`--` to end of line) and block comments (`/- ... -/`, nested, including
    `/--` doc and `/-!` module comments) are replaced by one space; newlines inside a block
    comment are kept so line numbers survive. String (`"..."`) and character (`'x'`)
    literals are copied verbatim, or replaced by `""` / `' '` when `blank_strings` is set
    (for keyword scans that must not look inside strings).

    keep_positions: replace comments (and blanked literals) by spaces of the same length
    instead, so every index of the result points at the same character of `text`; an
    unterminated block comment then blanks to the end.

    Returns (text without comments, unterminated) where `unterminated` is True when a
    block comment or string literal never closes (it would swallow whatever follows).
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(_blank(text[i:end]) if keep_positions else " ")
            i = end
        elif text.startswith("/-", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/-", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("-/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(_blank(text[i:j]) if keep_positions else " " + "\n" * text.count("\n", i, j))
            if depth:
                return "".join(out), True
            i = j
        elif ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                out.append('""' if blank_strings and not keep_positions else text[i:])
                return "".join(out), True
            literal = text[i : j + 1]
            if blank_strings:
                literal = '"' + _blank(literal[1:-1]) + '"' if keep_positions else '""'
            out.append(literal)
            i = j + 1
        elif ch == "'" and (i == 0 or not re.match(r"[\w'!?.]", text[i - 1])):
            # A char literal 'x' or '\n'; otherwise a prime that is part of a name.
            m = re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)|[^\\'\n])'", text[i:])
            if m:
                literal = m.group(0)
                if blank_strings:
                    literal = "'" + _blank(literal[1:-1]) + "'" if keep_positions else "' '"
                out.append(literal)
                i += m.end()
            else:
                out.append(ch)
                i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out), False


def strip_comments(text: str) -> str:
    """`text` without Lean comments (see `scan_comments`)."""
    return scan_comments(text)[0]


# ----------------------------------------------------------------------------- text checks


def contains_try(proof: str, token_aware: bool = False) -> bool:
    """method.md §4 step 8 `try` penalty: does the comment-stripped proof contain `try`?

    Default is the official plain substring test (it also hits names such as
    `symmetry`); `token_aware=True` only counts `try` as a whole token outside strings.
    """
    if token_aware:
        code, _ = scan_comments(proof, blank_strings=True)
        return _TRY_TOKEN_RE.search(code) is not None
    return "try" in strip_comments(proof)


def find_banned_tactic(proof: str) -> str | None:
    """The first banned search tactic (`apply?`, `exact?`, `rw?`) in the proof code, or None."""
    code, _ = scan_comments(proof, blank_strings=True)
    m = _BANNED_RE.search(code)
    return m.group(0) if m else None


def find_smuggled_command(proof: str) -> str | None:
    """The first top-level command or declaration hidden in a proof body, or None.

    The proof is only the text after `:= by`; a command keyword, a `#command`, or an
    attribute `@[...]` there would add code to the checked file (it could run on the
    verifying host). `open ... in` / `set_option ... in` are allowed tactic combinators,
    except for `debug.*` options.
    """
    code, _ = scan_comments(proof, blank_strings=True)
    found = [m for m in (r.search(code) for r in (_COMMAND_RE, _HASH_COMMAND_RE, _ATTRIBUTE_RE)) if m]
    for m in _SCOPED_RE.finditer(code):
        scoped = _SCOPED_IN.match(code, m.start())
        if scoped is None or (scoped.group("opt") or "").startswith("debug."):
            found.append(m)
            break
    return min(found, key=lambda m: m.start()).group(0) if found else None


def precheck(proof: str) -> Verdict | None:
    """Text checks done before Lean: a REJECTED verdict, or None when the proof may be checked."""
    try:
        proof.encode("utf-8")
    except UnicodeEncodeError:
        return Verdict(Status.REJECTED, "proof is not valid UTF-8 text")
    _, unterminated = scan_comments(proof)
    if unterminated:
        return Verdict(Status.REJECTED, "unterminated comment or string literal")
    banned = find_banned_tactic(proof)
    if banned:
        return Verdict(Status.REJECTED, f"banned tactic {banned}")
    smuggled = find_smuggled_command(proof)
    if smuggled:
        return Verdict(Status.REJECTED, f"top-level command in proof: {smuggled}")
    return None


# ----------------------------------------------------------------------------- axioms


def theorem_name(statement: str) -> str | None:
    """Name declared by a trusted statement (`theorem NAME ...` / `lemma NAME ...`), or None."""
    m = _THEOREM_RE.search(strip_comments(statement))
    return m.group(1) if m else None


def axioms_command(name: str) -> str:
    """The Lean command whose info message lists the axioms `name` depends on."""
    return f"#print axioms {name}"


def parse_axioms(data: str, name: str | None = None) -> tuple[str, ...] | None:
    """Axioms listed by one `#print axioms` info message, or None if `data` is not one.

    "'foo' depends on axioms: [propext, Quot.sound]" -> ("propext", "Quot.sound");
    "'foo' does not depend on any axioms" -> (). With `name`, the message must be about it.
    """
    m = _AXIOMS_RE.match(data.strip())
    if m is None or (name is not None and _plain_name(m.group("name")) != _plain_name(name)):
        return None
    listed = m.group("axioms")
    return tuple(a.strip() for a in listed.split(",") if a.strip()) if listed else ()


def _plain_name(name: str) -> str:
    return name.replace("«", "").replace("»", "")


def _position(message: dict[str, Any]) -> tuple[int, int]:
    pos = message.get("pos") or {}
    return (int(pos.get("line", 0)), int(pos.get("column", 0)))


def axioms_from_messages(messages: Sequence[dict[str, Any]], name: str) -> tuple[str, ...] | None:
    """Axioms of `name` from the `#print axioms` that ran *last* in the checked text.

    Only the message at the latest position counts: the `#print axioms` command sits
    after the proof, so an earlier look-alike (say, printed by `trace` inside the
    proof) cannot stand in for it. None when the last message is not the axioms report.
    """
    if not messages:
        return None
    last = max(messages, key=_position)
    if last.get("severity") != "info":
        return None
    return parse_axioms(str(last.get("data", "")), name)


# ----------------------------------------------------------------------------- verdict


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def judge(reply: dict[str, Any], axioms: tuple[str, ...] | None) -> Verdict:
    """method.md §7 verdict for one REPL reply to statement+proof.

    reply: the REPL's JSON reply (`env`, optional `messages`, `sorries`), or a failure
      `{"message": ...}`.
    axioms: the axioms `#print axioms` listed for the theorem (None: no report found).
    Verified iff no error message, no sorries, no "declaration uses sorry" warning (both
    quote styles) and only propext / Classical.choice / Quot.sound as axioms.
    """
    failed = _elaboration_failure(reply)
    if failed:
        return failed
    if reply.get("sorries"):
        return Verdict(Status.REJECTED, "proof contains sorry")
    if _has_sorry_warning(reply):
        return Verdict(Status.REJECTED, "declaration uses sorry")
    if axioms is None:
        return Verdict(Status.REJECTED, "no #print axioms report for the theorem")
    extra = sorted(set(axioms) - ALLOWED_AXIOMS)
    if extra:
        return Verdict(Status.REJECTED, _short("disallowed axioms: " + ", ".join(extra)))
    return Verdict(Status.VERIFIED)


def judge_statement(reply: dict[str, Any]) -> Verdict:
    """Verdict of a statement check: the REPL's reply to statement + `sorry`.

    VERIFIED (well-formed) iff the reply has no error message and carries the
    declaration-uses-sorry warning (so the declaration was elaborated up to its proof);
    other warnings, such as linters, are tolerated. LEAN_ERROR otherwise."""
    failed = _elaboration_failure(reply)
    if failed:
        return failed
    if not _has_sorry_warning(reply):
        return Verdict(Status.LEAN_ERROR, "no declaration was elaborated (no sorry warning)")
    return Verdict(Status.VERIFIED)


def _elaboration_failure(reply: Any) -> Verdict | None:
    """The verdict for a reply that is no JSON object, a REPL failure or holds an error; else None."""
    if not isinstance(reply, dict):
        return Verdict(Status.SYSTEM_ERROR, "reply is not a JSON object")
    if "message" in reply and "env" not in reply:
        return Verdict(Status.LEAN_ERROR, _short(f"REPL failure: {reply['message']}"))
    for msg in reply.get("messages") or []:
        if msg.get("severity") == "error":
            return Verdict(Status.LEAN_ERROR, _short(f"error: {msg.get('data', '')}"))
    return None


def _has_sorry_warning(reply: dict[str, Any]) -> bool:
    """The reply warns that the declaration uses sorry (either quote style)."""
    return any(msg.get("severity") == "warning" and any(w in str(msg.get("data", "")) for w in _SORRY_WARNINGS)
               for msg in reply.get("messages") or [])
