"""Packaging: what `import contextpool_jax` needs, the extras, the pins, the licence."""

import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / 'pyproject.toml').read_text())
PROJECT = PYPROJECT['project']

# Distributions only the extras may need (import names of training, data, notebooks, tests).
EXTRA_ONLY_MODULES = (
    'optax',
    'orbax',
    'tensorflow_datasets',
    'tensorflow',
    'grain',
    'ml_collections',
    'tensorboardX',
    'tqdm',
    'PIL',
    'sacrebleu',
    'sentencepiece',
    'matplotlib',
    'chex',
    'wandb',
    'mlflow',
    'sqlalchemy',
    'alembic',
    'xprof',
    'safetensors',
    'huggingface_hub',
    'contextpool_jax.training',
    'contextpool_jax.data',
)


def _name(requirement: str) -> str:
  return re.split(r'[\[<>=;! ]', requirement, maxsplit=1)[0].lower().replace('_', '-')


@pytest.mark.slow
def test_layers_and_models_import_no_training_or_data_dependency():
  script = (
      'import sys, contextpool_jax, contextpool_jax.models as m, contextpool_jax.viz, '
      'contextpool_jax.sample\n'
      "m.create('cp_transformer_lm'); m.create('cp_vit_ti16'); m.create('cp_resnet20')\n"
      'print(sorted(sys.modules))'
  )
  out = subprocess.run(
      [sys.executable, '-c', script], capture_output=True, text=True, timeout=300, cwd=REPO
  )
  assert out.returncode == 0, out.stderr[-2000:]
  loaded = set(eval(out.stdout))  # pylint: disable=eval-used
  bad = sorted(
      m
      for m in loaded
      if m in EXTRA_ONLY_MODULES or any(m.startswith(x + '.') for x in EXTRA_ONLY_MODULES)
  )
  assert not bad, f'import contextpool_jax pulled in {bad}'
  assert {_name(r) for r in PROJECT['dependencies']} == {'jax', 'flax', 'numpy'}


def _extra_closure(extras: dict, name: str) -> set[str]:
  """The distributions ``pip install 'contextpool-jax[<name>]'`` asks for, following the
  extras' references to ``contextpool-jax[...]``."""
  out = set()
  for requirement in extras[name]:
    if _name(requirement) == 'contextpool-jax':
      for inner in requirement.split('[', 1)[1].split(']')[0].split(','):
        out |= _extra_closure(extras, inner.strip())
    else:
      out.add(_name(requirement))
  return out


def test_extras_and_the_pinned_requirements_agree():
  """CI installs requirements.txt only: it pins everything the tests need (the ``[test]``
  extra, which takes in the others but ``[profile]``, a viewer no test runs)."""
  extras = PROJECT['optional-dependencies']
  assert set(extras) == {
      'train',
      'notebook',
      'wandb',
      'mlflow',
      'hub',
      'profile',
      'docs',
      'test',
      'all',
  }
  assert _extra_closure(extras, 'all') == _extra_closure(extras, 'test') | {'xprof'}
  assert _extra_closure(extras, 'test') >= {'mlflow-skinny', 'wandb', 'matplotlib', 'optax'}
  assert _extra_closure(extras, 'hub') >= {'huggingface-hub', 'safetensors'}
  assert _extra_closure(extras, 'test') >= {'sphinx', 'myst-parser'}  # the docs build is a test
  pinned = {}
  for line in (REPO / 'requirements.txt').read_text().splitlines():
    line = line.split('#')[0].strip()
    if line:
      assert '==' in line, f'requirements.txt: {line!r} is not pinned'
      pinned[_name(line)] = line
  wanted = _extra_closure(extras, 'test') | {_name(r) for r in PROJECT['dependencies']}
  missing = sorted(wanted - set(pinned))
  assert not missing, f'requirements.txt does not pin {missing}'


def test_licence_and_typing_marker_ship():
  assert PROJECT['license'] == 'Apache-2.0' and PROJECT['license-files'] == ['LICENSE']
  text = (REPO / 'LICENSE').read_text()
  assert 'Apache License' in text and 'Version 2.0, January 2004' in text
  assert (REPO / 'contextpool_jax' / 'py.typed').is_file()
  assert 'py.typed' in PYPROJECT['tool']['setuptools']['package-data']['contextpool_jax']
