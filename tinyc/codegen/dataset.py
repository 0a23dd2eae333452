"""Layer 3: BEAM's dataset (issue 16): every candidate a search builds, with its kernel, kept as data in the cache's sqlite file for a
learned cost model. Imports dtype, ops, shape/, codegen/kernel, codegen/search (its sqlite cache).

A kernel is stored as JSON that reads back into the same AST (`ast_json`, `ast_from_json`): features are computed from it when a
model is trained, so a new feature needs no new search. Schema in design.md section 8.
"""
from __future__ import annotations
import dataclasses, hashlib, json
from typing import Any, Iterator, Sequence
from tinyc.dtype import BY_NAME, DType
from tinyc.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, LoadOps, MemBuffer, MovementOps, ReduceOps, TernaryOps, UnaryOps
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.shape.view import View
from tinyc.codegen.kernel import KernelTarget, Opt, OptOps
from tinyc.codegen.search import ast_text, cache_execute, opts_text

OP_KINDS = {kind.__name__: kind for kind in (UnaryOps, BinaryOps, TernaryOps, ReduceOps, MovementOps, BufferOps, LoadOps)}

def ast_json(ast: LazyOp) -> str:
  """The AST as JSON: each node [op, arg, sources], an op as "Kind.NAME", a buffer's views as [shape, strides, offset, mask]."""
  def st(tracker: ShapeTracker) -> list[Any]: return [[v.shape, v.strides, v.offset, v.mask] for v in tracker.views]
  def arg(value: Any) -> Any:
    if isinstance(value, MemBuffer): return {"buffer": value.idx, "dtype": value.dtype.name, "views": st(value.st)}
    if isinstance(value, ConstBuffer): return {"const": value.val, "dtype": value.dtype.name, "views": st(value.st)}
    if isinstance(value, DType): return {"dtype": value.name}
    return value  # None, or a reduce's axes
  def node(op: LazyOp) -> list[Any]: return [f"{type(op.op).__name__}.{op.op.name}", arg(op.arg), [node(src) for src in op.src]]
  return json.dumps(node(ast))

def ast_from_json(text: str) -> LazyOp:
  def st(views: list[Any]) -> ShapeTracker:
    return ShapeTracker(tuple(View.create(tuple(shape), tuple(strides), offset, None if mask is None else tuple(map(tuple, mask)))
                              for shape, strides, offset, mask in views))
  def arg(value: Any) -> Any:
    if isinstance(value, dict) and "buffer" in value: return MemBuffer(value["buffer"], BY_NAME[value["dtype"]], st(value["views"]))
    if isinstance(value, dict) and "const" in value: return ConstBuffer(value["const"], BY_NAME[value["dtype"]], st(value["views"]))
    if isinstance(value, dict): return BY_NAME[value["dtype"]]
    return tuple(value) if isinstance(value, list) else value
  def node(item: list[Any]) -> LazyOp:
    kind, name = item[0].split(".")
    return LazyOp(OP_KINDS[kind][name], tuple(node(src) for src in item[2]), arg(item[1]))
  return node(json.loads(text))

def record_candidates(ast: LazyOp, device_key: str, target: KernelTarget, rows: Sequence[tuple[tuple[Opt, ...], bool, float | None]]) -> None:
  """A searched kernel (table kernels: the hash of its AST text, the AST as JSON), the device's KernelTarget (table devices: its
  fields as JSON, which features need) and each candidate's Opt list, whether it built and its time in seconds (table candidates)."""
  kernel = hashlib.sha256(ast_text(ast).encode()).hexdigest()
  cache_execute("INSERT OR REPLACE INTO devices (device, target) VALUES (?, ?)", (device_key, json.dumps(dataclasses.asdict(target))))
  cache_execute("INSERT OR IGNORE INTO kernels (kernel, ast) VALUES (?, ?)", (kernel, ast_json(ast)))
  values = [(kernel, device_key, opts_text(opts), int(built), seconds) for opts, built, seconds in rows]
  for start in range(0, len(values), 100):  # (SQLite takes up to 999 parameters a statement)
    chunk = values[start:start + 100]
    places = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
    cache_execute(f"INSERT OR REPLACE INTO candidates (kernel, device, opts, built, seconds) VALUES {places}", sum(chunk, ()))

def targets() -> dict[str, KernelTarget]:
  """Each recorded device's KernelTarget, by device key."""
  def target(fields: dict[str, Any]) -> KernelTarget:
    values: dict[str, Any] = {name: tuple(value) if isinstance(value, list) else value for name, value in fields.items()}
    return KernelTarget(**values)
  return {device: target(json.loads(text)) for device, text in cache_execute("SELECT device, target FROM devices", ())}

def candidates(device_key: str | None = None) -> Iterator[tuple[LazyOp, str, tuple[Opt, ...], bool, float | None]]:
  """The dataset's rows, each (the kernel's AST, the device key, the Opt list, whether it built, its seconds), of one device or all."""
  where, parameters = ("WHERE candidates.device = ?", (device_key,)) if device_key is not None else ("", ())
  asts: dict[str, LazyOp] = {}
  for kernel, text, device, opts, built, seconds in cache_execute(
      f"SELECT kernels.kernel, kernels.ast, device, opts, built, seconds FROM candidates JOIN kernels USING (kernel) {where}", parameters):
    if kernel not in asts: asts[kernel] = ast_from_json(text)
    yield asts[kernel], device, tuple(Opt(OptOps[op], axis, amount) for op, axis, amount in json.loads(opts)), bool(built), seconds
