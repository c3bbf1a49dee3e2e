r"""text8, 12-layer CP-Transformer LM and baseline, in the paper's three stages.

Target: ContextPool Table 5, CP-Transformer (12), 39M parameters: text8 dev
1.04 / test 1.09 BPC (Longformer 1.04 / 1.10).

  python train.py --config configs/text8.py:stage1 --workdir /tmp/text8_s1
  (stages 2 and 3 as in configs/enwik8.py, with --config.init_from)

The recipe and what the paper leaves open: configs/char_lm.py.
"""

from . import char_lm

ARGS = char_lm.ARGS


def get_config(arg: str = 'stage1'):
  return char_lm.char_lm_config('text8', arg)
