"""Fields every config has, with defaults; experiment files override them.

Also the pieces several experiment files share: the step-decay SGD recipe of
the ResNet papers, the fields of an image dataset, and :func:`check_argument`. A
config file lists every argument its ``get_config`` takes in ``ARGS`` (the tests run
each) and checks its argument against them (a ``ValueError`` naming the file, the
argument and the allowed values).

Config files import only ``ml_collections`` and this file: the config flows one
way, into the library. A config file lists only what differs from the modules'
defaults; ``train.py`` fills in every other field of the model (and of its
ContextPool) before it applies the command line's overrides
(``contextpool_jax/runs/config_fields.py``), so ``--config.model.<field>`` and
``--config.model.context_pool.<field>`` reach every field, and the trainer records
them all in ``<workdir>/config.json``.
"""

from typing import Iterable, Sequence

import ml_collections
from ml_collections import config_dict

# The W&B project and the MLflow experiment of every run (config.wandb.project,
# config.mlflow.experiment).
PROJECT = 'contextpool-jax'


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
  c.keep_checkpoint_period = 0  # also keep every checkpoint whose step is a multiple (0: off)
  c.async_checkpointing = True
  c.nan_check_every_steps = 0  # extra host checks for a NaN/inf loss every N steps
  # (0: only at log and checkpoint steps, no per-step sync)
  # A run holds <workdir>/run.lock (training/runlock.py); a lock written on another
  # machine counts as its holder dead after this many seconds without a heartbeat.
  c.lock_stale_seconds = 600
  c.eval_splits = ('validation',)
  c.dtype = 'float32'  # compute dtype: 'float32' | 'bfloat16' | 'float16' (params stay f32;
  # float16 adds a dynamic loss scale: docs/training.md#float16)
  # What each block keeps for the backward pass: 'none' | 'full' (recompute everything
  # from the block's input) | 'dots' (keep matmul and conv outputs) | 'dots_no_batch'
  # (keep the projections' and MLPs' matmuls); docs/models.md#memory. Typed object: the
  # booleans of older configs (True = 'full', False = 'none') still load.
  c.remat = config_dict.FieldReference('none', field_type=object)
  c.param_sharding = 'replicated'  # 'replicated' | 'fsdp'
  c.init_from = ''  # a previous stage's workdir: start from its params
  c.progress_bar = True
  c.log_pool_sizes = True  # ContextPool sigma histograms per layer (Fig. 4)
  # Where metrics go (training/writers.py): 'jsonl' (metrics.jsonl), 'tensorboard',
  # 'wandb' (pip install 'contextpool-jax[wandb]'; settings in c.wandb), 'mlflow'
  # (pip install 'contextpool-jax[mlflow]'; settings in c.mlflow).
  c.writers = ('jsonl', 'tensorboard')
  c.wandb = ml_collections.ConfigDict(
      # entity, name: '' = your default entity, the workdir's name; mode: '' (W&B's
      # default: WANDB_MODE, else online) | 'online' | 'offline' | 'disabled'.
      dict(project=PROJECT, entity='', name='', mode='')
  )
  c.mlflow = ml_collections.ConfigDict(
      # tracking_uri: '' = sqlite:///<workdir>/mlruns/mlflow.db (offline; artifacts in
      # <workdir>/mlruns/artifacts) or a server's URI; run_name: '' = the workdir's name.
      dict(tracking_uri='', experiment=PROJECT, run_name='')
  )
  # A jax.profiler trace of steps start_step .. start_step + num_steps - 1 into
  # <workdir>/profile (training/profiling.py); num_steps=0: off.
  c.profile = ml_collections.ConfigDict(dict(start_step=10, num_steps=0, all_processes=False))
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


def check_argument(config_file: str, argument: str, allowed: Iterable[str]) -> None:
  """Raises ValueError unless ``argument`` (of ``get_config``) is one of ``allowed``."""
  allowed = tuple(allowed)
  if argument not in allowed:
    raise ValueError(
        f'{config_file}: argument {argument!r} is not supported; allowed values: '
        f'{", ".join(repr(a) for a in allowed)}.'
    )


def step_sgd(boundaries: Sequence[int], learning_rate: float = 0.1) -> dict:
  """The ResNet papers' recipe: SGD, momentum 0.9 (no Nesterov), weight decay
  1e-4, the learning rate divided by 10 at each boundary step, no warm-up.
  For ``c.optimizer.update(**step_sgd(...))``."""
  return dict(
      name='sgd',
      learning_rate=learning_rate,
      schedule='piecewise',
      warmup_steps=0,
      boundaries=tuple(boundaries),
      decay_factor=0.1,
      momentum=0.9,
      nesterov=False,
      weight_decay=1e-4,
  )


def image_dataset(
    name: str, image_size: int, eval_split: str, eval_batch_size: int = 1000, **extra
) -> ml_collections.ConfigDict:
  """``c.dataset`` of an image classification task (TFDS ``name``, training on
  its ``'train'`` split); ``extra``: crop and augmentation fields."""
  return ml_collections.ConfigDict(
      dict(
          name=name,
          data_dir='',
          image_size=image_size,
          train_split='train',
          eval_split=eval_split,
          eval_batch_size=eval_batch_size,
          **extra,
      )
  )
