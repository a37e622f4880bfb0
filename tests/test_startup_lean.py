"""transformers loaded without torch._dynamo (eaglechat/lean_transformers.py): the stand-in lives only
while transformers loads, decoding never meets it, and a compile afterwards gets the real torch._dynamo,
with transformers' compiler decorators applied as transformers meant. Each case runs in a fresh
interpreter: pytest's own process has torch._dynamo loaded already, and then nothing is kept out."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from tiny_models import save_tiny_pair

# the common part of each probe: after `lean_state()`, what a fresh process holds of the stand-in
PROBE = """
    import json, sys, types
    from eaglechat import lean_transformers

    def lean_state():
        import torch
        dynamo = sys.modules.get("torch._dynamo")
        return {
            "stand_ins": sorted(n for n, m in sys.modules.items() if isinstance(m, lean_transformers.StandIn)),
            "finder": any(isinstance(f, lean_transformers._Finder) for f in sys.meta_path),
            "torch_attr": isinstance(vars(torch).get("_dynamo"), lean_transformers.StandIn),
            "dynamo": None if dynamo is None else type(dynamo).__name__,
            "real_dynamo": dynamo is not None and hasattr(dynamo, "optimize"),
            "touched": list(lean_transformers.touched),
            "sympy": type(sys.modules["sympy"]).__name__ if "sympy" in sys.modules else None,
            "symbolic": "torch.fx.experimental.symbolic_shapes" in sys.modules,
        }
"""


def probe(code: str, *args: str, timeout: float = 300) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE) + textwrap.dedent(code), *args],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), "llama")


def test_a_load_leaves_no_stand_in_and_decodes_without_torch_dynamo(pair, tmp_path):
    base, head = pair
    state = probe("""
        import os
        from eaglechat.engine.protocol import Finished, GenerationParams
        from eaglechat.loader import load_engine

        engine = load_engine(sys.argv[1], head=sys.argv[2], quant="none", compile="off")
        after_load = lean_state()
        events = list(engine.generate([{"role": "user", "content": "Hello"}],
                                      GenerationParams(max_new_tokens=6, temperature=0.0)))
        print(json.dumps({**after_load, "finished": isinstance(events[-1], Finished),
                          "after_decode": lean_state()["dynamo"]}))
    """, str(base), str(head))
    assert state["touched"], "transformers read nothing off the stand-in: it was never needed"
    assert "torch._dynamo" in state["touched"]
    assert state["stand_ins"] == [] and not state["finder"] and not state["torch_attr"]
    assert state["dynamo"] is None  # kept out of the whole start
    assert state["sympy"] is None and not state["symbolic"]  # building on the meta device asked only plain guards
    assert state["finished"] and state["after_decode"] is None  # decoding never asked for it


def test_a_compile_after_a_lean_load_uses_the_real_torch_dynamo(pair):
    """`--compile on` (the loader's inductor path, with dynamo's cheap eager backend): the real torch._dynamo
    loads on demand, the decorators transformers applied in the window are replayed on it, and compiled
    greedy decoding equals the eager one's."""
    base, head = pair
    state = probe("""
        from eaglechat.engine import compile as compiled_steps
        from eaglechat.engine.protocol import GenerationParams, TreeBudget
        from eaglechat.loader import load_engine

        eager = load_engine(sys.argv[1], head=sys.argv[2], quant="none", compile="off", tree=TreeBudget(8, 3, 4))
        lean = lean_state()
        frames = []

        def backend(gm, example_inputs):
            frames.append(1)
            return gm.forward

        import torch
        compiled_steps.step_compiler = lambda device: lambda fn: torch.compile(
            fn, backend=backend, fullgraph=True, dynamic=False)
        engine = load_engine(sys.argv[1], head=sys.argv[2], quant="none", compile="on", tree=TreeBudget(8, 3, 4))
        params = GenerationParams(max_new_tokens=12, temperature=0.0, speculate=True)
        chat = [{"role": "user", "content": "Hello world"}]
        tokens = lambda e: [t for ev in e.generate(chat, params) for t in getattr(ev, "tokens", ())]
        from transformers import masking_utils
        with masking_utils.TransformGetItemToIndex():  # a name read in the window is the real one now
            pass
        print(json.dumps({"lean": lean, "after": lean_state(), "compiled": engine.info.compiled,
                          "frames": len(frames), "same": tokens(engine) == tokens(eager),
                          "marks_left": len(lean_transformers._marks)}))
    """, str(base), str(head))
    assert state["lean"]["dynamo"] is None and state["lean"]["touched"]
    after = state["after"]
    assert after["dynamo"] == "module" and after["real_dynamo"] and after["stand_ins"] == []
    assert state["compiled"] and state["frames"] > 0 and state["same"]
    assert state["marks_left"] == 0  # every decorator transformers applied in the window ran on the real one


def test_torch_compiler_disable_in_the_window_is_the_real_disable_once_compiling():
    """A function transformers wraps in torch.compiler.disable at import runs as it is in eager code, and
    torch.compile meets the real disable: under fullgraph=True it refuses to trace into it."""
    state = probe("""
        with lean_transformers.kept_out():
            import torch
            plus_one = torch.compiler.disable(lambda x: x + 1)
        eager = plus_one(torch.ones(2)).tolist()
        before = lean_state()["dynamo"]
        loose = torch.compile(lambda x: plus_one(x) * 2, backend="eager")(torch.ones(2)).tolist()
        try:
            torch.compile(lambda x: plus_one(x) * 2, backend="eager", fullgraph=True)(torch.ones(2))
            refused = False
        except Exception as exc:
            refused = "disable" in str(exc).lower() or "skip" in str(exc).lower()
        print(json.dumps({"eager": eager, "before": before, "loose": loose, "refused": refused}))
    """)
    assert state["eager"] == [2.0, 2.0] and state["before"] is None
    assert state["loose"] == [4.0, 4.0] and state["refused"]


def test_names_of_a_kept_out_module_load_it_when_used_and_not_before():
    state = probe("""
        with lean_transformers.kept_out():
            from torch._dynamo.eval_frame import OptimizedModule
            from torch._dynamo.utils import is_compile_supported
            import torch
            fake = isinstance(torch.nn.Linear(1, 1), OptimizedModule)  # nothing is an instance of a class never loaded
            # accelerate's is_compiled_module reads the class through the submodule: still not loaded
            deep = isinstance(torch.nn.Linear(1, 1), torch._dynamo.eval_frame.OptimizedModule)
            in_window = lean_state()["dynamo"]
            try:
                import torch._dynamo.no_such_module  # noqa: F401
                missing = "imported"
            except ImportError:
                missing = "ImportError"
            supported = is_compile_supported("cpu")  # a use: the real module loads, the window ends
        print(json.dumps({"fake": fake, "deep": deep, "in_window": in_window, "supported": supported,
                          "missing": missing, "after": lean_state()}))
    """)
    assert state["fake"] is False and state["deep"] is False and state["in_window"] == "StandIn"
    assert state["supported"] is True and state["missing"] == "ImportError"
    assert state["after"]["real_dynamo"] and state["after"]["stand_ins"] == [] and not state["after"]["finder"]


def test_added_tokens_written_into_the_tokenizer_config_load_the_same_tokenizer(pair, tmp_path):
    """The converted default model's tokenizer_config.json gets tokenizer.json's added tokens (a faster
    load): the tokenizer loaded with them is the one loaded without."""
    import shutil

    from transformers import AutoTokenizer

    from eaglechat.models.default_model import write_added_tokens

    base, _ = pair
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (base / name).exists():
            shutil.copy(base / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)  # as transformers 5 saves its TokenizersBackend
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    before = AutoTokenizer.from_pretrained(folder)
    write_added_tokens(folder)
    written = json.loads((folder / "tokenizer_config.json").read_text())
    assert written["added_tokens_decoder"] and not list(folder.glob("*.part"))
    after = AutoTokenizer.from_pretrained(folder)
    assert after.added_tokens_decoder == before.added_tokens_decoder
    assert after.all_special_ids == before.all_special_ids
    text = "<|im_start|>user\nHello world!<|im_end|>\n<|endoftext|> caf\u00e9"
    assert after(text)["input_ids"] == before(text)["input_ids"]
    assert after.decode(after(text)["input_ids"]) == before.decode(before(text)["input_ids"])
    write_added_tokens(folder)  # once written, left as it is
    assert json.loads((folder / "tokenizer_config.json").read_text()) == written


def test_a_cpu_kv_buffer_from_a_mapping_is_zeros_and_decodes_the_same(monkeypatch):
    """KV buffers of >= 1 MiB on a CPU come from an anonymous mapping (no page written before use): they
    read as zeros, take writes, grow, and decoding over them (eager and compiled steps) is the decoding over
    torch.zeros buffers, token for token."""
    import torch
    from tiny_models import random_head, tiny_model
    from torch._dynamo.testing import CompileCounterWithBackend

    from eaglechat.engine import cache
    from eaglechat.engine.compile import CompiledSteps
    from eaglechat.engine.decode import Decoder
    from eaglechat.engine.protocol import GenerationParams, TreeBudget

    big = cache.zeros((4, 256, 1024), torch.bfloat16, "cpu")  # 2 MiB
    assert big.shape == (4, 256, 1024) and big.dtype == torch.bfloat16 and not big.any()
    big[1, 2, 3] = 5
    assert big.sum().item() == 5 and big.untyped_storage().nbytes() == 2 << 20
    assert not cache.zeros((4, 4), torch.float32, None).any()

    model = tiny_model("llama")
    head = random_head(model)
    params = GenerationParams(max_new_tokens=24, temperature=0.0, speculate=True)

    def tokens(compiled: bool):
        decoder = Decoder(model, head, 512, prefill_chunk=16)
        if compiled:
            torch._dynamo.reset()
            counter = CompileCounterWithBackend("eager")
            decoder.use(CompiledSteps(decoder, lambda fn: torch.compile(fn, backend=counter, fullgraph=True,
                                                                         dynamic=False)))
        prompt = [t % model.config.vocab_size for t in (5, 9, 17, 33, 2, 8, 100, 7) * 3]
        out = [t for step in decoder.generate(prompt, params, TreeBudget(8, 3, 4), set()) for t in step.tokens]
        return out, decoder.cache

    zeroed, _ = tokens(False)
    monkeypatch.setattr(cache, "ZERO_PAGES_FROM", 0)  # every buffer from a mapping
    mapped, kv = tokens(False)
    assert kv.fused is not None and not kv.fused.untyped_storage().resizable()  # not torch's allocation
    assert mapped == zeroed
    assert tokens(True)[0] == zeroed
    torch._dynamo.reset()


def test_transformers_map_of_its_models_from_the_cache_is_its_own_scan(tmp_path, monkeypatch):
    """transformers scans every file of its models/ folder at import (its lazy map of names to modules);
    the map kept in eaglechat's cache folder is that scan's result, and a changed transformers scans again."""
    from pathlib import Path

    import transformers
    from transformers.utils import import_utils

    from eaglechat import lean_transformers

    monkeypatch.setenv("EAGLECHAT_HOME", str(tmp_path / "home"))
    models = Path(transformers.__file__).parent / "models"
    own = import_utils.define_import_structure(models, prefix="models")
    scans = []

    def scan():
        scans.append(1)
        return own

    assert lean_transformers._structure(models, scan) == own and len(scans) == 1  # scanned, written
    cached = lean_transformers._structure(models, scan)
    assert cached == own and cached is not own and len(scans) == 1  # read back, not scanned
    file = tmp_path / "home" / "cache" / lean_transformers.STRUCTURE_FILE
    saved = json.loads(file.read_text())
    saved["key"][2] = "0.0.0"  # another transformers version
    file.write_text(json.dumps(saved))
    assert lean_transformers._structure(models, scan) == own and len(scans) == 2
    file.write_text("{not json")
    assert lean_transformers._structure(models, scan) == own and len(scans) == 3
    package = import_utils.define_import_structure(str(models / "__init__.py"))  # models/__init__.py's own
    for _ in range(2):
        assert lean_transformers._structure(models, lambda: package, "") == package
    assert (file.parent / "transformers-import-structure-own.json").is_file()


def test_a_fresh_process_imports_transformers_through_the_cached_map(tmp_path):
    import os

    env = {**os.environ, "EAGLECHAT_HOME": str(tmp_path / "home")}
    code = textwrap.dedent("""
        import sys
        from eaglechat import lean_transformers
        with lean_transformers.kept_out():
            import transformers
            from transformers import AutoModelForCausalLM, LlamaConfig
            print(transformers.LlamaForCausalLM.__name__, LlamaConfig.model_type, AutoModelForCausalLM.__name__)
    """)
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split() == ["LlamaForCausalLM", "llama", "AutoModelForCausalLM"]
    cache = tmp_path / "home" / "cache"
    # transformers' own map and the one models/__init__.py builds of its own folder
    assert (cache / "transformers-import-structure.json").is_file()
    assert (cache / "transformers-import-structure-own.json").is_file()


@pytest.mark.slow
def test_the_default_model_folder_lists_its_added_tokens(default_base):
    config = json.loads((default_base / "tokenizer_config.json").read_text())
    added = json.loads((default_base / "tokenizer.json").read_text())["added_tokens"]
    assert config["added_tokens_decoder"] == {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
    assert len(added) == 17 and config["added_tokens_decoder"]["1"]["content"] == "<|im_start|>"


def test_a_setting_made_in_the_window_reaches_the_real_module():
    state = probe("""
        with lean_transformers.kept_out():
            import torch._dynamo
            torch._dynamo.config.recompile_limit = 99  # a library's setting at import: never lost on a stand-in
        import torch._dynamo.config
        print(json.dumps({"limit": torch._dynamo.config.recompile_limit, "after": lean_state()}))
    """)
    assert state["limit"] == 99 and state["after"]["real_dynamo"] and state["after"]["stand_ins"] == []


def test_a_model_loaded_in_the_window_is_transformers_own_load(pair):
    """Initializers skipped on the meta device and symbolic_shapes' stand-in change nothing loaded: every
    parameter and buffer (the rotary inverse frequencies, built on the meta device) and the logits equal
    a plain transformers load's."""
    import torch
    from transformers import AutoModelForCausalLM

    from eaglechat.loader import load_base

    base, _ = pair
    ours, _tokenizer = load_base(base, device="cpu", dtype=torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    mine, own = dict(ours.named_buffers()), dict(theirs.named_buffers())
    assert mine.keys() == own.keys() and any("inv_freq" in name for name in mine)
    assert all(torch.equal(mine[name], own[name]) for name in mine)
    params = dict(theirs.named_parameters())
    assert all(torch.equal(p, params[name]) for name, p in ours.named_parameters())
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_initializers_skip_only_meta_tensors_and_are_restored():
    import torch

    from eaglechat import lean_transformers

    originals = {name: getattr(torch.nn.init, name) for name in lean_transformers.INITIALIZERS}
    torch.manual_seed(0)
    outside = torch.nn.Linear(4, 3).weight.detach().clone()
    with lean_transformers.meta_init_skipped(), lean_transformers.meta_init_skipped():  # re-entrant
        torch.manual_seed(0)
        inside = torch.nn.Linear(4, 3).weight.detach().clone()  # a real tensor: initialized as ever
        meta = torch.empty(3, 4, device="meta")
        assert torch.nn.init.kaiming_uniform_(meta) is meta and torch.nn.init.normal_(meta) is meta
    assert torch.equal(inside, outside)
    assert {name: getattr(torch.nn.init, name) for name in originals} == originals


@pytest.mark.parametrize("name", sorted(__import__("eaglechat.lean_transformers").lean_transformers.PLAIN_ANSWERS))
def test_symbolic_shapes_answers_for_plain_values_are_torchs_own(name):
    """What the stand-in answers for plain values, against torch's own function on the same values (the
    real module is loaded in pytest's process): a torch that changes one fails here."""
    from torch.fx.experimental import symbolic_shapes

    from eaglechat import lean_transformers

    samples = {"sym_eq": [((2, 3), (2, 3)), ((2, 3), (3, 2)), (4, 4), ((1, (2,)), (1, (2,)))],
               "sym_and": [(True, False), (True, True, True)], "sym_or": [(False, False), (False, True)]}
    cases = samples.get(name, [(v,) for v in (True, False, 0, 1, 7, 2.5)])
    answered = 0
    for values in cases:
        answers, _answer = lean_transformers.PLAIN_ANSWERS[name]
        if not all(answers(v) for v in values):
            continue
        answered += 1
        assert lean_transformers._plain_answer(name, *values) == getattr(symbolic_shapes, name)(*values), values
    assert answered >= 2


def test_the_collector_is_held_back_for_the_start_and_the_loaded_engine_frozen(pair):
    """startup_gc.py: the program's start runs with rare collections; once load_engine has an engine, what
    is alive is frozen and the thresholds are the interpreter's own again."""
    base, head = pair
    state = probe("""
        import gc
        from eaglechat import cli, startup_gc
        from eaglechat.loader import load_engine

        own = gc.get_threshold()
        sys.argv = ["eaglechat", "list"]
        cli.run_verb = lambda argv: 0  # main's program path, without running a verb
        cli.main()
        during = gc.get_threshold()
        engine = load_engine(BASE, head=HEAD, quant="none", compile="off")
        print(json.dumps({"own": own, "during": during, "after": gc.get_threshold(),
                          "frozen": gc.get_freeze_count(), "starting": startup_gc.STARTING}))
    """.replace("BASE", repr(str(base))).replace("HEAD", repr(str(head))))
    assert state["during"] == state["starting"] != state["own"]
    assert state["after"] == state["own"] and state["frozen"] > 10_000
