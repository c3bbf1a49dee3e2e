"""Text as byte tokens (contextpool_jax.base.byte_text): UTF-8 bytes one id each, bytes outside
the vocabulary named, invalid or cut-off sequences decoded as U+FFFD."""

import pytest

from contextpool_jax.base import byte_text


def test_text_is_its_utf8_bytes_and_back():
  # 'é' is U+00E9: UTF-8 0xC3 0xA9; '€' is U+20AC: 0xE2 0x82 0xAC.
  assert byte_text.encode_bytes('aé€', 256) == [97, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
  assert byte_text.decode_bytes([97, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]) == 'aé€'
  assert byte_text.encode_bytes('', 256) == [] and byte_text.decode_bytes([]) == ''


def test_bytes_outside_the_vocabulary_are_named():
  assert byte_text.encode_bytes('abc', 100) == [97, 98, 99]  # all below 100
  # 'é' is 0xC3 0xA9 (195, 169): both named, in order.
  with pytest.raises(
      ValueError, match=r'has bytes \[169, 195\] outside the model vocabulary of 128'
  ):
    byte_text.encode_bytes('é', 128)


def test_a_cut_off_or_invalid_sequence_decodes_as_the_replacement_character():
  assert byte_text.decode_bytes([104, 0xC3]) == 'h\ufffd'  # the first byte of 'é' only
  assert byte_text.decode_bytes([0xFF, 105]) == '\ufffdi'  # 0xFF starts no UTF-8 sequence
