"""The arguments a verl launch script passes to `python -m verl.trainer.main_ppo`, expanded as bash
would with the script's own defaults (no environment given), without running bash.

A small pure interpreter of what verl's example scripts use: assignments (`NAME=word`, `export`,
`NAME=${NAME:-default}`, arrays `NAME=( ... )`), `$NAME` / `${NAME}` / `${NAME:-w}` / `${NAME:=w}` /
`"${NAME[@]}"`, `$((arithmetic))`, single and double quotes, `if` / `elif` / `else` with `[ ... ]`
tests (also as `[ ... ] && a=b || a=c`) and `case ... esac` on plain words, here-documents;
`set`, `unset`, `echo`, `mkdir`, `cd` and the preparation steps of PREPARATION are taken as having no
effect on the command line. A command substitution is replaced only where
COMMAND_SUBSTITUTIONS gives what it prints on the GPU node the script is written for. Anything else
on a path the script takes raises `Unsupported`, naming the construct and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ENTRY = "verl.trainer.main_ppo"
# what a command substitution prints where verl's scripts run (a GPU node without torch_npu)
COMMAND_SUBSTITUTIONS = {
    "python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu": "gpu",
    "date +%Y%m%d": "20260101",
    "date +%H%M%S": "000000",
    "date +%Y%m%d_%H%M": "20260101_0000",
    "date +%Y%m%d_%H%M%S": "20260101_000000",
    "pwd": ".",
}
NO_EFFECT = ("set", "unset", "echo", "mkdir", "cd", "ulimit")
# steps that fetch or prepare a model before the launch (`python get_model.py` too): no effect on it
PREPARATION = ("huggingface-cli", "hf", "cp", "cat", "wget", "pip")


class Unsupported(ValueError):
    """A construct this expander does not interpret, on a path the script takes."""


@dataclass
class _State:
    scalars: dict[str, str] = field(default_factory=lambda: {"HOME": "~", "PWD": "."})
    arrays: dict[str, list[str]] = field(default_factory=dict)
    command: list[str] | None = None


def _find_close(text: str, start: int, open_: str, close: str) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text.startswith(open_, i):
            depth += 1
        elif text.startswith(close, i):
            depth -= 1
            if depth == 0:
                return i
    raise Unsupported(f"unbalanced {open_!r} in {text!r}")


def _arith(expr: str, st: _State) -> str:
    expr = re.sub(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: st.scalars.get(m.group(1), "0") or "0", expr)
    if not re.fullmatch(r"[0-9+\-*/%() \t]*", expr):
        raise Unsupported(f"arithmetic {expr!r}")
    return str(int(eval(expr.replace("/", "//"))))  # noqa: S307 - digits and operators only (checked above)


def _param(body: str, st: _State) -> list[str] | str:
    """`${body}`: a scalar, or an array's words for `NAME[@]`."""
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[@\]", body)
    if m:
        return list(st.arrays.get(m.group(1), []))
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=+])(.*))?", body, re.S)
    if not m:
        raise Unsupported(f"parameter expansion ${{{body}}}")
    name, op, word = m.groups()
    value = st.scalars.get(name)
    if op is None:
        return value or ""
    if op.endswith("+"):  # the word where the variable is set (non-empty for :+)
        is_set = value is not None and (value != "" or op == "+")
        return _expand_string(word, st) if is_set else ""
    if value is None or (op.startswith(":") and value == ""):
        value = _expand_string(word, st)
        if op.endswith("="):
            st.scalars[name] = value
    return value


def _dollar(text: str, i: int, st: _State) -> tuple[list[str] | str, int]:
    """The expansion starting at text[i] == '$' and the index after it."""
    if text.startswith("$((", i):
        end = _find_close(text, i + 1, "(", ")")
        return _arith(text[i + 3:end - 1], st), end + 1
    if text.startswith("$(", i):
        end = _find_close(text, i + 1, "(", ")")
        inner = text[i + 2:end].strip()
        if inner not in COMMAND_SUBSTITUTIONS:
            raise Unsupported(f"command substitution $({inner})")
        return COMMAND_SUBSTITUTIONS[inner], end + 1
    if text.startswith("${", i):
        end = _find_close(text, i + 1, "{", "}")
        return _param(text[i + 2:end], st), end + 1
    if text.startswith("$@", i) or text.startswith("$*", i):
        return [], i + 2
    m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(text, i + 1)
    if not m:
        return "$", i + 1
    return st.scalars.get(m.group(0), ""), m.end()


def _expand_string(text: str, st: _State) -> str:
    return " ".join(_words(text, st, split=False)) if text else ""


def _words(text: str, st: _State, *, split: bool = True) -> list[str]:
    """Words of `text` after expansion and quote removal (unquoted expansions are split on blanks)."""
    words: list[str] = []
    cur: list[str] = []
    have = False  # the current word exists (even if empty: "")
    i, quote = 0, None
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = None
            else:
                cur.append(c)
            i += 1
        elif c == "\\" and i + 1 < len(text):
            cur.append(text[i + 1])
            have = True
            i += 2
        elif c == "$":
            value, i = _dollar(text, i, st)
            if isinstance(value, list):  # "${ARR[@]}" or "$@": one word per element
                if cur:
                    words.append("".join(cur))
                words.extend(value)
                cur, have = [], False
            elif quote == '"' or not split:
                cur.append(value)
                have = True
            else:
                parts = value.split()
                if parts and value[:1].isspace() and (cur or have):
                    words.append("".join(cur))
                    cur, have = [], False
                for j, part in enumerate(parts):
                    cur.append(part)
                    have = True
                    if j < len(parts) - 1:
                        words.append("".join(cur))
                        cur = []
        elif quote == '"':
            if c == '"':
                quote = None
            else:
                cur.append(c)
            i += 1
        elif c in "'\"":
            quote, have = c, True
            i += 1
        elif c in " \t\n" and split:
            if cur or have:
                words.append("".join(cur))
            cur, have = [], False
            i += 1
        elif c == "#" and split and not cur and not have:
            break  # a comment
        else:
            cur.append(c)
            have = True
            i += 1
    if quote:
        raise Unsupported(f"unterminated {quote} quote in {text!r}")
    if cur or have:
        words.append("".join(cur))
    return words


_TEST = re.compile(r"\[\[?\s+(.*?)\s+\]\]?")


def _test(cond: str, st: _State) -> bool:
    """`[ a = b ] && [ -n c ] || ...` (left to right, as bash's && / || chain)."""
    parts = re.split(r"\s*(&&|\|\|)\s*", cond.strip())
    result = _one_test(parts[0], st)
    for op, term in zip(parts[1::2], parts[2::2]):
        result = (result and _one_test(term, st)) if op == "&&" else (result or _one_test(term, st))
    return result


def _one_test(term: str, st: _State) -> bool:
    m = _TEST.fullmatch(term.strip())
    if not m:
        raise Unsupported(f"condition {term!r}")
    args = _words(m.group(1), st)
    if len(args) == 2 and args[0] in ("-n", "-z"):
        return bool(args[1]) == (args[0] == "-n")
    if len(args) == 3:
        a, op, b = args
        ops = {"=": a == b, "==": a == b, "!=": a != b}
        if op in ops:
            return ops[op]
        nums = {"-gt": "__gt__", "-lt": "__lt__", "-ge": "__ge__", "-le": "__le__", "-eq": "__eq__", "-ne": "__ne__"}
        if op in nums:
            return getattr(int(a), nums[op])(int(b))
    raise Unsupported(f"test [ {m.group(1)} ]")


def _open_quote(text: str) -> bool:
    quote = None
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote and (quote == "'" or text[i - 1] != "\\") else quote
        elif c in "'\"" and (i == 0 or text[i - 1] != "\\"):
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            break
    return quote is not None


def _logical_lines(script: str) -> list[str]:
    """Lines with backslash-newline continuations and quoted newlines joined, comment-only lines
    and here-documents dropped."""
    out, buf, heredoc = [], "", None
    for line in script.splitlines():
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if buf and _open_quote(buf):
            buf += line + ("\n" if not line.rstrip().endswith("\\") else "")
            if not _open_quote(buf):
                out.append(buf)
                buf = ""
            continue
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if m:
            heredoc = m.group(1)
        if line.strip().startswith("#") and not buf:
            continue
        if line.strip().startswith("#"):  # a comment inside a continued command ends it in bash
            out.append(buf)
            buf = ""
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
        elif _open_quote(buf + line):
            buf += line + "\n"
        else:
            out.append(buf + line)
            buf = ""
    if buf:
        out.append(buf)
    return [line for line in out if line.strip()]


def _statements(line: str) -> list[str]:
    """A line split at top-level `;` (outside quotes, `$( )`, `${ }` and `[ ]`)."""
    out, cur, depth, quote = [], [], 0, None
    for c in line:
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == ";" and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(c)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _first_word_text(text: str) -> str:
    """`text` up to its first unquoted blank outside `${ }` / `$( )` (not expanded)."""
    quote, depth = None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
        elif c in " \t" and depth == 0:
            return text[:i]
    return text


def _run_simple(stmt: str, st: _State, lineno: int) -> None:
    if stmt.startswith("[") and re.search(r"\]\s*(&&|\|\|)", stmt):  # [ test ] && a || b
        m = re.fullmatch(r"(\[\[?.*?\]\]?)\s*&&\s*(.*?)(?:\s*\|\|\s*(.*))?", stmt)
        if not m:
            raise Unsupported(f"line {lineno}: {stmt[:60]!r}")
        test, then, otherwise = m.groups()
        branch = then if _test(test, st) else otherwise
        if branch:
            _run_simple(branch.strip(), st, lineno)
        return
    if re.search(r"python3?\s+-m\s+" + re.escape(ENTRY) + r"\b", stmt):  # also after `ray job submit ... --`
        head, _, rest = stmt.partition(ENTRY)
        rest = re.split(r"\s(?:\d?>>?|\||&(?!&))", " " + rest)[0]  # redirections and pipes end the arguments
        st.command = _words(rest, st)
        return
    m = re.fullmatch(r"(?:export\s+|local\s+|readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", stmt, re.S)
    if m:
        name, append, value = m.groups()
        if value.startswith("(") and value.rstrip().endswith(")"):
            words = _words(value.strip()[1:-1], st)
            st.arrays[name] = (st.arrays.get(name, []) if append else []) + words
        else:
            value = _first_word_text(value)  # an assignment's value is one word; a comment may follow
            words = _words(value, st, split=False) if value else [""]
            st.scalars[name] = (st.scalars.get(name, "") if append else "") + (words[0] if words else "")
        return
    word = stmt.split()[0]
    if word == "export":  # export NAME (no value)
        return
    if word == "unset":
        for name in stmt.split()[1:]:
            st.scalars.pop(name, None)
        return
    if word in NO_EFFECT or word in PREPARATION or word in (":", "true") or re.fullmatch(r"python3?\s+\S+\.py", stmt):
        return
    raise Unsupported(f"line {lineno}: command {word!r} ({stmt[:60]!r})")


def expand(script: str) -> list[str]:
    """The arguments after `python -m verl.trainer.main_ppo` in `script`; raises Unsupported."""
    st = _State()
    lines = _logical_lines(script)
    # frames: [taking this branch, a branch was taken already, the enclosing frame takes its body]
    frames: list[list] = []
    case_word: list[str] = []
    i = 0

    def active() -> bool:
        return all(f[0] for f in frames)

    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("#!"):
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\(\s*(.*)", line)
        if m and not m.group(3).rstrip().endswith(")"):  # a multi-line array
            body = [m.group(3)]
            while i < len(lines) and not (lines[i].strip() == ")" or lines[i].rstrip().endswith(" )")):
                body.append(lines[i])
                i += 1
            if i < len(lines):  # the closing line, with what a backslash joined before it
                body.append(lines[i].rstrip()[:-1])
            i += 1
            if active():
                name = m.group(1)
                words = [w for part in body for w in _words(part, st)]
                st.arrays[name] = (st.arrays.get(name, []) if m.group(2) else []) + words
            continue
        for stmt in _statements(line):
            kw = stmt.split()[0]
            if kw in ("if", "elif"):
                cond = re.sub(r"^(if|elif)\s+", "", stmt)
                cond = re.sub(r"\s*;?\s*then$", "", cond)
                if kw == "if":
                    outer = active()
                    take = outer and _test(cond, st)
                    frames.append([take, take, outer])
                else:
                    f = frames[-1]
                    take = f[2] and not f[1] and _test(cond, st)
                    f[0], f[1] = take, f[1] or take
            elif kw == "then":
                rest = stmt[4:].strip()
                if rest and active():
                    _run_simple(rest, st, i)
            elif kw == "else":
                f = frames[-1]
                f[0] = f[2] and not f[1]
                f[1] = True
                rest = stmt[4:].strip()
                if rest and active():
                    _run_simple(rest, st, i)
            elif kw == "fi":
                frames.pop()
            elif kw == "case":
                mm = re.fullmatch(r"case\s+(.*?)\s+in", stmt)
                if not mm:
                    raise Unsupported(f"line {i}: case {stmt!r}")
                outer = active()
                case_word.append(_expand_string(mm.group(1), st) if outer else "")
                frames.append([False, False, outer])
            elif kw == "esac":
                frames.pop()
                case_word.pop()
            elif stmt == ";;" or stmt == ";":
                continue
            elif case_word and re.match(r"[^\s()=]+\)", stmt) and frames[-1][2] is not None:
                pattern, _, rest = stmt.partition(")")
                f = frames[-1]
                alternatives = [_expand_string(p.strip(), st) for p in pattern.split("|")]
                take = f[2] and not f[1] and any(p == "*" or p == case_word[-1] for p in alternatives)
                f[0], f[1] = take, f[1] or take
                rest = rest.strip().removesuffix(";;").strip()
                if rest and active():
                    for sub in _statements(rest):
                        _run_simple(sub, st, i)
            elif active():
                if kw in ("for", "while", "until", "function") or re.match(r"\w+\(\)", stmt):
                    raise Unsupported(f"line {i}: {kw!r} ({stmt[:60]!r})")
                _run_simple(stmt.removesuffix(";;").strip(), st, i)
    if st.command is None:
        raise Unsupported(f"no `python -m {ENTRY}` command")
    return st.command
