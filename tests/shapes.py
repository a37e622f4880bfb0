"""Model shapes for the memory, planner and profile tests, written out from the models' config.json
(lmsys/vicuna-7b-v1.3, lmsys/vicuna-13b-v1.3, meta-llama/Llama-3.1-8B-Instruct) rather than read from
the catalog, so a wrong manifest cannot make a test agree with itself."""

from eaglechat.fit.memory import ModelShape

VICUNA_7B = ModelShape(
    params=6_738_415_616, num_layers=32, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
    num_key_value_heads=32, head_dim=128, vocab_size=32000, max_context=2048,
)
VICUNA_13B = ModelShape(
    params=13_015_864_320, num_layers=40, hidden_size=5120, intermediate_size=13824, num_attention_heads=40,
    num_key_value_heads=40, head_dim=128, vocab_size=32000, max_context=2048,
)
LLAMA31_8B = ModelShape(
    params=8_030_261_248, num_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, vocab_size=128256, max_context=131072,
)
