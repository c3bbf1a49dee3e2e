r"""ImageNet-1k ViT-B/16 and CP-ViT-B/16 with the DeiT recipe (ContextPool Sec. 4.1, Table 2).

Targets (top-1): ViT-B/16 77.9, CP-ViT-B/16 79.9 (Table 2; 55.4 vs 56.7 GFLOPs).

  python train.py --config configs/imagenet_vit.py:cp_vit_b16 --workdir /tmp/cp_vit

Recipe (Sec. 4.1 / DeiT): 300 epochs at 224x224, AdamW, batch 1024, peak
learning rate 1e-3, weight decay 0.05, cosine decay with 20 warm-up epochs,
gradient clipping at norm 1, RandAugment (DeiT's rand-m9-mstd0.5), mixup 0.8 /
cutmix 1.0, label smoothing 0.1. ``imagenet2012`` needs a manual download (the
error message says where the tar files go).
"""

import ml_collections

from . import common

_TRAIN_IMAGES = 1_281_167


ARGS = ('vit_b16', 'cp_vit_b16', 'vit_s16', 'cp_vit_s16', 'vit_ti16', 'cp_vit_ti16')


def get_config(arg: str = 'cp_vit_b16') -> ml_collections.ConfigDict:
  common.check_argument('configs/imagenet_vit.py', arg, ARGS)
  c = common.base_config()
  c.task = 'classification'
  c.batch_size = 1024
  steps_per_epoch = _TRAIN_IMAGES // c.batch_size
  c.num_train_steps = 300 * steps_per_epoch
  c.eval_every_steps = 5 * steps_per_epoch
  c.checkpoint_every_steps = steps_per_epoch
  c.log_every_steps = 100
  c.eval_splits = ('validation',)
  c.label_smoothing = 0.1
  c.dtype = 'bfloat16'
  c.model = ml_collections.ConfigDict(dict(name=arg, num_classes=1000, dropout_rate=0.0))
  c.optimizer.update(
      name='adamw',
      learning_rate=1e-3,
      schedule='cosine',
      warmup_steps=20 * steps_per_epoch,
      weight_decay=0.05,
      grad_clip_norm=1.0,
      b1=0.9,
      b2=0.999,
      end_learning_rate=1e-5,
  )
  c.dataset = common.image_dataset(
      'imagenet2012',
      224,
      eval_split='validation',
      crop_area_min=0.08,
      randaugment_num_ops=2,
      randaugment_magnitude=9,
      randaugment_magnitude_std=0.5,
      randaugment_prob=0.5,
      mixup_alpha=0.8,
      cutmix_alpha=1.0,
      mixup_switch_prob=0.5,
  )
  return c
