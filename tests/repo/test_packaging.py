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

from helpers import TINY_TRAIN
from pages import markdown_blocks

# CI's oldest stack runs the whole file beside its fast tier (-m "not slow or packaging").
pytestmark = pytest.mark.packaging

REPO = pathlib.Path(__file__).resolve().parents[2]
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
      'import sys, contextpool_jax, contextpool_jax.models as m, contextpool_jax.tools.viz, '
      'contextpool_jax.commands.sample\n'
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
  # The layers and models import jax, flax and numpy; loading and sampling also these two.
  core = {'jax', 'flax', 'numpy', 'ml-collections', 'safetensors'}
  assert {_name(r) for r in PROJECT['dependencies']} == core


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


# The two tested stacks (docs/install.md): the pinned file -> the Python versions it is for.
STACKS = {'requirements.txt': ('3.12', '3.13'), 'requirements-py311.txt': ('3.11',)}
OLDEST, NEWEST = 'requirements-py311.txt', 'requirements.txt'
# Each stack's developers' file: its users' file (-r) and what the tests, pyink and Sphinx need.
DEV = {
    'requirements.txt': 'requirements-dev.txt',
    'requirements-py311.txt': 'requirements-py311-dev.txt',
}
# The users' file pins the core install, [train] and [notebook], and these of their dependencies
# (the compiled ones whose versions the stack tests).
USERS_TRANSITIVE = {'jaxlib', 'ml-dtypes', 'array-record'}


def _pins(name: str) -> dict[str, str]:
  """A pinned requirements file: distribution -> version (every line ``==``; ``-r FILE``
  takes that file's pins in)."""
  pinned = {}
  for line in (REPO / name).read_text().splitlines():
    line = line.split('#')[0].strip()
    if line.startswith('-r '):
      pinned |= _pins(line[3:].strip())
    elif line:
      assert '==' in line, f'{name}: {line!r} is not pinned'
      pinned[_name(line)] = line.split('==')[1].strip()
  return pinned


def _requirements(extras: dict) -> list[str]:
  """Every requirement of pyproject.toml: the dependencies and the extras' own entries."""
  found = list(PROJECT['dependencies'])
  for requirements in extras.values():
    found += [r for r in requirements if _name(r) != 'contextpool-jax']
  return found


def test_extras_and_the_pinned_requirements_agree():
  """CI installs a pinned file per stack only: each pins everything the tests need (the
  ``[test]`` extra, which takes in the others but ``[profile]``, a viewer no test runs),
  libtpu and the CUDA plugin included (``[tpu]``, ``[gpu-compile]``: the suite compiles for
  TPU and GPUs)."""
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
      'tpu',
      'gpu-compile',
  }
  assert _extra_closure(extras, 'all') == _extra_closure(extras, 'test') | {'xprof'}
  assert _extra_closure(extras, 'test') >= {'mlflow-skinny', 'wandb', 'matplotlib', 'optax'}
  assert _extra_closure(extras, 'hub') >= {'huggingface-hub'}
  assert {'ml-collections', 'safetensors'} <= {_name(r) for r in PROJECT['dependencies']}
  assert _extra_closure(extras, 'test') >= {'sphinx', 'myst-parser'}  # the docs build is a test
  core = {_name(r) for r in PROJECT['dependencies']}
  wanted = _extra_closure(extras, 'test') | core
  wanted |= {'libtpu'}  # what jax[tpu] brings
  # jax[cuda12-local]: the newest stack only (its GPU compiles are slow tests; the oldest
  # stack's plugin logs at every JAX import without CUDA).
  cuda = {'jax-cuda12-plugin', 'jax-cuda12-pjrt'}
  users = core | _extra_closure(extras, 'train') | _extra_closure(extras, 'notebook')
  users -= {'contextpool-jax'}
  for name, dev in DEV.items():
    missing = sorted((wanted | (cuda if dev == DEV[NEWEST] else set())) - set(_pins(dev)))
    assert not missing, f'{dev} does not pin {missing}'
    # The users' file: what training and the notebooks need, no developers' tool.
    assert set(_pins(name)) == users | USERS_TRANSITIVE, (name, set(_pins(name)) ^ users)
  # The same distributions, other versions (the CUDA plugin on the newest alone).
  assert set(_pins(DEV[OLDEST])) == set(_pins(DEV[NEWEST])) - cuda


def test_ci_finds_each_stacks_python_or_fails_loudly(tmp_path):
  """``.ci/run``'s ``find_python``: the first given version that runs, from PATH or pyenv's
  installs; none of them is an error naming what it looked for (never another version)."""
  ci = (REPO / '.ci' / 'run').read_text()
  function = ci[ci.index('find_python() {') : ci.index('\n}\n', ci.index('find_python() {')) + 3]
  here = f'{sys.version_info.major}.{sys.version_info.minor}'
  (tmp_path / 'bin').mkdir()
  (tmp_path / 'bin' / f'python{here}').symlink_to(sys.executable)

  def find(*versions):
    script = f'{function}\nfind_python {" ".join(versions)}'
    env = {'PATH': f'{tmp_path / "bin"}:/usr/bin:/bin', 'PYENV_ROOT': str(tmp_path / 'pyenv')}
    return subprocess.run(['bash', '-c', script], capture_output=True, text=True, env=env)

  found = find('2.1', here)
  assert found.returncode == 0, found
  assert found.stdout.strip() == str(tmp_path / 'bin' / f'python{here}'), found
  missing = find('2.1', '2.2')
  assert missing.returncode == 1 and not missing.stdout, missing
  assert 'no Python 2.1 2.2 found' in missing.stderr and str(tmp_path / 'pyenv') in missing.stderr


def _tested_upper_bound(version: str) -> str:
  """Below the next release no stack tested: the next minor at 0.x (jax, flax, optax: their
  minors break APIs), else the next major."""
  major, minor = (int(x) for x in version.split('.')[:2])
  return f'0.{minor + 1}' if major == 0 else f'{major + 1}'


def test_the_ranges_are_what_the_two_stacks_test():
  """Every range of pyproject.toml runs from the oldest stack's pin to below the next release
  neither stack tested; ``requires-python`` covers the stacks' Pythons and no other."""
  from packaging.requirements import Requirement  # pylint: disable=g-import-not-at-top
  from packaging.specifiers import SpecifierSet  # pylint: disable=g-import-not-at-top

  oldest, newest = _pins(DEV[OLDEST]), _pins(DEV[NEWEST])
  checked = set()
  for text in _requirements(PROJECT['optional-dependencies']):
    requirement = Requirement(text)
    name = _name(requirement.name)
    if name not in oldest:
      assert name == 'xprof', f'{text}: no stack pins {name}; pin it or leave it out'
      continue
    wanted = SpecifierSet(f'>={oldest[name]},<{_tested_upper_bound(newest[name])}')
    assert requirement.specifier == wanted, f'pyproject.toml: {text!r}, tested: {name}{wanted}'
    checked.add(name)
  assert {'jax', 'flax', 'numpy', 'optax', 'orbax-checkpoint', 'chex'} <= checked
  python = SpecifierSet(PROJECT['requires-python'])
  tested = {v for versions in STACKS.values() for v in versions}
  assert {v for v in ('3.10', '3.11', '3.12', '3.13', '3.14') if v in python} == tested


def test_the_tpu_extra_takes_the_libtpu_of_the_installed_jax():
  """``[tpu]`` is jax's own ``tpu`` extra within the tested range: jax's metadata pins the
  libtpu it was built against, the one docs/install.md names for this stack."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  (tpu,) = PROJECT['optional-dependencies']['tpu']
  jax_range = next(r for r in PROJECT['dependencies'] if _name(r) == 'jax')
  assert tpu == jax_range.replace('jax', 'jax[tpu]', 1)
  libtpu = [
      r
      for r in metadata.requires('jax')
      if r.startswith('libtpu') and "'tpu'" in r.replace('"', "'")
  ]
  assert len(libtpu) == 1, metadata.requires('jax')
  pinned = re.match(r'libtpu\s*==\s*([0-9.*]+)', libtpu[0]).group(1)
  row = next(
      line
      for line in (REPO / 'docs' / 'install.md').read_text().splitlines()
      if line.startswith('| ') and f'| {metadata.version("jax")} |' in line
  )
  assert f'| {pinned} |' in row, (row, pinned)


def test_the_gpu_compile_extra_is_jaxs_cuda_plugin_without_cuda():
  """``[gpu-compile]`` is jax's own ``cuda12-local`` extra within the tested range (the CUDA
  plugin at the installed jaxlib's version, no ``nvidia-*`` libraries), and the newest
  developers' file pins that plugin at its jax (the oldest stack's logs at every JAX import
  without CUDA, and that stack compiles for no GPU in CI)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  (gpu,) = PROJECT['optional-dependencies']['gpu-compile']
  jax_range = next(r for r in PROJECT['dependencies'] if _name(r) == 'jax')
  assert gpu == jax_range.replace('jax', 'jax[cuda12-local]', 1)
  local = [r for r in metadata.requires('jax') if "'cuda12-local'" in r.replace('"', "'")]
  assert local and all('with-cuda' not in r and 'nvidia' not in r for r in local), local
  pins = _pins(DEV[NEWEST])
  assert pins['jax-cuda12-plugin'] == pins['jax-cuda12-pjrt'] == pins['jax']
  assert 'jax-cuda12-plugin' not in _pins(DEV[OLDEST])


def test_licence_and_typing_marker_ship():
  assert PROJECT['license'] == 'Apache-2.0' and PROJECT['license-files'] == ['LICENSE']
  text = (REPO / 'LICENSE').read_text()
  assert 'Apache License' in text and 'Version 2.0, January 2004' in text
  assert (REPO / 'contextpool_jax' / 'py.typed').is_file()
  assert 'py.typed' in PYPROJECT['tool']['setuptools']['package-data']['contextpool_jax']


def test_every_package_is_listed_and_the_configs_install_from_their_one_home():
  """``[tool.setuptools] packages`` lists every directory of ``contextpool_jax/``: each
  subpackage (one not listed would be left out of the wheel) and each directory of data
  alone (Python imports it as a namespace package, and setuptools warns at every build when
  it is not listed); ``contextpool_jax.configs`` is the top-level ``configs/`` (no copy)."""
  setuptools = PYPROJECT['tool']['setuptools']
  found = {
      '.'.join(p.relative_to(REPO).parts)
      for p in [REPO / 'contextpool_jax', *(REPO / 'contextpool_jax').rglob('*')]
      if p.is_dir() and p.name != '__pycache__'
  }
  assert set(setuptools['packages']) == found | {'contextpool_jax.configs'}
  assert setuptools['package-dir'] == {'contextpool_jax.configs': 'configs'}
  assert not (REPO / 'contextpool_jax' / 'configs').exists()
  assert PROJECT['scripts'] == {
      'contextpool-train': 'contextpool_jax.commands.train:command',
      'contextpool-sample': 'contextpool_jax.commands.sample:command',
      'contextpool-viz': 'contextpool_jax.commands.viz:command',
      'contextpool-compile': 'contextpool_jax.commands.compile:command',
  }


def _copy_sources(src: pathlib.Path) -> pathlib.Path:
  """What a build reads, copied to ``src`` (the build writes build/ and *.egg-info next to
  them: not in the checkout)."""
  src.mkdir(parents=True)
  for name in ('pyproject.toml', 'README.md', 'LICENSE'):
    shutil.copy(REPO / name, src / name)
  for name in ('contextpool_jax', 'configs'):
    shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns('__pycache__'))
  return src


def _build_wheel(src: pathlib.Path, dist: pathlib.Path) -> pathlib.Path:
  """The wheel of ``src``, built as users build one (pip, with build isolation), from a
  directory that is not the sources."""
  run = subprocess.run(
      [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', '-w', str(dist), str(src)],
      capture_output=True,
      text=True,
      timeout=600,
      cwd=dist.parent,
  )
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  assert 'would be ignored' not in run.stderr, run.stderr[-3000:]  # setuptools' unlisted package
  (wheel,) = dist.glob('contextpool_jax-*.whl')
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
      cwd=where.parent,  # not the checkout, whatever an earlier install left there
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


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> pathlib.Path:
  """The checkout's wheel (copied sources, pip with build isolation), built once for the tests
  that only read it: its names, and installs into their own fresh virtualenvs."""
  build = tmp_path_factory.mktemp('build')
  return _build_wheel(_copy_sources(build / 'src'), build / 'dist')


@pytest.mark.slow
def test_the_wheel_trains_and_samples_with_its_commands_outside_a_checkout(wheel, tmp_path, corpus):
  """Slow (a minute or two): the wheel (the ``wheel`` fixture's build) installed into a fresh
  virtualenv trains 4 steps of a tiny model with ``contextpool-train --config default`` from a
  directory that is not the checkout, samples the workdir with ``contextpool-sample`` and
  compiles the default for a TPU chip with ``contextpool-compile``."""
  names = zipfile.ZipFile(wheel).namelist()
  assert (
      'contextpool_jax/configs/default.py' in names and 'contextpool_jax/configs/common.py' in names
  )
  assert not any(n.startswith(('configs/', 'train.py', 'tests/')) for n in names)
  assert 'contextpool_jax/data/corpora/cpython-3.11.7-lib.tar.xz' in names  # the default corpus
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
  # The default corpus from the wheel's archive: checked, extracted, every file read.
  env['XDG_CACHE_HOME'] = str(tmp_path / 'cache')
  code = (
      'from contextpool_jax.data import text_builders as t; c = t.make_local_text_config(());'
      ' print(c.root, c.total_bytes, len(c.inputs))'
  )
  root, total, files = run('python', '-c', code).split()
  assert root.startswith(str(tmp_path / 'cache')) and (int(total), int(files)) == (4194301, 373)
  tiny = {  # the pages' shrunk run (helpers.TINY_TRAIN) on this test's corpus
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
  # The compile command from the wheel (libtpu: this environment's, through the .pth).
  out = run(
      'contextpool-compile', '--config', 'default', '--topology', 'v5e-1', '--config.batch_size=4'
  )
  assert out.startswith('v5e:1x1: 1 chip(s)') and '| train step |' in out, out


@pytest.mark.slow
def test_an_earlier_builds_leftovers_ship_unless_cleaned_as_the_docs_say(tmp_path):
  """Slow (two wheel builds, seconds each): setuptools reuses ``build/lib/`` of an earlier
  build from the same sources, so a module deleted since would ship in the next wheel; the
  cleaning command docs/install.md gives keeps it out."""
  (clean,) = [
      b.code
      for b in markdown_blocks((REPO / 'docs' / 'install.md').read_text())
      if b.code.startswith('rm -rf build')
  ]
  src = _copy_sources(tmp_path / 'src')
  stale = 'contextpool_jax/deleted_since.py'
  (src / 'build' / 'lib' / stale).parent.mkdir(parents=True)
  (src / 'build' / 'lib' / stale).write_text('x = 1\n')
  (src / 'contextpool_jax.egg-info').mkdir()
  (src / 'contextpool_jax.egg-info' / 'SOURCES.txt').write_text(stale + '\n')
  dirty = _build_wheel(src, tmp_path / 'dirty')
  assert stale in zipfile.ZipFile(dirty).namelist()  # the hazard the docs warn of
  subprocess.run(['bash', '-c', clean], cwd=src, check=True)
  assert not (src / 'build').exists() and not (src / 'contextpool_jax.egg-info').exists()
  names = zipfile.ZipFile(_build_wheel(src, tmp_path / 'cleaned')).namelist()
  assert stale not in names and 'contextpool_jax/training/tasks.py' in names


CORE_ONLY_ABSENT = ('tensorflow-datasets', 'grain', 'tensorboardX', 'pytest', 'sentencepiece')


@pytest.mark.slow
def test_the_core_install_loads_an_export_and_samples_and_names_the_train_extra(wheel, tmp_path):
  """Slow (about a minute): the wheel (the ``wheel`` fixture's build) with its core
  dependencies only (``pip install .``, versions held to this stack's pins), in a fresh
  virtualenv: it loads an export (safetensors + config.json) and samples from it, in Python and
  with ``contextpool-sample``; ``contextpool-train`` ends with one line naming the [train]
  extra."""
  from contextpool_jax.runs.export import export_params  # pylint: disable=g-import-not-at-top

  export = export_params(REPO / 'tests' / 'fixtures' / 'workdir_0_1_0', tmp_path / 'export')
  venv.create(tmp_path / 'core', with_pip=False)
  python = tmp_path / 'core' / 'bin' / 'python'
  pins = _pins(DEV[NEWEST if sys.version_info >= (3, 12) else OLDEST])
  (tmp_path / 'pins.txt').write_text(''.join(f'{n}=={v}\n' for n, v in pins.items()))
  install = subprocess.run(
      [sys.executable, '-m', 'pip', '--python', str(python), 'install', '-q']
      + ['-c', str(tmp_path / 'pins.txt')]
      + [str(wheel)],
      capture_output=True,
      text=True,
      timeout=900,
      cwd=tmp_path,
  )
  assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
  listed = subprocess.run(
      [sys.executable, '-m', 'pip', '--python', str(python), 'list', '--format=freeze'],
      capture_output=True,
      text=True,
      check=True,
  ).stdout
  installed = {_name(line.split('==')[0]) for line in listed.split()}
  assert {_name(n) for n in ('jax', 'flax', 'numpy', 'ml_collections', 'safetensors')} <= installed
  assert not installed & {_name(n) for n in CORE_ONLY_ABSENT}, installed
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
  env['PATH'] = f'{tmp_path / "core" / "bin"}{os.pathsep}{env.get("PATH", "")}'

  def run(*argv):
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

  code = (
      'from contextpool_jax.runs.workdirs import load\n'
      'from contextpool_jax.inference.sampling import sample_text\n'
      f'model, variables, config = load({str(export)!r})\n'
      "print(repr(sample_text(model, variables, config, 'def ', length=8, seed=0)))\n"
  )
  sampled = run(str(python), '-c', code)
  assert sampled.returncode == 0, sampled.stderr[-3000:]
  assert len(eval(sampled.stdout.strip())) >= 1  # pylint: disable=eval-used
  command = run('contextpool-sample', '--workdir', str(export), '--prompt', 'def ', '--length', '8')
  assert command.returncode == 0 and command.stdout.startswith('def '), command.stderr[-3000:]
  train = run('contextpool-train', '--config', 'default', '--workdir', str(tmp_path / 'w'))
  assert train.returncode == 1
  assert train.stderr.strip().splitlines() == [
      'error: contextpool-train needs the [train] extra, not installed here (no module named'
      f" {train.stderr.split('no module named ')[1].split(')')[0]}): pip install"
      " 'contextpool-jax[train]'"
  ], train.stderr
