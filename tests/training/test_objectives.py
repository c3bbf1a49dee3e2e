"""The objectives (contextpool_jax.training.objectives) against direct references."""

import numpy as np


def test_translation_objective_against_a_direct_reference():
  """Label smoothing in the trained loss only; padding (target 0) excluded; the
  reported loss, accuracy and perplexity are per real target token, unsmoothed."""
  import jax.numpy as jnp
  from contextpool_jax.training import objectives

  rng = np.random.default_rng(0)
  vocab, eps = 7, 0.1
  logits = rng.normal(size=(2, 5, vocab)).astype(np.float32)
  targets = rng.integers(1, vocab, (2, 5)).astype(np.int32)
  targets[1, 3:] = 0  # padding
  task = objectives.Translation(label_smoothing=eps)
  trained, sums = task.loss(jnp.asarray(logits), {'targets': jnp.asarray(targets)})

  ref_trained = ref_nll = ref_correct = count = 0.0
  for b in range(2):
    for t in range(5):
      if targets[b, t] == 0:
        continue
      z = logits[b, t].astype(np.float64)
      logp = z - z.max() - np.log(np.sum(np.exp(z - z.max())))
      smoothed = np.full(vocab, eps / vocab)
      smoothed[targets[b, t]] += 1.0 - eps
      ref_trained -= np.sum(smoothed * logp)
      ref_nll -= logp[targets[b, t]]
      ref_correct += float(np.argmax(z) == targets[b, t])
      count += 1
  np.testing.assert_allclose(float(trained), ref_trained, rtol=1e-5)
  np.testing.assert_allclose(float(sums['loss']), ref_nll, rtol=1e-5)
  assert float(sums['weight']) == count == 8
  assert float(sums['accuracy']) == ref_correct
  metrics = task.finalize({k: float(v) for k, v in sums.items()})
  np.testing.assert_allclose(metrics['perplexity'], np.exp(ref_nll / count), rtol=1e-5)
  np.testing.assert_allclose(metrics['accuracy'], ref_correct / count)
