"""The saturation guardrail (llm-d WVA's analyzer): spare capacity, per-variant targets, the fast path's trigger."""
