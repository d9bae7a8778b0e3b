"""Exports of slmlab runs and checkpoints for tools that know nothing of slmlab.

* :func:`slmlab.export.hf.export_hf`: a transformers folder (``--to hf``); lumen and lfm2 as
  transformers' own ``LlamaForCausalLM`` / ``Lfm2ForCausalLM``, the other families as a
  self-contained remote-code folder (``trust_remote_code=True``).
* :func:`slmlab.export.gguf.export_gguf`: one llama.cpp GGUF file (``--to gguf``; lumen, lfm2).
* :mod:`slmlab.export.common`: what a run records about a checkpoint, and the output-folder rules.

This package imports nothing heavy by itself (``slmlab --help`` must stay fast): each module
imports torch/transformers inside its functions.
"""
