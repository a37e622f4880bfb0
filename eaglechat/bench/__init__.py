"""`eaglechat bench`: EAGLE against plain decoding (and transformers' own decoders) on real prompts.

  prompts.py  MT-bench / HumanEval from PyPI data packages, or a JSONL file
  runs.py     one timed generation of one method -> Run (fair stops, cold prompt, counted forwards)
  runner.py   the schedule: warm-up, interleaved repeats per prompt, Ctrl-C keeps what is done
  summary.py  Results -> the JSON document (rates, spread, tau, acceptance, speedup, exact match)
  report.py   JSON document -> text on stdout
  plot.py     JSON document -> PNG
"""
