r"""CIFAR-style ResNets with and without ContextPool on scikit-learn's 8x8 digits.

The one real image dataset that exists offline on a fresh machine (shipped
inside scikit-learn; :mod:`contextpool_jax.data.image_builders`): 1,252 / 266 /
279 train / validation / test images of 10 handwritten digits, upsampled to
16x16. The ResNet vs CP-ResNet comparison of ``benchmarks/lm_study.py``
(group ``images``) trains these configs with several seeds.

  python train.py --config configs/digits_resnet.py:cp_resnet20 --workdir /tmp/cp_resnet20

Recipe (a choice, scaled from the CIFAR one of ``configs/cifar10_resnet.py``):
SGD with momentum 0.9 and weight decay 5e-4 (a small dataset), batch 64,
learning rate 0.05 with 100 warm-up steps and a cosine decay over 2,000 steps
(~100 epochs); augmentation: 1-pixel padding and a random 8x8 crop, no flip.
"""

import ml_collections

from . import common

ARGS = tuple(f'{p}resnet{d}' for p in ('', 'cp_') for d in (20, 32, 44, 56))


def get_config(arg: str = 'cp_resnet20') -> ml_collections.ConfigDict:
  common.check_argument('configs/digits_resnet.py', arg, ARGS)
  c = common.base_config()
  c.task = 'classification'
  c.num_train_steps = 2_000
  c.batch_size = 64
  c.eval_every_steps = 200
  c.checkpoint_every_steps = 200
  c.log_every_steps = 50
  c.eval_splits = ('validation', 'test')
  c.model = ml_collections.ConfigDict(dict(name=arg, num_classes=10))
  c.optimizer.update(
      name='sgd',
      learning_rate=0.05,
      schedule='cosine',
      warmup_steps=100,
      momentum=0.9,
      nesterov=False,
      weight_decay=5e-4,
  )
  c.dataset = common.image_dataset(
      'sklearn_digits', 16, eval_split='validation', eval_batch_size=300
  )
  return c
