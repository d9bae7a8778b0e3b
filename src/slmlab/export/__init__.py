"""Exports of slmlab runs and checkpoints for tools that know nothing of slmlab.

* :func:`slmlab.export.hf.export_hf`: a transformers folder (``--to hf``); a family with a
  transformers twin as transformers' own class, the others as a self-contained remote-code folder
  (``trust_remote_code=True``).
* :func:`slmlab.export.gguf.export_gguf`: one llama.cpp GGUF file (``--to gguf``; the families with
  a llama.cpp architecture).
* :mod:`slmlab.export.common`: what a run records about a checkpoint, and the output-folder rules.

What each family needs from a target is declared in the family's own ``convert.py`` (``EXPORT``,
a :class:`slmlab.models.export_info.ExportInfo`) and looked up through the registry; nothing here
names a family.

This package imports nothing heavy by itself (``slmlab --help`` must stay fast): each module
imports torch/transformers inside its functions.
"""
