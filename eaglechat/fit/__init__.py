"""What fits this machine: the hardware, the memory a model needs, and the plan that fits.

  hardware.py      the devices and dtypes of this machine
  memory.py        bytes a model, its KV cache and its draft tree need (ModelShape)
  planner.py       the device, dtype, quantization and context that fit (Planner)
  quantization.py  quantization names and their transformers configs
  bnb_dispatch.py  what bitsandbytes' kernels take on this machine (the 4-bit verify row limit)
  exactness.py     which (device, dtype, quant) decode exactly like plain greedy
  profiles/        per-hardware draft-tree defaults (YAML) and the results of `eaglechat tune`
"""
