"""Fields every config has, with defaults; experiment files override them."""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = 'lm'  # 'lm' | 'translation' | 'classification'
  c.seed = 0
  c.num_train_steps = 1000
  c.batch_size = 32  # global, over all processes and devices
  c.grad_accum_steps = 1  # micro-batches per step (same gradient, less memory)
  c.eval_every_steps = 1000
  c.checkpoint_every_steps = 1000
  c.log_every_steps = 50
  c.keep_checkpoints = 3
  c.async_checkpointing = True
  c.nan_check_every_steps = 0  # extra host checks for a NaN/inf loss every N steps
  # (0: only at log and checkpoint steps, no per-step sync)
  c.eval_splits = ('validation',)
  c.dtype = 'float32'  # compute dtype: 'float32' | 'bfloat16' (params stay f32)
  c.remat = False  # recompute activations in the backward pass
  c.param_sharding = 'replicated'  # 'replicated' | 'fsdp'
  c.init_from = ''  # a previous stage's workdir: start from its params
  c.progress_bar = True
  c.log_pool_sizes = True  # ContextPool sigma histograms per layer (Fig. 4)
  c.label_smoothing = 0.0
  c.model = ml_collections.ConfigDict({'name': 'cp_transformer_lm'})
  c.optimizer = ml_collections.ConfigDict(
      dict(
          name='adamw',
          learning_rate=1e-3,
          schedule='cosine',
          warmup_steps=100,
          end_learning_rate=0.0,
          b1=0.9,
          b2=0.999,
          eps=1e-8,
          weight_decay=0.0,
          grad_clip_norm=0.0,
          momentum=0.9,
          nesterov=False,
      )
  )
  c.dataset = ml_collections.ConfigDict()
  return c
