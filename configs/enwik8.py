r"""enwik8, 12-layer CP-Transformer LM and baseline, in the paper's three stages.

Target: ContextPool Table 5, CP-Transformer (12), 39M parameters: enwik8 dev
1.02 / test 0.99 BPC (Longformer 1.02 / 1.00).

  python train.py --config configs/enwik8.py:stage1 --workdir /tmp/enwik8_s1
  python train.py --config configs/enwik8.py:stage2 --workdir /tmp/enwik8_s2 \
      --config.init_from=/tmp/enwik8_s1
  python train.py --config configs/enwik8.py:stage3 --workdir /tmp/enwik8_s3 \
      --config.init_from=/tmp/enwik8_s2 --config.eval_splits='("validation","test")'
  python train.py --config configs/enwik8.py:stage1,baseline ...   # without ContextPool

The recipe and what the paper leaves open: configs/char_lm.py.
"""

from . import char_lm

ARGS = char_lm.ARGS


def get_config(arg: str = 'stage1'):
  return char_lm.char_lm_config('enwik8', arg)
