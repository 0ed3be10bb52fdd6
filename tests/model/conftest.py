"""Fixtures of the GPT-2 tests (gpt2_oracle.py): GPT-2's vocabulary and the tokenizers
built on it, pytfm's and GPT2TokenizerFast's."""

from gpt2_oracle import gpt2_tokenizer, gpt2_vocab_folder, hf_tokenizer  # noqa: F401
