"""What a start costs: a name checked before torch loads, imports transformers does not need kept out,
the process ended without the interpreter's slow teardown once a model ran."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_an_unknown_name_is_refused_before_torch_loads():
    r = python("""
        import sys
        from eaglechat.cli import main
        code = main(["run", "nosuch", "hi"])
        print(code, "torch" in sys.modules, "transformers" in sys.modules)
    """)
    assert r.stdout.split() == ["1", "False", "False"], r.stderr
    assert r.stderr.strip() == "eaglechat: error: unknown model 'nosuch'; run 'eaglechat list' to see the models"


def test_a_missing_folder_is_refused_before_torch_loads(tmp_path):
    r = python("""
        import sys
        from eaglechat.cli import main
        code = main(["run", sys.argv[1], "hi"])
        print(code, "torch" in sys.modules)
    """, str(tmp_path / "absent"))
    assert r.stdout.split() == ["1", "False"], r.stderr
    assert "no such model folder" in r.stderr


def test_loading_a_model_class_leaves_scipy_out():
    """transformers' detection losses import scipy.optimize when the check says scipy is there; after
    prepare() the check says False and a model class loads without it (and still decodes: the real
    default model's tests run through the same loader)."""
    code = """
        import sys
        if sys.argv[1] == "prepared":
            from eaglechat import lean_transformers
            lean_transformers.prepare()
        from transformers import AutoModelForCausalLM
        from transformers.models.llama import modeling_llama
        from transformers.utils import is_scipy_available
        print("scipy" in sys.modules, is_scipy_available())
    """
    assert python(code, "prepared").stdout.split() == ["False", "False"]
    assert python(code, "plain").stdout.split() == ["True", "True"]  # what prepare() changes


EXIT_PROBE = """
    import atexit, os, sys, threading, time
    import torch
    from eaglechat.cli import main

    class Teardown:
        def __del__(self):
            os.write(1, b"teardown ran\\n")

    keep = Teardown()  # a module global: freed by the interpreter's teardown, never by the fast exit
    atexit.register(lambda: print("atexit ran", flush=True))
    if sys.argv[1] == "worker":  # a non-daemon thread, still running when main() ends: the normal exit waits
        threading.Thread(target=lambda: (time.sleep(3), print("worker done", flush=True))).start()
    sys.argv = ["eaglechat", "list"]
    main()
"""


def test_after_torch_loaded_the_process_ends_without_the_teardown():
    r = python(EXIT_PROBE, "alone")
    assert r.returncode == 0, r.stderr
    assert "atexit ran" in r.stdout and "teardown ran" not in r.stdout
    assert "smollm2-135m-eagle2" in r.stdout  # the verb's own output came out first


def test_a_running_thread_gets_the_normal_exit():
    r = python(EXIT_PROBE, "worker")
    assert r.returncode == 0, r.stderr
    assert "worker done" in r.stdout and "atexit ran" in r.stdout
    assert "teardown ran" in r.stdout  # the probe sees a teardown when there is one


def test_a_call_from_python_returns_its_code():
    r = python("""
        import torch
        from eaglechat.cli import main
        print("code", main(["run", "nosuch", "hi"]))
        print("still here")
    """)
    assert "code 1" in r.stdout and "still here" in r.stdout
