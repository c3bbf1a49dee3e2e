r"""CIFAR-10 ResNets (He et al. 2016) with and without ContextPool (ContextPool App. B, Table S1).

Targets (accuracy): ResNet-44 92.9 (0.66M), CP-ResNet-44 93.4 (0.68M),
CP-ResNet-46 93.7 (0.70M).

  python train.py --config configs/cifar10_resnet.py:cp_resnet44 --workdir /tmp/cp_resnet44

Recipe (He et al. Sec. 4.2): SGD, momentum 0.9, weight decay 1e-4, batch 128,
learning rate 0.1 divided by 10 at 32k and 48k iterations, 64k iterations;
4-pixel padding + random 32x32 crop + horizontal flip.
"""

import ml_collections

from . import common

ARGS = tuple(f'{p}resnet{d}' for p in ('', 'cp_') for d in (20, 32, 44, 46, 56))


def get_config(arg: str = 'cp_resnet44') -> ml_collections.ConfigDict:
  common.check_argument('configs/cifar10_resnet.py', arg, ARGS)
  c = common.base_config()
  c.task = 'classification'
  c.num_train_steps = 64_000
  c.batch_size = 128
  c.eval_every_steps = 4_000
  c.checkpoint_every_steps = 4_000
  c.log_every_steps = 100
  c.eval_splits = ('test',)
  c.model = ml_collections.ConfigDict(dict(name=arg, num_classes=10))
  c.optimizer.update(**common.step_sgd(boundaries=(32_000, 48_000)))
  c.dataset = common.image_dataset('cifar10', 32, eval_split='test')
  return c
