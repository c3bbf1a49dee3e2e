"""The model card of an export (its ``README.md``): a Hugging Face model card with the model,
the run's key config fields, the data and its split, the metrics at export and how to load it."""

from __future__ import annotations

import json
import pathlib
import warnings
from typing import Any, Optional

import ml_collections

from contextpool_jax.models import common as model_common
from contextpool_jax.runs.layout import CONFIG_FILE, EXPORT_FILE, METRICS_FILE, SAFETENSORS_FILE

# The int fields of config.model a card lists (the model's sizes) come from the config; these
# top-level fields are the run's.
_CARD_RUN_FIELDS = ('task', 'seed', 'num_train_steps', 'batch_size', 'dtype')


def latest_eval(workdir: pathlib.Path, step: int) -> tuple[Optional[int], dict[str, dict]]:
  """``(step, {split: metrics})``: the evaluation records (``split`` ``eval_*``) of
  ``metrics.jsonl`` at the last step <= ``step`` that has any, or ``(None, {})``."""
  path = workdir / METRICS_FILE
  if not path.is_file():
    return None, {}
  records = []
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue  # a line cut by a crash
    if (
        isinstance(record, dict)
        and str(record.get('split', '')).startswith('eval')
        and isinstance(record.get('step'), int)
        and (step < 0 or record['step'] <= step)
    ):
      records.append(record)
  if not records:
    return None, {}
  last = max(r['step'] for r in records)
  out = {}
  for r in records:
    if r['step'] == last:
      out[r['split']] = {k: v for k, v in r.items() if k not in ('step', 'split')}
  return last, out


def _value(v: Any) -> str:
  if isinstance(v, float):
    return f'{v:.6g}'
  return f'`{json.dumps(v)}`' if not isinstance(v, str) else f'`{v}`'


def model_card(
    config: ml_collections.ConfigDict,
    variables: dict[str, Any],
    step: int,
    metrics: tuple[Optional[int], dict[str, dict]] = (None, {}),
    source: str = '',
) -> str:
  """The ``README.md`` of an export: a Hugging Face model card (:func:`_card_text`: YAML
  metadata, the library and tags) with the model (name, size fields, parameter count), the
  run's key config fields, the data and its split, the evaluation metrics at export
  (``metrics``: :func:`latest_eval`'s) and how to load it."""
  name = config.model.get('name', '?')
  lines = [
      '',
      f'# {name}',
      '',
      f'A `{name}` model of contextpool-jax, exported by '
      '`contextpool_jax.runs.export.export_params`'
      + (f' from step {step}' if step >= 0 else '')
      + (f' of `{source}`' if source else '')
      + f': parameters and model state only (no optimizer state), in `{SAFETENSORS_FILE}` '
      f'(keys: the nested paths joined with `/`, e.g. `params/...`) and `{EXPORT_FILE}`.',
  ]
  lines += _card_model(config.model, variables) + _card_config(config)
  lines += _card_data(config.get('dataset', ml_collections.ConfigDict()))
  lines += _card_metrics(*metrics, step) + _CARD_LOADING
  tags = list(dict.fromkeys(['jax', 'flax', 'contextpool-jax', str(name)]))
  return _card_text({'library_name': 'contextpool-jax', 'tags': tags}, '\n'.join(lines))


def _card_text(metadata: dict[str, Any], body: str) -> str:
  """A model card: ``metadata`` as its YAML block, then ``body`` (Markdown), rendered by
  ``huggingface_hub.ModelCard`` (the ``[hub]`` extra). Without huggingface_hub (the core and
  ``[train]`` installs export too), PyYAML writes the block as huggingface_hub does
  (``yaml.dump``: keys in order, unicode kept): the same text
  (tests/runs/test_model_card.py compares them)."""
  try:
    import huggingface_hub  # pylint: disable=import-outside-toplevel
  except ImportError:
    import yaml  # pylint: disable=import-outside-toplevel  # flax's and ml_collections' dependency

    block = yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True).strip()
    return f'---\n{block}\n---\n{body}'
  # huggingface_hub's names import tqdm.auto on first use, which warns in a Jupyter kernel
  # without ipywidgets (about progress bars: a card has none).
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', message='IProgress not found')
    block = huggingface_hub.ModelCardData(**metadata).to_yaml()
    return str(huggingface_hub.ModelCard(f'---\n{block}\n---\n{body}'))


def _card_model(model: ml_collections.ConfigDict, variables: dict[str, Any]) -> list[str]:
  """The card's model section: name, parameter count (and state), the size fields."""
  n = model_common.count_params(variables.get('params', {}))
  state = sorted(k for k in variables if k != 'params')
  lines = ['', '## Model', '', f'- name: `{model.get("name", "?")}`']
  lines += [f'- parameters: {n:,}' + (f' (model state: {", ".join(state)})' if state else '')]
  sizes = [
      (k, v) for k, v in sorted(model.items()) if isinstance(v, int) and not isinstance(v, bool)
  ]
  return lines + [f'- {k}: {_value(v)}' for k, v in sizes]


def _card_config(config: ml_collections.ConfigDict) -> list[str]:
  """The card's config section: where the whole config is, and its key fields."""
  lines = [
      '',
      '## Config',
      '',
      f'The full config is `{CONFIG_FILE}` beside this file (what `load` builds the model '
      'from). Key fields:',
      '',
  ]
  lines += [f'- {k}: {_value(config[k])}' for k in _CARD_RUN_FIELDS if k in config]
  if 'optimizer' in config:
    opt = config.optimizer
    lines += [
        f'- optimizer: {_value(opt.get("name"))}, learning_rate {_value(opt.get("learning_rate"))}'
        f', schedule {_value(opt.get("schedule"))}'
    ]
  return lines


def _card_data(data: ml_collections.ConfigDict) -> list[str]:
  """The card's data section: the dataset's source fields and how it was split."""
  lines = ['', '## Data and split', '', f'- dataset: {_value(data.get("name", "?"))}']
  lines += [
      f'- {k}: {_value(data[k])}'
      for k in ('files', 'data_dir', 'max_bytes', 'seq_len')
      if k in data
  ]
  if 'split_block_bytes' not in data and 'split_seed' not in data:
    return lines + ["- split: the dataset's own train / validation / test splits"]
  return lines + [
      f'- split: the seeded `local_text` rule (docs/data.md, `contextpool_jax/data/'
      'text_splits.py`): files cut into blocks of `split_block_bytes` (0: whole files), '
      "about 5% of each top folder's bytes to validation and 5% to test, by hashes seeded with "
      f'`split_seed`; split_block_bytes: {_value(data.get("split_block_bytes"))}, '
      f'split_seed: {_value(data.get("split_seed"))}'
  ]


def _card_metrics(metric_step: Optional[int], splits: dict[str, dict], step: int) -> list[str]:
  """The card's metrics section: a table of the last evaluation up to the export's step."""
  lines = ['', '## Metrics at export', '']
  if not splits:
    return lines + [f"No evaluation metrics (no eval records in the run's `{METRICS_FILE}`)."]
  keys = sorted({k for m in splits.values() for k in m})
  lines += [
      f"From the run's `{METRICS_FILE}`, evaluation at step {metric_step}"
      + (f' (the export is of step {step})' if metric_step != step and step >= 0 else '')
      + ':',
      '',
      '| split | ' + ' | '.join(keys) + ' |',
      '| --- |' + ' --- |' * len(keys),
  ]
  for split in sorted(splits):
    row = [_value(splits[split][k]) if k in splits[split] else '' for k in keys]
    lines += [f'| {split} | ' + ' | '.join(row) + ' |']
  return lines


_CARD_LOADING = [
    '',
    '## How to load',
    '',
    'With `pip install contextpool-jax` (and `[hub]` for the Hub):',
    '',
    '```python',
    'from contextpool_jax.runs.workdirs import load',
    '',
    "model, variables, config = load('path/to/this/directory')   # or load('hf://user/repo')",
    "outputs = model.apply(variables, inputs, train=False)   # inputs as the config's dataset makes them",
    '```',
    '',
]
