"""Inference: using a trained model, apart from training it.

* :mod:`.decoding` -- greedy decoding and beam search for the encoder-decoder
  Transformer (with the models' ``'cache'``);
* :mod:`.sampling` -- text from a byte-level language model;
* :mod:`.translation` -- sentences through a translation workdir's vocabulary.

The command line is :mod:`contextpool_jax.sample` (``python -m contextpool_jax.sample``).
Imports need only the core dependencies (jax, flax, numpy); loading a workdir
(:func:`contextpool_jax.workdirs.load`) needs the train extra.
"""
