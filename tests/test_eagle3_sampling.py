"""Sampling with an EAGLE-3 head and a reduced draft vocabulary follows the target distribution: the
drafts never propose 3 of the 8 tokens, the emitted tokens still come out exactly as plain sampling
(chi-square against the enumerated joint of the 2nd and 3rd tokens, as in test_engine_sampling)."""

import torch
from test_engine_sampling import PROMPT, V, chi2_pvalue, exact_joint, sampling_model

from eaglechat.engine.decode import Decoder
from eaglechat.engine.heads import Eagle3Config, Eagle3Head, init_weights
from eaglechat.engine.heads.eagle3 import set_draft_vocab
from eaglechat.engine.protocol import GenerationParams, TreeBudget

DRAFT_IDS = [0, 2, 3, 5, 7]


def test_reduced_vocab_eagle3_sampling_matches_target_distribution():
    model = sampling_model(num_layers=3).requires_grad_(False)  # EAGLE-3 fuses layers 2, N//2, N-3
    torch.manual_seed(3)
    head = init_weights(Eagle3Head(Eagle3Config.for_base(model.config, draft_vocab_size=5), model.get_input_embeddings()), std=0.3)
    set_draft_vocab(head, DRAFT_IDS)
    head.eval()
    params = GenerationParams(temperature=1.0, max_new_tokens=3)
    joint = exact_joint(model, params)
    assert joint[[1, 4, 6]].sum() > 0.05  # tokens the draft can never propose do occur
    decoder = Decoder(model, head, 64)
    counts = torch.zeros(V, V)
    drafted_outside = 0
    for seed in range(800):
        params.seed = seed
        steps = list(decoder.generate(PROMPT, params, TreeBudget(total_tokens=8, depth=3, draft_top_k=3), set()))
        out = [t for s in steps for t in s.tokens]
        drafted_outside += sum(t not in DRAFT_IDS for s in steps for t, d in zip(s.tokens, s.drafted) if d)
        counts[out[1], out[2]] += 1
    assert drafted_outside == 0
    assert chi2_pvalue(counts, joint) > 1e-3
