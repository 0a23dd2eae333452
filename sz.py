#!/usr/bin/env python3
"""Lines of code (non-blank, non-comment) per file, per folder and in total under tinyc/; exits 1 over budget."""
import pathlib, sys
from collections import defaultdict

FILE_BUDGET = 400    # per file: split along a concept before a file grows past this
TOTAL_BUDGET = 6000  # whole package: raising it is its own deliberate commit

def loc(path: pathlib.Path) -> int:
  return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))

if __name__ == "__main__":
  root = pathlib.Path(__file__).resolve().parent
  counts = {path.relative_to(root).as_posix(): loc(path) for path in sorted((root / "tinyc").rglob("*.py"))}
  per_folder: dict[str, int] = defaultdict(int)
  for name, n in counts.items(): per_folder[name.rsplit("/", 1)[0]] += n
  width = max((len(name) for name in counts), default=10)
  for name, n in counts.items(): print(f"{name:<{width}} {n:5d}{'  <- over the per-file budget' if n > FILE_BUDGET else ''}")
  print("-" * (width + 6))
  for folder, n in sorted(per_folder.items()): print(f"{folder + '/':<{width}} {n:5d}")
  total = sum(counts.values())
  print(f"{'total':<{width}} {total:5d} / {TOTAL_BUDGET}")
  errors = [f"{name} has {n} lines, over {FILE_BUDGET} per file: split it along a concept." for name, n in counts.items() if n > FILE_BUDGET]
  if total > TOTAL_BUDGET: errors.append(f"tinyc/ has {total} lines, over TOTAL_BUDGET={TOTAL_BUDGET}: shrink code, or raise it in its own commit.")
  for error in errors: print(f"error: {error}", file=sys.stderr)
  sys.exit(1 if errors else 0)
