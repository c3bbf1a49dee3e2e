"""Offline default: a small CP-Transformer character LM on local text, on a CPU in minutes.

No network: the corpus is a pinned snapshot of CPython 3.11.7's standard-library
sources that ships in the package (the same 4 MiB of text on every machine and
Python: ``data/corpus_snapshot.py``), turned into a byte-level corpus (vocabulary 256, like
enwik8) by our ``local_text`` TFDS builder, split 90/5/5 by a seeded rule spread
over the whole tree. Reports validation bits per character (BPC) with the paper's
overlapping-window protocol at a reduced context (256 bytes, step 128; the paper
uses 32k, step 512). Not a paper number: a smoke-sized version of the enwik8
setup (``configs/enwik8.py``) that exercises every part of the training system.

  python train.py --config configs/default.py --workdir /tmp/cp
  python train.py --config configs/default.py:baseline --workdir /tmp/base   # no ContextPool
  python train.py --config configs/default.py --workdir /tmp/cp2 \
      --config.model.context_pool.size_norm=softmax          # an ablation (A1)
  python train.py --config configs/default.py --workdir /tmp/cp_qkv \
      --config.model.context_pool_reads=qkv                  # the paper's reading (A6)
  python train.py --config configs/default.py --workdir /tmp/cp3 \
      --config.model.context_pool.ratio=0.025 --config.model.context_pool_heads=2

Every field of the model and of its ContextPool can be overridden so
(``train.py`` fills in the ones this file does not set, with the modules' defaults);
``<workdir>/config.json`` records them all.
"""

import ml_collections

from . import common

ARGS = ('', 'baseline')  # every argument get_config takes


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """``variant``: '' (CP-Transformer LM) or 'baseline' (the same LM without ContextPool)."""
  common.check_argument('configs/default.py', variant, ARGS)
  c = common.base_config()
  c.task = 'lm'
  c.num_train_steps = 500
  c.batch_size = 16
  c.log_every_steps = 50
  # Evaluation reads the whole validation split (below), so it runs once, at the end
  # (benchmarks/results/lm_study_notes.md, "What the default run's evaluation costs").
  c.eval_every_steps = c.num_train_steps
  c.checkpoint_every_steps = 250
  c.model = ml_collections.ConfigDict(
      dict(
          name='cp_transformer_lm',
          num_layers=2,
          emb_dim=256,
          mlp_dim=1024,
          num_heads=4,
          dropout_rate=0.0,
          context_pool_position='attention_input',
          # Only keys and values read the pooled features, queries the exact bytes
          # (docs/context_pool.md, A6: the paper's reading is 'qkv'): where training
          # ends, pooled keys and values end ahead of 'qkv' on every seed (docs/results.md).
          context_pool_reads='kv',
          # The ContextPool fields the paper's ablations change, at their defaults
          # (listed for reference; train.py fills in every other field).
          context_pool=dict(
              size_norm='sigmoid',
              residual=False,
              weights='learned',
              locality='gaussian',
              mapping='cnn',
          ),
      )
  )
  if variant == 'baseline':
    c.model.name = 'transformer_lm'
    c.model.context_pool = None
  c.optimizer.update(
      name='adamw',
      # Each arm's best peak rate on this config, the same for both (of 1e-3 .. 8e-3,
      # doubling; benchmarks/results/lm_study_notes.md, "The default run").
      learning_rate=2e-3,
      schedule='cosine',
      warmup_steps=50,
      weight_decay=0.01,
      grad_clip_norm=1.0,
  )
  c.dataset = ml_collections.ConfigDict(
      dict(
          name='local_text',
          data_dir='',
          files=(),
          max_bytes=4 * 2**20,
          allow_binary=False,
          # The seeded split of the files (docs/data.md): whole files up to 64 KiB (all of the
          # default corpus's), larger ones in 64 KiB blocks; 0 keeps every file whole.
          split_block_bytes=65536,
          split_seed=0,
          # Evaluation context = training length: sinusoidal positions do not extrapolate.
          seq_len=256,
          eval_context=256,
          eval_step=128,
          eval_batch_size=16,
          # The whole validation split (215,727 bytes): one model's BPC moved by 0.07 between
          # 64 KiB slices of the old corpus's (benchmarks/results/eval_spread.md).
          eval_max_bytes=0,
      )
  )
  return c
