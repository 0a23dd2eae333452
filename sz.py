#!/usr/bin/env python3
"""Lines of code (non-blank, non-comment) and code tokens per line, per file, per folder and in total under tinyc/; exits 1 over budget.

The budget counts lines. Tokens per line is density, what the line budget alone would let grow unseen: the code tokens (names,
operators, numbers, strings; not comments, docstrings or layout) over the lines that hold one, as tinygrad's sz.py counts them.
"""
import ast, os, pathlib, sys, tokenize
from collections import defaultdict

FILE_BUDGET = 400    # per file: split along a concept before a file grows past this
TOTAL_BUDGET = 9700  # whole package: raising it is its own deliberate commit
CODE_TOKENS = {tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING}

def loc(path: pathlib.Path) -> int:
  return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))

def code_tokens(path: pathlib.Path) -> tuple[int, int]:
  """(code tokens, lines holding at least one) of a Python file; docstrings are not code."""
  scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  docstrings = {(node.body[0].lineno, node.body[0].col_offset) for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, scopes) and ast.get_docstring(node, clean=False) is not None}
  with tokenize.open(path) as source:
    tokens = [token for token in tokenize.generate_tokens(source.readline) if token.type in CODE_TOKENS and token.start not in docstrings]
  return len(tokens), len({line for token in tokens for line in range(token.start[0], token.end[0] + 1)})

def report(counts: dict[str, tuple[int, int, int]]) -> None:
  """Print lines, tokens and tokens per line for each file, each folder and the total."""
  per_folder: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
  for name, numbers in counts.items():
    for i, n in enumerate(numbers): per_folder[name.rsplit("/", 1)[0] + "/"][i] += n
  width = max((len(name) for name in counts), default=10)
  def row(name: str, lines: int, tokens: int, code_lines: int) -> str:
    return f"{name:<{width}} {lines:5d} {tokens:6d} {tokens / max(code_lines, 1):11.1f}"
  print(f"{'file':<{width}} {'lines':>5} {'tokens':>6} {'tokens/line':>11}")
  for name, numbers in counts.items(): print(row(name, *numbers) + ("  <- over the per-file budget" if numbers[0] > FILE_BUDGET else ""))
  print("-" * (width + 25))
  for folder, numbers in sorted(per_folder.items()): print(row(folder, *numbers))
  total = [sum(numbers[i] for numbers in counts.values()) for i in range(3)]
  print(f"{row('total', *total)}   lines {total[0]} / {TOTAL_BUDGET}")

def main() -> int:
  root = pathlib.Path(__file__).resolve().parent
  counts = {path.relative_to(root).as_posix(): (loc(path), *code_tokens(path)) for path in sorted((root / "tinyc").rglob("*.py"))}
  try:
    report(counts)
    sys.stdout.flush()
  except BrokenPipeError:  # the reader stopped early (`python sz.py | head`): the rest goes nowhere, the budget still decides the exit
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
  total = sum(lines for lines, _, _ in counts.values())
  errors = [f"{name} has {lines} lines, over {FILE_BUDGET} per file: split it along a concept."
            for name, (lines, _, _) in counts.items() if lines > FILE_BUDGET]
  if total > TOTAL_BUDGET: errors.append(f"tinyc/ has {total} lines, over TOTAL_BUDGET={TOTAL_BUDGET}: shrink code, or raise it in its own commit.")
  for error in errors: print(f"error: {error}", file=sys.stderr)
  return 1 if errors else 0

if __name__ == "__main__":
  sys.exit(main())
