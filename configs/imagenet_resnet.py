r"""ImageNet-1k ResNet-50/101 and CP-, Lambda- and AA-variants.

Targets (top-1):
* resnet50 76.5 / cp_resnet50 77.3, resnet101 78.4 / cp_resnet101 78.9
  (ContextPool Table S2, trained as Dai et al. 2017);
* lambda_resnet50 78.4 (15.0M; LambdaNetworks Table 4);
* aa_resnet50 77.7 (25.8M; Attention Augmented Conv. Networks, relative positions),
  aa_resnet34 74.7.

  python train.py --config configs/imagenet_resnet.py:cp_resnet50 --workdir /tmp/cp_resnet50

Recipe: He et al.'s ResNet schedule (SGD, momentum 0.9, weight decay 1e-4,
batch 256, learning rate 0.1 divided by 10 at epochs 30, 60 and 80, 90 epochs,
random-resized crop + flip). The lambda and AA slides give no training recipe:
for them we use the common "ResNet-strikes-back-lite" variant of the same
schedule (cosine decay, 5 warm-up epochs, label smoothing 0.1, Nesterov, batch
1024, learning rate 0.4 = 0.1 x 1024/256, 90 epochs) -- our choice.
"""

import ml_collections

from . import common

_TRAIN_IMAGES = 1_281_167
ARGS = (
    'resnet50',
    'cp_resnet50',
    'resnet101',
    'cp_resnet101',
    'lambda_resnet50',
    'aa_resnet34',
    'aa_resnet50',
)


def get_config(arg: str = 'cp_resnet50') -> ml_collections.ConfigDict:
  common.check_argument('configs/imagenet_resnet.py', arg, ARGS)
  c = common.base_config()
  c.task = 'classification'
  attention = arg.startswith(('lambda', 'aa'))
  c.batch_size = 1024 if attention else 256
  steps_per_epoch = _TRAIN_IMAGES // c.batch_size
  c.num_train_steps = 90 * steps_per_epoch
  c.eval_every_steps = 5 * steps_per_epoch
  c.checkpoint_every_steps = steps_per_epoch
  c.log_every_steps = 100
  c.eval_splits = ('validation',)
  c.dtype = 'bfloat16'
  c.model = ml_collections.ConfigDict(dict(name=arg, num_classes=1000))
  if attention:
    c.label_smoothing = 0.1
    c.optimizer.update(
        name='sgd',
        learning_rate=0.4,
        schedule='cosine',
        warmup_steps=5 * steps_per_epoch,
        momentum=0.9,
        nesterov=True,
        weight_decay=1e-4,
    )
  else:
    c.optimizer.update(**common.step_sgd(boundaries=[e * steps_per_epoch for e in (30, 60, 80)]))
  c.dataset = common.image_dataset('imagenet2012', 224, eval_split='validation', crop_area_min=0.08)
  return c
