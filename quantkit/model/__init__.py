"""Model layer: tokenizer, forward pass, KV cache, sampling."""
