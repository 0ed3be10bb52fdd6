/*
 * fuzz_llama_config.c — libFuzzer target of the Llama-family folder reader's config.json rules
 * (csrc/model/llama.c's pytfm_llama_config_parse, on json.c).
 *
 * Each input is parsed as a config.json. Beyond what ASan and UBSan see, the parser's promises
 * are checked and a broken one traps: a status is OK, INVALID_ARGUMENT or OUT_OF_MEMORY; a
 * failure leaves a message naming the source; a config it takes is a Llama-family one that
 * pytfm_model_config_check accepts (RoPE, every size >= 1, n_params and step 0, Qwen 2's biases
 * and Qwen 3's q/k norm not both, a window only outside Llama) and is taken again, the same,
 * from the same text.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icsrc/include -Icsrc \
 *       tests/c_api/fuzz/fuzz_llama_config.c $(find csrc -name '*.c') -lm -o fuzz_llama_config
 * (tests/c_api/test_c_llama.py builds and runs it for a bounded time.)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pytfm.h"

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pytfm_model_config c, again;
    const char *text = (const char *)data;
    const pytfm_status st = pytfm_llama_config_parse(&c, text, (int64_t)size, "config.json");
    EXPECT(st == PYTFM_STATUS_OK || st == PYTFM_STATUS_INVALID_ARGUMENT ||
           st == PYTFM_STATUS_OUT_OF_MEMORY);
    if (st != PYTFM_STATUS_OK) {
        EXPECT(!strncmp(pytfm_last_error(), "config.json: ", 13));
        return 0;
    }
    EXPECT(pytfm_model_config_check(&c) == PYTFM_STATUS_OK);
    EXPECT(c.arch == PYTFM_ARCH_LLAMA && c.pos == PYTFM_POS_ROPE);
    EXPECT(c.vocab >= 1 && c.d_model >= 1 && c.n_layer >= 1 && c.n_head >= 1 && c.max_seq >= 1);
    EXPECT(c.n_kv_head >= 1 && c.n_head % c.n_kv_head == 0 && c.head_dim >= 2 && c.d_ff >= 1);
    EXPECT(c.n_params == 0 && c.step == 0 && c.sliding_window >= 0);
    EXPECT(!(c.qkv_bias && c.qk_norm) && (c.qkv_bias | c.qk_norm | c.tie_embeddings) <= 1);
    EXPECT(isfinite(c.norm_eps) && c.norm_eps > 0 && isfinite(c.rope_theta) && c.rope_theta > 0);
    if (c.rope_scaling == PYTFM_ROPE_SCALING_NONE)
        EXPECT(c.rope_factor == 0 && c.rope_low_freq_factor == 0 &&
               c.rope_high_freq_factor == 0 && c.rope_original_max_pos == 0);
    else
        EXPECT(c.rope_scaling == PYTFM_ROPE_SCALING_LLAMA3 && isfinite(c.rope_factor) &&
               isfinite(c.rope_original_max_pos) && c.rope_original_max_pos > 0);
    EXPECT(pytfm_llama_config_parse(&again, text, (int64_t)size, NULL) == PYTFM_STATUS_OK);
    EXPECT(!memcmp(&c, &again, sizeof c));
    return 0;
}
