// C entry points that run each kernel under the emulation, for ctypes. Built by
// test_kernels.py together with the kernel sources; one argument list per kernel, mirroring
// its signature.

#define EMU_GRID dim3e{gx, gy, gz}

extern "C" void emu_embedding_gather(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const int* ids, const bf16_t* table, float* out, int hidden, float scale) {
    emulate(EMU_GRID, threads, [=] { embedding_gather(ids, table, out, hidden, scale); });
}

extern "C" void emu_rms_norm_rows(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    float* x, const bf16_t* weight, int hidden, float eps) {
    emulate(EMU_GRID, threads, [=] { rms_norm_rows(x, weight, hidden, eps); });
}

extern "C" void emu_logit_softcap(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    float* logits, int width, float cap) {
    emulate(EMU_GRID, threads, [=] { logit_softcap(logits, width, cap); });
}

extern "C" void emu_rms_norm_residual(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    float* resid, const float* add, const bf16_t* bias, const int* rows, const bf16_t* weight,
    bf16_t* out, int hidden, float eps) {
    emulate(EMU_GRID, threads, [=] { rms_norm_residual(resid, add, bias, rows, weight, out, hidden, eps); });
}

extern "C" void emu_silu_and_mul(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const float* gate_up, bf16_t* out, int inter, int gelu) {
    emulate(EMU_GRID, threads, [=] { silu_and_mul(gate_up, out, inter, gelu); });
}

extern "C" void emu_rotary_kv_store(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const float* qkv, const bf16_t* bias, const bf16_t* q_norm, const bf16_t* k_norm, float eps,
    const int* positions, const float* inv_freq, int rot_half, float rope_scale, const int* slots,
    float* q_out, bf16_t* k_cache, bf16_t* v_cache, int q_heads, int kv_heads, int head_dim) {
    emulate(EMU_GRID, threads, [=] {
        rotary_kv_store(qkv, bias, q_norm, k_norm, eps, positions, inv_freq, rot_half, rope_scale,
            slots, q_out, k_cache, v_cache, q_heads, kv_heads, head_dim);
    });
}

extern "C" void emu_paged_attention(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const float* q, const bf16_t* k_cache, const bf16_t* v_cache, const int* context,
    const int* seq_of, const int* block_tables, const int* table_stride, int block_size, int q_heads,
    int kv_heads, int head_dim, float scale, float softcap, int window, int first_token,
    float* part_max, float* part_sum, float* part_acc, bf16_t* out) {
    emulate(EMU_GRID, threads, [=] {
        paged_attention(q, k_cache, v_cache, context, seq_of, block_tables, table_stride,
            block_size, q_heads, kv_heads, head_dim, scale, softcap, window, first_token, part_max,
            part_sum, part_acc, out);
    });
}

extern "C" void emu_attention_combine(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const float* part_max, const float* part_sum, const float* part_acc, int splits,
    int head_dim, int first_token, bf16_t* out) {
    emulate(EMU_GRID, threads, [=] {
        attention_combine(part_max, part_sum, part_acc, splits, head_dim, first_token, out);
    });
}

extern "C" void emu_gather_kv(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const bf16_t* k_cache, const bf16_t* v_cache, const int* block_tables, const int* table_stride,
    int seq, int block_size, int kv_heads, int head_dim, bf16_t* k_out, bf16_t* v_out) {
    emulate(EMU_GRID, threads, [=] {
        gather_kv(k_cache, v_cache, block_tables, table_stride, seq, block_size, kv_heads,
            head_dim, k_out, v_out);
    });
}

extern "C" void emu_pack_queries(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const float* q, int first_row, int head_dim, bf16_t* out) {
    emulate(EMU_GRID, threads, [=] { pack_queries(q, first_row, head_dim, out); });
}

extern "C" void emu_masked_softmax(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const float* scores, int width, int first_position, int window, float softcap,
    bf16_t* probs) {
    emulate(EMU_GRID, threads, [=] {
        masked_softmax(scores, width, first_position, window, softcap, probs);
    });
}

extern "C" void emu_sample_rows(unsigned gx, unsigned gy, unsigned gz, unsigned threads,
    const float* logits, int vocab, const SampleRow* params, const int* penalty_tokens,
    const int* penalty_counts, const int* banned_tokens, float* scratch_rows, int* out_token,
    float* out_logprob, int* out_top_ids, float* out_top_logprobs,
    const unsigned int* allowed_masks) {
    emulate(EMU_GRID, threads, [=] {
        sample_rows(logits, vocab, params, penalty_tokens, penalty_counts, banned_tokens,
            scratch_rows, out_token, out_logprob, out_top_ids, out_top_logprobs, allowed_masks);
    });
}
