"""Shared recipe of the enwik8 / text8 character-level LM configs (ContextPool Sec. 4.1).

12 layers, 512 hidden, 8 heads, 2048 filter, 256 bytes (39M parameters with
ContextPool); three stages of increasing length and batch (2048/32, 4096/32,
8192/16), 530k steps in total, dropout 0.2, weight decay 0.01, linear warm-up.
The paper does not say how the 530k steps split over the stages nor the
learning rate; following Longformer's staged recipe (which the paper follows)
we use 430k + 50k + 50k steps, AdamW at 2.5e-4 with 10k warm-up steps in stage
1, halving the rate at each later stage, and constant within a stage. Stage 2
and 3 start from the previous stage's parameters: pass its workdir as
``--config.init_from``.

Evaluation: the paper's overlapping-window protocol with step 512, at a context
of 8192 (the last stage's length) rather than 32k: our LM uses absolute
sinusoidal positions, which do not extrapolate beyond the trained length.
"""

import ml_collections

from . import common

STAGES = {  # stage: (sequence length, batch size, steps, learning rate)
    'stage1': (2048, 32, 430_000, 2.5e-4),
    'stage2': (4096, 32, 50_000, 1.25e-4),
    'stage3': (8192, 16, 50_000, 6.25e-5),
}
KINDS = ('cp', 'baseline')
# Every argument of enwik8.py / text8.py ('<stage>' is '<stage>,cp').
ARGS = tuple(s if k == 'cp' else f'{s},{k}' for s in STAGES for k in KINDS)


def char_lm_config(dataset: str, arg: str) -> ml_collections.ConfigDict:
  parts = [a.strip() for a in (arg or 'stage1').split(',')]
  stage, kind = parts[0], (parts[1] if len(parts) > 1 else 'cp')
  if stage not in STAGES or kind not in KINDS:
    raise ValueError(
        f'configs/{dataset}.py:{arg!r}: expected "<stage>[,cp|baseline]" with '
        f'stage in {tuple(STAGES)}.'
    )
  seq_len, batch, steps, lr = STAGES[stage]
  c = common.base_config()
  c.task = 'lm'
  c.num_train_steps = steps
  c.batch_size = batch
  c.eval_every_steps = 10_000
  c.checkpoint_every_steps = 5_000
  c.log_every_steps = 100
  c.eval_splits = ('validation',)
  c.remat = 'full'
  c.dtype = 'bfloat16'
  c.model = ml_collections.ConfigDict(
      dict(
          name='cp_transformer_lm' if kind == 'cp' else 'transformer_lm',
          num_layers=12,
          emb_dim=512,
          mlp_dim=2048,
          num_heads=8,
          vocab_size=256,
          dropout_rate=0.2,
          # nn.scan over layers: with remat, XLA then runs one layer's backward at a
          # time; unrolled, the CPU backend keeps every layer's [heads, n, n]
          # attention alive (80 GB at n = 8192; benchmarks/contextpool_memory.py).
          scan_layers=True,
      )
  )
  if kind == 'baseline':
    c.model.context_pool = None
  c.optimizer.update(
      name='adamw',
      learning_rate=lr,
      schedule='warmup_constant',
      warmup_steps=10_000 if stage == 'stage1' else 0,
      weight_decay=0.01,
      grad_clip_norm=0.25,
  )
  c.dataset = ml_collections.ConfigDict(
      dict(
          name=dataset,
          data_dir='',
          manual_dir='',
          seq_len=seq_len,
          eval_context=8192,
          eval_step=512,
          eval_batch_size=8,
          eval_max_bytes=0,
      )
  )
  return c
