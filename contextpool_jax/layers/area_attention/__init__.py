"""Area attention (Li et al., "Area Attention", ICML 2019): masks, the attention
core, the parameter-free function and the Linen modules.

Attention in which the unit a query attends to is an *area*: a contiguous
range of 1..``max_area_width`` items of a 1D memory, or a rectangle of up to
``max_area_height`` x ``max_area_width`` items of a 2D memory (a grid that is
stored flattened row-major, ``memory_height`` rows of ``kv_len //
memory_height`` items). Every area gets a key and a value computed from its
items, and ordinary dot-product attention runs over the areas.

* Basic form (parameter-free): area key = mean of the item keys (Eq. 3), area
  value = sum of the item values (Eq. 4).
* Rich form (Eq. 5-9): area key = ReLU(f W1 + sigma W2 + [e_h; e_w] W3) Wd from
  the area mean (or max, or a sample), the standard deviation of the item keys
  (Eq. 5) and learned embeddings of the area's height and width (Eq. 6-8).
  Key modes named as in tensor2tensor's ``area_attention.py`` compute what
  they compute there (some without sigma); see :class:`AreaAttention`.

In this package (a change belongs in one file):

* :mod:`.areas`: which areas exist, in which order, and their features (sums
  and means from summed area tables, Eq. 10-11; stds by pairwise merges instead
  of Eq. 12; maxima); its public names are importable from here too.
* :mod:`.keys`: the key and value modes, a key mode's base feature.
* :mod:`.validate`: the settings both entry points share (:class:`~.validate.AreaSettings`)
  and every check of the function's and the modules' settings and inputs.
* :mod:`.masks`: :func:`area_attention_mask`, item-level mask and causality ->
  area-level mask.
* :mod:`.attend`: :func:`attend_to_areas`, softmax attention of queries over
  area keys/values (and its dropout).
* :mod:`.through_items`: the basic form computed from item logits, without
  area keys or values.
* :mod:`.core`: the core both entry points run (:func:`~.core.area_attention`)
  and :func:`dot_product_area_attention`, the parameter-free pure function.
* :mod:`.key_encoder`: :class:`AreaKeyEncoder`, the learned area key of Eq. 9
  (Linen).
* :mod:`.module`: :class:`AreaAttention`, multi-head area attention (Linen);
  :mod:`.streaming`: its ``decode=True`` cache and step.

The function and the module check their settings and memory with the same two
functions (:func:`~.validate.check_config`, :func:`~.validate.check_memory`)
and run the same core (:func:`~.core.area_attention`).

Choices the paper leaves open (each documented where it is made; the area
order, the std and the tables' precision in :mod:`.areas`):

* Masking: an area may be attended by a query only if every one of its items
  may be. ``causal=True`` adds the item mask ``j <= i`` (top-left aligned when
  ``q_len != kv_len``, as ``jax.nn.dot_product_attention``); on a 2D memory
  positions are raster (row-major) indices, so an area is visible to query
  ``i`` iff its bottom-right item has flattened index ``<= i``.
* A query with no attendable area outputs exactly zero, with zero (finite)
  gradients.
* Numerics: the softmax runs in float32 with max-subtraction, whatever the
  compute dtype.
"""

from contextpool_jax.layers.area_attention.areas import FEATURE_NAMES
from contextpool_jax.layers.area_attention.areas import AreaFeatures
from contextpool_jax.layers.area_attention.areas import AreaLayout
from contextpool_jax.layers.area_attention.areas import area_features
from contextpool_jax.layers.area_attention.areas import area_layout
from contextpool_jax.layers.area_attention.areas import num_areas
from contextpool_jax.layers.area_attention.attend import attend_to_areas
from contextpool_jax.layers.area_attention.core import dot_product_area_attention
from contextpool_jax.layers.area_attention.key_encoder import AreaKeyEncoder
from contextpool_jax.layers.area_attention.keys import KEY_MODES
from contextpool_jax.layers.area_attention.keys import LEARNED_KEY_MODES
from contextpool_jax.layers.area_attention.keys import PARAMETER_FREE_KEY_MODES
from contextpool_jax.layers.area_attention.keys import VALUE_MODES
from contextpool_jax.layers.area_attention.masks import area_attention_mask
from contextpool_jax.layers.area_attention.module import AreaAttention

__all__ = [
    'KEY_MODES',
    'LEARNED_KEY_MODES',
    'PARAMETER_FREE_KEY_MODES',
    'VALUE_MODES',
    'AreaAttention',
    'AreaKeyEncoder',
    'area_attention_mask',
    'attend_to_areas',
    'dot_product_area_attention',
    # The areas and their features (areas.py).
    'FEATURE_NAMES',
    'AreaFeatures',
    'AreaLayout',
    'area_features',
    'area_layout',
    'num_areas',
]
