"""Layer 6: TinyJit captures the kernels a function runs and replays them, skipping Python, scheduling and codegen.
Imports helpers, device, realize, index_check, tensor.

The first call runs normally (compiling every kernel), the second runs again while recording each launch and its
buffers, and later calls replay the recording with the new inputs' buffers swapped in (on CUDA as one graph launch). A call may
bind the Variables of symbolic sizes to other values (bound Variables as arguments, or in the inputs' shapes): the capture is
keyed by the unbound shapes, and a replay passes each kernel the new values (on CUDA launching them one by one: a graph bakes its
kernels' arguments in).
Everything the function computes must be realized by the time it returns (returned tensors are realized here; optimizers
realize what they update). The capture records only the calling thread's kernels; calls of one TinyJit from several threads
take turns (a replay swaps its inputs into the shared recording, and every call returns the same output buffers). The index
checks the function makes (index_check.py) are captured with it: every call's return reads them, a replay's too, and raises
for an index out of range.
"""
from __future__ import annotations
import contextlib, functools, threading
from typing import Any, Callable, Generic, TypeVar
from tinyc.helpers import AUTOCAST, DEBUG
from tinyc import profiler
from tinyc.shape.symbolic import Node, Variable, bound_values
from tinyc.device import Buffer, Device, Program
from tinyc.realize import Step, steps_run
from tinyc import index_check
from tinyc.index_check import IndexCheck
from tinyc.tensor import Tensor

ReturnType = TypeVar("ReturnType")

class JitError(RuntimeError):
  """A call that the captured kernels cannot serve."""

class TinyJit(Generic[ReturnType]):
  def __init__(self, fn: Callable[..., ReturnType]) -> None:
    self.fn = fn
    self.lock = threading.RLock()  # reentrant, as calling the function from inside itself was before
    self.reset()
    functools.update_wrapper(self, fn)  # type: ignore[arg-type]

  def reset(self) -> None:
    """Forget the capture: the next two calls run the function again."""
    self.calls = 0
    self.steps: list[Step] = []
    self.signature: tuple[Any, ...] | None = None
    self.input_slots: list[tuple[int, int, int]] = []  # (step, buffer position, input number)
    self.result: Any = None
    self.checks: list[IndexCheck] = []  # the index checks the captured kernels compute, read after each replay
    self.graph: Callable[[list[Buffer]], None] | None = None  # the device's one-launch replay of the steps, where it has one

  def __get__(self, instance: Any, owner: Any) -> Any: return functools.partial(self.__call__, instance)  # decorating a method

  def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
    with self.lock: return self._call(*args, **kwargs)

  def _call(self, *args: Any, **kwargs: Any) -> ReturnType:
    inputs = [value for value in list(args) + list(kwargs.values()) if isinstance(value, Tensor)]
    for tensor in inputs:  # an input must be its own realized buffer: that buffer is what replays swap in
      if tensor.lazydata.base is not tensor.lazydata or tensor.lazydata.realized is None: tensor.lazydata = tensor.contiguous().realize().lazydata
    var_vals = {var.unbind()[0]: value for value in [*args, *kwargs.values(), *[size for t in inputs for size in t.shape]]
                if isinstance(value, Node) for var, value in bound_values(value).items()}
    signature = tuple((_unbound(t.shape), t.dtype, t.device) for t in inputs) + tuple(_static(value) for value in list(args) + list(kwargs.items())
                                                                                      if not isinstance(value, Tensor))
    signature += (f"AUTOCAST={AUTOCAST.value}",)  # a step captured inside autocast computes in its dtypes: a call outside may not replay it
    if self.calls >= 2:
      if signature != self.signature:
        raise JitError(f"TinyJit {self.fn.__name__}: this call's inputs {signature} differ from the captured {self.signature}; "
                       "the captured kernels would compute the wrong thing. Call .reset() to capture again.")
      return self._replay([t.lazydata.realized for t in inputs], var_vals)  # type: ignore[misc]
    capturing = self.calls == 1
    if capturing: Tensor.corealize([])  # index checks made before this call run now, not as part of the capture
    step_record: contextlib.AbstractContextManager[list[Step]] = steps_run.record() if capturing else contextlib.nullcontext([])
    check_record: contextlib.AbstractContextManager[list[IndexCheck]] = index_check.checks_made.record() if capturing else contextlib.nullcontext([])
    with step_record as steps, check_record as checks:
      result = self.fn(*args, **kwargs)
      Tensor.corealize(_tensors_in(result))  # computes the index checks the function made, too
    if capturing:
      input_buffers = [t.lazydata.realized for t in inputs]
      self.steps, self.signature, self.result, self.checks = steps, signature, result, checks
      self.graph = _device_graph(steps)
      self.input_slots = [(step, position, input_buffers.index(buf)) for step, (_, buffers, _) in enumerate(steps)
                          for position, buf in enumerate(buffers) if any(buf is b for b in input_buffers)]
      if DEBUG >= 1: print(f"TinyJit {self.fn.__name__}: captured {len(steps)} kernels")
    self.calls += 1
    index_check.read_pending()
    return result

  def _replay(self, input_buffers: list[Buffer], var_vals: dict[Variable, int]) -> ReturnType:
    for step, position, number in self.input_slots: self.steps[step][1][position] = input_buffers[number]
    shown = profiler.shown()  # read once for every kernel of the replay
    if self.graph is not None and not shown.timed: self.graph(input_buffers)
    else:  # DEBUG=2 and PROFILE time each kernel: launch them one by one, each with this call's value of each of its Variables
      for run, buffers, captured in self.steps:
        run(buffers, {var: var_vals.get(var, value) for var, value in captured.items()} if captured else captured, shown)
    index_check.raise_if_out_of_range(self.checks)
    return self.result

def _device_graph(steps: list[Step]) -> Callable[[list[Buffer]], None] | None:
  """The device's graph of these steps (CUDA) where all are programs of that device, or None: they then replay one launch at a time."""
  programs = [run for run, _, var_vals in steps if isinstance(run, Program) and not var_vals]
  devices = {program.device for program in programs}
  if len(programs) != len(steps) or len(devices) != 1: return None
  make_graph = Device[devices.pop()].graph
  return None if make_graph is None else make_graph(steps)

def _tensors_in(value: Any) -> list[Tensor]:
  if isinstance(value, Tensor): return [value]
  if isinstance(value, (list, tuple)): return [t for item in value for t in _tensors_in(item)]
  if isinstance(value, dict): return [t for item in value.values() for t in _tensors_in(item)]
  return []

def _unbound(shape: tuple[Any, ...]) -> tuple[Any, ...]:
  return tuple(size.substitute({var: var.unbind()[0] for var in bound_values(size)}) if isinstance(size, Node) else size for size in shape)

def _static(value: Any) -> Any:
  """A non-tensor argument as part of the signature: its value is baked into the captured kernels (a bound Variable's is not)."""
  if isinstance(value, Variable) and value.val is not None: return value.unbind()[0]
  if isinstance(value, tuple): return tuple(map(_static, value))  # (a keyword argument: its name and value)
  try:
    hash(value)
    return value
  except TypeError: return repr(value)
