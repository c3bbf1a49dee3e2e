"""Packaging: what `import contextpool_jax` needs, the extras, the pins, the licence, the
packages and commands the wheel installs (and that they train without a checkout)."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile

import pytest

from test_readme import TINY_TRAIN

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


def test_every_package_is_listed_and_the_configs_install_from_their_one_home():
  """``[tool.setuptools] packages`` lists every package of ``contextpool_jax/`` (a new
  subpackage not listed would be left out of the wheel), and ``contextpool_jax.configs`` is
  the top-level ``configs/`` (no copy)."""
  setuptools = PYPROJECT['tool']['setuptools']
  found = {
      '.'.join(p.parent.relative_to(REPO).parts) for p in (REPO / 'contextpool_jax').rglob('*.py')
  }
  found = {name for name in found if (REPO / name.replace('.', '/') / '__init__.py').is_file()}
  assert set(setuptools['packages']) == found | {'contextpool_jax.configs'}
  assert setuptools['package-dir'] == {'contextpool_jax.configs': 'configs'}
  assert not (REPO / 'contextpool_jax' / 'configs').exists()
  assert PROJECT['scripts'] == {
      'contextpool-train': 'contextpool_jax.training.cli:command',
      'contextpool-sample': 'contextpool_jax.sample:command',
      'contextpool-viz': 'contextpool_jax.viz:command',
  }


def _build_wheel(out: pathlib.Path) -> pathlib.Path:
  """The wheel of a copy of the sources (the build writes build/ and *.egg-info next to
  them: not in the checkout), built as CI's install builds (pip, build isolation)."""
  src = out / 'src'
  src.mkdir(parents=True)
  for name in ('pyproject.toml', 'README.md', 'LICENSE'):
    shutil.copy(REPO / name, src / name)
  for name in ('contextpool_jax', 'configs'):
    shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns('__pycache__'))
  run = subprocess.run(
      [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', '-w', str(out / 'dist'), str(src)],
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  (wheel,) = (out / 'dist').glob('contextpool_jax-*.whl')
  return wheel


def _venv_with(wheel: pathlib.Path, where: pathlib.Path) -> pathlib.Path:
  """A fresh virtualenv with the wheel installed (no dependencies), then given this
  environment's site-packages for them (a .pth line, after the install: pip must not see
  this environment's contextpool-jax and uninstall it). Returns its bin directory."""
  venv.create(where, with_pip=False)
  python = where / 'bin' / 'python'
  install = subprocess.run(
      [sys.executable, '-m', 'pip', '--python', str(python), 'install', '-q', '--no-deps']
      + ['--no-index', str(wheel)],
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
  site = subprocess.run(
      [python, '-c', "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()
  parents = {sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']}
  (pathlib.Path(site) / '_dependencies.pth').write_text('\n'.join(sorted(parents)) + '\n')
  return where / 'bin'


@pytest.mark.slow
def test_the_wheel_trains_and_samples_with_its_commands_outside_a_checkout(tmp_path, corpus):
  """Slow (a minute or two): builds the wheel (pip, with build isolation), installs it into a
  fresh virtualenv and trains 4 steps of a tiny model with ``contextpool-train --config
  default`` from a directory that is not the checkout, then samples the workdir with
  ``contextpool-sample``."""
  wheel = _build_wheel(tmp_path / 'build')
  names = zipfile.ZipFile(wheel).namelist()
  assert (
      'contextpool_jax/configs/default.py' in names and 'contextpool_jax/configs/common.py' in names
  )
  assert not any(n.startswith(('configs/', 'train.py', 'tests/')) for n in names)
  bin_dir = _venv_with(wheel, tmp_path / 'venv')
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
  env['PATH'] = f'{bin_dir}{os.pathsep}{env.get("PATH", "")}'
  away = tmp_path / 'away'  # the commands run here: no configs/, no contextpool_jax/
  away.mkdir()

  def run(*argv):
    out = subprocess.run(argv, cwd=away, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f'{argv}\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}'
    return out.stdout

  code = 'import contextpool_jax, contextpool_jax.configs as c; print(contextpool_jax.__file__, c.__file__)'
  for where in run('python', '-c', code).split():  # from the wheel, not this environment
    assert pathlib.Path(where).resolve().is_relative_to((tmp_path / 'venv').resolve()), where
  # A user's own config file, outside any package, shares the package's common.py.
  (away / 'mine.py').write_text(
      'from contextpool_jax.configs import common\n\n\ndef get_config():\n'
      '  c = common.base_config()\n  c.model.name = "transformer_lm"\n  return c\n'
  )
  code = (
      'from contextpool_jax.training import command_line as c; print(c.load_config_file("mine.py"))'
  )
  assert 'transformer_lm' in run('python', '-c', code)
  tiny = {  # the pages' shrunk run (test_readme.TINY_TRAIN) on this test's corpus
      **TINY_TRAIN,
      'num_train_steps': 4,
      'eval_every_steps': 4,
      'dataset.files': f"('{corpus}/*.txt',)",
      'dataset.data_dir': tmp_path / 'tfds',
      'dataset.max_bytes': 0,
  }
  workdir = tmp_path / 'w'
  overrides = [f'--config.{k}={v}' for k, v in tiny.items()]
  out = run('contextpool-train', '--config', 'default', '--workdir', str(workdir), *overrides)
  assert 'Finished at step 4' in out, out[-2000:]
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['2', '4']
  metrics = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert any('bpc' in json.dumps(m) for m in metrics), metrics[-1]
  text = run('contextpool-sample', '--workdir', str(workdir), '--prompt', 'def ', '--length', '8')
  assert text.startswith('def ') and len(text.encode()) >= 8, text
