"""Housekeeping that CI enforces: ruff is clean, sz.py is under budget, the layering of docs/design.md section 1 holds, mypy passes."""
from __future__ import annotations
import ast, pathlib, subprocess, sys
from typing import Iterator
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tinyc"

def run(*args: str) -> subprocess.CompletedProcess[str]:
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)

def test_ruff_clean():
  paths = [p for p in ("tinyc", "test", "examples", "bench", "sz.py") if (ROOT / p).exists()]
  proc = run("-m", "ruff", "check", *paths)
  assert proc.returncode == 0, f"`ruff check {' '.join(paths)}` failed (try `ruff check --fix`):\n{proc.stdout}{proc.stderr}"

def test_sz_under_budget():
  proc = run("sz.py")
  assert proc.returncode == 0, f"`python sz.py` failed:\n{proc.stdout}{proc.stderr}"

def test_sz_counts_code_tokens_per_line(tmp_path):
  sys.path.insert(0, str(ROOT))
  try: import sz
  finally: sys.path.remove(str(ROOT))
  source = tmp_path / "example.py"
  source.write_text('"""A module docstring\nover two lines."""\nx = 1  # a comment\n\ndef f(a):\n  """A docstring."""\n  return a + 1\n')
  assert sz.code_tokens(source) == (13, 3)  # x = 1 | def f ( a ) : | return a + 1: comments, docstrings and layout tokens skipped
  lines = run("sz.py").stdout.splitlines()
  assert "tokens/line" in lines[0], lines[0]
  helpers = next(line for line in lines if line.startswith("tinyc/helpers.py")).split()
  tokens, code_lines = sz.code_tokens(PACKAGE / "helpers.py")
  assert helpers[2:] == [str(tokens), f"{tokens / code_lines:.1f}"], helpers

def test_sz_exits_quietly_when_its_reader_closes_early():
  # `python sz.py | head -3`: the reader goes away before sz.py writes
  proc = subprocess.Popen([sys.executable, "sz.py"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert proc.stdout is not None and proc.stderr is not None
  proc.stdout.close()
  stderr = proc.stderr.read().decode()
  assert proc.wait() == 0 and stderr == "", stderr

def test_ci_runs_readme_test_command():
  readme_commands = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if "python -m pytest" in line]
  assert len(readme_commands) == 1, f"expected exactly one test command in README.md, found {readme_commands}"
  ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  assert readme_commands[0] in ci_lines, f"README's test command {readme_commands[0]!r} is not a line of .ci/run: keep the two identical"

@pytest.mark.mypy
def test_mypy_clean():
  proc = run("-m", "mypy")  # files and settings come from [tool.mypy] in pyproject.toml
  assert proc.returncode == 0, f"mypy failed:\n{proc.stdout}{proc.stderr}"

# ***** layering (docs/design.md section 1) *****

# Layer of each top-level tinyc module or subpackage, lowest first. A module may import from its own layer and lower ones.
LAYERS: dict[str, int] = {
  "helpers": 1, "dtype": 1, "profiler": 1, "safetensors": 1,
  "shape": 2, "ops": 2,
  "codegen": 3,
  "runtime": 4, "device": 4, "beam": 4,
  "lazy": 5, "fusion": 5, "merge": 5, "schedule": 5, "index_check": 5, "realize": 5,
  "function": 6, "tensor": 6, "nn": 6, "jit": 6, "amp": 6,
}
TOP = 7  # the `tinyc` package itself (tinyc/__init__.py): only it may import anything
# Optional third-party backends: only the runtime file that needs them imports them, so `import tinyc` works without them.
BACKENDS = {"llvmlite", "pyopencl", "pycuda", "nvidia"}
# the LLVM renderer builds IR text with llvmlite's pure-Python IR builder (docs/design.md section 1); it loads no native code
RENDERER_IMPORTS = {"codegen/llvmir.py": "llvmlite.ir"}
ALLOWED_EVERYWHERE = set(sys.stdlib_module_names) | {"numpy", "tinyc", "__future__"}

def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

def is_module(name: str) -> bool:
  base = ROOT.joinpath(*name.split("."))
  return base.with_suffix(".py").exists() or (base / "__init__.py").exists()

def layer(name: str) -> int | None:
  parts = name.split(".")
  if len(parts) == 1: return TOP
  return 6 if parts[1].startswith("tensor_") else LAYERS.get(parts[1])

def imports(path: pathlib.Path) -> Iterator[tuple[int, str, bool]]:
  """(line, imported module, inside a function?) for every import in the file; `from pkg import name` resolves to pkg.name when that is a module."""
  this = module_name(path)
  package = this if path.name == "__init__.py" else this.rpartition(".")[0]
  def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[int, str, bool]]:
    if isinstance(node, ast.Import):
      for alias in node.names: yield node.lineno, alias.name, in_function
    elif isinstance(node, ast.ImportFrom):
      base_parts = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
      base = ".".join(base_parts + ([node.module] if node.module else []))
      for alias in node.names: yield node.lineno, f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base, in_function
    for child in ast.iter_child_nodes(node): yield from visit(child, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
  yield from visit(ast.parse(path.read_text(), filename=str(path)), False)

SOURCES = sorted(PACKAGE.rglob("*.py"))

def test_layering():
  errors = []
  for path in SOURCES:
    this, where = module_name(path), path.relative_to(ROOT)
    if (this_layer := layer(this)) is None:
      errors.append(f"{where}: module {this} has no layer: add it to LAYERS in test/test_style.py (and to docs/design.md section 1)")
      continue
    for line, target, _ in imports(path):
      if target.split(".")[0] != "tinyc" or this_layer == TOP: continue
      if (target_layer := layer(target)) is None: errors.append(f"{where}:{line}: imports {target}, which has no layer in LAYERS")
      elif target_layer > this_layer:
        errors.append(f"{where}:{line}: {this} (layer {this_layer}) imports {target} (layer {target_layer}): imports go downward only; "
                      "pass what the lower layer needs in as an argument instead")
  assert not errors, "layering violations (docs/design.md section 1):\n" + "\n".join(errors)

def test_no_tinyc_import_inside_functions():
  errors = [f"{path.relative_to(ROOT)}:{line}: imports {target} inside a function: import at the top of the module; a cycle means a layering problem"
            for path in SOURCES for line, target, in_function in imports(path) if in_function and target.split(".")[0] == "tinyc"]
  assert not errors, "\n".join(errors)

def test_third_party_imports_only_in_runtimes():
  errors = []
  for path in SOURCES:
    is_runtime = path.parent == PACKAGE / "runtime" and path.name.startswith("ops_")
    for line, target, _ in imports(path):
      top = target.split(".")[0]
      if top in ALLOWED_EVERYWHERE or (top in BACKENDS and is_runtime): continue
      if RENDERER_IMPORTS.get(str(path.relative_to(PACKAGE))) == target: continue
      hint = "only tinyc/runtime/ops_*.py may import a backend" if top in BACKENDS else "tinyc depends only on numpy and llvmlite (pyproject.toml)"
      errors.append(f"{path.relative_to(ROOT)}:{line}: imports {target}: {hint}")
  assert not errors, "\n".join(errors)
