"""Inference: using a trained model, apart from training it.

* :mod:`.decoding` -- greedy decoding and beam search for the encoder-decoder
  Transformer (with the models' ``'cache'``);
* :mod:`.sampling` -- text from a byte-level language model;
* :mod:`.translation` -- sentences through a translation workdir's vocabulary.

The command line is :mod:`contextpool_jax.commands.sample` (``python -m contextpool_jax.commands.sample``).
Imports and loading a workdir or an export (:func:`contextpool_jax.runs.workdirs.load`)
need only the core install (``pip install contextpool-jax``: jax, flax, numpy,
ml_collections, safetensors); translating also needs sentencepiece (the [train] extra).
"""
