"""Launch scripts as engines publish them: shell variables set in the script, read before its
argument list is.

Megatron-LM's and Megatron-DeepSpeed's example scripts set the plan in variables (``TP=8``,
``GPUS_PER_NODE=8``, ``WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))``) and pass the arguments through
bash arrays (``GPT_MODEL_ARGS=( --num-layers 96 ... )`` then ``${GPT_MODEL_ARGS[@]}``). The arrays'
words are read where they are defined; :func:`expand` substitutes the scalar variables the script
sets (its last assignment of each outside ``if``/``for``/``while``/``case`` blocks, whose branches
it cannot decide; integer arithmetic ``$(( ))`` over those included), and leaves the others
(``$1``, variables from the environment) for the reader to name in its error.
"""

from __future__ import annotations

import ast
import operator
import re

ASSIGN = re.compile(r"^\s*(?:export\s+|declare\s+(?:-\w+\s+)?|local\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
ARITHMETIC = re.compile(r"^\$\(\((.*)\)\)$")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
             ast.Div: operator.floordiv, ast.Mod: operator.mod}
#: at most this many lines are read: a launch script has tens
MAX_ASSIGNMENTS = 10_000
OPENERS = ("if", "for", "while", "until", "case")
CLOSERS = ("fi", "done", "esac")


def assignments(text: str) -> dict[str, str]:
    """The scalar variables ``text`` sets, each to its last value (quotes and a trailing comment
    removed, its own references to earlier variables substituted, ``$(( ))`` evaluated where every
    operand is known). Arrays (``NAME=(``) are not scalars and are skipped."""
    out: dict[str, str] = {}
    depth = 0  # inside if/for/while/case: a branch the reader cannot decide, so its assignments are not read
    for line in text.splitlines()[:MAX_ASSIGNMENTS]:
        words = line.split()
        if words and words[0] in OPENERS:
            depth += 1 - sum(w.rstrip(";") in CLOSERS for w in words[1:])
            continue
        if words and words[0].rstrip(";") in CLOSERS:
            depth = max(0, depth - 1)
            continue
        m = ASSIGN.match(line)
        if depth or m is None or m.group(2).startswith("("):
            continue
        value = _unquote(_strip_comment(m.group(2)))
        value = _substitute(value, out)
        arith = ARITHMETIC.match(value)
        if arith is not None:
            number = _arithmetic(arith.group(1).replace("$", ""), out)
            value = value if number is None else str(number)
        out[m.group(1)] = value
    return out


def expand(text: str) -> str:
    """``text`` with every ``$NAME`` / ``${NAME}`` the script itself sets replaced by its value."""
    return _substitute(text, assignments(text))


def unresolved(value: str) -> bool:
    """Whether ``value`` still holds a shell reference (a variable the script does not set)."""
    return "$" in value


def _substitute(value: str, known: dict[str, str]) -> str:
    return REFERENCE.sub(lambda m: known.get(m.group(1) or m.group(2), m.group(0)), value)


def _strip_comment(value: str) -> str:
    quote = None
    for i, ch in enumerate(value):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        elif ch == "#" and quote is None and (i == 0 or value[i - 1].isspace()):
            return value[:i].strip()
    return value.strip()


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _arithmetic(expr: str, known: dict[str, str]) -> int | None:
    """Bash integer arithmetic over literals and known variables (+ − × / %); None otherwise."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            text = known.get(node.id, "")
            return int(text) if text.lstrip("-").isdigit() else None
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            a, b = value(node.left), value(node.right)
            if a is None or b is None or (b == 0 and type(node.op) in (ast.FloorDiv, ast.Div, ast.Mod)):
                return None
            if abs(a) > 10**12 or abs(b) > 10**12:
                return None
            return OPERATORS[type(node.op)](a, b)
        return None

    return value(tree.body)
