"""MoE experts in 4-bit: each expert's matrices quantized to nf4 with bitsandbytes' functional API, and an
experts forward that runs only the routed experts through bitsandbytes' 4-bit matmul.

transformers 5 keeps an MoE's experts as fused 3D parameters (Qwen3MoeExperts, Qwen3NextExperts,
Qwen3_5MoeExperts, Gemma4TextExperts, MixtralExperts, GptOssExperts: `gate_up_proj` [E, 2I, H] and
`down_proj` [E, H, I], transposed for gpt-oss), not nn.Linear, so its bitsandbytes quantizer leaves them in
the compute dtype: a 30B-A3B model stays ~57 GB under `--quant 4bit`. Here, during a `--quant 4bit` load:

- `ExpertsNF4Quantizer` (transformers' `Bnb4BitHfQuantizer`, registered under its own quantization method
  with `transformers.quantizers.register_quantizer`) quantizes every Linear as bitsandbytes always does and,
  as each fused expert tensor is assigned (one layer's tensor at a time, never the whole model in 16 bits),
  quantizes it expert by expert with `bitsandbytes.functional.quantize_4bit` into one packed uint8 parameter
  [E, out*in/2] under the same name, with each expert's QuantState beside it (`module.nf4_states`).
- `nf4_experts_forward` is registered in transformers' `ExpertsInterface` (the hook its
  `@use_experts_implementation` decorator dispatches through) and set as the model's experts
  implementation. It reads the layout flags that decorator sets on every fused experts class (`has_gate`,
  `has_bias`, `is_transposed`, `has_post_expert_norm`) and calls the module's own `_apply_gate` (SwiGLU
  chunks, gpt-oss's interleaved clamped gate) and `act_fn`, so it computes what the class's own forward
  computes on the dequantized weights (tests/test_nf4_experts.py), for any class that decorator marks.

Which experts a token routes to is read back once per MoE layer (the tokens of each expert are gathered
on the host side of the loop), so a step with 4-bit experts is not captured as a CUDA graph: the capture
fails in one line and the engine decodes eagerly (engine/compile.py).
"""

from __future__ import annotations

import torch

EXPERTS_IMPLEMENTATION = "eaglechat_nf4"  # the name in transformers' ExpertsInterface
QUANT_METHOD = "eaglechat_nf4_experts"  # the quantization method the quantizer is registered under
BLOCKSIZE = 64  # bitsandbytes' 4-bit block (Params4bit's default): one absmax per 64 weights


def expert_weight_names(module) -> tuple[str, ...]:
    """The fused 3D expert matrices of `module` ("gate_up_proj"/"up_proj", "down_proj"), or () when it is
    not an experts module of transformers' fused layout."""
    if not hasattr(module, "is_transposed") or not hasattr(module, "has_gate"):
        return ()  # not marked by transformers' @use_experts_implementation
    names = ("gate_up_proj" if module.has_gate else "up_proj", "down_proj")
    params = [module._parameters.get(n) for n in names]
    if all(p is not None and p.dim() == 3 for p in params) or getattr(module, "nf4_states", None):
        return names
    return ()


def quantize_experts(weight: torch.Tensor, *, transposed: bool = False, double_quant: bool = True,
                     quant_type: str = "nf4") -> tuple[torch.Tensor, list]:
    """A fused [E, out, in] expert tensor ([E, in, out] when `transposed`) -> (packed uint8 [E, out*in/2],
    one bitsandbytes QuantState per expert). One expert's 16-bit copy exists at a time besides the input."""
    import bitsandbytes.functional as F

    experts = weight.shape[0]
    out_in = weight.shape[1] * weight.shape[2]
    packed = torch.empty(experts, (out_in + 1) // 2, dtype=torch.uint8, device=weight.device)
    states = []
    for e in range(experts):
        w = weight[e].t() if transposed else weight[e]  # bitsandbytes multiplies by [out, in] weights
        data, state = F.quantize_4bit(w.contiguous(), blocksize=BLOCKSIZE, compress_statistics=double_quant,
                                      quant_type=quant_type)
        packed[e].copy_(data.view(-1))
        states.append(state)
    return packed, states


def quantize_module(module, double_quant: bool = True) -> None:
    """An in-memory fused experts module's matrices to nf4, in place (what a 4-bit load does as they arrive)."""
    names = expert_weight_names(module)
    module.nf4_states = {}
    for name in names:
        packed, states = quantize_experts(module._parameters[name].data, transposed=module.is_transposed,
                                          double_quant=double_quant)
        module.nf4_states[name] = states
        module._parameters[name] = torch.nn.Parameter(packed, requires_grad=False)


def quantize_model_experts(model, double_quant: bool = True) -> int:
    """Every fused experts module of an in-memory model to nf4, and the model switched to the nf4 experts
    forward; -> how many modules were quantized."""
    modules = [m for m in model.modules() if expert_weight_names(m) and not getattr(m, "nf4_states", None)]
    for m in modules:
        quantize_module(m, double_quant)
    if modules:
        register()
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
    return len(modules)


def dequantize_experts(module, name: str) -> torch.Tensor:
    """The [E, out, in] weights the packed `name` stands for (tests, and a reference forward)."""
    import bitsandbytes.functional as F

    packed = module._parameters[name]
    return torch.stack([F.dequantize_4bit(packed[e].view(-1, 1), state)
                        for e, state in enumerate(module.nf4_states[name])])


def _matmul(module, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
    import bitsandbytes as bnb

    state = module.nf4_states[name][expert]
    y = bnb.matmul_4bit(x.to(state.dtype), module._parameters[name][expert].view(-1, 1), quant_state=state)
    if module.has_bias:
        y = y + getattr(module, f"{name}_bias")[expert].to(y.dtype)
    return y.to(x.dtype)


def nf4_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts contract: hidden_states [T, H], the routed experts [T, k] and their weights
    [T, k] -> [T, H], the weighted sum of each token's experts. Only the routed experts run."""
    if hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("4-bit MoE experts choose their experts on the host: a step with them cannot be "
                           "captured as a CUDA graph")
    first, down = expert_weight_names(self)
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    weights = top_k_weights.reshape(-1)
    order = torch.argsort(flat, stable=True)  # the (token, slot) pairs, grouped by expert
    counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # the one read back of this layer
    out = torch.zeros_like(hidden_states)
    start = 0
    for expert, n in enumerate(counts):
        pairs, start = order[start:start + n], start + n
        if n == 0 or expert >= self.num_experts:  # not routed to; >= E: expert-parallel sentinels
            continue
        tokens = pairs // k
        h = _matmul(self, first, expert, hidden_states[tokens])
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        y = _matmul(self, down, expert, h)
        if getattr(self, "has_post_expert_norm", False):
            y = self.post_expert_norm(y)
        out.index_add_(0, tokens, (y * weights[pairs, None]).to(out.dtype))
    return out


def register() -> None:
    """The experts forward and the quantizer, registered with transformers once per process."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING, register_quantizer

    if EXPERTS_IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, nf4_experts_forward)
    if QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(QUANT_METHOD)(_quantizer_class())


def experts_nf4_config(dtype, double_quant: bool = True):
    """transformers' BitsAndBytesConfig for nf4 whose load also quantizes the fused MoE experts."""
    from transformers import BitsAndBytesConfig

    register()
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=double_quant,
                                bnb_4bit_compute_dtype=dtype)
    config.quant_method = QUANT_METHOD  # AutoHfQuantizer.from_config picks the quantizer by this name
    return config


def quantized_experts(model) -> list:
    """The experts modules of `model` whose matrices are nf4."""
    return [m for m in model.modules() if getattr(m, "nf4_states", None)]


_QUANTIZER = None


def _quantizer_class():
    """ExpertsNF4Quantizer, built on first use (transformers' quantizer module imports bitsandbytes' glue)."""
    global _QUANTIZER
    if _QUANTIZER is not None:
        return _QUANTIZER
    from transformers.core_model_loading import ConversionOps
    from transformers.integrations.bitsandbytes import Bnb4bitQuantize
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    from transformers.quantizers.quantizers_utils import get_module_from_name, should_convert_module

    class ExpertsNF4Quantize(ConversionOps):
        """Quantize on assignment: a fused expert tensor expert by expert, anything else as bitsandbytes does."""

        def __init__(self, hf_quantizer):
            self.hf_quantizer = hf_quantizer
            self.linears = Bnb4bitQuantize(hf_quantizer)

        def convert(self, input_dict: dict, full_layer_name: str | None = None, model=None, **kwargs) -> dict:
            result = {}
            for param_name, value in input_dict.items():
                value = value[0] if isinstance(value, list) else value
                module, name = get_module_from_name(model, param_name)
                if name not in expert_weight_names(module):
                    result.update(self.linears.convert({param_name: value}, full_layer_name=full_layer_name,
                                                       model=model, **kwargs))
                    continue
                packed, states = quantize_experts(
                    value, transposed=module.is_transposed,
                    double_quant=self.hf_quantizer.quantization_config.bnb_4bit_use_double_quant,
                    quant_type=self.hf_quantizer.quantization_config.bnb_4bit_quant_type)
                del value  # the 16-bit layer goes as soon as it is packed
                if getattr(module, "nf4_states", None) is None:
                    module.nf4_states = {}
                module.nf4_states[name] = states
                result[param_name] = torch.nn.Parameter(packed, requires_grad=False)
            return result

    class ExpertsNF4Quantizer(Bnb4BitHfQuantizer):
        """bitsandbytes' 4-bit quantizer, plus nf4 per expert for transformers' fused MoE experts."""

        def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
            module, name = get_module_from_name(model, param_name)
            if name in expert_weight_names(module):
                return should_convert_module(param_name.rpartition(".")[0], self.modules_to_not_convert)
            return super().param_needs_quantization(model, param_name, **kwargs)

        def get_quantize_ops(self):
            return ExpertsNF4Quantize(self)

        def _process_model_after_weight_loading(self, model, **kwargs):
            model = super()._process_model_after_weight_loading(model, **kwargs)
            if quantized_experts(model):
                model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
            return model

    _QUANTIZER = ExpertsNF4Quantizer
    return _QUANTIZER
