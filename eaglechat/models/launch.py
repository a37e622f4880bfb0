"""Beyond one machine: the vLLM or SGLang command that serves a catalog model's base and EAGLE head on
a multi-GPU box with the same tree budget (`eaglechat show NAME --serve vllm|sglang [--tp N]`).

How eaglechat's budget maps (total_tokens = drafted nodes below the root, depth = longest drafted
path, top_k = children per node and nodes expanded per level):

- SGLang (EAGLE-2 dynamic trees, python/sglang/srt/speculative/eagle_utils.py): --speculative-num-steps
  = depth (one draft forward per level), --speculative-eagle-topk = top_k, and
  --speculative-num-draft-tokens = total_tokens + 1, because SGLang counts the verified root
  (`organize_draft_results` keeps the top `num_draft_token - 1` drafted nodes).
- vLLM (--speculative-config {"method": "eagle"|"eagle3", "model": HEAD, "num_speculative_tokens": N}):
  its EAGLE proposer drafts one chain, so N = depth; total_tokens and top_k (the tree's width) have no
  counterpart there.

Heads: eaglechat's EAGLE-1/2 heads use the official EAGLE-1 layout (config.json + model.safetensors:
fc + one decoder layer), which vLLM's "eagle" and SGLang's EAGLE load; EAGLE-3 heads use the official
EAGLE-3 layout (vLLM "eagle3", SGLang EAGLE3), including a reduced draft vocabulary (d2t/t2d). A
reduced draft vocabulary on an EAGLE-1/2 head (`draft_vocab_size` + `d2t`, eaglechat's extension) is
read by neither server's EAGLE-1/2 loader. Such a head has no lm_head of its own (it scores rows of the
base lm_head), so without `draft_vocab_size` and `d2t` the same weights are a full-vocabulary head; SGLang
can take the reduction back as FR-Spec's --speculative-token-map (the hot token ids = arange + d2t).
`--export-head DIR` writes that server-ready copy (and the token map for SGLang).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from eaglechat.engine.protocol import TreeBudget
from eaglechat.errors import UsageError

SERVERS = ("vllm", "sglang")
# chat formats with no Jinja template in the tokenizer: SGLang's built-in template names
SGLANG_TEMPLATES = {"vicuna": "vicuna_v1.1", "llama-2-chat": "llama-2"}


def reduced_draft_vocab(head_dir: str | None) -> int:
    """draft_vocab_size of a local EAGLE-1/2 head folder (0: full vocabulary, or not on disk)."""
    if not head_dir:
        return 0
    try:
        config = json.loads((Path(head_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    size = config.get("draft_vocab_size") or 0
    return int(size) if size and size != config.get("vocab_size") else 0


def export_head_for_server(head_dir: Path, out_dir: Path, server: str) -> Path | None:
    """A copy of a local head folder that `server` loads: an EAGLE-1/2 head with a reduced draft
    vocabulary loses `draft_vocab_size` and `d2t` (the same weights over the full vocabulary); for SGLang
    the reduction comes back as FR-Spec's token map (`token_map.pt`: the hot target ids = arange + d2t,
    which SGLang reads with torch.load(weights_only=True)). Other heads are copied as they are.
    -> the token map's path, or None."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from eaglechat.errors import WeightsError

    if server not in SERVERS:
        raise UsageError(f"--serve {server}: one of {', '.join(SERVERS)}")
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    if (out_dir.resolve() == head_dir.resolve()) or (out_dir.exists() and any(out_dir.iterdir())):
        raise UsageError(f"--export-head {out_dir}: give a new or empty folder (nothing is overwritten)")
    from eaglechat.engine.heads.files import read_weights  # any layout: single, .bin, sharded

    try:
        config = json.loads((head_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"cannot read the head in {head_dir}: {exc}") from None
    weights = read_weights(head_dir)
    reduced = reduced_draft_vocab(str(head_dir)) and "d2t" in weights and "midlayer.self_attn.q_proj.weight" not in weights
    out_dir.mkdir(parents=True, exist_ok=True)
    if not reduced:  # the folder as it is (config, weights, shards and index)
        for path in sorted(head_dir.iterdir()):
            if path.is_file():
                shutil.copyfile(path, out_dir / path.name)
        return None
    d2t = weights.pop("d2t")
    config.pop("draft_vocab_size", None)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if server != "sglang":
        return None
    token_map = out_dir / "token_map.pt"
    torch.save(torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64), token_map)
    return token_map


def launch_command(server: str, *, base: str, head: str, head_kind: str, tree: TreeBudget, tp: int = 1,
                   dtype: str = "auto", template: str = "tokenizer", host: str = "0.0.0.0",
                   token_map: str | None = None) -> list[str]:
    """argv of the server command (pure: testable without either server installed)."""
    if server not in SERVERS:
        raise UsageError(f"--serve {server}: one of {', '.join(SERVERS)}")
    if tp < 1:
        raise UsageError("--tp must be at least 1")
    dtype = dtype if dtype in ("float16", "bfloat16", "float32") else "auto"
    if server == "sglang":
        argv = ["python", "-m", "sglang.launch_server", "--model-path", base,
                "--speculative-algorithm", "EAGLE3" if head_kind == "eagle3" else "EAGLE",
                "--speculative-draft-model-path", head,
                "--speculative-num-steps", str(tree.depth),
                "--speculative-eagle-topk", str(tree.draft_top_k),
                "--speculative-num-draft-tokens", str(tree.total_tokens + 1),  # SGLang counts the root
                "--tp", str(tp), "--dtype", dtype, "--enable-metrics", "--host", host, "--port", "30000",
                "--api-key", "$EAGLECHAT_API_KEY"]
        if template in SGLANG_TEMPLATES:
            argv += ["--chat-template", SGLANG_TEMPLATES[template]]
        if token_map:
            argv += ["--speculative-token-map", token_map]
        return argv
    spec = {"method": "eagle3" if head_kind == "eagle3" else "eagle", "model": head,
            "num_speculative_tokens": tree.depth}
    return ["vllm", "serve", base, "--speculative-config", json.dumps(spec),
            "--tensor-parallel-size", str(tp), "--dtype", dtype,
            "--per-request-spec-decode-metrics", "detailed", "--host", host, "--port", "8000",
            "--api-key", "$EAGLECHAT_API_KEY"]


def launch_notes(server: str, *, tree: TreeBudget, head_kind: str, template: str, reduced_vocab: int,
                 port: int, exported: bool = False) -> list[str]:
    """What the user should know next to the command: what did not carry over, how to connect."""
    notes = []
    if server == "vllm":
        notes.append(f"vLLM's EAGLE proposer drafts a chain of {tree.depth} tokens: the tree's width "
                     f"(total_tokens {tree.total_tokens}, draft_top_k {tree.draft_top_k}) has no vLLM equivalent.")
        notes.append("--per-request-spec-decode-metrics puts tau on every reply; on a vLLM without that flag "
                     "drop it (eaglechat then reads the server-wide /metrics counters).")
        if template not in ("tokenizer",):
            notes.append(f"the head was trained on the '{template}' prompt format: pass vLLM a matching "
                         "--chat-template file.")
    else:
        notes.append(f"tree {tree.label()} = num-draft-tokens "
                     f"{tree.total_tokens + 1} (SGLang counts the root), num-steps {tree.depth}, eagle-topk "
                     f"{tree.draft_top_k}.")
    if reduced_vocab and head_kind != "eagle3" and exported:
        notes.append(f"the head's reduced draft vocabulary ({reduced_vocab} tokens) was exported as a "
                     "full-vocabulary head" + (" plus --speculative-token-map (FR-Spec)." if server == "sglang"
                                               else "; vLLM has no equivalent of the reduction."))
    elif reduced_vocab and head_kind != "eagle3":
        notes.append(f"this EAGLE-2 head has a reduced draft vocabulary ({reduced_vocab} tokens, eaglechat's "
                     "d2t extension), which neither server's EAGLE-1/2 loader reads: serve a copy without "
                     "draft_vocab_size (config.json) and d2t (model.safetensors), the same weights over the full "
                     "vocabulary" + (", and give SGLang the reduction as --speculative-token-map (FR-Spec)"
                                     if server == "sglang" else "") + "; --export-head DIR writes that copy.")
    notes.append(f"set EAGLECHAT_API_KEY to the same secret on the GPU box and here, then: "
                 f"eaglechat chat --remote http://HOST:{port}")
    return notes


def _quote(arg: str) -> str:
    return f'"{arg}"' if arg.startswith("$") else shlex.quote(arg)  # let the shell expand $EAGLECHAT_API_KEY


def format_command(argv: list[str]) -> str:
    """One shell line per flag (copy-pasteable)."""
    lines, i = [" ".join(map(_quote, argv[:3]))], 3
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(" ".join(map(_quote, argv[i:i + 2])))
            i += 2
        else:
            lines.append(_quote(argv[i]))
            i += 1
    return " \\\n    ".join(lines)


def serve_recipe(manifest, server: str, *, tp: int = 1, gpu: str = "h100", tree: TreeBudget | None = None,
                 export_dir: str | None = None) -> dict:
    """Everything `show NAME --serve` prints, for a catalog manifest: the tree is the shipped profile's for
    `gpu` (a name or GiB, as `eaglechat plan --gpu`) unless given. `export_dir`: write a copy of the local
    (embedded or pulled) head that the server loads there, and serve that."""
    from eaglechat.fit import hardware, profiles

    if tree is None:
        device = hardware.fake_gpu(gpu)
        prof = profiles.resolve_profile(device, manifest.shape, "none", user_dir=False)
        tree = prof.tree_for("none", manifest.shape, device)
    head, local_head = manifest.head_repo, None
    if manifest.is_embedded:  # the default head ships in this checkout: serve the folder
        local_head = str(manifest.head_path)
        head = local_head
    token_map = None
    if export_dir:
        if local_head is None:
            from eaglechat.models import hub

            local_head = str(hub.local_paths(manifest)[1])  # ModelNotFound (one line) when not pulled
        token_map = export_head_for_server(Path(local_head), Path(export_dir), server)
        head = str(Path(export_dir).resolve())
    argv = launch_command(server, base=manifest.base_repo, head=head, head_kind=manifest.head_kind, tree=tree,
                          tp=tp, dtype=manifest.dtype, template=manifest.template,
                          token_map=str(token_map.resolve()) if token_map else None)
    notes = launch_notes(server, tree=tree, head_kind=manifest.head_kind, template=manifest.template,
                         reduced_vocab=reduced_draft_vocab(local_head), port=30000 if server == "sglang" else 8000,
                         exported=bool(export_dir))
    for role, repo, sub in (("base", manifest.base_repo, manifest.base_subfolder),
                            ("head", manifest.head_repo, manifest.head_subfolder if local_head is None else "")):
        if sub:  # a server takes a repo id or a local folder, not a folder inside a repo
            notes.append(f"the {role} is the folder {sub}/ of {repo}: pull it ('eaglechat pull') and pass its "
                         "local folder ('eaglechat show --json' names it)" + (", or use --export DIR" if role == "head" else ""))
    if manifest.base_revision not in ("main", "") or (manifest.head_repo and manifest.head_revision not in ("main", "")):
        notes.append(f"pinned revisions (base {manifest.base_revision}, head {manifest.head_revision}): "
                     "download those first and pass the local folders.")
    return {"server": server, "argv": argv, "command": format_command(argv), "notes": notes,
            "tree": tree.to_dict(), "gpu": gpu, "tp": tp}
