"""transformers without the imports a single-device eager decode never uses, kept out of every start.

1. scipy. Loading any model class makes transformers (5.x) import its loss functions, and the
   object-detection ones import `scipy.optimize` (about 0.4 s of a 2-core machine's start) whenever
   `is_scipy_available()` answers True. transformers supports environments without scipy and skips that
   import when the check answers False; the check is a `functools.lru_cache`d function, and `prepare()`
   fills its cache with False for this process. eaglechat never computes a detection loss.

2. `torch._dynamo` and `torch.distributed.tensor` (with sympy, which `torch.fx`'s symbolic shapes pull in
   under both): about 1.1 s of a quiet 2-core machine's start (`eaglechat bench --startup MODEL
   --importtime`). transformers imports them at import time for names an eager single-device decode
   never calls: `transformers.masking_utils` imports `TransformGetItemToIndex` (used only for vmap-built
   masks), its continuous-batching cache and flex-attention wrap methods in `torch.compiler.disable`, and
   `transformers.distributed.sharding_utils` imports `DTensor` and tensor-parallel helpers. `kept_out()`
   is a window around transformers' imports in which those two packages are stand-ins (a finder at the
   front of `sys.meta_path`; `importlib.abc.MetaPathFinder`): every name read off a stand-in is a
   `Deferred` that loads the real module the moment it is used (called, read from, subclassed), so
   nothing runs against a fake; `isinstance(x, DTensor)` answers False without loading it while the real
   package is not loaded, since only the real package can make a DTensor. `torch.compiler.disable(fn)`
   in the window returns `fn` wrapped so that, once the real torch._dynamo is loaded (a compile was asked
   for), the call goes through the real `torch._dynamo.disable(fn)`, as transformers meant. When the
   window closes the stand-ins leave `sys.modules` and `torch`'s attributes; `torch.compile` then loads
   the real torch._dynamo as usual. What was read off the stand-ins is in `touched` (`--verbose` says it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# the module whose import-time branch reads the check: once it has loaded, prepare() changes nothing
ASKER = "transformers.loss.loss_for_object_detection"
KEPT_OUT = ("torch._dynamo",)
touched: dict[str, None] = {}  # "module.name" of every name read off a stand-in, in order
_window = {"open": False, "depth": 0}


def prepare() -> None:
    """Before transformers' modeling modules load: its scipy and torch.distributed checks answer False
    for this process. Imports transformers' utils, which loading any model needs next anyway."""
    if ASKER in sys.modules:
        return
    from transformers.utils import import_utils

    checks = (import_utils.is_scipy_available, import_utils.is_torch_distributed_available)
    real = import_utils._is_package_available, import_utils.is_torch_available
    import_utils._is_package_available = lambda *_args, **_kwargs: (False, "N/A")
    import_utils.is_torch_available = lambda: False  # what is_torch_distributed_available asks first
    try:
        for check in checks:
            check.cache_clear()
            check()
    finally:
        import_utils._is_package_available, import_utils.is_torch_available = real


def _kept_out(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in KEPT_OUT)


class StandIn(types.ModuleType):
    """A kept-out module while the window is open; afterwards every name read off it is the real one's."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if not _window["open"]:
            return getattr(importlib.import_module(self.__name__), name)
        touched[f"{self.__name__}.{name}"] = None
        if self.__name__ == "torch._dynamo" and name == "disable":
            return _deferred_disable
        if self.__name__ == "torch._dynamo" and name in MARKERS:
            return functools.partial(_marked_later, name)
        return Deferred(self.__name__, name)


class Deferred:
    """A name of a kept-out module: the real object, loaded the first time it is used."""

    def __init__(self, module: str, name: str):
        self._where = (module, name)

    def _real(self):
        module, name = self._where
        close()  # a use inside the window: the rest of the load gets the real modules too
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args, **kwargs):
        return self._real()(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name != "__wrapped__":
            raise AttributeError(name)
        return getattr(self._real(), name)

    def __mro_entries__(self, bases):  # `class X(Deferred)`: a subclass of the real class
        return (self._real(),)

    def _loaded(self) -> bool:
        return not isinstance(sys.modules.get(self._where[0]), (StandIn, type(None)))

    def __instancecheck__(self, obj) -> bool:  # only the real module makes its objects
        return self._loaded() and isinstance(obj, self._real())

    def __subclasscheck__(self, cls) -> bool:
        return self._loaded() and issubclass(cls, self._real())

    def __repr__(self) -> str:
        return "<deferred {}.{}>".format(*self._where)


# torch._dynamo's decorators that mark `fn` for the compiler and return `fn` itself (torch/_dynamo/
# decorators.py): in the window `fn` is returned at once and the real decorator runs on the same function
# when the real torch._dynamo loads, before anything can compile it
MARKERS = ("assume_constant_result", "allow_in_graph")
_marks: list[tuple[str, object]] = []


def _marked_later(decorator: str, fn):
    _marks.append((decorator, fn))
    return fn


def _deferred_disable(fn=None, recursive: bool = True, **options):
    """torch._dynamo.disable in the window: `fn` as it is until the real torch._dynamo loads, then through
    the real disable's wrapper (built once), which is what compiled code must meet."""
    if fn is None:
        return functools.partial(_deferred_disable, recursive=recursive, **options)
    real_disabled = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or isinstance(dynamo, StandIn):
            return fn(*args, **kwargs)
        if not real_disabled:
            real_disabled.append(dynamo.disable(fn, recursive, **options))
        return real_disabled[0](*args, **kwargs)

    return call


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """In the window: a StandIn for every kept-out module."""

    def find_spec(self, name, path=None, target=None):
        if not _kept_out(name):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        touched[module.__name__] = None


class _AfterRealLoad(importlib.abc.MetaPathFinder):
    """After the window: the real torch._dynamo's own spec, whose loading ends with the marks' replay."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = next(filter(None, (f.find_spec(name, path, target) for f in sys.meta_path
                                  if hasattr(f, "find_spec"))), None)
        if spec is None or spec.loader is None:
            return spec
        exec_real = spec.loader.exec_module

        def exec_module(module):
            exec_real(module)
            while _marks:
                decorator, fn = _marks.pop(0)
                getattr(module, decorator)(fn)

        spec.loader.exec_module = exec_module
        return spec


_FINDER = _Finder()


def _open() -> None:
    if any(_kept_out(name) for name in sys.modules):
        return  # already loaded for real (a compile, or a caller that imported them): nothing to keep out
    _window["open"] = True
    sys.meta_path.insert(0, _FINDER)


def close() -> None:
    """The window ends: no stand-in in sys.modules, in sys.meta_path or as an attribute of torch."""
    if not _window["open"]:
        return
    _window["open"] = False
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_FINDER)
    for name in [n for n, m in sys.modules.items() if isinstance(m, StandIn)]:
        del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if isinstance(getattr(sys.modules.get(parent), child, None), StandIn):
            delattr(sys.modules[parent], child)
    if _marks and not any(isinstance(f, _AfterRealLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterRealLoad())


@contextlib.contextmanager
def kept_out():
    """transformers' imports inside, without torch._dynamo and torch.distributed.tensor (the module's
    docstring); re-entrant. The scipy check is prepared too."""
    _window["depth"] += 1
    try:
        if _window["depth"] == 1:
            _open()
        prepare()
        yield
    finally:
        _window["depth"] -= 1
        if _window["depth"] == 0:
            close()
