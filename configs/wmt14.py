r"""WMT'14 token-level translation: {EN-DE, EN-FR} x {tiny, small, base, big} x {standard, local, area, cp}.

  python train.py --config configs/wmt14.py:en-de,base,cp --workdir /tmp/wmt_cp_base

Targets (BLEU; the papers report tokenised BLEU, we report sacreBLEU on
detokenised text, which is typically lower by ~1 point -- see docs/training.md):

| model | standard | local | area (Eq. 3-4 / Eq. 9) | CP |
| --- | --- | --- | --- | --- |
| Tiny EN-DE / EN-FR  | 18.60 / 27.07 (Li T1) | - | 19.30 / 27.39, 19.45 / 27.79 (Li T1) | - |
| Small EN-DE / EN-FR | 22.55 / 31.93 (Huang T4) | 22.71 / 32.48 | 23.20 / 32.93 | 23.67 / 33.24 |
| Base EN-DE / EN-FR  | 28.16 / 38.97 (Huang T1, T4) | 28.32 / 39.04 | 28.52 / 39.19 | 28.91 / 39.36 |
| Big EN-DE / EN-FR   | 29.26 / 41.00 (Huang T4) | 29.31 / 41.17 | 29.77 / 41.46 | 30.11 / 41.59 |

(Li T1 = area attention paper Table 1; Huang T1/T4 = ContextPool paper Tables 1 and 4.)

Recipe (Li et al. Sec. 4.1): Adam with the Transformer schedule (inverse square
root after 4000 warm-up steps), label smoothing 0.1, dropout 0.1, shared
32k SentencePiece vocabulary; ~32k source+target tokens per batch for 250k
steps (Big: ~16k tokens, 600k steps). We batch a fixed number of sentence pairs
(512; Big 256) in length buckets, about that many tokens on average.
"""

import ml_collections

from . import common

SIZES = ('tiny', 'small', 'base', 'big')
KINDS = ('standard', 'local', 'area', 'cp')
PAIRS = {
    'en-de': ('wmt14_translate/de-en', 'en', 'de'),
    'en-fr': ('wmt14_translate/fr-en', 'en', 'fr'),
}
# Peak learning rates (Vaswani et al.'s d^-0.5 * warmup^-0.5 with factor 2).
PEAK_LR = {'tiny': 2e-3, 'small': 1.4e-3, 'base': 1e-3, 'big': 7e-4}
ARGS = tuple(f'{p},{s},{k}' for p in PAIRS for s in SIZES for k in KINDS)  # every argument


def get_config(arg: str = 'en-de,base,cp') -> ml_collections.ConfigDict:
  pair, size, kind = (a.strip() for a in arg.split(','))
  if pair not in PAIRS or size not in SIZES or kind not in KINDS:
    raise ValueError(
        f'configs/wmt14.py:{arg!r}: expected "<pair>,<size>,<kind>" with pair in '
        f'{tuple(PAIRS)}, size in {SIZES}, kind in {KINDS}.'
    )
  name, source, target = PAIRS[pair]
  c = common.base_config()
  c.task = 'translation'
  big = size == 'big'
  c.num_train_steps = 600_000 if big else 250_000
  c.batch_size = 256 if big else 512
  c.eval_every_steps = 10_000
  c.checkpoint_every_steps = 10_000
  c.log_every_steps = 100
  c.eval_splits = ('validation',)
  c.label_smoothing = 0.1
  c.eval_bleu = True
  c.beam_size = 4
  c.beam_alpha = 0.6
  c.eval_bleu_batches = 0  # 0 = the whole split
  model_name = {
      'standard': f'transformer_{size}',
      'local': f'local_transformer_{size}',
      'area': f'area_transformer_{size}',
      'cp': f'cp_transformer_{size}',
  }[kind]
  c.model = ml_collections.ConfigDict(dict(name=model_name, vocab_size=32000, dropout_rate=0.1))
  c.optimizer.update(
      name='adam',
      learning_rate=PEAK_LR[size],
      schedule='inverse_sqrt',
      warmup_steps=4000,
      b1=0.9,
      b2=0.98,
      eps=1e-9,
      weight_decay=0.0,
  )
  c.dataset = ml_collections.ConfigDict(
      dict(
          name=name,
          data_dir='',
          source_lang=source,
          target_lang=target,
          train_split='train',
          vocab_size=32000,
          vocab_type='unigram',
          vocab_max_chars=10**7,
          vocab_path='',
          max_source_len=256,
          max_target_len=256,
          eval_batch_size=256,
      )
  )
  return c
