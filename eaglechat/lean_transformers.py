"""transformers without the imports a single-device eager decode never uses, kept out of every start.

1. scipy. Loading any model class makes transformers (5.x) import its loss functions, and the
   object-detection ones import `scipy.optimize` (about 0.4 s of a 2-core machine's start) whenever
   `is_scipy_available()` answers True. transformers supports environments without scipy and skips that
   import when the check answers False; the check is a `functools.lru_cache`d function, and `prepare()`
   fills its cache with False for this process. eaglechat never computes a detection loss.

2. `torch._dynamo` and `torch.distributed.tensor`: about 1.1 s of a quiet 2-core machine's start
   (`eaglechat bench --startup MODEL --importtime`), imported by transformers for names an eager
   single-device decode never calls. torch.distributed: transformers' `is_torch_distributed_available()`
   is seeded False like the scipy check, a configuration transformers supports (torch builds without
   distributed), so its sharding, FSDP and tensor-parallel modules skip their torch.distributed imports;
   eaglechat runs on one device. accelerate's `extract_model_from_parallel` (transformers'
   save_pretrained, when the default model is converted) imports FSDP and DTensor for isinstance checks:
   `torch.distributed.fsdp` and `torch.distributed.tensor` are stand-ins in the window below too. torch._dynamo: `transformers.masking_utils` imports
   `TransformGetItemToIndex` (used only for vmap-built masks), its continuous-batching cache and
   flex-attention wrap methods in `torch.compiler.disable`, and its FP8/DeepGEMM integrations mark
   functions with `assume_constant_result` / `allow_in_graph`. `kept_out()` is a window around
   transformers' loading in which those packages are stand-ins (a finder at the front of `sys.meta_path`,
   `importlib.abc.MetaPathFinder`): a name read off it is a `Deferred` that loads the real module the
   moment it is used (called, read from, subclassed), so nothing runs against a fake, and `isinstance(x,
   Deferred)` answers False while the real module is not loaded (only it makes its objects); `disable(fn)`
   returns `fn` wrapped so that once the real torch._dynamo is loaded (a compile was asked for) calls go
   through the real `disable(fn)`; the marking decorators return `fn` (as the real ones do,
   torch/_dynamo/decorators.py) and run for real on the same functions when the real module loads. When the
   window closes the stand-ins leave `sys.modules` and `torch`'s attributes, and `torch.compile` loads
   the real torch._dynamo as usual. What was read off them is in `touched`. (sympy is kept out by 4 below.)

3. transformers' map of its model classes. `import transformers` reads every source file under
   `transformers/models` (about 1,100) for its `__all__` to build its lazy name -> module map
   (`define_import_structure`, transformers/utils/import_utils.py): 0.35-0.75 s of every start. The map
   depends only on those files, so `cached_structure()` keeps it in eaglechat's cache folder, keyed by
   transformers' version and the files' count, sizes and newest change, and a later start reads it back
   (transformers' own scan whenever the key differs or the file cannot be read or written).

4. torch's weight initializers on the meta device. transformers (5.x) builds a model on the meta device and
   lets every module's `reset_parameters` run there: `torch.nn.init.normal_`, `kaiming_uniform_`, ... go
   through torch's Python reference kernels (torch/_refs) for values a meta tensor does not hold. In the
   window those initializers return a meta tensor as it is and run as ever on any other. The factories
   left (the rotary embedding's `arange`) still go through the reference kernels, whose checks import
   sympy (`isinstance(x, sympy.Basic)`) and `torch.fx.experimental.symbolic_shapes` (`torch._check` asks
   its `expect_true`): about 0.35 s of a quiet 2-core start. Both are stand-ins in the window as in 2, and
   the guards torch._check asks answer a plain bool as the real ones do; no sympy object or SymBool exists
   before the real modules load, so `isinstance` against their stand-ins answering False is true too.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

# the module whose import-time branch reads the check: once it has loaded, prepare() changes nothing
ASKER = "transformers.loss.loss_for_object_detection"
KEPT_OUT = ("torch._dynamo", "torch.distributed.tensor", "torch.distributed.fsdp")
SYMBOLIC = "torch.fx.experimental.symbolic_shapes"
# kept out too while nothing has loaded them (the module docstring, 4); one loaded does not end the window
ALSO_KEPT_OUT = (SYMBOLIC, "sympy")
# what torch._check and torch's reference kernels ask symbolic_shapes while a model is built on the meta
# device, answered for plain Python values as its own functions answer them
# (torch/fx/experimental/symbolic_shapes.py): name -> (the values it answers, the answer)
def _plain(*kinds):
    return lambda value: type(value) in kinds


def _plain_shape(value) -> bool:
    return type(value) is int or (type(value) in (tuple, list) and all(_plain_shape(v) for v in value))


_AS_GIVEN = lambda value: value  # noqa: E731
PLAIN_ANSWERS = {
    **{guard: (_plain(bool), _AS_GIVEN) for guard in ("expect_true", "guard_bool", "guard_size_oblivious",
                                                      "statically_known_true", "guard_or_false", "guard_or_true")},
    "guard_int": (_plain(int), _AS_GIVEN),
    "guarding_hint_or_throw": (_plain(bool, int), _AS_GIVEN),
    "has_guarding_hint": (_plain(bool, int, float), lambda value: True),
    "is_nested_int": (_plain(bool, int, float), lambda value: False),
    "sym_and": (_plain(bool), lambda *values: all(values)),
    "sym_or": (_plain(bool), lambda *values: any(values)),
    "sym_eq": (_plain_shape, lambda x, y: x == y),
}
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


def _kept_out(name: str, tops=KEPT_OUT + ALSO_KEPT_OUT) -> bool:
    return any(name == top or name.startswith(top + ".") for top in tops)


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
        if self.__name__ == SYMBOLIC and name in PLAIN_ANSWERS:
            return functools.partial(_plain_answer, name)
        return Deferred(self.__name__, name)

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("__") or isinstance(value, StandIn):  # the import system's own bookkeeping
            super().__setattr__(name, value)
            return
        close()  # a setting meant for the real module: it loads, and gets it
        setattr(importlib.import_module(self.__name__), name, value)


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
        module = ".".join(self._where)
        if _window["open"] and _is_module(module):  # torch._dynamo.eval_frame.OptimizedModule: still deferred
            touched[f"{module}.{name}"] = None
            return Deferred(module, name)
        return getattr(self._real(), name)

    def __setattr__(self, name: str, value) -> None:  # torch._dynamo.config.x = y: set on the real one
        if name == "_where":
            object.__setattr__(self, name, value)
        else:
            setattr(self._real(), name, value)

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


def _search_path(package: str):
    """The folders the real `package` has its submodules in (found, not imported), or None."""
    module = sys.modules.get(package)
    if module is not None and not isinstance(module, StandIn):
        return getattr(module, "__path__", None)
    parent = package.rpartition(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(package, _search_path(parent) if parent else None)
    return spec.submodule_search_locations if spec is not None else None


def _is_module(dotted: str) -> bool:
    """`dotted` names a real submodule (not an attribute of one)."""
    parent = dotted.rpartition(".")[0]
    search = _search_path(parent) if parent else None  # a top-level name: sys.path
    if parent and search is None:
        return False
    return importlib.machinery.PathFinder.find_spec(dotted, search) is not None


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


def _plain_answer(name: str, *values, **kwargs):
    """A function of symbolic_shapes: plain values answered as the real one answers them, anything else
    (a SymInt or SymBool, only made where the real module is loaded) by the real one."""
    answers, answer = PLAIN_ANSWERS[name]
    if not kwargs and all(answers(value) for value in values):
        return answer(*values)
    return getattr(importlib.import_module(SYMBOLIC), name)(*values, **kwargs)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """In the window: a StandIn for every kept-out module."""

    def find_spec(self, name, path=None, target=None):
        if not _kept_out(name) or not _is_module(name):  # a module torch lacks stays an ImportError
            return None
        top = next(t for t in KEPT_OUT + ALSO_KEPT_OUT if _kept_out(name, (t,)))
        loaded = sys.modules.get(top)
        if top != name and loaded is not None and not isinstance(loaded, StandIn):
            return None  # a submodule of a package that loaded for real: its own
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        touched[module.__name__] = None


class _AfterLoad(importlib.abc.MetaPathFinder):
    """Module `name`'s own spec, whose loading ends with `then(module)`; gone from sys.meta_path once used."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = next(filter(None, (f.find_spec(name, path, target) for f in sys.meta_path
                                  if hasattr(f, "find_spec"))), None)
        if spec is None or spec.loader is None:
            return spec
        exec_real, then = spec.loader.exec_module, self.then

        def exec_module(module):
            exec_real(module)
            then(module)

        spec.loader.exec_module = exec_module
        return spec


def _replay_marks(dynamo) -> None:
    """The real torch._dynamo has loaded: its marking decorators run on what transformers marked in the window."""
    while _marks:
        decorator, fn = _marks.pop(0)
        getattr(dynamo, decorator)(fn)


_FINDER = _Finder()


def _open() -> None:
    if any(_kept_out(name, KEPT_OUT) for name in sys.modules):
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
    if _marks and not any(isinstance(f, _AfterLoad) and f.name == "torch._dynamo" for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLoad("torch._dynamo", _replay_marks))


# -- transformers' map of its model classes, read once per installed transformers ----------------------
IMPORT_UTILS = "transformers.utils.import_utils"
STRUCTURE_FILE = "transformers-import-structure.json"


def cached_structure() -> None:
    """Before transformers' first import: its scan of models/ comes from eaglechat's cache folder once this
    transformers wrote it there (the module docstring, 3)."""
    if "transformers" in sys.modules or any(isinstance(f, _AfterLoad) and f.name == IMPORT_UTILS for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AfterLoad(IMPORT_UTILS, _cache_structure))


def _cache_structure(import_utils) -> None:
    real = import_utils.define_import_structure

    @functools.wraps(real)
    def define_import_structure(module_path, prefix=None):
        # transformers/__init__.py asks for models/ (prefix "models"), models/__init__.py for its own file
        folder = Path(module_path) if Path(module_path).is_dir() else Path(module_path).parent
        if folder.name != "models" or folder.parent.name != "transformers" or prefix not in (None, "models"):
            return real(module_path, prefix)
        return _structure(folder, lambda: real(module_path, prefix), prefix or "")

    import_utils.define_import_structure = define_import_structure


def _structure_key(models: Path) -> list:
    """What the scan read: every source file of models/ (count, newest change, total size), and the version."""
    stats = [entry.stat() for folder in os.scandir(models) if folder.is_dir()
             for entry in os.scandir(folder.path) if entry.name.endswith(".py")]
    version = getattr(sys.modules.get("transformers"), "__version__", "")
    return [str(models), version, len(stats), max((st.st_mtime_ns for st in stats), default=0),
            sum(st.st_size for st in stats)]


def _structure(models: Path, scan, prefix: str = "models"):
    try:
        from eaglechat import paths

        file, key = paths.cache_dir() / STRUCTURE_FILE, [prefix, *_structure_key(models)]
        if prefix != "models":
            file = file.with_name(file.name.replace(".json", f"-{prefix or 'own'}.json"))
    except Exception:  # noqa: BLE001 - no cache folder or an unreadable models/: transformers' own scan
        return scan()
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
        if saved["key"] == key:
            return {frozenset(backends): {module: set(names) for module, names in modules.items()}
                    for backends, modules in saved["structure"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    structure = scan()
    rows = [[sorted(backends), {module: sorted(names) for module, names in modules.items()}]
            for backends, modules in structure.items()]
    part = file.with_name(f".{file.name}.{os.getpid()}.part")  # two starts may both write it
    try:
        part.write_text(json.dumps({"key": key, "structure": rows}), encoding="utf-8")
        os.replace(part, file)
    except OSError:
        part.unlink(missing_ok=True)
    return structure


# torch.nn.init's in-place initializers (torch/nn/init.py), each taking the tensor first
INITIALIZERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


def _skipping_meta(initializer):
    @functools.wraps(initializer)
    def init(tensor, *args, **kwargs):
        return tensor if tensor.is_meta else initializer(tensor, *args, **kwargs)

    init.skips_meta = True
    return init


@contextlib.contextmanager
def meta_init_skipped():
    """torch.nn.init's initializers leave meta tensors alone inside (the module docstring, 4)."""
    import torch.nn.init

    originals = {name: getattr(torch.nn.init, name) for name in INITIALIZERS}
    for name, initializer in originals.items():
        if not getattr(initializer, "skips_meta", False):  # an outer window's already does
            setattr(torch.nn.init, name, _skipping_meta(initializer))
    try:
        yield
    finally:
        for name, initializer in originals.items():
            setattr(torch.nn.init, name, initializer)


@contextlib.contextmanager
def kept_out():
    """transformers' imports inside, without torch._dynamo and torch.distributed.tensor (the module's
    docstring); re-entrant. The scipy check is prepared too, and meta tensors are not initialized."""
    _window["depth"] += 1
    try:
        if _window["depth"] == 1:
            cached_structure()
            _open()
        prepare()
        with meta_init_skipped():
            yield
    finally:
        _window["depth"] -= 1
        if _window["depth"] == 0:
            close()
