"""The README and docs/design.md as a newcomer reads them: every repository file, folder and section they name exists."""
from __future__ import annotations
import fnmatch, pathlib, re
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ["README.md", "docs/design.md"]
URL = re.compile(r"[a-z]+://\S+")
# a path from the repository root (a folder may end in /), or a file name with one of these suffixes, possibly in a folder
# (`tensor_nn.py`, `runtime/ops_*.py`: short forms resolve to any repository file whose path ends that way)
PATH = re.compile(r"(?<![\w/.~$-])((?:\.ci|tinyc|examples|bench|docs|test)(?:/[\w.*-]+)+/?|(?:\.ci|tinyc|examples|bench|docs|test)/"
                  r"|[\w.*/-]*[\w*]\.(?:py|md|toml))(?![\w/])")
LINK = re.compile(r"\]\(([^)\s]+)\)")

def repository_files() -> list[str]:
  return [path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else "") for path in ROOT.rglob("*")
          if not {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"} & set(path.parts) and ".egg-info" not in str(path)]

def resolves(name: str, files: list[str]) -> bool:
  return bool(list(ROOT.glob(name.rstrip("/")))) or any(fnmatch.fnmatch(path.rstrip("/"), f"*/{name.rstrip('/')}") for path in files)

def anchors(markdown: str) -> set[str]:
  """GitHub's anchors for the headings of a markdown text: lower case, punctuation dropped, spaces as hyphens."""
  return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-") for line in markdown.splitlines() if line.startswith("#")}

@pytest.mark.parametrize("doc", DOCS)
def test_every_file_a_doc_names_exists(doc):
  assert (ROOT / doc).exists(), f"{doc} is missing"
  text, files = URL.sub("", (ROOT / doc).read_text()), repository_files()
  missing = sorted({name for name in PATH.findall(text) if not resolves(name, files)})
  assert not missing, f"{doc} names files that are not in the repository: {missing}"

@pytest.mark.parametrize("doc", DOCS)
def test_every_link_of_a_doc_leads_somewhere(doc):
  assert (ROOT / doc).exists(), f"{doc} is missing"
  broken = []
  for target in LINK.findall((ROOT / doc).read_text()):
    if URL.match(target): continue
    path, _, anchor = target.partition("#")
    linked = (ROOT / doc).parent / path if path else ROOT / doc
    if not linked.exists(): broken.append(f"{target}: no file {path}")
    elif anchor and anchor not in anchors(linked.read_text()): broken.append(f"{target}: no heading #{anchor} in {path or doc}")
  assert not broken, f"{doc} has broken links: {broken}"

def test_the_path_pattern_finds_what_it_should():
  text = "see `tinyc/codegen/tiles.py`, `.ci/run`, bench/ and `runtime/ops_*.py`; DESIGN.md section 1; not ~/.cache/tinyc/beam.db or x.T"
  assert PATH.findall(text) == ["tinyc/codegen/tiles.py", ".ci/run", "bench/", "runtime/ops_*.py", "DESIGN.md"]
